//! Splitting a message into data frames that fit an MTU.

use super::{DataFrame, Frame, FrameBody, MessageHeader, DATA_HEADER_LEN, MIN_MTU};
use crate::error::DecodeError;
use crate::types::MacAddr;

/// A whole message to send over an uplink, before fragmentation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DataMessage<'a> {
    /// The header each fragment carries.
    pub header: MessageHeader,
    /// The session every fragment carries.
    pub session: u32,
    /// Sequence number of the first fragment; the next ones follow consecutively (wrapping).
    pub first_seq: u32,
    /// The whole message.
    pub payload: &'a [u8],
}

impl<'a> DataMessage<'a> {
    /// Payload bytes per fragment for `mtu` (Ethernet payload size), or why `mtu` is unusable.
    pub fn fragment_capacity(mtu: usize) -> Result<usize, DecodeError> {
        if mtu < MIN_MTU {
            return Err(DecodeError::Truncated {
                what: "MTU",
                len: mtu,
                need: MIN_MTU,
            });
        }
        let headers = super::SVNIC_HEADER_LEN + DATA_HEADER_LEN;
        Ok((mtu - headers).min(usize::from(u16::MAX)))
    }

    /// The data frames carrying this message, in order, each fitting `mtu` (the Ethernet payload
    /// size: svnic header + data header + payload). An empty message is one empty fragment.
    /// Fails if the MTU is below [`MIN_MTU`] or the message is too long or has flags its kind
    /// does not allow.
    pub fn fragments(&self, mtu: usize) -> Result<Fragments<'a>, DecodeError> {
        let chunk = Self::fragment_capacity(mtu)?;
        let h = &self.header;
        h.kind.check(h.msg_flags, self.payload.len() as u64)?;
        Ok(Fragments {
            msg: *self,
            chunk,
            offset: 0,
            seq: self.first_seq,
            done: false,
        })
    }
}

/// Iterator over the fragments of a [`DataMessage`]; see [`DataMessage::fragments`].
#[derive(Clone, Debug)]
pub struct Fragments<'a> {
    msg: DataMessage<'a>,
    chunk: usize,
    offset: usize,
    seq: u32,
    done: bool,
}

impl<'a> Iterator for Fragments<'a> {
    type Item = DataFrame<'a>;

    fn next(&mut self) -> Option<DataFrame<'a>> {
        if self.done {
            return None;
        }
        let rest = self.msg.payload.get(self.offset..)?;
        let payload = rest.get(..self.chunk.min(rest.len()))?;
        // fragments() checked the length against the kind's maximum, which fits in a u32.
        let frame = DataFrame {
            header: self.msg.header,
            session: self.msg.session,
            seq: self.seq,
            total_len: u32::try_from(self.msg.payload.len()).ok()?,
            frag_offset: u32::try_from(self.offset).ok()?,
            payload,
        };
        self.offset += payload.len();
        self.seq = self.seq.wrapping_add(1);
        self.done = self.offset >= self.msg.payload.len();
        Some(frame)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = if self.done {
            0
        } else {
            let rest = self.msg.payload.len().saturating_sub(self.offset);
            rest.div_ceil(self.chunk.max(1)).max(1)
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Fragments<'_> {}

/// Splits `msg` into encoded data frames from `src` to `dst`, each at most `mtu` bytes of
/// Ethernet payload (`mtu` + 14 bytes with the Ethernet header). See [`DataMessage::fragments`]
/// for the errors, and for an allocation-free iterator over the fragments.
pub fn fragment(
    dst: MacAddr,
    src: MacAddr,
    msg: &DataMessage<'_>,
    mtu: usize,
) -> Result<Vec<Vec<u8>>, DecodeError> {
    msg.fragments(mtu)?
        .map(|d| {
            Frame {
                dst,
                src,
                body: FrameBody::Data(d),
            }
            .encode()
        })
        .collect()
}
