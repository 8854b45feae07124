//! The `svnic-guestd` binary as a VM starts it, on a host: on one end of a veth pair in a
//! private network namespace (root only; skipped otherwise), started with `--background`,
//! answering applications with the interface's MAC, and stopped by SIGTERM.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use svnic_guest::vm::AgentClient;

const GUESTD: &str = env!("CARGO_BIN_EXE_svnic-guestd");

#[test]
fn the_daemon_starts_in_the_background_serves_and_stops_on_sigterm() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let t = std::thread::spawn(|| {
        // SAFETY: moves only this thread (and what it starts) into a new network namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!("skipped: cannot unshare the network namespace");
            return;
        }
        let made = Command::new("ip")
            .args([
                "link",
                "add",
                "gd0",
                "address",
                "52:54:00:7a:00:01",
                "type",
                "veth",
            ])
            .args(["peer", "name", "gd1"])
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: cannot create a veth pair");
            return;
        }
        let dir = std::env::temp_dir().join(format!("svnic-guestd-bin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sock = dir.join("run/agent.sock");
        let log = dir.join("run/guestd.log");
        let out = Command::new(GUESTD)
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
        let pid: i32 = stdout
            .split("(pid ")
            .nth(1)
            .and_then(|r| r.split(')').next())
            .and_then(|p| p.parse().ok())
            .unwrap();
        let client = AgentClient::connect(&sock).unwrap();
        assert_eq!(client.mac().to_string(), "52:54:00:7a:00:01");
        drop(client);
        // SAFETY: kill sends SIGTERM to the agent we started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
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
    t.join().unwrap();
}
