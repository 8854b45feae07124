//! A token bucket: how the control plane limits the rate of a guest's create requests (and the
//! engine the answers it sends to frames from the wire).
//!
//! The bucket holds at most `burst` tokens and gains one every `1 / per_sec` seconds; a request
//! takes one or is refused. Time comes from the caller, so that tests can drive it.

use std::time::{Duration, Instant};

/// A budget of `burst` tokens, refilled at `per_sec` tokens per second.
#[derive(Debug)]
pub struct TokenBucket {
    tokens: u32,
    /// The time up to which tokens have been added (the fraction of a token earned since is
    /// kept by not moving it past that point).
    refilled: Instant,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens.
    pub fn full(burst: u32, now: Instant) -> Self {
        TokenBucket {
            tokens: burst,
            refilled: now,
        }
    }

    /// Adds the tokens earned since the last refill (up to `burst`) and takes one. False if
    /// there was none.
    pub fn try_take(&mut self, burst: u32, per_sec: u32, now: Instant) -> bool {
        let per_token = Duration::from_secs(1) / per_sec.max(1);
        let elapsed = now.saturating_duration_since(self.refilled);
        let earned = elapsed.as_nanos() / per_token.as_nanos().max(1);
        let room = burst.saturating_sub(self.tokens);
        match u32::try_from(earned) {
            // Up to full: the fraction of a token earned since is kept.
            Ok(earned) if earned <= room => {
                self.tokens += earned;
                self.refilled = per_token
                    .checked_mul(earned)
                    .and_then(|d| self.refilled.checked_add(d))
                    .unwrap_or(now);
            }
            // Full for a while: time spent full earns nothing.
            _ => {
                self.tokens = burst;
                self.refilled = now;
            }
        }
        match self.tokens.checked_sub(1) {
            Some(left) => {
                self.tokens = left;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_burst_passes_then_the_rate_holds() {
        let t0 = Instant::now();
        let mut b = TokenBucket::full(4, t0);
        assert!((0..4).all(|_| b.try_take(4, 100, t0)));
        assert!(!b.try_take(4, 100, t0));
        // 100/s: one token per 10 ms; 9 ms earn nothing, 10 ms one.
        assert!(!b.try_take(4, 100, t0 + 9 * MS));
        assert!(b.try_take(4, 100, t0 + 10 * MS));
        assert!(!b.try_take(4, 100, t0 + 10 * MS));
    }

    #[test]
    fn fractions_of_a_token_are_not_lost() {
        let t0 = Instant::now();
        let mut b = TokenBucket::full(1, t0);
        assert!(b.try_take(1, 100, t0));
        // Asking every 6 ms at 100/s: the 6 ms of a refused try count towards the next token.
        let granted = (1..=50u32)
            .filter(|i| b.try_take(1, 100, t0 + 6 * MS * *i))
            .count();
        assert_eq!(granted, 30, "300 ms at 100/s");
    }

    #[test]
    fn an_idle_bucket_refills_only_up_to_the_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::full(3, t0);
        assert!((0..3).all(|_| b.try_take(3, 1, t0)));
        let later = t0 + Duration::from_secs(3600);
        assert_eq!((0..10).filter(|_| b.try_take(3, 1, later)).count(), 3);
    }

    #[test]
    fn a_clock_going_backwards_earns_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut b = TokenBucket::full(1, t0);
        assert!(b.try_take(1, 1000, t0));
        assert!(!b.try_take(1, 1000, t0 - Duration::from_secs(5)));
    }
}
