//! The application protocol of `svnic-guestd`: what an application and the agent say to each
//! other on the agent's Unix socket (`SOCK_SEQPACKET`, one message per packet, so no framing).
//!
//! Every message starts with an 8-byte header; integers are little-endian:
//!
//! ```text
//! offset size field
//!      0    1 version (1)
//!      1    1 kind (below; requests and responses have separate kind spaces)
//!      2    2 reserved, zero
//!      4    4 token (u32): chosen by the application per request, echoed in every answer
//! ```
//!
//! Requests (application -> agent):
//!
//! | kind | name    | body (offset: field)                       | total |
//! |-----:|---------|--------------------------------------------|------:|
//! | 1    | Create  | 8: endpoint u32, 12: ring_size u32         | 16 |
//! | 2    | Mapped  | —                                          | 8  |
//! | 3    | Destroy | 8: channel_id u32                          | 12 |
//! | 4    | Cancel  | — (give back a `Region` that will not be mapped; no answer) | 8 |
//!
//! Responses (agent -> application):
//!
//! | kind | name      | body                                                                  | total |
//! |-----:|-----------|-----------------------------------------------------------------------|------:|
//! | 1    | Hello     | 8: mac (6 bytes), 14: reserved (2), 16: region_len u64, 24: max_channels u32 | 28 |
//! | 2    | Region    | 8: region_len u64, 16: fd_offset u64; **3 fds**: memory, wake, doorbell | 24 |
//! | 3    | Pending   | —                                                                     | 8  |
//! | 4    | Success   | 8: channel_id, 12: worker, 16: cpu i32 (−1 unpinned), 20: mac (6 bytes), 26: reserved (2), 28: endpoint | 32 |
//! | 5    | Failure   | 8: code u16, 10: reserved (2), 12..: detail, UTF-8, at most 240 bytes  | 12+ |
//! | 6    | Destroyed | 8: channel_id u32                                                     | 12 |
//!
//! The conversation for a channel: `Create` -> `Region` (the agent allocated the memory and
//! passes it with `SCM_RIGHTS`, plus a wake eventfd and a doorbell eventfd) -> the application
//! maps the memory and answers `Mapped` -> the agent seals the memory so that nobody can free it
//! under the engine, learns its guest-physical address, and asks the engine -> `Pending` ->
//! `Success` or `Failure`. `Destroy` -> `Destroyed` (sent after the engine acknowledged; the
//! agent frees the memory only then). Any step may be answered with `Failure` instead.
//! `Hello` (token 0) is the agent's first message on every connection.
//!
//! Decoding checks the version, the kind, the exact length and every reserved byte, and never
//! panics.

use svnic_channels::{ChannelAddr, ChannelId, FailureReason, MacAddr};
use thiserror::Error;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u8 = 1;
/// Largest message either side sends.
pub const MAX_MESSAGE_LEN: usize = 256;
/// Longest failure detail text.
pub const MAX_DETAIL_LEN: usize = 240;
/// File descriptors that come with a `Region` response: memory, wake eventfd, doorbell eventfd.
pub const REGION_FDS: usize = 3;
/// Where `svnic-guestd` listens unless told otherwise.
pub const DEFAULT_AGENT_SOCKET: &str = "/run/svnic/agent.sock";

const HEADER_LEN: usize = 8;

/// A malformed protocol message.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// Shorter than the header.
    #[error("message of {0} bytes is shorter than the 8-byte header")]
    Short(usize),
    /// Another protocol version.
    #[error("protocol version {got} (this side speaks {PROTOCOL_VERSION})")]
    Version {
        /// The version received.
        got: u8,
    },
    /// Unknown kind.
    #[error("unknown {what} kind {kind}")]
    Kind {
        /// "request" or "response".
        what: &'static str,
        /// The kind byte.
        kind: u8,
    },
    /// Wrong length for the kind.
    #[error("{name} message is {len} bytes, expected {expected}")]
    Length {
        /// Message name.
        name: &'static str,
        /// Length received.
        len: usize,
        /// Length expected.
        expected: usize,
    },
    /// A reserved byte is not zero.
    #[error("{name} message: reserved byte {offset} is not zero")]
    Reserved {
        /// Message name.
        name: &'static str,
        /// Offset of the byte.
        offset: usize,
    },
    /// An unknown failure code.
    #[error("unknown failure code {0:#x}")]
    FailureCode(u16),
    /// A failure detail that is not UTF-8.
    #[error("failure detail is not UTF-8")]
    Detail,
    /// A field value that makes no sense (a negative CPU other than -1, a Hello with a token).
    #[error("{name} message: {why}")]
    Field {
        /// Message name.
        name: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

/// Application -> agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Allocate memory for a channel at (the NIC's MAC, `endpoint`) with `ring_size` slots.
    Create {
        /// Echoed in the answers.
        token: u32,
        /// The channel's endpoint.
        endpoint: u32,
        /// Slots per ring.
        ring_size: u32,
    },
    /// The memory of create request `token` is mapped: register the channel with the engine.
    Mapped {
        /// The create request's token.
        token: u32,
    },
    /// Destroy a channel of this application.
    Destroy {
        /// Echoed in the answer.
        token: u32,
        /// The channel.
        channel: ChannelId,
    },
    /// The application will not map the `Region` of create request `token`: free it (no answer).
    Cancel {
        /// The create request's token.
        token: u32,
    },
}

/// Why the agent refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentFailure {
    /// The engine refused (codes below 0x100, docs/abi.md §6.2).
    Engine(FailureReason),
    /// The request was malformed or out of place (code 0x101).
    BadRequest,
    /// No memory for the channel: hugepages exhausted, mapping failed (0x102).
    NoMemory,
    /// The application or the agent has as many channels as allowed (0x103).
    TooManyChannels,
    /// The NIC failed (0x104).
    Nic,
    /// No request with that token waits for this message (0x105).
    UnknownToken,
    /// The channel is not this application's (0x106).
    NotYourChannel,
    /// The agent is shutting down (0x107).
    ShuttingDown,
    /// The agent could not lock the memory down (sealing, address lookup) (0x108).
    Memory,
    /// The user (uid) has as many channels as `--max-channels-per-uid` allows (0x109).
    UidChannelQuota,
    /// The user's channel memory would pass `--max-hugepages-per-uid` (0x10a).
    UidMemoryQuota,
    /// The endpoint is reserved for, or held by, another user (0x10b).
    EndpointOwned,
}

impl AgentFailure {
    /// The wire code.
    pub fn code(self) -> u16 {
        match self {
            AgentFailure::Engine(r) => r.code(),
            AgentFailure::BadRequest => 0x101,
            AgentFailure::NoMemory => 0x102,
            AgentFailure::TooManyChannels => 0x103,
            AgentFailure::Nic => 0x104,
            AgentFailure::UnknownToken => 0x105,
            AgentFailure::NotYourChannel => 0x106,
            AgentFailure::ShuttingDown => 0x107,
            AgentFailure::Memory => 0x108,
            AgentFailure::UidChannelQuota => 0x109,
            AgentFailure::UidMemoryQuota => 0x10a,
            AgentFailure::EndpointOwned => 0x10b,
        }
    }

    /// Decodes a wire code.
    pub fn from_code(code: u16) -> Result<Self, ProtocolError> {
        Ok(match code {
            0x101 => AgentFailure::BadRequest,
            0x102 => AgentFailure::NoMemory,
            0x103 => AgentFailure::TooManyChannels,
            0x104 => AgentFailure::Nic,
            0x105 => AgentFailure::UnknownToken,
            0x106 => AgentFailure::NotYourChannel,
            0x107 => AgentFailure::ShuttingDown,
            0x108 => AgentFailure::Memory,
            0x109 => AgentFailure::UidChannelQuota,
            0x10a => AgentFailure::UidMemoryQuota,
            0x10b => AgentFailure::EndpointOwned,
            c => AgentFailure::Engine(
                FailureReason::from_code(c).map_err(|_| ProtocolError::FailureCode(c))?,
            ),
        })
    }
}

impl std::fmt::Display for AgentFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentFailure::Engine(r) => write!(f, "engine: {r}"),
            AgentFailure::BadRequest => f.write_str("bad request"),
            AgentFailure::NoMemory => f.write_str("no memory for the channel"),
            AgentFailure::TooManyChannels => f.write_str("too many channels"),
            AgentFailure::Nic => f.write_str("NIC failure"),
            AgentFailure::UnknownToken => f.write_str("unknown token"),
            AgentFailure::NotYourChannel => f.write_str("not a channel of this application"),
            AgentFailure::ShuttingDown => f.write_str("the agent is shutting down"),
            AgentFailure::Memory => f.write_str("cannot lock the channel memory down"),
            AgentFailure::UidChannelQuota => f.write_str("the user's channel quota is reached"),
            AgentFailure::UidMemoryQuota => f.write_str("the user's hugepage quota is reached"),
            AgentFailure::EndpointOwned => f.write_str("the endpoint belongs to another user"),
        }
    }
}

/// Agent -> application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// First message on a connection (token 0).
    Hello {
        /// The NIC's MAC: the MAC of every channel created through this agent.
        mac: MacAddr,
        /// Length of every channel region.
        region_len: u64,
        /// Channels one application may hold.
        max_channels: u32,
    },
    /// The memory of a create request, passed with [`REGION_FDS`] file descriptors.
    Region {
        /// The create request.
        token: u32,
        /// Bytes to map.
        region_len: u64,
        /// Offset of the region in the memory fd.
        fd_offset: u64,
    },
    /// The engine is working on the request.
    Pending {
        /// The request.
        token: u32,
    },
    /// The channel exists; its header is initialised.
    Success {
        /// The create request.
        token: u32,
        /// The engine's channel id.
        channel: ChannelId,
        /// Serving worker.
        worker: u32,
        /// Host CPU of the worker, if pinned.
        cpu: Option<u32>,
        /// The channel's own address.
        addr: ChannelAddr,
    },
    /// Refused; nothing of the request remains.
    Failure {
        /// The request.
        token: u32,
        /// Why.
        reason: AgentFailure,
        /// Human detail (may be empty).
        detail: String,
    },
    /// The engine acknowledged the destroy; the memory is freed.
    Destroyed {
        /// The destroy request.
        token: u32,
        /// The channel.
        channel: ChannelId,
    },
}

impl Response {
    /// The token the response answers (0 for Hello).
    pub fn token(&self) -> u32 {
        match self {
            Response::Hello { .. } => 0,
            Response::Region { token, .. }
            | Response::Pending { token }
            | Response::Success { token, .. }
            | Response::Failure { token, .. }
            | Response::Destroyed { token, .. } => *token,
        }
    }

    /// Number of file descriptors that must come with this response.
    pub fn fd_count(&self) -> usize {
        match self {
            Response::Region { .. } => REGION_FDS,
            _ => 0,
        }
    }
}

fn header(kind: u8, token: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(32);
    v.push(PROTOCOL_VERSION);
    v.push(kind);
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&token.to_le_bytes());
    v
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn mac_at(b: &[u8], off: usize) -> MacAddr {
    let mut a = [0u8; 6];
    a.copy_from_slice(&b[off..off + 6]);
    MacAddr(a)
}

/// Checks the header; returns (kind, token).
fn check_header(b: &[u8]) -> Result<(u8, u32), ProtocolError> {
    if b.len() < HEADER_LEN {
        return Err(ProtocolError::Short(b.len()));
    }
    if b[0] != PROTOCOL_VERSION {
        return Err(ProtocolError::Version { got: b[0] });
    }
    Ok((b[1], u32_at(b, 4)))
}

fn check_len(name: &'static str, b: &[u8], expected: usize) -> Result<(), ProtocolError> {
    if b.len() != expected {
        return Err(ProtocolError::Length {
            name,
            len: b.len(),
            expected,
        });
    }
    Ok(())
}

fn check_zero(
    name: &'static str,
    b: &[u8],
    range: std::ops::Range<usize>,
) -> Result<(), ProtocolError> {
    match range.clone().find(|&i| b[i] != 0) {
        Some(offset) => Err(ProtocolError::Reserved { name, offset }),
        None => Ok(()),
    }
}

impl Request {
    /// The token.
    pub fn token(&self) -> u32 {
        match self {
            Request::Create { token, .. }
            | Request::Mapped { token }
            | Request::Cancel { token }
            | Request::Destroy { token, .. } => *token,
        }
    }

    /// Encodes the request.
    pub fn encode(&self) -> Vec<u8> {
        match *self {
            Request::Create {
                token,
                endpoint,
                ring_size,
            } => {
                let mut v = header(1, token);
                v.extend_from_slice(&endpoint.to_le_bytes());
                v.extend_from_slice(&ring_size.to_le_bytes());
                v
            }
            Request::Mapped { token } => header(2, token),
            Request::Destroy { token, channel } => {
                let mut v = header(3, token);
                v.extend_from_slice(&channel.0.to_le_bytes());
                v
            }
            Request::Cancel { token } => header(4, token),
        }
    }

    /// Decodes a request. The token of a message whose header is readable is
    /// [`request_token`], so that a malformed request can still be answered.
    pub fn decode(b: &[u8]) -> Result<Self, ProtocolError> {
        let (kind, token) = check_header(b)?;
        check_zero("request", b, 2..4)?;
        match kind {
            1 => {
                check_len("Create", b, 16)?;
                Ok(Request::Create {
                    token,
                    endpoint: u32_at(b, 8),
                    ring_size: u32_at(b, 12),
                })
            }
            2 => {
                check_len("Mapped", b, 8)?;
                Ok(Request::Mapped { token })
            }
            3 => {
                check_len("Destroy", b, 12)?;
                Ok(Request::Destroy {
                    token,
                    channel: ChannelId(u32_at(b, 8)),
                })
            }
            4 => {
                check_len("Cancel", b, 8)?;
                Ok(Request::Cancel { token })
            }
            kind => Err(ProtocolError::Kind {
                what: "request",
                kind,
            }),
        }
    }
}

/// The token of a message whose header is at least readable (to answer a malformed request).
pub fn request_token(b: &[u8]) -> Option<u32> {
    (b.len() >= HEADER_LEN).then(|| u32_at(b, 4))
}

impl Response {
    /// Encodes the response. A failure detail is cut to [`MAX_DETAIL_LEN`] bytes (at a
    /// character boundary).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Response::Hello {
                mac,
                region_len,
                max_channels,
            } => {
                let mut v = header(1, 0);
                v.extend_from_slice(&mac.0);
                v.extend_from_slice(&[0, 0]);
                v.extend_from_slice(&region_len.to_le_bytes());
                v.extend_from_slice(&max_channels.to_le_bytes());
                v
            }
            Response::Region {
                token,
                region_len,
                fd_offset,
            } => {
                let mut v = header(2, *token);
                v.extend_from_slice(&region_len.to_le_bytes());
                v.extend_from_slice(&fd_offset.to_le_bytes());
                v
            }
            Response::Pending { token } => header(3, *token),
            Response::Success {
                token,
                channel,
                worker,
                cpu,
                addr,
            } => {
                let mut v = header(4, *token);
                v.extend_from_slice(&channel.0.to_le_bytes());
                v.extend_from_slice(&worker.to_le_bytes());
                let cpu = cpu.and_then(|c| i32::try_from(c).ok()).unwrap_or(-1);
                v.extend_from_slice(&cpu.to_le_bytes());
                v.extend_from_slice(&addr.mac.0);
                v.extend_from_slice(&[0, 0]);
                v.extend_from_slice(&addr.endpoint.to_le_bytes());
                v
            }
            Response::Failure {
                token,
                reason,
                detail,
            } => {
                let mut v = header(5, *token);
                v.extend_from_slice(&reason.code().to_le_bytes());
                v.extend_from_slice(&[0, 0]);
                let mut end = detail.len().min(MAX_DETAIL_LEN);
                while !detail.is_char_boundary(end) {
                    end -= 1;
                }
                v.extend_from_slice(&detail.as_bytes()[..end]);
                v
            }
            Response::Destroyed { token, channel } => {
                let mut v = header(6, *token);
                v.extend_from_slice(&channel.0.to_le_bytes());
                v
            }
        }
    }

    /// Decodes a response.
    pub fn decode(b: &[u8]) -> Result<Self, ProtocolError> {
        let (kind, token) = check_header(b)?;
        check_zero("response", b, 2..4)?;
        match kind {
            1 => {
                check_len("Hello", b, 28)?;
                check_zero("Hello", b, 14..16)?;
                if token != 0 {
                    return Err(ProtocolError::Field {
                        name: "Hello",
                        why: "token must be 0",
                    });
                }
                Ok(Response::Hello {
                    mac: mac_at(b, 8),
                    region_len: u64_at(b, 16),
                    max_channels: u32_at(b, 24),
                })
            }
            2 => {
                check_len("Region", b, 24)?;
                Ok(Response::Region {
                    token,
                    region_len: u64_at(b, 8),
                    fd_offset: u64_at(b, 16),
                })
            }
            3 => {
                check_len("Pending", b, 8)?;
                Ok(Response::Pending { token })
            }
            4 => {
                check_len("Success", b, 32)?;
                check_zero("Success", b, 26..28)?;
                let cpu = u32_at(b, 16) as i32;
                let cpu = match cpu {
                    -1 => None,
                    c => Some(u32::try_from(c).map_err(|_| ProtocolError::Field {
                        name: "Success",
                        why: "cpu is negative but not -1",
                    })?),
                };
                Ok(Response::Success {
                    token,
                    channel: ChannelId(u32_at(b, 8)),
                    worker: u32_at(b, 12),
                    cpu,
                    addr: ChannelAddr::new(mac_at(b, 20), u32_at(b, 28)),
                })
            }
            5 => {
                if b.len() < 12 || b.len() > 12 + MAX_DETAIL_LEN {
                    return Err(ProtocolError::Length {
                        name: "Failure",
                        len: b.len(),
                        expected: 12,
                    });
                }
                check_zero("Failure", b, 10..12)?;
                let code = u16::from_le_bytes([b[8], b[9]]);
                let detail = std::str::from_utf8(&b[12..]).map_err(|_| ProtocolError::Detail)?;
                Ok(Response::Failure {
                    token,
                    reason: AgentFailure::from_code(code)?,
                    detail: detail.to_string(),
                })
            }
            6 => {
                check_len("Destroyed", b, 12)?;
                Ok(Response::Destroyed {
                    token,
                    channel: ChannelId(u32_at(b, 8)),
                })
            }
            kind => Err(ProtocolError::Kind {
                what: "response",
                kind,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
