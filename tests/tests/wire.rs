//! The wire between hosts (docs/wire.md): two network namespaces joined by a veth pair, one
//! `svnic serve --uplink` in each, host-process guests on both sides.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use svnic_backend::admin::UplinkWorkerView;
use svnic_channels::frame::{BundleEntry, BundleFrame, Frame, FrameBody};
use svnic_channels::{
    ChannelAddr, Completion, CompletionStatus, DataRef, DmaData, MacAddr, Message,
};
use svnic_client::{Channel, Completions};
use svnic_host_frontend::host_guest::ChannelWaiter;
use svnic_host_frontend::HostGuest;
use svnic_tests::polite_pair::{assert_round_trip, PolitePair};
use svnic_tests::wire_fixture::{two_hosts, UplinkCount, WireHosts, WireOptions};

const TIMEOUT: Duration = Duration::from_secs(20);
const MEMORY: u64 = 64 << 20;

/// [`two_hosts`] with the default options changed by `tweak` first.
fn two_hosts_with(tag: &str, tweak: impl FnOnce(&mut WireOptions)) -> Option<WireHosts> {
    let mut opts = WireOptions::default();
    tweak(&mut opts);
    two_hosts(tag, &opts)
}

/// Owned copies of `args`, for [`WireOptions::extra_args`].
fn args(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

fn guest(hosts: &WireHosts, host: usize, i: usize) -> HostGuest {
    let s = hosts.hosts[host].socket(i);
    HostGuest::connect(&s, MEMORY).unwrap_or_else(|e| panic!("{}: {e}", s.display()))
}

/// A channel with a region of `mib` MiB.
fn channel(g: &HostGuest, endpoint: u32, mib: u64) -> Channel {
    let pending = g.begin_create(endpoint, 256, mib << 20).unwrap();
    match pending.wait(TIMEOUT).unwrap() {
        svnic_host_frontend::host_guest::CreateState::Success(c) => c,
        other => panic!("create endpoint {endpoint}: {other:?}"),
    }
}

/// Receives until `f` returns true for a message, or panics after `TIMEOUT`.
fn receive_until(g: &HostGuest, ch: &mut Channel, what: &str, mut f: impl FnMut(Message) -> bool) {
    let waiter = g.waiter(ch);
    let deadline = Instant::now() + TIMEOUT;
    let mut out = Vec::new();
    while Instant::now() < deadline {
        out.clear();
        ch.wait_poll(&mut out, 64, Duration::from_millis(100), &waiter)
            .unwrap();
        for m in out.drain(..) {
            if f(m) {
                return;
            }
        }
    }
    panic!("{what}: not done within {TIMEOUT:?}");
}

/// Two hosts, a guest on each and a channel of each at endpoint 1 (`mib.0` and `mib.1` MiB),
/// in the order they are bound so that they are dropped channels first, hosts last.
fn across_hosts(
    tag: &str,
    mib: (u64, u64),
) -> Option<(WireHosts, HostGuest, HostGuest, Channel, Channel)> {
    let hosts = two_hosts(tag, &WireOptions::default())?;
    let (ga, gb) = (guest(&hosts, 0, 0), guest(&hosts, 1, 0));
    let (ca, cb) = (channel(&ga, 1, mib.0), channel(&gb, 1, mib.1));
    Some((hosts, ga, gb, ca, cb))
}

/// The next `n` messages of `ch`, each turned into a `T` by `pick` (which panics on a message it
/// does not expect); panics if they do not all come within `TIMEOUT`.
fn receive_n<T>(
    g: &HostGuest,
    ch: &mut Channel,
    what: &str,
    n: usize,
    mut pick: impl FnMut(Message) -> T,
) -> Vec<T> {
    let mut got = Vec::with_capacity(n);
    receive_until(g, ch, what, |m| {
        got.push(pick(m));
        got.len() == n
    });
    got
}

/// The DMA-data message `m`; panics on any other.
fn dma_data(m: Message) -> DmaData {
    match m {
        Message::DmaData(d) => d,
        other => panic!("unexpected {other:?}"),
    }
}

/// The completion `m`; panics on any other message.
fn completion(m: Message) -> Completion {
    match m {
        Message::Completion(c) => c,
        other => panic!("unexpected {other:?}"),
    }
}

/// The uplink counters of `host`'s workers once `done` holds of them (or after 10 s).
fn uplink_until(
    host: &svnic_tests::wire_fixture::WireHost,
    done: impl Fn(&[UplinkWorkerView]) -> bool,
) -> Vec<UplinkWorkerView> {
    host.svnic()
        .wait_for(10, |s| s.uplink().map(|(_, w)| w), done)
        .unwrap()
}

#[test]
fn user_data_and_virtio_net_frames_cross_hosts() {
    let Some(hosts) = two_hosts("wire-basic", &WireOptions::default()) else {
        return;
    };
    let mut pair = PolitePair::connect(&hosts.hosts[0].socket(0), &hosts.hosts[1].socket(0))
        .unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..20 {
        assert_round_trip(&mut pair);
    }
    for (i, h) in hosts.hosts.iter().enumerate() {
        let (iface, _) = h.svnic().uplink().unwrap();
        assert_eq!(iface.as_deref(), Some("sv0"));
        // The counters are published by the worker every few milliseconds.
        let w = &uplink_until(h, |w| {
            w[0].get("rx_data") >= 20 && w[0].get("rx_to_ports") >= 20
        })[0];
        assert!(w.get("rx_data") >= 20, "host {i}: {w:?}");
        assert!(w.get("rx_acks") >= 1, "host {i}: {w:?}");
        assert!(
            w.get("rx_to_ports") >= 20,
            "host {i}: virtio-net frames: {w:?}"
        );
        assert_eq!(
            w.get("rx_malformed") + w.get("rx_spoofed"),
            0,
            "host {i}: {w:?}"
        );
    }
}

#[test]
fn dma_data_of_one_mib_crosses_hosts_intact_and_in_order() {
    let Some((_hosts, ga, gb, mut ca, mut cb)) = across_hosts("wire-dma", (4, 16)) else {
        return;
    };
    let (to_b, from_a) = (cb.addr(), ca.addr());
    let sizes: Vec<u32> = vec![1 << 20, 1, 1456, 1457, 65_536, 1 << 20, 3000, 0x8_0001];
    let base_a = ca.layout().data_offset;
    let base_b = cb.layout().data_offset;
    let pattern = |i: usize, len: u32| -> Vec<u8> {
        (0..len)
            .map(|k| (k as usize * 31 + i * 7 + (k as usize >> 11)) as u8)
            .collect()
    };
    // All in flight at once: B posts a 1 MiB buffer per message, A writes each message at an
    // offset of its own and sends them back to back, so the sessions carry several messages
    // (thousands of fragments) at a time and order is not given by lockstep.
    let mut offset = base_a;
    let mut sent = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let post = DataRef {
            offset: base_b + i as u64 * (1 << 20),
            len: 1 << 20,
        };
        assert!(cb.post_buffer(100 + i as u64, post).unwrap());
        let data = pattern(i, len);
        ca.write_data(offset, &data).unwrap();
        assert!(ca
            .send_dma(to_b, i as u64, DataRef { offset, len })
            .unwrap());
        sent.push((post, data));
        offset += u64::from(len).next_multiple_of(4096);
    }
    cb.flush().unwrap();
    ca.flush().unwrap();
    let got = receive_n(&gb, &mut cb, "8 DMA-data messages", sizes.len(), dma_data);
    for (i, (d, (post, data))) in got.iter().zip(&sent).enumerate() {
        assert_eq!(
            (d.peer, d.cookie, d.data.offset, d.data.len),
            (from_a, 100 + i as u64, post.offset, data.len() as u32),
            "message {i} (in send order, into the buffers in post order)"
        );
        assert!(d.is_complete(), "message {i} not COMPLETE");
        let mut back = vec![0u8; data.len()];
        cb.read_data(d.data.offset, &mut back).unwrap();
        assert!(
            back == *data,
            "message {i} ({} B): data differs",
            data.len()
        );
    }
    let done = receive_n(&ga, &mut ca, "8 completions", sizes.len(), completion);
    for (i, c) in done.iter().enumerate() {
        assert_eq!(
            (c.cookie, c.status, c.len, c.peer),
            (i as u64, CompletionStatus::Ok, sizes[i], to_b),
            "completion {i}"
        );
    }
}

/// A remote destination's refusals reach the sender as error completions, and its session
/// goes on: an endpoint with no channel is answered NoRoute, a DMA-data message larger than the
/// posted buffer fails BufferTooSmall (the buffer stays posted and takes the next message that
/// fits), and later messages are delivered, in order, and complete Ok.
#[test]
fn remote_refusals_complete_the_sender_with_their_status_and_traffic_goes_on() {
    let Some((hosts, ga, gb, mut ca, mut cb)) = across_hosts("wire-refuse", (4, 4)) else {
        return;
    };
    let (to_b, from_a) = (cb.addr(), ca.addr());
    let nobody = ChannelAddr::new(to_b.mac, 99);
    let (base_a, base_b) = (ca.layout().data_offset, cb.layout().data_offset);

    // No channel at B's endpoint 99.
    assert!(ca
        .send_user(nobody, 1, b"anyone?", Completions::Always)
        .unwrap());
    ca.flush().unwrap();
    let c = receive_n(&ga, &mut ca, "the NoRoute completion", 1, completion)[0];
    assert_eq!(
        (c.cookie, c.status, c.peer),
        (1, CompletionStatus::NoRoute, nobody)
    );

    // 3000 bytes for a 1000-byte buffer, then 700 bytes that fit it.
    let post = DataRef {
        offset: base_b,
        len: 1000,
    };
    assert!(cb.post_buffer(50, post).unwrap());
    cb.flush().unwrap();
    let data: Vec<u8> = (0..3000u32).map(|k| (k * 7) as u8).collect();
    ca.write_data(base_a, &data).unwrap();
    for (cookie, len) in [(2, 3000), (3, 700)] {
        let d = DataRef {
            offset: base_a,
            len,
        };
        assert!(ca.send_dma(to_b, cookie, d).unwrap());
    }
    assert!(ca
        .send_user(to_b, 4, b"still there", Completions::Always)
        .unwrap());
    ca.flush().unwrap();
    let done = receive_n(&ga, &mut ca, "three completions", 3, completion);
    let statuses: Vec<_> = done.iter().map(|c| (c.cookie, c.status)).collect();
    assert_eq!(
        statuses,
        [
            (2, CompletionStatus::BufferTooSmall),
            (3, CompletionStatus::Ok),
            (4, CompletionStatus::Ok)
        ]
    );
    let got = receive_n(&gb, &mut cb, "the DMA-data and the user-data", 2, |m| m);
    match got[0] {
        Message::DmaData(d) => {
            assert_eq!(
                (d.peer, d.cookie, d.data),
                (
                    from_a,
                    50,
                    DataRef {
                        offset: base_b,
                        len: 700
                    }
                )
            );
            let mut back = vec![0u8; 700];
            cb.read_data(d.data.offset, &mut back).unwrap();
            assert!(back == data[..700], "the 700 bytes differ");
        }
        ref other => panic!("expected the DMA-data first, got {other:?}"),
    }
    match got[1] {
        Message::UserData(u) => {
            assert_eq!(
                (u.peer, u.cookie, u.data()),
                (from_a, 4, &b"still there"[..])
            )
        }
        ref other => panic!("expected the user-data, got {other:?}"),
    }
    // B's engine counted the NoRoute answer and the reject.
    let w = &uplink_until(&hosts.hosts[1], |w| w[0].get("recv.rejects") >= 1)[0];
    assert!(w.get("rx_no_route") >= 1, "{w:?}");
    assert!(w.get("recv.rejects") >= 1, "{w:?}");
}

/// Polls `ch` once (waiting up to `wait` on `waiter`) and adds the status of every completion
/// among the messages to `statuses`.
fn poll_statuses(
    ch: &mut Channel,
    waiter: &ChannelWaiter,
    wait: Duration,
    statuses: &mut Vec<CompletionStatus>,
) {
    let mut out = Vec::new();
    ch.wait_poll(&mut out, 64, wait, waiter).unwrap();
    statuses.extend(out.iter().filter_map(|m| match m {
        Message::Completion(c) => Some(c.status),
        _ => None,
    }));
}

/// Sends `n` user-data messages numbered 0..n from `ch` to `to` (retrying while the TX ring is
/// full); error completions are collected.
fn send_numbered(
    g: &HostGuest,
    ch: &mut Channel,
    to: ChannelAddr,
    n: u64,
    errors: &mut Vec<CompletionStatus>,
) {
    let waiter = g.waiter(ch);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut i = 0;
    while i < n {
        assert!(Instant::now() < deadline, "sent {i} of {n} in 120 s");
        if ch
            .send_user(to, i, &i.to_le_bytes(), Completions::OnError)
            .unwrap()
        {
            i += 1;
            continue;
        }
        ch.flush().unwrap();
        poll_statuses(ch, &waiter, Duration::from_millis(1), errors);
    }
    ch.flush().unwrap();
}

/// Receives user-data numbered 0..n from `from`, in order, each once; panics otherwise.
fn receive_numbered(g: &HostGuest, ch: &mut Channel, from: ChannelAddr, n: u64) {
    let mut next = 0u64;
    receive_until(g, ch, &format!("{n} numbered messages"), |m| match m {
        Message::UserData(u) => {
            assert_eq!(u.peer, from);
            assert_eq!(
                (u.cookie, u.data()),
                (next, &next.to_le_bytes()[..]),
                "message {next} expected"
            );
            next += 1;
            next == n
        }
        other => panic!("unexpected {other:?} after {next} messages"),
    });
}

#[test]
fn with_loss_duplication_and_reordering_every_message_arrives_once_in_order() {
    let Some(hosts) = two_hosts_with("wire-lossy", |o| {
        o.extra_args = args(&[
            "--uplink-fault",
            "drop=0.05,duplicate=0.05,reorder=0.05,seed=7",
        ])
    }) else {
        return;
    };
    let (ga, gb) = (guest(&hosts, 0, 0), guest(&hosts, 1, 0));
    let (mut ca, mut cb) = (channel(&ga, 1, 4), channel(&gb, 1, 4));
    let (to_b, from_a) = (cb.addr(), ca.addr());
    const N: u64 = 3000;
    let mut errors = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| send_numbered(&ga, &mut ca, to_b, N, &mut errors));
        receive_numbered(&gb, &mut cb, from_a, N);
    });
    assert!(errors.is_empty(), "error completions: {errors:?}");

    // DMA-data, 64 KiB each (45 fragments), through the same faulty wire, in order and intact.
    let (base_a, base_b) = (ca.layout().data_offset, cb.layout().data_offset);
    for i in 0..20u64 {
        let post = DataRef {
            offset: base_b + (i % 8) * 65_536,
            len: 65_536,
        };
        assert!(cb.post_buffer(i, post).unwrap());
        cb.flush().unwrap();
        let data: Vec<u8> = (0..65_536u32)
            .map(|k| (k ^ (i as u32 * 131)) as u8)
            .collect();
        ca.write_data(base_a, &data).unwrap();
        assert!(ca
            .send_dma(
                to_b,
                1000 + i,
                DataRef {
                    offset: base_a,
                    len: 65_536
                }
            )
            .unwrap());
        ca.flush().unwrap();
        let d = receive_n(&gb, &mut cb, &format!("DMA {i}"), 1, dma_data)[0];
        assert_eq!((d.cookie, d.data.len), (i, 65_536));
        let mut back = vec![0u8; 65_536];
        cb.read_data(d.data.offset, &mut back).unwrap();
        assert!(back == data, "DMA {i}: data differs");
        let c = receive_n(&ga, &mut ca, &format!("completion {i}"), 1, completion)[0];
        assert_eq!((c.cookie, c.status), (1000 + i, CompletionStatus::Ok));
    }
    // The faults were real, and the protocol repaired them.
    let w = &uplink_until(&hosts.hosts[0], |w| w[0].get("fault.dropped") > 0)[0];
    assert!(w.get("fault.dropped") > 0, "{w:?}");
    assert!(w.get("fault.duplicated") > 0, "{w:?}");
    assert!(w.get("fault.reordered") > 0, "{w:?}");
    assert!(w.get("send.frames_retransmitted") > 0, "{w:?}");
    let wb = &uplink_until(&hosts.hosts[1], |w| w[0].get("recv.duplicates") > 0)[0];
    assert!(
        wb.get("recv.duplicates") + wb.get("recv.out_of_order") > 0,
        "{wb:?}"
    );
    // The user-data, sent in bursts, crossed largely in bundles (several messages per frame).
    assert!(wb.get("recv.bundles_accepted") > 0, "{wb:?}");
    assert!(
        wb.get("recv.frames_accepted") < wb.get("recv.messages_delivered"),
        "{wb:?}"
    );
}

/// A remote sender that goes silent in the middle of a DMA-data message does not keep the
/// destination's posted buffer: host A's engine dies after the first fragments of a 1 MiB
/// message reached host B (70 % of frames dropped both ways, so the rest trickles), B gives the
/// partial message up and the buffer takes the next message, here from a guest of B's own.
#[test]
fn a_sender_silent_mid_message_gives_the_posted_buffer_back() {
    let Some(mut hosts) = two_hosts_with("wire-silent", |o| {
        o.guests = 2;
        o.extra_args = args(&[
            "--uplink-fault",
            "drop=0.7,seed=7",
            "--uplink-peer-timeout-ms",
            "4000",
        ]);
    }) else {
        return;
    };
    let (ga, gb, gb2) = (
        guest(&hosts, 0, 0),
        guest(&hosts, 1, 0),
        guest(&hosts, 1, 1),
    );
    let (mut ca, mut cb, mut cb2) = (channel(&ga, 1, 4), channel(&gb, 1, 4), channel(&gb2, 1, 4));
    let to_b = cb.addr();
    let post = DataRef {
        offset: cb.layout().data_offset,
        len: 1 << 20,
    };
    assert!(cb.post_buffer(70, post).unwrap());
    cb.flush().unwrap();
    let big = DataRef {
        offset: ca.layout().data_offset,
        len: 1 << 20,
    };
    assert!(ca.send_dma(to_b, 1, big).unwrap());
    ca.flush().unwrap();
    // At this loss the message takes seconds; the counters are seen within about 0.1 s.
    let w = &uplink_until(&hosts.hosts[1], |w| w[0].get("recv.frames_accepted") >= 1)[0];
    assert!(w.get("recv.frames_accepted") >= 1, "{w:?}");
    assert_eq!(w.get("recv.messages_delivered"), 0, "{w:?}");
    hosts.hosts[0].kill();
    // Given up half the state lifetime (10 s here) after its first frame, while the state is
    // still live: not by the state's expiry, 10 s after the kill.
    let killed = Instant::now();
    let w = &uplink_until(&hosts.hosts[1], |w| w[0].get("recv.abandoned") >= 1)[0];
    assert_eq!(w.get("recv.abandoned"), 1, "{w:?}");
    assert_eq!(w.get("recv.states_expired"), 0, "{w:?}");
    assert!(
        killed.elapsed() < Duration::from_secs(8),
        "{:?}",
        killed.elapsed()
    );
    let data: Vec<u8> = (0..5000u32).map(|k| (k * 13) as u8).collect();
    let at = cb2.layout().data_offset;
    cb2.write_data(at, &data).unwrap();
    let d = DataRef {
        offset: at,
        len: data.len() as u32,
    };
    assert!(cb2.send_dma(to_b, 2, d).unwrap());
    cb2.flush().unwrap();
    let got = receive_n(&gb, &mut cb, "the local DMA-data", 1, dma_data)[0];
    assert_eq!(
        (got.peer, got.cookie, got.data),
        (
            cb2.addr(),
            70,
            DataRef {
                offset: post.offset,
                len: 5000
            }
        )
    );
    let mut back = vec![0u8; data.len()];
    cb.read_data(got.data.offset, &mut back).unwrap();
    assert!(back == data, "the 5000 bytes differ");
    let c = receive_n(&gb2, &mut cb2, "its completion", 1, completion)[0];
    assert_eq!((c.cookie, c.status), (2, CompletionStatus::Ok));
}

#[test]
fn a_killed_peer_engine_fails_its_senders_in_time_and_a_restarted_one_takes_traffic() {
    let Some(mut hosts) = two_hosts_with("wire-kill", |o| {
        o.extra_args = args(&["--uplink-peer-timeout-ms", "500"])
    }) else {
        return;
    };
    let ga = guest(&hosts, 0, 0);
    let mut ca = channel(&ga, 1, 4);
    let to_b;
    {
        let gb = guest(&hosts, 1, 0);
        let mut cb = channel(&gb, 1, 4);
        to_b = cb.addr();
        let mut errors = Vec::new();
        send_numbered(&ga, &mut ca, to_b, 200, &mut errors);
        receive_numbered(&gb, &mut cb, ca.addr(), 200);
        assert!(errors.is_empty(), "{errors:?}");
        hosts.hosts[1].kill();
    }
    // Mid-stream: messages keep going to the dead host; each fails within the peer timeout.
    let t0 = Instant::now();
    let mut errors = Vec::new();
    send_numbered(&ga, &mut ca, to_b, 300, &mut errors);
    let waiter = ga.waiter(&ca);
    while errors.len() < 300 && t0.elapsed() < Duration::from_secs(20) {
        poll_statuses(&mut ca, &waiter, Duration::from_millis(50), &mut errors);
    }
    let took = t0.elapsed();
    assert_eq!(errors.len(), 300, "every message completes: {errors:?}");
    assert!(
        errors
            .iter()
            .all(|s| *s == CompletionStatus::PeerUnreachable),
        "{errors:?}"
    );
    // 300 messages are at most five sessions' worth (64 each), each failing one peer timeout
    // after its first unanswered frame, one after the other.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let w = &uplink_until(&hosts.hosts[0], |w| w[0].get("send.peer_timeouts") > 0)[0];
    assert!(w.get("send.peer_timeouts") >= 1, "{w:?}");

    // The peer comes back: a new channel at the same address takes traffic again.
    hosts.hosts[1].restart().unwrap();
    let gb = guest(&hosts, 1, 0);
    let mut cb = channel(&gb, 1, 4);
    assert_eq!(cb.addr(), to_b);
    let mut errors = Vec::new();
    send_numbered(&ga, &mut ca, to_b, 100, &mut errors);
    receive_numbered(&gb, &mut cb, ca.addr(), 100);
    assert!(errors.is_empty(), "{errors:?}");
}

/// A frame of random length 14..=1514 with random bytes (a weak generator is enough).
fn garbage(state: &mut u64) -> Vec<u8> {
    let mut next = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    };
    let len = 14 + (next() % 1501) as usize;
    let mut f: Vec<u8> = (0..len).map(|_| next() as u8).collect();
    match next() % 5 {
        // An svnic frame with a random body, of a type that comes from the wire (data, ack,
        // bundle), to a MAC of host A's range, from a unicast source.
        0 | 1 => {
            f.resize(f.len().max(64), 0);
            f[..6].copy_from_slice(&[0x52, 0x54, 0x00, 0x10, 0x00, (next() % 3) as u8]);
            f[6] &= 0xfe;
            let kind = [3, 6, 7][(next() % 3) as usize];
            f[12..16].copy_from_slice(&[0x88, 0xb5, 1, kind]);
        }
        // A well-formed bundle with random session, ids and entries, for an endpoint of host
        // A's guest 0, from a stranger: it reaches the receiving protocol, not just the
        // decoder, which answers RESET (no state; never seq 0, which would start a session
        // and deliver the entries: the wire is not authenticated, docs/security.md).
        2 => {
            let mut entries = Vec::new();
            let count = 2 + (next() % 4) as u16;
            for _ in 0..count {
                let payload = next().to_le_bytes();
                BundleEntry {
                    cookie: next(),
                    msg_flags: 0,
                    payload: &payload[..(next() % 9) as usize],
                }
                .encode_into(&mut entries)
                .unwrap();
            }
            let small = |v: u64| {
                if v % 2 == 0 {
                    (v >> 8) as u32 % 4
                } else {
                    (v >> 8) as u32
                }
            };
            let frame = Frame {
                dst: MacAddr([0x52, 0x54, 0x00, 0x10, 0x00, 0x01]),
                src: MacAddr([0x02, 0x66, 0, 0, 0, (next() % 4) as u8]),
                body: FrameBody::Bundle(BundleFrame {
                    src_endpoint: (next() % 4) as u32,
                    dst_endpoint: (next() % 3) as u32,
                    session: small(next()),
                    seq: 1 + small(next()) % 1000,
                    first_message_id: small(next()),
                    count,
                    entries: &entries,
                }),
            };
            return frame.encode().unwrap();
        }
        // Anything at all, but from a unicast source.
        _ => f[6] &= 0xfe,
    }
    f
}

#[test]
fn spoofed_and_garbage_frames_from_the_wire_are_dropped_and_counted_and_local_traffic_flows() {
    let Some(hosts) = two_hosts_with("wire-hostile", |o| o.guests = 2) else {
        return;
    };
    use svnic_backend::uplink::packet::{PacketConfig, PacketSocket};
    let a = &hosts.hosts[0];
    // The attacker: a raw socket on host B's end of the cable.
    let mut evil = hosts.hosts[1]
        .ns()
        .run_in(|| PacketSocket::open("sv0", &PacketConfig::default()))
        .unwrap()
        .unwrap();
    let mut local = PolitePair::connect(&a.socket(0), &a.socket(1)).unwrap();
    assert_round_trip(&mut local);
    let (mac0, mac1) = (local.a.mac(), local.b.mac());

    // A frame to guest 0 claiming to come from guest 1, both of host A: never delivered.
    let spoofed = svnic_tests::polite_pair::test_frame(mac0, mac1, 0x5ec);
    for _ in 0..10 {
        evil.queue(&spoofed).unwrap();
    }
    evil.flush().unwrap();
    let w = &uplink_until(a, |w| w[0].get("rx_spoofed") >= 10)[0];
    assert!(w.get("rx_spoofed") >= 10, "{w:?}");
    let mut got = Vec::new();
    local.a.recv_raw(&mut got, 256).unwrap();
    assert!(!got.contains(&spoofed), "a spoofed frame reached guest 0");

    // A flood of garbage while the local guests keep talking.
    let before = uplink_until(a, |_| true)[0].clone();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let flood = std::thread::scope(|s| {
        let flooder = s.spawn(|| {
            let mut sent = 0u64;
            for _ in 0..30_000 {
                let f = garbage(&mut state);
                loop {
                    match evil.queue(&f) {
                        Ok(()) => break,
                        Err(svnic_backend::uplink::packet::PacketError::Full) => {
                            evil.flush().unwrap();
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("cannot queue a {}-byte frame: {e}", f.len()),
                    }
                }
                sent += 1;
            }
            evil.flush().unwrap();
            sent
        });
        for _ in 0..20 {
            assert_round_trip(&mut local);
        }
        flooder.join().unwrap()
    });
    assert_eq!(flood, 30_000);
    assert_round_trip(&mut local);
    let after = &uplink_until(a, |w| {
        w[0].get("rx_frames") >= before.get("rx_frames") + 1000
    })[0];
    let dropped: u64 = [
        "rx_malformed",
        "rx_spoofed",
        "rx_not_local",
        "rx_no_route",
        "recv.invalid",
    ]
    .iter()
    .map(|n| after.get(n) - before.get(n))
    .sum();
    assert!(dropped > 1000, "garbage not counted as dropped: {after:?}");
    // Every frame taken from the socket is accounted for in exactly one way.
    let taken = after.get("rx_frames") - before.get("rx_frames");
    let accounted: u64 = [
        "rx_malformed",
        "rx_spoofed",
        "rx_not_local",
        "rx_port_refused",
        "rx_to_ports",
        "rx_data",
        "rx_acks",
    ]
    .iter()
    .map(|n| after.get(n) - before.get(n))
    .sum();
    assert_eq!(accounted, taken, "{after:?}");
    assert!(
        after.get("recv.resets_sent") > before.get("recv.resets_sent"),
        "no well-formed bundle reached the receiving protocol: {after:?}"
    );
    // And the wire still carries good traffic (the local guests' sockets freed first: a guest's
    // socket serves one frontend at a time).
    drop(local);
    let mut across = PolitePair::connect(&a.socket(0), &hosts.hosts[1].socket(0)).unwrap();
    assert_round_trip(&mut across);
}

#[test]
fn every_frame_of_an_endpoint_is_handled_by_the_worker_serving_its_channel() {
    let Some(hosts) = two_hosts_with("wire-steer", |o| o.workers = 2) else {
        return;
    };
    let (ga, gb) = (guest(&hosts, 0, 0), guest(&hosts, 1, 0));
    let mut senders = [channel(&ga, 9, 2), channel(&ga, 10, 2)];
    let mut receivers: Vec<Channel> = (1..=4).map(|e| channel(&gb, e, 2)).collect();
    const K: u64 = 200;
    for (i, r) in receivers.iter().enumerate() {
        assert_eq!(
            r.served_by().0 as usize,
            (i + 1) % 2,
            "endpoint {} is placed on worker endpoint % 2",
            i + 1
        );
    }
    let to: Vec<ChannelAddr> = receivers.iter().map(|r| r.addr()).collect();
    let from: Vec<ChannelAddr> = senders.iter().map(|s| s.addr()).collect();
    std::thread::scope(|s| {
        let ga = &ga;
        let to = &to;
        s.spawn(move || {
            // Sender 0 (endpoint 9, worker 1) to endpoints 1 and 2; sender 1 (endpoint 10,
            // worker 0) to 3 and 4; every success completion asked for.
            for (k, sender) in senders.iter_mut().enumerate() {
                for j in 0..K {
                    for dest in &to[2 * k..2 * k + 2] {
                        while !sender
                            .send_user(*dest, j, &j.to_le_bytes(), Completions::Always)
                            .unwrap()
                        {
                            sender.flush().unwrap();
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    }
                }
                sender.flush().unwrap();
            }
            for (k, sender) in senders.iter_mut().enumerate() {
                let what = format!("completions of sender {k}");
                for c in receive_n(ga, sender, &what, 2 * K as usize, completion) {
                    assert_eq!(c.status, CompletionStatus::Ok, "{c:?}");
                }
            }
        });
        for (i, r) in receivers.iter_mut().enumerate() {
            receive_numbered(&gb, r, from[i / 2], K);
        }
    });
    // Worker 0 of host B took every message of endpoints 2 and 4 (in data and bundle frames),
    // worker 1 those of 1 and 3, and no frame reached a worker that does not serve its channel.
    let w = uplink_until(&hosts.hosts[1], |w| {
        w.iter()
            .map(|w| w.get("recv.messages_delivered"))
            .sum::<u64>()
            >= 4 * K
    });
    for v in &w {
        assert_eq!(v.get("rx_off_worker"), 0, "{v:?}");
        assert_eq!(v.get("recv.messages_delivered"), 2 * K, "{v:?}");
        assert!(v.get("recv.frames_accepted") > 0, "{v:?}");
    }
    // And the acks came back to the worker holding each sender's session (else its messages
    // would never complete): host A's workers each completed their sender's messages.
    let wa = uplink_until(&hosts.hosts[0], |w| {
        w.iter().all(|w| w.get("send.completed_ok") >= 2 * K)
    });
    for v in &wa {
        assert_eq!(v.get("send.completed_ok"), 2 * K, "{v:?}");
        assert_eq!(v.get("rx_off_worker"), 0, "{v:?}");
    }
}

/// `fi_pingpong` in host `h`'s namespace, attached to its guest 0 through the provider.
fn pingpong_in(
    h: &svnic_tests::wire_fixture::WireHost,
    args: &[&str],
    log: &std::path::Path,
) -> std::process::Child {
    use std::process::{Command, Stdio};
    use svnic_tests::libfabric::provider_dir;
    let out = std::fs::File::create(log).unwrap();
    let mut c = Command::new("ip");
    c.args(["netns", "exec", h.ns().name(), "fi_pingpong"])
        .args(args)
        .env("FI_PROVIDER_PATH", provider_dir())
        .env("FI_PROVIDER", "svnic")
        .env("FI_SVNIC_LOG", "warn")
        .env("FI_SVNIC_SOCKET", h.socket(0))
        .env_remove("FI_SVNIC_ENDPOINT")
        .stdin(Stdio::null())
        .stderr(out.try_clone().unwrap())
        .stdout(out);
    svnic_tests::daemon_proc::kill_with_parent(&mut c);
    c.spawn().unwrap()
}

/// True once a TCP socket listens on `port` in `h`'s namespace.
fn listening_in(h: &svnic_tests::wire_fixture::WireHost, port: u16) -> bool {
    std::process::Command::new("ip")
        .args(["netns", "exec", h.ns().name(), "ss", "-Hltn"])
        .arg(format!("sport = :{port}"))
        .output()
        .is_ok_and(|o| !o.stdout.is_empty())
}

#[test]
fn fi_pingpong_runs_between_hosts_over_the_provider() {
    let Some(hosts) = two_hosts("wire-fi", &WireOptions::default()) else {
        return;
    };
    // fi_pingpong's out-of-band socket: TCP over the same cable.
    for (i, h) in hosts.hosts.iter().enumerate() {
        h.ns()
            .ip(&[
                "addr",
                "add",
                &format!("10.199.0.{}/24", i + 1),
                "dev",
                "sv0",
            ])
            .unwrap();
    }
    let dir = svnic_tests::daemon_proc::ScratchDir::new("wire-fi").unwrap();
    let port = svnic_tests::libfabric::free_port().to_string();
    let common = ["-p", "svnic", "-e", "dgram", "-S", "all", "-c", "-I", "10"];
    let (server_log, client_log) = (dir.path().join("server.log"), dir.path().join("client.log"));
    let mut server = svnic_tests::daemon_proc::KillOnDrop(pingpong_in(
        &hosts.hosts[0],
        &[&common[..], &["-B", &port]].concat(),
        &server_log,
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listening_in(&hosts.hosts[0], port.parse().unwrap()) {
        assert!(Instant::now() < deadline, "the server never listened");
        assert!(server.0.try_wait().unwrap().is_none(), "the server exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client = svnic_tests::daemon_proc::KillOnDrop(pingpong_in(
        &hosts.hosts[1],
        &[&common[..], &["-P", &port, "10.199.0.1"]].concat(),
        &client_log,
    ));
    let deadline = Instant::now() + Duration::from_secs(120);
    let statuses = [
        client.wait_until(deadline).unwrap(),
        server.wait_until(deadline).unwrap(),
    ];
    for ((who, log), status) in [("client", &client_log), ("server", &server_log)]
        .into_iter()
        .zip(statuses)
    {
        let out = std::fs::read_to_string(log).unwrap();
        assert!(
            status.is_some_and(|s| s.success()),
            "{who}: {status:?}\n{out}"
        );
        assert_eq!(
            svnic_tests::libfabric::acked_sizes(who, &out, 10),
            svnic_tests::libfabric::all_sizes(64 << 10),
            "{who}:\n{out}"
        );
    }
    // It went over the wire, through the engines' sessions.
    let w = &uplink_until(&hosts.hosts[0], |w| w[0].get("send.completed_ok") > 0)[0];
    assert!(
        w.get("rx_data") > 0 && w.get("send.completed_ok") > 0,
        "{w:?}"
    );
}
