//! The engine's runtime state of one channel, shared (through `Arc`) by the worker that serves
//! its TX ring and by every worker that delivers into its RX ring.
//!
//! The RX side (RX producer, posted-buffer consumer, completion backlog) sits behind one lock
//! ([`RxLock`]): any worker may deliver into any channel, so writes to an RX ring are serialised
//! by it, and `open == false` (set under the same lock at destroy or fault) guarantees that
//! nobody writes into the channel's memory afterwards.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use log::warn;
use svnic_channels::layout::header;
use svnic_channels::{
    ChannelAddr, ChannelId, ChannelLayout, ChannelMem, Completion, CompletionStatus, Consumer,
    FaultReason, Message, Producer, RawMessage, RingError, RingKind, SharedRegion,
};
use svnic_control_plane::GuestId;

use super::counters::ChannelCounters;
use super::rx_lock::{RxGuard, RxLock};
use crate::debug_fields::debug_fields;

/// Tells a guest that one of its channels has new RX messages while it sleeps.
pub trait GuestWaker: Send + Sync {
    /// Wake the guest's poller of `channel`.
    fn wake(&self, channel: ChannelId);
}

/// Runtime status of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Served normally.
    Live,
    /// Faulted: no longer served, no longer delivered to; awaiting destroy.
    Faulted,
    /// Destroyed: the engine no longer touches its memory.
    Destroyed,
}

const LIVE: u8 = 0;
const FAULTED: u8 = 1;
const DESTROYED: u8 = 2;

/// One channel as the engine runs it.
pub struct EngineChannel {
    pub(crate) id: ChannelId,
    pub(crate) guest: GuestId,
    pub(crate) addr: ChannelAddr,
    pub(crate) worker: usize,
    pub(crate) region: SharedRegion,
    pub(crate) layout: ChannelLayout,
    pub(crate) rx: RxLock<RxSide>,
    /// True while the RX side's completion backlog is not empty; written under the RX lock, read
    /// without it so that a pass over a channel with no backlog takes no lock for it.
    backlog_pending: AtomicBool,
    pub(crate) counters: ChannelCounters,
    /// Guest-physical address of the region.
    pub(crate) region_addr: u64,
    /// The file pages behind the region, to survive a re-sent memory table.
    pub(crate) backing: Option<super::backing::Backing>,
    state: AtomicU8,
    waker: Option<Arc<dyn GuestWaker>>,
}

debug_fields!(EngineChannel, |e| id: e.id, addr: e.addr);

/// Everything a new [`EngineChannel`] is made of.
pub(crate) struct NewChannel {
    pub id: ChannelId,
    pub guest: GuestId,
    pub addr: ChannelAddr,
    pub worker: usize,
    pub region: SharedRegion,
    pub layout: ChannelLayout,
    pub waker: Option<Arc<dyn GuestWaker>>,
    pub region_addr: u64,
    pub backing: Option<super::backing::Backing>,
}

/// The RX side of a channel: written by whichever worker delivers, under the channel's lock.
#[derive(Debug)]
pub(crate) struct RxSide {
    /// False once destroyed or faulted: nothing is written into the channel any more.
    pub open: bool,
    pub rx: Producer,
    pub post: Consumer,
    /// The posted buffer at the head of the post ring is reserved for a DMA-data message being
    /// copied in pieces (see `large_copy`): it stays posted, and other DMA-data waits for it.
    pub post_reserved: bool,
    /// Completions for this channel's own sends that found its RX ring full.
    pub backlog: VecDeque<RawMessage>,
}

impl EngineChannel {
    pub(crate) fn new(spec: NewChannel) -> Self {
        let NewChannel {
            id,
            guest,
            addr,
            worker,
            region,
            layout,
            waker,
            region_addr,
            backing,
        } = spec;
        EngineChannel {
            id,
            guest,
            addr,
            worker,
            rx: RxLock::new(RxSide {
                open: true,
                rx: Producer::new(RingKind::Rx, &layout),
                post: Consumer::new(RingKind::Post, &layout),
                post_reserved: false,
                backlog: VecDeque::new(),
            }),
            backlog_pending: AtomicBool::new(false),
            region,
            layout,
            counters: ChannelCounters::default(),
            region_addr,
            backing,
            state: AtomicU8::new(LIVE),
            waker,
        }
    }

    /// The channel's memory view.
    pub(crate) fn mem(&self) -> ChannelMem<'_> {
        match ChannelMem::new(self.region.slice(), self.layout) {
            Ok(m) => m,
            // The region was resolved with exactly layout.region_len bytes at create.
            Err(_) => unreachable!("channel region shorter than its layout"),
        }
    }

    /// Locks the RX side.
    pub(crate) fn lock_rx(&self) -> RxGuard<'_, RxSide> {
        self.rx.lock()
    }

    /// Records whether `rx` (this channel's RX side, locked by the caller) has a backlog.
    pub(crate) fn note_backlog(&self, rx: &RxSide) {
        // Release, under the lock: a reader that sees `true` also sees the queued completions
        // once it takes the lock. Every store is made under the lock, so they cannot reorder.
        self.backlog_pending
            .store(!rx.backlog.is_empty(), Ordering::Release);
    }

    /// Current run state.
    pub fn run_state(&self) -> RunState {
        match self.state.load(Ordering::Acquire) {
            LIVE => RunState::Live,
            FAULTED => RunState::Faulted,
            _ => RunState::Destroyed,
        }
    }

    pub(crate) fn is_live(&self) -> bool {
        self.state.load(Ordering::Acquire) == LIVE
    }

    /// Faults the channel: records why in its header, closes its RX side. Idempotent.
    pub(crate) fn fault(&self, reason: FaultReason, err: &RingError) {
        if self
            .state
            .compare_exchange(LIVE, FAULTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            warn!(
                "{} ({}, guest {}): {}; channel faulted ({})",
                self.id, self.addr, self.guest.0, err, reason
            );
            let mut rx = self.lock_rx();
            if rx.open {
                self.mem().set_fault(reason);
            }
            self.close_rx(&mut rx);
        }
    }

    /// Marks the channel destroyed and closes its RX side; after this returns no worker writes
    /// into its memory through the RX side.
    pub(crate) fn close(&self) {
        self.state.store(DESTROYED, Ordering::Release);
        let mut rx = self.lock_rx();
        self.close_rx(&mut rx);
    }

    /// Closes `rx` (this channel's RX side, locked by the caller): nothing is written into the
    /// channel any more, and the completions still in its backlog are dropped (and counted).
    fn close_rx(&self, rx: &mut RxSide) {
        rx.open = false;
        let dropped = rx.backlog.len() as u64;
        rx.backlog.clear();
        self.note_backlog(rx);
        self.counters.add_completions(0, dropped);
    }

    /// Wakes the guest if it advertised sleeping (called after publishing RX).
    pub(crate) fn wake_if_sleeping(&self, mem: &ChannelMem<'_>) {
        if self.waker.is_some() {
            fence(Ordering::SeqCst);
            self.wake_if_flagged(mem);
        }
    }

    /// As [`EngineChannel::wake_if_sleeping`], for a caller that has made the SeqCst fence
    /// itself after its publishes (one fence for several channels).
    pub(crate) fn wake_if_flagged(&self, mem: &ChannelMem<'_>) {
        if let Some(w) = &self.waker {
            if mem.peer_flag_set(header::GUEST_SLEEPING) {
                self.counters.wake_sent();
                w.wake(self.id);
            }
        }
    }

    /// Writes completions for this channel's own sends: into the RX ring while there is room,
    /// the rest into the backlog (flushed on later passes). Publishes; returns true if the guest
    /// is then due a [`EngineChannel::wake_if_sleeping`] check (the caller makes it, once for
    /// everything it published in a pass).
    pub(crate) fn post_completions(&self, completions: &mut Vec<RawMessage>) -> bool {
        if completions.is_empty() {
            return false;
        }
        let rx = self.lock_rx();
        self.post_completions_locked(rx, completions)
    }

    /// Locks the RX side if it is free; never waits. For a caller that holds another channel's
    /// RX side (or this one's: then this fails).
    pub(crate) fn try_lock_rx(&self) -> Option<RxGuard<'_, RxSide>> {
        self.rx.try_lock()
    }

    /// [`EngineChannel::post_completions`] with the RX side already locked (and unlocked here).
    pub(crate) fn post_completions_locked(
        &self,
        mut rx: RxGuard<'_, RxSide>,
        completions: &mut Vec<RawMessage>,
    ) -> bool {
        if completions.is_empty() {
            return false;
        }
        let mem = self.mem();
        if !rx.open {
            self.counters.add_completions(0, completions.len() as u64);
            completions.clear();
            return false;
        }
        let mut posted = 0;
        let result = (|| -> Result<(), RingError> {
            rx.flush_backlog(&mem, &mut posted)?;
            for c in completions.iter() {
                if rx.backlog.is_empty() && rx.rx.cached_free() == 0 {
                    rx.rx.free(&mem)?;
                }
                if rx.backlog.is_empty() && rx.rx.push(&mem, c)? {
                    posted += 1;
                } else {
                    rx.backlog.push_back(*c);
                }
            }
            rx.rx.publish(&mem)
        })();
        completions.clear();
        self.note_backlog(&rx);
        self.counters.add_completions(posted, 0);
        drop(rx);
        match result {
            Ok(()) => posted > 0,
            Err(e) => {
                self.fault(FaultReason::RxIndex, &e);
                false
            }
        }
    }

    /// Flushes the completion backlog (serving worker, each pass). Returns the backlog length left.
    pub(crate) fn flush_backlog(&self) -> usize {
        // Acquire: pairs with `note_backlog`. A backlog queued by another worker an instant ago
        // is flushed on the next pass.
        if !self.backlog_pending.load(Ordering::Acquire) {
            return 0;
        }
        let mem = self.mem();
        let mut rx = self.lock_rx();
        if rx.backlog.is_empty() || !rx.open {
            return rx.backlog.len();
        }
        let mut posted = 0;
        let result = rx
            .flush_backlog(&mem, &mut posted)
            .and_then(|_| rx.rx.publish(&mem));
        let left = rx.backlog.len();
        self.note_backlog(&rx);
        self.counters.add_completions(posted, 0);
        drop(rx);
        match result {
            Ok(()) => {
                if posted > 0 {
                    self.wake_if_sleeping(&mem);
                }
            }
            Err(e) => self.fault(FaultReason::RxIndex, &e),
        }
        left
    }
}

impl RxSide {
    fn flush_backlog(&mut self, mem: &ChannelMem<'_>, posted: &mut u64) -> Result<(), RingError> {
        if self.backlog.is_empty() {
            return Ok(());
        }
        self.rx.free(mem)?;
        while let Some(c) = self.backlog.front() {
            if !self.rx.push(mem, c)? {
                break;
            }
            self.backlog.pop_front();
            *posted += 1;
        }
        Ok(())
    }
}

/// A completion message for a message sent to `peer` with `cookie`.
pub(crate) fn completion(
    peer: ChannelAddr,
    cookie: u64,
    status: CompletionStatus,
    len: u32,
) -> RawMessage {
    Message::Completion(Completion {
        peer,
        cookie,
        status,
        len,
    })
    .encode()
}
