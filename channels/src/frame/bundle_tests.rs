//! Tests of bundle frames: layout, round trip and refusals.

use super::tests::{body_at, u16_at, u32_at, u64_at};
use super::*;
use proptest::prelude::*;

const A: MacAddr = MacAddr([0x52, 0x54, 0, 0x20, 0, 1]);
const B: MacAddr = MacAddr([0x52, 0x54, 0, 0x21, 0, 1]);

fn entries(msgs: &[(u64, u8, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for &(cookie, msg_flags, payload) in msgs {
        BundleEntry {
            cookie,
            msg_flags,
            payload,
        }
        .encode_into(&mut out)
        .unwrap();
    }
    out
}

fn bundle(count: u16, entries: &[u8]) -> Frame<'_> {
    Frame {
        dst: B,
        src: A,
        body: FrameBody::Bundle(BundleFrame {
            src_endpoint: 2,
            dst_endpoint: 1,
            session: 0x5e55,
            seq: 41,
            first_message_id: u32::MAX,
            count,
            entries,
        }),
    }
}

#[test]
fn a_bundle_has_the_documented_bytes_and_round_trips() {
    let e = entries(&[
        (0xc0ffee, 0, b"hello"),
        (7, FLAG_WANT_COMPLETION, b""),
        (8, 0, &[9; 40]),
    ]);
    assert_eq!(e.len(), 3 * BUNDLE_ENTRY_HEADER_LEN + 45);
    let f = bundle(3, &e);
    let b = f.encode().unwrap();
    assert_eq!(b.len(), BODY_OFFSET + BUNDLE_HEADER_LEN + e.len());
    assert_eq!(b[15], 7);
    assert_eq!(u32_at(&b, body_at(0)), 2);
    assert_eq!(u32_at(&b, DST_ENDPOINT_OFFSET), 1);
    assert_eq!(u32_at(&b, body_at(8)), 0x5e55);
    assert_eq!(u32_at(&b, body_at(12)), 41);
    assert_eq!(u32_at(&b, body_at(16)), u32::MAX);
    assert_eq!(u16_at(&b, body_at(20)), 3);
    assert_eq!(&b[body_at(22)..body_at(24)], &[0, 0]);
    assert_eq!(u64_at(&b, body_at(24)), 0xc0ffee);
    assert_eq!(&b[body_at(32)..body_at(34)], &[0, 5]);
    assert_eq!(&b[body_at(34)..body_at(39)], b"hello");
    let d = Frame::decode(&b).unwrap();
    assert_eq!(d, f);
    let FrameBody::Bundle(got) = d.body else {
        panic!("not a bundle: {d:?}");
    };
    let got: Vec<_> = got.entries().collect();
    assert_eq!(got.len(), 3);
    // Ids are consecutive from first_message_id, wrapping.
    assert_eq!(got[0].0, u32::MAX);
    assert_eq!(got[1].0, 0);
    assert_eq!(got[2].0, 1);
    assert_eq!(got[0].1.payload, b"hello");
    assert_eq!(got[1].1.msg_flags, FLAG_WANT_COMPLETION);
    assert_eq!(got[2].1.payload, &[9; 40]);
    // Empty messages.
    let e = entries(&[(1, 0, b""), (2, 0, b"")]);
    let b = bundle(2, &e).encode().unwrap();
    assert_eq!(Frame::decode(&b).unwrap(), bundle(2, &e));
}

#[test]
fn malformed_bundles_are_refused() {
    let e = entries(&[(1, 0, b"ab"), (2, 0, b"cd")]);
    let good = bundle(2, &e).encode().unwrap();
    let count_at = BODY_OFFSET + 20;
    // A count outside 2..=255, or one entry more or fewer than the bytes hold.
    for count in [0u16, 1, 256, 3] {
        let mut b = good.clone();
        b[count_at..count_at + 2].copy_from_slice(&count.to_le_bytes());
        assert!(Frame::decode(&b).is_err(), "count {count}");
        assert!(bundle(count, &e).encode().is_err(), "count {count}");
    }
    let mut b = good.clone();
    b[count_at..count_at + 2].copy_from_slice(&1u16.to_le_bytes());
    assert!(matches!(
        Frame::decode(&b),
        Err(DecodeError::BadLength { .. })
    ));
    // Reserved bytes.
    let mut b = good.clone();
    b[BODY_OFFSET + 22] = 1;
    assert!(matches!(
        Frame::decode(&b),
        Err(DecodeError::ReservedNotZero { .. })
    ));
    // Truncated entries, and bytes after the last entry.
    for cut in 1..=e.len() {
        assert!(
            Frame::decode(&good[..good.len() - cut]).is_err(),
            "cut {cut}"
        );
    }
    let mut b = good.clone();
    b.push(0);
    assert!(Frame::decode(&b).is_err());
    let mut long = e.clone();
    long.push(0);
    assert!(bundle(2, &long).encode().is_err());
    // An entry longer than a user-data message, or with flags it may not carry.
    let len_at = BODY_OFFSET + BUNDLE_HEADER_LEN + 9;
    let mut b = good.clone();
    b[len_at] = INLINE_CAPACITY as u8 + 1;
    b.resize(b.len() + INLINE_CAPACITY, 0);
    assert!(matches!(
        Frame::decode(&b),
        Err(DecodeError::BadLength { .. })
    ));
    let mut b = good.clone();
    b[len_at - 1] = 0x80;
    assert!(matches!(
        Frame::decode(&b),
        Err(DecodeError::BadFlags { .. })
    ));
    let mut out = Vec::new();
    let too_long = [0u8; INLINE_CAPACITY + 1];
    let entry = BundleEntry {
        cookie: 0,
        msg_flags: 0,
        payload: &too_long,
    };
    assert!(entry.encode_into(&mut out).is_err());
    assert!(out.is_empty());
}

proptest! {
    #[test]
    fn any_bundle_round_trips(
        msgs in proptest::collection::vec(
            (any::<u64>(), prop_oneof![Just(0u8), Just(FLAG_COMPLETE), Just(FLAG_WANT_COMPLETION)],
             proptest::collection::vec(any::<u8>(), 0..=INLINE_CAPACITY)),
            2..40,
        ),
        first in any::<u32>(),
    ) {
        let list: Vec<(u64, u8, &[u8])> = msgs.iter().map(|(c, f, p)| (*c, *f, &p[..])).collect();
        let e = entries(&list);
        let mut f = bundle(msgs.len() as u16, &e);
        if let FrameBody::Bundle(b) = &mut f.body {
            b.first_message_id = first;
        }
        let bytes = f.encode().unwrap();
        let d = Frame::decode(&bytes).unwrap();
        prop_assert_eq!(d, f);
        let FrameBody::Bundle(b) = d.body else { unreachable!() };
        prop_assert_eq!(b.entries().count(), msgs.len());
        for (i, (id, entry)) in b.entries().enumerate() {
            prop_assert_eq!(id, first.wrapping_add(i as u32));
            prop_assert_eq!(entry.cookie, msgs[i].0);
            prop_assert_eq!(entry.msg_flags, msgs[i].1);
            prop_assert_eq!(entry.payload, &msgs[i].2[..]);
        }
    }
}
