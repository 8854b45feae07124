//! The uplink: the engine's attachment to a host interface, so that guests on different hosts
//! reach each other (docs/wire.md).
//!
//! - [`packet`]: batched packet I/O on a host interface (AF_PACKET with mmap rings), steered to
//!   workers by destination endpoint.
//! - [`reliable`]: the reliability protocol between engines (sequence numbers, acknowledgements,
//!   retransmission in a bounded window), as a state machine without I/O.

pub mod packet;
pub mod reliable;
