//! The engine, running, fed with a hostile guest's channel memory.
//!
//! One engine (1 worker, 1 ms backpressure wait, short idle phases) lives for the whole process,
//! with three fake guests of 2 MiB each:
//! - the **attacker** owns channels `a0` and `a1` (16 slots, 256 KiB each) and writes whatever the
//!   [`Script`] says into their headers and rings;
//! - the **victim** owns channel `v` (32 slots, 512 KiB) and behaves: it keeps 4 buffers of 4 KiB
//!   posted, drains its RX ring, and on request sends DMA-data to the attacker (so the attacker's
//!   hostile post ring is exercised with an honest source);
//! - a **healthy** guest owns channel `h`, which sends user-data to the attacker on request and,
//!   at the end of every input, one message to the victim as a liveness probe.
//!
//! Every input starts from fresh channels (created, then destroyed at the end) over memory filled
//! with known patterns. [`run`] panics unless, after the script:
//! - the engine still delivers: the probe `h -> v` arrives within [`PROBE_TIMEOUT`] (if it comes
//!   back RingFull, the victim's RX ring stayed full of its own completions longer than the 1 ms
//!   backpressure wait, which is the engine keeping its word: it is sent again);
//! - the victim and the healthy channel are live (the victim's fault word clear), and everything
//!   the victim received decodes, names a real source, and (DMA-data) lies in a buffer it posted
//!   and holds only bytes from a data area;
//! - no byte of the victim's or the attacker's guest memory outside what the engine may write was
//!   changed: guest memory outside the channel regions, and the victim's data area outside its
//!   posted buffers.
//!
//! A panic in any engine thread ends a fuzzing process too (libfuzzer-sys aborts on a panic).

use std::time::{Duration, Instant};

use svnic_backend::RunState;
use svnic_channels::layout::header;
use svnic_channels::message::{FLAG_COMPLETE, MESSAGE_SIZE};
use svnic_channels::{
    ChannelAddr, ChannelId, ChannelLayout, CompletionStatus, DataRef, DmaData, MacAddr, Message,
    PostBuffer, RawMessage, UserData,
};
use svnic_client::{Channel, Completions};

use super::guests::{check_fill, fill, fixture, Fixture, GUEST_MEM};
use super::hostile::{Heads, Hostile};
use super::input::{
    Attacker, Head, Op, Peer, Ring, Script, Slot, SlotBody, Target, MAX_BURST, MAX_OPS,
};

/// Waiting per input at most.
const MAX_WAIT: Duration = Duration::from_millis(3);
/// Generous: the project machine is shared, and a slow probe is not a lost one (libFuzzer's
/// `-timeout` must be longer).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Fill of guest memory that nobody may write.
const FILL_OUTSIDE: u8 = 0xa5;
/// Fill of the attacker's data areas (the only bytes its DMA-data can carry, besides what the
/// victim sent it).
const FILL_ATTACKER_DATA: u8 = 0x11;
/// Fill of the attacker's header and rings before the engine initialises them (never valid
/// DMA-data: the engine must only copy from data areas).
const FILL_ATTACKER_RINGS: u8 = 0xee;
/// Fill of the victim's data area outside its posted buffers (also its DMA source).
const FILL_VICTIM_DATA: u8 = 0x5a;
/// Posted buffers start zeroed.
const FILL_POSTED: u8 = 0x00;

pub(super) const ATTACKER_RING: u32 = 16;
const ATTACKER_LEN: u64 = 256 << 10;
/// Attacker channel regions (guest-physical); the rest of its memory is FILL_OUTSIDE.
const ATTACKER_AT: [u64; 2] = [0, 512 << 10];
/// Where the attacker's memory is checked for FILL_OUTSIDE: after each channel region up to the
/// next 512 KiB, and the upper half.
const ATTACKER_SLOT_LEN: u64 = 512 << 10;
const VICTIM_RING: u32 = 32;
const VICTIM_LEN: u64 = 512 << 10;
pub(super) const VICTIM_AT: u64 = 512 << 10;
const VICTIM_ENDPOINT: u32 = 7;
const HEALTHY_RING: u32 = 16;
const HEALTHY_LEN: u64 = 256 << 10;
const HEALTHY_ENDPOINT: u32 = 9;
const POSTED: u64 = 4;
pub(super) const POST_LEN: u32 = 4096;
/// Offset (in the victim's data area, after the posted buffers) of its DMA source.
const VICTIM_SRC: u64 = POSTED * POST_LEN as u64;
/// The cookie of the probe.
const PROBE: u64 = u64::MAX;

/// Everything one input works with.
struct Run<'f> {
    f: &'f Fixture,
    a: [Hostile; 2],
    v: Channel,
    h: Channel,
    /// Cookies of the victim's own DMA sends (their completions come back to it).
    victim_sent: u64,
    probe_seen: bool,
    waited: Duration,
    out: Vec<Message>,
}

fn index(a: &Attacker) -> usize {
    match a {
        Attacker::A0 => 0,
        Attacker::A1 => 1,
    }
}

impl Run<'_> {
    fn peer(&self, p: &Peer) -> ChannelAddr {
        match p {
            Peer::Victim => self.v.addr(),
            Peer::A0 => self.a[0].addr,
            Peer::A1 => self.a[1].addr,
            Peer::Healthy => self.h.addr(),
            Peer::VictimNoEndpoint => self.f.victim.addr(999),
            Peer::Engine => ChannelAddr::new(MacAddr::ENGINE, 0),
            Peer::Zero => ChannelAddr::default(),
        }
    }

    fn encode(&self, a: &Hostile, s: &Slot) -> RawMessage {
        let peer = self.peer(&s.peer);
        let cookie = u64::from(s.cookie);
        let mut raw = match &s.body {
            SlotBody::User { flags, len, first } => {
                let mut payload = [0u8; 40];
                payload[0] = *first;
                Message::UserData(UserData {
                    peer,
                    flags: flags & 3,
                    cookie,
                    len: len % 41,
                    payload,
                })
                .encode()
            }
            SlotBody::Dma { flags, data } => Message::DmaData(DmaData {
                peer,
                flags: flags & 1,
                cookie,
                data: a.data(data),
            })
            .encode(),
            SlotBody::Post(buf) => Message::PostBuffer(PostBuffer {
                cookie,
                buf: a.data(buf),
            })
            .encode(),
            SlotBody::Raw(bytes) => RawMessage(*bytes),
        };
        if let Some(flip) = &s.flip {
            raw.0[usize::from(flip.at) % MESSAGE_SIZE] ^= flip.xor | 1;
        }
        raw
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Store { chan, word, value } => {
                let a = &self.a[index(chan)];
                a.store(Hostile::header_word(word), a.value(value));
            }
            Op::RawSlot {
                chan,
                ring,
                slot,
                bytes,
            } => self.a[index(chan)].write_slot(*ring, u32::from(*slot), &RawMessage(*bytes)),
            Op::Write { chan, slot } => {
                let raw = self.encode(&self.a[index(chan)], slot);
                self.a[index(chan)].push_tx(&raw);
            }
            Op::Post { chan, cookie, buf } => {
                let a = &mut self.a[index(chan)];
                let raw = Message::PostBuffer(PostBuffer {
                    cookie: u64::from(*cookie),
                    buf: a.data(buf),
                })
                .encode();
                a.write_slot(Ring::Post, a.heads.post, &raw);
                a.heads.post = a.heads.post.wrapping_add(1);
            }
            Op::Publish { chan, doorbell } => {
                let a = &self.a[index(chan)];
                a.publish();
                if *doorbell {
                    self.f.engine.doorbell(a.id);
                }
            }
            Op::Doorbell { chan, target } => {
                let id = match target {
                    Target::Own => self.a[index(chan)].id,
                    Target::Victim => ChannelId(self.v.id()),
                    Target::Any(id) => ChannelId(*id),
                    Target::Healthy => ChannelId(self.h.id()),
                };
                self.f.engine.doorbell(id);
            }
            Op::Wait { units } => {
                let d = Duration::from_micros(u64::from(units % 8) * 50);
                if self.waited + d <= MAX_WAIT {
                    self.waited += d;
                    std::thread::sleep(d);
                } else {
                    std::thread::yield_now();
                }
            }
            Op::VictimDrain => self.victim_drain(),
            Op::VictimDma { to, len } => {
                let buf = DataRef {
                    offset: self.v.layout().data_offset + VICTIM_SRC,
                    len: (u32::from(*len) + 1) * 32,
                };
                self.victim_sent += 1;
                let dest = self.a[index(to)].addr;
                let _ = self
                    .v
                    .send_dma(dest, self.victim_sent, buf)
                    .expect("victim send");
                self.v.flush().expect("victim flush");
            }
            Op::HealthyUser {
                to,
                cookie,
                want_completion,
            } => {
                let dest = self.a[index(to)].addr;
                let _ = self
                    .h
                    .send_user(
                        dest,
                        u64::from(*cookie),
                        b"hello",
                        if *want_completion {
                            Completions::Always
                        } else {
                            Completions::OnError
                        },
                    )
                    .expect("healthy send");
                self.h.flush().expect("healthy flush");
                self.out.clear();
                let _ = self.h.poll(&mut self.out, 64).expect("healthy poll");
            }
            Op::Skew { chan, head, delta } => {
                let a = &self.a[index(chan)];
                let delta = u32::from(*delta);
                match head {
                    Head::Tx => a.store(header::TX_HEAD, a.heads.tx.wrapping_add(delta)),
                    Head::Post => a.store(header::POST_HEAD, a.heads.post.wrapping_add(delta)),
                }
            }
            Op::Burst { chan, slots } => {
                for s in slots.iter().take(MAX_BURST) {
                    let raw = self.encode(&self.a[index(chan)], s);
                    self.a[index(chan)].push_tx(&raw);
                }
                let a = &self.a[index(chan)];
                a.store(header::TX_HEAD, a.heads.tx);
                self.f.engine.doorbell(a.id);
            }
        }
    }

    /// Drains the victim's RX ring, checking every message, and re-posts filled buffers.
    fn victim_drain(&mut self) {
        let sources = [self.a[0].addr, self.a[1].addr, self.h.addr()];
        let data_offset = self.v.layout().data_offset;
        loop {
            self.out.clear();
            let n = self
                .v
                .poll(&mut self.out, 64)
                .expect("victim RX holds valid messages");
            if n == 0 {
                break;
            }
            let msgs = std::mem::take(&mut self.out);
            for m in &msgs {
                match m {
                    Message::UserData(u) => {
                        assert!(sources.contains(&u.peer), "user-data from {:?}", u.peer);
                        assert_ne!(u.flags & FLAG_COMPLETE, 0);
                        if u.peer == self.h.addr() && u.cookie == PROBE {
                            self.probe_seen = true;
                        }
                    }
                    Message::DmaData(d) => {
                        assert!(d.is_complete(), "DMA-data delivered before COMPLETE");
                        assert!(sources.contains(&d.peer), "DMA-data from {:?}", d.peer);
                        assert!(d.cookie < POSTED, "cookie {} was never posted", d.cookie);
                        let buf = data_offset + d.cookie * u64::from(POST_LEN);
                        assert_eq!(d.data.offset, buf, "DMA-data outside the posted buffer");
                        assert!(d.data.len <= POST_LEN, "DMA-data longer than the buffer");
                        let mut got = vec![0u8; d.data.len as usize];
                        self.v.read_data(d.data.offset, &mut got).expect("read");
                        assert!(
                            got.iter().all(|b| matches!(
                                *b,
                                FILL_POSTED | FILL_ATTACKER_DATA | FILL_VICTIM_DATA
                            )),
                            "DMA-data carries bytes from outside a data area"
                        );
                        let again = DataRef {
                            offset: buf,
                            len: POST_LEN,
                        };
                        assert!(self.v.post_buffer(d.cookie, again).expect("re-post"));
                    }
                    Message::Completion(c) => {
                        assert!(
                            (1..=self.victim_sent).contains(&c.cookie),
                            "completion for cookie {} the victim never used",
                            c.cookie
                        );
                        assert_ne!(c.status, CompletionStatus::BadPostBuffer);
                    }
                    Message::PostBuffer(_) => panic!("post-buffer message in an RX ring"),
                }
            }
            self.out = msgs;
            self.v.flush().expect("victim flush");
        }
    }

    /// The liveness probe: `h -> v` must arrive.
    fn probe(&mut self) {
        let start = Instant::now();
        let mut sent = false;
        while !self.probe_seen {
            // h's TX ring may still be full of messages held for the attacker (each waits at
            // most the backpressure wait): retry until the probe is accepted.
            if !sent {
                sent = self
                    .h
                    .send_user(self.v.addr(), PROBE, b"probe", Completions::OnError)
                    .expect("probe send");
            }
            self.h.flush().expect("probe flush");
            self.victim_drain();
            self.out.clear();
            let _ = self.h.poll(&mut self.out, 64).expect("healthy poll");
            for m in &self.out {
                if let Message::Completion(c) = m {
                    if c.cookie == PROBE {
                        // The victim's RX ring can be full of its own completions for longer
                        // than the (deliberately short) backpressure wait when this thread is
                        // descheduled: that is the engine keeping its word, not a loss. Send
                        // again. Any other error means the victim became unreachable.
                        assert_eq!(c.status, CompletionStatus::RingFull, "probe failed: {c:?}");
                        sent = false;
                    }
                }
            }
            if start.elapsed() >= PROBE_TIMEOUT {
                panic!(
                    "engine stopped delivering: probe h -> v (sent: {sent}) lost\n{}",
                    self.report()
                );
            }
            std::thread::yield_now();
        }
    }

    fn ids(&self) -> [ChannelId; 4] {
        [
            self.a[0].id,
            self.a[1].id,
            ChannelId(self.v.id()),
            ChannelId(self.h.id()),
        ]
    }

    /// The engine's view of every channel, and the clients' counters.
    fn report(&self) -> String {
        let e = &self.f.engine;
        let mut s = format!("workers {:?}\n", e.worker_stats());
        for (name, id) in ["a0", "a1", "v", "h"].into_iter().zip(self.ids()) {
            s += &format!(
                "{name} {id}: {:?} {:?}\n",
                e.run_state(id),
                e.channel_stats(id)
            );
        }
        s + &format!("v {:?}\nh {:?}", self.v.stats(), self.h.stats())
    }
}

/// Runs one script against the process's engine (created by the first call), checking every
/// invariant of the [module](self); panics if one does not hold.
pub fn run(script: &Script) {
    let f = fixture().lock().unwrap_or_else(|e| e.into_inner());
    run_one(&f, script);
}

fn run_one(f: &Fixture, script: &Script) {
    let engine = &f.engine;
    let mem_len = GUEST_MEM as u64;
    // Fresh memory: patterns everywhere nobody may write, attacker data areas, victim data.
    let (am, vm, hm) = (&f.attacker.mem, &f.victim.mem, &f.healthy.mem);
    fill(am, 0, mem_len, FILL_OUTSIDE);
    let al = ChannelLayout::new(ATTACKER_RING, ATTACKER_LEN).expect("layout");
    for at in ATTACKER_AT {
        fill(am, at, al.data_offset, FILL_ATTACKER_RINGS);
        fill(am, at + al.data_offset, al.data_len(), FILL_ATTACKER_DATA);
    }
    fill(vm, 0, mem_len, FILL_OUTSIDE);
    let vl = ChannelLayout::new(VICTIM_RING, VICTIM_LEN).expect("layout");
    let posted_len = POSTED * u64::from(POST_LEN);
    fill(vm, VICTIM_AT, vl.data_offset, 0);
    fill(
        vm,
        VICTIM_AT + vl.data_offset,
        vl.data_len(),
        FILL_VICTIM_DATA,
    );
    fill(vm, VICTIM_AT + vl.data_offset, posted_len, FILL_POSTED);
    fill(hm, 0, HEALTHY_LEN, 0);

    let hostile = |endpoint: u32, at: u64| Hostile {
        id: f
            .attacker
            .create(engine, endpoint, ATTACKER_RING, at, ATTACKER_LEN),
        addr: f.attacker.addr(endpoint),
        region: f.attacker.region(at, ATTACKER_LEN),
        layout: al,
        heads: Heads::default(),
    };
    let a = [hostile(1, ATTACKER_AT[0]), hostile(2, ATTACKER_AT[1])];
    let v = &f.victim;
    v.create(engine, VICTIM_ENDPOINT, VICTIM_RING, VICTIM_AT, VICTIM_LEN);
    let mut v = v.client(engine, VICTIM_ENDPOINT, VICTIM_AT, VICTIM_LEN);
    let h = &f.healthy;
    h.create(engine, HEALTHY_ENDPOINT, HEALTHY_RING, 0, HEALTHY_LEN);
    let h = h.client(engine, HEALTHY_ENDPOINT, 0, HEALTHY_LEN);
    for i in 0..POSTED {
        let buf = DataRef {
            offset: vl.data_offset + i * u64::from(POST_LEN),
            len: POST_LEN,
        };
        assert!(v.post_buffer(i, buf).expect("post"));
    }
    v.flush().expect("flush");

    let mut run = Run {
        f,
        a,
        v,
        h,
        victim_sent: 0,
        probe_seen: false,
        waited: Duration::ZERO,
        out: Vec::with_capacity(64),
    };
    for op in script.ops.iter().take(MAX_OPS) {
        run.apply(op);
    }
    run.probe();

    let [_, _, vid, hid] = run.ids();
    assert_eq!(
        engine.run_state(vid),
        Some(RunState::Live),
        "victim faulted"
    );
    assert_eq!(run.v.fault(), None, "victim's fault word set");
    assert_eq!(
        engine.run_state(hid),
        Some(RunState::Live),
        "healthy faulted"
    );
    if std::env::var_os("SVNIC_FUZZ_VERBOSE").is_some() {
        eprintln!("{}", run.report());
    }
    // Tear down (each destroy waits for the worker to let go), then nothing may write any more.
    for id in run.ids() {
        engine.destroy_channel(None, id).expect("destroy");
    }
    for at in ATTACKER_AT {
        let (after, len) = (at + ATTACKER_LEN, ATTACKER_SLOT_LEN - ATTACKER_LEN);
        check_fill(am, after, len, FILL_OUTSIDE, "attacker");
    }
    let upper = 2 * ATTACKER_SLOT_LEN;
    check_fill(am, upper, mem_len - upper, FILL_OUTSIDE, "attacker");
    check_fill(vm, 0, VICTIM_AT, FILL_OUTSIDE, "victim (below its channel)");
    let end = VICTIM_AT + VICTIM_LEN;
    let what = "victim (above its channel)";
    check_fill(vm, end, mem_len - end, FILL_OUTSIDE, what);
    let posted_end = vl.data_offset + posted_len;
    let what = "victim data area outside its posted buffers";
    check_fill(
        vm,
        VICTIM_AT + posted_end,
        VICTIM_LEN - posted_end,
        FILL_VICTIM_DATA,
        what,
    );
    check_fill(hm, HEALTHY_LEN, mem_len - HEALTHY_LEN, 0, "healthy guest");
}
