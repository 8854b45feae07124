//! Waiting for a condition in tests.

use std::time::{Duration, Instant};

/// Polls `cond` every millisecond until it holds or `timeout` passes (then panics: the test
/// failed).
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "condition not reached within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
