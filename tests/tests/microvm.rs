//! The kvm-ioctls micro-VM against the real daemon: its 64-bit user-mode guest program drives a
//! channel in its own memory (the memfd shared with the daemon over vhost-user and registered as
//! the KVM memslot) and exchanges user-data, or DMA-data, with a host-process guest that
//! echoes, intact and in order, while KVM's statistics count the exits.
//!
//! A micro-VM killed mid-stream (a child process running the launcher): the daemon destroys its
//! channel and the peer's next message to it is error-completed.
//!
//! Skips, saying why, only when there is no usable `/dev/kvm` or the detection probe cannot run
//! a guest at all.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use svnic_backend::config::EngineOverrides;
use svnic_channels::{ChannelAddr, CompletionStatus, MacAddr, Message};
use svnic_client::Completions;
use svnic_microvm::{detect, peer, run_bypass, BypassConfig, KvmReport, ModeProbe, Payload};
use svnic_tests::daemon_fixture::{recv_messages, DaemonFixture};
use svnic_tests::daemon_proc::spawn_test_child;
use svnic_tests::wait::wait_until;

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
        Ok(r) if matches!(r.cpl3, ModeProbe::Failed(_)) => {
            eprintln!("skipping: KVM cannot run the probe guest:\n{r}");
            None
        }
        Ok(r) => {
            eprintln!("{r}");
            Some(r)
        }
    }
}

/// Echoes `count` messages on a channel of host-process guest 2 in a thread; returns what
/// arrived there (each message with its bytes), in arrival order.
fn echo(d: &DaemonFixture, count: u64) -> thread::JoinHandle<Vec<(Message, Vec<u8>)>> {
    let g = d.guest(2);
    let mut ch = g.create_channel(HOST_ENDPOINT, 256, LONG).unwrap();
    thread::spawn(move || {
        let mut got = Vec::new();
        peer::echo(&g, &mut ch, count, LONG, |m, bytes| {
            got.push((*m, bytes.to_vec()))
        })
        .unwrap();
        got
    })
}

/// The micro-VM exchanges `COUNT` messages of `payload` with an echoing host-process guest
/// through the daemon; checks both sides and the exit counts.
fn exchange(name: &str, payload: Payload) {
    let Some(report) = kvm_or_skip() else { return };
    let d = DaemonFixture::start(
        name,
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
        payload,
        timeout: LONG,
    })
    .unwrap();
    eprintln!(
        "{payload:?}: {COUNT} round trips in {:?}: {}; {} user-space exit(s); KVM counters: {:?}",
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
    for (i, (m, bytes)) in (0u64..).zip(&got) {
        match (payload, m) {
            (Payload::UserData, Message::UserData(u)) => assert_eq!(
                (u.cookie, &bytes[..], u.peer),
                (i, &(SEED + i).to_le_bytes()[..], from)
            ),
            (Payload::DmaData { len }, Message::DmaData(d)) => {
                let want: Vec<u8> = (0..u64::from(len) / 8)
                    .flat_map(|k| (SEED + i + k).to_le_bytes())
                    .collect();
                assert_eq!((d.peer, d.is_complete()), (from, true), "message {i}");
                assert!(bytes == &want, "message {i}: bytes differ");
            }
            _ => panic!("message {i}: {m:?}"),
        }
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
        // In the steady state (every page touched, the final store still to come) the kernel
        // saw nothing but host interrupts: no page fault, no MMIO or port exit, nothing emulated.
        let w = r
            .steady
            .as_ref()
            .expect("the launcher saw the steady-state window");
        let n = |name| w.stats.get(name).unwrap_or(0);
        eprintln!(
            "steady state: {} messages (replies {}..{}), counters {:?}",
            w.messages(),
            w.from,
            w.to,
            w.stats.nonzero()
        );
        assert!(w.messages() >= 100, "{w:?}");
        assert_eq!(n("exits"), n("irq_exits"), "{:?}", w.stats.nonzero());
        assert_eq!(
            (
                n("mmio_exits"),
                n("io_exits"),
                n("pf_fixed"),
                n("insn_emulation")
            ),
            (0, 0, 0, 0),
            "{:?}",
            w.stats.nonzero()
        );
    }
}

#[test]
fn user_mode_guest_exchanges_user_data_with_a_host_process_guest_without_exits() {
    exchange("microvm-user", Payload::UserData);
}

#[test]
fn user_mode_guest_exchanges_dma_data_with_a_host_process_guest_without_exits() {
    exchange("microvm-dma", Payload::DmaData { len: 4096 });
}

const CHILD_VAR: &str = "SVNIC_MICROVM_CHILD_SOCKET";

/// The child process of `a_micro_vm_killed_mid_stream_loses_its_channel_and_its_peer_is_told`:
/// the launcher streaming to the echo until it is killed. `CHILD_VAR` is its socket.
#[test]
fn child_micro_vm() {
    let Ok(sock) = std::env::var(CHILD_VAR) else {
        return;
    };
    println!("MICROVM-CHILD-READY");
    let r = run_bypass(&BypassConfig {
        socket: sock.into(),
        memory_size: 64 << 20,
        endpoint: VM_ENDPOINT,
        ring_size: 256,
        peer: ChannelAddr {
            mac: HOST_MAC,
            endpoint: HOST_ENDPOINT,
        },
        count: u64::MAX,
        seed: SEED,
        payload: Payload::UserData,
        timeout: LONG,
    });
    panic!("the child should have been killed mid-stream, but the run ended: {r:?}");
}

#[test]
fn a_micro_vm_killed_mid_stream_loses_its_channel_and_its_peer_is_told() {
    if kvm_or_skip().is_none() {
        return;
    }
    let d = DaemonFixture::start(
        "microvm-kill",
        &[(VM_MAC, ""), (HOST_MAC, "")],
        EngineOverrides::default(),
    );
    let g = d.guest(2);
    let mut ch = g.create_channel(HOST_ENDPOINT, 256, LONG).unwrap();
    let answered = Arc::new(AtomicU64::new(0));
    let echoer = {
        let answered = answered.clone();
        thread::spawn(move || {
            // Ends with an error once the micro-VM is gone (nothing arrives any more).
            let end = peer::echo(&g, &mut ch, u64::MAX, Duration::from_secs(2), |_, _| {
                answered.fetch_add(1, Ordering::Relaxed);
            });
            (g, ch, end)
        })
    };
    let (child, _) = spawn_test_child(
        "child_micro_vm",
        CHILD_VAR,
        d.sock(1).as_os_str(),
        "MICROVM-CHILD-READY",
    )
    .unwrap();
    // Streaming: the echo has answered a hundred messages, the micro-VM's channel is live.
    wait_until(LONG, || answered.load(Ordering::Relaxed) >= 100);
    let cp = d.daemon().engine().control_plane();
    let vm_guest = cp.guest_by_mac(VM_MAC).unwrap();
    assert_eq!(cp.live_channels_of(vm_guest).len(), 1);

    drop(child); // SIGKILL, mid-stream
    wait_until(LONG, || cp.live_channels_of(vm_guest).is_empty());
    let (g, mut ch, end) = echoer.join().unwrap();
    assert!(
        end.is_err(),
        "the echo cannot have answered u64::MAX messages"
    );
    let at_kill = answered.load(Ordering::Relaxed);
    assert!(at_kill >= 100, "{at_kill}");

    // The peer's next message to the dead micro-VM comes back as an error completion.
    let to_vm = ChannelAddr {
        mac: VM_MAC,
        endpoint: VM_ENDPOINT,
    };
    assert!(ch
        .send_user(to_vm, 42, b"anyone?", Completions::OnError)
        .unwrap());
    ch.flush().unwrap();
    let got = recv_messages(&mut ch, &g, 1, LONG);
    let completion = got.iter().find_map(|m| match m {
        Message::Completion(c) if c.cookie == 42 => Some(*c),
        _ => None,
    });
    let c = completion.unwrap_or_else(|| panic!("no completion for the message: {got:?}"));
    assert_eq!((c.status, c.peer), (CompletionStatus::NoRoute, to_vm));
}
