//! Deterministic simulations: a sending engine's [`SendTable`] and a receiving engine's
//! [`RecvTable`] joined by two one-way links (real encoded frames, a fixed latency, optionally a
//! [`FaultInjector`] each), in virtual time.

use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use svnic_channels::frame::{
    bundle_entry_len, AckFrame, AckKind, BundleEntry, BundleFrame, DataKind, Frame, FrameBody,
};
use svnic_channels::message::INLINE_CAPACITY;
use svnic_channels::{ChannelAddr, ChannelId, CompletionStatus, MacAddr};

use super::*;

const A_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0a]);
const B_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x0b]);
const A_CH: ChannelId = ChannelId(1);
const B_CH: ChannelId = ChannelId(2);
const A_ADDR: ChannelAddr = ChannelAddr::new(A_MAC, 1);
const B_ADDR: ChannelAddr = ChannelAddr::new(B_MAC, 2);
const LATENCY: Duration = Duration::from_micros(10);
/// Frames the sender's "TX ring" takes per step before it is full.
const TX_BURST: usize = 48;
const TICK: Duration = Duration::from_micros(5);
const LOSSY: FaultInjection = FaultInjection {
    drop: 0.05,
    duplicate: 0.05,
    reorder: 0.05,
};

/// A small deterministic generator for sizes and payload bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn payload_of(index: usize, len: usize) -> Rc<Vec<u8>> {
    Rc::new(
        (0..len)
            .map(|i| (i.wrapping_mul(31) ^ index.wrapping_mul(0x9e)) as u8)
            .collect(),
    )
}

/// The sender's handle of a message: its index and bytes.
#[derive(Debug)]
struct Msg {
    index: usize,
    payload: Rc<Vec<u8>>,
}

struct Link {
    faults: Option<FaultInjector<Vec<u8>>>,
    queue: VecDeque<(Instant, Vec<u8>)>,
    up: bool,
}

impl Link {
    fn new(faults: FaultInjection, seed: u64) -> Link {
        Link {
            faults: (!faults.is_off()).then(|| FaultInjector::new(faults, seed).unwrap()),
            queue: VecDeque::new(),
            up: true,
        }
    }

    fn send(&mut self, now: Instant, frame: Vec<u8>) {
        if !self.up {
            return;
        }
        let mut out = Vec::new();
        match &mut self.faults {
            Some(f) => f.apply(frame, &mut out),
            None => out.push(frame),
        }
        self.queue
            .extend(out.into_iter().map(|f| (now + LATENCY, f)));
    }

    fn due(&mut self, now: Instant) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        while self.queue.front().is_some_and(|(t, _)| *t <= now) {
            v.extend(self.queue.pop_front().map(|(_, f)| f));
        }
        v
    }

    /// When the next frame arrives; held frames are let go when nothing else is in flight.
    fn next(&mut self, now: Instant) -> Option<Instant> {
        if self.queue.is_empty() {
            if let Some(f) = &mut self.faults {
                let mut out = Vec::new();
                f.release_all(&mut out);
                self.queue
                    .extend(out.into_iter().map(|f| (now + LATENCY, f)));
            }
        }
        self.queue.front().map(|(t, _)| *t)
    }
}

/// What the receiving engine does with a frame it could place, given the frame's cookie, whether
/// it is the message's first and last frame, and the time since the simulation began: `None`
/// places it, `Some(s)` reports it blocked with `s`.
type Policy = Box<dyn Fn(u64, bool, bool, Duration) -> Option<CompletionStatus>>;

struct Receiver {
    /// When the simulation began.
    t0: Instant,
    table: RecvTable<Vec<u8>>,
    delivered: Vec<(u64, Vec<u8>)>,
    /// Placements given back by rejects and abandonment.
    undone: usize,
    policy: Policy,
    /// No channel at the destination: answer every data frame with [`no_route`].
    no_channel: bool,
}

impl Receiver {
    fn new(cfg: ReliableConfig, t0: Instant) -> Receiver {
        Receiver {
            t0,
            table: RecvTable::new(cfg),
            delivered: Vec::new(),
            undone: 0,
            policy: Box::new(|_, _, _, _| None),
            no_channel: false,
        }
    }

    fn on_frame(&mut self, bytes: &[u8], now: Instant, back: &mut Link) {
        let d = match Frame::decode(bytes) {
            Ok(Frame {
                body: FrameBody::Data(d),
                ..
            }) => d,
            Ok(Frame {
                body: FrameBody::Bundle(b),
                ..
            }) => return self.on_bundle(&b, now, back),
            other => panic!("the link carries data and bundle frames only: {other:?}"),
        };
        let h = DataHeader::of(&d);
        let reply = |kind, back: &mut Link| {
            back.send(now, ack_frame(h.session, kind));
        };
        if self.no_channel {
            reply(no_route(&h), back);
            return;
        }
        match self.table.on_frame(B_CH, A_ADDR, &h, now) {
            Verdict::Process { first, last } => {
                if let Some(status) = (self.policy)(h.cookie, first, last, now - self.t0) {
                    if let Blocked::Rejected(p) = self.table.blocked(B_CH, A_ADDR, now, status) {
                        self.undone += usize::from(p.is_some());
                        assert_eq!(p.is_some(), !first, "earlier frames' placement comes back");
                    }
                    return;
                }
                let mut fresh = None;
                match first {
                    true => fresh = Some(d.payload.to_vec()),
                    false => self
                        .table
                        .placement_mut(B_CH, A_ADDR)
                        .expect("a message in progress has its placement")
                        .extend_from_slice(d.payload),
                }
                if let Some(done) = self.table.accepted(B_CH, A_ADDR, fresh, now) {
                    assert!(last);
                    self.delivered.push((h.cookie, done));
                }
            }
            Verdict::Drop => {}
            Verdict::Reset => reply(AckKind::Reset, back),
        }
        self.undone += self.table.take_abandoned().count();
    }

    /// A bundle: each entry is a whole message, placed (or blocked by the policy) in turn.
    fn on_bundle(&mut self, b: &BundleFrame<'_>, now: Instant, back: &mut Link) {
        let h = BundleHeader::of(b);
        if self.no_channel {
            let kind = AckKind::Reject {
                ack: h.seq,
                message_id: h.first_message_id,
                status: CompletionStatus::NoRoute,
            };
            back.send(now, ack_frame(h.session, kind));
            return;
        }
        match self.table.on_bundle(B_CH, A_ADDR, &h, now) {
            BundleVerdict::Process { skip } => {
                for (_, e) in b.entries().skip(usize::from(skip)) {
                    if let Some(status) = (self.policy)(e.cookie, true, true, now - self.t0) {
                        if let Blocked::Rejected(p) = self.table.blocked(B_CH, A_ADDR, now, status)
                        {
                            assert!(p.is_none(), "a whole message has no earlier placement");
                        }
                        break;
                    }
                    self.delivered.push((e.cookie, e.payload.to_vec()));
                    self.table.entry_accepted(B_CH, A_ADDR, now);
                }
            }
            BundleVerdict::Drop => {}
            BundleVerdict::Reset => back.send(now, ack_frame(h.session, AckKind::Reset)),
        }
    }

    fn send_acks(&mut self, now: Instant, back: &mut Link) {
        self.table.take_acks(|a| {
            assert_eq!((a.local, a.remote), (B_CH, A_ADDR));
            back.send(now, a.frame(B_ADDR).encode().unwrap());
        });
    }
}

/// An ack from B's channel to A's, encoded (for answers that have no [`OutgoingAck`]).
fn ack_frame(session: u32, kind: AckKind) -> Vec<u8> {
    let a = OutgoingAck {
        local: B_CH,
        remote: A_ADDR,
        session,
        kind,
    };
    a.frame(B_ADDR).encode().unwrap()
}

fn data_frame(f: FrameOut<'_, Msg>) -> Vec<u8> {
    if let Some(bundle) = f.bundle {
        let count = bundle.len() as u16;
        let mut entries = Vec::new();
        for (i, (id, m)) in bundle.enumerate() {
            assert_eq!(
                id,
                f.message_id.wrapping_add(i as u32),
                "bundle ids are consecutive"
            );
            BundleEntry {
                cookie: m.index as u64,
                msg_flags: 0,
                payload: &m.payload,
            }
            .encode_into(&mut entries)
            .unwrap();
        }
        let frame = Frame {
            dst: f.remote.mac,
            src: A_MAC,
            body: FrameBody::Bundle(BundleFrame {
                src_endpoint: A_ADDR.endpoint,
                dst_endpoint: f.remote.endpoint,
                session: f.session,
                seq: f.seq,
                first_message_id: f.message_id,
                count,
                entries: &entries,
            }),
        };
        return frame.encode().unwrap();
    }
    let start = f.frag_offset as usize;
    let payload = &f.handle.payload[start..start + f.frag_len as usize];
    assert_eq!((f.local, f.remote), (A_CH, B_ADDR));
    let cookie = f.handle.index as u64;
    let frame = f.frame(A_ADDR, DataKind::DmaData, 0, cookie, payload);
    assert_eq!(frame.dst, B_MAC);
    frame.encode().unwrap()
}

/// A frame carries, every time it is sent, the company its messages had the first time they
/// were sent, less those completed since: a stale copy of a frame must never stand for other
/// messages than the frame now sent at its place (docs/wire.md §6).
fn check_company(
    company: &mut HashMap<usize, Vec<usize>>,
    done: &HashSet<usize>,
    f: &FrameOut<'_, Msg>,
) {
    let members: Vec<usize> = match &f.bundle {
        Some(b) => b.clone().map(|(_, m)| m.index).collect(),
        None => vec![f.handle.index],
    };
    for m in &members {
        match company.get(m) {
            Some(first) => {
                let left: Vec<usize> = first
                    .iter()
                    .copied()
                    .filter(|i| !done.contains(i))
                    .collect();
                assert_eq!(
                    members, left,
                    "message {m} was first sent with {first:?}, now with {members:?}"
                );
            }
            None => {
                company.insert(*m, members.clone());
            }
        }
    }
}

/// Something to do at a point of the simulation.
type Hook = Box<dyn FnMut(&mut Sim)>;

struct Sim {
    t0: Instant,
    now: Instant,
    sender: SendTable<Msg>,
    receiver: Receiver,
    ab: Link,
    ba: Link,
    /// Messages not yet accepted by `offer`, in order.
    to_offer: VecDeque<Msg>,
    offered: usize,
    /// (index, status, when) of each completion.
    completed: Vec<(usize, CompletionStatus, Instant)>,
    /// Called once at the next step (a hook that must run again registers itself again).
    hooks: Vec<Hook>,
    /// Messages of at most [`INLINE_CAPACITY`] bytes are offered as bundle entries.
    bundling: bool,
    /// The messages each message first shared its frame with (itself included).
    company: HashMap<usize, Vec<usize>>,
}

impl Sim {
    fn new(cfg: ReliableConfig, faults: FaultInjection, seed: u64) -> Sim {
        let t0 = Instant::now();
        Sim {
            t0,
            now: t0,
            sender: SendTable::new(cfg, seed as u32 ^ 0x5e55_0000),
            receiver: Receiver::new(cfg, t0),
            ab: Link::new(faults, seed.wrapping_mul(2) + 1),
            ba: Link::new(faults, seed.wrapping_mul(2) + 2),
            to_offer: VecDeque::new(),
            offered: 0,
            completed: Vec::new(),
            hooks: Vec::new(),
            bundling: false,
            company: HashMap::new(),
        }
    }

    /// A simulation with a message of each length in `lens` queued.
    fn with_messages(
        cfg: ReliableConfig,
        faults: FaultInjection,
        seed: u64,
        lens: impl IntoIterator<Item = usize>,
    ) -> Sim {
        let mut sim = Sim::new(cfg, faults, seed);
        for len in lens {
            sim.add(len);
        }
        sim
    }

    fn add(&mut self, len: usize) -> usize {
        let index = self.offered;
        self.offered += 1;
        self.to_offer.push_back(Msg {
            index,
            payload: payload_of(index, len),
        });
        index
    }

    fn elapsed(&self) -> Duration {
        self.now - self.t0
    }

    fn step(&mut self) {
        let now = self.now;
        while let Some(m) = self.to_offer.pop_front() {
            let len = m.payload.len() as u32;
            let entry = (self.bundling && m.payload.len() <= INLINE_CAPACITY)
                .then(|| bundle_entry_len(m.payload.len()) as u32);
            match self.sender.offer(A_CH, B_ADDR, m, len, entry, now) {
                Ok(()) => {}
                Err(Refused::Full(m)) => {
                    self.to_offer.push_front(m);
                    break;
                }
                Err(other) => panic!("refused: {other:?}"),
            }
        }
        let mut budget = TX_BURST;
        let ab = &mut self.ab;
        let done: HashSet<usize> = self.completed.iter().map(|c| c.0).collect();
        let company = &mut self.company;
        self.sender.transmit(now, |f| {
            if budget == 0 {
                return false;
            }
            budget -= 1;
            check_company(company, &done, &f);
            ab.send(now, data_frame(f));
            true
        });
        for f in self.ab.due(now) {
            self.receiver.on_frame(&f, now, &mut self.ba);
        }
        self.receiver.send_acks(now, &mut self.ba);
        let mut done = Vec::new();
        for f in self.ba.due(now) {
            match Frame::decode(&f) {
                Ok(Frame {
                    body: FrameBody::Ack(a),
                    ..
                }) => self.sender.on_ack(A_CH, B_ADDR, &a, now, &mut done),
                other => panic!("the link carries acks only: {other:?}"),
            }
        }
        self.sender.poll(now, &mut done);
        for c in done {
            assert_eq!((c.local, c.remote), (A_CH, B_ADDR));
            self.completed.push((c.handle.index, c.status, now));
        }
        for mut hook in std::mem::take(&mut self.hooks) {
            hook(self);
        }
    }

    /// Runs until every message offered so far completed; panics if it takes longer than
    /// `limit` of virtual time (a hang).
    fn run(&mut self, limit: Duration) {
        while self.completed.len() < self.offered || !self.hooks.is_empty() {
            assert!(
                self.elapsed() <= limit,
                "hung: {} of {} messages completed after {:?}",
                self.completed.len(),
                self.offered,
                self.elapsed()
            );
            self.step();
            let now = self.now;
            let next = [
                self.ab.next(now),
                self.ba.next(now),
                self.sender.next_deadline(),
                self.sender.can_transmit().then_some(now + TICK),
                (!self.to_offer.is_empty() || !self.hooks.is_empty()).then_some(now + TICK),
            ]
            .into_iter()
            .flatten()
            .min();
            match next {
                Some(t) => self.now = t.max(now + Duration::from_nanos(1)),
                None => break,
            }
        }
    }

    /// Checks the contract: every message completed once; a message is delivered at most once,
    /// intact, in offer order; `Ok` iff delivered.
    fn check(&self) {
        let mut status = vec![None; self.offered];
        for &(i, s, _) in &self.completed {
            assert!(status[i].is_none(), "message {i} completed twice");
            status[i] = Some(s);
        }
        assert!(
            status.iter().all(|s| s.is_some()),
            "a message never completed"
        );
        let mut delivered = vec![false; self.offered];
        let mut last = None;
        for (cookie, bytes) in &self.receiver.delivered {
            let i = *cookie as usize;
            assert!(!delivered[i], "message {i} delivered twice");
            delivered[i] = true;
            assert!(last < Some(i), "message {i} delivered after {last:?}");
            last = Some(i);
            assert_eq!(bytes, &*payload_of(i, bytes.len()), "message {i} corrupted");
        }
        for i in 0..self.offered {
            assert_eq!(
                status[i] == Some(CompletionStatus::Ok),
                delivered[i],
                "message {i}: {:?}, delivered {}",
                status[i],
                delivered[i]
            );
        }
    }

    fn status(&self, index: usize) -> Option<CompletionStatus> {
        self.completed.iter().find(|c| c.0 == index).map(|c| c.1)
    }

    /// Whether every completion so far is `Ok`.
    fn all_ok(&self) -> bool {
        self.completed.iter().all(|c| c.1 == CompletionStatus::Ok)
    }
}

fn sizes(seed: u64, n: usize) -> Vec<usize> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9) | 1);
    (0..n)
        .map(|_| match rng.next() % 8 {
            0 => 0,
            1 => (rng.next() % 41) as usize,
            _ => (rng.next() % (64 * 1024 + 1)) as usize,
        })
        .collect()
}

#[test]
fn lossy_links_deliver_every_message_exactly_once_in_order() {
    for seed in 0..16 {
        let mut sim = Sim::with_messages(ReliableConfig::default(), LOSSY, seed, sizes(seed, 40));
        sim.run(Duration::from_secs(60));
        sim.check();
        assert!(
            sim.all_ok(),
            "seed {seed}: 5% faults must not fail a message: {:?}",
            sim.completed
                .iter()
                .filter(|c| c.1 != CompletionStatus::Ok)
                .collect::<Vec<_>>()
        );
        let s = sim.sender.counters();
        let r = sim.receiver.table.counters();
        assert!(
            s.frames_retransmitted > 0 && r.duplicates + r.out_of_order > 0,
            "seed {seed}"
        );
        assert_eq!(r.messages_delivered, 40);
    }
}

#[test]
fn a_megabyte_message_crosses_the_window_intact() {
    for faults in [FaultInjection::default(), LOSSY] {
        let mut sim = Sim::new(ReliableConfig::default(), faults, 9);
        sim.add(1 << 20);
        sim.add(10);
        sim.add(1 << 20);
        sim.run(Duration::from_secs(60));
        sim.check();
        assert_eq!(sim.receiver.delivered.len(), 3, "{faults:?}");
        let s = sim.sender.counters();
        assert!(s.frames_sent > 2 * 721, "{s:?}");
        if faults.is_off() {
            assert_eq!(s.frames_sent, 2 * 721 + 1);
            assert_eq!(s.frames_retransmitted, 0, "{s:?}");
        }
    }
}

#[test]
fn a_receiver_blocked_past_the_wait_rejects_and_later_messages_follow() {
    let cfg = ReliableConfig {
        backpressure_wait: Duration::from_millis(10),
        ..ReliableConfig::default()
    };
    for faults in [FaultInjection::default(), LOSSY] {
        let mut sim = Sim::with_messages(cfg, faults, 3, [100, 5000, 3000, 20, 4000, 9000, 50]);
        // Message 2 finds no buffer for 100 ms; message 4 for 3 ms only; message 5's last
        // frame finds the RX ring full for good.
        sim.receiver.policy = Box::new(|cookie, first, last, since| match cookie {
            2 if first && since < Duration::from_millis(100) => Some(CompletionStatus::NoBuffer),
            4 if first && since < Duration::from_millis(3) => Some(CompletionStatus::NoBuffer),
            5 if last => Some(CompletionStatus::RingFull),
            _ => None,
        });
        sim.run(Duration::from_secs(30));
        sim.check();
        assert_eq!(
            sim.status(2),
            Some(CompletionStatus::NoBuffer),
            "{faults:?}"
        );
        assert_eq!(
            sim.status(5),
            Some(CompletionStatus::RingFull),
            "{faults:?}"
        );
        for i in [0, 1, 3, 4, 6] {
            assert_eq!(
                sim.status(i),
                Some(CompletionStatus::Ok),
                "message {i}, {faults:?}"
            );
        }
        assert!(
            sim.receiver.undone >= 1,
            "message 5's first frames were undone"
        );
        let r = sim.receiver.table.counters();
        assert!(r.rejects >= 2 && r.blocked > r.rejects, "{r:?}");
    }
}

#[test]
fn a_vanished_receiver_fails_everything_peer_unreachable_in_time() {
    let cfg = ReliableConfig::default();
    for faults in [FaultInjection::default(), LOSSY] {
        let mut sim = Sim::with_messages(cfg, faults, 5, sizes(5, 30));
        // The receiver goes away (both directions) once it delivered 3 messages.
        let gone = Rc::new(std::cell::Cell::new(None));
        fn vanish_when_ready(g: Rc<std::cell::Cell<Option<Instant>>>) -> Hook {
            Box::new(move |sim: &mut Sim| {
                if sim.receiver.delivered.len() < 3 {
                    sim.hooks.push(vanish_when_ready(g.clone()));
                    return;
                }
                for link in [&mut sim.ab, &mut sim.ba] {
                    link.up = false;
                    link.queue.clear();
                }
                g.set(Some(sim.now));
            })
        }
        sim.hooks.push(vanish_when_ready(gone.clone()));
        sim.run(Duration::from_secs(30));
        let t_gone = gone.get().expect("the receiver went away");
        let deadline = t_gone + cfg.peer_timeout + cfg.max_rto;
        let mut failed = 0;
        for &(i, s, t) in &sim.completed {
            if s != CompletionStatus::Ok {
                assert_eq!(s, CompletionStatus::PeerUnreachable, "message {i}");
                assert!(t <= deadline, "message {i} failed {:?} late", t - deadline);
                failed += 1;
            }
        }
        assert!(failed >= 20, "{failed} failed");
        assert!(sim.sender.counters().peer_timeouts >= 1);
        // Acks lost with the link can leave a delivered message unacknowledged: only Ok
        // implies delivered here.
        for &(i, s, _) in &sim.completed {
            if s == CompletionStatus::Ok {
                assert!(sim.receiver.delivered.iter().any(|d| d.0 == i as u64));
            }
        }
    }
}

#[test]
fn a_restarted_receiver_resets_in_flight_messages_and_takes_new_ones() {
    for faults in [FaultInjection::default(), LOSSY] {
        let cfg = ReliableConfig::default();
        let mut sim = Sim::with_messages(cfg, faults, 11, std::iter::repeat_n(60_000, 12));
        // The receiving engine restarts (all state lost) after 4 deliveries, then 6 more
        // messages are offered.
        let restarted_at = Rc::new(std::cell::Cell::new(None));
        let r = restarted_at.clone();
        let hook_cfg = cfg;
        fn restart_when_ready(r: Rc<std::cell::Cell<Option<usize>>>, cfg: ReliableConfig) -> Hook {
            Box::new(move |sim: &mut Sim| {
                if sim.receiver.delivered.len() < 4 {
                    sim.hooks.push(restart_when_ready(r.clone(), cfg));
                    return;
                }
                let before = std::mem::take(&mut sim.receiver.delivered);
                sim.receiver = Receiver::new(cfg, sim.t0);
                sim.receiver.delivered = before;
                r.set(Some(sim.offered));
                for _ in 0..6 {
                    sim.add(3000);
                }
            })
        }
        sim.hooks.push(restart_when_ready(r, hook_cfg));
        sim.run(Duration::from_secs(30));
        let first_new = restarted_at.get().expect("restarted");
        let mut gone = 0;
        for i in 0..sim.offered {
            match sim.status(i) {
                Some(CompletionStatus::Ok) => {
                    assert!(
                        sim.receiver.delivered.iter().any(|d| d.0 == i as u64),
                        "message {i} Ok but not delivered"
                    );
                }
                Some(CompletionStatus::DestinationGone) => {
                    assert!(
                        i < first_new,
                        "message {i} offered after the restart failed"
                    );
                    gone += 1;
                }
                other => panic!("message {i}: {other:?}"),
            }
        }
        assert!(
            gone >= 1,
            "{faults:?}: something was in flight at the restart"
        );
        assert!(sim.sender.counters().resets >= 1);
        // Nothing delivered twice, all in order.
        let order: Vec<u64> = sim.receiver.delivered.iter().map(|d| d.0).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    }
}

#[test]
fn no_channel_at_the_destination_fails_sent_messages_no_route() {
    let mut sim = Sim::new(ReliableConfig::default(), FaultInjection::default(), 1);
    sim.receiver.no_channel = true;
    for len in [10, 2000, 0] {
        sim.add(len);
    }
    sim.run(Duration::from_secs(5));
    sim.check();
    for i in 0..3 {
        assert_eq!(sim.status(i), Some(CompletionStatus::NoRoute));
    }
}

// ---------------------------------------------------------------- receiver and sender alone

fn header(
    session: u32,
    seq: u32,
    message_id: u32,
    total_len: u32,
    frag_offset: u32,
    frag_len: u32,
) -> DataHeader {
    DataHeader {
        session,
        seq,
        message_id,
        kind: DataKind::DmaData,
        msg_flags: 0,
        total_len,
        frag_offset,
        frag_len,
        cookie: u64::from(message_id),
    }
}

#[test]
fn stale_first_frames_of_older_sessions_are_not_delivered() {
    let t = Instant::now();
    let mut r: RecvTable<u32> = RecvTable::new(ReliableConfig::default());
    let deliver = |r: &mut RecvTable<u32>, session: u32| match r.on_frame(
        B_CH,
        A_ADDR,
        &header(session, 0, 0, 5, 0, 5),
        t,
    ) {
        Verdict::Process {
            first: true,
            last: true,
        } => {
            assert_eq!(r.accepted(B_CH, A_ADDR, Some(session), t), Some(session));
            true
        }
        Verdict::Drop => false,
        v => panic!("{v:?}"),
    };
    for s in 100..106 {
        assert!(deliver(&mut r, s), "session {s} starts");
    }
    // The last 4 sessions before the current one (101..=104) are remembered.
    for s in 101..105 {
        assert!(!deliver(&mut r, s), "stale first frame of session {s}");
    }
    assert_eq!(r.counters().stale_sessions, 4);
    // A frame after the first of a session without state draws a RESET.
    assert_eq!(
        r.on_frame(B_CH, A_ADDR, &header(7, 3, 0, 5, 0, 5), t),
        Verdict::Reset
    );
    assert_eq!(
        r.on_frame(ChannelId(9), A_ADDR, &header(7, 3, 0, 5, 0, 5), t),
        Verdict::Reset
    );
}

fn expect_process(r: &mut RecvTable<u32>, h: &DataHeader, t: Instant, first: bool, last: bool) {
    assert_eq!(
        r.on_frame(B_CH, A_ADDR, h, t),
        Verdict::Process { first, last },
        "{h:?}"
    );
}

#[test]
fn a_fragment_must_continue_its_message_exactly() {
    let t = Instant::now();
    let mut r: RecvTable<u32> = RecvTable::new(ReliableConfig::default());
    let first = header(1, 0, 10, 30, 0, 10);
    expect_process(&mut r, &first, t, true, false);
    assert_eq!(r.accepted(B_CH, A_ADDR, Some(7), t), None);
    let next = header(1, 1, 10, 30, 10, 10);
    let mut spoiled = Vec::new();
    for spoil in [
        |h: &mut DataHeader| h.message_id = 11,
        |h: &mut DataHeader| h.kind = DataKind::UserData,
        |h: &mut DataHeader| h.msg_flags = 1,
        |h: &mut DataHeader| h.total_len = 31,
        |h: &mut DataHeader| h.cookie = 0,
        |h: &mut DataHeader| h.frag_offset = 9,
        |h: &mut DataHeader| h.frag_len = 25,
    ] {
        let mut h = next;
        spoil(&mut h);
        spoiled.push(h);
    }
    for h in &spoiled {
        assert_eq!(r.on_frame(B_CH, A_ADDR, h, t), Verdict::Drop, "{h:?}");
    }
    assert_eq!(r.counters().invalid, spoiled.len() as u64);
    let mut acks = Vec::new();
    r.take_acks(|a| acks.push(a.kind));
    assert_eq!(
        acks,
        vec![AckKind::Cumulative { ack: 1 }],
        "invalid frames are not acked"
    );
    expect_process(&mut r, &next, t, false, false);
    *r.placement_mut(B_CH, A_ADDR).unwrap() += 1;
    assert_eq!(r.accepted(B_CH, A_ADDR, None, t), None);
    let last = header(1, 2, 10, 30, 20, 10);
    expect_process(&mut r, &last, t, false, true);
    assert_eq!(r.accepted(B_CH, A_ADDR, None, t), Some(8));
    // A new message must come after the last one: an older id is a stale frame.
    assert_eq!(
        r.on_frame(B_CH, A_ADDR, &header(1, 3, 9, 5, 0, 5), t),
        Verdict::Drop
    );
    // An abandoned partial message comes back once its state expires.
    assert!(matches!(
        r.on_frame(B_CH, A_ADDR, &header(1, 3, 11, 50, 0, 5), t),
        Verdict::Process {
            first: true,
            last: false
        }
    ));
    assert_eq!(r.accepted(B_CH, A_ADDR, Some(99), t), None);
    r.expire(t + Duration::from_secs(9));
    assert_eq!(r.len(), 1);
    r.expire(t + Duration::from_secs(10));
    assert_eq!(r.len(), 0);
    assert_eq!(r.take_abandoned().collect::<Vec<_>>(), vec![(B_CH, 99)]);
}

#[test]
fn frames_that_make_no_progress_do_not_keep_a_partial_message_alive() {
    let t = Instant::now();
    let mut r: RecvTable<u32> = RecvTable::new(ReliableConfig::default());
    expect_process(&mut r, &header(1, 0, 10, 30, 0, 10), t, true, false);
    assert_eq!(r.accepted(B_CH, A_ADDR, Some(99), t), None);
    // Every second for 10 s: the same old frame again (a duplicate), a frame ahead (out of
    // order) and one that does not continue the message (invalid). Anyone on the wire can send
    // them; none is progress.
    for s in 1..=10u64 {
        let at = t + Duration::from_secs(s);
        for h in [
            header(1, 0, 10, 30, 0, 10),
            header(1, 5, 10, 30, 10, 10),
            header(1, 1, 10, 30, 9, 10),
        ] {
            assert_eq!(r.on_frame(B_CH, A_ADDR, &h, at), Verdict::Drop, "{h:?}");
        }
        r.expire(at);
    }
    // Ten seconds after its last frame taken the state is gone, and its reserved buffer back.
    assert_eq!(r.len(), 0);
    assert_eq!(r.take_abandoned().collect::<Vec<_>>(), vec![(B_CH, 99)]);
    // A first frame that cannot begin a message takes no slot.
    for h in [
        header(2, 0, 1, 30, 10, 10),
        header(2, 0, 1, 5, 0, 10),
        header(2, 0, 1, 5, 0, 0),
    ] {
        assert_eq!(r.on_frame(B_CH, A_ADDR, &h, t), Verdict::Drop, "{h:?}");
    }
    assert_eq!(r.len(), 0);
}

/// Feeds an ack from B to `local` into `s`; returns the completions.
fn ack_in(
    s: &mut SendTable<u32>,
    local: ChannelId,
    session: u32,
    kind: AckKind,
    at: Instant,
) -> Vec<Completed<u32>> {
    let a = AckFrame {
        src_endpoint: B_ADDR.endpoint,
        dst_endpoint: A_ADDR.endpoint,
        session,
        kind,
    };
    let mut done = Vec::new();
    s.on_ack(local, B_ADDR, &a, at, &mut done);
    done
}

#[test]
fn the_first_frame_of_a_session_goes_alone_and_bad_acks_are_dropped() {
    let t = Instant::now();
    let cfg = ReliableConfig::default();
    let mut s: SendTable<u32> = SendTable::new(cfg, 500);
    let mut done = Vec::new();
    for i in 0..3 {
        s.offer(A_CH, B_ADDR, i, 3000, None, t).unwrap();
    }
    let mut sent = Vec::new();
    s.transmit(t, |f| {
        sent.push(f.seq);
        true
    });
    assert_eq!(sent, vec![0], "one frame until the receiver holds state");
    let session = s.session(A_CH, B_ADDR).unwrap().id();
    let cum = |ack| AckKind::Cumulative { ack };
    let t30 = t + Duration::from_micros(30);
    // A RESET before the session is established is not about it; wrong session, beyond sent.
    done.extend(ack_in(&mut s, A_CH, session, AckKind::Reset, t));
    done.extend(ack_in(&mut s, A_CH, session + 1, cum(1), t));
    done.extend(ack_in(&mut s, A_CH, session, cum(2), t));
    done.extend(ack_in(&mut s, A_CH, session, cum(1), t30));
    done.extend(ack_in(&mut s, ChannelId(5), session, cum(1), t));
    let c = s.counters();
    assert_eq!(
        (
            c.rejects_invalid,
            c.acks_wrong_session,
            c.acks_beyond_sent,
            c.acks_no_session
        ),
        (1, 1, 1, 1)
    );
    assert!(done.is_empty());
    sent.clear();
    let t1 = t + Duration::from_micros(50);
    s.transmit(t1, |f| {
        sent.push(f.seq);
        true
    });
    // 3 messages of 3 frames: the rest of the window now goes.
    assert_eq!(sent, (1..9).collect::<Vec<_>>());
    // Three duplicate acks: fast retransmit from the base.
    for _ in 0..3 {
        done.extend(ack_in(&mut s, A_CH, session, cum(1), t1));
    }
    assert_eq!(s.counters().fast_retransmits, 1);
    sent.clear();
    s.transmit(t1, |f| {
        assert!(f.retransmission);
        sent.push(f.seq);
        sent.len() < 2
    });
    assert_eq!(sent, vec![1, 2], "the second was refused by a full ring");
    // Progress completes whole messages in order. The frame timed since t1 was retransmitted:
    // no sample from it (Karn); the estimate is still the first frame's 30 us.
    let t2 = t1 + Duration::from_micros(500);
    done.extend(ack_in(&mut s, A_CH, session, cum(7), t2));
    let statuses: Vec<_> = done.iter().map(|c| (c.handle, c.status)).collect();
    assert_eq!(
        statuses,
        vec![(0, CompletionStatus::Ok), (1, CompletionStatus::Ok)]
    );
    assert_eq!(
        s.session(A_CH, B_ADDR).unwrap().rtt().srtt(),
        Some(Duration::from_micros(30))
    );
    // The table refuses beyond max_messages, and too large messages.
    for i in 0..cfg.max_messages as u32 - 1 {
        s.offer(A_CH, B_ADDR, 10 + i, 1, None, t1).unwrap();
    }
    assert_eq!(
        s.offer(A_CH, B_ADDR, 1000, 1, None, t1),
        Err(Refused::Full(1000))
    );
    assert_eq!(
        s.offer(A_CH, B_ADDR, 1001, MAX_MESSAGE_LEN + 1, None, t1),
        Err(Refused::TooLarge(1001))
    );
}

// ---------------------------------------------------------------- bounds under garbage

#[test]
fn tables_stay_within_their_bounds_under_garbage() {
    let cfg = ReliableConfig {
        max_send_sessions: 8,
        max_recv_sessions: 8,
        max_messages: 4,
        ..ReliableConfig::default()
    };
    for seed in 1..6u64 {
        let mut rng = Rng(seed * 0x1234_5678_9abc);
        let t0 = Instant::now();
        let mut recv: RecvTable<u64> = RecvTable::new(cfg);
        let mut send: SendTable<u64> = SendTable::new(cfg, seed as u32);
        let mut done = Vec::new();
        for i in 0..20_000u64 {
            let now = t0 + Duration::from_millis(i / 4);
            let key = |r: &mut Rng| {
                (
                    ChannelId((r.next() % 4) as u32),
                    ChannelAddr::new(
                        MacAddr([2, 0, 0, 0, 0, (r.next() % 8) as u8]),
                        (r.next() % 2) as u32,
                    ),
                )
            };
            let (local, remote) = key(&mut rng);
            let small = |r: &mut Rng| match r.next() % 3 {
                0 => (r.next() % 4) as u32,
                _ => r.next() as u32,
            };
            let h = DataHeader {
                session: small(&mut rng),
                seq: small(&mut rng),
                message_id: small(&mut rng),
                kind: if rng.next() % 2 == 0 {
                    DataKind::DmaData
                } else {
                    DataKind::UserData
                },
                msg_flags: (rng.next() % 2) as u8,
                total_len: small(&mut rng),
                frag_offset: small(&mut rng),
                frag_len: small(&mut rng) % 2000,
                cookie: rng.next() % 2,
            };
            if let Verdict::Process { .. } = recv.on_frame(local, remote, &h, now) {
                match rng.next() % 4 {
                    0 => drop(recv.accepted(local, remote, Some(i), now)),
                    1 => drop(recv.blocked(local, remote, now, CompletionStatus::NoBuffer)),
                    2 => drop(recv.rejected(local, remote, CompletionStatus::RingFull)),
                    _ => {}
                }
            }
            let b = BundleHeader {
                session: small(&mut rng),
                seq: small(&mut rng),
                first_message_id: small(&mut rng),
                count: (rng.next() % 4) as u16,
            };
            if let BundleVerdict::Process { .. } = recv.on_bundle(local, remote, &b, now) {
                for _ in 0..rng.next() % 4 {
                    match rng.next() % 3 {
                        0 => recv.entry_accepted(local, remote, now),
                        1 => drop(recv.blocked(local, remote, now, CompletionStatus::RingFull)),
                        _ => drop(recv.rejected(local, remote, CompletionStatus::RingFull)),
                    }
                }
            }
            assert!(recv.len() <= cfg.max_recv_sessions);
            if i % 16 == 0 {
                let mut n = 0;
                recv.take_acks(|_| n += 1);
                assert!(n <= cfg.max_recv_sessions);
                recv.take_abandoned().for_each(drop);
            }

            let (local, remote) = key(&mut rng);
            match rng.next() % 3 {
                0 => {
                    // Small messages may share frames; every kind of ack below meets them.
                    let len = match rng.next() % 2 {
                        0 => (rng.next() % 100_000) as u32,
                        _ => (rng.next() % 41) as u32,
                    };
                    let entry = (len <= 40).then(|| bundle_entry_len(len as usize) as u32);
                    drop(send.offer(local, remote, i, len, entry, now))
                }
                1 => send.transmit(now, |f| {
                    assert!(f.frag_len as usize <= cfg.chunk);
                    assert!(f.frag_offset + f.frag_len <= f.total_len);
                    rng.next() % 8 != 0
                }),
                _ => {
                    let kind = match rng.next() % 5 {
                        0 => AckKind::Cumulative {
                            ack: small(&mut rng),
                        },
                        1 => AckKind::Reject {
                            ack: small(&mut rng),
                            message_id: small(&mut rng),
                            status: CompletionStatus::ALL[1 + (rng.next() % 11) as usize],
                        },
                        3 => AckKind::Blocked {
                            ack: small(&mut rng),
                        },
                        _ => AckKind::Reset,
                    };
                    let session = match rng.next() % 2 {
                        0 => send.session(local, remote).map_or(0, |s| s.id()),
                        _ => small(&mut rng),
                    };
                    let a = AckFrame {
                        src_endpoint: remote.endpoint,
                        dst_endpoint: 0,
                        session,
                        kind,
                    };
                    send.on_ack(local, remote, &a, now, &mut done);
                }
            }
            send.poll(now, &mut done);
            assert!(send.len() <= cfg.max_send_sessions);
            for l in 0..4 {
                for m in 0..8 {
                    for e in 0..2 {
                        let r = ChannelAddr::new(MacAddr([2, 0, 0, 0, 0, m]), e);
                        if let Some(s) = send.session(ChannelId(l), r) {
                            assert!(s.queued() <= cfg.max_messages);
                        }
                    }
                }
            }
        }
        let r = recv.counters();
        let s = send.counters();
        assert!(
            r.invalid + r.out_of_order + r.duplicates > 0 && r.resets_sent > 0,
            "{r:?}"
        );
        assert!(
            s.acks_wrong_session + s.acks_beyond_sent + s.rejects_invalid > 0,
            "{s:?}"
        );
        // Completions name only offered messages, each once.
        let mut ids: Vec<u64> = done.iter().map(|c| c.handle).collect();
        ids.sort_unstable();
        assert!(ids.windows(2).all(|w| w[0] != w[1]));
    }
}

#[test]
fn a_reject_holds_until_a_later_message_takes_its_place() {
    let t = Instant::now();
    let cfg = ReliableConfig {
        backpressure_wait: Duration::from_millis(1),
        ..ReliableConfig::default()
    };
    let mut r: RecvTable<u32> = RecvTable::new(cfg);
    // Message 4 (seq 0..=1) is delivered; message 5 starts at seq 2 and its second frame finds
    // the RX ring full past the wait.
    for (seq, off, last) in [(0, 0, false), (1, 10, true)] {
        expect_process(&mut r, &header(1, seq, 4, 20, off, 10), t, off == 0, last);
        r.accepted(B_CH, A_ADDR, (off == 0).then_some(40), t);
    }
    expect_process(&mut r, &header(1, 2, 5, 20, 0, 10), t, true, false);
    assert_eq!(r.accepted(B_CH, A_ADDR, Some(50), t), None);
    let second = header(1, 3, 5, 20, 10, 10);
    expect_process(&mut r, &second, t, false, true);
    assert_eq!(
        r.blocked(B_CH, A_ADDR, t, CompletionStatus::RingFull),
        Blocked::Wait
    );
    expect_process(&mut r, &second, t + Duration::from_millis(1), false, true);
    assert_eq!(
        r.blocked(
            B_CH,
            A_ADDR,
            t + Duration::from_millis(1),
            CompletionStatus::RingFull
        ),
        Blocked::Rejected(Some(50))
    );
    let reject = AckKind::Reject {
        ack: 3,
        message_id: 5,
        status: CompletionStatus::RingFull,
    };
    let acks = |r: &mut RecvTable<u32>| {
        let mut v = Vec::new();
        r.take_acks(|a| v.push(a.kind));
        v
    };
    assert_eq!(acks(&mut r), vec![reject]);
    // Neither the rejected message again, nor an earlier one, nor a later one's second frame
    // ends the reject: each draws it again.
    for h in [
        header(1, 3, 5, 20, 10, 10),
        header(1, 2, 5, 20, 0, 10),
        header(1, 3, 4, 5, 0, 5),
        header(1, 3, 6, 20, 10, 10),
        header(1, 4, 6, 5, 0, 5),
    ] {
        assert_eq!(r.on_frame(B_CH, A_ADDR, &h, t), Verdict::Drop, "{h:?}");
        assert_eq!(acks(&mut r), vec![reject], "{h:?}");
    }
    // The renumbered message 6 at seq 3 ends it.
    expect_process(&mut r, &header(1, 3, 6, 5, 0, 5), t, true, true);
    assert_eq!(r.accepted(B_CH, A_ADDR, Some(60), t), Some(60));
    assert_eq!(acks(&mut r), vec![AckKind::Cumulative { ack: 4 }]);
    // A stale first frame of message 5 landing on the expected seq does not start it again.
    assert_eq!(
        r.on_frame(B_CH, A_ADDR, &header(1, 4, 5, 20, 0, 10), t),
        Verdict::Drop
    );
    assert_eq!(r.counters().invalid, 1);
}

#[test]
fn a_reject_mid_message_renumbers_from_the_rejected_frame() {
    let t = Instant::now();
    let mut s: SendTable<u32> = SendTable::new(ReliableConfig::default(), 70);
    // Message 0: 3 frames (seq 0..=2); message 1: 1 frame (3); message 2: 2 frames (4..=5).
    for (handle, len) in [(0, 3000), (1, 10), (2, 2000)] {
        s.offer(A_CH, B_ADDR, handle, len, None, t).unwrap();
    }
    let session = s.session(A_CH, B_ADDR).unwrap().id();
    let mut done = Vec::new();
    let seqs = |s: &mut SendTable<u32>| {
        let mut v = Vec::new();
        s.transmit(t, |f| {
            v.push((f.seq, *f.handle, f.frag_offset));
            true
        });
        v
    };
    assert_eq!(seqs(&mut s), vec![(0, 0, 0)]);
    done.extend(ack_in(
        &mut s,
        A_CH,
        session,
        AckKind::Cumulative { ack: 1 },
        t,
    ));
    assert_eq!(seqs(&mut s).len(), 5);
    // The receiver took frames 0 and 1 of message 0 and rejects it at frame 2.
    let reject = AckKind::Reject {
        ack: 2,
        message_id: 0,
        status: CompletionStatus::RingFull,
    };
    done.extend(ack_in(&mut s, A_CH, session, reject, t));
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].handle, done[0].status),
        (0, CompletionStatus::RingFull)
    );
    // Messages 1 and 2 now start at seq 2; nothing of them counts as sent.
    assert_eq!(seqs(&mut s), vec![(2, 1, 0), (3, 2, 0), (4, 2, 1456)]);
    // A stale ack from before the reject (frames 0..2 taken) acknowledges nothing new, and the
    // reject again (a duplicate) is dropped.
    done.extend(ack_in(
        &mut s,
        A_CH,
        session,
        AckKind::Cumulative { ack: 2 },
        t,
    ));
    done.extend(ack_in(&mut s, A_CH, session, reject, t));
    assert_eq!(done.len(), 1);
    assert_eq!(s.counters().rejects_invalid, 1);
    done.extend(ack_in(
        &mut s,
        A_CH,
        session,
        AckKind::Cumulative { ack: 5 },
        t,
    ));
    let rest: Vec<_> = done[1..].iter().map(|c| (c.handle, c.status)).collect();
    assert_eq!(
        rest,
        vec![(1, CompletionStatus::Ok), (2, CompletionStatus::Ok)]
    );
}

/// A simulation with `n` messages of `len` bytes offered as bundle entries.
fn bundled(faults: FaultInjection, seed: u64, n: usize, len: usize) -> Sim {
    let mut sim = Sim::new(ReliableConfig::default(), faults, seed);
    sim.bundling = true;
    for _ in 0..n {
        sim.add(len);
    }
    sim
}

#[test]
fn small_messages_share_frames_and_survive_lossy_links() {
    let mut retransmitted = 0;
    for seed in 0..8 {
        let mut sim = bundled(LOSSY, seed, 0, 0);
        let mut rng = Rng(seed.wrapping_mul(0x51) | 1);
        for _ in 0..400 {
            sim.add((rng.next() % (INLINE_CAPACITY as u64 + 1)) as usize);
        }
        sim.run(Duration::from_secs(60));
        sim.check();
        assert!(sim.all_ok(), "seed {seed}");
        let s = sim.sender.counters();
        let r = sim.receiver.table.counters();
        assert_eq!(r.messages_delivered, 400, "seed {seed}");
        assert!(
            r.bundles_accepted > 0 && s.frames_sent < 100,
            "seed {seed}: 400 messages took {} frames ({} bundles)",
            s.frames_sent,
            r.bundles_accepted
        );
        retransmitted += s.frames_retransmitted;
    }
    assert!(retransmitted > 0, "the faults never hit a frame");
}

#[test]
fn a_bundle_blocked_part_way_goes_on_after_its_placed_entries() {
    for faults in [FaultInjection::default(), LOSSY] {
        let mut sim = bundled(faults, 5, 30, 20);
        // The RX ring is full when message 10 arrives, for 300 us (within the wait).
        sim.receiver.policy = Box::new(|cookie, _, _, since| {
            (cookie == 10 && since < Duration::from_micros(300))
                .then_some(CompletionStatus::RingFull)
        });
        sim.run(Duration::from_secs(10));
        sim.check();
        assert!(sim.all_ok(), "{faults:?}");
        let s = sim.sender.counters();
        let r = sim.receiver.table.counters();
        assert!(r.blocked > 0 && r.bundles_accepted > 0, "{faults:?}: {r:?}");
        if faults.is_off() {
            // One bundle; its copies after the pause carry on after message 9.
            assert_eq!(s.frames_sent, 1, "{s:?}");
            assert!(s.pauses > 0 && s.timeouts == 0, "{s:?}");
            assert_eq!(r.messages_delivered, 30);
        }
    }
}

#[test]
fn a_bundle_entry_rejected_fails_alone_and_the_rest_follow() {
    let mut sim = bundled(FaultInjection::default(), 6, 30, 20);
    // Message 10 never finds room: rejected after the wait; 0-9 were delivered before it, and
    // 11-29 travel again, renumbered, in a new bundle.
    sim.receiver.policy =
        Box::new(|cookie, _, _, _| (cookie == 10).then_some(CompletionStatus::RingFull));
    sim.run(Duration::from_secs(10));
    sim.check();
    for i in 0..30 {
        let want = match i {
            10 => CompletionStatus::RingFull,
            _ => CompletionStatus::Ok,
        };
        assert_eq!(sim.status(i), Some(want), "message {i}");
    }
    let r = sim.receiver.table.counters();
    assert_eq!((r.rejects, r.messages_delivered), (1, 29), "{r:?}");
    // 11-29 went again together, in a bundle of their own.
    assert_eq!(r.bundles_accepted, 1, "{r:?}");
    assert_eq!(sim.company.get(&11).map(Vec::len), Some(19 + 11));
}

/// Sends `n` messages of 1000 bytes over clean links (seed `seed`) to a receiver that blocks
/// frames as `policy` says, and asserts that every message completed Ok and that the sender
/// paused for the blocked receiver instead of waiting out a retransmission timeout. Returns
/// the finished simulation.
fn assert_sender_pauses_for(seed: u64, n: usize, policy: Policy) -> Sim {
    let mut sim = Sim::with_messages(
        ReliableConfig::default(),
        FaultInjection::default(),
        seed,
        std::iter::repeat_n(1000, n),
    );
    sim.receiver.policy = policy;
    sim.run(Duration::from_secs(10));
    sim.check();
    assert!(sim.all_ok());
    let s = sim.sender.counters();
    assert!(s.pauses > 0 && s.timeouts == 0, "{s:?}");
    sim
}

#[test]
fn a_blocked_receiver_pauses_the_sender_instead_of_timing_out() {
    // Every frame finds the RX ring full from 100 to 500 us (within the wait).
    let sim = assert_sender_pauses_for(
        7,
        3000,
        Box::new(|_, _, _, since| {
            (since >= Duration::from_micros(100) && since < Duration::from_micros(500))
                .then_some(CompletionStatus::RingFull)
        }),
    );
    let r = sim.receiver.table.counters();
    assert!(r.blocked > 0, "the receiver was blocked: {r:?}");
    // Without the pause, the window goes into the blocked receiver and the sender waits out a
    // retransmission timeout (1 ms at least).
    assert!(
        sim.elapsed() < Duration::from_millis(5),
        "took {:?}",
        sim.elapsed()
    );
}

#[test]
fn rejects_among_bundles_of_mixed_sizes_over_lossy_links_keep_exactly_once() {
    let cfg = ReliableConfig {
        backpressure_wait: Duration::from_micros(200),
        ..ReliableConfig::default()
    };
    let mut rejected = 0;
    for seed in 0..16 {
        let mut sim = Sim::new(cfg, LOSSY, seed);
        sim.bundling = true;
        let mut rng = Rng(seed.wrapping_mul(0x3b) | 1);
        // Empty and full-size entries, so that bundles fill unevenly, and the odd DMA-sized
        // message between them.
        for _ in 0..300 {
            sim.add(match rng.next() % 8 {
                0 => 0,
                1 => 3000,
                _ => INLINE_CAPACITY,
            });
        }
        // Every 17th message finds no room for good: rejected after the wait.
        sim.receiver.policy =
            Box::new(|cookie, _, _, _| (cookie % 17 == 5).then_some(CompletionStatus::RingFull));
        sim.run(Duration::from_secs(60));
        sim.check();
        for i in 0..300 {
            let want = match i % 17 {
                5 => CompletionStatus::RingFull,
                _ => CompletionStatus::Ok,
            };
            assert_eq!(sim.status(i), Some(want), "seed {seed}, message {i}");
        }
        rejected += sim.receiver.table.counters().rejects;
    }
    assert!(rejected >= 16 * 17, "{rejected} rejects");
}

#[test]
fn a_blocked_ack_that_also_makes_progress_pauses_the_sender() {
    // Message 0 establishes the session; 1-10 then go in one burst, and message 5's first
    // frame finds no buffer for 300 us: the receiver's one ack for the burst takes 1-4 and is
    // blocked at 5, with nothing new for the sender to send.
    assert_sender_pauses_for(
        8,
        11,
        Box::new(|cookie, first, _, since| {
            (cookie == 5 && first && since < Duration::from_micros(300))
                .then_some(CompletionStatus::NoBuffer)
        }),
    );
}

#[test]
fn a_message_trickled_in_is_given_up_half_a_lifetime_after_its_first_frame() {
    let t = Instant::now();
    let cfg = ReliableConfig::default();
    let mut r: RecvTable<u32> = RecvTable::new(cfg);
    // A 1 MiB message whose sender sends one small fragment every 2 s: each is progress, so
    // the state lives on, but the message (and the posted buffer it holds) may not.
    expect_process(&mut r, &header(1, 0, 10, 1 << 20, 0, 10), t, true, false);
    assert_eq!(r.accepted(B_CH, A_ADDR, Some(99), t), None);
    let longest = cfg.state_lifetime / 2;
    let mut k = 1u32;
    loop {
        let at = t + Duration::from_secs(2 * u64::from(k));
        r.expire(at);
        if at.duration_since(t) >= longest {
            break;
        }
        assert_eq!(r.take_abandoned().count(), 0, "given up too early, at {k}");
        let h = header(1, k, 10, 1 << 20, 10 * k, 10);
        expect_process(&mut r, &h, at, false, false);
        assert_eq!(r.accepted(B_CH, A_ADDR, None, at), None);
        k += 1;
    }
    // Its placement is back, the state stays, and the next fragment no longer continues it.
    assert_eq!(r.take_abandoned().collect::<Vec<_>>(), vec![(B_CH, 99)]);
    assert_eq!(r.len(), 1);
    let next = header(1, k, 10, 1 << 20, 10 * k, 10);
    let at = t + Duration::from_secs(2 * u64::from(k));
    assert_eq!(r.on_frame(B_CH, A_ADDR, &next, at), Verdict::Drop);
    assert_eq!(r.counters().abandoned, 1);
}
