use std::os::unix::io::{FromRawFd, IntoRawFd};

use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::tempfile::TempFile;

use super::*;

const V1: u32 = FLAG_VERSION_1;
const SET_FEATURES: u32 = 2;
const SET_MEM_TABLE: u32 = 5;
const SET_LOG_BASE: u32 = 6;
const SET_VRING_NUM: u32 = 8;
const SET_VRING_ADDR: u32 = 9;
const SET_VRING_KICK: u32 = 12;
const SET_VRING_CALL: u32 = 13;
const GET_PROTOCOL_FEATURES: u32 = 15;
const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_VRING_ENABLE: u32 = 18;
const GET_CONFIG: u32 = 24;
const RESET_DEVICE: u32 = 34;
const ADD_MEM_REG: u32 = 37;

fn u64_body(value: u64) -> Vec<u8> {
    value.to_le_bytes().to_vec()
}

fn ring_state(index: u32, num: u32) -> Vec<u8> {
    let mut b = index.to_le_bytes().to_vec();
    b.extend_from_slice(&num.to_le_bytes());
    b
}

fn mem_table(regions: u32) -> Vec<u8> {
    let mut b = regions.to_le_bytes().to_vec();
    b.extend_from_slice(&[0; 4]);
    for i in 0..u64::from(regions) {
        for field in [i << 30, 1 << 20, 0x7f00_0000_0000 + (i << 30), 0] {
            b.extend_from_slice(&field.to_le_bytes());
        }
    }
    b
}

fn eventfd(flags: i32) -> File {
    let fd = EventFd::new(flags).unwrap().into_raw_fd();
    // SAFETY: into_raw_fd handed over the eventfd's only owner.
    unsafe { File::from_raw_fd(fd) }
}

/// Both ends of a pipe: (read, write).
fn pipe() -> (File, File) {
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors pipe() writes.
    let created = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(created, 0);
    // SAFETY: pipe() just created fds[0], owned by nobody else.
    let read = unsafe { File::from_raw_fd(fds[0]) };
    // SAFETY: pipe() just created fds[1], owned by nobody else.
    let write = unsafe { File::from_raw_fd(fds[1]) };
    (read, write)
}

fn regular_file() -> File {
    TempFile::new().unwrap().into_file()
}

fn status_flags(file: &File) -> i32 {
    // SAFETY: F_GETFL only reads the status flags of a descriptor `file` keeps open.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) }
}

/// A gate after the protocol-feature handshake a polite frontend does.
fn negotiated(protocol: VhostUserProtocolFeatures) -> RequestGate {
    let mut gate = RequestGate::for_device();
    let proto = u64_body(protocol.bits());
    assert_eq!(
        gate.check(SET_PROTOCOL_FEATURES, V1, &proto, &[]).unwrap(),
        Verdict::Forward
    );
    gate
}

#[test]
fn an_unoffered_protocol_feature_is_refused_and_named() {
    let mut gate = RequestGate::for_device();
    let acked =
        VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
    let err = gate
        .check(SET_PROTOCOL_FEATURES, V1, &u64_body(acked.bits()), &[])
        .unwrap_err();
    assert!(
        matches!(
            err,
            Refusal::UnofferedProtocolFeatures { unoffered: 0x8000 }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("CONFIGURE_MEM_SLOTS"), "{err}");
    // Nothing was recorded: a protocol-gated request is still refused.
    assert!(matches!(
        gate.check(ADD_MEM_REG, V1, &[0; 40], &[]),
        Err(Refusal::NotServed { .. })
    ));
}

#[test]
fn every_offered_protocol_feature_is_accepted() {
    let offered = protocol_features() | VhostUserProtocolFeatures::REPLY_ACK;
    negotiated(offered);
}

#[test]
fn an_unoffered_virtio_feature_is_refused() {
    let mut gate = RequestGate::for_device();
    let acked = device_features() | 1 << 17; // VIRTIO_NET_F_CTRL_RX, never offered
    let err = gate
        .check(SET_FEATURES, V1, &u64_body(acked), &[])
        .unwrap_err();
    assert!(matches!(err, Refusal::UnofferedFeatures { unoffered } if unoffered == 1 << 17));
    assert!(err.to_string().contains("bit 17"), "{err}");
    assert_eq!(
        gate.check(SET_FEATURES, V1, &u64_body(device_features()), &[])
            .unwrap(),
        Verdict::Forward
    );
}

#[test]
fn requests_svnic_does_not_serve_are_refused_by_name() {
    let mut gate = negotiated(protocol_features() | VhostUserProtocolFeatures::REPLY_ACK);
    let file = regular_file();
    let err = gate
        .check(ADD_MEM_REG, V1, &[0; 40], std::slice::from_ref(&file))
        .unwrap_err();
    assert!(matches!(
        err,
        Refusal::NotServed {
            request: RequestCode(37)
        }
    ));
    assert!(err.to_string().contains("ADD_MEM_REG"), "{err}");
    let err = gate
        .check(SET_LOG_BASE, V1, &[0; 16], std::slice::from_ref(&file))
        .unwrap_err();
    assert!(err.to_string().contains("SET_LOG_BASE"), "{err}");
    for code in [0, 36, 38, 39, 99, u32::MAX] {
        assert!(
            matches!(
                gate.check(code, V1, &[], &[]),
                Err(Refusal::NotServed { .. })
            ),
            "request {code}"
        );
    }
    assert!(gate
        .check(99, V1, &[], &[])
        .unwrap_err()
        .to_string()
        .contains("unknown request 99"));
}

#[test]
fn protocol_gated_requests_need_their_feature_acked() {
    let mut gate = RequestGate::for_device();
    let config = [0u8; 12 + 6];
    assert!(matches!(
        gate.check(GET_CONFIG, V1, &config, &[]),
        Err(Refusal::NotNegotiated {
            feature: "CONFIG",
            ..
        })
    ));
    assert!(matches!(
        gate.check(RESET_DEVICE, V1, &[], &[]),
        Err(Refusal::NotNegotiated {
            feature: "RESET_DEVICE",
            ..
        })
    ));
    let mut gate =
        negotiated(VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::RESET_DEVICE);
    assert_eq!(
        gate.check(GET_CONFIG, V1, &config, &[]).unwrap(),
        Verdict::Forward
    );
    assert_eq!(
        gate.check(RESET_DEVICE, V1, &[], &[]).unwrap(),
        Verdict::Forward
    );
}

#[test]
fn a_reply_or_a_wrong_version_is_refused() {
    let mut gate = RequestGate::for_device();
    for flags in [0, 2, V1 | FLAG_REPLY, V1 | 0x10, V1 | 0x8000_0000] {
        assert!(
            matches!(
                gate.check(GET_PROTOCOL_FEATURES, flags, &[], &[]),
                Err(Refusal::Flags { .. })
            ),
            "flags {flags:#x}"
        );
    }
    assert_eq!(
        gate.check(GET_PROTOCOL_FEATURES, V1 | FLAG_NEED_REPLY, &[], &[])
            .unwrap(),
        Verdict::Forward
    );
}

#[test]
fn a_body_of_the_wrong_size_is_refused() {
    let mut gate = RequestGate::for_device();
    assert!(matches!(
        gate.check(SET_FEATURES, V1, &[0; 4], &[]),
        Err(Refusal::BodySize {
            size: 4,
            expected: 8,
            ..
        })
    ));
    assert!(matches!(
        gate.check(SET_VRING_ADDR, V1, &[0; 8], &[]),
        Err(Refusal::BodySize { expected: 40, .. })
    ));
}

#[test]
fn a_memory_table_carries_one_regular_file_per_region() {
    let mut gate = RequestGate::for_device();
    let (a, b) = (regular_file(), regular_file());
    let table = mem_table(1);
    for files in [
        &[][..],
        &[a.try_clone().unwrap(), b.try_clone().unwrap()][..],
    ] {
        assert!(matches!(
            gate.check(SET_MEM_TABLE, V1, &table, files),
            Err(Refusal::FdCount { expected: 1, .. })
        ));
    }
    let (read, _write) = pipe();
    assert!(matches!(
        gate.check(SET_MEM_TABLE, V1, &table, &[read]),
        Err(Refusal::NotRegularFile { region: 0 })
    ));
    assert_eq!(
        gate.check(SET_MEM_TABLE, V1, &mem_table(2), &[a, b])
            .unwrap(),
        Verdict::Forward
    );
}

#[test]
fn a_memory_table_is_capped_and_its_size_consistent() {
    let mut gate = RequestGate::for_device();
    let files: Vec<File> = (0..9).map(|_| regular_file()).collect();
    assert!(matches!(
        gate.check(SET_MEM_TABLE, V1, &mem_table(9), &files),
        Err(Refusal::RegionCount { regions: 9 })
    ));
    assert!(matches!(
        gate.check(SET_MEM_TABLE, V1, &mem_table(0), &[]),
        Err(Refusal::RegionCount { regions: 0 })
    ));
    let mut short = mem_table(2);
    short.truncate(8 + 32);
    assert!(matches!(
        gate.check(SET_MEM_TABLE, V1, &short, &files[..2]),
        Err(Refusal::BodySize { expected: 72, .. })
    ));
}

#[test]
fn vring_descriptors_follow_the_no_fd_flag() {
    let mut gate = RequestGate::for_device();
    let call = eventfd(0);
    assert!(matches!(
        gate.check(SET_VRING_CALL, V1, &u64_body(0), &[]),
        Err(Refusal::FdCount {
            got: 0,
            expected: 1,
            ..
        })
    ));
    assert!(matches!(
        gate.check(
            SET_VRING_CALL,
            V1,
            &u64_body(0x100),
            std::slice::from_ref(&call)
        ),
        Err(Refusal::FdCount {
            got: 1,
            expected: 0,
            ..
        })
    ));
    assert_eq!(
        gate.check(SET_VRING_CALL, V1, &u64_body(0x101), &[])
            .unwrap(),
        Verdict::Forward
    );
    // Any other request carries no descriptor.
    assert!(matches!(
        gate.check(SET_VRING_NUM, V1, &ring_state(0, 256), &[call]),
        Err(Refusal::FdCount {
            got: 1,
            expected: 0,
            ..
        })
    ));
}

#[test]
fn a_pipe_as_call_fd_is_refused() {
    let mut gate = RequestGate::for_device();
    let (_read, write) = pipe();
    let err = gate
        .check(SET_VRING_CALL, V1, &u64_body(1), &[write])
        .unwrap_err();
    assert!(matches!(err, Refusal::NotEventFd { ref target, .. } if target.starts_with("pipe:")));
}

#[test]
fn an_eventfd_is_accepted_and_made_non_blocking() {
    let mut gate = RequestGate::for_device();
    for request in [SET_VRING_KICK, SET_VRING_CALL] {
        let fd = eventfd(0);
        assert_eq!(status_flags(&fd) & libc::O_NONBLOCK, 0);
        assert_eq!(
            gate.check(request, V1, &u64_body(1), std::slice::from_ref(&fd))
                .unwrap(),
            Verdict::Forward
        );
        assert_ne!(status_flags(&fd) & libc::O_NONBLOCK, 0);
    }
}

#[test]
fn ring_indices_beyond_the_device_are_refused() {
    let mut gate = RequestGate::for_device();
    assert!(matches!(
        gate.check(SET_VRING_NUM, V1, &ring_state(2, 256), &[]),
        Err(Refusal::RingIndex { index: 2, .. })
    ));
    assert!(matches!(
        gate.check(SET_VRING_CALL, V1, &u64_body(0x102), &[]),
        Err(Refusal::RingIndex { index: 2, .. })
    ));
    let mut addr = vec![0u8; 40];
    addr[..4].copy_from_slice(&7u32.to_le_bytes());
    assert!(matches!(
        gate.check(SET_VRING_ADDR, V1, &addr, &[]),
        Err(Refusal::RingIndex { index: 7, .. })
    ));
}

#[test]
fn millions_of_distinct_enable_indices_cannot_grow_the_held_state() {
    let mut gate = RequestGate::for_device();
    for index in 0..2_000_000u32 {
        let verdict = gate.check(SET_VRING_ENABLE, V1, &ring_state(index, 1), &[]);
        if (index as usize) < NUM_QUEUES {
            assert_eq!(verdict.unwrap(), Verdict::Hold { ack: false });
        } else {
            assert!(
                matches!(verdict, Err(Refusal::RingIndex { .. })),
                "ring {index}"
            );
        }
    }
    assert_eq!(gate.held(), NUM_QUEUES);
}

#[test]
fn an_enable_state_other_than_0_or_1_is_refused() {
    let mut gate = RequestGate::for_device();
    assert!(matches!(
        gate.check(SET_VRING_ENABLE, V1, &ring_state(0, 2), &[]),
        Err(Refusal::EnableState { index: 0, state: 2 })
    ));
    assert_eq!(gate.held(), 0);
}

/// QEMU 7.2's start of vhost-user-net: protocol features, owner, call fds, early enables for
/// rings 0 and 1, then features (which replays them), memory table and rings.
#[test]
fn qemu_7_2_order_is_accepted_and_early_enables_replayed() {
    let mut gate = RequestGate::for_device();
    let proto = VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::RESET_DEVICE;
    let mut accept = |request: u32, flags: u32, body: &[u8], files: &[File]| {
        gate.check(request, flags, body, files)
            .unwrap_or_else(|e| panic!("request {request}: {e}"))
    };
    let need = V1 | FLAG_NEED_REPLY;
    assert_eq!(accept(1, V1, &[], &[]), Verdict::Forward); // GET_FEATURES
    assert_eq!(accept(15, V1, &[], &[]), Verdict::Forward);
    assert_eq!(
        accept(16, V1, &u64_body(proto.bits()), &[]),
        Verdict::Forward
    );
    assert_eq!(accept(3, need, &[], &[]), Verdict::Forward); // SET_OWNER
    for ring in 0..2 {
        accept(
            SET_VRING_CALL,
            need,
            &u64_body(ring),
            &[eventfd(libc::O_NONBLOCK)],
        );
    }
    assert_eq!(
        accept(SET_VRING_ENABLE, V1, &ring_state(0, 1), &[]),
        Verdict::Hold { ack: false }
    );
    assert_eq!(
        accept(SET_VRING_ENABLE, need, &ring_state(1, 1), &[]),
        Verdict::Hold { ack: true }
    );
    assert_eq!(
        accept(SET_FEATURES, need, &u64_body(device_features()), &[]),
        Verdict::ForwardThenReplay(vec![
            ring_state(0, 1).try_into().unwrap(),
            ring_state(1, 1).try_into().unwrap()
        ])
    );
    accept(SET_MEM_TABLE, need, &mem_table(1), &[regular_file()]);
    for ring in 0..2u32 {
        accept(SET_VRING_NUM, need, &ring_state(ring, 256), &[]);
        accept(10, need, &ring_state(ring, 0), &[]); // SET_VRING_BASE
        let mut addr = vec![0u8; 40];
        addr[..4].copy_from_slice(&ring.to_le_bytes());
        accept(SET_VRING_ADDR, need, &addr, &[]);
        accept(SET_VRING_KICK, need, &u64_body(ring.into()), &[eventfd(0)]);
        accept(SET_VRING_CALL, need, &u64_body(ring.into()), &[eventfd(0)]);
    }
    // Enables now pass straight through; stopping and resetting are served.
    assert_eq!(
        accept(SET_VRING_ENABLE, need, &ring_state(0, 0), &[]),
        Verdict::Forward
    );
    accept(11, need, &ring_state(0, 0), &[]); // GET_VRING_BASE
    accept(RESET_DEVICE, need, &[], &[]);
    accept(4, need, &[], &[]); // RESET_OWNER
}
