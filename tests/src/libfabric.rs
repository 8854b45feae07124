//! The svnic libfabric provider as applications load it: libsvnic-fi.so installed by the
//! project's script where `FI_PROVIDER_PATH` points, libfabric's tools (Debian's libfabric-bin,
//! installed by scripts/setup.sh) run with it, and fi_pingpong's output read back.
#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::daemon_proc::{kill_with_parent, repo_root, KillOnDrop};

/// The directory holding libsvnic-fi.so (under the target directory), installed once per test
/// binary by the project's script.
pub fn provider_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| repo_root().join("target"), PathBuf::from);
        let dir = target.join("libfabric-provider");
        let script = repo_root().join("scripts/install-libfabric-provider.sh");
        let out = Command::new(&script).arg(&dir).output().unwrap();
        assert!(
            out.status.success(),
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(dir.join("libsvnic-fi.so").is_file());
        dir
    })
}

/// A libfabric tool (from libfabric-bin) with the provider path and `FI_SVNIC_SOCKET`.
pub fn fi_tool(tool: &str, socket: Option<&Path>) -> Command {
    let mut c = Command::new(tool);
    c.env("FI_PROVIDER_PATH", provider_dir())
        .env("FI_PROVIDER", "svnic")
        .env("FI_SVNIC_LOG", "warn")
        .env_remove("FI_SVNIC_ENDPOINT");
    match socket {
        Some(s) => c.env("FI_SVNIC_SOCKET", s),
        None => c.env_remove("FI_SVNIC_SOCKET"),
    };
    c
}

pub fn run(mut c: Command) -> (bool, String) {
    let out = c.output().unwrap_or_else(|e| {
        panic!("cannot run {c:?} (scripts/setup.sh installs libfabric-bin): {e}")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A TCP port nobody listens on right now (for fi_pingpong's out-of-band socket).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// True once something listens on TCP `port` (read from /proc, so no connection is used up).
pub fn listening(port: u16) -> bool {
    let needle = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&needle) && cols[3] == "0A"
            })
        })
    })
}

/// One result line of fi_pingpong: bytes, #sent, #ack.
#[derive(Debug, PartialEq, Eq)]
pub struct PingpongLine {
    /// Message size.
    pub bytes: u64,
    /// Iterations sent.
    pub sent: u64,
    /// Iterations acknowledged.
    pub acked: u64,
}

/// fi_pingpong's size column: `64`, `1.5k`, `64k`, `1m`.
pub fn parse_size(s: &str) -> Option<u64> {
    let (num, mul) = match s.as_bytes().last()? {
        b'k' => (&s[..s.len() - 1], 1024.0),
        b'm' => (&s[..s.len() - 1], 1024.0 * 1024.0),
        _ => (s, 1.0),
    };
    let v: f64 = num.parse().ok()?;
    Some((v * mul).round() as u64)
}

/// The result table of fi_pingpong's output (the lines under its `bytes #sent #ack` header).
pub fn parse_pingpong(text: &str) -> Vec<PingpongLine> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with("bytes"));
    assert!(lines.next().is_some(), "no result table in:\n{text}");
    lines
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if cols.len() < 8 {
                return None;
            }
            Some(PingpongLine {
                bytes: parse_size(cols[0])?,
                sent: cols[1].parse().ok()?,
                acked: cols[2].strip_prefix('=')?.parse().ok()?,
            })
        })
        .collect()
}

/// The sizes `fi_pingpong -S all` runs up to `max` (util/pingpong.c of 1.17: 0, then powers of
/// two and 1.5 times each from 1).
pub fn all_sizes(max: u64) -> Vec<u64> {
    let mut v = vec![0];
    let mut p = 1u64;
    while p <= max {
        v.push(p);
        if p >= 2 && p + p / 2 <= max {
            v.push(p + p / 2);
        }
        p *= 2;
    }
    v
}

/// A fi_pingpong server and its client, each process's output in a log of its own.
#[derive(Debug)]
pub struct Pingpong {
    /// The server.
    pub server: KillOnDrop,
    /// The client.
    pub client: KillOnDrop,
    /// The server's output.
    pub server_log: PathBuf,
    /// The client's output.
    pub client_log: PathBuf,
}

/// A fi_pingpong server with `args` attached through `sockets.0`, and once it listens its client
/// through `sockets.1`, both with the variables `env` set, on a fresh control port; their
/// outputs go to server.log and client.log in `dir`.
pub fn start_pingpong(
    sockets: (&Path, &Path),
    env: &[(&str, &str)],
    args: &[&str],
    dir: &Path,
) -> Pingpong {
    let (server_log, client_log) = (dir.join("server.log"), dir.join("client.log"));
    let port = free_port().to_string();
    let spawn = |socket: &Path, extra: &[&str], log: &Path| {
        let out = std::fs::File::create(log).unwrap();
        let mut c = fi_tool("fi_pingpong", Some(socket));
        c.envs(env.iter().copied())
            .args(args)
            .args(extra)
            .stdin(Stdio::null())
            .stderr(out.try_clone().unwrap())
            .stdout(out);
        kill_with_parent(&mut c);
        KillOnDrop(c.spawn().unwrap())
    };
    let mut server = spawn(sockets.0, &["-B", &port], &server_log);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listening(port.parse().unwrap()) {
        assert!(Instant::now() < deadline, "the server never listened");
        assert!(server.0.try_wait().unwrap().is_none(), "the server exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = spawn(sockets.1, &["-P", &port, "127.0.0.1"], &client_log);
    Pingpong {
        server,
        client,
        server_log,
        client_log,
    }
}

/// Runs fi_pingpong as [`start_pingpong`] does and checks that both processes exit 0 within
/// `timeout`; their outputs, client first.
pub fn run_pingpong(
    sockets: (&Path, &Path),
    env: &[(&str, &str)],
    args: &[&str],
    dir: &Path,
    timeout: Duration,
) -> [(&'static str, String); 2] {
    let mut p = start_pingpong(sockets, env, args, dir);
    let deadline = Instant::now() + timeout;
    let client_status = p.client.wait_until(deadline).unwrap();
    let server_status = p.server.wait_until(deadline).unwrap();
    let outputs = [
        ("client", std::fs::read_to_string(&p.client_log).unwrap()),
        ("server", std::fs::read_to_string(&p.server_log).unwrap()),
    ];
    for ((who, out), status) in outputs.iter().zip([client_status, server_status]) {
        assert!(
            status.is_some_and(|s| s.success()),
            "{who}: {status:?}\n{out}"
        );
    }
    outputs
}

/// A dead peer is an error for the survivor, not a hang: starts fi_pingpong as
/// [`start_pingpong`] does with `args` (a run far longer than the test), kills the client once
/// `messages()` (the engine's count of messages carried) passes 1000, so the out-of-band address
/// exchange is over, and checks that the server then exits within 60 s, failing a completion
/// read for the dead peer. `what` begins the failure messages.
pub fn check_survivor_of_a_killed_client(
    sockets: (&Path, &Path),
    args: &[&str],
    dir: &Path,
    messages: impl Fn() -> u64,
    what: &str,
) {
    let mut p = start_pingpong(sockets, &[], args, dir);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            p.client.0.try_wait().unwrap().is_none(),
            "{what}: the client ended early:\n{}",
            std::fs::read_to_string(&p.client_log).unwrap()
        );
        if messages() >= 1000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no traffic through the engine"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    p.client.0.kill().unwrap();
    p.client.0.wait().unwrap();
    let killed = Instant::now();
    let status = p
        .server
        .wait_until(killed + Duration::from_secs(60))
        .unwrap();
    let out = std::fs::read_to_string(&p.server_log).unwrap();
    let status = status.unwrap_or_else(|| {
        panic!("{what}: the server still waits 60 s after its peer died:\n{out}")
    });
    assert!(!status.success(), "{what}: {out}");
    assert!(
        out.contains("cq_readerr: svnic: no route to destination")
            || out.contains("cq_readerr: svnic: destination channel gone"),
        "{what}: {status:?}\n{out}"
    );
}

/// The sizes of `who`'s result table in `out`, after checking that every size had `iterations`
/// sent and acknowledged.
pub fn acked_sizes(who: &str, out: &str, iterations: u64) -> Vec<u64> {
    let table = parse_pingpong(out);
    for l in &table {
        assert_eq!(
            (l.sent, l.acked),
            (iterations, iterations),
            "{who}: {l:?}\n{out}"
        );
    }
    table.iter().map(|l| l.bytes).collect()
}
