//! The retransmission timeout of a sending session: RFC 6298's estimator with the bounds of
//! [`super::ReliableConfig`] in place of its 1 s minimum and 60 s maximum, and exponential
//! backoff. Callers apply Karn's rule: no sample from a retransmitted frame.

use std::time::Duration;

/// Smoothed round-trip time, its variation and the current timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    rto: Duration,
    min: Duration,
    max: Duration,
}

impl RttEstimator {
    /// An estimator without samples: the timeout is `initial`, kept within `min..=max`.
    pub fn new(initial: Duration, min: Duration, max: Duration) -> RttEstimator {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            rto: initial.clamp(min, max),
            min,
            max,
        }
    }

    /// The current retransmission timeout.
    pub fn rto(&self) -> Duration {
        self.rto
    }

    /// The smoothed round-trip time, once there is a sample.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// Takes a round-trip sample (RFC 6298 2.2 and 2.3, alpha 1/8, beta 1/4, K 4); the timeout
    /// is recomputed, which also ends any backoff (5.7).
    pub fn sample(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                let err = srtt.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + err) / 4;
                self.srtt = Some((srtt * 7 + r) / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(r);
        self.rto = (srtt + self.rttvar * 4).clamp(self.min, self.max);
    }

    /// Doubles the timeout after an expiry (RFC 6298 5.5), up to the maximum.
    pub fn back_off(&mut self) {
        self.rto = self.rto.saturating_mul(2).min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn follows_rfc6298_within_bounds() {
        let mut e = RttEstimator::new(10 * MS, MS, 200 * MS);
        assert_eq!(e.rto(), 10 * MS);
        assert_eq!(e.srtt(), None);
        e.sample(Duration::from_micros(400));
        // srtt 400 us, rttvar 200 us: 400 + 4 * 200 = 1.2 ms.
        assert_eq!(e.rto(), Duration::from_micros(1200));
        e.sample(Duration::from_micros(800));
        // rttvar = (3 * 200 + 400) / 4 = 250; srtt = (7 * 400 + 800) / 8 = 450.
        assert_eq!(e.srtt(), Some(Duration::from_micros(450)));
        assert_eq!(e.rto(), Duration::from_micros(1450));
        // Tiny samples are held at the minimum.
        for _ in 0..50 {
            e.sample(Duration::from_micros(5));
        }
        assert_eq!(e.rto(), MS);
        // Backoff doubles up to the maximum; a sample ends it.
        for _ in 0..20 {
            e.back_off();
        }
        assert_eq!(e.rto(), 200 * MS);
        e.sample(Duration::from_micros(5));
        assert_eq!(e.rto(), MS);
        // A huge sample is capped.
        e.sample(Duration::from_secs(30));
        assert_eq!(e.rto(), 200 * MS);
    }
}
