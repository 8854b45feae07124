//! The plain values the control plane hands out: guest ids, create requests, channel records and
//! the operator views built from them.

use std::fmt;
use std::time::SystemTime;

use svnic_channels::{ChannelAddr, ChannelId, FailureReason};

use crate::lifecycle::ChannelState;
use crate::policy::GuestPolicy;

/// A registered guest, unique for the engine's lifetime (ids are never reused, so a stale id never
/// names a newer guest).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct GuestId(pub u32);

impl fmt::Display for GuestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "guest {}", self.0)
    }
}

/// A guest's channel-create request, as decoded from its control frame: the ABI crate's type.
pub use svnic_channels::frame::CreateRequest;

/// What the control plane knows about one channel: the operator view.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChannelRecord {
    /// The channel.
    pub id: ChannelId,
    /// The guest it belongs to.
    pub guest: GuestId,
    /// That guest's name (kept after the guest is removed).
    pub guest_name: String,
    /// Its address (MAC, endpoint).
    pub addr: ChannelAddr,
    /// Slots per ring.
    pub ring_size: u32,
    /// Guest-physical address of its region.
    pub region_addr: u64,
    /// Length of its region.
    pub region_len: u64,
    /// Lifecycle state.
    pub state: ChannelState,
    /// True between `begin_destroy` and `finish_destroy`: unrouted, being torn down; the state
    /// stays Pending or Success until the teardown finishes.
    pub destroying: bool,
    /// The engine worker serving it (set on Success).
    pub worker: Option<u32>,
    /// The host CPU that worker runs on, if pinned (set on Success).
    pub cpu: Option<u32>,
    /// When the create request was admitted.
    pub created: SystemTime,
}

impl ChannelRecord {
    /// True while the channel holds its endpoint and quota (Pending or Success, destroying or not).
    pub fn is_live(&self) -> bool {
        self.state.is_live()
    }

    /// End of the region (exclusive); admission guarantees that it does not overflow.
    pub fn region_end(&self) -> u64 {
        self.region_addr.saturating_add(self.region_len)
    }
}

/// A registered guest: the operator view.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GuestInfo {
    /// The guest.
    pub id: GuestId,
    /// Its policy.
    pub policy: GuestPolicy,
    /// Its live channels (Pending or Success), by id.
    pub live_channels: Vec<ChannelId>,
}

/// A create request that was refused, kept in a bounded log for operators.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FailedRequest {
    /// The guest that asked.
    pub guest: GuestId,
    /// Its name, if it was registered.
    pub guest_name: Option<String>,
    /// What it asked for.
    pub request: CreateRequest,
    /// Why it was refused.
    pub reason: FailureReason,
    /// The channel id, if the request had been admitted (Pending) before the engine refused it.
    pub channel: Option<ChannelId>,
    /// When it was refused.
    pub at: SystemTime,
}

/// A channel whose teardown has begun: the one caller that receives this owns the teardown and
/// must end it with [`crate::ControlPlane::finish_destroy`].
#[derive(Clone, Debug)]
pub struct ChannelTeardown<T> {
    /// The channel's record (with `destroying` set).
    pub record: ChannelRecord,
    /// The payload that was routed, if the channel had reached Success; `None` for a Pending one.
    pub payload: Option<T>,
    /// The first routing generation without the channel's route. Data-path readers holding an
    /// older snapshot may still reach the payload: wait until every worker has refreshed to this
    /// generation (or have the payload refuse work) before releasing the channel's memory.
    pub route_generation: u64,
}
