//! [`ControlPlane`]: the guest registry, the channel registry and the routing table.
//!
//! Guests and channels live behind one mutex: the control path is slow and rare, and one lock makes
//! every check-then-reserve atomic (two racing requests for one endpoint cannot both pass). The data
//! path never takes it; it reads the [`RoutingTable`] snapshots only.
//!
//! Lines about one channel (admitted, created, failed, destroyed) are debug: a guest decides how
//! often they happen. The records, [`ControlPlane::failed_requests`] and the engine's counters
//! keep the detail; guests added and removed (operator actions) are logged at info.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime};

use log::{debug, error};
use svnic_channels::{ChannelAddr, ChannelId, FailureReason, MacAddr};

use crate::admission::admit;
use crate::channel_ids::ChannelIds;
use crate::error::ControlError;
use crate::lifecycle::{ChannelState, LifecycleEvent};
use crate::policy::GuestPolicy;
use crate::rate_limit::TokenBucket;
use crate::records::{
    ChannelRecord, ChannelTeardown, CreateRequest, FailedRequest, GuestId, GuestInfo,
};
use crate::routing::RoutingTable;

/// Terminal (Failure or Destroyed) channel records kept for operator views; older ones are dropped.
/// Live records are never dropped.
pub const MAX_TERMINAL_RECORDS: usize = 256;
/// Refused create requests kept for operator views; older ones are dropped.
pub const MAX_FAILED_REQUESTS: usize = 64;

/// The control plane of one engine: guests, channels and routes. See the crate documentation for
/// the lifecycle and the order the engine must follow.
pub struct ControlPlane<T> {
    registry: Mutex<Registry>,
    routes: RoutingTable<T>,
    /// The time the create-rate limits run on.
    clock: Box<dyn Fn() -> Instant + Send + Sync>,
}

struct GuestEntry {
    policy: GuestPolicy,
    /// Live (Pending or Success) channels, destroying or not: they count against the quota.
    live: BTreeSet<ChannelId>,
    /// The guest's create-request budget ([`GuestPolicy::create_burst`] and
    /// [`GuestPolicy::creates_per_sec`]).
    creates: TokenBucket,
}

#[derive(Default)]
struct Registry {
    last_guest_id: u32,
    /// The next channel id: any id no record holds (see the crate documentation).
    channel_ids: ChannelIds,
    guests: BTreeMap<GuestId, GuestEntry>,
    guest_names: HashMap<String, GuestId>,
    mac_owners: HashMap<MacAddr, GuestId>,
    channels: BTreeMap<ChannelId, ChannelRecord>,
    /// Addresses held by live channels (Pending ones included, so none is promised twice).
    reserved: HashMap<ChannelAddr, ChannelId>,
    /// Terminal channels, oldest first, for bounding the records kept.
    terminal: VecDeque<ChannelId>,
    failed: VecDeque<FailedRequest>,
}

impl<T: Clone + Send + Sync + 'static> ControlPlane<T> {
    /// An empty control plane: no guest, no channel, no route.
    pub fn new() -> Self {
        Self::with_clock(Instant::now)
    }

    /// An empty control plane whose create-rate limits read the time from `clock` (tests drive
    /// it by hand).
    pub fn with_clock(clock: impl Fn() -> Instant + Send + Sync + 'static) -> Self {
        ControlPlane {
            registry: Mutex::new(Registry::default()),
            routes: RoutingTable::new(),
            clock: Box::new(clock),
        }
    }

    /// The routing table the data path reads.
    pub fn routes(&self) -> &RoutingTable<T> {
        &self.routes
    }

    /// Registers a guest under a validated `policy`. Refuses a name already registered and a MAC
    /// owned by another registered guest.
    pub fn add_guest(&self, policy: GuestPolicy) -> Result<GuestId, ControlError> {
        policy.validate()?;
        let mut reg = self.lock();
        if let Some(existing) = reg.guest_names.get(&policy.name) {
            return Err(ControlError::GuestNameTaken {
                name: policy.name,
                existing: *existing,
            });
        }
        for mac in &policy.macs {
            if let Some(owner) = reg.mac_owners.get(mac) {
                let owner_name = reg.guest_name(*owner).unwrap_or_default();
                return Err(ControlError::MacOwned {
                    name: policy.name.clone(),
                    mac: *mac,
                    owner: *owner,
                    owner_name,
                });
            }
        }
        let Some(next) = reg.last_guest_id.checked_add(1) else {
            return Err(ControlError::GuestIdsExhausted(GuestId(reg.last_guest_id)));
        };
        reg.last_guest_id = next;
        let id = GuestId(next);
        crate::log_limited!(
            log::Level::Info,
            "{id} {:?} added: MACs {:?}, endpoints {}..={}, up to {} channels of at most {} bytes, creates {}/s in bursts of {}",
            policy.name,
            policy.macs,
            policy.endpoints.start(),
            policy.endpoints.end(),
            policy.max_channels,
            policy.max_region_len,
            policy.creates_per_sec,
            policy.create_burst
        );
        reg.guest_names.insert(policy.name.clone(), id);
        for mac in &policy.macs {
            reg.mac_owners.insert(*mac, id);
        }
        let creates = TokenBucket::full(policy.create_burst, (self.clock)());
        reg.guests.insert(
            id,
            GuestEntry {
                policy,
                live: BTreeSet::new(),
                creates,
            },
        );
        Ok(id)
    }

    /// Unregisters a guest and begins the teardown of all its live channels, atomically: from now
    /// on its requests fail with UnknownGuest, its name and MACs may be registered again, and none
    /// of its channels is routed. Returns the teardowns this call began; the caller owns them and
    /// must finish each with [`ControlPlane::finish_destroy`] before dropping the guest's memory
    /// mapping. Channels whose teardown another caller had already begun are not returned (their
    /// owner finishes them); [`ControlPlane::live_channels_of`] lists whatever is still live.
    pub fn remove_guest(&self, id: GuestId) -> Result<Vec<ChannelTeardown<T>>, ControlError> {
        let mut reg = self.lock();
        let Some(entry) = reg.guests.remove(&id) else {
            return Err(ControlError::UnknownGuest(id));
        };
        reg.guest_names.remove(&entry.policy.name);
        for mac in &entry.policy.macs {
            reg.mac_owners.remove(mac);
        }
        let teardowns: Vec<_> = entry
            .live
            .iter()
            .filter_map(|cid| self.begin_destroy_locked(&mut reg, None, *cid).ok())
            .collect();
        crate::log_limited!(
            log::Level::Info,
            "{id} {:?} removed; {} of its {} live channels to tear down",
            entry.policy.name,
            teardowns.len(),
            entry.live.len()
        );
        Ok(teardowns)
    }

    /// A registered guest.
    pub fn guest(&self, id: GuestId) -> Option<GuestInfo> {
        let reg = self.lock();
        reg.guests.get(&id).map(|e| guest_info(id, e))
    }

    /// The registered guest with this name.
    pub fn guest_by_name(&self, name: &str) -> Option<GuestId> {
        self.lock().guest_names.get(name).copied()
    }

    /// The registered guest that owns `mac`.
    pub fn guest_by_mac(&self, mac: MacAddr) -> Option<GuestId> {
        self.lock().mac_owners.get(&mac).copied()
    }

    /// Every registered guest, by id.
    pub fn guests(&self) -> Vec<GuestInfo> {
        let reg = self.lock();
        reg.guests
            .iter()
            .map(|(id, e)| guest_info(*id, e))
            .collect()
    }

    /// Admits a create request from `guest` (the guest the request *arrived from*, never a field
    /// it wrote) and records the channel as Pending, with its address and quota reserved.
    ///
    /// Checks, in this order, failing with the first that applies: UnknownGuest; RateLimited (the
    /// request takes a token of the guest's create budget, whatever its outcome); MacNotOwned;
    /// EndpointOutOfRange; the ABI layout ([`svnic_channels::ChannelLayout::new`]: BadRingSize,
    /// RegionTooSmall, RegionTooLarge, RegionMisaligned for the length); RegionTooLarge (above the
    /// policy's `max_region_len`); RegionMisaligned (address not 4 KiB aligned);
    /// RegionOutsideMemory (address + length overflows); RegionOverlaps (with a live channel of
    /// the same guest); QuotaExceeded; EndpointTaken (by any live channel, Pending included).
    /// Whether the region lies inside the guest's memory is the engine's check afterwards
    /// ([`ControlPlane::fail_create`]).
    ///
    /// A refused request allocates nothing and consumes no channel id; it is logged in
    /// [`ControlPlane::failed_requests`].
    pub fn begin_create(
        &self,
        guest: GuestId,
        req: &CreateRequest,
    ) -> Result<ChannelId, FailureReason> {
        let now = (self.clock)();
        let mut reg = self.lock();
        match reg.admit_and_reserve(guest, req, now) {
            Ok(id) => {
                debug!("{id} pending for {guest}: {req}");
                Ok(id)
            }
            Err(reason) => {
                debug!("create request from {guest} refused ({reason}): {req}");
                let guest_name = reg.guest_name(guest);
                reg.log_failure(guest, guest_name, *req, reason, None);
                Err(reason)
            }
        }
    }

    /// Pending -> Success: binds the route (MAC, endpoint) -> (`id`, `payload`) and records the
    /// serving `worker` and its `cpu`. Fails if the channel is unknown, not Pending, or being
    /// destroyed (then drop the create work; the teardown's owner finishes the channel).
    pub fn complete_create(
        &self,
        id: ChannelId,
        payload: T,
        worker: u32,
        cpu: Option<u32>,
    ) -> Result<(), ControlError> {
        let mut reg = self.lock();
        let rec = reg.changeable(id)?;
        let next = transition(rec, LifecycleEvent::Established)?;
        self.routes
            .bind(rec.addr, id, payload)
            .map_err(|source| ControlError::Route { id, source })?;
        rec.state = next;
        rec.worker = Some(worker);
        rec.cpu = cpu;
        debug!(
            "{id} of {} created at {}: worker {worker}, cpu {cpu:?}",
            rec.guest, rec.addr
        );
        Ok(())
    }

    /// Pending -> Failure(`reason`): the engine's own checks (e.g. against the guest memory
    /// table) refused an admitted channel. Releases its address and quota.
    pub fn fail_create(&self, id: ChannelId, reason: FailureReason) -> Result<(), ControlError> {
        let mut reg = self.lock();
        let rec = reg.changeable(id)?;
        rec.state = transition(rec, LifecycleEvent::Refused(reason))?;
        let (guest, guest_name, request) = (rec.guest, rec.guest_name.clone(), request_of(rec));
        debug!("{id} of {guest} failed: {reason}");
        reg.release(id);
        reg.log_failure(guest, Some(guest_name), request, reason, Some(id));
        Ok(())
    }

    /// Begins the teardown of channel `id`: unbinds its route (new sends find no route) and marks
    /// it destroying; its state stays Pending or Success, and its address and quota stay held,
    /// until [`ControlPlane::finish_destroy`]. `guest` is `Some` for a guest's request (the channel
    /// must be that guest's) and `None` for the operator or the engine. Fails with NoSuchChannel
    /// if the channel does not exist, is not the guest's (a guest learns nothing about others'
    /// channels), is terminal, or is already being destroyed: exactly one caller owns a teardown.
    pub fn begin_destroy(
        &self,
        guest: Option<GuestId>,
        id: ChannelId,
    ) -> Result<ChannelTeardown<T>, FailureReason> {
        let mut reg = self.lock();
        self.begin_destroy_locked(&mut reg, guest, id)
    }

    /// Ends a teardown begun by [`ControlPlane::begin_destroy`] or [`ControlPlane::remove_guest`]:
    /// -> Destroyed, releasing the channel's address and quota. Call it only once the engine no
    /// longer touches the channel's memory.
    pub fn finish_destroy(&self, id: ChannelId) -> Result<(), ControlError> {
        let mut reg = self.lock();
        let rec = reg
            .channels
            .get_mut(&id)
            .ok_or(ControlError::UnknownChannel(id))?;
        if !rec.destroying {
            return Err(ControlError::NotBeingDestroyed {
                id,
                state: rec.state,
            });
        }
        rec.state = transition(rec, LifecycleEvent::Destroy)?;
        rec.destroying = false;
        debug!("{id} of {} at {} destroyed", rec.guest, rec.addr);
        reg.release(id);
        Ok(())
    }

    /// The record of channel `id` (live, or among the last terminal ones).
    pub fn channel(&self, id: ChannelId) -> Option<ChannelRecord> {
        self.lock().channels.get(&id).cloned()
    }

    /// Every channel record kept, by id.
    pub fn channels(&self) -> Vec<ChannelRecord> {
        self.lock().channels.values().cloned().collect()
    }

    /// The live (Pending or Success) channels of `guest`, whether or not it is still registered.
    pub fn live_channels_of(&self, guest: GuestId) -> Vec<ChannelRecord> {
        let reg = self.lock();
        reg.channels
            .values()
            .filter(|c| c.guest == guest && c.is_live())
            .cloned()
            .collect()
    }

    /// The last [`MAX_FAILED_REQUESTS`] refused create requests, oldest first.
    pub fn failed_requests(&self) -> Vec<FailedRequest> {
        self.lock().failed.iter().cloned().collect()
    }

    fn begin_destroy_locked(
        &self,
        reg: &mut Registry,
        guest: Option<GuestId>,
        id: ChannelId,
    ) -> Result<ChannelTeardown<T>, FailureReason> {
        let Some(rec) = reg.channels.get_mut(&id) else {
            return Err(FailureReason::NoSuchChannel);
        };
        let foreign = guest.is_some_and(|g| g != rec.guest);
        if foreign || rec.destroying || rec.state.next(LifecycleEvent::Destroy).is_err() {
            return Err(FailureReason::NoSuchChannel);
        }
        let payload = if rec.state == ChannelState::Success {
            self.unroute(rec)
        } else {
            None
        };
        rec.destroying = true;
        debug!("{id} of {} at {} being destroyed", rec.guest, rec.addr);
        Ok(ChannelTeardown {
            record: rec.clone(),
            payload,
            route_generation: self.routes.generation(),
        })
    }

    /// Unbinds the route of a Success channel and returns its payload.
    fn unroute(&self, rec: &ChannelRecord) -> Option<T> {
        let bound_here =
            matches!(self.routes.load().lookup(&rec.addr), Some((b, _)) if *b == rec.id);
        if !bound_here {
            error!(
                "{} is in state success but {} is not routed to it",
                rec.id, rec.addr
            );
            return None;
        }
        match self.routes.unbind(&rec.addr) {
            Ok(removed) => Some(removed.payload),
            Err(e) => {
                error!("{}: {e}", rec.id);
                None
            }
        }
    }

    /// Locks the registry. Nothing panics while holding the lock, so a poisoned lock (a panic
    /// elsewhere in the thread) still guards a consistent registry and is used as is.
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Registry {
    fn guest_name(&self, id: GuestId) -> Option<String> {
        self.guests.get(&id).map(|e| e.policy.name.clone())
    }

    fn admit_and_reserve(
        &mut self,
        guest: GuestId,
        req: &CreateRequest,
        now: Instant,
    ) -> Result<ChannelId, FailureReason> {
        let Some(entry) = self.guests.get_mut(&guest) else {
            return Err(FailureReason::UnknownGuest);
        };
        let (burst, per_sec) = (entry.policy.create_burst, entry.policy.creates_per_sec);
        if !entry.creates.try_take(burst, per_sec, now) {
            return Err(FailureReason::RateLimited);
        }
        let live: Vec<&ChannelRecord> = entry
            .live
            .iter()
            .filter_map(|id| self.channels.get(id))
            .collect();
        admit(&entry.policy, req, &live, |addr| {
            self.reserved.contains_key(addr)
        })?;
        let channels = &self.channels;
        let Some(id) = self
            .channel_ids
            .allocate(channels.len(), |id| channels.contains_key(&id))
        else {
            // Only with a record for every one of the 2^32 - 1 ids: not reachable in practice.
            crate::log_limited!(
                log::Level::Error,
                "every channel id is in use; refusing creates"
            );
            return Err(FailureReason::QuotaExceeded);
        };
        let record = ChannelRecord {
            id,
            guest,
            guest_name: entry.policy.name.clone(),
            addr: req.addr(),
            ring_size: req.ring_size,
            region_addr: req.region_addr,
            region_len: req.region_len,
            state: ChannelState::Pending,
            destroying: false,
            worker: None,
            cpu: None,
            created: SystemTime::now(),
        };
        self.reserved.insert(record.addr, id);
        self.channels.insert(id, record);
        if let Some(entry) = self.guests.get_mut(&guest) {
            entry.live.insert(id);
        }
        Ok(id)
    }

    /// The record of `id` if an event may still change it (known, not being destroyed).
    fn changeable(&mut self, id: ChannelId) -> Result<&mut ChannelRecord, ControlError> {
        let rec = self
            .channels
            .get_mut(&id)
            .ok_or(ControlError::UnknownChannel(id))?;
        if rec.destroying {
            return Err(ControlError::ChannelDestroying(id));
        }
        Ok(rec)
    }

    /// Releases the address and quota of a channel that just became terminal, and bounds the
    /// number of terminal records kept.
    fn release(&mut self, id: ChannelId) {
        let Some(rec) = self.channels.get(&id) else {
            return;
        };
        if self.reserved.get(&rec.addr) == Some(&id) {
            self.reserved.remove(&rec.addr);
        }
        if let Some(entry) = self.guests.get_mut(&rec.guest) {
            entry.live.remove(&id);
        }
        self.terminal.push_back(id);
        while self.terminal.len() > MAX_TERMINAL_RECORDS {
            if let Some(old) = self.terminal.pop_front() {
                self.channels.remove(&old);
            }
        }
    }

    fn log_failure(
        &mut self,
        guest: GuestId,
        guest_name: Option<String>,
        request: CreateRequest,
        reason: FailureReason,
        channel: Option<ChannelId>,
    ) {
        self.failed.push_back(FailedRequest {
            guest,
            guest_name,
            request,
            reason,
            channel,
            at: SystemTime::now(),
        });
        while self.failed.len() > MAX_FAILED_REQUESTS {
            self.failed.pop_front();
        }
    }
}

/// The state `rec` reaches on `event`, as a [`ControlError`] if the lifecycle forbids it.
fn transition(rec: &ChannelRecord, event: LifecycleEvent) -> Result<ChannelState, ControlError> {
    rec.state
        .next(event)
        .map_err(|source| ControlError::Transition { id: rec.id, source })
}

/// The create request a channel record was admitted from.
fn request_of(rec: &ChannelRecord) -> CreateRequest {
    CreateRequest {
        mac: rec.addr.mac,
        endpoint: rec.addr.endpoint,
        ring_size: rec.ring_size,
        region_addr: rec.region_addr,
        region_len: rec.region_len,
    }
}

fn guest_info(id: GuestId, entry: &GuestEntry) -> GuestInfo {
    GuestInfo {
        id,
        policy: entry.policy.clone(),
        live_channels: entry.live.iter().copied().collect(),
    }
}

impl<T: Clone + Send + Sync + 'static> Default for ControlPlane<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for ControlPlane<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reg = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("ControlPlane")
            .field("guests", &reg.guests.len())
            .field("channels", &reg.channels.len())
            .field("reserved", &reg.reserved.len())
            .field("routes", &self.routes)
            .finish()
    }
}

#[cfg(test)]
mod tests;
