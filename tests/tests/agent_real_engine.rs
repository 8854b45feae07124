//! VM mode on a host, against the real engine: the agent of `svnic-guestd` (the library, run as
//! the binary runs it, except that its NIC is a datagram socket wired to the backend's control
//! path instead of eth0, and channel memory is carved from a memfd "guest RAM" that the engine
//! has as the guest's memory table instead of hugepages) serves `svnic-guest --agent` processes
//! — unprivileged (user nobody) when the test runs as root.
//!
//! Everything between the application and the engine is the real thing: the seqpacket protocol,
//! fd passing, mapping, the doorbell and wake eventfds, control/doorbell/wake frames, the
//! control path, the engine's workers. Only eth0 (virtio-net in a VM) and the hugepages /
//! pagemap are replaced; the VM tests (tests/, vm-images/) cover those.
#![allow(clippy::unwrap_used)]

use svnic_tests::guest_tool as tool;

use std::collections::VecDeque;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use svnic_backend::frame_handler::{FrameHandler, FrameOut};
use svnic_backend::Engine;
use svnic_channels::MacAddr;
use svnic_control_plane::{GuestId, GuestPolicy};
use svnic_guestd::memory::{MemfdBackend, HUGEPAGE};
use svnic_guestd::nic::DatagramNic;
use svnic_guestd::{
    Agent, AgentConfig, AgentEvent, AgentHandle, EndpointRange, UidLimits, UserPolicy,
};
use svnic_host_frontend::virtio_user::MemfdMemory;
use tool::{spawn_as, Tool};

const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x71, 0x00, 0x01]);
const LONG: Duration = Duration::from_secs(120);

/// The engine's frames for the guest go back down the wire to the agent's NIC.
struct WireOut(UnixDatagram);

impl FrameOut for WireOut {
    fn send(&self, _port: GuestId, frame: &[u8]) -> bool {
        self.0.send(frame).is_ok()
    }
}

/// One "VM": engine, control path, the agent, and the wire between them (which can be paused:
/// frames from the agent are then held back from the engine).
struct Vm {
    engine: Engine,
    guest: GuestId,
    memory: Arc<MemfdMemory>,
    handle: AgentHandle,
    agent: Option<JoinHandle<()>>,
    pump: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    dir: PathBuf,
}

impl Vm {
    fn start(name: &str) -> Self {
        Self::start_users(name, UserPolicy::default())
    }

    fn start_users(name: &str, users: UserPolicy) -> Self {
        let dir = std::env::temp_dir().join(format!("svnic-vmmode-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let engine = svnic_tests::fake_guest::engine(1);
        let guest = engine
            .register_guest(GuestPolicy::new("vm", MAC), None)
            .unwrap();
        let memory = Arc::new(MemfdMemory::new(64 << 20).unwrap());
        engine
            .set_guest_memory(guest, Some(memory.guest_memory().clone()))
            .unwrap();
        let (nic, wire) = DatagramNic::pair(MAC).unwrap();
        let control =
            FrameHandler::new(engine.clone(), Arc::new(WireOut(wire.try_clone().unwrap())));
        engine
            .set_guest_waker(guest, Some(control.waker(guest, MAC)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let pump = {
            let (stop, paused) = (stop.clone(), paused.clone());
            wire.set_read_timeout(Some(Duration::from_millis(2)))
                .unwrap();
            std::thread::spawn(move || {
                let mut held: VecDeque<Vec<u8>> = VecDeque::new();
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(n) = wire.recv(&mut buf) {
                        held.push_back(buf[..n].to_vec());
                    }
                    if !paused.load(Ordering::Relaxed) {
                        while let Some(f) = held.pop_front() {
                            control.handle(guest, &f);
                        }
                    }
                }
            })
        };
        let cfg = AgentConfig {
            socket: dir.join("agent.sock"),
            state_file: Some(dir.join("agent.channels")),
            users,
            ..AgentConfig::default()
        };
        let backend = MemfdBackend::new(memory.clone()).unwrap();
        let (agent, handle) = Agent::new(cfg, Box::new(nic), Box::new(backend)).unwrap();
        let agent = std::thread::spawn(move || agent.run().unwrap());
        // Let unprivileged applications reach the socket.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        Vm {
            engine,
            guest,
            memory,
            handle,
            agent: Some(agent),
            pump: Some(pump),
            stop,
            paused,
            dir,
        }
    }

    fn sock(&self) -> String {
        self.handle.socket().display().to_string()
    }

    fn live_in_engine(&self) -> usize {
        self.engine
            .control_plane()
            .live_channels_of(self.guest)
            .len()
    }

    /// Starts `tool --agent <the agent's socket> <args>` (as nobody when root).
    fn run(&self, tool: &str, args: &[&str]) -> Tool {
        let sock = self.sock();
        let mut all = vec![tool, "--agent", &sock];
        all.extend_from_slice(args);
        self.tool(tool, &all)
    }

    /// Starts `tool --path <path> --endpoint <endpoint> [--peer <peer>] --count <count> --json`.
    fn run_on(
        &self,
        tool: &str,
        path: &str,
        endpoint: &str,
        peer: Option<&str>,
        count: &str,
    ) -> Tool {
        let mut args = vec!["--path", path, "--endpoint", endpoint];
        if let Some(peer) = peer {
            args.extend(["--peer", peer]);
        }
        args.extend(["--count", count, "--json"]);
        self.run(tool, &args)
    }

    fn tool(&self, name: &str, args: &[&str]) -> Tool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        spawn_as(name, args, root.then_some(65534))
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.handle.stop();
        if let Some(a) = self.agent.take() {
            let _ = a.join();
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(p) = self.pump.take() {
            let _ = p.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `out`'s stderr says `what`.
fn assert_stderr_has(out: &tool::Finished, what: &str) {
    assert!(out.stderr.contains(what), "{}", out.stderr);
}

fn wait_until(what: &str, f: impl FnMut() -> bool) {
    eprintln!("waiting until {what}");
    svnic_tests::wait::wait_until(LONG, f);
}

#[test]
fn ping_and_perf_through_the_agent_and_the_real_engine() {
    let vm = Vm::start("tools");
    let free = vm.memory.free_bytes();
    let peer = format!("{MAC}/1");
    for path in ["user", "dma", "user"] {
        let echo = vm.run_on("echo", path, "1", None, "200");
        let ready = echo.wait_ready(LONG);
        assert!(
            ready.contains(&format!("ready at {MAC}/1 (vm, path {path})")),
            "{ready}"
        );
        let p = vm
            .run_on("ping", path, "2", Some(&peer), "200")
            .finish(LONG)
            .json();
        assert_eq!(
            (p["mode"].as_str(), p["round_trips"].as_u64()),
            (Some("vm"), Some(200))
        );
        assert!(p["p50_us"].as_f64().unwrap() > 0.0);
        assert_eq!(echo.finish(LONG).json()["echoed"], 200);
        eprintln!(
            "vm mode {path}: ping p50 {:.1} us",
            p["p50_us"].as_f64().unwrap()
        );
    }
    for (path, count) in [("user", 20_000u64), ("dma", 2_000)] {
        let n = count.to_string();
        let sink = vm.run_on("sink", path, "1", None, &n);
        sink.wait_ready(LONG);
        let p = vm
            .run_on("perf", path, "2", Some(&peer), &n)
            .finish(LONG)
            .json();
        assert_eq!(p["messages"], count);
        let k = sink.finish(LONG).json();
        assert_eq!(k["messages"], count, "channels lose nothing: {k}");
        eprintln!("vm mode {path}: {} msgs/s received", k["messages_per_sec"]);
    }
    // Every channel was destroyed with the engine and its memory freed.
    wait_until("every region freed", || {
        let s = vm.handle.status();
        s.held_regions == 0 && s.apps == 0
    });
    assert_eq!(vm.live_in_engine(), 0);
    assert_eq!(vm.memory.free_bytes(), free);
}

#[test]
fn sleeping_clients_are_woken_through_the_agent() {
    let vm = Vm::start("sleep");
    let peer = format!("{MAC}/1");
    // No polling at all: every wait sleeps, so every reply needs a Wake frame relayed by the
    // agent to the application's eventfd.
    let quiet = ["--spins", "0", "--yields", "0"];
    let mut args = vec!["--endpoint", "1", "--count", "50", "--json"];
    args.extend(quiet);
    let echo = vm.run("echo", &args);
    echo.wait_ready(LONG);
    let mut args = vec![
        "--endpoint",
        "2",
        "--peer",
        &peer,
        "--count",
        "50",
        "--json",
    ];
    args.extend(quiet);
    let p = vm.run("ping", &args).finish(LONG).json();
    assert_eq!(p["round_trips"], 50);
    assert_eq!(echo.finish(LONG).json()["echoed"], 50);
    let st = vm.handle.status();
    assert!(st.wakes >= 50, "wakes relayed: {st:?}");
    eprintln!(
        "sleeping clients: p50 {:.1} us, {} wakes and {} doorbells relayed",
        p["p50_us"].as_f64().unwrap(),
        st.wakes,
        st.doorbells
    );
}

#[test]
fn a_killed_application_has_its_channel_destroyed_before_the_memory_is_freed() {
    let vm = Vm::start("kill");
    let free = vm.memory.free_bytes();
    let echo = vm.run(
        "echo",
        &["--path", "user", "--count", "1000000", "--wait", "600"],
    );
    echo.wait_ready(LONG);
    assert_eq!(vm.live_in_engine(), 1);
    assert_eq!(vm.memory.free_bytes(), free - HUGEPAGE);
    let id = vm.engine.control_plane().live_channels_of(vm.guest)[0].id;

    // The engine hears nothing from the agent for a while.
    vm.paused.store(true, Ordering::Relaxed);
    let f = echo.kill();
    assert!(!f.status.success());
    wait_until("the agent notices", || {
        vm.handle
            .status()
            .events
            .contains(&AgentEvent::DestroySent { channel: id })
    });
    std::thread::sleep(Duration::from_millis(200));
    // Not acknowledged: the engine still serves the channel, and the memory is still held.
    assert_eq!(vm.live_in_engine(), 1);
    assert_eq!(vm.memory.free_bytes(), free - HUGEPAGE);
    assert_eq!(vm.handle.status().held_regions, 1);

    vm.paused.store(false, Ordering::Relaxed);
    // The agent frees the memory, then records the event: wait for both.
    let freed_event =
        |e: &AgentEvent| matches!(e, AgentEvent::MemoryFreed { channel: Some(c), .. } if *c == id);
    wait_until("the memory is freed", || {
        vm.memory.free_bytes() == free && vm.handle.status().events.iter().any(freed_event)
    });
    assert_eq!(vm.live_in_engine(), 0);
    let ev: Vec<AgentEvent> = vm.handle.status().events.into_iter().collect();
    let at = |e: &AgentEvent| ev.iter().position(|x| x == e).unwrap();
    let freed = ev.iter().position(freed_event).unwrap();
    assert!(
        at(&AgentEvent::DestroySent { channel: id })
            < at(&AgentEvent::EngineDestroyed { channel: id })
    );
    assert!(at(&AgentEvent::EngineDestroyed { channel: id }) < freed);
}

#[test]
fn crash_test_sees_the_endpoint_reclaimed_through_the_agent() {
    let vm = Vm::start("crashtest");
    let sock = vm.sock();
    let free = vm.memory.free_bytes();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut args = vec!["crash-test", "--agent", &sock, "--endpoint", "5", "--json"];
    if root {
        // Drops root itself (instead of being started as nobody).
        args.extend(["--user", "65534"]);
    }
    let r = tool::spawn("crash-test", &args).finish(LONG).json();
    assert_eq!(r["tool"], "crash-test");
    assert!(r["reclaimed_ms"].as_f64().unwrap() > 0.0, "{r}");
    let pid = r["killed_pid"].as_u64().unwrap();
    assert!(pid > 0);
    wait_until("every region freed", || {
        vm.handle.status().held_regions == 0 && vm.memory.free_bytes() == free
    });
    assert_eq!(vm.live_in_engine(), 0);
    let ev = vm.handle.status().events;
    // The killed application's channel went through destroy -> acknowledgement -> free.
    assert!(ev
        .iter()
        .any(|e| matches!(e, AgentEvent::AppGone { channels: 1, .. })));
    let destroyed = ev
        .iter()
        .filter(|e| matches!(e, AgentEvent::EngineDestroyed { .. }))
        .count();
    assert_eq!(destroyed, 2, "the killed one and crash-test's own: {ev:?}");
}

/// Real processes running as nobody (the kernel's credentials, read by the agent with
/// SO_PEERCRED): held to nobody's quota and kept out of an endpoint range reserved for another
/// uid, and the quota comes back only after the killed holder's channel was destroyed.
#[test]
fn an_unprivileged_process_is_held_to_its_uids_quota_and_endpoints() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to start applications as another uid");
        return;
    }
    const NOBODY: u32 = 65534;
    let users = UserPolicy {
        default: UidLimits::new(Some(1), None),
        endpoint_ranges: vec![EndpointRange {
            first: 100,
            last: 199,
            uid: 1000,
        }],
        ..UserPolicy::default()
    };
    let vm = Vm::start_users("uids", users);
    let sock = vm.sock();
    let free = vm.memory.free_bytes();
    let echo_as_nobody = |endpoint: &str| {
        let args = [
            "echo",
            "--agent",
            &sock,
            "--endpoint",
            endpoint,
            "--count",
            "1000000",
            "--wait",
            "600",
        ];
        spawn_as("echo", &args, Some(NOBODY))
    };
    let holder = echo_as_nobody("1");
    holder.wait_ready(LONG);
    // The status is published after each turn of the agent's loop: it may lag the answer.
    wait_until("nobody's channel counted", || {
        vm.handle.status().users.get(&NOBODY).map(|u| u.channels) == Some(1)
    });
    let events = vm.handle.status().events;
    assert!(
        events
            .iter()
            .any(|e| matches!(e, AgentEvent::AppConnected { uid: NOBODY, .. })),
        "{events:?}"
    );

    // A second process of the same user: refused by the user's quota, named.
    let second = echo_as_nobody("2").finish(LONG);
    assert!(!second.status.success());
    assert!(
        second
            .stderr
            .contains("the user's channel quota is reached")
            && second.stderr.contains("--max-channels-per-uid"),
        "{}",
        second.stderr
    );
    // The reservation is checked first: another uid's endpoint is refused as such.
    let reserved = echo_as_nobody("150").finish(LONG);
    assert_stderr_has(&reserved, "reserved for uid 1000");

    // Killed: the quota comes back once the engine acknowledged the destroy, not before.
    vm.paused.store(true, Ordering::Relaxed);
    holder.kill();
    wait_until("the holder is gone", || vm.handle.status().apps == 0);
    let blocked = echo_as_nobody("2").finish(LONG);
    assert_stderr_has(&blocked, "--max-channels-per-uid");
    vm.paused.store(false, Ordering::Relaxed);
    wait_until("the quota is released", || {
        !vm.handle.status().users.contains_key(&NOBODY)
    });
    assert_eq!(vm.memory.free_bytes(), free);
    let again = echo_as_nobody("2");
    again.wait_ready(LONG);
    again.kill();
}
