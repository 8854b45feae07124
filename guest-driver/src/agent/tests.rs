//! The agent against a fake engine on a datagram NIC, with channel memory from a host-process
//! memfd, driven by the real VM client ([`AgentClient`]) and by a raw (hostile) client.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use svnic_channels::frame::{
    ControlOp, ControlResponse, ControlStatus, CreateRequest, Frame, FrameBody,
};
use svnic_channels::layout::header;
use svnic_channels::{
    ChannelAddr, ChannelId, ChannelLayout, FailureReason, MacAddr, Message, Producer, RingKind,
    SharedRegion, UserData,
};

use super::memory::{MemfdBackend, HUGEPAGE};
use super::nic::{DatagramNic, Nic, PacketSocket};
use super::*;
use crate::virtio_user::MemfdMemory;
use crate::vm::protocol::{AgentFailure, Request, Response, MAX_MESSAGE_LEN};
use crate::vm::seqpacket::{poll_readable, SeqPacket};
use crate::vm::{AgentClient, AgentError as ClientError};

const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0xa9, 0, 1]);
const LONG: Duration = Duration::from_secs(10);

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < LONG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[derive(Default)]
struct Seen {
    creates: Vec<CreateRequest>,
    destroys: Vec<ChannelId>,
    doorbells: Vec<ChannelId>,
    regions: HashMap<ChannelId, (SharedRegion, ChannelLayout)>,
}

#[derive(Clone, Default)]
struct Behaviour {
    refuse: HashMap<u32, FailureReason>,
    hold_creates: bool,
    hold_destroys: bool,
    refuse_destroys: bool,
    /// Channels of an earlier agent that the engine still serves.
    stale: HashSet<u32>,
}

enum Cmd {
    Behave(Behaviour, Sender<()>),
    Release,
    Send(Vec<u8>),
    Stop,
}

struct FakeEngine {
    cmds: Sender<Cmd>,
    seen: Arc<Mutex<Seen>>,
    thread: Option<JoinHandle<()>>,
}

fn frame_to(dst: MacAddr, body: FrameBody<'_>) -> Vec<u8> {
    Frame {
        dst,
        src: MacAddr::ENGINE,
        body,
    }
    .encode()
    .unwrap()
}

fn frame(body: FrameBody<'_>) -> Vec<u8> {
    frame_to(MAC, body)
}

fn response(to: MacAddr, request_id: u32, channel: ChannelId, status: ControlStatus) -> Vec<u8> {
    frame_to(
        to,
        FrameBody::ControlResponse(ControlResponse {
            request_id,
            channel,
            status,
        }),
    )
}

impl FakeEngine {
    fn start(wire: Box<dyn Nic>, agent: MacAddr, memory: Arc<MemfdMemory>, b: Behaviour) -> Self {
        let (cmds, rx) = channel();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s = seen.clone();
        let thread = std::thread::spawn(move || engine_loop(wire, agent, memory, b, rx, s));
        FakeEngine {
            cmds,
            seen,
            thread: Some(thread),
        }
    }

    /// Changes the behaviour; returns once the engine applies it.
    fn behave(&self, b: Behaviour) {
        let (tx, rx) = channel();
        self.cmds.send(Cmd::Behave(b, tx)).unwrap();
        rx.recv_timeout(LONG).unwrap();
    }

    fn release(&self) {
        self.cmds.send(Cmd::Release).unwrap();
    }

    fn send(&self, f: Vec<u8>) {
        self.cmds.send(Cmd::Send(f)).unwrap();
    }

    fn seen<R>(&self, f: impl FnOnce(&Seen) -> R) -> R {
        f(&self.seen.lock().unwrap())
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() && !std::thread::panicking() {
                panic!("the fake engine panicked");
            }
        }
    }
}

fn engine_loop(
    mut wire: Box<dyn Nic>,
    agent: MacAddr,
    memory: Arc<MemfdMemory>,
    mut b: Behaviour,
    rx: Receiver<Cmd>,
    seen: Arc<Mutex<Seen>>,
) {
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut next = 100u32;
    loop {
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                Cmd::Behave(nb, done) => {
                    b = nb;
                    let _ = done.send(());
                }
                Cmd::Release => {
                    for f in held.drain(..) {
                        wire.send(&f).unwrap();
                    }
                }
                Cmd::Send(f) => wire.send(&f).unwrap(),
                Cmd::Stop => return,
            }
        }
        let mut buf = [0u8; 2048];
        if !poll_readable(wire.fd(), Duration::from_millis(2)).unwrap() {
            continue;
        }
        let Some(n) = wire.recv(&mut buf).unwrap() else {
            continue;
        };
        let f = Frame::decode(&buf[..n]).unwrap();
        assert_eq!((f.dst, f.src), (MacAddr::ENGINE, agent));
        let mut seen = seen.lock().unwrap();
        match f.body {
            FrameBody::ControlRequest(req) => match req.op {
                ControlOp::Create(c) => {
                    seen.creates.push(c);
                    if let Some(reason) = b.refuse.get(&c.endpoint) {
                        wire.send(&response(
                            agent,
                            req.request_id,
                            ChannelId(0),
                            ControlStatus::Failure(*reason),
                        ))
                        .unwrap();
                        continue;
                    }
                    next += 1;
                    let ch = ChannelId(next);
                    wire.send(&response(agent, req.request_id, ch, ControlStatus::Pending))
                        .unwrap();
                    let layout = ChannelLayout::new(c.ring_size, c.region_len).unwrap();
                    let region = SharedRegion::from_guest_memory(
                        memory.guest_memory().clone(),
                        c.region_addr,
                        c.region_len,
                    )
                    .unwrap();
                    region
                        .channel(layout)
                        .unwrap()
                        .init_header(ch.0, 0, None)
                        .unwrap();
                    seen.regions.insert(ch, (region, layout));
                    let ok = response(
                        agent,
                        req.request_id,
                        ch,
                        ControlStatus::Success {
                            worker: 0,
                            cpu: None,
                        },
                    );
                    if b.hold_creates {
                        held.push(ok);
                    } else {
                        wire.send(&ok).unwrap();
                    }
                }
                ControlOp::Destroy { channel } => {
                    seen.destroys.push(channel);
                    let known = seen.regions.contains_key(&channel) || b.stale.remove(&channel.0);
                    let status = if b.refuse_destroys || !known {
                        ControlStatus::Failure(FailureReason::NoSuchChannel)
                    } else {
                        seen.regions.remove(&channel);
                        ControlStatus::Destroyed
                    };
                    let answer = response(agent, req.request_id, channel, status);
                    if b.hold_destroys {
                        held.push(answer);
                    } else {
                        wire.send(&answer).unwrap();
                    }
                }
            },
            FrameBody::Doorbell { channel } => seen.doorbells.push(channel),
            _ => {}
        }
    }
}

struct Harness {
    mac: MacAddr,
    agent: Option<JoinHandle<Result<(), super::AgentError>>>,
    handle: AgentHandle,
    engine: FakeEngine,
    memory: Arc<MemfdMemory>,
    dir: PathBuf,
}

fn config(dir: &std::path::Path) -> AgentConfig {
    AgentConfig {
        socket: dir.join("agent.sock"),
        state_file: Some(dir.join("agent.channels")),
        max_channels_per_app: 3,
        max_channels: 5,
        shutdown_wait: Duration::from_secs(2),
        recovery_wait: Duration::from_secs(2),
        ..AgentConfig::default()
    }
}

fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("svnic-agent-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Harness {
    fn start(name: &str, b: Behaviour) -> Self {
        Self::start_in(test_dir(name), b)
    }

    fn start_in(dir: PathBuf, b: Behaviour) -> Self {
        let (nic, wire) = DatagramNic::pair(MAC).unwrap();
        let wire = DatagramNic::new(wire, MacAddr::ENGINE).unwrap();
        Self::start_with(dir, Box::new(nic), Box::new(wire), b)
    }

    fn start_with(dir: PathBuf, nic: Box<dyn Nic>, wire: Box<dyn Nic>, b: Behaviour) -> Self {
        let memory = Arc::new(MemfdMemory::new(32 << 20).unwrap());
        let mac = nic.mac();
        let engine = FakeEngine::start(wire, mac, memory.clone(), b);
        let backend = MemfdBackend::new(memory.clone()).unwrap();
        let (agent, handle) = Agent::new(config(&dir), nic, Box::new(backend)).unwrap();
        let agent = std::thread::spawn(move || agent.run());
        Harness {
            mac,
            agent: Some(agent),
            handle,
            engine,
            memory,
            dir,
        }
    }

    fn client(&self) -> AgentClient {
        AgentClient::connect(self.handle.socket()).unwrap()
    }

    fn status(&self) -> AgentStatus {
        self.handle.status()
    }

    fn stop(&mut self) {
        self.handle.stop();
        if let Some(a) = self.agent.take() {
            a.join().unwrap().unwrap();
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.handle.stop();
        if let Some(a) = self.agent.take() {
            let _ = a.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client that speaks the protocol by hand.
struct Raw {
    sock: SeqPacket,
}

impl Raw {
    fn connect(h: &Harness) -> Self {
        let r = Raw {
            sock: SeqPacket::connect(h.handle.socket()).unwrap(),
        };
        assert!(matches!(r.recv().0, Response::Hello { mac: MAC, .. }));
        r
    }

    fn send(&self, req: Request) {
        self.sock.send(&req.encode(), &[]).unwrap();
    }

    fn recv(&self) -> (Response, Vec<OwnedFd>) {
        assert!(self.sock.wait_readable(LONG).unwrap(), "no answer");
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let r = self.sock.recv(&mut buf).unwrap();
        (Response::decode(&buf[..r.len]).unwrap(), r.fds)
    }

    fn failure(&self) -> (u32, AgentFailure) {
        match self.recv().0 {
            Response::Failure { token, reason, .. } => (token, reason),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    /// Create + Mapped without mapping; returns (token, answer).
    fn create(&self, token: u32, endpoint: u32) -> Response {
        self.send(Request::Create {
            token,
            endpoint,
            ring_size: 256,
        });
        let (r, fds) = self.recv();
        assert!(matches!(r, Response::Region { .. }), "{r:?}");
        assert_eq!(fds.len(), 3);
        self.send(Request::Mapped { token });
        loop {
            match self.recv().0 {
                Response::Pending { .. } => continue,
                r => return r,
            }
        }
    }
}

fn events(h: &Harness) -> Vec<AgentEvent> {
    h.status().events.into_iter().collect()
}

#[test]
fn a_channel_is_created_used_and_destroyed_through_the_agent() {
    let h = Harness::start("use", Behaviour::default());
    create_use_and_destroy(&h);
}

/// The agent over a real raw packet socket: a veth pair in a private network namespace, the
/// fake engine on the other end. Needs root (skipped otherwise).
#[test]
fn the_agent_speaks_through_a_real_packet_socket() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let t = std::thread::spawn(|| {
        // SAFETY: unshare(CLONE_NEWNET) moves only this thread (and what it spawns) into a new
        // network namespace; it touches no memory.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!("skipped: cannot unshare the network namespace");
            return;
        }
        let made = std::process::Command::new("ip")
            .args([
                "link", "add", "svt0", "type", "veth", "peer", "name", "svt1",
            ])
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: cannot create a veth pair");
            return;
        }
        // Opening brings both ends up.
        let nic = PacketSocket::open("svt0", svnic_channels::frame::ETHERTYPE).unwrap();
        let wire = PacketSocket::open("svt1", svnic_channels::frame::ETHERTYPE).unwrap();
        assert!(nic.describe().starts_with("svt0"));
        let h = Harness::start_with(
            test_dir("veth"),
            Box::new(nic),
            Box::new(wire),
            Behaviour::default(),
        );
        create_use_and_destroy(&h);
    });
    t.join().unwrap();
}

fn create_use_and_destroy(h: &Harness) {
    let mac = h.mac;
    let client = h.client();
    assert_eq!(client.mac(), mac);
    assert_eq!(client.info().region_len, HUGEPAGE);
    let free = h.memory.free_bytes();
    let mut ch = client.create_channel(5, 256, LONG).unwrap();
    assert_eq!(ch.addr(), ChannelAddr { mac, endpoint: 5 });
    assert_eq!(h.memory.free_bytes(), free - HUGEPAGE);
    let id = ChannelId(ch.id());
    let create = h.engine.seen(|s| s.creates[0]);
    assert_eq!(
        (create.mac, create.endpoint, create.ring_size),
        (mac, 5, 256)
    );
    assert_eq!(create.region_len, HUGEPAGE);
    assert_eq!(create.region_addr % HUGEPAGE, 0);
    wait_until("the channel is live", || h.status().live_channels == 1);

    // Engine -> application: an RX message written into the memory the agent registered.
    let (region, layout) = h.engine.seen(|s| s.regions[&id].clone());
    let mem = region.channel(layout).unwrap();
    let mut rx = Producer::new(RingKind::Rx, &layout);
    let from = ChannelAddr {
        mac: MacAddr([2, 0, 0, 0, 0, 9]),
        endpoint: 1,
    };
    let msg = Message::UserData(UserData::new(from, 77, b"through the agent").unwrap());
    assert!(rx.push(&mem, &msg.encode()).unwrap());
    rx.publish(&mem).unwrap();
    let mut got = Vec::new();
    assert_eq!(ch.poll(&mut got, 8).unwrap(), 1);
    assert!(
        matches!(&got[0], Message::UserData(u) if u.cookie == 77 && u.data() == b"through the agent")
    );

    // Application -> engine: a doorbell when the worker sleeps, relayed as a frame.
    mem.set_sleeping(header::ENGINE_SLEEPING, true);
    assert!(ch.send_user(from, 1, b"hi", false).unwrap());
    ch.flush().unwrap();
    wait_until("the doorbell frame", || {
        h.engine.seen(|s| s.doorbells.contains(&id))
    });

    // Engine wake -> the application's waiter.
    let waiter = client.waiter(&ch).unwrap();
    assert!(!waiter.wait_for_wake(Duration::from_millis(10)).unwrap());
    h.engine
        .send(frame_to(mac, FrameBody::Wake { channel: id }));
    assert!(waiter.wait_for_wake(LONG).unwrap());
    wait_until("the wake is counted", || h.status().wakes == 1);

    client.destroy_channel(ch, LONG).unwrap();
    assert_eq!(
        h.memory.free_bytes(),
        free,
        "freed before Destroyed was answered"
    );
    assert_eq!(h.engine.seen(|s| s.destroys.clone()), vec![id]);
    let ev = events(h);
    let pos = |e: &AgentEvent| ev.iter().position(|x| x == e).unwrap();
    let gpa = create.region_addr;
    assert!(
        pos(&AgentEvent::DestroySent { channel: id })
            < pos(&AgentEvent::EngineDestroyed { channel: id })
    );
    assert!(
        pos(&AgentEvent::EngineDestroyed { channel: id })
            < pos(&AgentEvent::MemoryFreed {
                gpa,
                channel: Some(id)
            })
    );
    let state = std::fs::read_to_string(h.dir.join("agent.channels")).unwrap();
    assert!(!state.lines().any(|l| l == id.0.to_string()), "{state}");
}

#[test]
fn a_refused_create_frees_the_memory_at_once() {
    let b = Behaviour {
        refuse: HashMap::from([(9, FailureReason::EndpointTaken)]),
        ..Default::default()
    };
    let h = Harness::start("refused", b);
    let client = h.client();
    let free = h.memory.free_bytes();
    match client.create_channel(9, 256, LONG) {
        Err(ClientError::Refused {
            reason: AgentFailure::Engine(FailureReason::EndpointTaken),
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(h.memory.free_bytes(), free);
    wait_until("no region held", || h.status().held_regions == 0);
    // The client still works.
    let ch = client.create_channel(10, 256, LONG).unwrap();
    client.destroy_channel(ch, LONG).unwrap();
}

#[test]
fn an_application_that_dies_has_its_channels_destroyed_before_the_memory_is_freed() {
    let h = Harness::start("dies", Behaviour::default());
    let client = h.client();
    let free = h.memory.free_bytes();
    let a = client.create_channel(1, 256, LONG).unwrap();
    let b = client.create_channel(2, 64, LONG).unwrap();
    let ids = [ChannelId(a.id()), ChannelId(b.id())];
    h.engine.behave(Behaviour {
        hold_destroys: true,
        ..Default::default()
    });
    // The "crash": the connection closes with the channels live.
    drop((a, b, client));
    wait_until("both destroy frames", || {
        h.engine.seen(|s| s.destroys.len() == 2)
    });
    let mut destroyed = h.engine.seen(|s| s.destroys.clone());
    destroyed.sort();
    assert_eq!(destroyed, ids);
    // Not acknowledged yet: the memory is still held.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.memory.free_bytes(), free - 2 * HUGEPAGE);
    let st = h.status();
    assert_eq!((st.apps, st.live_channels, st.held_regions), (0, 0, 2));
    let state = std::fs::read_to_string(h.dir.join("agent.channels")).unwrap();
    for id in ids {
        assert!(state.lines().any(|l| l == id.0.to_string()), "{state}");
    }
    h.engine.release();
    wait_until("the memory is freed", || h.memory.free_bytes() == free);
    wait_until("no region held", || h.status().held_regions == 0);
    let ev = events(&h);
    for id in ids {
        let i = ev
            .iter()
            .position(|e| *e == AgentEvent::EngineDestroyed { channel: id })
            .unwrap();
        assert!(matches!(ev[i + 1], AgentEvent::MemoryFreed { channel: Some(c), .. } if c == id));
    }
    assert!(ev.contains(&AgentEvent::AppGone {
        app: 1,
        channels: 2
    }));
}

#[test]
fn an_application_gone_while_its_create_is_pending_gets_the_channel_destroyed() {
    let h = Harness::start(
        "pending",
        Behaviour {
            hold_creates: true,
            ..Default::default()
        },
    );
    let free = h.memory.free_bytes();
    let raw = Raw::connect(&h);
    raw.send(Request::Create {
        token: 1,
        endpoint: 4,
        ring_size: 256,
    });
    assert!(matches!(raw.recv().0, Response::Region { .. }));
    raw.send(Request::Mapped { token: 1 });
    assert!(matches!(raw.recv().0, Response::Pending { token: 1 }));
    drop(raw);
    wait_until("the app is gone", || h.status().apps == 0);
    assert_eq!(h.memory.free_bytes(), free - HUGEPAGE);
    // The Success comes after the application left: the agent destroys the channel.
    h.engine.release();
    wait_until("the channel is destroyed", || {
        h.engine.seen(|s| s.destroys.len() == 1)
    });
    wait_until("the memory is freed", || h.memory.free_bytes() == free);
    assert_eq!(h.status().outstanding, 0);
}

#[test]
fn memory_passed_but_never_registered_is_freed_on_cancel_or_disconnect() {
    let h = Harness::start("cancel", Behaviour::default());
    let free = h.memory.free_bytes();
    let raw = Raw::connect(&h);
    for token in [1, 2] {
        raw.send(Request::Create {
            token,
            endpoint: token,
            ring_size: 256,
        });
        assert!(matches!(raw.recv().0, Response::Region { .. }));
    }
    assert_eq!(h.memory.free_bytes(), free - 2 * HUGEPAGE);
    raw.send(Request::Cancel { token: 1 });
    wait_until("cancel frees", || h.memory.free_bytes() == free - HUGEPAGE);
    drop(raw);
    wait_until("disconnect frees", || h.memory.free_bytes() == free);
    assert!(h
        .engine
        .seen(|s| s.creates.is_empty() && s.destroys.is_empty()));
}

#[test]
fn a_refused_destroy_keeps_the_memory_for_good() {
    let h = Harness::start("quarantine", Behaviour::default());
    let client = h.client();
    let free = h.memory.free_bytes();
    let ch = client.create_channel(3, 256, LONG).unwrap();
    let id = ChannelId(ch.id());
    h.engine.behave(Behaviour {
        refuse_destroys: true,
        ..Default::default()
    });
    match client.destroy_channel(ch, LONG) {
        Err(ClientError::Refused {
            reason: AgentFailure::Engine(FailureReason::NoSuchChannel),
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    wait_until("quarantined", || h.status().quarantined == 1);
    drop(client);
    wait_until("the app is gone", || h.status().apps == 0);
    assert_eq!(h.memory.free_bytes(), free - HUGEPAGE);
    assert!(events(&h).contains(&AgentEvent::Quarantined { channel: id }));
}

#[test]
fn hostile_requests_get_failures_and_the_agent_carries_on() {
    let h = Harness::start("hostile", Behaviour::default());
    let raw = Raw::connect(&h);
    let other = Raw::connect(&h);
    // Garbage, a wrong version, token 0, an oversized message, descriptors.
    raw.sock.send(b"garbage!!", &[]).unwrap();
    assert_eq!(raw.failure().1, AgentFailure::BadRequest);
    let mut v = Request::Mapped { token: 3 }.encode();
    v[0] = 9;
    raw.sock.send(&v, &[]).unwrap();
    assert_eq!(raw.failure(), (3, AgentFailure::BadRequest));
    raw.send(Request::Mapped { token: 0 });
    assert_eq!(raw.failure(), (0, AgentFailure::BadRequest));
    raw.sock.send(&[1u8; 1000], &[]).unwrap();
    assert_eq!(raw.failure().1, AgentFailure::BadRequest);
    let e = crate::vm::event::Event::new().unwrap();
    use std::os::fd::AsFd;
    raw.sock
        .send(&Request::Mapped { token: 4 }.encode(), &[e.as_fd()])
        .unwrap();
    assert_eq!(raw.failure(), (4, AgentFailure::BadRequest));
    // Out-of-place and foreign requests.
    raw.send(Request::Mapped { token: 5 });
    assert_eq!(raw.failure(), (5, AgentFailure::UnknownToken));
    raw.send(Request::Create {
        token: 6,
        endpoint: 1,
        ring_size: 100,
    });
    assert_eq!(
        raw.failure(),
        (6, AgentFailure::Engine(FailureReason::BadRingSize))
    );
    let Response::Success { channel, .. } = other.create(1, 1) else {
        panic!("create failed")
    };
    raw.send(Request::Destroy { token: 7, channel });
    assert_eq!(raw.failure(), (7, AgentFailure::NotYourChannel));
    // Quotas: 3 per application, 5 in all.
    for t in 10..12 {
        assert!(matches!(other.create(t, t), Response::Success { .. }));
    }
    other.send(Request::Create {
        token: 12,
        endpoint: 12,
        ring_size: 256,
    });
    assert_eq!(other.failure(), (12, AgentFailure::TooManyChannels));
    for t in 20..22 {
        assert!(matches!(raw.create(t, t), Response::Success { .. }));
    }
    raw.send(Request::Create {
        token: 22,
        endpoint: 22,
        ring_size: 256,
    });
    assert_eq!(raw.failure(), (22, AgentFailure::TooManyChannels));
    // A destroy of a channel that does not exist.
    raw.send(Request::Destroy {
        token: 30,
        channel: ChannelId(9999),
    });
    assert_eq!(raw.failure(), (30, AgentFailure::NotYourChannel));
    assert_eq!(h.status().live_channels, 5);
}

#[test]
fn frames_that_are_not_the_engines_are_ignored() {
    let h = Harness::start("frames", Behaviour::default());
    let client = h.client();
    let ch = client.create_channel(1, 256, LONG).unwrap();
    let id = ChannelId(ch.id());
    // From another MAC, malformed, a wake for a channel nobody holds, not svnic at all.
    let mut spoofed = frame(FrameBody::Wake { channel: id });
    spoofed[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 66]);
    let mut malformed = frame(FrameBody::Wake { channel: id });
    malformed[14] = 7;
    let mut ipv4 = vec![0u8; 60];
    ipv4[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let unknown = frame(FrameBody::Wake {
        channel: ChannelId(4242),
    });
    for f in [spoofed, malformed, ipv4, unknown] {
        h.engine.send(f);
    }
    wait_until("three ignored frames", || h.status().ignored_frames == 3);
    let waiter = client.waiter(&ch).unwrap();
    assert!(!waiter.wait_for_wake(Duration::from_millis(20)).unwrap());
    assert_eq!(h.status().wakes, 0);
}

#[test]
fn stopping_the_agent_destroys_every_channel_first() {
    let mut h = Harness::start("stop", Behaviour::default());
    let client = h.client();
    let free = h.memory.free_bytes();
    let ch = client.create_channel(1, 256, LONG).unwrap();
    let id = ChannelId(ch.id());
    h.stop();
    assert_eq!(h.engine.seen(|s| s.destroys.clone()), vec![id]);
    assert_eq!(h.memory.free_bytes(), free);
    let st = h.status();
    assert!(st.stopped);
    assert_eq!(st.held_regions, 0);
    assert!(!h.dir.join("agent.sock").exists());
    // The application finds out on its next request.
    assert!(client
        .create_channel(2, 256, Duration::from_secs(1))
        .is_err());
}

#[test]
fn a_new_agent_destroys_the_channels_an_earlier_one_left() {
    let dir = test_dir("recover");
    std::fs::write(dir.join("agent.channels"), "# earlier agent\n101\n102\n").unwrap();
    let b = Behaviour {
        stale: HashSet::from([101]),
        ..Default::default()
    };
    let h = Harness::start_in(dir, b);
    // Recovery runs before the first application is served.
    let client = h.client();
    let destroyed = h.engine.seen(|s| s.destroys.clone());
    assert_eq!(destroyed, vec![ChannelId(101), ChannelId(102)]);
    assert!(events(&h).contains(&AgentEvent::Recovered {
        channel: ChannelId(101)
    }));
    let state = std::fs::read_to_string(h.dir.join("agent.channels")).unwrap();
    assert!(!state.contains("101") && !state.contains("102"), "{state}");
    let ch = client.create_channel(1, 256, LONG).unwrap();
    client.destroy_channel(ch, LONG).unwrap();
}
