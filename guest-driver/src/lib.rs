//! # svnic-guest: the client side of svnic
//!
//! What runs in a guest or in a host process: the channel API applications use ([`channel`]),
//! and (later) the transports that create channels through the engine's control path.

pub mod channel;
pub mod control_client;
pub mod tools;
pub mod virtio_user;

pub use channel::{Channel, ChannelError, ClientStats, Doorbell, WaitPolicy, Waiter};
