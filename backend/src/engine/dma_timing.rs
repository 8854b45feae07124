//! Where a worker's time goes around DMA-data copies: built only with the `dma-timing` feature,
//! for the `dma/*` benches (see `scripts/research/dma-phases.sh`).
//!
//! Each worker thread records, for every DMA-data copy, how long the copy took and how long it
//! spent since the end of its previous copy (the *gap*: taking the next message, validating it,
//! routing it, taking a posted buffer, and publishing the previous copy and its completion).
//! Gaps longer than [`PAUSE_TICKS`] are counted as pauses (the worker had nothing to copy),
//! not as gaps. Times are in time-stamp-counter ticks (constant-rate on x86-64; see
//! [`ticks_per_second`]); elsewhere in nanoseconds.
//!
//! The recording is a few plain loads and stores per copy into counters only its own thread
//! writes: no locked instruction, which would change what it measures (a locked instruction
//! waits for all earlier stores to reach the cache).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::counters::bump;

/// Buckets of the gap histogram: bucket 0 holds gaps below 256 ticks, bucket `i` those from
/// `2^(i+7)` to `2^(i+8)`, the last one everything longer (up to [`PAUSE_TICKS`]).
pub const GAP_BUCKETS: usize = 12;

/// A gap longer than this (about 200 µs at 2.5 GHz) is a pause: the worker was idle or
/// serving nothing, not working between copies.
pub const PAUSE_TICKS: u64 = 1 << 19;

/// Totals over every worker thread since the process started.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DmaTiming {
    /// DMA-data copies made.
    pub copies: u64,
    /// Ticks spent copying.
    pub copy_ticks: u64,
    /// Copies that followed another copy of the same worker within [`PAUSE_TICKS`].
    pub gaps: u64,
    /// Ticks spent in those gaps.
    pub gap_ticks: u64,
    /// Histogram of the gaps (see [`GAP_BUCKETS`]).
    pub gap_histogram: [u64; GAP_BUCKETS],
}

impl DmaTiming {
    /// What happened between `earlier` and `self` (both totals of this process).
    pub fn since(&self, earlier: &DmaTiming) -> DmaTiming {
        let gap_histogram =
            std::array::from_fn(|i| self.gap_histogram[i].wrapping_sub(earlier.gap_histogram[i]));
        DmaTiming {
            copies: self.copies.wrapping_sub(earlier.copies),
            copy_ticks: self.copy_ticks.wrapping_sub(earlier.copy_ticks),
            gaps: self.gaps.wrapping_sub(earlier.gaps),
            gap_ticks: self.gap_ticks.wrapping_sub(earlier.gap_ticks),
            gap_histogram,
        }
    }
}

/// One worker thread's counters: written by that thread only (a plain load and store each, so
/// no update is lost), read by anyone.
#[derive(Default)]
struct ThreadTiming {
    last_end: AtomicU64,
    copies: AtomicU64,
    copy_ticks: AtomicU64,
    gaps: AtomicU64,
    gap_ticks: AtomicU64,
    gap_histogram: [AtomicU64; GAP_BUCKETS],
}

/// Every thread that has recorded a copy.
static THREADS: Mutex<Vec<Arc<ThreadTiming>>> = Mutex::new(Vec::new());

thread_local! {
    static MINE: Arc<ThreadTiming> = {
        let t = Arc::new(ThreadTiming::default());
        THREADS.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(&t));
        t
    };
}

/// The time-stamp counter (x86-64), else nanoseconds since the first call.
#[inline]
pub(crate) fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC is in the x86-64 baseline; it reads a counter and touches no memory.
        unsafe { std::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Records a copy made by the calling thread from `start` to `end` (values of [`now`]).
#[inline]
pub(crate) fn record_copy(start: u64, end: u64) {
    MINE.with(|t| {
        bump(&t.copies, 1);
        bump(&t.copy_ticks, end.wrapping_sub(start));
        let last = t.last_end.load(Relaxed);
        t.last_end.store(end, Relaxed);
        let gap = start.wrapping_sub(last);
        if last != 0 && gap <= PAUSE_TICKS {
            bump(&t.gaps, 1);
            bump(&t.gap_ticks, gap);
            let bucket = (u64::BITS - gap.leading_zeros()).saturating_sub(8) as usize;
            bump(&t.gap_histogram[bucket.min(GAP_BUCKETS - 1)], 1);
        }
    });
}

/// Totals over every worker thread so far.
pub fn dma_timing() -> DmaTiming {
    let threads = THREADS.lock().unwrap_or_else(|e| e.into_inner());
    let mut sum = DmaTiming::default();
    for t in threads.iter().map(|t| t.snapshot()) {
        sum.copies += t.copies;
        sum.copy_ticks += t.copy_ticks;
        sum.gaps += t.gaps;
        sum.gap_ticks += t.gap_ticks;
        for (s, h) in sum.gap_histogram.iter_mut().zip(t.gap_histogram) {
            *s += h;
        }
    }
    sum
}

impl ThreadTiming {
    fn snapshot(&self) -> DmaTiming {
        DmaTiming {
            copies: self.copies.load(Relaxed),
            copy_ticks: self.copy_ticks.load(Relaxed),
            gaps: self.gaps.load(Relaxed),
            gap_ticks: self.gap_ticks.load(Relaxed),
            gap_histogram: std::array::from_fn(|i| self.gap_histogram[i].load(Relaxed)),
        }
    }
}

/// Ticks of [`now`] per second, measured over `window` against the monotonic clock.
pub fn ticks_per_second(window: Duration) -> f64 {
    let (t0, i0) = (now(), Instant::now());
    while i0.elapsed() < window {
        std::hint::spin_loop();
    }
    let (t1, elapsed) = (now(), i0.elapsed());
    t1.wrapping_sub(t0) as f64 / elapsed.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_between_copies_are_bucketed_and_pauses_left_out() {
        // The calling thread's own counters: other tests may copy in other threads meanwhile.
        let mine = || MINE.with(|t| t.snapshot());
        std::thread::spawn(move || {
            let before = mine();
            record_copy(1_000, 4_000); // the thread's first copy: no gap yet
            record_copy(4_300, 7_000); // gap 300: bucket 1 (256..512)
            record_copy(7_100, 9_000); // gap 100: bucket 0
            record_copy(9_000 + PAUSE_TICKS + 1, 9_000 + PAUSE_TICKS + 3_000); // a pause
            let d = mine().since(&before);
            assert!(
                dma_timing().copies >= 4,
                "the process totals include this thread"
            );
            assert_eq!(d.copies, 4);
            assert_eq!(d.copy_ticks, 3_000 + 2_700 + 1_900 + 2_999);
            assert_eq!(d.gaps, 2);
            assert_eq!(d.gap_ticks, 400);
            assert_eq!(d.gap_histogram[0], 1);
            assert_eq!(d.gap_histogram[1], 1);
            assert_eq!(d.gap_histogram.iter().sum::<u64>(), 2);
        })
        .join()
        .unwrap();
    }
}
