//! The virtio-user frontend against a real vhost-user daemon (rust-vmm's vhost-user-backend,
//! as the svnic backend uses it) over real Unix sockets: negotiation, frames both ways between
//! two host-process guests, refusals with named errors, and a backend that hangs up.
#![allow(clippy::unwrap_used)]

use svnic_tests::hub_device as hub_backend;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hub_backend::{Hub, ALL_FEATURES, MINIMAL_FEATURES};
use svnic_channels::MacAddr;
use svnic_host_frontend::virtio_user::{
    MemfdMemory, VirtioNet, VirtioUserError, DEFAULT_QUEUE_SIZE,
};
use svnic_host_frontend::HostGuest;
use vhost::vhost_user::VhostUserProtocolFeatures;

const A: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0xa]);
const B: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0xb]);
const LONG: Duration = Duration::from_secs(20);

fn memory() -> Arc<MemfdMemory> {
    Arc::new(MemfdMemory::new(32 << 20).unwrap())
}

fn frame(src: MacAddr, dst: MacAddr, n: u32, len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&0x88b6u16.to_be_bytes());
    f.extend_from_slice(&n.to_le_bytes());
    while f.len() < len {
        f.push((f.len() as u32 ^ n) as u8);
    }
    f
}

#[test]
fn negotiates_features_mac_and_link_with_a_vhost_user_daemon() {
    let hub = Hub::new("negotiate");
    let port = hub.add_port(A, ALL_FEATURES, VhostUserProtocolFeatures::CONFIG);
    let net = VirtioNet::connect(port.path(), memory(), DEFAULT_QUEUE_SIZE).unwrap();
    assert_eq!(net.mac(), A);
    assert_eq!(net.features(), ALL_FEATURES);
    assert_eq!(net.link_up(), Some(true));
    assert!(!net.backend_gone());

    let port = hub.add_port(B, MINIMAL_FEATURES, VhostUserProtocolFeatures::CONFIG);
    let net = VirtioNet::connect(port.path(), memory(), 64).unwrap();
    assert_eq!(net.features(), MINIMAL_FEATURES);
    assert_eq!(net.link_up(), None);
}

/// Calls `step` (wait, then take what arrived) until `n` frames came; `who` received them.
fn receive_n(n: u32, who: &str, mut step: impl FnMut(&mut Vec<Vec<u8>>)) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let t = Instant::now();
    while got.len() < n as usize {
        assert!(t.elapsed() < LONG, "{who} received {} of {n}", got.len());
        step(&mut got);
    }
    got
}

fn exchange(features: u64, name: &str) {
    let hub = Hub::new(name);
    let pa = hub.add_port(A, features, VhostUserProtocolFeatures::CONFIG);
    let pb = hub.add_port(B, features, VhostUserProtocolFeatures::CONFIG);
    let guest_a = HostGuest::connect(pa.path(), 32 << 20).unwrap();
    let mut net_b = VirtioNet::connect(pb.path(), memory(), DEFAULT_QUEUE_SIZE).unwrap();
    assert_eq!(guest_a.mac(), A);
    const N: u32 = 1500;

    // B -> A, in batches larger than a ring, received by A through the control client's
    // demultiplexer from another thread.
    let a2 = guest_a.clone();
    let receiver = std::thread::spawn(move || {
        receive_n(N, "A", |got| {
            a2.wait_raw(Duration::from_millis(100)).unwrap();
            a2.recv_raw(got, usize::MAX).unwrap();
        })
    });
    let t = Instant::now();
    for n in 0..N {
        let f = frame(B, A, n, 60 + (n as usize * 13) % 1400);
        while !net_b.send_frame(&f).unwrap() {
            net_b.flush().unwrap();
            assert!(t.elapsed() < LONG, "B's TX ring stays full");
            net_b.wait(Duration::from_millis(50)).unwrap();
        }
        if n % 50 == 0 {
            net_b.flush().unwrap();
        }
    }
    net_b.flush().unwrap();
    let got = receiver.join().unwrap();
    for (n, f) in got.iter().enumerate() {
        assert_eq!(*f, frame(B, A, n as u32, 60 + (n * 13) % 1400), "frame {n}");
    }

    // A -> B: B sleeps on its call eventfd between batches.
    let sender = std::thread::spawn(move || {
        for n in 0..N {
            let f = frame(A, B, n, 60 + (n as usize * 7) % 1400);
            let t = Instant::now();
            while !guest_a.send_raw(&f).unwrap() {
                assert!(t.elapsed() < LONG, "A's TX ring stays full");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        guest_a
    });
    let got = receive_n(N, "B", |got| {
        net_b.wait(Duration::from_millis(100)).unwrap();
        net_b.recv_frames(got, usize::MAX).unwrap();
    });
    for (n, f) in got.iter().enumerate() {
        assert_eq!(*f, frame(A, B, n as u32, 60 + (n * 7) % 1400), "frame {n}");
    }
    let guest_a = sender.join().unwrap();
    assert_eq!(pb.delivered(), u64::from(N));
    assert_eq!(pa.delivered(), u64::from(N));
    assert_eq!(guest_a.stats().raw_received, u64::from(N));
    assert_eq!(net_b.stats().rx_frames, u64::from(N));
}

#[test]
fn two_guests_exchange_frames_with_every_feature() {
    exchange(ALL_FEATURES, "exchange-all");
}

#[test]
fn two_guests_exchange_frames_without_event_idx_or_mrg_rxbuf() {
    exchange(MINIMAL_FEATURES, "exchange-minimal");
}

#[test]
fn missing_features_are_refused_with_their_names() {
    let hub = Hub::new("refuse");
    let port = hub.add_port(
        A,
        ALL_FEATURES & !(1 << 32),
        VhostUserProtocolFeatures::CONFIG,
    );
    match VirtioNet::connect(port.path(), memory(), DEFAULT_QUEUE_SIZE) {
        Err(VirtioUserError::MissingFeatures { missing, .. }) => {
            assert_eq!(missing, "VIRTIO_F_VERSION_1")
        }
        other => panic!("expected MissingFeatures, got {other:?}"),
    }
    let port = hub.add_port(B, ALL_FEATURES, VhostUserProtocolFeatures::empty());
    assert!(matches!(
        VirtioNet::connect(port.path(), memory(), DEFAULT_QUEUE_SIZE),
        Err(VirtioUserError::MissingProtocolFeature { name: "CONFIG", .. })
    ));
    // A queue larger than the backend's maximum (1024) is refused at SET_VRING_NUM (REPLY_ACK).
    let port = hub.add_port(
        MacAddr([0x52, 0x54, 0, 0, 0, 0xc]),
        ALL_FEATURES,
        VhostUserProtocolFeatures::CONFIG,
    );
    match VirtioNet::connect(port.path(), memory(), 2048) {
        Err(VirtioUserError::Setup { step, .. }) => assert_eq!(step, "SET_VRING_NUM (RX)"),
        other => panic!("expected a SET_VRING_NUM failure, got {other:?}"),
    }
}

#[test]
fn connecting_to_no_backend_names_the_step() {
    let dir = std::env::temp_dir().join(format!("svnic-guest-nobody-{}", std::process::id()));
    match VirtioNet::connect(dir.join("none.sock"), memory(), DEFAULT_QUEUE_SIZE) {
        Err(VirtioUserError::Setup {
            step: "connect", ..
        }) => {}
        other => panic!("expected a connect failure, got {other:?}"),
    }
}

#[test]
fn a_backend_that_hangs_up_is_noticed_by_a_waiter() {
    let hub = Hub::new("hangup");
    let port = hub.add_port(A, ALL_FEATURES, VhostUserProtocolFeatures::CONFIG);
    let mut net = VirtioNet::connect(port.path(), memory(), DEFAULT_QUEUE_SIZE).unwrap();
    assert!(!net.wait(Duration::from_millis(20)).unwrap());
    port.hang_up();
    let t = Instant::now();
    assert!(matches!(net.wait(LONG), Err(VirtioUserError::Disconnected)));
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(net.backend_gone());
}
