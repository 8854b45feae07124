//! Engine settings, validated before anything starts.

use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

/// How a new channel is assigned to a worker. In the configuration file: `placement =
/// "endpoint-hash"` or `"least-loaded"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Open-MX style: a hash of the endpoint id picks the worker, so an endpoint always lands on
    /// the same worker (and CPU) whatever else exists. Stateless and predictable.
    #[default]
    EndpointHash,
    /// The worker serving the fewest channels.
    LeastLoaded,
}

/// Default [`EngineConfig::byte_budget`]: 1 MiB, some tens of microseconds of copying for the
/// other channels to wait, while 64 KiB messages still go sixteen to a pass (each pass end costs
/// a publish and a fence).
pub const DEFAULT_BYTE_BUDGET: u32 = 1 << 20;

/// Bounds of [`EngineConfig::byte_budget`]: at least a page (smaller pieces cost more in locking
/// and publishing than they save), at most 64 MiB (the largest default channel region).
const BYTE_BUDGET_RANGE: std::ops::RangeInclusive<u32> = 4096..=64 << 20;

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Number of worker threads ("microengines"), 1..=64.
    pub workers: usize,
    /// At most this many TX messages of one channel per pass (fairness between channels).
    pub poll_budget: u32,
    /// A channel's share of a pass also ends once it has copied this many DMA-data bytes, and a
    /// DMA-data message longer than this is copied in pieces of this size, one per pass (so that
    /// one sender of large messages cannot stall the other channels of its worker).
    pub byte_budget: u32,
    /// How long a message may wait for room (RX ring full, no posted buffer) before its sender
    /// gets an error completion.
    pub backpressure_wait: Duration,
    /// Idle passes a worker spins before it starts yielding.
    pub spin_passes: u32,
    /// Idle passes (spinning + yielding) before a worker advertises sleeping and blocks.
    pub idle_passes: u32,
    /// Longest a sleeping worker blocks before it re-checks its channels anyway.
    pub max_sleep: Duration,
    /// Worker placement policy.
    pub placement: Placement,
    /// Pin worker i to CPU i modulo the CPUs available, and tell clients which CPU serves them.
    pub pin_workers: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: 1,
            poll_budget: 64,
            byte_budget: DEFAULT_BYTE_BUDGET,
            backpressure_wait: Duration::from_millis(100),
            spin_passes: 2_000,
            idle_passes: 4_000,
            max_sleep: Duration::from_millis(200),
            placement: Placement::EndpointHash,
            pin_workers: false,
        }
    }
}

/// A setting out of range.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("engine setting {field} = {value} is invalid: {expected}")]
pub struct ConfigError {
    /// Setting name.
    pub field: &'static str,
    /// Value given.
    pub value: String,
    /// What is allowed.
    pub expected: &'static str,
}

impl EngineConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |field, value: String, expected| {
            Err(ConfigError {
                field,
                value,
                expected,
            })
        };
        if !(1..=64).contains(&self.workers) {
            return err("workers", self.workers.to_string(), "1..=64");
        }
        if !(1..=4096).contains(&self.poll_budget) {
            return err("poll_budget", self.poll_budget.to_string(), "1..=4096");
        }
        if !BYTE_BUDGET_RANGE.contains(&self.byte_budget) {
            return err(
                "byte_budget",
                self.byte_budget.to_string(),
                "4096..=67108864 (4 KiB to 64 MiB)",
            );
        }
        if self.backpressure_wait > Duration::from_secs(60) {
            return err(
                "backpressure_wait",
                format!("{:?}", self.backpressure_wait),
                "at most 60 s",
            );
        }
        if self.spin_passes > self.idle_passes {
            return err(
                "spin_passes",
                self.spin_passes.to_string(),
                "at most idle_passes",
            );
        }
        if self.max_sleep.is_zero() || self.max_sleep > Duration::from_secs(3600) {
            return err(
                "max_sleep",
                format!("{:?}", self.max_sleep),
                "between 1 ns and 1 hour",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_each_bad_field_is_named() {
        assert!(EngineConfig::default().validate().is_ok());
        for byte_budget in [4096, 64 << 20] {
            let c = EngineConfig {
                byte_budget,
                ..Default::default()
            };
            assert!(c.validate().is_ok(), "byte_budget {byte_budget}");
        }
        let bad = [
            EngineConfig {
                workers: 0,
                ..Default::default()
            },
            EngineConfig {
                poll_budget: 0,
                ..Default::default()
            },
            EngineConfig {
                byte_budget: 4095,
                ..Default::default()
            },
            EngineConfig {
                byte_budget: (64 << 20) + 1,
                ..Default::default()
            },
            EngineConfig {
                backpressure_wait: Duration::from_secs(61),
                ..Default::default()
            },
            EngineConfig {
                spin_passes: 10,
                idle_passes: 5,
                ..Default::default()
            },
            EngineConfig {
                max_sleep: Duration::ZERO,
                ..Default::default()
            },
        ];
        let fields = [
            "workers",
            "poll_budget",
            "byte_budget",
            "byte_budget",
            "backpressure_wait",
            "spin_passes",
            "max_sleep",
        ];
        for (c, f) in bad.iter().zip(fields) {
            assert_eq!(c.validate().unwrap_err().field, f);
        }
    }
}
