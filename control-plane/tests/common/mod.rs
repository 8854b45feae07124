//! Helpers shared by the control-plane integration tests.
#![allow(dead_code)]

use svnic_channels::layout::DEFAULT_REGION_LEN;
use svnic_channels::{EndpointId, MacAddr};
use svnic_control_plane::{ControlPlane, CreateRequest, GuestId, GuestPolicy};

pub const MAC_A: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0xa]);
pub const MAC_A2: MacAddr = MacAddr([0x52, 0x54, 0, 0, 1, 0xa]);
pub const MAC_B: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0xb]);
pub const MIB2: u64 = DEFAULT_REGION_LEN;

/// A valid request on MAC_A: 256 slots, 2 MiB at `region_addr`.
pub fn req(endpoint: EndpointId, region_addr: u64) -> CreateRequest {
    CreateRequest {
        mac: MAC_A,
        endpoint,
        ring_size: 256,
        region_addr,
        region_len: MIB2,
    }
}

/// A control plane with guest "a" owning MAC_A and MAC_A2, with default policy otherwise.
pub fn plane_with_guest_a() -> (ControlPlane<u32>, GuestId) {
    plane_with(|_| {})
}

/// A control plane with guest "a" whose default policy `tweak` adjusts.
pub fn plane_with(tweak: impl FnOnce(&mut GuestPolicy)) -> (ControlPlane<u32>, GuestId) {
    let cp = ControlPlane::new();
    let mut p = GuestPolicy::new("a", MAC_A);
    p.macs.push(MAC_A2);
    tweak(&mut p);
    let id = cp.add_guest(p).expect("valid policy");
    (cp, id)
}
