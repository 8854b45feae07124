//! The RDM endpoint's message header and its matching rules.
//!
//! An RDM endpoint is the DGRAM data path (svnic channels deliver reliably, in order per
//! sender, or fail the send with the reason) plus a header in front of every payload, inside
//! the 40 inline bytes of a user-data message or at the front of the DMA-data bytes:
//! one flags byte, then the tag (8 bytes, little-endian) if its bit 0 is set, then the remote CQ
//! data (8 bytes) if its bit 1 is set.
//!
//! A message longer than `max_msg_size` (the bounce buffers' size) travels in parts of
//! `max_msg_size` bytes, sent back to back: the first part's header also carries the message's
//! total length (bit 2, 8 bytes), every other part's header only its offset in the message (bit 3,
//! 8 bytes, no other field). The receiver assembles them per sender (whose messages arrive in
//! order) and checks the offsets. A receive matches a message when both are tagged or both are not,
//! the tags agree outside the receive's ignore bits, and the receive's source (if directed) is
//! the sender.

use svnic_channels::ChannelAddr;

/// Flag bit: the message is tagged (`fi_tsend*`), a tag follows.
const TAGGED: u8 = 1;
/// Flag bit: remote CQ data follows.
const HAS_DATA: u8 = 2;
/// Flag bit: the first part of a message in parts; its total length follows.
const FIRST: u8 = 4;
/// Flag bit: a later part of a message in parts; its offset follows (and nothing else).
const CONT: u8 = 8;
/// The longest header of a message in one part: flags, tag, data.
pub const HEADER_MAX: usize = 17;
/// The longest header of a part: flags, tag, data, total length.
pub const PART_HEADER_MAX: usize = 25;
/// Parts a message may have at most: `max_msg_size` of the RDM endpoint is this many times the
/// bounce buffers' size (an endpoint needs a staging slot per part: it has 14 with the defaults).
pub const MAX_PARTS: usize = 8;
/// Bytes every bounce buffer and staging slot of an RDM endpoint has beyond `max_msg_size`
/// (the header, rounded up to keep the slots 64-byte aligned).
pub const SLOT_EXTRA: usize = 64;

/// What a message carries beside its payload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    /// The tag of a tagged message.
    pub tag: Option<u64>,
    /// Remote CQ data.
    pub data: Option<u64>,
    /// The total length of a message in parts (its first part).
    pub total: Option<u64>,
    /// The offset of a later part of a message in parts (the header has nothing else).
    pub offset: Option<u64>,
}

impl Header {
    /// The header's bytes, and how many of them are used.
    pub fn encode(&self) -> ([u8; PART_HEADER_MAX], usize) {
        let mut b = [0u8; PART_HEADER_MAX];
        let mut n = 1;
        let fields = match self.offset {
            Some(_) => [(CONT, self.offset), (0, None), (0, None)],
            None => [
                (TAGGED, self.tag),
                (HAS_DATA, self.data),
                (FIRST, self.total),
            ],
        };
        for (bit, v) in fields {
            if let Some(v) = v {
                b[0] |= bit;
                b[n..n + 8].copy_from_slice(&v.to_le_bytes());
                n += 8;
            }
        }
        (b, n)
    }

    /// The header at the front of `b`, and its length; `None` if `b` does not start with one.
    pub fn decode(b: &[u8]) -> Option<(Header, usize)> {
        let flags = *b.first()?;
        if flags & !(TAGGED | HAS_DATA | FIRST | CONT) != 0 || (flags & CONT != 0 && flags != CONT)
        {
            return None;
        }
        let mut n = 1;
        let mut field = |bit: u8| -> Option<Option<u64>> {
            if flags & bit == 0 {
                return Some(None);
            }
            let v = u64::from_le_bytes(b.get(n..n + 8)?.try_into().ok()?);
            n += 8;
            Some(Some(v))
        };
        let tag = field(TAGGED)?;
        let data = field(HAS_DATA)?;
        let total = field(FIRST)?;
        let offset = field(CONT)?;
        let h = Header {
            tag,
            data,
            total,
            offset,
        };
        Some((h, n))
    }
}

/// Which messages a posted receive takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Want {
    /// `Some((tag, ignore))` for a tagged receive.
    pub tag: Option<(u64, u64)>,
    /// The only sender accepted (`FI_DIRECTED_RECV`), or any.
    pub src: Option<ChannelAddr>,
}

impl Want {
    /// Whether a message with header `h` from `src` matches.
    pub fn matches(&self, h: &Header, src: ChannelAddr) -> bool {
        let tag_ok = match (self.tag, h.tag) {
            (None, None) => true,
            (Some((want, ignore)), Some(tag)) => (want ^ tag) & !ignore == 0,
            _ => false,
        };
        tag_ok && self.src.is_none_or(|s| s == src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(ep: u32) -> ChannelAddr {
        ChannelAddr {
            mac: svnic_channels::MacAddr([2, 0, 0, 0, 0, 1]),
            endpoint: ep,
        }
    }

    #[test]
    fn every_header_shape_round_trips_and_garbage_is_refused() {
        let h = |tag, data, total, offset| Header {
            tag,
            data,
            total,
            offset,
        };
        for h in [
            Header::default(),
            h(Some(u64::MAX), None, None, None),
            h(None, Some(7), None, None),
            h(Some(0x1234), Some(u64::MAX - 1), None, None),
            h(Some(1), Some(2), Some(1 << 20), None),
            h(None, None, None, Some(65536)),
        ] {
            let (b, n) = h.encode();
            assert_eq!(Header::decode(&b[..n]), Some((h, n)));
            if n > 1 {
                assert_eq!(Header::decode(&b[..n - 1]), None, "{h:?} cut short");
            }
        }
        assert_eq!(Header::decode(&[]), None);
        assert_eq!(Header::decode(&[16]), None, "an unknown flag");
        let mut cont_and_tag = [0u8; 17];
        cont_and_tag[0] = CONT | TAGGED;
        assert_eq!(
            Header::decode(&cont_and_tag),
            None,
            "a later part has only its offset"
        );
    }

    #[test]
    fn matching_takes_kind_tag_ignore_bits_and_source_into_account() {
        let tagged = |t| Header {
            tag: Some(t),
            ..Header::default()
        };
        let any = Want::default();
        assert!(any.matches(&Header::default(), addr(1)));
        assert!(!any.matches(&tagged(5), addr(1)));
        let t5 = Want {
            tag: Some((5, 0)),
            src: None,
        };
        assert!(t5.matches(&tagged(5), addr(1)));
        assert!(!t5.matches(&tagged(4), addr(1)));
        assert!(!t5.matches(&Header::default(), addr(1)));
        let t5_or_4 = Want {
            tag: Some((5, 1)),
            src: None,
        };
        assert!(t5_or_4.matches(&tagged(4), addr(1)));
        let from2 = Want {
            tag: Some((5, 0)),
            src: Some(addr(2)),
        };
        assert!(from2.matches(&tagged(5), addr(2)));
        assert!(!from2.matches(&tagged(5), addr(1)));
    }
}
