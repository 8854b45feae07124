//! End-to-end tests across the svnic crates, and the one test kit the workspace's tests share
//! (a dev-dependency of svnic-backend for its integration tests and benches).
//!
//! - In-process: fake guests on an engine ([`fake_guest`]); the daemon with host-process
//!   guests ([`daemon_fixture`]) or a guest pool ([`pool_fixture`]); the virtio-net switch with real listeners ([`switch_fixture`]).
//! - Frontends: one virtio-net test frontend built on the real host-process driver (its memfd
//!   memory, split rings and vhost-user setup), with a QEMU 7.2 order, QEMU 7.2's conversation
//!   step by step to deviate from, and raw messages on the same socket ([`vhost_frontend`]);
//!   the raw vhost-user message codec ([`raw_frontend`]) and raw ring writes for hostile
//!   descriptors ([`raw_ring`]); two well-behaved host-process guests
//!   ([`polite_pair`]) and the verdict after an attack ([`arena`]); a tiny vhost-user hub device
//!   ([`hub_device`]).
//! - Processes: the daemon as a child process ([`daemon_proc`]), libfabric's tools with the
//!   svnic provider ([`libfabric`]), svnic-guest
//!   ([`guest_tool`]), real QEMU guests ([`vm`]), the soak driver ([`soak`]).
//! - Small things: frames ([`frames`]), log capture ([`logs`]), waiting ([`wait`]).

pub mod arena;
pub mod daemon_fixture;
pub mod daemon_proc;
pub mod fake_guest;
pub mod frames;
pub mod guest_tool;
pub mod hub_device;
pub mod libfabric;
pub mod logs;
pub mod netns;
pub mod polite_pair;
pub mod pool_fixture;
pub mod raw_frontend;
pub mod raw_ring;
pub mod soak;
pub mod switch_fixture;
pub mod vhost_frontend;
pub mod vm;
pub mod wait;
pub mod wire_fixture;
