//! Tests of frame encoding and decoding.

use super::*;
use crate::message::INLINE_CAPACITY;
use proptest::prelude::*;

const ENGINE: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xee]);
const GUEST: MacAddr = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);

fn frame(body: FrameBody<'_>) -> Frame<'_> {
    Frame {
        dst: ENGINE,
        src: GUEST,
        body,
    }
}

fn create() -> FrameBody<'static> {
    FrameBody::ControlRequest(ControlRequest {
        request_id: 7,
        op: ControlOp::Create(CreateRequest {
            mac: GUEST,
            endpoint: 3,
            ring_size: 256,
            region_addr: 0x4000_0000,
            region_len: 2 << 20,
        }),
    })
}

fn destroy() -> FrameBody<'static> {
    FrameBody::ControlRequest(ControlRequest {
        request_id: 8,
        op: ControlOp::Destroy {
            channel: ChannelId(5),
        },
    })
}

fn response(status: ControlStatus) -> FrameBody<'static> {
    FrameBody::ControlResponse(ControlResponse {
        request_id: 7,
        channel: ChannelId(5),
        status,
    })
}

fn data(payload: &[u8]) -> DataFrame<'_> {
    DataFrame {
        header: MessageHeader {
            src_endpoint: 1,
            dst_endpoint: 2,
            kind: DataKind::DmaData,
            msg_flags: 0,
            message_id: 99,
            cookie: 0xc0ffee,
        },
        session: 0x5e55,
        seq: 41,
        total_len: payload.len() as u32 + 10,
        frag_offset: 10,
        payload,
    }
}

fn ack(kind: AckKind) -> FrameBody<'static> {
    FrameBody::Ack(AckFrame {
        src_endpoint: 2,
        dst_endpoint: 1,
        session: 0x5e55,
        kind,
    })
}

fn enc(f: &Frame<'_>) -> Vec<u8> {
    f.encode().unwrap()
}

/// Byte `i` of the body of an encoded frame.
pub(super) fn body_at(i: usize) -> usize {
    BODY_OFFSET + i
}

/// The little-endian u16 field at byte `at` of the encoded frame `b`.
pub(super) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}

/// The little-endian u32 field at byte `at` of the encoded frame `b`.
pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// The little-endian u64 field at byte `at` of the encoded frame `b`.
pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Decodes the frame `b` with its body bytes from `i` on replaced by `bytes`.
fn decode_with(b: &[u8], i: usize, bytes: &[u8]) -> Result<(), DecodeError> {
    let mut v = b.to_vec();
    v[body_at(i)..body_at(i) + bytes.len()].copy_from_slice(bytes);
    Frame::decode(&v).map(|_| ())
}

// ---------------------------------------------------------------- layout and happy paths

#[test]
fn encodings_have_the_documented_bytes() {
    let b = enc(&frame(create()));
    assert_eq!(b.len(), MIN_FRAME_LEN);
    assert_eq!(&b[0..6], &ENGINE.0);
    assert_eq!(&b[6..12], &GUEST.0);
    assert_eq!(&b[12..14], &[0x88, 0xb5]);
    assert_eq!(&b[14..18], &[1, 1, 0, 0]);
    assert_eq!(u32_at(&b, 18), 7);
    assert_eq!(b[22], 1);
    assert_eq!(&b[24..30], &GUEST.0);
    assert_eq!(u32_at(&b, 30), 3);
    assert_eq!(u32_at(&b, 34), 256);
    assert_eq!(u64_at(&b, 42), 0x4000_0000);
    assert_eq!(u64_at(&b, 50), 2 << 20);
    assert_eq!(&b[58..60], &[0, 0]);

    let b = enc(&frame(response(ControlStatus::Success {
        worker: 2,
        cpu: None,
    })));
    assert_eq!(b[15], 2);
    assert_eq!(b[22], 2);
    assert_eq!(u32_at(&b, 26), 5);
    assert_eq!(u32_at(&b, 30), 2);
    assert_eq!(&b[34..38], &(-1i32).to_le_bytes());

    let payload = [0xab; 100];
    let b = enc(&frame(FrameBody::Data(data(&payload))));
    assert_eq!(b.len(), BODY_OFFSET + DATA_HEADER_LEN + 100);
    assert_eq!(b[15], 3);
    assert_eq!(u32_at(&b, body_at(0)), 1);
    assert_eq!(u32_at(&b, body_at(4)), 2);
    assert_eq!(u32_at(&b, DST_ENDPOINT_OFFSET), 2);
    assert_eq!(u32_at(&b, body_at(8)), 0x5e55);
    assert_eq!(u32_at(&b, body_at(12)), 41);
    assert_eq!(u32_at(&b, body_at(16)), 99);
    assert_eq!(u32_at(&b, body_at(20)), 110);
    assert_eq!(u32_at(&b, body_at(24)), 10);
    assert_eq!(u16_at(&b, body_at(28)), 100);
    assert_eq!(b[body_at(30)], 2);
    assert_eq!(b[body_at(31)], 0);
    assert_eq!(u64_at(&b, body_at(32)), 0xc0ffee);
    assert_eq!(&b[body_at(40)..], &payload);

    let b = enc(&frame(ack(AckKind::Reject {
        ack: 0x01020304,
        message_id: 77,
        status: CompletionStatus::NoBuffer,
    })));
    assert_eq!(b.len(), MIN_FRAME_LEN);
    assert_eq!(b[15], 6);
    assert_eq!(u32_at(&b, body_at(0)), 2);
    assert_eq!(u32_at(&b, DST_ENDPOINT_OFFSET), 1);
    assert_eq!(u32_at(&b, body_at(8)), 0x5e55);
    assert_eq!(&b[body_at(12)..body_at(16)], &[4, 3, 2, 1]);
    assert_eq!(u32_at(&b, body_at(16)), 77);
    assert_eq!(u16_at(&b, body_at(20)), 3);
    assert_eq!(&b[body_at(22)..body_at(24)], &[0, 0]);
    assert!(b[body_at(24)..].iter().all(|x| *x == 0));
    let b = enc(&frame(ack(AckKind::Reset)));
    assert_eq!(&b[body_at(12)..body_at(22)], &[0; 10]);
    assert_eq!(&b[body_at(22)..body_at(24)], &[1, 0]);
    let b = enc(&frame(ack(AckKind::Cumulative { ack: 9 })));
    assert_eq!(u32_at(&b, body_at(12)), 9);
    assert_eq!(&b[body_at(16)..body_at(24)], &[0; 8]);
    let b = enc(&frame(ack(AckKind::Blocked { ack: 9 })));
    assert_eq!(u32_at(&b, body_at(12)), 9);
    assert_eq!(&b[body_at(16)..body_at(22)], &[0; 6]);
    assert_eq!(&b[body_at(22)..body_at(24)], &[2, 0]);

    let b = enc(&frame(FrameBody::Wake {
        channel: ChannelId(0x01020304),
    }));
    assert_eq!(b.len(), MIN_FRAME_LEN);
    assert_eq!(b[15], 5);
    assert_eq!(&b[18..22], &[4, 3, 2, 1]);
    assert!(b[22..].iter().all(|x| *x == 0));
}

#[test]
fn every_fixed_body_fits_in_a_minimum_frame() {
    for t in [
        FrameType::ControlRequest,
        FrameType::ControlResponse,
        FrameType::Doorbell,
        FrameType::Wake,
        FrameType::Ack,
    ] {
        assert!(BODY_OFFSET + t.body_len() <= MIN_FRAME_LEN, "{t:?}");
    }
}

#[test]
fn decode_accepts_unpadded_and_garbage_padded_frames() {
    let f = frame(FrameBody::Doorbell {
        channel: ChannelId(9),
    });
    let b = enc(&f);
    // Unpadded (as a virtio-net TX queue may hand it over).
    assert_eq!(Frame::decode(&b[..BODY_OFFSET + NOTIFY_LEN]), Ok(f));
    // Padding need not be zero.
    let mut g = b.clone();
    g[40..].fill(0x5a);
    assert_eq!(Frame::decode(&g), Ok(f));

    // A short data frame, padded: frag_len says where the payload ends.
    let payload = [1u8];
    let f = frame(FrameBody::Data(data(&payload)));
    let mut b = enc(&f);
    assert_eq!(b.len(), MIN_FRAME_LEN);
    b[BODY_OFFSET + DATA_HEADER_LEN + 1..].fill(0xff);
    match Frame::decode(&b).unwrap().body {
        FrameBody::Data(d) => assert_eq!(d.payload, &payload),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------- one test per error case

#[test]
fn truncated_headers_are_refused() {
    let b = enc(&frame(create()));
    for len in [0, 5, 13] {
        assert!(matches!(
            Frame::decode(&b[..len]),
            Err(DecodeError::Truncated {
                what: "Ethernet header",
                ..
            })
        ));
    }
    for len in [14, 15, 17] {
        assert!(matches!(
            Frame::decode(&b[..len]),
            Err(DecodeError::Truncated {
                what: "svnic header",
                ..
            })
        ));
    }
}

#[test]
fn truncated_bodies_are_refused() {
    let payload = [7u8; 50];
    for f in [
        frame(create()),
        frame(destroy()),
        frame(response(ControlStatus::Pending)),
        frame(FrameBody::Data(data(&payload))),
        frame(FrameBody::Doorbell {
            channel: ChannelId(1),
        }),
        frame(FrameBody::Wake {
            channel: ChannelId(1),
        }),
        frame(ack(AckKind::Cumulative { ack: 3 })),
    ] {
        let b = enc(&f);
        let need = BODY_OFFSET + f.body.frame_type().body_len();
        assert!(matches!(
            Frame::decode(&b[..need - 1]),
            Err(DecodeError::Truncated { .. })
        ));
    }
    // Data: the payload is shorter than frag_len.
    let b = enc(&frame(FrameBody::Data(data(&payload))));
    assert!(matches!(
        Frame::decode(&b[..b.len() - 1]),
        Err(DecodeError::Truncated {
            what: "data frame payload (frag_len)",
            ..
        })
    ));
}

#[test]
fn other_ethertypes_and_vlan_tags_are_not_svnic() {
    let b = enc(&frame(destroy()));
    let mut ip = b.clone();
    ip[12..14].copy_from_slice(&[0x08, 0x00]);
    assert!(matches!(Frame::decode(&ip), Err(DecodeError::NotSvnic(_))));
    // An 802.1Q tag in front of the svnic EtherType.
    let mut tagged = b[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
    tagged.extend_from_slice(&b[12..]);
    assert!(matches!(
        Frame::decode(&tagged),
        Err(DecodeError::NotSvnic(_))
    ));
    assert!(claims_svnic(&b));
    assert!(claims_svnic(&tagged));
    assert!(!claims_svnic(&ip));
    assert!(!claims_svnic(&b[..13]));
}

#[test]
fn unknown_version_type_and_flags_are_refused() {
    let b = enc(&frame(destroy()));
    let mut v = b.clone();
    v[14] = 2;
    assert!(matches!(Frame::decode(&v), Err(DecodeError::NotSvnic(_))));
    for t in [0, 8, 255] {
        let mut v = b.clone();
        v[15] = t;
        assert!(matches!(
            Frame::decode(&v),
            Err(DecodeError::UnknownCode {
                what: "frame type",
                ..
            })
        ));
    }
    for i in [16, 17] {
        let mut v = b.clone();
        v[i] = 1;
        assert!(matches!(
            Frame::decode(&v),
            Err(DecodeError::ReservedNotZero {
                what: "svnic header flags"
            })
        ));
    }
}

#[test]
fn trailing_bytes_that_are_not_padding_are_refused() {
    let mut b = enc(&frame(create()));
    b.push(0);
    assert!(matches!(
        Frame::decode(&b),
        Err(DecodeError::BadLength { max: 60, .. })
    ));
    let payload = [0u8; 100];
    let mut b = enc(&frame(FrameBody::Data(data(&payload))));
    b.push(0);
    assert!(matches!(
        Frame::decode(&b),
        Err(DecodeError::BadLength { .. })
    ));
}

#[test]
fn control_request_errors() {
    let b = enc(&frame(create()));
    for op in [0, 3, 255] {
        assert!(matches!(
            decode_with(&b, 4, &[op]),
            Err(DecodeError::UnknownCode {
                what: "control request op",
                ..
            })
        ));
    }
    for i in [5, 20, 23] {
        assert!(
            matches!(
                decode_with(&b, i, &[1]),
                Err(DecodeError::ReservedNotZero { .. })
            ),
            "create byte {i}"
        );
    }
    let b = enc(&frame(destroy()));
    for i in [5, 7, 12, 20, 39] {
        assert!(
            matches!(
                decode_with(&b, i, &[1]),
                Err(DecodeError::ReservedNotZero { .. })
            ),
            "destroy byte {i}"
        );
    }
}

#[test]
fn control_request_id_survives_malformation() {
    let mut b = enc(&frame(create()));
    b[body_at(20)] = 9;
    assert!(Frame::decode(&b).is_err());
    assert_eq!(control_request_id(&b), Some(7));
    let w = enc(&frame(FrameBody::Wake {
        channel: ChannelId(1),
    }));
    assert_eq!(control_request_id(&w), None);
    assert_eq!(control_request_id(&b[..20]), None);
}

#[test]
fn control_response_errors() {
    let ok = enc(&frame(response(ControlStatus::Success {
        worker: 1,
        cpu: Some(3),
    })));
    let pending = enc(&frame(response(ControlStatus::Pending)));
    let failure = enc(&frame(response(ControlStatus::Failure(
        FailureReason::QuotaExceeded,
    ))));

    for s in [0, 5, 255] {
        assert!(matches!(
            decode_with(&ok, 4, &[s]),
            Err(DecodeError::UnknownCode {
                what: "control response status",
                ..
            })
        ));
    }
    assert!(matches!(
        decode_with(&ok, 5, &[1]),
        Err(DecodeError::ReservedNotZero { .. })
    ));
    // A reason on Success or Pending.
    for b in [&ok, &pending] {
        assert!(matches!(
            decode_with(b, 6, &[1]),
            Err(DecodeError::ReservedNotZero { .. })
        ));
    }
    // Worker or CPU on a status other than Success.
    for (b, i) in [(&pending, 12), (&failure, 16)] {
        assert!(matches!(
            decode_with(b, i, &[1]),
            Err(DecodeError::ReservedNotZero { .. })
        ));
    }
    // The newest reason decodes; the next code (what a decoder of this version sees from a newer
    // engine) is refused as unknown, like 0 and any other unknown reason.
    let mut v = failure.clone();
    v[body_at(6)..body_at(8)].copy_from_slice(&16u16.to_le_bytes());
    assert!(matches!(
        Frame::decode(&v).map(|f| f.body),
        Ok(FrameBody::ControlResponse(ControlResponse {
            status: ControlStatus::Failure(FailureReason::RateLimited),
            ..
        }))
    ));
    for r in [0u16, 17, 999] {
        assert!(matches!(
            decode_with(&failure, 6, &r.to_le_bytes()),
            Err(DecodeError::UnknownCode {
                what: "FailureReason",
                ..
            })
        ));
    }
    // CPU -2.
    assert!(matches!(
        decode_with(&ok, 16, &(-2i32).to_le_bytes()),
        Err(DecodeError::UnknownCode { .. })
    ));
    // ... and the encoder refuses a CPU that does not fit an i32.
    let f = frame(response(ControlStatus::Success {
        worker: 0,
        cpu: Some(1 << 31),
    }));
    assert!(matches!(f.encode(), Err(DecodeError::BadLength { .. })));
}

#[test]
fn data_frame_errors() {
    let payload = [3u8; 20];
    let b = enc(&frame(FrameBody::Data(data(&payload))));
    let put32 = |v: &mut Vec<u8>, i: usize, x: u32| {
        v[body_at(i)..body_at(i + 4)].copy_from_slice(&x.to_le_bytes())
    };

    for k in [0, 3] {
        assert!(matches!(
            decode_with(&b, 30, &[k]),
            Err(DecodeError::UnknownCode {
                what: "data message kind",
                ..
            })
        ));
    }
    // WANT_COMPLETION is not a DMA-data flag; unknown bits never are.
    for f in [FLAG_WANT_COMPLETION, 0x80] {
        assert!(matches!(
            decode_with(&b, 31, &[f]),
            Err(DecodeError::BadFlags { .. })
        ));
    }
    // total_len above the kind's maximum.
    let mut v = b.clone();
    put32(&mut v, 20, MAX_DATA_LEN + 1);
    assert!(matches!(
        Frame::decode(&v),
        Err(DecodeError::BadLength { .. })
    ));
    let mut v = b.clone();
    v[body_at(30)] = DataKind::UserData.code();
    put32(&mut v, 20, INLINE_CAPACITY as u32 + 1);
    put32(&mut v, 24, 0);
    assert!(matches!(
        Frame::decode(&v),
        Err(DecodeError::BadLength { .. })
    ));
    // frag_offset + frag_len past total_len, including a u32 overflow.
    for off in [11, u32::MAX] {
        let mut v = b.clone();
        put32(&mut v, 24, off);
        assert!(matches!(
            Frame::decode(&v),
            Err(DecodeError::BadLength { .. })
        ));
    }
    // An empty fragment of a non-empty message.
    let f = frame(FrameBody::Data(data(&[])));
    assert!(matches!(f.encode(), Err(DecodeError::BadLength { .. })));
    // The encoder refuses a fragment longer than frag_len can say.
    let big = vec![0u8; 70_000];
    let mut d = data(&big);
    d.total_len = 80_000;
    d.frag_offset = 0;
    assert!(matches!(
        frame(FrameBody::Data(d)).encode(),
        Err(DecodeError::BadLength { .. })
    ));
}

#[test]
fn ack_frame_errors() {
    let cumulative = enc(&frame(ack(AckKind::Cumulative { ack: 5 })));
    let reset = enc(&frame(ack(AckKind::Reset)));
    let blocked = enc(&frame(ack(AckKind::Blocked { ack: 5 })));
    // Flag bits other than RESET and BLOCKED, with or without them, and both together.
    for flags in [4u16, 0x8000, 3, 5, 6] {
        for b in [&cumulative, &reset, &blocked] {
            assert!(matches!(
                decode_with(b, 22, &flags.to_le_bytes()),
                Err(DecodeError::ReservedNotZero {
                    what: "ack flags (bits other than RESET or BLOCKED, or both)"
                })
            ));
        }
    }
    // A BLOCKED ack names no message and no status.
    for (at, bytes) in [(16, &[1u8][..]), (20, &[3])] {
        assert!(matches!(
            decode_with(&blocked, at, bytes),
            Err(DecodeError::ReservedNotZero {
                what: "message_id and status of a BLOCKED ack"
            })
        ));
    }
    // A RESET says nothing else.
    for (at, bytes) in [(12, &[1u8][..]), (16, &[1]), (20, &[3])] {
        assert!(matches!(
            decode_with(&reset, at, bytes),
            Err(DecodeError::ReservedNotZero {
                what: "ack, message_id and status of a RESET ack"
            })
        ));
    }
    // A plain cumulative ack names no message.
    assert!(matches!(
        decode_with(&cumulative, 16, &[1]),
        Err(DecodeError::ReservedNotZero {
            what: "message_id of a cumulative ack (status 0)"
        })
    ));
    // A reject needs a known status, and the encoder refuses a reject with status Ok.
    assert!(matches!(
        decode_with(&cumulative, 20, &999u16.to_le_bytes()),
        Err(DecodeError::UnknownCode {
            what: "CompletionStatus",
            ..
        })
    ));
    let ok_reject = frame(ack(AckKind::Reject {
        ack: 1,
        message_id: 2,
        status: CompletionStatus::Ok,
    }));
    assert!(matches!(
        ok_reject.encode(),
        Err(DecodeError::UnknownCode { code: 0, .. })
    ));
    // With status set, the same bytes are a reject.
    let mut v = cumulative.clone();
    v[body_at(16)] = 8;
    v[body_at(20)] = CompletionStatus::RingFull.code() as u8;
    assert_eq!(
        Frame::decode(&v).map(|f| f.body),
        Ok(ack(AckKind::Reject {
            ack: 5,
            message_id: 8,
            status: CompletionStatus::RingFull
        }))
    );
}

#[test]
fn encode_into_appends_and_leaves_the_buffer_alone_on_error() {
    let mut out = vec![1, 2, 3];
    frame(destroy()).encode_into(&mut out).unwrap();
    assert_eq!(out.len(), 3 + MIN_FRAME_LEN);
    assert_eq!(Frame::decode(&out[3..]), Ok(frame(destroy())));
    let bad = frame(FrameBody::Data(data(&[])));
    assert!(bad.encode_into(&mut out).is_err());
    assert_eq!(out.len(), 3 + MIN_FRAME_LEN);
}

// ---------------------------------------------------------------- property tests

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(MacAddr)
}

fn control_body() -> impl Strategy<Value = FrameBody<'static>> {
    let create = (
        any::<u32>(),
        mac(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(request_id, mac, endpoint, ring_size, region_addr, region_len)| {
                FrameBody::ControlRequest(ControlRequest {
                    request_id,
                    op: ControlOp::Create(CreateRequest {
                        mac,
                        endpoint,
                        ring_size,
                        region_addr,
                        region_len,
                    }),
                })
            },
        );
    let destroy = (any::<u32>(), any::<u32>()).prop_map(|(request_id, c)| {
        FrameBody::ControlRequest(ControlRequest {
            request_id,
            op: ControlOp::Destroy {
                channel: ChannelId(c),
            },
        })
    });
    let status = prop_oneof![
        Just(ControlStatus::Pending),
        Just(ControlStatus::Destroyed),
        (any::<u32>(), proptest::option::of(0..=i32::MAX as u32))
            .prop_map(|(worker, cpu)| ControlStatus::Success { worker, cpu }),
        proptest::sample::select(FailureReason::ALL).prop_map(ControlStatus::Failure),
    ];
    let response = (any::<u32>(), any::<u32>(), status).prop_map(|(request_id, c, status)| {
        FrameBody::ControlResponse(ControlResponse {
            request_id,
            channel: ChannelId(c),
            status,
        })
    });
    let notify = (any::<bool>(), any::<u32>()).prop_map(|(door, c)| {
        let channel = ChannelId(c);
        if door {
            FrameBody::Doorbell { channel }
        } else {
            FrameBody::Wake { channel }
        }
    });
    let ack_kind = prop_oneof![
        any::<u32>().prop_map(|ack| AckKind::Cumulative { ack }),
        (
            any::<u32>(),
            any::<u32>(),
            proptest::sample::select(&CompletionStatus::ALL[1..])
        )
            .prop_map(|(ack, message_id, status)| AckKind::Reject {
                ack,
                message_id,
                status
            }),
        Just(AckKind::Reset),
        any::<u32>().prop_map(|ack| AckKind::Blocked { ack }),
    ];
    let ack = (any::<(u32, u32, u32)>(), ack_kind).prop_map(|((s, d, session), kind)| {
        FrameBody::Ack(AckFrame {
            src_endpoint: s,
            dst_endpoint: d,
            session,
            kind,
        })
    });
    prop_oneof![create, destroy, response, notify, ack]
}

/// A valid data frame (with an empty placeholder payload) and its payload.
fn data_parts() -> impl Strategy<Value = (DataFrame<'static>, Vec<u8>)> {
    let kind = prop_oneof![Just(DataKind::UserData), Just(DataKind::DmaData)];
    (kind, prop_oneof![0u32..=64, 0u32..=MAX_DATA_LEN])
        .prop_flat_map(|(kind, total)| {
            let total = total.min(kind.max_len());
            let min_len = u32::from(total > 0);
            let len = min_len..=total.min(1600);
            (Just(kind), Just(total), len)
        })
        .prop_flat_map(|(kind, total, len)| {
            (
                Just(kind),
                Just(total),
                0..=total - len,
                proptest::collection::vec(any::<u8>(), len as usize),
                (0..=kind.allowed_flags()).prop_map(move |f| f & kind.allowed_flags()),
                any::<(u32, u32, u32, u64)>(),
                any::<(u32, u32)>(),
            )
        })
        .prop_map(
            |(
                kind,
                total_len,
                frag_offset,
                payload,
                msg_flags,
                (s, d, id, cookie),
                (session, seq),
            )| {
                (
                    DataFrame {
                        header: MessageHeader {
                            src_endpoint: s,
                            dst_endpoint: d,
                            kind,
                            msg_flags,
                            message_id: id,
                            cookie,
                        },
                        session,
                        seq,
                        total_len,
                        frag_offset,
                        payload: &[],
                    },
                    payload,
                )
            },
        )
}

/// Encodes a frame built from `dst`, `src` and either a control body or data parts.
fn build<'a>(
    dst: MacAddr,
    src: MacAddr,
    body: &Result<FrameBody<'static>, (DataFrame<'static>, Vec<u8>)>,
    storage: &'a mut Vec<u8>,
) -> Frame<'a> {
    match body {
        Ok(b) => Frame { dst, src, body: *b },
        Err((d, p)) => {
            storage.clone_from(p);
            let mut d: DataFrame<'a> = *d;
            d.payload = storage;
            Frame {
                dst,
                src,
                body: FrameBody::Data(d),
            }
        }
    }
}

fn any_body() -> impl Strategy<Value = Result<FrameBody<'static>, (DataFrame<'static>, Vec<u8>)>> {
    prop_oneof![control_body().prop_map(Ok), data_parts().prop_map(Err)]
}

proptest! {
    #[test]
    fn every_frame_type_round_trips(dst in mac(), src in mac(), body in any_body()) {
        let mut storage = Vec::new();
        let f = build(dst, src, &body, &mut storage);
        let bytes = f.encode().unwrap();
        prop_assert_eq!(bytes.len(), f.encoded_len());
        prop_assert!(bytes.len() >= MIN_FRAME_LEN);
        prop_assert_eq!(Frame::decode(&bytes), Ok(f));
        // Unpadded, it decodes too.
        prop_assert_eq!(Frame::decode(&bytes[..f.content_len()]), Ok(f));
    }

    #[test]
    fn decode_of_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        check_canonical(&bytes)?;
    }

    #[test]
    fn decode_of_mutated_frames_never_panics(
        dst in mac(), src in mac(), body in any_body(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(), extend in 0usize..4,
    ) {
        let mut storage = Vec::new();
        let mut bytes = build(dst, src, &body, &mut storage).encode().unwrap();
        for (i, v) in edits {
            let i = i.index(bytes.len());
            bytes[i] = v;
        }
        bytes.extend(std::iter::repeat_n(0xa5, extend));
        check_canonical(&bytes)?;
        check_canonical(&bytes[..cut.index(bytes.len() + 1)])?;
    }
}

/// Whatever decodes re-encodes to a frame that decodes equal, with the same content bytes.
fn check_canonical(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(f) = Frame::decode(bytes) {
        let again = f.encode();
        prop_assert!(again.is_ok(), "{:?} decoded but does not encode", f);
        let again = again.unwrap_or_default();
        prop_assert_eq!(Frame::decode(&again), Ok(f));
        // Canonical: the content bytes are the very same; only padding may differ.
        let content = f.content_len();
        prop_assert_eq!(again.get(..content), bytes.get(..content));
    }
    Ok(())
}
