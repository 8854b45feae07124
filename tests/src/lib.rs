//! End-to-end tests across the svnic crates, and the one test kit the workspace's tests share
//! (a dev-dependency of svnic-backend for its integration tests and benches).
//!
//! - In-process: fake guests on an engine ([`fake_guest`]); the daemon with host-process
//!   guests ([`daemon_fixture`]); the virtio-net switch with real listeners ([`switch_fixture`]).
//! - Frontends: a virtio-net frontend on the `vhost` crate's `Frontend`, with a QEMU 7.2 order
//!   and raw messages on the same socket ([`vhost_frontend`]); a raw vhost-user frontend
//!   ([`raw_frontend`]), split rings written by hand ([`virtqueue`]) and a polite virtio-net
//!   frontend on them to deviate from ([`net_frontend`]); two well-behaved host-process guests
//!   ([`polite_pair`]) and the verdict after an attack ([`arena`]); a tiny vhost-user hub device
//!   ([`hub_device`]).
//! - Processes: the daemon as a child process ([`daemon_proc`]), svnic-guest
//!   ([`guest_tool`]), real QEMU guests ([`vm`]), the soak driver ([`soak`]).
//! - Small things: frames ([`frames`]), log capture ([`logs`]), waiting ([`wait`]).

pub mod arena;
pub mod daemon_fixture;
pub mod daemon_proc;
pub mod fake_guest;
pub mod frames;
pub mod guest_tool;
pub mod hub_device;
pub mod logs;
pub mod net_frontend;
pub mod polite_pair;
pub mod raw_frontend;
pub mod soak;
pub mod switch_fixture;
pub mod vhost_frontend;
pub mod virtqueue;
pub mod vm;
pub mod wait;
