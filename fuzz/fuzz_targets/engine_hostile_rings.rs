//! The engine, running, fed with a hostile guest's channel memory.
//!
//! One engine (1 worker, 1 ms backpressure wait, short idle phases) lives for the whole process,
//! with three fake guests of 2 MiB each:
//! - the **attacker** owns channels `a0` and `a1` (16 slots, 256 KiB each) and writes whatever the
//!   input says into their headers and rings: u32 stores to any header offset (indices, flags,
//!   the engine-written fields), raw or structured 64-byte slots in the TX, RX and post rings,
//!   published heads (sane or absurd), doorbells and short waits;
//! - the **victim** owns channel `v` (32 slots, 512 KiB) and behaves: it keeps 4 buffers of 4 KiB
//!   posted, drains its RX ring, and on request sends DMA-data to the attacker (so the attacker's
//!   hostile post ring is exercised with an honest source);
//! - a **healthy** guest owns channel `h`, which sends user-data to the attacker on request and,
//!   at the end of every input, one message to the victim as a liveness probe.
//!
//! Every input starts from fresh channels (created, then destroyed at the end) over memory filled
//! with known patterns. After the script it checks:
//! - the engine did not panic (libfuzzer-sys aborts the process on a panic in any thread, the
//!   worker's included) and still delivers: the probe `h -> v` arrives within [`PROBE_TIMEOUT`]
//!   (if it comes back RingFull, the victim's RX ring stayed full of its own completions longer
//!   than the 1 ms backpressure wait, which is the engine keeping its word: it is sent again);
//! - the victim was not faulted, and everything it received decodes, names a real source, and
//!   (DMA-data) lies in a buffer it posted and holds only bytes some channel legitimately sent;
//! - no byte of the victim's or the attacker's guest memory outside what the engine may write was
//!   changed: guest memory outside the channel regions, and the victim's data area outside its
//!   posted buffers.
//!
//! Input: a script of operations, one selector byte each followed by its operands (see
//! `Run::op`: selector % 12 is the operation, bit 7 picks `a0` or `a1`); missing bytes read as
//! zero. At most [`MAX_OPS`] operations and [`MAX_WAIT`] of waiting per input.
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use svnic_backend::{Engine, EngineConfig, RunState};
use svnic_channels::layout::header;
use svnic_channels::message::FLAG_COMPLETE;
use svnic_channels::{
    ChannelAddr, ChannelId, ChannelLayout, CompletionStatus, DataRef, DmaData, MacAddr, Message,
    PostBuffer, RawMessage, SharedRegion, UserData,
};
use svnic_control::{CreateRequest, GuestId, GuestPolicy};
use svnic_guest::{Channel, Doorbell};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

const GUEST_MEM: usize = 2 << 20;
const MAX_OPS: usize = 200;
const MAX_WAIT: Duration = Duration::from_millis(3);
/// Generous: the project machine is shared, and a slow probe is not a lost one (libFuzzer's
/// `-timeout` must be longer).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

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

const ATTACKER_RING: u32 = 16;
const ATTACKER_LEN: u64 = 256 << 10;
/// Attacker channel regions (guest-physical); the rest of its memory is FILL_OUTSIDE.
const ATTACKER_AT: [u64; 2] = [0, 512 << 10];
const VICTIM_RING: u32 = 32;
const VICTIM_LEN: u64 = 512 << 10;
const VICTIM_AT: u64 = 512 << 10;
const HEALTHY_RING: u32 = 16;
const HEALTHY_LEN: u64 = 256 << 10;
const POSTED: u64 = 4;
const POST_LEN: u32 = 4096;
/// Offset (in the victim's data area, after the posted buffers) of its DMA source.
const VICTIM_SRC: u64 = POSTED * POST_LEN as u64;

/// Doorbell straight into the engine (what the backend does on a doorbell frame).
struct EngineDoorbell(Engine);

impl Doorbell for EngineDoorbell {
    fn ring(&self, channel_id: u32) {
        self.0.doorbell(ChannelId(channel_id));
    }
}

struct Guest {
    id: GuestId,
    mac: MacAddr,
    mem: Arc<GuestMemoryMmap>,
}

struct Fixture {
    engine: Engine,
    attacker: Guest,
    victim: Guest,
    healthy: Guest,
}

fn mac(n: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, n])
}

impl Fixture {
    fn new() -> Self {
        let engine = Engine::new(EngineConfig {
            workers: 1,
            backpressure_wait: Duration::from_millis(1),
            spin_passes: 50,
            idle_passes: 100,
            max_sleep: Duration::from_millis(20),
            ..Default::default()
        })
        .expect("engine starts");
        let guest = |n: u8, name: &str| {
            let mem = Arc::new(
                GuestMemoryMmap::from_ranges(&[(GuestAddress(0), GUEST_MEM)])
                    .expect("guest memory"),
            );
            // Every input creates channels afresh, thousands a second: far above the default
            // per-guest create rate, which is not what this target tests.
            let policy = GuestPolicy {
                create_burst: u32::MAX,
                creates_per_sec: svnic_control::policy::MAX_CREATES_PER_SEC,
                ..GuestPolicy::new(name, mac(n))
            };
            let id = engine
                .add_guest(policy, mem.clone(), None)
                .expect("guest registers");
            Guest {
                id,
                mac: mac(n),
                mem,
            }
        };
        Fixture {
            attacker: guest(1, "attacker"),
            victim: guest(2, "victim"),
            healthy: guest(3, "healthy"),
            engine,
        }
    }
}

fn fixture() -> &'static Mutex<Fixture> {
    static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
    F.get_or_init(|| Mutex::new(Fixture::new()))
}

/// The operands of the script, read on demand; past the end every read is zero.
struct Script<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Script<'_> {
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    fn bytes64(&mut self) -> [u8; 64] {
        let mut b = [0; 64];
        for x in b.iter_mut() {
            *x = self.u8();
        }
        b
    }
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
}

/// One attacker channel as the attacker sees it: raw memory and its own idea of its heads.
struct Hostile {
    id: ChannelId,
    addr: ChannelAddr,
    region: SharedRegion,
    layout: ChannelLayout,
    tx_head: u32,
    post_head: u32,
}

impl Hostile {
    fn store(&self, off: usize, v: u32) {
        // Offsets are chosen inside the header page; a failed store is just a lost write.
        let _ = self
            .region
            .slice()
            .store(v, off, std::sync::atomic::Ordering::Release);
    }
    fn write_slot(&self, ring: usize, slot: u32, raw: &RawMessage) {
        let off = ring + (slot & self.layout.mask()) as usize * 64;
        let _ = self.region.slice().write_obj(*raw, off);
    }
}

/// Header offsets worth hitting: every index and flag, and the engine-written fields.
const HEADER_FIELDS: [usize; 20] = [
    header::TX_HEAD,
    header::TX_TAIL,
    header::RX_HEAD,
    header::RX_TAIL,
    header::POST_HEAD,
    header::POST_TAIL,
    header::ENGINE_SLEEPING,
    header::GUEST_SLEEPING,
    header::FAULT,
    header::RING_SIZE,
    header::READY,
    header::MAGIC,
    header::VERSION,
    header::REGION_LEN,
    header::DATA_OFFSET,
    header::TX_RING,
    header::RX_RING,
    header::POST_RING,
    header::CHANNEL_ID,
    header::WORKER,
];

/// Everything one input works with.
struct Run<'f> {
    f: &'f Fixture,
    a: [Hostile; 2],
    v: Channel,
    h: Channel,
    /// Cookies of the victim's own DMA sends (their completions come back to it).
    victim_sent: u64,
    probe_seen: bool,
    out: Vec<Message>,
}

impl Run<'_> {
    fn peers(&self) -> [ChannelAddr; 7] {
        [
            self.v.addr(),
            self.a[0].addr,
            self.a[1].addr,
            self.h.addr(),
            ChannelAddr {
                mac: self.f.victim.mac,
                endpoint: 999,
            },
            ChannelAddr {
                mac: MacAddr::ENGINE,
                endpoint: 0,
            },
            ChannelAddr::default(),
        ]
    }

    /// A DMA/post offset: inside or around the attacker's own data area, at the edges of its
    /// region, or far away (where other memory, the victim's included, lies).
    fn offset(&self, s: &mut Script, l: &ChannelLayout) -> u64 {
        let small = u64::from(s.u8()) * 64;
        match s.u8() % 8 {
            0 => l.data_offset + small,
            1 => l.region_len.wrapping_sub(small),
            2 => small,
            3 => l.data_offset.wrapping_sub(small + 1),
            4 => VICTIM_AT + small,
            5 => u64::MAX - small,
            6 => l.data_offset + u64::from(s.u32()) % l.data_len().max(1),
            _ => s.u64(),
        }
    }

    fn length(s: &mut Script) -> u32 {
        match s.u8() % 6 {
            0 => 0,
            1 => u32::from(s.u8()) + 1,
            2 => POST_LEN,
            3 => u32::from(s.u8()) << 10,
            4 => u32::MAX - u32::from(s.u8()),
            _ => s.u32(),
        }
    }

    fn structured(&self, s: &mut Script, l: &ChannelLayout) -> RawMessage {
        let peers = self.peers();
        let peer = peers[usize::from(s.u8()) % peers.len()];
        let cookie = u64::from(s.u16());
        let sel = s.u8();
        let mut raw = match sel % 4 {
            0 => {
                let mut payload = [0u8; 40];
                payload[0] = sel;
                Message::UserData(UserData {
                    peer,
                    flags: s.u8() & 3,
                    cookie,
                    len: s.u8() % 41,
                    payload,
                })
                .encode()
            }
            1 => Message::DmaData(DmaData {
                peer,
                flags: s.u8() & 1,
                cookie,
                data: DataRef {
                    offset: self.offset(s, l),
                    len: Self::length(s),
                },
            })
            .encode(),
            2 => Message::PostBuffer(PostBuffer {
                cookie,
                buf: DataRef {
                    offset: self.offset(s, l),
                    len: Self::length(s),
                },
            })
            .encode(),
            _ => RawMessage(s.bytes64()),
        };
        // Now and then, flip one byte of an otherwise well-formed message.
        if sel & 0x80 != 0 {
            let at = usize::from(s.u8()) % 64;
            raw.0[at] ^= s.u8() | 1;
        }
        raw
    }

    fn op(&mut self, s: &mut Script, waited: &mut Duration) {
        let sel = s.u8();
        let which = usize::from(sel >> 7);
        match sel % 12 {
            // u32 store into a header field (or any aligned header offset).
            0 => {
                let b = s.u8();
                let off = if b < 224 {
                    HEADER_FIELDS[usize::from(b) % HEADER_FIELDS.len()]
                } else {
                    (s.u32() as usize % header::END) & !3
                };
                let a = &self.a[which];
                let v = match s.u8() % 8 {
                    0 => a.tx_head.wrapping_add(u32::from(s.u8())),
                    1 => a.post_head.wrapping_add(u32::from(s.u8())),
                    2 => ATTACKER_RING.wrapping_mul(u32::from(s.u8())),
                    3 => u32::MAX - u32::from(s.u8()),
                    4 => u32::from(s.u8()),
                    _ => s.u32(),
                };
                a.store(off, v);
            }
            // Raw 64 bytes into any slot of any ring.
            1 => {
                let a = &self.a[which];
                let ring = [a.layout.tx_ring, a.layout.rx_ring, a.layout.post_ring]
                    [usize::from(s.u8()) % 3];
                let slot = u32::from(s.u8());
                a.write_slot(ring, slot, &RawMessage(s.bytes64()));
            }
            // A (mostly) well-formed message at the attacker's own TX head, not yet published.
            2 => {
                let l = self.a[which].layout;
                let raw = self.structured(s, &l);
                let a = &mut self.a[which];
                a.write_slot(a.layout.tx_ring, a.tx_head, &raw);
                a.tx_head = a.tx_head.wrapping_add(1);
            }
            // A posted buffer (often hostile) at the attacker's own post head.
            3 => {
                let l = self.a[which].layout;
                let raw = Message::PostBuffer(PostBuffer {
                    cookie: u64::from(s.u16()),
                    buf: DataRef {
                        offset: self.offset(s, &l),
                        len: Self::length(s),
                    },
                })
                .encode();
                let a = &mut self.a[which];
                a.write_slot(a.layout.post_ring, a.post_head, &raw);
                a.post_head = a.post_head.wrapping_add(1);
            }
            // Publish the heads as written (the honest move), then maybe ring.
            4 => {
                let ring = s.u8();
                let a = &self.a[which];
                a.store(header::TX_HEAD, a.tx_head);
                a.store(header::POST_HEAD, a.post_head);
                if ring & 1 != 0 {
                    self.f.engine.doorbell(a.id);
                }
            }
            // Doorbell of any channel, even one that is not ours.
            5 => {
                let id = match s.u8() % 4 {
                    0 => self.a[which].id,
                    1 => ChannelId(self.v.id()),
                    2 => ChannelId(s.u32()),
                    _ => ChannelId(self.h.id()),
                };
                self.f.engine.doorbell(id);
            }
            // A short wait, so the worker gets to what was written.
            6 => {
                let d = Duration::from_micros(u64::from(s.u8() % 8) * 50);
                if *waited + d <= MAX_WAIT {
                    *waited += d;
                    std::thread::sleep(d);
                } else {
                    std::thread::yield_now();
                }
            }
            // The victim drains its RX ring and re-posts its buffers.
            7 => self.victim_drain(),
            // The victim sends DMA-data to an attacker channel.
            8 => {
                let dest = self.a[which].addr;
                let len = (u32::from(s.u8()) + 1) * 32;
                let buf = DataRef {
                    offset: self.v.layout().data_offset + VICTIM_SRC,
                    len,
                };
                self.victim_sent += 1;
                let _ = self
                    .v
                    .send_dma(dest, self.victim_sent, buf)
                    .expect("victim send");
                self.v.flush().expect("victim flush");
            }
            // The healthy channel sends user-data to an attacker channel.
            9 => {
                let dest = self.a[which].addr;
                let _ = self
                    .h
                    .send_user(dest, u64::from(s.u8()), b"hello", s.u8() & 1 != 0)
                    .expect("healthy send");
                self.h.flush().expect("healthy flush");
                self.out.clear();
                let _ = self.h.poll(&mut self.out, 64).expect("healthy poll");
            }
            // Publish an arbitrary TX or post head relative to what was written.
            10 => {
                let delta = s.u8();
                let a = &self.a[which];
                if delta & 0x80 == 0 {
                    a.store(header::TX_HEAD, a.tx_head.wrapping_add(u32::from(delta)));
                } else {
                    a.store(
                        header::POST_HEAD,
                        a.post_head.wrapping_add(u32::from(delta & 0x7f)),
                    );
                }
            }
            // A burst: n structured messages, published at once, doorbell.
            _ => {
                let n = s.u8() % 20;
                let l = self.a[which].layout;
                for _ in 0..n {
                    let raw = self.structured(s, &l);
                    let a = &mut self.a[which];
                    a.write_slot(a.layout.tx_ring, a.tx_head, &raw);
                    a.tx_head = a.tx_head.wrapping_add(1);
                }
                let a = &self.a[which];
                a.store(header::TX_HEAD, a.tx_head);
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
                        if u.peer == self.h.addr() && u.cookie == u64::MAX {
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
                    .send_user(self.v.addr(), u64::MAX, b"probe", false)
                    .expect("probe send");
            }
            self.h.flush().expect("probe flush");
            self.victim_drain();
            self.out.clear();
            let _ = self.h.poll(&mut self.out, 64).expect("healthy poll");
            for m in &self.out {
                match m {
                    Message::Completion(c) if c.cookie == u64::MAX => {
                        // The victim's RX ring can be full of its own completions for longer
                        // than the (deliberately short) backpressure wait when this thread is
                        // descheduled: that is the engine keeping its word, not a loss. Send
                        // again. Any other error means the victim became unreachable.
                        assert_eq!(c.status, CompletionStatus::RingFull, "probe failed: {c:?}");
                        sent = false;
                    }
                    _ => {}
                }
            }
            if start.elapsed() >= PROBE_TIMEOUT {
                let e = &self.f.engine;
                let (v, h) = (ChannelId(self.v.id()), ChannelId(self.h.id()));
                panic!(
                    "engine stopped delivering: probe h -> v (sent: {sent}) lost\n\
                     workers {:?}\nv {:?} {:?} {:?}\nh {:?} {:?} {:?}\na0 {:?} {:?}\na1 {:?} {:?}",
                    e.worker_stats(),
                    e.run_state(v),
                    e.channel_stats(v),
                    self.v.stats(),
                    e.run_state(h),
                    e.channel_stats(h),
                    self.h.stats(),
                    e.run_state(self.a[0].id),
                    e.channel_stats(self.a[0].id),
                    e.run_state(self.a[1].id),
                    e.channel_stats(self.a[1].id),
                );
            }
            std::thread::yield_now();
        }
    }
}

/// Chunk size of [`fill`] and [`check`].
const CHUNK: usize = 64 << 10;

/// Writes `byte` over `at..at+len` of `mem`.
fn fill(mem: &GuestMemoryMmap, at: u64, len: usize, byte: u8) {
    let chunk = [byte; CHUNK];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(CHUNK);
        mem.write_slice(&chunk[..n], GuestAddress(at + off as u64))
            .expect("fill guest memory");
        off += n;
    }
}

/// Asserts that `at..at+len` of `mem` still holds `byte` everywhere.
fn check(mem: &GuestMemoryMmap, at: u64, len: u64, byte: u8, what: &str) {
    let expect = [byte; CHUNK];
    let mut buf = [0u8; CHUNK];
    let mut off = at;
    while off < at + len {
        let n = (at + len - off).min(CHUNK as u64) as usize;
        let s = mem.get_slice(GuestAddress(off), n).expect("slice");
        s.copy_to(&mut buf[..n]);
        // One memcmp per chunk; the byte-wise search only runs to report a difference.
        if buf[..n] != expect[..n] {
            let i = buf[..n].iter().position(|b| *b != byte).unwrap_or(0);
            panic!(
                "{what}: guest memory at {:#x} changed to {:#04x}",
                off + i as u64,
                buf[i]
            );
        }
        off += n as u64;
    }
}

fn create(f: &Fixture, g: &Guest, endpoint: u32, ring: u32, at: u64, len: u64) -> ChannelId {
    let req = CreateRequest {
        mac: g.mac,
        endpoint,
        ring_size: ring,
        region_addr: at,
        region_len: len,
    };
    f.engine
        .create_channel(g.id, &req)
        .expect("channel created")
        .id
}

fn client(f: &Fixture, g: &Guest, endpoint: u32, at: u64, len: u64) -> Channel {
    let region = SharedRegion::from_guest_memory(g.mem.clone(), at, len).expect("region");
    let addr = ChannelAddr {
        mac: g.mac,
        endpoint,
    };
    Channel::attach(region, addr, Arc::new(EngineDoorbell(f.engine.clone()))).expect("attach")
}

fn run_one(f: &Fixture, data: &[u8]) {
    // Fresh memory: patterns everywhere nobody may write, attacker data areas, victim data.
    let (am, vm, hm) = (&f.attacker.mem, &f.victim.mem, &f.healthy.mem);
    fill(am, 0, GUEST_MEM, FILL_OUTSIDE);
    let al = ChannelLayout::new(ATTACKER_RING, ATTACKER_LEN).expect("layout");
    for at in ATTACKER_AT {
        fill(am, at, al.data_offset as usize, FILL_ATTACKER_RINGS);
        fill(
            am,
            at + al.data_offset,
            al.data_len() as usize,
            FILL_ATTACKER_DATA,
        );
    }
    fill(vm, 0, GUEST_MEM, FILL_OUTSIDE);
    let vl = ChannelLayout::new(VICTIM_RING, VICTIM_LEN).expect("layout");
    fill(vm, VICTIM_AT, vl.data_offset as usize, 0);
    fill(
        vm,
        VICTIM_AT + vl.data_offset,
        vl.data_len() as usize,
        FILL_VICTIM_DATA,
    );
    fill(
        vm,
        VICTIM_AT + vl.data_offset,
        (POSTED * u64::from(POST_LEN)) as usize,
        FILL_POSTED,
    );
    fill(hm, 0, HEALTHY_LEN as usize, 0);

    let hostile = |i: usize| {
        let at = ATTACKER_AT[i];
        let id = create(
            f,
            &f.attacker,
            i as u32 + 1,
            ATTACKER_RING,
            at,
            ATTACKER_LEN,
        );
        Hostile {
            id,
            addr: ChannelAddr {
                mac: f.attacker.mac,
                endpoint: i as u32 + 1,
            },
            region: SharedRegion::from_guest_memory(am.clone(), at, ATTACKER_LEN).expect("region"),
            layout: al,
            tx_head: 0,
            post_head: 0,
        }
    };
    let a = [hostile(0), hostile(1)];
    create(f, &f.victim, 7, VICTIM_RING, VICTIM_AT, VICTIM_LEN);
    let mut v = client(f, &f.victim, 7, VICTIM_AT, VICTIM_LEN);
    create(f, &f.healthy, 9, HEALTHY_RING, 0, HEALTHY_LEN);
    let h = client(f, &f.healthy, 9, 0, HEALTHY_LEN);
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
        out: Vec::with_capacity(64),
    };
    let mut s = Script { data, pos: 0 };
    let mut waited = Duration::ZERO;
    for _ in 0..MAX_OPS {
        if s.done() {
            break;
        }
        run.op(&mut s, &mut waited);
    }
    run.probe();

    let (vid, hid) = (ChannelId(run.v.id()), ChannelId(run.h.id()));
    assert_eq!(
        f.engine.run_state(vid),
        Some(RunState::Live),
        "victim faulted"
    );
    assert_eq!(run.v.fault(), None, "victim's fault word set");
    assert_eq!(
        f.engine.run_state(hid),
        Some(RunState::Live),
        "healthy faulted"
    );

    if std::env::var_os("SVNIC_FUZZ_VERBOSE").is_some() {
        for id in [run.a[0].id, run.a[1].id, vid, hid] {
            eprintln!(
                "{id}: {:?} {:?}",
                f.engine.run_state(id),
                f.engine.channel_stats(id)
            );
        }
    }
    // Tear down (each destroy waits for the worker to let go), then nothing may write any more.
    for id in [run.a[0].id, run.a[1].id, vid, hid] {
        f.engine.destroy_channel(None, id).expect("destroy");
    }
    for at in ATTACKER_AT {
        check(
            am,
            at + ATTACKER_LEN,
            (512 << 10) - ATTACKER_LEN,
            FILL_OUTSIDE,
            "attacker",
        );
    }
    check(
        am,
        1 << 20,
        (GUEST_MEM as u64) - (1 << 20),
        FILL_OUTSIDE,
        "attacker",
    );
    check(vm, 0, VICTIM_AT, FILL_OUTSIDE, "victim (below its channel)");
    let end = VICTIM_AT + VICTIM_LEN;
    check(
        vm,
        end,
        GUEST_MEM as u64 - end,
        FILL_OUTSIDE,
        "victim (above its channel)",
    );
    let posted_end = vl.data_offset + POSTED * u64::from(POST_LEN);
    check(
        vm,
        VICTIM_AT + posted_end,
        VICTIM_LEN - posted_end,
        FILL_VICTIM_DATA,
        "victim data area outside its posted buffers",
    );
    check(
        hm,
        HEALTHY_LEN,
        GUEST_MEM as u64 - HEALTHY_LEN,
        0,
        "healthy guest",
    );
}

fuzz_target!(|data: &[u8]| {
    let f = fixture().lock().unwrap_or_else(|e| e.into_inner());
    run_one(&f, data);
});
