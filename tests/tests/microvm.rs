//! The kvm-ioctls micro-VM against the real daemon: its 64-bit user-mode guest program drives a
//! channel in its own memory (the memfd shared with the daemon over vhost-user and registered as
//! the KVM memslot) and exchanges user-data, or DMA-data, with a host-process guest that
//! echoes, or with a second micro-VM, intact and in order, while KVM's statistics count the
//! exits of each data path: bypass (no exit but the doorbells of a sleeping engine), a doorbell
//! per message (an in-kernel ioeventfd exit each, no exit to the VMM), VMM-mediated (exits to
//! the VMM for every message).
//!
//! A micro-VM killed mid-stream (a child process running the launcher): the daemon destroys its
//! channel and the peer's next message to it is error-completed.
//!
//! Skips, saying why, only when there is no usable `/dev/kvm` or the detection probe cannot run
//! a guest at all.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use svnic_backend::config::EngineOverrides;
use svnic_channels::{ChannelAddr, CompletionStatus, MacAddr, Message};
use svnic_client::Completions;
use svnic_microvm::path::RelayStats;
use svnic_microvm::{
    detect, peer, run_bypass, BypassArgs, BypassConfig, BypassReport, DataPath, KvmReport,
    ModeProbe, Payload, StartLine,
};
use svnic_tests::daemon_fixture::{recv_messages, DaemonFixture};
use svnic_tests::daemon_proc::spawn_test_child;
use svnic_tests::wait::wait_until;

const VM_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x4b, 0x01, 0x01]);
const HOST_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x4b, 0x01, 0x02]);
const VM_ENDPOINT: u32 = 3;
const HOST_ENDPOINT: u32 = 7;
const VM_ADDR: ChannelAddr = ChannelAddr::new(VM_MAC, VM_ENDPOINT);
const HOST_ADDR: ChannelAddr = ChannelAddr::new(HOST_MAC, HOST_ENDPOINT);
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

/// The launcher's settings: `count` messages of `payload` on `path` from the guest at `socket`
/// (its channel at `endpoint`) to `peer`.
fn config(
    socket: PathBuf,
    endpoint: u32,
    peer: ChannelAddr,
    count: u64,
    payload: Payload,
    path: DataPath,
) -> BypassConfig {
    BypassConfig {
        socket,
        memory_size: 64 << 20,
        endpoint,
        ring_size: 256,
        program: BypassArgs {
            peer,
            count,
            seed: SEED,
            payload,
            path,
            times: 0,
        },
        timeout: LONG,
        start: None,
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

/// Checks that `got`, what arrived at a peer, is the micro-VM's `COUNT` messages of `payload`
/// from `from`, intact and in order.
fn check_arrivals(got: &[(Message, Vec<u8>)], payload: Payload, from: ChannelAddr) {
    assert_eq!(got.len() as u64, COUNT);
    for (i, (m, bytes)) in (0u64..).zip(got) {
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
}

/// The micro-VM exchanges `COUNT` messages of `payload` on `path` with an echoing host-process
/// guest through the daemon; checks both sides; returns the launcher's report.
fn exchange(name: &str, payload: Payload, path: DataPath) -> Option<(KvmReport, BypassReport)> {
    let report = kvm_or_skip()?;
    // On the bypass path the engine worker polls for the whole run (it never gives up and
    // sleeps), so that the guest never has a reason to ring its doorbell: the run shows the data
    // path alone. The other paths keep the engine's adaptive sleep.
    let awake = path == DataPath::Bypass;
    let d = DaemonFixture::start_with(
        name,
        &[(VM_MAC, ""), (HOST_MAC, "")],
        EngineOverrides::default(),
        |cfg| {
            if awake {
                cfg.engine.idle_passes = u32::MAX;
            }
        },
    );
    let echoer = echo(&d, COUNT);
    let peer = HOST_ADDR;
    let r = run_bypass(&config(d.sock(1), VM_ENDPOINT, peer, COUNT, payload, path)).unwrap();
    eprintln!(
        "{path} {payload:?}: {COUNT} round trips in {:?}: {}; {} user-space exit(s); relay \
         {:?}; mediator {:?}; KVM counters: {:?}",
        r.run.elapsed,
        r.result.describe(),
        r.run.user_exits,
        r.relay,
        r.mediator,
        r.stats.as_ref().map(|s| s.nonzero())
    );
    if let Some(e) = r.exits() {
        eprintln!(
            "{path} {payload:?}: over the run, {}",
            e.describe_per_message(COUNT)
        );
    }
    assert!(r.ok(), "{}", r.result.describe());
    assert_eq!(r.result.done, COUNT);
    // Every doorbell the program rang reached the VMM's relay through the ioeventfd.
    assert_eq!(r.relay.signals, r.result.doorbells, "{:?}", r.relay);

    // The host side saw every message, intact and in order, from the micro-VM's channel.
    let from = VM_ADDR;
    check_arrivals(&echoer.join().unwrap(), payload, from);
    Some((report, r))
}

/// Bypass: no exit per message. The only exit to the launcher is the final MMIO store; no
/// signal interrupted the run. The engine polls throughout (see `exchange`), so the program
/// rings no doorbell. What the kernel counted: every in-kernel exit is a host interrupt (timer
/// ticks) or the first touch of a guest page (a fixed page fault, a number that does not grow
/// with the messages); with native user mode nothing emulated but the final store.
fn bypass(name: &str, payload: Payload) {
    let Some((report, r)) = exchange(name, payload, DataPath::Bypass) else {
        return;
    };
    assert_eq!((r.run.user_exits, r.run.interrupted), (1, 0));
    assert!(r.mediator.is_none());
    // The engine never slept: the program never had to ring, and the relay had nothing to do.
    assert_eq!(
        r.result.doorbells, 0,
        "doorbells rung although the engine polled throughout"
    );
    assert_eq!(r.relay, RelayStats::default());
    if let (Some(s), Some(e)) = (&r.stats, r.exits()) {
        let n = |name| s.get(name).unwrap_or(0);
        assert_eq!(n("mmio_exits"), 1, "{:?}", s.nonzero());
        assert_eq!(
            n("exits"),
            n("mmio_exits") + n("irq_exits") + n("pf_fixed"),
            "{:?}",
            s.nonzero()
        );
        assert_eq!((e.user_space, e.other), (1, 0), "{e:?}");
        assert!(n("pf_fixed") <= 32, "{:?}", s.nonzero());
        if report.cpl3_native() {
            assert!(n("insn_emulation") <= 1, "{:?}", s.nonzero());
        }
        // In the steady state (every page touched, the final store still to come) the kernel
        // saw nothing but host interrupts: no page fault, no MMIO or port exit to the VMM,
        // nothing emulated.
        let w = r
            .steady
            .as_ref()
            .expect("the launcher saw the steady-state window");
        let n = |name| w.stats.get(name).unwrap_or(0);
        eprintln!(
            "steady state: {} messages (replies {}..{}), {} doorbell(s), counters {:?}",
            w.messages(),
            w.from,
            w.to,
            w.doorbells,
            w.stats.nonzero()
        );
        assert!(w.messages() >= 100, "{w:?}");
        // Not a single exit but host interrupts (timer ticks) during these messages.
        assert_eq!(w.doorbells, 0, "{w:?}");
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
    bypass("microvm-user", Payload::UserData);
}

#[test]
fn user_mode_guest_exchanges_dma_data_with_a_host_process_guest_without_exits() {
    bypass("microvm-dma", Payload::DmaData { len: 4096 });
}

/// A doorbell per message: at least one in-kernel exit per message that is neither a host
/// interrupt nor a page fault (the ioeventfd store, an emulated instruction), and still no exit
/// to the VMM before the final one.
#[test]
fn a_doorbell_per_message_is_an_in_kernel_exit_each_and_no_exit_to_the_vmm() {
    let Some((_, r)) = exchange("microvm-bell", Payload::UserData, DataPath::Doorbell) else {
        return;
    };
    assert_eq!((r.run.user_exits, r.run.interrupted), (1, 0));
    assert_eq!((r.result.doorbells, r.relay.signals), (COUNT, COUNT));
    if let Some(e) = r.exits() {
        assert_eq!(e.user_space, 1, "{e:?}");
        assert!(e.other >= COUNT, "{e:?}");
        assert!(e.emulated > COUNT, "{e:?}");
        let s = r.steady_exits().expect("the steady-state window");
        let m = r.steady.as_ref().map_or(0, |w| w.messages());
        eprintln!("steady state: {}", s.describe_per_message(m));
        assert_eq!(s.user_space, 0, "{s:?}");
        assert!(s.other >= m && s.emulated >= m, "{s:?} over {m} messages");
    }
}

/// VMM-mediated: every message is an exit to the VMM (its hand-over), and every reply at least
/// one more (the receive load); the program rings no doorbell (the VMM notifies the engine).
fn mediated(name: &str, payload: Payload, handed_per_message: u64) {
    let Some((_, r)) = exchange(name, payload, DataPath::Mediated) else {
        return;
    };
    let m = r.mediator.expect("the mediator's statistics");
    assert_eq!(m.sends, handed_per_message * COUNT, "{m:?}");
    assert!(m.recvs >= COUNT, "{m:?}");
    assert_eq!(r.run.interrupted, 0);
    assert_eq!(r.run.user_exits, m.sends + m.recvs + 1);
    assert!(r.run.user_exits > 2 * COUNT);
    assert_eq!(r.result.doorbells, 0);
    assert_eq!(r.relay, RelayStats::default());
    if let (Some(s), Some(e)) = (&r.stats, r.exits()) {
        // KVM counted the same exits to the VMM as the launcher.
        assert_eq!(
            s.get("mmio_exits"),
            Some(r.run.user_exits),
            "{:?}",
            s.nonzero()
        );
        assert_eq!(e.user_space, r.run.user_exits, "{e:?}");
        // In the kernel: host interrupts and first touches of pages only.
        assert_eq!(e.other, 0, "{e:?}");
        let w = r.steady_exits().expect("the steady-state window");
        let n = r.steady.as_ref().map_or(0, |w| w.messages());
        eprintln!("steady state: {}", w.describe_per_message(n));
        assert!(w.user_space >= 2 * n, "{w:?} over {n} messages");
    }
}

#[test]
fn vmm_mediated_user_data_exits_to_the_vmm_for_every_message() {
    mediated("microvm-mediated", Payload::UserData, 1);
}

#[test]
fn vmm_mediated_dma_data_exits_to_the_vmm_for_every_post_and_send() {
    mediated("microvm-mediated-dma", Payload::DmaData { len: 4096 }, 2);
}

/// Two micro-VMs exchange `COUNT` messages of `payload` through the daemon, both on the bypass
/// path, in lockstep: each sends message i and waits for the other's message i, which must be
/// the one it sent itself (the same seed: the same cookie, payload or DMA bytes, into the buffer
/// it posted), from the other, in order. Each program checks every message it receives.
fn two_micro_vms(name: &str, payload: Payload) {
    if kvm_or_skip().is_none() {
        return;
    }
    // Each program posts its receive buffer for message i only after message i - 1 is done, so
    // the engine holds the other's DMA-data i until this vCPU runs again; on two CPUs shared with
    // the other tests that can take longer than the default 100 ms wait for a posted buffer.
    let d = DaemonFixture::start(
        name,
        &[(VM_MAC, ""), (HOST_MAC, "")],
        EngineOverrides {
            backpressure_wait_ms: Some(60_000),
            ..EngineOverrides::default()
        },
    );
    // A side that fails before its program starts abandons the line, so the other fails too
    // rather than waiting for it.
    let start = Arc::new(StartLine::new(2));
    let a = VM_ADDR;
    let b = HOST_ADDR;
    let run = |sock: PathBuf, me: ChannelAddr, peer: ChannelAddr| {
        let mut cfg = config(sock, me.endpoint, peer, COUNT, payload, DataPath::Bypass);
        cfg.start = Some(Arc::clone(&start));
        thread::spawn(move || run_bypass(&cfg))
    };
    let vm_a = run(d.sock(1), a, b);
    let vm_b = run(d.sock(2), b, a);
    // Both sides' outcomes first, failed ones too: when one side fails or stalls, the other's
    // state says where the exchange stopped.
    let outcomes = [("a", vm_a), ("b", vm_b)].map(|(who, vm)| (who, vm.join().unwrap()));
    for (who, outcome) in &outcomes {
        match outcome {
            Ok(r) => eprintln!(
                "micro-VM {who} {payload:?}: {COUNT} exchanges in {:?}: {}; {} user-space exit(s)",
                r.run.elapsed,
                r.result.describe(),
                r.run.user_exits
            ),
            Err(e) => eprintln!("micro-VM {who} {payload:?}: {e}"),
        }
    }
    for (who, outcome) in outcomes {
        let r = outcome.unwrap_or_else(|e| panic!("micro-VM {who}: {e}"));
        assert!(r.ok(), "micro-VM {who}: {}", r.result.describe());
        assert_eq!((r.result.done, r.run.user_exits), (COUNT, 1));
    }
}

#[test]
fn two_micro_vms_exchange_user_data_through_the_daemon() {
    two_micro_vms("microvm-pair-user", Payload::UserData);
}

#[test]
fn two_micro_vms_exchange_dma_data_through_the_daemon() {
    two_micro_vms("microvm-pair-dma", Payload::DmaData { len: 4096 });
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
    let peer = HOST_ADDR;
    let cfg = config(
        sock.into(),
        VM_ENDPOINT,
        peer,
        u64::MAX,
        Payload::UserData,
        DataPath::Bypass,
    );
    let r = run_bypass(&cfg);
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
    let to_vm = VM_ADDR;
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
