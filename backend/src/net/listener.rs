//! The per-port vhost-user socket: accept a frontend, serve it with a fresh daemon and device
//! until it goes away, clean up, accept the next one.
//!
//! A `VhostUserDaemon` cannot serve a second connection (its owner state survives a
//! disconnect), so the listening socket is kept here and every connection gets a new daemon and
//! a new [`NetDevice`]; the [`SwitchPort`] stays. Whatever a frontend does
//! (garbage bytes, a truncated message, an unusable memory table) ends at most its own
//! connection, with a `warn` log line naming the port and the error.
//!
//! The listener accepts the frontend itself and connects it to the daemon through a relay
//! ([`super::relay`], which passes QEMU 7.2's early `SET_VRING_ENABLE` on in the order the
//! vhost crate accepts); the daemon accepts the relay's connection on a private rendezvous
//! socket.

use std::io;
use std::ops::ControlFlow;
use std::os::fd::AsFd;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use log::{info, warn, Level};
use svnic_control_plane::log_limited;
use thiserror::Error;
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{Error as DaemonError, ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::tempdir::TempDir;

use super::device::{NetDevice, WAKE_EVENT};
use super::port::{PortId, SwitchPort};
use super::relay::Relay;
use super::switch::Switch;
use crate::debug_fields::debug_fields;
use crate::sockets::{
    bind_socket, next_connection, Backoff, PeerFilter, SocketAccess, SocketError, StopWatch,
};

/// Why a listener could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ListenerError {
    /// The socket could not be created at its path (see [`SocketError`] for the rules).
    #[error("vhost-user socket: {0}")]
    Socket(#[from] SocketError),
    /// The port is not on the switch.
    #[error("{0} has no switch port")]
    UnknownPort(PortId),
    /// The listener thread could not be started.
    #[error("cannot start the listener thread for {port}: {source}")]
    Spawn {
        /// The port.
        port: PortId,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The private socket the daemon accepts the relay's connection on could not be created.
    #[error("cannot create the daemon's private rendezvous socket: {0}")]
    Rendezvous(#[source] io::Error),
    /// Waiting for a connection failed.
    #[error("{port}: waiting for a frontend failed: {source}")]
    Poll {
        /// The port.
        port: PortId,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

struct StopInner {
    stopped: AtomicBool,
    fd: EventFd,
    next_ticket: AtomicU64,
    connections: Mutex<Vec<(u64, ShutdownHandle)>>,
}

/// Stops listeners: every listener sharing it stops accepting, its current connection is shut
/// down, and it removes the socket file it bound. Cheap to clone.
#[derive(Clone)]
pub struct StopSignal {
    inner: Arc<StopInner>,
}

debug_fields!(StopSignal, |s| stopped: s.is_stopped());

impl StopSignal {
    /// A signal not yet raised.
    pub fn new() -> io::Result<Self> {
        Ok(StopSignal {
            inner: Arc::new(StopInner {
                stopped: AtomicBool::new(false),
                fd: EventFd::new(EFD_NONBLOCK)?,
                next_ticket: AtomicU64::new(0),
                connections: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Raises the signal. Listeners notice it at once, also in the middle of a connection.
    pub fn stop(&self) {
        let conns = self.lock_connections();
        self.inner.stopped.store(true, Ordering::SeqCst);
        // Never read: it stays readable for every listener polling it.
        let _ = self.inner.fd.write(1);
        for (_, conn) in conns.iter() {
            conn.shutdown();
        }
    }

    /// True once [`Self::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    fn lock_connections(&self) -> std::sync::MutexGuard<'_, Vec<(u64, ShutdownHandle)>> {
        self.inner
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a live connection so that [`Self::stop`] can end it (at once, if it already
    /// stopped).
    fn track(&self, conn: ShutdownHandle) -> u64 {
        let mut conns = self.lock_connections();
        if self.is_stopped() {
            conn.shutdown();
        }
        let ticket = self.inner.next_ticket.fetch_add(1, Ordering::Relaxed);
        conns.push((ticket, conn));
        ticket
    }

    fn untrack(&self, ticket: u64) {
        self.lock_connections().retain(|(t, _)| *t != ticket);
    }
}

/// A vhost-user listening socket for one port.
pub struct PortListener {
    listener: UnixListener,
    /// Set when we bound the path: the file is removed when the listener ends.
    path: Option<PathBuf>,
    /// Which peer uids are served.
    peers: PeerFilter,
    rendezvous: Rendezvous,
}

debug_fields!(PortListener, |p| path: p.path);

/// Where each connection's daemon accepts the [`Relay`]'s connection: vhost-user-backend's
/// daemon serves only connections it accepts itself from a `Listener`. The socket lives in a
/// private (0700) temporary directory, so only this user can reach it.
pub(crate) struct Rendezvous {
    listener: Listener,
    path: PathBuf,
    _dir: TempDir,
}

impl Rendezvous {
    pub(crate) fn new() -> Result<Self, ListenerError> {
        let dir = TempDir::new_with_prefix(std::env::temp_dir().join("svnic-relay-"))
            .map_err(|e| ListenerError::Rendezvous(e.into()))?;
        let path = dir.as_path().join("daemon.sock");
        let listener = UnixListener::bind(&path).map_err(ListenerError::Rendezvous)?;
        Ok(Rendezvous {
            listener: Listener::from(listener),
            path,
            _dir: dir,
        })
    }
}

impl PortListener {
    /// Binds `path` with the default access (mode 0600, any peer uid that can reach it). See
    /// [`Self::bind_with`].
    pub fn bind(path: impl AsRef<Path>) -> Result<Self, ListenerError> {
        Self::bind_with(path, &SocketAccess::default())
    }

    /// Binds `path` with `access`'s mode, group and peer allow-list, under the rules of
    /// [`crate::sockets::bind`]: a private or sticky directory, a stale socket of ours replaced,
    /// anything else at the path refused.
    pub fn bind_with(path: impl AsRef<Path>, access: &SocketAccess) -> Result<Self, ListenerError> {
        let path = path.as_ref();
        let rendezvous = Rendezvous::new()?;
        let listener = bind_socket(path, access)?;
        Ok(PortListener {
            listener,
            path: Some(path.into()),
            peers: PeerFilter::new(access.allow_uids.as_deref()),
            rendezvous,
        })
    }

    /// Serves an already bound socket (for instance one inherited from a supervisor). Its file,
    /// if any, is left alone.
    pub fn from_unix_listener(listener: UnixListener) -> Result<Self, ListenerError> {
        Ok(PortListener {
            listener,
            path: None,
            peers: PeerFilter::default(),
            rendezvous: Rendezvous::new()?,
        })
    }

    /// The socket path, if this listener bound it.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Counts the connections refused by the peer allow-list; stays valid after [`Self::spawn`].
    pub fn refused_peers(&self) -> Arc<AtomicU64> {
        self.peers.refused_counter()
    }

    /// Serves `port` until `stop` is raised: one frontend connection at a time, each with a
    /// fresh daemon and device.
    pub fn serve(
        mut self,
        switch: &Arc<Switch>,
        port: PortId,
        stop: &StopSignal,
    ) -> Result<(), ListenerError> {
        let id = port;
        switch.port(id).ok_or(ListenerError::UnknownPort(id))?;
        info!("{id}: vhost-user socket {:?} ready", self.path);
        let rendezvous = &mut self.rendezvous;
        accept_each(&self.listener, &self.peers, stop, &id, |frontend| {
            // Looked up per connection: a port removed from the switch is no longer served.
            let Some(port) = switch.port(id) else {
                refuse(id, "the port was removed from the switch");
                return ControlFlow::Break(());
            };
            serve_connection(rendezvous, switch, &port, frontend, stop);
            ControlFlow::Continue(())
        })
        .map_err(|source| ListenerError::Poll { port: id, source })?;
        info!("{id}: listener stopped");
        Ok(())
    }

    /// Accepts connections until `stop` is raised (or `serve` breaks), and hands each one the
    /// peer allow-list admits to `serve`; refused peers are closed before a byte of theirs is
    /// read. `socket` names the socket in log lines.
    pub(crate) fn accept_each(
        &self,
        stop: &StopSignal,
        socket: &dyn std::fmt::Display,
        serve: impl FnMut(UnixStream) -> ControlFlow<()>,
    ) -> io::Result<()> {
        accept_each(&self.listener, &self.peers, stop, socket, serve)
    }

    /// [`Self::serve`] on a thread of its own; errors are logged.
    pub fn spawn(
        self,
        switch: Arc<Switch>,
        port: PortId,
        stop: StopSignal,
    ) -> Result<JoinHandle<()>, ListenerError> {
        std::thread::Builder::new()
            .name(format!("svnic-listen-{}", port.0))
            .spawn(move || {
                if let Err(e) = self.serve(&switch, port, &stop) {
                    warn!("{e}");
                }
            })
            .map_err(|source| ListenerError::Spawn { port, source })
    }
}

/// [`PortListener::accept_each`] on the listener's parts, so that its caller may hold the rest.
fn accept_each(
    listener: &UnixListener,
    peers: &PeerFilter,
    stop: &StopSignal,
    socket: &dyn std::fmt::Display,
    mut serve: impl FnMut(UnixStream) -> ControlFlow<()>,
) -> io::Result<()> {
    let is_stopped = || stop.is_stopped();
    let watch = StopWatch {
        fd: stop.inner.fd.as_raw_fd(),
        is_stopped: &is_stopped,
    };
    let mut backoff = Backoff::default();
    while let Some(frontend) =
        next_connection(&mut backoff, listener.as_fd(), &watch, socket, || {
            listener.accept().map(|(frontend, _)| frontend)
        })?
    {
        if !peers.admits(&frontend, socket) {
            continue;
        }
        if serve(frontend).is_break() {
            break;
        }
    }
    Ok(())
}

/// Serves one accepted frontend of `port` with a fresh daemon and device until it goes away;
/// the daemon accepts the relay's connection on `rendezvous`.
pub(crate) fn serve_connection(
    rendezvous: &mut Rendezvous,
    switch: &Arc<Switch>,
    port: &Arc<SwitchPort>,
    frontend: UnixStream,
    stop: &StopSignal,
) {
    let id = port.id();
    let device = match NetDevice::new(Arc::clone(switch), Arc::clone(port)) {
        Ok(d) => d,
        Err(e) => return refuse(id, &format!("cannot create the device: {e}")),
    };
    let memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut daemon =
        match VhostUserDaemon::new(format!("svnic-port-{}", id.0), device.clone(), memory) {
            Ok(d) => d,
            Err(e) => {
                device.close_leaked_exit_fds();
                return refuse(id, &format!("cannot create the daemon: {e}"));
            }
        };
    for handler in daemon.get_epoll_handlers() {
        if let Err(e) =
            handler.register_listener(device.wake_fd(), EventSet::IN, u64::from(WAKE_EVENT))
        {
            drop(daemon);
            device.close_leaked_exit_fds();
            return refuse(id, &format!("cannot watch the wake event: {e}"));
        }
    }
    // Queue a connection on the rendezvous socket, then let the daemon accept it.
    match UnixStream::connect(&rendezvous.path) {
        Err(e) => warn!("{id}: cannot reach the daemon's rendezvous socket: {e}"),
        Ok(daemon_side) => match daemon.start(&mut rendezvous.listener) {
            Err(e) => warn!("{id}: the daemon cannot accept its connection: {e}"),
            Ok(()) => run_connection(id, &device, &mut daemon, frontend, daemon_side, stop),
        },
    }
    // Dropping the daemon stops and joins its vring worker; only then does the device tell
    // the daemon that memory and link are gone, and release the memory.
    drop(daemon);
    device.disconnected();
    device.close_leaked_exit_fds();
}

/// Relays between the frontend and the started daemon until the connection ends, and says how
/// it ended.
fn run_connection(
    id: PortId,
    device: &NetDevice,
    daemon: &mut VhostUserDaemon<NetDevice>,
    frontend: UnixStream,
    daemon_side: UnixStream,
    stop: &StopSignal,
) {
    let relay = match Relay::spawn(id, frontend, daemon_side) {
        Ok(relay) => relay,
        Err(e) => {
            // The daemon's peer is gone with the failed relay: it ends at once.
            warn!("{id}: cannot start the relay: {e}");
            let _ = daemon.wait();
            return;
        }
    };
    log_limited!(Level::Info, "{id}: frontend connected");
    let ticket = daemon.shutdown_handle().map(|conn| {
        device.attach_connection(conn.clone());
        stop.track(conn)
    });
    let served = daemon.wait();
    if let Some(ticket) = ticket {
        stop.untrack(ticket);
    }
    // The relay ends by itself once the daemon has (its write timeout bounds that); on stop,
    // end it at once, even if a frontend that does not read keeps it writing.
    if stop.is_stopped() {
        relay.shutdown();
    }
    // Frontends control how often connections end: these lines are rate-limited.
    match (relay.join(), served) {
        (Err(e), _) => log_limited!(Level::Warn, "{id}: frontend connection ended: {e}"),
        (Ok(()), Ok(()) | Err(DaemonError::HandleRequest(VhostUserError::Disconnected))) => {
            log_limited!(Level::Info, "{id}: frontend disconnected")
        }
        (Ok(()), Err(e)) => log_limited!(Level::Warn, "{id}: frontend connection ended: {e}"),
    }
}

impl Drop for PortListener {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Logs why a frontend is not served; dropping its stream closes it.
fn refuse(port: PortId, why: &str) {
    warn!("{port}: refusing a frontend: {why}");
}

/// Binds `socket` and serves `port` on a new thread until `stop` is raised; the socket file is
/// removed when the listener ends.
pub fn serve_port(
    switch: Arc<Switch>,
    port: PortId,
    socket: impl AsRef<Path>,
    stop: &StopSignal,
) -> Result<JoinHandle<()>, ListenerError> {
    if switch.port(port).is_none() {
        return Err(ListenerError::UnknownPort(port));
    }
    PortListener::bind(socket)?.spawn(switch, port, stop.clone())
}
