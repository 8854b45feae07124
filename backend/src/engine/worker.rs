//! A worker ("microengine"): a thread that polls the TX rings of the channels it serves and
//! delivers their messages. Each channel is served by exactly one worker.
//!
//! Adaptive polling: a worker spins while there is work; after `spin_passes` idle passes it
//! yields; after `idle_passes` it advertises sleeping in every served channel's header, re-checks
//! all TX rings (so a message published just before the flag was set is not missed), and blocks
//! on its doorbell eventfd for at most `max_sleep`. A guest that publishes while the flag is set
//! rings the doorbell once per batch.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, error, info};
use svnic_channels::layout::header;
use svnic_channels::{
    ChannelAddr, ChannelId, CompletionStatus, Consumer, FaultReason, Message, RawMessage, RingKind,
};
use svnic_control::{RoutingSnapshot, RoutingTable};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::channel::{completion, EngineChannel};
use super::config::EngineConfig;
use super::counters::{TxTally, WorkerCounters};
use super::deliver::{deliver_locked, Outcome};
use super::Control;

pub(crate) enum Command {
    Attach(Arc<EngineChannel>),
    Detach(ChannelId, Sender<()>),
    Shutdown,
}

/// The engine's handle on one worker thread.
pub(crate) struct WorkerHandle {
    pub index: usize,
    pub cpu: Option<u32>,
    commands: Mutex<Sender<Command>>,
    doorbell: Arc<EventFd>,
    pub counters: Arc<WorkerCounters>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl WorkerHandle {
    pub fn spawn(
        index: usize,
        cpu: Option<u32>,
        config: EngineConfig,
        control: Arc<Control>,
    ) -> std::io::Result<Self> {
        let doorbell = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let counters = Arc::new(WorkerCounters::default());
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            index,
            cpu,
            config,
            control,
            commands: rx,
            doorbell: doorbell.clone(),
            counters: counters.clone(),
            served: Vec::new(),
            completions: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("svnic-worker-{index}"))
            .spawn(move || worker.run())?;
        Ok(WorkerHandle {
            index,
            cpu,
            commands: Mutex::new(tx),
            doorbell,
            counters,
            thread: Mutex::new(Some(thread)),
        })
    }

    fn send(&self, cmd: Command) -> bool {
        let ok = self
            .commands
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(cmd)
            .is_ok();
        self.ring();
        ok
    }

    /// Wakes the worker (doorbell).
    pub fn ring(&self) {
        // An eventfd write only fails if the counter would overflow, which means it is already
        // signalled: nothing is lost.
        let _ = self.doorbell.write(1);
    }

    pub fn attach(&self, ch: Arc<EngineChannel>) {
        self.send(Command::Attach(ch));
    }

    /// Stops serving `id` and waits until the worker has let go of it (it no longer reads the
    /// channel's TX ring once this returns).
    pub fn detach(&self, id: ChannelId) {
        let (ack_tx, ack_rx) = mpsc::channel();
        if self.send(Command::Detach(id, ack_tx)) {
            // The worker answers within one pass; if it died, recv fails and there is nothing
            // left reading the channel either.
            let _ = ack_rx.recv();
        }
    }

    pub fn shutdown(&self) {
        self.send(Command::Shutdown);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if t.join().is_err() {
                error!("worker {} panicked", self.index);
            }
        }
    }
}

struct Served {
    ch: Arc<EngineChannel>,
    tx: Consumer,
    /// The message at the head of the TX ring is waiting for room since this instant.
    held_since: Option<Instant>,
}

struct Worker {
    index: usize,
    cpu: Option<u32>,
    config: EngineConfig,
    control: Arc<Control>,
    commands: Receiver<Command>,
    doorbell: Arc<EventFd>,
    counters: Arc<WorkerCounters>,
    served: Vec<Served>,
    completions: Vec<RawMessage>,
}

/// Result of one pass over one channel.
#[derive(Default)]
struct Pass {
    progress: u64,
    blocked: bool,
}

impl Worker {
    fn run(mut self) {
        if let Some(cpu) = self.cpu {
            pin_to_cpu(cpu);
        }
        info!("worker {} started (cpu {:?})", self.index, self.cpu);
        let mut idle: u32 = 0;
        loop {
            if !self.handle_commands() {
                break;
            }
            let mut progress = 0;
            let mut blocked = false;
            {
                let routes = self.control.routes().load();
                for i in 0..self.served.len() {
                    let p = self.service(i, &routes);
                    progress += p.progress;
                    blocked |= p.blocked;
                }
            }
            self.drop_dead();
            if progress > 0 {
                self.counters.passes.fetch_add(1, Relaxed);
                self.counters.messages.fetch_add(progress, Relaxed);
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle <= self.config.spin_passes {
                std::hint::spin_loop();
            } else if idle <= self.config.idle_passes {
                std::thread::yield_now();
            } else if blocked {
                // Messages wait for room at a destination: nap briefly and retry; the guests
                // that must make room do not ring our doorbell.
                self.wait_doorbell(Duration::from_millis(1));
            } else {
                self.sleep();
                idle = 0;
            }
        }
        info!("worker {} stopped", self.index);
    }

    /// Applies pending commands; false on shutdown.
    fn handle_commands(&mut self) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(Command::Attach(ch)) => {
                    debug!("worker {}: serving {}", self.index, ch.id);
                    let tx = Consumer::new(RingKind::Tx, &ch.layout);
                    self.served.push(Served {
                        ch,
                        tx,
                        held_since: None,
                    });
                    self.counters
                        .channels
                        .store(self.served.len() as u64, Relaxed);
                }
                Ok(Command::Detach(id, ack)) => {
                    self.served.retain(|s| s.ch.id != id);
                    self.counters
                        .channels
                        .store(self.served.len() as u64, Relaxed);
                    let _ = ack.send(());
                }
                Ok(Command::Shutdown) => return false,
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn drop_dead(&mut self) {
        let before = self.served.len();
        self.served.retain(|s| s.ch.is_live());
        if self.served.len() != before {
            self.counters
                .channels
                .store(self.served.len() as u64, Relaxed);
        }
    }

    /// Advertise sleeping, re-check, block on the doorbell, clear the flags.
    fn sleep(&mut self) {
        for s in &self.served {
            s.ch.mem().set_sleeping(header::ENGINE_SLEEPING, true);
        }
        let pending = self.served.iter_mut().any(|s| {
            let mem = s.ch.mem();
            // An index error counts as work: the next pass faults the channel.
            s.tx.available(&mem).map_or(true, |n| n > 0)
        });
        if !pending {
            self.counters.sleeps.fetch_add(1, Relaxed);
            self.wait_doorbell(self.config.max_sleep);
        }
        for s in &self.served {
            s.ch.mem().set_sleeping(header::ENGINE_SLEEPING, false);
        }
    }

    fn wait_doorbell(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.doorbell.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: pfd is a valid pollfd for the duration of the call and nfds is 1.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r > 0 && self.doorbell.read().is_ok() {
            self.counters.doorbells.fetch_add(1, Relaxed);
        }
    }

    /// One pass over served channel `i`: flush its completion backlog, then take up to
    /// `poll_budget` messages from its TX ring and deliver them.
    fn service(&mut self, i: usize, routes: &RoutingSnapshot<Arc<EngineChannel>>) -> Pass {
        let budget = self.config.poll_budget;
        let wait = self.config.backpressure_wait;
        let Some(s) = self.served.get_mut(i) else {
            return Pass::default();
        };
        let src = s.ch.clone();
        if !src.is_live() {
            return Pass::default();
        }
        // Completions that found the RX ring full come first; while too many wait, take no
        // more messages (the sender must drain its RX ring: backpressure, not loss).
        if src.flush_backlog() >= src.layout.ring_size as usize {
            return Pass::default();
        }
        let mem = src.mem();
        let avail = match s.tx.available(&mem) {
            Ok(n) => n,
            Err(e) => {
                self.counters.faults.fetch_add(1, Relaxed);
                src.fault(FaultReason::TxIndex, &e);
                return Pass::default();
            }
        };
        let mut tally = TxTally::default();
        let mut pass = Pass::default();
        let mut dirty: Option<(Arc<EngineChannel>, u64, u64)> = None;
        let mut lookup = RouteLookup {
            snapshot: routes,
            table: self.control.routes(),
            last: None,
        };
        for _ in 0..avail.min(budget) {
            let raw = match s.tx.peek(&mem) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    self.counters.faults.fetch_add(1, Relaxed);
                    src.fault(FaultReason::TxIndex, &e);
                    break;
                }
            };
            let (outcome, peer) = route_and_deliver(
                &src,
                &mem,
                &raw,
                &mut lookup,
                s.held_since.is_some(),
                &mut dirty,
            );
            let cookie = raw.cookie();
            let failed = match outcome {
                Outcome::Delivered { completion, .. } => {
                    tally.delivered();
                    if let Some(c) = completion {
                        self.completions.push(c);
                    }
                    None
                }
                Outcome::Failed(status) => Some(status),
                Outcome::DestinationBroken(reason, err) => {
                    if let Some((_, d)) = routes.lookup(&peer) {
                        self.counters.faults.fetch_add(1, Relaxed);
                        d.fault(reason, &err);
                    }
                    Some(CompletionStatus::DestinationFaulted)
                }
                Outcome::Blocked(status) => {
                    let since = *s.held_since.get_or_insert_with(|| {
                        tally.holds += 1;
                        Instant::now()
                    });
                    if since.elapsed() < wait {
                        pass.blocked = true;
                        break;
                    }
                    Some(status)
                }
            };
            if let Some(status) = failed {
                tally.error(status);
                self.completions.push(completion(peer, cookie, status, 0));
            }
            s.held_since = None;
            s.tx.skip();
        }
        if let Err(e) = s.tx.release(&mem) {
            src.fault(FaultReason::TxIndex, &e);
        }
        publish(dirty);
        pass.progress = tally.taken;
        src.counters.add_tx(&tally);
        src.post_completions(&mut self.completions);
        pass
    }
}

/// Where one pass over a channel finds destinations: the snapshot loaded for the pass, the live
/// table (for a route bound since), and the last route found in the snapshot.
struct RouteLookup<'r> {
    snapshot: &'r RoutingSnapshot<Arc<EngineChannel>>,
    table: &'r RoutingTable<Arc<EngineChannel>>,
    last: Option<(ChannelAddr, &'r Arc<EngineChannel>)>,
}

impl<'r> RouteLookup<'r> {
    /// The destination bound to `peer` in the pass's snapshot. A batch usually goes to one peer
    /// and the snapshot cannot change under the pass, so the last hit is remembered and the
    /// hash lookup is done once per peer change rather than once per message.
    fn cached(&mut self, peer: &ChannelAddr) -> Option<&'r Arc<EngineChannel>> {
        if let Some((addr, dest)) = self.last {
            if addr == *peer {
                return Some(dest);
            }
        }
        let (_, dest) = self.snapshot.lookup(peer)?;
        self.last = Some((*peer, dest));
        Some(dest)
    }
}

/// Decodes and routes one TX message and delivers it. Returns the outcome and the peer the
/// message was addressed to (for the completion). `dirty` accumulates the destination whose RX
/// ring needs publishing; when the destination changes the previous one is published first.
fn route_and_deliver(
    src: &Arc<EngineChannel>,
    mem: &svnic_channels::ChannelMem<'_>,
    raw: &RawMessage,
    lookup: &mut RouteLookup<'_>,
    was_held: bool,
    dirty: &mut Option<(Arc<EngineChannel>, u64, u64)>,
) -> (Outcome, ChannelAddr) {
    let msg = match raw.decode() {
        Ok(m @ Message::UserData(_)) => m,
        Ok(m @ Message::DmaData(d)) => {
            if !src
                .layout
                .data_range_ok(d.data.offset, d.data.len.into(), false)
            {
                return (Outcome::Failed(CompletionStatus::AddressOutOfRange), d.peer);
            }
            m
        }
        Ok(_) | Err(_) => {
            return (
                Outcome::Failed(CompletionStatus::BadMessage),
                ChannelAddr::default(),
            )
        }
    };
    let peer = match &msg {
        Message::UserData(u) => u.peer,
        Message::DmaData(d) => d.peer,
        _ => ChannelAddr::default(),
    };
    // The pass's snapshot may predate a route bound since (a channel created while this pass
    // ran, whose Success its peer already saw): on a miss, look again in the current one.
    let fresh;
    let dest = match lookup.cached(&peer) {
        Some(d) => d,
        None => {
            fresh = lookup.table.load_full();
            match fresh.lookup(&peer) {
                Some((_, d)) => d,
                None => {
                    // A message that was waiting for room at a destination since destroyed.
                    let status = if was_held {
                        CompletionStatus::DestinationGone
                    } else {
                        CompletionStatus::NoRoute
                    };
                    return (Outcome::Failed(status), peer);
                }
            }
        }
    };
    if let Some((d, _, _)) = dirty.as_ref() {
        if !Arc::ptr_eq(d, dest) {
            publish(dirty.take());
        }
    }
    let dest_mem = dest.mem();
    let mut wrote = false;
    let outcome = {
        let mut rx = dest.lock_rx();
        deliver_locked(src, mem, &msg, dest, &dest_mem, &mut rx, &mut wrote)
    };
    if wrote {
        let entry = dirty.get_or_insert_with(|| (dest.clone(), 0, 0));
        if let Outcome::Delivered { bytes, .. } = &outcome {
            entry.1 += 1;
            entry.2 += bytes;
        }
    }
    (outcome, peer)
}

/// Publishes a destination's RX ring (if still open) and wakes its guest if it sleeps.
fn publish(dirty: Option<(Arc<EngineChannel>, u64, u64)>) {
    let Some((dest, messages, bytes)) = dirty else {
        return;
    };
    let mem = dest.mem();
    let result = {
        let mut rx = dest.lock_rx();
        if rx.open {
            rx.rx.publish(&mem)
        } else {
            Ok(())
        }
    };
    dest.counters.add_rx(messages, bytes);
    match result {
        Ok(()) => dest.wake_if_sleeping(&mem),
        Err(e) => dest.fault(FaultReason::RxIndex, &e),
    }
}

/// Pins the calling thread to `cpu` (modulo the CPU set size); logs a warning if refused.
pub fn pin_to_cpu(cpu: u32) {
    // SAFETY: cpu_set_t is plain data; zeroed is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes within `set`; cpu is reduced modulo CPU_SETSIZE first.
    unsafe { libc::CPU_SET(cpu as usize % libc::CPU_SETSIZE as usize, &mut set) };
    // SAFETY: pid 0 is the calling thread; set is valid for its size.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        log::warn!(
            "could not pin worker to cpu {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
}
