//! Network namespaces joined by veth pairs: "hosts" and the cables between them, for tests of
//! the uplink. Every namespace is deleted when its handle is dropped (which also removes the
//! veth ends inside it), so a failing test leaves nothing behind.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A network namespace created with `ip netns add`, deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates namespace `name`, with its loopback up.
    pub fn new(name: &str) -> io::Result<NetNs> {
        run_ip(&["netns", "add", name])?;
        let ns = NetNs {
            name: name.to_owned(),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A namespace whose name is unique to this process and call: `<prefix>-<pid>-<n>`, so
    /// that tests running in parallel (in one process or several) never share one.
    pub fn unique(prefix: &str) -> io::Result<NetNs> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        NetNs::new(&format!("{prefix}-{}-{n}", std::process::id()))
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's file, which `setns` enters.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }

    /// Runs `ip -n <name> args...` and fails unless it succeeds.
    pub fn ip(&self, args: &[&str]) -> io::Result<()> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run_ip(&all)
    }

    /// Brings interface `iface` up.
    pub fn set_up(&self, iface: &str) -> io::Result<()> {
        self.ip(&["link", "set", iface, "up"])
    }

    /// Brings interface `iface` down.
    pub fn set_down(&self, iface: &str) -> io::Result<()> {
        self.ip(&["link", "set", iface, "down"])
    }

    /// Sets interface `iface`'s MTU.
    pub fn set_mtu(&self, iface: &str, mtu: usize) -> io::Result<()> {
        self.ip(&["link", "set", iface, "mtu", &mtu.to_string()])
    }

    /// A command that runs `program` inside the namespace (`ip netns exec <name> program`),
    /// to add arguments to and spawn.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs `f` on a new thread that has entered the namespace (setns), and returns its
    /// result. What `f` creates there (sockets) stays in the namespace when other threads use
    /// it afterwards. A panic in `f` is resumed on the caller's thread.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        let file = File::open(self.path())?;
        std::thread::scope(|s| {
            let thread = s.spawn(move || {
                // SAFETY: setns on an open namespace file for this thread's network
                // namespace only; no memory is passed.
                let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                if r != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(f())
            });
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = run_ip(&["netns", "del", &self.name]) {
            eprintln!("netns {}: not deleted: {e}", self.name);
        }
    }
}

/// Joins namespace `a` (interface `a_if`) and namespace `b` (interface `b_if`) by a veth
/// pair, both ends up with MTU 1500. Interface names are at most 15 bytes.
pub fn veth_pair(a: &NetNs, a_if: &str, b: &NetNs, b_if: &str) -> io::Result<()> {
    a.ip(&[
        "link", "add", a_if, "mtu", "1500", "type", "veth", "peer", "name", b_if, "mtu", "1500",
        "netns", &b.name,
    ])?;
    a.set_up(a_if)?;
    b.set_up(b_if)
}

fn run_ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "ip {}: {} ({})",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}
