//! Create, complete, fail and destroy flows; guests and their MACs; concurrency.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Barrier};
use std::thread;

use common::*;
use svnic_channels::{ChannelAddr, ChannelId, FailureReason};
use svnic_control_plane::{
    ChannelState, ControlError, ControlPlane, CreateRequest, GuestPolicy, LifecycleEvent,
    PolicyError, TransitionError, MAX_TERMINAL_RECORDS,
};

#[test]
fn complete_create_binds_the_route() {
    let (cp, a) = plane_with_guest_a();
    let id = cp.begin_create(a, &req(7, 0)).unwrap();
    cp.complete_create(id, 77, 2, Some(5)).unwrap();
    let rec = cp.channel(id).unwrap();
    assert_eq!(rec.state, ChannelState::Success);
    assert_eq!((rec.worker, rec.cpu), (Some(2), Some(5)));
    assert_eq!(cp.routes().lookup(&req(7, 0).addr()), Some((id, 77)));
    assert_eq!(cp.routes().generation(), 1);
    // Twice is a lifecycle error.
    assert_eq!(
        cp.complete_create(id, 78, 2, None),
        Err(ControlError::Transition {
            id,
            source: TransitionError {
                from: ChannelState::Success,
                event: LifecycleEvent::Established
            }
        })
    );
    assert_eq!(
        cp.complete_create(ChannelId(99), 1, 0, None),
        Err(ControlError::UnknownChannel(ChannelId(99)))
    );
}

#[test]
fn fail_create_releases_the_reservation() {
    let (cp, a) = plane_with(|p| p.max_channels = 1);
    let id = cp.begin_create(a, &req(7, 0)).unwrap();
    cp.fail_create(id, FailureReason::RegionStraddles).unwrap();
    assert_eq!(
        cp.channel(id).unwrap().state,
        ChannelState::Failure(FailureReason::RegionStraddles)
    );
    assert!(cp.guest(a).unwrap().live_channels.is_empty());
    // Same endpoint, same region, quota of one: all free again.
    let again = cp.begin_create(a, &req(7, 0)).unwrap();
    assert_eq!(again, ChannelId(id.0 + 1));
    // A failed channel takes no more events.
    assert!(matches!(
        cp.fail_create(id, FailureReason::BadRequest),
        Err(ControlError::Transition { .. })
    ));
    assert!(matches!(
        cp.complete_create(id, 0, 0, None),
        Err(ControlError::Transition { .. })
    ));
    assert_eq!(
        cp.begin_destroy(None, id).unwrap_err(),
        FailureReason::NoSuchChannel
    );
}

#[test]
fn destroy_unroutes_at_once_and_releases_at_finish() {
    let (cp, a) = plane_with(|p| p.max_channels = 1);
    let id = cp.begin_create(a, &req(7, 0)).unwrap();
    cp.complete_create(id, 77, 0, None).unwrap();

    let teardown = cp.begin_destroy(Some(a), id).unwrap();
    assert_eq!(teardown.payload, Some(77));
    assert_eq!(teardown.record.id, id);
    assert!(teardown.record.destroying);
    assert_eq!(teardown.record.state, ChannelState::Success);
    assert_eq!(teardown.route_generation, 2);
    assert_eq!(cp.routes().generation(), 2);
    assert_eq!(cp.routes().lookup(&req(7, 0).addr()), None);

    // Until the teardown finishes, endpoint and quota stay held.
    assert_eq!(
        cp.begin_create(a, &req(8, 8 * MIB2)).unwrap_err(),
        FailureReason::QuotaExceeded
    );
    // Exactly one owner: a second begin_destroy is refused, and create events too.
    assert_eq!(
        cp.begin_destroy(None, id).unwrap_err(),
        FailureReason::NoSuchChannel
    );
    assert_eq!(
        cp.fail_create(id, FailureReason::BadRequest),
        Err(ControlError::ChannelDestroying(id))
    );

    cp.finish_destroy(id).unwrap();
    let rec = cp.channel(id).unwrap();
    assert_eq!(
        (rec.state, rec.destroying),
        (ChannelState::Destroyed, false)
    );
    assert_eq!(
        cp.finish_destroy(id),
        Err(ControlError::NotBeingDestroyed {
            id,
            state: ChannelState::Destroyed
        })
    );
    // Quota released.
    cp.begin_create(a, &req(8, 8 * MIB2)).unwrap();
}

#[test]
fn finish_destroy_needs_begin_destroy() {
    let (cp, a) = plane_with_guest_a();
    let id = cp.begin_create(a, &req(7, 0)).unwrap();
    let err = cp.finish_destroy(id).unwrap_err();
    assert_eq!(
        err,
        ControlError::NotBeingDestroyed {
            id,
            state: ChannelState::Pending
        }
    );
    assert_eq!(
        err.to_string(),
        "channel 1 is pending and not being destroyed; call begin_destroy first"
    );
}

#[test]
fn a_pending_channel_can_be_destroyed_and_its_create_then_refused() {
    let (cp, a) = plane_with_guest_a();
    let id = cp.begin_create(a, &req(7, 0)).unwrap();
    let teardown = cp.begin_destroy(None, id).unwrap();
    assert_eq!(teardown.payload, None);
    assert_eq!(teardown.record.state, ChannelState::Pending);
    // The create work finishing late is told to drop its work; no route appears.
    assert_eq!(
        cp.complete_create(id, 1, 0, None),
        Err(ControlError::ChannelDestroying(id))
    );
    assert!(cp.routes().is_empty());
    cp.finish_destroy(id).unwrap();
    assert_eq!(cp.channel(id).unwrap().state, ChannelState::Destroyed);
}

#[test]
fn endpoint_taken_until_destroyed_then_reusable() {
    let (cp, a) = plane_with_guest_a();
    let id = cp.begin_create(a, &req(7, 0)).unwrap();
    cp.complete_create(id, 1, 0, None).unwrap();
    assert_eq!(
        cp.begin_create(a, &req(7, MIB2)).unwrap_err(),
        FailureReason::EndpointTaken
    );
    cp.begin_destroy(Some(a), id).unwrap();
    assert_eq!(
        cp.begin_create(a, &req(7, MIB2)).unwrap_err(),
        FailureReason::EndpointTaken
    );
    cp.finish_destroy(id).unwrap();
    let again = cp.begin_create(a, &req(7, MIB2)).unwrap();
    cp.complete_create(again, 2, 0, None).unwrap();
    assert_eq!(cp.routes().lookup(&req(7, 0).addr()), Some((again, 2)));
}

#[test]
fn a_guest_cannot_destroy_another_guests_channel() {
    let (cp, a) = plane_with_guest_a();
    let b = cp.add_guest(GuestPolicy::new("b", MAC_B)).unwrap();
    let id = cp.begin_create(a, &req(7, 0)).unwrap();
    cp.complete_create(id, 1, 0, None).unwrap();
    // Same answer as for a channel that does not exist: b learns nothing.
    assert_eq!(
        cp.begin_destroy(Some(b), id).unwrap_err(),
        FailureReason::NoSuchChannel
    );
    assert_eq!(
        cp.begin_destroy(Some(b), ChannelId(999)).unwrap_err(),
        FailureReason::NoSuchChannel
    );
    assert_eq!(cp.routes().lookup(&req(7, 0).addr()), Some((id, 1)));
    assert!(!cp.channel(id).unwrap().destroying);
    // The owner, and the operator, can.
    cp.begin_destroy(Some(a), id).unwrap();
}

#[test]
fn the_operator_can_destroy_any_channel() {
    let (cp, a) = plane_with_guest_a();
    let id = cp.begin_create(a, &req(7, 0)).unwrap();
    cp.complete_create(id, 1, 0, None).unwrap();
    assert_eq!(cp.begin_destroy(None, id).unwrap().payload, Some(1));
}

#[test]
fn a_guest_cannot_claim_another_guests_mac() {
    let (cp, a) = plane_with_guest_a();
    // Not at registration ...
    let mut p = GuestPolicy::new("b", MAC_B);
    p.macs.push(MAC_A2);
    let err = cp.add_guest(p.clone()).unwrap_err();
    assert_eq!(
        err,
        ControlError::MacOwned {
            name: "b".into(),
            mac: MAC_A2,
            owner: a,
            owner_name: "a".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "guest \"b\" cannot own MAC 52:54:00:00:01:0a: it belongs to guest 1 (\"a\")"
    );
    assert_eq!(
        cp.guest_by_mac(MAC_B),
        None,
        "a refused guest registers nothing"
    );
    // ... nor in a create request.
    let b = cp.add_guest(GuestPolicy::new("b", MAC_B)).unwrap();
    assert_eq!(
        cp.begin_create(b, &req(1, 0)).unwrap_err(),
        FailureReason::MacNotOwned
    );
    assert_eq!(cp.guest_by_mac(MAC_A), Some(a));
    assert_eq!(cp.guest_by_mac(MAC_A2), Some(a));
    assert_eq!(cp.guest_by_mac(MAC_B), Some(b));
    // Once a is gone, its MACs may be given to another guest.
    cp.remove_guest(a).unwrap();
    assert_eq!(cp.guest_by_mac(MAC_A), None);
    let c = cp.add_guest(GuestPolicy::new("c", MAC_A)).unwrap();
    assert_eq!(cp.guest_by_mac(MAC_A), Some(c));
}

#[test]
fn guest_names_are_unique_and_policies_validated() {
    let (cp, a) = plane_with_guest_a();
    assert_eq!(
        cp.add_guest(GuestPolicy::new("a", MAC_B)),
        Err(ControlError::GuestNameTaken {
            name: "a".into(),
            existing: a
        })
    );
    assert_eq!(
        cp.add_guest(GuestPolicy::new("bad name", MAC_B)),
        Err(ControlError::Policy(PolicyError::NameBadChar {
            name: "bad name".into(),
            ch: ' '
        }))
    );
    let b = cp.add_guest(GuestPolicy::new("b", MAC_B)).unwrap();
    assert_eq!(cp.guest_by_name("a"), Some(a));
    assert_eq!(cp.guest_by_name("b"), Some(b));
    assert_eq!(cp.guest_by_name("c"), None);
    let names: Vec<_> = cp.guests().into_iter().map(|g| g.policy.name).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(cp.guest(b).unwrap().policy, GuestPolicy::new("b", MAC_B));
    assert_eq!(
        cp.remove_guest(svnic_control_plane::GuestId(99))
            .unwrap_err(),
        ControlError::UnknownGuest(svnic_control_plane::GuestId(99))
    );
}

#[test]
fn remove_guest_tears_down_exactly_the_live_channels() {
    let (cp, a) = plane_with_guest_a();
    let b = cp.add_guest(GuestPolicy::new("b", MAC_B)).unwrap();
    let pending = cp.begin_create(a, &req(1, 0)).unwrap();
    let success = cp.begin_create(a, &req(2, MIB2)).unwrap();
    cp.complete_create(success, 2, 0, None).unwrap();
    let failed = cp.begin_create(a, &req(3, 2 * MIB2)).unwrap();
    cp.fail_create(failed, FailureReason::RegionOutsideMemory)
        .unwrap();
    let destroyed = cp.begin_create(a, &req(4, 3 * MIB2)).unwrap();
    cp.complete_create(destroyed, 4, 0, None).unwrap();
    cp.begin_destroy(None, destroyed).unwrap();
    cp.finish_destroy(destroyed).unwrap();
    let elsewhere = cp
        .begin_create(
            b,
            &CreateRequest {
                mac: MAC_B,
                ..req(1, 0)
            },
        )
        .unwrap();
    cp.complete_create(elsewhere, 9, 0, None).unwrap();

    let teardowns = cp.remove_guest(a).unwrap();
    let ids: Vec<_> = teardowns.iter().map(|t| t.record.id).collect();
    assert_eq!(ids, [pending, success]);
    let payloads: Vec<_> = teardowns.iter().map(|t| t.payload).collect();
    assert_eq!(payloads, [None, Some(2)]);
    assert!(teardowns.iter().all(|t| t.record.destroying));

    // The guest is gone at once: unknown to requests, unrouted; b is untouched.
    assert_eq!(cp.guest(a), None);
    assert_eq!(cp.guest_by_name("a"), None);
    assert_eq!(
        cp.begin_create(a, &req(9, 9 * MIB2)).unwrap_err(),
        FailureReason::UnknownGuest
    );
    assert_eq!(
        cp.routes().load().sorted(),
        [(ChannelAddr::new(MAC_B, 1), elsewhere)]
    );
    assert_eq!(cp.live_channels_of(a).len(), 2);

    for t in &teardowns {
        cp.finish_destroy(t.record.id).unwrap();
    }
    assert!(cp.live_channels_of(a).is_empty());
    assert_eq!(cp.channel(pending).unwrap().state, ChannelState::Destroyed);
    // Records keep the guest's name for operators.
    assert_eq!(cp.channel(success).unwrap().guest_name, "a");
}

#[test]
fn remove_guest_leaves_teardowns_already_owned_to_their_owner() {
    let (cp, a) = plane_with_guest_a();
    let one = cp.begin_create(a, &req(1, 0)).unwrap();
    let two = cp.begin_create(a, &req(2, MIB2)).unwrap();
    cp.begin_destroy(Some(a), one).unwrap();
    let teardowns = cp.remove_guest(a).unwrap();
    assert_eq!(teardowns.len(), 1);
    assert_eq!(teardowns[0].record.id, two);
    let live: Vec<_> = cp.live_channels_of(a).into_iter().map(|c| c.id).collect();
    assert_eq!(live, [one, two]);
    cp.finish_destroy(one).unwrap();
    cp.finish_destroy(two).unwrap();
    assert!(cp.live_channels_of(a).is_empty());
}

#[test]
fn terminal_records_are_bounded_and_live_ones_kept() {
    // More creates than one burst: the rate limit is not what this test is about.
    let (cp, a) = plane_with(|p| p.create_burst = 1000);
    let live = cp.begin_create(a, &req(0, 0)).unwrap();
    for i in 0..(MAX_TERMINAL_RECORDS as u32 + 20) {
        let id = cp.begin_create(a, &req(1, MIB2)).unwrap();
        if i % 2 == 0 {
            cp.fail_create(id, FailureReason::BadRequest).unwrap();
        } else {
            cp.begin_destroy(None, id).unwrap();
            cp.finish_destroy(id).unwrap();
        }
    }
    let records = cp.channels();
    assert_eq!(records.len(), MAX_TERMINAL_RECORDS + 1);
    assert_eq!(records[0].id, live);
    // The oldest terminal records went first.
    assert_eq!(records[1].id, ChannelId(live.0 + 21));
    assert_eq!(cp.channel(ChannelId(live.0 + 1)), None);
    assert_eq!(
        cp.finish_destroy(ChannelId(live.0 + 1)),
        Err(ControlError::UnknownChannel(ChannelId(live.0 + 1)))
    );
}

#[test]
fn concurrent_creates_of_one_endpoint_admit_exactly_one() {
    const THREADS: u64 = 6;
    let (cp, a) = plane_with_guest_a();
    let cp = Arc::new(cp);
    let start = Arc::new(Barrier::new(THREADS as usize));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let cp: Arc<ControlPlane<u32>> = Arc::clone(&cp);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                // Distinct regions, so the only conflict is the endpoint.
                cp.begin_create(a, &req(42, t * MIB2))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let admitted: Vec<_> = results.iter().filter_map(|r| r.ok()).collect();
    assert_eq!(admitted.len(), 1, "{results:?}");
    assert!(results
        .iter()
        .filter_map(|r| r.err())
        .all(|e| e == FailureReason::EndpointTaken));
    assert_eq!(cp.guest(a).unwrap().live_channels, admitted);
}

#[test]
fn concurrent_creates_never_exceed_the_quota() {
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 20;
    let (cp, a) = plane_with(|p| p.max_channels = 10);
    let cp = Arc::new(cp);
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let cp: Arc<ControlPlane<u32>> = Arc::clone(&cp);
            thread::spawn(move || {
                (0..PER_THREAD)
                    .filter(|i| {
                        let n = t * PER_THREAD + i;
                        cp.begin_create(a, &req(n as u32, n * MIB2)).is_ok()
                    })
                    .count()
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 10);
    assert_eq!(cp.guest(a).unwrap().live_channels.len(), 10);
}
