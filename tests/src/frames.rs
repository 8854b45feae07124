//! Ethernet frames and addresses for tests.

use svnic_channels::frame::{ControlOp, ControlRequest, CreateRequest, Frame, FrameBody};
use svnic_channels::MacAddr;

/// A locally administered MAC address in test range `range` (a per-suite byte, so that suites
/// sharing a daemon never collide), number `n`: `52:54:00:<range>:e0:<n>`.
pub fn mac_in(range: u8, n: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0x00, range, 0xe0, n])
}

/// An Ethernet frame: `dst`, `src`, `ethertype`, then `payload`.
pub fn eth(dst: MacAddr, src: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A payload whose bytes depend on `seed` and position, to check frames arrive intact.
pub fn payload(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The encoded svnic frame `body` from `src` to `dst`.
pub fn svnic_frame(src: MacAddr, dst: MacAddr, body: FrameBody<'_>) -> Vec<u8> {
    let frame = Frame { dst, src, body };
    frame
        .encode()
        .unwrap_or_else(|e| panic!("encoding {frame:?}: {e:?}"))
}

/// The encoded frame of control request `request_id` from `src` to the engine.
pub fn control_request(src: MacAddr, request_id: u32, op: ControlOp) -> Vec<u8> {
    let body = FrameBody::ControlRequest(ControlRequest { request_id, op });
    svnic_frame(src, MacAddr::ENGINE, body)
}

/// A create-channel operation.
pub fn create_op(
    mac: MacAddr,
    endpoint: u32,
    ring_size: u32,
    region_addr: u64,
    region_len: u64,
) -> ControlOp {
    ControlOp::Create(CreateRequest {
        mac,
        endpoint,
        ring_size,
        region_addr,
        region_len,
    })
}
