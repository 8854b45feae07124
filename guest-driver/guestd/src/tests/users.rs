//! Per-uid quotas and endpoint ownership, with applications connecting as real uids (the
//! connecting thread switches credentials; these tests need root and say so otherwise).
#![allow(clippy::unwrap_used)]

use super::*;

const A: u32 = 65534;
const B: u32 = 65533;

fn limits(channels: Option<usize>, hugepages: Option<u64>) -> UserPolicy {
    UserPolicy {
        default: UidLimits::new(channels, hugepages),
        ..UserPolicy::default()
    }
}

fn reserved(uid: u32, first: u32, last: u32) -> UserPolicy {
    UserPolicy {
        endpoint_ranges: vec![EndpointRange { first, last, uid }],
        ..UserPolicy::default()
    }
}

fn refused(r: Result<ChannelId, (AgentFailure, String)>) -> (AgentFailure, String) {
    match r {
        Err(e) => e,
        Ok(ch) => panic!("created {ch}, expected a refusal"),
    }
}

fn usage(h: &Harness, uid: u32) -> UidUsage {
    h.status().users.get(&uid).copied().unwrap_or_default()
}

/// An agent named `name` with `users`, and a connection of user A and one of user B; `None`
/// (the test is skipped) unless the test runs as root.
fn users_a_and_b(name: &str, users: UserPolicy) -> Option<(Harness, Raw, Raw)> {
    let h = Harness::start_users(name, Behaviour::default(), users);
    let a = Raw::connect_as(&h, A)?;
    let b = Raw::connect_as(&h, B).unwrap();
    Some((h, a, b))
}

/// Asserts that `create` is refused for user A's channel quota, that the agent has counted
/// `refusals` such refusals in all, and that A is still charged 2 channels.
#[track_caller]
fn assert_quota_refused(
    h: &Harness,
    create: Result<ChannelId, (AgentFailure, String)>,
    refusals: u64,
) {
    assert_eq!(refused(create).0, AgentFailure::UidChannelQuota);
    wait_until("the refusals counted", || {
        h.status().refused.quota == refusals
    });
    assert_eq!(usage(h, A).channels, 2);
}

/// Sends Destroy without waiting for the answer (the engine may hold it).
fn destroy(raw: &Raw, token: u32, channel: ChannelId) {
    raw.send(Request::Destroy { token, channel });
}

fn destroyed(raw: &Raw, token: u32) {
    loop {
        match raw.recv().0 {
            Response::Pending { .. } => continue,
            Response::Destroyed { token: t, .. } if t == token => return,
            other => panic!("expected Destroyed, got {other:?}"),
        }
    }
}

#[test]
fn the_uids_channel_quota_refuses_naming_the_limit_until_the_engine_acknowledged_a_destroy() {
    let h = Harness::start_users("uid-channels", Behaviour::default(), limits(Some(2), None));
    let Some(a1) = Raw::connect_as(&h, A) else {
        return;
    };
    let a2 = Raw::connect_as(&h, A).unwrap();
    let first = a1.try_create(1, 1).unwrap();
    a2.try_create(1, 2).unwrap();
    // The quota is the user's, whichever of its applications asks.
    for raw in [&a1, &a2] {
        let (why, detail) = refused(raw.try_create(2, 3));
        assert_eq!(why, AgentFailure::UidChannelQuota);
        assert!(
            detail.contains("uid 65534 holds 2 channel(s); the limit is 2")
                && detail.contains("--max-channels-per-uid"),
            "{detail}"
        );
    }
    // The status is published after each turn of the agent's loop, so it may lag an answer.
    wait_until("two refusals counted", || h.status().refused.quota == 2);
    assert_eq!(usage(&h, A).channels, 2);
    // Another user has its own quota.
    let b = Raw::connect_as(&h, B).unwrap();
    b.try_create(1, 4).unwrap();

    // Destroyed but not acknowledged: still charged.
    h.engine.behave(holding_destroys());
    destroy(&a1, 3, first);
    wait_until("the destroy frame", || {
        h.engine.seen(|s| s.destroys.contains(&first))
    });
    assert_quota_refused(&h, a2.try_create(4, 5), 3);
    h.engine.release();
    destroyed(&a1, 3);
    wait_until("the quota released", || usage(&h, A).channels == 1);
    a2.try_create(5, 5).unwrap();
}

#[test]
fn the_uids_hugepage_quota_counts_memory_passed_but_not_yet_registered() {
    let h = Harness::start_users("uid-memory", Behaviour::default(), limits(None, Some(1)));
    let Some(a) = Raw::connect_as(&h, A) else {
        return;
    };
    // A Region not yet answered with Mapped already spends the quota.
    a.region(1, 1);
    wait_until("the region charged", || usage(&h, A).memory == HUGEPAGE);
    let (why, detail) = refused(a.try_create(2, 2));
    assert_eq!(why, AgentFailure::UidMemoryQuota);
    assert!(
        detail.contains("2048 KiB of channel memory") && detail.contains("--max-hugepages-per-uid"),
        "{detail}"
    );
    a.send(Request::Cancel { token: 1 });
    wait_until("the region given back", || usage(&h, A).memory == 0);
    a.try_create(3, 2).unwrap();
    // Root is unlimited by default.
    let root = Raw::connect(&h);
    for t in 1..=3 {
        root.try_create(t, 10 + t).unwrap();
    }
}

#[test]
fn a_killed_client_keeps_its_uid_charged_until_the_engine_acknowledged_and_then_not() {
    let h = Harness::start_users("uid-killed", Behaviour::default(), limits(Some(2), None));
    let Some(doomed) = Raw::connect_as(&h, A) else {
        return;
    };
    doomed.try_create(1, 1).unwrap();
    doomed.try_create(2, 2).unwrap();
    h.engine.behave(holding_destroys());
    drop(doomed);
    wait_until("both destroy frames", || {
        h.engine.seen(|s| s.destroys.len() == 2)
    });
    wait_until("the app is gone", || h.status().apps == 0);
    // A new application of the same user cannot get around the quota by the kill.
    let next = Raw::connect_as(&h, A).unwrap();
    assert_quota_refused(&h, next.try_create(1, 3), 1);
    h.engine.release();
    wait_until("the memory is freed", || h.memory_held() == 0);
    wait_until("the quota released", || !h.status().users.contains_key(&A));
    next.try_create(2, 3).unwrap();
    next.try_create(3, 4).unwrap();
}

#[test]
fn an_endpoint_reserved_for_another_uid_is_refused_and_root_may_claim_it() {
    let Some((h, a, b)) = users_a_and_b("uid-range", reserved(B, 100, 199)) else {
        return;
    };
    let (why, detail) = refused(a.try_create(1, 150));
    assert_eq!(why, AgentFailure::EndpointOwned);
    assert!(
        detail.contains("reserved for uid 65533 (--endpoints-for-uid 65533=100-199)"),
        "{detail}"
    );
    wait_until("the refusal counted", || h.status().refused.endpoint == 1);
    b.try_create(1, 150).unwrap();
    // Outside the range: anyone.
    a.try_create(2, 200).unwrap();
    // Root: not bound by reservations...
    let root = Raw::connect(&h);
    root.try_create(1, 160).unwrap();
    // ...but by what another uid holds, and what root holds is root's.
    let (why, detail) = refused(root.try_create(2, 150));
    assert_eq!(why, AgentFailure::EndpointOwned);
    assert!(detail.contains("held by uid 65533"), "{detail}");
    let (_, detail) = refused(b.try_create(2, 160));
    assert!(detail.contains("held by uid 0"), "{detail}");
}

#[test]
fn a_first_come_endpoint_is_its_uids_until_the_engine_acknowledged_the_destroy() {
    let Some((h, a, b)) = users_a_and_b("uid-first", UserPolicy::default()) else {
        return;
    };
    let ch = a.try_create(1, 7).unwrap();
    let (why, detail) = refused(b.try_create(1, 7));
    assert_eq!(why, AgentFailure::EndpointOwned);
    assert!(
        detail.starts_with("endpoint 7 is held by uid 65534"),
        "{detail}"
    );
    // Between A's destroy and the engine's acknowledgement, B still cannot step in.
    h.engine.behave(holding_destroys());
    destroy(&a, 2, ch);
    wait_until("the destroy frame", || {
        h.engine.seen(|s| s.destroys.contains(&ch))
    });
    assert_eq!(refused(b.try_create(2, 7)).0, AgentFailure::EndpointOwned);
    h.engine.release();
    destroyed(&a, 2);
    b.try_create(3, 7).unwrap();
    // Now it is B's.
    assert_eq!(refused(a.try_create(3, 7)).0, AgentFailure::EndpointOwned);
}

#[test]
fn two_uids_cannot_hold_one_endpoint_even_before_the_engine_hears_of_it() {
    let Some((h, a, b)) = users_a_and_b("uid-race", UserPolicy::default()) else {
        return;
    };
    a.region(1, 9);
    // A holds endpoint 9 from the moment its memory was passed.
    assert_eq!(refused(b.try_create(1, 9)).0, AgentFailure::EndpointOwned);
    // Given back unregistered: free for B.
    a.send(Request::Cancel { token: 1 });
    wait_until("the region given back", || usage(&h, A).channels == 0);
    b.try_create(2, 9).unwrap();
    assert!(h.engine.seen(|s| s.creates.len() == 1));
}

#[test]
fn root_can_be_given_its_own_quota() {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let users = UserPolicy {
        overrides: vec![(me, UidLimits::new(Some(1), None))],
        ..UserPolicy::default()
    };
    let h = Harness::start_users("uid-root", Behaviour::default(), users);
    let root = Raw::connect(&h);
    root.try_create(1, 1).unwrap();
    let (why, detail) = refused(root.try_create(2, 2));
    assert_eq!(why, AgentFailure::UidChannelQuota);
    assert!(
        detail.contains(&format!("uid {me} holds 1 channel(s)")),
        "{detail}"
    );
}
