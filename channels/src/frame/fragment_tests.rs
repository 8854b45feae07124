//! Tests of fragmentation and reassembly.

use super::*;
use crate::message::FLAG_WANT_COMPLETION;
use proptest::prelude::*;

const ENGINE: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xee]);
const GUEST: MacAddr = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);

fn message(payload: &[u8], kind: DataKind) -> DataMessage<'_> {
    DataMessage {
        header: MessageHeader {
            src_endpoint: 4,
            dst_endpoint: 5,
            kind,
            msg_flags: 0,
            message_id: 1,
            cookie: 77,
        },
        session: 0x5e55,
        first_seq: u32::MAX - 1,
        payload,
    }
}

fn data_of(bytes: &[u8]) -> (MacAddr, DataFrame<'_>) {
    match Frame::decode(bytes) {
        Ok(Frame {
            src,
            body: FrameBody::Data(d),
            ..
        }) => (src, d),
        other => panic!("not a data frame: {other:?}"),
    }
}

/// Fragments DMA-data message `id` of `payload` for `mtu` and pushes its first fragment only,
/// which must leave it incomplete; returns all its fragments.
fn start_message(r: &mut Reassembler, payload: &[u8], id: u32, mtu: usize) -> Vec<Vec<u8>> {
    let mut m = message(payload, DataKind::DmaData);
    m.header.message_id = id;
    let frames = fragment(ENGINE, GUEST, &m, mtu).unwrap();
    let (src, d) = data_of(&frames[0]);
    assert_eq!(r.push(src, &d), PushOutcome::Incomplete, "message {id}");
    frames
}

#[test]
fn fragment_respects_the_mtu_and_the_limits() {
    let payload: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let frames = fragment(ENGINE, GUEST, &message(&payload, DataKind::DmaData), 1500).unwrap();
    assert_eq!(frames.len(), 4);
    assert!(frames.iter().all(|f| f.len() <= 1500 + ETH_HEADER_LEN));
    assert_eq!(frames[0].len(), 1514);
    assert_eq!(DataMessage::fragment_capacity(1500), Ok(1456));
    // Fragments carry the session and consecutive sequence numbers, wrapping past u32::MAX.
    for (i, f) in frames.iter().enumerate() {
        let (_, d) = data_of(f);
        assert_eq!(d.session, 0x5e55);
        assert_eq!(d.seq, (u32::MAX - 1).wrapping_add(i as u32));
        assert_eq!(d.frag_offset as usize, i * 1456);
    }

    assert_eq!(
        DataMessage::fragment_capacity(MIN_MTU - 1),
        Err(DecodeError::Truncated {
            what: "MTU",
            len: MIN_MTU - 1,
            need: MIN_MTU
        })
    );
    assert_eq!(DataMessage::fragment_capacity(MIN_MTU), Ok(24));
    assert_eq!(DataMessage::fragment_capacity(1 << 20), Ok(65535));
    let big = vec![0u8; MAX_DATA_LEN as usize + 1];
    assert!(matches!(
        fragment(ENGINE, GUEST, &message(&big, DataKind::DmaData), 1500),
        Err(DecodeError::BadLength { .. })
    ));
    assert!(matches!(
        fragment(ENGINE, GUEST, &message(&[0; 41], DataKind::UserData), 1500),
        Err(DecodeError::BadLength { .. })
    ));
    let mut m = message(&[1], DataKind::DmaData);
    m.header.msg_flags = FLAG_WANT_COMPLETION;
    assert!(matches!(
        fragment(ENGINE, GUEST, &m, 1500),
        Err(DecodeError::BadFlags { .. })
    ));
    // An empty message is one empty fragment, and reassembles at once.
    let frames = fragment(ENGINE, GUEST, &message(&[], DataKind::UserData), 1500).unwrap();
    assert_eq!(frames.len(), 1);
    let (src, d) = data_of(&frames[0]);
    let mut r = Reassembler::new(ReassemblyLimits::default());
    match r.push(src, &d) {
        PushOutcome::Complete(m) => assert!(m.payload.is_empty()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn reassembler_evicts_the_oldest_partial_message() {
    let mut r = Reassembler::new(ReassemblyLimits {
        max_messages: 2,
        max_bytes: 1 << 20,
        remember_completed: 4,
    });
    let payload = vec![9u8; 300];
    let mut firsts = Vec::new();
    for id in 0..3 {
        firsts.push(start_message(&mut r, &payload, id, 200));
    }
    assert_eq!(r.in_progress(), 2);
    assert_eq!(r.stats().evicted, 1);
    // Message 0 was evicted: its second fragment starts it over and it cannot complete.
    let (src, d) = data_of(&firsts[0][1]);
    assert_eq!(r.push(src, &d), PushOutcome::Incomplete);
    assert_eq!(r.stats().evicted, 2);
    // Message 2 completes.
    let (src, d) = data_of(&firsts[2][1]);
    assert!(matches!(r.push(src, &d), PushOutcome::Complete(_)));
    assert_eq!(r.in_progress(), 1);
}

#[test]
fn reassembler_respects_its_byte_budget() {
    let limits = ReassemblyLimits {
        max_messages: 100,
        max_bytes: 10_000,
        remember_completed: 0,
    };
    let mut r = Reassembler::new(limits);
    let payload = vec![1u8; 4000];
    for id in 0..10 {
        start_message(&mut r, &payload, id, 1500);
        assert!(r.buffered_bytes() <= limits.max_bytes);
    }
    assert_eq!(r.in_progress(), 2);
    assert_eq!(r.stats().evicted, 8);
    // A message larger than the whole budget is refused outright.
    let big = vec![0u8; 20_000];
    let frames = fragment(ENGINE, GUEST, &message(&big, DataKind::DmaData), 1500).unwrap();
    let (src, d) = data_of(&frames[0]);
    assert_eq!(r.push(src, &d), PushOutcome::TooLarge);
    assert_eq!(r.stats().too_large, 1);
    r.clear();
    assert_eq!((r.in_progress(), r.buffered_bytes()), (0, 0));
}

#[test]
fn reassembler_handles_conflicts_duplicates_and_invalid_fragments() {
    let mut r = Reassembler::new(ReassemblyLimits::default());
    let payload = vec![5u8; 3000];
    let frames = fragment(ENGINE, GUEST, &message(&payload, DataKind::DmaData), 1500).unwrap();
    let (src, d0) = data_of(&frames[0]);
    assert_eq!(r.push(src, &d0), PushOutcome::Incomplete);
    assert_eq!(r.push(src, &d0), PushOutcome::Duplicate);
    // Same key, different cookie: the partial message is replaced.
    let mut other = d0;
    other.header.cookie = 1;
    assert_eq!(r.push(src, &other), PushOutcome::Incomplete);
    assert_eq!(r.stats().conflicts, 1);
    assert_eq!(r.in_progress(), 1);
    // The same fragment from another source MAC is another message.
    assert_eq!(r.push(ENGINE, &d0), PushOutcome::Incomplete);
    assert_eq!(r.in_progress(), 2);
    // Invalid fragments are refused and counted.
    let mut bad = d0;
    bad.frag_offset = u32::MAX;
    assert!(matches!(r.push(src, &bad), PushOutcome::Invalid(_)));
    assert_eq!(r.stats().invalid, 1);
    // Complete the ENGINE one, then replay its fragments: all duplicates.
    let mut done = 0;
    for f in &frames {
        let (_, d) = data_of(f);
        if let PushOutcome::Complete(m) = r.push(ENGINE, &d) {
            assert_eq!(m.payload, payload);
            assert_eq!(m.src, ENGINE);
            done += 1;
        }
    }
    assert_eq!(done, 1);
    for f in &frames {
        let (_, d) = data_of(f);
        assert_eq!(r.push(ENGINE, &d), PushOutcome::Duplicate);
    }
    assert_eq!(r.remembered(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn fragment_and_reassemble_in_any_order(
        len in prop_oneof![0usize..100, 0usize..70_000],
        mtu in prop_oneof![MIN_MTU..200, 200usize..9001],
        order in any::<prop::sample::Index>(),
        dups in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        seed in any::<u64>(),
    ) {
        let payload: Vec<u8> = (0..len).map(|i| (i as u64).wrapping_mul(seed | 1) as u8).collect();
        let msg = message(&payload, DataKind::DmaData);
        let frames = fragment(ENGINE, GUEST, &msg, mtu).unwrap();
        prop_assert_eq!(frames.len(), msg.fragments(mtu).unwrap().len());
        prop_assert!(frames.iter().all(|f| f.len() <= (mtu + ETH_HEADER_LEN).max(MIN_FRAME_LEN)));
        // A permutation of the fragments (a rotation then a reversal of part of it), with
        // duplicates inserted.
        let mut seq: Vec<usize> = (0..frames.len()).collect();
        seq.rotate_left(order.index(frames.len()));
        let half = seq.len() / 2;
        seq[..half].reverse();
        for d in &dups {
            let f = d.index(frames.len());
            let at = d.index(seq.len() + 1);
            seq.insert(at, f);
        }
        let mut r = Reassembler::new(ReassemblyLimits::default());
        let mut got = None;
        for i in seq {
            let (src, d) = data_of(&frames[i]);
            match r.push(src, &d) {
                PushOutcome::Complete(m) => {
                    prop_assert!(got.is_none(), "completed twice");
                    got = Some(m);
                }
                PushOutcome::Incomplete | PushOutcome::Duplicate => {}
                other => prop_assert!(false, "{:?}", other),
            }
        }
        let m = got.unwrap_or_else(|| panic!("never completed"));
        prop_assert_eq!(&m.payload, &payload);
        let h = m.header;
        prop_assert_eq!((m.src, h.src_endpoint, h.dst_endpoint, h.cookie), (GUEST, 4, 5, 77));
        prop_assert_eq!(r.in_progress(), 0);
        prop_assert_eq!(r.buffered_bytes(), 0);
    }
}
