//! The daemon in this process with one guest pool, as `svnic serve --pool` runs it
//! (`Daemon::start` with its admin socket), and the operator's view of it as `svnic ctl` asks it.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use svnic_backend::admin::{query, AdminRequest, AdminResponse, EngineView, GuestView, PoolView};
use svnic_backend::config::{DaemonConfig, EngineOverrides};
use svnic_backend::daemon::{AdminSocket, Daemon};
use svnic_channels::MacAddr;
use svnic_host_frontend::HostGuest;

use crate::daemon_fixture::GUEST_MEMORY;
use crate::daemon_proc::ScratchDir;

/// The pool's MAC range: 52:54:00:10:00:00 to 52:54:00:10:00:ff.
pub const POOL_RANGE: &str = "52:54:00:10:00:00/40";

/// The MAC at `offset` in [`POOL_RANGE`].
pub fn pool_mac(offset: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0x00, 0x10, 0x00, offset])
}

/// How long the fixture waits for the daemon to reach a state.
const T: Duration = Duration::from_secs(10);

/// A daemon (one engine worker) serving one pool `ranks` of at most `max` guests, and its admin
/// socket. One at a time in a test process: tests count the process's descriptors and threads,
/// and the clients of pool tests are whole programs that need the CPUs.
#[derive(Debug)]
pub struct PoolFixture {
    daemon: Option<Daemon>,
    _serial: MutexGuard<'static, ()>,
    socket: PathBuf,
    admin: PathBuf,
    _dir: ScratchDir,
}

impl PoolFixture {
    /// Starts the daemon; `extra` is appended to the pool's `--pool` spec (e.g. `",channels=4"`).
    pub fn start(tag: &str, max: u32, extra: &str) -> Self {
        static SERIAL: Mutex<()> = Mutex::new(());
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let dir = ScratchDir::new(tag).unwrap();
        let socket = dir.path().join("ranks.sock");
        let admin = dir.path().join("admin.sock");
        let spec = format!(
            "name=ranks,socket={},macs={POOL_RANGE},max={max}{extra}",
            socket.display()
        );
        let overrides = EngineOverrides {
            workers: Some(1),
            backpressure_wait_ms: Some(50),
            ..Default::default()
        };
        let cfg =
            DaemonConfig::load_with_pools(None, &[], &[spec], &overrides, Some(admin.clone()))
                .unwrap();
        let daemon = Daemon::start(&cfg, AdminSocket::Serve).unwrap();
        PoolFixture {
            daemon: Some(daemon),
            _serial: serial,
            socket,
            admin,
            _dir: dir,
        }
    }

    /// The daemon.
    pub fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().unwrap()
    }

    /// The pool's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The admin socket.
    pub fn admin(&self) -> &Path {
        &self.admin
    }

    /// A host-process guest of this process, as a new pool member.
    pub fn connect(&self) -> HostGuest {
        HostGuest::connect(&self.socket, GUEST_MEMORY).unwrap()
    }

    /// `svnic ctl guests`.
    pub fn guests(&self) -> Vec<GuestView> {
        match query(&self.admin, AdminRequest::Guests).unwrap() {
            AdminResponse::Guests { guests } => guests,
            other => panic!("{other:?}"),
        }
    }

    /// `svnic ctl pools` (the one pool).
    pub fn pool(&self) -> PoolView {
        match query(&self.admin, AdminRequest::Pools).unwrap() {
            AdminResponse::Pools { mut pools } => {
                assert_eq!(pools.len(), 1, "{pools:?}");
                pools.remove(0)
            }
            other => panic!("{other:?}"),
        }
    }

    /// `svnic ctl engine`.
    pub fn engine(&self) -> EngineView {
        match query(&self.admin, AdminRequest::Engine).unwrap() {
            AdminResponse::Engine(e) => e,
            other => panic!("{other:?}"),
        }
    }

    /// Waits until the pool has `n` live members and the switch `n` ports.
    pub fn wait_members(&self, n: usize) {
        let deadline = Instant::now() + T;
        while (self.guests().len(), self.daemon().switch().stats().len()) != (n, n) {
            assert!(
                Instant::now() < deadline,
                "still {:?} and {} ports, want {n}",
                self.guests(),
                self.daemon().switch().stats().len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PoolFixture {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
    }
}
