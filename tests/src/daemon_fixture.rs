//! The daemon in this process, as `svnic serve` runs it (`Daemon::start`), with its guests'
//! sockets and admin socket in a fresh directory; host-process guests connect to it.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use svnic_backend::config::{DaemonConfig, EngineOverrides};
use svnic_backend::daemon::{AdminSocket, Daemon};
use svnic_channels::{ChannelAddr, MacAddr, Message};
use svnic_client::Channel;
use svnic_host_frontend::HostGuest;

/// Guest memory of a host-process guest from [`DaemonFixture::guest`].
pub const GUEST_MEMORY: u64 = 64 << 20;

/// A running daemon; shut down and its directory removed on drop.
#[derive(Debug)]
pub struct DaemonFixture {
    daemon: Option<Daemon>,
    dir: PathBuf,
}

impl DaemonFixture {
    /// A daemon with one engine worker and guests `g1, g2, ..` (socket `g<i>.sock`), one for each
    /// `(mac, extra)` of `guests`; `extra` is appended to the guest's `--guest` spec (e.g.
    /// `",channels=2"`). `overrides.workers` defaults to 1.
    pub fn start(name: &str, guests: &[(MacAddr, &str)], overrides: EngineOverrides) -> Self {
        Self::start_with(name, guests, overrides, |_| {})
    }

    /// [`DaemonFixture::start`], with `tweak` applied to the configuration before the daemon
    /// starts (for settings no command line gives, such as the engine's idle passes).
    pub fn start_with(
        name: &str,
        guests: &[(MacAddr, &str)],
        overrides: EngineOverrides,
        tweak: impl FnOnce(&mut DaemonConfig),
    ) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "svnic-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let specs: Vec<String> = guests
            .iter()
            .zip(1..)
            .map(|((mac, extra), i): (&(MacAddr, &str), u32)| {
                format!(
                    "name=g{i},socket={},mac={mac}{extra}",
                    dir.join(format!("g{i}.sock")).display()
                )
            })
            .collect();
        let overrides = EngineOverrides {
            workers: overrides.workers.or(Some(1)),
            ..overrides
        };
        let mut cfg =
            DaemonConfig::load(None, &specs, &overrides, Some(dir.join("admin.sock"))).unwrap();
        tweak(&mut cfg);
        DaemonFixture {
            daemon: Some(Daemon::start(&cfg, AdminSocket::Off).unwrap()),
            dir,
        }
    }

    /// The socket of guest `i` (from 1).
    pub fn sock(&self, i: u8) -> PathBuf {
        self.dir.join(format!("g{i}.sock"))
    }

    /// The daemon.
    pub fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().unwrap()
    }

    /// A host-process guest connected as guest `i`, with [`GUEST_MEMORY`] of memory.
    pub fn guest(&self, i: u8) -> HostGuest {
        HostGuest::connect(self.sock(i), GUEST_MEMORY).unwrap()
    }
}

impl Drop for DaemonFixture {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            d.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits on `g`'s waiter until `n` messages arrived on `ch` or `timeout` passed; what arrived.
pub fn recv_messages(ch: &mut Channel, g: &HostGuest, n: usize, timeout: Duration) -> Vec<Message> {
    let w = g.waiter(ch);
    let mut out = Vec::new();
    let deadline = Instant::now() + timeout;
    while out.len() < n && Instant::now() < deadline {
        let want = n - out.len();
        ch.wait_poll(&mut out, want, Duration::from_millis(200), &w)
            .unwrap();
    }
    out
}

/// Checks that `got` are user-data messages from `from` numbered from 0: message i has cookie i
/// and the 8 bytes of i (little-endian) as its data.
pub fn assert_numbered_user_data(got: &[Message], from: ChannelAddr) {
    for (i, m) in got.iter().enumerate() {
        let Message::UserData(u) = m else {
            panic!("message {i}: {m:?}")
        };
        assert_eq!(
            (u.cookie, u.data(), u.peer),
            (i as u64, &(i as u64).to_le_bytes()[..], from)
        );
    }
}
