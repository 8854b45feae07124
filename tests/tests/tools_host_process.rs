//! `svnic-guest ping/echo` and `perf/sink` in host-process mode, as separate processes (the
//! built binary), against the real svnic daemon (`Daemon::start`, as `svnic serve` runs it) over
//! real vhost-user sockets: every path (channel user-data, channel DMA-data, virtio-net frames)
//! and kernel UDP on loopback.
#![allow(clippy::unwrap_used)]

use svnic_tests::guest_tool as tool;

use std::time::Duration;

use svnic_backend::config::EngineOverrides;
use svnic_channels::MacAddr;
use svnic_tests::daemon_fixture::DaemonFixture;
use tool::spawn;

const MAC1: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x70, 0x01, 0x01]);
const MAC2: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x70, 0x01, 0x02]);
const LONG: Duration = Duration::from_secs(120);

/// The daemon with guests 1 (MAC1) and 2 (MAC2).
fn daemon(name: &str) -> DaemonFixture {
    let guests = [(MAC1, ""), (MAC2, "")];
    DaemonFixture::start(
        &format!("tools-{name}"),
        &guests,
        EngineOverrides::default(),
    )
}

/// Guest `i`'s socket, as an argument.
fn sock(d: &DaemonFixture, i: u8) -> String {
    d.sock(i).display().to_string()
}

fn peer(path: &str) -> String {
    match path {
        "frame" => MAC2.to_string(),
        _ => format!("{MAC2}/1"),
    }
}

/// Starts `tool` (ping or perf) on guest socket `sock`, aimed at guest 2 over `path`, for
/// `count` messages, with JSON output.
fn spawn_initiator(tool: &str, sock: &str, path: &str, count: &str) -> tool::Tool {
    spawn(
        &format!("{tool} {path}"),
        &[
            tool,
            "--socket",
            sock,
            "--path",
            path,
            "--peer",
            &peer(path),
            "--count",
            count,
            "--json",
        ],
    )
}

#[test]
fn ping_and_echo_over_every_path() {
    let s = daemon("ping");
    let (g1, g2) = (sock(&s, 1), sock(&s, 2));
    for path in ["user", "dma", "frame"] {
        let count = "200";
        let echo = spawn(
            &format!("echo {path}"),
            &[
                "echo", "--socket", &g2, "--path", path, "--count", count, "--json",
            ],
        );
        let ready = echo.wait_ready(LONG);
        assert!(ready.contains("host-process"), "{ready}");
        let ping = spawn_initiator("ping", &g1, path, count);
        let p = ping.finish(LONG).json();
        assert_eq!(
            (p["tool"].as_str(), p["path"].as_str()),
            (Some("ping"), Some(path))
        );
        assert_eq!(p["mode"], "host-process");
        assert_eq!(p["round_trips"], 200);
        let (min, p50, p99) = (
            p["min_us"].as_f64().unwrap(),
            p["p50_us"].as_f64().unwrap(),
            p["p99_us"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= p50 && p50 <= p99, "{p}");
        let size = if path == "dma" { 4096 } else { 32 };
        assert_eq!(p["size"], size);
        let e = echo.finish(LONG).json();
        assert_eq!(e["echoed"], 200, "the probe is not counted");
        eprintln!("{path}: p50 {p50:.1} us");
    }
}

#[test]
fn perf_and_sink_over_every_path() {
    let s = daemon("perf");
    let (g1, g2) = (sock(&s, 1), sock(&s, 2));
    for (path, count) in [("user", 20_000u64), ("dma", 2_000), ("frame", 2_000)] {
        let n = count.to_string();
        let sink = spawn(
            &format!("sink {path}"),
            &[
                "sink",
                "--socket",
                &g2,
                "--path",
                path,
                "--count",
                &n,
                "--idle-ms",
                "1000",
                "--json",
            ],
        );
        sink.wait_ready(LONG);
        let perf = spawn_initiator("perf", &g1, path, &n);
        let p = perf.finish(LONG).json();
        assert_eq!(p["messages"], count);
        assert!(p["messages_per_sec"].as_f64().unwrap() > 0.0, "{p}");
        let k = sink.finish(LONG).json();
        let got = k["messages"].as_u64().unwrap();
        if path == "frame" {
            // The switch may drop frames when a queue is full; most arrive.
            assert!(got > 0 && got <= count, "{k}");
        } else {
            // Channels lose nothing.
            assert_eq!(got, count, "{k}");
        }
        let per = if path == "dma" { 4096 } else { 32 };
        assert_eq!(k["bytes"].as_u64().unwrap(), got * per);
        eprintln!("{path}: {} msgs/s received", k["messages_per_sec"]);
    }
}

#[test]
fn udp_ping_and_stream_over_loopback() {
    let echo = spawn(
        "udp echo",
        &[
            "echo",
            "--path",
            "udp",
            "--listen",
            "127.0.0.1:17601",
            "--count",
            "100",
            "--json",
        ],
    );
    echo.wait_ready(LONG);
    let p = spawn(
        "udp ping",
        &[
            "ping",
            "--path",
            "udp",
            "--peer",
            "127.0.0.1:17601",
            "--count",
            "100",
            "--json",
        ],
    )
    .finish(LONG)
    .json();
    assert_eq!(p["round_trips"], 100);
    assert_eq!(echo.finish(LONG).json()["echoed"], 100);

    let sink = spawn(
        "udp sink",
        &[
            "sink",
            "--path",
            "udp",
            "--listen",
            "127.0.0.1:17602",
            "--count",
            "1000",
            "--idle-ms",
            "500",
            "--json",
        ],
    );
    sink.wait_ready(LONG);
    let p = spawn(
        "udp perf",
        &[
            "perf",
            "--path",
            "udp",
            "--peer",
            "127.0.0.1:17602",
            "--count",
            "1000",
            "--json",
        ],
    )
    .finish(LONG)
    .json();
    assert_eq!(p["messages"], 1000);
    let k = sink.finish(LONG).json();
    assert!(k["messages"].as_u64().unwrap() > 0);
}

#[test]
fn errors_are_reported_not_panicked() {
    // Nobody listens on the socket: a clear error after --wait, exit status 1.
    let f = spawn(
        "no daemon",
        &[
            "ping",
            "--socket",
            "/nonexistent/g.sock",
            "--peer",
            "52:54:00:00:00:01/1",
            "--wait",
            "1",
        ],
    )
    .finish(LONG);
    assert_eq!(f.status.code(), Some(1), "{}", f.stderr);
    assert!(f.stderr.contains("/nonexistent/g.sock"), "{}", f.stderr);
    // Bad arguments.
    let f = spawn(
        "bad peer",
        &[
            "ping", "--path", "user", "--peer", "nonsense", "--wait", "1",
        ],
    )
    .finish(LONG);
    assert_eq!(f.status.code(), Some(1));
    assert!(f.stderr.contains("MAC/ENDPOINT"), "{}", f.stderr);
    let f = spawn(
        "too big",
        &[
            "ping",
            "--path",
            "user",
            "--peer",
            "52:54:00:00:00:01/1",
            "--size",
            "64",
        ],
    )
    .finish(LONG);
    assert_eq!(f.status.code(), Some(1));
    assert!(f.stderr.contains("at most 40"), "{}", f.stderr);
}

#[test]
fn crash_test_in_host_process_mode() {
    let s = daemon("crash");
    let r = spawn(
        "crash-test",
        &["crash-test", "--socket", &sock(&s, 1), "--json"],
    )
    .finish(LONG)
    .json();
    assert_eq!(r["mode"], "host-process");
    assert!(r["reclaimed_ms"].as_f64().unwrap() > 0.0, "{r}");
}
