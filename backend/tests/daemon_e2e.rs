//! The whole daemon end to end, over real vhost-user Unix sockets: host-process guests (the
//! virtio-user frontend of svnic-guest) and hostile frame-level frontends, against
//! `Daemon::start` exactly as `svnic serve` runs it.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_backend::admin::{AdminRequest, AdminResponse, AdminSource};
use svnic_backend::config::EngineOverrides;
use svnic_channels::frame::ControlStatus;
use svnic_channels::{ChannelAddr, CompletionStatus, DataRef, FailureReason, MacAddr, Message};
use svnic_host_frontend::HostGuest;
use svnic_tests::daemon_fixture::{assert_numbered_user_data, recv_messages, DaemonFixture};
use svnic_tests::daemon_proc::{spawn_test_child, KillOnDrop};
use svnic_tests::fake_guest::post_flushed;
use svnic_tests::frames::{create_op as create, eth, mac_in};
use svnic_tests::logs;
use svnic_tests::raw_frontend::Sealing;
use svnic_tests::vhost_frontend::{TestFrontend, FREE};
use svnic_tests::wait::wait_until;
use vhost::VhostBackend;
use vhost::VhostUserMemoryRegionInfo;

const T: Duration = Duration::from_secs(10);

fn mac(n: u8) -> MacAddr {
    mac_in(0xe2, n)
}

/// A daemon with guests 1..=n; guest 1 may have at most 2 channels.
fn daemon(n: u8, backpressure_ms: u64) -> DaemonFixture {
    let guests: Vec<_> = (1..=n)
        .map(|i| (mac(i), if i == 1 { ",channels=2" } else { "" }))
        .collect();
    let overrides = EngineOverrides {
        backpressure_wait_ms: Some(backpressure_ms),
        ..Default::default()
    };
    DaemonFixture::start("e2e", &guests, overrides)
}

fn recv(ch: &mut svnic_client::Channel, g: &HostGuest, n: usize) -> Vec<Message> {
    recv_messages(ch, g, n, T)
}

// ---------------------------------------------------------------------------------------------
// Control path: success and each failure reason, from a frame-level (hostile) frontend.
// ---------------------------------------------------------------------------------------------

/// Where the second guest's memory table splits its memory in two regions: inside the test's memory.
const SEAM: u64 = FREE + 0x8_0000;

fn failure(answers: &[(ControlStatus, u32)]) -> Option<FailureReason> {
    match answers.last() {
        Some((ControlStatus::Failure(r), _)) => Some(*r),
        _ => None,
    }
}

#[test]
fn channel_creation_succeeds_and_fails_for_each_reason_over_a_real_socket() {
    let s = daemon(2, 100);
    let mut f = TestFrontend::start(&s.sock(1));
    let me = mac(1);
    let k = 64 << 10;

    let ok = f.control(me, 1, create(me, 1, 16, FREE, k));
    assert!(
        matches!(ok.as_slice(), [(ControlStatus::Pending, id), (ControlStatus::Success { .. }, id2)] if id == id2),
        "{ok:?}"
    );
    assert_eq!(
        failure(&f.control(me, 2, create(me, 1, 16, FREE + k, k))),
        Some(FailureReason::EndpointTaken)
    );
    assert_eq!(
        failure(&f.control(me, 3, create(me, 2, 100, FREE + k, k))),
        Some(FailureReason::BadRingSize)
    );
    // Pending, then Failure: only the engine's look at the memory table can tell.
    let outside = f.control(me, 4, create(me, 2, 16, 64 << 20, k));
    assert_eq!(outside.first().map(|a| a.0), Some(ControlStatus::Pending));
    assert_eq!(failure(&outside), Some(FailureReason::RegionOutsideMemory));
    assert_eq!(
        failure(&f.control(me, 5, create(mac(2), 2, 16, FREE + k, k))),
        Some(FailureReason::MacNotOwned)
    );
    assert!(matches!(
        f.control(me, 6, create(me, 2, 16, FREE + k, k)).last(),
        Some((ControlStatus::Success { .. }, _))
    ));
    assert_eq!(
        failure(&f.control(me, 7, create(me, 3, 16, FREE + 2 * k, k))),
        Some(FailureReason::QuotaExceeded)
    );

    // A second guest whose memory table has two regions: a channel across the seam is refused.
    let mut g = TestFrontend::start(&s.sock(2));
    g.set_split_mem_table(SEAM);
    let straddle = g.control(mac(2), 8, create(mac(2), 1, 16, SEAM - k, 2 * k));
    assert_eq!(failure(&straddle), Some(FailureReason::RegionStraddles));
    assert!(matches!(
        g.control(mac(2), 9, create(mac(2), 1, 16, SEAM, k)).last(),
        Some((ControlStatus::Success { .. }, _))
    ));

    // The operator view lists them.
    let AdminResponse::Channels { channels } = s.daemon().view().answer(AdminRequest::Channels)
    else {
        panic!()
    };
    assert_eq!(
        channels.iter().filter(|c| c.state == "Success").count(),
        3,
        "{channels:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Data: channels and virtio-net frames between host-process guests.
// ---------------------------------------------------------------------------------------------

#[test]
fn user_data_and_dma_data_between_two_host_process_guests_intact_and_in_order() {
    let s = daemon(2, 100);
    let (ga, gb) = (s.guest(1), s.guest(2));
    let mut a = ga.create_channel(7, 256, T).unwrap();
    let mut b = gb.create_channel(9, 256, T).unwrap();
    let b_addr = ChannelAddr::new(mac(2), 9);
    let n = 5000u64;
    let mut sent = 0;
    let mut got = Vec::new();
    while (got.len() as u64) < n {
        while sent < n
            && a.send_user(b_addr, sent, &sent.to_le_bytes(), Completions::OnError)
                .unwrap()
        {
            sent += 1;
        }
        a.flush().unwrap();
        got.extend(recv(&mut b, &gb, 1));
    }
    assert_numbered_user_data(&got, a.addr());
    // DMA-data: 100 KiB, copied into a posted buffer, COMPLETE, with a completion for the sender.
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let (da, db) = (a.layout().data_offset, b.layout().data_offset);
    post_flushed(&mut b, 77, db, 128 << 10);
    a.write_data(da, &data).unwrap();
    a.send_dma(
        b_addr,
        5,
        DataRef {
            offset: da,
            len: data.len() as u32,
        },
    )
    .unwrap();
    a.flush().unwrap();
    let m = recv(&mut b, &gb, 1);
    let Message::DmaData(d) = m[0] else {
        panic!("{m:?}")
    };
    assert!(d.is_complete() && d.cookie == 77 && d.data.len as usize == data.len());
    let mut back = vec![0u8; data.len()];
    b.read_data(d.data.offset, &mut back).unwrap();
    assert!(back == data, "DMA payload intact");
    let c = recv(&mut a, &ga, 1);
    assert!(
        matches!(c[0], Message::Completion(c) if c.cookie == 5 && c.status == CompletionStatus::Ok && c.len as usize == data.len())
    );
}

/// A frame of 50 bytes `tag` (ethertype 0x88b6, local experimental).
fn tagged(dst: MacAddr, src: MacAddr, tag: u8) -> Vec<u8> {
    eth(dst, src, 0x88b6, &[tag; 50])
}

fn raw_frames(g: &HostGuest, quiet: Duration) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        if !g.wait_raw(quiet).unwrap() {
            return out;
        }
        g.recv_raw(&mut out, 64).unwrap();
    }
}

#[test]
fn virtio_net_unicast_broadcast_and_a_spoofed_source_counted() {
    let s = daemon(3, 100);
    let (g1, g2, g3) = (s.guest(1), s.guest(2), s.guest(3));
    assert!(g1.send_raw(&tagged(mac(2), mac(1), 1)).unwrap());
    assert!(g1.send_raw(&tagged(MacAddr::BROADCAST, mac(1), 2)).unwrap());
    assert!(g1.send_raw(&tagged(mac(2), mac(3), 3)).unwrap()); // spoofs guest 3
    let at2 = raw_frames(&g2, Duration::from_millis(300));
    let at3 = raw_frames(&g3, Duration::from_millis(300));
    assert_eq!(
        at2,
        vec![
            tagged(mac(2), mac(1), 1),
            tagged(MacAddr::BROADCAST, mac(1), 2)
        ]
    );
    assert_eq!(at3, vec![tagged(MacAddr::BROADCAST, mac(1), 2)]);
    assert!(
        raw_frames(&g1, Duration::from_millis(100)).is_empty(),
        "a broadcast does not return to its sender"
    );
    let stats = s.daemon().switch().stats();
    let p1 = stats.iter().find(|p| p.macs.contains(&mac(1))).unwrap();
    assert_eq!(p1.drops.spoofed, 1);
    let AdminResponse::Guests { guests } = s.daemon().view().answer(AdminRequest::Guests) else {
        panic!()
    };
    assert!(guests.iter().all(|g| g.connected));
    assert_eq!(guests[0].drops, 1);
}

// ---------------------------------------------------------------------------------------------
// A guest process killed mid-traffic.
// ---------------------------------------------------------------------------------------------

/// Not a test on its own: when SVNIC_E2E_CHILD_SOCKET is set, this runs as the child guest
/// process of `a_guest_killed_mid_traffic...`: it connects, creates channel 9, and sleeps.
#[test]
fn child_guest_process() {
    let Ok(sock) = std::env::var("SVNIC_E2E_CHILD_SOCKET") else {
        return;
    };
    let g = HostGuest::connect(&sock, 64 << 20).unwrap();
    let _ch = g.create_channel(9, 256, T).unwrap();
    println!("CHILD-READY");
    std::thread::sleep(Duration::from_secs(60));
}

/// A child guest process, killed and reaped when dropped (even if the test fails first).
struct ChildGuest(KillOnDrop);

impl ChildGuest {
    fn alive(&mut self) -> bool {
        self.0 .0.try_wait().unwrap().is_none()
    }
    fn kill(&mut self) {
        let _ = self.0 .0.kill(); // SIGKILL
        let _ = self.0 .0.wait();
    }
}

fn spawn_child(sock: &Path) -> ChildGuest {
    let (child, _) = spawn_test_child(
        "child_guest_process",
        "SVNIC_E2E_CHILD_SOCKET",
        sock.as_os_str(),
        "CHILD-READY",
    )
    .unwrap();
    ChildGuest(child)
}

#[test]
fn a_guest_killed_mid_traffic_is_torn_down_and_can_come_back() {
    let s = daemon(3, 50);
    let ga = s.guest(1);
    let mut a = ga.create_channel(1, 256, T).unwrap();
    let b_addr = ChannelAddr::new(mac(2), 9);
    let mut child = spawn_child(&s.sock(2));

    // A streams to B (which never reads: messages are held, then delivered while room lasts).
    let mut completions = Vec::new();
    let mut sent = 0u64;
    let deadline = Instant::now() + T;
    while sent < 600 {
        while sent < 600
            && a.send_user(b_addr, sent, b"to-b", Completions::OnError)
                .unwrap()
        {
            sent += 1;
        }
        a.flush().unwrap();
        a.poll(&mut completions, 256).unwrap();
        if sent >= 300 && child.alive() {
            child.kill(); // SIGKILL, mid-traffic
        }
        assert!(Instant::now() < deadline);
    }
    // Every message is delivered or error-completed; the errors name the destination's fate.
    let engine = s.daemon().engine();
    let a_id = svnic_channels::ChannelId(a.id());
    let deadline = Instant::now() + T;
    loop {
        a.poll(&mut completions, 256).unwrap();
        let st = engine.channel_stats(a_id).unwrap();
        if st.tx_taken == sent && completions.len() as u64 == st.tx_errors_total() {
            assert_eq!(st.tx_delivered + st.tx_errors_total(), sent);
            assert!(
                st.tx_errors_total() > 0,
                "messages to the dead guest were error-completed"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "accounting did not settle: {st:?}, {} completions",
            completions.len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for m in &completions {
        let Message::Completion(c) = m else {
            panic!("{m:?}")
        };
        assert!(
            matches!(
                c.status,
                CompletionStatus::NoRoute
                    | CompletionStatus::DestinationGone
                    | CompletionStatus::RingFull
            ),
            "{c:?}"
        );
    }
    // The dead guest's channels are gone; the daemon still serves the others.
    let guest2 = engine.control_plane().guest_by_name("g2").unwrap();
    wait_until(T, || {
        engine.control_plane().live_channels_of(guest2).is_empty()
    });
    let g3 = s.guest(3);
    let mut c = g3.create_channel(3, 256, T).unwrap();
    a.send_user(
        ChannelAddr::new(mac(3), 3),
        1,
        b"alive",
        Completions::OnError,
    )
    .unwrap();
    a.flush().unwrap();
    assert_eq!(recv(&mut c, &g3, 1).len(), 1);
    // The guest comes back on the same socket and gets the same endpoint again.
    let gb = s.guest(2);
    let mut b = gb.create_channel(9, 256, T).unwrap();
    a.send_user(b_addr, 2, b"again", Completions::OnError)
        .unwrap();
    a.flush().unwrap();
    let got = recv(&mut b, &gb, 1);
    assert!(matches!(got[0], Message::UserData(u) if u.data() == b"again"));
}

#[test]
fn garbage_on_a_socket_leaves_the_daemon_serving_the_others() {
    use std::io::Write;
    logs::capture(log::LevelFilter::Info);
    let s = daemon(3, 100);
    let (g1, g2) = (s.guest(1), s.guest(2));
    let mut a = g1.create_channel(1, 256, T).unwrap();
    let mut b = g2.create_channel(2, 256, T).unwrap();
    for garbage in [
        &b"\x01\x02 random bytes \xff\xfe"[..],
        &[0u8; 7][..],
        &[1, 0, 0, 0, 1, 0, 0, 0, 255, 255, 255, 255][..],
    ] {
        let mut raw = std::os::unix::net::UnixStream::connect(s.sock(3)).unwrap();
        raw.write_all(garbage).unwrap();
        drop(raw);
    }
    // An absurd memory table: a region far larger than its file.
    let mut f = TestFrontend::connect(&s.sock(3), Sealing::Unsealed);
    f.negotiate().unwrap();
    let absurd = VhostUserMemoryRegionInfo {
        memory_size: 1 << 40,
        ..f.region()
    };
    let _ = f.frontend.set_mem_table(&[absurd]);
    drop(f);
    // Guests 1 and 2 are unaffected, and guest 3's socket takes a good frontend afterwards.
    a.send_user(b.addr(), 1, b"fine", Completions::OnError)
        .unwrap();
    a.flush().unwrap();
    assert_eq!(recv(&mut b, &g2, 1).len(), 1);
    let g3 = s.guest(3);
    assert!(g3.create_channel(3, 256, T).is_ok());
    // Each bad connection ended with a log line that says what was wrong.
    for words in [
        &[
            "guest 3",
            "frontend connection ended",
            "announces a 2036473965-byte body",
        ][..],
        &[
            "guest 3",
            "frontend connection ended",
            "in the middle of message 0 (7 of 12 bytes)",
        ],
        &[
            "guest 3",
            "frontend connection ended",
            "announces a 4294967295-byte body",
        ],
        &["guest 3", "unusable memory table", "0x10000000000 bytes"],
    ] {
        logs::wait_for(words);
    }
}
