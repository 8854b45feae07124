//! `begin_create`: one test per failure reason, the order of the checks, and the promise that a
//! refused request allocates nothing.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use svnic_channels::layout::{MAX_REGION_LEN, PAGE};
use svnic_channels::{ChannelId, FailureReason};
use svnic_control_plane::{
    ChannelState, ControlPlane, CreateRequest, GuestId, MAX_FAILED_REQUESTS,
};

fn refused(cp: &ControlPlane<u32>, guest: GuestId, r: CreateRequest) -> FailureReason {
    cp.begin_create(guest, &r).unwrap_err()
}

/// Asserts that `guest`'s request `make(v)` is refused with `reason`, for every `v` in `values`.
#[track_caller]
fn assert_each_refused<T: Copy + std::fmt::Debug>(
    cp: &ControlPlane<u32>,
    guest: GuestId,
    values: impl IntoIterator<Item = T>,
    make: impl Fn(T) -> CreateRequest,
    reason: FailureReason,
) {
    for v in values {
        assert_eq!(refused(cp, guest, make(v)), reason, "{v:?}");
    }
}

#[test]
fn a_valid_request_becomes_pending() {
    let (cp, a) = plane_with_guest_a();
    let id = cp.begin_create(a, &req(7, 0)).unwrap();
    assert_eq!(id, ChannelId(1));
    let rec = cp.channel(id).unwrap();
    assert_eq!(rec.state, ChannelState::Pending);
    assert_eq!((rec.guest, rec.guest_name.as_str()), (a, "a"));
    assert_eq!(rec.addr, req(7, 0).addr());
    assert_eq!(
        (rec.ring_size, rec.region_addr, rec.region_len),
        (256, 0, MIB2)
    );
    assert_eq!((rec.worker, rec.cpu, rec.destroying), (None, None, false));
    assert_eq!(cp.guest(a).unwrap().live_channels, vec![id]);
    // Pending channels are not routed.
    assert!(cp.routes().is_empty());
}

#[test]
fn unknown_guest() {
    let (cp, _) = plane_with_guest_a();
    assert_eq!(
        refused(&cp, GuestId(99), req(1, 0)),
        FailureReason::UnknownGuest
    );
}

#[test]
fn mac_not_owned() {
    let (cp, a) = plane_with_guest_a();
    let r = CreateRequest {
        mac: MAC_B,
        ..req(1, 0)
    };
    assert_eq!(refused(&cp, a, r), FailureReason::MacNotOwned);
    // Both of the guest's own MACs are fine.
    cp.begin_create(a, &req(1, 0)).unwrap();
    let r = CreateRequest {
        mac: MAC_A2,
        ..req(1, MIB2)
    };
    cp.begin_create(a, &r).unwrap();
}

#[test]
fn endpoint_out_of_range() {
    let (cp, a) = plane_with(|p| p.endpoints = 10..=20);
    assert_each_refused(
        &cp,
        a,
        [0, 9, 21, u32::MAX],
        |ep| req(ep, 0),
        FailureReason::EndpointOutOfRange,
    );
    cp.begin_create(a, &req(10, 0)).unwrap();
    cp.begin_create(a, &req(20, MIB2)).unwrap();
}

#[test]
fn bad_ring_size() {
    let (cp, a) = plane_with_guest_a();
    assert_each_refused(
        &cp,
        a,
        [0, 8, 100, 8192, u32::MAX],
        |ring_size| CreateRequest {
            ring_size,
            ..req(1, 0)
        },
        FailureReason::BadRingSize,
    );
}

#[test]
fn region_too_small() {
    let (cp, a) = plane_with_guest_a();
    assert_each_refused(
        &cp,
        a,
        [0, PAGE, 4 * PAGE],
        |region_len| CreateRequest {
            region_len,
            ..req(1, 0)
        },
        FailureReason::RegionTooSmall,
    );
}

#[test]
fn region_too_large_for_the_abi() {
    let (cp, a) = plane_with(|p| p.max_region_len = MAX_REGION_LEN);
    let r = CreateRequest {
        region_len: MAX_REGION_LEN + PAGE,
        ..req(1, 0)
    };
    assert_eq!(refused(&cp, a, r), FailureReason::RegionTooLarge);
}

#[test]
fn region_too_large_for_the_policy() {
    let (cp, a) = plane_with(|p| p.max_region_len = MIB2);
    let r = CreateRequest {
        region_len: 2 * MIB2,
        ..req(1, 0)
    };
    assert_eq!(refused(&cp, a, r), FailureReason::RegionTooLarge);
    cp.begin_create(a, &req(1, 0)).unwrap();
}

#[test]
fn region_misaligned() {
    let (cp, a) = plane_with_guest_a();
    // Length not a page multiple (the ABI layout check) ...
    let r = CreateRequest {
        region_len: MIB2 + 1,
        ..req(1, 0)
    };
    assert_eq!(refused(&cp, a, r), FailureReason::RegionMisaligned);
    // ... and address not page aligned.
    assert_each_refused(
        &cp,
        a,
        [1, 0x800, PAGE + 8],
        |addr| req(1, addr),
        FailureReason::RegionMisaligned,
    );
}

#[test]
fn region_outside_memory_when_the_end_overflows() {
    let (cp, a) = plane_with_guest_a();
    let top = u64::MAX - (PAGE - 1); // the last page-aligned address
    assert_eq!(
        refused(&cp, a, req(1, top)),
        FailureReason::RegionOutsideMemory
    );
    assert_eq!(
        refused(&cp, a, req(1, top - MIB2 + 2 * PAGE)),
        FailureReason::RegionOutsideMemory
    );
    // A region ending at the last page boundary is representable: admitted here (whether it is
    // inside guest memory is the engine's memory-table check).
    cp.begin_create(a, &req(1, top - MIB2)).unwrap();
}

#[test]
fn region_overlaps_a_live_channel_of_the_same_guest() {
    let (cp, a) = plane_with_guest_a();
    cp.begin_create(a, &req(1, 4 * MIB2)).unwrap();
    assert_each_refused(
        &cp,
        a,
        [
            3 * MIB2 + PAGE,
            4 * MIB2,
            4 * MIB2 + MIB2 / 2,
            5 * MIB2 - PAGE,
        ],
        |addr| req(2, addr),
        FailureReason::RegionOverlaps,
    );
    // A region containing the other one entirely.
    let r = CreateRequest {
        region_len: 4 * MIB2,
        ..req(2, 3 * MIB2)
    };
    assert_eq!(refused(&cp, a, r), FailureReason::RegionOverlaps);
    // Adjacent regions on either side are fine.
    cp.begin_create(a, &req(2, 3 * MIB2)).unwrap();
    cp.begin_create(a, &req(3, 5 * MIB2)).unwrap();
}

#[test]
fn regions_of_different_guests_may_coincide() {
    let (cp, a) = plane_with_guest_a();
    let b = cp
        .add_guest(svnic_control_plane::GuestPolicy::new("b", MAC_B))
        .unwrap();
    cp.begin_create(a, &req(1, 0)).unwrap();
    cp.begin_create(
        b,
        &CreateRequest {
            mac: MAC_B,
            ..req(1, 0)
        },
    )
    .unwrap();
}

#[test]
fn quota_exceeded() {
    let (cp, a) = plane_with(|p| p.max_channels = 2);
    cp.begin_create(a, &req(1, 0)).unwrap();
    cp.begin_create(a, &req(2, MIB2)).unwrap();
    assert_eq!(
        refused(&cp, a, req(3, 2 * MIB2)),
        FailureReason::QuotaExceeded
    );
}

#[test]
fn endpoint_taken() {
    let (cp, a) = plane_with_guest_a();
    cp.begin_create(a, &req(5, 0)).unwrap();
    assert_eq!(refused(&cp, a, req(5, MIB2)), FailureReason::EndpointTaken);
    // The same endpoint on the guest's other MAC is another address.
    cp.begin_create(
        a,
        &CreateRequest {
            mac: MAC_A2,
            ..req(5, MIB2)
        },
    )
    .unwrap();
}

#[test]
fn checks_run_in_the_documented_order() {
    let (cp, a) = plane_with(|p| {
        p.max_channels = 1;
        p.endpoints = 0..=10;
    });
    cp.begin_create(a, &req(1, 0)).unwrap();
    // Each request fails several checks; the earliest one is reported.
    let everything_wrong = CreateRequest {
        mac: MAC_B,
        endpoint: 99,
        ring_size: 3,
        region_addr: 1,
        region_len: 5,
    };
    let steps = [
        (everything_wrong, FailureReason::MacNotOwned),
        (
            CreateRequest {
                mac: MAC_A,
                ..everything_wrong
            },
            FailureReason::EndpointOutOfRange,
        ),
        (
            CreateRequest {
                mac: MAC_A,
                endpoint: 1,
                ..everything_wrong
            },
            FailureReason::BadRingSize,
        ),
        (
            CreateRequest {
                ring_size: 256,
                region_len: PAGE,
                ..req(1, 1)
            },
            FailureReason::RegionTooSmall,
        ),
        (
            CreateRequest {
                region_len: 128 << 20,
                ..req(1, 1)
            },
            FailureReason::RegionTooLarge,
        ),
        (req(1, 1), FailureReason::RegionMisaligned),
        (
            req(1, u64::MAX - (PAGE - 1)),
            FailureReason::RegionOutsideMemory,
        ),
        (req(1, 0), FailureReason::RegionOverlaps),
        (req(1, MIB2), FailureReason::QuotaExceeded),
    ];
    for (r, reason) in steps {
        assert_eq!(refused(&cp, a, r), reason, "{r}");
    }
    // Overlap before quota before endpoint: with quota left, the taken endpoint is reported.
    let (cp, a) = plane_with_guest_a();
    cp.begin_create(a, &req(1, 0)).unwrap();
    assert_eq!(refused(&cp, a, req(1, 0)), FailureReason::RegionOverlaps);
    assert_eq!(refused(&cp, a, req(1, MIB2)), FailureReason::EndpointTaken);
}

#[test]
fn a_refused_request_allocates_nothing() {
    let (cp, a) = plane_with(|p| {
        p.max_channels = 2;
        p.endpoints = 0..=10;
        p.max_region_len = 4 * MIB2;
    });
    let first = cp.begin_create(a, &req(1, 0)).unwrap();
    cp.complete_create(first, 100, 0, Some(3)).unwrap();
    let second = cp.begin_create(a, &req(2, MIB2)).unwrap();
    cp.fail_create(second, FailureReason::RegionOutsideMemory)
        .unwrap();

    let channels = cp.channels();
    let guest = cp.guest(a).unwrap();
    let generation = cp.routes().generation();
    let routes = cp.routes().load().sorted();

    let bad = [
        (GuestId(42), req(3, 4 * MIB2)),
        (
            a,
            CreateRequest {
                mac: MAC_B,
                ..req(3, 4 * MIB2)
            },
        ),
        (a, req(11, 4 * MIB2)),
        (
            a,
            CreateRequest {
                ring_size: 7,
                ..req(3, 4 * MIB2)
            },
        ),
        (
            a,
            CreateRequest {
                region_len: PAGE,
                ..req(3, 4 * MIB2)
            },
        ),
        (
            a,
            CreateRequest {
                region_len: 8 * MIB2,
                ..req(3, 4 * MIB2)
            },
        ),
        (a, req(3, 4 * MIB2 + 16)),
        (a, req(3, u64::MAX - (PAGE - 1))),
        (a, req(3, 0)),
        (a, req(1, 4 * MIB2)),
    ];
    let mut reasons = Vec::new();
    for (guest_id, r) in bad {
        reasons.push(cp.begin_create(guest_id, &r).unwrap_err());
    }
    // The channel whose create failed freed its endpoint and quota; fill the quota.
    let third = cp.begin_create(a, &req(2, 2 * MIB2)).unwrap();
    let quota = cp.begin_create(a, &req(3, 6 * MIB2)).unwrap_err();
    reasons.push(quota);
    assert_eq!(quota, FailureReason::QuotaExceeded);
    assert_eq!(reasons.len(), 11);
    assert!(reasons.contains(&FailureReason::EndpointTaken));

    // Nothing changed but the new channel, which got the next id: refusals consumed no id.
    assert_eq!(third, ChannelId(second.0 + 1));
    let mut after = cp.channels();
    assert_eq!(after.pop().map(|c| c.id), Some(third));
    assert_eq!(after, channels);
    let mut guest_after = cp.guest(a).unwrap();
    guest_after.live_channels.retain(|c| *c != third);
    assert_eq!(guest_after, guest);
    assert_eq!(cp.routes().generation(), generation);
    assert_eq!(cp.routes().load().sorted(), routes);

    // Every refusal is in the operator log, with the engine's own failure first.
    let log = cp.failed_requests();
    assert_eq!(log.len(), 1 + reasons.len());
    assert_eq!(log[0].channel, Some(second));
    assert_eq!(log[0].reason, FailureReason::RegionOutsideMemory);
    assert_eq!(log[1].guest, GuestId(42));
    assert_eq!(log[1].guest_name, None);
    assert_eq!(log[2].guest_name.as_deref(), Some("a"));
    let logged: Vec<_> = log[1..].iter().map(|f| f.reason).collect();
    assert_eq!(logged, reasons);
    assert!(log[1..].iter().all(|f| f.channel.is_none()));
}

#[test]
fn the_failed_request_log_is_bounded() {
    let (cp, a) = plane_with(|p| p.create_burst = 1000);
    for ep in 0..(MAX_FAILED_REQUESTS as u32 + 10) {
        let r = CreateRequest {
            ring_size: 1,
            ..req(ep, 0)
        };
        cp.begin_create(a, &r).unwrap_err();
    }
    let log = cp.failed_requests();
    assert_eq!(log.len(), MAX_FAILED_REQUESTS);
    // Oldest dropped first.
    assert_eq!(log[0].request.endpoint, 10);
}
