//! End-to-end tests across the svnic crates; the helpers they share live here: the daemon as a
//! child process ([`daemon_proc`]), real QEMU guests ([`vm`]), and the hostile-frontend kit: a
//! raw vhost-user frontend ([`raw_frontend`]), split rings written by hand ([`virtqueue`]), a
//! polite virtio-net frontend to deviate from ([`net_frontend`]), two well-behaved host-process
//! guests ([`polite_pair`]) and the verdict after an attack ([`arena`]); the soak driver
//! ([`soak`]).

pub mod arena;
pub mod daemon_proc;
pub mod guest_tool;
pub mod hub_device;
pub mod net_frontend;
pub mod polite_pair;
pub mod raw_frontend;
pub mod soak;
pub mod virtqueue;
pub mod vm;
