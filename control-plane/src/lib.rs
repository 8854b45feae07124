//! # svnic-control-plane: the control plane of the svnic engine
//!
//! Guests, their policies, their channels' lifecycle, and the routing table the data path reads.
//! No I/O and no threads: the engine (svnic-backend) calls in from its control path and its
//! workers read [`RoutingTable`] snapshots.
//!
//! ## Channel lifecycle
//!
//! ```text
//!   begin_create ──► Pending ── complete_create ──► Success
//!        │              │  \                          │
//!   (refused:           │   fail_create ──► Failure   │
//!    nothing            │                             │
//!    allocated)         └── begin_destroy ◄───────────┘
//!                                │  unrouted, `destroying`; state unchanged,
//!                                │  address and quota still held
//!                                ▼
//!                          finish_destroy ──► Destroyed
//! ```
//!
//! - [`ControlPlane::begin_create`] admits a guest's request (checks in the order listed there)
//!   and records a **Pending** channel with a fresh [`ChannelId`](svnic_channels::ChannelId).
//!   Its (MAC, endpoint) and one unit of the guest's quota are reserved from this moment, so no
//!   concurrent request can be promised the same endpoint. A refused request allocates nothing
//!   (not even a channel id). Each request, refused or not, takes a token of the guest's create
//!   budget ([`GuestPolicy::create_burst`], [`GuestPolicy::creates_per_sec`]); with none left it
//!   is refused with RateLimited before any other check.
//! - The engine then does its own checks (guest memory table) and sets the channel up, and calls
//!   [`ControlPlane::complete_create`] (**Success**: the route is bound) or
//!   [`ControlPlane::fail_create`] (**Failure**: the reservation is released).
//! - [`ControlPlane::begin_destroy`] unroutes the channel at once (new sends find no route) and
//!   hands the one caller that gets `Ok` a [`ChannelTeardown`]; that caller stops the worker,
//!   waits until no worker holds a routing snapshot older than
//!   [`ChannelTeardown::route_generation`], and calls [`ControlPlane::finish_destroy`]
//!   (**Destroyed**: reservation released). While destroying, `complete_create` and `fail_create`
//!   are refused; the create work is dropped and the teardown owner finishes the channel.
//! - Failure and Destroyed are terminal ([`lifecycle`]); the last [`MAX_TERMINAL_RECORDS`] of
//!   them are kept for operators, live records are never dropped.
//!
//! ## Channel ids
//!
//! Ids are handed out in turn over 1..=u32::MAX (0 is "no channel" on the wire), wrapping back to
//! 1 after u32::MAX, so they never run out whatever a guest does. An id still held by a record
//! (live, and also a kept terminal one, so that a record always names exactly one channel) is
//! skipped, not evicted; an id therefore comes back only after a full cycle, and only once its
//! old record is gone. Failed creates spend an id like any other.
//!
//! ## Order the engine follows when a guest goes away
//!
//! DESIGN.md: a guest reset, reboot or disconnect destroys all its channels before any of its
//! memory mapping is dropped or replaced. So:
//! 1. [`ControlPlane::remove_guest`]: atomically unregisters the guest (its requests now fail
//!    with UnknownGuest; its name and MACs are free again) and begins the teardown of every live
//!    channel, returning the teardowns.
//! 2. For each teardown: stop the worker from touching the channel, then
//!    [`ControlPlane::finish_destroy`].
//! 3. Wait until [`ControlPlane::live_channels_of`] that guest is empty (teardowns begun earlier
//!    by someone else).
//! 4. Only now drop or replace the guest's memory mapping.
//!
//! The engine serialises the control work of one guest (create setup and teardown), so that no
//! create setup is still writing into a region whose Pending channel was torn down.
//!
//! ## Trust
//!
//! The guest a request comes from is the port it arrived on, passed as a [`GuestId`]; nothing a
//! guest writes selects another guest. A guest destroying a channel that is not its own gets
//! NoSuchChannel, exactly as for a channel that does not exist. A MAC belongs to at most one
//! registered guest.

pub mod admission;
mod channel_ids;
pub mod error;
pub mod fast_hash;
pub mod lifecycle;
pub mod log_limit;
pub mod manual_clock;
pub mod policy;
mod rate_limit;
pub mod records;
pub mod registry;
pub mod routing;

pub use admission::failure_reason_for_layout;
pub use error::ControlError;
pub use lifecycle::{ChannelState, LifecycleEvent, TransitionError};
pub use policy::{GuestPolicy, PolicyError};
pub use rate_limit::TokenBucket;
pub use records::{
    ChannelRecord, ChannelTeardown, CreateRequest, FailedRequest, GuestId, GuestInfo,
};
pub use registry::{ControlPlane, MAX_FAILED_REQUESTS, MAX_TERMINAL_RECORDS};
pub use routing::{RemovedRoute, RouteError, RoutingSnapshot, RoutingTable, SnapshotGuard};
