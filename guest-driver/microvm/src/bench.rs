//! The comparison of the three data paths, next to the host-process bypass and the cache-line
//! floor, measured alternately in one run (`svnic-microvm bench`; `scripts/bench-microvm.sh`
//! starts the daemon and the echo and places the threads).
//!
//! Every round measures, in an order that rotates from round to round:
//! - each [`DataPath`] of the guest program: user-data round trips with the echo, timed by the
//!   program itself (TSC ticks per message), with KVM's exits per message;
//! - the host-process bypass: the same round trips with the same echo from a host thread in
//!   place of the vCPU (the channel API of `svnic-client`, timed with the TSC as well);
//! - the floor: two host threads handing one cache line back and forth.
//!
//! A round trip is one message in flight, so the message rate is round trips per second: the
//! number of round trips over the sum of their times (1 / the mean round trip), computed the same
//! way for every subject.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use svnic_channels::{ChannelAddr, Message};
use svnic_client::Completions;
use svnic_host_frontend::HostGuest;

use crate::error::MicroVmError;
use crate::launcher::{run_bypass, BypassConfig};
use crate::path::DataPath;
use crate::program::{BypassArgs, Payload};
use crate::stats::{ExitCounts, PerMessage};

/// What one measurement of a round is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// The guest program on one data path.
    Vm(DataPath),
    /// A host thread driving the channel (the host-process bypass).
    HostBypass,
    /// Two host threads ping-ponging one word.
    Floor,
}

impl Subject {
    /// Every subject, in the order of the first round.
    pub const ALL: [Subject; 5] = [
        Subject::Vm(DataPath::Bypass),
        Subject::Vm(DataPath::Doorbell),
        Subject::Vm(DataPath::Mediated),
        Subject::HostBypass,
        Subject::Floor,
    ];

    /// The row name.
    pub fn name(self) -> String {
        match self {
            Subject::Vm(p) => format!("micro-VM {p}"),
            Subject::HostBypass => "host-process bypass".into(),
            Subject::Floor => "cache-line floor".into(),
        }
    }
}

/// One measurement.
#[derive(Debug, Clone)]
pub struct Sample {
    /// What was measured.
    pub subject: Subject,
    /// Round trips, in nanoseconds, sorted.
    pub rtt_ns: Vec<f64>,
    /// Round trips per second (their number over the sum of their times).
    pub rate: f64,
    /// The micro-VM's exits over the run, from KVM's counters (not for host subjects, nor
    /// without binary statistics).
    pub exits: Option<ExitCounts>,
    /// The doorbells the micro-VM's program rang over the run (not for host subjects).
    pub doorbells: Option<u64>,
}

impl Sample {
    /// A sample of round trips of `ticks` TSC ticks each, with no exit or doorbell counts.
    pub fn new(subject: Subject, mut ticks: Vec<u64>, ticks_per_ns: f64) -> Self {
        ticks.sort_unstable();
        let rtt_ns: Vec<f64> = ticks.iter().map(|&t| t as f64 / ticks_per_ns).collect();
        let total_s = rtt_ns.iter().sum::<f64>() * 1e-9;
        Sample {
            subject,
            rate: rtt_ns.len() as f64 / total_s.max(1e-12),
            rtt_ns,
            exits: None,
            doorbells: None,
        }
    }

    /// The round trips (messages) measured.
    pub fn messages(&self) -> u64 {
        self.rtt_ns.len() as u64
    }

    /// The doorbells per message, if counted (0 for no messages).
    pub fn doorbells_per_message(&self) -> Option<f64> {
        let n = self.messages();
        self.doorbells
            .map(|d| if n == 0 { 0.0 } else { d as f64 / n as f64 })
    }

    /// The `q` quantile (0..=1) of the round trips, in nanoseconds.
    pub fn quantile(&self, q: f64) -> f64 {
        quantile(&self.rtt_ns, q)
    }
}

/// The `q` quantile of sorted `v` (nearest rank), 0 for none.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Reads the time-stamp counter.
fn tsc() -> u64 {
    // SAFETY: rdtsc reads a counter; it has no memory effects and every x86-64 CPU has it.
    unsafe { std::arch::x86_64::_rdtsc() }
}

/// TSC ticks per nanosecond, measured against the monotonic clock over `over`.
pub fn tsc_per_ns(over: Duration) -> f64 {
    let (t0, c0) = (Instant::now(), tsc());
    while t0.elapsed() < over {
        std::hint::spin_loop();
    }
    let (c1, ns) = (tsc(), t0.elapsed().as_nanos() as f64);
    (c1.wrapping_sub(c0)) as f64 / ns.max(1.0)
}

/// Pins the calling thread to `cpu`; false for a CPU beyond what a `cpu_set_t` holds
/// (`libc::CPU_SETSIZE`), or if the kernel refused (fewer CPUs).
pub fn pin_to(cpu: usize) -> bool {
    if !fits_cpu_set(cpu) {
        return false;
    }
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t and `cpu` < CPU_SETSIZE (checked above), the number
    // of CPUs it holds, so CPU_SET sets a bit inside it (a larger `cpu` would panic).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size given; pid 0 is the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// Whether `cpu` fits in a `cpu_set_t` (is below `libc::CPU_SETSIZE`), so [`pin_to`] can
/// name it.
pub fn fits_cpu_set(cpu: usize) -> bool {
    usize::try_from(libc::CPU_SETSIZE).is_ok_and(|size| cpu < size)
}

/// The settings of a benchmark run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The micro-VM's (and the host thread's) guest socket, with the seed, count, peer, etc.
    pub vm: BypassConfig,
    /// Rounds.
    pub rounds: u32,
    /// CPUs of the floor's two threads.
    pub floor_cpus: (usize, usize),
}

/// Round trips of user-data with the echo at `peer` from a host thread: a channel of a
/// host-process guest at `socket` (the channel API), `count` messages of `seed + i` with
/// cookie `i`, each checked.
pub fn host_bypass(cfg: &BypassConfig, ticks_per_ns: f64) -> Result<Sample, MicroVmError> {
    let guest = HostGuest::connect(&cfg.socket, cfg.memory_size)?;
    let mut ch = guest.create_channel(cfg.endpoint, cfg.ring_size, cfg.timeout)?;
    let p = &cfg.program;
    let result = host_round_trips(&mut ch, p.peer, p.count, p.seed, cfg.timeout);
    guest.destroy_channel(ch, cfg.timeout)?;
    Ok(Sample::new(Subject::HostBypass, result?, ticks_per_ns))
}

/// An empty vector with room for up to `count` round trips, as far as memory allows (it grows
/// past that if need be).
fn ticks_for(count: u64) -> Vec<u64> {
    let mut ticks = Vec::new();
    let _ = ticks.try_reserve_exact(usize::try_from(count).unwrap_or(usize::MAX));
    ticks
}

fn host_round_trips(
    ch: &mut svnic_client::Channel,
    peer: ChannelAddr,
    count: u64,
    seed: u64,
    timeout: Duration,
) -> Result<Vec<u64>, MicroVmError> {
    let mut ticks = ticks_for(count);
    let mut batch = Vec::new();
    for i in 0..count {
        let t0 = tsc();
        let payload = seed.wrapping_add(i).to_le_bytes();
        if !ch.send_user(peer, i, &payload, Completions::OnError)? {
            return Err(MicroVmError::Peer("host bypass: TX ring full".into()));
        }
        ch.flush()?;
        let waited = Instant::now();
        loop {
            batch.clear();
            ch.poll(&mut batch, 4)?;
            match batch.first() {
                None if waited.elapsed() > timeout => {
                    return Err(MicroVmError::Peer(format!(
                        "host bypass: no reply to message {i} within {timeout:?}"
                    )))
                }
                None => std::hint::spin_loop(),
                Some(Message::UserData(u))
                    if batch.len() == 1
                        && u.cookie == i
                        && u.peer == peer
                        && u.data() == payload =>
                {
                    break
                }
                Some(other) => {
                    return Err(MicroVmError::Peer(format!(
                        "host bypass: message {i} answered by {other:?}"
                    )))
                }
            }
        }
        ticks.push(tsc().wrapping_sub(t0));
    }
    Ok(ticks)
}

/// `count` round trips of one word between two threads pinned to `cpus`.
pub fn floor(count: u64, cpus: (usize, usize), ticks_per_ns: f64) -> Sample {
    let word = Arc::new(AtomicU64::new(0));
    let echo = {
        let word = Arc::clone(&word);
        std::thread::spawn(move || {
            pin_to(cpus.1);
            for i in 0..count {
                while word.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                word.store(2 * i + 2, Ordering::Release);
            }
        })
    };
    let mine = std::thread::spawn(move || {
        pin_to(cpus.0);
        let mut ticks = ticks_for(count);
        for i in 0..count {
            let t0 = tsc();
            word.store(2 * i + 1, Ordering::Release);
            while word.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
            }
            ticks.push(tsc().wrapping_sub(t0));
        }
        ticks
    });
    let ticks = mine.join().unwrap_or_default();
    let _ = echo.join();
    Sample::new(Subject::Floor, ticks, ticks_per_ns)
}

/// The micro-VM on `path`: `cfg.program.count` user-data round trips, timed by the program.
pub fn vm_round_trips(
    cfg: &BypassConfig,
    path: DataPath,
    ticks_per_ns: f64,
) -> Result<Sample, MicroVmError> {
    let cfg = BypassConfig {
        program: BypassArgs {
            path,
            payload: Payload::UserData,
            times: cfg.program.count,
            ..cfg.program
        },
        ..cfg.clone()
    };
    let r = run_bypass(&cfg)?;
    if !r.ok() {
        return Err(MicroVmError::BadGuest(format!(
            "{path}: {}",
            r.result.describe()
        )));
    }
    let (exits, doorbells) = (r.exits(), r.result.doorbells);
    Ok(Sample {
        exits,
        doorbells: Some(doorbells),
        ..Sample::new(Subject::Vm(path), r.times, ticks_per_ns)
    })
}

/// Runs `cfg.rounds` rounds of every [`Subject`], the order rotating by one each round;
/// `each` sees every sample as it is taken (with its round).
pub fn run(
    cfg: &BenchConfig,
    mut each: impl FnMut(u32, &Sample),
) -> Result<Vec<Sample>, MicroVmError> {
    let ticks_per_ns = tsc_per_ns(Duration::from_millis(200));
    let mut all = Vec::new();
    for round in 0..cfg.rounds {
        for k in 0..Subject::ALL.len() {
            let subject = Subject::ALL[(k + round as usize) % Subject::ALL.len()];
            let sample = match subject {
                Subject::Vm(path) => vm_round_trips(&cfg.vm, path, ticks_per_ns)?,
                Subject::HostBypass => host_bypass(&cfg.vm, ticks_per_ns)?,
                Subject::Floor => floor(cfg.vm.program.count, cfg.floor_cpus, ticks_per_ns),
            };
            each(round, &sample);
            all.push(sample);
        }
    }
    Ok(all)
}

/// One line per sample: round, subject, median and p99 round trip, rate, doorbells and exits
/// per message.
pub fn describe(round: u32, s: &Sample) -> String {
    let bells = s
        .doorbells_per_message()
        .map_or(String::new(), |d| format!("; {d:.3} doorbells per message"));
    let exits = s.exits.map_or(String::new(), |e| {
        format!("; exits {}", e.describe_per_message(s.messages()))
    });
    format!(
        "round {round}: {:<22} median {:>9.0} ns, p99 {:>9.0} ns, {:>9.0} round trips/s\
         {bells}{exits}",
        s.subject.name(),
        s.quantile(0.5),
        s.quantile(0.99),
        s.rate
    )
}

/// `(median, min, max)` of `v`.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_unstable_by(f64::total_cmp);
    let (lo, hi) = (
        v.first().copied().unwrap_or(0.0),
        v.last().copied().unwrap_or(0.0),
    );
    (quantile(&v, 0.5), lo, hi)
}

fn cell((mid, lo, hi): (f64, f64, f64), digits: usize) -> String {
    format!("{mid:.digits$} ({lo:.digits$}-{hi:.digits$})")
}

/// The summary table (Markdown): per subject, the median over rounds (and the range) of the
/// round-trip median and p99 and of the rate, and the micro-VM's exits per message (the mean
/// over rounds: to the VMM, the program's doorbells, host interrupts, emulated instructions);
/// then the ratios of the targets, round by round.
pub fn summary(samples: &[Sample]) -> String {
    let mut out = String::from(
        "| subject | RTT median ns | RTT p99 ns | round trips/s | exits per message: user space / \
         in-kernel doorbell / host interrupts / emulated |\n|---|---|---|---|---|\n",
    );
    let of = |subject: Subject| samples.iter().filter(move |s| s.subject == subject);
    for subject in Subject::ALL {
        if of(subject).next().is_none() {
            continue;
        }
        let med = spread(of(subject).map(|s| s.quantile(0.5)).collect());
        let p99 = spread(of(subject).map(|s| s.quantile(0.99)).collect());
        let rate = spread(of(subject).map(|s| s.rate).collect());
        let exits: Vec<(PerMessage, f64)> = of(subject)
            .filter_map(|s| {
                Some((
                    s.exits?.per_message(s.messages()),
                    s.doorbells_per_message()?,
                ))
            })
            .collect();
        let exit_cell = if exits.is_empty() {
            "-".to_string()
        } else {
            let mean = |f: fn(&(PerMessage, f64)) -> f64| {
                exits.iter().map(f).sum::<f64>() / exits.len() as f64
            };
            format!(
                "{:.3} / {:.3} / {:.3} / {:.3}",
                mean(|(e, _)| e.user_space),
                mean(|&(_, bells)| bells),
                mean(|(e, _)| e.irq),
                mean(|(e, _)| e.emulated)
            )
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {exit_cell} |\n",
            subject.name(),
            cell(med, 0),
            cell(p99, 0),
            cell(rate, 0)
        ));
    }
    let ratio = |a: Subject, b: Subject| {
        let a: Vec<f64> = of(a).map(|s| s.quantile(0.5)).collect();
        let b: Vec<f64> = of(b).map(|s| s.quantile(0.5)).collect();
        spread(a.iter().zip(&b).map(|(x, y)| x / y.max(1e-9)).collect())
    };
    let bypass = Subject::Vm(DataPath::Bypass);
    out.push_str(&format!(
        "\nmicro-VM bypass / host-process bypass, RTT median, round by round: {} (target <= 1.2)\n\
         VMM-mediated / micro-VM bypass: {} (target >= 10)\n\
         doorbell per message / micro-VM bypass: {}\n",
        cell(ratio(bypass, Subject::HostBypass), 2),
        cell(ratio(Subject::Vm(DataPath::Mediated), bypass), 2),
        cell(ratio(Subject::Vm(DataPath::Doorbell), bypass), 2),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_and_empty_is_zero() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn the_summary_has_a_row_per_subject_measured_and_the_target_ratios() {
        let sample = |subject, ns: u64| Sample::new(subject, vec![2 * ns; 10], 2.0);
        // Every count different, and none equal to the in-kernel total or its other part, so
        // that a column reading the wrong count shows.
        let exits = ExitCounts {
            user_space: 20,
            in_kernel: 90,
            irq: 30,
            halt: 0,
            page_faults: 10,
            other: 50,
            emulated: 60,
        };
        let samples = [
            sample(Subject::Vm(DataPath::Bypass), 1000),
            Sample {
                exits: Some(exits),
                doorbells: Some(40),
                ..sample(Subject::Vm(DataPath::Mediated), 20000)
            },
            sample(Subject::HostBypass, 900),
        ];
        let t = summary(&samples);
        // Per message (10 messages): user space / doorbells / host interrupts / emulated.
        assert!(
            t.contains(concat!(
                "| micro-VM mediated | 20000 (20000-20000) | 20000 (20000-20000) | ",
                "50000 (50000-50000) | 2.000 / 4.000 / 3.000 / 6.000 |"
            )),
            "{t}"
        );
        assert!(
            t.contains(concat!(
                "| host-process bypass | 900 (900-900) | 900 (900-900) | ",
                "1111111 (1111111-1111111) | - |"
            )),
            "{t}"
        );
        let line = describe(1, &samples[1]);
        assert!(
            line.contains("; 4.000 doorbells per message; exits per message: 2.000 user-space"),
            "{line}"
        );
        assert!(!describe(1, &samples[2]).contains("per message"));
        // 2 ticks per ns; one round trip per microsecond.
        assert!(
            t.contains("| micro-VM bypass | 1000 (1000-1000) | 1000 (1000-1000) | 1000000 "),
            "{t}"
        );
        assert!(!t.contains("cache-line floor"), "{t}");
        assert!(
            t.contains("host-process bypass, RTT median, round by round: 1.11"),
            "{t}"
        );
        assert!(t.contains("micro-VM bypass: 20.00 (20.00-20.00)"), "{t}");
    }

    #[test]
    fn the_floor_times_every_round_trip() {
        let s = floor(100, (0, 1), tsc_per_ns(Duration::from_millis(10)));
        assert_eq!(s.rtt_ns.len(), 100);
        assert!(s.rtt_ns.windows(2).all(|w| w[0] <= w[1]));
        assert!(s.quantile(0.5) > 0.0 && s.rate > 0.0);
    }
}
