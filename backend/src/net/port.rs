//! A switch port: the seam between a guest's virtio-net device and the rest of the daemon.
//!
//! [`PortEvents`] is what the device reports to the daemon; [`SwitchPort`] is the per-guest state
//! the switch keeps (owned MACs, link state, the bounded queues of frames waiting for the guest's
//! RX buffers, the wake eventfd of the device's worker, counters).
//!
//! A port has two RX queues. Frames from the engine (control responses, wakes) wait in a small
//! reserved queue of their own, which the device drains first: switched traffic from other guests
//! (a broadcast flood) can fill only the other queue, so it can neither drop nor delay them. A
//! wake for a channel that already has one waiting (not the one being delivered) is coalesced
//! into it: one pending wake per channel is all a guest needs.

use std::collections::VecDeque;
use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use svnic_channels::{ChannelId, MacAddr};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::frame_pool::PooledFrame;
use crate::counter_set::counter_set;
use crate::debug_fields::debug_fields;

/// A port is named by the guest it belongs to.
pub type PortId = svnic_control_plane::GuestId;

/// What the device reports to the rest of the daemon. Implemented by the daemon.
///
/// Per port, `memory_changed` and `connection` are called one at a time, in this order:
/// `memory_changed(Some)`, `connection(true)`, any number of `memory_changed(Some)` (the table
/// changed), then `memory_changed(None)`, `connection(false)`; and again for the next start of
/// the device or the next connection. `None` only follows a `Some`.
///
/// `svnic_frame` comes from the port's vring worker, only while the link is up. It may overlap a
/// `memory_changed(Some)` (a table change, on the vhost-user request thread), but not a
/// `memory_changed(None)`: on reset, stop and disconnect the rings are stopped first. (The one
/// exception is a frontend that sends an unusable memory table while its rings run: the link
/// goes down at once and the connection is closed.)
///
/// The implementation may call [`super::Switch::inject`] from any of these; it must not wait for
/// the port's own threads.
pub trait PortEvents: Send + Sync {
    /// The guest's memory table was set or changed (Some) or is gone (None: reset, vring stop,
    /// disconnect).
    ///
    /// Called BEFORE the device drops or replaces its own reference to the old memory, and
    /// synchronously: when it returns, the engine no longer uses the old mapping.
    fn memory_changed(&self, port: PortId, mem: Option<Arc<GuestMemoryMmap>>);

    /// An svnic-EtherType frame (`svnic_channels::frame::claims_svnic`) arrived on the guest's TX
    /// queue. It is never switched. Called on the port's vring worker thread: keep it short.
    fn svnic_frame(&self, port: PortId, frame: &[u8]);

    /// Link state: the frontend connected and started the device (true), or went away, reset or
    /// stopped it (false).
    fn connection(&self, port: PortId, connected: bool);
}

counter_set! {
    /// Counters of one port's traffic, by frame direction as the guest sees it: `tx` is what the
    /// guest sent, `rx` what it received.
    pub(crate) struct TrafficCounters;
    /// A port's traffic (see [`PortStats`]).
    pub struct PortTraffic {
        /// Engine frames accepted into the reserved queue, in total.
        engine_frames,
        /// Wake frames not queued because a wake for the same channel was already waiting.
        engine_wakes_coalesced,
        /// Frames the guest sent (every frame read from its TX queue).
        tx_frames,
        /// Bytes of those frames (without the virtio-net header).
        tx_bytes,
        /// Frames written into the guest's RX buffers.
        rx_frames,
        /// Bytes of those frames (without the virtio-net header).
        rx_bytes,
        /// svnic frames handed to the engine.
        to_engine,
        /// Frames handed to the uplink.
        to_uplink,
    }
}

counter_set! {
    /// Counters of the frames (or descriptor chains) a port dropped, by reason.
    pub(crate) struct DropCounters;
    /// Frames (or descriptor chains) a port dropped, by reason.
    pub struct PortDrops {
        /// From the guest: source MAC not owned by the port.
        spoofed,
        /// From the guest: unicast to a MAC no port owns, and no uplink.
        unknown_unicast,
        /// From the guest: shorter than an Ethernet header or longer than the largest frame.
        malformed,
        /// From the guest: unicast to one of its own MACs.
        looped,
        /// TX descriptor chains that were unusable (shorter than the virtio-net header,
        /// write-only or outside guest memory); returned to the guest with length 0.
        tx_bad_descriptors,
        /// To the guest: its RX queue was full.
        rx_queue_full,
        /// To the guest: its link was down (not connected, or device stopped).
        rx_port_down,
        /// To the guest: larger than its receive buffers (no MRG_RXBUF).
        rx_too_big,
        /// RX descriptor chains that were unusable (read-only, outside guest memory, empty);
        /// returned to the guest with length 0.
        rx_bad_descriptors,
        /// To the guest, from the engine: its reserved engine queue was full (the guest does
        /// not drain its RX queue).
        engine_queue_full,
    }
}

/// Counters of one port: its traffic and its drops, written with relaxed `fetch_add` by
/// whichever thread sees the event.
#[derive(Debug, Default)]
pub(crate) struct PortCounters {
    pub traffic: TrafficCounters,
    pub drops: DropCounters,
}

impl PortCounters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn inc(counter: &AtomicU64) {
        Self::add(counter, 1);
    }
}

impl PortDrops {
    /// Sum of every reason.
    pub fn total(&self) -> u64 {
        self.values().sum()
    }
}

/// A snapshot of one port's state and counters, for an operator view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortStats {
    /// The port.
    pub port: PortId,
    /// MACs it owns.
    pub macs: Vec<MacAddr>,
    /// Link up: a frontend is connected and the device started.
    pub link_up: bool,
    /// Switched frames waiting for the guest's RX buffers.
    pub rx_queued: usize,
    /// Engine frames (control responses, wakes) waiting in the reserved queue; delivered first.
    pub engine_queued: usize,
    /// Frames and bytes, by direction.
    pub traffic: PortTraffic,
    /// Drops by reason.
    pub drops: PortDrops,
}

struct RxQueue {
    up: bool,
    /// Engine-originated frames, delivered before `frames`; never displaced by switched traffic.
    engine: VecDeque<EngineFrame>,
    /// Switched frames from other ports.
    frames: VecDeque<Arc<PooledFrame>>,
}

struct EngineFrame {
    frame: Arc<PooledFrame>,
    /// The channel, if the frame is a wake.
    wake: Option<ChannelId>,
}

/// Which of a port's RX queues a frame came from (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RxSource {
    /// The reserved queue of engine frames.
    Engine,
    /// The queue of switched frames.
    Switched,
}

/// What became of an engine frame handed to [`SwitchPort::enqueue_engine`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EngineQueued {
    /// Queued.
    Queued,
    /// A wake for the same channel was already waiting: nothing more to queue.
    Coalesced,
    /// Not queued (counted): link down, or the reserved queue full.
    Refused,
}

/// One guest's port on the switch. Created by [`super::Switch::add_port`]; lives as long as the
/// guest is configured, across frontend connections.
pub struct SwitchPort {
    id: PortId,
    macs: Vec<MacAddr>,
    rx_capacity: usize,
    engine_capacity: usize,
    rx: Mutex<RxQueue>,
    wake: EventFd,
    pub(crate) counters: PortCounters,
}

debug_fields!(SwitchPort, |s| id: s.id, macs: s.macs, up: s.is_up());

impl SwitchPort {
    /// A port whose switched RX queue holds `rx_capacity` frames and whose reserved engine queue
    /// holds `engine_capacity`.
    pub(crate) fn new(
        id: PortId,
        macs: Vec<MacAddr>,
        rx_capacity: usize,
        engine_capacity: usize,
    ) -> io::Result<Self> {
        Ok(SwitchPort {
            id,
            macs,
            rx_capacity,
            engine_capacity,
            rx: Mutex::new(RxQueue {
                up: false,
                engine: VecDeque::new(),
                frames: VecDeque::new(),
            }),
            wake: EventFd::new(EFD_NONBLOCK)?,
            counters: PortCounters::default(),
        })
    }

    /// The port's id.
    pub fn id(&self) -> PortId {
        self.id
    }

    /// MACs the port owns; the first is the one the device reports in its config space.
    pub fn macs(&self) -> &[MacAddr] {
        &self.macs
    }

    /// The MAC the device reports in its config space.
    pub fn primary_mac(&self) -> MacAddr {
        self.macs.first().copied().unwrap_or_default()
    }

    /// True if the port owns `mac`.
    pub fn owns(&self, mac: MacAddr) -> bool {
        self.macs.contains(&mac)
    }

    /// True while a frontend is connected and the device started.
    pub fn is_up(&self) -> bool {
        self.lock_rx().up
    }

    /// The eventfd the switch writes when it queues a frame for this port (edge: only when the
    /// queue goes from empty to non-empty). The device registers it with its vring worker.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// A snapshot of the port's counters.
    pub fn stats(&self) -> PortStats {
        let c = &self.counters;
        let (link_up, rx_queued, engine_queued) = {
            let rx = self.lock_rx();
            (rx.up, rx.frames.len(), rx.engine.len())
        };
        PortStats {
            port: self.id,
            macs: self.macs.clone(),
            link_up,
            rx_queued,
            engine_queued,
            traffic: c.traffic.read(),
            drops: c.drops.read(),
        }
    }

    fn lock_rx(&self) -> MutexGuard<'_, RxQueue> {
        self.rx.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a frame for the guest's RX. False (and counted) if the link is down or the queue
    /// is full. Wakes the device's worker when the queue was empty.
    pub(crate) fn enqueue(&self, frame: Arc<PooledFrame>) -> bool {
        let mut rx = self.lock_rx();
        if !rx.up {
            PortCounters::inc(&self.counters.drops.rx_port_down);
            return false;
        }
        if rx.frames.len() >= self.rx_capacity {
            PortCounters::inc(&self.counters.drops.rx_queue_full);
            return false;
        }
        let was_empty = rx.frames.is_empty();
        rx.frames.push_back(frame);
        drop(rx);
        if was_empty {
            // A failed write means the counter is at its maximum: the worker is awake anyway.
            let _ = self.wake.write(1);
        }
        true
    }

    /// Queues an engine frame (`wake`: the channel, if it is a wake frame) in the reserved queue.
    /// Refused (and counted) if the link is down or the reserved queue is full. A wake for a
    /// channel that already has one waiting behind the front is coalesced into it; the front one
    /// may already be on its way into the guest's buffers, so it does not count. Wakes the
    /// device's worker when the reserved queue was empty.
    pub(crate) fn enqueue_engine(
        &self,
        frame: Arc<PooledFrame>,
        wake: Option<ChannelId>,
    ) -> EngineQueued {
        let mut rx = self.lock_rx();
        if !rx.up {
            PortCounters::inc(&self.counters.drops.rx_port_down);
            return EngineQueued::Refused;
        }
        if wake.is_some() && rx.engine.iter().skip(1).any(|f| f.wake == wake) {
            PortCounters::inc(&self.counters.traffic.engine_wakes_coalesced);
            return EngineQueued::Coalesced;
        }
        if rx.engine.len() >= self.engine_capacity {
            PortCounters::inc(&self.counters.drops.engine_queue_full);
            return EngineQueued::Refused;
        }
        let was_empty = rx.engine.is_empty();
        rx.engine.push_back(EngineFrame { frame, wake });
        drop(rx);
        PortCounters::inc(&self.counters.traffic.engine_frames);
        if was_empty {
            // A failed write means the counter is at its maximum: the worker is awake anyway.
            let _ = self.wake.write(1);
        }
        EngineQueued::Queued
    }

    /// Link up or down. Going down discards the queued frames of both queues (counted as
    /// `rx_port_down`).
    pub(crate) fn set_up(&self, up: bool) {
        let mut rx = self.lock_rx();
        rx.up = up;
        if !up {
            let n = (rx.frames.len() + rx.engine.len()) as u64;
            rx.frames.clear();
            rx.engine.clear();
            PortCounters::add(&self.counters.drops.rx_port_down, n);
        }
    }

    /// The next frame to deliver, left in its queue: the oldest engine frame if there is one,
    /// otherwise the oldest switched frame. Only the port's worker consumes the queues, so the
    /// peeked frame is still at the front of its queue when it calls [`Self::pop_rx`] with the
    /// same source (an engine frame queued in between does not take its place).
    pub(crate) fn peek_rx(&self) -> Option<(RxSource, Arc<PooledFrame>)> {
        let rx = self.lock_rx();
        match rx.engine.front() {
            Some(f) => Some((RxSource::Engine, Arc::clone(&f.frame))),
            None => rx
                .frames
                .front()
                .map(|f| (RxSource::Switched, Arc::clone(f))),
        }
    }

    /// Removes the oldest frame of the queue `from`.
    pub(crate) fn pop_rx(&self, from: RxSource) -> Option<Arc<PooledFrame>> {
        let mut rx = self.lock_rx();
        match from {
            RxSource::Engine => rx.engine.pop_front().map(|f| f.frame),
            RxSource::Switched => rx.frames.pop_front(),
        }
    }

    /// Resets the wake eventfd (before the worker looks at the queue, so that no wake is lost).
    pub(crate) fn consume_wake(&self) {
        let _ = self.wake.read();
    }

    /// Wakes the port's worker (used by the device to continue a TX batch it cut short).
    pub(crate) fn wake(&self) {
        let _ = self.wake.write(1);
    }
}
