//! The agent's event loop: one thread, one epoll set over the application listener, the NIC,
//! every application connection and every live channel's doorbell eventfd.
//!
//! Frames to the engine go through a backlog (control requests, in order) and a set (doorbells,
//! one per channel is enough), both retried when the NIC says "later", so nothing is lost to a
//! full device queue. What the requests mean is in `book.rs`.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use log::{debug, info, warn};
use svnic_channels::frame::{claims_svnic, ControlRequest, Frame, FrameBody};
use svnic_channels::{ChannelId, MacAddr};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

use super::memory::MemoryBackend;
use super::nic::Nic;
use super::records::{App, Creating, Destroying, Held, Live, Prepared};
use super::{AgentConfig, AgentError, AgentEvent, AgentStatus, Refusals, EVENT_LOG};
use svnic_client::request_table::RequestTable;
use svnic_client::vm::event::Event;
use svnic_client::vm::protocol::{Response, MAX_MESSAGE_LEN};
use svnic_client::vm::seqpacket::SeqPacketListener;

const T_LISTENER: u64 = 1;
const T_NIC: u64 = 2;
const T_STOP: u64 = 3;
const T_APP: u64 = 1 << 40;
const T_DOORBELL: u64 = 2 << 40;
/// Connections served at once; more are closed at once (each costs a descriptor).
const MAX_APPS: usize = 256;
/// Frames taken from the NIC, or messages from one application, per wake-up.
const BUDGET: usize = 256;

/// Counters kept by the loop.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) wakes: u64,
    pub(super) doorbells: u64,
    pub(super) ignored: u64,
    pub(super) refused: Refusals,
}

/// Stops a running agent and reads its status from another thread.
#[derive(Debug, Clone)]
pub struct AgentHandle {
    stop: Arc<Event>,
    status: Arc<Mutex<AgentStatus>>,
    socket: PathBuf,
}

impl AgentHandle {
    /// Asks the agent to stop: it destroys every channel with the engine (waiting up to
    /// `shutdown_wait` for the acknowledgements), then [`Agent::run`] returns.
    pub fn stop(&self) {
        if let Err(e) = self.stop.signal() {
            warn!("cannot signal the agent to stop: {e}");
        }
    }

    /// The status as of the loop's last iteration.
    pub fn status(&self) -> AgentStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The application socket.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// The stop eventfd (a signal handler may write to it).
    pub fn stop_fd(&self) -> RawFd {
        self.stop.as_raw_fd()
    }
}

/// The guest agent. See the module documentation of [`crate`].
pub struct Agent {
    pub(super) cfg: AgentConfig,
    pub(super) nic: Box<dyn Nic>,
    pub(super) mac: MacAddr,
    pub(super) memory: Box<dyn MemoryBackend>,
    epoll: Epoll,
    listener: Option<SeqPacketListener>,
    stop: Arc<Event>,
    pub(super) apps: HashMap<u64, App>,
    next_app: u64,
    pub(super) table: RequestTable,
    /// Memory the engine knows of (or may): by guest-physical address.
    pub(super) regions: HashMap<u64, Held>,
    /// Memory passed to an application, not yet registered: by (app, token).
    pub(super) prepared: HashMap<(u64, u32), Prepared>,
    /// Create requests an application waits for: by request id.
    pub(super) creates: HashMap<u32, Creating>,
    /// Destroy requests an application waits for: by request id.
    pub(super) destroys: HashMap<u32, Destroying>,
    /// Channels live in the engine for a connected application.
    pub(super) live: HashMap<ChannelId, Live>,
    backlog: VecDeque<Vec<u8>>,
    pub(super) doorbells: BTreeSet<u32>,
    /// Applications to disconnect after the current event.
    pub(super) dead: Vec<u64>,
    status: Arc<Mutex<AgentStatus>>,
    pub(super) counters: Counters,
    pub(super) shutdown_deadline: Option<Instant>,
    nic_failing: bool,
    pub(super) state_warned: bool,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("nic", &self.nic.describe())
            .field("apps", &self.apps.len())
            .field("live", &self.live.len())
            .field("regions", &self.regions.len())
            .finish()
    }
}

fn setup(what: impl Into<String>) -> impl FnOnce(io::Error) -> AgentError {
    let what = what.into();
    move |source| AgentError::Setup { what, source }
}

impl Agent {
    /// Binds the application socket and prepares the loop; [`Agent::run`] serves.
    pub fn new(
        cfg: AgentConfig,
        nic: Box<dyn Nic>,
        memory: Box<dyn MemoryBackend>,
    ) -> Result<(Agent, AgentHandle), AgentError> {
        cfg.users.validate()?;
        super::socket_path::check_socket_path(&cfg.socket)?;
        let listener = SeqPacketListener::bind(&cfg.socket, cfg.socket_mode)
            .map_err(setup(format!("listen on {}", cfg.socket.display())))?;
        let epoll = Epoll::new().map_err(setup("epoll"))?;
        let stop = Arc::new(Event::new().map_err(setup("eventfd"))?);
        let watch = |fd: RawFd, token: u64| {
            epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, token),
            )
        };
        watch(listener.as_raw_fd(), T_LISTENER).map_err(setup("epoll add listener"))?;
        watch(nic.fd().as_raw_fd(), T_NIC).map_err(setup("epoll add NIC"))?;
        watch(stop.as_raw_fd(), T_STOP).map_err(setup("epoll add stop"))?;
        let status = Arc::new(Mutex::new(AgentStatus::default()));
        let handle = AgentHandle {
            stop: stop.clone(),
            status: status.clone(),
            socket: cfg.socket.clone(),
        };
        let mac = nic.mac();
        Ok((
            Agent {
                cfg,
                nic,
                mac,
                memory,
                epoll,
                listener: Some(listener),
                stop,
                apps: HashMap::new(),
                next_app: 1,
                table: RequestTable::new(),
                regions: HashMap::new(),
                prepared: HashMap::new(),
                creates: HashMap::new(),
                destroys: HashMap::new(),
                live: HashMap::new(),
                backlog: VecDeque::new(),
                doorbells: BTreeSet::new(),
                dead: Vec::new(),
                status,
                counters: Counters::default(),
                shutdown_deadline: None,
                nic_failing: false,
                state_warned: false,
            },
            handle,
        ))
    }

    /// Destroys stale channels of an earlier agent, then serves until stopped (see
    /// [`AgentHandle::stop`]) and every channel is destroyed.
    pub fn run(mut self) -> Result<(), AgentError> {
        self.recover();
        info!(
            "svnic-guestd: serving applications on {} (mode {:o}); NIC {}; channel memory: {}",
            self.cfg.socket.display(),
            self.cfg.socket_mode,
            self.nic.describe(),
            self.memory.describe()
        );
        let users = &self.cfg.users;
        let show = |n: Option<u64>| n.map_or("unlimited".to_string(), |n| n.to_string());
        info!(
            "per uid: {} channel(s), {} KiB of channel memory; {} override(s); {} reserved \
             endpoint range(s)",
            show(users.default.channels.map(|n| n as u64)),
            show(users.default.memory.map(|b| b / 1024)),
            users.overrides.len(),
            users.endpoint_ranges.len()
        );
        let mut events = vec![EpollEvent::default(); 64];
        let result = loop {
            let timeout = if self.nic_failing {
                100
            } else if !self.backlog.is_empty() || !self.doorbells.is_empty() {
                2
            } else if self.shutdown_deadline.is_some() {
                20
            } else {
                1000
            };
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => break Err(AgentError::Poll(e)),
            };
            for ev in &events[..n] {
                self.dispatch(ev.data());
            }
            self.reap_dead();
            self.pump();
            self.publish();
            if let Some(deadline) = self.shutdown_deadline {
                if self.settled() {
                    info!("every channel is destroyed; exiting");
                    break Ok(());
                }
                if Instant::now() >= deadline {
                    warn!(
                        "stopping with {} request(s) unanswered by the engine; {} region(s) \
                         are released on exit although the engine may still use them \
                         (listed in the state file for the next agent)",
                        self.table.outstanding(),
                        self.regions.len()
                    );
                    break Ok(());
                }
            }
        };
        self.save_state();
        self.publish();
        self.lock_status().stopped = true;
        result
    }

    fn dispatch(&mut self, token: u64) {
        match token {
            T_LISTENER => self.accept(),
            T_NIC => self.read_nic(),
            T_STOP => {
                let _ = self.stop.drain();
                self.begin_shutdown();
            }
            t if t >= T_DOORBELL => self.on_doorbell(ChannelId((t - T_DOORBELL) as u32)),
            t if t >= T_APP => self.read_app(t - T_APP),
            t => debug!("unknown epoll token {t}"),
        }
    }

    fn accept(&mut self) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            let sock = match listener.accept() {
                Ok(Some(s)) => s,
                Ok(None) => return,
                Err(e) => {
                    warn!("accept on {}: {e}", self.cfg.socket.display());
                    return;
                }
            };
            if self.apps.len() >= MAX_APPS {
                self.counters.refused.connections += 1;
                debug!("{MAX_APPS} applications connected already; refusing another");
                continue;
            }
            // The uid decides quotas and endpoints: a connection without one is not served.
            let cred = match sock.peer_cred() {
                Ok(c) => c,
                Err(e) => {
                    self.counters.refused.connections += 1;
                    debug!("application connection without peer credentials ({e}); closed");
                    continue;
                }
            };
            let id = self.next_app;
            self.next_app += 1;
            let registered = sock.set_nonblocking(true).and_then(|()| {
                self.epoll.ctl(
                    ControlOperation::Add,
                    sock.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, T_APP | id),
                )
            });
            if let Err(e) = registered {
                warn!("application connection: {e}");
                continue;
            }
            let (pid, uid) = (cred.pid, cred.uid);
            info!("application {id} connected (pid {pid}, uid {uid})");
            self.apps.insert(id, App { sock, pid, uid });
            self.event(AgentEvent::AppConnected { app: id, pid, uid });
            let allowed = self.cfg.users.limits(uid).channels.unwrap_or(usize::MAX);
            let max_channels = self.cfg.max_channels_per_app.min(allowed);
            let hello = Response::Hello {
                mac: self.mac,
                region_len: self.memory.region_len(),
                max_channels: u32::try_from(max_channels).unwrap_or(u32::MAX),
            };
            self.reply(id, &hello, &[]);
        }
    }

    fn read_app(&mut self, id: u64) {
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        for _ in 0..BUDGET {
            let Some(app) = self.apps.get(&id) else {
                return;
            };
            match app.sock.recv(&mut buf) {
                Ok(r) if r.len == 0 && r.fds.is_empty() => {
                    self.dead.push(id);
                    return;
                }
                // Descriptors an application sent are closed here, unread.
                Ok(r) => self.on_app_message(id, &buf[..r.len], r.truncated, r.fds.len()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    debug!("application {id}: receive failed: {e}");
                    self.dead.push(id);
                    return;
                }
            }
        }
    }

    fn read_nic(&mut self) {
        let mut buf = [0u8; 2048];
        for _ in 0..BUDGET {
            match self.nic.recv(&mut buf) {
                Ok(Some(n)) => self.on_frame(&buf[..n]),
                Ok(None) => return,
                Err(e) => {
                    warn!("NIC {}: receive failed: {e}", self.nic.describe());
                    return;
                }
            }
        }
    }

    /// One frame from the NIC: only svnic frames from the engine mean anything.
    pub(super) fn on_frame(&mut self, bytes: &[u8]) {
        if !claims_svnic(bytes) {
            return;
        }
        let frame = match Frame::decode(bytes) {
            Ok(f) if f.src == MacAddr::ENGINE => f,
            Ok(f) => {
                self.counters.ignored += 1;
                debug!("svnic frame from {} (not the engine) ignored", f.src);
                return;
            }
            Err(e) => {
                self.counters.ignored += 1;
                debug!("malformed svnic frame ignored: {e}");
                return;
            }
        };
        match frame.body {
            FrameBody::ControlResponse(resp) => self.on_response(resp),
            FrameBody::Wake { channel } => self.on_wake(channel),
            // Requests, doorbells and the engines' frames between hosts never come to a guest.
            _ => self.counters.ignored += 1,
        }
    }

    /// Queues a control request to the engine (sent by [`Agent::pump`], in order).
    pub(super) fn send_request(&mut self, req: ControlRequest) {
        let frame = Frame {
            dst: MacAddr::ENGINE,
            src: self.mac,
            body: FrameBody::ControlRequest(req),
        };
        match frame.encode() {
            Ok(bytes) => self.backlog.push_back(bytes),
            Err(e) => warn!("control request {}: cannot encode: {e}", req.request_id),
        }
    }

    fn nic_send(&mut self, frame: &[u8]) -> bool {
        match self.nic.send(frame) {
            Ok(()) => {
                if self.nic_failing {
                    info!("NIC {}: sending again", self.nic.describe());
                    self.nic_failing = false;
                }
                true
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                false
            }
            Err(e) => {
                if !self.nic_failing {
                    warn!(
                        "NIC {}: send failed: {e}; retrying every 100 ms",
                        self.nic.describe()
                    );
                    self.nic_failing = true;
                }
                false
            }
        }
    }

    /// Sends queued control requests, then queued doorbells, as far as the NIC takes them.
    pub(super) fn pump(&mut self) {
        while let Some(frame) = self.backlog.pop_front() {
            if !self.nic_send(&frame) {
                self.backlog.push_front(frame);
                return;
            }
        }
        while let Some(&channel) = self.doorbells.first() {
            let frame = Frame {
                dst: MacAddr::ENGINE,
                src: self.mac,
                body: FrameBody::Doorbell {
                    channel: ChannelId(channel),
                },
            };
            let Ok(bytes) = frame.encode() else {
                self.doorbells.pop_first();
                continue;
            };
            if !self.nic_send(&bytes) {
                return;
            }
            self.doorbells.pop_first();
            self.counters.doorbells += 1;
        }
    }

    /// Sends one response to an application; an application that cannot take it (gone, or its
    /// socket buffer full because it does not read) is disconnected.
    pub(super) fn reply(&mut self, app: u64, resp: &Response, fds: &[std::os::fd::BorrowedFd<'_>]) {
        let Some(a) = self.apps.get(&app) else {
            return;
        };
        if let Err(e) = a.sock.send(&resp.encode(), fds) {
            debug!("application {app}: cannot answer ({e}); disconnecting it");
            self.dead.push(app);
        }
    }

    /// Watches a live channel's doorbell eventfd.
    pub(super) fn watch_doorbell(&mut self, channel: ChannelId, doorbell: &Event) {
        let ev = EpollEvent::new(EventSet::IN, T_DOORBELL | u64::from(channel.0));
        if let Err(e) = self
            .epoll
            .ctl(ControlOperation::Add, doorbell.as_raw_fd(), ev)
        {
            warn!("{channel}: cannot watch its doorbell eventfd: {e}");
        }
    }

    /// Stops watching a descriptor (a doorbell or an application socket).
    pub(super) fn unwatch(&mut self, fd: impl AsFd) {
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            fd.as_fd().as_raw_fd(),
            EpollEvent::default(),
        );
    }

    fn reap_dead(&mut self) {
        while let Some(app) = self.dead.pop() {
            self.disconnect(app, "disconnected");
        }
    }

    fn begin_shutdown(&mut self) {
        if self.shutdown_deadline.is_some() {
            return;
        }
        info!("stopping: destroying every channel with the engine before exiting");
        self.shutdown_deadline = Some(Instant::now() + self.cfg.shutdown_wait);
        if let Some(l) = self.listener.take() {
            self.unwatch_raw(l.as_raw_fd());
        }
        let apps: Vec<u64> = self.apps.keys().copied().collect();
        for app in apps {
            self.disconnect(app, "dropped (agent stopping)");
        }
    }

    fn unwatch_raw(&mut self, fd: RawFd) {
        let _ = self
            .epoll
            .ctl(ControlOperation::Delete, fd, EpollEvent::default());
    }

    /// Nothing is left that the engine might still use or answer.
    fn settled(&self) -> bool {
        self.creates.is_empty()
            && self.destroys.is_empty()
            && self.prepared.is_empty()
            && self.table.outstanding() == 0
            && self.regions.values().all(|h| h.quarantined)
    }

    fn lock_status(&self) -> MutexGuard<'_, AgentStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an event for [`AgentHandle::status`].
    pub(super) fn event(&self, e: AgentEvent) {
        let mut s = self.lock_status();
        if s.events.len() >= EVENT_LOG {
            s.events.pop_front();
        }
        s.events.push_back(e);
    }

    fn publish(&self) {
        let quarantined = self.regions.values().filter(|h| h.quarantined).count();
        let mut s = self.lock_status();
        s.apps = self.apps.len();
        s.live_channels = self.live.len();
        s.held_regions = self.regions.len();
        s.quarantined = quarantined;
        s.outstanding = self.table.outstanding();
        s.wakes = self.counters.wakes;
        s.doorbells = self.counters.doorbells;
        s.ignored_frames = self.counters.ignored;
        s.refused = self.counters.refused;
        s.users = self.usage_by_uid();
    }
}
