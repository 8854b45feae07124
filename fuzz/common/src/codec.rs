//! The decoders of untrusted bytes in `svnic-channels`: ring messages, frames and the reassembly
//! of fragmented messages. Each `check_*` function panics when an invariant does not hold.

use arbitrary::{Arbitrary, Unstructured};
use svnic_channels::frame::{claims_svnic, control_request_id, PushOutcome};
use svnic_channels::message::MESSAGE_SIZE;
use svnic_channels::{Frame, FrameBody, RawMessage, Reassembler, ReassemblyLimits};

/// The input of `message_decode`: a ring slot.
pub type Slot = [u8; MESSAGE_SIZE];

/// `message_decode`: decoding any slot never panics, and whatever decodes is canonical (encoding
/// it gives back the very same 64 bytes).
pub fn check_message(slot: Slot) {
    let raw = RawMessage(slot);
    let _ = raw.cookie();
    let _ = raw.flags();
    if let Ok(msg) = raw.decode() {
        assert_eq!(
            msg.encode(),
            raw,
            "decoded {msg:?} does not re-encode to the same bytes"
        );
    }
}

/// `frame_decode`: decoding any received bytes never panics; whatever decodes is claimed by
/// `claims_svnic`, re-encodes to the same content bytes (headers, body, payload: only Ethernet
/// padding may differ, and it is zero) and decodes equal; a control request's id is what
/// `control_request_id` reads.
pub fn check_frame(data: &[u8]) {
    let claims = claims_svnic(data);
    let request_id = control_request_id(data);
    let Ok(frame) = Frame::decode(data) else {
        return;
    };
    assert!(claims, "{frame:?} decoded but claims_svnic is false");
    let bytes = match frame.encode() {
        Ok(b) => b,
        Err(e) => panic!("{frame:?} decoded but does not encode: {e}"),
    };
    let content = frame.content_len();
    assert_eq!(bytes.len(), frame.encoded_len());
    assert_eq!(
        bytes.get(..content),
        data.get(..content),
        "content not canonical"
    );
    assert!(
        bytes
            .get(content..)
            .unwrap_or_default()
            .iter()
            .all(|b| *b == 0),
        "padding not zero"
    );
    assert_eq!(Frame::decode(&bytes), Ok(frame));
    if let FrameBody::ControlRequest(r) = frame.body {
        assert_eq!(request_id, Some(r.request_id));
    }
}

/// The input of `reassembly`: frames received in a row, as records `[len: u16 LE][len bytes]`
/// (a length past the end takes what is left; a last lone byte is ignored).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameStream<'a>(pub Vec<&'a [u8]>);

impl<'a> Arbitrary<'a> for FrameStream<'a> {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        // Inside a larger input: the records take the rest.
        let rest = u.bytes(u.len())?;
        Self::arbitrary_take_rest(Unstructured::new(rest))
    }

    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> arbitrary::Result<Self> {
        let mut records = Vec::new();
        while u.len() >= 2 {
            let len = usize::from(u16::arbitrary(&mut u)?).min(u.len());
            records.push(u.bytes(len)?);
        }
        Ok(FrameStream(records))
    }
}

/// The limits of the reassembler `reassembly` feeds: small, to reach them.
pub const REASSEMBLY_LIMITS: ReassemblyLimits = ReassemblyLimits {
    max_messages: 4,
    max_bytes: 64 << 10,
    remember_completed: 8,
};

/// `reassembly`: the data frames of `stream` (the others are skipped) pushed into a
/// [`Reassembler`] with [`REASSEMBLY_LIMITS`]: it never panics nor refuses a fragment that
/// decoded; after every push its partial messages, buffered bytes and remembered completions stay
/// within the limits; a completed message has the length, source and key its fragments announced
/// and counts once.
pub fn check_reassembly(stream: &FrameStream<'_>) {
    let limits = REASSEMBLY_LIMITS;
    let mut r = Reassembler::new(limits);
    for record in &stream.0 {
        let Ok(Frame {
            src,
            body: FrameBody::Data(frag),
            ..
        }) = Frame::decode(record)
        else {
            continue;
        };
        let before = r.stats();
        match r.push(src, &frag) {
            PushOutcome::Complete(m) => {
                assert_eq!(m.payload.len() as u64, u64::from(frag.total_len));
                assert_eq!((m.src, m.header), (src, frag.header));
                assert_eq!(r.stats().completed, before.completed + 1);
            }
            PushOutcome::Invalid(e) => panic!("decoded fragment {frag:?} refused: {e}"),
            PushOutcome::Incomplete | PushOutcome::Duplicate | PushOutcome::TooLarge => {}
        }
        assert!(r.in_progress() <= limits.max_messages);
        assert!(r.buffered_bytes() <= limits.max_bytes);
        assert!(r.remembered() <= limits.remember_completed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus;
    use crate::encode::decode;

    #[test]
    fn frame_streams_split_as_records() {
        let s: FrameStream = decode(&[2, 0, 0xa, 0xb, 9, 0, 0xc, 0x7]).expect("decodes");
        assert_eq!(s.0, vec![&[0xa, 0xb][..], &[0xc, 0x7][..]]);
        let lone: FrameStream = decode(&[1, 0, 5, 3]).expect("decodes");
        assert_eq!(lone.0, vec![&[5][..]], "a last lone byte is no record");
    }

    #[test]
    fn message_seeds_are_slots_that_decode_and_hold() {
        for (name, bytes) in corpus::committed("message_decode") {
            let slot: Slot = decode(&bytes).expect("decodes");
            assert_eq!(&slot[..], &bytes[..MESSAGE_SIZE], "{name}");
            assert!(RawMessage(slot).decode().is_ok(), "{name} is no message");
            check_message(slot);
        }
    }

    #[test]
    fn frame_seeds_decode_and_hold() {
        for (name, bytes) in corpus::committed("frame_decode") {
            assert!(Frame::decode(&bytes).is_ok(), "{name} is no frame");
            check_frame(&bytes);
        }
    }

    #[test]
    fn reassembly_seeds_are_fragment_streams_that_hold() {
        for (name, bytes) in corpus::committed("reassembly") {
            let s: FrameStream = decode(&bytes).expect("decodes");
            assert!(
                s.0.iter().any(|r| matches!(
                    Frame::decode(r),
                    Ok(Frame {
                        body: FrameBody::Data(_),
                        ..
                    })
                )),
                "{name} holds no data frame"
            );
            check_reassembly(&s);
        }
    }
}
