//! Latency percentiles and throughput figures.

use std::time::Duration;

/// Round-trip statistics over a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencyStats {
    /// Round trips measured.
    pub count: usize,
    /// Fastest.
    pub min: Duration,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Mean.
    pub mean: Duration,
}

impl LatencyStats {
    /// Computes the statistics of `samples` (empty gives all zeros).
    pub fn from_samples(mut samples: Vec<Duration>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let n = samples.len();
        let pick = |q: f64| samples[((n as f64 - 1.0) * q).round() as usize];
        let total: Duration = samples.iter().sum();
        LatencyStats {
            count: n,
            min: samples[0],
            p50: pick(0.5),
            p99: pick(0.99),
            mean: total / n as u32,
        }
    }
}

/// Streaming throughput.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Throughput {
    /// Messages (or frames) received.
    pub messages: u64,
    /// Payload bytes received.
    pub bytes: u64,
    /// Time from the first to the last message.
    pub elapsed: Duration,
}

impl Throughput {
    /// Messages per second.
    pub fn messages_per_sec(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Payload bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_set() {
        let s = LatencyStats::from_samples((1..=100).map(Duration::from_micros).collect());
        assert_eq!(s.count, 100);
        assert_eq!(s.min, Duration::from_micros(1));
        assert_eq!(s.p50, Duration::from_micros(51));
        assert_eq!(s.p99, Duration::from_micros(99));
        assert_eq!(LatencyStats::from_samples(vec![]), LatencyStats::default());
    }
}
