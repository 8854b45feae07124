//! # virtio-user: a host process as its own virtio-net "guest"
//!
//! The host-process transport of svnic (DESIGN.md, "Two ways a guest attaches", mode 2): the
//! process is the vhost-user *frontend* of the backend's virtio-net device, exactly as QEMU would
//! be for a VM, with a memfd as its guest memory:
//!
//! - [`MemfdMemory`]: the memfd, mapped shared at guest-physical 0, and an allocator for ring
//!   areas, packet buffers and 2 MiB-aligned channel regions ([`allocator`]);
//! - [`SplitRing`]: the driver side of a virtio 1.x split virtqueue, which trusts nothing the
//!   device writes ([`split_ring`]);
//! - [`VirtioNet`]: virtio-net on two such queues over a vhost-user connection
//!   ([`virtio_net`], [`vhost_setup`], [`notifier`]);
//! - [`HostGuest`](crate::HostGuest) (in [`crate::host_guest`]) builds on all of it.
//!
//! ```no_run
//! use std::time::Duration;
//! use svnic_host_frontend::virtio_user::DEFAULT_MEMORY_SIZE;
//! use svnic_host_frontend::HostGuest;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let guest = HostGuest::connect("/run/svnic/guest0.sock", DEFAULT_MEMORY_SIZE)?;
//! let channel = guest.create_channel(7, 256, Duration::from_secs(5))?;
//! // ... channel.send_user(...), channel.flush(), channel.wait_poll(..., &guest.waiter(&channel))
//! guest.destroy_channel(channel, Duration::from_secs(5))?;
//! # Ok(())
//! # }
//! ```

pub mod allocator;
pub mod error;
pub mod memory;
pub mod net_header;
pub mod notifier;
pub mod split_ring;
pub mod vhost_setup;
pub mod virtio_net;

pub use allocator::{AllocError, RangeAllocator};
pub use error::{NetDeviceError, VirtioUserError};
pub use memory::{MemfdMemory, MemoryError, Sealing, DEFAULT_MEMORY_SIZE, REGION_ALIGN};
pub use notifier::{CallWaiter, WaitOutcome};
pub use split_ring::{ChainSegment, Descriptor, RingError, RingLayout, SplitRing, UsedBuffer};
pub use virtio_net::{NetStats, VirtioNet, BUFFER_SIZE, DEFAULT_QUEUE_SIZE, MAX_TX_FRAME};
