//! Attacks 4 and 10 of issue 13: the daemon's own resources and sockets on the host.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use svnic_tests::arena::{arena_mac, Arena, Bounds};
use svnic_tests::daemon_proc::{
    proc_lowest_free_fd, serve_command, set_soft_open_files, svnic_binary, GuestSpec, ScratchDir,
    ServeOptions,
};
use svnic_tests::raw_frontend::RawFrontend;

/// Attack 4: the daemon cannot open another descriptor (its soft RLIMIT_NOFILE is lowered to
/// the next descriptor number it would get) while a frontend waits to be accepted. It must not spin: its CPU time
/// grows by well under half the wall time. Once descriptors are available again it accepts the
/// frontend.
#[test]
fn attack_04_accept_failing_with_emfile_does_not_spin() {
    const WINDOW: Duration = Duration::from_secs(2);
    let arena = Arena::start("hostile-a04", 0);
    let before = arena.footprint();
    let pid = arena.svnic.pid();
    // Descriptors closed after the limit was set would leave room below it: set it again until
    // the lowest free descriptor stays at the limit.
    let mut normal = None;
    for _ in 0..20 {
        let next_fd = proc_lowest_free_fd(pid).unwrap();
        let old = set_soft_open_files(pid, next_fd).unwrap();
        normal.get_or_insert(old);
        std::thread::sleep(Duration::from_millis(100));
        if proc_lowest_free_fd(pid).unwrap() == next_fd {
            break;
        }
    }
    let normal = normal.unwrap();
    let waiting = UnixStream::connect(arena.socket("evil")).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let (cpu0, t0) = (arena.svnic.cpu_time().unwrap(), Instant::now());
    std::thread::sleep(WINDOW);
    let (cpu1, wall) = (arena.svnic.cpu_time().unwrap(), t0.elapsed());
    let log_len = arena.svnic.log_len();
    set_soft_open_files(pid, normal).unwrap();
    let cpu = cpu1.saturating_sub(cpu0);
    eprintln!("out of descriptors for {wall:?}: {cpu:?} of CPU, log at {log_len} bytes");
    assert!(
        cpu < wall / 8,
        "out of descriptors with a frontend waiting, the daemon used {cpu:?} of CPU in {wall:?}\n{}",
        arena.log()
    );
    let f = RawFrontend::from_stream(waiting);
    if let Err(e) = f.sync() {
        panic!(
            "the waiting frontend was not served once descriptors were available: {e}\n{}",
            arena.log()
        );
    }
    drop(f);
    std::thread::sleep(Duration::from_millis(300));
    arena.assert_unharmed(before, Bounds::default());
}

/// Attack 10: under umask 000 every socket the daemon creates is still 0600.
#[test]
fn attack_10_sockets_are_0600_whatever_the_umask() {
    let opts = ServeOptions {
        umask: Some(0),
        ..ServeOptions::default()
    };
    let arena = Arena::start_with("hostile-a10-umask", 0, &opts);
    let before = arena.footprint();
    let mut sockets: Vec<_> = ["a", "b", "evil", "spare"]
        .into_iter()
        .map(|n| arena.socket(n))
        .collect();
    sockets.push(arena.svnic.admin_socket().to_path_buf());
    for s in &sockets {
        let mode = std::fs::metadata(s).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode,
            0o600,
            "{} has mode {mode:o} under umask 000\n{}",
            s.display(),
            arena.log()
        );
    }
    arena.assert_unharmed(before, Bounds::default());
}

/// The uid a socket is given to pretend that another local user made it.
const OTHER_UID: u32 = 65_534;

/// Runs `svnic serve` for guest "victim" at `socket` and expects it to refuse to start: a
/// non-zero exit within 10 s whose message names the socket.
fn expect_refusal(dir: &ScratchDir, socket: &std::path::Path, what: &str) {
    let bin = svnic_binary().unwrap();
    let guests = [GuestSpec {
        name: "victim".into(),
        socket: socket.to_path_buf(),
        mac: arena_mac(0),
    }];
    let log = dir.path().join("serve.err");
    let mut child = serve_command(&bin, dir.path(), &guests, &ServeOptions::default())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    match status {
        Some(s) if !s.success() => assert!(
            text.contains(&socket.display().to_string()),
            "{what}: svnic serve refused ({s}) without naming {}:\n{text}",
            socket.display()
        ),
        Some(s) => panic!("{what}: svnic serve exited with {s}, expected a refusal:\n{text}"),
        None => panic!(
            "{what}: svnic serve started on {}, owned by uid {OTHER_UID}:\n{text}",
            socket.display()
        ),
    }
}

fn chown_to_other(path: &std::path::Path) -> bool {
    match std::os::unix::fs::chown(path, Some(OTHER_UID), Some(OTHER_UID)) {
        Ok(()) => true,
        Err(e) => {
            eprintln!(
                "SKIPPED: cannot give {} to uid {OTHER_UID}: {e}",
                path.display()
            );
            false
        }
    }
}

/// Attack 10: another local user has bound the guest's socket path and is listening on it.
#[test]
fn attack_10_a_socket_path_bound_by_another_user_is_refused() {
    let dir = ScratchDir::new("hostile-a10-live").unwrap();
    let socket = dir.path().join("victim.sock");
    let _squatter = UnixListener::bind(&socket).unwrap();
    if chown_to_other(&socket) {
        expect_refusal(&dir, &socket, "a live socket of another user");
    }
}

/// Attack 10: another local user left a socket file at the guest's path (nobody listening): the
/// daemon does not own the path, so it does not take it over.
#[test]
fn attack_10_a_stale_socket_of_another_user_is_refused() {
    let dir = ScratchDir::new("hostile-a10-stale").unwrap();
    let socket = dir.path().join("victim.sock");
    drop(UnixListener::bind(&socket).unwrap());
    if chown_to_other(&socket) {
        expect_refusal(&dir, &socket, "a stale socket of another user");
    }
}
