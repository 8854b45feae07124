//! Per-channel and per-worker counters. Every message taken from a TX ring is counted once as
//! delivered or once under the status of its error completion, so that
//! `tx_taken == tx_delivered + sum(tx_errors)` holds at every quiescent point.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use svnic_channels::CompletionStatus;

use crate::counter_set::counter_set;

const N_STATUS: usize = 16;

/// Counters of one channel (atomics: the serving worker and delivering workers update them).
#[derive(Debug, Default)]
pub struct ChannelCounters {
    tx_taken: AtomicU64,
    tx_delivered: AtomicU64,
    tx_errors: [AtomicU64; N_STATUS],
    rx_messages: AtomicU64,
    rx_bytes: AtomicU64,
    completions_posted: AtomicU64,
    completions_dropped: AtomicU64,
    backpressure_holds: AtomicU64,
    bad_posts: AtomicU64,
    wakes_sent: AtomicU64,
}

/// A snapshot of a channel's counters.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ChannelStats {
    /// Messages taken from the TX ring.
    pub tx_taken: u64,
    /// Of those, delivered.
    pub tx_delivered: u64,
    /// Of those, error-completed, by status.
    pub tx_errors: Vec<(CompletionStatus, u64)>,
    /// Messages written into this channel's RX ring as a destination.
    pub rx_messages: u64,
    /// DMA-data bytes copied into this channel.
    pub rx_bytes: u64,
    /// Completions written into this channel's RX ring.
    pub completions_posted: u64,
    /// Completions that could not be written because the channel went away.
    pub completions_dropped: u64,
    /// Times a message of this channel had to wait for room at its destination.
    pub backpressure_holds: u64,
    /// Posted buffers refused.
    pub bad_posts: u64,
    /// Wakes sent to this channel's sleeping guest.
    pub wakes_sent: u64,
}

impl ChannelStats {
    /// Sum of all error completions.
    pub fn tx_errors_total(&self) -> u64 {
        self.tx_errors.iter().map(|(_, n)| n).sum()
    }

    /// Error completions with `status`.
    pub fn errors(&self, status: CompletionStatus) -> u64 {
        self.tx_errors
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    }
}

/// Counts accumulated by a worker during one pass over one channel, added to the atomics once.
#[derive(Debug, Default)]
pub(crate) struct TxTally {
    pub taken: u64,
    pub delivered: u64,
    pub errors: [u64; N_STATUS],
    pub holds: u64,
}

impl TxTally {
    pub fn error(&mut self, s: CompletionStatus) {
        self.taken += 1;
        if let Some(e) = self.errors.get_mut(usize::from(s.code())) {
            *e += 1;
        }
    }
    pub fn delivered(&mut self) {
        self.taken += 1;
        self.delivered += 1;
    }
}

/// Adds `n` to a counter that one thread at a time writes: a load and a store rather than a
/// locked read-modify-write. On x86 a locked instruction waits for every earlier store to
/// reach the cache, and on the data path those include the ring index just published, whose
/// cache line the other side's core holds: each `fetch_add` after a publish cost a cross-core
/// round trip. Readers (stats snapshots) see a value that is at most one update old.
pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

// Who writes what (one writer at a time, so `bump` is exact):
// - TX counters and backpressure holds: the channel's serving worker, the only one;
// - RX, completion and bad-post counters: whoever holds the channel's RX lock;
// - wakes: any worker, without the lock: a real `fetch_add`.
impl ChannelCounters {
    /// Serving worker only.
    pub(crate) fn add_tx(&self, t: &TxTally) {
        if t.taken == 0 && t.holds == 0 {
            return;
        }
        bump(&self.tx_taken, t.taken);
        bump(&self.tx_delivered, t.delivered);
        bump(&self.backpressure_holds, t.holds);
        for (i, n) in t.errors.iter().enumerate() {
            if *n > 0 {
                bump(&self.tx_errors[i], *n);
            }
        }
    }
    /// Under the channel's RX lock.
    pub(crate) fn add_rx(&self, messages: u64, bytes: u64) {
        bump(&self.rx_messages, messages);
        bump(&self.rx_bytes, bytes);
    }
    /// Under the channel's RX lock.
    pub(crate) fn add_completions(&self, posted: u64, dropped: u64) {
        bump(&self.completions_posted, posted);
        bump(&self.completions_dropped, dropped);
    }
    /// Under the channel's RX lock.
    pub(crate) fn bad_post(&self) {
        bump(&self.bad_posts, 1);
    }
    pub(crate) fn wake_sent(&self) {
        self.wakes_sent.fetch_add(1, Relaxed);
    }

    /// A consistent-enough snapshot (each field read once, relaxed).
    pub fn snapshot(&self) -> ChannelStats {
        let tx_errors = CompletionStatus::ALL
            .iter()
            .filter(|s| **s != CompletionStatus::Ok)
            .map(|s| (*s, self.tx_errors[usize::from(s.code())].load(Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect();
        ChannelStats {
            tx_taken: self.tx_taken.load(Relaxed),
            tx_delivered: self.tx_delivered.load(Relaxed),
            tx_errors,
            rx_messages: self.rx_messages.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            completions_posted: self.completions_posted.load(Relaxed),
            completions_dropped: self.completions_dropped.load(Relaxed),
            backpressure_holds: self.backpressure_holds.load(Relaxed),
            bad_posts: self.bad_posts.load(Relaxed),
            wakes_sent: self.wakes_sent.load(Relaxed),
        }
    }
}

counter_set! {
    /// Counters of one worker (written by its thread only).
    pub struct WorkerCounters;
    /// A worker's counts (see [`WorkerStats`]).
    pub struct WorkerCounts {
        /// Passes over its channels that found work.
        passes,
        /// TX messages processed.
        messages,
        /// Times it advertised sleeping and blocked.
        sleeps,
        /// Doorbells received.
        doorbells,
        /// Channels it faulted.
        faults,
        /// Channels it serves now.
        channels,
    }
}

/// A snapshot of a worker's counters.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WorkerStats {
    /// Worker index.
    pub worker: usize,
    /// Host CPU it is pinned to.
    pub cpu: Option<u32>,
    /// Its counters.
    pub counts: WorkerCounts,
}

impl WorkerCounters {
    /// A pass that took `messages` (the worker's own thread).
    pub(crate) fn pass(&self, messages: u64) {
        bump(&self.passes, 1);
        bump(&self.messages, messages);
    }

    pub(crate) fn snapshot(&self, worker: usize, cpu: Option<u32>) -> WorkerStats {
        WorkerStats {
            worker,
            cpu,
            counts: self.read(),
        }
    }
}

const _: () = assert!(N_STATUS > 10, "room for every CompletionStatus code");
