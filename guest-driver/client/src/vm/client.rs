//! [`AgentClient`]: an application's connection to `svnic-guestd`, giving the same [`Channel`]
//! API as host-process mode. Unprivileged: it needs only the agent's socket.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use svnic_channels::layout::{MAX_REGION_LEN, PAGE as PAGE_SIZE};
use svnic_channels::{ChannelId, EndpointId, MacAddr};
use thiserror::Error;

use super::event::Event;
use super::mapping::Mapping;
use super::protocol::{
    AgentFailure, ProtocolError, Request, Response, MAX_MESSAGE_LEN, REGION_FDS,
};
use super::seqpacket::SeqPacket;
use crate::channel::{Channel, ChannelError, Doorbell, OwnedChannelError, Waiter};

/// How long [`AgentClient::connect`] waits for the agent's Hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Responses for other requests kept while one request waits, before the connection is
/// declared broken (an agent that floods us is not one we can work with).
const STASH_LIMIT: usize = 1024;

/// Errors of the VM transport.
#[derive(Debug, Error)]
pub enum AgentError {
    /// A socket operation failed.
    #[error("agent socket {path}: {what}: {source}")]
    Io {
        /// The agent socket.
        path: String,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The agent sent something this client does not understand.
    #[error("agent socket {path}: {source}")]
    Protocol {
        /// The agent socket.
        path: String,
        /// What was wrong.
        #[source]
        source: ProtocolError,
    },
    /// The agent answered out of turn (a response of the wrong kind, wrong descriptors).
    #[error("agent socket {path}: unexpected answer: {what}")]
    Unexpected {
        /// The agent socket.
        path: String,
        /// What arrived.
        what: String,
    },
    /// The agent closed the connection.
    #[error("agent socket {0}: the agent closed the connection")]
    Disconnected(String),
    /// The agent (or the engine behind it) refused.
    #[error("refused: {reason}{}", if detail.is_empty() { String::new() } else { format!(" ({detail})") })]
    Refused {
        /// Why.
        reason: AgentFailure,
        /// The agent's explanation.
        detail: String,
    },
    /// No answer in time. A create that times out is abandoned: a channel created for it later
    /// is destroyed by this client.
    #[error("{what} not answered within {waited:?}")]
    Timeout {
        /// Which request.
        what: &'static str,
        /// How long we waited.
        waited: Duration,
    },
    /// The passed memory could not be mapped.
    #[error("cannot map the channel memory: {0}")]
    Map(#[source] std::io::Error),
    /// The channel was not usable once created, or is not this client's.
    #[error(transparent)]
    Channel(#[from] OwnedChannelError),
}

/// What the agent said in its Hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentInfo {
    /// The NIC's MAC: the MAC of every channel of this guest.
    pub mac: MacAddr,
    /// Length of each channel region.
    pub region_len: u64,
    /// Channels this application may hold.
    pub max_channels: u32,
}

#[derive(Debug)]
struct Incoming {
    resp: Response,
    fds: Vec<OwnedFd>,
}

#[derive(Debug, Default)]
struct Io {
    next_token: u32,
    stash: VecDeque<Incoming>,
    /// Requests nobody waits for any more: a late Success is destroyed, a late Region cancelled.
    abandoned: HashSet<u32>,
}

impl Io {
    fn fresh_token(&mut self) -> u32 {
        self.next_token = self.next_token.wrapping_add(1).max(1);
        self.next_token
    }
}

#[derive(Debug)]
struct Inner {
    sock: SeqPacket,
    path: PathBuf,
    info: AgentInfo,
    io: Mutex<Io>,
    wakes: Mutex<HashMap<u32, Arc<Event>>>,
    warned: AtomicBool,
}

/// A connection to the guest agent. Cheap to clone. The connection (and with it every channel
/// created through it) lives as long as the client or any of its channels: when the last one
/// goes, the agent destroys the channels with the engine and frees their memory.
#[derive(Debug, Clone)]
pub struct AgentClient {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn io_err(&self, what: &'static str, source: std::io::Error) -> AgentError {
        AgentError::Io {
            path: self.path.display().to_string(),
            what,
            source,
        }
    }

    fn send(&self, req: Request) -> Result<(), AgentError> {
        self.sock
            .send(&req.encode(), &[])
            .map_err(|e| self.io_err("send", e))
    }

    /// Receives and decodes one message (blocking until `deadline`); `None` on timeout.
    fn recv_one(&self, deadline: Instant) -> Result<Option<Incoming>, AgentError> {
        let now = Instant::now();
        let Some(left) = deadline
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
        else {
            return Ok(None);
        };
        if !self
            .sock
            .wait_readable(left)
            .map_err(|e| self.io_err("poll", e))?
        {
            return Ok(None);
        }
        let mut buf = [0u8; MAX_MESSAGE_LEN];
        let r = match self.sock.recv(&mut buf) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(self.io_err("receive", e)),
        };
        if r.len == 0 && r.fds.is_empty() {
            return Err(AgentError::Disconnected(self.path.display().to_string()));
        }
        let path = || self.path.display().to_string();
        if r.truncated {
            return Err(AgentError::Unexpected {
                path: path(),
                what: format!("a message longer than {MAX_MESSAGE_LEN} bytes"),
            });
        }
        let resp = Response::decode(&buf[..r.len]).map_err(|source| AgentError::Protocol {
            path: path(),
            source,
        })?;
        if r.fds.len() != resp.fd_count() {
            return Err(AgentError::Unexpected {
                path: path(),
                what: format!(
                    "{} descriptor(s) with {resp:?}, expected {}",
                    r.fds.len(),
                    resp.fd_count()
                ),
            });
        }
        Ok(Some(Incoming { resp, fds: r.fds }))
    }

    /// Deals with an answer to a request nobody waits for any more.
    fn settle_abandoned(&self, io: &mut Io, m: Incoming) -> Result<(), AgentError> {
        let token = m.resp.token();
        match m.resp {
            Response::Pending { .. } => {}
            Response::Region { .. } => {
                io.abandoned.remove(&token);
                self.send(Request::Cancel { token })?;
            }
            Response::Success { channel, .. } => {
                io.abandoned.remove(&token);
                let t = io.fresh_token();
                io.abandoned.insert(t);
                debug!("{channel} created for an abandoned request; destroying it");
                self.send(Request::Destroy { token: t, channel })?;
            }
            _ => {
                io.abandoned.remove(&token);
            }
        }
        Ok(())
    }

    /// The next answer to `token` (Pending included), until `deadline`.
    fn next_for(
        &self,
        io: &mut Io,
        token: u32,
        deadline: Instant,
    ) -> Result<Option<Incoming>, AgentError> {
        if let Some(pos) = io.stash.iter().position(|m| m.resp.token() == token) {
            return Ok(io.stash.remove(pos));
        }
        loop {
            let Some(m) = self.recv_one(deadline)? else {
                return Ok(None);
            };
            let t = m.resp.token();
            if t == token {
                return Ok(Some(m));
            }
            if io.abandoned.contains(&t) {
                self.settle_abandoned(io, m)?;
                continue;
            }
            if io.stash.len() >= STASH_LIMIT {
                return Err(AgentError::Unexpected {
                    path: self.path.display().to_string(),
                    what: format!("more than {STASH_LIMIT} answers nobody asked for"),
                });
            }
            io.stash.push_back(m);
        }
    }

    fn unexpected(&self, resp: &Response) -> AgentError {
        AgentError::Unexpected {
            path: self.path.display().to_string(),
            what: format!("{resp:?}"),
        }
    }
}

impl AgentClient {
    /// Connects to the agent at `path` (usually [`super::DEFAULT_AGENT_SOCKET`]) and reads its
    /// Hello.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, AgentError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |what, source| AgentError::Io {
            path: path.display().to_string(),
            what,
            source,
        };
        let sock = SeqPacket::connect(&path).map_err(|e| io_err("connect", e))?;
        let mut inner = Inner {
            sock,
            path: path.clone(),
            info: AgentInfo {
                mac: MacAddr([0; 6]),
                region_len: 0,
                max_channels: 0,
            },
            io: Mutex::new(Io::default()),
            wakes: Mutex::new(HashMap::new()),
            warned: AtomicBool::new(false),
        };
        let hello = inner.recv_one(Instant::now() + HELLO_TIMEOUT)?;
        match hello.map(|m| m.resp) {
            Some(Response::Hello {
                mac,
                region_len,
                max_channels,
            }) => {
                inner.info = AgentInfo {
                    mac,
                    region_len,
                    max_channels,
                };
            }
            Some(other) => return Err(inner.unexpected(&other)),
            None => {
                return Err(AgentError::Timeout {
                    what: "the agent's Hello",
                    waited: HELLO_TIMEOUT,
                })
            }
        }
        debug!(
            "connected to svnic-guestd at {} (NIC {}, {} byte regions)",
            path.display(),
            inner.info.mac,
            inner.info.region_len
        );
        Ok(AgentClient {
            inner: Arc::new(inner),
        })
    }

    /// What the agent said when we connected.
    pub fn info(&self) -> AgentInfo {
        self.inner.info
    }

    /// The NIC's MAC: the MAC of every channel created through the agent.
    pub fn mac(&self) -> MacAddr {
        self.inner.info.mac
    }

    /// Creates a channel at (the NIC's MAC, `endpoint`) with `ring_size` slots per ring and
    /// waits up to `timeout` for the engine: the agent passes the memory, this client maps it,
    /// the agent registers it with the engine. On timeout the request is abandoned (a channel
    /// the engine creates later is destroyed).
    pub fn create_channel(
        &self,
        endpoint: EndpointId,
        ring_size: u32,
        timeout: Duration,
    ) -> Result<Channel, AgentError> {
        let inner = &self.inner;
        let deadline = Instant::now() + timeout;
        let mut io = lock(&inner.io);
        let token = io.fresh_token();
        inner.send(Request::Create {
            token,
            endpoint,
            ring_size,
        })?;
        let timed_out = |io: &mut Io| {
            io.abandoned.insert(token);
            AgentError::Timeout {
                what: "channel create",
                waited: timeout,
            }
        };
        let Some(m) = inner.next_for(&mut io, token, deadline)? else {
            return Err(timed_out(&mut io));
        };
        let (region_len, fd_offset) = match m.resp {
            Response::Region {
                region_len,
                fd_offset,
                ..
            } => (region_len, fd_offset),
            Response::Failure { reason, detail, .. } => {
                return Err(AgentError::Refused { reason, detail })
            }
            other => return Err(inner.unexpected(&other)),
        };
        let mut fds = m.fds.into_iter();
        let (Some(mem), Some(wake), Some(doorbell)) = (fds.next(), fds.next(), fds.next()) else {
            return Err(inner.unexpected(&Response::Region {
                token,
                region_len,
                fd_offset,
            }));
        };
        let mapping = match map_region(mem, fd_offset, region_len) {
            Ok(m) => m,
            Err(e) => {
                inner.send(Request::Cancel { token })?;
                return Err(e);
            }
        };
        inner.send(Request::Mapped { token })?;
        let (channel, addr) = loop {
            let Some(m) = inner.next_for(&mut io, token, deadline)? else {
                return Err(timed_out(&mut io));
            };
            match m.resp {
                Response::Pending { .. } => continue,
                Response::Success { channel, addr, .. } => break (channel, addr),
                Response::Failure { reason, detail, .. } => {
                    return Err(AgentError::Refused { reason, detail })
                }
                other => return Err(inner.unexpected(&other)),
            }
        };
        let wake = Arc::new(Event::from_fd(wake));
        let bell = Arc::new(EventDoorbell {
            event: Event::from_fd(doorbell),
            conn: inner.clone(),
        });
        let attached = Channel::attach(mapping.into_region(), addr, bell).and_then(|ch| {
            if ch.id() == channel.0 {
                Ok(ch)
            } else {
                Err(ChannelError::WrongChannel {
                    header: ch.id(),
                    answer: channel.0,
                })
            }
        });
        match attached {
            Ok(ch) => {
                lock(&inner.wakes).insert(channel.0, wake);
                info!("{channel} created at {addr} through the agent");
                Ok(ch)
            }
            Err(source) => {
                let t = io.fresh_token();
                io.abandoned.insert(t);
                inner.send(Request::Destroy { token: t, channel })?;
                Err(OwnedChannelError::Attach { channel, source }.into())
            }
        }
    }

    /// Destroys `channel`: the agent asks the engine, waits for its acknowledgement, frees the
    /// memory, and then answers.
    pub fn destroy_channel(&self, channel: Channel, timeout: Duration) -> Result<(), AgentError> {
        let inner = &self.inner;
        let id = ChannelId(channel.id());
        if lock(&inner.wakes).remove(&id.0).is_none() {
            return Err(OwnedChannelError::Unknown(id).into());
        }
        drop(channel);
        let deadline = Instant::now() + timeout;
        let mut io = lock(&inner.io);
        let token = io.fresh_token();
        inner.send(Request::Destroy { token, channel: id })?;
        loop {
            let Some(m) = inner.next_for(&mut io, token, deadline)? else {
                io.abandoned.insert(token);
                return Err(AgentError::Timeout {
                    what: "channel destroy",
                    waited: timeout,
                });
            };
            match m.resp {
                Response::Pending { .. } => continue,
                Response::Destroyed { .. } => {
                    info!("{id} destroyed through the agent");
                    return Ok(());
                }
                Response::Failure { reason, detail, .. } => {
                    return Err(AgentError::Refused { reason, detail })
                }
                other => return Err(inner.unexpected(&other)),
            }
        }
    }

    /// A [`Waiter`] for `channel`: blocks until the agent relays the engine's Wake frame.
    pub fn waiter(&self, channel: &Channel) -> Result<AgentWaiter, AgentError> {
        let id = channel.id();
        let event = lock(&self.inner.wakes)
            .get(&id)
            .cloned()
            .ok_or(OwnedChannelError::Unknown(ChannelId(id)))?;
        Ok(AgentWaiter {
            event,
            conn: self.inner.clone(),
        })
    }
}

fn map_region(mem: OwnedFd, fd_offset: u64, len: u64) -> Result<Mapping, AgentError> {
    if len == 0 || len > MAX_REGION_LEN || len % PAGE_SIZE != 0 || fd_offset % PAGE_SIZE != 0 {
        return Err(AgentError::Map(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("region {fd_offset:#x}+{len:#x} is not a 4 KiB-aligned channel region"),
        )));
    }
    Mapping::map_shared(mem.as_fd(), fd_offset, len as usize, true).map_err(AgentError::Map)
}

fn warn_once(conn: &Inner, what: &str, e: &std::io::Error) {
    if !conn.warned.swap(true, Ordering::Relaxed) {
        warn!("{what}: {e} (further failures are not logged)");
    }
}

/// Rings a channel's doorbell by signalling the eventfd the agent watches; the agent sends the
/// Doorbell frame. Holds the connection open.
#[derive(Debug)]
struct EventDoorbell {
    event: Event,
    conn: Arc<Inner>,
}

impl Doorbell for EventDoorbell {
    fn ring(&self, _channel_id: u32) {
        if let Err(e) = self.event.signal() {
            warn_once(&self.conn, "doorbell", &e);
        }
    }
}

/// Blocks until the agent relays a Wake frame for one channel (or the timeout passes). A wake
/// that arrived before the wait ends it at once (the eventfd keeps it).
#[derive(Debug, Clone)]
pub struct AgentWaiter {
    event: Arc<Event>,
    conn: Arc<Inner>,
}

impl AgentWaiter {
    /// Like [`Waiter::wait`], but says whether a wake came and reports errors.
    pub fn wait_for_wake(&self, timeout: Duration) -> std::io::Result<bool> {
        self.event.wait(timeout)
    }
}

impl Waiter for AgentWaiter {
    fn wait(&self, timeout: Duration) {
        if let Err(e) = self.event.wait(timeout) {
            warn_once(&self.conn, "channel waiter", &e);
            std::thread::sleep(timeout.min(Duration::from_millis(10)));
        }
    }
}

// REGION_FDS is what the protocol promises; the destructuring above takes exactly that many.
const _: () = assert!(REGION_FDS == 3);
