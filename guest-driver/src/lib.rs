//! # svnic-guest: the client side of svnic
//!
//! What runs in a guest or in a host process: the channel API applications use ([`channel`]),
//! and the transports that create channels through the engine's control path:
//!
//! - host-process mode ([`virtio_user`], [`control_client`]): the process is its own
//!   virtio-net guest;
//! - VM mode ([`vm`] for applications, [`agent`] for the privileged guest agent
//!   `svnic-guestd`): the guest kernel owns the NIC and the agent speaks to the engine for
//!   everybody.
//!
//! [`tools`] holds the measurements of `svnic-guest ping/perf` and `svnic demo`; [`cli`] the
//! `svnic-guest` command line.

pub mod agent;
pub mod channel;
pub mod cli;
pub mod control_client;
pub mod tools;
pub mod virtio_user;
pub mod vm;

pub use channel::{Channel, ChannelError, ClientStats, Doorbell, WaitPolicy, Waiter};
