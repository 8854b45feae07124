//! Hostile applications and frames that are not the engine's.
#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn hostile_requests_get_failures_and_the_agent_carries_on() {
    let h = Harness::start("hostile", Behaviour::default());
    let raw = Raw::connect(&h);
    let other = Raw::connect(&h);
    // Garbage, a wrong version, token 0, an oversized message, descriptors.
    raw.sock.send(b"garbage!!", &[]).unwrap();
    assert_eq!(raw.failure().1, AgentFailure::BadRequest);
    let mut v = Request::Mapped { token: 3 }.encode();
    v[0] = 9;
    raw.sock.send(&v, &[]).unwrap();
    assert_eq!(raw.failure(), (3, AgentFailure::BadRequest));
    raw.send(Request::Mapped { token: 0 });
    assert_eq!(raw.failure(), (0, AgentFailure::BadRequest));
    raw.sock.send(&[1u8; 1000], &[]).unwrap();
    assert_eq!(raw.failure().1, AgentFailure::BadRequest);
    let e = svnic_client::vm::event::Event::new().unwrap();
    use std::os::fd::AsFd;
    raw.sock
        .send(&Request::Mapped { token: 4 }.encode(), &[e.as_fd()])
        .unwrap();
    assert_eq!(raw.failure(), (4, AgentFailure::BadRequest));
    // Out-of-place and foreign requests.
    raw.send(Request::Mapped { token: 5 });
    assert_eq!(raw.failure(), (5, AgentFailure::UnknownToken));
    raw.send(Request::Create {
        token: 6,
        endpoint: 1,
        ring_size: 100,
    });
    assert_eq!(
        raw.failure(),
        (6, AgentFailure::Engine(FailureReason::BadRingSize))
    );
    let Response::Success { channel, .. } = other.create(1, 1) else {
        panic!("create failed")
    };
    raw.send(Request::Destroy { token: 7, channel });
    assert_eq!(raw.failure(), (7, AgentFailure::NotYourChannel));
    // Quotas: 3 per application, 5 in all.
    fill_quota(&other, 10..12);
    fill_quota(&raw, 20..22);
    // A destroy of a channel that does not exist.
    raw.send(Request::Destroy {
        token: 30,
        channel: ChannelId(9999),
    });
    assert_eq!(raw.failure(), (30, AgentFailure::NotYourChannel));
    assert_eq!(h.status().live_channels, 5);
}

#[test]
fn frames_that_are_not_the_engines_are_ignored() {
    let h = Harness::start("frames", Behaviour::default());
    let client = h.client();
    let ch = client.create_channel(1, 256, LONG).unwrap();
    let id = ChannelId(ch.id());
    // From another MAC, malformed, a wake for a channel nobody holds, not svnic at all.
    let mut spoofed = frame(FrameBody::Wake { channel: id });
    spoofed[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 66]);
    let mut malformed = frame(FrameBody::Wake { channel: id });
    malformed[14] = 7;
    let mut ipv4 = vec![0u8; 60];
    ipv4[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let unknown = frame(FrameBody::Wake {
        channel: ChannelId(4242),
    });
    for f in [spoofed, malformed, ipv4, unknown] {
        h.engine.send(f);
    }
    wait_until("three ignored frames", || h.status().ignored_frames == 3);
    let waiter = client.waiter(&ch).unwrap();
    assert!(!waiter.wait_for_wake(Duration::from_millis(20)).unwrap());
    assert_eq!(h.status().wakes, 0);
}

/// Creates a channel for each token of `tokens` (endpoint = token), then finds the next one
/// refused for the quota.
fn fill_quota(raw: &Raw, tokens: std::ops::Range<u32>) {
    let next = tokens.end;
    for t in tokens {
        assert!(matches!(raw.create(t, t), Response::Success { .. }));
    }
    raw.send(Request::Create {
        token: next,
        endpoint: next,
        ring_size: 256,
    });
    assert_eq!(raw.failure(), (next, AgentFailure::TooManyChannels));
}
