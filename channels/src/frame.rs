//! svnic Ethernet frames: control requests and responses, data fragments between engines,
//! doorbells and wakes. docs/abi.md ("Frames") is the normative description of the bytes.
//!
//! ```text
//! offset  size  field
//!      0     6  destination MAC
//!      6     6  source MAC
//!     12     2  EtherType 0x88B5, big-endian (the only big-endian field)
//!     14     1  version (1)
//!     15     1  frame type: 1 control request, 2 control response, 3 data, 4 doorbell, 5 wake,
//!                 6 ack, 7 bundle
//!     16     2  flags, must be 0
//!     18     -  body (little-endian), by type
//! ```
//!
//! Encoded frames are zero-padded to [`MIN_FRAME_LEN`] (60 bytes, the Ethernet minimum without FCS).
//! A decoder accepts a frame that ends exactly where its content ends (the body, plus `frag_len`
//! payload bytes for a data frame) or that is longer only by Ethernet padding: up to
//! [`MIN_FRAME_LEN`] bytes in all. Padding bytes are ignored whatever their value; any other
//! trailing byte is an error.
//!
//! Data and ack frames travel only between engines over an uplink; docs/wire.md describes the
//! protocol they carry.
//!
//! Decoding validates everything with checked arithmetic and returns a [`DecodeError`]; it never
//! panics and never reads past the buffer. Encoding runs the same checks first, so whatever
//! [`Frame::encode`] accepts, [`Frame::decode`] accepts and returns equal.
//!
//! Semantic checks (ring size, region bounds, MAC ownership, endpoint range) are not done here: a
//! well-formed but unacceptable create request decodes, and the control plane answers it with the
//! precise [`FailureReason`].

mod bundle;
mod fragment;
mod reassembly;
mod wire;

pub use bundle::{
    bundle_entry_len, BundleEntry, BundleFrame, BUNDLE_ENTRY_HEADER_LEN, BUNDLE_HEADER_LEN,
    MAX_BUNDLE_COUNT, MIN_BUNDLE_COUNT,
};

pub use fragment::{fragment, DataMessage, Fragments};
pub use reassembly::{
    PushOutcome, ReassembledMessage, Reassembler, ReassemblyLimits, ReassemblyStats,
};

use wire::{off, svnic_header, Reader};

use crate::error::DecodeError;
use crate::message::{FLAG_COMPLETE, FLAG_WANT_COMPLETION, INLINE_CAPACITY};
use crate::status::{wire_enum, CompletionStatus, FailureReason};
use crate::types::{ChannelAddr, ChannelId, EndpointId, MacAddr};

/// The svnic EtherType (IEEE 802 local experimental 1).
pub const ETHERTYPE: u16 = 0x88B5;
/// The frame format version this crate speaks.
pub const FRAME_VERSION: u8 = 1;
/// Length of the Ethernet header (no VLAN tag).
pub const ETH_HEADER_LEN: usize = 14;
/// Length of the svnic header that follows the Ethernet header.
pub const SVNIC_HEADER_LEN: usize = 4;
/// Offset of the body: Ethernet header plus svnic header.
pub const BODY_OFFSET: usize = ETH_HEADER_LEN + SVNIC_HEADER_LEN;
/// Smallest Ethernet frame (without FCS); shorter encodings are zero-padded to it.
pub const MIN_FRAME_LEN: usize = 60;
/// Body length of a control request (both operations).
pub const CONTROL_REQUEST_LEN: usize = 40;
/// Body length of a control response.
pub const CONTROL_RESPONSE_LEN: usize = 20;
/// Body length of a data frame before its payload.
pub const DATA_HEADER_LEN: usize = 40;
/// Body length of an ack frame.
pub const ACK_LEN: usize = 24;
/// Offset of a data, ack or bundle frame's `dst_endpoint` in the frame (body offset 4): a packet-fanout
/// program steers frames to workers by this field, so it never moves.
pub const DST_ENDPOINT_OFFSET: usize = BODY_OFFSET + 4;
/// Body length of a doorbell or a wake.
pub const NOTIFY_LEN: usize = 4;
/// Largest message that may cross an uplink (the `total_len` of a data frame): 1 MiB.
///
/// Half the default channel region, and a bound on what a receiving engine must buffer per message
/// while reassembling. A larger DMA-data message can still be delivered between channels of one
/// engine; sent to a remote destination it completes with
/// [`crate::CompletionStatus::UplinkError`].
pub const MAX_DATA_LEN: u32 = 1 << 20;
/// Default MTU (Ethernet payload size, excluding the 14-byte Ethernet header).
pub const DEFAULT_MTU: usize = 1500;
/// Smallest MTU [`fragment`] accepts (the IPv4 minimum, RFC 791): 24 payload bytes per fragment.
pub const MIN_MTU: usize = 68;

wire_enum! {
    /// The frame type byte.
    FrameType: u8 as "frame type" {
        /// Guest -> engine: create or destroy a channel.
        ControlRequest = 1 => "control request",
        /// Engine -> guest: answer to a control request.
        ControlResponse = 2 => "control response",
        /// Engine -> engine over an uplink: one fragment of a message.
        Data = 3 => "data",
        /// Guest -> engine: new work in a TX or post ring while the serving worker sleeps.
        Doorbell = 4 => "doorbell",
        /// Engine -> guest: new messages in an RX ring while the guest sleeps.
        Wake = 5 => "wake",
        /// Engine -> engine over an uplink: acknowledgement, reject or reset of a session.
        Ack = 6 => "ack",
        /// Engine -> engine over an uplink: several whole user-data messages in one frame.
        Bundle = 7 => "bundle",
    }
}

impl FrameType {
    /// Length of the fixed part of the body.
    pub fn body_len(self) -> usize {
        match self {
            FrameType::ControlRequest => CONTROL_REQUEST_LEN,
            FrameType::ControlResponse => CONTROL_RESPONSE_LEN,
            FrameType::Data => DATA_HEADER_LEN,
            FrameType::Doorbell | FrameType::Wake => NOTIFY_LEN,
            FrameType::Ack => ACK_LEN,
            FrameType::Bundle => BUNDLE_HEADER_LEN,
        }
    }

    fn name(self) -> &'static str {
        match self {
            FrameType::ControlRequest => "control request",
            FrameType::ControlResponse => "control response",
            FrameType::Data => "data frame",
            FrameType::Doorbell => "doorbell",
            FrameType::Wake => "wake",
            FrameType::Ack => "ack frame",
            FrameType::Bundle => "bundle frame",
        }
    }
}

/// A decoded svnic frame.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Frame<'a> {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC. For frames from a guest port, the port decides who sent it, not this field.
    pub src: MacAddr,
    /// What the frame says.
    pub body: FrameBody<'a>,
}

/// The body of a frame, by type. `'a` is the lifetime of a data frame's payload, borrowed from
/// the buffer the frame was decoded from (or from the caller's message when encoding).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FrameBody<'a> {
    /// Create or destroy a channel.
    ControlRequest(ControlRequest),
    /// Answer to a control request.
    ControlResponse(ControlResponse),
    /// One fragment of a message between engines.
    Data(DataFrame<'a>),
    /// Guest -> engine: this channel's TX or post ring has new work (the worker advertised sleeping).
    Doorbell {
        /// The channel, as the engine named it in its Success response.
        channel: ChannelId,
    },
    /// Engine -> guest: this channel's RX ring has new messages (the guest advertised sleeping).
    Wake {
        /// The channel.
        channel: ChannelId,
    },
    /// Engine -> engine: acknowledgement, reject or reset of a session of data frames.
    Ack(AckFrame),
    /// Engine -> engine: several whole user-data messages of a session in one frame.
    Bundle(BundleFrame<'a>),
}

impl FrameBody<'_> {
    /// The frame type of this body.
    pub fn frame_type(&self) -> FrameType {
        match self {
            FrameBody::ControlRequest(_) => FrameType::ControlRequest,
            FrameBody::ControlResponse(_) => FrameType::ControlResponse,
            FrameBody::Data(_) => FrameType::Data,
            FrameBody::Doorbell { .. } => FrameType::Doorbell,
            FrameBody::Wake { .. } => FrameType::Wake,
            FrameBody::Ack(_) => FrameType::Ack,
            FrameBody::Bundle(_) => FrameType::Bundle,
        }
    }
}

/// A control request (guest -> engine).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ControlRequest {
    /// Chosen by the requester, echoed in every response to this request.
    pub request_id: u32,
    /// What to do.
    pub op: ControlOp,
}

/// The operation of a control request.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ControlOp {
    /// Create a channel (op code 1).
    Create(CreateRequest),
    /// Destroy a channel (op code 2).
    Destroy {
        /// The channel to destroy.
        channel: ChannelId,
    },
}

/// The parameters of a create request. Decoding checks none of their values: every field is
/// guest-chosen and untrusted until the control plane accepts it (it answers with a
/// [`FailureReason`] otherwise).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CreateRequest {
    /// The channel's own MAC; must be owned by the requesting guest.
    pub mac: MacAddr,
    /// The channel's endpoint id under that MAC; must be in the guest's range and free.
    pub endpoint: EndpointId,
    /// Slots per ring (power of two, 16..=4096, see [`crate::layout`]).
    pub ring_size: u32,
    /// Guest-physical address of the channel region (4 KiB aligned).
    pub region_addr: u64,
    /// Length of the channel region in bytes (4 KiB multiple).
    pub region_len: u64,
}

impl CreateRequest {
    /// The channel address the request asks for.
    pub fn addr(&self) -> ChannelAddr {
        ChannelAddr::new(self.mac, self.endpoint)
    }
}

impl std::fmt::Display for CreateRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ring {} region {:#x}+{:#x}",
            self.addr(),
            self.ring_size,
            self.region_addr,
            self.region_len
        )
    }
}

/// A control response (engine -> guest).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ControlResponse {
    /// The request being answered.
    pub request_id: u32,
    /// The channel concerned (the new channel on Success; the named one for a destroy).
    pub channel: ChannelId,
    /// What happened.
    pub status: ControlStatus,
}

/// The status of a control response.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ControlStatus {
    /// Accepted, being worked on (code 1).
    Pending,
    /// Channel created (code 2).
    Success {
        /// Index of the serving worker.
        worker: u32,
        /// Host CPU the worker is pinned to (at most `i32::MAX`); `None` if unpinned (-1 on the wire).
        cpu: Option<u32>,
    },
    /// Refused; nothing was allocated (code 3).
    Failure(FailureReason),
    /// Channel destroyed; the engine no longer touches its memory (code 4).
    Destroyed,
}

wire_enum! {
    /// The kind of message a data frame carries.
    DataKind: u8 as "data message kind" {
        /// User-data: at most [`INLINE_CAPACITY`] bytes, delivered as an RX user-data message.
        UserData = 1 => "user-data",
        /// DMA-data: at most [`MAX_DATA_LEN`] bytes, delivered into a posted receive buffer.
        DmaData = 2 => "DMA-data",
    }
}

impl DataKind {
    /// Largest message of this kind.
    pub fn max_len(self) -> u32 {
        match self {
            DataKind::UserData => INLINE_CAPACITY as u32,
            DataKind::DmaData => MAX_DATA_LEN,
        }
    }

    /// Message flags allowed on this kind (the same as in ring messages).
    pub fn allowed_flags(self) -> u8 {
        match self {
            DataKind::UserData => FLAG_COMPLETE | FLAG_WANT_COMPLETION,
            DataKind::DmaData => FLAG_COMPLETE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            DataKind::UserData => "user-data",
            DataKind::DmaData => "DMA-data",
        }
    }

    /// Checks a whole message of this kind: flags and total length.
    pub(crate) fn check(self, flags: u8, total_len: u64) -> Result<(), DecodeError> {
        if flags & !self.allowed_flags() != 0 {
            return Err(DecodeError::BadFlags {
                kind: self.name(),
                flags,
            });
        }
        if total_len > u64::from(self.max_len()) {
            return Err(DecodeError::BadLength {
                what: match self {
                    DataKind::UserData => "data frame: user-data total_len",
                    DataKind::DmaData => "data frame: DMA-data total_len",
                },
                len: total_len,
                max: self.max_len().into(),
            });
        }
        Ok(())
    }
}

/// What the sender says about a message: the same in every data frame of it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MessageHeader {
    /// Sending channel's endpoint (its MAC is the frame's source MAC).
    pub src_endpoint: EndpointId,
    /// Destination endpoint (its MAC is the frame's destination MAC).
    pub dst_endpoint: EndpointId,
    /// User-data or DMA-data.
    pub kind: DataKind,
    /// The sender's message flags (see [`DataKind::allowed_flags`]).
    pub msg_flags: u8,
    /// Message id: the sending engine numbers its messages per source endpoint, unique while
    /// fragments are in flight. Start the counter at a value that differs from one engine start
    /// to the next (random or time-based), so that a receiver's duplicate filter does not mistake
    /// a restarted engine's first messages for duplicates of the old ones.
    pub message_id: u32,
    /// The sender's cookie.
    pub cookie: u64,
}

/// One fragment of a message sent from a channel of one engine to a channel of another.
///
/// The fragment's bytes are `payload`, at `frag_offset` within the message of `total_len` bytes.
/// Fragments of one message share (source MAC, `src_endpoint`, `message_id`) and every other
/// header field; `session` and `seq` place the frame in the sender's stream (docs/wire.md).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DataFrame<'a> {
    /// The message's header.
    pub header: MessageHeader,
    /// The sender's session id for (source channel, destination channel).
    pub session: u32,
    /// Sequence number of this frame in the session (wraps; serial-number arithmetic).
    pub seq: u32,
    /// Length of the whole message.
    pub total_len: u32,
    /// Offset of this fragment in the message.
    pub frag_offset: u32,
    /// This fragment's bytes (`frag_len` on the wire is its length).
    pub payload: &'a [u8],
}

impl DataFrame<'_> {
    /// Checks what the decoder checks: kind flags and size limits, `frag_len <= u16::MAX`,
    /// `frag_offset + frag_len <= total_len`, and an empty fragment only for an empty message.
    pub fn validate(&self) -> Result<(), DecodeError> {
        let h = &self.header;
        h.kind.check(h.msg_flags, self.total_len.into())?;
        let frag_len = self.payload.len();
        if frag_len > usize::from(u16::MAX) {
            return Err(DecodeError::BadLength {
                what: "data frame: frag_len",
                len: frag_len as u64,
                max: u16::MAX.into(),
            });
        }
        let end = u64::from(self.frag_offset) + frag_len as u64;
        if end > u64::from(self.total_len) {
            return Err(DecodeError::BadLength {
                what: "data frame: frag_offset + frag_len",
                len: end,
                max: self.total_len.into(),
            });
        }
        if frag_len == 0 && self.total_len != 0 {
            return Err(DecodeError::BadLength {
                what: "data frame: empty fragment of a non-empty message; frag_len",
                len: 0,
                max: 0,
            });
        }
        Ok(())
    }

    /// True if this one fragment is the whole message.
    pub fn is_whole_message(&self) -> bool {
        self.frag_offset == 0 && self.payload.len() as u64 == u64::from(self.total_len)
    }
}

/// What an ack frame says about a session (docs/wire.md).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AckKind {
    /// Every frame before `ack` was processed (status 0, `message_id` 0 on the wire).
    Cumulative {
        /// The next sequence number the receiver expects.
        ack: u32,
    },
    /// Every frame before `ack` was processed, and message `message_id`, of which `ack` is the
    /// frame the receiver could not take (its first frame, or a later one), failed with `status`
    /// (never [`CompletionStatus::Ok`]).
    Reject {
        /// Sequence number of the frame of the rejected message the receiver could not take.
        ack: u32,
        /// The rejected message.
        message_id: u32,
        /// Why it failed.
        status: CompletionStatus,
    },
    /// The receiver holds no state for this session (flag bit 0; every other field 0).
    Reset,
    /// As [`AckKind::Cumulative`], and the receiver could not place frame `ack` now (no free RX
    /// slot or posted buffer): it drops the frames after it until it can (flag bit 1, status 0,
    /// `message_id` 0).
    Blocked {
        /// The next sequence number the receiver expects: the frame it could not place.
        ack: u32,
    },
}

/// An acknowledgement from the receiving channel's engine back to the sending channel's engine.
/// The frame's source MAC is the receiving channel's MAC, its destination MAC the sender's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct AckFrame {
    /// The receiving channel's endpoint (the one that sends this ack).
    pub src_endpoint: EndpointId,
    /// The sending channel's endpoint (the one this ack is for).
    pub dst_endpoint: EndpointId,
    /// The session acknowledged.
    pub session: u32,
    /// What the receiver says.
    pub kind: AckKind,
}

impl AckFrame {
    /// Checks what the decoder checks: a reject's status is not [`CompletionStatus::Ok`].
    pub fn validate(&self) -> Result<(), DecodeError> {
        match self.kind {
            AckKind::Reject {
                status: CompletionStatus::Ok,
                ..
            } => Err(DecodeError::UnknownCode {
                what: "ack status (a reject needs a status other than Ok)",
                code: 0,
            }),
            _ => Ok(()),
        }
    }
}

impl ControlResponse {
    /// Checks what the decoder checks: a Success CPU must fit in an `i32`.
    pub fn validate(&self) -> Result<(), DecodeError> {
        if let ControlStatus::Success { cpu: Some(c), .. } = self.status {
            if c > i32::MAX as u32 {
                return Err(DecodeError::BadLength {
                    what: "control response: cpu",
                    len: c.into(),
                    max: i32::MAX as u64,
                });
            }
        }
        Ok(())
    }
}

impl<'a> Frame<'a> {
    /// Checks that the frame can be encoded (the same checks decoding does).
    pub fn validate(&self) -> Result<(), DecodeError> {
        match &self.body {
            FrameBody::ControlResponse(r) => r.validate(),
            FrameBody::Data(d) => d.validate(),
            FrameBody::Ack(a) => a.validate(),
            FrameBody::Bundle(b) => b.validate(),
            FrameBody::ControlRequest(_) | FrameBody::Doorbell { .. } | FrameBody::Wake { .. } => {
                Ok(())
            }
        }
    }

    /// Bytes of content (headers, body, payload) before padding.
    pub fn content_len(&self) -> usize {
        let payload = match &self.body {
            FrameBody::Data(d) => d.payload.len(),
            FrameBody::Bundle(b) => b.entries.len(),
            _ => 0,
        };
        BODY_OFFSET + self.body.frame_type().body_len() + payload
    }

    /// Length of the encoded frame: the content, padded to [`MIN_FRAME_LEN`].
    pub fn encoded_len(&self) -> usize {
        self.content_len().max(MIN_FRAME_LEN)
    }

    /// Validates, then appends the encoded frame (padded to [`MIN_FRAME_LEN`]) to `out`.
    /// On error nothing is appended.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), DecodeError> {
        self.validate()?;
        let start = out.len();
        out.reserve(self.encoded_len());
        out.extend_from_slice(&self.dst.0);
        out.extend_from_slice(&self.src.0);
        out.extend_from_slice(&ETHERTYPE.to_be_bytes());
        out.push(FRAME_VERSION);
        out.push(self.body.frame_type().code());
        out.extend_from_slice(&0u16.to_le_bytes());
        let body_start = out.len();
        out.resize(body_start + self.body.frame_type().body_len(), 0);
        wire::write_body(&self.body, &mut out[body_start..]);
        match &self.body {
            FrameBody::Data(d) => out.extend_from_slice(d.payload),
            FrameBody::Bundle(b) => out.extend_from_slice(b.entries),
            _ => {}
        }
        let padded = start + MIN_FRAME_LEN;
        if out.len() < padded {
            out.resize(padded, 0);
        }
        Ok(())
    }

    /// Validates and encodes into a new buffer (padded to [`MIN_FRAME_LEN`]).
    pub fn encode(&self) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// Validates and decodes a frame (Ethernet header included, FCS excluded). A data frame's
    /// payload borrows from `bytes`. Never panics, whatever the bytes.
    pub fn decode(bytes: &'a [u8]) -> Result<Frame<'a>, DecodeError> {
        let ftype = svnic_header(bytes)?;
        let r = Reader(bytes);
        let dst = MacAddr(r.array(0, "Ethernet header")?);
        let src = MacAddr(r.array(6, "Ethernet header")?);
        let body_bytes = bytes.get(BODY_OFFSET..).unwrap_or_default();
        let body_len = ftype.body_len();
        if body_bytes.len() < body_len {
            return Err(DecodeError::Truncated {
                what: ftype.name(),
                len: bytes.len(),
                need: BODY_OFFSET + body_len,
            });
        }
        let b = Reader(body_bytes);
        let (body, payload_len) = wire::decode_body(ftype, &b)?;
        // Only Ethernet padding may follow the content (see the module documentation).
        let content = BODY_OFFSET + body_len + payload_len;
        let allowed = content.max(MIN_FRAME_LEN);
        if bytes.len() > allowed {
            return Err(DecodeError::BadLength {
                what: "frame (bytes after the content that are not Ethernet padding)",
                len: bytes.len() as u64,
                max: allowed as u64,
            });
        }
        Ok(Frame { dst, src, body })
    }
}

/// True if `bytes` is an svnic frame or pretends to be one: EtherType 0x88B5, directly or behind
/// up to two VLAN tags (0x8100, 0x88A8, 0x9100).
///
/// The backend uses this on frames from a guest port: such a frame is consumed by the engine
/// (decoded, or dropped if tagged or malformed) and never switched to another port, so guests
/// cannot send svnic frames to one another by hiding them behind a VLAN tag.
pub fn claims_svnic(bytes: &[u8]) -> bool {
    let r = Reader(bytes);
    let mut at = 12;
    for _ in 0..3 {
        match r.array::<2>(at, "").map(u16::from_be_bytes) {
            Ok(ETHERTYPE) => return true,
            Ok(0x8100 | 0x88A8 | 0x9100) => at += 4,
            _ => return false,
        }
    }
    false
}

/// The request id of something that claims to be an svnic control request, even if the rest of
/// it is malformed, so that the engine can answer it with [`FailureReason::BadRequest`].
/// `None` if the headers are not those of a version-1 control request.
pub fn control_request_id(bytes: &[u8]) -> Option<u32> {
    match svnic_header(bytes) {
        Ok(FrameType::ControlRequest) => {}
        _ => return None,
    }
    let b = Reader(bytes.get(BODY_OFFSET..)?);
    b.u32(off::REQ_ID, "control request").ok()
}

#[cfg(test)]
mod bundle_tests;
#[cfg(test)]
mod fragment_tests;
#[cfg(test)]
mod tests;
