//! The input of the `vhost_user_sequences` target: a sequence of vhost-user messages, each with
//! its header fields, a body (structured for the messages that carry one, or raw bytes) and the
//! file descriptors attached to it.
//!
//! The types derive `Arbitrary`; [`Encode`] writes the bytes `Arbitrary` decodes back into the
//! same value, so seeds can be written as values ([`crate::vhost_user_seeds`]) and checked to
//! round-trip.

use arbitrary::Arbitrary;

/// Messages per input at most (the rest is ignored).
pub const MAX_MESSAGES: usize = 64;
/// File descriptors attached to one message at most (the rest is ignored).
pub const MAX_FDS: usize = 8;
/// Regions of a structured memory table at most (vhost-user's own limit is 8: a few more are
/// sent to see them refused).
pub const MAX_REGIONS: usize = 10;
/// Raw body bytes at most.
pub const MAX_RAW_BODY: usize = 512;
/// Largest memfd an input may ask for (sparse: nothing is written to it).
pub const MAX_MEMFD: u64 = 64 << 20;

/// vhost-user header flag: protocol version 1.
pub const VERSION_1: u32 = 0x1;
/// vhost-user header flag: the frontend wants a REPLY_ACK.
pub const NEED_REPLY: u32 = 0x8;

/// Request codes (the frontend's side of the protocol).
pub mod req {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
    pub const GET_CONFIG: u32 = 24;
    pub const RESET_DEVICE: u32 = 34;
    pub const ADD_MEM_REG: u32 = 37;
    pub const REM_MEM_REG: u32 = 38;
    /// The highest code the generator is biased toward.
    pub const LAST_KNOWN: u32 = 40;
}

/// One fuzz input.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// Sent in order over one fresh connection.
    pub messages: Vec<Message>,
}

/// One vhost-user message and what goes with it.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Before sending it, truncate to 0 every "truncated later" memfd sent so far.
    pub truncate_before: bool,
    /// The request code.
    pub request: Request,
    /// The header flags.
    pub flags: Flags,
    /// The body.
    pub body: Body,
    /// Overrides the header's body size (normally the body's length).
    pub size: Option<u32>,
    /// Attached file descriptors (SCM_RIGHTS), in order.
    pub fds: Vec<Attach>,
}

/// The request code: mostly a real one, sometimes anything.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// `1 + n % 40`.
    Known(u8),
    /// Any code.
    Any(u32),
}

impl Request {
    /// The code on the wire.
    pub fn code(self) -> u32 {
        match self {
            Request::Known(n) => 1 + u32::from(n) % req::LAST_KNOWN,
            Request::Any(code) => code,
        }
    }

    /// The `Known` form of a real code (for seeds).
    pub fn of(code: u32) -> Self {
        Request::Known(u8::try_from(code.saturating_sub(1)).unwrap_or(0))
    }
}

/// The header flags.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flags {
    /// Version 1, no reply asked (how QEMU sends most messages).
    Version1,
    /// Version 1 with NEED_REPLY.
    NeedReply,
    /// Anything.
    Raw(u32),
}

impl Flags {
    /// The flags on the wire.
    pub fn bits(self) -> u32 {
        match self {
            Flags::Version1 => VERSION_1,
            Flags::NeedReply => VERSION_1 | NEED_REPLY,
            Flags::Raw(bits) => bits,
        }
    }
}

/// A message body.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// No body.
    Empty,
    /// A u64 (features, protocol features, log base).
    U64(u64),
    /// `vhost_vring_state`: ring index and a number (size, base, enable).
    VringState { index: u32, num: u32 },
    /// The u64 of SET_VRING_KICK/CALL/ERR: ring index, bit 8 "no fd".
    VringFd { index: u8, no_fd: bool },
    /// `vhost_vring_addr`.
    VringAddr {
        index: u32,
        flags: u32,
        desc: Addr,
        used: Addr,
        avail: Addr,
        log: u64,
    },
    /// `vhost_user_memory`: up to [`MAX_REGIONS`] regions; `claimed` replaces the region count.
    MemTable {
        regions: Vec<Region>,
        claimed: Option<u32>,
    },
    /// `vhost_user_memory_single_region` (ADD_MEM_REG / REM_MEM_REG).
    SingleRegion(Region),
    /// Up to [`MAX_RAW_BODY`] bytes.
    Raw(Vec<u8>),
}

/// An address in a vring message.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    /// As is.
    Raw(u64),
    /// Inside a region of the last memory table sent (its frontend address plus `offset`
    /// modulo the region's size), or `offset` when none was sent.
    InRegion { region: u8, offset: u32 },
}

/// A memory-table region.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    /// Every field as is.
    Raw {
        gpa: u64,
        size: u64,
        user_addr: u64,
        offset: u64,
    },
    /// In pages: plausible values, more likely to fit a memfd.
    Pages {
        gpa_page: u16,
        pages: u16,
        user_page: u32,
        offset_page: u16,
    },
}

/// Page size of [`Region::Pages`].
pub const PAGE: u64 = 4096;
/// Frontend addresses of [`Region::Pages`] start here (like a user-space mapping).
pub const USER_BASE: u64 = 0x7f00_0000_0000;

impl Region {
    /// `(gpa, size, user_addr, offset)` on the wire.
    pub fn fields(self) -> (u64, u64, u64, u64) {
        match self {
            Region::Raw {
                gpa,
                size,
                user_addr,
                offset,
            } => (gpa, size, user_addr, offset),
            Region::Pages {
                gpa_page,
                pages,
                user_page,
                offset_page,
            } => (
                u64::from(gpa_page) * PAGE,
                u64::from(pages) * PAGE,
                USER_BASE + u64::from(user_page) * PAGE,
                u64::from(offset_page) * PAGE,
            ),
        }
    }
}

/// A file descriptor attached to a message.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A memfd of `size % (MAX_MEMFD + 1)` bytes; sealed against shrinking and growing (as
    /// QEMU's memory-backend-memfd is) or not.
    Memfd { size: u32, sealed: bool },
    /// An unsealed memfd that a later message's `truncate_before` truncates to 0.
    MemfdTruncatedLater { size: u32 },
    /// An eventfd.
    EventFd,
    /// The read end of a pipe (the harness keeps the write end).
    PipeRead,
    /// The write end of a pipe, which nobody reads (the harness keeps the read end).
    PipeWrite,
}

/// Writes a value as the bytes `Arbitrary` decodes back into it.
pub trait Encode {
    /// Appends the encoding to `out`.
    fn encode(&self, out: &mut Vec<u8>);
}

/// The tag of variant `k` of an `n`-variant enum: the derive maps a u32 `x` to
/// `(x * n) >> 32`, so the smallest `x` with that result is `ceil(k * 2^32 / n)`.
fn variant(out: &mut Vec<u8>, k: u64, n: u64) {
    let x = (k << 32).div_ceil(n);
    (x as u32).encode(out);
}

macro_rules! encode_ints {
    ($($t:ty),*) => {$(
        impl Encode for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
encode_ints!(u8, u16, u32, u64);

impl Encode for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        u8::from(*self).encode(out);
    }
}

impl<T: Encode> Encode for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        self.is_some().encode(out);
        if let Some(v) = self {
            v.encode(out);
        }
    }
}

/// Each element after a `true`, then a `false` (both as collection and as the last field).
impl<T: Encode> Encode for Vec<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in self {
            true.encode(out);
            v.encode(out);
        }
        false.encode(out);
    }
}

impl Encode for Input {
    fn encode(&self, out: &mut Vec<u8>) {
        self.messages.encode(out);
    }
}

impl Encode for Message {
    fn encode(&self, out: &mut Vec<u8>) {
        self.truncate_before.encode(out);
        self.request.encode(out);
        self.flags.encode(out);
        self.body.encode(out);
        self.size.encode(out);
        self.fds.encode(out);
    }
}

impl Encode for Request {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Request::Known(n) => {
                variant(out, 0, 2);
                n.encode(out);
            }
            Request::Any(code) => {
                variant(out, 1, 2);
                code.encode(out);
            }
        }
    }
}

impl Encode for Flags {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Flags::Version1 => variant(out, 0, 3),
            Flags::NeedReply => variant(out, 1, 3),
            Flags::Raw(bits) => {
                variant(out, 2, 3);
                bits.encode(out);
            }
        }
    }
}

impl Encode for Body {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u64 = 8;
        match self {
            Body::Empty => variant(out, 0, N),
            Body::U64(v) => {
                variant(out, 1, N);
                v.encode(out);
            }
            Body::VringState { index, num } => {
                variant(out, 2, N);
                index.encode(out);
                num.encode(out);
            }
            Body::VringFd { index, no_fd } => {
                variant(out, 3, N);
                index.encode(out);
                no_fd.encode(out);
            }
            Body::VringAddr {
                index,
                flags,
                desc,
                used,
                avail,
                log,
            } => {
                variant(out, 4, N);
                index.encode(out);
                flags.encode(out);
                desc.encode(out);
                used.encode(out);
                avail.encode(out);
                log.encode(out);
            }
            Body::MemTable { regions, claimed } => {
                variant(out, 5, N);
                regions.encode(out);
                claimed.encode(out);
            }
            Body::SingleRegion(region) => {
                variant(out, 6, N);
                region.encode(out);
            }
            Body::Raw(bytes) => {
                variant(out, 7, N);
                bytes.encode(out);
            }
        }
    }
}

impl Encode for Addr {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Addr::Raw(a) => {
                variant(out, 0, 2);
                a.encode(out);
            }
            Addr::InRegion { region, offset } => {
                variant(out, 1, 2);
                region.encode(out);
                offset.encode(out);
            }
        }
    }
}

impl Encode for Region {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Region::Raw {
                gpa,
                size,
                user_addr,
                offset,
            } => {
                variant(out, 0, 2);
                for v in [gpa, size, user_addr, offset] {
                    v.encode(out);
                }
            }
            Region::Pages {
                gpa_page,
                pages,
                user_page,
                offset_page,
            } => {
                variant(out, 1, 2);
                gpa_page.encode(out);
                pages.encode(out);
                user_page.encode(out);
                offset_page.encode(out);
            }
        }
    }
}

impl Encode for Attach {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u64 = 5;
        match self {
            Attach::Memfd { size, sealed } => {
                variant(out, 0, N);
                size.encode(out);
                sealed.encode(out);
            }
            Attach::MemfdTruncatedLater { size } => {
                variant(out, 1, N);
                size.encode(out);
            }
            Attach::EventFd => variant(out, 2, N),
            Attach::PipeRead => variant(out, 3, N),
            Attach::PipeWrite => variant(out, 4, N),
        }
    }
}

/// The encoding of `input`.
pub fn to_bytes(input: &Input) -> Vec<u8> {
    let mut out = Vec::new();
    input.encode(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbitrary::Unstructured;

    fn decode(bytes: &[u8]) -> Input {
        Input::arbitrary_take_rest(Unstructured::new(bytes)).expect("decodes")
    }

    #[test]
    fn every_variant_round_trips_through_arbitrary() {
        let regions = vec![
            Region::Raw {
                gpa: 1,
                size: u64::MAX,
                user_addr: 3,
                offset: 4,
            },
            Region::Pages {
                gpa_page: 5,
                pages: 6,
                user_page: 7,
                offset_page: 8,
            },
        ];
        let bodies = [
            Body::Empty,
            Body::U64(u64::MAX - 1),
            Body::VringState { index: 1, num: 2 },
            Body::VringFd {
                index: 1,
                no_fd: true,
            },
            Body::VringAddr {
                index: 1,
                flags: 2,
                desc: Addr::Raw(3),
                used: Addr::InRegion {
                    region: 4,
                    offset: 5,
                },
                avail: Addr::Raw(6),
                log: 7,
            },
            Body::MemTable {
                regions: regions.clone(),
                claimed: Some(9),
            },
            Body::SingleRegion(regions[1]),
            Body::Raw(vec![0, 1, 0xff, 2]),
        ];
        let fds = [
            Attach::Memfd {
                size: 77,
                sealed: true,
            },
            Attach::MemfdTruncatedLater { size: 88 },
            Attach::EventFd,
            Attach::PipeRead,
            Attach::PipeWrite,
        ];
        let messages = bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Message {
                truncate_before: i % 2 == 1,
                request: if i % 3 == 0 {
                    Request::Any(0xdead_0000 + i as u32)
                } else {
                    Request::of(i as u32 + 1)
                },
                flags: [Flags::Version1, Flags::NeedReply, Flags::Raw(0x1234)][i % 3],
                body,
                size: (i % 2 == 0).then_some(i as u32),
                fds: fds[..i % 6].to_vec(),
            })
            .collect();
        let input = Input { messages };
        assert_eq!(decode(&to_bytes(&input)), input);
    }

    #[test]
    fn request_codes_stay_known_and_flags_match_the_protocol() {
        assert_eq!(Request::of(req::SET_MEM_TABLE).code(), 5);
        assert_eq!(Request::Known(255).code(), 1 + 255 % 40);
        assert_eq!(Flags::NeedReply.bits(), 0x9);
    }
}
