//! Process-wide counters of what the provider did on its own (retries, give-ups, messages it
//! ignored), and a limit on log lines that peers can trigger.
//!
//! Every line a peer's messages can cause goes through `warn_limited!`: at most one line per
//! second per call site, the rest only counted here, so a hostile or broken peer cannot flood
//! the application's stderr.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// One counter.
#[derive(Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    /// Adds one.
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// The count so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Sends sent again after the engine completed them `NoBuffer`/`RingFull`.
pub static SEND_RETRIES: Counter = Counter::new();
/// Senders an RDM receiver stopped waiting for (a gap held too long, or a bound exceeded).
pub static REORDER_GIVEN_UP: Counter = Counter::new();
/// RDM messages handed on after later ones of their sender.
pub static REORDER_LATE: Counter = Counter::new();
/// RDM messages in parts abandoned (parts missing, out of order, too long, timed out, refused).
pub static PARTS_ABANDONED: Counter = Counter::new();
/// Messages from peers ignored (no RDM header, an unknown buffer, an unknown part).
pub static PEER_MESSAGES_IGNORED: Counter = Counter::new();
/// Lines of `warn_limited!` not printed (the limit of one per second per call site).
pub static LOG_LINES_SUPPRESSED: Counter = Counter::new();

/// Whether a rate-limited call site whose last printed line is at `last` (milliseconds since
/// the first call, plus one; 0: never) may print now: one line per second.
pub fn allow(last: &AtomicU64) -> bool {
    static START: OnceLock<Instant> = OnceLock::new();
    let now = START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1;
    let prev = last.load(Ordering::Relaxed);
    if prev != 0 && now.saturating_sub(prev) < 1000 {
        LOG_LINES_SUPPRESSED.bump();
        return false;
    }
    let ok = last
        .compare_exchange(prev, now, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok();
    if !ok {
        LOG_LINES_SUPPRESSED.bump();
    }
    ok
}

/// `log::warn!`, at most one line per second from this call site (see [`allow`]).
macro_rules! warn_limited {
    ($($arg:tt)*) => {{
        static LAST: ::std::sync::atomic::AtomicU64 = ::std::sync::atomic::AtomicU64::new(0);
        if $crate::stats::allow(&LAST) {
            ::log::warn!($($arg)*);
        }
    }};
}
pub(crate) use warn_limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_site_prints_once_per_second() {
        let last = AtomicU64::new(0);
        assert!(allow(&last));
        let before = LOG_LINES_SUPPRESSED.get();
        assert!(!allow(&last));
        assert!(LOG_LINES_SUPPRESSED.get() > before);
        last.store(1, Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(allow(&last));
    }
}
