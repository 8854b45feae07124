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
    ChannelAddr, ChannelId, CompletionStatus, Consumer, FaultReason, RawMessage, RingKind,
};
use svnic_control_plane::{RoutingSnapshot, RoutingTable};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::channel::{completion, EngineChannel};
use super::config::EngineConfig;
use super::counters::{TxTally, WorkerCounters};
use super::deliver::{parse_tx, DestRun, Outcome, PendingWakes, Tx};
use super::large_copy::{self, LargeCopy, Next};
use super::wire::{ServedChannels, WireSide, WireStats};
use super::EngineControlPlane;

pub use super::cpu::{allowed_cpus, pin_to_cpu};

pub(crate) enum Command {
    Attach(Arc<EngineChannel>),
    /// Join the uplink.
    Wire(Box<WireSide>),
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
    /// Its uplink counters, as last published by its thread.
    pub wire_published: Arc<Mutex<WireStats>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl WorkerHandle {
    pub fn spawn(
        index: usize,
        cpu: Option<u32>,
        config: EngineConfig,
        control_plane: Arc<EngineControlPlane>,
    ) -> std::io::Result<Self> {
        let doorbell = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let counters = Arc::new(WorkerCounters::default());
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            index,
            cpu,
            config,
            control_plane,
            commands: rx,
            doorbell: doorbell.clone(),
            counters: counters.clone(),
            served: Vec::new(),
            completions: Vec::new(),
            wire: None,
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
            wire_published: Arc::new(Mutex::new(WireStats::default())),
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

    /// Hands the worker its side of the uplink.
    pub fn attach_wire(&self, wire: WireSide) {
        self.send(Command::Wire(Box::new(wire)));
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

/// How many TX slots ahead a worker asks the CPU to load the next messages while it delivers
/// (the client prefetches as far ahead on its side).
const TX_PREFETCH_AHEAD: u32 = 8;

/// First and longest nap of a worker whose messages wait for room at their destinations (a
/// full RX ring, no posted buffer). A receiver that drains its ring does not ring the engine's
/// doorbell, so a nap is the delay between room appearing and the worker using it: short at
/// first (the receiver is usually just descheduled for a moment), doubling up to 1 ms while
/// the wait goes on.
const MIN_BLOCKED_NAP: Duration = Duration::from_micros(50);
const MAX_BLOCKED_NAP: Duration = Duration::from_millis(1);

/// A run of deliveries to one destination is published (and its senders' completions posted)
/// once it has copied this many DMA-data bytes, rather than only at the end of the pass: a copy
/// of 16 KiB takes about as long as the receiver needs to notice a message and re-post a buffer,
/// so publishing at this pace keeps bulk transfers pipelined at a negligible cost per byte.
const PUBLISH_EVERY_BYTES: u64 = 16 << 10;

struct Served {
    ch: Arc<EngineChannel>,
    tx: Consumer,
    /// The message at the head of the TX ring is waiting for room since this instant.
    held_since: Option<Instant>,
    /// The message at the head of the TX ring, when it is DMA-data being copied in pieces.
    large: Option<LargeCopy>,
}

struct Worker {
    index: usize,
    cpu: Option<u32>,
    config: EngineConfig,
    control_plane: Arc<EngineControlPlane>,
    commands: Receiver<Command>,
    doorbell: Arc<EventFd>,
    counters: Arc<WorkerCounters>,
    served: Vec<Served>,
    completions: Vec<RawMessage>,
    /// Its side of the uplink, if the engine has one.
    wire: Option<Box<WireSide>>,
}

impl ServedChannels for Vec<Served> {
    fn served(&self, id: ChannelId) -> Option<&EngineChannel> {
        self.iter().find(|s| s.ch.id == id).map(|s| &*s.ch)
    }
}

/// Result of one pass over one channel.
#[derive(Default)]
struct Pass {
    progress: u64,
    blocked: bool,
    /// Stopped early to look again with a fresher routing table: not idle.
    retry: bool,
    /// Copied part of a DMA-data message, though it took no message: not idle.
    busy: bool,
}

impl Worker {
    fn run(mut self) {
        if let Some(cpu) = self.cpu {
            pin_to_cpu(cpu);
        }
        info!("worker {} started (cpu {:?})", self.index, self.cpu);
        let mut idle: u32 = 0;
        let mut nap = MIN_BLOCKED_NAP;
        // The routing snapshot, kept across passes and replaced when the table's generation
        // moves (one atomic load per pass instead of a reference-counted load); dropped while
        // the worker sleeps, so that it does not keep destroyed channels' memory mapped.
        let mut routes: Option<Arc<RoutingSnapshot<Arc<EngineChannel>>>> = None;
        loop {
            if !self.handle_commands() {
                break;
            }
            let mut progress = 0;
            let mut blocked = false;
            let mut retry = false;
            let mut busy = false;
            {
                let table = self.control_plane.routes();
                let snapshot = match &mut routes {
                    Some(r) => {
                        table.refresh(r);
                        r
                    }
                    None => routes.insert(table.load_full()),
                };
                for i in 0..self.served.len() {
                    let p = self.service(i, snapshot);
                    progress += p.progress;
                    blocked |= p.blocked;
                    retry |= p.retry;
                    busy |= p.busy;
                }
                if let Some(w) = &mut self.wire {
                    progress += w.pass(snapshot, &self.served);
                    busy |= w.busy();
                }
            }
            self.drop_dead();
            if progress > 0 || busy {
                self.counters.pass(progress);
                idle = 0;
                nap = MIN_BLOCKED_NAP;
                continue;
            }
            if retry {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle <= self.config.spin_passes {
                std::hint::spin_loop();
            } else if idle <= self.config.idle_passes {
                std::thread::yield_now();
            } else if blocked {
                // Messages wait for room at a destination: nap and retry, the naps growing while
                // nothing moves; the guests that must make room do not ring our doorbell.
                self.wait_doorbell(nap);
                nap = (nap * 2).min(MAX_BLOCKED_NAP);
            } else {
                routes = None;
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
                        large: None,
                    });
                    self.counters
                        .channels
                        .store(self.served.len() as u64, Relaxed);
                }
                Ok(Command::Wire(w)) => {
                    info!("worker {}: on the uplink", self.index);
                    self.wire = Some(w);
                }
                Ok(Command::Detach(id, ack)) => {
                    self.served.retain(|s| s.ch.id != id);
                    if let Some(w) = &mut self.wire {
                        w.forget(id);
                    }
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
        if let Some(w) = &mut self.wire {
            for s in self.served.iter().filter(|s| !s.ch.is_live()) {
                w.forget(s.ch.id);
            }
        }
        self.served.retain(|s| s.ch.is_live());
        if self.served.len() != before {
            self.counters
                .channels
                .store(self.served.len() as u64, Relaxed);
        }
    }

    /// Advertise sleeping, re-check, block on the doorbell, clear the flags.
    fn sleep(&mut self) {
        if let Some(w) = &self.wire {
            w.publish();
        }
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
        if let Some(w) = &mut self.wire {
            w.woke();
        }
    }

    /// Blocks until the doorbell rings, a frame arrives on the uplink, or `timeout` (cut short
    /// to the uplink's next timer) runs out.
    fn wait_doorbell(&self, timeout: Duration) {
        let mut timeout = timeout;
        if let Some(d) = self.wire.as_ref().and_then(|w| w.next_deadline()) {
            timeout = timeout.min(d.saturating_duration_since(Instant::now()));
        }
        let mut pfd = [
            libc::pollfd {
                fd: self.doorbell.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.wire.as_ref().map_or(-1, |w| w.fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            // Below 10^9: fits any c_long.
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: pfd is an array of 2 valid pollfds (a negative fd is ignored by the kernel)
        // and ts a valid timespec for the duration of the call; a null signal mask leaves the
        // thread's mask as it is.
        let r = unsafe { libc::ppoll(pfd.as_mut_ptr(), 2, &ts, std::ptr::null()) };
        if r > 0 && pfd[0].revents != 0 && self.doorbell.read().is_ok() {
            self.counters.doorbells.fetch_add(1, Relaxed);
        }
        if r > 0 && pfd[1].revents & libc::POLLERR != 0 {
            if let Some(w) = &self.wire {
                w.take_error();
            }
        }
    }

    /// One pass over served channel `i`: flush its completion backlog, then take up to
    /// `poll_budget` messages from its TX ring and deliver them, until they have copied
    /// `byte_budget` bytes. A DMA-data message longer than that is copied one `byte_budget` piece
    /// per pass (see `large_copy`); nothing else of the channel moves until it is done.
    fn service(&mut self, i: usize, routes: &RoutingSnapshot<Arc<EngineChannel>>) -> Pass {
        let budget = self.config.poll_budget;
        let byte_budget = self.config.byte_budget;
        let wait = self.config.backpressure_wait;
        let Some(Served {
            ch: src,
            tx,
            held_since,
            large,
        }) = self.served.get_mut(i)
        else {
            return Pass::default();
        };
        let wire = &mut self.wire;
        // `src` is borrowed from the served list, not cloned: an `Arc` clone is a locked
        // instruction, which waits for the previous pass's publishes to reach the cache.
        let src: &EngineChannel = src;
        if !src.is_live() {
            return Pass::default();
        }
        // Completions that found the RX ring full come first; while too many wait, take no
        // more messages (the sender must drain its RX ring: backpressure, not loss). A message
        // being copied in pieces still takes its step: it holds the destination's head posted
        // buffer, and a sender that never drains its RX ring must not hold it for ever (the
        // step ends with at most one completion, and no new message is taken).
        let backlog_full = src.flush_backlog() >= src.layout.ring_size as usize;
        if backlog_full && large.is_none() {
            return Pass::default();
        }
        let mem = src.mem();
        let avail = match tx.available(&mem) {
            Ok(n) => n,
            Err(e) => {
                self.counters.faults.fetch_add(1, Relaxed);
                src.fault(FaultReason::TxIndex, &e);
                return Pass::default();
            }
        };
        let mut tally = TxTally::default();
        let mut pass = Pass::default();
        let mut run: Option<DestRun<'_>> = None;
        let mut wakes = PendingWakes::new();
        let mut lookup = RouteLookup {
            snapshot: routes,
            table: self.control_plane.routes(),
            last: None,
        };
        // The sender's TX indices turned out impossible: it is faulted at the end of the pass.
        let mut tx_broken = None;
        // Messages of this pass not taken yet, and what is left of the budget beyond them.
        let mut left = avail.min(budget);
        let mut room = budget - left;
        // DMA-data bytes this channel copied in this pass.
        let mut copied = 0u64;
        if large.is_some() {
            // The head message is being copied in pieces: its next step comes first.
            let next = large_copy::step(
                large,
                src,
                &mem,
                (byte_budget, wait),
                held_since,
                &mut tally,
                &mut self.completions,
            );
            match next {
                Next::ShareOver { blocked, busy } => {
                    src.counters.add_tx(&tally);
                    pass.blocked = blocked;
                    pass.busy = busy;
                    return pass;
                }
                Next::Taken { bytes, faulted } => {
                    if faulted {
                        self.counters.faults.fetch_add(1, Relaxed);
                    }
                    tx.skip();
                    left = left.saturating_sub(1);
                    copied += bytes;
                    if copied >= u64::from(byte_budget) || backlog_full {
                        (left, room) = (0, 0);
                    }
                }
            }
        }
        loop {
            if left == 0 {
                // The sender may have published more while this pass ran: take them too (within
                // the budget) rather than end the pass, whose end costs a fence for the wake
                // checks and whose next start re-locks the destination.
                let more = if room == 0 { Ok(0) } else { tx.available(&mem) };
                match more {
                    Ok(0) => break,
                    Ok(n) => {
                        left = n.min(room);
                        room -= left;
                    }
                    Err(e) => {
                        tx_broken = Some(e);
                        break;
                    }
                }
            }
            left -= 1;
            let raw = match tx.peek(&mem) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    tx_broken = Some(e);
                    break;
                }
            };
            tx.prefetch(&mem, TX_PREFETCH_AHEAD);
            let (outcome, peer) = match parse_tx(src, &raw) {
                Err((status, peer)) => (Outcome::Failed(status), peer),
                Ok((msg, peer)) => match lookup.cached(&peer) {
                    Some(dest) => {
                        if !run.as_ref().is_some_and(|r| r.is(dest)) {
                            if let Some(r) = run.take() {
                                r.finish(&mut wakes);
                            }
                        }
                        let r = run.get_or_insert_with(|| DestRun::open(dest));
                        match &msg {
                            Tx::Dma(d) if d.data.len > byte_budget => {
                                match r.begin_large(d, &mem, byte_budget) {
                                    Ok(job) => {
                                        // The message stays at the head of the TX ring until
                                        // its last piece; this channel's share of the pass is
                                        // over.
                                        *large = Some(job);
                                        *held_since = None;
                                        pass.busy = true;
                                        break;
                                    }
                                    Err(outcome) => (outcome, peer),
                                }
                            }
                            _ => (r.deliver(src, &mem, &msg, peer), peer),
                        }
                    }
                    None if lookup.table_changed() => {
                        // The pass's snapshot predates a route bound since (a channel created
                        // while this pass ran, whose Success its peer already saw): leave the
                        // message for the next pass, which loads the current table.
                        pass.retry = true;
                        break;
                    }
                    // Not a local guest's MAC: its session on the uplink takes it.
                    None if wire.as_ref().is_some_and(|w| !w.is_local(peer.mac)) => {
                        let outcome = wire.as_mut().map(|w| w.offer(src, &msg, peer));
                        (
                            outcome.unwrap_or(Outcome::Failed(CompletionStatus::NoRoute)),
                            peer,
                        )
                    }
                    // A message that was waiting for room at a destination since destroyed.
                    None if held_since.is_some() => {
                        (Outcome::Failed(CompletionStatus::DestinationGone), peer)
                    }
                    None => (Outcome::Failed(CompletionStatus::NoRoute), peer),
                },
            };
            let cookie = raw.cookie();
            let failed = match outcome {
                Outcome::Delivered { completion, bytes } => {
                    copied += bytes;
                    tally.delivered();
                    if let Some(c) = completion {
                        self.completions.push(c);
                    }
                    None
                }
                Outcome::Failed(status) => Some(status),
                Outcome::DestinationBroken(reason, err) => {
                    // Unlock the destination before faulting it (fault takes its lock).
                    if let Some(r) = run.take() {
                        let dest = r.dest;
                        r.finish(&mut wakes);
                        self.counters.faults.fetch_add(1, Relaxed);
                        dest.fault(reason, &err);
                    }
                    Some(CompletionStatus::DestinationFaulted)
                }
                Outcome::Forwarded => {
                    pass.busy = true;
                    None
                }
                Outcome::Held => {
                    pass.blocked = true;
                    break;
                }
                Outcome::Blocked(status) => {
                    let since = *held_since.get_or_insert_with(|| {
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
            *held_since = None;
            tx.skip();
            if let Some(r) = run.as_mut().filter(|r| r.bytes() >= PUBLISH_EVERY_BYTES) {
                // Bulk DMA-data: let the receiver (and the sender, through its completions) see
                // each copy as soon as it is made, so that they can re-post and re-send while
                // the next copy runs. The run keeps its lock; the TX slots go back first (see
                // below); the completions follow the publish at once if the sender's RX side
                // is free (it may be this very destination), else at the end of the pass. That
                // side is locked before the publish: taking a lock waits until every earlier
                // store has reached the cache, and the publish's line is held by the receiver's
                // core; after it, the publish and the completions travel together.
                tx.prefetch_incoming(&mem);
                let src_rx = if self.completions.is_empty() {
                    None
                } else {
                    src.try_lock_rx()
                };
                if tx.release(&mem).is_err() || !r.publish(&mut wakes) {
                    break;
                }
                if let Some(rx) = src_rx {
                    if src.post_completions_locked(rx, &mut self.completions) {
                        wakes.add(src);
                    }
                }
            }
            if copied >= u64::from(byte_budget) {
                break;
            }
        }
        // Give the TX slots back before publishing at the destination: whoever sees the messages
        // arrive may count on their slots being free again.
        let released = tx.release(&mem);
        if let Some(r) = run.take() {
            r.finish(&mut wakes);
        }
        // After the run is finished: the destination may be this very channel, and a fault
        // takes its lock.
        if let Some(e) = tx_broken.or(released.err()) {
            self.counters.faults.fetch_add(1, Relaxed);
            src.fault(FaultReason::TxIndex, &e);
        }
        pass.progress = tally.taken;
        src.counters.add_tx(&tally);
        // The sender's next messages: on their way while the fence and locks below wait.
        tx.prefetch_incoming(&mem);
        if src.post_completions(&mut self.completions) {
            wakes.add(src);
        }
        wakes.flush();
        pass
    }
}

/// Where one pass over a channel finds destinations: the snapshot loaded for the pass, and the
/// last route found in it.
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

    /// True if the routing table changed since the pass's snapshot was loaded.
    fn table_changed(&self) -> bool {
        self.table.generation() != self.snapshot.generation()
    }
}
