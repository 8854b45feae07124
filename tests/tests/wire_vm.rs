//! Two real Linux guests under QEMU on two hosts joined by a wire: each host is a network
//! namespace with its own `svnic serve --uplink` (docs/wire.md), each guest's virtio-net NIC is
//! served by its host's daemon. Guest A's kernel pings guest B's and reaches B's TCP echo server:
//! every frame between them crosses the uplink (ARP broadcasts included), which the test reads
//! from both hosts' `svnic ctl uplink` counters.
//!
//! Skips, saying so, only when the guest image has not been built (scripts/test.sh builds it) or
//! the machine cannot make network namespaces.

use std::time::{Duration, Instant};

use svnic_backend::admin::UplinkWorkerView;
use svnic_tests::ensure;
use svnic_tests::vm::{find_line, or_skip, Image, Vm, VmSpec};
use svnic_tests::wire_fixture::{guest_mac, two_hosts, UplinkCount, WireOptions};

/// B waits for A's "quit" (seconds): longer than A can take, shorter than the test's deadline.
const B_APPEND: &str = "IP=10.0.0.2/24 RUN=echo-server,wait-quit:9:150";
const A_APPEND: &str = "IP=10.0.0.1/24 RUN=ping:10.0.0.2:3,tcp-echo:10.0.0.2,quit:10.0.0.2";

fn sum(workers: &[UplinkWorkerView], counter: &str) -> u64 {
    workers.iter().map(|w| w.get(counter)).sum()
}

#[test]
fn qemu_guests_on_two_hosts_ping_and_tcp_echo_across_the_uplink() {
    let test = "qemu_guests_on_two_hosts_ping_and_tcp_echo_across_the_uplink";
    let Some(image) = or_skip(test, Image::find()) else {
        return;
    };
    let Some(hosts) = two_hosts("wire-vm", &WireOptions::default()) else {
        return;
    };
    let (mac_a, mac_b) = (guest_mac(0, 0), guest_mac(1, 0));
    let launch = |host: usize, name: &str, mac: &str, append: &str| {
        let h = &hosts.hosts[host];
        let socket = h.socket(0);
        Vm::launch(
            &image,
            h.dir(),
            &VmSpec {
                name,
                socket: &socket,
                mac,
                mem: "256M",
                append,
            },
        )
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let mut b = launch(1, "vmb", &mac_b, B_APPEND);
    let mut a = launch(0, "vma", &mac_a, A_APPEND);
    let context = |a: &Vm, b: &Vm| {
        format!(
            "{}{}--- host A's svnic log:\n{}--- host B's svnic log:\n{}",
            a.report(),
            b.report(),
            hosts.hosts[0].svnic().log_text(),
            hosts.hosts[1].svnic().log_text()
        )
    };

    let deadline = Instant::now() + Duration::from_secs(150);
    let echo = a.wait_for_line("SVNIC-STEP tcp-echo:", deadline);
    ensure!(
        echo.as_deref().is_some_and(|l| l.ends_with(" ok")),
        context(&a, &b),
        "guest A's TCP echo to guest B across the uplink did not succeed: {echo:?}"
    );
    let a_exit = a.wait_exit(deadline).unwrap_or_else(|e| panic!("{e}"));
    let b_exit = b
        .wait_exit(Instant::now() + Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    ensure!(
        a_exit.is_some_and(|s| s.success()) && b_exit.is_some_and(|s| s.success()),
        context(&a, &b),
        "QEMU did not exit cleanly after the guests powered off: A {a_exit:?}, B {b_exit:?}"
    );
    for (who, vm, markers) in [
        (
            "A",
            &a,
            &[
                "SVNIC-STEP ping:10.0.0.2:3 ok",
                "SVNIC-STEP tcp-echo:10.0.0.2 ok",
                "SVNIC-STEP quit:10.0.0.2 ok",
                "SVNIC-RESULT PASS",
            ][..],
        ),
        (
            "B",
            &b,
            &["SVNIC-STEP echo-server ok", "SVNIC-RESULT PASS"][..],
        ),
    ] {
        let serial = vm.serial_text();
        for m in markers {
            ensure!(
                find_line(&serial, m).is_some(),
                context(&a, &b),
                "guest {who}'s console lacks '{m}'"
            );
        }
    }

    // The guests' frames went out on each host's uplink and came in to the other's guest port:
    // at least the 3 echo requests one way and the 3 replies the other.
    for (i, name) in [(0, "A"), (1, "B")] {
        let (_, workers) = hosts.hosts[i]
            .svnic()
            .uplink()
            .unwrap_or_else(|e| panic!("{e}"));
        let (to_ports, spoofed) = (sum(&workers, "rx_to_ports"), sum(&workers, "rx_spoofed"));
        ensure!(
            to_ports >= 3 && spoofed == 0,
            context(&a, &b),
            "host {name}'s uplink handed {to_ports} frames to its guest (>= 3 expected), \
             refused {spoofed} as spoofed: {workers:?}"
        );
        eprintln!("host {name}: {to_ports} frames from the uplink to its guest's port");
    }
}
