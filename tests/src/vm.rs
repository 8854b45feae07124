//! Real QEMU guests against a real `svnic serve`: the image built by `vm-images/build.sh`, guests
//! started by `vm-images/launch.sh`, the daemon as its own process, and `svnic ctl` to look at it.
//! Every process is killed when its handle is dropped, so a failing test leaves nothing running.

use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use svnic_backend::admin::{AdminResponse, ChannelView, GuestView};

/// The workspace root (where `vm-images/` and `target/` are).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// The guest image and the launcher.
#[derive(Debug, Clone)]
pub struct Image {
    /// `vm-images/launch.sh`.
    pub launcher: PathBuf,
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
}

impl Image {
    /// The image `vm-images/build.sh` built, or why there is none (it has not been run).
    pub fn find() -> Result<Image, String> {
        let root = repo_root();
        let build = std::env::var_os("SVNIC_VM_BUILD")
            .map_or_else(|| root.join("vm-images/build"), PathBuf::from);
        let image = Image {
            launcher: root.join("vm-images/launch.sh"),
            kernel: build.join("vmlinuz"),
            initrd: build.join("initramfs.cpio.gz"),
        };
        for f in [&image.kernel, &image.initrd] {
            if !f.is_file() {
                return Err(format!(
                    "{} does not exist: run vm-images/build.sh (scripts/test.sh does)",
                    f.display()
                ));
            }
        }
        Ok(image)
    }
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
fn kill_with_parent(cmd: &mut Command) -> &mut Command {
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

/// The `svnic` binary: `$SVNIC_BIN` if set, else the workspace's release build, brought up to
/// date with `cargo build --release -p svnic-backend --bin svnic`. Release, because scripts/test.sh
/// builds exactly that for `svnic demo` anyway (so in CI this is a no-op), and because a debug
/// build from here would be built without the dev-dependency features `cargo test --workspace`
/// unifies in, recompiling half the workspace.
pub fn svnic_binary() -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os("SVNIC_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let root = repo_root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let args = [
        "build",
        "--release",
        "-p",
        "svnic-backend",
        "--bin",
        "svnic",
    ];
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
    let bin = target.join("release/svnic");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{} was not built", bin.display()))
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

/// `svnic serve` running as a child process.
#[derive(Debug)]
pub struct Svnic {
    bin: PathBuf,
    admin: PathBuf,
    /// Where its log (stderr) goes.
    pub log: PathBuf,
    child: KillOnDrop,
}

impl Svnic {
    /// Starts `svnic serve` with `guests` and waits until every socket exists.
    pub fn start(bin: &Path, dir: &Path, guests: &[GuestSpec]) -> Result<Svnic, String> {
        let admin = dir.join("admin.sock");
        let log = dir.join("svnic.log");
        let log_file = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .args(["--workers", "1", "--admin-socket"])
            .arg(&admin);
        for g in guests {
            cmd.arg("--guest").arg(format!(
                "name={},socket={},mac={}",
                g.name,
                g.socket.display(),
                g.mac
            ));
        }
        let child = kill_with_parent(&mut cmd)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut svnic = Svnic {
            bin: bin.to_path_buf(),
            admin,
            log,
            child: KillOnDrop(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
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
                    "svnic serve: sockets not there after 20 s:\n{}",
                    svnic.log_text()
                ));
            }
            sleep(Duration::from_millis(50));
        }
        Ok(svnic)
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

    /// Polls [`Svnic::guests`] until `done` holds or `secs` pass; the last answer.
    pub fn wait_guests(
        &self,
        secs: u64,
        done: impl Fn(&[GuestView]) -> bool,
    ) -> Result<Vec<GuestView>, String> {
        poll(secs, || self.guests(), done)
    }

    /// Polls [`Svnic::channels`] until `done` holds or `secs` pass; the last answer.
    pub fn wait_channels(
        &self,
        secs: u64,
        done: impl Fn(&[ChannelView]) -> bool,
    ) -> Result<Vec<ChannelView>, String> {
        poll(secs, || self.channels(), done)
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

    /// Its log so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits up to 10 s for a clean exit.
    pub fn stop(mut self) -> Result<ExitStatus, String> {
        self.child
            .terminate()
            .map_err(|e| format!("svnic serve: {e}"))?;
        match self
            .child
            .wait_until(Instant::now() + Duration::from_secs(10))
        {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err("svnic serve did not exit within 10 s of SIGTERM".into()),
            Err(e) => Err(format!("svnic serve: {e}")),
        }
    }
}

/// Asks `query` every 100 ms until `done` holds of its answer or `secs` pass; the last answer.
fn poll<T>(
    secs: u64,
    query: impl Fn() -> Result<Vec<T>, String>,
    done: impl Fn(&[T]) -> bool,
) -> Result<Vec<T>, String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let answer = query()?;
        if done(&answer) || Instant::now() > deadline {
            return Ok(answer);
        }
        sleep(Duration::from_millis(100));
    }
}

/// What a guest is asked to be.
#[derive(Debug, Clone)]
pub struct VmSpec<'a> {
    /// Name (also names its log files).
    pub name: &'a str,
    /// vhost-user socket.
    pub socket: &'a Path,
    /// MAC address of its NIC.
    pub mac: &'a str,
    /// Memory, e.g. "256M".
    pub mem: &'a str,
    /// Extra kernel command line (IP=..., RUN=...).
    pub append: &'a str,
}

/// How launch.sh starts the line that says which accelerator it chose.
const ACCELERATOR: &str = "launch.sh: accelerator: ";

/// A guest started by `vm-images/launch.sh` (which becomes QEMU).
#[derive(Debug)]
pub struct Vm {
    /// Its name.
    pub name: String,
    /// Serial console log.
    pub serial: PathBuf,
    /// The launcher's stderr (accelerator choice, QEMU command line, QEMU's own messages).
    pub launcher_log: PathBuf,
    child: KillOnDrop,
}

impl Vm {
    /// Launches a guest; its files go into `dir`.
    pub fn launch(image: &Image, dir: &Path, spec: &VmSpec<'_>) -> Result<Vm, String> {
        let serial = dir.join(format!("{}.serial.log", spec.name));
        let launcher_log = dir.join(format!("{}.launch.log", spec.name));
        let err = fs::File::create(&launcher_log)
            .map_err(|e| format!("{}: {e}", launcher_log.display()))?;
        let mut cmd = Command::new(&image.launcher);
        let child = kill_with_parent(&mut cmd)
            .arg("--socket")
            .arg(spec.socket)
            .args(["--mac", spec.mac, "--mem", spec.mem, "--name", spec.name])
            .arg("--log")
            .arg(&serial)
            .arg("--kernel")
            .arg(&image.kernel)
            .arg("--initrd")
            .arg(&image.initrd)
            .args(["--append", spec.append])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", image.launcher.display()))?;
        Ok(Vm {
            name: spec.name.to_string(),
            serial,
            launcher_log,
            child: KillOnDrop(child),
        })
    }

    /// The serial console so far.
    pub fn serial_text(&self) -> String {
        fs::read(&self.serial)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The launcher's stderr so far.
    pub fn launcher_text(&self) -> String {
        fs::read_to_string(&self.launcher_log).unwrap_or_default()
    }

    /// What the launcher said about the accelerator it chose (the rest of its
    /// "launch.sh: accelerator: " line, e.g. "tcg (as asked)"), if it has said it yet.
    pub fn accelerator(&self) -> Option<String> {
        let text = self.launcher_text();
        find_line(&text, ACCELERATOR).map(|l| l[ACCELERATOR.len()..].to_string())
    }

    /// The first console line starting with `prefix` (see [`find_line`]), waiting for it until `deadline` or until the
    /// guest exits.
    pub fn wait_for_line(&mut self, prefix: &str, deadline: Instant) -> Option<String> {
        loop {
            // Whether it had exited before the log is read: then the log is complete.
            let exited = !matches!(self.child.0.try_wait(), Ok(None));
            let text = self.serial_text();
            if let Some(line) = find_line(&text, prefix) {
                return Some(line.to_string());
            }
            if exited || Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// Waits for QEMU to exit, at most until `deadline`.
    pub fn wait_exit(&mut self, deadline: Instant) -> Result<Option<ExitStatus>, String> {
        self.child
            .wait_until(deadline)
            .map_err(|e| format!("{}: {e}", self.name))
    }

    /// Everything worth printing when a test fails.
    pub fn report(&self) -> String {
        format!(
            "--- {} launcher:\n{}--- {} serial console:\n{}",
            self.name,
            self.launcher_text(),
            self.name,
            self.serial_text()
        )
    }
}

/// The first line of `text` that starts with `prefix`, ignoring anything before `prefix` on that
/// line (the firmware leaves terminal escapes in front of the guest's first line).
pub fn find_line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.find(prefix).map(|i| l[i..].trim_end()))
}

/// `found`, or `None` after saying on stderr that `test` is skipped and why: for a test that needs
/// the guest image, on a machine where it has not been built.
pub fn or_skip<T>(test: &str, found: Result<T, String>) -> Option<T> {
    match found {
        Ok(found) => Some(found),
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

/// Panics with `msg`, then `context` (only computed then: say, [`TwoGuests::context`]), unless
/// `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $ctx:expr, $($msg:tt)+) => {
        if !$cond {
            panic!("{}\n{}", format!($($msg)+), $ctx);
        }
    };
}

/// What one of [`TwoGuests`] runs.
#[derive(Debug, Clone, Copy)]
pub struct GuestSetup<'a> {
    /// MAC address of its NIC.
    pub mac: &'a str,
    /// Extra kernel command line (see [`VmSpec::append`]).
    pub append: &'a str,
}

/// Two guests, A ("vm1") and B ("vm2"), each with 256M, served by one `svnic serve`, all in one
/// scratch directory. Dropping it kills A, then B, then svnic, then removes the directory (kept if
/// the test is failing).
#[derive(Debug)]
pub struct TwoGuests {
    /// How long `svnic serve` took to come up (with building it, if it was not up to date).
    pub svnic_up: Duration,
    // The rest are declared in the order they are to be dropped.
    /// Guest A, "vm1".
    pub a: Vm,
    /// Guest B, "vm2".
    pub b: Vm,
    /// The daemon serving both.
    pub svnic: Svnic,
    dir: ScratchDir,
}

impl TwoGuests {
    /// Builds `svnic` if needed, starts `svnic serve` for both guests in a new scratch directory
    /// (named after `tag`), then launches B and then A. Panics if any of it fails; the scratch
    /// directory is then kept for its logs.
    #[track_caller]
    pub fn start(image: &Image, tag: &str, a: GuestSetup<'_>, b: GuestSetup<'_>) -> TwoGuests {
        let t0 = Instant::now();
        let bin = or_panic(svnic_binary());
        let dir = or_panic(ScratchDir::new(tag).map_err(|e| format!("scratch dir: {e}")));
        let specs = [("vm1", a), ("vm2", b)].map(|(name, setup)| GuestSpec {
            name: name.into(),
            socket: dir.path().join(format!("{name}.sock")),
            mac: setup.mac.into(),
        });
        let svnic = or_panic(Svnic::start(&bin, dir.path(), &specs));
        let svnic_up = t0.elapsed();
        let launch = |spec: &GuestSpec, append: &str| {
            Vm::launch(
                image,
                dir.path(),
                &VmSpec {
                    name: &spec.name,
                    socket: &spec.socket,
                    mac: &spec.mac,
                    mem: "256M",
                    append,
                },
            )
        };
        let b = or_panic(launch(&specs[1], b.append));
        let a = or_panic(launch(&specs[0], a.append));
        TwoGuests {
            svnic_up,
            a,
            b,
            svnic,
            dir,
        }
    }

    /// The scratch directory with the sockets and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything worth reading when the test fails: each guest's launcher log and console, then
    /// svnic's log.
    pub fn context(&self) -> String {
        format!(
            "{}{}--- svnic serve log:\n{}",
            self.a.report(),
            self.b.report(),
            self.svnic.log_text()
        )
    }

    /// Stops `svnic serve` (SIGTERM) and asserts that it exits cleanly.
    #[track_caller]
    pub fn stop_svnic(self) {
        let status = or_panic(self.svnic.stop());
        assert!(
            status.success(),
            "svnic serve exited with {status} on SIGTERM"
        );
    }
}

/// The value, or a panic with the error (where the caller is, with `#[track_caller]`).
#[track_caller]
fn or_panic<T>(result: Result<T, String>) -> T {
    match result {
        Ok(value) => value,
        Err(e) => panic!("{e}"),
    }
}
