//! The bypass channels end to end, in one boot of two real Linux guests under QEMU against a real
//! `svnic serve`: the guest agent (`svnic-guestd`) in each guest, unprivileged applications
//! (`svnic-guest --user 65534`) creating channels through it.
//!
//! In order, the guests (A = vm1, B = vm2) run paired steps that synchronise themselves:
//! 1. user-data and DMA-data round trips between an application in A and one in B;
//! 2. the comparison: round trips and throughput over the user channel and over kernel UDP on
//!    virtio-net (printed as a table and written to target/vm-comparison.txt; never asserted);
//! 3. B powers off while A streams to it: A's stream ends with an error completion, svnic
//!    destroys B's channels, and A goes on;
//! 4. A's crash-test: an application holding a channel is SIGKILLed; its agent destroys the
//!    channel with the engine before freeing the memory.
//!
//! Skips, saying so, only when the image has no guest binaries (`vm-images/build.sh` was run
//! without `--build-guest`; scripts/test.sh passes it).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::Value;
use svnic_backend::admin::ChannelView;
use svnic_tests::daemon_proc::Svnic;
use svnic_tests::ensure;
use svnic_tests::vm::{find_line, or_skip, repo_root, GuestSetup, Image, TwoGuests};

const MAC_A: &str = "52:54:00:00:00:01";
const MAC_B: &str = "52:54:00:00:00:02";
/// Round trips per ping/echo pair, and messages per perf/sink pair (TCG: keep them small).
const ROUND_TRIPS: u32 = 200;
const MESSAGES: u32 = 10_000;

/// `cmd:` steps with '+' for spaces, as vm-images/init.sh wants them.
fn cmd(words: &str) -> String {
    format!("cmd:{}", words.replace(' ', "+"))
}

fn b_append() -> String {
    let app = "svnic-guest --user 65534";
    let steps = [
        cmd("svnic-guestd --background"),
        cmd(&format!(
            "{app} echo --path user --count {ROUND_TRIPS} --json"
        )),
        cmd(&format!(
            "{app} echo --path dma --count {ROUND_TRIPS} --json"
        )),
        cmd(&format!(
            "{app} echo --path udp --count {ROUND_TRIPS} --json"
        )),
        cmd(&format!("{app} sink --path user --count {MESSAGES} --json")),
        cmd(&format!(
            "{app} sink --path udp --count {MESSAGES} --idle-ms 2000 --json"
        )),
        // A sink that never ends (A streams to it), then B powers off under A's stream.
        cmd(&format!(
            "{app} sink --path user --endpoint 2 --count 1000000000 --json &"
        )),
        "sleep:10".to_string(),
    ];
    format!("HUGEPAGES=16 IP=10.0.0.2/24 RUN={}", steps.join(","))
}

fn a_append() -> String {
    let app = "svnic-guest --user 65534";
    let peer = format!("{MAC_B}/1");
    let steps = [
        cmd("svnic-guestd --background"),
        cmd(&format!(
            "{app} ping --path user --peer {peer} --count {ROUND_TRIPS} --json"
        )),
        cmd(&format!(
            "{app} ping --path dma --peer {peer} --count {ROUND_TRIPS} --json"
        )),
        cmd(&format!(
            "{app} ping --path udp --peer 10.0.0.2:7777 --count {ROUND_TRIPS} --json"
        )),
        cmd(&format!(
            "{app} perf --path user --peer {peer} --count {MESSAGES} --json"
        )),
        cmd(&format!(
            "{app} perf --path udp --peer 10.0.0.2:7777 --count {MESSAGES} --json"
        )),
        // Streams to B until B is gone: the stream must end in an error (so '!').
        cmd(&format!(
            "! {app} perf --path user --endpoint 2 --peer {MAC_B}/2 --count 1000000000 --json"
        )),
        cmd(&format!("{app} crash-test --endpoint 9 --json")),
        "sleep:2".to_string(),
        cmd("cat /run/svnic/svnic-guestd.log"),
    ];
    format!("HUGEPAGES=16 IP=10.0.0.1/24 RUN={}", steps.join(","))
}

/// The JSON line a tool printed on the console for `tool` over `path` (any path if empty).
fn tool_json(serial: &str, tool: &str, path: &str) -> Option<Value> {
    serial.lines().find_map(|l| {
        let v: Value = serde_json::from_str(&l[l.find("{\"")?..]).ok()?;
        (v["tool"] == tool && (path.is_empty() || v["path"] == path)).then_some(v)
    })
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// The step's marker line, e.g. "SVNIC-STEP cmd:... ok".
fn step_ok(serial: &str, step: &str) -> bool {
    find_line(serial, &format!("SVNIC-STEP {step} ok")).is_some()
}

fn channels_of<'a>(channels: &'a [ChannelView], guest: &str) -> Vec<&'a ChannelView> {
    channels.iter().filter(|c| c.guest == guest).collect()
}

/// The image's manifest lists the guest binaries only when build.sh ran with --build-guest.
fn guest_binaries_in_image(image: &Image) -> Result<(), String> {
    let manifest = image.initrd.with_file_name("manifest");
    let text =
        std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let bins = find_line(&text, "guest_binaries=").unwrap_or("guest_binaries=");
    let listed: Vec<&str> = bins
        .trim_start_matches("guest_binaries=")
        .split_whitespace()
        .collect();
    if ["svnic-guestd", "svnic-guest"]
        .iter()
        .all(|b| listed.contains(b))
    {
        Ok(())
    } else {
        Err(format!(
            "the guest image has no svnic-guest/svnic-guestd ({}: '{bins}'): run \
             vm-images/build.sh --build-guest (scripts/test.sh does)",
            manifest.display()
        ))
    }
}

#[test]
fn bypass_channels_between_two_qemu_guests() {
    let Some(image) = or_skip(
        "bypass_channels_between_two_qemu_guests",
        Image::find().and_then(|i| guest_binaries_in_image(&i).map(|()| i)),
    ) else {
        return;
    };
    let t0 = Instant::now();
    let (a_append, b_append) = (a_append(), b_append());
    let mut vms = TwoGuests::start(
        &image,
        "vm-bypass",
        GuestSetup {
            mac: MAC_A,
            append: &a_append,
        },
        GuestSetup {
            mac: MAC_B,
            append: &b_append,
        },
    );
    let deadline = Instant::now() + Duration::from_secs(170);

    // B powers off while A streams to it. svnic tears B's channels down (none stays live)...
    vms.wait_powered_off("B", deadline);
    let t_b_off = t0.elapsed();
    let live = |c: &&ChannelView| c.state == "Success" || c.state == "Pending";
    let after_b = vms
        .svnic
        .wait_for(20, Svnic::channels, |chs| {
            !channels_of(chs, "vm2").iter().any(live)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    let b_channels = channels_of(&after_b, "vm2");
    ensure!(
        !b_channels.is_empty() && b_channels.iter().all(|c| c.state == "Destroyed"),
        vms.context(),
        "after B powered off, svnic ctl channels --json should show B's channels Destroyed: \
         {after_b:#?}"
    );

    // ... and A goes on: its stream ends in an error completion, then its crash-test runs.
    let crash_step = cmd("svnic-guest --user 65534 crash-test --endpoint 9 --json");
    let crash = vms
        .a
        .wait_for_line(&format!("SVNIC-STEP {crash_step} "), deadline);
    let after_crash = vms.svnic.channels().unwrap_or_else(|e| panic!("{e}"));
    ensure!(
        crash.as_deref().is_some_and(|l| l.ends_with(" ok")),
        vms.context(),
        "guest A's crash-test after B powered off did not succeed: {crash:?}"
    );
    vms.wait_powered_off("A", deadline);
    let t_done = t0.elapsed();
    let (a_serial, b_serial) = (vms.a.serial_text(), vms.b.serial_text());

    // 1. Every paired step passed, and the tools' JSON says the data came back intact.
    let b_steps = b_append["HUGEPAGES=16 IP=10.0.0.2/24 RUN=".len()..].split(',');
    let a_steps = a_append["HUGEPAGES=16 IP=10.0.0.1/24 RUN=".len()..].split(',');
    for (who, serial, steps) in [
        ("A", &a_serial, a_steps.collect::<Vec<_>>()),
        ("B", &b_serial, b_steps.collect()),
    ] {
        for step in steps {
            ensure!(
                step_ok(serial, step),
                vms.context(),
                "guest {who}: step '{step}' did not pass"
            );
        }
        ensure!(
            find_line(serial, "SVNIC-RESULT PASS").is_some(),
            vms.context(),
            "guest {who} did not pass"
        );
    }
    let json = |serial: &str, tool: &str, path: &str| {
        tool_json(serial, tool, path)
            .unwrap_or_else(|| panic!("no {tool} --path {path} JSON line\n{}", vms.context()))
    };
    let mut pings = Vec::new();
    for path in ["user", "dma", "udp"] {
        let ping = json(&a_serial, "ping", path);
        let echo = json(&b_serial, "echo", path);
        ensure!(
            ping["round_trips"] == ROUND_TRIPS && echo["echoed"] == ROUND_TRIPS,
            vms.context(),
            "{path}: ping {ping} / echo {echo}: not {ROUND_TRIPS} round trips"
        );
        if path != "udp" {
            ensure!(
                ping["mode"] == "vm" && ping["local"] == format!("{MAC_A}/1"),
                vms.context(),
                "{path}: ping did not run over the agent's channel: {ping}"
            );
        }
        pings.push((path, ping));
    }
    let mut perfs = Vec::new();
    for path in ["user", "udp"] {
        let perf = json(&a_serial, "perf", path);
        let sink = json(&b_serial, "sink", path);
        ensure!(
            perf["messages"] == MESSAGES && sink["messages"].as_u64().is_some_and(|n| n > 0),
            vms.context(),
            "{path}: perf {perf} / sink {sink}"
        );
        if path == "user" {
            ensure!(
                sink["messages"] == MESSAGES,
                vms.context(),
                "user channel dropped messages: perf {perf} / sink {sink}"
            );
        }
        perfs.push((path, perf, sink));
    }

    // 3. A's stream to the powered-off B ended in an error, not a hang.
    ensure!(
        a_serial.contains("stream: "),
        vms.context(),
        "guest A's stream to B did not end in an error completion"
    );

    // 2. The crash-test: the engine destroyed the dead application's channel before its
    // memory was freed (the agent's log, cat on A's console), and svnic shows it Destroyed.
    let crash_json = json(&a_serial, "crash-test", "");
    let killed = crash_json["killed_pid"].as_u64().unwrap_or_else(|| {
        panic!(
            "crash-test JSON has no killed_pid: {crash_json}\n{}",
            vms.context()
        )
    });
    let lines: Vec<&str> = a_serial.lines().collect();
    let pos = |pat: &str| lines.iter().position(|l| l.contains(pat));
    let created = lines
        .iter()
        .find(|l| l.contains(&format!("(pid {killed}) at ")) && l.contains(" created for "))
        .copied();
    let channel = created.and_then(|l| {
        let i = l.find("channel ")?;
        let rest = &l[i + "channel ".len()..];
        rest.split_whitespace().next()?.parse::<u32>().ok()
    });
    let channel = channel.unwrap_or_else(|| {
        panic!(
            "no 'channel N created for application ... (pid {killed})' in A's agent log \
             ({created:?})\n{}",
            vms.context()
        )
    });
    let disconnected = pos(&format!(
        "(pid {killed}) disconnected: destroying 1 channel(s)"
    ));
    let freed = pos(&format!("channel {channel} destroyed by engine; memory 0x"));
    ensure!(
        disconnected.is_some() && freed.is_some() && disconnected < freed,
        vms.context(),
        "A's agent log: expected 'application ... (pid {killed}) disconnected: destroying 1 \
         channel(s)' (line {disconnected:?}) before 'channel {channel} destroyed by engine; \
         memory 0x... freed' (line {freed:?})"
    );
    let crashed = after_crash.iter().find(|c| c.id == channel);
    ensure!(
        crashed.is_some_and(|c| c.guest == "vm1" && c.state == "Destroyed"),
        vms.context(),
        "svnic ctl channels --json after the crash-test: channel {channel} is {crashed:?}"
    );

    // The comparison, labelled with the accelerator (never asserted: TCG timings are emulated).
    let accel = vms.a.accelerator().unwrap_or_else(|| "unknown".into());
    let accel_name = accel
        .split_whitespace()
        .next()
        .unwrap_or("unknown")
        .to_uppercase();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "svnic bypass channel vs UDP over virtio-net, inside two QEMU guests \
         (accelerator: {accel_name}; {accel})"
    );
    let _ = writeln!(
        table,
        "{:<28} {:>10} {:>10} {:>10} {:>10}",
        "round trip (ping/echo)", "min us", "p50 us", "p99 us", "mean us"
    );
    for (path, p) in &pings {
        let label = match *path {
            "user" => "channel user-data",
            "dma" => "channel DMA-data",
            _ => "UDP over virtio-net",
        };
        let _ = writeln!(
            table,
            "{:<28} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            format!("{label} ({} B)", p["size"]),
            num(p, "min_us"),
            num(p, "p50_us"),
            num(p, "p99_us"),
            num(p, "mean_us")
        );
    }
    let _ = writeln!(
        table,
        "{:<28} {:>10} {:>10} {:>12} {:>12}",
        "throughput (perf/sink)", "sent", "received", "msg/s sent", "MB/s sent"
    );
    for (path, perf, sink) in &perfs {
        let label = if *path == "user" {
            "channel user-data"
        } else {
            "UDP over virtio-net"
        };
        let _ = writeln!(
            table,
            "{:<28} {:>10} {:>10} {:>12.0} {:>12.2}",
            format!("{label} ({} B)", perf["size"]),
            perf["messages"].as_u64().unwrap_or(0),
            sink["messages"].as_u64().unwrap_or(0),
            num(perf, "messages_per_sec"),
            num(perf, "bytes_per_sec") / 1e6
        );
    }
    let _ = writeln!(
        table,
        "(timings under {accel_name} are emulated: compare rows, not absolute values)"
    );
    println!("{table}");
    let out = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| repo_root().join("target"), Into::into)
        .join("vm-comparison.txt");
    std::fs::write(&out, &table).unwrap_or_else(|e| panic!("{}: {e}", out.display()));

    vms.stop_svnic();
    println!(
        "B powered off at {t_b_off:.1?}, A done at {t_done:.1?}; table in {}",
        out.display()
    );
}
