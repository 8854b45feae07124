//! The uplink: the engine's attachment to a host interface, so that guests on different hosts
//! reach each other (docs/wire.md).
//!
//! - [`packet`]: batched packet I/O on a host interface (AF_PACKET with mmap rings), steered to
//!   workers by destination endpoint.
//! - [`reliable`]: the reliability protocol between engines (sequence numbers, acknowledgements,
//!   retransmission in a bounded window), as a state machine without I/O.

pub mod packet;
pub mod reliable;

use svnic_channels::MacAddr;

/// What became of a frame from the uplink; see [`LocalPorts::deliver`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ingress {
    /// Queued for its owner, or for every port that is up (how many took it).
    Delivered(usize),
    /// For a local guest whose link is down or whose queue is full (counted on that port).
    Refused,
    /// An svnic frame: for the engine, not the switch.
    Svnic,
    /// Shorter than an Ethernet header, longer than the largest frame, or with a group address
    /// as its source.
    Malformed,
    /// The source MAC is owned by a local guest.
    Spoofed,
    /// Unicast to a MAC no local guest owns.
    NotLocal,
}

/// The local side of the uplink: the guests' virtio-net ports, which take every frame from the
/// wire that is not the engine's. The switch implements it.
pub trait LocalPorts: Send + Sync {
    /// Hands a frame from the wire (not an svnic frame) to the local guests it is for.
    fn deliver(&self, frame: &[u8]) -> Ingress;
    /// True if a local guest owns `mac`.
    fn owns(&self, mac: MacAddr) -> bool;
}
