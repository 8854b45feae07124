//! Random sequences of control-plane calls, checking after every call the invariants that the
//! data path and the trust boundary rely on.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashSet};

use proptest::prelude::*;
use svnic_channels::layout::PAGE;
use svnic_channels::{ChannelId, FailureReason, MacAddr};
use svnic_control_plane::{ChannelState, ControlPlane, CreateRequest, GuestId, GuestPolicy};

const MACS: [MacAddr; 3] = [
    MacAddr([0x52, 0x54, 0, 0, 0, 0]),
    MacAddr([0x52, 0x54, 0, 0, 0, 1]),
    MacAddr([0x52, 0x54, 0, 0, 0, 2]), // owned by nobody
];
const MAX_CHANNELS: u32 = 3;

#[derive(Clone, Debug)]
enum Op {
    Create {
        guest: usize,
        mac: usize,
        endpoint: u32,
        ring_size: u32,
        page: u64,
        misalign: bool,
        pages: u64,
    },
    Complete(usize),
    Fail(usize),
    BeginDestroy(Option<usize>, usize),
    FinishDestroy(usize),
    RemoveGuest(usize),
    AddGuest(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 0..3usize, 0..12u32, prop::sample::select(vec![16u32, 32, 256, 3]),
              0..16u64, prop::bool::weighted(0.05), prop::sample::select(vec![0u64, 1, 2, 3, 4, 20]))
            .prop_map(|(guest, mac, endpoint, ring_size, page, misalign, pages)| Op::Create {
                guest, mac, endpoint, ring_size, page, misalign, pages
            }),
        2 => any::<usize>().prop_map(Op::Complete),
        1 => any::<usize>().prop_map(Op::Fail),
        2 => (prop::option::of(0..2usize), any::<usize>()).prop_map(|(g, i)| Op::BeginDestroy(g, i)),
        2 => any::<usize>().prop_map(Op::FinishDestroy),
        1 => (0..2usize).prop_map(Op::RemoveGuest),
        1 => (0..2usize).prop_map(Op::AddGuest),
    ]
}

fn policy(slot: usize) -> GuestPolicy {
    let mut p = GuestPolicy::new(format!("g{slot}"), MACS[slot]);
    p.endpoints = 0..=9;
    p.max_channels = MAX_CHANNELS;
    p.max_region_len = 16 * PAGE;
    p
}

fn check_invariants(cp: &ControlPlane<ChannelId>, registered: &[Option<GuestId>; 2]) {
    let records = cp.channels();
    let live: Vec<_> = records.iter().filter(|c| c.is_live()).collect();
    // One live channel per address.
    let addrs: HashSet<_> = live.iter().map(|c| c.addr).collect();
    assert_eq!(addrs.len(), live.len(), "address reserved twice: {live:?}");
    for (i, c) in live.iter().enumerate() {
        // Quota, and no overlap within a guest.
        let same_guest: Vec<_> = live.iter().filter(|o| o.guest == c.guest).collect();
        assert!(same_guest.len() <= MAX_CHANNELS as usize);
        for o in &live[i + 1..] {
            if o.guest == c.guest {
                let overlap = c.region_addr < o.region_end() && o.region_addr < c.region_end();
                assert!(!overlap, "{c:?} overlaps {o:?}");
            }
        }
        assert_eq!(c.region_addr % PAGE, 0);
        assert!(c.region_addr.checked_add(c.region_len).is_some());
    }
    // Routes are exactly the Success channels not being destroyed, with their own payload.
    let expected: BTreeSet<_> = live
        .iter()
        .filter(|c| c.state == ChannelState::Success && !c.destroying)
        .map(|c| (c.addr, c.id))
        .collect();
    let snapshot = cp.routes().load();
    let routed: BTreeSet<_> = snapshot.sorted().into_iter().collect();
    assert_eq!(routed, expected);
    for (addr, (id, payload)) in snapshot.iter() {
        assert_eq!(id, payload, "payload of another channel at {addr}");
    }
    // Each registered guest lists exactly its live channels, and owns its MAC.
    for (slot, id) in registered.iter().enumerate() {
        let Some(id) = id else { continue };
        let info = cp.guest(*id).unwrap();
        let mine: Vec<_> = live
            .iter()
            .filter(|c| c.guest == *id)
            .map(|c| c.id)
            .collect();
        assert_eq!(info.live_channels, mine);
        assert_eq!(cp.guest_by_mac(MACS[slot]), Some(*id));
    }
    assert_eq!(cp.guest_by_mac(MACS[2]), None);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_any_sequence(ops in prop::collection::vec(op(), 1..80)) {
        let cp: ControlPlane<ChannelId> = ControlPlane::new();
        let mut registered = [None, None];
        let mut last_known = [GuestId(0), GuestId(0)];
        for slot in 0..2 {
            let id = cp.add_guest(policy(slot)).unwrap();
            registered[slot] = Some(id);
            last_known[slot] = id;
        }
        let mut created: Vec<ChannelId> = Vec::new();
        let pick = |created: &Vec<ChannelId>, i: usize| created.get(i % created.len().max(1)).copied();

        for op in ops {
            match op {
                Op::Create { guest, mac, endpoint, ring_size, page, misalign, pages } => {
                    let r = CreateRequest {
                        mac: MACS[mac],
                        endpoint,
                        ring_size,
                        region_addr: page * PAGE + u64::from(misalign) * 64,
                        region_len: pages * PAGE,
                    };
                    let before = cp.channels();
                    match cp.begin_create(last_known[guest], &r) {
                        Ok(id) => {
                            prop_assert!(created.last().is_none_or(|l| id > *l));
                            created.push(id);
                        }
                        Err(reason) => {
                            // A refusal allocates nothing.
                            prop_assert_eq!(cp.channels(), before);
                            if registered[guest].is_none() {
                                prop_assert_eq!(reason, FailureReason::UnknownGuest);
                            }
                            if mac != guest {
                                prop_assert_ne!(reason, FailureReason::EndpointTaken);
                            }
                        }
                    }
                }
                Op::Complete(i) => {
                    if let Some(id) = pick(&created, i) {
                        let _ = cp.complete_create(id, id, 0, None);
                    }
                }
                Op::Fail(i) => {
                    if let Some(id) = pick(&created, i) {
                        let _ = cp.fail_create(id, FailureReason::RegionOutsideMemory);
                    }
                }
                Op::BeginDestroy(guest, i) => {
                    if let Some(id) = pick(&created, i) {
                        let requester = guest.map(|g| last_known[g]);
                        let owner = cp.channel(id).map(|c| c.guest);
                        if let Ok(t) = cp.begin_destroy(requester, id) {
                            // Only the owner (or the operator) may begin it.
                            prop_assert!(requester.is_none() || requester == owner);
                            prop_assert_eq!(t.record.id, id);
                            prop_assert!(t.payload.is_none_or(|p| p == id));
                        }
                    }
                }
                Op::FinishDestroy(i) => {
                    if let Some(id) = pick(&created, i) {
                        let _ = cp.finish_destroy(id);
                    }
                }
                Op::RemoveGuest(slot) => {
                    if let Some(id) = registered[slot].take() {
                        let teardowns = cp.remove_guest(id).unwrap();
                        for t in teardowns {
                            prop_assert_eq!(t.record.guest, id);
                            cp.finish_destroy(t.record.id).unwrap();
                        }
                    }
                }
                Op::AddGuest(slot) => {
                    // Refused while the slot's guest (name and MAC) is registered.
                    match cp.add_guest(policy(slot)) {
                        Ok(id) => {
                            prop_assert!(registered[slot].is_none());
                            registered[slot] = Some(id);
                            last_known[slot] = id;
                        }
                        Err(_) => prop_assert!(registered[slot].is_some()),
                    }
                }
            }
            check_invariants(&cp, &registered);
        }
    }
}
