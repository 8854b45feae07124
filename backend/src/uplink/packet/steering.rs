//! Steering of uplink frames to engine workers: the classic BPF program a fanout group runs
//! (PACKET_FANOUT_CBPF) and its definition in Rust, which the engine's placement uses.
//!
//! The rule, for a group of `workers` sockets:
//! - an svnic frame (EtherType 0x88B5, version 1) of a type that comes from the wire (3 data,
//!   6 ack, 7 bundle) goes to `dst_endpoint % workers`, `dst_endpoint` being the little-endian u32 at
//!   frame offset 22 ([`worker_of_endpoint`]): every frame of an endpoint reaches the worker
//!   serving its channel;
//! - any other frame (virtio-net traffic for guests, svnic frames of other types or versions)
//!   goes to the last four bytes of its destination MAC, read as a big-endian u32,
//!   `% workers`: all frames for one guest MAC reach one worker, in order, and distinct guests
//!   spread over the workers;
//! - a frame too short to hold the fields the rule reads goes to worker 0.
//!
//! [`steered_worker`] is that rule in Rust; the unit tests run the program in a cBPF interpreter
//! and check that both agree.

use libc::sock_filter;

use svnic_channels::frame::FrameType;

/// EtherType of svnic frames (docs/abi.md §7).
pub const SVNIC_ETHERTYPE: u16 = svnic_channels::frame::ETHERTYPE;
/// The svnic frame version the program steers by endpoint.
pub const SVNIC_VERSION: u8 = svnic_channels::frame::FRAME_VERSION;
/// Frame type of a data frame.
pub const TYPE_DATA: u8 = FrameType::Data as u8;
/// Frame type of an acknowledgement.
pub const TYPE_ACK: u8 = FrameType::Ack as u8;
/// Frame type of a bundle of small messages.
pub const TYPE_BUNDLE: u8 = FrameType::Bundle as u8;
/// Frame offset of the destination endpoint (u32, little-endian) in data, ack and bundle
/// frames.
pub const DST_ENDPOINT_OFFSET: usize = svnic_channels::frame::DST_ENDPOINT_OFFSET;

/// Base of the cBPF load offsets relative to the frame's link-layer (Ethernet) header
/// (`SKF_LL_OFF` in linux/filter.h). A fanout program runs on the skb with its data pointing
/// at the network header, so plain offsets would start after the Ethernet header; loads
/// relative to this base see the whole frame as received (VLAN tags already moved to
/// metadata by the kernel). A load beyond the frame ends the program with 0.
const SKF_LL_OFF: u32 = (-0x20_0000_i32) as u32;

// Classic BPF opcodes (linux/bpf_common.h, linux/filter.h).
const BPF_LD: u16 = 0x00;
const BPF_ALU: u16 = 0x04;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_MISC: u16 = 0x07;
const BPF_W: u16 = 0x00;
const BPF_H: u16 = 0x08;
const BPF_B: u16 = 0x10;
const BPF_ABS: u16 = 0x20;
const BPF_K: u16 = 0x00;
const BPF_X: u16 = 0x08;
const BPF_A: u16 = 0x10;
const BPF_OR: u16 = 0x40;
const BPF_LSH: u16 = 0x60;
const BPF_MOD: u16 = 0x90;
const BPF_JEQ: u16 = 0x10;
const BPF_TAX: u16 = 0x00;

/// The worker serving `endpoint` in a group of `workers` (`endpoint % workers`; 0 when
/// `workers` is 0). The single definition of endpoint placement: the engine places channels
/// with it and [`steering_program`] steers frames with it.
pub fn worker_of_endpoint(endpoint: u32, workers: usize) -> usize {
    match u32::try_from(workers) {
        Ok(0) => 0,
        Ok(w) => (endpoint % w) as usize,
        // More workers than endpoints: every endpoint is its own worker.
        Err(_) => endpoint as usize,
    }
}

/// The worker [`steering_program`] picks for `frame` (the whole Ethernet frame as received,
/// without VLAN tags) in a group of `workers` sockets: the rule of the module documentation.
pub fn steered_worker(frame: &[u8], workers: u16) -> usize {
    let workers = u32::from(workers.max(1));
    let byte = |i: usize| frame.get(i).copied();
    let le_u32 = |at: usize| {
        let b = frame.get(at..at + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let ethertype = frame.get(12..14).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let Some(ethertype) = ethertype else {
        return 0;
    };
    if ethertype == SVNIC_ETHERTYPE {
        let (Some(version), Some(kind)) = (byte(14), byte(15)) else {
            return 0;
        };
        if version == SVNIC_VERSION && [TYPE_DATA, TYPE_ACK, TYPE_BUNDLE].contains(&kind) {
            return match le_u32(DST_ENDPOINT_OFFSET) {
                Some(endpoint) => worker_of_endpoint(endpoint, workers as usize),
                None => 0,
            };
        }
    }
    // The frame is at least 14 bytes long here, so the MAC bytes 2..6 are present.
    let mac_tail = u32::from_be_bytes([frame[2], frame[3], frame[4], frame[5]]);
    (mac_tail % workers) as usize
}

/// The classic BPF program of a fanout group of `workers` sockets (`PACKET_FANOUT_DATA`): it
/// returns the index of the member that receives a frame, by the rule of the module
/// documentation ([`steered_worker`]). `workers` 0 is taken as 1.
///
/// The endpoint is little-endian and `BPF_LD|BPF_W` loads big-endian, so the program
/// assembles it byte by byte, most significant (offset 25) first.
pub fn steering_program(workers: u16) -> Vec<sock_filter> {
    let workers = u32::from(workers.max(1));
    let ll = |offset: usize| SKF_LL_OFF + offset as u32;
    let mut p = vec![
        // 0: EtherType; 1: not svnic -> OTHER (23).
        stmt(BPF_LD | BPF_H | BPF_ABS, ll(12)),
        jeq(u32::from(SVNIC_ETHERTYPE), 0, 21),
        // 2: version; 3: not 1 -> OTHER.
        stmt(BPF_LD | BPF_B | BPF_ABS, ll(14)),
        jeq(u32::from(SVNIC_VERSION), 0, 19),
        // 4: type; 5: data -> ENDPOINT (8); 6: ack -> ENDPOINT; 7: not bundle -> OTHER.
        stmt(BPF_LD | BPF_B | BPF_ABS, ll(15)),
        jeq(u32::from(TYPE_DATA), 2, 0),
        jeq(u32::from(TYPE_ACK), 1, 0),
        jeq(u32::from(TYPE_BUNDLE), 0, 15),
    ];
    // 8..=20: ENDPOINT, A = u32 LE at offset 22, built from byte 25 down to byte 22.
    p.push(stmt(BPF_LD | BPF_B | BPF_ABS, ll(DST_ENDPOINT_OFFSET + 3)));
    for byte in (0..3).rev() {
        p.push(stmt(BPF_ALU | BPF_LSH | BPF_K, 8));
        p.push(stmt(BPF_MISC | BPF_TAX, 0));
        p.push(stmt(
            BPF_LD | BPF_B | BPF_ABS,
            ll(DST_ENDPOINT_OFFSET + byte),
        ));
        p.push(stmt(BPF_ALU | BPF_OR | BPF_X, 0));
    }
    // 21, 22: A % workers.
    p.push(stmt(BPF_ALU | BPF_MOD | BPF_K, workers));
    p.push(stmt(BPF_RET | BPF_A, 0));
    // 23..=25: OTHER, the last four bytes of the destination MAC % workers.
    p.push(stmt(BPF_LD | BPF_W | BPF_ABS, ll(2)));
    p.push(stmt(BPF_ALU | BPF_MOD | BPF_K, workers));
    p.push(stmt(BPF_RET | BPF_A, 0));
    p
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jeq(k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: BPF_JMP | BPF_JEQ | BPF_K,
        jt,
        jf,
        k,
    }
}

#[cfg(test)]
mod tests;
