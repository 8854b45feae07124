//! Typed errors of the ABI crate. Every decode and every index check returns one of these; none
//! of them is ever a panic.

use thiserror::Error;

/// A message, frame or code that failed validation.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// A code with no meaning in this ABI version.
    #[error("unknown {what} code {code}")]
    UnknownCode {
        /// Which enumeration was being decoded.
        what: &'static str,
        /// The value found.
        code: u64,
    },
    /// Flags outside the set allowed for this kind.
    #[error("flags {flags:#04x} not allowed on a {kind} message")]
    BadFlags {
        /// Message kind name.
        kind: &'static str,
        /// The flags found.
        flags: u8,
    },
    /// A length field out of range.
    #[error("{what}: length {len} out of range (maximum {max})")]
    BadLength {
        /// Which length.
        what: &'static str,
        /// The value found.
        len: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// Bytes that must be zero were not.
    #[error("{what}: reserved bytes are not zero")]
    ReservedNotZero {
        /// Which structure.
        what: &'static str,
    },
    /// A buffer too short for the structure.
    #[error("{what}: {len} bytes, need at least {need}")]
    Truncated {
        /// Which structure.
        what: &'static str,
        /// Bytes available.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// A frame that is not an svnic frame (wrong EtherType) or of an unsupported version.
    #[error("not an svnic frame: {0}")]
    NotSvnic(String),
}

/// A channel layout request that cannot be honoured.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LayoutError {
    /// Ring size not a power of two in the allowed range.
    #[error("ring size {0} is not a power of two in 16..=4096")]
    BadRingSize(u32),
    /// Region too small to hold header and rings.
    #[error("region of {len} bytes is too small: header and rings need {need}")]
    RegionTooSmall {
        /// Region length requested.
        len: u64,
        /// Minimum length for this ring size.
        need: u64,
    },
    /// Region larger than the ABI maximum.
    #[error("region of {len} bytes exceeds the maximum of {max}")]
    RegionTooLarge {
        /// Region length requested.
        len: u64,
        /// Maximum.
        max: u64,
    },
    /// Region length not a multiple of 4 KiB.
    #[error("region length {0} is not a multiple of 4096")]
    Misaligned(u64),
    /// The memory handed over is shorter than the layout.
    #[error("memory of {have} bytes is shorter than the {need}-byte channel region")]
    MemoryTooShort {
        /// Bytes available.
        have: usize,
        /// Bytes needed.
        need: u64,
    },
    /// The channel header does not describe a valid channel (magic, version, or fields).
    #[error("channel header invalid: {0}")]
    BadHeader(String),
}

/// The other side of a ring wrote an index that cannot be right.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RingError {
    /// Producer index more than a ring ahead of the consumer, or behind it.
    #[error("{ring} ring: producer index {head} is {ahead} slots ahead of consumer index {tail} (ring has {size})")]
    ProducerOutOfRange {
        /// Ring name.
        ring: &'static str,
        /// Producer index read.
        head: u32,
        /// Our consumer index.
        tail: u32,
        /// `head - tail`, wrapping.
        ahead: u32,
        /// Ring size.
        size: u32,
    },
    /// Consumer index behind what it was before, or ahead of the producer.
    #[error("{ring} ring: consumer index {tail} is impossible (producer at {head}, consumer was at {last})")]
    ConsumerOutOfRange {
        /// Ring name.
        ring: &'static str,
        /// Consumer index read.
        tail: u32,
        /// Our producer index.
        head: u32,
        /// Last consumer index seen.
        last: u32,
    },
    /// Producer index moved backwards.
    #[error("{ring} ring: producer index moved backwards from {last} to {head}")]
    ProducerBackwards {
        /// Ring name.
        ring: &'static str,
        /// Producer index read.
        head: u32,
        /// Last producer index seen.
        last: u32,
    },
    /// Memory access failed (the region is not mapped as described).
    #[error("{ring} ring: memory access at offset {offset} failed")]
    Memory {
        /// Ring name.
        ring: &'static str,
        /// Offset within the channel region.
        offset: usize,
    },
}

/// A textual value (MAC address, ...) that failed to parse.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// Not a MAC address.
    #[error("'{0}' is not a MAC address (expected six hex pairs like 52:54:00:12:34:56)")]
    Mac(String),
}
