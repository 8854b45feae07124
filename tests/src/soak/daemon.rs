//! `svnic serve` as the soak's own child process: started with explicit socket paths in the
//! soak's private directory, watched through /proc (RSS, open fds) and `svnic ctl`, ended with
//! SIGTERM.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use svnic_backend::admin::{AdminResponse, ChannelView, GuestView};

use crate::vm::KillOnDrop;

/// A running `svnic serve`.
#[derive(Debug)]
pub struct Daemon {
    bin: PathBuf,
    admin: PathBuf,
    log: PathBuf,
    child: KillOnDrop,
    pid: u32,
}

/// Resident memory and open fds of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// Entries of /proc/PID/fd.
    pub fds: u64,
}

impl Daemon {
    /// Starts `bin serve` with one guest per socket (`name=sN`, MAC `soak_mac(N)`, `channels`
    /// channels at most) and waits until every socket exists.
    pub fn start(
        bin: &Path,
        dir: &Path,
        sockets: &[PathBuf],
        channels: u32,
    ) -> Result<Daemon, String> {
        let admin = dir.join("admin.sock");
        let log = dir.join("svnic.log");
        let log_file = fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve").arg("--admin-socket").arg(&admin);
        for (i, socket) in sockets.iter().enumerate() {
            cmd.arg("--guest").arg(format!(
                "name=s{i},socket={},mac={},channels={channels}",
                socket.display(),
                super::soak_mac(i as u32)
            ));
        }
        let child = cmd
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let pid = child.id();
        let mut daemon = Daemon {
            bin: bin.to_path_buf(),
            admin,
            log,
            child: KillOnDrop(child),
            pid,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !sockets.iter().chain([&daemon.admin]).all(|s| s.exists()) {
            daemon.check_alive()?;
            if Instant::now() > deadline {
                return Err(format!(
                    "svnic serve: sockets not there after 30 s:\n{}",
                    daemon.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(daemon)
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// An error if the process exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.0.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "svnic serve (pid {}) exited: {status}\n{}",
                self.pid,
                self.log_tail()
            )),
            Err(e) => Err(format!("svnic serve: {e}")),
        }
    }

    /// Its RSS and open fds now.
    pub fn usage(&self) -> Result<Usage, String> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid))
            .map_err(|e| format!("/proc/{}/status: {e}", self.pid))?;
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no VmRSS in /proc/{}/status", self.pid))?;
        let fds = fs::read_dir(format!("/proc/{}/fd", self.pid))
            .map_err(|e| format!("/proc/{}/fd: {e}", self.pid))?
            .count() as u64;
        Ok(Usage { rss_kib, fds })
    }

    /// `svnic ctl channels --json`.
    pub fn channels(&self) -> Result<Vec<ChannelView>, String> {
        match self.ctl_json("channels")? {
            AdminResponse::Channels { channels } => Ok(channels),
            other => Err(format!("svnic ctl channels answered {other:?}")),
        }
    }

    /// `svnic ctl guests --json`.
    pub fn guests(&self) -> Result<Vec<GuestView>, String> {
        match self.ctl_json("guests")? {
            AdminResponse::Guests { guests } => Ok(guests),
            other => Err(format!("svnic ctl guests answered {other:?}")),
        }
    }

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

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Sends SIGTERM and waits up to `limit` for the exit; the status and how long it took.
    pub fn terminate(mut self, limit: Duration) -> Result<(ExitStatus, Duration), String> {
        let pid = i32::try_from(self.pid).map_err(|_| "pid out of range".to_string())?;
        // SAFETY: kill(2) with our own child's pid (not yet reaped, so not reused) and a
        // signal number; no pointers.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            return Err(format!(
                "kill -TERM {pid}: {}",
                std::io::Error::last_os_error()
            ));
        }
        let start = Instant::now();
        match self.child.wait_until(start + limit) {
            Ok(Some(status)) => Ok((status, start.elapsed())),
            Ok(None) => Err(format!(
                "svnic serve did not exit within {limit:?} of SIGTERM\n{}",
                self.log_tail()
            )),
            Err(e) => Err(format!("svnic serve: {e}")),
        }
    }
}
