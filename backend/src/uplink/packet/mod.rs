//! Batched packet I/O on a host interface: AF_PACKET sockets with mmap rings, joined in a
//! fanout group whose classic BPF program steers each svnic frame to the worker serving its
//! destination endpoint.
//!
//! One [`PacketSocket`] per engine worker (plus one for the switch) is bound to the uplink
//! interface, promiscuous (guest MACs are not the interface's), blind to its own
//! transmissions, and non-blocking. Its RX ring is walked by [`PacketSocket::receive`]
//! without a syscall; frames to send are copied into the TX ring by [`PacketSocket::queue`]
//! and handed to the kernel by one `send()` per batch ([`PacketSocket::flush`]). A sleeping
//! worker polls [`PacketSocket::fd`].
//!
//! # Why TPACKET_V2
//! TPACKET_V3 packs variable-size frames into blocks and hands a block to user space only
//! when it is full or when its retire timer (millisecond granularity) fires: under light load a
//! frame waits up to that timer, which an engine whose round trip must beat UDP's cannot
//! afford, and V3 brings nothing to the TX ring. TPACKET_V2 hands over each frame the moment
//! the kernel has written it. Its cost is a fixed slot per frame sized for the MTU (a
//! 64-byte ack takes a 1584-byte slot at MTU 1500): the rings stay bounded and small
//! (1024 slots are 1.6 MB per worker).
//!
//! # Steering
//! [`steering_program`] is the program of the fanout group ([`PacketSocket::join_fanout`]);
//! [`worker_of_endpoint`] is the placement rule it implements, the one the engine uses to
//! place channels. See [`steering`] for the rule on other frames.
//!
//! # What never reaches the caller
//! Frames longer than a ring slot (the kernel truncates them to the slot): counted in
//! [`PacketStats::truncated`] and dropped. Our own transmissions: the kernel does not loop them
//! back (PACKET_IGNORE_OUTGOING and its fanout flag) and any that would still appear are
//! dropped and counted. VLAN tags, which the kernel strips into the slot header, are put back
//! in place (TPID then TCI after the source MAC): the caller sees frames as they were on the
//! wire.

mod ring;
mod socket;
pub mod steering;
mod sys;

use thiserror::Error;

pub use socket::PacketSocket;
pub use steering::{steered_worker, steering_program, worker_of_endpoint};

/// Ring sizes of a [`PacketSocket`]. Each ring takes at most 1 GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketConfig {
    /// Bytes per ring slot, kernel header included (a multiple of 16). None: the smallest
    /// slot that holds a frame of the interface's MTU + 14 bytes. A given size must hold such
    /// a frame too.
    pub frame_size: Option<usize>,
    /// Slots of the RX ring (rounded up to fill whole ring blocks), 1..=[`MAX_RING_FRAMES`].
    pub rx_frames: usize,
    /// Slots of the TX ring (rounded up likewise), 1..=[`MAX_RING_FRAMES`].
    pub tx_frames: usize,
}

/// Upper bound of [`PacketConfig::rx_frames`] and [`PacketConfig::tx_frames`].
pub const MAX_RING_FRAMES: usize = 1 << 16;

impl Default for PacketConfig {
    fn default() -> Self {
        PacketConfig {
            frame_size: None,
            rx_frames: 1024,
            tx_frames: 256,
        }
    }
}

/// Counters of one [`PacketSocket`] since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketStats {
    /// Frames handed to the `receive` callback.
    pub received: u64,
    /// Frames handed to the kernel for transmission by `flush`.
    pub sent: u64,
    /// `queue` calls refused because no TX slot was free.
    pub tx_full: u64,
    /// Received frames dropped because they were longer than a ring slot.
    pub truncated: u64,
    /// Received frames whose VLAN tag was put back from the slot header.
    pub vlan_reinserted: u64,
    /// Received frames that were our own transmissions, dropped.
    pub outgoing_ignored: u64,
    /// Frames the kernel dropped for want of a free RX slot (PACKET_STATISTICS).
    pub rx_kernel_drops: u64,
}

/// Why a packet socket operation failed.
#[derive(Debug, Error)]
pub enum PacketError {
    /// A ring setting is out of range.
    #[error("packet socket config: {field} = {value} {rule}")]
    Config {
        /// The field of [`PacketConfig`].
        field: &'static str,
        /// Its value.
        value: usize,
        /// What it must be.
        rule: &'static str,
    },
    /// The interface name cannot name an interface.
    #[error("{0:?} is not an interface name (1 to 15 bytes, no NUL)")]
    BadInterfaceName(String),
    /// No interface has that name in the socket's network namespace.
    #[error("interface {iface:?} does not exist in this network namespace")]
    NoSuchInterface {
        /// The interface name.
        iface: String,
    },
    /// The interface is administratively down.
    #[error("interface {iface:?} is down: bring it up (ip link set {iface} up)")]
    InterfaceDown {
        /// The interface name.
        iface: String,
    },
    /// The interface the socket was bound to has been removed; the socket is unusable.
    #[error("interface {iface:?} is gone; open a new socket once it is back")]
    InterfaceGone {
        /// The interface name.
        iface: String,
    },
    /// The configured ring slot cannot hold a frame of the interface's MTU.
    #[error(
        "interface {iface:?} has MTU {mtu}: a ring slot of {frame_size} bytes cannot hold its \
         frames; use at least {needed} (or leave frame_size unset)"
    )]
    SlotTooSmall {
        /// The interface name.
        iface: String,
        /// Its MTU.
        mtu: usize,
        /// The configured slot size.
        frame_size: usize,
        /// The smallest slot that holds an MTU + 14 byte frame.
        needed: usize,
    },
    /// `join_fanout` with no workers.
    #[error("a fanout group needs at least one worker")]
    NoWorkers,
    /// A frame to send is shorter than an Ethernet header or longer than the interface takes.
    #[error("cannot send a {len}-byte frame: frames are 14 to {max} bytes on {iface:?}")]
    FrameSize {
        /// The interface name.
        iface: String,
        /// The frame's length.
        len: usize,
        /// The longest frame the interface takes (MTU + 14, + 4 if VLAN-tagged).
        max: usize,
    },
    /// No TX slot is free: flush, then queue again.
    #[error("the TX ring is full")]
    Full,
    /// A system call failed.
    #[error("{op} on interface {iface:?}")]
    Os {
        /// The operation.
        op: &'static str,
        /// The interface name.
        iface: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}
