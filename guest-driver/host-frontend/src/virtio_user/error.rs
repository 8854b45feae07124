//! [`VirtioUserError`]: everything that can go wrong in the host-process transport, each variant
//! naming what failed and with what value.

use svnic_channels::MacAddr;
use thiserror::Error;

use super::memory::MemoryError;
use super::split_ring::RingError;

/// A virtio-net protocol violation by the device above the ring level (the ring itself checks
/// descriptor ids and lengths). Once returned, the device is considered broken.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NetDeviceError {
    /// The first buffer of a received frame is shorter than the virtio-net header.
    #[error("RX: device returned a first buffer of {len} bytes, shorter than the {hdr}-byte virtio-net header; device broken")]
    RxHeaderTooShort {
        /// Bytes the device wrote.
        len: u32,
        /// Header length.
        hdr: usize,
    },
    /// `num_buffers` of a received frame is 0, or more than the RX queue holds.
    #[error("RX: device says a frame spans {num} buffers (must be 1..={max}); device broken")]
    BadNumBuffers {
        /// The value in the header.
        num: u16,
        /// RX queue size.
        max: u16,
    },
}

/// Errors of the host-process transport.
#[derive(Debug, Error)]
pub enum VirtioUserError {
    /// The guest memory (memfd, mapping, allocation) failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A vhost-user request failed or was refused by the backend.
    #[error("vhost-user {step} failed: {source}")]
    Setup {
        /// The request (or connection step) that failed, e.g. "SET_MEM_TABLE" or "SET_VRING_ADDR (TX)".
        step: &'static str,
        /// What the vhost crate reported.
        #[source]
        source: vhost::Error,
    },
    /// The backend does not offer virtio features this driver requires.
    #[error("backend does not offer required virtio feature(s) {missing} (offered {offered:#x}); is it a virtio-net vhost-user backend?")]
    MissingFeatures {
        /// Names of the missing features.
        missing: String,
        /// Features the backend offered.
        offered: u64,
    },
    /// The backend does not offer a vhost-user protocol feature this driver requires.
    #[error("backend does not offer vhost-user protocol feature {name} (offered {offered:#x})")]
    MissingProtocolFeature {
        /// The missing protocol feature.
        name: &'static str,
        /// Protocol features the backend offered.
        offered: u64,
    },
    /// The device's configuration space is unusable.
    #[error("device config: {0}")]
    BadConfig(String),
    /// The MAC address in config space is not a unicast address.
    #[error("device MAC {0} is not a unicast address")]
    BadMac(MacAddr),
    /// The queue size is not a power of two in 2..=32768.
    #[error("queue size {0} is not a power of two in 2..=32768")]
    BadQueueSize(u16),
    /// A queue index other than RX (0) and TX (1).
    #[error("queue index {0}: this device has only queues 0 (RX) and 1 (TX)")]
    BadQueueIndex(usize),
    /// Creating, writing or waiting on an eventfd failed.
    #[error("eventfd ({what}): {source}")]
    EventFd {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The device broke the split-ring protocol.
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The device broke the virtio-net protocol.
    #[error(transparent)]
    Device(#[from] NetDeviceError),
    /// A frame larger than a transmit buffer.
    #[error("frame of {len} bytes is larger than the {max} bytes a transmit buffer holds")]
    FrameTooLarge {
        /// Frame length.
        len: usize,
        /// Largest frame.
        max: usize,
    },
    /// The backend closed the vhost-user socket: the device is gone.
    #[error(
        "the backend closed the vhost-user connection; the device is gone (reconnect to continue)"
    )]
    Disconnected,
}
