//! A long-running daemon sees many connections: each must release every descriptor it used.
//! (vhost-user-backend 0.24 leaks the vring worker's exit-event fd; the device closes it.)
//! One test in this binary, so that no other test opens descriptors meanwhile.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use svnic_control_plane::GuestId;
use svnic_tests::frames::{eth, payload};
use svnic_tests::switch_fixture::{mac, Event, Net};
use svnic_tests::vhost_frontend::{TestFrontend, TIMEOUT};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn connections_do_not_leak_file_descriptors() {
    let mut net = Net::new();
    let (sa, sb) = (net.add_port(1), net.add_port(2));
    let mut b = TestFrontend::start(&sb);

    let mut cycle = |n: usize| {
        let mut a = TestFrontend::start(&sa);
        let f = eth(mac(2), mac(1), 0x0800, &payload(n as u8, 80));
        a.send(&f);
        assert_eq!(b.recv(TIMEOUT), Some(f));
        drop(a);
        net.events.wait_count(&Event::Link(GuestId(1), false), n);
    };
    cycle(1);
    // The listener finishes its clean-up just after reporting the link down.
    std::thread::sleep(Duration::from_millis(100));
    let baseline = open_fds();
    for n in 2..=11 {
        cycle(n);
    }
    let deadline = Instant::now() + TIMEOUT;
    while open_fds() > baseline && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(open_fds(), baseline, "10 connections later");
}
