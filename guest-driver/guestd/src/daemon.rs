//! `svnic-guestd` as a program: command line ([`DaemonArgs`]) -> [`AgentConfig`] -> the NIC,
//! the hugepage pool and the memory backend -> [`Agent::run`], stopped by SIGTERM/SIGINT/SIGHUP
//! (every channel is destroyed with the engine before it exits).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use clap::Parser;
use log::{info, warn};
use svnic_channels::frame::ETHERTYPE;

use super::hugepages::HugepagePool;
use super::memory::HugepageBackend;
use super::nic::{find_virtio_nic, PacketSocket};
use super::policy::{
    parse_endpoint_range, parse_uid_quota, EndpointRange, Limit, UidLimits, UserPolicy,
    DEFAULT_CHANNELS_PER_UID, DEFAULT_HUGEPAGES_PER_UID,
};
use super::{Agent, AgentConfig, AgentError, DEFAULT_STATE_FILE};
use svnic_client::vm::DEFAULT_AGENT_SOCKET;

/// svnic-guestd: the svnic guest agent. Runs as root in a VM whose NIC is an svnic virtio-net
/// device; creates channels for unprivileged applications (svnic-guest, or any program using
/// svnic_client::vm::AgentClient) over a Unix socket.
#[derive(Debug, Parser)]
#[command(name = "svnic-guestd", version)]
pub struct DaemonArgs {
    /// The svnic NIC [default: the interface driven by virtio_net].
    #[arg(long)]
    pub iface: Option<String>,
    /// Application socket.
    #[arg(long, default_value = DEFAULT_AGENT_SOCKET)]
    pub socket: PathBuf,
    /// File mode of the application socket, octal (666: every local user may create channels).
    #[arg(long, default_value = "666", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// Channels (one 2 MiB hugepage each) of all applications together.
    #[arg(long, default_value_t = 16)]
    pub max_channels: usize,
    /// Channels one application may hold.
    #[arg(long, default_value_t = 8)]
    pub max_channels_per_app: usize,
    /// Channels one user (uid) may hold, its applications together, counted until the engine
    /// acknowledged their destruction (a number or "unlimited"; root: unlimited unless given
    /// --quota-for-uid 0=...).
    #[arg(long, default_value_t = Limit(Some(DEFAULT_CHANNELS_PER_UID as u64)))]
    pub max_channels_per_uid: Limit,
    /// 2 MiB hugepages of channel memory one user (uid) may hold (a number or "unlimited").
    #[arg(long, default_value_t = Limit(Some(DEFAULT_HUGEPAGES_PER_UID)))]
    pub max_hugepages_per_uid: Limit,
    /// Limits of one uid instead of the two above, as UID=CHANNELS:HUGEPAGES (e.g. 1000=8:8,
    /// 0=16:16 to limit root); repeatable.
    #[arg(long, value_parser = parse_uid_quota)]
    pub quota_for_uid: Vec<(u32, UidLimits)>,
    /// Reserves endpoints FIRST..=LAST for one uid, as UID=FIRST-LAST (e.g. 1000=100-199);
    /// repeatable, ranges must not overlap. Other users' creates there are refused; endpoints
    /// outside every range go to the first user to claim them, until its channel is destroyed.
    #[arg(long, value_parser = parse_endpoint_range)]
    pub endpoints_for_uid: Vec<EndpointRange>,
    /// Free 2 MiB hugepages to make sure of at start, raising /proc/sys/vm/nr_hugepages if
    /// needed (0: leave the pool alone) [default: --max-channels].
    #[arg(long)]
    pub hugepages: Option<u64>,
    /// Where the ids of channels whose memory the agent holds are kept (a restarted agent
    /// destroys them first).
    #[arg(long, default_value = DEFAULT_STATE_FILE)]
    pub state_file: PathBuf,
    /// Keep no state file.
    #[arg(long)]
    pub no_state_file: bool,
    /// Work on kernels that cannot seal hugetlb memfds (an application could then free channel
    /// memory the engine still uses).
    #[arg(long)]
    pub allow_unsealed: bool,
    /// How long stopping waits for the engine to acknowledge the destroys, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub shutdown_wait_ms: u64,
    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides it.
    #[arg(long, default_value = "info")]
    pub log: String,
    /// Run in the background: start the agent detached (its log in --log-file) and exit 0 once
    /// it answers on its socket (1 if it does not come up).
    #[arg(long)]
    pub background: bool,
    /// With --background: the agent's log.
    #[arg(long, default_value = DEFAULT_LOG_FILE)]
    pub log_file: PathBuf,
}

/// Where `--background` sends the agent's log.
pub const DEFAULT_LOG_FILE: &str = "/run/svnic/svnic-guestd.log";
/// How long `--background` waits for the agent to answer.
const BACKGROUND_READY: Duration = Duration::from_secs(30);

fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!("{s:?} is not an octal file mode such as 666")),
    }
}

impl From<&DaemonArgs> for AgentConfig {
    fn from(a: &DaemonArgs) -> Self {
        AgentConfig {
            socket: a.socket.clone(),
            socket_mode: a.socket_mode,
            max_channels_per_app: a.max_channels_per_app,
            max_channels: a.max_channels,
            users: UserPolicy {
                default: UidLimits::new(
                    a.max_channels_per_uid
                        .0
                        .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                    a.max_hugepages_per_uid.0,
                ),
                overrides: a.quota_for_uid.clone(),
                endpoint_ranges: a.endpoints_for_uid.clone(),
            },
            state_file: (!a.no_state_file).then(|| a.state_file.clone()),
            shutdown_wait: Duration::from_millis(a.shutdown_wait_ms),
            ..AgentConfig::default()
        }
    }
}

static STOP_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(_sig: libc::c_int) {
    let fd = STOP_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let one = 1u64.to_ne_bytes();
        // SAFETY: write(2) is async-signal-safe; it reads 8 bytes from a local array and the
        // descriptor is the agent's stop eventfd, open for the agent's whole life.
        let _ = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
    }
}

/// Makes SIGTERM, SIGINT and SIGHUP signal the eventfd `stop_fd`.
fn stop_on_signals(stop_fd: i32) -> std::io::Result<()> {
    STOP_FD.store(stop_fd, Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: sigaction is plain old data; all zeroes is a valid value (empty mask, no
        // flags) that we complete below.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: installs a handler that only calls async-signal-safe write(2); `sa` is a
        // valid sigaction that outlives the call; the old action is not asked for.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `--background`: starts this program again without `--background`, detached (its own process
/// group, stdin from /dev/null, stdout and stderr to `--log-file`), and returns its pid once the
/// agent answers on its socket.
pub fn spawn_background(args: &DaemonArgs) -> Result<u32, AgentError> {
    let setup = |what: &str| {
        let what = what.to_string();
        move |source| AgentError::Setup { what, source }
    };
    if let Some(dir) = args.log_file.parent() {
        std::fs::create_dir_all(dir).map_err(setup("create the log directory"))?;
    }
    let log = std::fs::File::create(&args.log_file)
        .map_err(setup(&format!("create {}", args.log_file.display())))?;
    let exe = std::env::current_exe().map_err(setup("find this program"))?;
    let argv: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--background")
        .collect();
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new(exe)
        .args(argv)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(setup("log file"))?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(setup("start the agent"))?;
    let deadline = std::time::Instant::now() + BACKGROUND_READY;
    loop {
        if let Some(status) = child.try_wait().map_err(setup("wait for the agent"))? {
            return Err(AgentError::Setup {
                what: format!(
                    "the agent exited ({status}); see {}",
                    args.log_file.display()
                ),
                source: std::io::Error::other("agent did not start"),
            });
        }
        if svnic_client::vm::AgentClient::connect(&args.socket).is_ok() {
            return Ok(child.id());
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            return Err(AgentError::Setup {
                what: format!(
                    "the agent did not answer on {} within {BACKGROUND_READY:?}; see {}",
                    args.socket.display(),
                    args.log_file.display()
                ),
                source: std::io::Error::from(std::io::ErrorKind::TimedOut),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the agent as `svnic-guestd` does: finds and opens the NIC, reserves hugepages, serves
/// until a signal, then destroys every channel and returns.
pub fn run_daemon(args: &DaemonArgs) -> Result<(), AgentError> {
    if args.background {
        let pid = spawn_background(args)?;
        println!(
            "svnic-guestd: serving applications on {} (pid {pid}); log in {}",
            args.socket.display(),
            args.log_file.display()
        );
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        warn!(
            "svnic-guestd is not running as root: it needs a raw packet socket, hugepages and \
             physical addresses from /proc/self/pagemap"
        );
    }
    let iface = match &args.iface {
        Some(i) => i.clone(),
        None => find_virtio_nic(Path::new("/sys"))?,
    };
    let nic = PacketSocket::open(&iface, ETHERTYPE)?;
    let wanted = args.hugepages.unwrap_or(args.max_channels as u64);
    if wanted > 0 {
        HugepagePool::system().reserve(wanted)?;
    }
    let memory = HugepageBackend::new(args.allow_unsealed)?;
    let cfg = AgentConfig::from(args);
    let (agent, handle) = Agent::new(cfg, Box::new(nic), Box::new(memory))?;
    stop_on_signals(handle.stop_fd()).map_err(|source| AgentError::Setup {
        what: "signal handlers".into(),
        source,
    })?;
    agent.run()?;
    info!("svnic-guestd stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn arguments_become_a_config() {
        let a = DaemonArgs::try_parse_from([
            "svnic-guestd",
            "--socket",
            "/tmp/a.sock",
            "--socket-mode",
            "0o660",
            "--max-channels",
            "4",
            "--no-state-file",
        ])
        .unwrap();
        let c = AgentConfig::from(&a);
        assert_eq!(c.socket, PathBuf::from("/tmp/a.sock"));
        assert_eq!(c.socket_mode, 0o660);
        assert_eq!(c.max_channels, 4);
        assert_eq!(c.state_file, None);
        let d = DaemonArgs::try_parse_from(["svnic-guestd"]).unwrap();
        assert_eq!(d.socket, PathBuf::from(DEFAULT_AGENT_SOCKET));
        assert_eq!(
            AgentConfig::from(&d).state_file,
            Some(PathBuf::from(DEFAULT_STATE_FILE))
        );
        assert!(DaemonArgs::try_parse_from(["svnic-guestd", "--socket-mode", "999"]).is_err());
    }

    #[test]
    fn per_uid_flags_become_the_user_policy() {
        let d = AgentConfig::from(&DaemonArgs::try_parse_from(["svnic-guestd"]).unwrap());
        assert_eq!(d.users, UserPolicy::default());
        assert_eq!(d.users.limits(1000), UidLimits::new(Some(4), Some(4)));
        let a = DaemonArgs::try_parse_from([
            "svnic-guestd",
            "--max-channels-per-uid",
            "2",
            "--max-hugepages-per-uid",
            "unlimited",
            "--quota-for-uid",
            "1000=8:16",
            "--quota-for-uid",
            "0=1:1",
            "--endpoints-for-uid",
            "1000=100-199",
            "--endpoints-for-uid",
            "1001=200",
        ])
        .unwrap();
        let u = AgentConfig::from(&a).users;
        assert_eq!(u.limits(7), UidLimits::new(Some(2), None));
        assert_eq!(u.limits(1000), UidLimits::new(Some(8), Some(16)));
        assert_eq!(u.limits(0), UidLimits::new(Some(1), Some(1)));
        assert_eq!(u.reservation(150).map(|r| r.uid), Some(1000));
        assert_eq!(u.reservation(200).map(|r| r.uid), Some(1001));
        assert_eq!(u.reservation(201), None);
        for bad in [
            ["--max-channels-per-uid", "many"],
            ["--quota-for-uid", "1000=8"],
            ["--endpoints-for-uid", "1000:1-2"],
        ] {
            let mut argv = vec!["svnic-guestd"];
            argv.extend(bad);
            assert!(DaemonArgs::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }
}
