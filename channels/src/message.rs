//! The 64-byte message: the unit of every channel ring (TX, RX and posted-buffer rings).
//!
//! Byte layout (little-endian; docs/abi.md is the normative description):
//!
//! | offset | size | field                                                                  |
//! |-------:|-----:|------------------------------------------------------------------------|
//! | 0      | 1    | kind: 1 user-data, 2 DMA-data, 3 post-buffer, 4 completion             |
//! | 1      | 1    | flags: bit 0 COMPLETE, bit 1 WANT_COMPLETION                           |
//! | 2      | 2    | user-data: inline payload length (0..=40); other kinds: 0              |
//! | 4      | 4    | peer endpoint (destination on TX, source on RX)                        |
//! | 8      | 6    | peer MAC (destination on TX, source on RX)                             |
//! | 14     | 2    | completion status (completion only; 0 otherwise)                       |
//! | 16     | 8    | cookie (opaque to the engine, echoed)                                  |
//! | 24     | 40   | user-data: payload; DMA/post: offset u64 @24, length u32 @32, zero @36 |
//!
//! Addresses in DMA-data and post-buffer messages are byte offsets from the start of the channel
//! region, and must lie inside its data area (see [`crate::layout`]).

use vm_memory::ByteValued;

use crate::error::DecodeError;
use crate::status::CompletionStatus;
use crate::types::{ChannelAddr, MacAddr};

/// Size of every message, in bytes.
pub const MESSAGE_SIZE: usize = 64;
/// Inline payload capacity of a user-data message.
pub const INLINE_CAPACITY: usize = 40;

/// Flag: the data of this message is in place (RX DMA-data, and every RX user-data message).
/// A consumer must not read DMA-data before it sees this flag.
pub const FLAG_COMPLETE: u8 = 1 << 0;
/// Flag (TX user-data): also send a completion on success, not only on error.
pub const FLAG_WANT_COMPLETION: u8 = 1 << 1;

const KIND_USER: u8 = 1;
const KIND_DMA: u8 = 2;
const KIND_POST: u8 = 3;
const KIND_COMPLETION: u8 = 4;

const OFF_KIND: usize = 0;
const OFF_FLAGS: usize = 1;
const OFF_LEN: usize = 2;
const OFF_ENDPOINT: usize = 4;
const OFF_MAC: usize = 8;
const OFF_STATUS: usize = 14;
const OFF_COOKIE: usize = 16;
const OFF_BODY: usize = 24;
const OFF_ADDR: usize = 24;
const OFF_DLEN: usize = 32;
const OFF_DMA_RESERVED: usize = 36;

/// A message as it sits in a ring slot: 64 raw bytes, aligned like a ring slot.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct RawMessage(pub [u8; MESSAGE_SIZE]);

const _: () = assert!(std::mem::size_of::<RawMessage>() == MESSAGE_SIZE);

// SAFETY: RawMessage is a plain byte array (repr(C), no padding: size 64 == the array, alignment 8
// divides 64), so every bit pattern is a valid value and it may be read from / written to guest
// memory as bytes.
unsafe impl ByteValued for RawMessage {}

impl Default for RawMessage {
    fn default() -> Self {
        RawMessage([0; MESSAGE_SIZE])
    }
}

impl std::fmt::Debug for RawMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RawMessage(kind={}, flags={:#x}, ", self.0[0], self.0[1])?;
        write!(f, "cookie={:#x})", self.cookie())
    }
}

impl RawMessage {
    fn u16_at(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.0[off], self.0[off + 1]])
    }
    fn u32_at(&self, off: usize) -> u32 {
        let mut b = [0; 4];
        b.copy_from_slice(&self.0[off..off + 4]);
        u32::from_le_bytes(b)
    }
    fn u64_at(&self, off: usize) -> u64 {
        let mut b = [0; 8];
        b.copy_from_slice(&self.0[off..off + 8]);
        u64::from_le_bytes(b)
    }
    /// True if the reserved tail of a DMA-data, post-buffer or completion message (bytes
    /// [`OFF_DMA_RESERVED`]..64) is all zero: read as one 32-bit and three 64-bit words rather
    /// than byte by byte (two such checks per DMA-data message on the engine's data path).
    fn reserved_tail_is_zero(&self) -> bool {
        const _: () = assert!(OFF_DMA_RESERVED + 4 + 3 * 8 == MESSAGE_SIZE);
        self.u32_at(OFF_DMA_RESERVED) == 0
            && self.u64_at(OFF_DMA_RESERVED + 4)
                | self.u64_at(OFF_DMA_RESERVED + 12)
                | self.u64_at(OFF_DMA_RESERVED + 20)
                == 0
    }
    fn put_u16(&mut self, off: usize, v: u16) {
        self.0[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, off: usize, v: u32) {
        self.0[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, off: usize, v: u64) {
        self.0[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// The cookie field, whatever the kind (used to report errors on undecodable messages).
    pub fn cookie(&self) -> u64 {
        self.u64_at(OFF_COOKIE)
    }

    /// The flags byte, undecoded.
    pub fn flags(&self) -> u8 {
        self.0[OFF_FLAGS]
    }

    /// The destination and flags of a valid user-data message, checked exactly as
    /// [`RawMessage::decode`] checks user-data, without copying the payload out: the engine's
    /// forwarding fast path. `None` for every other kind and for invalid user-data (which
    /// `decode` then explains).
    #[inline]
    pub fn user_data_peer(&self) -> Option<(ChannelAddr, u8)> {
        let valid = self.0[OFF_KIND] == KIND_USER
            && self.0[OFF_FLAGS] & !(FLAG_COMPLETE | FLAG_WANT_COMPLETION) == 0
            && usize::from(self.u16_at(OFF_LEN)) <= INLINE_CAPACITY
            && self.u16_at(OFF_STATUS) == 0;
        valid.then(|| (self.peer(), self.0[OFF_FLAGS]))
    }

    /// The message as DMA-data if [`RawMessage::decode`] would decode it as such, checked the
    /// same way without building a [`Message`]: the engine's path for each TX DMA-data message.
    #[inline]
    pub fn dma_data(&self) -> Option<DmaData> {
        let valid = self.0[OFF_KIND] == KIND_DMA
            && self.0[OFF_FLAGS] & !FLAG_COMPLETE == 0
            && self.u16_at(OFF_LEN) == 0
            && self.u16_at(OFF_STATUS) == 0
            && self.reserved_tail_is_zero();
        valid.then(|| DmaData {
            peer: self.peer(),
            flags: self.0[OFF_FLAGS],
            cookie: self.cookie(),
            data: self.data_ref(),
        })
    }

    /// The message as a posted buffer if [`RawMessage::decode`] would decode it as such, checked
    /// the same way without building a [`Message`]: the engine's path for each buffer it fills.
    #[inline]
    pub fn post_buffer(&self) -> Option<PostBuffer> {
        let valid = self.0[OFF_KIND] == KIND_POST
            && self.0[OFF_FLAGS] == 0
            && self.u16_at(OFF_LEN) == 0
            && self.u16_at(OFF_STATUS) == 0
            && self.reserved_tail_is_zero()
            && self.peer() == ChannelAddr::default();
        valid.then(|| PostBuffer {
            cookie: self.cookie(),
            buf: self.data_ref(),
        })
    }

    fn data_ref(&self) -> DataRef {
        DataRef {
            offset: self.u64_at(OFF_ADDR),
            len: self.u32_at(OFF_DLEN),
        }
    }

    /// This message with its peer and flags replaced, everything else (kind, length, cookie,
    /// payload) kept: how a TX user-data message becomes the RX one (sender as peer, COMPLETE).
    #[inline]
    pub fn with_peer_and_flags(&self, peer: ChannelAddr, flags: u8) -> RawMessage {
        let mut out = *self;
        out.0[OFF_FLAGS] = flags;
        out.put_u32(OFF_ENDPOINT, peer.endpoint);
        out.0[OFF_MAC..OFF_MAC + 6].copy_from_slice(&peer.mac.0);
        out
    }

    fn peer(&self) -> ChannelAddr {
        let mut mac = [0; 6];
        mac.copy_from_slice(&self.0[OFF_MAC..OFF_MAC + 6]);
        ChannelAddr::new(MacAddr(mac), self.u32_at(OFF_ENDPOINT))
    }

    /// Validates and decodes. Never panics, whatever the bytes.
    pub fn decode(&self) -> Result<Message, DecodeError> {
        let kind = self.0[OFF_KIND];
        let flags = self.0[OFF_FLAGS];
        let len = self.u16_at(OFF_LEN);
        let peer = self.peer();
        let status = self.u16_at(OFF_STATUS);
        let cookie = self.cookie();
        let check_flags = |name: &'static str, allowed: u8| {
            if flags & !allowed != 0 {
                Err(DecodeError::BadFlags { kind: name, flags })
            } else {
                Ok(())
            }
        };
        let check_zero = |name: &'static str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(DecodeError::ReservedNotZero { what: name })
            }
        };
        match kind {
            KIND_USER => {
                check_flags("user-data", FLAG_COMPLETE | FLAG_WANT_COMPLETION)?;
                check_zero("user-data", status == 0)?;
                if usize::from(len) > INLINE_CAPACITY {
                    return Err(DecodeError::BadLength {
                        what: "user-data payload",
                        len: len.into(),
                        max: INLINE_CAPACITY as u64,
                    });
                }
                let mut payload = [0u8; INLINE_CAPACITY];
                payload.copy_from_slice(&self.0[OFF_BODY..]);
                Ok(Message::UserData(UserData {
                    peer,
                    flags,
                    cookie,
                    len: len as u8,
                    payload,
                }))
            }
            KIND_DMA | KIND_POST => {
                let name = if kind == KIND_DMA {
                    "DMA-data"
                } else {
                    "post-buffer"
                };
                let allowed = if kind == KIND_DMA { FLAG_COMPLETE } else { 0 };
                check_flags(name, allowed)?;
                check_zero(name, len == 0 && status == 0)?;
                check_zero(name, self.reserved_tail_is_zero())?;
                let buf = self.data_ref();
                if kind == KIND_DMA {
                    Ok(Message::DmaData(DmaData {
                        peer,
                        flags,
                        cookie,
                        data: buf,
                    }))
                } else {
                    check_zero(name, peer == ChannelAddr::default())?;
                    Ok(Message::PostBuffer(PostBuffer { cookie, buf }))
                }
            }
            KIND_COMPLETION => {
                check_flags("completion", 0)?;
                check_zero("completion", len == 0 && self.u64_at(OFF_ADDR) == 0)?;
                check_zero("completion", self.reserved_tail_is_zero())?;
                Ok(Message::Completion(Completion {
                    peer,
                    cookie,
                    status: CompletionStatus::from_code(status)?,
                    len: self.u32_at(OFF_DLEN),
                }))
            }
            other => Err(DecodeError::UnknownCode {
                what: "message kind",
                code: other.into(),
            }),
        }
    }
}

/// A reference to bytes in a channel's data area: offset from the region start, and length.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct DataRef {
    /// Offset from the start of the channel region.
    pub offset: u64,
    /// Length in bytes.
    pub len: u32,
}

/// User-data: up to 40 bytes inline.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UserData {
    /// Destination (TX) or source (RX).
    pub peer: ChannelAddr,
    /// Flags ([`FLAG_COMPLETE`] on RX, [`FLAG_WANT_COMPLETION`] on TX).
    pub flags: u8,
    /// Opaque cookie.
    pub cookie: u64,
    /// Payload length (<= 40).
    pub len: u8,
    /// Payload; bytes past `len` are carried but meaningless.
    pub payload: [u8; INLINE_CAPACITY],
}

impl UserData {
    /// A TX user-data message. Fails if `data` is longer than 40 bytes.
    pub fn new(peer: ChannelAddr, cookie: u64, data: &[u8]) -> Result<Self, DecodeError> {
        if data.len() > INLINE_CAPACITY {
            return Err(DecodeError::BadLength {
                what: "user-data payload",
                len: data.len() as u64,
                max: INLINE_CAPACITY as u64,
            });
        }
        let mut payload = [0u8; INLINE_CAPACITY];
        payload[..data.len()].copy_from_slice(data);
        Ok(UserData {
            peer,
            flags: 0,
            cookie,
            len: data.len() as u8,
            payload,
        })
    }

    /// The meaningful payload bytes.
    pub fn data(&self) -> &[u8] {
        &self.payload[..usize::from(self.len).min(INLINE_CAPACITY)]
    }
}

/// DMA-data: the data lives in the channel's data area.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DmaData {
    /// Destination (TX) or source (RX).
    pub peer: ChannelAddr,
    /// Flags ([`FLAG_COMPLETE`] on RX).
    pub flags: u8,
    /// Sender's cookie on TX; the posted buffer's cookie on RX.
    pub cookie: u64,
    /// Where the data is (TX: in the sender's region; RX: in the receiver's posted buffer).
    pub data: DataRef,
}

impl DmaData {
    /// True when the data is in place and may be read.
    pub fn is_complete(&self) -> bool {
        self.flags & FLAG_COMPLETE != 0
    }
}

/// A receive buffer the guest offers for incoming DMA-data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PostBuffer {
    /// Echoed in the RX DMA-data message that fills this buffer.
    pub cookie: u64,
    /// The buffer, in the channel's data area.
    pub buf: DataRef,
}

/// A completion: the fate of a message this channel sent (or of a refused posted buffer).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Completion {
    /// The destination the message was sent to.
    pub peer: ChannelAddr,
    /// The sender's cookie.
    pub cookie: u64,
    /// What happened.
    pub status: CompletionStatus,
    /// Bytes delivered (DMA-data) or 0.
    pub len: u32,
}

/// A decoded, validated message.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Message {
    /// Inline payload.
    UserData(UserData),
    /// Address + length of data in the channel's data area.
    DmaData(DmaData),
    /// A receive buffer offered by the guest.
    PostBuffer(PostBuffer),
    /// The fate of a sent message.
    Completion(Completion),
}

impl Message {
    /// Encodes into the 64-byte ring representation. `decode(encode(m)) == m` for every message
    /// that [`RawMessage::decode`] can produce.
    pub fn encode(&self) -> RawMessage {
        let mut r = RawMessage::default();
        let put_peer = |r: &mut RawMessage, p: &ChannelAddr| {
            r.put_u32(OFF_ENDPOINT, p.endpoint);
            r.0[OFF_MAC..OFF_MAC + 6].copy_from_slice(&p.mac.0);
        };
        match self {
            Message::UserData(u) => {
                r.0[OFF_KIND] = KIND_USER;
                r.0[OFF_FLAGS] = u.flags;
                r.put_u16(OFF_LEN, u.len.into());
                put_peer(&mut r, &u.peer);
                r.put_u64(OFF_COOKIE, u.cookie);
                r.0[OFF_BODY..].copy_from_slice(&u.payload);
            }
            Message::DmaData(d) => {
                r.0[OFF_KIND] = KIND_DMA;
                r.0[OFF_FLAGS] = d.flags;
                put_peer(&mut r, &d.peer);
                r.put_u64(OFF_COOKIE, d.cookie);
                r.put_u64(OFF_ADDR, d.data.offset);
                r.put_u32(OFF_DLEN, d.data.len);
            }
            Message::PostBuffer(p) => {
                r.0[OFF_KIND] = KIND_POST;
                r.put_u64(OFF_COOKIE, p.cookie);
                r.put_u64(OFF_ADDR, p.buf.offset);
                r.put_u32(OFF_DLEN, p.buf.len);
            }
            Message::Completion(c) => {
                r.0[OFF_KIND] = KIND_COMPLETION;
                put_peer(&mut r, &c.peer);
                r.put_u16(OFF_STATUS, c.status.code());
                r.put_u64(OFF_COOKIE, c.cookie);
                r.put_u32(OFF_DLEN, c.len);
            }
        }
        r
    }

    /// The cookie of any kind of message.
    pub fn cookie(&self) -> u64 {
        match self {
            Message::UserData(u) => u.cookie,
            Message::DmaData(d) => d.cookie,
            Message::PostBuffer(p) => p.cookie,
            Message::Completion(c) => c.cookie,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn addr() -> impl Strategy<Value = ChannelAddr> {
        (any::<[u8; 6]>(), any::<u32>()).prop_map(|(m, e)| ChannelAddr::new(MacAddr(m), e))
    }

    fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            (addr(), 0u8..4, any::<u64>(), 0u8..=40, any::<[u8; 40]>()).prop_map(
                |(peer, flags, cookie, len, payload)| Message::UserData(UserData {
                    peer,
                    flags,
                    cookie,
                    len,
                    payload
                })
            ),
            (addr(), 0u8..2, any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
                |(peer, flags, cookie, offset, len)| Message::DmaData(DmaData {
                    peer,
                    flags,
                    cookie,
                    data: DataRef { offset, len }
                })
            ),
            (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(cookie, offset, len)| {
                Message::PostBuffer(PostBuffer {
                    cookie,
                    buf: DataRef { offset, len },
                })
            }),
            (
                addr(),
                any::<u64>(),
                0usize..CompletionStatus::ALL.len(),
                any::<u32>()
            )
                .prop_map(|(peer, cookie, s, len)| Message::Completion(Completion {
                    peer,
                    cookie,
                    status: CompletionStatus::ALL[s],
                    len
                })),
        ]
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(m in message()) {
            prop_assert_eq!(m.encode().decode(), Ok(m));
        }

        #[test]
        fn user_data_fast_path_agrees_with_decode(
            mut bytes in any::<[u8; 64]>(),
            user in any::<bool>(),
            small in any::<bool>(),
            peer in addr(),
            flags in any::<u8>(),
        ) {
            // Bias towards user-data with a plausible length, or most inputs are other kinds.
            if user {
                bytes[0] = KIND_USER;
                bytes[1] &= 0x83;
                if small {
                    bytes[2] %= 41;
                    bytes[3] = 0;
                    bytes[14] = 0;
                    bytes[15] = 0;
                }
            }
            let raw = RawMessage(bytes);
            match raw.decode() {
                Ok(Message::UserData(u)) => {
                    prop_assert_eq!(raw.user_data_peer(), Some((u.peer, u.flags)));
                    let rebuilt = Message::UserData(UserData { peer, flags, ..u }).encode();
                    prop_assert_eq!(raw.with_peer_and_flags(peer, flags), rebuilt);
                }
                _ => prop_assert_eq!(raw.user_data_peer(), None),
            }
        }

        #[test]
        fn dma_and_post_fast_paths_agree_with_decode(
            m in message(),
            at in 0usize..64,
            value in any::<u8>(),
            mutate in any::<bool>(),
        ) {
            // Valid messages of every kind, and the same with one byte changed: near misses of
            // every check (kind, flags, length, status, reserved bytes, peer of a post).
            let mut raw = m.encode();
            if mutate {
                raw.0[at] = value;
            }
            let decoded = raw.decode();
            let as_dma = match decoded {
                Ok(Message::DmaData(d)) => Some(d),
                _ => None,
            };
            let as_post = match decoded {
                Ok(Message::PostBuffer(p)) => Some(p),
                _ => None,
            };
            prop_assert_eq!(raw.dma_data(), as_dma);
            prop_assert_eq!(raw.post_buffer(), as_post);
        }

        #[test]
        fn decode_never_panics_and_reencodes_exactly(bytes in any::<[u8; 64]>()) {
            let raw = RawMessage(bytes);
            if let Ok(m) = raw.decode() {
                // Whatever decodes is canonical: encoding gives back the very same bytes.
                prop_assert_eq!(m.encode(), raw);
            }
        }
    }

    #[test]
    fn rejects_each_kind_of_malformation() {
        let peer = ChannelAddr::new(MacAddr([2, 0, 0, 0, 0, 1]), 7);
        let good = Message::UserData(UserData::new(peer, 9, b"hi").unwrap()).encode();
        assert!(good.decode().is_ok());

        let mut m = good;
        m.0[0] = 0;
        assert!(matches!(m.decode(), Err(DecodeError::UnknownCode { .. })));
        let mut m = good;
        m.0[1] = 0x80;
        assert!(matches!(m.decode(), Err(DecodeError::BadFlags { .. })));
        let mut m = good;
        m.0[2] = 41;
        assert!(matches!(m.decode(), Err(DecodeError::BadLength { .. })));

        let dma = Message::DmaData(DmaData {
            peer,
            flags: 0,
            cookie: 1,
            data: DataRef {
                offset: 4096,
                len: 10,
            },
        })
        .encode();
        let mut m = dma;
        m.0[40] = 1;
        assert!(matches!(
            m.decode(),
            Err(DecodeError::ReservedNotZero { .. })
        ));
        let mut m = dma;
        m.0[1] = FLAG_WANT_COMPLETION;
        assert!(matches!(m.decode(), Err(DecodeError::BadFlags { .. })));

        let mut c = Message::Completion(Completion {
            peer,
            cookie: 1,
            status: CompletionStatus::Ok,
            len: 0,
        })
        .encode();
        c.0[14] = 200;
        assert!(matches!(c.decode(), Err(DecodeError::UnknownCode { .. })));
    }

    #[test]
    fn a_nonzero_byte_anywhere_in_the_reserved_tail_is_refused() {
        let data = DataRef {
            offset: 4096,
            len: 10,
        };
        let peer = ChannelAddr::new(MacAddr([2, 0, 0, 0, 0, 1]), 7);
        for m in [
            Message::DmaData(DmaData {
                peer,
                flags: 0,
                cookie: 1,
                data,
            }),
            Message::PostBuffer(PostBuffer {
                cookie: 1,
                buf: data,
            }),
            Message::Completion(Completion {
                peer,
                cookie: 1,
                status: CompletionStatus::Ok,
                len: 10,
            }),
        ] {
            let good = m.encode();
            assert_eq!(good.decode(), Ok(m));
            for at in OFF_DMA_RESERVED..MESSAGE_SIZE {
                for bit in 0..8 {
                    let mut bad = good;
                    bad.0[at] = 1 << bit;
                    assert!(
                        matches!(bad.decode(), Err(DecodeError::ReservedNotZero { .. })),
                        "{m:?}: byte {at} = {:#x} accepted",
                        bad.0[at]
                    );
                }
            }
        }
    }

    #[test]
    fn user_data_too_long_is_refused() {
        let peer = ChannelAddr::default();
        assert!(UserData::new(peer, 0, &[0; 41]).is_err());
        assert_eq!(UserData::new(peer, 0, &[5; 40]).unwrap().data(), &[5; 40]);
    }
}
