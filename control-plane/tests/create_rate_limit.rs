//! The per-guest create-rate limit, on a clock the tests move by hand.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use svnic_control_plane::manual_clock::ManualClock;

use common::*;
use svnic_channels::FailureReason;
use svnic_control_plane::{ControlPlane, CreateRequest, GuestId, GuestPolicy};

/// Guests "a" (MAC_A, policy tweaked by `tweak_a`) and "b" (MAC_B, defaults) on `clock`.
fn plane(
    clock: &ManualClock,
    tweak_a: impl FnOnce(&mut GuestPolicy),
) -> (ControlPlane<u32>, GuestId, GuestId) {
    let c = clock.clone();
    let cp = ControlPlane::with_clock(move || c.now());
    let mut pa = GuestPolicy::new("a", MAC_A);
    tweak_a(&mut pa);
    let a = cp.add_guest(pa).unwrap();
    let b = cp.add_guest(GuestPolicy::new("b", MAC_B)).unwrap();
    (cp, a, b)
}

/// A request refused by admission (MAC not owned), so that it reserves nothing either way.
fn refused_anyway(endpoint: u32) -> CreateRequest {
    CreateRequest {
        mac: MAC_B,
        ..req(endpoint, 0)
    }
}

#[test]
fn every_request_takes_a_token_and_past_the_burst_creates_are_refused_until_one_returns() {
    let clock = ManualClock::new();
    let (cp, a, _) = plane(&clock, |_| {});
    // The default burst: 64 requests back to back, refused ones included.
    for i in 0..64 {
        assert_eq!(
            cp.begin_create(a, &refused_anyway(i)),
            Err(FailureReason::MacNotOwned)
        );
    }
    let valid = req(1, 0);
    assert_eq!(cp.begin_create(a, &valid), Err(FailureReason::RateLimited));
    assert!(
        cp.channels().is_empty(),
        "a limited request reserves nothing"
    );
    let last = cp.failed_requests().pop().unwrap();
    assert_eq!(
        (last.reason, last.request),
        (FailureReason::RateLimited, valid)
    );

    // 200/s: one token every 5 ms.
    clock.advance(Duration::from_millis(4));
    assert_eq!(cp.begin_create(a, &valid), Err(FailureReason::RateLimited));
    clock.advance(Duration::from_millis(1));
    let id = cp.begin_create(a, &valid).unwrap();
    assert_eq!(cp.channel(id).unwrap().addr, valid.addr());
    assert_eq!(
        cp.begin_create(a, &req(2, 4 * MIB2)),
        Err(FailureReason::RateLimited)
    );
}

#[test]
fn the_rate_limit_is_checked_before_anything_but_the_guest() {
    let clock = ManualClock::new();
    let (cp, a, _) = plane(&clock, |p| p.create_burst = 1);
    cp.begin_create(a, &req(1, 0)).unwrap();
    // With no token left, an otherwise refused request reports the rate limit...
    assert_eq!(
        cp.begin_create(a, &refused_anyway(2)),
        Err(FailureReason::RateLimited)
    );
    // ... and an unknown guest is still unknown.
    assert_eq!(
        cp.begin_create(GuestId(99), &req(3, 0)),
        Err(FailureReason::UnknownGuest)
    );
}

#[test]
fn the_policy_sets_burst_and_rate() {
    let clock = ManualClock::new();
    let (cp, a, _) = plane(&clock, |p| {
        p.create_burst = 2;
        p.creates_per_sec = 1;
    });
    let outcomes = |cp: &ControlPlane<u32>, n: u32| -> Vec<FailureReason> {
        (0..n)
            .map(|i| cp.begin_create(a, &refused_anyway(i)).unwrap_err())
            .collect()
    };
    use FailureReason::{MacNotOwned as Admitted, RateLimited as Limited};
    assert_eq!(outcomes(&cp, 3), [Admitted, Admitted, Limited]);
    clock.advance(Duration::from_millis(999));
    assert_eq!(outcomes(&cp, 1), [Limited]);
    clock.advance(Duration::from_millis(1));
    assert_eq!(outcomes(&cp, 2), [Admitted, Limited]);
    // Idle for a minute: back to a full burst of 2, not 60.
    clock.advance(Duration::from_secs(60));
    assert_eq!(outcomes(&cp, 3), [Admitted, Admitted, Limited]);
}

#[test]
fn one_guest_spending_its_budget_leaves_another_guests_untouched() {
    let clock = ManualClock::new();
    let (cp, a, b) = plane(&clock, |_| {});
    for i in 0..1000 {
        let _ = cp.begin_create(a, &refused_anyway(i));
    }
    assert_eq!(
        cp.begin_create(a, &req(1, 0)),
        Err(FailureReason::RateLimited)
    );
    let b_req = CreateRequest {
        mac: MAC_B,
        ..req(1, 0)
    };
    for i in 0..64 {
        let id = cp
            .begin_create(
                b,
                &CreateRequest {
                    endpoint: i,
                    region_addr: u64::from(i) * MIB2,
                    ..b_req
                },
            )
            .unwrap_or_else(|r| panic!("B's create {i} refused: {r}"));
        cp.fail_create(id, FailureReason::RegionOutsideMemory)
            .unwrap();
    }
}
