//! `svnic demo`: the backend and two host-process guests in one process, and the bypass channel
//! measured side by side with the virtio-net path of the same backend.
//!
//! Both paths cross the same daemon. The virtio-net path is what a guest kernel does: frames
//! through the TX/RX virtqueues, the device woken by kick eventfds and the guest by call eventfds.
//! The bypass path is a channel: the guest writes its ring, an engine worker polls and delivers.

use std::path::PathBuf;
use std::time::Duration;

use crate::measure::{
    channel_echo, channel_ping, channel_ping_local, channel_stream_local, channel_stream_recv,
    channel_stream_send, frame_echo, frame_ping, frame_stream_recv, frame_stream_send,
    LatencyStats, PingKind, Throughput,
};
use serde_json::json;
use svnic_channels::{ChannelAddr, MacAddr};
use svnic_client::{Channel, WaitPolicy};
use svnic_host_frontend::host_guest::ClientError;
use svnic_host_frontend::HostGuest;
use thiserror::Error;

use svnic_backend::config::{ConfigError, DaemonConfig, EngineOverrides};
use svnic_backend::daemon::{AdminSocket, Daemon, DaemonError};

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Round trips per latency measurement.
    pub rounds: usize,
    /// Messages per channel throughput measurement (frames: a tenth, at most 200 000).
    pub messages: u64,
    /// Engine workers.
    pub workers: usize,
    /// Pin engine workers and guests to different CPUs (when there are at least two).
    pub pin: bool,
    /// CPUs of the machine (filled in by [`run_demo`]).
    pub cpus: usize,
}

/// What went wrong in the demo.
#[derive(Debug, Error)]
pub enum DemoError {
    /// The private directory of the demo's sockets could not be made.
    #[error("setup: {}: {source}", dir.display())]
    SocketDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The daemon's configuration was refused.
    #[error("setup: {0}")]
    Config(#[from] ConfigError),
    /// The daemon did not start.
    #[error("setup: {0}")]
    Daemon(#[from] DaemonError),
    /// A guest could not connect to its socket, or not create its channel.
    #[error("setup: {step} on {}: {source}", socket.display())]
    Guest {
        /// `connect` or `channel`.
        step: &'static str,
        /// The guest's vhost-user socket.
        socket: PathBuf,
        /// Why.
        #[source]
        source: ClientError,
    },
    /// Guest B's thread panicked.
    #[error("setup: guest B's thread panicked")]
    GuestPanicked,
    /// Guest B did not come back from a failed measurement.
    #[error("setup: guest B lost by a failed measurement")]
    GuestLost,
    /// A measurement failed.
    #[error("{what}: {source}")]
    Measure {
        /// Which measurement.
        what: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A round trip's reply never came.
    #[error("{what}: a reply never came")]
    NoReply {
        /// Which measurement.
        what: &'static str,
    },
}

/// The demo's results.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// Engine workers.
    pub workers: usize,
    /// Channel user-data round trip (32 bytes), both guests' loops on one thread.
    pub bypass_user: LatencyStats,
    /// Channel user-data round trip (32 bytes), one thread per guest.
    pub bypass_user_threads: LatencyStats,
    /// CPUs of the machine.
    pub cpus: usize,
    /// Channel DMA-data round trip (4 KiB).
    pub bypass_dma: LatencyStats,
    /// virtio-net frame round trip (32-byte payload).
    pub virtio: LatencyStats,
    /// Channel streaming of 64-byte user-data messages.
    pub bypass_stream: Repeated,
    /// Channel streaming, one thread per guest.
    pub bypass_stream_threads: Repeated,
    /// virtio-net streaming of frames with a 64-byte payload.
    pub virtio_stream: Repeated,
    /// CPU the guests were pinned to (workers on CPU 0), if pinned.
    pub guest_cpu: Option<u32>,
    /// Frames sent in the virtio-net stream (received may be fewer: the switch drops on full queues).
    pub virtio_sent: u64,
}

/// Each streaming measurement is made this many times; the report shows the median run and the
/// spread. One run lasts a fraction of a second, and on a 2-core machine a single run can land
/// on a moment when the host takes a core away.
pub const STREAM_RUNS: usize = 3;

/// Slots per ring of the demo's channels: streaming applications size their rings for batches
/// (the default is 256), and the round trips do not depend on it.
pub const DEMO_RING_SLOTS: u32 = 1024;

/// A measurement made [`STREAM_RUNS`] times.
#[derive(Debug, Clone)]
pub struct Repeated {
    /// The run with the median rate.
    pub median: Throughput,
    /// Messages per second of every run, in the order they were made.
    pub rates: Vec<f64>,
}

impl Repeated {
    /// Makes `runs` (at least 1) measurements with `f` and keeps the median.
    fn measure<E>(runs: usize, mut f: impl FnMut() -> Result<Throughput, E>) -> Result<Self, E> {
        let mut all = Vec::with_capacity(runs.max(1));
        for _ in 0..runs.max(1) {
            all.push(f()?);
        }
        let rates: Vec<f64> = all.iter().map(Throughput::messages_per_sec).collect();
        all.sort_by(|a, b| a.messages_per_sec().total_cmp(&b.messages_per_sec()));
        let median = all.swap_remove(all.len() / 2);
        Ok(Repeated { median, rates })
    }

    /// Slowest and fastest run, messages per second.
    pub fn spread(&self) -> (f64, f64) {
        let min = self.rates.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.rates.iter().copied().fold(0.0, f64::max);
        (min, max)
    }
}

/// Polling budget of the demo's clients before they sleep.
pub const BUSY_POLL: WaitPolicy = WaitPolicy {
    spins: 100,
    yields: 1_000_000,
};

const MAC_A: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x5a, 0x00, 0x01]);
const MAC_B: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x5a, 0x00, 0x02]);

fn measure<T, E>(what: &'static str, r: Result<T, E>) -> Result<T, DemoError>
where
    E: std::error::Error + Send + Sync + 'static,
{
    r.map_err(|e| DemoError::Measure {
        what,
        source: Box::new(e),
    })
}

/// Runs the whole demo: daemon, two guests, five measurements.
pub fn run_demo(opts: &DemoOptions) -> Result<DemoReport, DemoError> {
    let dir = std::env::temp_dir().join(format!("svnic-demo-{}", std::process::id()));
    // Private whatever the umask: svnic refuses sockets in a directory others may write to.
    svnic_backend::sockets::bind::ensure_private_dir(&dir).map_err(|source| {
        DemoError::SocketDir {
            dir: dir.clone(),
            source,
        }
    })?;
    let sock = |n: &str| -> PathBuf { dir.join(format!("{n}.sock")) };
    let specs = vec![
        format!("name=guest-a,socket={},mac={MAC_A}", sock("a").display()),
        format!("name=guest-b,socket={},mac={MAC_B}", sock("b").display()),
    ];
    // The engine plays the NIC's processor: with 2+ CPUs its workers get CPU 0 and the guests
    // the last CPU, so that polling guests never compete with the worker for a core.
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = opts.pin && ncpu >= 2;
    let opts = &DemoOptions {
        cpus: ncpu,
        ..opts.clone()
    };
    let overrides = EngineOverrides {
        workers: Some(opts.workers),
        pin_workers: pin,
        ..Default::default()
    };
    let config = DaemonConfig::load(None, &specs, &overrides, Some(dir.join("admin.sock")))?;
    let daemon = Daemon::start(&config, AdminSocket::Off)?;
    // The engine pins its workers from the first CPU this process may use; the guests go on
    // the last one.
    let guest_cpu = pin
        .then(|| svnic_backend::allowed_cpus().last().copied())
        .flatten();
    let result = run_guests(opts, &sock("a"), &sock("b"), guest_cpu);
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

struct Guest {
    client: HostGuest,
    channel: Channel,
}

fn connect(socket: &std::path::Path) -> Result<Guest, DemoError> {
    let guest_error = |step| {
        move |source| DemoError::Guest {
            step,
            socket: socket.to_path_buf(),
            source,
        }
    };
    let client = HostGuest::connect(socket, 64 << 20).map_err(guest_error("connect"))?;
    let mut channel = client
        .create_channel(1, DEMO_RING_SLOTS, Duration::from_secs(10))
        .map_err(guest_error("channel"))?;
    // Busy-poll mode for the measurements: poll (yielding the CPU between polls, so the engine
    // worker and the other guest still run on a 2-core machine) for up to about a second before
    // sleeping. The sleep/wake path is exercised by the tests; here we measure the data path.
    channel.set_wait_policy(BUSY_POLL);
    Ok(Guest { client, channel })
}

thread_local! {
    static GUEST_CPU: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
}

fn current_cpu_pin() -> Option<u32> {
    GUEST_CPU.with(|c| c.get())
}

/// Runs `b` on a thread (guest B) and `a` here (guest A); returns A's result.
fn pair<RA, RB: Send + 'static>(
    a: &mut Guest,
    b: Guest,
    fb: impl FnOnce(&mut Guest) -> RB + Send + 'static,
    fa: impl FnOnce(&mut Guest) -> RA,
) -> Result<(RA, RB, Guest), DemoError> {
    let cpu = current_cpu_pin();
    let handle = std::thread::spawn(move || {
        if let Some(c) = cpu {
            svnic_backend::pin_to_cpu(c);
        }
        let mut b = b;
        let r = fb(&mut b);
        (r, b)
    });
    let ra = fa(a);
    let (rb, b) = handle.join().map_err(|_| DemoError::GuestPanicked)?;
    Ok((ra, rb, b))
}

/// A stream from guest A (sending here) to guest B (receiving on its own thread), measured
/// [`STREAM_RUNS`] times by B's receive side; `what` names the send and receive sides in errors.
fn stream_pair<E, ER>(
    a: &mut Guest,
    b: &mut Option<Guest>,
    what: [&'static str; 2],
    recv: impl Fn(&mut Guest) -> Result<Throughput, ER> + Copy + Send + 'static,
    send: impl Fn(&mut Guest) -> Result<(), E>,
) -> Result<Repeated, DemoError>
where
    E: std::error::Error + Send + Sync + 'static,
    ER: std::error::Error + Send + Sync + 'static,
{
    Repeated::measure(STREAM_RUNS, || {
        let (sent, received, back) = pair(a, take_guest(b)?, recv, &send)?;
        *b = Some(back);
        measure(what[0], sent)?;
        measure(what[1], received)
    })
}

/// Guest B, back from the previous measurement's thread.
fn take_guest(b: &mut Option<Guest>) -> Result<Guest, DemoError> {
    b.take().ok_or(DemoError::GuestLost)
}

fn run_guests(
    opts: &DemoOptions,
    sa: &std::path::Path,
    sb: &std::path::Path,
    guest_cpu: Option<u32>,
) -> Result<DemoReport, DemoError> {
    if let Some(cpu) = guest_cpu {
        svnic_backend::pin_to_cpu(cpu);
        GUEST_CPU.with(|c| c.set(Some(cpu)));
    }
    let mut a = connect(sa)?;
    let mut b = connect(sb)?;
    let b_addr = ChannelAddr::new(MAC_B, 1);
    let rounds = opts.rounds.max(10);
    let n = opts.messages.max(1000);

    // 1-3. The bypass data path, both guests' polling loops on one thread (no context switch).
    let bypass_user = measure(
        "channel user-data ping",
        channel_ping_local(
            &mut a.channel,
            &mut b.channel,
            PingKind::UserData,
            32,
            rounds,
        ),
    )?;
    let bypass_dma = measure(
        "channel DMA-data ping",
        channel_ping_local(
            &mut a.channel,
            &mut b.channel,
            PingKind::DmaData,
            4096,
            rounds,
        ),
    )?;
    let bypass_stream = Repeated::measure(STREAM_RUNS, || {
        measure(
            "channel stream",
            channel_stream_local(&mut a.channel, &mut b.channel, n),
        )
    })?;

    // 4. The same user-data ping with one thread per guest (each waiting with wait_poll).
    let (ra, rb, b) = pair(
        &mut a,
        b,
        move |g| {
            let w = g.client.waiter(&g.channel);
            channel_echo(&mut g.channel, PingKind::UserData, rounds, &w)
        },
        |g| {
            let w = g.client.waiter(&g.channel);
            channel_ping(&mut g.channel, b_addr, PingKind::UserData, 32, rounds, &w)
        },
    )?;
    let bypass_user_threads = measure("channel user-data ping (threads)", ra)?;
    measure("channel user-data echo (threads)", rb)?;

    // 4b. Streaming with one thread per guest.
    let mut b = Some(b);
    let bypass_stream_threads = stream_pair(
        &mut a,
        &mut b,
        [
            "channel stream send (threads)",
            "channel stream receive (threads)",
        ],
        move |g| {
            let w = g.client.waiter(&g.channel);
            channel_stream_recv(&mut g.channel, n, &w)
        },
        |g| channel_stream_send(&mut g.channel, b_addr, 40, n),
    )?;
    let b = take_guest(&mut b)?;

    // 5. virtio-net frame round trip, each guest a thread waiting on its call eventfd.
    let (ra, rb, b) = pair(
        &mut a,
        b,
        move |g| frame_echo(&mut g.client, rounds),
        |g| frame_ping(&mut g.client, MAC_B, 32, rounds),
    )?;
    let virtio = measure("virtio-net ping", ra)?.ok_or(DemoError::NoReply {
        what: "virtio-net ping",
    })?;
    measure("virtio-net echo", rb)?;

    // 6. virtio-net streaming.
    let frames = (n / 10).clamp(1000, 200_000);
    let mut b = Some(b);
    let virtio_stream = stream_pair(
        &mut a,
        &mut b,
        ["virtio-net stream send", "virtio-net stream receive"],
        move |g| frame_stream_recv(&mut g.client, frames, Duration::from_millis(500)),
        |g| frame_stream_send(&mut g.client, MAC_B, 64, frames),
    )?;

    Ok(DemoReport {
        workers: opts.workers,
        cpus: opts.cpus,
        guest_cpu,
        bypass_user_threads,
        bypass_stream_threads,
        bypass_user,
        bypass_dma,
        virtio,
        bypass_stream,
        virtio_stream,
        virtio_sent: frames,
    })
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl DemoReport {
    /// virtio-net p50 round trip divided by the channel's.
    pub fn latency_ratio(&self) -> f64 {
        us(self.virtio.p50) / us(self.bypass_user.p50).max(1e-3)
    }

    /// Channel messages/s divided by virtio-net frames/s.
    pub fn throughput_ratio(&self) -> f64 {
        self.bypass_stream.median.messages_per_sec()
            / self.virtio_stream.median.messages_per_sec().max(1e-9)
    }

    /// A human table.
    pub fn to_table(&self) -> String {
        const THREAD_PER_GUEST: &str = "bypass, user-data, thread per guest";
        let lat = |name: &str, s: &LatencyStats| {
            format!(
                "{name:<34} {:>9.1} {:>9.1} {:>9.1}\n",
                us(s.min),
                us(s.p50),
                us(s.p99)
            )
        };
        let thr = |name: &str, r: &Repeated| {
            let t = &r.median;
            let (min, max) = r.spread();
            format!(
                "{name:<34} {:>12.0} {:>10.1}  ({} in {:.3} s; runs {:.2}-{:.2} M/s)\n",
                t.messages_per_sec(),
                t.bytes_per_sec() / 1e6,
                t.messages,
                t.elapsed.as_secs_f64(),
                min / 1e6,
                max / 1e6
            )
        };
        let mut s = String::new();
        s.push_str(&format!(
            "svnic demo: backend + 2 host-process guests (virtio-user), {} engine worker(s), {} CPUs\n\
             bypass rows: both guests' polling loops on one thread unless marked; virtio-net guests are\n\
             threads waiting on call eventfds like a kernel; {}\n\n",
            self.workers,
            self.cpus,
            match self.guest_cpu {
                Some(c) => format!("engine worker(s) pinned from the first CPU allowed, guests to CPU {c}"),
                None => "nothing pinned".to_string(),
            }
        ));
        s.push_str(&format!(
            "{:<34} {:>9} {:>9} {:>9}\n",
            "round trip (us)", "min", "p50", "p99"
        ));
        for (name, stats) in [
            ("bypass channel, user-data 32 B", &self.bypass_user),
            ("bypass channel, DMA-data 4 KiB", &self.bypass_dma),
            (THREAD_PER_GUEST, &self.bypass_user_threads),
            ("virtio-net frames, 32 B", &self.virtio),
        ] {
            s.push_str(&lat(name, stats));
        }
        s.push_str(&format!(
            "\n{:<34} {:>12} {:>10}\n",
            format!("streaming (median of {STREAM_RUNS})"),
            "msgs/s",
            "MB/s"
        ));
        for (name, runs) in [
            ("bypass channel, user-data 40 B", &self.bypass_stream),
            (THREAD_PER_GUEST, &self.bypass_stream_threads),
            ("virtio-net frames, 64 B payload", &self.virtio_stream),
        ] {
            s.push_str(&thr(name, runs));
        }
        s.push_str(&format!(
            "\nbypass vs virtio-net: round trip {:.1}x lower, throughput {:.1}x higher ({} of {} frames arrived)\n",
            self.latency_ratio(),
            self.throughput_ratio(),
            self.virtio_stream.median.messages,
            self.virtio_sent
        ));
        s
    }

    /// The same as one JSON object.
    pub fn to_json(&self) -> String {
        let lat = |s: &LatencyStats| json!({"count": s.count, "min_us": us(s.min), "p50_us": us(s.p50), "p99_us": us(s.p99), "mean_us": us(s.mean)});
        let thr = |r: &Repeated| {
            let t = &r.median;
            json!({"messages": t.messages, "bytes": t.bytes, "seconds": t.elapsed.as_secs_f64(), "messages_per_sec": t.messages_per_sec(), "bytes_per_sec": t.bytes_per_sec(), "runs_messages_per_sec": r.rates})
        };
        json!({
            "mode": "host-process",
            "workers": self.workers,
            "guest_cpu": self.guest_cpu,
            "cpus": self.cpus,
            "ring_slots": DEMO_RING_SLOTS,
            "stream_runs": STREAM_RUNS,
            "round_trip": {
                "bypass_user_data_32": lat(&self.bypass_user),
                "bypass_dma_data_4096": lat(&self.bypass_dma),
                "bypass_user_data_32_thread_per_guest": lat(&self.bypass_user_threads),
                "virtio_net_32": lat(&self.virtio),
            },
            "streaming": {
                "bypass_user_data": thr(&self.bypass_stream),
                "bypass_user_data_thread_per_guest": thr(&self.bypass_stream_threads),
                "virtio_net": thr(&self.virtio_stream),
                "virtio_net_sent": self.virtio_sent,
            },
            "latency_ratio": self.latency_ratio(),
            "throughput_ratio": self.throughput_ratio(),
        })
        .to_string()
    }
}
