//! The agent against a fake engine on a datagram NIC (or a packet socket), with channel memory
//! from a host-process memfd, driven by the real VM client ([`AgentClient`]) and by a raw
//! (hostile) client. The harness is here; the tests in `lifecycle` and `hostile`.
#![allow(clippy::unwrap_used)]

mod hostile;
mod lifecycle;
mod users;

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
use svnic_client::vm::protocol::{AgentFailure, Request, Response, MAX_MESSAGE_LEN};
use svnic_client::vm::seqpacket::{poll_readable, SeqPacket};
use svnic_client::vm::{AgentClient, AgentError as ClientError};
use svnic_host_frontend::virtio_user::MemfdMemory;

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

/// Destroys held until released.
fn holding_destroys() -> Behaviour {
    Behaviour {
        hold_destroys: true,
        ..Default::default()
    }
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
    /// The guest memory free when the harness started, before any channel.
    free_at_start: u64,
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
        let cfg = config(&dir);
        Self::start_configured(dir, nic, wire, b, cfg)
    }

    /// An agent with these per-uid rules.
    fn start_users(name: &str, b: Behaviour, users: UserPolicy) -> Self {
        let dir = test_dir(name);
        let (nic, wire) = DatagramNic::pair(MAC).unwrap();
        let wire = DatagramNic::new(wire, MacAddr::ENGINE).unwrap();
        let cfg = AgentConfig {
            users,
            ..config(&dir)
        };
        Self::start_configured(dir, Box::new(nic), Box::new(wire), b, cfg)
    }

    fn start_configured(
        dir: PathBuf,
        nic: Box<dyn Nic>,
        wire: Box<dyn Nic>,
        b: Behaviour,
        cfg: AgentConfig,
    ) -> Self {
        let memory = Arc::new(MemfdMemory::new(32 << 20).unwrap());
        let free_at_start = memory.free_bytes();
        let mac = nic.mac();
        let engine = FakeEngine::start(wire, mac, memory.clone(), b);
        let backend = MemfdBackend::new(memory.clone()).unwrap();
        let (agent, handle) = Agent::new(cfg, nic, Box::new(backend)).unwrap();
        let agent = std::thread::spawn(move || agent.run());
        Harness {
            mac,
            agent: Some(agent),
            handle,
            engine,
            memory,
            free_at_start,
            dir,
        }
    }

    /// The channel memory the agent holds now: passed to applications or known to the engine,
    /// and not freed yet.
    fn memory_held(&self) -> u64 {
        self.free_at_start - self.memory.free_bytes()
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
        Self::greeted(SeqPacket::connect(h.handle.socket()).unwrap())
    }

    fn greeted(sock: SeqPacket) -> Self {
        let r = Raw { sock };
        assert!(matches!(r.recv().0, Response::Hello { mac: MAC, .. }));
        r
    }

    /// Connects as `uid` (None, and a printed reason, unless the test runs as root). Only the
    /// connecting thread changes its credentials (the raw syscalls, unlike libc's wrappers, act
    /// on the calling thread alone), and `SO_PEERCRED` records them at connect.
    fn connect_as(h: &Harness, uid: u32) -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: connecting as another uid needs root");
            return None;
        }
        let path = h.handle.socket().to_path_buf();
        let sock = std::thread::spawn(move || {
            // SAFETY: setresgid on this thread only; integer arguments.
            let g = unsafe { libc::syscall(libc::SYS_setresgid, uid, uid, uid) };
            // SAFETY: setresuid on this thread only (it ends after connecting); integers.
            let u = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
            assert_eq!((g, u), (0, 0), "cannot switch this thread to uid {uid}");
            SeqPacket::connect(&path).unwrap()
        })
        .join()
        .unwrap();
        Some(Self::greeted(sock))
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

    /// Create + Mapped without mapping; a refusal of the Create itself is returned as Err.
    fn try_create(&self, token: u32, endpoint: u32) -> Result<ChannelId, (AgentFailure, String)> {
        self.send(Request::Create {
            token,
            endpoint,
            ring_size: 256,
        });
        match self.recv().0 {
            Response::Region { .. } => {}
            Response::Failure { reason, detail, .. } => return Err((reason, detail)),
            other => panic!("expected a region, got {other:?}"),
        }
        self.send(Request::Mapped { token });
        loop {
            match self.recv().0 {
                Response::Pending { .. } => continue,
                Response::Success { channel, .. } => return Ok(channel),
                other => panic!("expected a channel, got {other:?}"),
            }
        }
    }

    /// Create, answered with a Region for `token` and its three descriptors (memory, wake,
    /// doorbell); not followed by Mapped.
    fn region(&self, token: u32, endpoint: u32) {
        self.send(Request::Create {
            token,
            endpoint,
            ring_size: 256,
        });
        let (r, fds) = self.recv();
        assert!(
            matches!(r, Response::Region { token: t, .. } if t == token),
            "{r:?}"
        );
        assert_eq!(fds.len(), 3);
    }

    /// Create + Mapped without mapping; returns (token, answer).
    fn create(&self, token: u32, endpoint: u32) -> Response {
        self.region(token, endpoint);
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
