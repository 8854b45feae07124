//! Connections come and go; hostile frontends end only their own connection.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use svnic_control_plane::GuestId;
use svnic_tests::frames::{eth, payload};
use svnic_tests::logs::wait_for as wait_for_log;
use svnic_tests::raw_frontend::Sealing;
use svnic_tests::switch_fixture::{mac, Event, Net};
use svnic_tests::vhost_frontend::{TestFrontend, MEM_SIZE, RX, TIMEOUT, TX};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo};

const QUIET: Duration = Duration::from_millis(200);

/// Port 1 and port 2 exchange one frame each way.
fn exchange(a: &mut TestFrontend, b: &mut TestFrontend, seed: u8) {
    let ab = eth(mac(2), mac(1), 0x0800, &payload(seed, 300));
    let ba = eth(mac(1), mac(2), 0x0800, &payload(seed + 1, 200));
    a.send(&ab);
    b.send(&ba);
    assert_eq!(b.recv(TIMEOUT), Some(ab));
    assert_eq!(a.recv(TIMEOUT), Some(ba));
}

/// A good frontend on `sock` (port `port`) sends a frame that one on `to` (port 2) receives.
fn assert_port_works(sock: &Path, to: &Path, port: u8, seed: u8) {
    let mut a = TestFrontend::start(sock);
    let mut b = TestFrontend::start(to);
    let f = eth(mac(2), mac(port), 0x0800, &payload(seed, 100));
    a.send(&f);
    assert_eq!(b.recv(TIMEOUT), Some(f));
}

fn some_memory() -> Event {
    Event::Memory(GuestId(1), Some(MEM_SIZE))
}

const NO_MEMORY: Event = Event::Memory(GuestId(1), None);
const LINK_UP: Event = Event::Link(GuestId(1), true);
const LINK_DOWN: Event = Event::Link(GuestId(1), false);

/// Connects to `socket`, negotiates, and offers the frontend's memory region changed by `edit`:
/// asserts that the backend refuses the table, and returns the frontend.
fn refused_memory_table(
    socket: &Path,
    edit: impl FnOnce(&mut VhostUserMemoryRegionInfo),
) -> TestFrontend {
    let mut evil = TestFrontend::connect(socket, Sealing::Unsealed);
    evil.negotiate().unwrap();
    let mut region = evil.region();
    edit(&mut region);
    assert!(evil.frontend.set_mem_table(&[region]).is_err());
    evil
}

#[test]
fn a_frontend_that_reconnects_to_the_same_socket_works_again() {
    let (net, mut a, mut b) = Net::with_two_frontends();
    exchange(&mut a, &mut b, 1);

    drop(a);
    net.events.wait_count(&LINK_DOWN, 1);
    assert!(!net.switch.port(GuestId(1)).unwrap().stats().link_up);
    // While port 1 is down, frames for it are dropped and counted, not queued for later.
    b.send(&eth(mac(1), mac(2), 0x0800, b"into the void"));
    assert_eq!(
        net.switch
            .port(GuestId(1))
            .unwrap()
            .stats()
            .drops
            .rx_port_down,
        1
    );

    let mut a = TestFrontend::start(&net.socket(1));
    net.events.wait_count(&LINK_UP, 2);
    assert_eq!(
        net.events.of(GuestId(1)),
        vec![
            some_memory(),
            LINK_UP,
            NO_MEMORY,
            LINK_DOWN,
            some_memory(),
            LINK_UP
        ],
        "memory_changed(None) comes before the reconnect's memory"
    );
    assert!(a.recv(QUIET).is_none(), "nothing stale is delivered");
    exchange(&mut a, &mut b, 3);

    // And once more, to be sure the listener keeps its socket across connections.
    drop(a);
    let mut a = TestFrontend::start(&net.socket(1));
    net.events.wait_count(&LINK_UP, 3);
    exchange(&mut a, &mut b, 5);
}

#[test]
fn stopping_the_rings_takes_memory_and_link_down_and_a_restart_brings_them_back() {
    let (net, mut a, mut b) = Net::with_two_frontends();
    exchange(&mut a, &mut b, 1);

    // The guest driver resets: QEMU disables and stops both rings (GET_VRING_BASE).
    a.stop_rings().unwrap();
    net.events.wait_count(&LINK_DOWN, 1);
    assert_eq!(
        net.events.of(GuestId(1)),
        vec![some_memory(), LINK_UP, NO_MEMORY, LINK_DOWN]
    );

    // Restart as QEMU does, memory table first.
    a.set_mem_table().unwrap();
    a.start_rings().unwrap();
    net.events.wait_count(&LINK_UP, 2);
    exchange(&mut a, &mut b, 3);

    // A frontend that restarts the rings without resending the table: the device comes back
    // with the table it has, and says so.
    a.stop_rings().unwrap();
    net.events.wait_count(&LINK_DOWN, 2);
    a.start_rings().unwrap();
    net.events.wait_count(&LINK_UP, 3);
    exchange(&mut a, &mut b, 5);
    let evs = net.events.of(GuestId(1));
    assert_eq!(&evs[evs.len() - 2..], &[some_memory(), LINK_UP]);
}

#[test]
fn the_device_goes_down_only_when_every_ring_is_stopped() {
    let (net, mut a, mut b) = Net::with_two_frontends();
    exchange(&mut a, &mut b, 1);

    a.stop_ring(RX).unwrap();
    let f = eth(mac(2), mac(1), 0x0800, &payload(7, 90));
    a.send(&f); // TX still runs
    assert_eq!(b.recv(TIMEOUT), Some(f));
    assert!(!net.events.events().contains(&LINK_DOWN));

    a.stop_ring(TX).unwrap();
    net.events.wait_count(&LINK_DOWN, 1);
    assert_eq!(
        net.events.of(GuestId(1)),
        vec![some_memory(), LINK_UP, NO_MEMORY, LINK_DOWN]
    );
}

#[test]
fn reset_device_takes_memory_and_link_down() {
    let mut net = Net::new();
    let s = net.add_port(1);
    let mut a = TestFrontend::start(&s);
    net.events.wait_count(&LINK_UP, 1);
    a.reset_device().unwrap();
    net.events.wait_count(&LINK_DOWN, 1);
    assert_eq!(
        net.events.of(GuestId(1)),
        vec![some_memory(), LINK_UP, NO_MEMORY, LINK_DOWN]
    );
}

/// Connects raw, writes `bytes`, and waits until the backend closes the connection.
fn send_raw_and_expect_close(socket: &Path, bytes: &[u8], half_close: bool) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.write_all(bytes).unwrap();
    if half_close {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut rest = Vec::new();
    match s.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert_ne!(
            e.kind(),
            std::io::ErrorKind::WouldBlock,
            "the backend kept a garbage connection open"
        ),
    }
}

#[test]
fn garbage_bytes_end_that_connection_and_the_listener_keeps_serving() {
    let mut net = Net::new();
    let (sa, sb) = (net.add_port(11), net.add_port(2));
    let garbage: Vec<u8> = (0..200u32).map(|i| (i * 97 + 13) as u8).collect();
    send_raw_and_expect_close(&sa, &garbage, false);
    let line = wait_for_log(&["guest 11", "frontend connection ended"]);
    assert!(line.starts_with("WARN"), "{line}");

    // The same socket serves a well-behaved frontend next.
    assert_port_works(&sa, &sb, 11, 1);
}

#[test]
fn a_truncated_message_ends_that_connection_and_the_listener_keeps_serving() {
    let mut net = Net::new();
    let s = net.add_port(12);
    // SET_FEATURES, version 1, announcing an 8-byte body but sending 4.
    let mut msg = Vec::new();
    msg.extend_from_slice(&2u32.to_le_bytes());
    msg.extend_from_slice(&1u32.to_le_bytes());
    msg.extend_from_slice(&8u32.to_le_bytes());
    msg.extend_from_slice(&[0xaa; 4]);
    send_raw_and_expect_close(&s, &msg, true);
    wait_for_log(&["guest 12", "frontend connection ended"]);

    let mut a = TestFrontend::start(&s);
    assert_eq!(&a.config_space()[..6], &mac(12).0);
}

#[test]
fn a_memory_table_larger_than_its_file_ends_the_connection() {
    let mut net = Net::new();
    let (sa, sb) = (net.add_port(13), net.add_port(2));
    // 1 TiB claimed over an 8 MiB memfd: mmap(MAP_NORESERVE) accepts it, and touching it past
    // the end of the file would be SIGBUS for the whole daemon.
    let evil = refused_memory_table(&sa, |region| region.memory_size = 1 << 40);
    wait_for_log(&["guest 13", "unusable memory table", "only 0x800000 bytes"]);
    // The backend closed the connection.
    assert!(evil.frontend.get_features().is_err());
    assert!(
        !net.events
            .events()
            .iter()
            .any(|e| matches!(e, Event::Memory(GuestId(13), Some(_)))),
        "the daemon never saw that table"
    );
    drop(evil);

    assert_port_works(&sa, &sb, 13, 2);
}

#[test]
fn a_memory_table_with_overflowing_ranges_ends_the_connection() {
    let mut net = Net::new();
    let s = net.add_port(14);
    // guest_phys_addr + memory_size overflows.
    let evil = refused_memory_table(&s, |region| region.guest_phys_addr = u64::MAX - 0xfff);
    wait_for_log(&["guest 14", "frontend connection ended"]);
    drop(evil);

    let mut a = TestFrontend::start(&s);
    net.events.wait_count(&Event::Link(GuestId(14), true), 1);
    assert!(net
        .switch
        .inject(GuestId(14), &eth(mac(14), mac(99), 0x0800, b"still alive")));
    assert!(a.recv(TIMEOUT).is_some());
}

#[test]
fn a_memory_table_that_cannot_be_mapped_ends_the_connection() {
    let mut net = Net::new();
    let (s, sb) = (net.add_port(15), net.add_port(2));
    // Well-formed, but no address space for it: mmap fails.
    let evil = refused_memory_table(&s, |region| region.memory_size = 1 << 62);
    let line = wait_for_log(&["guest 15", "frontend connection ended", "os error 12"]);
    assert!(line.starts_with("WARN"), "{line}");
    drop(evil);

    assert_port_works(&s, &sb, 15, 3);
}

#[test]
fn stop_ends_live_connections_and_removes_the_sockets() {
    let mut net = Net::new();
    let (sa, sb) = (net.add_port(1), net.add_port(2));
    let _a = TestFrontend::start(&sa);
    net.events.wait_count(&LINK_UP, 1);
    assert!(sa.exists() && sb.exists());
    net.shutdown();
    assert!(!sa.exists() && !sb.exists(), "socket files removed");
    assert!(
        net.events.events().contains(&LINK_DOWN),
        "live connection ended"
    );
    assert!(UnixStream::connect(&sa).is_err());
}

#[test]
fn a_port_removed_from_the_switch_is_no_longer_served() {
    let mut net = Net::new();
    let s = net.add_port(16);
    wait_for_log(&["guest 16", "socket", "ready"]);
    assert!(net.switch.remove_port(GuestId(16)));
    send_raw_and_expect_close(&s, &[], true);
    let deadline = std::time::Instant::now() + TIMEOUT;
    while s.exists() {
        assert!(std::time::Instant::now() < deadline, "socket still there");
        std::thread::sleep(Duration::from_millis(10));
    }
    wait_for_log(&["guest 16", "removed from the switch"]);
}
