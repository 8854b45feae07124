//! Fault injection on the uplink, for tests (the kernel here has no netem): a seeded, pure
//! decision per frame to drop it, send it twice, or hold it back and release it after the next
//! few frames. Off unless configured (docs/wire.md, "Fault injection").

use std::collections::VecDeque;

use crate::counter_set::counts;

/// Fractions of frames to drop, duplicate and reorder, each in `0.0..=1.0`; all zero is off.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultInjection {
    /// Fraction of frames dropped.
    pub drop: f64,
    /// Fraction of frames sent twice.
    pub duplicate: f64,
    /// Fraction of frames held back and sent after the next 1 to [`MAX_REORDER_DISTANCE`]
    /// frames.
    pub reorder: f64,
}

/// How many later frames a reordered frame may wait for.
pub const MAX_REORDER_DISTANCE: u32 = 3;
/// Frames held back at once; when full, a frame picked for reordering is sent at once.
pub const MAX_HELD: usize = 16;

impl FaultInjection {
    /// Checks that each fraction is a number in `0.0..=1.0`; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!(
                    "fault injection: {name} = {v} is not a fraction in 0.0..=1.0"
                ));
            }
        }
        Ok(())
    }

    /// True if no fault is injected.
    pub fn is_off(&self) -> bool {
        self.drop == 0.0 && self.duplicate == 0.0 && self.reorder == 0.0
    }
}

counts! {
    /// What the injector did.
    pub struct FaultCounters {
        /// Frames that went through the injector.
        frames,
        /// Frames dropped.
        dropped,
        /// Frames sent twice.
        duplicated,
        /// Frames held back.
        reordered,
    }
}

/// xorshift64* (Vigna): small, fast, and good enough to pick which frames to hurt.
#[derive(Clone, Copy, Debug)]
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        // One splitmix64 step spreads nearby seeds apart; the state must never be zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        XorShift((z ^ (z >> 31)).max(1))
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A uniform number in `0.0..1.0`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Applies a [`FaultInjection`] to a stream of frames, deterministically for a seed.
#[derive(Debug)]
pub struct FaultInjector<F> {
    cfg: FaultInjection,
    rng: XorShift,
    /// Held frames and how many more frames each waits for.
    held: VecDeque<(F, u32)>,
    counters: FaultCounters,
}

impl<F: Clone> FaultInjector<F> {
    /// An injector for `cfg` (validated) seeded with `seed`.
    pub fn new(cfg: FaultInjection, seed: u64) -> Result<FaultInjector<F>, String> {
        cfg.validate()?;
        Ok(FaultInjector {
            cfg,
            rng: XorShift::new(seed),
            held: VecDeque::new(),
            counters: FaultCounters::default(),
        })
    }

    /// What the injector did so far.
    pub fn counters(&self) -> &FaultCounters {
        &self.counters
    }

    /// Frames held back now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Decides the fate of `frame` and appends what goes on the wire now to `out`: nothing
    /// (dropped or held), the frame, or the frame twice; then the held frames whose wait ended.
    pub fn apply(&mut self, frame: F, out: &mut Vec<F>) {
        self.counters.frames += 1;
        let mut released = Vec::new();
        for (_, wait) in self.held.iter_mut() {
            *wait = wait.saturating_sub(1);
        }
        while let Some(i) = self.held.iter().position(|(_, w)| *w == 0) {
            if let Some((f, _)) = self.held.remove(i) {
                released.push(f);
            }
        }
        if self.cfg.is_off() {
            out.push(frame);
        } else if self.rng.unit() < self.cfg.drop {
            self.counters.dropped += 1;
        } else if self.rng.unit() < self.cfg.reorder && self.held.len() < MAX_HELD {
            self.counters.reordered += 1;
            let wait = 1 + (self.rng.next_u64() % u64::from(MAX_REORDER_DISTANCE)) as u32;
            self.held.push_back((frame, wait));
        } else if self.rng.unit() < self.cfg.duplicate {
            self.counters.duplicated += 1;
            out.push(frame.clone());
            out.push(frame);
        } else {
            out.push(frame);
        }
        out.append(&mut released);
    }

    /// Sends every held frame now (when the link goes idle).
    pub fn release_all(&mut self, out: &mut Vec<F>) {
        out.extend(self.held.drain(..).map(|(f, _)| f));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cfg: FaultInjection, seed: u64, n: u32) -> (Vec<u32>, FaultCounters) {
        let mut inj = FaultInjector::new(cfg, seed).unwrap();
        let mut out = Vec::new();
        for i in 0..n {
            inj.apply(i, &mut out);
            assert!(inj.held() <= MAX_HELD);
        }
        inj.release_all(&mut out);
        (out, *inj.counters())
    }

    #[test]
    fn fractions_are_validated() {
        assert!(FaultInjection::default().is_off());
        assert_eq!(FaultInjection::default().validate(), Ok(()));
        for bad in [-0.1, 1.5, f64::NAN] {
            for spoil in [
                FaultInjection {
                    drop: bad,
                    ..Default::default()
                },
                FaultInjection {
                    duplicate: bad,
                    ..Default::default()
                },
                FaultInjection {
                    reorder: bad,
                    ..Default::default()
                },
            ] {
                assert!(spoil.validate().is_err(), "{spoil:?}");
                assert!(FaultInjector::<u32>::new(spoil, 1).is_err());
            }
        }
    }

    #[test]
    fn off_passes_everything_in_order() {
        let (out, c) = run(FaultInjection::default(), 7, 1000);
        assert_eq!(out, (0..1000).collect::<Vec<_>>());
        assert_eq!((c.dropped, c.duplicated, c.reordered), (0, 0, 0));
    }

    #[test]
    fn each_fault_happens_at_about_its_rate_and_is_deterministic() {
        let cfg = FaultInjection {
            drop: 0.05,
            duplicate: 0.05,
            reorder: 0.05,
        };
        let n = 100_000;
        let (out, c) = run(cfg, 42, n);
        assert!(run(cfg, 42, n).0 == out, "same seed, same faults");
        assert!(run(cfg, 43, n).0 != out, "another seed, other faults");
        for (what, count) in [
            ("dropped", c.dropped),
            ("duplicated", c.duplicated),
            ("reordered", c.reordered),
        ] {
            let rate = count as f64 / f64::from(n);
            assert!((0.04..0.06).contains(&rate), "{what}: {rate}");
        }
        // Every frame not dropped comes out, duplicated ones twice.
        assert_eq!(out.len() as u64, u64::from(n) - c.dropped + c.duplicated);
        // Reordered frames come out at most MAX_REORDER_DISTANCE frames late.
        let late = out.windows(2).filter(|w| w[1] < w[0]).count() as u64;
        assert!(late > 0 && late <= c.reordered, "{late} inversions");
        // Overtaken by at most that many later frames.
        let mut seen = std::collections::BTreeSet::new();
        for (pos, &f) in out.iter().enumerate() {
            let overtaken_by = seen.range(f + 1..).count();
            assert!(
                overtaken_by <= MAX_REORDER_DISTANCE as usize,
                "frame {f} at {pos} after {overtaken_by} later frames"
            );
            seen.insert(f);
        }
    }
}
