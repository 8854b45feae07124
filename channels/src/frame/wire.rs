//! The byte-level encoding of frame bodies: field offsets, and bounds-checked readers and writers.
//! docs/abi.md section 7 has the same tables.

use super::bundle::entries_len;
use super::{
    AckFrame, AckKind, BundleFrame, ControlOp, ControlRequest, ControlResponse, ControlStatus,
    CreateRequest, DataFrame, DataKind, FrameBody, FrameType, MessageHeader, BODY_OFFSET,
    BUNDLE_HEADER_LEN, CONTROL_REQUEST_LEN, DATA_HEADER_LEN, ETHERTYPE, ETH_HEADER_LEN,
    FRAME_VERSION,
};
use crate::error::DecodeError;
use crate::status::{CompletionStatus, FailureReason};
use crate::types::{ChannelId, MacAddr};

// Body field offsets (from BODY_OFFSET). docs/abi.md has the same tables.
pub(super) mod off {
    pub const REQ_ID: usize = 0;
    pub const REQ_OP: usize = 4;
    pub const REQ_MAC: usize = 6;
    pub const REQ_ENDPOINT: usize = 12;
    pub const REQ_RING_SIZE: usize = 16;
    pub const REQ_RESERVED: usize = 20;
    pub const REQ_REGION_ADDR: usize = 24;
    pub const REQ_REGION_LEN: usize = 32;
    pub const REQ_DESTROY_CHANNEL: usize = 8;

    pub const RESP_ID: usize = 0;
    pub const RESP_STATUS: usize = 4;
    pub const RESP_RESERVED: usize = 5;
    pub const RESP_REASON: usize = 6;
    pub const RESP_CHANNEL: usize = 8;
    pub const RESP_WORKER: usize = 12;
    pub const RESP_CPU: usize = 16;

    pub const DATA_SRC_EP: usize = 0;
    pub const DATA_DST_EP: usize = 4;
    pub const DATA_SESSION: usize = 8;
    pub const DATA_SEQ: usize = 12;
    pub const DATA_MSG_ID: usize = 16;
    pub const DATA_TOTAL: usize = 20;
    pub const DATA_FRAG_OFF: usize = 24;
    pub const DATA_FRAG_LEN: usize = 28;
    pub const DATA_KIND: usize = 30;
    pub const DATA_FLAGS: usize = 31;
    pub const DATA_COOKIE: usize = 32;

    pub const ACK_SRC_EP: usize = 0;
    pub const ACK_DST_EP: usize = 4;
    pub const ACK_SESSION: usize = 8;
    pub const ACK_ACK: usize = 12;
    pub const ACK_MSG_ID: usize = 16;
    pub const ACK_STATUS: usize = 20;
    pub const ACK_FLAGS: usize = 22;

    pub const BUNDLE_SRC_EP: usize = 0;
    pub const BUNDLE_DST_EP: usize = 4;
    pub const BUNDLE_SESSION: usize = 8;
    pub const BUNDLE_SEQ: usize = 12;
    pub const BUNDLE_FIRST_ID: usize = 16;
    pub const BUNDLE_COUNT: usize = 20;
    pub const BUNDLE_RESERVED: usize = 22;

    pub const NOTIFY_CHANNEL: usize = 0;
}

const OP_CREATE: u8 = 1;
const OP_DESTROY: u8 = 2;

const STATUS_PENDING: u8 = 1;
const STATUS_SUCCESS: u8 = 2;
const STATUS_FAILURE: u8 = 3;
const STATUS_DESTROYED: u8 = 4;

/// Ack flag bit 0: the receiver holds no state for the session.
const ACK_FLAG_RESET: u16 = 1;
/// Ack flag bit 1: the receiver could not place the frame `ack` names.
const ACK_FLAG_BLOCKED: u16 = 2;

/// Writes the fixed part of `body` into `out`, which is exactly `body_len()` zeroed bytes.
pub(super) fn write_body(body: &FrameBody<'_>, out: &mut [u8]) {
    let mut w = Writer(out);
    match body {
        FrameBody::ControlRequest(r) => {
            w.u32(off::REQ_ID, r.request_id);
            match &r.op {
                ControlOp::Create(c) => {
                    w.u8(off::REQ_OP, OP_CREATE);
                    w.bytes(off::REQ_MAC, &c.mac.0);
                    w.u32(off::REQ_ENDPOINT, c.endpoint);
                    w.u32(off::REQ_RING_SIZE, c.ring_size);
                    w.u64(off::REQ_REGION_ADDR, c.region_addr);
                    w.u64(off::REQ_REGION_LEN, c.region_len);
                }
                ControlOp::Destroy { channel } => {
                    w.u8(off::REQ_OP, OP_DESTROY);
                    w.u32(off::REQ_DESTROY_CHANNEL, channel.0);
                }
            }
        }
        FrameBody::ControlResponse(r) => {
            w.u32(off::RESP_ID, r.request_id);
            w.u32(off::RESP_CHANNEL, r.channel.0);
            match r.status {
                ControlStatus::Pending => w.u8(off::RESP_STATUS, STATUS_PENDING),
                ControlStatus::Success { worker, cpu } => {
                    w.u8(off::RESP_STATUS, STATUS_SUCCESS);
                    w.u32(off::RESP_WORKER, worker);
                    // validate() checked c <= i32::MAX; None is -1.
                    w.u32(off::RESP_CPU, cpu.unwrap_or(u32::MAX));
                }
                ControlStatus::Failure(reason) => {
                    w.u8(off::RESP_STATUS, STATUS_FAILURE);
                    w.u16(off::RESP_REASON, reason.code());
                }
                ControlStatus::Destroyed => w.u8(off::RESP_STATUS, STATUS_DESTROYED),
            }
        }
        FrameBody::Data(d) => {
            let h = &d.header;
            w.u32(off::DATA_SRC_EP, h.src_endpoint);
            w.u32(off::DATA_DST_EP, h.dst_endpoint);
            w.u32(off::DATA_SESSION, d.session);
            w.u32(off::DATA_SEQ, d.seq);
            w.u8(off::DATA_KIND, h.kind.code());
            w.u8(off::DATA_FLAGS, h.msg_flags);
            w.u32(off::DATA_MSG_ID, h.message_id);
            w.u32(off::DATA_TOTAL, d.total_len);
            w.u32(off::DATA_FRAG_OFF, d.frag_offset);
            // validate() checked the length fits in a u16.
            w.u16(off::DATA_FRAG_LEN, d.payload.len() as u16);
            w.u64(off::DATA_COOKIE, h.cookie);
        }
        FrameBody::Doorbell { channel } | FrameBody::Wake { channel } => {
            w.u32(off::NOTIFY_CHANNEL, channel.0);
        }
        FrameBody::Ack(a) => {
            w.u32(off::ACK_SRC_EP, a.src_endpoint);
            w.u32(off::ACK_DST_EP, a.dst_endpoint);
            w.u32(off::ACK_SESSION, a.session);
            match a.kind {
                AckKind::Cumulative { ack } => w.u32(off::ACK_ACK, ack),
                AckKind::Reject {
                    ack,
                    message_id,
                    status,
                } => {
                    w.u32(off::ACK_ACK, ack);
                    w.u32(off::ACK_MSG_ID, message_id);
                    w.u16(off::ACK_STATUS, status.code());
                }
                AckKind::Reset => w.u16(off::ACK_FLAGS, ACK_FLAG_RESET),
                AckKind::Blocked { ack } => {
                    w.u32(off::ACK_ACK, ack);
                    w.u16(off::ACK_FLAGS, ACK_FLAG_BLOCKED);
                }
            }
        }
        FrameBody::Bundle(b) => {
            w.u32(off::BUNDLE_SRC_EP, b.src_endpoint);
            w.u32(off::BUNDLE_DST_EP, b.dst_endpoint);
            w.u32(off::BUNDLE_SESSION, b.session);
            w.u32(off::BUNDLE_SEQ, b.seq);
            w.u32(off::BUNDLE_FIRST_ID, b.first_message_id);
            w.u16(off::BUNDLE_COUNT, b.count);
        }
    }
}

/// Decodes the body of a frame of type `ftype` from `b` (everything after the svnic header,
/// at least `ftype.body_len()` bytes). Returns the body and its payload length.
pub(super) fn decode_body<'a>(
    ftype: FrameType,
    b: &Reader<'a>,
) -> Result<(FrameBody<'a>, usize), DecodeError> {
    let (body, payload_len) = match ftype {
        FrameType::ControlRequest => (FrameBody::ControlRequest(decode_request(b)?), 0),
        FrameType::ControlResponse => (FrameBody::ControlResponse(decode_response(b)?), 0),
        FrameType::Data => {
            let d = decode_data(b)?;
            (FrameBody::Data(d), d.payload.len())
        }
        FrameType::Doorbell => (
            FrameBody::Doorbell {
                channel: ChannelId(b.u32(off::NOTIFY_CHANNEL, "doorbell")?),
            },
            0,
        ),
        FrameType::Wake => (
            FrameBody::Wake {
                channel: ChannelId(b.u32(off::NOTIFY_CHANNEL, "wake")?),
            },
            0,
        ),
        FrameType::Ack => (FrameBody::Ack(decode_ack(b)?), 0),
        FrameType::Bundle => {
            let bundle = decode_bundle(b)?;
            (FrameBody::Bundle(bundle), bundle.entries.len())
        }
    };
    Ok((body, payload_len))
}

/// Checks the Ethernet and svnic headers and returns the frame type.
pub(super) fn svnic_header(bytes: &[u8]) -> Result<FrameType, DecodeError> {
    let r = Reader(bytes);
    let ethertype = u16::from_be_bytes(r.array(12, "Ethernet header")?);
    if ethertype != ETHERTYPE {
        return Err(DecodeError::NotSvnic(format!(
            "EtherType {ethertype:#06x}, expected {ETHERTYPE:#06x} (VLAN tags are not allowed)"
        )));
    }
    let [version, ftype] = r.array(ETH_HEADER_LEN, "svnic header")?;
    let flags = u16::from_le_bytes(r.array(ETH_HEADER_LEN + 2, "svnic header")?);
    if version != FRAME_VERSION {
        return Err(DecodeError::NotSvnic(format!(
            "frame version {version}, this engine speaks version {FRAME_VERSION}"
        )));
    }
    let ftype = FrameType::from_code(ftype)?;
    if flags != 0 {
        return Err(DecodeError::ReservedNotZero {
            what: "svnic header flags",
        });
    }
    Ok(ftype)
}

fn decode_request(b: &Reader<'_>) -> Result<ControlRequest, DecodeError> {
    const WHAT: &str = "control request";
    let request_id = b.u32(off::REQ_ID, WHAT)?;
    let op = match b.u8(off::REQ_OP, WHAT)? {
        OP_CREATE => {
            b.zero(off::REQ_OP + 1..off::REQ_MAC, WHAT)?;
            b.zero(off::REQ_RESERVED..off::REQ_REGION_ADDR, WHAT)?;
            ControlOp::Create(CreateRequest {
                mac: MacAddr(b.array(off::REQ_MAC, WHAT)?),
                endpoint: b.u32(off::REQ_ENDPOINT, WHAT)?,
                ring_size: b.u32(off::REQ_RING_SIZE, WHAT)?,
                region_addr: b.u64(off::REQ_REGION_ADDR, WHAT)?,
                region_len: b.u64(off::REQ_REGION_LEN, WHAT)?,
            })
        }
        OP_DESTROY => {
            b.zero(off::REQ_OP + 1..off::REQ_DESTROY_CHANNEL, WHAT)?;
            b.zero(off::REQ_DESTROY_CHANNEL + 4..CONTROL_REQUEST_LEN, WHAT)?;
            ControlOp::Destroy {
                channel: ChannelId(b.u32(off::REQ_DESTROY_CHANNEL, WHAT)?),
            }
        }
        other => {
            return Err(DecodeError::UnknownCode {
                what: "control request op",
                code: other.into(),
            })
        }
    };
    Ok(ControlRequest { request_id, op })
}

fn decode_response(b: &Reader<'_>) -> Result<ControlResponse, DecodeError> {
    const WHAT: &str = "control response";
    let request_id = b.u32(off::RESP_ID, WHAT)?;
    let status = b.u8(off::RESP_STATUS, WHAT)?;
    b.zero(off::RESP_RESERVED..off::RESP_REASON, WHAT)?;
    let reason = b.u16(off::RESP_REASON, WHAT)?;
    let channel = ChannelId(b.u32(off::RESP_CHANNEL, WHAT)?);
    let worker = b.u32(off::RESP_WORKER, WHAT)?;
    let cpu = b.u32(off::RESP_CPU, WHAT)?;
    let status = match status {
        STATUS_SUCCESS => {
            let cpu = match cpu {
                u32::MAX => None,
                c if c <= i32::MAX as u32 => Some(c),
                c => {
                    return Err(DecodeError::UnknownCode {
                        what: "control response cpu (negative other than -1)",
                        code: c.into(),
                    })
                }
            };
            if reason != 0 {
                return Err(DecodeError::ReservedNotZero {
                    what: "control response reason (status Success)",
                });
            }
            ControlStatus::Success { worker, cpu }
        }
        STATUS_PENDING | STATUS_FAILURE | STATUS_DESTROYED => {
            if worker != 0 || cpu != 0 {
                return Err(DecodeError::ReservedNotZero {
                    what: "control response worker/cpu (status not Success)",
                });
            }
            match status {
                STATUS_FAILURE => ControlStatus::Failure(FailureReason::from_code(reason)?),
                _ if reason != 0 => {
                    return Err(DecodeError::ReservedNotZero {
                        what: "control response reason (status not Failure)",
                    })
                }
                STATUS_PENDING => ControlStatus::Pending,
                _ => ControlStatus::Destroyed,
            }
        }
        other => {
            return Err(DecodeError::UnknownCode {
                what: "control response status",
                code: other.into(),
            })
        }
    };
    Ok(ControlResponse {
        request_id,
        channel,
        status,
    })
}

fn decode_data<'a>(b: &Reader<'a>) -> Result<DataFrame<'a>, DecodeError> {
    const WHAT: &str = "data frame";
    let frag_len = usize::from(b.u16(off::DATA_FRAG_LEN, WHAT)?);
    let payload_end = DATA_HEADER_LEN
        .checked_add(frag_len)
        .ok_or(DecodeError::BadLength {
            what: "data frame: frag_len",
            len: frag_len as u64,
            max: u16::MAX.into(),
        })?;
    let payload =
        b.0.get(DATA_HEADER_LEN..payload_end)
            .ok_or_else(|| DecodeError::Truncated {
                what: "data frame payload (frag_len)",
                len: BODY_OFFSET + b.0.len(),
                need: BODY_OFFSET + payload_end,
            })?;
    let d = DataFrame {
        session: b.u32(off::DATA_SESSION, WHAT)?,
        seq: b.u32(off::DATA_SEQ, WHAT)?,
        header: MessageHeader {
            src_endpoint: b.u32(off::DATA_SRC_EP, WHAT)?,
            dst_endpoint: b.u32(off::DATA_DST_EP, WHAT)?,
            kind: DataKind::from_code(b.u8(off::DATA_KIND, WHAT)?)?,
            msg_flags: b.u8(off::DATA_FLAGS, WHAT)?,
            message_id: b.u32(off::DATA_MSG_ID, WHAT)?,
            cookie: b.u64(off::DATA_COOKIE, WHAT)?,
        },
        total_len: b.u32(off::DATA_TOTAL, WHAT)?,
        frag_offset: b.u32(off::DATA_FRAG_OFF, WHAT)?,
        payload,
    };
    d.validate()?;
    Ok(d)
}

fn decode_bundle<'a>(b: &Reader<'a>) -> Result<BundleFrame<'a>, DecodeError> {
    const WHAT: &str = "bundle frame";
    b.zero(off::BUNDLE_RESERVED..BUNDLE_HEADER_LEN, WHAT)?;
    let count = b.u16(off::BUNDLE_COUNT, WHAT)?;
    let rest = b.0.get(BUNDLE_HEADER_LEN..).unwrap_or_default();
    let len = entries_len(rest, count)?;
    Ok(BundleFrame {
        src_endpoint: b.u32(off::BUNDLE_SRC_EP, WHAT)?,
        dst_endpoint: b.u32(off::BUNDLE_DST_EP, WHAT)?,
        session: b.u32(off::BUNDLE_SESSION, WHAT)?,
        seq: b.u32(off::BUNDLE_SEQ, WHAT)?,
        first_message_id: b.u32(off::BUNDLE_FIRST_ID, WHAT)?,
        count,
        entries: rest.get(..len).unwrap_or_default(),
    })
}

fn decode_ack(b: &Reader<'_>) -> Result<AckFrame, DecodeError> {
    const WHAT: &str = "ack frame";
    let ack = b.u32(off::ACK_ACK, WHAT)?;
    let message_id = b.u32(off::ACK_MSG_ID, WHAT)?;
    let status = b.u16(off::ACK_STATUS, WHAT)?;
    let flags = b.u16(off::ACK_FLAGS, WHAT)?;
    if flags & !(ACK_FLAG_RESET | ACK_FLAG_BLOCKED) != 0
        || flags == ACK_FLAG_RESET | ACK_FLAG_BLOCKED
    {
        return Err(DecodeError::ReservedNotZero {
            what: "ack flags (bits other than RESET or BLOCKED, or both)",
        });
    }
    let kind = if flags == ACK_FLAG_BLOCKED {
        if message_id != 0 || status != 0 {
            return Err(DecodeError::ReservedNotZero {
                what: "message_id and status of a BLOCKED ack",
            });
        }
        AckKind::Blocked { ack }
    } else if flags & ACK_FLAG_RESET != 0 {
        if ack != 0 || message_id != 0 || status != 0 {
            return Err(DecodeError::ReservedNotZero {
                what: "ack, message_id and status of a RESET ack",
            });
        }
        AckKind::Reset
    } else if status == CompletionStatus::Ok.code() {
        if message_id != 0 {
            return Err(DecodeError::ReservedNotZero {
                what: "message_id of a cumulative ack (status 0)",
            });
        }
        AckKind::Cumulative { ack }
    } else {
        AckKind::Reject {
            ack,
            message_id,
            status: CompletionStatus::from_code(status)?,
        }
    };
    Ok(AckFrame {
        src_endpoint: b.u32(off::ACK_SRC_EP, WHAT)?,
        dst_endpoint: b.u32(off::ACK_DST_EP, WHAT)?,
        session: b.u32(off::ACK_SESSION, WHAT)?,
        kind,
    })
}

/// Bounds-checked little-endian reads from a byte slice; never panics.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn array<const N: usize>(
        &self,
        at: usize,
        what: &'static str,
    ) -> Result<[u8; N], DecodeError> {
        at.checked_add(N)
            .and_then(|end| self.0.get(at..end))
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or(DecodeError::Truncated {
                what,
                len: self.0.len(),
                need: at.saturating_add(N),
            })
    }
    fn u8(&self, at: usize, what: &'static str) -> Result<u8, DecodeError> {
        self.array::<1>(at, what).map(|[b]| b)
    }
    fn u16(&self, at: usize, what: &'static str) -> Result<u16, DecodeError> {
        self.array(at, what).map(u16::from_le_bytes)
    }
    pub(super) fn u32(&self, at: usize, what: &'static str) -> Result<u32, DecodeError> {
        self.array(at, what).map(u32::from_le_bytes)
    }
    fn u64(&self, at: usize, what: &'static str) -> Result<u64, DecodeError> {
        self.array(at, what).map(u64::from_le_bytes)
    }
    /// Checks that `range` is all zero (reserved bytes).
    fn zero(&self, range: std::ops::Range<usize>, what: &'static str) -> Result<(), DecodeError> {
        let range_end = range.end;
        match self.0.get(range) {
            Some(s) if s.iter().all(|b| *b == 0) => Ok(()),
            Some(_) => Err(DecodeError::ReservedNotZero { what }),
            None => Err(DecodeError::Truncated {
                what,
                len: self.0.len(),
                need: range_end,
            }),
        }
    }
}

/// Little-endian writes into a body whose length the caller sized from the frame type; offsets
/// are the constants above, so every write is in range (checked by the round-trip tests).
struct Writer<'a>(&'a mut [u8]);

impl Writer<'_> {
    fn bytes(&mut self, at: usize, v: &[u8]) {
        if let Some(dst) = self.0.get_mut(at..at + v.len()) {
            dst.copy_from_slice(v);
        }
    }
    fn u8(&mut self, at: usize, v: u8) {
        self.bytes(at, &[v]);
    }
    fn u16(&mut self, at: usize, v: u16) {
        self.bytes(at, &v.to_le_bytes());
    }
    fn u32(&mut self, at: usize, v: u32) {
        self.bytes(at, &v.to_le_bytes());
    }
    fn u64(&mut self, at: usize, v: u64) {
        self.bytes(at, &v.to_le_bytes());
    }
}
