//! A frontend whose memory vanishes under the daemon (its unsealed memfd truncated after
//! `SET_MEM_TABLE`) loses its own connection; the daemon survives the SIGBUS and keeps serving
//! every other guest.
#![allow(clippy::unwrap_used)]

mod net_support;

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use net_support::{eth, mac, payload, Event, Net, TestFrontend, QUEUE_SIZE, RX, TX};
use svnic_backend::config::{DaemonConfig, EngineOverrides};
use svnic_backend::daemon::{AdminSocket, Daemon};
use svnic_backend::net::sigbus_guard;
use svnic_channels::{MacAddr, Message};
use svnic_control_plane::GuestId;
use svnic_host_frontend::HostGuest;
use vhost::vhost_user::VhostUserFrontend;
use vhost::{VhostBackend, VringConfigData};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

const T: Duration = Duration::from_secs(10);

fn guest_mac(n: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0x00, 0xe3, 0xe0, n])
}

/// `svnic serve` with guests 1..=n, in this process.
struct Setup {
    daemon: Option<Daemon>,
    dir: PathBuf,
}

impl Setup {
    fn new(n: u8) -> Self {
        let dir = std::env::temp_dir().join(format!("svnic-memguard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let specs: Vec<String> = (1..=n)
            .map(|i| {
                format!(
                    "name=g{i},socket={},mac={}",
                    dir.join(format!("g{i}.sock")).display(),
                    guest_mac(i)
                )
            })
            .collect();
        let overrides = EngineOverrides {
            workers: Some(1),
            ..Default::default()
        };
        let cfg =
            DaemonConfig::load(None, &specs, &overrides, Some(dir.join("admin.sock"))).unwrap();
        Setup {
            daemon: Some(Daemon::start(&cfg, AdminSocket::Off).unwrap()),
            dir,
        }
    }

    fn sock(&self, i: u8) -> PathBuf {
        self.dir.join(format!("g{i}.sock"))
    }

    fn guest(&self, i: u8) -> HostGuest {
        HostGuest::connect(self.sock(i), 64 << 20).unwrap()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The memfd behind a test frontend's memory.
fn memfd_of(f: &TestFrontend) -> &File {
    f.mem
        .find_region(GuestAddress(0))
        .unwrap()
        .file_offset()
        .unwrap()
        .file()
}

/// Sets up and enables both rings and kicks them, without the frontend touching its own memory
/// (which is gone): only addresses are computed. The daemon touches the rings as early as
/// `SET_VRING_ADDR` (the library reads the used index), so the connection may end at any step.
fn start_rings_blind(f: &mut TestFrontend) {
    let _ = try_start_rings_blind(f);
    f.queues[TX].kick();
    f.queues[RX].kick();
}

fn try_start_rings_blind(f: &mut TestFrontend) -> vhost::Result<()> {
    for (q, base) in [(RX, 0x1_0000u64), (TX, 0x2_0000)] {
        let host = |gpa: u64| f.mem.get_host_address(GuestAddress(gpa)).unwrap() as u64;
        let avail = base + 16 * u64::from(QUEUE_SIZE);
        let used = (avail + 6 + 2 * u64::from(QUEUE_SIZE) + 3) & !3;
        let config = VringConfigData {
            queue_max_size: QUEUE_SIZE,
            queue_size: QUEUE_SIZE,
            flags: 0,
            desc_table_addr: host(base),
            used_ring_addr: host(used),
            avail_ring_addr: host(avail),
            log_addr: None,
        };
        f.frontend.set_vring_num(q, QUEUE_SIZE)?;
        f.frontend.set_vring_addr(q, &config)?;
        f.frontend.set_vring_base(q, 0)?;
        f.frontend.set_vring_call(q, &f.queues[q].call)?;
        f.frontend.set_vring_kick(q, &f.queues[q].kick)?;
        f.frontend.set_vring_enable(q, true)?;
    }
    Ok(())
}

/// Waits until the daemon closes `stream`.
fn assert_closed_by_the_daemon(stream: &UnixStream) {
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let deadline = Instant::now() + T;
    let mut buf = [0u8; 256];
    loop {
        match (&*stream).read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!("reading the frontend socket: {e}"),
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not close the connection"
        );
    }
}

fn recv(ch: &mut svnic_client::Channel, g: &HostGuest, n: usize) -> Vec<Message> {
    let w = g.waiter(ch);
    let mut out = Vec::new();
    let deadline = Instant::now() + T;
    while out.len() < n && Instant::now() < deadline {
        let want = n - out.len();
        ch.wait_poll(&mut out, want, Duration::from_millis(200), &w)
            .unwrap();
    }
    out
}

#[test]
fn a_frontend_that_truncates_its_memory_is_closed_and_the_daemon_serves_on() {
    net_support::capture_logs();
    let s = Setup::new(3);
    let (g2, g3) = (s.guest(2), s.guest(3));
    let mut b = g2.create_channel(2, 256, T).unwrap();
    let mut c = g3.create_channel(3, 256, T).unwrap();
    let faults_before = sigbus_guard::recovered_faults();

    // Guest 1: a valid memory table, then the file shrinks to nothing, then rings and kicks
    // make the daemon read the (vanished) rings.
    let mut a = TestFrontend::connect(&s.sock(1));
    a.negotiate().unwrap();
    a.set_mem_table().unwrap();
    memfd_of(&a).set_len(0).unwrap();
    start_rings_blind(&mut a);

    assert_closed_by_the_daemon(&a.raw);
    assert!(sigbus_guard::recovered_faults() > faults_before);
    let line = net_support::wait_for_log(&["guest 1", "vanished", "closing the connection"]);
    assert!(line.starts_with("WARN"), "{line}");
    let info = net_support::wait_for_log(&["guest 1", "memory table", "not sealed"]);
    assert!(info.contains("guarded against SIGBUS only"), "{info}");

    // Guests 2 and 3 still complete a round trip.
    b.send_user(c.addr(), 1, b"ping", false).unwrap();
    b.flush().unwrap();
    let got = recv(&mut c, &g3, 1);
    assert!(
        matches!(&got[..], [Message::UserData(u)] if u.data() == b"ping"),
        "{got:?}"
    );
    c.send_user(b.addr(), 2, b"pong", false).unwrap();
    c.flush().unwrap();
    let got = recv(&mut b, &g2, 1);
    assert!(
        matches!(&got[..], [Message::UserData(u)] if u.data() == b"pong"),
        "{got:?}"
    );

    // Guest 1's socket serves a well-behaved frontend again.
    drop(a);
    let g1 = s.guest(1);
    assert!(g1.create_channel(1, 256, T).is_ok());
}

#[test]
fn memory_truncated_under_running_rings_takes_down_only_that_port() {
    let mut net = Net::new();
    let (sa, sb, sc) = (net.add_port(1), net.add_port(2), net.add_port(3));
    let a = TestFrontend::start(&sa);
    let mut b = TestFrontend::start(&sb);
    let mut c = TestFrontend::start(&sc);
    let faults_before = sigbus_guard::recovered_faults();

    memfd_of(&a).set_len(0).unwrap();
    // A broadcast makes the daemon write into port 1's RX ring (gone), and reach port 3.
    let broadcast = eth(MacAddr([0xff; 6]), mac(2), 0x0800, &payload(1, 60));
    b.send(&broadcast);
    assert_eq!(c.recv(T), Some(broadcast));

    assert_closed_by_the_daemon(&a.raw);
    net.events.wait_count(&Event::Link(GuestId(1), false), 1);
    assert!(sigbus_guard::recovered_faults() > faults_before);
    let f = eth(mac(3), mac(2), 0x0800, &payload(2, 200));
    b.send(&f);
    assert_eq!(c.recv(T), Some(f));
    let back = eth(mac(2), mac(3), 0x0800, &payload(3, 200));
    c.send(&back);
    assert_eq!(b.recv(T), Some(back));
}
