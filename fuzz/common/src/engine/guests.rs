//! The engine the harness runs (one per process) and its three fake guests, each with its own
//! guest memory; filling and checking that memory.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use svnic_backend::{Engine, EngineConfig};
use svnic_channels::{ChannelAddr, ChannelId, MacAddr, SharedRegion};
use svnic_client::{Channel, Doorbell};
use svnic_control_plane::{CreateRequest, GuestId, GuestPolicy};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Guest memory of each fake guest.
pub(super) const GUEST_MEM: usize = 2 << 20;

/// Doorbell straight into the engine (what the backend does on a doorbell frame).
struct EngineDoorbell(Engine);

impl Doorbell for EngineDoorbell {
    fn ring(&self, channel_id: u32) {
        self.0.doorbell(ChannelId(channel_id));
    }
}

/// A fake guest registered with the engine (no create-rate limit).
pub(super) struct Guest {
    id: GuestId,
    mac: MacAddr,
    pub(super) mem: Arc<GuestMemoryMmap>,
}

impl Guest {
    fn new(engine: &Engine, n: u8, name: &str) -> Self {
        let mac = MacAddr([0x52, 0x54, 0, 0, 0, n]);
        let mem = Arc::new(
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), GUEST_MEM)]).expect("guest memory"),
        );
        // Every input creates channels afresh, thousands a second: far above the default
        // per-guest create rate, which is not what this harness tests.
        let policy = GuestPolicy {
            create_burst: u32::MAX,
            creates_per_sec: svnic_control_plane::policy::MAX_CREATES_PER_SEC,
            ..GuestPolicy::new(name, mac)
        };
        let id = engine
            .add_guest(policy, mem.clone(), None)
            .expect("guest registers");
        Guest { id, mac, mem }
    }

    pub(super) fn addr(&self, endpoint: u32) -> ChannelAddr {
        ChannelAddr::new(self.mac, endpoint)
    }

    pub(super) fn create(
        &self,
        engine: &Engine,
        endpoint: u32,
        ring: u32,
        at: u64,
        len: u64,
    ) -> ChannelId {
        let req = CreateRequest {
            mac: self.mac,
            endpoint,
            ring_size: ring,
            region_addr: at,
            region_len: len,
        };
        engine
            .create_channel(self.id, &req)
            .expect("channel created")
            .id
    }

    pub(super) fn region(&self, at: u64, len: u64) -> SharedRegion {
        SharedRegion::from_guest_memory(self.mem.clone(), at, len).expect("region")
    }

    /// A channel of the client library over a channel created at `at`.
    pub(super) fn client(&self, engine: &Engine, endpoint: u32, at: u64, len: u64) -> Channel {
        let doorbell = Arc::new(EngineDoorbell(engine.clone()));
        Channel::attach(self.region(at, len), self.addr(endpoint), doorbell).expect("attach")
    }
}

/// The engine (1 worker, 1 ms backpressure wait, short idle phases) and its guests.
pub(super) struct Fixture {
    pub(super) engine: Engine,
    pub(super) attacker: Guest,
    pub(super) victim: Guest,
    pub(super) healthy: Guest,
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
        Fixture {
            attacker: Guest::new(&engine, 1, "attacker"),
            victim: Guest::new(&engine, 2, "victim"),
            healthy: Guest::new(&engine, 3, "healthy"),
            engine,
        }
    }
}

pub(super) fn fixture() -> &'static Mutex<Fixture> {
    static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
    F.get_or_init(|| Mutex::new(Fixture::new()))
}

/// Chunk size of [`fill`] and [`check_fill`].
const CHUNK: usize = 64 << 10;

/// Writes `byte` over `at..at+len` of `mem`.
pub(super) fn fill(mem: &GuestMemoryMmap, at: u64, len: u64, byte: u8) {
    let chunk = [byte; CHUNK];
    let mut off = at;
    while off < at + len {
        let n = (at + len - off).min(CHUNK as u64) as usize;
        mem.write_slice(&chunk[..n], GuestAddress(off))
            .expect("fill guest memory");
        off += n as u64;
    }
}

/// Asserts that `at..at+len` of `mem` still holds `byte` everywhere.
pub(super) fn check_fill(mem: &GuestMemoryMmap, at: u64, len: u64, byte: u8, what: &str) {
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
