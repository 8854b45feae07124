//! The libfabric provider inside VMs: two QEMU guests (TCG) on one `svnic serve`, each with the
//! guest agent (`svnic-guestd`), run libfabric's `fi_pingpong` as user nobody in one boot: over
//! svnic (`-p svnic`, VM mode: the provider asks the agent for its channels), then over the
//! kernel's UDP and TCP (`-p udp`, `-p tcp`) on the same virtio-net, each at two sizes with every
//! payload checked (`-c`). The out-of-band socket of every run is TCP over eth0.
//!
//! The numbers are printed and written to target/vm-libfabric.txt, never asserted: the guests are
//! emulated (TCG), so they say nothing about the paths' speed on hardware.
//!
//! Skips, saying so, only when the image has no libfabric or no guest binaries
//! (`vm-images/build.sh` without `--build-guest --libfabric`; scripts/test.sh passes both).
#![allow(clippy::unwrap_used)]

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use svnic_backend::admin::{query, AdminRequest, AdminResponse};
use svnic_tests::ensure;
use svnic_tests::libfabric::{parse_pingpong, PingpongLine};
use svnic_tests::vm::{find_line, or_skip, GuestSetup, Image, TwoGuests};

const MAC_A: &str = "52:54:00:00:00:31";
const MAC_B: &str = "52:54:00:00:00:32";
const ITERATIONS: u64 = 50;
/// The runs, in order: provider, endpoint type, message size.
const RUNS: [(&str, &str, u64); 6] = [
    ("svnic", "dgram", 64),
    ("svnic", "dgram", 1024),
    ("udp", "dgram", 64),
    ("udp", "dgram", 1024),
    ("tcp", "msg", 64),
    ("tcp", "msg", 1024),
];
/// The first run's out-of-band port (B listens); the next runs take the next ports.
const FIRST_PORT: u16 = 47001;
/// A's port for B's "go" (vm-images/init.sh's wait-quit / quit).
const GO_PORT: u16 = 9;

/// `fi_pingpong` as vm-images/init.sh's `user:` steps want it ('+' for spaces), with the
/// provider directory of the image.
fn pingpong(run: (&str, &str, u64), extra: &str) -> String {
    let (prov, ep, size) = run;
    format!(
        "env+FI_PROVIDER_PATH=/lib/svnic-fi+fi_pingpong+-p+{prov}+-e+{ep}+-S+{size}+-c+-I+{ITERATIONS}+{extra}"
    )
}

/// B, the servers: each run's server in the background, once it listens A is told to go, then
/// B waits for it.
fn b_append() -> String {
    let mut steps = vec!["cmd:svnic-guestd+--background".to_string()];
    for (i, run) in RUNS.into_iter().enumerate() {
        let port = FIRST_PORT + i as u16;
        steps.push(format!("user-bg:{}", pingpong(run, &format!("-B+{port}"))));
        steps.push(format!("listening:{port}"));
        steps.push(format!("quit:10.0.0.1:{GO_PORT}"));
        steps.push("wait-bg".to_string());
    }
    format!("HUGEPAGES=16 IP=10.0.0.2/24 RUN={}", steps.join(","))
}

/// The step of A that runs the client of run `i`.
fn client_step(i: usize) -> String {
    let port = FIRST_PORT + i as u16;
    format!("user:{}", pingpong(RUNS[i], &format!("-P+{port}+10.0.0.2")))
}

/// A, the clients: who it runs as, then each run's client once B says its server listens.
fn a_append() -> String {
    let mut steps = vec![
        "cmd:svnic-guestd+--background".to_string(),
        "user:id".to_string(),
    ];
    for i in 0..RUNS.len() {
        steps.push(format!("wait-quit:{GO_PORT}:60"));
        steps.push(client_step(i));
    }
    format!("HUGEPAGES=16 IP=10.0.0.1/24 RUN={}", steps.join(","))
}

/// The console output of `step` (what came after the previous step's marker line and before
/// this step's).
fn step_output<'a>(serial: &'a str, step: &str) -> Option<&'a str> {
    let marker = format!("SVNIC-STEP {step} ");
    let end = serial.find(&marker)?;
    let start = serial[..end].rfind("SVNIC-STEP ").unwrap_or(0);
    Some(&serial[start..end])
}

#[test]
fn fi_pingpong_between_unprivileged_processes_of_two_qemu_guests_svnic_udp_tcp() {
    let Some(image) = or_skip(
        "fi_pingpong_between_unprivileged_processes_of_two_qemu_guests_svnic_udp_tcp",
        Image::find().and_then(|i| {
            i.manifest_lists("guest_binaries", &["svnic-guestd"])?;
            i.manifest_lists(
                "libfabric",
                &["/usr/bin/fi_pingpong", "/lib/svnic-fi/libsvnic-fi.so"],
            )?;
            Ok(i)
        }),
    ) else {
        return;
    };
    let t0 = Instant::now();
    let guests = [(MAC_A, a_append()), (MAC_B, b_append())];
    let [a, b] = guests
        .each_ref()
        .map(|(mac, append)| GuestSetup { mac, append });
    let mut vms = TwoGuests::start(&image, "vm-libfabric", a, b);
    let deadline = Instant::now() + Duration::from_secs(100);

    // While the svnic runs go on, each guest has a channel of its own through its agent.
    let svnic_runs_done = vms
        .a
        .wait_for_line(&format!("SVNIC-STEP {} ", client_step(1)), deadline);
    let channels = vms.svnic.channels().unwrap_or_else(|e| panic!("{e}"));
    vms.wait_powered_off("A", deadline);
    vms.wait_powered_off("B", deadline);
    let took = t0.elapsed();
    let (a_serial, b_serial) = (vms.a.serial_text(), vms.b.serial_text());
    ensure!(
        svnic_runs_done.is_some(),
        vms.context(),
        "A never finished the svnic runs"
    );
    for (who, serial) in [("A", &a_serial), ("B", &b_serial)] {
        ensure!(
            find_line(serial, "SVNIC-RESULT ") == Some("SVNIC-RESULT PASS"),
            vms.context(),
            "guest {who} did not pass every step"
        );
    }
    ensure!(
        find_line(&a_serial, "uid=").is_some_and(|l| l.starts_with("uid=65534(nobody)")),
        vms.context(),
        "the applications do not run as nobody"
    );
    // The svnic runs went through the engine: each guest's agent made a channel for each of them,
    // and the engine carried at least every ping and pong.
    for guest in ["vm1", "vm2"] {
        let made = channels.iter().filter(|c| c.guest == guest).count();
        ensure!(
            made == 2,
            vms.context(),
            "{guest} made {made} channels, not one per svnic run: {channels:#?}"
        );
    }
    let moved: u64 = match query(vms.svnic.admin_socket(), AdminRequest::Engine) {
        Ok(AdminResponse::Engine(e)) => e.workers.iter().map(|w| w.messages).sum(),
        other => panic!("svnic ctl engine: {other:?}"),
    };
    ensure!(
        moved >= 2 * 2 * ITERATIONS,
        vms.context(),
        "the engine carried {moved} messages"
    );

    // Every run: the client's table has its size with every iteration sent and acknowledged
    // (fi_pingpong -c checks each payload and fails the step on a mismatch).
    let mut table = String::new();
    writeln!(
        table,
        "fi_pingpong between two QEMU guests (TCG: emulated, not representative), {ITERATIONS} \
         iterations, client's numbers"
    )
    .unwrap();
    writeln!(
        table,
        "{:<6} {:<6} {:>6} {:>12} {:>10}",
        "prov", "ep", "bytes", "usec/xfer", "MB/s"
    )
    .unwrap();
    for (i, run) in RUNS.into_iter().enumerate() {
        let out = step_output(&a_serial, &client_step(i)).unwrap_or("");
        let lines = parse_pingpong(out);
        ensure!(
            lines
                == [PingpongLine {
                    bytes: run.2,
                    sent: ITERATIONS,
                    acked: ITERATIONS
                }],
            vms.context(),
            "run {run:?}: {lines:?}"
        );
        let cols: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.starts_with("bytes"))
            .nth(1)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        writeln!(
            table,
            "{:<6} {:<6} {:>6} {:>12} {:>10}",
            run.0,
            run.1,
            run.2,
            cols.get(6).unwrap_or(&"?"),
            cols.get(5).unwrap_or(&"?")
        )
        .unwrap();
    }
    writeln!(table, "whole test: {:.1} s", took.as_secs_f64()).unwrap();
    eprintln!("{table}");
    let out = svnic_tests::vm::repo_root().join("target/vm-libfabric.txt");
    std::fs::write(&out, &table).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    vms.stop_svnic();
}

#[test]
fn step_output_is_what_came_before_the_marker() {
    let serial = "boot\nSVNIC-STEP a ok\nline 1\nline 2\nSVNIC-STEP b ok\n";
    assert_eq!(
        step_output(serial, "b"),
        Some("SVNIC-STEP a ok\nline 1\nline 2\n")
    );
    assert_eq!(step_output(serial, "c"), None);
}
