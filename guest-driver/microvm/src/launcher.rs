//! The launcher: a micro-VM that is a host-process guest of `svnic serve`.
//!
//! It connects to the daemon as a [`HostGuest`] (which creates the memfd guest memory and
//! brings up virtio-net over vhost-user), creates the channel through the control path on the
//! guest program's behalf (Pending, then Success), registers the very same memory as the KVM
//! memslot, registers the doorbell's ioeventfd, loads the program and its boot-info page from
//! that memory's allocator, and runs the vCPU until the program's final MMIO exit. While it
//! runs, a VMM thread relays the doorbell's signals to the engine ([`relay_doorbells`]) and, on
//! the mediated path, the vCPU thread emulates the device's registers ([`Mediator`]); otherwise
//! the host side never touches the channel while the program runs. It destroys it afterwards.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use log::info;
use svnic_channels::layout::{header, DEFAULT_REGION_LEN};
use svnic_channels::{ChannelAddr, EndpointId};
use svnic_host_frontend::host_guest::CreateState;
use svnic_host_frontend::virtio_user::MemfdMemory;
use svnic_host_frontend::HostGuest;

use crate::boot_info::{BI_DONE, BI_DOORBELLS};
use crate::detect;
use crate::error::MicroVmError;
use crate::path::{
    register_doorbell, relay_doorbells, DataPath, EngineSide, Mediator, MediatorStats, RelayStats,
};
use crate::program::{load_bypass, read_bypass, read_times, BypassArgs, BypassResult};
use crate::stats::{ExitCounts, Snapshot, VcpuStats};
use crate::vcpu::{run_until_exit, run_with, RunOutcome};
use crate::vm::{load, MicroVm, EXIT_GPA};

/// What to run.
#[derive(Debug, Clone)]
pub struct BypassConfig {
    /// The guest socket of `svnic serve` to connect to.
    pub socket: PathBuf,
    /// Guest memory size (at most [`crate::vm::MAX_MEMORY`]).
    pub memory_size: u64,
    /// The guest's channel endpoint.
    pub endpoint: EndpointId,
    /// Slots per ring.
    pub ring_size: u32,
    /// What the program does on the channel: its peer, messages, payloads, data path and
    /// timing.
    pub program: BypassArgs,
    /// Longest wait for the create answer, and for the program to finish.
    pub timeout: Duration,
    /// Reached once the channel exists, before the program starts: micro-VMs that talk to
    /// each other start together, each once the other's channel can receive.
    pub start: Option<Arc<StartLine>>,
}

/// Where micro-VMs that talk to each other wait for one another before their programs start.
/// A launcher that fails before it gets there, or waits there longer than its timeout, abandons
/// the line: every launcher waiting there (or arriving later) fails too, rather than waiting
/// forever or starting without its peer.
#[derive(Debug)]
pub struct StartLine {
    parties: usize,
    /// Launchers arrived, and whether one abandoned the line.
    state: Mutex<(usize, bool)>,
    changed: Condvar,
}

impl StartLine {
    /// A line for `parties` launchers.
    pub fn new(parties: usize) -> Self {
        StartLine {
            parties,
            state: Mutex::new((0, false)),
            changed: Condvar::new(),
        }
    }

    /// Arrives and waits until all `parties` have arrived; an error if one abandoned the line,
    /// or if they did not all arrive within `timeout` (which abandons it).
    pub fn arrive(&self, timeout: Duration) -> Result<(), MicroVmError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.0 += 1;
        self.changed.notify_all();
        loop {
            let (arrived, abandoned) = *state;
            if abandoned {
                return Err(MicroVmError::Start(
                    "another micro-VM failed before it could start".into(),
                ));
            }
            if arrived >= self.parties {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                state.1 = true;
                self.changed.notify_all();
                return Err(MicroVmError::Start(format!(
                    "{arrived} of {} micro-VMs ready within {timeout:?}",
                    self.parties
                )));
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Gives up: every launcher waiting at the line, or arriving later, fails.
    pub fn abandon(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).1 = true;
        self.changed.notify_all();
    }
}

/// Abandons its [`StartLine`] when dropped before [`StartTicket::arrive`]: on every early
/// return of the launcher.
struct StartTicket<'a>(Option<&'a StartLine>);

impl StartTicket<'_> {
    fn arrive(mut self, timeout: Duration) -> Result<(), MicroVmError> {
        match self.0.take() {
            Some(line) => line.arrive(timeout),
            None => Ok(()),
        }
    }
}

impl Drop for StartTicket<'_> {
    fn drop(&mut self) {
        if let Some(line) = self.0 {
            line.abandon();
        }
    }
}

/// What happened.
#[derive(Debug, Clone)]
pub struct BypassReport {
    /// This guest's channel address.
    pub addr: ChannelAddr,
    /// The channel region's guest-physical address, as handed to the program.
    pub channel_gpa: u64,
    /// What the program was asked to do (the messages asked for, the data path it ran).
    pub program: BypassArgs,
    /// What the program reported.
    pub result: BypassResult,
    /// The run.
    pub run: RunOutcome,
    /// The vCPU's KVM statistics over the run (after − before), if the kernel has them.
    pub stats: Option<Snapshot>,
    /// The statistics over a window of the run in the steady state, if one was seen.
    pub steady: Option<Window>,
    /// What the VMM's doorbell relay did.
    pub relay: RelayStats,
    /// What the mediator did (the mediated path only).
    pub mediator: Option<MediatorStats>,
    /// The round trips the program timed, in TSC ticks.
    pub times: Vec<u64>,
}

/// KVM's statistics over the messages `from..to` of a run, read while the vCPU ran: after every
/// ring slot was used once (so every page the program touches has been touched) and well before
/// the final exit.
#[derive(Debug, Clone)]
pub struct Window {
    /// Replies checked right after the first snapshot.
    pub from: u64,
    /// Replies checked right before the second snapshot.
    pub to: u64,
    /// The counters over the window (second − first).
    pub stats: Snapshot,
    /// Doorbells the program rang between the two snapshots (at most: from just before the
    /// first to just after the second).
    pub doorbells: u64,
}

impl Window {
    /// Messages wholly inside the window (the one in flight at the first snapshot may have
    /// begun before it).
    pub fn messages(&self) -> u64 {
        self.to.saturating_sub(self.from + 1)
    }
}

/// Where the steady-state window opens and closes, for `count` messages on rings of
/// `ring_size`: from the first wrap of the rings to halfway through the rest, which leaves the
/// second half for the monitor to see it close before the run ends. None for short runs.
fn window_bounds(count: u64, ring_size: u32) -> Option<(u64, u64)> {
    let from = u64::from(ring_size);
    let to = from + count.checked_sub(from)? / 2;
    (to >= from + 2).then_some((from, to))
}

/// Polls the program's progress in boot info `info` while `running`, and snapshots `stats`
/// when it passes `bounds`. The window counts only if the program had not finished when the
/// second snapshot was taken (its final exit comes after it reports every reply).
fn watch_window(
    memory: &MemfdMemory,
    info: u64,
    stats: &VcpuStats,
    bounds: (u64, u64),
    count: u64,
    running: &AtomicBool,
) -> Option<Window> {
    let done = || load::<u64>(memory, info + BI_DONE).ok();
    let rung = || load::<u64>(memory, info + BI_DOORBELLS).ok();
    let mut first: Option<(u64, u64, Snapshot)> = None;
    while running.load(Ordering::Acquire) {
        let now = done()?;
        match &first {
            None if now >= bounds.0 => {
                let bells = rung()?;
                let snap = stats.snapshot().ok()?;
                first = Some((done()?, bells, snap));
            }
            Some((from, bells, before)) if now >= bounds.1 => {
                let snap = stats.snapshot().ok()?;
                let to = done()?;
                let bells_after = rung()?;
                return (to < count).then(|| Window {
                    from: *from,
                    to: now,
                    stats: snap.since(before),
                    doorbells: bells_after.saturating_sub(*bells),
                });
            }
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    None
}

impl BypassReport {
    /// Whether every reply arrived intact and in order.
    pub fn ok(&self) -> bool {
        self.result.result == crate::boot_info::RESULT_OK && self.result.done == self.program.count
    }

    /// The exits of the whole run by kind, if the kernel has binary statistics.
    pub fn exits(&self) -> Option<ExitCounts> {
        self.stats.as_ref().map(ExitCounts::from_snapshot)
    }

    /// The exits over the steady-state window by kind, if one was seen.
    pub fn steady_exits(&self) -> Option<ExitCounts> {
        self.steady
            .as_ref()
            .map(|w| ExitCounts::from_snapshot(&w.stats))
    }
}

/// Runs the bypass program once, as described in the module documentation.
pub fn run_bypass(cfg: &BypassConfig) -> Result<BypassReport, MicroVmError> {
    let ticket = StartTicket(cfg.start.as_deref());
    let kvm = detect::open()?;
    let guest = HostGuest::connect(&cfg.socket, cfg.memory_size)?;
    let pending = guest.begin_create(cfg.endpoint, cfg.ring_size, DEFAULT_REGION_LEN)?;
    let channel_gpa = pending.region_addr();
    let addr = pending.addr();
    let channel = match pending.wait(cfg.timeout)? {
        CreateState::Success(channel) => channel,
        CreateState::Failure(reason) => return Err(MicroVmError::Create(reason.to_string())),
        CreateState::Pending(_) => {
            return Err(MicroVmError::Create(format!(
                "no answer within {:?}",
                cfg.timeout
            )))
        }
    };
    info!(
        "channel {} at {addr} in guest memory at {channel_gpa:#x}",
        channel.id()
    );
    let program = cfg.program;
    program.payload.check(channel.layout())?;
    let mut vm = MicroVm::new(&kvm, Arc::clone(guest.memory()))?;
    let evt = register_doorbell(vm.vm())?;
    let loaded = load_bypass(&vm, channel_gpa, program)?;
    let info = loaded.info;
    let doorbell = guest.doorbell();
    let (region, layout, channel_id) = (channel.region(), *channel.layout(), channel.id());
    let doorbell = &*doorbell;
    let side = move || EngineSide::new(region, layout, channel_gpa, channel_id, doorbell);
    // The channel's view is checked here, before the program starts, on every path: the
    // relay's own view (built on its thread) is then the same and cannot fail.
    let checked = side()?;
    let mut mediator = match program.path {
        DataPath::Mediated => Some(Mediator::new(checked)),
        DataPath::Bypass | DataPath::Doorbell => None,
    };
    ticket.arrive(cfg.timeout)?;
    let stats = VcpuStats::open(vm.vcpu_mut()).ok();
    let before = stats.as_ref().map(VcpuStats::snapshot).transpose()?;
    let memory = Arc::clone(vm.memory());
    let running = AtomicBool::new(true);
    let (memory, running, count, evt) = (&memory, &running, program.count, &evt);
    let (run, steady, relay) = std::thread::scope(|s| {
        let watcher = match (&stats, window_bounds(program.count, cfg.ring_size)) {
            (Some(st), Some(bounds)) => {
                Some(s.spawn(move || watch_window(memory, info, st, bounds, count, running)))
            }
            _ => None,
        };
        // The relay's own view of the channel: a view of guest memory stays on its thread.
        let relay = s.spawn(move || relay_doorbells(evt, &side()?, running));
        let run = match mediator.as_mut() {
            Some(m) => run_with(vm.vcpu_mut(), EXIT_GPA, cfg.timeout, &mut |a| m.handle(a)),
            None => run_until_exit(vm.vcpu_mut(), EXIT_GPA, cfg.timeout),
        };
        running.store(false, Ordering::Release);
        let relay = relay
            .join()
            .unwrap_or_else(|_| Err(MicroVmError::Relay(std::io::Error::other("it panicked"))));
        (run, watcher.and_then(|w| w.join().ok().flatten()), relay)
    });
    let relay = relay?;
    let after = stats.as_ref().map(VcpuStats::snapshot).transpose()?;
    let run = match run {
        Err(MicroVmError::Timeout { waited }) => {
            let progress = format!(
                "{}; channel: {}",
                read_bypass(&vm, info)?.describe(),
                channel_words(&vm, channel_gpa)?
            );
            return Err(MicroVmError::Stalled { waited, progress });
        }
        other => other?,
    };
    let result = read_bypass(&vm, info)?;
    let times = read_times(&vm, &loaded, result.done)?;
    let mediator = mediator.map(|m| m.stats());
    guest.destroy_channel(channel, cfg.timeout)?;
    Ok(BypassReport {
        addr,
        channel_gpa,
        program,
        result,
        run,
        stats: after.zip(before).map(|(a, b)| a.since(&b)),
        steady,
        relay,
        mediator,
        times,
    })
}

/// The channel's index and flag words (docs/abi.md §2), for a stalled run's report.
fn channel_words(vm: &MicroVm, gpa: u64) -> Result<String, MicroVmError> {
    let words = [
        ("fault", header::FAULT),
        ("tx_head", header::TX_HEAD),
        ("tx_tail", header::TX_TAIL),
        ("rx_head", header::RX_HEAD),
        ("rx_tail", header::RX_TAIL),
        ("engine_sleeping", header::ENGINE_SLEEPING),
    ];
    let mut out = Vec::with_capacity(words.len());
    for (name, offset) in words {
        out.push(format!(
            "{name} {}",
            load::<u32>(vm.memory(), gpa + offset as u64)?
        ));
    }
    Ok(out.join(", "))
}

#[cfg(test)]
mod tests {
    use super::{window_bounds, StartLine, StartTicket};
    use crate::error::MicroVmError;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn the_start_line_lets_all_go_together_and_fails_them_all_if_one_gives_up() {
        let line = Arc::new(StartLine::new(2));
        let other = {
            let line = Arc::clone(&line);
            std::thread::spawn(move || line.arrive(Duration::from_secs(60)))
        };
        line.arrive(Duration::from_secs(60)).expect("both arrived");
        other.join().expect("no panic").expect("both arrived");

        // One launcher fails before it arrives (its ticket dropped on the early return): the
        // one waiting fails at once instead of waiting for it.
        let line = Arc::new(StartLine::new(2));
        let waiting = {
            let line = Arc::clone(&line);
            std::thread::spawn(move || {
                let t0 = Instant::now();
                (line.arrive(Duration::from_secs(60)), t0.elapsed())
            })
        };
        // Abandon only once the other is waiting, so that the abandon must wake it.
        while line.state.lock().map(|s| s.0).unwrap_or(0) < 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(StartTicket(Some(&*line)));
        let (result, waited) = waiting.join().expect("no panic");
        assert!(
            matches!(&result, Err(MicroVmError::Start(why)) if why.contains("failed")),
            "{result:?}"
        );
        assert!(waited < Duration::from_secs(30), "{waited:?}");
        // And so does one arriving after that.
        assert!(line.arrive(Duration::from_secs(60)).is_err());
    }

    #[test]
    fn a_start_line_nobody_else_reaches_fails_after_the_timeout() {
        let line = StartLine::new(2);
        let e = line
            .arrive(Duration::from_millis(20))
            .expect_err("alone at the line");
        assert!(e.to_string().contains("1 of 2 micro-VMs ready"), "{e}");
        // The late one fails as well, rather than start without its peer.
        assert!(line.arrive(Duration::from_secs(60)).is_err());
        // A ticket that arrived does not abandon the line.
        let line = StartLine::new(1);
        StartTicket(Some(&line))
            .arrive(Duration::from_secs(1))
            .expect("one of one");
        line.arrive(Duration::from_secs(1)).expect("not abandoned");
    }

    #[test]
    fn the_steady_window_opens_after_the_first_wrap_and_closes_halfway_through_the_rest() {
        assert_eq!(window_bounds(1000, 256), Some((256, 628)));
        assert_eq!(window_bounds(260, 256), Some((256, 258)));
        // Too short for a window: no more than one message past the first wrap.
        assert_eq!(window_bounds(259, 256), None);
        assert_eq!(window_bounds(100, 256), None);
    }
}
