//! The sending side: one [`SendSession`] per (local channel, remote channel), in a bounded
//! [`SendTable`]. docs/wire.md ("Sender") is the normative description.

use std::collections::{vec_deque, HashMap, VecDeque};
use std::time::{Duration, Instant};

use svnic_channels::frame::{
    AckFrame, AckKind, DataFrame, DataKind, Frame, FrameBody, MessageHeader, MAX_BUNDLE_COUNT,
};
use svnic_channels::{ChannelAddr, ChannelId, CompletionStatus};

use super::rtt::RttEstimator;
use crate::counter_set::counts;

use super::{seq_le, seq_lt, Completed, ReliableConfig, SessionKey, MAX_MESSAGE_LEN};

counts! {
    /// What a send table did, dropped and refused.
    pub struct SendCounters {
        /// Data frames handed to the engine for the first time.
        frames_sent,
        /// Data frames handed to the engine again (go-back after a timeout or duplicate acks).
        frames_retransmitted,
        /// Messages refused: the session already holds `max_messages`.
        refused_full,
        /// Messages refused: the table is full of sessions with messages in flight.
        refused_table_full,
        /// Messages refused: longer than the frame format allows.
        refused_too_large,
        /// Acks for a (local, remote) pair without a session: dropped.
        acks_no_session,
        /// Acks naming another session id than the pair's current one: dropped.
        acks_wrong_session,
        /// Acks acknowledging frames never sent: dropped.
        acks_beyond_sent,
        /// Cumulative acks older than the window base (liveness only).
        acks_stale,
        /// Rejects or resets that name no message in flight or do not fit the session: dropped.
        rejects_invalid,
        /// Duplicate acks (no progress while frames are outstanding).
        duplicate_acks,
        /// Fast retransmits (third duplicate ack).
        fast_retransmits,
        /// Retransmission timeouts.
        timeouts,
        /// Peer timeouts: every message of the session failed `PeerUnreachable`.
        peer_timeouts,
        /// Resets received: every message sent and not acknowledged failed `DestinationGone`.
        resets,
        /// Blocked acks that paused the session (the receiver could not place the window base).
        pauses,
        /// Idle sessions evicted to make room.
        sessions_evicted,
        /// Messages completed `Ok`.
        completed_ok,
        /// Messages completed with an error status.
        completed_error,
    }
}

/// Why [`SendTable::offer`] refused a message; the handle comes back.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused<T> {
    /// The session holds `max_messages` already: retry once some complete (backpressure).
    Full(T),
    /// Every session slot holds messages in flight: retry later (backpressure).
    TableFull(T),
    /// Longer than a data frame's `total_len` may say: fail the message.
    TooLarge(T),
}

impl<T> Refused<T> {
    /// The refused message's handle.
    pub fn into_handle(self) -> T {
        match self {
            Refused::Full(t) | Refused::TableFull(t) | Refused::TooLarge(t) => t,
        }
    }
}

/// One data frame to send: the engine encodes it with the bytes `frag_offset..+frag_len` of the
/// message `handle` stands for, from `local`'s MAC and endpoint to `remote`.
#[derive(Debug)]
pub struct FrameOut<'a, T> {
    /// The sending channel.
    pub local: ChannelId,
    /// The destination.
    pub remote: ChannelAddr,
    /// The session.
    pub session: u32,
    /// The frame's sequence number.
    pub seq: u32,
    /// The message's id in the session.
    pub message_id: u32,
    /// The message's length.
    pub total_len: u32,
    /// Where this fragment starts.
    pub frag_offset: u32,
    /// This fragment's length (at most `chunk`).
    pub frag_len: u32,
    /// The engine's handle of the message.
    pub handle: &'a T,
    /// True if this frame was sent before (a go-back).
    pub retransmission: bool,
    /// Several whole messages share this frame: encode a bundle of these (the first is
    /// `handle`, with id `message_id`); `None` for a data frame of one message.
    pub bundle: Option<Bundle<'a, T>>,
}

/// The messages of a bundle frame, in order, with their ids.
#[derive(Debug)]
pub struct Bundle<'a, T> {
    messages: vec_deque::Iter<'a, Outgoing<T>>,
}

impl<T> Clone for Bundle<'_, T> {
    fn clone(&self) -> Self {
        Bundle {
            messages: self.messages.clone(),
        }
    }
}

impl<T> Bundle<'_, T> {
    /// How many messages are left.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// True if none are left.
    pub fn is_empty(&self) -> bool {
        self.messages.len() == 0
    }
}

impl<'a, T> Iterator for Bundle<'a, T> {
    type Item = (u32, &'a T);

    fn next(&mut self) -> Option<Self::Item> {
        self.messages.next().map(|m| (m.message_id, &m.handle))
    }
}

impl<T> FrameOut<'_, T> {
    /// The data frame to encode: from the sending channel at `local_addr` (its MAC and
    /// endpoint) to `remote`, for a message of `kind` with `msg_flags` and `cookie`; `payload`
    /// is the message's bytes `frag_offset..frag_offset + frag_len`.
    pub fn frame<'p>(
        &self,
        local_addr: ChannelAddr,
        kind: DataKind,
        msg_flags: u8,
        cookie: u64,
        payload: &'p [u8],
    ) -> Frame<'p> {
        Frame {
            dst: self.remote.mac,
            src: local_addr.mac,
            body: FrameBody::Data(DataFrame {
                header: MessageHeader {
                    src_endpoint: local_addr.endpoint,
                    dst_endpoint: self.remote.endpoint,
                    kind,
                    msg_flags,
                    message_id: self.message_id,
                    cookie,
                },
                session: self.session,
                seq: self.seq,
                total_len: self.total_len,
                frag_offset: self.frag_offset,
                payload,
            }),
        }
    }
}

/// The first pause after a blocked ack; each blocked answer to the probe that follows doubles
/// it, up to the retransmission timeout.
pub const FIRST_PAUSE: Duration = Duration::from_micros(20);

/// Session ids: an engine-wide counter seeded from the clock at start, so that a restarted
/// engine does not reuse the ids its peers remember.
#[derive(Clone, Copy, Debug)]
pub struct SessionIds(u32);

impl SessionIds {
    /// Ids from `seed` on.
    pub fn seeded(seed: u32) -> SessionIds {
        SessionIds(seed)
    }

    /// The next id.
    pub fn next_id(&mut self) -> u32 {
        let id = self.0;
        self.0 = self.0.wrapping_add(1);
        id
    }
}

/// A message queued or in flight.
#[derive(Debug)]
struct Outgoing<T> {
    handle: T,
    message_id: u32,
    len: u32,
    first_seq: u32,
    frames: u32,
    /// Bytes it takes as a bundle entry, if it may travel in a bundle.
    entry: Option<u32>,
    /// A frame of it was transmitted: the messages it shares that frame with stay its only
    /// company for the rest of the session (a copy of the frame may still be on the wire).
    sent: bool,
}

/// The bundle being filled at the end of the numbering: its frame is not sent yet.
#[derive(Clone, Copy, Debug)]
struct OpenBundle {
    seq: u32,
    count: u16,
    bytes: u32,
}

impl<T> Outgoing<T> {
    fn end(&self) -> u32 {
        self.first_seq.wrapping_add(self.frames)
    }
}

/// The sending state of one (local channel, remote channel) pair.
#[derive(Debug)]
pub struct SendSession<T> {
    cfg: ReliableConfig,
    local: ChannelId,
    remote: ChannelAddr,
    session: u32,
    /// A valid ack (other than a stateless NoRoute) came back: the receiver holds state, the
    /// whole window may be used. Before it, only the session's first frame is sent.
    established: bool,
    /// Oldest unacknowledged sequence number.
    una: u32,
    /// Next sequence number to transmit.
    nxt: u32,
    /// One past the highest sequence number sent in the current numbering.
    max_sent: u32,
    /// One past the last sequence number assigned to a queued message.
    end: u32,
    next_message_id: u32,
    queue: VecDeque<Outgoing<T>>,
    /// The last frame of the numbering, while more messages may join it.
    open: Option<OpenBundle>,
    rtt: RttEstimator,
    rto_deadline: Option<Instant>,
    /// The frame being timed and when it was first sent (Karn: never a retransmitted one).
    timing: Option<(u32, Instant)>,
    /// Last sign of life from the peer (or the moment frames became outstanding).
    heard: Instant,
    dupacks: u32,
    fast_retransmitted: bool,
    /// A blocked ack paused sending until then; the window base goes again afterwards.
    paused_until: Option<Instant>,
    /// After a pause: one frame at a time until the receiver takes one.
    probing: bool,
    /// When the probe went: blocked acks sooner than half a round trip after it answer the
    /// burst before the pause, not the probe.
    probe_sent: Option<Instant>,
    /// The next pause.
    pause: Duration,
    last_active: Instant,
    counters: SendCounters,
}

impl<T> SendSession<T> {
    /// A session from `local` to `remote` with id `session`, nothing queued.
    pub fn new(
        cfg: &ReliableConfig,
        local: ChannelId,
        remote: ChannelAddr,
        session: u32,
        now: Instant,
    ) -> SendSession<T> {
        SendSession {
            cfg: *cfg,
            local,
            remote,
            session,
            established: false,
            una: 0,
            nxt: 0,
            max_sent: 0,
            end: 0,
            next_message_id: 0,
            queue: VecDeque::new(),
            open: None,
            rtt: RttEstimator::new(cfg.initial_rto, cfg.min_rto, cfg.max_rto),
            rto_deadline: None,
            timing: None,
            heard: now,
            dupacks: 0,
            fast_retransmitted: false,
            paused_until: None,
            probing: false,
            probe_sent: None,
            pause: FIRST_PAUSE,
            last_active: now,
            counters: SendCounters::default(),
        }
    }

    /// The current session id.
    pub fn id(&self) -> u32 {
        self.session
    }

    /// Messages queued or in flight.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// This session's counters.
    pub fn counters(&self) -> &SendCounters {
        &self.counters
    }

    /// The retransmission timeout estimator.
    pub fn rtt(&self) -> &RttEstimator {
        &self.rtt
    }

    fn outstanding(&self) -> bool {
        self.una != self.max_sent
    }

    fn window(&self) -> u32 {
        if self.established && !self.probing {
            self.cfg.window_frames
        } else {
            1
        }
    }

    /// True if [`SendSession::transmit`] would hand out a frame.
    pub fn can_transmit(&self) -> bool {
        self.paused_until.is_none()
            && seq_lt(self.nxt, self.end)
            && self.nxt.wrapping_sub(self.una) < self.window()
    }

    /// Queues a message of `len` bytes; `handle` comes back in its completion. `entry` is what
    /// it takes as a bundle entry if it may share a frame with other whole messages (user-data),
    /// `None` otherwise. Refused when the session holds `max_messages` or the message is too
    /// long. A session idle for half the state lifetime first starts over with a new id from
    /// `ids`, before the receiver may have forgotten it.
    pub fn offer(
        &mut self,
        handle: T,
        len: u32,
        entry: Option<u32>,
        now: Instant,
        ids: &mut SessionIds,
    ) -> Result<(), Refused<T>> {
        if len > MAX_MESSAGE_LEN {
            self.counters.refused_too_large += 1;
            return Err(Refused::TooLarge(handle));
        }
        if self.queue.len() >= self.cfg.max_messages {
            self.counters.refused_full += 1;
            return Err(Refused::Full(handle));
        }
        let used = self.established || self.max_sent != 0;
        if self.queue.is_empty()
            && used
            && now.saturating_duration_since(self.last_active) >= self.cfg.state_lifetime / 2
        {
            self.restart(ids.next_id());
        }
        self.queue.push_back(Outgoing {
            handle,
            message_id: self.next_message_id,
            len,
            first_seq: 0,
            frames: self.cfg.frames_of(len),
            entry,
            sent: false,
        });
        self.number(self.queue.len() - 1);
        self.next_message_id = self.next_message_id.wrapping_add(1);
        self.last_active = now;
        Ok(())
    }

    /// Gives the message at `idx` (the last one numbered so far) its seqs: a share of the open
    /// bundle if it fits there and that frame was never sent, else seqs of its own from `end`.
    fn number(&mut self, idx: usize) {
        let room = self.cfg.bundle_room();
        let Some(m) = self.queue.get_mut(idx) else {
            return;
        };
        let open = self.open.filter(|o| {
            !seq_lt(o.seq, self.max_sent) && o.seq.wrapping_add(1) == self.end && m.frames == 1
        });
        match (open, m.entry) {
            (Some(o), Some(bytes))
                if o.count < MAX_BUNDLE_COUNT && o.bytes.saturating_add(bytes) <= room =>
            {
                m.first_seq = o.seq;
                self.open = Some(OpenBundle {
                    seq: o.seq,
                    count: o.count + 1,
                    bytes: o.bytes + bytes,
                });
            }
            _ => {
                m.first_seq = self.end;
                self.end = self.end.wrapping_add(m.frames);
                self.open = m.entry.filter(|_| m.frames == 1).map(|bytes| OpenBundle {
                    seq: m.first_seq,
                    count: 1,
                    bytes,
                });
            }
        }
    }

    /// Hands frames in sequence order to `emit` while the window allows; `emit` encodes and
    /// queues one and returns false when the TX ring is full (that frame was not sent: it is
    /// offered again next time). Returns false if `emit` refused.
    pub fn transmit(
        &mut self,
        now: Instant,
        emit: &mut dyn FnMut(FrameOut<'_, T>) -> bool,
    ) -> bool {
        let chunk = self.cfg.chunk as u64;
        let mut idx = 0;
        while self.can_transmit() {
            let Some(m) = self.queue.get(idx) else {
                break;
            };
            if !seq_lt(self.nxt, m.end()) {
                idx += 1;
                continue;
            }
            let i = u64::from(self.nxt.wrapping_sub(m.first_seq));
            let frag_offset = (i * chunk).min(u64::from(m.len));
            let frag_len = chunk.min(u64::from(m.len) - frag_offset);
            let retransmission = seq_lt(self.nxt, self.max_sent);
            // Messages numbered into the same frame travel together.
            let mates = self
                .queue
                .range(idx..)
                .take_while(|o| o.first_seq == self.nxt && o.frames == 1)
                .count();
            let bundle = (mates >= 2).then(|| Bundle {
                messages: self.queue.range(idx..idx + mates),
            });
            let members = idx..idx + mates.max(1);
            let frame = FrameOut {
                local: self.local,
                remote: self.remote,
                session: self.session,
                seq: self.nxt,
                message_id: m.message_id,
                total_len: m.len,
                // Both fit: frag_offset <= len <= MAX_MESSAGE_LEN and frag_len <= chunk.
                frag_offset: frag_offset as u32,
                frag_len: frag_len as u32,
                handle: &m.handle,
                retransmission,
                bundle,
            };
            if !emit(frame) {
                return false;
            }
            for o in self.queue.range_mut(members) {
                o.sent = true;
            }
            if self.probing && self.nxt == self.una {
                self.probe_sent = Some(now);
            }
            if !self.outstanding() {
                self.heard = now;
            }
            if retransmission {
                self.counters.frames_retransmitted += 1;
            } else {
                self.counters.frames_sent += 1;
                self.max_sent = self.nxt.wrapping_add(1);
                if self.timing.is_none() {
                    self.timing = Some((self.nxt, now));
                }
            }
            self.nxt = self.nxt.wrapping_add(1);
            if self.rto_deadline.is_none() {
                self.rto_deadline = Some(now + self.rtt.rto());
            }
            self.last_active = now;
        }
        true
    }

    /// Takes an ack for this pair: progress completes whole messages `Ok` in order; a reject
    /// completes its message and renumbers the later ones; a reset or a stateless NoRoute fails
    /// what was sent and starts a new session (id from `ids`) for the rest. Invalid acks are
    /// dropped and counted.
    pub fn on_ack(
        &mut self,
        session: u32,
        kind: AckKind,
        now: Instant,
        ids: &mut SessionIds,
        completions: &mut Vec<Completed<T>>,
    ) {
        if session != self.session {
            self.counters.acks_wrong_session += 1;
            return;
        }
        match kind {
            AckKind::Cumulative { ack } => self.on_cumulative(ack, now, completions),
            AckKind::Blocked { ack } => {
                self.on_cumulative(ack, now, completions);
                // Blocked at the window base, after whatever progress the ack made.
                if ack == self.una && self.outstanding() {
                    self.on_blocked(now);
                }
            }
            AckKind::Reject {
                ack,
                message_id,
                status: CompletionStatus::NoRoute,
            } => {
                if self.sent_message_at(message_id, ack).is_none() {
                    self.counters.rejects_invalid += 1;
                    return;
                }
                self.fail_sent(CompletionStatus::NoRoute, completions);
                self.restart(ids.next_id());
            }
            AckKind::Reject {
                ack,
                message_id,
                status,
            } => self.on_reject(ack, message_id, status, now, completions),
            AckKind::Reset => {
                if !self.established {
                    // A receiver answers RESET only to a frame after the first, which is sent
                    // only once the receiver held state: this one is not about this session.
                    self.counters.rejects_invalid += 1;
                    return;
                }
                self.counters.resets += 1;
                self.fail_sent(CompletionStatus::DestinationGone, completions);
                self.restart(ids.next_id());
            }
        }
    }

    /// Takes a cumulative ack (also the cumulative part of a blocked one).
    fn on_cumulative(&mut self, ack: u32, now: Instant, completions: &mut Vec<Completed<T>>) {
        if seq_lt(self.max_sent, ack) {
            self.counters.acks_beyond_sent += 1;
            return;
        }
        self.established = true;
        self.heard = now;
        self.last_active = now;
        if seq_lt(ack, self.una) {
            self.counters.acks_stale += 1;
            return;
        }
        if ack == self.una {
            // While paused or probing the pause rules: these answer the burst before it, or
            // the probe.
            if self.outstanding() && !self.probing && self.paused_until.is_none() {
                self.counters.duplicate_acks += 1;
                self.dupacks += 1;
                if self.dupacks >= 3 && !self.fast_retransmitted {
                    self.fast_retransmitted = true;
                    self.counters.fast_retransmits += 1;
                    self.go_back();
                }
            }
            return;
        }
        if let Some((seq, sent)) = self.timing {
            if seq_lt(seq, ack) {
                self.rtt.sample(now.saturating_duration_since(sent));
                self.timing = None;
            }
        }
        self.una = ack;
        if seq_lt(self.nxt, ack) {
            self.nxt = ack;
        }
        self.end_recovery();
        while let Some(m) = self.queue.front() {
            if !seq_le(m.end(), ack) {
                break;
            }
            if let Some(m) = self.queue.pop_front() {
                self.complete(m, CompletionStatus::Ok, completions);
            }
        }
        self.rto_deadline = self.outstanding().then(|| now + self.rtt.rto());
    }

    /// The receiver cannot place the window base now and drops what follows it: rather than
    /// sending the window into it again (and waiting for the retransmission timeout when that
    /// is dropped too), wait a pause, then send the base alone as a probe. Each blocked answer
    /// to a probe doubles the pause, up to the retransmission timeout; progress ends it.
    fn on_blocked(&mut self, now: Instant) {
        let half_rtt = self.rtt.srtt().unwrap_or(FIRST_PAUSE) / 2;
        let early = self
            .probe_sent
            .is_some_and(|t| now.saturating_duration_since(t) < half_rtt);
        if self.paused_until.is_some() || (self.probing && (self.nxt == self.una || early)) {
            // Paused already, the probe is not sent yet, or this answers what went before it.
            return;
        }
        self.counters.pauses += 1;
        self.go_back();
        self.paused_until = Some(now + self.pause);
        self.pause = (self.pause * 2).min(self.rtt.rto());
        self.probing = true;
        // The probe re-arms the retransmission timer when it goes.
        self.rto_deadline = None;
    }

    /// The index of the message `message_id` if some of it was sent and `seq` is one of its
    /// frames that was sent.
    fn sent_message_at(&self, message_id: u32, seq: u32) -> Option<usize> {
        let idx = self.queue.iter().position(|m| m.message_id == message_id)?;
        let m = &self.queue[idx];
        let fits = seq_le(m.first_seq, seq) && seq_lt(seq, m.end()) && seq_lt(seq, self.max_sent);
        fits.then_some(idx)
    }

    fn on_reject(
        &mut self,
        ack: u32,
        message_id: u32,
        status: CompletionStatus,
        now: Instant,
        completions: &mut Vec<Completed<T>>,
    ) {
        let Some(idx) = self
            .sent_message_at(message_id, ack)
            .filter(|_| seq_le(self.una, ack) && status != CompletionStatus::Ok)
        else {
            self.counters.rejects_invalid += 1;
            return;
        };
        self.established = true;
        self.heard = now;
        self.last_active = now;
        // Every frame before `ack` was processed: the messages before this one are delivered.
        for _ in 0..idx {
            if let Some(m) = self.queue.pop_front() {
                self.complete(m, CompletionStatus::Ok, completions);
            }
        }
        if let Some(m) = self.queue.pop_front() {
            self.complete(m, status, completions);
        }
        self.renumber_from(ack);
    }

    /// Numbers the queued messages consecutively from `seq`, nothing of them counting as sent
    /// any more. Messages that were transmitted keep the company they had in their frame (less
    /// those that completed): a stale copy of that frame landing where the new one is expected
    /// must carry the same messages, or be refused for carrying messages already taken.
    /// Messages never transmitted are bundled anew after them.
    fn renumber_from(&mut self, seq: u32) {
        self.end = seq;
        self.una = seq;
        self.nxt = seq;
        self.max_sent = seq;
        self.open = None;
        // (old first seq, new first seq) of the last transmitted message numbered.
        let mut last_sent: Option<(u32, u32)> = None;
        for idx in 0..self.queue.len() {
            let Some(m) = self.queue.get_mut(idx) else {
                break;
            };
            if !m.sent {
                self.number(idx);
                continue;
            }
            let old = m.first_seq;
            match last_sent {
                Some((prev_old, prev_new)) if prev_old == old => m.first_seq = prev_new,
                _ => {
                    m.first_seq = self.end;
                    self.end = self.end.wrapping_add(m.frames);
                }
            }
            last_sent = Some((old, m.first_seq));
        }
        self.timing = None;
        self.rto_deadline = None;
        self.end_recovery();
    }

    /// Forgets the duplicate acks counted and any pause or probing: the receiver took frames,
    /// or the numbering starts over.
    fn end_recovery(&mut self) {
        self.dupacks = 0;
        self.fast_retransmitted = false;
        self.paused_until = None;
        self.probing = false;
        self.probe_sent = None;
        self.pause = FIRST_PAUSE;
    }

    /// Starts a new session `id` at sequence number 0 for the queued messages.
    fn restart(&mut self, id: u32) {
        self.session = id;
        self.established = false;
        self.renumber_from(0);
    }

    /// Fails every message with a frame sent, in order.
    fn fail_sent(&mut self, status: CompletionStatus, completions: &mut Vec<Completed<T>>) {
        while let Some(m) = self.queue.front() {
            if !seq_lt(m.first_seq, self.max_sent) {
                break;
            }
            if let Some(m) = self.queue.pop_front() {
                self.complete(m, status, completions);
            }
        }
    }

    fn go_back(&mut self) {
        self.nxt = self.una;
        self.timing = None;
    }

    fn complete(
        &mut self,
        m: Outgoing<T>,
        status: CompletionStatus,
        completions: &mut Vec<Completed<T>>,
    ) {
        if status == CompletionStatus::Ok {
            self.counters.completed_ok += 1;
        } else {
            self.counters.completed_error += 1;
        }
        completions.push(Completed {
            local: self.local,
            remote: self.remote,
            handle: m.handle,
            status,
        });
    }

    /// Runs the timers: after `peer_timeout` without a valid ack while frames are outstanding,
    /// every message fails `PeerUnreachable` and the session starts over; after the
    /// retransmission timeout, the timeout backs off and sending goes back to the window base.
    pub fn poll(
        &mut self,
        now: Instant,
        ids: &mut SessionIds,
        completions: &mut Vec<Completed<T>>,
    ) {
        if self.outstanding() && now >= self.heard + self.cfg.peer_timeout {
            self.counters.peer_timeouts += 1;
            while let Some(m) = self.queue.pop_front() {
                self.complete(m, CompletionStatus::PeerUnreachable, completions);
            }
            self.restart(ids.next_id());
            return;
        }
        if self.paused_until.is_some_and(|d| now >= d) {
            self.paused_until = None;
        }
        if self.rto_deadline.is_some_and(|d| now >= d) {
            self.counters.timeouts += 1;
            self.rtt.back_off();
            self.go_back();
            self.rto_deadline = None;
        }
    }

    /// When [`SendSession::poll`] has something to do next, if ever.
    pub fn next_deadline(&self) -> Option<Instant> {
        let peer = self
            .outstanding()
            .then(|| self.heard + self.cfg.peer_timeout);
        [self.rto_deadline, peer, self.paused_until]
            .into_iter()
            .flatten()
            .min()
    }

    /// Drops every message without completing it (the local channel is gone); their handles.
    fn drain_handles(&mut self) -> impl Iterator<Item = T> + '_ {
        self.queue.drain(..).map(|m| m.handle)
    }
}

/// The sending sessions of one worker, keyed by (local channel, remote channel address), at most
/// `max_send_sessions`; an idle session (nothing queued) is evicted, least recently active
/// first, to make room.
#[derive(Debug)]
pub struct SendTable<T> {
    cfg: ReliableConfig,
    sessions: Vec<SendSession<T>>,
    index: HashMap<SessionKey, usize>,
    /// Where the next [`SendTable::transmit`] starts, so that a full TX ring does not always
    /// favour the same sessions.
    cursor: usize,
    ids: SessionIds,
    /// Counters of the table itself and of evicted sessions.
    retired: SendCounters,
}

impl<T> SendTable<T> {
    /// An empty table; session ids start at `session_seed` (seed it from the clock).
    pub fn new(cfg: ReliableConfig, session_seed: u32) -> SendTable<T> {
        SendTable {
            cfg,
            sessions: Vec::new(),
            index: HashMap::new(),
            cursor: 0,
            ids: SessionIds::seeded(session_seed),
            retired: SendCounters::default(),
        }
    }

    /// Sessions in the table.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// True if the table holds no session.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// The session of a pair, if any.
    pub fn session(&self, local: ChannelId, remote: ChannelAddr) -> Option<&SendSession<T>> {
        self.index.get(&(local, remote)).map(|&i| &self.sessions[i])
    }

    /// Every counter, summed over the sessions and those evicted.
    pub fn counters(&self) -> SendCounters {
        let mut c = self.retired;
        for s in &self.sessions {
            c.add(&s.counters);
        }
        c
    }

    /// Queues a message of `len` bytes from `local` to `remote` (see [`SendSession::offer`]).
    pub fn offer(
        &mut self,
        local: ChannelId,
        remote: ChannelAddr,
        handle: T,
        len: u32,
        entry: Option<u32>,
        now: Instant,
    ) -> Result<(), Refused<T>> {
        let i = match self.index.get(&(local, remote)) {
            Some(&i) => i,
            None => {
                if self.sessions.len() >= self.cfg.max_send_sessions && !self.evict_idle() {
                    self.retired.refused_table_full += 1;
                    return Err(Refused::TableFull(handle));
                }
                let id = self.ids.next_id();
                self.sessions
                    .push(SendSession::new(&self.cfg, local, remote, id, now));
                let i = self.sessions.len() - 1;
                self.index.insert((local, remote), i);
                i
            }
        };
        self.sessions[i].offer(handle, len, entry, now, &mut self.ids)
    }

    /// Evicts the least recently active idle session; false if every session is busy.
    fn evict_idle(&mut self) -> bool {
        let victim = self
            .sessions
            .iter()
            .enumerate()
            .filter(|(_, s)| s.queue.is_empty())
            .min_by_key(|(_, s)| s.last_active)
            .map(|(i, _)| i);
        let Some(i) = victim else {
            return false;
        };
        self.remove_at(i);
        self.retired.sessions_evicted += 1;
        true
    }

    fn remove_at(&mut self, i: usize) -> SendSession<T> {
        let s = self.sessions.swap_remove(i);
        self.index.remove(&(s.local, s.remote));
        if let Some(moved) = self.sessions.get(i) {
            self.index.insert((moved.local, moved.remote), i);
        }
        self.retired.add(&s.counters);
        s
    }

    /// Hands out frames of every session that may send, round robin (see
    /// [`SendSession::transmit`]); stops at the first frame `emit` refuses.
    pub fn transmit(&mut self, now: Instant, mut emit: impl FnMut(FrameOut<'_, T>) -> bool) {
        let n = self.sessions.len();
        for k in 0..n {
            let i = (self.cursor + k) % n;
            if !self.sessions[i].transmit(now, &mut emit) {
                self.cursor = i;
                return;
            }
        }
        self.cursor = if n == 0 { 0 } else { (self.cursor + 1) % n };
    }

    /// Takes an ack from `remote` to `local` (see [`SendSession::on_ack`]).
    pub fn on_ack(
        &mut self,
        local: ChannelId,
        remote: ChannelAddr,
        ack: &AckFrame,
        now: Instant,
        completions: &mut Vec<Completed<T>>,
    ) {
        match self.index.get(&(local, remote)) {
            Some(&i) => {
                self.sessions[i].on_ack(ack.session, ack.kind, now, &mut self.ids, completions)
            }
            None => self.retired.acks_no_session += 1,
        }
    }

    /// Runs the timers of every session whose deadline has passed.
    pub fn poll(&mut self, now: Instant, completions: &mut Vec<Completed<T>>) {
        for s in &mut self.sessions {
            if s.next_deadline().is_some_and(|d| now >= d) {
                s.poll(now, &mut self.ids, completions);
            }
        }
    }

    /// The earliest deadline of any session.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.sessions.iter().filter_map(|s| s.next_deadline()).min()
    }

    /// True if some session may send a frame now.
    pub fn can_transmit(&self) -> bool {
        self.sessions.iter().any(|s| s.can_transmit())
    }

    /// Drops the sessions of a destroyed local channel; `dropped` gets each message's handle.
    pub fn remove_local(&mut self, local: ChannelId, mut dropped: impl FnMut(T)) {
        let mut i = 0;
        while i < self.sessions.len() {
            if self.sessions[i].local == local {
                let mut s = self.remove_at(i);
                s.drain_handles().for_each(&mut dropped);
            } else {
                i += 1;
            }
        }
    }
}
