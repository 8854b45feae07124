//! The steering program, run by a small classic BPF interpreter with the kernel's semantics for
//! the instructions it uses, against [`worker_of_endpoint`] and [`steered_worker`].

use super::*;

/// Runs `prog` on `frame` the way a fanout group does: loads are relative to the link-layer
/// header (`SKF_LL_OFF`), a load beyond the frame ends the program with 0, and the kernel
/// reduces the result modulo the number of members (`fanout_demux_bpf`).
fn run(prog: &[sock_filter], frame: &[u8], members: u32) -> u32 {
    let (mut a, mut x) = (0u32, 0u32);
    let mut pc = 0usize;
    let load = |k: u32, size: usize| -> Option<u32> {
        let at = k.checked_sub(SKF_LL_OFF)? as usize;
        let bytes = frame.get(at..at + size)?;
        Some(bytes.iter().fold(0u32, |v, &b| (v << 8) | u32::from(b)))
    };
    loop {
        let insn = prog.get(pc).expect("the program ran off its end");
        pc += 1;
        match insn.code {
            c if c == BPF_LD | BPF_W | BPF_ABS => match load(insn.k, 4) {
                Some(v) => a = v,
                None => return 0,
            },
            c if c == BPF_LD | BPF_H | BPF_ABS => match load(insn.k, 2) {
                Some(v) => a = v,
                None => return 0,
            },
            c if c == BPF_LD | BPF_B | BPF_ABS => match load(insn.k, 1) {
                Some(v) => a = v,
                None => return 0,
            },
            c if c == BPF_ALU | BPF_LSH | BPF_K => a <<= insn.k,
            c if c == BPF_ALU | BPF_OR | BPF_X => a |= x,
            c if c == BPF_ALU | BPF_MOD | BPF_K => {
                assert_ne!(insn.k, 0, "the kernel refuses a modulo by 0");
                a %= insn.k;
            }
            c if c == BPF_MISC | BPF_TAX => x = a,
            c if c == BPF_JMP | BPF_JEQ | BPF_K => {
                let skip = if a == insn.k { insn.jt } else { insn.jf };
                pc += usize::from(skip);
            }
            c if c == BPF_RET | BPF_A => return a % members,
            other => panic!("instruction {other:#x} is not modelled"),
        }
    }
}

/// An svnic frame of `kind` to `endpoint`, `len` bytes long (at least 26).
fn svnic(kind: u8, endpoint: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(26)];
    f[..6].copy_from_slice(&[0x52, 0x54, 0x00, 0xab, 0xcd, 0xef]);
    f[6..12].copy_from_slice(&[0x52, 0x54, 0x00, 0x01, 0x02, 0x03]);
    f[12..14].copy_from_slice(&SVNIC_ETHERTYPE.to_be_bytes());
    f[14] = SVNIC_VERSION;
    f[15] = kind;
    f[18..22].copy_from_slice(&0xdead_beef_u32.to_le_bytes());
    f[22..26].copy_from_slice(&endpoint.to_le_bytes());
    f
}

const ENDPOINTS: [u32; 8] = [0, 1, 2, 3, 7, 1 << 31, u32::MAX - 1, u32::MAX];

#[test]
fn data_ack_and_bundle_frames_go_to_their_endpoints_worker() {
    for workers in 1..=8u16 {
        let prog = steering_program(workers);
        for kind in [TYPE_DATA, TYPE_ACK, TYPE_BUNDLE] {
            for endpoint in ENDPOINTS {
                for len in [26, 60, 1514] {
                    let frame = svnic(kind, endpoint, len);
                    let want = worker_of_endpoint(endpoint, usize::from(workers));
                    assert_eq!(want, (endpoint % u32::from(workers)) as usize);
                    assert_eq!(
                        run(&prog, &frame, u32::from(workers)) as usize,
                        want,
                        "type {kind}, endpoint {endpoint}, {workers} workers, {len} bytes"
                    );
                    assert_eq!(steered_worker(&frame, workers), want);
                }
            }
        }
    }
}

#[test]
fn endpoint_bytes_are_read_little_endian() {
    // Endpoint 1 is bytes 01 00 00 00: 1 % 6 = 1, where a big-endian reading (2^24) gives 4.
    let frame = svnic(TYPE_DATA, 1, 60);
    assert_eq!(run(&steering_program(6), &frame, 6), 1);
    let frame = svnic(TYPE_DATA, 1 << 24, 60);
    assert_eq!(run(&steering_program(6), &frame, 6), 4);
}

#[test]
fn other_frames_go_by_destination_mac_and_agree_with_the_rust_rule() {
    let mut frames = Vec::new();
    // svnic frames of types that never come from the wire, and of another version.
    for kind in [0, 1, 2, 4, 5, 8, 255] {
        frames.push(svnic(kind, 5, 60));
    }
    let mut v2 = svnic(TYPE_DATA, 5, 60);
    v2[14] = 2;
    frames.push(v2);
    // IPv4, ARP, VLAN-looking and broadcast frames.
    for (ethertype, dst) in [
        (0x0800u16, [0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
        (0x0806, [0xff; 6]),
        (0x8100, [0x52, 0x54, 0x00, 0x00, 0x00, 0x07]),
        (0x86dd, [0x33, 0x33, 0x00, 0x00, 0x00, 0x01]),
    ] {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&dst);
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        frames.push(f);
    }
    for workers in 1..=8u16 {
        let prog = steering_program(workers);
        for frame in &frames {
            let mac_tail = u32::from_be_bytes([frame[2], frame[3], frame[4], frame[5]]);
            let want = (mac_tail % u32::from(workers)) as usize;
            assert_eq!(steered_worker(frame, workers), want, "{frame:02x?}");
            assert_eq!(
                run(&prog, frame, u32::from(workers)) as usize,
                want,
                "{workers} workers, {frame:02x?}"
            );
        }
    }
}

#[test]
fn frames_too_short_for_the_fields_go_to_worker_0() {
    let full = svnic(TYPE_DATA, 7, 26);
    let mut short_frames: Vec<Vec<u8>> = (0..26).map(|len| full[..len].to_vec()).collect();
    short_frames.push(Vec::new());
    for workers in 1..=8u16 {
        let prog = steering_program(workers);
        for frame in &short_frames {
            // Prefixes of an svnic frame: too short for the EtherType, the header or the
            // endpoint.
            let want = steered_worker(frame, workers);
            assert_eq!(
                run(&prog, frame, u32::from(workers)) as usize,
                want,
                "{workers} workers, {} bytes",
                frame.len()
            );
            if frame.len() < 26 {
                assert_eq!(want, 0, "{} bytes", frame.len());
            }
        }
    }
}

#[test]
fn zero_workers_are_taken_as_one() {
    assert_eq!(worker_of_endpoint(u32::MAX, 0), 0);
    assert_eq!(steered_worker(&svnic(TYPE_DATA, 9, 60), 0), 0);
    let prog = steering_program(0);
    let code = |p: &[sock_filter]| -> Vec<(u16, u8, u8, u32)> {
        p.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect()
    };
    assert_eq!(code(&prog), code(&steering_program(1)));
}

#[test]
fn every_jump_stays_inside_the_program_and_it_ends_in_returns() {
    for workers in [1u16, 2, 3, 8, u16::MAX] {
        let prog = steering_program(workers);
        for (i, insn) in prog.iter().enumerate() {
            if insn.code == BPF_JMP | BPF_JEQ | BPF_K {
                assert!(i + 1 + usize::from(insn.jt.max(insn.jf)) < prog.len());
            }
        }
        assert_eq!(prog.last().map(|i| i.code), Some(BPF_RET | BPF_A));
    }
}
