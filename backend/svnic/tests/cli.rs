//! The `svnic` binary as users run it: `serve` refusing bad configuration and socket paths
//! others could take over, sockets with their modes whatever the umask, uid allow-lists, `ctl`
//! talking to a running daemon, guest pools, and a clean shutdown on SIGTERM that removes every
//! socket.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use svnic_host_frontend::HostGuest;

const BIN: &str = env!("CARGO_BIN_EXE_svnic");

/// A fresh directory with `mode` (0700 keeps it private; 0755 lets other uids reach sockets).
fn tmpdir(tag: &str, mode: u32) -> PathBuf {
    let d = std::env::temp_dir().join(format!("svnic-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
    d
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

/// Sends SIGTERM and waits (up to 10 s) for a successful exit.
fn terminate(serve: &mut Serve) {
    // SAFETY: kill with a valid pid of our own child and a valid signal number.
    unsafe { libc::kill(serve.0.id() as i32, libc::SIGTERM) };
    let status = wait_exit(serve, 10, "svnic serve did not exit on SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// Waits up to `secs` for the child to exit; panics with `what` otherwise.
fn wait_exit(serve: &mut Serve, secs: u64, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(s) = serve.0.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `svnic serve args`, which must fail; returns its stderr.
fn serve_must_fail(args: &[String]) -> String {
    let mut child = Serve(
        Command::new(BIN)
            .arg("serve")
            .args(args)
            .env("RUST_LOG", "off")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let status = wait_exit(
        &mut child,
        20,
        &format!("svnic serve {args:?} kept running"),
    );
    assert_eq!(status.code(), Some(1), "{args:?}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut err).unwrap();
    err
}

/// A `svnic serve` process, killed when dropped if still running.
struct Serve(Child);

impl Serve {
    /// Spawns `cmd` (a `svnic serve` command line) with `RUST_LOG=log` and its output
    /// discarded, and waits until each of `sockets` exists.
    fn spawn(cmd: &mut Command, log: &str, sockets: &[&Path]) -> Serve {
        let child = cmd
            .env("RUST_LOG", log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let serve = Serve(child);
        for p in sockets {
            wait_for(p);
        }
        serve
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ctl(admin: &Path, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("ctl")
        .args(args)
        .arg("--admin-socket")
        .arg(admin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "svnic ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn serve_refuses_bad_configuration_naming_the_field_and_value() {
    let cases = [
        (
            vec!["--guest", "name=a,socket=/tmp/svnic-x.sock,mac=zz:zz"],
            "mac",
        ),
        (
            vec![
                "--guest",
                "name=a,socket=/tmp/svnic-x.sock,mac=52:54:00:00:00:01,endpoints=9-1",
            ],
            "endpoints",
        ),
        (
            vec![
                "--guest",
                "name=a,socket=/tmp/svnic-x.sock,mac=52:54:00:00:00:01",
                "--workers",
                "0",
            ],
            "workers",
        ),
        (vec![], "no guest configured"),
        (
            vec![
                "--pool",
                "name=r,socket=/tmp/svnic-x.sock,macs=52:54:00:10:00:00/24,max=5000",
            ],
            "max = '5000'",
        ),
        (
            vec![
                "--pool",
                "name=r,socket=/tmp/svnic-x.sock,macs=52:54:00:10:00:00/4,max=1",
            ],
            "macs = '52:54:00:10:00:00/4'",
        ),
        (
            vec![
                "--guest",
                "name=a,socket=/tmp/svnic-x.sock,mac=52:54:00:10:00:07",
                "--pool",
                "name=r,socket=/tmp/svnic-y.sock,macs=52:54:00:10:00:00/40,max=4",
            ],
            "macs = '52:54:00:10:00:00-52:54:00:10:00:ff'",
        ),
    ];
    for (args, word) in cases {
        let out = Command::new(BIN).arg("serve").args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(word), "{args:?}: {err}");
    }
    let out = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg("/nonexistent/svnic.toml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/svnic.toml"));
}

/// Values outside a fixed set are refused by the parser, naming the option, the value and every
/// accepted value.
#[test]
fn placement_and_ctl_refuse_unknown_values_naming_the_accepted_ones() {
    let cases: [(&[&str], &[&str]); 2] = [
        (
            &[
                "serve",
                "--guest",
                "name=a,socket=/tmp/svnic-x.sock,mac=52:54:00:00:00:01",
                "--placement",
                "fastest",
            ],
            &["--placement", "fastest", "endpoint-hash", "least-loaded"],
        ),
        (
            &["ctl", "routes"],
            &["routes", "guests", "channels", "engine"],
        ),
    ];
    for (args, words) in cases {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        for word in words {
            assert!(err.contains(word), "{args:?}: {word} missing from {err}");
        }
    }
    let dir = tmpdir("placement-file", 0o700);
    let file = dir.join("svnic.toml");
    std::fs::write(
        &file,
        "[engine]\nplacement = \"fastest\"\n[[guest]]\nname = \"a\"\nsocket = \"/tmp/svnic-x.sock\"\nmac = \"52:54:00:00:00:01\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("serve")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for word in ["placement", "fastest", "endpoint-hash", "least-loaded"] {
        assert!(err.contains(word), "{word} missing from {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_answers_ctl_and_shuts_down_cleanly_on_sigterm() {
    let dir = tmpdir("serve", 0o700);
    let (s1, s2, admin) = (
        dir.join("vm1.sock"),
        dir.join("vm2.sock"),
        dir.join("admin.sock"),
    );
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg("--guest")
        .arg(format!(
            "name=vm1,socket={},mac=52:54:00:c1:00:01,channels=4",
            s1.display()
        ))
        .arg("--guest")
        .arg(format!(
            "name=vm2,socket={},mac=52:54:00:c1:00:02",
            s2.display()
        ))
        .arg("--admin-socket")
        .arg(&admin)
        .arg("--workers")
        .arg("2");
    let mut serve = Serve::spawn(&mut cmd, "warn", &[&s1, &s2, &admin]);
    // A host-process guest connects and creates a channel.
    let g = HostGuest::connect(&s1, 32 << 20).unwrap();
    let ch = g.create_channel(5, 256, Duration::from_secs(10)).unwrap();

    let guests: serde_json::Value =
        serde_json::from_str(&ctl(&admin, &["guests", "--json"])).unwrap();
    let list = guests["guests"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["name"], "vm1");
    assert_eq!(list[0]["connected"], true);
    assert_eq!(list[0]["channels"], 1);
    assert_eq!(list[1]["connected"], false);
    let table = ctl(&admin, &["channels"]);
    assert!(
        table.starts_with("ID")
            && table.contains("52:54:00:c1:00:01/5")
            && table.contains("Success"),
        "{table}"
    );
    let engine: serde_json::Value =
        serde_json::from_str(&ctl(&admin, &["engine", "--json"])).unwrap();
    assert_eq!(engine["workers"].as_array().unwrap().len(), 2);
    assert!(
        engine["control_requests"].as_u64().unwrap() >= 2,
        "Pending + Success answered"
    );
    drop(ch);
    drop(g);

    // SIGTERM: a clean exit, sockets removed.
    terminate(&mut serve);
    for p in [&s1, &s2, &admin] {
        assert!(!p.exists(), "{} left behind", p.display());
    }
    // ctl now says clearly that nothing is running.
    let out = Command::new(BIN)
        .args(["ctl", "guests", "--admin-socket"])
        .arg(&admin)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `svnic serve` running?"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_with_only_a_pool_lists_its_members_in_ctl_and_removes_its_socket() {
    let dir = tmpdir("pool", 0o700);
    let (sock, admin) = (dir.join("ranks.sock"), dir.join("admin.sock"));
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg("--pool")
        .arg(format!(
            "name=ranks,socket={},macs=52:54:00:c2:00:00/40,max=2",
            sock.display()
        ))
        .arg("--admin-socket")
        .arg(&admin);
    let mut serve = Serve::spawn(&mut cmd, "warn", &[&sock, &admin]);
    let (a, b) = (
        HostGuest::connect(&sock, 32 << 20).unwrap(),
        HostGuest::connect(&sock, 32 << 20).unwrap(),
    );
    let _ch = b.create_channel(5, 256, Duration::from_secs(10)).unwrap();
    assert_eq!(
        (a.mac().to_string(), b.mac().to_string()),
        ("52:54:00:c2:00:00".into(), "52:54:00:c2:00:01".into())
    );
    let table = ctl(&admin, &["guests"]);
    let me = std::process::id().to_string();
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert_eq!(&rows[0][9..], ["POOL", "PID", "UID"], "{table}");
    for (row, (name, mac, channels)) in rows[1..].iter().zip([
        ("ranks-0", "52:54:00:c2:00:00", "0"),
        ("ranks-1", "52:54:00:c2:00:01", "1"),
    ]) {
        assert_eq!(
            (row[0], row[1], row[3], row[4], row[9], row[10]),
            (name, mac, "yes", channels, "ranks", me.as_str()),
            "{table}"
        );
    }
    // The third process is refused at once; the pools table counts it.
    assert!(HostGuest::connect(&sock, 32 << 20).is_err());
    let pools: serde_json::Value =
        serde_json::from_str(&ctl(&admin, &["pools", "--json"])).unwrap();
    let pool = &pools["pools"][0];
    assert_eq!(
        (
            &pool["name"],
            &pool["max"],
            &pool["live"],
            &pool["refused_full"]
        ),
        (&"ranks".into(), &2.into(), &2.into(), &1.into()),
        "{pools}"
    );
    let table = ctl(&admin, &["pools"]);
    assert!(
        table.starts_with("NAME") && table.contains("52:54:00:c2:00:00-52:54:00:c2:00:ff"),
        "{table}"
    );
    drop(a);
    terminate(&mut serve);
    assert!(!sock.exists() && !admin.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sockets_get_their_modes_whatever_the_umask_and_allow_lists_refuse_other_uids() {
    let dir = tmpdir("modes", 0o755);
    // Straight in /tmp (root's, sticky) as the README shows, and in a directory of our own.
    let s1 = std::env::temp_dir().join(format!("svnic-cli-{}-vm1.sock", std::process::id()));
    let (s2, admin) = (dir.join("vm2.sock"), dir.join("admin.sock"));
    // Under umask 000 a socket bound the usual way would be 0777.
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("umask 000; exec \"$0\" \"$@\"")
        .arg(BIN)
        .arg("serve")
        .arg("--guest")
        .arg(format!(
            "name=vm1,socket={},mac=52:54:00:c2:00:01",
            s1.display()
        ))
        .arg("--guest")
        .arg(format!(
            "name=vm2,socket={},mac=52:54:00:c2:00:02,socket_mode=0666,allow_uids=0",
            s2.display()
        ))
        .arg("--admin-socket")
        .arg(&admin)
        .args(["--admin-socket-mode", "0666", "--workers", "1"]);
    let mut serve = Serve::spawn(&mut cmd, "off", &[&s1, &s2, &admin]);
    assert_eq!(
        (mode_of(&s1), mode_of(&s2), mode_of(&admin)),
        (0o600, 0o666, 0o666)
    );
    if is_root() {
        // uid 65534 through `svnic ctl`, which connects to any socket and sends a line.
        let as_nobody = |socket: &Path| {
            Command::new(BIN)
                .args(["ctl", "guests", "--admin-socket"])
                .arg(socket)
                .uid(65534)
                .gid(65534)
                .output()
                .unwrap()
        };
        let out = as_nobody(&s1);
        assert!(!out.status.success(), "0600 keeps other uids out");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(err.contains("ermission denied"), "{err}");
        // vm2's mode lets everyone connect; its allow-list lets only root in.
        assert!(!as_nobody(&s2).status.success());
        // The admin socket admits the daemon's uid and root only.
        let out = as_nobody(&admin);
        assert!(
            !out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let guests: serde_json::Value =
            serde_json::from_str(&ctl(&admin, &["guests", "--json"])).unwrap();
        let refused: Vec<_> = guests["guests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["refused_peers"].as_u64().unwrap())
            .collect();
        assert_eq!(refused, [0, 1]);
    } else {
        eprintln!("skipped the uid checks: connecting as another uid needs root");
    }
    terminate(&mut serve);
    assert!(!s1.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_refuses_socket_paths_other_users_could_take_over() {
    let dir = tmpdir("refuse", 0o700);
    let serve_args = |socket: &Path, admin: &Path| {
        vec![
            "--guest".to_string(),
            format!("name=vm1,socket={},mac=52:54:00:c3:00:01", socket.display()),
            "--admin-socket".to_string(),
            admin.display().to_string(),
        ]
    };
    let guest = |socket: &Path| serve_args(socket, &dir.join("admin.sock"));
    // A directory everyone may write to, without the sticky bit.
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = serve_must_fail(&guest(&open.join("vm1.sock")));
    assert!(
        err.contains("writable by group or others") && err.contains(&*open.to_string_lossy()),
        "{err}"
    );
    // Something that is not a socket.
    let file = dir.join("file.sock");
    std::fs::write(&file, b"").unwrap();
    let err = serve_must_fail(&guest(&file));
    assert!(err.contains("is not a socket"), "{err}");
    // The admin socket follows the same rules.
    let args = serve_args(&dir.join("vm1.sock"), &open.join("admin.sock"));
    let err = serve_must_fail(&args);
    assert!(
        err.contains("admin socket") && err.contains("writable"),
        "{err}"
    );
    assert!(
        !dir.join("vm1.sock").exists(),
        "the guest socket is removed again"
    );
    if is_root() {
        // A socket another user left at the path.
        let theirs = dir.join("theirs.sock");
        drop(std::os::unix::net::UnixListener::bind(&theirs).unwrap());
        std::os::unix::fs::lchown(&theirs, Some(65534), None).unwrap();
        let err = serve_must_fail(&guest(&theirs));
        assert!(
            err.contains("does not own") && err.contains("65534"),
            "{err}"
        );
        assert!(theirs.exists(), "their socket is left alone");
    }
    // A bad mode is a configuration error (exit 2) naming the field and the value.
    let out = Command::new(BIN)
        .args(["serve", "--guest"])
        .arg(format!(
            "name=vm1,socket={},mac=52:54:00:c3:00:01,socket_mode=0999",
            dir.join("x.sock").display()
        ))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("socket_mode") && err.contains("0999"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
