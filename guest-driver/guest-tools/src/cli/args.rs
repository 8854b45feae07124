//! The command line of `svnic-guest` (clap derive).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// svnic-guest: round trips (ping/echo) and streaming (perf/sink) over an svnic channel
/// (user-data or DMA-data), virtio-net frames, or kernel UDP sockets — in a VM through
/// svnic-guestd (--agent), or as a host-process guest of the svnic daemon (--socket).
#[derive(Debug, Parser)]
#[command(name = "svnic-guest", version)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides it.
    #[arg(long, global = true, default_value = "warn")]
    pub log: String,
    /// Drop root first: run as this numeric user id (and group id), e.g. 65534, to show that
    /// channels need no privileges (the frame path does: it opens a packet socket).
    #[arg(long, global = true)]
    pub user: Option<u32>,
}

/// The tools.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Round trips to an `echo`: min/p50/p99.
    Ping(PingArgs),
    /// Answers a `ping`.
    Echo(EchoArgs),
    /// Streams messages to a `sink` (the sender's messages/s and bytes/s).
    Perf(PerfArgs),
    /// Receives a `perf` stream: messages/s and bytes/s as received.
    Sink(SinkArgs),
    /// Kills (SIGKILL) an application holding a channel and waits until its endpoint can be
    /// created again: the agent (or daemon) destroyed the dead application's channel.
    CrashTest(CrashTestArgs),
}

/// Which path a measurement takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PathKind {
    /// Channel user-data (payload inline in the 64-byte message, at most 40 bytes).
    User,
    /// Channel DMA-data (payload in the data area, copied by the engine into a posted buffer).
    Dma,
    /// Raw Ethernet frames through the NIC's virtio-net queues (EtherType 0x88b6).
    Frame,
    /// Kernel UDP sockets (in a VM: the guest kernel's stack on the same NIC).
    Udp,
}

impl PathKind {
    /// The name used in output.
    pub fn name(self) -> &'static str {
        match self {
            PathKind::User => "user",
            PathKind::Dma => "dma",
            PathKind::Frame => "frame",
            PathKind::Udp => "udp",
        }
    }

    /// The default message size of the path.
    pub fn default_size(self) -> usize {
        match self {
            PathKind::Dma => 4096,
            _ => 32,
        }
    }
}

/// Options every tool takes.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Host-process mode: this guest's vhost-user socket on the svnic daemon.
    #[arg(long, conflicts_with = "agent")]
    pub socket: Option<PathBuf>,
    /// VM mode: svnic-guestd's socket [default: /run/svnic/agent.sock].
    #[arg(long)]
    pub agent: Option<PathBuf>,
    /// The path to measure.
    #[arg(long, value_enum, default_value_t = PathKind::User)]
    pub path: PathKind,
    /// This side's channel endpoint (user, dma).
    #[arg(long, default_value_t = 1)]
    pub endpoint: u32,
    /// Slots per channel ring (user, dma).
    #[arg(long, default_value_t = 256)]
    pub ring_size: u32,
    /// VM mode, frame path: the svnic NIC [default: the interface driven by virtio_net].
    #[arg(long)]
    pub iface: Option<String>,
    /// Host-process mode: guest memory, MiB.
    #[arg(long, default_value_t = 64)]
    pub memory_mib: u64,
    /// Busy polls before a waiting channel client starts yielding the CPU.
    #[arg(long, default_value_t = 100)]
    pub spins: u32,
    /// Yielding polls before a waiting channel client sleeps until woken.
    #[arg(long, default_value_t = 100_000)]
    pub yields: u32,
    /// Seconds to wait for the agent or daemon socket, and for the peer.
    #[arg(long, default_value_t = 30)]
    pub wait: u64,
    /// Print one JSON object on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

impl Common {
    /// How long to wait for the peer (`--wait`).
    pub fn wait(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.wait)
    }

    /// The transport, as reports name it: `host-process` (`--socket`) or `vm` (the agent).
    pub fn mode(&self) -> &'static str {
        if self.socket.is_some() {
            "host-process"
        } else {
            "vm"
        }
    }

    /// The report of `tool` run with these options: `size` bytes per message, `count` asked
    /// for, between `local` and `peer` (if this side named it).
    pub fn report(
        &self,
        tool: &'static str,
        (size, count): (usize, u64),
        local: String,
        peer: Option<String>,
        outcome: super::Outcome,
    ) -> super::Report {
        super::Report {
            tool,
            mode: self.mode(),
            path: self.path,
            size,
            count,
            local,
            peer,
            outcome,
        }
    }
}

/// Where a sending tool (ping, perf) sends, and how much per message.
#[derive(Debug, Args)]
pub struct Target {
    /// The responder (ping: an echo, perf: a sink): MAC/ENDPOINT (user, dma), MAC (frame),
    /// IP:PORT (udp).
    #[arg(long)]
    pub peer: String,
    /// Payload bytes per message [default: 32; dma 4096; user at most 40].
    #[arg(long)]
    pub size: Option<usize>,
}

/// `svnic-guest ping`.
#[derive(Debug, Args)]
pub struct PingArgs {
    /// Common options.
    #[command(flatten)]
    pub common: Common,
    /// The echo to ping, and what to send it.
    #[command(flatten)]
    pub target: Target,
    /// Round trips.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
}

/// `svnic-guest echo`.
#[derive(Debug, Args)]
pub struct EchoArgs {
    /// Common options.
    #[command(flatten)]
    pub common: Common,
    /// Messages to answer (the ping's --count).
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// udp: the address to listen on.
    #[arg(long, default_value = "0.0.0.0:7777")]
    pub listen: SocketAddr,
}

/// `svnic-guest perf`.
#[derive(Debug, Args)]
pub struct PerfArgs {
    /// Common options.
    #[command(flatten)]
    pub common: Common,
    /// The sink to stream to, and what to send it.
    #[command(flatten)]
    pub target: Target,
    /// Messages to send.
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
}

/// `svnic-guest sink`.
#[derive(Debug, Args)]
pub struct SinkArgs {
    /// Common options.
    #[command(flatten)]
    pub common: Common,
    /// Messages to receive (the perf's --count; frame/udp may lose some).
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
    /// dma: bytes per posted buffer (at least the perf's --size) [default: 4096].
    #[arg(long)]
    pub size: Option<usize>,
    /// udp: the address to listen on.
    #[arg(long, default_value = "0.0.0.0:7777")]
    pub listen: SocketAddr,
    /// frame, udp: stop when nothing arrived for this long once the stream began, ms.
    #[arg(long, default_value_t = 2000)]
    pub idle_ms: u64,
}

/// `svnic-guest crash-test`.
#[derive(Debug, Args)]
pub struct CrashTestArgs {
    /// Common options (--endpoint is the endpoint the killed application holds; user path).
    #[command(flatten)]
    pub common: Common,
}
