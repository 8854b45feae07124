//! # svnic-client: what an application links to use svnic channels
//!
//! - [`channel`]: the channel API — a queue pair of 64-byte messages in the application's own
//!   memory, driven without a system call on the data path ([`Channel`]).
//! - [`vm`]: in a VM, channels come from the guest agent `svnic-guestd` over a Unix socket
//!   ([`vm::AgentClient`]); the application needs no privilege.
//! - [`request_table`]: the bookkeeping of channel requests (create / destroy) and of the
//!   memory each channel holds, shared by every requester (the guest agent, host-process
//!   guests).
//!
//! Host processes that are their own guest use `svnic-host-frontend`, which builds on this
//! crate. This crate is linked into applications: it depends on the ABI crate, vm-memory, libc, log and
//! thiserror, never on command-line, logging-setup, serialization or vhost crates.

pub mod channel;
pub mod request_table;
pub mod vm;

pub use channel::{
    Channel, ChannelError, ClientStats, Completions, Doorbell, OwnedChannelError, WaitPolicy,
    Waiter,
};
