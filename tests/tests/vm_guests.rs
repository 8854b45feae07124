//! Two real Linux guests under QEMU, each with a virtio-net NIC that a real `svnic serve` serves
//! over vhost-user: the guests' kernel networking (ARP, ping, a TCP echo) goes through svnic's
//! switch. Guest A pings guest B and sends a token to B's TCP echo server, then tells B to power
//! off; the test reads the guests' serial consoles and `svnic ctl guests --json`.
//!
//! Skips, saying so, only when `vm-images/build.sh` has not been run (scripts/test.sh runs it).

use std::time::{Duration, Instant};

use svnic_backend::admin::GuestView;
use svnic_tests::daemon_proc::Svnic;
use svnic_tests::ensure;
use svnic_tests::vm::{find_line, or_skip, GuestSetup, Image, TwoGuests};

const MAC_A: &str = "52:54:00:5e:00:01";
const MAC_B: &str = "52:54:00:5e:00:02";
/// B's wait for A's "quit" (seconds): longer than A can take, shorter than the test's deadline.
const B_APPEND: &str = "IP=10.0.0.2/24 RUN=echo-server,wait-quit:9:150";
/// A holds for 3 s after the echo so that the test sees both guests connected.
const A_APPEND: &str = "IP=10.0.0.1/24 RUN=ping:10.0.0.2:3,tcp-echo:10.0.0.2,sleep:3,quit:10.0.0.2";

fn guest<'a>(guests: &'a [GuestView], name: &str) -> Option<&'a GuestView> {
    guests.iter().find(|g| g.name == name)
}

/// "SVNIC-STATS eth0 rx_packets=14 tx_packets=21" -> (14, 21).
fn guest_stats(serial: &str) -> Option<(u64, u64)> {
    let line = find_line(serial, "SVNIC-STATS eth0 ")?;
    let field = |key: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
    };
    Some((field("rx_packets=")?, field("tx_packets=")?))
}

#[test]
fn two_qemu_guests_ping_and_tcp_echo_through_svnic() {
    let Some(image) = or_skip(
        "two_qemu_guests_ping_and_tcp_echo_through_svnic",
        Image::find(),
    ) else {
        return;
    };
    let t0 = Instant::now();
    let mut vms = TwoGuests::start(
        &image,
        "vm",
        GuestSetup {
            mac: MAC_A,
            append: A_APPEND,
        },
        GuestSetup {
            mac: MAC_B,
            append: B_APPEND,
        },
    );
    let deadline = Instant::now() + Duration::from_secs(150);

    // While A holds after its echo, both guests are up: svnic must show them connected, with
    // frames both ways (at least the 3 echo requests and 3 replies of the ping).
    let echo = vms.a.wait_for_line("SVNIC-STEP tcp-echo:", deadline);
    let t_echo = t0.elapsed();
    ensure!(
        echo.as_deref().is_some_and(|l| l.ends_with(" ok")),
        vms.context(),
        "guest A's TCP echo through svnic did not succeed: {echo:?}"
    );
    let live = vms.svnic.guests().unwrap_or_else(|e| panic!("{e}"));
    for name in ["vm1", "vm2"] {
        let g = guest(&live, name);
        ensure!(
            g.is_some_and(|g| g.connected && g.frames_in >= 3 && g.frames_out >= 3),
            vms.context(),
            "svnic ctl guests --json during the exchange: {name} not connected with frames \
             both ways: {g:?}"
        );
    }

    let a_exit = vms.a.wait_exit(deadline).unwrap_or_else(|e| panic!("{e}"));
    let b_exit = vms
        .b
        .wait_exit(Instant::now() + Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let t_done = t0.elapsed();
    ensure!(
        a_exit.is_some_and(|s| s.success()) && b_exit.is_some_and(|s| s.success()),
        vms.context(),
        "QEMU did not exit cleanly after the guests powered off: A {a_exit:?}, B {b_exit:?}"
    );

    let (a_serial, b_serial) = (vms.a.serial_text(), vms.b.serial_text());
    for (who, serial, markers) in [
        (
            "A",
            &a_serial,
            &[
                "SVNIC-BOOT ok",
                "SVNIC-NET eth0 mac=52:54:00:5e:00:01 ip=10.0.0.1/24",
                "SVNIC-STEP ping:10.0.0.2:3 ok",
                "SVNIC-STEP tcp-echo:10.0.0.2 ok",
                "SVNIC-STEP quit:10.0.0.2 ok",
                "SVNIC-RESULT PASS",
            ][..],
        ),
        (
            "B",
            &b_serial,
            &[
                "SVNIC-BOOT ok",
                "SVNIC-NET eth0 mac=52:54:00:5e:00:02 ip=10.0.0.2/24",
                "SVNIC-STEP echo-server ok",
                "SVNIC-STEP wait-quit:9:150 ok",
                "SVNIC-RESULT PASS",
            ][..],
        ),
    ] {
        for m in markers {
            ensure!(
                find_line(serial, m).is_some(),
                vms.context(),
                "guest {who}'s console lacks '{m}'"
            );
        }
    }

    // Once both are gone, svnic shows them disconnected, and it has seen at least every frame
    // each guest kernel counted (the kernels may send more after printing their counters).
    let after = vms
        .svnic
        .wait_for(10, Svnic::guests, |guests| {
            guests.iter().all(|g| !g.connected)
        })
        .unwrap_or_else(|e| panic!("{e}"));
    for (name, serial) in [("vm1", &a_serial), ("vm2", &b_serial)] {
        let g = guest(&after, name);
        let stats = guest_stats(serial);
        ensure!(
            g.is_some_and(|g| !g.connected)
                && stats.is_some_and(
                    |(rx, tx)| g.is_some_and(|g| g.frames_in >= tx && g.frames_out >= rx)
                ),
            vms.context(),
            "after power-off, svnic's view of {name} ({g:?}) does not match the guest's \
             counters (rx, tx) = {stats:?}"
        );
    }

    let (a_accel, b_accel) = (vms.a.accelerator(), vms.b.accelerator());
    ensure!(
        a_accel.is_some() && b_accel.is_some(),
        vms.context(),
        "the launcher did not say which accelerator it used"
    );
    let t_serve = vms.svnic_up;
    vms.stop_svnic();

    eprintln!(
        "launch.sh: accelerator: {}\nsvnic up {:.1?}, A's TCP echo done {:.1?}, both guests off \
         {:.1?}\nsvnic ctl during the exchange: {live:?}\nafter: {after:?}",
        a_accel.unwrap_or_default(),
        t_serve,
        t_echo,
        t_done
    );
}

/// The launcher's QEMU command line (no QEMU run, no image needed): the flags docs/vm.md explains.
#[test]
fn launcher_builds_the_documented_qemu_command_line() {
    let launcher = svnic_tests::vm::repo_root().join("vm-images/launch.sh");
    let out = std::process::Command::new(&launcher)
        .args(["--socket", "/tmp/vm1.sock", "--mac", "52:54:00:00:00:01"])
        .args(["--mem", "256M", "--log", "/tmp/vm1.log", "--accel", "tcg"])
        .args(["--append", "IP=10.0.0.1/24 RUN=ping:10.0.0.2", "--dry-run"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", launcher.display()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "launch.sh --dry-run failed: {err}");
    assert!(
        err.contains("launch.sh: accelerator: tcg (as asked)"),
        "{err}"
    );
    let cmd = find_line(&err, "launch.sh: qemu-system-x86_64 ")
        .unwrap_or_else(|| panic!("no QEMU command line in: {err}"));
    for flag in [
        " -accel tcg ",
        " -m 256M ",
        " -object memory-backend-memfd,id=mem,size=256M,share=on -numa node,memdev=mem ",
        " -chardev socket,id=c0,path=/tmp/vm1.sock -netdev vhost-user,id=n0,chardev=c0 ",
        " -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01,vectors=0,romfile= ",
        " -append 'console=ttyS0 quiet panic=-1 IP=10.0.0.1/24 RUN=ping:10.0.0.2' ",
        " -nographic -no-reboot ",
        " -serial file:/tmp/vm1.log -monitor none",
    ] {
        assert!(cmd.contains(flag), "'{flag}' missing from: {cmd}");
    }

    // Bad input is refused before QEMU is anywhere near it.
    for bad in [
        &["--mac", "52:54:00:00:01", "--socket", "/tmp/x.sock"][..],
        &["--mem", "512", "--accel", "tcg"][..],
        &["--accel", "xen"][..],
        &["--append", "RUN='a b'", "--accel", "tcg"][..],
    ] {
        let out = std::process::Command::new(&launcher)
            .args(bad)
            .arg("--dry-run")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", launcher.display()));
        assert_eq!(
            out.status.code(),
            Some(2),
            "launch.sh {bad:?} was not refused"
        );
    }
}
