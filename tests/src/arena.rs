//! The stage of a hostile-frontend test: a fresh `svnic serve` with a polite pair (guests "a" and
//! "b", connected, a channel each), an attacker's socket ("evil") and a spare guest socket
//! ("spare"); and the verdict after the attack, [`Arena::assert_unharmed`]:
//!
//! (a) the daemon process is alive;
//! (b) the polite pair completes a round trip, and a guest connecting afresh on "spare" gets a
//!     channel and a message from A;
//! (c) the daemon's RSS and open fds stay within [`Bounds`] of their values before the attack;
//! (d) SIGTERM ends it, cleanly, within 5 s.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_host_frontend::HostGuest;

use crate::daemon_proc::{svnic_binary, GuestSpec, ScratchDir, ServeOptions, Svnic};
use crate::polite_pair::{PolitePair, GUEST_MEMORY, LEG_TIMEOUT};

/// How long SIGTERM may take.
pub const TERMINATION_LIMIT: Duration = Duration::from_secs(5);
/// How long the daemon may take to give back what an attacker's connections held after they ended.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// What the daemon holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Resident set, KiB.
    pub rss_kib: u64,
    /// Open descriptors.
    pub fds: usize,
}

/// How much a footprint may grow across an attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// RSS growth, KiB.
    pub rss_kib: u64,
    /// More open descriptors.
    pub fds: usize,
}

impl Default for Bounds {
    /// +32 MiB, +16 fds.
    fn default() -> Bounds {
        Bounds {
            rss_kib: 32 << 10,
            fds: 16,
        }
    }
}

/// A daemon, its polite pair, and the sockets of the others.
#[derive(Debug)]
pub struct Arena {
    /// The witnesses (dropped first).
    pub pair: PolitePair,
    /// The daemon.
    pub svnic: Svnic,
    dir: ScratchDir,
}

/// The value, or a panic with the error.
#[track_caller]
pub fn or_panic<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// The MAC address of guest `i` of an arena.
pub fn arena_mac(i: usize) -> String {
    format!("52:54:00:5e:00:{:02x}", i + 1)
}

impl Arena {
    /// Guests "a", "b", "evil", "spare" and `more` attackers "evil2", "evil3", ...
    pub fn start(tag: &str, more: usize) -> Arena {
        Arena::start_with(tag, more, &ServeOptions::default())
    }

    /// [`Arena::start`] with process settings.
    #[track_caller]
    pub fn start_with(tag: &str, more: usize, opts: &ServeOptions) -> Arena {
        let bin = or_panic(svnic_binary());
        let dir = or_panic(ScratchDir::new(tag).map_err(|e| format!("scratch dir: {e}")));
        let mut names: Vec<String> = ["a", "b", "evil", "spare"].map(String::from).to_vec();
        names.extend((0..more).map(|i| format!("evil{}", i + 2)));
        let specs: Vec<GuestSpec> = names
            .iter()
            .enumerate()
            .map(|(i, n)| GuestSpec::in_dir(dir.path(), n, &arena_mac(i)))
            .collect();
        let svnic = or_panic(Svnic::start_with(&bin, dir.path(), &specs, opts));
        let pair = match PolitePair::connect(&specs[0].socket, &specs[1].socket) {
            Ok(p) => p,
            Err(e) => panic!("the polite pair cannot start: {e}\n{}", svnic.log_text()),
        };
        let mut arena = Arena { pair, svnic, dir };
        if let Err(e) = arena.pair.round_trip() {
            panic!(
                "the polite pair's first round trip failed: {e}\n{}",
                arena.log()
            );
        }
        arena
    }

    /// The socket of guest `name`.
    pub fn socket(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.sock"))
    }

    /// The scratch directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The daemon's log (its end).
    pub fn log(&self) -> String {
        format!("--- svnic serve log:\n{}", self.svnic.log_text())
    }

    /// The daemon's footprint now.
    #[track_caller]
    pub fn footprint(&self) -> Footprint {
        Footprint {
            rss_kib: or_panic(self.svnic.rss_kib()),
            fds: or_panic(self.svnic.fd_count()),
        }
    }

    /// Checks (a)-(d) of the module documentation against `before` (taken before the attack),
    /// then consumes the daemon. Call it while the attacker is still connected.
    #[track_caller]
    pub fn assert_unharmed(mut self, before: Footprint, bounds: Bounds) {
        // (a)
        if let Some(status) = self.svnic.exit_status() {
            panic!("(a) the daemon died: {status}\n{}", self.log());
        }
        // (b)
        if let Err(e) = self.pair.round_trip() {
            panic!(
                "(b) the polite pair's round trip failed: {e}\n{}",
                self.log()
            );
        }
        // (c) The attacker's connections end asynchronously (relay threads, the memory guard's
        // release of unused mappings), so the footprint may take a moment to settle.
        let settle_until = Instant::now() + SETTLE_LIMIT;
        let within = |after: &Footprint| {
            after.rss_kib.saturating_sub(before.rss_kib) <= bounds.rss_kib
                && after.fds.saturating_sub(before.fds) <= bounds.fds
        };
        let mut after = self.footprint();
        while !within(&after) && Instant::now() < settle_until {
            std::thread::sleep(Duration::from_millis(50));
            after = self.footprint();
        }
        assert!(
            within(&after),
            "(c) the daemon grew from {before:?} to {after:?} (bounds: +{} KiB, +{} fds)\n{}",
            bounds.rss_kib,
            bounds.fds,
            self.log()
        );
        // (b), for a guest that arrives after the attack.
        if let Err(e) = self.fresh_guest_gets_a_message() {
            panic!("(b) a fresh guest on \"spare\": {e}\n{}", self.log());
        }
        // (d)
        match self.svnic.terminate_within(TERMINATION_LIMIT) {
            Ok(status) => assert!(
                status.success(),
                "(d) the daemon exited with {status} on SIGTERM\n{}",
                self.log()
            ),
            Err(e) => panic!("(d) {e}\n{}", self.log()),
        }
    }

    /// A new guest connects on "spare", creates a channel and receives a message from A there.
    fn fresh_guest_gets_a_message(&mut self) -> Result<(), String> {
        let socket = self.socket("spare");
        let guest = run_with_timeout(LEG_TIMEOUT + LEG_TIMEOUT, move || {
            let g =
                HostGuest::connect(&socket, GUEST_MEMORY).map_err(|e| format!("connect: {e}"))?;
            let ch = g
                .create_channel(7, 256, LEG_TIMEOUT)
                .map_err(|e| format!("create channel: {e}"))?;
            Ok::<_, String>((g, ch))
        })
        .ok_or("no answer within 20 s")??;
        let (g, mut ch) = guest;
        let to = ch.addr();
        let n = u64::MAX - 1;
        if !self
            .pair
            .ca
            .send_user(to, n, b"hello spare", Completions::OnError)
            .map_err(|e| format!("A cannot send: {e}"))?
        {
            return Err("A's TX ring is full".into());
        }
        self.pair.ca.flush().map_err(|e| format!("flush: {e}"))?;
        let waiter = g.waiter(&ch);
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + LEG_TIMEOUT;
        while out.is_empty() && std::time::Instant::now() < deadline {
            ch.wait_poll(&mut out, 4, Duration::from_millis(500), &waiter)
                .map_err(|e| format!("receive: {e}"))?;
        }
        let got = out.iter().any(|m| {
            matches!(m, svnic_channels::Message::UserData(u) if u.cookie == n && u.data() == b"hello spare")
        });
        if got {
            Ok(())
        } else {
            Err(format!("A's message did not arrive (got {out:?})"))
        }
    }
}

/// Runs `f` on a thread and waits up to `limit` for its result; `None` if it did not finish
/// (the thread is left behind, blocked on whatever it waits for: the daemon, killed at the end of
/// the test, unblocks it).
pub fn run_with_timeout<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}
