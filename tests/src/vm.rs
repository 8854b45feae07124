//! Real QEMU guests against a real `svnic serve`: the image built by `vm-images/build.sh`, guests
//! started by `vm-images/launch.sh`, the daemon as its own process, and `svnic ctl` to look at it.
//! Every process is killed when its handle is dropped, so a failing test leaves nothing running.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub use crate::daemon_proc::{
    kill_with_parent, repo_root, svnic_binary, GuestSpec, KillOnDrop, ScratchDir, Svnic,
};

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

    /// Checks that the manifest `vm-images/build.sh` wrote beside the initramfs lists every one
    /// of `want` in its `key=` line (e.g. `guest_binaries`, `libfabric`), or says what is missing.
    pub fn manifest_lists(&self, key: &str, want: &[&str]) -> Result<(), String> {
        let manifest = self.initrd.with_file_name("manifest");
        let text =
            fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
        let prefix = format!("{key}=");
        let listed: Vec<&str> = text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let missing: Vec<&&str> = want.iter().filter(|w| !listed.contains(w)).collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the guest image lacks {missing:?} ({} {key}=): run vm-images/build.sh \
                 --build-guest --libfabric (scripts/test.sh does)",
                manifest.display()
            ))
        }
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

    /// Waits until guest `who` ("A" or "B") has powered off cleanly by `deadline`; panics with
    /// [`TwoGuests::context`] if it has not.
    pub fn wait_powered_off(&mut self, who: &str, deadline: Instant) {
        let vm = if who == "A" { &mut self.a } else { &mut self.b };
        let exit = vm.wait_exit(deadline).unwrap_or_else(|e| panic!("{e}"));
        ensure!(
            exit.is_some_and(|s| s.success()),
            self.context(),
            "guest {who} did not power off in time: {exit:?}"
        );
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
