//! Errors of the control plane's operator- and engine-facing calls. (Guest-facing refusals are
//! [`svnic_channels::FailureReason`]s, which go back to the guest on the wire.)

use svnic_channels::{ChannelId, MacAddr};
use thiserror::Error;

use crate::lifecycle::{ChannelState, TransitionError};
use crate::policy::PolicyError;
use crate::records::GuestId;
use crate::routing::RouteError;

/// A control-plane call that could not be carried out.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ControlError {
    /// The guest policy is invalid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// Another registered guest has this name.
    #[error("guest name {name:?} is already registered as {existing}; remove it first or choose another name")]
    GuestNameTaken {
        /// The name.
        name: String,
        /// The guest registered under it.
        existing: GuestId,
    },
    /// Another registered guest owns this MAC.
    #[error("guest {name:?} cannot own MAC {mac}: it belongs to {owner} ({owner_name:?})")]
    MacOwned {
        /// The guest being added.
        name: String,
        /// The MAC.
        mac: MacAddr,
        /// Its owner.
        owner: GuestId,
        /// The owner's name.
        owner_name: String,
    },
    /// No guest has this id (never registered, or removed).
    #[error("{0} is not registered")]
    UnknownGuest(GuestId),
    /// No channel record has this id (never created, or its terminal record was evicted).
    #[error("{0} is unknown")]
    UnknownChannel(ChannelId),
    /// The event is not allowed in the channel's state.
    #[error("{id}: {source}")]
    Transition {
        /// The channel.
        id: ChannelId,
        /// The refused transition.
        #[source]
        source: TransitionError,
    },
    /// The channel is being destroyed; only `finish_destroy` may change it now.
    #[error("{0} is being destroyed; drop the create work and let the teardown finish")]
    ChannelDestroying(ChannelId),
    /// `finish_destroy` on a channel whose teardown was not begun.
    #[error("{id} is {state} and not being destroyed; call begin_destroy first")]
    NotBeingDestroyed {
        /// The channel.
        id: ChannelId,
        /// Its state.
        state: ChannelState,
    },
    /// The routing table refused a change (an internal inconsistency; the registry's
    /// reservations should prevent it).
    #[error("{id}: routing update failed: {source}")]
    Route {
        /// The channel.
        id: ChannelId,
        /// The routing error.
        #[source]
        source: RouteError,
    },
    /// All 2^32 - 1 guest ids have been used.
    #[error("guest ids exhausted after {0}; restart the engine")]
    GuestIdsExhausted(GuestId),
}
