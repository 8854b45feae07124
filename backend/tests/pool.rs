//! Guest pools end to end: the daemon as `svnic serve --pool` runs it (`Daemon::start` with its
//! admin socket), host-process guests connecting to the pool's socket (in this process and in
//! child processes), and the operator's view over the admin socket as `svnic ctl` asks it.
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use svnic_backend::config::{DaemonConfig, EngineOverrides};
use svnic_backend::daemon::{AdminSocket, Daemon, DaemonError};
use svnic_backend::pool::PoolError;
use svnic_channels::ChannelAddr;
use svnic_client::{Channel, Completions};
use svnic_host_frontend::HostGuest;
use svnic_tests::daemon_fixture::{assert_numbered_user_data, recv_messages, GUEST_MEMORY};
use svnic_tests::daemon_proc::{spawn_test_child, KillOnDrop, ScratchDir};
use svnic_tests::pool_fixture::{pool_mac, PoolFixture, POOL_RANGE};
use svnic_tests::wait::wait_until;

const T: Duration = Duration::from_secs(10);

fn addr(g: &HostGuest, endpoint: u32) -> ChannelAddr {
    ChannelAddr::new(g.mac(), endpoint)
}

/// Sends `n` user-data messages from `a` to `to` and checks that `b` receives them in order.
fn send_and_check(a: &mut Channel, b: &mut Channel, gb: &HostGuest, to: ChannelAddr, n: u64) {
    for i in 0..n {
        assert!(a
            .send_user(to, i, &i.to_le_bytes(), Completions::OnError)
            .unwrap());
    }
    a.flush().unwrap();
    let got = recv_messages(b, gb, n as usize, T);
    assert_eq!(got.len() as u64, n, "{got:?}");
    assert_numbered_user_data(&got, a.addr());
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[test]
fn two_members_get_distinct_macs_exchange_messages_and_are_listed() {
    let d = PoolFixture::start("pool-two", 8, ",channels=4");
    let (ga, gb) = (d.connect(), d.connect());
    assert_eq!(
        (ga.mac(), gb.mac()),
        (pool_mac(0), pool_mac(1)),
        "the lowest free MACs, in order"
    );
    let mut a = ga.create_channel(7, 256, T).unwrap();
    let mut b = gb.create_channel(9, 256, T).unwrap();
    send_and_check(&mut a, &mut b, &gb, addr(&gb, 9), 100);
    send_and_check(&mut b, &mut a, &ga, addr(&ga, 7), 100);
    // The pool's policy holds for each member: at most 4 channels.
    let more: Vec<Channel> = (10..13)
        .map(|e| ga.create_channel(e, 64, T).unwrap())
        .collect();
    assert!(ga.create_channel(13, 64, T).is_err(), "a fifth channel");

    let guests = d.guests();
    let rows: Vec<_> = guests
        .iter()
        .map(|g| {
            (
                g.name.as_str(),
                g.macs.clone(),
                g.pool.as_deref(),
                g.peer_pid,
                g.peer_uid,
                g.connected,
                g.channels,
            )
        })
        .collect();
    let me = Some(std::process::id() as i32);
    assert_eq!(
        rows,
        vec![
            (
                "ranks-0",
                vec![pool_mac(0).to_string()],
                Some("ranks"),
                me,
                Some(effective_uid()),
                true,
                4
            ),
            (
                "ranks-1",
                vec![pool_mac(1).to_string()],
                Some("ranks"),
                me,
                Some(effective_uid()),
                true,
                1
            ),
        ]
    );
    assert!(guests
        .iter()
        .all(|g| g.socket == d.socket().display().to_string()));
    let pool = d.pool();
    assert_eq!(
        (pool.max, pool.live, pool.accepted, pool.refused_full),
        (8, 2, 2, 0)
    );
    assert_eq!(pool.macs, "52:54:00:10:00:00-52:54:00:10:00:ff");
    drop(more);
}

/// The child process of `a_member_killed_leaves_nothing_behind_and_its_mac_is_reused`: it joins
/// the pool, creates channel 9, says its MAC, and sleeps until killed.
#[test]
fn child_pool_member() {
    let Ok(sock) = std::env::var("SVNIC_POOL_CHILD_SOCKET") else {
        return;
    };
    let g = HostGuest::connect(&sock, GUEST_MEMORY).unwrap();
    let _ch = g.create_channel(9, 256, T).unwrap();
    println!("CHILD-READY {}", g.mac());
    std::thread::sleep(Duration::from_secs(60));
}

/// Starts a child member on `sock`; returns it once it has its channel, with its MAC.
fn spawn_member(sock: &Path) -> (KillOnDrop, String) {
    spawn_test_child(
        "child_pool_member",
        "SVNIC_POOL_CHILD_SOCKET",
        sock.as_os_str(),
        "CHILD-READY ",
    )
    .unwrap()
}

#[test]
fn a_member_killed_leaves_nothing_behind_and_its_mac_is_reused() {
    let d = PoolFixture::start("pool-kill", 4, ",channels=4");
    let ga = d.connect();
    let mut a = ga.create_channel(1, 256, T).unwrap();
    let (child, child_mac) = spawn_member(d.socket());
    assert_eq!(child_mac, pool_mac(1).to_string());
    let child_pid = child.0.id() as i32;
    let guests = d.guests();
    assert_eq!(guests.len(), 2, "{guests:?}");
    assert_eq!(
        (guests[1].peer_pid, guests[1].channels, guests[1].connected),
        (Some(child_pid), 1, true)
    );
    // The member reaches the child's channel.
    let to_child = ChannelAddr::new(pool_mac(1), 9);
    assert!(a
        .send_user(to_child, 1, b"hi", Completions::OnError)
        .unwrap());
    a.flush().unwrap();

    drop(child); // SIGKILL
    d.wait_members(1);
    let guests = d.guests();
    assert_eq!(guests[0].name, "ranks-0");
    // Its engine guest, its channel and its MAC are gone; the other member's stay.
    let control_plane = d.daemon().engine().control_plane();
    let guests = control_plane.guests();
    assert_eq!(guests.len(), 1, "{guests:?}");
    assert_eq!(
        (guests[0].policy.macs.clone(), guests[0].live_channels.len()),
        (vec![pool_mac(0)], 1)
    );
    assert_eq!(control_plane.guest_by_mac(pool_mac(1)), None);
    assert_eq!(d.pool().live, 1);

    // Its MAC goes to the next process, which is served like the first.
    let gc = d.connect();
    assert_eq!(gc.mac(), pool_mac(1));
    let mut c = gc.create_channel(9, 256, T).unwrap();
    send_and_check(&mut a, &mut c, &gc, to_child, 10);

    // Joining and leaving again and again: nothing grows, not even the daemon's descriptors
    // and threads.
    drop(c);
    drop(gc);
    d.wait_members(1);
    let (fds, threads) = (fd_count(), thread_count());
    for _ in 0..5 {
        let g = d.connect();
        assert_eq!(g.mac(), pool_mac(1));
        drop(g.create_channel(3, 64, T).unwrap());
        drop(g);
        d.wait_members(1);
        // A process that connects and leaves without a word is a member for a moment too.
        let accepted = d.pool().accepted;
        drop(UnixStream::connect(d.socket()).unwrap());
        wait_until(T, || d.pool().accepted == accepted + 1);
        d.wait_members(1);
    }
    wait_until(T, || fd_count() <= fds && thread_count() <= threads);
    let pool = d.pool();
    assert_eq!((pool.live, pool.accepted), (1, 13), "{pool:?}");
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn at_max_a_further_connection_is_closed_at_once_and_the_members_are_unharmed() {
    let d = PoolFixture::start("pool-full", 2, ",channels=4");
    let (ga, gb) = (d.connect(), d.connect());
    let mut a = ga.create_channel(1, 256, T).unwrap();
    let mut b = gb.create_channel(2, 256, T).unwrap();

    // A raw connection is closed before anything is read: end of file, at once.
    let mut raw = UnixStream::connect(d.socket()).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    let started = Instant::now();
    assert_eq!(raw.read(&mut [0u8; 16]).unwrap(), 0);
    assert!(started.elapsed() < Duration::from_secs(2));
    // A host-process guest gets an error, not a hang.
    assert!(HostGuest::connect(d.socket(), GUEST_MEMORY).is_err());
    let pool = d.pool();
    assert_eq!((pool.live, pool.refused_full), (2, 2), "{pool:?}");
    assert_eq!(d.guests().len(), 2);

    send_and_check(&mut a, &mut b, &gb, addr(&gb, 2), 50);

    // After one leaves, the next is accepted, with the MAC it left.
    drop(b);
    drop(gb);
    d.wait_members(1);
    let gc = d.connect();
    assert_eq!(gc.mac(), pool_mac(1));
    let mut c = gc.create_channel(2, 256, T).unwrap();
    send_and_check(&mut a, &mut c, &gc, addr(&gc, 2), 50);
    assert_eq!(d.pool().accepted, 3);
}

#[test]
fn shutdown_releases_every_member_and_removes_the_socket() {
    let d = PoolFixture::start("pool-stop", 4, ",channels=4");
    let g = d.connect();
    let _ch = g.create_channel(1, 256, T).unwrap();
    let socket = d.socket().to_path_buf();
    let admin = d.admin().to_path_buf();
    drop(d);
    assert!(!socket.exists() && !admin.exists());
    // The member's connection was ended by the daemon: its requests now fail.
    assert!(g.create_channel(2, 64, Duration::from_secs(2)).is_err());
}

#[test]
fn a_pool_socket_that_cannot_be_bound_stops_the_start_naming_the_pool() {
    let dir = ScratchDir::new("pool-bad").unwrap();
    let spec = format!(
        "name=ranks,socket={},macs={POOL_RANGE},max=2",
        dir.path().join("missing/ranks.sock").display()
    );
    let cfg = DaemonConfig::load_with_pools(
        None,
        &[],
        &[spec],
        &EngineOverrides::default(),
        Some(dir.path().join("admin.sock")),
    )
    .unwrap();
    let e = Daemon::start(&cfg, AdminSocket::Serve).unwrap_err();
    assert!(
        matches!(&e, DaemonError::Pool(PoolError::Socket { name, .. }) if name == "ranks"),
        "{e}"
    );
    assert!(e.to_string().starts_with("pool 'ranks': "), "{e}");
    assert!(!dir.path().join("admin.sock").exists());
}
