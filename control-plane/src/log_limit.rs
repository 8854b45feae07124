//! Rate limits for log lines a guest, a frontend or the wire can trigger.
//!
//! Rule: a line whose frequency an untrusted party controls goes through [`log_limited!`](crate::log_limited); the
//! detail lives in counters, and the log says how many lines of the same call site it left out.
//! Each call site has its own budget of [`LINES_PER_WINDOW`] lines per [`WINDOW`].

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines one call site may write per window.
pub const LINES_PER_WINDOW: u32 = 10;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Window {
    start: Option<Instant>,
    written: u32,
    suppressed: u64,
}

/// The budget of one call site (a `static`, made by [`log_limited!`](crate::log_limited)).
#[derive(Debug)]
pub struct LogLimiter {
    window: Mutex<Window>,
}

impl Default for LogLimiter {
    fn default() -> Self {
        Self::new()
    }
}

impl LogLimiter {
    /// A fresh budget.
    pub const fn new() -> Self {
        LogLimiter {
            window: Mutex::new(Window {
                start: None,
                written: 0,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` if a line may be written now, `n` being the lines left out since the last one
    /// written; `None` (and the line counted as left out) otherwise.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let expired = w
            .start
            .is_none_or(|start| now.saturating_duration_since(start) >= WINDOW);
        if expired {
            w.start = Some(now);
            w.written = 0;
        }
        if w.written >= LINES_PER_WINDOW {
            w.suppressed = w.suppressed.saturating_add(1);
            return None;
        }
        w.written += 1;
        Some(std::mem::take(&mut w.suppressed))
    }
}

/// `log::log!` with a per-call-site budget ([`LogLimiter`]): at most [`LINES_PER_WINDOW`] lines
/// per [`WINDOW`]; the next line written says how many were left out.
///
/// ```
/// use svnic_control_plane::log_limited;
/// log_limited!(log::Level::Warn, "guest {} sent garbage", 3);
/// ```
#[macro_export]
macro_rules! log_limited {
    ($level:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::log_limit::LogLimiter = $crate::log_limit::LogLimiter::new();
        if ::log::log_enabled!($level) {
            if let Some(left_out) = LIMIT.allow() {
                if left_out > 0 {
                    ::log::log!($level, "({left_out} similar lines left out)");
                }
                ::log::log!($level, $($arg)+);
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_at_the_budget_and_the_next_window_reports_what_was_left_out() {
        let limit = LogLimiter::new();
        let t0 = Instant::now();
        for _ in 0..LINES_PER_WINDOW {
            assert_eq!(limit.allow_at(t0), Some(0));
        }
        for _ in 0..25 {
            assert_eq!(limit.allow_at(t0 + Duration::from_millis(500)), None);
        }
        assert_eq!(limit.allow_at(t0 + WINDOW), Some(25));
        assert_eq!(limit.allow_at(t0 + WINDOW), Some(0));
    }
}
