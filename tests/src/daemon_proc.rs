//! `svnic serve` as a child process of a test: a scratch directory for its sockets and log, the
//! release binary, its start with any guests and process settings (umask, fd limit), what
//! /proc says about it (RSS, open fds, CPU time), and its end (SIGTERM within a deadline).
//! Every process is killed when its handle is dropped, so a failing test leaves nothing running.

use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use svnic_backend::admin::{AdminResponse, ChannelView, EngineView, GuestView, UplinkWorkerView};

/// The workspace root (where `vm-images/` and `target/` are).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// A scratch directory for one test's sockets and logs: removed when dropped, unless the thread
/// is panicking (then it is kept, and its path printed, for the logs in it).
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// A new, unique directory under the system temp dir.
    pub fn new(tag: &str) -> io::Result<ScratchDir> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("svnic-{tag}-{}-{nanos:x}", std::process::id()));
        fs::create_dir_all(&path)?;
        Ok(ScratchDir { path })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for its logs", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Makes `cmd`'s process get SIGKILL when the thread that spawns it dies, so that a test killed
/// outright (Ctrl-C, a CI timeout), which runs no destructors, leaves no QEMU or daemon behind.
/// The setting survives exec (launch.sh execs QEMU).
pub fn kill_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: the hook runs in the forked child between fork and exec; `die_with_parent` only
    // calls prctl(2), which is async-signal-safe, and allocates nothing.
    unsafe { cmd.pre_exec(die_with_parent) }
}

fn die_with_parent() -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A child process killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// Waits for the process to exit, at most until `deadline`.
    pub fn wait_until(&mut self, deadline: Instant) -> io::Result<Option<ExitStatus>> {
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM (through kill(1), to stay clear of unsafe code).
    pub fn terminate(&self) -> io::Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "kill -TERM {} failed: {status}",
                self.0.id()
            )))
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs test `test` of the running test binary alone in a child process, with `var` set to
/// `value` (which tells the test it is the child, and what to do), killed when dropped. Returns
/// once the child printed a line with `ready` in it, with what follows `ready` on that line
/// (libtest may print its own "test NAME ... " before it on the same line).
pub fn spawn_test_child(
    test: &str,
    var: &str,
    value: &std::ffi::OsStr,
    ready: &str,
) -> Result<(KillOnDrop, String), String> {
    let exe = std::env::current_exe().map_err(|e| format!("the test binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, value)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    kill_with_parent(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {test}: {e}"))?;
    let out = child.stdout.take();
    let mut child = KillOnDrop(child);
    let rest = out.and_then(|out| {
        io::BufRead::lines(io::BufReader::new(out))
            .map_while(Result::ok)
            .find_map(|l| l.split_once(ready).map(|(_, rest)| rest.trim().to_string()))
    });
    let Some(rest) = rest else {
        return Err(format!("{test}: the child never printed {ready:?}"));
    };
    if !matches!(child.0.try_wait(), Ok(None)) {
        return Err(format!("{test}: the child exited after printing {ready:?}"));
    }
    Ok((child, rest))
}

/// The `svnic` binary: `$SVNIC_BIN` if set, else [`workspace_binary`]`("svnic", "svnic")`.
pub fn svnic_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("SVNIC_BIN") {
        return Ok(PathBuf::from(bin));
    }
    workspace_binary("svnic", "svnic")
}

/// A binary of the workspace's release build, brought up to date with
/// `cargo build --release -p PACKAGE --bin BIN`. Release, because scripts/test.sh builds the
/// binaries that way for `svnic demo` and the guest image anyway (so in CI this is a no-op), and
/// because a debug build from here would be built without the dev-dependency features
/// `cargo test --workspace` unifies in, recompiling half the workspace. Built once per test
/// process: later calls return the path at once.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf, String> {
    static BUILT: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, path)) = built.iter().find(|(name, _)| name == bin) {
        return Ok(path.clone());
    }
    let path = build_workspace_binary(package, bin)?;
    built.push((bin.to_string(), path.clone()));
    Ok(path)
}

fn build_workspace_binary(package: &str, bin: &str) -> Result<PathBuf, String> {
    let root = repo_root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let args = ["build", "--release", "-p", package, "--bin", bin];
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(&root)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !status.success() {
        return Err(format!("cargo {} failed: {status}", args.join(" ")));
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let path = target.join("release").join(bin);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} was not built", path.display()))
    }
}

/// One guest of `svnic serve`.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    /// Name.
    pub name: String,
    /// Its vhost-user socket.
    pub socket: PathBuf,
    /// Its MAC address.
    pub mac: String,
}

impl GuestSpec {
    /// Guest `name` with its socket `<name>.sock` in `dir`.
    pub fn in_dir(dir: &Path, name: &str, mac: &str) -> GuestSpec {
        GuestSpec {
            name: name.into(),
            socket: dir.join(format!("{name}.sock")),
            mac: mac.into(),
        }
    }
}

/// How `svnic serve` is started, beyond its guests.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Engine worker threads (none: the daemon's own default); 1 by default.
    pub workers: Option<usize>,
    /// The channel limit given to every guest (none: the daemon's own default).
    pub guest_channels: Option<u32>,
    /// Its `RUST_LOG`; `info` by default.
    pub rust_log: &'static str,
    /// How long [`Svnic::start_with`] waits for its sockets; 20 s by default.
    pub start_timeout: Duration,
    /// The umask it starts with (none: the test's own).
    pub umask: Option<libc::mode_t>,
    /// Its RLIMIT_NOFILE, soft and hard (none: the test's own).
    pub max_open_files: Option<u64>,
    /// More command-line arguments after the guests.
    pub extra_args: Vec<String>,
    /// The network namespace it runs in (`ip netns exec`; none: the test's own).
    pub netns: Option<String>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            workers: Some(1),
            guest_channels: None,
            rust_log: "info",
            start_timeout: Duration::from_secs(20),
            umask: None,
            max_open_files: None,
            extra_args: Vec::new(),
            netns: None,
        }
    }
}

/// `svnic serve` running as a child process.
#[derive(Debug)]
pub struct Svnic {
    bin: PathBuf,
    admin: PathBuf,
    /// Where its log (stderr) goes.
    pub log: PathBuf,
    guests: Vec<GuestSpec>,
    child: KillOnDrop,
}

/// The `svnic serve` command line for `guests`, its admin socket in `dir`; stdout and stderr are
/// left to the caller.
pub fn serve_command(bin: &Path, dir: &Path, guests: &[GuestSpec], opts: &ServeOptions) -> Command {
    // `ip netns exec` execs the daemon: its pid is the daemon's.
    let mut cmd = match &opts.netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("serve");
    if let Some(n) = opts.workers {
        cmd.arg("--workers").arg(n.to_string());
    }
    cmd.arg("--admin-socket").arg(dir.join("admin.sock"));
    for g in guests {
        let mut spec = format!(
            "name={},socket={},mac={}",
            g.name,
            g.socket.display(),
            g.mac
        );
        if let Some(n) = opts.guest_channels {
            spec.push_str(&format!(",channels={n}"));
        }
        cmd.arg("--guest").arg(spec);
    }
    cmd.args(&opts.extra_args);
    kill_with_parent(&mut cmd);
    let (umask, max_open_files) = (opts.umask, opts.max_open_files);
    if umask.is_some() || max_open_files.is_some() {
        let hook = move || set_process_limits(umask, max_open_files);
        // SAFETY: the hook runs in the forked child between fork and exec; umask(2) and
        // setrlimit(2) are async-signal-safe, and it allocates nothing.
        unsafe { cmd.pre_exec(hook) };
    }
    cmd.env("RUST_LOG", opts.rust_log).stdin(Stdio::null());
    cmd
}

fn set_process_limits(umask: Option<libc::mode_t>, max_open_files: Option<u64>) -> io::Result<()> {
    if let Some(mask) = umask {
        // SAFETY: umask takes a mode and cannot fail.
        unsafe { libc::umask(mask) };
    }
    if let Some(n) = max_open_files {
        set_max_open_files(0, n)?;
    }
    Ok(())
}

/// Sets RLIMIT_NOFILE (soft and hard) of process `pid` (0: this one) to `n`.
pub fn set_max_open_files(pid: libc::pid_t, n: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: `limit` is a valid rlimit read during the call; a null old-limit pointer is allowed.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets only the soft RLIMIT_NOFILE of process `pid`, keeping its hard limit (so that it can be
/// raised again); the soft limit it had.
pub fn set_soft_open_files(pid: libc::pid_t, n: u64) -> io::Result<u64> {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a null new-limit pointer only reads the limit into `old`, valid for the call.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut old) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let limit = libc::rlimit {
        rlim_cur: n.min(old.rlim_max),
        rlim_max: old.rlim_max,
    };
    // SAFETY: `limit` is a valid rlimit read during the call; a null old-limit pointer is allowed.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(old.rlim_cur)
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Svnic {
    /// Starts `svnic serve` with `guests` and waits up to 20 s until every socket exists.
    pub fn start(bin: &Path, dir: &Path, guests: &[GuestSpec]) -> Result<Svnic, String> {
        Svnic::start_with(bin, dir, guests, &ServeOptions::default())
    }

    /// [`Svnic::start`] with process settings.
    pub fn start_with(
        bin: &Path,
        dir: &Path,
        guests: &[GuestSpec],
        opts: &ServeOptions,
    ) -> Result<Svnic, String> {
        let admin = dir.join("admin.sock");
        let log = dir.join("svnic.log");
        let log_file = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = serve_command(bin, dir, guests, opts)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut svnic = Svnic {
            bin: bin.to_path_buf(),
            admin,
            log,
            guests: guests.to_vec(),
            child: KillOnDrop(child),
        };
        let deadline = Instant::now() + opts.start_timeout;
        let mut sockets: Vec<&Path> = guests.iter().map(|g| g.socket.as_path()).collect();
        sockets.push(&svnic.admin);
        while !sockets.iter().all(|s| s.exists()) {
            if let Ok(Some(status)) = svnic.child.0.try_wait() {
                return Err(format!(
                    "svnic serve exited ({status}) before its sockets appeared:\n{}",
                    svnic.log_text()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "svnic serve: sockets not there after {:?}:\n{}",
                    opts.start_timeout,
                    svnic.log_text()
                ));
            }
            sleep(Duration::from_millis(50));
        }
        Ok(svnic)
    }

    /// Its process id.
    pub fn pid(&self) -> libc::pid_t {
        libc::pid_t::try_from(self.child.0.id()).unwrap_or(libc::pid_t::MAX)
    }

    /// The guests it serves.
    pub fn guest_specs(&self) -> &[GuestSpec] {
        &self.guests
    }

    /// The vhost-user socket of guest `name`.
    pub fn socket(&self, name: &str) -> Option<&Path> {
        self.guests
            .iter()
            .find(|g| g.name == name)
            .map(|g| g.socket.as_path())
    }

    /// The admin socket.
    pub fn admin_socket(&self) -> &Path {
        &self.admin
    }

    /// True while the process has not exited (a zombie counts as exited).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.0.try_wait(), Ok(None))
    }

    /// How it exited, if it has.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.0.try_wait().ok().flatten()
    }

    /// An error naming its exit status and ending with the last 30 lines of its log, if the
    /// process has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.0.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "svnic serve (pid {}) exited: {status}\n{}",
                self.pid(),
                self.log_tail(30)
            )),
            Err(e) => Err(format!("svnic serve: {e}")),
        }
    }

    /// Resident set size, from /proc/PID/status (VmRSS).
    pub fn rss_kib(&self) -> Result<u64, String> {
        proc_rss_kib(self.pid())
    }

    /// Open file descriptors, from /proc/PID/fd.
    pub fn fd_count(&self) -> Result<usize, String> {
        proc_fd_count(self.pid())
    }

    /// CPU time used so far (user + system), from /proc/PID/stat.
    pub fn cpu_time(&self) -> Result<Duration, String> {
        proc_cpu_time(self.pid())
    }

    /// Threads, from /proc/PID/status.
    pub fn threads(&self) -> Result<u64, String> {
        proc_status_field(self.pid(), "Threads:")
    }

    /// Bytes of log written so far.
    pub fn log_len(&self) -> u64 {
        fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// SIGTERM, then waits up to `limit` for it to exit; its exit status, or an error saying it
    /// did not end in time (it is then killed when dropped).
    pub fn terminate_within(&mut self, limit: Duration) -> Result<ExitStatus, String> {
        if let Some(status) = self.exit_status() {
            return Err(format!("svnic serve had already exited ({status})"));
        }
        self.child
            .terminate()
            .map_err(|e| format!("svnic serve: {e}"))?;
        match self.child.wait_until(Instant::now() + limit) {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err(format!(
                "svnic serve did not exit within {limit:?} of SIGTERM"
            )),
            Err(e) => Err(format!("svnic serve: {e}")),
        }
    }

    /// `svnic ctl guests --json`, parsed.
    pub fn guests(&self) -> Result<Vec<GuestView>, String> {
        match self.ctl_json("guests")? {
            AdminResponse::Guests { guests } => Ok(guests),
            other => Err(format!("svnic ctl guests --json answered {other:?}")),
        }
    }

    /// `svnic ctl channels --json`, parsed.
    pub fn channels(&self) -> Result<Vec<ChannelView>, String> {
        match self.ctl_json("channels")? {
            AdminResponse::Channels { channels } => Ok(channels),
            other => Err(format!("svnic ctl channels --json answered {other:?}")),
        }
    }

    /// `svnic ctl engine --json`, parsed.
    pub fn engine(&self) -> Result<EngineView, String> {
        match self.ctl_json("engine")? {
            AdminResponse::Engine(view) => Ok(view),
            other => Err(format!("svnic ctl engine --json answered {other:?}")),
        }
    }

    /// `svnic ctl uplink`: the uplink's interface and each worker's counters.
    pub fn uplink(&self) -> Result<(Option<String>, Vec<UplinkWorkerView>), String> {
        match self.ctl_json("uplink")? {
            AdminResponse::Uplink { iface, workers } => Ok((iface, workers)),
            other => Err(format!("svnic ctl uplink --json answered {other:?}")),
        }
    }

    /// Asks `query` (e.g. [`Svnic::guests`], [`Svnic::channels`]) every 100 ms until `done`
    /// holds of its answer or `secs` pass; the last answer.
    pub fn wait_for<T>(
        &self,
        secs: u64,
        query: impl Fn(&Self) -> Result<Vec<T>, String>,
        done: impl Fn(&[T]) -> bool,
    ) -> Result<Vec<T>, String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let answer = query(self)?;
            if done(&answer) || Instant::now() > deadline {
                return Ok(answer);
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// `svnic ctl <command> --json`, parsed.
    fn ctl_json(&self, command: &str) -> Result<AdminResponse, String> {
        let out = Command::new(&self.bin)
            .args(["ctl", command, "--json", "--admin-socket"])
            .arg(&self.admin)
            .output()
            .map_err(|e| format!("cannot run svnic ctl: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "svnic ctl {command} --json: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        serde_json::from_str(&text).map_err(|e| format!("svnic ctl {command} --json: {e}: {text}"))
    }

    /// Its log so far (at most the last 64 KiB, which is what a failing test wants to read).
    pub fn log_text(&self) -> String {
        let bytes = fs::read(&self.log).unwrap_or_default();
        let tail = bytes.len().saturating_sub(64 << 10);
        String::from_utf8_lossy(bytes.get(tail..).unwrap_or_default()).into_owned()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let bytes = fs::read(&self.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let all: Vec<&str> = text.lines().collect();
        all.get(all.len().saturating_sub(lines)..)
            .unwrap_or_default()
            .join("\n")
    }

    /// SIGTERM, then waits up to 10 s for a clean exit.
    pub fn stop(mut self) -> Result<ExitStatus, String> {
        self.terminate_within(Duration::from_secs(10))
    }
}

/// VmRSS of process `pid`, in KiB.
pub fn proc_rss_kib(pid: libc::pid_t) -> Result<u64, String> {
    proc_status_field(pid, "VmRSS:")
}

/// The first number of the /proc/PID/status line starting with `field`.
fn proc_status_field(pid: libc::pid_t, field: &str) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let text = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("{path}: no {field} line"))
}

/// Open descriptors of process `pid`.
pub fn proc_fd_count(pid: libc::pid_t) -> Result<usize, String> {
    let path = format!("/proc/{pid}/fd");
    fs::read_dir(&path)
        .map(Iterator::count)
        .map_err(|e| format!("{path}: {e}"))
}

/// The lowest descriptor number process `pid` does not use: the next one it would get.
pub fn proc_lowest_free_fd(pid: libc::pid_t) -> Result<u64, String> {
    let path = format!("/proc/{pid}/fd");
    let mut used: Vec<u64> = fs::read_dir(&path)
        .map_err(|e| format!("{path}: {e}"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    used.sort_unstable();
    let mut next = 0;
    for fd in used {
        if fd != next {
            break;
        }
        next += 1;
    }
    Ok(next)
}

/// User + system CPU time of process `pid` (all its threads).
pub fn proc_cpu_time(pid: libc::pid_t) -> Result<Duration, String> {
    let path = format!("/proc/{pid}/stat");
    let text = fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    // utime and stime are fields 14 and 15, so the 12th and 13th after the name.
    let after_name = text.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let (Some(utime), Some(stime)) = (ticks(11), ticks(12)) else {
        return Err(format!("{path}: cannot read utime and stime from {text:?}"));
    };
    // SAFETY: sysconf takes a constant and has no other effect.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100);
    Ok(Duration::from_millis((utime + stime) * 1000 / hz))
}
