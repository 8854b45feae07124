//! Bundle frames: several whole user-data messages of one session in one frame, so that small
//! messages do not cost a frame each on the wire (docs/abi.md §7.8, docs/wire.md §1).

use crate::error::DecodeError;
use crate::message::INLINE_CAPACITY;
use crate::types::EndpointId;

use super::DataKind;

/// Body length of a bundle frame before its entries.
pub const BUNDLE_HEADER_LEN: usize = 24;
/// Length of an entry's header (cookie, flags, length) before its payload.
pub const BUNDLE_ENTRY_HEADER_LEN: usize = 10;
/// Fewest messages in a bundle: one message travels in a data frame.
pub const MIN_BUNDLE_COUNT: u16 = 2;
/// Most messages in a bundle: bounds the work one frame asks of a receiver.
pub const MAX_BUNDLE_COUNT: u16 = 255;

/// Bytes an entry with `payload_len` payload bytes takes in a bundle.
pub const fn bundle_entry_len(payload_len: usize) -> usize {
    BUNDLE_ENTRY_HEADER_LEN + payload_len
}

/// Several whole user-data messages, with consecutive message ids from `first_message_id`, that
/// take one sequence number of their session together.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BundleFrame<'a> {
    /// Sending channel's endpoint (its MAC is the frame's source MAC).
    pub src_endpoint: EndpointId,
    /// Destination endpoint (its MAC is the frame's destination MAC); at frame offset 22, like
    /// a data frame's.
    pub dst_endpoint: EndpointId,
    /// The sender's session id for (source channel, destination channel).
    pub session: u32,
    /// Sequence number of this frame in the session.
    pub seq: u32,
    /// Id of the first message; entry `i` is message `first_message_id + i` (wrapping).
    pub first_message_id: u32,
    /// Number of entries.
    pub count: u16,
    /// The entries, encoded (see [`BundleEntry::encode_into`]).
    pub entries: &'a [u8],
}

/// One message of a bundle.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BundleEntry<'a> {
    /// The sender's cookie.
    pub cookie: u64,
    /// The sender's message flags (those of a user-data message).
    pub msg_flags: u8,
    /// The message (at most [`INLINE_CAPACITY`] bytes).
    pub payload: &'a [u8],
}

impl BundleEntry<'_> {
    /// Appends the entry's encoding: cookie (u64 LE), flags (u8), length (u8), payload.
    /// Refuses a payload longer than [`INLINE_CAPACITY`] or flags a user-data message may not
    /// carry; on error nothing is appended.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), DecodeError> {
        check_entry(self.msg_flags, self.payload.len())?;
        out.extend_from_slice(&self.cookie.to_le_bytes());
        out.push(self.msg_flags);
        // check_entry bounded the length by INLINE_CAPACITY (< 256).
        out.push(self.payload.len() as u8);
        out.extend_from_slice(self.payload);
        Ok(())
    }
}

fn check_entry(flags: u8, len: usize) -> Result<(), DecodeError> {
    DataKind::UserData.check(flags, len as u64)?;
    debug_assert!(INLINE_CAPACITY <= usize::from(u8::MAX));
    Ok(())
}

/// Walks the entries of `bytes`, which must be exactly `count` valid entries: returns their
/// total length.
pub(super) fn entries_len(bytes: &[u8], count: u16) -> Result<usize, DecodeError> {
    if !(MIN_BUNDLE_COUNT..=MAX_BUNDLE_COUNT).contains(&count) {
        return Err(DecodeError::BadLength {
            what: "bundle frame: count",
            len: count.into(),
            max: MAX_BUNDLE_COUNT.into(),
        });
    }
    let mut it = BundleEntries {
        rest: bytes,
        left: count,
    };
    for _ in 0..count {
        it.next_checked()?;
    }
    Ok(bytes.len() - it.rest.len())
}

impl<'a> BundleFrame<'a> {
    /// Checks what the decoder checks: `count` in
    /// [`MIN_BUNDLE_COUNT`]`..=`[`MAX_BUNDLE_COUNT`], and `entries` exactly `count` valid
    /// entries.
    pub fn validate(&self) -> Result<(), DecodeError> {
        let len = entries_len(self.entries, self.count)?;
        if len != self.entries.len() {
            return Err(DecodeError::BadLength {
                what: "bundle frame: bytes after the last entry",
                len: self.entries.len() as u64,
                max: len as u64,
            });
        }
        Ok(())
    }

    /// The entries, in order, with their message ids.
    pub fn entries(&self) -> impl Iterator<Item = (u32, BundleEntry<'a>)> + 'a {
        let first = self.first_message_id;
        let mut it = BundleEntries {
            rest: self.entries,
            left: self.count,
        };
        (0u32..).map_while(move |i| {
            it.next_checked()
                .ok()
                .flatten()
                .map(|e| (first.wrapping_add(i), e))
        })
    }
}

struct BundleEntries<'a> {
    rest: &'a [u8],
    left: u16,
}

impl<'a> BundleEntries<'a> {
    fn next_checked(&mut self) -> Result<Option<BundleEntry<'a>>, DecodeError> {
        if self.left == 0 {
            return Ok(None);
        }
        let truncated = |rest: &[u8]| DecodeError::Truncated {
            what: "bundle frame entry",
            len: rest.len(),
            need: BUNDLE_ENTRY_HEADER_LEN,
        };
        let head = self
            .rest
            .get(..BUNDLE_ENTRY_HEADER_LEN)
            .ok_or_else(|| truncated(self.rest))?;
        let mut cookie = [0u8; 8];
        cookie.copy_from_slice(&head[..8]);
        let (msg_flags, len) = (head[8], usize::from(head[9]));
        check_entry(msg_flags, len)?;
        let payload = self
            .rest
            .get(BUNDLE_ENTRY_HEADER_LEN..BUNDLE_ENTRY_HEADER_LEN + len)
            .ok_or(DecodeError::Truncated {
                what: "bundle frame entry payload",
                len: self.rest.len(),
                need: BUNDLE_ENTRY_HEADER_LEN + len,
            })?;
        self.rest = &self.rest[BUNDLE_ENTRY_HEADER_LEN + len..];
        self.left -= 1;
        Ok(Some(BundleEntry {
            cookie: u64::from_le_bytes(cookie),
            msg_flags,
            payload,
        }))
    }
}
