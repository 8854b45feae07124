//! The `svnic-guestd` binary as a VM starts it, on a host: on one end of a veth pair in a
//! private network namespace (root only; skipped otherwise), started with `--background`,
//! answering applications with the interface's MAC, and stopped by SIGTERM.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use svnic_client::vm::AgentClient;

fn guestd() -> std::path::PathBuf {
    match svnic_tests::daemon_proc::workspace_binary("svnic-guestd", "svnic-guestd") {
        Ok(path) => path,
        Err(e) => panic!("svnic-guestd: {e}"),
    }
}

#[test]
fn the_daemon_starts_in_the_background_serves_and_stops_on_sigterm() {
    in_netns_with_veth(&["gd0", "address", "52:54:00:7a:00:01"], "gd1", || {
        let dir = std::env::temp_dir().join(format!("svnic-guestd-bin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sock = dir.join("run/agent.sock");
        let log = dir.join("run/guestd.log");
        let out = Command::new(guestd())
            .args([
                "--background",
                "--iface",
                "gd0",
                "--hugepages",
                "0",
                "--no-state-file",
            ])
            .arg("--socket")
            .arg(&sock)
            .arg("--log-file")
            .arg(&log)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("svnic-guestd: serving applications on"),
            "{stdout}"
        );
        let pid = pid_of(&stdout);
        let client = AgentClient::connect(&sock).unwrap();
        assert_eq!(client.mac().to_string(), "52:54:00:7a:00:01");
        drop(client);
        // SAFETY: kill sends SIGTERM to the agent we started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        wait_gone(pid);
        assert!(!sock.exists(), "the socket is removed on exit");
        let text = std::fs::read_to_string(&log).unwrap();
        for line in [
            "svnic-guestd: serving applications on",
            "application 1 connected",
            "stopping: destroying every channel",
            "svnic-guestd stopped",
        ] {
            assert!(text.contains(line), "{line:?} not in the log:\n{text}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// Connects as `uid` from a thread that alone switches to that user (the raw syscalls act on
/// the calling thread only); returns the channels the agent's Hello allows, or the error.
fn hello_as(sock: &std::path::Path, uid: u32) -> Result<u32, String> {
    let sock = sock.to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: setresgid on this thread only; integer arguments.
        let g = unsafe { libc::syscall(libc::SYS_setresgid, uid, uid, uid) };
        // SAFETY: setresuid on this thread only (it ends after connecting); integer arguments.
        let u = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
        assert_eq!((g, u), (0, 0), "cannot switch this thread to uid {uid}");
        AgentClient::connect(&sock)
            .map(|c| c.info().max_channels)
            .map_err(|e| e.to_string())
    })
    .join()
    .unwrap()
}

/// The pid in "(pid N)" of the agent's start-up line.
fn pid_of(stdout: &str) -> i32 {
    stdout
        .split("(pid ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .unwrap()
}

/// Runs `body` on a thread moved into a new network namespace holding a veth pair: `first`
/// (`ip link add` arguments: the name, and maybe `address <mac>`) and its peer `peer`. Skips
/// (prints why, and passes) unless root and both steps work.
fn in_netns_with_veth(first: &[&str], peer: &str, body: impl FnOnce() + Send + 'static) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let mut args = vec!["link", "add"];
    args.extend_from_slice(first);
    let args: Vec<String> = args
        .iter()
        .chain(&["type", "veth", "peer", "name", peer])
        .map(|a| a.to_string())
        .collect();
    std::thread::spawn(move || {
        // SAFETY: moves only this thread (and what it starts) into a new network namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!("skipped: cannot unshare the network namespace");
            return;
        }
        let made = Command::new("ip").args(&args).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: cannot create a veth pair");
            return;
        }
        body();
    })
    .join()
    .unwrap();
}

fn wait_gone(pid: i32) {
    let t0 = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the agent did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The socket file gets exactly --socket-mode whatever the umask the daemon starts with (000
/// would otherwise leave it 0777, 077 would leave it 0600), and the per-uid flags reach the
/// agent: nobody's Hello allows the --max-channels-per-uid channels, root's the per-app ones.
#[test]
fn the_socket_mode_is_exact_under_any_umask_and_uid_flags_reach_the_agent() {
    in_netns_with_veth(&["gm0"], "gm1", || {
        let dir = std::env::temp_dir().join(format!("svnic-guestd-mode-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let run = dir.join("run");
        std::fs::create_dir_all(&run).unwrap();
        use std::os::unix::fs::PermissionsExt;
        for d in [&dir, &run] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let sock = run.join("agent.sock");
        let log = run.join("guestd.log");
        for (umask, mode) in [("000", 0o660), ("077", 0o666)] {
            let cmd = format!(
                "umask {umask}; exec {} --background --iface gm0 --hugepages 0 \
                 --no-state-file --socket {} --log-file {} --socket-mode {mode:o} \
                 --max-channels-per-app 8 --max-channels-per-uid 2",
                guestd().display(),
                sock.display(),
                log.display()
            );
            let out = Command::new("sh").args(["-c", &cmd]).output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(
                out.status.success(),
                "{stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let pid = pid_of(&stdout);
            let got = std::fs::symlink_metadata(&sock)
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(got & 0o7777, mode, "umask {umask}: mode {got:o}");
            assert_eq!(hello_as(&sock, 0), Ok(8));
            let nobody = hello_as(&sock, 65534);
            if mode == 0o666 {
                assert_eq!(nobody, Ok(2), "nobody's Hello");
            } else {
                let e = nobody.unwrap_err();
                assert!(e.contains("Permission denied"), "{e}");
            }
            // SAFETY: kill sends SIGTERM to the agent we started.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
            wait_gone(pid);
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}
