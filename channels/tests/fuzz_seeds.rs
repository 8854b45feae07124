//! Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/seed-*) from real encoded
//! messages and frames. Ignored by default; see fuzz/README.md:
//!
//! ```text
//! SVNIC_FUZZ_CORPUS=$PWD/fuzz/corpus cargo test -p svnic-channels --test fuzz_seeds -- --ignored
//! ```

#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use svnic_channels::frame::{
    fragment, AckFrame, AckKind, BundleEntry, BundleFrame, ControlOp, ControlRequest,
    ControlResponse, ControlStatus, CreateRequest, DataKind, DataMessage, Frame, FrameBody,
    MessageHeader, DEFAULT_MTU, MIN_MTU,
};
use svnic_channels::message::{FLAG_COMPLETE, FLAG_WANT_COMPLETION};
use svnic_channels::{
    ChannelAddr, ChannelId, Completion, CompletionStatus, DataRef, DmaData, FailureReason, MacAddr,
    Message, PostBuffer, UserData,
};

const ENGINE: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xee]);
const GUEST: MacAddr = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
const REMOTE: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 0xee]);

fn write(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let d = dir.join(target);
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join(format!("seed-{name}")), bytes).unwrap();
}

fn messages() -> Vec<(&'static str, Message)> {
    let peer = ChannelAddr::new(GUEST, 7);
    let mut want = UserData::new(peer, 2, b"ping").unwrap();
    want.flags = FLAG_WANT_COMPLETION;
    let dma = DmaData {
        peer,
        flags: 0,
        cookie: 3,
        data: DataRef {
            offset: 0xd000,
            len: 4096,
        },
    };
    vec![
        (
            "user-data",
            Message::UserData(UserData::new(peer, 1, b"hello, channel").unwrap()),
        ),
        ("user-data-want-completion", Message::UserData(want)),
        ("dma-data", Message::DmaData(dma)),
        (
            "dma-data-complete",
            Message::DmaData(DmaData {
                flags: FLAG_COMPLETE,
                ..dma
            }),
        ),
        (
            "post-buffer",
            Message::PostBuffer(PostBuffer {
                cookie: 4,
                buf: DataRef {
                    offset: 0x10000,
                    len: 65536,
                },
            }),
        ),
        (
            "completion-ok",
            Message::Completion(Completion {
                peer,
                cookie: 3,
                status: CompletionStatus::Ok,
                len: 4096,
            }),
        ),
        (
            "completion-bad-post",
            Message::Completion(Completion {
                peer: ChannelAddr::default(),
                cookie: 4,
                status: CompletionStatus::BadPostBuffer,
                len: 0,
            }),
        ),
    ]
}

fn control_frames() -> Vec<(&'static str, Frame<'static>)> {
    let to_engine = |body| Frame {
        dst: ENGINE,
        src: GUEST,
        body,
    };
    let to_guest = |body| Frame {
        dst: GUEST,
        src: ENGINE,
        body,
    };
    let ack = |kind| Frame {
        dst: REMOTE,
        src: ENGINE,
        body: FrameBody::Ack(AckFrame {
            src_endpoint: 9,
            dst_endpoint: 7,
            session: 0x5e55,
            kind,
        }),
    };
    let response = |status| {
        to_guest(FrameBody::ControlResponse(ControlResponse {
            request_id: 1,
            channel: ChannelId(3),
            status,
        }))
    };
    vec![
        (
            "create",
            to_engine(FrameBody::ControlRequest(ControlRequest {
                request_id: 1,
                op: ControlOp::Create(CreateRequest {
                    mac: GUEST,
                    endpoint: 7,
                    ring_size: 256,
                    region_addr: 0x4000_0000,
                    region_len: 2 << 20,
                }),
            })),
        ),
        (
            "destroy",
            to_engine(FrameBody::ControlRequest(ControlRequest {
                request_id: 2,
                op: ControlOp::Destroy {
                    channel: ChannelId(3),
                },
            })),
        ),
        ("pending", response(ControlStatus::Pending)),
        (
            "success",
            response(ControlStatus::Success {
                worker: 1,
                cpu: Some(1),
            }),
        ),
        (
            "success-unpinned",
            response(ControlStatus::Success {
                worker: 0,
                cpu: None,
            }),
        ),
        (
            "failure",
            response(ControlStatus::Failure(FailureReason::EndpointTaken)),
        ),
        ("destroyed", response(ControlStatus::Destroyed)),
        (
            "doorbell",
            to_engine(FrameBody::Doorbell {
                channel: ChannelId(3),
            }),
        ),
        (
            "wake",
            to_guest(FrameBody::Wake {
                channel: ChannelId(3),
            }),
        ),
        ("ack", ack(AckKind::Cumulative { ack: 3 })),
        (
            "ack-reject",
            ack(AckKind::Reject {
                ack: 3,
                message_id: 2,
                status: CompletionStatus::NoBuffer,
            }),
        ),
        ("ack-reset", ack(AckKind::Reset)),
        ("ack-blocked", ack(AckKind::Blocked { ack: 3 })),
        ("bundle", bundle()),
    ]
}

/// A bundle of three small messages (the entries live as long as the seed writer).
fn bundle() -> Frame<'static> {
    let mut entries = Vec::new();
    for (cookie, payload) in [(1u64, &b"one"[..]), (2, b""), (3, &[7; 40])] {
        BundleEntry {
            cookie,
            msg_flags: 0,
            payload,
        }
        .encode_into(&mut entries)
        .expect("a valid entry");
    }
    Frame {
        dst: REMOTE,
        src: ENGINE,
        body: FrameBody::Bundle(BundleFrame {
            src_endpoint: 7,
            dst_endpoint: 9,
            session: 0x5e55,
            seq: 4,
            first_message_id: 10,
            count: 3,
            entries: entries.leak(),
        }),
    }
}

fn message_to_send(payload: &[u8], id: u32, kind: DataKind) -> DataMessage<'_> {
    DataMessage {
        header: MessageHeader {
            src_endpoint: 7,
            dst_endpoint: 9,
            kind,
            msg_flags: 0,
            message_id: id,
            cookie: 0x5eed_0000 + u64::from(id),
        },
        session: 0x5e55,
        first_seq: 0,
        payload,
    }
}

/// Records of `[len u16 LE][frame]`, the input format of the reassembly target.
fn records<'a>(frames: impl IntoIterator<Item = &'a Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        out.extend_from_slice(&u16::try_from(f.len()).unwrap().to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

#[test]
#[ignore = "writes the fuzz seed corpus; set SVNIC_FUZZ_CORPUS (see fuzz/README.md)"]
fn write_fuzz_seeds() {
    let Some(dir) = std::env::var_os("SVNIC_FUZZ_CORPUS") else {
        eprintln!("SVNIC_FUZZ_CORPUS not set: nothing written");
        return;
    };
    let dir = Path::new(&dir);

    for (name, m) in messages() {
        let raw = m.encode();
        assert_eq!(raw.decode(), Ok(m));
        write(dir, "message_decode", name, &raw.0);
    }

    for (name, f) in control_frames() {
        let bytes = f.encode().unwrap();
        assert_eq!(Frame::decode(&bytes), Ok(f));
        write(dir, "frame_decode", name, &bytes);
    }
    let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    let frames = fragment(
        REMOTE,
        ENGINE,
        &message_to_send(&payload, 1, DataKind::DmaData),
        DEFAULT_MTU,
    )
    .unwrap();
    write(dir, "frame_decode", "data-first-fragment", &frames[0]);
    write(dir, "frame_decode", "data-last-fragment", &frames[2]);
    let user = fragment(
        REMOTE,
        ENGINE,
        &message_to_send(b"hi", 2, DataKind::UserData),
        DEFAULT_MTU,
    )
    .unwrap();
    write(dir, "frame_decode", "data-user", &user[0]);

    // Reassembly: in order; reversed with duplicates; two messages from two sources interleaved;
    // a single user-data frame; an empty message; small fragments at the minimum MTU.
    write(dir, "reassembly", "in-order", &records(&frames));
    let mut shuffled: Vec<&Vec<u8>> = frames.iter().rev().collect();
    shuffled.insert(1, &frames[2]);
    shuffled.push(&frames[1]);
    write(dir, "reassembly", "reversed-duplicates", &records(shuffled));
    let other = fragment(
        REMOTE,
        GUEST,
        &message_to_send(&payload[..2000], 1, DataKind::DmaData),
        1000,
    )
    .unwrap();
    let mut interleaved = Vec::new();
    for i in 0..frames.len().max(other.len()) {
        interleaved.extend(frames.get(i));
        interleaved.extend(other.get(i));
    }
    write(dir, "reassembly", "interleaved", &records(interleaved));
    write(dir, "reassembly", "user-data", &records(&user));
    let empty = fragment(
        REMOTE,
        ENGINE,
        &message_to_send(&[], 3, DataKind::DmaData),
        DEFAULT_MTU,
    )
    .unwrap();
    write(dir, "reassembly", "empty", &records(&empty));
    let small = fragment(
        REMOTE,
        ENGINE,
        &message_to_send(&payload[..200], 4, DataKind::DmaData),
        MIN_MTU,
    )
    .unwrap();
    write(dir, "reassembly", "min-mtu", &records(small.iter().rev()));
}
