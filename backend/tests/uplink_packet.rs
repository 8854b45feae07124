//! The uplink's packet sockets on a real veth cable between two network namespaces ("hosts"):
//! batches arrive intact and in order, a fanout group steers every endpoint to its worker,
//! frames longer than a ring slot are counted and dropped, a full TX ring is flushed and
//! retried, our own transmissions never come back, and a downed or removed interface is an
//! error. Runs as root; skipped with a message when namespaces cannot be created.
#![allow(clippy::unwrap_used)]

use std::thread::sleep;
use std::time::{Duration, Instant};

use svnic_backend::uplink::packet::{
    steered_worker, worker_of_endpoint, PacketConfig, PacketError, PacketSocket,
};
use svnic_channels::MacAddr;
use svnic_tests::frames::{eth, mac_in, payload};
use svnic_tests::netns::{veth_pair, NetNs};

const T: Duration = Duration::from_secs(10);
/// Host A's interface (the receiving side unless a test says otherwise) and host B's.
const A_IF: &str = "svpa0";
const B_IF: &str = "svpb0";

/// The MAC test frames come from on each host (the veth's own MACs are not used: the sockets
/// are promiscuous, and filtering on these keeps the kernel's own chatter out of the counts).
fn test_mac(host: u8) -> MacAddr {
    mac_in(0xe7, host)
}

/// Two hosts joined by a veth cable, or None (after saying why) when this machine cannot
/// create them.
struct Hosts {
    a: NetNs,
    b: NetNs,
}

fn hosts() -> Option<Hosts> {
    let made = (|| -> std::io::Result<Hosts> {
        let a = NetNs::unique("svnic-pk")?;
        let b = NetNs::unique("svnic-pk")?;
        veth_pair(&a, A_IF, &b, B_IF)?;
        Ok(Hosts { a, b })
    })();
    match made {
        Ok(h) => Some(h),
        Err(e) => {
            eprintln!("skipping: cannot create network namespaces and a veth pair: {e}");
            None
        }
    }
}

fn open(ns: &NetNs, iface: &str, cfg: PacketConfig) -> PacketSocket {
    ns.run_in(|| PacketSocket::open(iface, &cfg))
        .unwrap()
        .unwrap()
}

/// An svnic frame of `kind` (3 data, 6 ack) from host B to `endpoint`, `len` bytes long,
/// numbered `seq` (bytes 26..30) and filled with a pattern of it.
fn svnic(kind: u8, endpoint: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut body = vec![1, kind, 0, 0];
    body.extend_from_slice(&7u32.to_le_bytes());
    body.extend_from_slice(&endpoint.to_le_bytes());
    body.extend_from_slice(&seq.to_le_bytes());
    body.extend_from_slice(&payload(seq as u8, len.max(30) - 30));
    eth(test_mac(2), test_mac(1), 0x88B5, &body)
}

fn endpoint_of(frame: &[u8]) -> u32 {
    u32::from_le_bytes(frame[22..26].try_into().unwrap())
}

/// Queues `frames` and flushes, retrying on a full TX ring until `T` passes (while also
/// draining `drain`, if any, into its vector). Returns how many times the ring was full.
fn send_all(
    tx: &mut PacketSocket,
    frames: &[Vec<u8>],
    mut drain: Option<(&mut PacketSocket, &mut Vec<Vec<u8>>)>,
) -> usize {
    let deadline = Instant::now() + T;
    let mut full = 0;
    for frame in frames {
        loop {
            match tx.queue(frame) {
                Ok(()) => break,
                Err(PacketError::Full) => {
                    full += 1;
                    tx.flush().unwrap();
                    if let Some((rx, got)) = drain.as_mut() {
                        receive_from(rx, test_mac(1), got);
                    }
                    assert!(Instant::now() < deadline, "TX ring stayed full");
                    sleep(Duration::from_micros(100));
                }
                Err(e) => panic!("queue: {e}"),
            }
        }
    }
    while tx.tx_pending() > 0 {
        tx.flush().unwrap();
        assert!(Instant::now() < deadline, "frames stayed queued");
    }
    full
}

/// Receives what is in `rx`'s ring, keeping the frames from `src`.
fn receive_from(rx: &mut PacketSocket, src: MacAddr, got: &mut Vec<Vec<u8>>) {
    rx.receive(256, |f| {
        if f.get(6..12) == Some(&src.0[..]) {
            got.push(f.to_vec());
        }
    });
}

/// Receives frames from `src` on `rx` until `want` have come or `T` passes, then for 50 ms
/// more so that extra frames would be seen.
fn collect(rx: &mut PacketSocket, src: MacAddr, want: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + T;
    while got.len() < want && Instant::now() < deadline {
        receive_from(rx, src, &mut got);
        sleep(Duration::from_millis(1));
    }
    sleep(Duration::from_millis(50));
    receive_from(rx, src, &mut got);
    got
}

#[test]
fn batches_of_svnic_frames_arrive_intact_and_in_order() {
    let Some(h) = hosts() else { return };
    let mut rx = open(&h.a, A_IF, PacketConfig::default());
    let mut tx = open(&h.b, B_IF, PacketConfig::default());
    assert_eq!(rx.mtu(), 1500);
    let mut sent = Vec::new();
    for batch in 0..10u32 {
        let frames: Vec<Vec<u8>> = (0..32u32)
            .map(|i| {
                let seq = batch * 32 + i;
                let kind = if seq % 3 == 0 { 6 } else { 3 };
                let endpoint = [0, 1, 1 << 31, u32::MAX, seq][(seq % 5) as usize];
                svnic(kind, endpoint, seq, 60 + (seq as usize * 97) % 1455)
            })
            .collect();
        for f in &frames {
            tx.queue(f).unwrap();
        }
        assert_eq!(tx.flush().unwrap(), 32, "one send() takes the whole batch");
        sent.extend(frames);
    }
    let got = collect(&mut rx, test_mac(1), sent.len());
    assert_eq!(got.len(), sent.len());
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert_eq!(g, s, "frame {i}");
    }
    let (rs, ts) = (rx.stats(), tx.stats());
    assert!(rs.received >= sent.len() as u64, "{rs:?}");
    assert_eq!(
        (rs.truncated, rs.rx_kernel_drops, rs.outgoing_ignored),
        (0, 0, 0)
    );
    assert_eq!(ts.sent, sent.len() as u64);
}

#[test]
fn a_fanout_group_steers_every_endpoint_to_its_worker() {
    let Some(h) = hosts() else { return };
    let mut tx = open(&h.b, B_IF, PacketConfig::default());
    for workers in [2u16, 3] {
        let n = usize::from(workers);
        let mut group: Vec<PacketSocket> = (0..n)
            .map(|_| open(&h.a, A_IF, PacketConfig::default()))
            .collect();
        // Member 0 makes a group of its own (an id no one else in the namespace uses), the
        // others join it in order.
        let id = group[0].create_fanout(workers).unwrap();
        for s in &group[1..] {
            s.join_fanout(id, workers).unwrap();
        }
        // A second group made the same way gets another id.
        let other = open(&h.a, A_IF, PacketConfig::default());
        assert_ne!(other.create_fanout(1).unwrap(), id);
        drop(other);
        let endpoints = [0, 1, 2, 3, 4, 5, 7, 1 << 31, u32::MAX, 12_345];
        let mut frames = Vec::new();
        for round in 0..20u32 {
            for (i, &e) in endpoints.iter().enumerate() {
                // Data, ack and bundle frames all go by endpoint.
                let kind = [3, 6, 7][(round as usize + i) % 3];
                frames.push(svnic(kind, e, round * 100 + i as u32, 90));
            }
        }
        // Frames that are not svnic data, acks or bundles go by destination MAC.
        let others: Vec<Vec<u8>> = (0..12u8)
            .map(|i| eth(mac_in(0xe8, i), test_mac(1), 0x0800, &payload(i, 46)))
            .collect();
        frames.extend(others.iter().cloned());
        send_all(&mut tx, &frames, None);

        let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); n];
        let deadline = Instant::now() + T;
        while got.iter().map(Vec::len).sum::<usize>() < frames.len() && Instant::now() < deadline {
            for (s, g) in group.iter_mut().zip(&mut got) {
                receive_from(s, test_mac(1), g);
            }
            sleep(Duration::from_millis(1));
        }
        sleep(Duration::from_millis(50));
        for (s, g) in group.iter_mut().zip(&mut got) {
            receive_from(s, test_mac(1), g);
        }

        let mut expected = vec![0usize; n];
        for f in &frames {
            expected[steered_worker(f, workers)] += 1;
        }
        let counts: Vec<usize> = got.iter().map(Vec::len).collect();
        assert_eq!(counts, expected, "{workers} workers: frames per socket");
        assert!(expected.iter().all(|&c| c > 0), "every worker has traffic");
        for (worker, frames) in got.iter().enumerate() {
            for f in frames {
                if f[12..14] == [0x88, 0xB5] {
                    let e = endpoint_of(f);
                    assert_eq!(worker_of_endpoint(e, n), worker, "endpoint {e}");
                } else {
                    assert!(others.contains(f));
                    assert_eq!(steered_worker(f, workers), worker);
                }
            }
        }
    }
}

#[test]
fn a_frame_of_mtu_size_passes_and_one_beyond_the_slot_is_counted_truncated() {
    let Some(h) = hosts() else { return };
    // Slots sized for MTU 1500; then the cable's MTU grows under the socket.
    let mut rx = open(&h.a, A_IF, PacketConfig::default());
    let slot = rx.frame_size();
    for (ns, iface) in [(&h.a, A_IF), (&h.b, B_IF)] {
        ns.set_mtu(iface, 9000).unwrap();
    }
    let mut tx = open(&h.b, B_IF, PacketConfig::default());
    assert_eq!(tx.mtu(), 9000);
    assert_eq!(tx.max_frame_len(false), 9014);

    let full_size = svnic(3, 1, 1, 1514);
    let jumbo = svnic(3, 1, 2, 4000);
    let after = svnic(3, 1, 3, 1514);
    send_all(&mut tx, &[full_size.clone(), jumbo, after.clone()], None);
    let got = collect(&mut rx, test_mac(1), 2);
    assert_eq!(got, vec![full_size, after]);
    let stats = rx.stats();
    assert_eq!(stats.truncated, 1, "{stats:?}");

    // A slot too small for the interface's MTU is refused at open.
    let cfg = PacketConfig {
        frame_size: Some(slot),
        ..PacketConfig::default()
    };
    let err = h.a.run_in(|| PacketSocket::open(A_IF, &cfg)).unwrap();
    assert!(
        matches!(err, Err(PacketError::SlotTooSmall { mtu: 9000, .. })),
        "{err:?}"
    );
    // And a frame longer than MTU + 14 is refused by queue.
    let err = tx.queue(&svnic(3, 1, 4, 9015));
    assert!(
        matches!(
            err,
            Err(PacketError::FrameSize {
                len: 9015,
                max: 9014,
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn a_thousand_frames_through_a_small_tx_ring_reach_the_peer_in_order() {
    let Some(h) = hosts() else { return };
    let mut rx = open(&h.a, A_IF, PacketConfig::default());
    let small = PacketConfig {
        tx_frames: 32,
        ..PacketConfig::default()
    };
    let mut tx = open(&h.b, B_IF, small);
    assert!(tx.ring_frames().1 < 1000);
    let frames: Vec<Vec<u8>> = (0..1000u32)
        .map(|seq| svnic(3, seq % 7, seq, 60 + (seq as usize % 200)))
        .collect();
    let mut got = Vec::new();
    let full = send_all(&mut tx, &frames, Some((&mut rx, &mut got)));
    assert!(full > 0, "the TX ring was never full");
    assert_eq!(tx.stats().tx_full, full as u64);
    let deadline = Instant::now() + T;
    while got.len() < frames.len() && Instant::now() < deadline {
        receive_from(&mut rx, test_mac(1), &mut got);
        sleep(Duration::from_millis(1));
    }
    assert_eq!(got.len(), frames.len());
    assert!(got == frames, "frames arrived out of order or damaged");
    assert_eq!(tx.stats().sent, 1000);
}

#[test]
fn our_own_transmissions_are_not_received_back() {
    let Some(h) = hosts() else { return };
    let mut peer = open(&h.b, B_IF, PacketConfig::default());
    let mut plain = open(&h.a, A_IF, PacketConfig::default());
    let mut member = open(&h.a, A_IF, PacketConfig::default());
    member.join_fanout(7, 1).unwrap();
    let from_a = |seq: u32| {
        let mut f = svnic(3, seq, seq, 64);
        f[6..12].copy_from_slice(&test_mac(3).0);
        f
    };
    let plain_frames: Vec<Vec<u8>> = (0..50).map(from_a).collect();
    let member_frames: Vec<Vec<u8>> = (50..100).map(from_a).collect();
    send_all(&mut plain, &plain_frames, None);
    send_all(&mut member, &member_frames, None);
    let at_peer = collect(&mut peer, test_mac(3), 100);
    assert_eq!(at_peer.len(), 100, "the frames went out");
    // Each socket of host A sees the other's transmissions only if the kernel loops them
    // back; neither sees anything from host A's MAC.
    for s in [&mut plain, &mut member] {
        let mut own = Vec::new();
        receive_from(s, test_mac(3), &mut own);
        assert!(own.is_empty(), "{} of our own frames came back", own.len());
        assert_eq!(s.stats().outgoing_ignored, 0, "the kernel filtered them");
    }
}

#[test]
fn a_downed_or_removed_interface_is_an_error_not_a_panic() {
    let Some(h) = hosts() else { return };
    let bad = |name: &str| {
        h.a.run_in(|| PacketSocket::open(name, &PacketConfig::default()))
    };
    assert!(matches!(
        bad("").unwrap(),
        Err(PacketError::BadInterfaceName(_))
    ));
    assert!(matches!(
        bad("a-name-too-long-for-linux").unwrap(),
        Err(PacketError::BadInterfaceName(_))
    ));
    assert!(matches!(
        bad("svnone0").unwrap(),
        Err(PacketError::NoSuchInterface { .. })
    ));
    h.a.set_down(A_IF).unwrap();
    assert!(matches!(
        bad(A_IF).unwrap(),
        Err(PacketError::InterfaceDown { .. })
    ));
    h.a.set_up(A_IF).unwrap();

    let mut tx = open(&h.a, A_IF, PacketConfig::default());
    let mut peer = open(&h.b, B_IF, PacketConfig::default());
    assert!(tx.take_error().is_ok());
    h.a.set_down(A_IF).unwrap();
    assert!(
        matches!(tx.take_error(), Err(PacketError::InterfaceDown { .. })),
        "the socket reports the interface down"
    );
    let queued = svnic(3, 5, 1, 100);
    tx.queue(&queued).unwrap();
    assert!(matches!(tx.flush(), Err(PacketError::InterfaceDown { .. })));
    assert_eq!(tx.tx_pending(), 1, "the frame stays queued");
    // The frame goes out once the interface is back up.
    h.a.set_up(A_IF).unwrap();
    let deadline = Instant::now() + T;
    while tx.flush().is_err() {
        assert!(
            Instant::now() < deadline,
            "flush kept failing after the link came up"
        );
        sleep(Duration::from_millis(10));
    }
    assert_eq!(collect(&mut peer, test_mac(1), 1), vec![queued]);

    h.a.ip(&["link", "del", A_IF]).unwrap();
    tx.queue(&svnic(3, 5, 2, 100)).unwrap();
    assert!(matches!(tx.flush(), Err(PacketError::InterfaceGone { .. })));
    assert!(matches!(
        tx.take_error(),
        Err(PacketError::InterfaceGone { .. })
    ));
    assert_eq!(tx.receive(64, |_| panic!("nothing can arrive")), 0);
}

#[test]
fn vlan_tagged_frames_arrive_with_their_tag_in_place() {
    let Some(h) = hosts() else { return };
    let mut rx = open(&h.a, A_IF, PacketConfig::default());
    let mut tx = open(&h.b, B_IF, PacketConfig::default());
    let tagged = |tpid: u16, tci: u16, inner: &[u8]| {
        let mut f = inner[..12].to_vec();
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&tci.to_be_bytes());
        f.extend_from_slice(&inner[12..]);
        f
    };
    let frames = vec![
        tagged(0x8100, 0x2007, &svnic(3, 9, 1, 200)),
        svnic(3, 9, 2, 200),
        tagged(
            0x88a8,
            0x0123,
            &eth(mac_in(0xe8, 1), test_mac(1), 0x0800, &[7; 46]),
        ),
        // A frame of MTU + 14 bytes with a tag on top.
        tagged(0x8100, 0x0fff, &svnic(6, 9, 3, 1514)),
    ];
    send_all(&mut tx, &frames, None);
    let got = collect(&mut rx, test_mac(1), frames.len());
    assert_eq!(got, frames);
    assert_eq!(rx.stats().vlan_reinserted, 3);
}

#[test]
fn a_full_rx_ring_drops_in_the_kernel_counts_it_and_recovers() {
    let Some(h) = hosts() else { return };
    let tiny = PacketConfig {
        rx_frames: 1,
        ..PacketConfig::default()
    };
    let mut rx = open(&h.a, A_IF, tiny);
    let slots = rx.ring_frames().0;
    assert!(slots < 8, "{slots} RX slots");
    let mut tx = open(&h.b, B_IF, PacketConfig::default());
    let burst: Vec<Vec<u8>> = (0..50).map(|seq| svnic(3, 1, seq, 60)).collect();
    send_all(&mut tx, &burst, None);
    // The burst is in the ring (or dropped) by now: take what is there, without waiting for
    // slots the kernel's own chatter may hold.
    sleep(Duration::from_millis(50));
    let mut kept = Vec::new();
    receive_from(&mut rx, test_mac(1), &mut kept);
    assert!(kept.len() <= slots, "{} frames kept", kept.len());
    // The ring kept the oldest frames, in order, and the kernel counted the rest as drops.
    assert_eq!(kept[..], burst[..kept.len()]);
    let drops = rx.stats().rx_kernel_drops;
    assert!(drops >= (burst.len() - slots) as u64, "{drops} drops");
    // With its slots back, the ring receives again.
    let after = svnic(3, 1, 99, 60);
    send_all(&mut tx, std::slice::from_ref(&after), None);
    assert_eq!(collect(&mut rx, test_mac(1), 1), vec![after]);
}

#[test]
fn bad_ring_settings_are_refused_naming_the_field() {
    let Some(h) = hosts() else { return };
    let open_with = |cfg: PacketConfig| h.a.run_in(|| PacketSocket::open(A_IF, &cfg)).unwrap();
    let d = PacketConfig::default();
    let cases = [
        (PacketConfig { rx_frames: 0, ..d }, "rx_frames", 0),
        (PacketConfig { tx_frames: 0, ..d }, "tx_frames", 0),
        (
            PacketConfig {
                rx_frames: 70_000,
                ..d
            },
            "rx_frames",
            70_000,
        ),
        (
            PacketConfig {
                frame_size: Some(2004),
                ..d
            },
            "frame_size",
            2004,
        ),
        (
            PacketConfig {
                frame_size: Some(0),
                ..d
            },
            "frame_size",
            0,
        ),
        (
            PacketConfig {
                frame_size: Some(1 << 16),
                rx_frames: 1 << 16,
                ..d
            },
            "rx_frames",
            1 << 16,
        ),
    ];
    for (cfg, want_field, want_value) in cases {
        match open_with(cfg) {
            Err(PacketError::Config { field, value, .. }) => {
                assert_eq!((field, value), (want_field, want_value), "{cfg:?}")
            }
            other => panic!("{cfg:?}: {other:?}"),
        }
    }
    // A multiple of 16 below what MTU 1500 needs (66 + 1514, rounded up to 1584).
    let small = open_with(PacketConfig {
        frame_size: Some(1568),
        ..d
    });
    assert!(
        matches!(
            small,
            Err(PacketError::SlotTooSmall {
                mtu: 1500,
                needed: 1584,
                ..
            })
        ),
        "{small:?}"
    );
    let exact = open_with(PacketConfig {
        frame_size: Some(1584),
        ..d
    })
    .unwrap();
    assert_eq!(exact.frame_size(), 1584);
}
