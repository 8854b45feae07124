//! # VM mode: the application side of the guest agent
//!
//! In a VM the guest kernel owns the svnic NIC, and a privileged agent (`svnic-guestd`, see
//! the `svnic-guestd` crate) creates channels for applications. An application connects to the agent's
//! Unix socket with [`AgentClient`] and gets the same [`crate::Channel`] API as in host-process
//! mode, without any privilege:
//!
//! - the channel memory (a 2 MiB hugepage the agent allocated, registered with the engine by its
//!   guest-physical address) arrives as a file descriptor and is mapped here;
//! - the doorbell is an eventfd the agent watches and turns into Doorbell frames;
//! - wakes are an eventfd the agent signals when the engine's Wake frame arrives.
//!
//! The wire protocol is in [`protocol`]; the socket layer (seqpacket + `SCM_RIGHTS`) in
//! [`seqpacket`].
//!
//! ```no_run
//! use std::time::Duration;
//! use svnic_client::vm::{AgentClient, DEFAULT_AGENT_SOCKET};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let agent = AgentClient::connect(DEFAULT_AGENT_SOCKET)?;
//! let channel = agent.create_channel(7, 256, Duration::from_secs(5))?;
//! let waiter = agent.waiter(&channel)?;
//! // ... channel.send_user(...), channel.flush(), channel.wait_poll(..., &waiter)
//! agent.destroy_channel(channel, Duration::from_secs(5))?;
//! # Ok(())
//! # }
//! ```

mod client;
pub mod event;
pub mod mapping;
pub mod protocol;
pub mod seqpacket;

pub use client::{AgentClient, AgentError, AgentInfo, AgentWaiter, HELLO_TIMEOUT};
pub use protocol::DEFAULT_AGENT_SOCKET;
