//! Switch rules with fake ports: no devices, the tests play both guests.

use std::sync::Mutex;

use svnic_channels::frame::{ControlResponse, ControlStatus, ETHERTYPE};
use svnic_channels::ChannelId;
use svnic_control_plane::GuestId;
use vm_memory::GuestMemoryMmap;

use super::*;
use crate::uplink::Ingress;

#[derive(Default)]
struct Recorder {
    svnic: Mutex<Vec<(PortId, Vec<u8>)>>,
}

impl PortEvents for Recorder {
    fn memory_changed(&self, _port: PortId, _mem: Option<Arc<GuestMemoryMmap>>) {}
    fn svnic_frame(&self, port: PortId, frame: &[u8]) {
        self.svnic.lock().unwrap().push((port, frame.to_vec()));
    }
    fn connection(&self, _port: PortId, _connected: bool) {}
}

#[derive(Default)]
struct RecordingUplink {
    sent: Mutex<Vec<(PortId, Vec<u8>)>>,
}

impl Uplink for RecordingUplink {
    fn transmit(&self, from: PortId, frame: &[u8]) -> bool {
        self.sent.lock().unwrap().push((from, frame.to_vec()));
        true
    }
}

fn mac(last: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, last])
}

fn eth(dst: MacAddr, src: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

struct Fixture {
    events: Arc<Recorder>,
    switch: Arc<Switch>,
    ports: Vec<Arc<SwitchPort>>,
}

/// `n` ports, ids 1..=n, MACs 52:54:00:00:00:<id>, all up, on a switch of the default
/// configuration.
fn fixture(n: u8) -> Fixture {
    fixture_with(n, |_| {})
}

/// As [`fixture`], with the switch's configuration changed by `tweak` first.
fn fixture_with(n: u8, tweak: impl FnOnce(&mut SwitchConfig)) -> Fixture {
    let mut config = SwitchConfig::default();
    tweak(&mut config);
    let events = Arc::new(Recorder::default());
    let switch = Switch::new(events.clone(), config);
    let ports = (1..=n)
        .map(|i| {
            let p = switch.add_port(GuestId(i.into()), &[mac(i)]).unwrap();
            p.set_up(true);
            p
        })
        .collect();
    Fixture {
        events,
        switch,
        ports,
    }
}

impl Fixture {
    fn send(&self, from: usize, bytes: &[u8]) {
        let mut f = self.switch.alloc_frame();
        f.buf_mut().extend_from_slice(bytes);
        self.switch.forward(&self.ports[from], f);
    }

    /// Every queued frame of `port`, in the order its device delivers them.
    fn received(&self, port: usize) -> Vec<Vec<u8>> {
        let p = &self.ports[port];
        std::iter::from_fn(|| {
            let (from, frame) = p.peek_rx()?;
            assert!(p.pop_rx(from).is_some());
            Some(frame.to_vec())
        })
        .collect()
    }

    /// How many times `port`'s wake eventfd was signalled since it was last read (reading it
    /// resets it).
    fn wakes(&self, port: usize) -> u64 {
        let mut buf = [0u8; 8];
        // SAFETY: reading 8 bytes into an 8-byte stack buffer from an eventfd we own.
        let n = unsafe { libc::read(self.ports[port].wake_fd(), buf.as_mut_ptr().cast(), 8) };
        assert_eq!(n, 8, "an eventfd reads as 8 bytes once signalled");
        u64::from_ne_bytes(buf)
    }
}

#[test]
fn unicast_reaches_only_the_owner_intact() {
    let fx = fixture(3);
    let frame = eth(mac(2), mac(1), 0x0800, b"hello port two");
    fx.send(0, &frame);
    assert_eq!(fx.received(1), vec![frame.clone()]);
    assert!(fx.received(2).is_empty());
    assert!(fx.received(0).is_empty());
    let s = fx.ports[0].stats();
    assert_eq!(
        (s.traffic.tx_frames, s.traffic.tx_bytes),
        (1, frame.len() as u64)
    );
    assert_eq!(s.drops.total(), 0);
}

#[test]
fn broadcast_and_multicast_reach_every_other_up_port() {
    let fx = fixture(4);
    fx.ports[3].set_up(false);
    let bcast = eth(MacAddr::BROADCAST, mac(1), 0x0806, b"who has");
    let mcast = eth(MacAddr([0x33, 0x33, 0, 0, 0, 1]), mac(1), 0x86dd, b"v6");
    fx.send(0, &bcast);
    fx.send(0, &mcast);
    for p in 1..3 {
        assert_eq!(fx.received(p), vec![bcast.clone(), mcast.clone()]);
    }
    assert!(fx.received(0).is_empty());
    assert!(fx.received(3).is_empty());
    assert_eq!(
        fx.ports[3].stats().drops.total(),
        0,
        "a down port misses nothing it must know"
    );
}

#[test]
fn spoofed_source_is_dropped_and_counted() {
    let fx = fixture(2);
    fx.send(0, &eth(mac(2), mac(9), 0x0800, b"not mine"));
    fx.send(0, &eth(MacAddr::BROADCAST, mac(2), 0x0800, b"steals 2"));
    assert!(fx.received(1).is_empty());
    assert_eq!(fx.ports[0].stats().drops.spoofed, 2);
}

#[test]
fn svnic_frames_go_to_the_engine_never_to_ports_even_behind_vlan_tags() {
    let fx = fixture(2);
    let direct = eth(mac(2), mac(9), ETHERTYPE, &[1, 1, 0, 0]);
    let mut tagged = eth(MacAddr::BROADCAST, mac(1), 0x8100, &[0, 5]);
    tagged.extend_from_slice(&ETHERTYPE.to_be_bytes());
    tagged.extend_from_slice(&[1, 4, 0, 0]);
    fx.send(0, &direct);
    fx.send(1, &tagged);
    assert!(fx.received(0).is_empty());
    assert!(fx.received(1).is_empty());
    let got = fx.events.svnic.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![(GuestId(1), direct), (GuestId(2), tagged)],
        "the source is the port, whatever the frame says"
    );
    assert_eq!(fx.ports[0].stats().traffic.to_engine, 1);
    assert_eq!(fx.ports[0].stats().drops.spoofed, 0);
}

#[test]
fn unknown_unicast_looped_and_malformed_are_counted() {
    let fx = fixture(2);
    fx.send(0, &eth(mac(7), mac(1), 0x0800, b"nobody"));
    fx.send(0, &eth(mac(1), mac(1), 0x0800, b"myself"));
    fx.send(0, &[0xff; 13]);
    let d = fx.ports[0].stats().drops;
    assert_eq!((d.unknown_unicast, d.looped, d.malformed), (1, 1, 1));
    assert!(fx.received(1).is_empty());
}

#[test]
fn uplink_takes_unknown_unicast_and_broadcast() {
    let fx = fixture(2);
    let uplink = Arc::new(RecordingUplink::default());
    fx.switch.set_uplink(Some(uplink.clone()));
    let unknown = eth(mac(7), mac(1), 0x0800, b"far away");
    let bcast = eth(MacAddr::BROADCAST, mac(1), 0x0806, b"arp");
    fx.send(0, &unknown);
    fx.send(0, &bcast);
    assert_eq!(
        uplink.sent.lock().unwrap().clone(),
        vec![(GuestId(1), unknown), (GuestId(1), bcast.clone())]
    );
    assert_eq!(fx.received(1), vec![bcast]);
    let s = fx.ports[0].stats();
    assert_eq!((s.traffic.to_uplink, s.drops.unknown_unicast), (2, 0));
}

#[test]
fn rx_queue_is_bounded_and_overflow_counted() {
    let fx = fixture_with(2, |c| {
        c.rx_queue_frames = 3;
        c.pooled_buffers = 8;
    });
    for i in 0..5u8 {
        fx.send(0, &eth(mac(2), mac(1), 0x0800, &[i]));
    }
    let got = fx.received(1);
    assert_eq!(got.len(), 3);
    assert_eq!(got[2][14], 2, "the oldest frames are kept, in order");
    assert_eq!(fx.ports[1].stats().drops.rx_queue_full, 2);
}

#[test]
fn inject_queues_for_an_up_port_and_refuses_otherwise() {
    let fx = fixture(2);
    let resp = eth(mac(1), MacAddr::ENGINE, ETHERTYPE, &[1, 2, 0, 0]);
    assert!(fx.switch.inject(GuestId(1), &resp));
    assert_eq!(fx.received(0), vec![resp.clone()]);
    assert!(!fx.switch.inject(GuestId(9), &resp), "no such port");
    assert!(!fx.switch.inject(GuestId(1), &resp[..10]), "runt");
    fx.ports[0].set_up(false);
    assert!(!fx.switch.inject(GuestId(1), &resp), "link down");
    assert_eq!(fx.ports[0].stats().drops.rx_port_down, 1);
}

#[test]
fn wake_fd_fires_when_the_queue_becomes_non_empty() {
    let fx = fixture(2);
    let frame = eth(mac(2), mac(1), 0x0800, b"x");
    fx.send(0, &frame);
    fx.send(0, &frame);
    assert_eq!(fx.wakes(1), 1, "one wake per batch, not per frame");
}

#[test]
fn going_down_discards_the_queue() {
    let fx = fixture(2);
    fx.send(0, &eth(mac(2), mac(1), 0x0800, b"x"));
    fx.ports[1].set_up(false);
    fx.ports[1].set_up(true);
    assert!(fx.received(1).is_empty());
    assert_eq!(fx.ports[1].stats().drops.rx_port_down, 1);
}

#[test]
fn add_port_rejects_bad_mac_sets() {
    let fx = fixture(1);
    let s = &fx.switch;
    assert!(matches!(
        s.add_port(GuestId(1), &[mac(5)]),
        Err(SwitchError::DuplicatePort(_))
    ));
    assert!(matches!(
        s.add_port(GuestId(2), &[mac(1)]),
        Err(SwitchError::MacInUse { .. })
    ));
    assert!(matches!(
        s.add_port(GuestId(2), &[]),
        Err(SwitchError::NoMac(_))
    ));
    assert!(matches!(
        s.add_port(GuestId(2), &[MacAddr::BROADCAST]),
        Err(SwitchError::NotUnicast { .. })
    ));
    assert!(s.remove_port(GuestId(1)));
    assert!(s.add_port(GuestId(2), &[mac(1)]).is_ok(), "MAC freed");
}

/// An engine frame for the guest of port `to`.
fn engine_frame(to: u8, body: FrameBody<'static>) -> Vec<u8> {
    Frame {
        dst: mac(to),
        src: MacAddr::ENGINE,
        body,
    }
    .encode()
    .unwrap()
}

fn wake(to: u8, channel: u32) -> Vec<u8> {
    engine_frame(
        to,
        FrameBody::Wake {
            channel: ChannelId(channel),
        },
    )
}

fn response(to: u8, request_id: u32) -> Vec<u8> {
    engine_frame(
        to,
        FrameBody::ControlResponse(ControlResponse {
            request_id,
            channel: ChannelId(0),
            status: ControlStatus::Pending,
        }),
    )
}

#[test]
fn engine_frames_get_past_a_flooded_rx_queue_and_are_delivered_first() {
    let fx = fixture_with(2, |c| c.rx_queue_frames = 8);
    let flood = |n: u8| {
        for i in 0..n {
            fx.send(0, &eth(MacAddr::BROADCAST, mac(1), 0x0800, &[i]));
        }
    };
    flood(20);
    assert_eq!(fx.ports[1].stats().drops.rx_queue_full, 12);
    let (resp, wake) = (response(2, 7), wake(2, 9));
    assert!(fx.switch.inject(GuestId(2), &resp));
    flood(20);
    assert!(fx.switch.inject(GuestId(2), &wake));
    let s = fx.ports[1].stats();
    assert_eq!(
        (s.rx_queued, s.engine_queued, s.traffic.engine_frames),
        (8, 2, 2)
    );
    assert_eq!(s.drops.rx_queue_full, 32);
    assert_eq!(s.drops.engine_queue_full, 0);

    let got = fx.received(1);
    assert_eq!(got.len(), 10);
    assert_eq!(got[..2], [resp, wake], "engine frames first, in order");
    assert!(got[2..].iter().all(|f| f[..6] == MacAddr::BROADCAST.0));
}

#[test]
fn a_wake_for_a_channel_with_one_waiting_is_coalesced() {
    let fx = fixture(2);
    let inject = |f: &[u8]| assert!(fx.switch.inject(GuestId(2), f));
    let resp = response(2, 1);
    inject(&resp);
    for f in [wake(2, 5), wake(2, 5), wake(2, 6), wake(2, 5), wake(2, 6)] {
        inject(&f);
    }
    let s = fx.ports[1].stats();
    assert_eq!(
        (s.traffic.engine_frames, s.traffic.engine_wakes_coalesced),
        (3, 3)
    );
    assert_eq!(fx.received(1), [resp, wake(2, 5), wake(2, 6)]);

    // Delivered: the next wake is queued again. A wake at the front may already be on its way
    // into the guest's buffers, so one more behind it is queued, and only then coalesced.
    for _ in 0..3 {
        inject(&wake(2, 5));
    }
    assert_eq!(fx.ports[1].stats().traffic.engine_wakes_coalesced, 4);
    assert_eq!(fx.received(1), [wake(2, 5), wake(2, 5)]);
}

#[test]
fn a_full_engine_queue_refuses_and_counts_and_wakes_the_worker_once() {
    let fx = fixture_with(2, |c| c.engine_queue_frames = 2);
    assert!(fx.switch.inject(GuestId(2), &response(2, 1)));
    assert!(fx.switch.inject(GuestId(2), &response(2, 2)));
    assert!(!fx.switch.inject(GuestId(2), &response(2, 3)));
    let s = fx.ports[1].stats();
    assert_eq!((s.engine_queued, s.drops.engine_queue_full), (2, 1));
    assert_eq!(s.drops.total(), 1);
    assert_eq!(fx.wakes(1), 1, "the worker is woken once");
    assert_eq!(fx.received(1), [response(2, 1), response(2, 2)]);
}

#[test]
fn frames_from_the_uplink_reach_local_guests_only_and_never_as_a_local_guest() {
    let fx = fixture(3);
    fx.ports[2].set_up(false);
    let remote = MacAddr([0x52, 0x54, 0, 0, 1, 9]);
    let unicast = eth(mac(2), remote, 0x0800, b"from another host");
    assert_eq!(fx.switch.from_uplink(&unicast), Ingress::Delivered(1));
    assert_eq!(fx.received(1), vec![unicast]);

    let bcast = eth(MacAddr::BROADCAST, remote, 0x0806, b"who has");
    assert_eq!(fx.switch.from_uplink(&bcast), Ingress::Delivered(2));
    assert_eq!(fx.received(0), vec![bcast.clone()]);
    assert_eq!(fx.received(1), vec![bcast]);

    let down = eth(mac(3), remote, 0x0800, b"link down");
    assert_eq!(fx.switch.from_uplink(&down), Ingress::Refused);
    assert_eq!(fx.ports[2].stats().drops.rx_port_down, 1);

    for (frame, outcome) in [
        (
            eth(mac(2), mac(1), 0x0800, b"spoofing guest 1"),
            Ingress::Spoofed,
        ),
        (
            eth(mac(2), MacAddr::BROADCAST, 0x0800, b"group source"),
            Ingress::Malformed,
        ),
        (vec![0u8; 13], Ingress::Malformed),
        (vec![0u8; MAX_FRAME_LEN + 1], Ingress::Malformed),
        (
            eth(
                MacAddr([0x52, 0x54, 0, 0, 2, 1]),
                remote,
                0x0800,
                b"for someone else",
            ),
            Ingress::NotLocal,
        ),
        (
            eth(mac(2), remote, ETHERTYPE, &[1, 3, 0, 0]),
            Ingress::Svnic,
        ),
    ] {
        assert_eq!(fx.switch.from_uplink(&frame), outcome, "{frame:02x?}");
    }
    for p in 0..3 {
        assert!(fx.received(p).is_empty(), "port {p} got a refused frame");
    }
    assert!(fx.switch.owns(mac(1)) && !fx.switch.owns(remote));
}
