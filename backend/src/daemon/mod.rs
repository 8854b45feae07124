//! The daemon: one engine, one switch, one vhost-user listener per guest, the frame handler
//! between them, and the admin socket. `svnic serve` and `svnic demo` both run this.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use log::info;
use svnic_channels::MacAddr;
use svnic_control_plane::{ChannelState, GuestId};
use thiserror::Error;
use vm_memory::GuestMemoryMmap;

use crate::admin::{
    AdminOptions, AdminRequest, AdminResponse, AdminServer, AdminSource, ChannelView, EngineView,
    GuestView, PoolView, UplinkWorkerView, WorkerView,
};
use crate::config::DaemonConfig;
use crate::debug_fields::debug_fields;
use crate::engine::{Engine, EngineError, RunState};
use crate::frame_handler::{FrameHandler, FrameOut};
use crate::net::{
    ListenerError, PortEvents, PortId, PortListener, StopSignal, Switch, SwitchConfig, SwitchError,
};
use crate::pool::{Pool, PoolContext, PoolError};
use crate::sockets::SocketError;

mod uplink;

/// Why the daemon could not start.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// The engine refused its settings or could not start workers.
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    /// A guest's port could not be added.
    #[error("switch: {0}")]
    Switch(#[from] SwitchError),
    /// A guest's socket could not be served.
    #[error("{0}")]
    Listener(#[from] ListenerError),
    /// The admin socket could not be created.
    #[error("admin socket: {0}")]
    Admin(#[source] SocketError),
    /// The stop signal could not be created.
    #[error("stop signal: {0}")]
    Io(#[from] std::io::Error),
    /// A pool's socket could not be served.
    #[error("{0}")]
    Pool(#[from] PoolError),
}

/// What the switch reports, turned into engine and frame-handler calls.
struct Events {
    engine: Engine,
    frame_handler: OnceLock<Arc<FrameHandler>>,
}

impl PortEvents for Events {
    fn memory_changed(&self, port: PortId, mem: Option<Arc<GuestMemoryMmap>>) {
        if let Err(e) = self.engine.set_guest_memory(port, mem) {
            svnic_control_plane::log_limited!(log::Level::Warn, "{port}: memory change: {e}");
        }
    }

    fn svnic_frame(&self, port: PortId, frame: &[u8]) {
        if let Some(h) = self.frame_handler.get() {
            h.handle(port, frame);
        }
    }

    fn connection(&self, port: PortId, connected: bool) {
        // A frontend decides how often it connects: rate-limited.
        if connected {
            svnic_control_plane::log_limited!(log::Level::Info, "{port}: frontend connected");
        } else {
            // Channels went with the memory (memory_changed(None) comes first); nothing of
            // the guest stays in the engine.
            svnic_control_plane::log_limited!(log::Level::Info, "{port}: frontend disconnected");
        }
    }
}

/// The frame handler answers through the switch.
struct SwitchOut(Arc<Switch>);

impl FrameOut for SwitchOut {
    fn send(&self, port: GuestId, frame: &[u8]) -> bool {
        self.0.inject(port, frame)
    }
}

struct GuestEntry {
    id: GuestId,
    name: String,
    macs: Vec<MacAddr>,
    socket: PathBuf,
    /// Frontends refused by the socket's uid allow-list.
    refused_peers: Arc<AtomicU64>,
}

/// Whether [`Daemon::start`] opens the operator socket ([`DaemonConfig::admin_socket`]) for
/// `svnic ctl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminSocket {
    /// Open it and answer operator requests (`svnic serve`).
    Serve,
    /// No operator socket (the demo, tests).
    Off,
}

/// A running daemon. [`Daemon::shutdown`] (or drop) stops listeners and removes sockets.
pub struct Daemon {
    engine: Engine,
    switch: Arc<Switch>,
    frame_handler: Arc<FrameHandler>,
    stop: StopSignal,
    listeners: Vec<JoinHandle<()>>,
    admin: Option<AdminServer>,
    guests: Arc<Vec<GuestEntry>>,
    pools: Arc<Vec<Arc<Pool>>>,
    /// The uplink's interface, if any.
    uplink: Option<String>,
}

debug_fields!(Daemon, |d| guests: d.guests.len(), pools: d.pools.len());

impl Daemon {
    /// Starts the engine, the switch, every guest's listener and, with
    /// [`AdminSocket::Serve`], the admin socket.
    pub fn start(config: &DaemonConfig, admin: AdminSocket) -> Result<Self, DaemonError> {
        let engine = Engine::new(config.engine.clone())?;
        let events = Arc::new(Events {
            engine: engine.clone(),
            frame_handler: OnceLock::new(),
        });
        let switch = Switch::new(events.clone(), SwitchConfig::default());
        let frame_handler = FrameHandler::new(engine.clone(), Arc::new(SwitchOut(switch.clone())));
        let _ = events.frame_handler.set(frame_handler.clone());
        if let Some(up) = &config.uplink {
            uplink::attach(up, &engine, &switch)?;
        }
        let stop = StopSignal::new()?;
        let mut guests = Vec::new();
        let mut daemon = Daemon {
            engine: engine.clone(),
            switch: switch.clone(),
            frame_handler: frame_handler.clone(),
            stop: stop.clone(),
            listeners: Vec::new(),
            admin: None,
            guests: Arc::new(Vec::new()),
            pools: Arc::new(Vec::new()),
            uplink: config.uplink.as_ref().map(|u| u.iface.clone()),
        };
        for g in &config.guests {
            let policy = g.policy.clone();
            let macs = policy.macs.clone();
            let name = policy.name.clone();
            let id = engine.register_guest(policy, None)?;
            engine.set_guest_waker(id, Some(frame_handler.waker(id, macs[0])))?;
            switch.add_port(id, &macs)?;
            let listener = PortListener::bind_with(&g.socket, &g.access)?;
            let refused_peers = listener.refused_peers();
            daemon
                .listeners
                .push(listener.spawn(switch.clone(), id, stop.clone())?);
            info!(
                "guest '{name}' ({id}, {}) on {}",
                macs[0],
                g.socket.display()
            );
            guests.push(GuestEntry {
                id,
                name,
                macs,
                socket: g.socket.clone(),
                refused_peers,
            });
        }
        daemon.guests = Arc::new(guests);
        let mut pools = Vec::new();
        for p in &config.pools {
            let ctx = PoolContext {
                engine: engine.clone(),
                switch: switch.clone(),
                frame_handler: frame_handler.clone(),
                stop: stop.clone(),
            };
            let (pool, thread) = crate::pool::start(p, ctx)?;
            daemon.listeners.push(thread);
            pools.push(pool);
        }
        daemon.pools = Arc::new(pools);
        if admin == AdminSocket::Serve {
            let view = Arc::new(daemon.view_parts());
            let options = AdminOptions {
                access: config.admin_access(),
                ..AdminOptions::default()
            };
            daemon.admin = Some(
                AdminServer::start(&config.admin_socket, view, &options)
                    .map_err(DaemonError::Admin)?,
            );
        }
        Ok(daemon)
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The switch.
    pub fn switch(&self) -> &Arc<Switch> {
        &self.switch
    }

    /// The guest pools, in configuration order.
    pub fn pools(&self) -> &[Arc<Pool>] {
        &self.pools
    }

    /// What `svnic ctl` would see.
    pub fn view(&self) -> impl AdminSource {
        self.view_parts()
    }

    fn view_parts(&self) -> DaemonView {
        DaemonView {
            engine: self.engine.clone(),
            switch: self.switch.clone(),
            frame_handler: self.frame_handler.clone(),
            guests: self.guests.clone(),
            pools: self.pools.clone(),
            uplink: self.uplink.clone(),
        }
    }

    /// Stops every listener (their sockets are removed) and the admin socket.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        self.stop.stop();
        for l in self.listeners.drain(..) {
            let _ = l.join();
        }
        self.admin = None;
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Blocks the calling thread until SIGINT or SIGTERM. Call [`block_termination_signals`] first,
/// before any thread is started, so that no other thread takes the signal.
pub fn wait_for_termination() -> i32 {
    let set = termination_set();
    let mut sig: libc::c_int = 0;
    // SAFETY: set is a valid, initialised sigset; sig is a valid out pointer.
    let r = unsafe { libc::sigwait(&set, &mut sig) };
    if r == 0 {
        sig
    } else {
        -1
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread (and the threads it starts later), so that
/// [`wait_for_termination`] receives them.
pub fn block_termination_signals() {
    let set = termination_set();
    // SAFETY: set is valid; a null old-set pointer is allowed.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

fn termination_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set points to a live sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: set is initialised; sig is a valid signal number.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    set
}

struct DaemonView {
    engine: Engine,
    switch: Arc<Switch>,
    frame_handler: Arc<FrameHandler>,
    guests: Arc<Vec<GuestEntry>>,
    pools: Arc<Vec<Arc<Pool>>>,
    uplink: Option<String>,
}

impl AdminSource for DaemonView {
    fn answer(&self, req: AdminRequest) -> AdminResponse {
        use std::sync::atomic::Ordering::Relaxed;
        match req {
            AdminRequest::Guests => {
                let stats: HashMap<PortId, _> = self
                    .switch
                    .stats()
                    .into_iter()
                    .map(|s| (s.port, s))
                    .collect();
                let row = |id: GuestId, name: &str, macs: &[MacAddr], socket: &Path| {
                    let s = stats.get(&id);
                    GuestView {
                        name: name.to_string(),
                        macs: macs.iter().map(|m| m.to_string()).collect(),
                        socket: socket.display().to_string(),
                        connected: s.is_some_and(|s| s.link_up),
                        channels: self.engine.control_plane().live_channels_of(id).len(),
                        frames_in: s.map_or(0, |s| s.traffic.tx_frames),
                        frames_out: s.map_or(0, |s| s.traffic.rx_frames),
                        drops: s.map_or(0, |s| s.drops.total()),
                        refused_peers: 0,
                        pool: None,
                        peer_pid: None,
                        peer_uid: None,
                    }
                };
                let mut guests: Vec<GuestView> = self
                    .guests
                    .iter()
                    .map(|g| GuestView {
                        refused_peers: g.refused_peers.load(Relaxed),
                        ..row(g.id, &g.name, &g.macs, &g.socket)
                    })
                    .collect();
                for pool in self.pools.iter() {
                    let config = pool.config();
                    guests.extend(pool.members().into_iter().map(|m| GuestView {
                        pool: Some(config.name.clone()),
                        peer_pid: m.pid,
                        peer_uid: m.uid,
                        ..row(m.id, &m.name, &[m.mac], &config.socket)
                    }));
                }
                AdminResponse::Guests { guests }
            }
            AdminRequest::Pools => AdminResponse::Pools {
                pools: self
                    .pools
                    .iter()
                    .map(|pool| {
                        let (config, stats) = (pool.config(), pool.stats());
                        PoolView {
                            name: config.name.clone(),
                            socket: config.socket.display().to_string(),
                            macs: config.macs.to_string(),
                            max: config.max,
                            live: stats.live,
                            accepted: stats.accepted,
                            refused_full: stats.refused_full,
                            refused_peers: stats.refused_peers,
                        }
                    })
                    .collect(),
            },
            AdminRequest::Channels => {
                let channels = self
                    .engine
                    .channel_records()
                    .into_iter()
                    .map(|r| {
                        let stats = self.engine.channel_stats(r.id).unwrap_or_default();
                        let state = match (r.state, self.engine.run_state(r.id)) {
                            (ChannelState::Success, Some(RunState::Faulted)) => {
                                "Faulted".to_string()
                            }
                            (ChannelState::Failure(reason), _) => format!("Failure({reason})"),
                            (s, _) => format!("{s:?}"),
                        };
                        ChannelView {
                            id: r.id.0,
                            guest: r.guest_name.clone(),
                            addr: r.addr.to_string(),
                            state,
                            worker: r.worker,
                            cpu: r.cpu,
                            ring_size: r.ring_size,
                            tx: stats.tx_taken,
                            delivered: stats.tx_delivered,
                            errors: stats.tx_errors_total(),
                            rx: stats.rx_messages,
                            rx_bytes: stats.rx_bytes,
                        }
                    })
                    .collect();
                AdminResponse::Channels { channels }
            }
            AdminRequest::Engine => {
                let c = self.frame_handler.counters();
                AdminResponse::Engine(EngineView {
                    workers: self
                        .engine
                        .worker_stats()
                        .into_iter()
                        .map(|w| WorkerView {
                            worker: w.worker,
                            cpu: w.cpu,
                            channels: w.counts.channels,
                            messages: w.counts.messages,
                            sleeps: w.counts.sleeps,
                            doorbells: w.counts.doorbells,
                            faults: w.counts.faults,
                        })
                        .collect(),
                    control_requests: c.requests.load(Relaxed),
                    doorbells: c.doorbells.load(Relaxed),
                    wakes: c.wakes.load(Relaxed),
                    svnic_frame_drops: c.dropped.load(Relaxed),
                    switch_drops: self.switch.stats().iter().map(|s| s.drops.total()).sum(),
                    creates_succeeded: c.creates_succeeded.load(Relaxed),
                    creates_refused: c.creates_refused.load(Relaxed),
                    creates_rate_limited: c.creates_rate_limited.load(Relaxed),
                    creates_failed: c.creates_failed.load(Relaxed),
                    memory_faults: crate::net::sigbus_guard::recovered_faults(),
                })
            }
            AdminRequest::Uplink => AdminResponse::Uplink {
                iface: self.uplink.clone(),
                workers: self
                    .engine
                    .wire_stats()
                    .into_iter()
                    .map(|w| UplinkWorkerView {
                        worker: w.worker,
                        counters: w.named().into_iter().collect(),
                    })
                    .collect(),
            },
        }
    }
}
