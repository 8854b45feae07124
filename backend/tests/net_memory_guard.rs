//! A frontend whose memory vanishes under the daemon (its unsealed memfd truncated after
//! `SET_MEM_TABLE`) loses its own connection; the daemon survives the SIGBUS and keeps serving
//! every other guest.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use svnic_backend::config::EngineOverrides;
use svnic_backend::net::sigbus_guard;
use svnic_channels::{MacAddr, Message};
use svnic_client::{Channel, Completions};
use svnic_control_plane::GuestId;
use svnic_host_frontend::HostGuest;
use svnic_tests::daemon_fixture::{recv_messages as recv, DaemonFixture};
use svnic_tests::frames::{eth, mac_in, payload};
use svnic_tests::logs;
use svnic_tests::raw_frontend::Sealing;
use svnic_tests::switch_fixture::{mac, Event, Net};
use svnic_tests::vhost_frontend::{TestFrontend, RX, TX};

const T: Duration = Duration::from_secs(10);

/// `svnic serve` with guests 1..=n, in this process.
fn daemon(n: u8) -> DaemonFixture {
    let guests: Vec<_> = (1..=n).map(|i| (mac_in(0xe3, i), "")).collect();
    DaemonFixture::start("memguard", &guests, EngineOverrides::default())
}

/// Sets up and enables both rings and kicks them, without the frontend touching its own memory
/// (which is gone): only addresses are computed. The daemon touches the rings as early as
/// `SET_VRING_ADDR` (the library reads the used index), so the connection may end at any step.
fn start_rings_blind(f: &mut TestFrontend) {
    let _ = f.start_rings_blind();
    let _ = f.kick(TX);
    let _ = f.kick(RX);
}

/// `data` sent from `from` reaches `to` (a channel of guest `g`) as one user-data message.
fn user_data_arrives(
    from: &mut Channel,
    to: &mut Channel,
    g: &HostGuest,
    cookie: u64,
    data: &[u8],
) {
    from.send_user(to.addr(), cookie, data, Completions::OnError)
        .unwrap();
    from.flush().unwrap();
    let got = recv(to, g, 1, T);
    assert!(
        matches!(&got[..], [Message::UserData(u)] if u.data() == data),
        "{got:?}"
    );
}

/// The two tests below count faults on the process-wide guard and look for "guest 1" in the
/// shared log: run one at a time, so that each sees only its own fault.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_frontend_that_truncates_its_memory_is_closed_and_the_daemon_serves_on() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    logs::capture(log::LevelFilter::Info);
    let s = daemon(3);
    let (g2, g3) = (s.guest(2), s.guest(3));
    let mut b = g2.create_channel(2, 256, T).unwrap();
    let mut c = g3.create_channel(3, 256, T).unwrap();
    let faults_before = sigbus_guard::recovered_faults();

    // Guest 1: a valid memory table, then the file shrinks to nothing, then rings and kicks
    // make the daemon read the (vanished) rings.
    let mut a = TestFrontend::connect(&s.sock(1), Sealing::Unsealed);
    a.negotiate().unwrap();
    a.set_mem_table().unwrap();
    a.memory.file().set_len(0).unwrap();
    start_rings_blind(&mut a);

    assert!(
        a.raw.closed_within(T),
        "the daemon did not close the connection"
    );
    assert!(sigbus_guard::recovered_faults() > faults_before);
    let line = logs::wait_for(&["guest 1", "vanished", "closing the connection"]);
    assert!(line.starts_with("WARN"), "{line}");
    let info = logs::wait_for(&["guest 1", "memory table", "not sealed"]);
    assert!(info.contains("guarded against SIGBUS only"), "{info}");

    // Guests 2 and 3 still complete a round trip.
    user_data_arrives(&mut b, &mut c, &g3, 1, b"ping");
    user_data_arrives(&mut c, &mut b, &g2, 2, b"pong");

    // Guest 1's socket serves a well-behaved frontend again.
    drop(a);
    let g1 = s.guest(1);
    assert!(g1.create_channel(1, 256, T).is_ok());
}

#[test]
fn memory_truncated_under_running_rings_takes_down_only_that_port() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut net = Net::new();
    let (sa, sb, sc) = (net.add_port(1), net.add_port(2), net.add_port(3));
    let a = TestFrontend::start(&sa);
    let mut b = TestFrontend::start(&sb);
    let mut c = TestFrontend::start(&sc);
    let faults_before = sigbus_guard::recovered_faults();

    a.memory.file().set_len(0).unwrap();
    // A broadcast makes the daemon write into port 1's RX ring (gone), and reach port 3.
    let broadcast = eth(MacAddr([0xff; 6]), mac(2), 0x0800, &payload(1, 60));
    b.send(&broadcast);
    assert_eq!(c.recv(T), Some(broadcast));

    assert!(
        a.raw.closed_within(T),
        "the daemon did not close the connection"
    );
    net.events.wait_count(&Event::Link(GuestId(1), false), 1);
    assert!(sigbus_guard::recovered_faults() > faults_before);
    let f = eth(mac(3), mac(2), 0x0800, &payload(2, 200));
    b.send(&f);
    assert_eq!(c.recv(T), Some(f));
    let back = eth(mac(2), mac(3), 0x0800, &payload(3, 200));
    c.send(&back);
    assert_eq!(b.recv(T), Some(back));
}
