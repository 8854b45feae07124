//! The kvm-ioctls micro-VM against the real daemon: its 64-bit user-mode guest program drives a
//! channel in its own memory (the memfd shared with the daemon over vhost-user and registered as
//! the KVM memslot) and exchanges user-data with a host-process guest that echoes, intact and in
//! order, while KVM's statistics count the exits.
//!
//! Skips, saying why, only when there is no usable `/dev/kvm` or the detection probe cannot run
//! a guest at all.
#![allow(clippy::unwrap_used)]

use std::thread;
use std::time::Duration;

use svnic_backend::config::EngineOverrides;
use svnic_channels::{ChannelAddr, MacAddr, UserData};
use svnic_microvm::{detect, peer, run_bypass, BypassConfig, Cpl3Probe, KvmReport};
use svnic_tests::daemon_fixture::DaemonFixture;

const VM_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x4b, 0x01, 0x01]);
const HOST_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x4b, 0x01, 0x02]);
const VM_ENDPOINT: u32 = 3;
const HOST_ENDPOINT: u32 = 7;
const COUNT: u64 = 1000;
const SEED: u64 = 0x5eed_0000_0000_0000;
const LONG: Duration = Duration::from_secs(60);

/// The detection report, or `None` (with the reason printed) when the test must skip.
fn kvm_or_skip() -> Option<KvmReport> {
    match detect() {
        Err(e) => {
            eprintln!("skipping: no usable KVM: {e}");
            None
        }
        Ok(r) if matches!(r.cpl3, Cpl3Probe::Failed(_)) => {
            eprintln!("skipping: KVM cannot run the probe guest:\n{r}");
            None
        }
        Ok(r) => {
            eprintln!("{r}");
            Some(r)
        }
    }
}

/// Echoes `count` user-data messages on a channel of host-process guest 2 in a thread; returns
/// what arrived there, in arrival order.
fn echo(d: &DaemonFixture, count: u64) -> thread::JoinHandle<Vec<UserData>> {
    let g = d.guest(2);
    let mut ch = g.create_channel(HOST_ENDPOINT, 256, LONG).unwrap();
    thread::spawn(move || {
        let mut got = Vec::new();
        peer::echo(&g, &mut ch, count, LONG, |u| got.push(*u)).unwrap();
        got
    })
}

#[test]
fn user_mode_guest_exchanges_user_data_with_a_host_process_guest_without_exits() {
    let Some(report) = kvm_or_skip() else { return };
    let d = DaemonFixture::start(
        "microvm",
        &[(VM_MAC, ""), (HOST_MAC, "")],
        EngineOverrides::default(),
    );
    let echoer = echo(&d, COUNT);
    let peer = ChannelAddr {
        mac: HOST_MAC,
        endpoint: HOST_ENDPOINT,
    };
    let r = run_bypass(&BypassConfig {
        socket: d.sock(1),
        memory_size: 64 << 20,
        endpoint: VM_ENDPOINT,
        ring_size: 256,
        peer,
        count: COUNT,
        seed: SEED,
        timeout: LONG,
    })
    .unwrap();
    eprintln!(
        "{COUNT} round trips in {:?}: {}; {} user-space exit(s); KVM counters: {:?}",
        r.run.elapsed,
        r.result.describe(),
        r.run.user_exits,
        r.stats.as_ref().map(|s| s.nonzero())
    );
    assert!(r.ok(), "{}", r.result.describe());
    assert_eq!(r.result.done, COUNT);

    // The host side saw every message, intact and in order, from the micro-VM's channel.
    let got = echoer.join().unwrap();
    assert_eq!(got.len() as u64, COUNT);
    let from = ChannelAddr {
        mac: VM_MAC,
        endpoint: VM_ENDPOINT,
    };
    for (i, u) in (0u64..).zip(&got) {
        assert_eq!(
            (u.cookie, u.data(), u.peer),
            (i, &(SEED + i).to_le_bytes()[..], from)
        );
    }

    // The only exit to the launcher is the final MMIO store; no signal interrupted the run.
    assert_eq!((r.run.user_exits, r.run.interrupted), (1, 0));
    // What the kernel counted over the run: every in-kernel exit is the final MMIO store, a host
    // interrupt (timer ticks), or the first touch of a guest page (a fixed page fault, a number
    // that does not grow with the messages); nothing else, and with native user mode nothing
    // emulated but that store.
    if let Some(s) = &r.stats {
        let n = |name| s.get(name).unwrap_or(0);
        assert_eq!(n("mmio_exits"), 1, "{:?}", s.nonzero());
        assert_eq!(
            n("exits"),
            n("mmio_exits") + n("irq_exits") + n("pf_fixed"),
            "{:?}",
            s.nonzero()
        );
        assert!(n("pf_fixed") <= 32, "{:?}", s.nonzero());
        if report.cpl3_native() {
            assert!(n("insn_emulation") <= 1, "{:?}", s.nonzero());
        }
    }
}
