//! Reassembling data frames into whole messages, with bounded memory.
//!
//! Messages are keyed by (source MAC, source endpoint, message id). Fragments may arrive in any
//! order, repeat, or overlap (overlapping bytes take the value of the latest fragment). Every
//! fragment must agree with the first one seen for its key on the destination endpoint, kind,
//! flags, total length and cookie; one that does not starts a new message in place of the old
//! partial one (counted as a conflict).
//!
//! Bounds: at most [`ReassemblyLimits::max_messages`] partial messages and
//! [`ReassemblyLimits::max_bytes`] bytes for their buffers and received-byte bitmaps (charged in
//! full when a message's first fragment arrives). When a new message does not fit, the least
//! recently touched partial messages are evicted (counted). Keys of the last
//! [`ReassemblyLimits::remember_completed`] completed messages are remembered so that late
//! duplicates of their fragments are dropped instead of delivered twice or left to rot.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::{DataFrame, MessageHeader};
use crate::error::DecodeError;
use crate::types::{EndpointId, MacAddr};

/// Bounds of a [`Reassembler`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ReassemblyLimits {
    /// Partial messages held at once (at least 1 is used).
    pub max_messages: usize,
    /// Bytes charged to partial messages at once: `total_len` plus `total_len / 8` (rounded up to
    /// 8 bytes) for the bitmap of received bytes.
    pub max_bytes: usize,
    /// Completed message keys remembered to drop late duplicates (0 disables the filter).
    pub remember_completed: usize,
}

impl Default for ReassemblyLimits {
    /// 64 messages, 16 MiB, 256 remembered completions.
    fn default() -> Self {
        ReassemblyLimits {
            max_messages: 64,
            max_bytes: 16 << 20,
            remember_completed: 256,
        }
    }
}

/// Counters of a [`Reassembler`]; they only grow.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ReassemblyStats {
    /// Messages returned whole.
    pub completed: u64,
    /// Fragments that brought no new byte (already received, or of a recently completed message).
    pub duplicates: u64,
    /// Partial messages evicted to make room (their data is lost).
    pub evicted: u64,
    /// Partial messages replaced by a fragment that disagreed with their header (data lost).
    pub conflicts: u64,
    /// Fragments of messages too large for `max_bytes`.
    pub too_large: u64,
    /// Fragments that failed [`DataFrame::validate`].
    pub invalid: u64,
}

/// What [`Reassembler::push`] did with a fragment.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum PushOutcome {
    /// The fragment completed its message.
    Complete(ReassembledMessage),
    /// Stored; the message still misses bytes.
    Incomplete,
    /// The fragment brought nothing new.
    Duplicate,
    /// The message is larger than the reassembler's whole byte budget; dropped.
    TooLarge,
    /// The fragment is malformed; dropped.
    Invalid(DecodeError),
}

/// A whole message, reassembled.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ReassembledMessage {
    /// Source MAC (the frames' source).
    pub src: MacAddr,
    /// The header its fragments carried.
    pub header: MessageHeader,
    /// The message bytes (`total_len` of them).
    pub payload: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    src: MacAddr,
    src_endpoint: EndpointId,
    message_id: u32,
}

/// Header fields every fragment of a message must agree on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Signature {
    header: MessageHeader,
    total_len: u32,
}

#[derive(Debug)]
struct Partial {
    sig: Signature,
    buf: Vec<u8>,
    /// One bit per byte of `buf`: received.
    have: Vec<u64>,
    received: usize,
    cost: usize,
    /// Key of this entry in `Reassembler::lru`.
    touched: u64,
}

/// Reassembles data frames into messages within fixed bounds (see the module documentation).
#[derive(Debug)]
pub struct Reassembler {
    limits: ReassemblyLimits,
    partial: HashMap<Key, Partial>,
    /// Partial messages by last touch, oldest first.
    lru: BTreeMap<u64, Key>,
    clock: u64,
    bytes: usize,
    /// Recently completed messages, with the sequence number of their entry in `recent_order`.
    recent: HashMap<Key, (Signature, u64)>,
    recent_order: VecDeque<(Key, u64)>,
    stats: ReassemblyStats,
}

/// Bytes charged for a partial message of `total_len` bytes: buffer plus bitmap.
fn cost_of(total_len: usize) -> usize {
    total_len.saturating_add(total_len.div_ceil(64).saturating_mul(8))
}

/// Marks bytes `start..end` received; returns how many were not already.
fn mark(bits: &mut [u64], start: usize, end: usize) -> usize {
    let mut newly = 0;
    let mut i = start;
    while i < end {
        let bit = i % 64;
        let n = (64 - bit).min(end - i);
        let mask = if n == 64 {
            u64::MAX
        } else {
            ((1u64 << n) - 1) << bit
        };
        let Some(word) = bits.get_mut(i / 64) else {
            break;
        };
        newly += (mask & !*word).count_ones() as usize;
        *word |= mask;
        i += n;
    }
    newly
}

impl Reassembler {
    /// An empty reassembler with these bounds.
    pub fn new(limits: ReassemblyLimits) -> Self {
        Reassembler {
            limits,
            partial: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
            bytes: 0,
            recent: HashMap::new(),
            recent_order: VecDeque::new(),
            stats: ReassemblyStats::default(),
        }
    }

    /// The bounds.
    pub fn limits(&self) -> ReassemblyLimits {
        self.limits
    }

    /// The counters.
    pub fn stats(&self) -> ReassemblyStats {
        self.stats
    }

    /// Partial messages held.
    pub fn in_progress(&self) -> usize {
        self.partial.len()
    }

    /// Bytes charged to partial messages (never more than `max_bytes`).
    pub fn buffered_bytes(&self) -> usize {
        self.bytes
    }

    /// Completed keys remembered for the duplicate filter.
    pub fn remembered(&self) -> usize {
        self.recent.len()
    }

    /// Drops every partial message (counted as evicted), e.g. when the uplink goes down.
    pub fn clear(&mut self) {
        self.stats.evicted += self.partial.len() as u64;
        self.partial.clear();
        self.lru.clear();
        self.bytes = 0;
    }

    /// Takes one fragment that arrived from `src` (the frame's source MAC).
    pub fn push(&mut self, src: MacAddr, frag: &DataFrame<'_>) -> PushOutcome {
        if let Err(e) = frag.validate() {
            self.stats.invalid += 1;
            return PushOutcome::Invalid(e);
        }
        let key = Key {
            src,
            src_endpoint: frag.header.src_endpoint,
            message_id: frag.header.message_id,
        };
        let sig = Signature {
            header: frag.header,
            total_len: frag.total_len,
        };
        match self.recent.get(&key) {
            Some((s, _)) if *s == sig => {
                self.stats.duplicates += 1;
                return PushOutcome::Duplicate;
            }
            // Same key, different header: a new message reusing the id.
            Some(_) => {
                self.recent.remove(&key);
            }
            None => {}
        }
        if let Some(p) = self.partial.get(&key) {
            if p.sig != sig {
                self.stats.conflicts += 1;
                self.remove_partial(&key);
            }
        }
        if !self.partial.contains_key(&key) {
            if frag.is_whole_message() {
                return self.complete(key, sig, frag.payload.to_vec());
            }
            if let Some(out) = self.start_partial(key, sig) {
                return out;
            }
        }
        self.merge(key, frag)
    }

    /// Makes room for and inserts an empty partial message; `Some` if that is impossible.
    fn start_partial(&mut self, key: Key, sig: Signature) -> Option<PushOutcome> {
        let total = sig.total_len as usize;
        let cost = cost_of(total);
        if cost > self.limits.max_bytes {
            self.stats.too_large += 1;
            return Some(PushOutcome::TooLarge);
        }
        let max_messages = self.limits.max_messages.max(1);
        while self.partial.len() >= max_messages || self.bytes + cost > self.limits.max_bytes {
            let Some((_, oldest)) = self.lru.pop_first() else {
                break;
            };
            if let Some(p) = self.partial.remove(&oldest) {
                self.bytes -= p.cost;
                self.stats.evicted += 1;
            }
        }
        self.clock += 1;
        self.lru.insert(self.clock, key);
        self.bytes += cost;
        self.partial.insert(
            key,
            Partial {
                sig,
                buf: vec![0; total],
                have: vec![0; total.div_ceil(64)],
                received: 0,
                cost,
                touched: self.clock,
            },
        );
        None
    }

    /// Adds a fragment to an existing partial message.
    fn merge(&mut self, key: Key, frag: &DataFrame<'_>) -> PushOutcome {
        let Some(p) = self.partial.get_mut(&key) else {
            // start_partial inserted it; reaching here would be a bug, reported as a drop.
            self.stats.evicted += 1;
            return PushOutcome::Incomplete;
        };
        let start = frag.frag_offset as usize;
        let end = start + frag.payload.len();
        let newly = mark(&mut p.have, start, end);
        if let Some(dst) = p.buf.get_mut(start..end) {
            dst.copy_from_slice(frag.payload);
        }
        if newly == 0 {
            self.stats.duplicates += 1;
            return PushOutcome::Duplicate;
        }
        p.received += newly;
        if p.received < p.buf.len() {
            self.clock += 1;
            let old = std::mem::replace(&mut p.touched, self.clock);
            self.lru.remove(&old);
            self.lru.insert(self.clock, key);
            return PushOutcome::Incomplete;
        }
        match self.remove_partial(&key) {
            Some(p) => self.complete(key, p.sig, p.buf),
            None => PushOutcome::Incomplete,
        }
    }

    fn remove_partial(&mut self, key: &Key) -> Option<Partial> {
        let p = self.partial.remove(key)?;
        self.lru.remove(&p.touched);
        self.bytes -= p.cost;
        Some(p)
    }

    fn complete(&mut self, key: Key, sig: Signature, payload: Vec<u8>) -> PushOutcome {
        self.stats.completed += 1;
        if self.limits.remember_completed > 0 {
            while self.recent_order.len() >= self.limits.remember_completed {
                let Some((old, seq)) = self.recent_order.pop_front() else {
                    break;
                };
                if self.recent.get(&old).is_some_and(|(_, s)| *s == seq) {
                    self.recent.remove(&old);
                }
            }
            self.clock += 1;
            self.recent.insert(key, (sig, self.clock));
            self.recent_order.push_back((key, self.clock));
        }
        PushOutcome::Complete(ReassembledMessage {
            src: key.src,
            header: sig.header,
            payload,
        })
    }
}
