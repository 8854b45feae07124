//! The `svnic` binary as users run it: `serve` refusing bad configuration, `ctl` talking to a
//! running daemon, and a clean shutdown on SIGTERM that removes every socket.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use svnic_guest::virtio_user::HostGuest;

const BIN: &str = env!("CARGO_BIN_EXE_svnic");

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("svnic-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `svnic serve` process, killed when dropped if still running.
struct Serve(Child);

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

#[test]
fn serve_answers_ctl_and_shuts_down_cleanly_on_sigterm() {
    let dir = tmpdir("serve");
    let (s1, s2, admin) = (
        dir.join("vm1.sock"),
        dir.join("vm2.sock"),
        dir.join("admin.sock"),
    );
    let child = Command::new(BIN)
        .arg("serve")
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
        .arg("2")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut serve = Serve(child);
    for p in [&s1, &s2, &admin] {
        wait_for(p);
    }
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
    // SAFETY: kill with a valid pid of our own child and a valid signal number.
    unsafe { libc::kill(serve.0.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = serve.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "svnic serve did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
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
