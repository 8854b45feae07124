//! The per-guest vhost-user virtio-net device: [`NetDevice`] implements vhost-user-backend's
//! `VhostUserBackend`, moves frames between the guest's virtqueues and its [`SwitchPort`], and
//! reports the device's life to the daemon through [`PortEvents`](super::PortEvents).
//!
//! One device serves one frontend connection (the listener builds a fresh one per connection);
//! the switch port outlives it.
//!
//! Threads: the vhost-user request thread (features, memory table, vring setup, reset), one vring
//! worker (both queues and the port's wake eventfd, so each virtqueue has a single writer), and
//! the listener thread (disconnect). Lock order: the worker never holds the device state lock
//! while it holds a vring lock.

use std::io;
use std::os::unix::io::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use log::{debug, warn, Level};
use svnic_control_plane::log_limited;
use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{ShutdownHandle, VhostUserBackend, VringRwLock, VringState, VringT};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use super::memory_table::{protection, validate_memory_table};
use super::port::{PortCounters, PortId, SwitchPort};
use super::sigbus_guard::{self, FaultOwner, GuestMemoryFault};
use super::switch::Switch;
use super::virtio_net::{
    device_features, read_config, read_tx_frame, write_rx_frame, NetFeatures, RxOutcome,
    MAX_QUEUE_SIZE, NUM_QUEUES, RX_QUEUE, TX_QUEUE,
};
use crate::debug_fields::debug_fields;

/// Event id of the port's wake eventfd on the vring worker's epoll (ids `0..NUM_QUEUES` are the
/// queues, `NUM_QUEUES` is the library's exit / vring-enabled event).
pub const WAKE_EVENT: u16 = NUM_QUEUES as u16 + 1;

/// Bits of every queue in [`DeviceState::stopped_queues`].
const ALL_QUEUES: u32 = (1 << NUM_QUEUES) - 1;

/// TX chains handled per event before the worker yields to RX (it wakes itself to continue).
const TX_BUDGET: usize = 1024;

type GuestMemory = GuestMemoryAtomic<GuestMemoryMmap>;

/// The protocol features offered. REPLY_ACK is added by the vhost crate whatever we say.
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::RESET_DEVICE
}

#[derive(Default)]
struct DeviceState {
    net: NetFeatures,
    /// The last validated memory table (kept, "parked", while the device is stopped).
    memory: Option<Arc<GuestMemoryMmap>>,
    /// Memory reported to the daemon and link up.
    live: bool,
    /// Queues stopped by `GET_VRING_BASE` and not restarted since (bit per queue). The device
    /// goes down when all are: until then the other queue may still be running.
    stopped_queues: u32,
    /// The frontend is gone: nothing may revive the device.
    disconnected: bool,
    /// A fatal protocol violation: the connection is being closed.
    poisoned: bool,
    closer: Option<ShutdownHandle>,
}

struct DeviceInner {
    switch: Arc<Switch>,
    port: Arc<SwitchPort>,
    state: Mutex<DeviceState>,
    /// A TX batch was cut short by the budget; the worker continues on its wake event.
    tx_more: AtomicBool,
    /// A broken ring was already reported (once per start, not per event).
    ring_fault_reported: AtomicBool,
    /// The vring worker's exit event, created with the device so that it cannot be missing
    /// (without one, dropping the daemon blocks forever); handed to the library once.
    exit_event: Mutex<Option<(EventConsumer, EventNotifier)>>,
    /// Exit-event consumers handed to the library, which leaks them (see
    /// [`NetDevice::close_leaked_exit_fds`]).
    exit_fds: Mutex<Vec<RawFd>>,
}

/// The data path's view for one event: validated memory and negotiated features.
struct DataPath {
    mem: Arc<GuestMemoryMmap>,
    net: NetFeatures,
}

/// The virtio-net device of one guest port, for one frontend connection. Cheap to clone (the
/// library wants a `Clone` backend); clones share the device.
#[derive(Clone)]
pub struct NetDevice {
    inner: Arc<DeviceInner>,
}

debug_fields!(NetDevice, |n| port: n.inner.port.id(), live: n.is_live());

impl NetDevice {
    /// A device for `port` (which must belong to `switch`). Fails only if the worker's exit
    /// eventfd cannot be created.
    pub fn new(switch: Arc<Switch>, port: Arc<SwitchPort>) -> io::Result<Self> {
        let exit = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)?;
        Ok(NetDevice {
            inner: Arc::new(DeviceInner {
                switch,
                port,
                state: Mutex::new(DeviceState::default()),
                tx_more: AtomicBool::new(false),
                ring_fault_reported: AtomicBool::new(false),
                exit_event: Mutex::new(Some(exit)),
                exit_fds: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The port this device serves.
    pub fn port(&self) -> PortId {
        self.inner.port.id()
    }

    /// The port's wake eventfd, to register with the vring worker as [`WAKE_EVENT`].
    pub fn wake_fd(&self) -> RawFd {
        self.inner.port.wake_fd()
    }

    /// True while the device is started: memory reported to the daemon, link up.
    pub fn is_live(&self) -> bool {
        self.lock().live
    }

    fn lock(&self) -> MutexGuard<'_, DeviceState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the device the means to end its connection on a fatal protocol violation. If one
    /// already happened (before the listener could call this), the connection ends now.
    pub fn attach_connection(&self, closer: ShutdownHandle) {
        let mut st = self.lock();
        if st.poisoned {
            closer.shutdown();
        }
        st.closer = Some(closer);
    }

    /// The frontend went away: memory and link go down, and the device drops its memory. Call
    /// after the daemon's vring worker has stopped.
    pub fn disconnected(&self) {
        let mut st = self.lock();
        self.go_down(&mut st, "frontend disconnected");
        st.disconnected = true;
        st.memory = None;
        st.closer = None;
        drop(st);
        // The guest's memory is unmapped now if nobody else holds it, not at the next sweep.
        sigbus_guard::release_unused();
    }

    /// Closes the exit-event consumers vhost-user-backend 0.24 leaks: `VringEpollHandler::new`
    /// turns the consumer returned by `exit_event` into a raw fd for its epoll and never closes
    /// it (one fd per connection). Call only after the daemon that used this device is dropped,
    /// which joins its vring worker.
    pub fn close_leaked_exit_fds(&self) {
        let fds = std::mem::take(
            &mut *self
                .inner
                .exit_fds
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for fd in fds {
            // SAFETY: `fd` is the consumer end created in `exit_event` and released with
            // `into_raw_fd` by the library, which only registered it with its epoll. The daemon
            // (epoll and worker) is gone, so nothing else owns or uses this descriptor.
            unsafe {
                libc::close(fd);
            }
        }
    }

    /// Ends the connection: a frontend that sent something unusable.
    fn poison(&self, st: &mut DeviceState) {
        st.poisoned = true;
        if let Some(closer) = &st.closer {
            closer.shutdown();
        }
    }

    /// Tells this device about faults in its guest memory (held weakly: the guard may outlive it).
    fn fault_owner(&self) -> Arc<FaultOwner> {
        let device = Arc::downgrade(&self.inner);
        FaultOwner::new(u64::from(self.port().0), move |fault| {
            if let Some(inner) = device.upgrade() {
                NetDevice { inner }.memory_vanished(fault);
            }
        })
    }

    /// Guest memory vanished under the daemon (zero memory stands in): the connection ends.
    fn memory_vanished(&self, fault: GuestMemoryFault) {
        log_limited!(
            Level::Warn,
            "{}: guest memory at {:#x} vanished under the daemon (file truncated, hole punched or \
             hugepage pool exhausted); closing the connection ({} such faults in all)",
            self.port(),
            fault.gpa,
            sigbus_guard::recovered_faults()
        );
        let mut st = self.lock();
        self.poison(&mut st);
    }

    /// Memory already reported: link up, then `connection(true)`.
    fn go_live(&self, st: &mut DeviceState) {
        let port = self.port();
        self.inner.port.set_up(true);
        st.live = true;
        self.inner
            .ring_fault_reported
            .store(false, Ordering::Relaxed);
        self.inner.switch.events().connection(port, true);
        log_limited!(Level::Info, "{port}: device started, link up");
    }

    /// Link down (queued frames dropped), `memory_changed(None)`, `connection(false)`. The
    /// device keeps its own reference to the memory until after the daemon was told.
    fn go_down(&self, st: &mut DeviceState, why: &str) {
        if !st.live {
            return;
        }
        let port = self.port();
        self.inner.port.set_up(false);
        st.live = false;
        self.inner.switch.events().memory_changed(port, None);
        self.inner.switch.events().connection(port, false);
        log_limited!(Level::Info, "{port}: link down ({why})");
    }

    /// The data path's view, or `None` if the device is not started. A queue event on a stopped
    /// device whose frontend restarted the rings without a new memory table revives it with the
    /// parked table.
    ///
    /// A kick of a ring the frontend has disabled is stale (one already on its way when the
    /// frontend reset the device, say): it neither restarts its queue nor revives the device.
    fn data_path(&self, queue: Option<u16>, vrings: &[VringRwLock]) -> Option<DataPath> {
        // Read before taking the state lock, so that this thread never holds both locks.
        let ring_enabled = queue.is_some_and(|q| {
            vrings
                .get(usize::from(q))
                .is_some_and(|v| v.get_ref().is_enabled())
        });
        let mut st = self.lock();
        if st.poisoned || st.disconnected {
            return None;
        }
        if let Some(q) = queue.filter(|_| ring_enabled) {
            st.stopped_queues &= !(1 << q);
        }
        let mem = st.memory.clone()?;
        if !st.live {
            // Only a ring that runs again may revive the device, not a stale wake or kick.
            if !ring_enabled {
                return None;
            }
            log_limited!(
                Level::Info,
                "{}: rings restarted without a new memory table: using the one it has",
                self.port()
            );
            self.inner
                .switch
                .events()
                .memory_changed(self.port(), Some(Arc::clone(&mem)));
            self.go_live(&mut st);
        }
        Some(DataPath { mem, net: st.net })
    }

    fn report_ring_fault(&self, queue: &str, e: &virtio_queue::Error) {
        if !self.inner.ring_fault_reported.swap(true, Ordering::Relaxed) {
            warn!("{}: {queue} queue unusable: {e}", self.port());
        }
    }

    /// Drains the guest's TX queue into the switch.
    fn drain_tx(&self, vrings: &[VringRwLock], dp: &DataPath) {
        let Some(vring) = vrings.get(usize::from(TX_QUEUE)) else {
            return;
        };
        let port = &self.inner.port;
        let mem = &*dp.mem;
        let mut state = vring.get_mut();
        if !state.is_enabled() || !state.get_queue().ready() {
            return;
        }
        let mut budget = TX_BUDGET;
        let mut completed = false;
        'batches: loop {
            let q = state.get_queue_mut();
            if dp.net.event_idx && q.disable_notification(mem).is_err() {
                break;
            }
            loop {
                if budget == 0 {
                    self.inner.tx_more.store(true, Ordering::Relaxed);
                    port.wake();
                    break 'batches;
                }
                let chain = match q.iter(mem) {
                    Ok(mut chains) => chains.next(),
                    Err(e) => {
                        self.report_ring_fault("TX", &e);
                        break 'batches;
                    }
                };
                let Some(chain) = chain else {
                    break;
                };
                budget -= 1;
                let head = chain.head_index();
                let mut frame = self.inner.switch.alloc_frame();
                let read = read_tx_frame(chain, mem, dp.net.hdr_len, frame.buf_mut());
                let returned = q.add_used(mem, head, 0);
                completed |= returned.is_ok();
                match (read, returned) {
                    (Ok(()), Ok(())) => self.inner.switch.forward(port, frame),
                    (read, returned) => {
                        PortCounters::inc(&port.counters.drops.tx_bad_descriptors);
                        debug!(
                            "{}: bad TX chain {head}: {:?} / {:?}",
                            self.port(),
                            read.err(),
                            returned.err()
                        );
                    }
                }
            }
            if !dp.net.event_idx {
                break;
            }
            // Re-enable notifications, then re-check: chains published in between are handled
            // now, not lost until the next kick.
            match q.enable_notification(mem) {
                Ok(true) => continue,
                _ => break,
            }
        }
        if completed {
            signal_used(&mut state, mem);
        }
    }

    /// Writes the port's queued frames into the guest's RX buffers.
    fn flush_rx(&self, vrings: &[VringRwLock], dp: &DataPath) {
        let Some(vring) = vrings.get(usize::from(RX_QUEUE)) else {
            return;
        };
        let port = &self.inner.port;
        let c = &port.counters;
        let mem = &*dp.mem;
        let mut state = vring.get_mut();
        if !state.is_enabled() || !state.get_queue().ready() {
            return;
        }
        let mut completed = false;
        // Engine frames first (`peek_rx`); each is popped from the queue it was peeked from.
        while let Some((from, frame)) = port.peek_rx() {
            let q = state.get_queue_mut();
            let w = match write_rx_frame(q, mem, &frame, &dp.net) {
                Ok(w) => w,
                Err(e) => {
                    self.report_ring_fault("RX", &e);
                    break;
                }
            };
            if w.bad_chains > 0 {
                PortCounters::add(&c.drops.rx_bad_descriptors, w.bad_chains.into());
                completed = true;
            }
            match w.outcome {
                RxOutcome::Delivered { .. } => {
                    port.pop_rx(from);
                    PortCounters::inc(&c.traffic.rx_frames);
                    PortCounters::add(&c.traffic.rx_bytes, frame.len() as u64);
                    completed = true;
                }
                RxOutcome::TooBig => {
                    port.pop_rx(from);
                    PortCounters::inc(&c.drops.rx_too_big);
                }
                RxOutcome::WriteFailed => {
                    port.pop_rx(from);
                    PortCounters::inc(&c.drops.rx_bad_descriptors);
                    completed = true;
                }
                RxOutcome::NoBuffers { avail_idx } => {
                    if !ask_for_rx_kick(q, mem, avail_idx) {
                        break;
                    }
                }
            }
        }
        if completed {
            signal_used(&mut state, mem);
        }
    }
}

/// Out of RX buffers: asks the driver to kick when it adds one past `seen` (the available index
/// at which the buffers ran out) and returns true if it already has, so the caller retries.
///
/// `Queue::enable_notification` compares with (and, with EVENT_IDX, publishes `avail_event` as)
/// the queue's `next_avail`; after a rewind that is behind the driver's index, and a driver
/// publishing past it would never kick. So both use `seen` here.
fn ask_for_rx_kick(q: &mut Queue, mem: &GuestMemoryMmap, seen: u16) -> bool {
    let next_avail = q.next_avail();
    q.set_next_avail(seen);
    let more = q.enable_notification(mem).unwrap_or(false);
    q.set_next_avail(next_avail);
    more
}

/// Signals the guest once per batch, if the driver asked for it (EVENT_IDX `used_event`, or no
/// VRING_AVAIL_F_NO_INTERRUPT handling: always).
fn signal_used(state: &mut VringState<GuestMemory>, mem: &GuestMemoryMmap) {
    if state
        .get_queue_mut()
        .needs_notification(mem)
        .unwrap_or(true)
    {
        if let Err(e) = state.signal_used_queue() {
            debug!("cannot signal the guest: {e}");
        }
    }
}

impl VhostUserBackend for NetDevice {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        device_features()
    }

    fn acked_features(&self, features: u64) {
        let mut st = self.lock();
        st.net = NetFeatures::from_acked(features);
        debug!(
            "{}: features {features:#x} acked: {:?}",
            self.port(),
            st.net
        );
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        protocol_features()
    }

    fn reset_device(&self) {
        let mut st = self.lock();
        self.go_down(&mut st, "device reset");
        st.net = NetFeatures::default();
    }

    fn set_event_idx(&self, enabled: bool) {
        self.lock().net.event_idx = enabled;
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        read_config(self.inner.port.primary_mac(), offset, size)
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: the virtio-net config space is read-only (write of {} bytes at {offset})",
                self.port(),
                buf.len()
            ),
        ))
    }

    fn update_memory(&self, mem: GuestMemory) -> io::Result<()> {
        let port = self.port();
        let table = mem.memory().into_inner();
        let mut st = self.lock();
        if st.poisoned {
            return Err(io::Error::other("connection is being closed"));
        }
        let accepted = validate_memory_table(&table)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
            .and_then(|backings| {
                let pages = table.iter().zip(&backings).map(|(r, b)| (r, b.page_size));
                sigbus_guard::guard_regions(pages, &self.fault_owner())
                    .map(|()| backings)
                    .map_err(io::Error::other)
            });
        let backings = match accepted {
            Ok(backings) => backings,
            Err(e) => {
                // The library installed the table before calling us: take it away from the
                // vrings before anything touches it.
                if let Ok(guard) = mem.lock() {
                    guard.replace(GuestMemoryMmap::new());
                }
                drop(table);
                log_limited!(
                    Level::Warn,
                    "{port}: frontend sent an unusable memory table: {e}; closing the connection"
                );
                self.go_down(&mut st, "unusable memory table");
                st.memory = None;
                self.poison(&mut st);
                return Err(e);
            }
        };
        log_limited!(
            Level::Info,
            "{port}: memory table: {} region(s), {} MiB, {}",
            table.num_regions(),
            table
                .iter()
                .map(vm_memory::GuestMemoryRegion::len)
                .sum::<u64>()
                >> 20,
            protection(&backings)
        );
        self.inner
            .switch
            .events()
            .memory_changed(port, Some(Arc::clone(&table)));
        // The old table (if any) is released only now, after the daemon was told.
        st.memory = Some(table);
        st.stopped_queues = 0;
        if !st.live {
            self.go_live(&mut st);
        }
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // One worker for both queues and the wake event: a single writer per virtqueue.
        vec![(1 << NUM_QUEUES) - 1]
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        // Called once: `queues_per_thread` has a single worker.
        let (consumer, notifier) = self
            .inner
            .exit_event
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?;
        self.inner
            .exit_fds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(consumer.as_raw_fd());
        Some((consumer, notifier))
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        let mut st = self.lock();
        if let Some(bit) = 1u32.checked_shl(queue_index) {
            st.stopped_queues |= bit;
        }
        if st.stopped_queues & ALL_QUEUES == ALL_QUEUES {
            self.go_down(&mut st, "all queues stopped");
        }
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        // Errors returned here stop the vring worker for good: guest-caused problems are
        // counted and logged instead.
        if device_event == WAKE_EVENT {
            // Before looking at the queue, so that a frame queued meanwhile wakes us again.
            self.inner.port.consume_wake();
        }
        let queue = (usize::from(device_event) < NUM_QUEUES).then_some(device_event);
        let Some(dp) = self.data_path(queue, vrings) else {
            return Ok(());
        };
        match device_event {
            RX_QUEUE => self.flush_rx(vrings, &dp),
            TX_QUEUE => self.drain_tx(vrings, &dp),
            WAKE_EVENT => {
                if self.inner.tx_more.swap(false, Ordering::Relaxed) {
                    self.drain_tx(vrings, &dp);
                }
                self.flush_rx(vrings, &dp);
            }
            other => debug!("{}: unexpected event {other}", self.port()),
        }
        Ok(())
    }
}
