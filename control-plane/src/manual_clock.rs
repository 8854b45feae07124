//! A clock tests move by hand, for [`ControlPlane::with_clock`](crate::ControlPlane::with_clock).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Starts at the moment it is made and moves only by [`ManualClock::advance`]. Clones share the
/// time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    start: Instant,
    nanos: Arc<AtomicU64>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A clock standing at now.
    pub fn new() -> Self {
        ManualClock {
            start: Instant::now(),
            nanos: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The time it shows.
    pub fn now(&self) -> Instant {
        self.start + Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Moves it forward by `by` (saturating at about 584 years).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(by))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_time_and_it_moves_only_when_advanced() {
        let a = ManualClock::new();
        let b = a.clone();
        let t0 = a.now();
        assert_eq!(b.now(), t0);
        a.advance(Duration::from_millis(5));
        assert_eq!(b.now(), t0 + Duration::from_millis(5));
    }
}
