//! Hosts joined by a wire, for the uplink's tests: each "host" is a network namespace with its
//! own `svnic serve` (a child process, `--uplink` on its end of a veth pair) and guests whose
//! vhost-user sockets the test reaches from outside the namespace (Unix sockets are not
//! namespaced). Everything is torn down when dropped.

use std::path::PathBuf;
use std::time::Duration;

use svnic_backend::admin::UplinkWorkerView;

use crate::daemon_proc::{svnic_binary, GuestSpec, ScratchDir, ServeOptions, Svnic};
use crate::netns::{veth_pair, NetNs};

/// The uplink interface's name on every host.
pub const UPLINK: &str = "sv0";

/// How the hosts are started.
#[derive(Debug, Clone)]
pub struct WireOptions {
    /// Guests per host.
    pub guests: usize,
    /// Engine workers per host.
    pub workers: usize,
    /// More `svnic serve` arguments for every host (e.g. `--uplink-fault ...`).
    pub extra_args: Vec<String>,
    /// The daemons' RUST_LOG.
    pub rust_log: &'static str,
}

impl Default for WireOptions {
    fn default() -> Self {
        WireOptions {
            guests: 1,
            workers: 1,
            extra_args: Vec::new(),
            rust_log: "info",
        }
    }
}

/// One host: its namespace, its daemon and the directory of its sockets and log.
#[derive(Debug)]
pub struct WireHost {
    /// The daemon (None while stopped).
    pub svnic: Option<Svnic>,
    /// Its guests.
    pub guests: Vec<GuestSpec>,
    opts: ServeOptions,
    bin: PathBuf,
    dir: ScratchDir,
    ns: NetNs,
}

/// A worker's uplink counter by name (docs/wire.md §8), for tests: a name the daemon does not
/// publish is a mistake in the test, and panics.
pub trait UplinkCount {
    /// The counter `name`.
    fn get(&self, name: &str) -> u64;
}

impl UplinkCount for UplinkWorkerView {
    fn get(&self, name: &str) -> u64 {
        self.counter(name)
            .unwrap_or_else(|| panic!("no uplink counter {name:?} in {self:?}"))
    }
}

/// The MAC of guest `guest` of host `host`.
pub fn guest_mac(host: usize, guest: usize) -> String {
    format!("52:54:00:{:02x}:00:{:02x}", 0x10 + host, guest + 1)
}

impl WireHost {
    /// The running daemon.
    pub fn svnic(&self) -> &Svnic {
        match &self.svnic {
            Some(s) => s,
            None => panic!("host {} has no running daemon", self.ns.name()),
        }
    }

    /// The vhost-user socket of guest `i`.
    pub fn socket(&self, i: usize) -> PathBuf {
        self.guests[i].socket.clone()
    }

    /// The host's scratch directory (its sockets and logs).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The host's namespace.
    pub fn ns(&self) -> &NetNs {
        &self.ns
    }

    /// Kills the daemon outright (SIGKILL): a host that dies.
    pub fn kill(&mut self) {
        self.svnic = None;
    }

    /// Starts the daemon again with the same settings.
    pub fn restart(&mut self) -> Result<(), String> {
        self.svnic = None;
        for g in &self.guests {
            let _ = std::fs::remove_file(&g.socket);
        }
        let _ = std::fs::remove_file(self.dir.path().join("admin.sock"));
        self.svnic = Some(Svnic::start_with(
            &self.bin,
            self.dir.path(),
            &self.guests,
            &self.opts,
        )?);
        Ok(())
    }
}

/// Two hosts joined by a veth pair.
#[derive(Debug)]
pub struct WireHosts {
    /// Host A and host B.
    pub hosts: [WireHost; 2],
}

/// Why hosts could not be set up: the machine cannot make namespaces (a skip), or the daemon
/// failed (a failure).
#[derive(Debug)]
pub enum WireSetupError {
    /// Network namespaces or veth pairs are not available here.
    NoNamespaces(String),
    /// Something else failed.
    Failed(String),
}

impl WireHosts {
    /// Creates the namespaces and the cable, and starts a daemon on each with `opts`.
    pub fn start(tag: &str, opts: &WireOptions) -> Result<WireHosts, WireSetupError> {
        let no_ns = |e: std::io::Error| WireSetupError::NoNamespaces(e.to_string());
        let (a, b) = (
            NetNs::unique(&format!("{tag}-a")).map_err(no_ns)?,
            NetNs::unique(&format!("{tag}-b")).map_err(no_ns)?,
        );
        // Both ends come up with the pair.
        veth_pair(&a, UPLINK, &b, UPLINK).map_err(no_ns)?;
        let bin = svnic_binary().map_err(WireSetupError::Failed)?;
        let host = |i: usize, ns: NetNs| -> Result<WireHost, WireSetupError> {
            let dir = ScratchDir::new(&format!("{tag}-{i}"))
                .map_err(|e| WireSetupError::Failed(e.to_string()))?;
            let guests: Vec<GuestSpec> = (0..opts.guests)
                .map(|k| GuestSpec::in_dir(dir.path(), &format!("h{i}g{k}"), &guest_mac(i, k)))
                .collect();
            let mut extra = vec!["--uplink".to_string(), UPLINK.to_string()];
            extra.extend(opts.extra_args.iter().cloned());
            let serve = ServeOptions {
                workers: Some(opts.workers),
                rust_log: opts.rust_log,
                start_timeout: Duration::from_secs(30),
                extra_args: extra,
                netns: Some(ns.name().to_string()),
                ..ServeOptions::default()
            };
            let svnic = Svnic::start_with(&bin, dir.path(), &guests, &serve)
                .map_err(WireSetupError::Failed)?;
            Ok(WireHost {
                svnic: Some(svnic),
                guests,
                opts: serve,
                bin: bin.clone(),
                dir,
                ns,
            })
        };
        let ha = host(0, a)?;
        let hb = host(1, b)?;
        Ok(WireHosts { hosts: [ha, hb] })
    }
}

/// Starts two hosts, or returns None after saying why the machine cannot (the test then
/// skips); panics if the daemons fail.
pub fn two_hosts(tag: &str, opts: &WireOptions) -> Option<WireHosts> {
    match WireHosts::start(tag, opts) {
        Ok(h) => Some(h),
        Err(WireSetupError::NoNamespaces(why)) => {
            eprintln!("SKIP {tag}: this machine cannot create network namespaces: {why}");
            None
        }
        Err(WireSetupError::Failed(why)) => panic!("{tag}: {why}"),
    }
}
