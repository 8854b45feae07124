//! The soak: many host-process guests (each its own process, see [`guest`]) against one
//! `svnic serve` (its own process, see [`crate::daemon_proc`]), with random channel creates and destroys,
//! user-data and DMA-data between channels of different guests, and guests SIGKILLed and
//! reconnected, for a while; then [`driver::run`] checks that the daemon never restarted, that
//! every counter balances exactly, that its RSS and fds came back to their baseline once the
//! guests were gone, and that SIGTERM ends it within 5 s.
//!
//! `scripts/soak.sh` runs the full soak (64 guests x 16 channels, 10 minutes); the test
//! `tests/soak.rs` a short one.

pub mod driver;
pub mod guest;

use std::path::PathBuf;
use std::time::Duration;

use svnic_channels::MacAddr;

pub use driver::{run, SoakReport};
pub use guest::{guest_main, GuestArgs};

/// The MAC of soak guest `index`.
pub fn soak_mac(index: u32) -> MacAddr {
    let [_, _, hi, lo] = index.to_be_bytes();
    MacAddr([0x52, 0x54, 0x00, 0x50, hi, lo])
}

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The `svnic` binary (its `serve` and `ctl`).
    pub svnic: PathBuf,
    /// The `svnic-soak` binary (its `guest` subcommand is a soak guest).
    pub soak_bin: PathBuf,
    /// Guest processes.
    pub guests: u32,
    /// Channels per guest at most.
    pub channels: u32,
    /// How long the traffic runs.
    pub duration: Duration,
    /// One guest is SIGKILLed and restarted this often.
    pub kill_every: Duration,
    /// Each guest's pause between rounds of work.
    pub tick: Duration,
    /// Random seed of the driver and (derived) of the guests.
    pub seed: u64,
    /// How far above its baseline the daemon's RSS may end, KiB.
    pub rss_slack_kib: u64,
    /// How far above its baseline the daemon's fd count may end.
    pub fd_slack: u64,
}

impl SoakConfig {
    /// The full soak of issue 13: 64 guests x 16 channels for `duration`.
    pub fn full(svnic: PathBuf, soak_bin: PathBuf, duration: Duration) -> Self {
        SoakConfig {
            svnic,
            soak_bin,
            guests: 64,
            channels: 16,
            duration,
            kill_every: Duration::from_secs(2),
            tick: Duration::from_millis(5),
            seed: 0x5eed_50a4,
            rss_slack_kib: 32 << 10,
            fd_slack: 4,
        }
    }
}

/// A small xorshift generator: reproducible from its seed, good enough for picking actions.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded (0 is replaced: xorshift would stay at 0).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}
