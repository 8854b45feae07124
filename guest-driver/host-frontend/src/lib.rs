//! # svnic-host-frontend: a host process as its own svnic guest
//!
//! - [`virtio_user`]: a vhost-user frontend in user space — the process's guest memory (a
//!   memfd), split virtqueues and a virtio-net device driven through the daemon's socket.
//! - [`host_guest`]: a [`HostGuest`] — that NIC plus channel requests sent over it as control
//!   frames, answered Pending, then Success or Failure; channels come back as
//!   [`svnic_client::Channel`]s.

pub mod host_guest;
pub mod virtio_user;

pub use host_guest::{ClientError, HostGuest};
