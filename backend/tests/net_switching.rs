//! Guests connected over real vhost-user sockets exchange frames through the switch.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use svnic_backend::net::PortStats;
use svnic_channels::frame::{ControlResponse, ControlStatus, FrameBody, ETHERTYPE};
use svnic_channels::{ChannelId, MacAddr};
use svnic_control_plane::GuestId;
use svnic_tests::frames::{eth, payload, svnic_frame};
use svnic_tests::switch_fixture::{mac, Event, Net};
use svnic_tests::vhost_frontend::{TestFrontend, FREE, HDR_LEN, RX_BUFFERS, TIMEOUT};

const QUIET: Duration = Duration::from_millis(200);

#[test]
fn two_ports_exchange_unicast_both_ways_intact() {
    let (net, mut a, mut b) = Net::with_two_frontends();

    let ab = eth(mac(2), mac(1), 0x0800, &payload(1, 1000));
    let ba = eth(mac(1), mac(2), 0x0800, &payload(2, 60));
    a.send(&ab);
    b.send(&ba);
    assert_eq!(b.recv(TIMEOUT).as_ref(), Some(&ab));
    assert_eq!(a.recv(TIMEOUT).as_ref(), Some(&ba));

    // A frame larger than one 2 KiB receive buffer spans several (MRG_RXBUF, num_buffers > 1).
    let big = eth(mac(1), mac(2), 0x0800, &payload(3, 5000));
    b.send(&big);
    assert_eq!(a.recv(TIMEOUT).as_ref(), Some(&big));
    assert_eq!(
        a.last_num_buffers, 3,
        "5026 bytes with header in 2 KiB buffers"
    );

    // More frames than the guest has receive buffers: they wait in the port's queue and flow
    // as the guest posts buffers again (recv re-posts and kicks).
    let burst: Vec<_> = (0..(u32::from(RX_BUFFERS) + 40))
        .map(|i| eth(mac(2), mac(1), 0x0800, &payload(i as u8, 100 + i as usize)))
        .collect();
    for f in &burst {
        a.send(f);
    }
    let got = b.recv_all(QUIET);
    assert_eq!(got.len(), burst.len());
    assert!(got == burst, "frames arrive intact and in order");

    let sa_stats = net.switch.port(GuestId(1)).unwrap().stats();
    let sb_stats = net.switch.port(GuestId(2)).unwrap().stats();
    assert_eq!(sa_stats.traffic.tx_frames, 1 + burst.len() as u64);
    assert_eq!(sb_stats.traffic.rx_frames, 1 + burst.len() as u64);
    assert_eq!(sa_stats.traffic.rx_frames, 2);
    assert_eq!(sa_stats.drops.total() + sb_stats.drops.total(), 0);
    assert!(sa_stats.link_up && sb_stats.link_up);
}

#[test]
fn config_space_reports_the_port_mac_and_link_up() {
    let mut net = Net::new();
    let s = net.add_port(7);
    let mut g = TestFrontend::start(&s);
    let config = g.config_space();
    assert_eq!(&config[..6], &mac(7).0);
    assert_eq!(
        u16::from_le_bytes([config[6], config[7]]),
        1,
        "VIRTIO_NET_S_LINK_UP"
    );
}

#[test]
fn broadcast_reaches_every_other_port() {
    let mut net = Net::new();
    let socks: Vec<_> = (1..=3).map(|i| net.add_port(i)).collect();
    let mut guests: Vec<_> = socks.iter().map(|s| TestFrontend::start(s)).collect();
    net.events.wait_count(&Event::Link(GuestId(3), true), 1);

    let arp = eth(MacAddr::BROADCAST, mac(1), 0x0806, &payload(9, 28));
    guests[0].send(&arp);
    assert_eq!(guests[1].recv(TIMEOUT).as_ref(), Some(&arp));
    assert_eq!(guests[2].recv(TIMEOUT).as_ref(), Some(&arp));
    assert!(
        guests[0].recv(QUIET).is_none(),
        "not reflected to the sender"
    );
}

#[test]
fn spoofed_source_mac_is_dropped_and_counted() {
    let (net, mut a, mut b) = Net::with_two_frontends();

    a.send(&eth(mac(2), mac(2), 0x0800, b"pretending to be port 2"));
    a.send(&eth(MacAddr::BROADCAST, mac(9), 0x0800, b"nobody's MAC"));
    assert!(b.recv(QUIET).is_none());
    let stats = net.switch.port(GuestId(1)).unwrap().stats();
    assert_eq!(stats.drops.spoofed, 2);
    assert_eq!(stats.traffic.tx_frames, 2);
}

#[test]
fn svnic_frames_reach_the_engine_with_the_right_port_and_are_not_switched() {
    let (net, mut a, mut b) = Net::with_two_frontends();

    // To the engine; to the other guest; broadcast behind a VLAN tag with a forged source:
    // all consumed by the engine, attributed to the sending port.
    let to_engine = eth(
        MacAddr::ENGINE,
        mac(1),
        ETHERTYPE,
        &[1, 1, 0, 0, 7, 0, 0, 0],
    );
    let to_peer = eth(mac(2), mac(1), ETHERTYPE, &[1, 4, 0, 0]);
    let mut tagged = eth(MacAddr::BROADCAST, mac(2), 0x8100, &[0, 42]);
    tagged.extend_from_slice(&ETHERTYPE.to_be_bytes());
    tagged.extend_from_slice(&[1, 4, 0, 0]);
    for f in [&to_engine, &to_peer, &tagged] {
        a.send(f);
    }
    net.events.wait_for("three svnic frames", |evs| {
        evs.iter().filter(|e| matches!(e, Event::Svnic(..))).count() == 3
    });
    let svnic: Vec<_> = net
        .events
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::Svnic(..)))
        .collect();
    assert_eq!(
        svnic,
        vec![
            Event::Svnic(GuestId(1), to_engine),
            Event::Svnic(GuestId(1), to_peer),
            Event::Svnic(GuestId(1), tagged),
        ]
    );
    assert!(b.recv(QUIET).is_none(), "svnic frames are never switched");
    assert_eq!(
        net.switch
            .port(GuestId(1))
            .unwrap()
            .stats()
            .traffic
            .to_engine,
        3
    );
}

#[test]
fn inject_reaches_the_guest() {
    let mut net = Net::new();
    let s = net.add_port(1);
    assert!(
        !net.switch.inject(
            GuestId(1),
            &eth(mac(1), MacAddr::ENGINE, ETHERTYPE, &[0; 8])
        ),
        "link down before a frontend starts the device"
    );
    let mut g = TestFrontend::start(&s);
    net.events.wait_count(&Event::Link(GuestId(1), true), 1);

    let response = eth(mac(1), MacAddr::ENGINE, ETHERTYPE, &payload(5, 24));
    assert!(net.switch.inject(GuestId(1), &response));
    assert_eq!(g.recv(TIMEOUT).as_ref(), Some(&response));

    // More than the guest has receive buffers: the last ones wait in the port's reserved engine
    // queue and arrive once buffers are posted. (That queue is small: let the device drain it
    // into the guest's buffers as the frames go in.)
    let mut many = Vec::new();
    for i in 0..(u32::from(RX_BUFFERS) + 5) {
        wait_for_stats(&net, 1, "engine queue drained", |s| s.engine_queued < 16);
        let f = eth(mac(1), MacAddr::ENGINE, ETHERTYPE, &payload(i as u8, 30));
        assert!(net.switch.inject(GuestId(1), &f));
        many.push(f);
    }
    wait_for_stats(&net, 1, "5 frames waiting", |s| s.engine_queued == 5);
    assert_eq!(g.recv_all(QUIET), many);
    let stats = net.switch.port(GuestId(1)).unwrap().stats();
    assert_eq!(stats.traffic.rx_frames, many.len() as u64 + 1);
    assert_eq!((stats.rx_queued, stats.engine_queued), (0, 0));
}

/// Waits until port `id`'s stats satisfy `pred`.
fn wait_for_stats(net: &Net, id: u32, what: &str, pred: impl Fn(&PortStats) -> bool) -> PortStats {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let stats = net.switch.port(GuestId(id)).unwrap().stats();
        if pred(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "{what}: still {stats:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// An engine frame (from `MacAddr::ENGINE`) for the guest of port `to`.
fn engine_frame(to: u8, body: FrameBody<'static>) -> Vec<u8> {
    svnic_frame(MacAddr::ENGINE, mac(to), body)
}

#[test]
fn another_guests_broadcast_flood_cannot_drop_or_delay_engine_frames() {
    let (net, mut a, mut b) = Net::with_two_frontends();

    // B floods: A's receive buffers fill, then A's RX queue, then the rest is dropped.
    let capacity = net.switch.config().rx_queue_frames;
    let flood = |b: &mut TestFrontend, n: usize| {
        for i in 0..n {
            b.send(&eth(
                MacAddr::BROADCAST,
                mac(2),
                0x0800,
                &payload(i as u8, 200),
            ));
        }
    };
    flood(&mut b, usize::from(RX_BUFFERS) + capacity + 16);
    let full = wait_for_stats(&net, 1, "A's buffers and RX queue full", |s| {
        s.traffic.rx_frames == u64::from(RX_BUFFERS)
            && s.rx_queued == capacity
            && s.drops.rx_queue_full > 0
    });

    // The engine answers A and wakes one of its channels: both are queued despite the flood,
    // and a second wake of that channel while one waits is coalesced.
    let response = engine_frame(
        1,
        FrameBody::ControlResponse(ControlResponse {
            request_id: 42,
            channel: ChannelId(3),
            status: ControlStatus::Pending,
        }),
    );
    let wake = engine_frame(
        1,
        FrameBody::Wake {
            channel: ChannelId(3),
        },
    );
    assert!(net.switch.inject(GuestId(1), &response));
    assert!(net.switch.inject(GuestId(1), &wake));
    flood(&mut b, 50);
    assert!(net.switch.inject(GuestId(1), &wake));
    let s = wait_for_stats(&net, 1, "flood dropped", |s| {
        s.drops.rx_queue_full >= full.drops.rx_queue_full + 50
    });
    assert_eq!(
        (
            s.engine_queued,
            s.traffic.engine_frames,
            s.traffic.engine_wakes_coalesced
        ),
        (2, 2, 1)
    );
    assert_eq!(s.drops.engine_queue_full, 0);

    // A drains: the frames already in its buffers, then the engine's, then the switched ones.
    let got = a.recv_all(QUIET);
    let first_after_buffers = usize::from(RX_BUFFERS);
    assert_eq!(got.len(), first_after_buffers + 2 + capacity);
    assert_eq!(got[first_after_buffers], response);
    assert_eq!(got[first_after_buffers + 1], wake);
    assert!(got
        .iter()
        .enumerate()
        .filter(|(i, _)| !(first_after_buffers..first_after_buffers + 2).contains(i))
        .all(|(_, f)| f[..6] == MacAddr::BROADCAST.0));
}

#[test]
fn bad_tx_chains_are_counted_and_returned_not_fatal() {
    let (net, mut a, mut b) = Net::with_two_frontends();

    // Shorter than the virtio-net header; outside guest memory; device-writable.
    assert_eq!(a.send_chain(&[(FREE, HDR_LEN as u32 - 1, false)]).1, 0);
    assert_eq!(a.send_chain(&[(1 << 40, 100, false)]).1, 0);
    assert_eq!(a.send_chain(&[(FREE, 100, true)]).1, 0);
    let stats = net.switch.port(GuestId(1)).unwrap().stats();
    assert_eq!(stats.drops.tx_bad_descriptors, 3);

    // The device is still fine.
    let f = eth(mac(2), mac(1), 0x0800, &payload(1, 64));
    a.send(&f);
    assert_eq!(b.recv(TIMEOUT), Some(f));
}

#[test]
fn a_frontend_using_qemu_7_2_message_order_works() {
    // QEMU 7.2 enables the rings before SET_FEATURES and never again; the vhost crate alone
    // would end such a connection (see net::relay).
    let mut net = Net::new();
    let (sa, sb) = (net.add_port(1), net.add_port(2));
    let mut a = TestFrontend::start_like_qemu_7_2(&sa);
    let mut b = TestFrontend::start(&sb);
    net.events.wait_count(&Event::Link(GuestId(1), true), 1);
    let ab = eth(mac(2), mac(1), 0x0806, &payload(1, 28));
    let ba = eth(mac(1), mac(2), 0x0806, &payload(2, 28));
    a.send(&ab);
    assert_eq!(b.recv(TIMEOUT), Some(ab));
    b.send(&ba);
    assert_eq!(a.recv(TIMEOUT), Some(ba));
}
