//! Hostile frontends against a real `svnic serve` (issue 13): one test per attack, and per DPDK
//! vhost CVE class as it applies to svnic, on the virtio-net queues and on channels. Each test
//! runs a fresh daemon with a polite pair of host-process guests, attacks from another guest's
//! socket, and then asserts through [`Arena::assert_unharmed`] that the daemon is alive, the
//! pair (and a guest arriving afterwards) still completes a round trip, RSS and fds stayed
//! bounded, and SIGTERM ends it within 5 s.
#![allow(clippy::unwrap_used)]

mod hostile;

use std::time::Duration;

use svnic_channels::MacAddr;
use svnic_tests::arena::{Arena, Bounds, Footprint};
use svnic_tests::polite_pair::test_frame;
use svnic_tests::raw_frontend::Sealing;
use svnic_tests::vhost_frontend::{TestFrontend, RX, WANTED_FEATURES};

/// Time for the daemon's vring worker to handle what a test just published.
const SETTLE: Duration = Duration::from_millis(400);

/// A frontend on "evil" that has done everything QEMU does.
fn polite_evil(arena: &Arena) -> TestFrontend {
    let mut f = TestFrontend::connect(&arena.socket("evil"), Sealing::Sealed);
    if let Err(e) = f.polite_setup() {
        panic!("polite setup on \"evil\": {e}\n{}", arena.log());
    }
    f
}

/// A frontend on "evil" (sealed memory) through QEMU 7.2's handshake: owner, features and
/// protocol features asked, REPLY_ACK and CONFIG acknowledged.
fn evil_after_handshake(arena: &Arena) -> TestFrontend {
    let mut f = TestFrontend::connect(&arena.socket("evil"), Sealing::Sealed);
    f.handshake().unwrap();
    f
}

/// [`evil_after_handshake`], then early enable and SET_FEATURES (what it wants of what is
/// offered): memory and rings are the test's.
fn evil_up_to_features(arena: &Arena) -> TestFrontend {
    let mut f = evil_after_handshake(arena);
    f.early_enable().unwrap();
    f.set_features(f.offered_features & WANTED_FEATURES)
        .unwrap();
    f
}

/// [`evil_up_to_features`], then the memory table.
fn evil_with_memory(arena: &Arena) -> TestFrontend {
    let f = evil_up_to_features(arena);
    f.set_mem_table().unwrap();
    f
}

/// Gives the daemon [`SETTLE`] to handle what the test published, then the verdict.
fn settle_then_assert_unharmed(arena: Arena, before: Footprint) {
    std::thread::sleep(SETTLE);
    arena.assert_unharmed(before, Bounds::default());
}

/// A broadcast frame from A: it lands in the RX queue of every other connected guest.
fn broadcast_from_a(arena: &Arena, n: u64) {
    let a = &arena.pair.a;
    assert!(a
        .send_raw(&test_frame(MacAddr::BROADCAST, a.mac(), n))
        .unwrap());
}

#[test]
fn the_polite_pair_alone_passes_every_check() {
    let arena = Arena::start("hostile-control", 0);
    let evil = polite_evil(&arena);
    let before = arena.footprint();
    let mut evil = evil;
    evil.post_rx(16).unwrap();
    broadcast_from_a(&arena, 1);
    let used = evil.wait_used(RX, Duration::from_secs(10));
    assert_eq!(
        used.unwrap().len(),
        1,
        "the polite frontend received A's broadcast"
    );
    arena.assert_unharmed(before, Bounds::default());
}
