//! Guest pools in the daemon: one listening socket per pool; every connection it accepts becomes
//! a guest of its own (an engine guest with the pool's policy, a switch port, a vhost-user device
//! serving that connection) with the lowest free MAC of the pool's range. When the connection
//! ends, the guest, its port, its channels and its MAC are released. At `max` live members a
//! further connection is closed at once and counted.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use log::{info, warn, Level};
use svnic_channels::MacAddr;
use svnic_control_plane::{log_limited, GuestId};
use thiserror::Error;

use crate::config::PoolConfig;
use crate::engine::Engine;
use crate::frame_handler::FrameHandler;
use crate::net::listener::{serve_connection, Rendezvous};
use crate::net::{ListenerError, PortListener, StopSignal, Switch, SwitchPort};
use crate::sockets::peer_credentials;

/// Why a pool could not start.
#[derive(Debug, Error)]
pub enum PoolError {
    /// Its socket could not be bound.
    #[error("pool '{name}': {source}")]
    Socket {
        /// The pool.
        name: String,
        /// The cause.
        #[source]
        source: ListenerError,
    },
    /// Its listener thread could not be started.
    #[error("pool '{name}': cannot start its listener thread: {source}")]
    Spawn {
        /// The pool.
        name: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// One live member of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its engine guest and switch port.
    pub id: GuestId,
    /// Its guest name (`POOL-OFFSET`).
    pub name: String,
    /// Its MAC.
    pub mac: MacAddr,
    /// The connecting process, as the kernel recorded it at connect (none if unreadable).
    pub pid: Option<i32>,
    /// Its uid.
    pub uid: Option<u32>,
}

/// A pool's members and counters, shared by its listener and the operator view.
#[derive(Debug)]
pub struct Pool {
    config: PoolConfig,
    /// Live members by MAC offset.
    members: Mutex<BTreeMap<u64, Member>>,
    accepted: AtomicU64,
    refused_full: AtomicU64,
    refused_peers: Arc<AtomicU64>,
}

/// A snapshot of a pool's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Members live now.
    pub live: usize,
    /// Connections that became members, since start.
    pub accepted: u64,
    /// Connections closed at once because the pool was full.
    pub refused_full: u64,
    /// Connections refused by the socket's uid allow-list.
    pub refused_peers: u64,
}

impl Pool {
    /// The pool's configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Its live members, by MAC.
    pub fn members(&self) -> Vec<Member> {
        self.lock().values().cloned().collect()
    }

    /// Its counters.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            live: self.lock().len(),
            accepted: self.accepted.load(Ordering::Relaxed),
            refused_full: self.refused_full.load(Ordering::Relaxed),
            refused_peers: self.refused_peers.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a pool's members are made of and served by.
#[derive(Clone)]
pub(crate) struct PoolContext {
    /// Registers members as guests.
    pub(crate) engine: Engine,
    /// Gets a port per member.
    pub(crate) switch: Arc<Switch>,
    /// Wakes members' sleeping clients.
    pub(crate) frame_handler: Arc<FrameHandler>,
    /// Ends the listener and every member's connection.
    pub(crate) stop: StopSignal,
}

/// Binds the pool's socket (under the rules of guest sockets) and serves it on a thread of its
/// own until `ctx.stop` is raised; that thread ends after every member it started has been
/// released.
pub(crate) fn start(
    config: &PoolConfig,
    ctx: PoolContext,
) -> Result<(Arc<Pool>, JoinHandle<()>), PoolError> {
    let name = config.name.clone();
    let listener = PortListener::bind_with(&config.socket, &config.access).map_err(|source| {
        PoolError::Socket {
            name: name.clone(),
            source,
        }
    })?;
    let pool = Arc::new(Pool {
        config: config.clone(),
        members: Mutex::new(BTreeMap::new()),
        accepted: AtomicU64::new(0),
        refused_full: AtomicU64::new(0),
        refused_peers: listener.refused_peers(),
    });
    let served = Arc::clone(&pool);
    let thread = std::thread::Builder::new()
        .name(format!("svnic-pool-{name}"))
        .spawn(move || serve(&served, &listener, &ctx))
        .map_err(|source| PoolError::Spawn { name, source })?;
    Ok((pool, thread))
}

/// The pool's name in log lines.
struct PoolName<'a>(&'a str);

impl std::fmt::Display for PoolName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pool '{}'", self.0)
    }
}

fn serve(pool: &Arc<Pool>, listener: &PortListener, ctx: &PoolContext) {
    let name = PoolName(&pool.config.name);
    info!(
        "{name}: socket {} ready, MACs {}, at most {} guests",
        pool.config.socket.display(),
        pool.config.macs,
        pool.config.max
    );
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    let accepted = listener.accept_each(&ctx.stop, &name, |frontend| {
        threads.retain(|t| !t.is_finished());
        if let Some(t) = admit(pool, ctx, frontend) {
            threads.push(t);
        }
        ControlFlow::Continue(())
    });
    if let Err(e) = accepted {
        warn!("{name}: waiting for connections failed: {e}");
    }
    for t in threads {
        let _ = t.join();
    }
    info!("{name}: listener stopped");
}

/// Makes `frontend` a member and serves it on a thread of its own, or closes it (pool full, or
/// the guest could not be set up).
fn admit(pool: &Arc<Pool>, ctx: &PoolContext, frontend: UnixStream) -> Option<JoinHandle<()>> {
    let name = PoolName(&pool.config.name);
    let (pid, uid) = match peer_credentials(&frontend) {
        Ok(cred) => (Some(cred.pid), Some(cred.uid)),
        Err(_) => (None, None),
    };
    let (offset, port) = {
        let mut members = pool.lock();
        if members.len() >= pool.config.max as usize {
            pool.refused_full.fetch_add(1, Ordering::Relaxed);
            log_limited!(
                Level::Warn,
                "{name}: refusing a connection (pid {}): all {} guests are taken",
                pid.map_or_else(|| "?".to_string(), |p| p.to_string()),
                pool.config.max
            );
            return None;
        }
        // Fewer than `max` members, and `max` is at most the range's size: an offset is free.
        let offset = (0..pool.config.macs.len()).find(|o| !members.contains_key(o))?;
        let (member, port) = match add_guest(pool, ctx, offset, pid, uid) {
            Ok(added) => added,
            Err(e) => {
                log_limited!(Level::Warn, "{name}: refusing a connection: {e}");
                return None;
            }
        };
        members.insert(offset, member);
        (offset, port)
    };
    pool.accepted.fetch_add(1, Ordering::Relaxed);
    let (served, ctx2) = (Arc::clone(pool), ctx.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("svnic-member-{}", port.id().0))
        .spawn(move || {
            serve_member(&served, &ctx2, &port, frontend);
            release(&served, &ctx2, offset);
        });
    match spawned {
        Ok(t) => Some(t),
        Err(e) => {
            log_limited!(Level::Warn, "{name}: cannot start a guest's thread: {e}");
            release(pool, ctx, offset);
            None
        }
    }
}

/// Registers the member at MAC `offset` with the engine and the switch.
fn add_guest(
    pool: &Pool,
    ctx: &PoolContext,
    offset: u64,
    pid: Option<i32>,
    uid: Option<u32>,
) -> Result<(Member, Arc<SwitchPort>), String> {
    let outside = || format!("MAC offset {offset} is outside {}", pool.config.macs);
    let mac = pool.config.macs.get(offset).ok_or_else(outside)?;
    let policy = pool.config.member_policy(offset).ok_or_else(outside)?;
    let name = policy.name.clone();
    let id = ctx
        .engine
        .register_guest(policy, None)
        .map_err(|e| e.to_string())?;
    let added = ctx
        .engine
        .set_guest_waker(id, Some(ctx.frame_handler.waker(id, mac)))
        .map_err(|e| e.to_string())
        .and_then(|()| ctx.switch.add_port(id, &[mac]).map_err(|e| e.to_string()));
    let port = match added {
        Ok(port) => port,
        Err(e) => {
            let _ = ctx.engine.remove_guest(id);
            return Err(e);
        }
    };
    // Connecting processes decide how often this happens: rate-limited, as are the releases.
    log_limited!(
        Level::Info,
        "pool '{}': guest '{name}' ({id}, {mac}) for pid {}",
        pool.config.name,
        pid.map_or_else(|| "?".to_string(), |p| p.to_string())
    );
    let member = Member {
        id,
        name,
        mac,
        pid,
        uid,
    };
    Ok((member, port))
}

/// Serves the member's connection until it ends.
fn serve_member(pool: &Pool, ctx: &PoolContext, port: &Arc<SwitchPort>, frontend: UnixStream) {
    match Rendezvous::new() {
        Ok(mut rendezvous) => {
            serve_connection(&mut rendezvous, &ctx.switch, port, frontend, &ctx.stop)
        }
        Err(e) => log_limited!(
            Level::Warn,
            "pool '{}': {}: {e}",
            pool.config.name,
            port.id()
        ),
    }
}

/// Releases the member at `offset`: its port, its guest (and any channel left), then its MAC.
fn release(pool: &Pool, ctx: &PoolContext, offset: u64) {
    let Some(id) = pool.lock().get(&offset).map(|m| m.id) else {
        return;
    };
    ctx.switch.remove_port(id);
    if let Err(e) = ctx.engine.remove_guest(id) {
        warn!("pool '{}': {id}: {e}", pool.config.name);
    }
    pool.lock().remove(&offset);
    log_limited!(Level::Info, "pool '{}': {id} released", pool.config.name);
}
