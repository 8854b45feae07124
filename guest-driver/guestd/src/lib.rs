//! # svnic-guestd: the guest agent (VM mode)
//!
//! In a VM the guest kernel's virtio-net driver owns the svnic NIC (eth0). The agent, running as
//! root, is the only process of the guest that sends control frames to the engine; everything
//! else asks it over a Unix socket ([`svnic_client::vm::protocol`]) and never needs privileges.
//!
//! ```text
//!  application ──(seqpacket: Create/Mapped/Destroy; SCM_RIGHTS: memory, wake, doorbell)──┐
//!  application ──┐                                                                       │
//!                ▼                                                                       ▼
//!   svnic-guestd: hugepage per channel, sealed + mlocked, GPA from /proc/self/pagemap
//!                │  control / doorbell frames (AF_PACKET, EtherType 0x88B5, to MacAddr::ENGINE)
//!                ▼
//!              eth0 ── virtio-net ── svnic backend: frame handler, engine (polls the rings)
//! ```
//!
//! - **Create**: the agent allocates one 2 MiB hugepage ([`memory`]), passes it to the
//!   application with a wake and a doorbell eventfd, waits for the application's `Mapped`,
//!   seals the memory (no truncation, no hole punching, no new writable mappings), reads its
//!   guest-physical address and sends a Create control frame. The engine's Pending, then
//!   Success or Failure, are relayed; a refused region is freed at once.
//! - **Doorbells**: the application signals its doorbell eventfd; the agent sends one Doorbell
//!   frame per signal batch. **Wakes**: a Wake frame from the engine signals the channel's wake
//!   eventfd.
//! - **Destroy**, asked for or because the application's connection closed (exit, crash):
//!   Destroy frame, then — only after the engine's Destroyed — the memory is freed and logged
//!   as `channel N destroyed by engine; memory 0x... freed`. A refused destroy keeps the memory
//!   for good. The request bookkeeping is the control client's
//!   ([`svnic_client::request_table::RequestTable`]).
//! - **Users**: every application's uid comes from `SO_PEERCRED`; each uid has quotas (channels,
//!   hugepage memory) charged until the engine acknowledged the destroy, and owns the endpoints
//!   reserved for it or that it holds ([`policy`]). The socket is only served from a directory
//!   others cannot change, with exactly the configured mode ([`SocketPathError`]).
//! - **Agent restarts**: the channels whose memory it holds are listed in a state file; a new
//!   agent destroys them before serving anyone (their pages went back to the hugepage pool,
//!   which only the agent allocates from).
//!
//! The NIC is a trait ([`nic::Nic`]) so that tests and in-process setups can replace the packet
//! socket; memory likewise ([`memory::MemoryBackend`]).

mod admission;
mod book;
pub mod daemon;
pub mod hugepages;
pub mod memory;
pub mod nic;
pub mod policy;
mod records;
mod recovery;
mod server;
mod socket_path;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use svnic_channels::ChannelId;
use thiserror::Error;

pub use daemon::{run_daemon, spawn_background, DaemonArgs};
pub use policy::{EndpointRange, UidLimits, UidUsage, UserPolicy};
pub use server::{Agent, AgentHandle};
pub use socket_path::SocketPathError;

/// Default path of the state file (channels whose memory the agent holds).
pub const DEFAULT_STATE_FILE: &str = "/run/svnic/agent.channels";
/// Events kept in [`AgentStatus::events`].
const EVENT_LOG: usize = 512;

/// Settings of the agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The application socket.
    pub socket: PathBuf,
    /// Its file mode (0o666: any local user may create channels).
    pub socket_mode: u32,
    /// Channels (held memory included) one application may have.
    pub max_channels_per_app: usize,
    /// Channels (held memory included) of all applications together.
    pub max_channels: usize,
    /// Per-uid quotas and endpoint reservations.
    pub users: UserPolicy,
    /// Where live channel ids are recorded for a restarted agent (None: not recorded).
    pub state_file: Option<PathBuf>,
    /// How long a shutdown waits for the engine to acknowledge the destroys.
    pub shutdown_wait: Duration,
    /// How long a start waits for the engine to acknowledge destroys of stale channels.
    pub recovery_wait: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            socket: PathBuf::from(svnic_client::vm::DEFAULT_AGENT_SOCKET),
            socket_mode: 0o666,
            max_channels_per_app: 16,
            max_channels: 64,
            users: UserPolicy::default(),
            state_file: Some(PathBuf::from(DEFAULT_STATE_FILE)),
            shutdown_wait: Duration::from_secs(5),
            recovery_wait: Duration::from_secs(3),
        }
    }
}

/// Errors that stop the agent.
#[derive(Debug, Error)]
pub enum AgentError {
    /// Setting up a socket, epoll or eventfd failed.
    #[error("{what}: {source}")]
    Setup {
        /// What was being set up.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The per-uid policy contradicts itself.
    #[error("per-uid policy: {0}")]
    Policy(#[from] policy::PolicyError),
    /// The socket path is not safe to serve on.
    #[error(transparent)]
    SocketPath(#[from] SocketPathError),
    /// The NIC could not be opened.
    #[error(transparent)]
    Nic(#[from] nic::NicError),
    /// Hugepages could not be reserved.
    #[error(transparent)]
    Hugepages(#[from] hugepages::HugepageError),
    /// Channel memory could not be set up.
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    /// The event loop failed.
    #[error("event loop: {0}")]
    Poll(#[source] std::io::Error),
}

/// Something that happened, in order (tests and operators read these from
/// [`AgentHandle::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentEvent {
    /// An application connected.
    AppConnected {
        /// Agent-local application id.
        app: u64,
        /// Its process id.
        pid: i32,
        /// Its user id (whose quota and endpoints it uses).
        uid: u32,
    },
    /// An application's connection closed with `channels` channels to destroy.
    AppGone {
        /// Application id.
        app: u64,
        /// Channels (live or being created) it left behind.
        channels: usize,
    },
    /// The engine created a channel for an application.
    Created {
        /// The channel.
        channel: ChannelId,
        /// Application id.
        app: u64,
        /// Guest-physical address of its memory.
        gpa: u64,
    },
    /// A Destroy frame was sent.
    DestroySent {
        /// The channel.
        channel: ChannelId,
    },
    /// The engine acknowledged a destroy.
    EngineDestroyed {
        /// The channel.
        channel: ChannelId,
    },
    /// Channel memory was freed.
    MemoryFreed {
        /// Guest-physical address.
        gpa: u64,
        /// The channel it belonged to (None: the engine refused to create it).
        channel: Option<ChannelId>,
    },
    /// The engine refused a destroy: the memory stays allocated for good.
    Quarantined {
        /// The channel.
        channel: ChannelId,
    },
    /// A stale channel of an earlier agent was destroyed at start.
    Recovered {
        /// The channel.
        channel: ChannelId,
    },
}

/// What the agent refused, by reason (counted since it started).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refusals {
    /// Application connections closed at once (too many, no peer credentials).
    pub connections: u64,
    /// Creates refused by a per-uid quota.
    pub quota: u64,
    /// Creates refused because the endpoint is reserved for, or held by, another uid.
    pub endpoint: u64,
    /// Creates refused for want of channel memory.
    pub no_memory: u64,
}

/// The agent's state as of its last loop iteration.
#[derive(Debug, Clone, Default)]
pub struct AgentStatus {
    /// Connected applications.
    pub apps: usize,
    /// Channels live in the engine on behalf of applications.
    pub live_channels: usize,
    /// Regions whose memory the agent holds for the engine (live, being created or destroyed,
    /// quarantined).
    pub held_regions: usize,
    /// Regions kept for good (destroy refused).
    pub quarantined: usize,
    /// Control requests not yet finally answered.
    pub outstanding: usize,
    /// Wake frames relayed to applications.
    pub wakes: u64,
    /// Doorbell frames sent.
    pub doorbells: u64,
    /// svnic frames ignored (malformed, not from the engine, unknown channel).
    pub ignored_frames: u64,
    /// What the agent refused, by reason.
    pub refused: Refusals,
    /// What each uid holding channel memory holds (charged until the memory is freed).
    pub users: BTreeMap<u32, UidUsage>,
    /// The loop has finished (stopped).
    pub stopped: bool,
    /// The last events, oldest first.
    pub events: VecDeque<AgentEvent>,
}
