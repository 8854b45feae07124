//! A worker's side of the uplink (docs/wire.md): its own packet socket in the uplink's fanout
//! group, the sending sessions of the channels it serves and the receiving states of the
//! channels whose frames the steering program gives it.
//!
//! Each pass, a worker with an uplink:
//! - **receives** a batch from its socket: data frames go through the receiving side of the
//!   protocol into the destination channel (`remote::Incoming`), acks through the sending side
//!   into completions for the channels it serves, other frames to the local guests' ports
//!   ([`LocalPorts`]); everything from the wire is checked first (decoded, a source MAC that is
//!   a local guest's refused) and every drop is counted;
//! - **transmits** the data frames its sessions may send (DMA-data read again from the sender's
//!   memory for each transmission), the acks due and the stateless answers (NoRoute for an
//!   endpoint of a local MAC that has no channel, RESET for a frame without state), those at a
//!   bounded rate;
//! - **runs the timers**: retransmission and peer timeouts, expiry of silent receiving states.
//!
//! A message for a remote destination leaves its sender's TX ring when its session takes it
//! ([`WireSide::offer`]); its completion follows when the peer acknowledged it (or when it
//! failed). While the session is full the message waits at the head of the TX ring, without a
//! deadline: the session's peer timeout bounds how long its messages can stay unanswered. While
//! the table has no slot for a new session (every one holds other channels' messages) it waits
//! like a message for a full local destination, up to the backpressure wait.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use svnic_channels::frame::{
    bundle_entry_len, AckFrame, AckKind, BundleEntry, BundleFrame, DataFrame, DataKind, Frame,
    FrameBody,
};
use svnic_channels::message::FLAG_WANT_COMPLETION;
use svnic_channels::{ChannelAddr, ChannelId, CompletionStatus, MacAddr, RawMessage};
use svnic_control_plane::{RoutingSnapshot, TokenBucket};

use super::channel::{completion, EngineChannel};
use super::counters::{bump, TxTally};
use super::deliver::{Outcome, Tx};
use super::remote::{Incoming, Outbound, Placement};
use crate::counter_set::counter_set;
use crate::debug_fields::debug_fields;
use crate::uplink::packet::{PacketError, PacketSocket};
use crate::uplink::reliable::{
    Blocked, BundleHeader, BundleVerdict, Completed, DataHeader, FaultCounters, FaultInjection,
    FaultInjector, FrameOut, RecvCounters, RecvTable, Refused, ReliableConfig, SendCounters,
    SendTable, Verdict,
};
use crate::uplink::{Ingress, LocalPorts};

/// Frames a worker takes from its socket per pass.
const RX_BATCH: usize = 64;

/// Stateless answers (NoRoute, RESET) a worker sends per second at most: they answer frames
/// anyone on the wire can send.
const STATELESS_PER_SEC: u32 = 1000;

/// Addresses of local channels remembered for their acks: beyond this many the map starts
/// afresh (it is refilled by the next frame of each live state; a channel destroyed on another
/// worker is never forgotten here otherwise).
const LOCAL_ADDRS_MAX: usize = 4096;

/// How often silent receiving states are looked for.
const EXPIRE_EVERY: Duration = Duration::from_millis(100);

/// How often the counters of the protocol tables are copied out for the operator.
const PUBLISH_EVERY: Duration = Duration::from_millis(20);

/// An idle pass (no frame in the RX ring, nothing to send, no timer running) does nothing but
/// look at the ring, except every this many: then it reads the clock and runs the periodic
/// work (expiry of silent states, publishing the counters). Reading the clock on every idle pass
/// made a spinning worker's pass several times longer.
const IDLE_CLOCK_EVERY: u32 = 256;

counter_set! {
    /// What a worker's uplink side did (written by its thread only).
    pub struct WireCounters;
    /// A worker's uplink counts (see [`WireStats`]).
    pub struct WireCounts {
        /// Frames taken from the socket.
        rx_frames,
        /// Data and bundle frames taken.
        rx_data,
        /// Ack frames taken.
        rx_acks,
        /// Data frames for a channel another worker serves (steering and placement disagree).
        rx_off_worker,
        /// Other frames handed to local guests' ports.
        rx_to_ports,
        /// Frames that did not decode, or svnic frames of a type that never comes from the wire.
        rx_malformed,
        /// Frames whose source MAC is a local guest's.
        rx_spoofed,
        /// Frames for MACs no local guest owns.
        rx_not_local,
        /// Frames a local port refused (link down, queue full).
        rx_port_refused,
        /// Data frames for an endpoint of a local MAC without a channel (answered NoRoute).
        rx_no_route,
        /// Stateless answers not sent: over the rate limit.
        answers_limited,
        /// Frames handed to the socket.
        tx_frames,
        /// Frames the socket could not take (TX ring full after a flush): sent again later
        /// (data) or lost (acks, answers: the peer retransmits).
        tx_full,
    }
}

/// A snapshot of one worker's uplink counters: the socket side's own and the protocol tables'.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WireStats {
    /// Worker index.
    pub worker: usize,
    /// Frames taken from and handed to the socket.
    pub counts: WireCounts,
    /// The send table's counters.
    pub send: SendCounters,
    /// The receive table's counters.
    pub recv: RecvCounters,
    /// The fault injector's counters (all zero without one).
    pub fault: FaultCounters,
}

impl WireStats {
    /// Every counter with its name, for the operator: the socket side's names as declared,
    /// then the tables' prefixed with `send.`, `recv.` and `fault.`.
    pub fn named(&self) -> Vec<(String, u64)> {
        fn prefixed<'a>(
            prefix: &'a str,
            names: &'a [&'a str],
            values: impl Iterator<Item = u64> + 'a,
        ) -> impl Iterator<Item = (String, u64)> + 'a {
            names
                .iter()
                .map(move |n| format!("{prefix}{n}"))
                .zip(values)
        }
        prefixed("", WireCounts::NAMES, self.counts.values())
            .chain(prefixed("send.", SendCounters::NAMES, self.send.values()))
            .chain(prefixed("recv.", RecvCounters::NAMES, self.recv.values()))
            .chain(prefixed(
                "fault.",
                FaultCounters::NAMES,
                self.fault.values(),
            ))
            .collect()
    }
}

/// What a worker needs to join the uplink.
pub struct WireSetup {
    /// Its socket, already in the fanout group at its index.
    pub socket: PacketSocket,
    /// The local guests' ports.
    pub ports: Arc<dyn LocalPorts>,
    /// The protocol's parameters.
    pub reliable: ReliableConfig,
    /// Fault injection on the frames this worker sends, and its seed.
    pub fault: Option<(FaultInjection, u64)>,
    /// Seed of the session ids (different for every worker and every start).
    pub session_seed: u32,
}

debug_fields!(WireSetup, |w| iface: w.socket.iface(), reliable: w.reliable, fault: w.fault);

/// A channel a worker serves, as the uplink side needs it.
pub(crate) trait ServedChannels {
    /// The served channel with this id.
    fn served(&self, id: ChannelId) -> Option<&EngineChannel>;
}

/// The uplink side of one worker.
pub(crate) struct WireSide {
    /// The worker's index.
    index: usize,
    socket: PacketSocket,
    ports: Arc<dyn LocalPorts>,
    send: SendTable<Outbound>,
    recv: RecvTable<Incoming>,
    fault: Option<FaultInjector<Vec<u8>>>,
    counters: WireCounters,
    /// The counters as last published (see `publish`).
    published: Arc<Mutex<WireStats>>,
    completions: Vec<Completed<Outbound>>,
    raw_completions: Vec<RawMessage>,
    /// The addresses of the local channels that have receiving states (acks come from them).
    local_addrs: HashMap<ChannelId, ChannelAddr>,
    /// Acks and answers to send: (from, to, session, what).
    acks: Vec<(ChannelAddr, ChannelAddr, u32, AckKind)>,
    /// The stateless answers' budget: `STATELESS_PER_SEC` per second.
    budget: TokenBucket,
    frame: Vec<u8>,
    payload: Vec<u8>,
    faulted: Vec<Vec<u8>>,
    next_expire: Instant,
    next_publish: Instant,
    /// Idle passes since the clock was last read.
    idle: u32,
    /// The last flush found the interface down or gone.
    link_down: bool,
}

impl WireSide {
    /// The uplink side of a worker; it publishes its counters into `published`.
    pub fn new(
        index: usize,
        setup: WireSetup,
        published: Arc<Mutex<WireStats>>,
    ) -> Result<Self, String> {
        setup.reliable.validate()?;
        let fault = match setup.fault {
            Some((cfg, seed)) if !cfg.is_off() => Some(FaultInjector::new(cfg, seed)?),
            _ => None,
        };
        let now = Instant::now();
        Ok(WireSide {
            index,
            socket: setup.socket,
            ports: setup.ports,
            send: SendTable::new(setup.reliable, setup.session_seed),
            recv: RecvTable::new(setup.reliable),
            fault,
            counters: WireCounters::default(),
            published,
            completions: Vec::new(),
            raw_completions: Vec::new(),
            local_addrs: HashMap::new(),
            acks: Vec::new(),
            budget: TokenBucket::full(STATELESS_PER_SEC, now),
            frame: Vec::with_capacity(2048),
            payload: Vec::with_capacity(2048),
            faulted: Vec::new(),
            next_expire: now + EXPIRE_EVERY,
            next_publish: now,
            idle: 0,
            link_down: false,
        })
    }

    /// The socket's descriptor, for a sleeping worker's poll.
    pub fn fd(&self) -> RawFd {
        self.socket.fd()
    }

    /// True if a local guest owns `mac` (then a message to it never leaves on the uplink).
    pub fn is_local(&self, mac: MacAddr) -> bool {
        self.ports.owns(mac)
    }

    /// Hands a message of `src` for the remote `peer` to its session. `Forwarded` when taken
    /// (its completion follows the peer's ack), `Held` while the session is full,
    /// `Failed(UplinkError)` if it cannot cross an uplink at all.
    pub fn offer(&mut self, src: &EngineChannel, tx: &Tx<'_>, peer: ChannelAddr) -> Outcome {
        let Some(msg) = Outbound::from_tx(tx, peer) else {
            return Outcome::Failed(CompletionStatus::BadMessage);
        };
        let len = msg.len();
        let entry = msg.inline().map(|p| bundle_entry_len(p.len()) as u32);
        match self
            .send
            .offer(src.id, peer, msg, len, entry, Instant::now())
        {
            Ok(()) => Outcome::Forwarded,
            Err(Refused::Full(_)) => Outcome::Held,
            // Every session slot holds other channels' messages: wait like for room at a
            // local destination, up to the backpressure wait, not for ever.
            Err(Refused::TableFull(_)) => Outcome::Blocked(CompletionStatus::UplinkError),
            Err(Refused::TooLarge(_)) => Outcome::Failed(CompletionStatus::UplinkError),
        }
    }

    /// Forgets a channel that is no longer served or received into: its sessions' messages are
    /// dropped without completions (there is no one left to complete them to), its partial
    /// placements undone.
    pub fn forget(&mut self, id: ChannelId) {
        self.send.remove_local(id, drop);
        self.recv.remove_local(id, drop);
        self.local_addrs.remove(&id);
    }

    /// One pass: receive a batch, run the timers, send what is due. Returns the work done
    /// (frames received and sent, messages completed), 0 if idle.
    pub fn pass(
        &mut self,
        routes: &RoutingSnapshot<Arc<EngineChannel>>,
        served: &dyn ServedChannels,
    ) -> u64 {
        // (Completions never carry over: every pass posts those it made.)
        let idle = !self.socket.has_frames() && !self.busy() && self.send.next_deadline().is_none();
        if idle {
            self.idle = self.idle.wrapping_add(1);
            if self.idle != 1 && self.idle % IDLE_CLOCK_EVERY != 0 {
                return 0;
            }
        }
        let now = Instant::now();
        let mut work = self.receive(routes, now);
        self.send.poll(now, &mut self.completions);
        if now >= self.next_expire {
            self.recv.expire(now);
            self.next_expire = now + EXPIRE_EVERY;
        }
        // Placements of messages their senders gave up: the reservations go back.
        self.recv.take_abandoned().for_each(drop);
        work += self.complete(served);
        work += self.transmit(served, now);
        if now >= self.next_publish {
            self.publish();
            self.next_publish = now + PUBLISH_EVERY;
        }
        work
    }

    /// The worker slept: its next pass reads the clock and runs the periodic work even if idle.
    pub fn woke(&mut self) {
        self.idle = 0;
    }

    /// When the timers need the worker next, if ever.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.send.next_deadline()
    }

    /// True if frames wait to be sent (the worker must not sleep). Not while the interface
    /// is down or gone: the worker then sleeps between its timers and tries again after them.
    pub fn busy(&self) -> bool {
        !self.link_down
            && (self.send.can_transmit() || !self.acks.is_empty() || self.socket.tx_pending() > 0)
    }

    /// Takes the error a poll reported on the socket (POLLERR), which would otherwise make
    /// every poll return at once: logged, at a bounded rate.
    pub fn take_error(&self) {
        if let Err(e) = self.socket.take_error() {
            svnic_control_plane::log_limited!(log::Level::Warn, "uplink: {e}");
        }
    }

    /// Copies the counters out for the operator (also done every `PUBLISH_EVERY` during
    /// passes).
    pub fn publish(&self) {
        let stats = WireStats {
            worker: self.index,
            counts: self.counters.read(),
            send: self.send.counters(),
            recv: self.recv.counters(),
            fault: self
                .fault
                .as_ref()
                .map(|f| *f.counters())
                .unwrap_or_default(),
        };
        *self.published.lock().unwrap_or_else(|e| e.into_inner()) = stats;
    }

    fn receive(&mut self, routes: &RoutingSnapshot<Arc<EngineChannel>>, now: Instant) -> u64 {
        let mut rx = Receiver {
            index: self.index,
            ports: self.ports.as_ref(),
            send: &mut self.send,
            recv: &mut self.recv,
            counters: &self.counters,
            completions: &mut self.completions,
            local_addrs: &mut self.local_addrs,
            acks: &mut self.acks,
            budget: &mut self.budget,
            routes,
            now,
        };
        let n = self.socket.receive(RX_BATCH, |frame| rx.frame(frame));
        bump(&self.counters.rx_frames, n as u64);
        // Acks for what this batch placed: one per receiving state.
        let (recv, local_addrs, acks) = (&mut self.recv, &self.local_addrs, &mut self.acks);
        recv.take_acks(|a| {
            if let Some(from) = local_addrs.get(&a.local) {
                acks.push((*from, a.remote, a.session, a.kind));
            }
        });
        n as u64
    }

    /// Posts the completions of finished messages into their senders' RX rings.
    fn complete(&mut self, served: &dyn ServedChannels) -> u64 {
        let n = self.completions.len() as u64;
        let mut done = std::mem::take(&mut self.completions);
        done.sort_by_key(|c| c.local);
        let mut i = 0;
        while i < done.len() {
            let id = done[i].local;
            let mut tally = TxTally::default();
            let start = i;
            while i < done.len() && done[i].local == id {
                let c = &done[i];
                let msg = &c.handle;
                if c.status == CompletionStatus::Ok {
                    tally.delivered();
                    let want = match msg.kind() {
                        DataKind::UserData => msg.flags & FLAG_WANT_COMPLETION != 0,
                        DataKind::DmaData => true,
                    };
                    if want {
                        let len = match msg.kind() {
                            DataKind::DmaData => msg.len(),
                            DataKind::UserData => 0,
                        };
                        self.raw_completions
                            .push(completion(c.remote, msg.cookie, c.status, len));
                    }
                } else {
                    tally.error(c.status);
                    self.raw_completions
                        .push(completion(c.remote, msg.cookie, c.status, 0));
                }
                i += 1;
            }
            match served.served(id) {
                Some(ch) => {
                    ch.counters.add_tx(&tally);
                    if ch.post_completions(&mut self.raw_completions) {
                        ch.wake_if_sleeping(&ch.mem());
                    }
                }
                None => svnic_control_plane::log_limited!(
                    log::Level::Warn,
                    "uplink: {} completion(s) for {id}, which this worker no longer serves",
                    i - start
                ),
            }
            self.raw_completions.clear();
        }
        done.clear();
        self.completions = done;
        n
    }

    /// Sends the acks due and the data frames the sessions may send; flushes the socket.
    fn transmit(&mut self, served: &dyn ServedChannels, now: Instant) -> u64 {
        let mut sent = 0u64;
        for (from, to, session, kind) in std::mem::take(&mut self.acks) {
            let frame = Frame {
                dst: to.mac,
                src: from.mac,
                body: FrameBody::Ack(AckFrame {
                    src_endpoint: from.endpoint,
                    dst_endpoint: to.endpoint,
                    session,
                    kind,
                }),
            };
            self.frame.clear();
            if frame.encode_into(&mut self.frame).is_ok() {
                sent += u64::from(self.emit_frame());
            }
        }
        let WireSide {
            socket,
            send,
            fault,
            counters,
            frame,
            payload,
            faulted,
            ..
        } = self;
        // A session's frames come one after the other: its sender is looked up once for them.
        let mut last: Option<(ChannelId, &EngineChannel)> = None;
        send.transmit(now, |f: FrameOut<'_, Outbound>| {
            let src = match last {
                Some((id, ch)) if id == f.local => ch,
                _ => match served.served(f.local) {
                    Some(ch) => {
                        last = Some((f.local, ch));
                        ch
                    }
                    // The sender is gone; its sessions are forgotten at its detach.
                    None => return true,
                },
            };
            let msg = f.handle;
            payload.clear();
            if let Some(bundle) = f.bundle {
                let count = bundle.len() as u16;
                for (_, m) in bundle {
                    let entry = BundleEntry {
                        cookie: m.cookie,
                        msg_flags: m.flags,
                        payload: m.inline().unwrap_or_default(),
                    };
                    // Cannot fail (user-data was checked when taken); an entry left out makes
                    // the frame invalid at the receiver and the peer timeout fails it.
                    let _ = entry.encode_into(payload);
                }
                let bundle = Frame {
                    dst: f.remote.mac,
                    src: src.addr.mac,
                    body: FrameBody::Bundle(BundleFrame {
                        src_endpoint: src.addr.endpoint,
                        dst_endpoint: f.remote.endpoint,
                        session: f.session,
                        seq: f.seq,
                        first_message_id: f.message_id,
                        count,
                        entries: payload,
                    }),
                };
                frame.clear();
                if bundle.encode_into(frame).is_err() {
                    return true;
                }
                let ok = emit(socket, fault.as_mut(), counters, frame, faulted);
                sent += u64::from(ok);
                return ok;
            }
            payload.resize(f.frag_len as usize, 0);
            if !msg.read(&src.mem(), f.frag_offset, payload) {
                // Cannot happen (the range was checked when the message was taken); sent empty,
                // the receiver refuses it as invalid and the peer timeout fails the message.
                payload.clear();
            }
            let data = f.frame(src.addr, msg.kind(), msg.flags, msg.cookie, payload);
            frame.clear();
            if data.encode_into(frame).is_err() {
                return true;
            }
            let ok = emit(socket, fault.as_mut(), counters, frame, faulted);
            sent += u64::from(ok);
            ok
        });
        if sent == 0 {
            // The link is idle: frames the fault injector held back go now, or they would wait
            // for traffic that may never come.
            if let Some(f) = &mut self.fault {
                f.release_all(&mut self.faulted);
                for held in std::mem::take(&mut self.faulted) {
                    let _ = queue(&mut self.socket, &self.counters, &held);
                }
            }
        }
        let flushed = self.socket.flush();
        self.link_down = matches!(
            flushed,
            Err(PacketError::InterfaceDown { .. } | PacketError::InterfaceGone { .. })
        );
        if let Err(e) = flushed {
            svnic_control_plane::log_limited!(log::Level::Debug, "uplink: flush: {e}");
        }
        sent
    }

    fn emit_frame(&mut self) -> bool {
        emit(
            &mut self.socket,
            self.fault.as_mut(),
            &self.counters,
            &self.frame,
            &mut self.faulted,
        )
    }
}

/// Queues `frame` on the socket (through the fault injector if there is one); false if the TX
/// ring stayed full after a flush.
fn emit(
    socket: &mut PacketSocket,
    fault: Option<&mut FaultInjector<Vec<u8>>>,
    counters: &WireCounters,
    frame: &[u8],
    faulted: &mut Vec<Vec<u8>>,
) -> bool {
    let Some(fault) = fault else {
        return queue(socket, counters, frame);
    };
    fault.apply(frame.to_vec(), faulted);
    for f in faulted.drain(..) {
        // What the injector lets through is on the wire as far as the protocol knows.
        let _ = queue(socket, counters, &f);
    }
    true
}

fn queue(socket: &mut PacketSocket, counters: &WireCounters, frame: &[u8]) -> bool {
    let mut r = socket.queue(frame);
    if r.is_err() {
        let _ = socket.flush();
        r = socket.queue(frame);
    }
    match r {
        Ok(()) => {
            bump(&counters.tx_frames, 1);
            true
        }
        Err(_) => {
            bump(&counters.tx_full, 1);
            false
        }
    }
}

/// The local channel (destination MAC and endpoint) and the remote one (source MAC and
/// endpoint) a frame from the wire is between.
fn addresses(dst: MacAddr, src: MacAddr, dst_ep: u32, src_ep: u32) -> (ChannelAddr, ChannelAddr) {
    let local = ChannelAddr::new(dst, dst_ep);
    let remote = ChannelAddr::new(src, src_ep);
    (local, remote)
}

/// The receiving half of a pass, borrowed out of the [`WireSide`] while its socket walks the RX
/// ring.
struct Receiver<'a> {
    index: usize,
    ports: &'a dyn LocalPorts,
    send: &'a mut SendTable<Outbound>,
    recv: &'a mut RecvTable<Incoming>,
    counters: &'a WireCounters,
    completions: &'a mut Vec<Completed<Outbound>>,
    local_addrs: &'a mut HashMap<ChannelId, ChannelAddr>,
    acks: &'a mut Vec<(ChannelAddr, ChannelAddr, u32, AckKind)>,
    budget: &'a mut TokenBucket,
    routes: &'a RoutingSnapshot<Arc<EngineChannel>>,
    now: Instant,
}

impl<'a> Receiver<'a> {
    fn frame(&mut self, bytes: &[u8]) {
        let c = self.counters;
        match self.ports.deliver(bytes) {
            Ingress::Svnic => {}
            Ingress::Delivered(_) => return bump(&c.rx_to_ports, 1),
            Ingress::Refused => return bump(&c.rx_port_refused, 1),
            Ingress::Malformed => return bump(&c.rx_malformed, 1),
            Ingress::Spoofed => return bump(&c.rx_spoofed, 1),
            Ingress::NotLocal => return bump(&c.rx_not_local, 1),
        }
        let Ok(frame) = Frame::decode(bytes) else {
            return bump(&c.rx_malformed, 1);
        };
        if self.ports.owns(frame.src) || frame.src.is_multicast() {
            return bump(&c.rx_spoofed, 1);
        }
        // Counted once here, not again as data or an ack.
        if !self.ports.owns(frame.dst) {
            return bump(&c.rx_not_local, 1);
        }
        match frame.body {
            FrameBody::Data(d) => {
                bump(&c.rx_data, 1);
                self.data(frame.dst, frame.src, &d);
            }
            FrameBody::Ack(a) => {
                bump(&c.rx_acks, 1);
                self.ack(frame.dst, frame.src, &a);
            }
            FrameBody::Bundle(b) => {
                bump(&c.rx_data, 1);
                self.bundle(frame.dst, frame.src, &b);
            }
            // Control frames, doorbells and wakes only ever come from a guest's own port.
            _ => bump(&c.rx_malformed, 1),
        }
    }

    fn ack(&mut self, dst: MacAddr, src: MacAddr, a: &AckFrame) {
        let (local, remote) = addresses(dst, src, a.dst_endpoint, a.src_endpoint);
        match self.routes.lookup(&local) {
            Some((id, _)) => self.send.on_ack(*id, remote, a, self.now, self.completions),
            None => bump(&self.counters.rx_no_route, 1),
        }
    }

    fn answer(&mut self, from: ChannelAddr, to: ChannelAddr, session: u32, kind: AckKind) {
        if self
            .budget
            .try_take(STATELESS_PER_SEC, STATELESS_PER_SEC, self.now)
        {
            self.acks.push((from, to, session, kind));
        } else {
            bump(&self.counters.answers_limited, 1);
        }
    }

    /// The local channel a data or bundle frame for a local guest's MAC is for, or None after
    /// answering NoRoute for `(seq, message_id)` of `session`.
    fn destination(
        &mut self,
        local: ChannelAddr,
        remote: ChannelAddr,
        (session, seq, message_id): (u32, u32, u32),
    ) -> Option<(ChannelId, &'a Arc<EngineChannel>)> {
        let routes: &'a RoutingSnapshot<Arc<EngineChannel>> = self.routes;
        let Some((id, dest)) = routes.lookup(&local) else {
            bump(&self.counters.rx_no_route, 1);
            let no_route = AckKind::Reject {
                ack: seq,
                message_id,
                status: CompletionStatus::NoRoute,
            };
            self.answer(local, remote, session, no_route);
            return None;
        };
        // The steering program sends a worker the frames of the endpoints placed on it.
        if dest.worker != self.index {
            bump(&self.counters.rx_off_worker, 1);
        }
        if self.local_addrs.len() >= LOCAL_ADDRS_MAX && !self.local_addrs.contains_key(id) {
            self.local_addrs.clear();
        }
        self.local_addrs.entry(*id).or_insert(local);
        Some((*id, dest))
    }

    fn bundle(&mut self, dst: MacAddr, src: MacAddr, b: &BundleFrame<'_>) {
        let (local, remote) = addresses(dst, src, b.dst_endpoint, b.src_endpoint);
        let h = BundleHeader::of(b);
        let Some((id, dest)) =
            self.destination(local, remote, (h.session, h.seq, h.first_message_id))
        else {
            return;
        };
        let skip = match self.recv.on_bundle(id, remote, &h, self.now) {
            BundleVerdict::Process { skip } => skip,
            BundleVerdict::Drop => return,
            BundleVerdict::Reset => return self.answer(local, remote, h.session, AckKind::Reset),
        };
        for (_, entry) in b.entries().skip(usize::from(skip)) {
            let mut msg = Incoming::User {
                len: 0,
                bytes: [0; svnic_channels::message::INLINE_CAPACITY],
            };
            if let Err(outcome) = msg.take(0, entry.payload) {
                return self.refused(id, remote, outcome);
            }
            match msg.finish(dest, remote, entry.cookie) {
                Outcome::Delivered { .. } => self.recv.entry_accepted(id, remote, self.now),
                outcome => return self.refused(id, remote, outcome),
            }
        }
    }

    fn data(&mut self, dst: MacAddr, src: MacAddr, d: &DataFrame<'_>) {
        let (local, remote) = addresses(dst, src, d.header.dst_endpoint, d.header.src_endpoint);
        let h = DataHeader::of(d);
        let Some((id, dest)) = self.destination(local, remote, (h.session, h.seq, h.message_id))
        else {
            return;
        };
        match self.recv.on_frame(id, remote, &h, self.now) {
            Verdict::Drop => {}
            Verdict::Reset => self.answer(local, remote, h.session, AckKind::Reset),
            Verdict::Process { first, last } => {
                self.place(id, dest, remote, &h, d.payload, first, last)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn place(
        &mut self,
        id: ChannelId,
        dest: &Arc<EngineChannel>,
        remote: ChannelAddr,
        h: &DataHeader,
        payload: &[u8],
        first: bool,
        last: bool,
    ) {
        let now = self.now;
        let mut fresh = None;
        if first {
            match h.kind {
                DataKind::UserData => {
                    fresh = Some(Incoming::User {
                        len: 0,
                        bytes: [0; svnic_channels::message::INLINE_CAPACITY],
                    })
                }
                DataKind::DmaData => match Placement::begin(dest, h.total_len) {
                    Ok(p) => fresh = Some(Incoming::Dma(p)),
                    Err(outcome) => return self.refused(id, remote, outcome),
                },
            }
        }
        let incoming = match fresh.as_mut() {
            Some(p) => p,
            None => match self.recv.placement_mut(id, remote) {
                Some(p) => p,
                // A continuation without a placement: its first frame was never placed.
                None => {
                    self.recv.rejected(id, remote, CompletionStatus::BadMessage);
                    return;
                }
            },
        };
        if let Err(outcome) = incoming.take(h.frag_offset, payload) {
            return self.refused(id, remote, outcome);
        }
        if last {
            match incoming.finish(dest, remote, h.cookie) {
                Outcome::Delivered { .. } => {}
                outcome => return self.refused(id, remote, outcome),
            }
        }
        // On the last frame the placement comes back, done (dropped here).
        self.recv.accepted(id, remote, fresh, now);
    }

    /// The frame could not be placed: wait (the sender retransmits it) or reject its message.
    fn refused(&mut self, id: ChannelId, remote: ChannelAddr, outcome: Outcome) {
        match outcome {
            Outcome::Blocked(status) => match self.recv.blocked(id, remote, self.now, status) {
                Blocked::Wait | Blocked::Rejected(_) => {}
            },
            Outcome::Failed(status) => {
                self.recv.rejected(id, remote, status);
            }
            Outcome::DestinationBroken(..) => {
                self.recv
                    .rejected(id, remote, CompletionStatus::DestinationFaulted);
            }
            Outcome::Delivered { .. } | Outcome::Forwarded | Outcome::Held => {}
        }
    }
}
