//! # svnic-channels: the ABI shared by the svnic engine and its guests
//!
//! Everything that crosses the guest/engine boundary is defined here and nowhere else:
//! - [`message`]: the 64-byte ring message (user-data, DMA-data, post-buffer, completion);
//! - [`layout`]: where header, indices, rings and data area lie in a channel region;
//! - [`ring`]: producer/consumer access to the rings through vm-memory, with every index the other
//!   side wrote validated;
//! - [`frame`]: svnic Ethernet frames (control, data with fragments, doorbell, wake);
//! - [`status`]: completion statuses, failure reasons, fault codes.
//!
//! The crate does no I/O and starts no threads. docs/abi.md describes the same bytes in prose.

// Tests may unwrap (STYLE.md); the library itself may not, which clippy still checks.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod error;
pub mod frame;
pub mod layout;
pub mod message;
pub mod region;
pub mod ring;
pub mod status;
pub mod types;

pub use error::{DecodeError, LayoutError, ParseError, RingError};
pub use frame::{
    AckFrame, AckKind, DataFrame, DataKind, DataMessage, Frame, FrameBody, MessageHeader,
    PushOutcome, ReassembledMessage, Reassembler, ReassemblyLimits,
};
pub use layout::ChannelLayout;
pub use message::{Completion, DataRef, DmaData, Message, PostBuffer, RawMessage, UserData};
pub use region::{RegionError, SharedRegion};
pub use ring::{ChannelMem, Consumer, Producer, RingKind};
pub use status::{CompletionStatus, FailureReason, FaultReason};
pub use types::{ChannelAddr, ChannelId, EndpointId, MacAddr};
