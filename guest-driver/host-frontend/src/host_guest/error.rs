//! [`ClientError`]: what the control client reports.

use std::time::Duration;

use svnic_channels::{ChannelId, DecodeError, FailureReason, LayoutError};
use thiserror::Error;

use crate::virtio_user::{MemoryError, VirtioUserError};
use svnic_client::OwnedChannelError;

/// Errors of the control client.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The virtio-net transport failed (device broken, backend gone, ...).
    #[error(transparent)]
    Transport(#[from] VirtioUserError),
    /// No guest memory for the channel region.
    #[error("cannot allocate the channel region: {0}")]
    Memory(#[from] MemoryError),
    /// The ring size or region length cannot make a channel (checked before asking the engine).
    #[error("invalid channel parameters: {0}")]
    BadParameters(#[source] LayoutError),
    /// The engine refused to create the channel (nothing was allocated; the region was freed).
    #[error("the engine refused the channel: {0}")]
    Refused(FailureReason),
    /// The engine refused to destroy the channel; its region stays reserved (the engine may
    /// still use it).
    #[error("the engine refused to destroy {channel}: {reason}; its region stays reserved")]
    DestroyRefused {
        /// The channel.
        channel: ChannelId,
        /// Why.
        reason: FailureReason,
    },
    /// No final answer in time. A create is then abandoned (a channel created later is
    /// destroyed automatically); a destroy keeps its region reserved until the engine answers.
    #[error("{what} (request {request_id}) not answered within {waited:?}")]
    Timeout {
        /// Which request.
        what: &'static str,
        /// Its id.
        request_id: u32,
        /// How long we waited.
        waited: Duration,
    },
    /// The channel was not usable once created, or is not this client's.
    #[error(transparent)]
    Channel(#[from] OwnedChannelError),
    /// A control frame could not be encoded.
    #[error("cannot encode a control frame: {0}")]
    Encode(#[from] DecodeError),
}
