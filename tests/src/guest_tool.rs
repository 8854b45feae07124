//! Running the `svnic-guest` binary as a child process in tests: spawn, wait for its "ready"
//! line, collect its output, kill it.
// Test kit: a failed step is a failed test, so it panics with the error.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The binary under test: the release build of `svnic-guest`, brought up to date.
pub fn tool_binary() -> PathBuf {
    match crate::daemon_proc::workspace_binary("svnic-guest-tools", "svnic-guest") {
        Ok(path) => path,
        Err(e) => panic!("svnic-guest: {e}"),
    }
}

/// A running `svnic-guest`.
#[derive(Debug)]
pub struct Tool {
    pub name: String,
    child: Child,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    stdout: Option<JoinHandle<String>>,
    err_thread: Option<JoinHandle<()>>,
}

/// What a finished tool left.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// The JSON object it printed (with --json), after checking it succeeded.
    pub fn json(&self) -> serde_json::Value {
        assert!(
            self.status.success(),
            "exit {:?}\nstdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

pub fn spawn(name: &str, args: &[&str]) -> Tool {
    spawn_as(name, args, None)
}

/// [`spawn`] as user `uid` (same group id), e.g. nobody, to show a tool needs no privileges.
pub fn spawn_as(name: &str, args: &[&str], uid: Option<u32>) -> Tool {
    let mut cmd = Command::new(tool_binary());
    cmd.args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(uid) = uid {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(uid);
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = child.stderr.take().unwrap();
    let (tx, lines) = channel();
    let stderr = Arc::new(Mutex::new(String::new()));
    let keep = stderr.clone();
    let err_thread = std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            keep.lock().unwrap().push_str(&format!("{line}\n"));
            let _ = tx.send(line);
        }
    });
    Tool {
        name: name.to_string(),
        child,
        lines,
        stderr,
        stdout: Some(stdout),
        err_thread: Some(err_thread),
    }
}

impl Tool {
    /// Waits for the `svnic-guest <tool>: ready at ...` line; returns it.
    pub fn wait_ready(&self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(": ready at ") => return l,
                Ok(_) => continue,
                Err(_) => panic!(
                    "{} not ready within {timeout:?}; stderr:\n{}",
                    self.name,
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Waits for it to exit (killing it after `timeout`, which fails the test).
    pub fn finish(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} still running after {timeout:?}; stderr:\n{}",
                    self.name,
                    self.stderr.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let stdout = self.stdout.take().unwrap().join().unwrap();
        if let Some(t) = self.err_thread.take() {
            let _ = t.join();
        }
        let stderr = self.stderr.lock().unwrap().clone();
        Finished {
            status,
            stdout,
            stderr,
        }
    }

    /// SIGKILL: the process dies without cleaning anything up.
    pub fn kill(mut self) -> Finished {
        let _ = self.child.kill();
        self.finish(Duration::from_secs(10))
    }

    /// Everything it wrote on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
