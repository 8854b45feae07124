//! Engine data-path benchmarks, end to end through the real workers and the real client library.
//!
//! - `forward/user_data_1w`: 64-byte user-data messages (40-byte inline payload) from a channel of
//!   one fake guest to a channel of another, one engine worker. The bench thread plays both guests
//!   (fills the sender's TX ring in batches, drains the receiver's RX ring); the worker runs in its
//!   own thread. One iteration = one message delivered; criterion prints messages/s, which is the
//!   worker's rate (it is the only thread touching both rings).
//! - `forward/user_data_2w_4p`: the same with 2 workers and 4 sender/receiver pairs, senders spread
//!   over the two workers. Messages/s is for the whole engine; divide by 2 for per worker. On a
//!   2-core machine the bench thread competes with the workers, so this one is a lower bound
//!   (the bench thread yields after 64 sweeps with nothing received, as a guest's adaptive wait
//!   would, so that the worker sharing its CPU gets to run).
//! - `forward/user_data_1w_burst`: the worker alone, in batches: 4096 messages published at once
//!   into a 4096-slot TX ring, timed until the worker has published them all into the receiver's
//!   4096-slot RX ring (see [`forward_burst`]). The guests' own costs are outside the clock.
//! - `forward/user_data_1w_same_core`: the worker on a full TX ring with the bench thread asleep
//!   on the worker's own CPU (see [`forward_same_core`]): no cache line crosses cores, so this is
//!   the engine's own cost per message, whatever the machine's cross-core latency.
//! - `forward/*_worker_cpu`: the same runs timed by the CPU time of the worker threads rather than
//!   the wall clock (see [`forward_worker_cpu`]): messages per second of worker CPU, i.e. per
//!   worker, whatever else runs on the machine (a lower bound: idle polling counts too).
//! - `dma/<size>/{engine,memcpy_vec,volatile_copy}` for 4 KiB and 64 KiB: DMA-data end to end
//!   (the receiver keeps 4 buffers posted and re-posts each one it gets back; the sender sends
//!   whenever a buffer is posted and drains its completions), beside a plain `copy_from_slice`
//!   between two page-aligned `Vec<u8>` windows and a vm-memory
//!   `VolatileSlice::copy_to_volatile_slice` of the same size. One iteration = one message (or one
//!   copy); criterion prints bytes/s side by side. The worker polls without pause here (see
//!   [`spinning_engine`]), as in `forward/user_data_1w_burst` and `_same_core`.
//! - `dma/<size>/engine_vs_memcpy`: the `engine` run again, alternating within each criterion
//!   sample with as many `memcpy_vec` copies, in chunks of [`PAIRED_CHUNK`] (about half a
//!   millisecond each), each half timed on its own. Criterion prints the engine's half; the
//!   per-sample ratios of memcpy time to engine time (the engine's bandwidth as a fraction of
//!   memcpy's, measured over the same moments) and their median go to
//!   `<criterion dir>/dma/<size>/engine_vs_memcpy/paired.json`, on which
//!   `scripts/bench-summary.sh` judges the DMA target. Compare the engine with memcpy only
//!   through this row: on a host whose pace drifts, two rows measured seconds apart do not
//!   compare (docs/performance.md, Method).
//!   After the engine rows, a line gives the time of a plain memcpy of the message into each
//!   of the receiver's posted buffers (see [`DmaBench::print_copy_times_per_buffer`]): glibc's
//!   `rep movsb` can be slower at some page placements, the engine's AVX2 copy is not.
//! - `dma/<size>/engine_burst`: the worker alone in batches, as `forward/user_data_1w_burst`:
//!   [`DMA_BURST`] messages queued at once into [`DMA_BURST`] posted buffers, timed until the
//!   worker has published them all (see [`DmaBench::burst`]).
//!
//! Workers are pinned (worker i on CPU i), the bench thread to the last CPU.
//!
//! Run with `cargo bench -p svnic-backend --bench engine`; `scripts/bench-summary.sh` turns the
//! results into ratios against the project's targets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use svnic_client::Completions;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use svnic_backend::{allowed_cpus, pin_to_cpu, Engine, EngineConfig, Placement};
use svnic_channels::layout::{header, DEFAULT_REGION_LEN};
use svnic_channels::{ChannelAddr, DataRef, Message};
use svnic_client::Channel;
use svnic_tests::fake_guest::FakeGuest;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, VolatileMemory};

/// Inline payload: the whole 40 bytes a 64-byte message carries.
const PAYLOAD: [u8; 40] = [0xa5; 40];
/// Nothing in these benches should take longer; if it does the engine lost a message.
const STALL: Duration = Duration::from_secs(10);

/// An engine with its workers pinned (worker i on CPU i), so that a worker never shares a core
/// with the bench thread; see [`pin_bench_thread`].
fn engine(workers: usize) -> Engine {
    new_engine(EngineConfig {
        workers,
        // Senders are spread over the workers by creation order (see `pairs`).
        placement: Placement::LeastLoaded,
        pin_workers: true,
        ..Default::default()
    })
}

/// One pinned worker that polls without pause for as long as it lives (no yield, no sleep), so
/// that the clock measures delivery, not the idle policy: on a shared machine a worker that
/// yields hands its core to another process for a whole time slice (milliseconds), and a
/// benchmark whose guests pause between round trips would measure that.
fn spinning_engine() -> Engine {
    new_engine(EngineConfig {
        workers: 1,
        pin_workers: true,
        spin_passes: u32::MAX / 2,
        idle_passes: u32::MAX / 2,
        ..Default::default()
    })
}

/// Starts an engine from a thread that may use every CPU: the engine counts the CPUs it may
/// pin workers to in the calling thread's affinity mask, which the bench thread narrows to one.
fn new_engine(config: EngineConfig) -> Engine {
    set_affinity(cpus());
    let e = Engine::new(config).unwrap();
    pin_bench_thread();
    e
}

/// The CPUs this process may use, as it started (before the bench thread pinned itself).
fn cpus() -> &'static [u32] {
    static CPUS: OnceLock<Vec<u32>> = OnceLock::new();
    CPUS.get_or_init(allowed_cpus)
}

/// Pins the bench thread (both fake guests) to the last CPU, away from worker 0 on CPU 0. With
/// 2 CPUs and 1 worker, the worker and the guests each have a core of their own; with more
/// workers than the CPUs left, they share (the 2-worker bench says so).
fn pin_bench_thread() {
    if let Some(last) = cpus().last() {
        pin_to_cpu(*last);
    }
}

/// Lets the bench thread run on any of `allowed` CPUs again (`pin_to_cpu` narrows it to one).
fn set_affinity(allowed: &[u32]) {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in allowed {
        // SAFETY: CPU_SET writes inside `set`; the CPU index is reduced below CPU_SETSIZE.
        unsafe { libc::CPU_SET(*cpu as usize % libc::CPU_SETSIZE as usize, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; `set` is valid for its size.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        eprintln!(
            "could not pin the bench thread: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Switches the bench thread to SCHED_FIFO (priority 1) or back to SCHED_OTHER. Returns whether
/// it worked (it needs CAP_SYS_NICE).
fn set_fifo(on: bool) -> bool {
    let (policy, priority) = if on {
        (libc::SCHED_FIFO, 1)
    } else {
        (libc::SCHED_OTHER, 0)
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
    let r = unsafe { libc::sched_setscheduler(0, policy, &param) };
    if r != 0 {
        eprintln!(
            "could not set the scheduling policy: {} (same-core numbers will be off)",
            std::io::Error::last_os_error()
        );
    }
    r == 0
}

/// A sender channel and a receiver channel, in two different guests.
struct Pair {
    tx: Channel,
    rx: Channel,
    dest: ChannelAddr,
}

/// `n` pairs. With [`Placement::LeastLoaded`], the creation order (all senders first) puts the
/// senders round-robin on the workers; the receivers' worker does not matter (a worker polls only
/// the TX rings it serves).
fn pairs(engine: &Engine, n: u32) -> (Vec<Pair>, Vec<FakeGuest>) {
    let mut ga = FakeGuest::new(engine, 1, 2 * u64::from(n) + 2);
    let mut gb = FakeGuest::new(engine, 2, 2 * u64::from(n) + 2);
    let txs: Vec<Channel> = (0..n).map(|i| ga.open(10 + i)).collect();
    let rxs: Vec<Channel> = (0..n).map(|i| gb.open(100 + i)).collect();
    let pairs = txs
        .into_iter()
        .zip(rxs)
        .map(|(tx, rx)| {
            let dest = rx.addr();
            Pair { tx, rx, dest }
        })
        .collect();
    (pairs, vec![ga, gb])
}

/// Sends `n` user-data messages spread over `pairs` and waits until each is received (or came
/// back to its sender as an error completion, which is reported). Returns the time from the
/// first send to the last message accounted for.
fn forward(pairs: &mut [Pair], n: u64, out: &mut Vec<Message>) -> Duration {
    let k = pairs.len() as u64;
    let mut sent = vec![0u64; pairs.len()];
    let mut got = vec![0u64; pairs.len()];
    let mut failed = Vec::new();
    let target: Vec<u64> = (0..k).map(|i| n / k + u64::from(i < n % k)).collect();
    let start = Instant::now();
    let mut left = n;
    let mut idle_sweeps = 0u32;
    while left > 0 {
        let before = left;
        for (i, p) in pairs.iter_mut().enumerate() {
            while sent[i] < target[i]
                && p.tx
                    .send_user(p.dest, sent[i], &PAYLOAD, Completions::OnError)
                    .unwrap()
            {
                sent[i] += 1;
            }
            p.tx.flush().unwrap();
            out.clear();
            let r = p.rx.poll(out, 256).unwrap() as u64;
            got[i] += r;
            left -= r;
            // User-data without WANT_COMPLETION only ever comes back on error.
            out.clear();
            if p.tx.poll(out, 256).unwrap() > 0 {
                for m in out.iter() {
                    if let Message::Completion(c) = m {
                        failed.push((i, c.cookie, c.status));
                        got[i] += 1;
                        left -= 1;
                    }
                }
            }
        }
        assert!(
            start.elapsed() < STALL,
            "forwarding stalled: {got:?} of {target:?}"
        );
        // Like a guest's adaptive wait: after a while with nothing arriving, let a worker that
        // shares this CPU (more workers than CPUs left) run instead of spinning against it.
        idle_sweeps = if left == before { idle_sweeps + 1 } else { 0 };
        if idle_sweeps > 64 {
            std::thread::yield_now();
        }
    }
    let elapsed = start.elapsed();
    if !failed.is_empty() {
        eprintln!(
            "warning: {} of {n} messages came back with an error completion (first: {:?})",
            failed.len(),
            failed[0]
        );
    }
    elapsed
}

/// Nanoseconds the engine's worker threads (named `svnic-worker-<i>`) have run on a CPU so far,
/// summed. Each thread's CPU clock is read with `clock_gettime` on its per-thread clock id (what
/// `pthread_getcpuclockid` returns), which is exact to the nanosecond, unlike
/// `/proc/.../schedstat` of a running thread.
fn workers_cpu_ns() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if !comm.starts_with("svnic-worker-") {
            continue;
        }
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        // Linux per-thread CPU clock: (~tid << 3) | CPUCLOCK_PERTHREAD (4) | CPUCLOCK_SCHED (2).
        let clock = (!tid << 3) | 6;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write; an unknown clock id only returns EINVAL.
        if unsafe { libc::clock_gettime(clock, &mut ts) } == 0 {
            total += ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        }
    }
    total
}

/// [`forward`], timed by the workers' CPU time instead of the wall clock: what a worker costs per
/// message when it has a core (idle polling while the guests lag included, so a lower bound of
/// its capacity). Robust to other tenants of a shared machine, which the wall clock is not; and
/// for several workers, elements per second of this time is the rate *per worker*.
fn forward_worker_cpu(pairs: &mut [Pair], n: u64, out: &mut Vec<Message>) -> Duration {
    let before = workers_cpu_ns();
    forward(pairs, n, out);
    Duration::from_nanos(workers_cpu_ns() - before)
}

/// Slots in the rings of the burst bench: the largest the ABI allows.
const BURST: u32 = 4096;

/// The worker alone: the sender queues [`BURST`] messages without publishing them (untimed),
/// then the clock runs from the one publish until the worker has published all of them into the
/// receiver's RX ring (seen by watching the RX head, not consuming); then the receiver drains
/// (untimed). The worker takes them in passes of `poll_budget`, so this is its rate in batches.
fn forward_burst(p: &mut Pair, n: u64, out: &mut Vec<Message>) -> Duration {
    let mut wall = Duration::ZERO;
    let mut left = n;
    while left > 0 {
        let burst = left.min(u64::from(BURST));
        let base = queue_burst(p, burst);
        wall += flush_until_published(p, base, burst);
        drain(p, burst, out);
        left -= burst;
    }
    wall
}

/// How long the bench thread sleeps in [`forward_same_core`] while the worker runs alone.
const WINDOW: Duration = Duration::from_micros(150);

/// The engine's own cost per message, with no cache line crossing cores: the bench thread runs
/// on the worker's CPU, queues [`BURST`] messages, publishes them and *sleeps* ~50 us, during
/// which the worker has the CPU to itself; on waking it reads how many the worker has
/// published into the RX ring in that time (counted per pass of `poll_budget`, so to within
/// 64). The result is scaled to `n` messages. Then it lets the worker finish and drains.
fn forward_same_core(p: &mut Pair, n: u64, out: &mut Vec<Message>) -> Duration {
    let (mut window, mut done) = (Duration::ZERO, 0u64);
    let start = Instant::now();
    while done < n.max(1) {
        let base = queue_burst(p, u64::from(BURST));
        let t0 = Instant::now();
        p.tx.flush().unwrap();
        std::thread::sleep(WINDOW);
        let elapsed = t0.elapsed();
        let published = rx_published(p, base);
        assert!(
            published < u64::from(BURST),
            "the worker emptied the ring within the window: lengthen BURST or shorten the sleep"
        );
        window += elapsed;
        done += published;
        while rx_published(p, base) < u64::from(BURST) {
            std::thread::sleep(Duration::from_micros(50));
            assert!(start.elapsed() < STALL, "same-core burst stalled");
        }
        drain(p, u64::from(BURST), out);
    }
    window.mul_f64(n as f64 / done as f64)
}

/// The receiver's RX head (what the worker has published so far).
fn rx_head(p: &Pair) -> u32 {
    p.rx.region()
        .slice()
        .load::<u32>(header::RX_HEAD, Ordering::Acquire)
        .unwrap()
}

/// Queues `burst` messages on the sender's TX ring without publishing them; returns the RX head
/// of the receiver before they are sent.
fn queue_burst(p: &mut Pair, burst: u64) -> u32 {
    let base = rx_head(p);
    for i in 0..burst {
        assert!(p
            .tx
            .send_user(p.dest, i, &PAYLOAD, Completions::OnError)
            .unwrap());
    }
    base
}

/// Messages the worker has published into the receiver's RX ring since its head was `base`.
/// Publishes the sender's queued messages and times until the worker has published `n`
/// messages into the receiver's RX ring beyond `base` (watching the RX head, not consuming).
fn flush_until_published(p: &mut Pair, base: u32, n: u64) -> Duration {
    let start = Instant::now();
    p.tx.flush().unwrap();
    while rx_published(p, base) < n {
        std::hint::spin_loop();
        assert!(
            start.elapsed() < STALL,
            "burst stalled at {}/{n}",
            rx_published(p, base)
        );
    }
    start.elapsed()
}

fn rx_published(p: &Pair, base: u32) -> u64 {
    u64::from(rx_head(p).wrapping_sub(base))
}

fn drain(p: &mut Pair, n: u64, out: &mut Vec<Message>) {
    let mut got = 0;
    while got < n {
        out.clear();
        got += p.rx.poll(out, BURST as usize).unwrap() as u64;
    }
}

fn forwarding(c: &mut Criterion) {
    pin_bench_thread();
    let mut g = c.benchmark_group("forward");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(256);
    {
        let e = engine(1);
        let (mut p, _guests) = pairs(&e, 1);
        g.bench_function("user_data_1w", |b| {
            b.iter_custom(|n| forward(&mut p, n, &mut out))
        });
        g.bench_function("user_data_1w_worker_cpu", |b| {
            b.iter_custom(|n| forward_worker_cpu(&mut p, n, &mut out))
        });
    }
    {
        let e = spinning_engine();
        let mut ga = FakeGuest::new(&e, 1, 4);
        let mut gb = FakeGuest::new(&e, 2, 4);
        let tx = ga.open_with(10, BURST, DEFAULT_REGION_LEN).unwrap();
        let rx = gb.open_with(20, BURST, DEFAULT_REGION_LEN).unwrap();
        let dest = rx.addr();
        let mut p = Pair { tx, rx, dest };
        g.bench_function("user_data_1w_burst", |b| {
            b.iter_custom(|n| forward_burst(&mut p, n, &mut out))
        });
        // Worker 0 runs on CPU 0.
        pin_to_cpu(0);
        // Real-time priority, so that the bench thread preempts the spinning worker as soon as
        // its sleep ends (otherwise it waits for the end of the worker's time slice, and the
        // worker empties the ring before the window closes). It runs only briefly: the RT
        // throttle of the kernel is never approached.
        let rt = set_fifo(true);
        g.bench_function("user_data_1w_same_core", |b| {
            b.iter_custom(|n| forward_same_core(&mut p, n, &mut out))
        });
        if rt {
            set_fifo(false);
        }
        pin_bench_thread();
    }
    {
        let e = engine(2);
        let (mut p, _guests) = pairs(&e, 4);
        let workers: Vec<u32> = p.iter().map(|p| p.tx.served_by().0).collect();
        assert_eq!(workers, [0, 1, 0, 1], "senders spread over both workers");
        g.bench_function("user_data_2w_4p", |b| {
            b.iter_custom(|n| forward(&mut p, n, &mut out))
        });
        g.bench_function("user_data_2w_4p_worker_cpu", |b| {
            b.iter_custom(|n| forward_worker_cpu(&mut p, n, &mut out))
        });
    }
    g.finish();
}

/// Buffers the receiver keeps posted (and so DMA-data messages in flight).
const POSTED: u64 = 4;

/// A DMA pair: the sender sends one source buffer over and over; the receiver keeps
/// [`POSTED`] buffers posted and re-posts each as soon as its message arrives.
struct DmaBench {
    pair: Pair,
    size: u32,
    src: u64,
    /// Buffers the receiver has posted that no sent message has claimed yet.
    credits: u64,
    out: Vec<Message>,
}

impl DmaBench {
    fn new(engine: &Engine, size: u32) -> (Self, Vec<FakeGuest>) {
        let (mut ps, guests) = pairs(engine, 1);
        let mut pair = ps.pop().unwrap();
        let src = pair.tx.layout().data_offset;
        pair.tx.write_data(src, &vec![0x3c; size as usize]).unwrap();
        let base = pair.rx.layout().data_offset;
        for i in 0..POSTED {
            let buf = DataRef {
                offset: base + i * u64::from(size),
                len: size,
            };
            assert!(pair.rx.post_buffer(i, buf).unwrap());
        }
        pair.rx.flush().unwrap();
        let b = DmaBench {
            pair,
            size,
            src,
            credits: POSTED,
            out: Vec::with_capacity(256),
        };
        (b, guests)
    }

    /// Sends `n` messages; returns when all are received and completed.
    fn run(&mut self, n: u64) -> Duration {
        let (mut sent, mut received, mut completed) = (0u64, 0u64, 0u64);
        let data = DataRef {
            offset: self.src,
            len: self.size,
        };
        let p = &mut self.pair;
        let start = Instant::now();
        let mut spins = 0u64;
        while received < n || completed < n {
            while sent < n && self.credits > 0 {
                assert!(p.tx.send_dma(p.dest, sent, data).unwrap());
                sent += 1;
                self.credits -= 1;
            }
            p.tx.flush().unwrap();
            self.out.clear();
            p.rx.poll(&mut self.out, 256).unwrap();
            for m in &self.out {
                let Message::DmaData(d) = m else {
                    panic!("receiver got {m:?}")
                };
                assert!(d.is_complete());
                // Re-post the buffer that was just filled (its cookie is its index).
                let buf = DataRef {
                    offset: d.data.offset,
                    len: self.size,
                };
                assert!(p.rx.post_buffer(d.cookie, buf).unwrap());
                received += 1;
                self.credits += 1;
            }
            p.rx.flush().unwrap();
            self.out.clear();
            p.tx.poll(&mut self.out, 256).unwrap();
            for m in &self.out {
                match m {
                    Message::Completion(c) if c.status == svnic_channels::CompletionStatus::Ok => {
                        completed += 1
                    }
                    other => panic!("sender got {other:?}"),
                }
            }
            // Reading the clock costs as much as a poll: check for a stall now and then.
            spins += 1;
            if spins % 1024 == 0 {
                assert!(start.elapsed() < STALL, "DMA stalled at {received}/{n}");
            }
        }
        start.elapsed()
    }
}

impl DmaBench {
    /// Prints how long a plain memcpy of the message takes into each of the receiver's buffers
    /// (best of 5 x 2000 copies each, from the bench thread), next to `memcpy_vec`'s copy of
    /// `vec_src` into `vec_dst`. glibc's `rep movsb` is slower for some pairs of source and
    /// destination pages, reproducibly within a process; the engine copies with its own AVX2
    /// loop, which is not (see `engine/vector_copy.rs`), so a slow buffer here shows the
    /// placement, and `memcpy_vec` may be on such a pair too. Call it with nothing in flight.
    fn print_copy_times_per_buffer(&self, vec_src: &[u8], vec_dst: &mut [u8]) {
        let len = self.size as usize;
        let tx = self.pair.tx.region().slice();
        let rx = self.pair.rx.region().slice();
        let from = tx.get_slice(self.src as usize, len).unwrap();
        let base = self.pair.rx.layout().data_offset as usize;
        let best = |copy: &mut dyn FnMut()| {
            (0..5)
                .map(|_| {
                    let start = Instant::now();
                    for _ in 0..2000 {
                        copy();
                    }
                    start.elapsed() / 2000
                })
                .min()
                .unwrap()
        };
        let per_buffer: Vec<String> = (0..POSTED as usize)
            .map(|i| {
                let to = rx.get_slice(base + i * len, len).unwrap();
                let t = best(&mut || from.copy_to_volatile_slice(black_box(to)));
                format!("{:.2} us", t.as_secs_f64() * 1e6)
            })
            .collect();
        let t = best(&mut || memcpy_once(vec_src, vec_dst));
        println!(
            "dma/{} KiB: memcpy into each posted buffer: [{}]; memcpy_vec {:.2} us",
            len >> 10,
            per_buffer.join(", "),
            t.as_secs_f64() * 1e6
        );
    }
}

/// DMA-data messages per burst in [`DmaBench::burst`]: 4 x 64 KiB of destination buffers plus
/// the source stay within the worker's L2 cache, as the memcpy baseline's buffers do.
const DMA_BURST: u64 = 4;

impl DmaBench {
    /// The worker alone, in batches (as `forward/user_data_1w_burst` for user-data): the
    /// receiver posts [`DMA_BURST`] buffers and the sender queues as many messages (untimed);
    /// the clock runs from the sender's one publish until the worker has published every
    /// message into the receiver's RX ring; then both drain (untimed).
    fn burst(&mut self, n: u64) -> Duration {
        let data = DataRef {
            offset: self.src,
            len: self.size,
        };
        let p = &mut self.pair;
        // The receiver's buffers: those posted in `new` were all consumed by `run` or are still
        // posted; post a fresh window per burst at the same offsets (4 buffers exist).
        let base = p.rx.layout().data_offset;
        let mut wall = Duration::ZERO;
        let mut left = n;
        while left > 0 {
            let k = left.min(DMA_BURST);
            let rx_base = queue_dma_burst(p, base, self.size, self.credits, k, data);
            self.credits = self.credits.saturating_sub(k);
            wall += flush_until_published(p, rx_base, k);
            let (mut received, mut completed) = (0, 0);
            while received < k || completed < k {
                self.out.clear();
                p.rx.poll(&mut self.out, 256).unwrap();
                received += self.out.len() as u64;
                self.out.clear();
                p.tx.poll(&mut self.out, 256).unwrap();
                for m in &self.out {
                    match m {
                        Message::Completion(c)
                            if c.status == svnic_channels::CompletionStatus::Ok =>
                        {
                            completed += 1
                        }
                        other => panic!("sender got {other:?}"),
                    }
                }
            }
            left -= k;
        }
        wall
    }
}

/// Posts buffers (beyond the `already` still posted) so that `k` are, queues `k` DMA-data
/// messages of `data` without publishing them; returns the receiver's RX head before.
fn queue_dma_burst(p: &mut Pair, base: u64, size: u32, already: u64, k: u64, data: DataRef) -> u32 {
    for i in already..k {
        let buf = DataRef {
            offset: base + i * u64::from(size),
            len: size,
        };
        assert!(p.rx.post_buffer(i, buf).unwrap());
    }
    p.rx.flush().unwrap();
    let rx_base = rx_head(p);
    for i in 0..k {
        assert!(p.tx.send_dma(p.dest, i, data).unwrap());
    }
    rx_base
}

/// Samples per DMA row (criterion's sample size).
const DMA_SAMPLES: usize = 20;

/// Messages (and copies) per alternation in `engine_vs_memcpy`: 256 x 64 KiB is about half a
/// millisecond each way, long enough that refilling the engine's pipeline at the start of a
/// chunk (a few microseconds) costs about 1 %.
const PAIRED_CHUNK: u64 = 256;

fn dma(c: &mut Criterion) {
    pin_bench_thread();
    for (size, name) in [(4u32 << 10, "4KiB"), (64 << 10, "64KiB")] {
        // A fresh engine (and fresh guests) per size; the guests pause between round trips,
        // so the worker must not fall into its idle policy (see `spinning_engine`).
        let e = spinning_engine();
        let mut g = c.benchmark_group(format!("dma/{name}"));
        g.warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
            .sample_size(DMA_SAMPLES)
            .throughput(Throughput::Bytes(u64::from(size)));

        // Both windows page-aligned, like the engine's buffers: with malloc's 16-byte alignment
        // the destination can land 1..63 bytes after the source modulo 4 KiB, where glibc's
        // `rep movsb` is an order of magnitude slower (see `copy_data` in deliver.rs), and the
        // baseline would be meaningless.
        let len = size as usize;
        let src_buf = vec![0x3cu8; len + 4096];
        let mut dst_buf = vec![0u8; len + 4096];
        let (so, dof) = (
            src_buf.as_ptr().align_offset(4096),
            dst_buf.as_ptr().align_offset(4096),
        );
        let src = &src_buf[so..so + len];
        let dst = &mut dst_buf[dof..dof + len];

        let (mut bench, _guests) = DmaBench::new(&e, size);
        g.bench_function("engine", |b| b.iter_custom(|n| bench.run(n)));
        let mut pairs = Vec::new();
        #[cfg(feature = "dma-timing")]
        let (timing_before, passes_before) = (
            svnic_backend::engine::dma_timing::dma_timing(),
            passes_and_messages(&e),
        );
        g.bench_function("engine_vs_memcpy", |b| {
            b.iter_custom(|n| {
                // Alternate in chunks of a fraction of a millisecond, so that both halves see
                // the same moments of the host (its pace changes within a second too).
                let (mut engine, mut memcpy) = (Duration::ZERO, Duration::ZERO);
                let mut left = n;
                while left > 0 {
                    let k = left.min(PAIRED_CHUNK);
                    engine += bench.run(k);
                    memcpy += memcpy_n(src, dst, k);
                    left -= k;
                }
                pairs.push((engine, memcpy));
                engine
            })
        });
        // Criterion calls the routine once per sample after its warm-up calls: keep the samples.
        let samples = &pairs[pairs.len().saturating_sub(DMA_SAMPLES)..];
        write_paired_ratios(&format!("dma/{name}/engine_vs_memcpy"), samples);
        #[cfg(feature = "dma-timing")]
        print_dma_timing(
            &format!("dma/{name}/engine_vs_memcpy"),
            &svnic_backend::engine::dma_timing::dma_timing().since(&timing_before),
            {
                let (p, m) = passes_and_messages(&e);
                (p - passes_before.0, m - passes_before.1)
            },
        );
        // `run` leaves every buffer it posted posted again; `burst` takes them as its first
        // window.
        g.bench_function("engine_burst", |b| b.iter_custom(|n| bench.burst(n)));
        bench.print_copy_times_per_buffer(src, dst);

        g.bench_function("memcpy_vec", |b| b.iter_custom(|n| memcpy_n(src, dst, n)));

        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 * len)]).unwrap();
        let whole = mem.get_slice(GuestAddress(0), 2 * len).unwrap();
        let from = whole.get_slice(0, len).unwrap();
        let to = whole.get_slice(len, len).unwrap();
        g.bench_function("volatile_copy", |b| {
            b.iter(|| black_box(from).copy_to_volatile_slice(black_box(to)))
        });
        g.finish();
    }
}

/// Times `n` copies of `src` into `dst` (the `memcpy_vec` row, and the paired row's memcpy half).
fn memcpy_n(src: &[u8], dst: &mut [u8], n: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        memcpy_once(src, dst);
    }
    start.elapsed()
}

/// One plain copy of `src` into `dst`, which the optimiser may neither skip nor merge.
#[inline]
fn memcpy_once(src: &[u8], dst: &mut [u8]) {
    dst.copy_from_slice(black_box(src));
    black_box(&mut *dst);
}

/// Prints where the worker's time went during row `id` (built with the `dma-timing` feature):
/// the mean copy and the mean gap between copies (everything else the worker does per
/// message), how the gaps were spread, and how many messages a pass took on average (from the
/// workers' `passes` and `messages` counters over the row).
#[cfg(feature = "dma-timing")]
fn print_dma_timing(
    id: &str,
    t: &svnic_backend::engine::dma_timing::DmaTiming,
    (passes, messages): (u64, u64),
) {
    use svnic_backend::engine::dma_timing::{ticks_per_second, GAP_BUCKETS};
    if t.copies == 0 || t.gaps == 0 {
        return;
    }
    let ns = 1e9 / ticks_per_second(Duration::from_millis(50));
    let buckets: Vec<String> = (0..GAP_BUCKETS)
        // Buckets with at least 0.1 % of the gaps.
        .filter(|&i| t.gap_histogram[i] * 1000 >= t.gaps)
        .map(|i| {
            let low = if i == 0 { 0 } else { 1u64 << (i + 7) };
            format!(
                "{:.0}+ ns {:.1}%",
                low as f64 * ns,
                100.0 * t.gap_histogram[i] as f64 / t.gaps as f64
            )
        })
        .collect();
    println!(
        "{id}: worker per message: copy {:.0} ns, gap before it {:.0} ns ({} copies; gaps: {}; \
         {:.1} messages per pass)",
        t.copy_ticks as f64 / t.copies as f64 * ns,
        t.gap_ticks as f64 / t.gaps as f64 * ns,
        t.copies,
        buckets.join(", "),
        messages as f64 / passes.max(1) as f64
    );
}

/// Passes that found work and messages taken, over all of `e`'s workers.
#[cfg(feature = "dma-timing")]
fn passes_and_messages(e: &Engine) -> (u64, u64) {
    e.worker_stats().iter().fold((0, 0), |(p, m), w| {
        (p + w.counts.passes, m + w.counts.messages)
    })
}

/// Writes `paired.json` for the `engine_vs_memcpy` row `id` into criterion's directory for it:
/// per sample, the engine's bandwidth as a fraction of memcpy's (`memcpy time / engine time`
/// for the same number of bytes, timed alternately over the same moments), and their median.
/// `scripts/bench-summary.sh` judges the DMA target on it.
fn write_paired_ratios(id: &str, samples: &[(Duration, Duration)]) {
    let mut ratios: Vec<f64> = samples
        .iter()
        .filter(|(e, _)| !e.is_zero())
        .map(|(e, m)| m.as_secs_f64() / e.as_secs_f64())
        .collect();
    if ratios.is_empty() {
        return;
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "{id}: engine at {:.1}% of memcpy (median of {} paired samples)",
        median * 100.0,
        ratios.len()
    );
    let list: Vec<String> = ratios.iter().map(|r| format!("{r:.4}")).collect();
    let json = format!(
        "{{\"median\": {median:.4}, \"ratios\": [{}]}}\n",
        list.join(", ")
    );
    let dir = criterion_dir().join(id);
    if let Err(e) =
        std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(dir.join("paired.json"), json))
    {
        eprintln!("cannot write {}: {e}", dir.display());
    }
}

/// Criterion's output directory, found as criterion finds it: `CRITERION_HOME`, else
/// `$CARGO_TARGET_DIR/criterion`, else `criterion` in the target directory this bench binary
/// was built into (`<target>/release/deps/engine-*`).
fn criterion_dir() -> std::path::PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return home.into();
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return std::path::PathBuf::from(target).join("criterion");
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(|t| t.join("criterion")))
        .unwrap_or_else(|| "target/criterion".into())
}

criterion_group!(benches, forwarding, dma);
criterion_main!(benches);
