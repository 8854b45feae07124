//! The engine: the emulated communications engine of the self-virtualized NIC.
//!
//! [`Engine`] is the facade the daemon (and tests) use: register guests with their memory,
//! create and destroy channels through the control plane (Pending -> Success | Failure ->
//! Destroyed), ring doorbells, read counters. Worker threads (`worker`) do the data path.

mod backing;
mod channel;
mod config;
mod counters;
mod cpu;
mod deliver;
#[cfg(feature = "dma-timing")]
pub mod dma_timing;
mod large_copy;
mod remote;
mod rx_lock;
mod vector_copy;
mod wire;
pub(crate) mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use log::{debug, info, warn};
use svnic_channels::{
    ChannelAddr, ChannelId, ChannelLayout, FailureReason, RegionError, SharedRegion,
};
use svnic_control_plane::{
    ChannelRecord, ChannelState, ControlPlane, CreateRequest, GuestId, GuestPolicy,
};
use thiserror::Error;
use vm_memory::GuestMemoryMmap;

pub use channel::{EngineChannel, GuestWaker, RunState};
pub use config::{ConfigError, EngineConfig, Placement};
pub use counters::{ChannelStats, WorkerStats};
pub use wire::{WireCounts, WireSetup, WireStats};
pub use worker::{allowed_cpus, pin_to_cpu};

use worker::WorkerHandle;

use crate::debug_fields::debug_fields;

/// The engine's control plane (guests, channel records, routing table): routes carry the
/// runtime channel.
pub type EngineControlPlane = ControlPlane<Arc<EngineChannel>>;

/// Errors of engine management operations (not of channel requests, which answer with a
/// [`FailureReason`]).
#[derive(Debug, Error)]
pub enum EngineError {
    /// Invalid configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A worker thread or its eventfd could not be created.
    #[error("cannot start worker: {0}")]
    Spawn(#[source] std::io::Error),
    /// The guest registry refused the request.
    #[error("guest registry: {0}")]
    ControlPlane(#[from] svnic_control_plane::ControlError),
    /// No such guest.
    #[error("no guest with id {0}")]
    NoSuchGuest(u32),
    /// The uplink could not be attached.
    #[error("uplink: {0}")]
    Uplink(String),
}

/// What a client learns when its channel is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelInfo {
    /// Channel id.
    pub id: ChannelId,
    /// The channel's address (MAC, endpoint).
    pub addr: ChannelAddr,
    /// Serving worker.
    pub worker: u32,
    /// Host CPU the serving worker is pinned to, if any.
    pub cpu: Option<u32>,
}

struct GuestEntry {
    /// None until the guest's memory table arrives (vhost-user), and after it went away.
    memory: Option<Arc<GuestMemoryMmap>>,
    waker: Option<Arc<dyn GuestWaker>>,
}

struct Inner {
    config: EngineConfig,
    control_plane: Arc<EngineControlPlane>,
    workers: Vec<WorkerHandle>,
    guests: Mutex<HashMap<GuestId, GuestEntry>>,
    channels: Mutex<HashMap<ChannelId, Arc<EngineChannel>>>,
    /// Whether the workers are on an uplink.
    uplink: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for w in &self.workers {
            w.shutdown();
        }
    }
}

/// The engine. Cheap to clone (a handle); workers stop when the last handle is dropped.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

debug_fields!(Engine, |e| workers: e.inner.workers.len());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// Validates `config` and starts the workers.
    pub fn new(config: EngineConfig) -> Result<Self, EngineError> {
        config.validate()?;
        let control_plane = Arc::new(EngineControlPlane::new());
        // Worker i goes on the i-th CPU the caller may use (so that `taskset` is respected).
        let cpus = worker::allowed_cpus();
        let mut workers = Vec::with_capacity(config.workers);
        for i in 0..config.workers {
            let cpu = config
                .pin_workers
                .then(|| cpus.get(i % cpus.len().max(1)).copied())
                .flatten();
            workers.push(
                WorkerHandle::spawn(i, cpu, config.clone(), control_plane.clone())
                    .map_err(EngineError::Spawn)?,
            );
        }
        info!(
            "engine started: {} worker(s), placement {:?}",
            config.workers, config.placement
        );
        Ok(Engine {
            inner: Arc::new(Inner {
                config,
                control_plane,
                workers,
                guests: Mutex::new(HashMap::new()),
                channels: Mutex::new(HashMap::new()),
                uplink: AtomicBool::new(false),
            }),
        })
    }

    /// Puts the workers on an uplink: `setups` holds one [`WireSetup`] per worker, in worker
    /// order (each socket already joined to the uplink's fanout group at its worker's index).
    /// Channels must be placed by endpoint hash, as the steering program places their frames.
    pub fn attach_uplink(&self, setups: Vec<WireSetup>) -> Result<(), EngineError> {
        if setups.len() != self.inner.workers.len() {
            return Err(EngineError::Uplink(format!(
                "{} uplink sockets for {} workers",
                setups.len(),
                self.inner.workers.len()
            )));
        }
        if self.inner.config.placement != Placement::EndpointHash {
            return Err(EngineError::Uplink(
                "an uplink needs endpoint-hash placement".into(),
            ));
        }
        let mut sides = Vec::with_capacity(setups.len());
        for (w, setup) in self.inner.workers.iter().zip(setups) {
            let side = wire::WireSide::new(w.index, setup, w.wire_published.clone())
                .map_err(EngineError::Uplink)?;
            sides.push(side);
        }
        for (w, side) in self.inner.workers.iter().zip(sides) {
            w.attach_wire(side);
        }
        self.inner.uplink.store(true, Ordering::Release);
        Ok(())
    }

    /// Each worker's uplink counters (empty without an uplink).
    pub fn wire_stats(&self) -> Vec<WireStats> {
        if !self.inner.uplink.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.inner
            .workers
            .iter()
            .map(|w| {
                let published = w.wire_published.lock();
                let mut stats = published.unwrap_or_else(|e| e.into_inner()).clone();
                stats.worker = w.index;
                stats
            })
            .collect()
    }

    /// The configuration in force.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The control plane (guest and channel registry, routing table), for operator views.
    pub fn control_plane(&self) -> &EngineControlPlane {
        &self.inner.control_plane
    }

    /// Registers a guest with its policy and memory. `waker` is told when a sleeping client of
    /// one of its channels has new messages.
    pub fn add_guest(
        &self,
        policy: GuestPolicy,
        memory: Arc<GuestMemoryMmap>,
        waker: Option<Arc<dyn GuestWaker>>,
    ) -> Result<GuestId, EngineError> {
        let id = self.register_guest(policy, waker)?;
        self.set_guest_memory(id, Some(memory))?;
        Ok(id)
    }

    /// Registers a guest whose memory is not known yet (a vhost-user guest before it connects).
    /// Its create requests fail with RegionOutsideMemory until [`Engine::set_guest_memory`].
    pub fn register_guest(
        &self,
        policy: GuestPolicy,
        waker: Option<Arc<dyn GuestWaker>>,
    ) -> Result<GuestId, EngineError> {
        let id = self.inner.control_plane.add_guest(policy)?;
        lock(&self.inner.guests).insert(
            id,
            GuestEntry {
                memory: None,
                waker,
            },
        );
        Ok(id)
    }

    /// Sets the guest's waker (how a sleeping client of its channels is woken).
    pub fn set_guest_waker(
        &self,
        guest: GuestId,
        waker: Option<Arc<dyn GuestWaker>>,
    ) -> Result<(), EngineError> {
        let mut guests = lock(&self.inner.guests);
        let g = guests
            .get_mut(&guest)
            .ok_or(EngineError::NoSuchGuest(guest.0))?;
        g.waker = waker;
        Ok(())
    }

    /// The guest's memory table arrived or changed (`Some`), or is gone (`None`: reset, stopped
    /// rings, disconnect).
    ///
    /// - `None`: every channel of the guest is destroyed (each acknowledged by its worker) before
    ///   the engine lets go of the old mapping; messages in flight to them become error
    ///   completions for their senders.
    /// - `Some`: each live channel whose range the new table maps to the same file pages keeps
    ///   running; any other is faulted (`MemoryGone`) and must be destroyed by its guest.
    ///
    /// When this returns the engine no longer relies on the old mapping for new work.
    pub fn set_guest_memory(
        &self,
        guest: GuestId,
        memory: Option<Arc<GuestMemoryMmap>>,
    ) -> Result<(), EngineError> {
        if !lock(&self.inner.guests).contains_key(&guest) {
            return Err(EngineError::NoSuchGuest(guest.0));
        }
        match &memory {
            None => {
                let n = self.destroy_guest_channels(guest);
                if n > 0 {
                    svnic_control_plane::log_limited!(
                        log::Level::Info,
                        "guest {}: memory gone, {n} channel(s) destroyed",
                        guest.0
                    );
                }
            }
            Some(new) => {
                let chans: Vec<Arc<EngineChannel>> = lock(&self.inner.channels)
                    .values()
                    .filter(|c| c.guest == guest && c.is_live())
                    .cloned()
                    .collect();
                for ch in chans {
                    let same_pages = ch.backing.is_some()
                        && backing::backing_of(new, ch.region_addr) == ch.backing
                        && SharedRegion::from_guest_memory(
                            new.clone(),
                            ch.region_addr,
                            ch.layout.region_len,
                        )
                        .is_ok();
                    if !same_pages {
                        let err = svnic_channels::RingError::Memory {
                            ring: "region",
                            offset: 0,
                        };
                        ch.fault(svnic_channels::FaultReason::MemoryGone, &err);
                    }
                }
            }
        }
        if let Some(g) = lock(&self.inner.guests).get_mut(&guest) {
            g.memory = memory;
        }
        Ok(())
    }

    /// Destroys every channel of the guest (each acknowledged by its worker), then forgets the
    /// guest and drops its memory. Nothing of the engine touches that memory afterwards.
    pub fn remove_guest(&self, guest: GuestId) -> Result<(), EngineError> {
        for teardown in self.inner.control_plane.remove_guest(guest)? {
            self.teardown(teardown.record.id);
        }
        // Teardowns begun by someone else (a concurrent destroy) finish in their own call; wait
        // for them so that the memory is dropped last.
        // (Each channel keeps its own reference to the mapping, so this orders the teardown; it
        // does not guard the memory. Bounded, so a stuck teardown cannot hang the caller.)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !self.inner.control_plane.live_channels_of(guest).is_empty() {
            if std::time::Instant::now() > deadline {
                warn!(
                    "guest {}: channel teardowns still pending after 10 s",
                    guest.0
                );
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        lock(&self.inner.guests).remove(&guest);
        svnic_control_plane::log_limited!(log::Level::Info, "guest {} removed", guest.0);
        Ok(())
    }

    /// Destroys every live channel of `guest` (reset, disconnect, memory change).
    pub fn destroy_guest_channels(&self, guest: GuestId) -> usize {
        let ids: Vec<ChannelId> = self
            .inner
            .control_plane
            .live_channels_of(guest)
            .into_iter()
            .map(|r| r.id)
            .collect();
        let n = ids.len();
        for id in ids {
            let _ = self.destroy_channel(None, id);
        }
        n
    }

    /// Channel creation, step 1 (the control plane's admission): policy checks and reservation.
    /// The channel is Pending on success.
    pub fn begin_create(
        &self,
        guest: GuestId,
        req: &CreateRequest,
    ) -> Result<ChannelId, FailureReason> {
        self.inner.control_plane.begin_create(guest, req)
    }

    /// Channel creation, step 2: validates the region against the guest's memory, initialises the
    /// channel header, assigns a worker and binds the route. Success or Failure (which
    /// allocates nothing).
    pub fn finish_create(&self, id: ChannelId) -> Result<ChannelInfo, FailureReason> {
        let control_plane = &self.inner.control_plane;
        let rec = control_plane
            .channel(id)
            .ok_or(FailureReason::NoSuchChannel)?;
        let fail = |reason| {
            let _ = control_plane.fail_create(id, reason);
            Err(reason)
        };
        if rec.state != ChannelState::Pending {
            return Err(FailureReason::NoSuchChannel);
        }
        let (memory, waker) = match lock(&self.inner.guests).get(&rec.guest) {
            Some(GuestEntry {
                memory: Some(m),
                waker,
            }) => (m.clone(), waker.clone()),
            Some(_) => return fail(FailureReason::RegionOutsideMemory),
            None => return fail(FailureReason::UnknownGuest),
        };
        let backing = backing::backing_of(&memory, rec.region_addr);
        let layout = match ChannelLayout::new(rec.ring_size, rec.region_len) {
            Ok(l) => l,
            Err(_) => return fail(FailureReason::BadRequest),
        };
        let region = match SharedRegion::from_guest_memory(memory, rec.region_addr, rec.region_len)
        {
            Ok(r) => r,
            Err(RegionError::OutsideMemory { .. }) => {
                return fail(FailureReason::RegionOutsideMemory)
            }
            Err(RegionError::Straddles { .. }) => return fail(FailureReason::RegionStraddles),
        };
        let worker = self.place(rec.addr.endpoint);
        let w = &self.inner.workers[worker];
        let ch = Arc::new(EngineChannel::new(channel::NewChannel {
            id,
            guest: rec.guest,
            addr: rec.addr,
            worker,
            region,
            layout,
            waker,
            region_addr: rec.region_addr,
            backing,
        }));
        if let Err(e) = ch.mem().init_header(id.0, worker as u32, w.cpu) {
            svnic_control_plane::log_limited!(
                log::Level::Warn,
                "{id}: cannot initialise channel header: {e}"
            );
            return fail(FailureReason::RegionOutsideMemory);
        }
        lock(&self.inner.channels).insert(id, ch.clone());
        w.attach(ch.clone());
        if let Err(e) = control_plane.complete_create(id, ch.clone(), worker as u32, w.cpu) {
            // Destroyed while pending (guest went away): undo.
            svnic_control_plane::log_limited!(log::Level::Warn, "{id}: creation overtaken: {e}");
            ch.close();
            w.detach(id);
            lock(&self.inner.channels).remove(&id);
            return Err(FailureReason::NoSuchChannel);
        }
        Ok(ChannelInfo {
            id,
            addr: rec.addr,
            worker: worker as u32,
            cpu: w.cpu,
        })
    }

    /// Both steps of channel creation.
    pub fn create_channel(
        &self,
        guest: GuestId,
        req: &CreateRequest,
    ) -> Result<ChannelInfo, FailureReason> {
        let id = self.begin_create(guest, req)?;
        self.finish_create(id)
    }

    /// Destroys a channel: unbinds its route (new sends to it fail with no route), closes its RX
    /// side (messages waiting for it fail with destination gone), detaches it from its worker and
    /// waits for the acknowledgement. When this returns, the engine no longer touches its memory.
    /// `guest`: the requesting guest (it must own the channel), or None for the operator.
    pub fn destroy_channel(
        &self,
        guest: Option<GuestId>,
        id: ChannelId,
    ) -> Result<(), FailureReason> {
        self.inner.control_plane.begin_destroy(guest, id)?;
        self.teardown(id);
        Ok(())
    }

    /// Second half of a destroy whose route is already unbound.
    fn teardown(&self, id: ChannelId) {
        let ch = lock(&self.inner.channels).remove(&id);
        if let Some(ch) = ch {
            ch.close();
            self.inner.workers[ch.worker].detach(id);
            debug!("{id} ({}) destroyed: {:?}", ch.addr, ch.counters.snapshot());
        }
        if let Err(e) = self.inner.control_plane.finish_destroy(id) {
            svnic_control_plane::log_limited!(log::Level::Warn, "{id}: finishing destroy: {e}");
        }
    }

    /// The guest rang the doorbell of `channel`: wake its worker.
    pub fn doorbell(&self, channel: ChannelId) {
        let worker = lock(&self.inner.channels).get(&channel).map(|c| c.worker);
        if let Some(w) = worker {
            self.inner.workers[w].ring();
        }
    }

    fn place(&self, endpoint: u32) -> usize {
        let n = self.inner.workers.len();
        match self.inner.config.placement {
            // The rule the uplink's steering program computes, so that frames from the wire
            // reach the worker serving their channel.
            Placement::EndpointHash => crate::uplink::packet::worker_of_endpoint(endpoint, n),
            Placement::LeastLoaded => {
                let mut load = vec![0usize; n];
                for c in lock(&self.inner.channels).values() {
                    load[c.worker] += 1;
                }
                (0..n).min_by_key(|i| load[*i]).unwrap_or(0)
            }
        }
    }

    /// Counters of one channel (live or faulted; destroyed channels are forgotten).
    pub fn channel_stats(&self, id: ChannelId) -> Option<ChannelStats> {
        lock(&self.inner.channels)
            .get(&id)
            .map(|c| c.counters.snapshot())
    }

    /// Run state of a channel the engine still holds.
    pub fn run_state(&self, id: ChannelId) -> Option<RunState> {
        lock(&self.inner.channels).get(&id).map(|c| c.run_state())
    }

    /// Counters of every worker.
    pub fn worker_stats(&self) -> Vec<WorkerStats> {
        self.inner
            .workers
            .iter()
            .map(|w| w.counters.snapshot(w.index, w.cpu))
            .collect()
    }

    /// Channel records from the control plane (every state, bounded history of ended ones).
    pub fn channel_records(&self) -> Vec<ChannelRecord> {
        self.inner.control_plane.channels()
    }
}
