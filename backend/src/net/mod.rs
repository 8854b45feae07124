//! Guest networking: a vhost-user virtio-net device per guest and the L2 switch between them.
//!
//! - [`port`]: the seam with the daemon: [`PortId`], [`PortEvents`], and the per-guest
//!   [`SwitchPort`] with its counters ([`PortStats`]).
//! - [`switch`]: the [`Switch`]: forwarding rules, spoof checks, svnic frames to the engine,
//!   [`Switch::inject`] for engine-originated frames, the [`Uplink`] hook.
//! - [`virtio_net`]: virtio-net features, config space, and one frame out of a TX chain or into
//!   RX chains (MRG_RXBUF), with every guest value checked.
//! - [`device`]: [`NetDevice`], the vhost-user backend of one guest for one connection.
//! - [`listener`]: the per-port socket; [`serve_port`] and [`StopSignal`].
//! - [`relay`]: passes vhost-user messages between a frontend and its daemon through a protocol
//!   gate (only what svnic offered and serves, descriptors checked, write timeouts), absorbing
//!   the `SET_VRING_ENABLE` QEMU 7.2 sends before feature negotiation.
//! - [`memory_table`]: checks a frontend's memory table before anything touches it.
//! - [`sigbus_guard`]: guest memory that vanishes under the daemon (SIGBUS) costs its frontend
//!   the connection, not the daemon its life.
//! - [`frame_pool`]: pooled frame buffers, copied into once per frame.
//!
//! Wiring (done by the daemon): create the [`Switch`] with the daemon's [`PortEvents`], add a
//! port per guest ([`Switch::add_port`]) with the MACs of its policy, then [`serve_port`] it on
//! its socket. The daemon answers svnic frames with [`Switch::inject`].

pub mod device;
pub mod frame_pool;
pub mod listener;
pub mod memory_table;
pub mod port;
pub mod relay;
pub mod sigbus_guard;
pub mod switch;
pub mod virtio_net;

pub use device::NetDevice;
pub use frame_pool::{FramePool, PooledFrame};
pub use listener::{serve_port, ListenerError, PortListener, StopSignal};
pub use memory_table::MemoryTableError;
pub use port::{PortDrops, PortEvents, PortId, PortStats, SwitchPort};
pub use relay::{Peer, Refusal, RelayError, RequestCode};
pub use switch::{Switch, SwitchConfig, SwitchError, Uplink};
