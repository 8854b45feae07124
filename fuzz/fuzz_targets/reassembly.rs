//! A stream of frames from the uplink fed to a small Reassembler: never panics, never exceeds its
//! bounds, and every message it returns has the length its fragments announced.
//!
//! Input: records of `[len: u16 little-endian][len bytes of frame]`; a record that does not decode
//! as a data frame is skipped. The seeds (corpus/reassembly/seed-*) are real fragment streams.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svnic_channels::frame::PushOutcome;
use svnic_channels::{Frame, FrameBody, Reassembler, ReassemblyLimits};

const LIMITS: ReassemblyLimits = ReassemblyLimits {
    max_messages: 4,
    max_bytes: 64 << 10,
    remember_completed: 8,
};

fuzz_target!(|data: &[u8]| {
    let mut r = Reassembler::new(LIMITS);
    let mut rest = data;
    while let [lo, hi, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
        let (record, next) = tail.split_at(len);
        rest = next;
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
                assert_eq!(
                    (m.src, m.src_endpoint, m.message_id, m.cookie),
                    (src, frag.src_endpoint, frag.message_id, frag.cookie)
                );
                assert_eq!(r.stats().completed, before.completed + 1);
            }
            PushOutcome::Invalid(e) => panic!("decoded fragment {frag:?} refused: {e}"),
            PushOutcome::Incomplete | PushOutcome::Duplicate | PushOutcome::TooLarge => {}
        }
        assert!(r.in_progress() <= LIMITS.max_messages);
        assert!(r.buffered_bytes() <= LIMITS.max_bytes);
        assert!(r.remembered() <= LIMITS.remember_completed);
    }
});
