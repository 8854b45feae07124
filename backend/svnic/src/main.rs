//! `svnic`: the host daemon (`serve`), its operator view (`ctl`), and the demo (`demo`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use svnic_backend::admin::{query, render, AdminRequest};
use svnic_backend::config::{DaemonConfig, EngineOverrides, UplinkOverrides, DEFAULT_ADMIN_SOCKET};
use svnic_backend::daemon::{block_termination_signals, wait_for_termination, AdminSocket, Daemon};
use svnic_backend::Placement;
use svnic_guest_tools::demo::{run_demo, DemoOptions};

/// `--guest`'s help (a string, not a doc comment: rustdoc would read its brackets as links).
const GUEST_HELP: &str = "A guest: name=NAME,socket=PATH,mac=MAC[,endpoints=A-B][,channels=N]
[,max_region_mib=M][,create_burst=N][,creates_per_sec=N][,socket_mode=0600]
[,socket_group=GID][,allow_uids=UID,UID...]. The socket's directory must be owned by this
user or root and not writable by others unless sticky (/tmp is fine); socket_mode (default
0600) and socket_group decide who may connect, and allow_uids, if given, refuses frontends
of any other uid. create_burst and creates_per_sec bound its channel creates (default 64
at once, 200 per second).";

/// `--pool`'s help.
const POOL_HELP: &str = "A guest pool: name=NAME,socket=PATH,macs=RANGE,max=N with the optional
policy and socket fields of --guest (endpoints, channels, max_region_mib, create_burst,
creates_per_sec, socket_mode, socket_group, allow_uids). Every process that connects to
the socket becomes a guest of its own, named NAME-OFFSET, with the lowest free MAC of RANGE
(BASE/LEN: from BASE to the end of its LEN-bit prefix, e.g. 52:54:00:10:00:00/24; or
FIRST-LAST); when it disconnects its guest, channels and MAC are released. At most N (up
to 1024) at once: further connections are closed at once and counted (svnic ctl pools).";

#[derive(Parser)]
#[command(
    name = "svnic",
    version,
    about = "svnic: a self-virtualized NIC for virtual machines (vhost-user backend)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `svnic serve`'s uplink settings.
#[derive(clap::Args)]
struct UplinkArgs {
    /// The host interface to reach guests on other hosts through (docs/wire.md).
    #[arg(long, value_name = "IFACE")]
    uplink: Option<String>,
    /// How long a peer engine may acknowledge nothing before its senders' messages fail
    /// [default: 2000].
    #[arg(long, value_name = "MS")]
    uplink_peer_timeout_ms: Option<u64>,
    /// For tests: drop, duplicate and reorder these fractions of uplink frames
    /// (drop=F,duplicate=F,reorder=F[,seed=N]).
    #[arg(long, value_name = "SPEC")]
    uplink_fault: Option<String>,
}

// `serve` carries most options; the command is parsed once, so its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Serve guests, each on its own vhost-user socket, and guest pools until SIGINT/SIGTERM.
    Serve {
        /// TOML configuration file (guests and engine settings).
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(
            long = "guest",
            value_name = "SPEC",
            help = GUEST_HELP,
        )]
        guests: Vec<String>,
        #[arg(
            long = "pool",
            value_name = "SPEC",
            help = POOL_HELP,
        )]
        pools: Vec<String>,
        /// Engine worker threads.
        #[arg(long)]
        workers: Option<usize>,
        /// TX messages per channel per worker pass.
        #[arg(long)]
        poll_budget: Option<u32>,
        /// DMA-data bytes per channel per worker pass, in KiB (a larger message is copied in
        /// pieces of this size, one per pass).
        #[arg(long, value_name = "KIB")]
        byte_budget_kib: Option<u64>,
        /// How long a message may wait for room before its sender gets an error completion.
        #[arg(long, value_name = "MS")]
        backpressure_wait_ms: Option<u64>,
        /// How a new channel is assigned to a worker [default: endpoint-hash].
        #[arg(long, value_enum)]
        placement: Option<PlacementArg>,
        /// Pin worker i to CPU i (and tell clients which CPU serves them).
        #[arg(long)]
        pin_workers: bool,
        /// Idle passes a worker spins before it yields the CPU [default: 2000]; 0 when it
        /// shares its CPU with the guests it serves.
        #[arg(long, value_name = "N")]
        spin_passes: Option<u32>,
        /// Idle passes (spinning, then yielding) before a worker sleeps [default: 4000].
        #[arg(long, value_name = "N")]
        idle_passes: Option<u32>,
        /// The operator socket for `svnic ctl` [default: /run/svnic/admin.sock; /run/svnic is
        /// created 0700 if missing].
        #[arg(long, value_name = "PATH")]
        admin_socket: Option<PathBuf>,
        /// The admin socket's mode (octal) [default: 0600].
        #[arg(long, value_name = "MODE")]
        admin_socket_mode: Option<String>,
        /// A uid allowed on the admin socket besides this daemon's own and root (repeatable).
        #[arg(long = "admin-allow-uid", value_name = "UID")]
        admin_allow_uids: Vec<u32>,
        #[command(flatten)]
        uplink: UplinkArgs,
    },
    /// Ask a running daemon: guests, pools, channels, or engine counters.
    Ctl {
        /// What to show.
        #[arg(value_enum)]
        what: CtlWhat,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The daemon's operator socket.
        #[arg(long, value_name = "PATH", default_value = DEFAULT_ADMIN_SOCKET)]
        admin_socket: PathBuf,
    },
    /// Start the backend and two host-process guests, and compare the bypass channel with the
    /// virtio-net path of the same backend (round trip and throughput).
    Demo {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Round trips per latency measurement.
        #[arg(long, default_value_t = 2000)]
        rounds: usize,
        /// Messages per throughput measurement over the channel.
        #[arg(long, default_value_t = 2_000_000)]
        messages: u64,
        /// Engine worker threads.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Do not pin the engine worker and the guests to different CPUs.
        #[arg(long)]
        no_pin: bool,
    },
}

/// `--placement`: the engine's [`Placement`].
#[derive(Clone, Copy, Debug, ValueEnum)]
enum PlacementArg {
    /// A hash of the endpoint picks the worker: an endpoint always lands on the same worker.
    EndpointHash,
    /// The worker serving the fewest channels.
    LeastLoaded,
}

impl From<PlacementArg> for Placement {
    fn from(p: PlacementArg) -> Self {
        match p {
            PlacementArg::EndpointHash => Placement::EndpointHash,
            PlacementArg::LeastLoaded => Placement::LeastLoaded,
        }
    }
}

/// `svnic ctl <what>`: one [`AdminRequest`] each.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum CtlWhat {
    /// Every configured guest and pool member: MACs, socket, connection, channels.
    Guests,
    /// Every guest pool: MAC range, members live, connections accepted and refused.
    Pools,
    /// Every channel the daemon remembers, live and recently ended.
    Channels,
    /// Engine-wide counters: workers, frames, creates.
    Engine,
    /// The uplink's counters, per worker: frames, protocol, drops (docs/wire.md).
    Uplink,
}

impl From<CtlWhat> for AdminRequest {
    fn from(w: CtlWhat) -> Self {
        match w {
            CtlWhat::Guests => AdminRequest::Guests,
            CtlWhat::Pools => AdminRequest::Pools,
            CtlWhat::Channels => AdminRequest::Channels,
            CtlWhat::Engine => AdminRequest::Engine,
            CtlWhat::Uplink => AdminRequest::Uplink,
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match Cli::parse().command {
        Command::Serve {
            config,
            guests,
            pools,
            workers,
            poll_budget,
            byte_budget_kib,
            backpressure_wait_ms,
            placement,
            pin_workers,
            spin_passes,
            idle_passes,
            admin_socket,
            admin_socket_mode,
            admin_allow_uids,
            uplink,
        } => {
            let uplink = UplinkOverrides {
                iface: uplink.uplink,
                peer_timeout_ms: uplink.uplink_peer_timeout_ms,
                fault: uplink.uplink_fault,
            };
            let overrides = EngineOverrides {
                workers,
                poll_budget,
                byte_budget_kib,
                backpressure_wait_ms,
                pin_workers,
                placement: placement.map(Placement::from),
                spin_passes,
                idle_passes,
            };
            let loaded = DaemonConfig::load_with_pools(
                config.as_deref(),
                &guests,
                &pools,
                &overrides,
                admin_socket,
            )
            .and_then(|mut c| {
                c.override_admin(admin_socket_mode.as_deref(), &admin_allow_uids)?;
                c.override_uplink(&uplink)?;
                Ok(c)
            });
            let cfg = match loaded {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("svnic serve: {e}");
                    return ExitCode::from(2);
                }
            };
            block_termination_signals();
            let daemon = match Daemon::start(&cfg, AdminSocket::Serve) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("svnic serve: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let sig = wait_for_termination();
            log::info!("signal {sig}: shutting down");
            daemon.shutdown();
            ExitCode::SUCCESS
        }
        Command::Ctl {
            what,
            json,
            admin_socket,
        } => match query(&admin_socket, AdminRequest::from(what)) {
            Ok(resp) => {
                if json {
                    match serde_json::to_string_pretty(&resp) {
                        Ok(s) => println!("{s}"),
                        Err(e) => {
                            eprintln!("svnic ctl: {e}");
                            return ExitCode::FAILURE;
                        }
                    }
                } else {
                    print!("{}", render(&resp));
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("svnic ctl: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Demo {
            json,
            rounds,
            messages,
            workers,
            no_pin,
        } => {
            match run_demo(&DemoOptions {
                rounds,
                messages,
                workers,
                pin: !no_pin,
                cpus: 0,
            }) {
                Ok(report) => {
                    if json {
                        println!("{}", report.to_json());
                    } else {
                        print!("{}", report.to_table());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("svnic demo: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
