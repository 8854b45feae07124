//! The receiving side: one [`RecvSession`] per (local channel, remote channel), in a bounded
//! [`RecvTable`]. Frames are taken in order only, straight into the engine's placement (no
//! buffering here). docs/wire.md ("Receiver") is the normative description.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use svnic_channels::frame::{AckKind, DataKind};
use svnic_channels::{ChannelAddr, ChannelId, CompletionStatus};

use crate::counter_set::counts;

use super::{seq_lt, BundleHeader, DataHeader, OutgoingAck, ReliableConfig, SessionKey};

counts! {
    /// What a receive table took, dropped and refused.
    pub struct RecvCounters {
        /// Frames the engine placed.
        frames_accepted,
        /// Messages whose last frame (or bundle entry) the engine placed.
        messages_delivered,
        /// Bundle frames whose every entry the engine placed.
        bundles_accepted,
        /// Frames already processed (dropped; an ack is due).
        duplicates,
        /// Frames ahead of the next expected one (dropped; an ack is due).
        out_of_order,
        /// Frames that do not continue their message or start a new one properly (dropped, not
        /// acknowledged).
        invalid,
        /// First frames of a session this state saw before (stale duplicates, dropped).
        stale_sessions,
        /// Frames without state answered with RESET.
        resets_sent,
        /// First frames dropped because the table is full of live states.
        table_full,
        /// Frames the engine could not place yet (blocked: not taken, retransmitted later).
        blocked,
        /// Messages rejected (the engine could not place them).
        rejects,
        /// Frames of a rejected message, answered with the reject again.
        rejects_resent,
        /// Partial messages given up (sender silent for the state lifetime, or a new session).
        abandoned,
        /// States dropped after the state lifetime without progress.
        states_expired,
    }
}

/// What to do with a data frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The next frame in order: place it, then call `accepted`, `blocked` or `rejected`. `first`:
    /// it starts a message (create its placement); `last`: it ends it (publish). Whatever can
    /// block (a posted buffer for the first frame, an RX ring slot for the last) is checked
    /// before `accepted`: an accepted frame is never taken back.
    Process {
        /// The frame starts a message.
        first: bool,
        /// The frame ends its message.
        last: bool,
    },
    /// Dropped and counted (an ack may be due).
    Drop,
    /// Dropped: no state for its session; answer [`AckKind::Reset`] for the frame's session.
    Reset,
}

/// What to do with a bundle frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BundleVerdict {
    /// The next frame in order: place its entries from `skip` on (those before were placed
    /// when an earlier copy of the frame was blocked part way), calling `entry_accepted` after
    /// each, or `blocked` / `rejected` for the one that cannot be placed (then stop).
    Process {
        /// Entries already placed.
        skip: u16,
    },
    /// Dropped and counted (an ack may be due).
    Drop,
    /// Dropped: no state for its session; answer [`AckKind::Reset`] for the frame's session.
    Reset,
}

/// A bundle whose entries are being placed.
#[derive(Clone, Copy, Debug)]
struct BundleCursor {
    header: BundleHeader,
    /// The entry being placed.
    next: u16,
}

/// The outcome of [`RecvTable::blocked`].
#[derive(Debug, PartialEq, Eq)]
pub enum Blocked<P> {
    /// Keep the frame's message; the sender retransmits and the frame comes back.
    Wait,
    /// Blocked longer than the backpressure wait: the message is rejected; the placement of its
    /// earlier frames, if any, is given back to be undone.
    Rejected(Option<P>),
}

/// The stateless answer of an engine that has no channel at a data frame's destination
/// endpoint: reject the frame's message `NoRoute` at the frame's sequence number.
pub fn no_route(h: &DataHeader) -> AckKind {
    AckKind::Reject {
        ack: h.seq,
        message_id: h.message_id,
        status: CompletionStatus::NoRoute,
    }
}

/// Session ids a state remembers besides its current one.
const RECENT_SESSIONS: usize = 4;

#[derive(Debug)]
struct InProgress<P> {
    message_id: u32,
    kind: DataKind,
    msg_flags: u8,
    total_len: u32,
    cookie: u64,
    received: u32,
    placement: Option<P>,
    /// When its first frame was taken.
    started: Instant,
}

impl<P> InProgress<P> {
    fn continued_by(&self, h: &DataHeader) -> bool {
        self.message_id == h.message_id
            && self.kind == h.kind
            && self.msg_flags == h.msg_flags
            && self.total_len == h.total_len
            && self.cookie == h.cookie
            && self.received == h.frag_offset
    }
}

#[derive(Clone, Copy, Debug)]
struct PendingReject {
    seq: u32,
    message_id: u32,
    status: CompletionStatus,
}

/// The receiving state of one (local channel, remote channel) pair.
#[derive(Debug)]
pub struct RecvSession<P> {
    session: u32,
    expected: u32,
    recent: [Option<u32>; RECENT_SESSIONS],
    msg: Option<InProgress<P>>,
    reject: Option<PendingReject>,
    /// The last message completed or rejected: a new message's id must come after it.
    last_done: Option<u32>,
    /// (seq, message_id) of the frame being retried, since when.
    blocked_since: Option<(u32, u32, Instant)>,
    /// The frame handed out as [`Verdict::Process`] (or the bundle entry being placed), until
    /// the engine says what became of it.
    current: Option<DataHeader>,
    /// The bundle being placed, entry by entry.
    bundle: Option<BundleCursor>,
    /// A bundle at the expected seq of which the entries up to `last_done` were placed (its
    /// next entry was blocked): its copies continue after them.
    partial: Option<BundleHeader>,
    ack_due: bool,
    ack_queued: bool,
    /// When this state last made progress (began a session, took a frame).
    last_frame: Instant,
    backpressure_wait: Duration,
    counters: RecvCounters,
}

impl<P> RecvSession<P> {
    /// A state for session `session`, expecting its frame 0.
    pub fn new(session: u32, backpressure_wait: Duration, now: Instant) -> RecvSession<P> {
        RecvSession {
            session,
            expected: 0,
            recent: [None; RECENT_SESSIONS],
            msg: None,
            reject: None,
            last_done: None,
            blocked_since: None,
            current: None,
            bundle: None,
            partial: None,
            ack_due: false,
            ack_queued: false,
            last_frame: now,
            backpressure_wait,
            counters: RecvCounters::default(),
        }
    }

    /// The current session id.
    pub fn id(&self) -> u32 {
        self.session
    }

    /// The next sequence number expected.
    pub fn expected(&self) -> u32 {
        self.expected
    }

    /// This state's counters.
    pub fn counters(&self) -> &RecvCounters {
        &self.counters
    }

    /// Switches to session `session` (its frame 0 arrived); a partial message of the old one
    /// is given up into `abandoned`.
    fn start(&mut self, session: u32, abandoned: &mut Vec<P>) {
        self.recent.rotate_right(1);
        self.recent[0] = Some(self.session);
        self.session = session;
        self.expected = 0;
        self.give_up_message(abandoned);
        self.reject = None;
        self.last_done = None;
        self.blocked_since = None;
        self.partial = None;
    }

    fn give_up_message(&mut self, abandoned: &mut Vec<P>) {
        if let Some(m) = self.msg.take() {
            self.counters.abandoned += 1;
            abandoned.extend(m.placement);
        }
    }

    /// The checks every frame of the pair passes first: its session (a frame 0 of a new one
    /// starts it), a pending reject, and order. `Ok` for the frame at the expected seq.
    fn admit(
        &mut self,
        session: u32,
        seq: u32,
        message_id: u32,
        starts_message: bool,
        now: Instant,
        abandoned: &mut Vec<P>,
    ) -> Result<(), Verdict> {
        self.current = None;
        self.bundle = None;
        if session != self.session {
            if seq != 0 {
                self.counters.resets_sent += 1;
                return Err(Verdict::Reset);
            }
            if self.recent.contains(&Some(session)) {
                self.counters.stale_sessions += 1;
                return Err(Verdict::Drop);
            }
            self.start(session, abandoned);
            self.last_frame = now;
        }
        // `last_frame` moves only with progress (a new session above, a frame taken in
        // `accepted`): duplicates, frames out of order and invalid ones, which anyone on the wire
        // can send, do not keep a state (and a partial message's reserved buffer) alive.
        if let Some(r) = self.reject {
            // Only the first frame of a later message at the rejected frame's place ends the
            // reject: the sender has heard it and renumbered.
            let renumbered = seq == r.seq && starts_message && seq_lt(r.message_id, message_id);
            if !renumbered {
                self.counters.rejects_resent += 1;
                self.ack_due = true;
                return Err(Verdict::Drop);
            }
            self.reject = None;
        }
        if seq_lt(seq, self.expected) {
            self.counters.duplicates += 1;
            self.ack_due = true;
            return Err(Verdict::Drop);
        }
        if seq != self.expected {
            self.counters.out_of_order += 1;
            self.ack_due = true;
            return Err(Verdict::Drop);
        }
        Ok(())
    }

    /// Classifies a data frame of this pair (see [`Verdict`]).
    pub fn on_frame(&mut self, h: &DataHeader, now: Instant, abandoned: &mut Vec<P>) -> Verdict {
        let starts = h.frag_offset == 0;
        if let Err(v) = self.admit(h.session, h.seq, h.message_id, starts, now, abandoned) {
            return v;
        }
        if self.partial.is_some() {
            // The expected frame is a bundle placed part way: this is not it.
            self.counters.invalid += 1;
            return Verdict::Drop;
        }
        let end = u64::from(h.frag_offset) + u64::from(h.frag_len);
        let sane = end <= u64::from(h.total_len) && (h.frag_len > 0 || h.total_len == 0);
        let first = match &self.msg {
            Some(m) if sane && m.continued_by(h) => false,
            None if sane
                && h.frag_offset == 0
                && self.last_done.is_none_or(|d| seq_lt(d, h.message_id)) =>
            {
                true
            }
            _ => {
                self.counters.invalid += 1;
                return Verdict::Drop;
            }
        };
        self.current = Some(*h);
        Verdict::Process {
            first,
            last: h.is_last(),
        }
    }

    /// Classifies a bundle frame of this pair (see [`BundleVerdict`]).
    pub fn on_bundle(
        &mut self,
        b: &BundleHeader,
        now: Instant,
        abandoned: &mut Vec<P>,
    ) -> BundleVerdict {
        let first = b.first_message_id;
        match self.admit(b.session, b.seq, first, true, now, abandoned) {
            Ok(()) => {}
            Err(Verdict::Reset) => return BundleVerdict::Reset,
            Err(_) => return BundleVerdict::Drop,
        }
        let skip = match (&self.msg, self.partial) {
            (None, None) if b.count >= 2 && self.last_done.is_none_or(|d| seq_lt(d, first)) => {
                Some(0)
            }
            // The same bundle again (the sender retransmitted it): on after what was placed.
            (None, Some(p)) if p == *b => self
                .last_done
                .map(|d| d.wrapping_sub(first).wrapping_add(1))
                .and_then(|n| u16::try_from(n).ok())
                .filter(|&n| n < b.count),
            _ => None,
        };
        let Some(skip) = skip else {
            self.counters.invalid += 1;
            return BundleVerdict::Drop;
        };
        self.current = Some(b.entry(skip));
        self.bundle = Some(BundleCursor {
            header: *b,
            next: skip,
        });
        BundleVerdict::Process { skip }
    }

    /// The engine placed the bundle entry being processed (see [`BundleVerdict::Process`]):
    /// its message is delivered; after the last entry the frame is taken.
    pub fn entry_accepted(&mut self, now: Instant) {
        let (Some(mut c), Some(h)) = (self.bundle.take(), self.current.take()) else {
            return;
        };
        self.last_done = Some(h.message_id);
        self.counters.messages_delivered += 1;
        self.blocked_since = None;
        self.last_frame = now;
        c.next += 1;
        if c.next >= c.header.count {
            self.partial = None;
            self.expected = self.expected.wrapping_add(1);
            self.ack_due = true;
            self.counters.frames_accepted += 1;
            self.counters.bundles_accepted += 1;
            return;
        }
        self.partial = Some(c.header);
        self.current = Some(c.header.entry(c.next));
        self.bundle = Some(c);
    }

    /// The placement of the message in progress, once its first frame was accepted.
    pub fn placement_mut(&mut self) -> Option<&mut P> {
        self.msg.as_mut().and_then(|m| m.placement.as_mut())
    }

    /// The engine placed the frame of the last [`Verdict::Process`]. On a message's first frame
    /// `placement` is its new placement (on a later one, `Some` replaces it). When the frame
    /// ends the message, its placement comes back (the message is delivered); otherwise `None`
    /// (or `placement` itself if no frame was being processed).
    pub fn accepted(&mut self, placement: Option<P>, now: Instant) -> Option<P> {
        let Some(h) = self.current.take() else {
            return placement;
        };
        let m = match self.msg.take() {
            Some(mut m) => {
                if placement.is_some() {
                    m.placement = placement;
                }
                m
            }
            None => InProgress {
                message_id: h.message_id,
                kind: h.kind,
                msg_flags: h.msg_flags,
                total_len: h.total_len,
                cookie: h.cookie,
                received: 0,
                placement,
                started: now,
            },
        };
        let mut m = m;
        m.received = m.received.saturating_add(h.frag_len);
        self.expected = self.expected.wrapping_add(1);
        self.ack_due = true;
        self.blocked_since = None;
        self.last_frame = now;
        self.counters.frames_accepted += 1;
        if h.is_last() {
            self.last_done = Some(m.message_id);
            self.counters.messages_delivered += 1;
            return m.placement;
        }
        self.msg = Some(m);
        None
    }

    /// The engine could not place the frame of the last [`Verdict::Process`] now (no posted
    /// buffer, RX ring full: `status` says which). Once that has lasted the backpressure wait,
    /// the message is rejected with `status`.
    pub fn blocked(&mut self, now: Instant, status: CompletionStatus) -> Blocked<P> {
        self.bundle = None;
        let Some(h) = self.current.take() else {
            return Blocked::Wait;
        };
        // A blocked ack (`take_ack`): a sign of life; the sender pauses, then probes.
        self.ack_due = true;
        self.counters.blocked += 1;
        let since = match self.blocked_since {
            Some((seq, id, t)) if seq == h.seq && id == h.message_id => t,
            _ => {
                self.blocked_since = Some((h.seq, h.message_id, now));
                now
            }
        };
        if now.saturating_duration_since(since) >= self.backpressure_wait {
            Blocked::Rejected(self.reject_current(&h, status))
        } else {
            Blocked::Wait
        }
    }

    /// The engine refuses the message of the last [`Verdict::Process`] frame with `status`
    /// (`Ok` is taken as `DestinationGone`). The placement of its earlier frames comes back.
    pub fn rejected(&mut self, status: CompletionStatus) -> Option<P> {
        self.bundle = None;
        let h = self.current.take()?;
        self.reject_current(&h, status)
    }

    fn reject_current(&mut self, h: &DataHeader, status: CompletionStatus) -> Option<P> {
        let status = match status {
            CompletionStatus::Ok => CompletionStatus::DestinationGone,
            s => s,
        };
        self.reject = Some(PendingReject {
            seq: h.seq,
            message_id: h.message_id,
            status,
        });
        self.last_done = Some(h.message_id);
        self.blocked_since = None;
        self.partial = None;
        self.ack_due = true;
        self.counters.rejects += 1;
        self.msg.take().and_then(|m| m.placement)
    }

    /// The ack due, if any (at most one until more frames arrive): the pending reject, else
    /// the cumulative ack, marked blocked while the expected frame could not be placed.
    pub fn take_ack(&mut self) -> Option<AckKind> {
        if !std::mem::take(&mut self.ack_due) {
            return None;
        }
        Some(match self.reject {
            Some(r) => AckKind::Reject {
                ack: r.seq,
                message_id: r.message_id,
                status: r.status,
            },
            // Still unable to place the expected frame: the sender pauses instead of sending
            // the window into frames that are dropped.
            None if self
                .blocked_since
                .is_some_and(|(seq, _, _)| seq == self.expected) =>
            {
                AckKind::Blocked { ack: self.expected }
            }
            None => AckKind::Cumulative { ack: self.expected },
        })
    }
}

/// The receiving states of one worker, keyed by (local channel, remote channel address), at
/// most `max_recv_sessions`; a state is evicted only after `state_lifetime` without progress (a frame taken).
#[derive(Debug)]
pub struct RecvTable<P> {
    cfg: ReliableConfig,
    sessions: HashMap<SessionKey, RecvSession<P>>,
    acks_due: Vec<SessionKey>,
    abandoned: Vec<(ChannelId, P)>,
    scratch: Vec<P>,
    retired: RecvCounters,
}

impl<P> RecvTable<P> {
    /// An empty table.
    pub fn new(cfg: ReliableConfig) -> RecvTable<P> {
        RecvTable {
            cfg,
            sessions: HashMap::new(),
            acks_due: Vec::new(),
            abandoned: Vec::new(),
            scratch: Vec::new(),
            retired: RecvCounters::default(),
        }
    }

    /// States in the table.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// True if the table holds no state.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Every counter, summed over the states and those dropped.
    pub fn counters(&self) -> RecvCounters {
        let mut c = self.retired;
        for s in self.sessions.values() {
            c.add(&s.counters);
        }
        c
    }

    /// Runs `f` on the state of a pair and queues its ack if one became due.
    fn with<R>(
        &mut self,
        key: SessionKey,
        f: impl FnOnce(&mut RecvSession<P>, &mut Vec<P>) -> R,
    ) -> Option<R> {
        let s = self.sessions.get_mut(&key)?;
        let r = f(s, &mut self.scratch);
        if s.ack_due && !s.ack_queued {
            s.ack_queued = true;
            self.acks_due.push(key);
        }
        let local = key.0;
        self.abandoned
            .extend(self.scratch.drain(..).map(|p| (local, p)));
        Some(r)
    }

    /// Classifies a data frame from `remote` to `local` (see [`RecvSession::on_frame`]); the
    /// first frame of a session creates the pair's state if there is room.
    pub fn on_frame(
        &mut self,
        local: ChannelId,
        remote: ChannelAddr,
        h: &DataHeader,
        now: Instant,
    ) -> Verdict {
        // Only a frame that can begin a message creates a state.
        let end = u64::from(h.frag_offset) + u64::from(h.frag_len);
        let starts = h.frag_offset == 0
            && end <= u64::from(h.total_len)
            && (h.frag_len > 0 || h.total_len == 0);
        let key = (local, remote);
        if let Err(v) = self.find_or_create(key, h.session, h.seq, starts, now) {
            return v;
        }
        self.with(key, |s, abandoned| s.on_frame(h, now, abandoned))
            .unwrap_or(Verdict::Drop)
    }

    /// Classifies a bundle frame from `remote` to `local` (see [`RecvSession::on_bundle`]); its
    /// first frame of a session creates the pair's state if there is room.
    pub fn on_bundle(
        &mut self,
        local: ChannelId,
        remote: ChannelAddr,
        b: &BundleHeader,
        now: Instant,
    ) -> BundleVerdict {
        let key = (local, remote);
        match self.find_or_create(key, b.session, b.seq, true, now) {
            Ok(()) => {}
            Err(Verdict::Reset) => return BundleVerdict::Reset,
            Err(_) => return BundleVerdict::Drop,
        }
        self.with(key, |s, abandoned| s.on_bundle(b, now, abandoned))
            .unwrap_or(BundleVerdict::Drop)
    }

    /// See [`RecvSession::entry_accepted`].
    pub fn entry_accepted(&mut self, local: ChannelId, remote: ChannelAddr, now: Instant) {
        self.with((local, remote), |s, _| s.entry_accepted(now));
    }

    /// Makes sure the pair has a state, for a frame of `session` at `seq` (`starts`: it can
    /// begin a message): a pair without one gets one only for a frame 0 that can begin a
    /// message, after an expired state is evicted if the table is full. Otherwise what to
    /// answer (counted).
    fn find_or_create(
        &mut self,
        key: SessionKey,
        session: u32,
        seq: u32,
        starts: bool,
        now: Instant,
    ) -> Result<(), Verdict> {
        if self.sessions.contains_key(&key) {
            return Ok(());
        }
        if seq != 0 {
            self.retired.resets_sent += 1;
            return Err(Verdict::Reset);
        }
        if !starts {
            self.retired.invalid += 1;
            return Err(Verdict::Drop);
        }
        if self.sessions.len() >= self.cfg.max_recv_sessions && !self.evict_one(now) {
            self.retired.table_full += 1;
            return Err(Verdict::Drop);
        }
        let state = RecvSession::new(session, self.cfg.backpressure_wait, now);
        self.sessions.insert(key, state);
        Ok(())
    }

    /// See [`RecvSession::placement_mut`].
    pub fn placement_mut(&mut self, local: ChannelId, remote: ChannelAddr) -> Option<&mut P> {
        self.sessions
            .get_mut(&(local, remote))
            .and_then(|s| s.placement_mut())
    }

    /// See [`RecvSession::accepted`].
    pub fn accepted(
        &mut self,
        local: ChannelId,
        remote: ChannelAddr,
        placement: Option<P>,
        now: Instant,
    ) -> Option<P> {
        match self.sessions.contains_key(&(local, remote)) {
            true => self
                .with((local, remote), |s, _| s.accepted(placement, now))
                .flatten(),
            false => placement,
        }
    }

    /// See [`RecvSession::blocked`].
    pub fn blocked(
        &mut self,
        local: ChannelId,
        remote: ChannelAddr,
        now: Instant,
        status: CompletionStatus,
    ) -> Blocked<P> {
        self.with((local, remote), |s, _| s.blocked(now, status))
            .unwrap_or(Blocked::Wait)
    }

    /// See [`RecvSession::rejected`].
    pub fn rejected(
        &mut self,
        local: ChannelId,
        remote: ChannelAddr,
        status: CompletionStatus,
    ) -> Option<P> {
        self.with((local, remote), |s, _| s.rejected(status))
            .flatten()
    }

    /// Hands out the acks due, at most one per state since the last call.
    pub fn take_acks(&mut self, mut out: impl FnMut(OutgoingAck)) {
        for key in std::mem::take(&mut self.acks_due) {
            let Some(s) = self.sessions.get_mut(&key) else {
                continue;
            };
            s.ack_queued = false;
            if let Some(kind) = s.take_ack() {
                out(OutgoingAck {
                    local: key.0,
                    remote: key.1,
                    session: s.session,
                    kind,
                });
            }
        }
    }

    fn expired(&self, s: &RecvSession<P>, now: Instant) -> bool {
        now.saturating_duration_since(s.last_frame) >= self.cfg.state_lifetime
    }

    /// Drops the state idle longest if it has been idle for the state lifetime.
    fn evict_one(&mut self, now: Instant) -> bool {
        let victim = self
            .sessions
            .iter()
            .filter(|(_, s)| self.expired(s, now))
            .min_by_key(|(_, s)| s.last_frame)
            .map(|(k, _)| *k);
        match victim {
            Some(k) => {
                self.drop_state(k);
                true
            }
            None => false,
        }
    }

    fn drop_state(&mut self, key: SessionKey) {
        if let Some(mut s) = self.sessions.remove(&key) {
            s.give_up_message(&mut self.scratch);
            s.counters.states_expired += 1;
            self.retired.add(&s.counters);
            self.abandoned
                .extend(self.scratch.drain(..).map(|p| (key.0, p)));
        }
    }

    fn keys_where(&self, f: impl Fn(&SessionKey, &RecvSession<P>) -> bool) -> Vec<SessionKey> {
        self.sessions
            .iter()
            .filter(|(k, s)| f(k, s))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Drops every state without progress for the state lifetime, and gives up every message
    /// still partial half a state lifetime after its first frame (a sender that trickles
    /// fragments would otherwise hold the destination's posted buffer for as long as it
    /// likes; a sender that keeps up finishes within its peer timeout or its receiver's
    /// backpressure wait, both at most half the lifetime). Their placements go to
    /// [`RecvTable::take_abandoned`].
    pub fn expire(&mut self, now: Instant) {
        for k in self.keys_where(|_, s| self.expired(s, now)) {
            self.drop_state(k);
        }
        let longest = self.cfg.state_lifetime / 2;
        let (scratch, abandoned) = (&mut self.scratch, &mut self.abandoned);
        for (key, s) in &mut self.sessions {
            let m = s.msg.as_ref();
            if m.is_some_and(|m| now.saturating_duration_since(m.started) >= longest) {
                s.give_up_message(scratch);
                abandoned.extend(scratch.drain(..).map(|p| (key.0, p)));
            }
        }
    }

    /// Placements of messages that will never complete (their sender gave up or moved to a new
    /// session): the engine undoes them (un-reserves the posted buffer).
    pub fn take_abandoned(&mut self) -> std::vec::Drain<'_, (ChannelId, P)> {
        self.abandoned.drain(..)
    }

    /// Drops the states of a destroyed local channel; `dropped` gets each partial placement.
    pub fn remove_local(&mut self, local: ChannelId, mut dropped: impl FnMut(P)) {
        for k in self.keys_where(|k, _| k.0 == local) {
            if let Some(mut s) = self.sessions.remove(&k) {
                if let Some(p) = s.msg.take().and_then(|m| m.placement) {
                    dropped(p);
                }
                self.retired.add(&s.counters);
            }
        }
    }
}
