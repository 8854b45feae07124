//! Fake guests on an in-process [`Engine`]: each with its own guest memory (vm-memory over
//! anonymous mappings), whose channels are driven by the real client library
//! ([`svnic_client::Channel`]), touching the rings only as a guest would. Used by the backend's
//! engine tests and its engine bench.
#![allow(clippy::unwrap_used)]

pub use crate::wait::wait_until;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_backend::{Engine, EngineConfig, GuestWaker};
use svnic_channels::layout::DEFAULT_REGION_LEN;
use svnic_channels::{
    ChannelAddr, ChannelId, CompletionStatus, DataRef, FailureReason, MacAddr, Message,
    SharedRegion,
};
use svnic_client::{Channel, Doorbell, Waiter};
use svnic_control_plane::{CreateRequest, GuestId, GuestPolicy};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Doorbell that calls the engine directly (what the backend does on a doorbell frame).
#[derive(Debug)]
pub struct EngineDoorbell(pub Engine);

impl Doorbell for EngineDoorbell {
    fn ring(&self, channel_id: u32) {
        self.0.doorbell(ChannelId(channel_id));
    }
}

/// An eventfd the engine signals (GuestWaker) and the client blocks on (Waiter).
#[derive(Debug)]
pub struct EventWaker(pub EventFd);

impl EventWaker {
    /// A new non-blocking eventfd, shared.
    pub fn new() -> Arc<Self> {
        Arc::new(EventWaker(EventFd::new(EFD_NONBLOCK).unwrap()))
    }
}

impl GuestWaker for EventWaker {
    fn wake(&self, _channel: ChannelId) {
        let _ = self.0.write(1);
    }
}

impl Waiter for EventWaker {
    fn wait(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, 10_000) as i32;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        let _ = self.0.read();
    }
}

/// An engine of `workers` workers, otherwise the default configuration.
pub fn engine(workers: usize) -> Engine {
    Engine::new(EngineConfig {
        workers,
        ..Default::default()
    })
    .unwrap()
}

/// An engine whose held messages wait at most `backpressure_wait` for room at their destination.
pub fn engine_with_wait(workers: usize, backpressure_wait: Duration) -> Engine {
    Engine::new(EngineConfig {
        workers,
        backpressure_wait,
        ..Default::default()
    })
    .unwrap()
}

/// The MAC address of fake guest `n`.
pub fn mac(n: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0, 0, n])
}

/// A fake guest: memory, policy, a waker; hands out channel regions from its memory.
#[derive(Debug)]
pub struct FakeGuest {
    /// Its id in the engine.
    pub id: GuestId,
    /// Its MAC address ([`mac`] of its number).
    pub mac: MacAddr,
    /// Its memory.
    pub mem: Arc<GuestMemoryMmap>,
    /// What the engine wakes and its channels wait on.
    pub waker: Arc<EventWaker>,
    engine: Engine,
    next_region: u64,
    mem_len: u64,
}

impl FakeGuest {
    /// Guest `n` with `mem_mib` MiB of memory and the default policy, added to `engine`.
    pub fn new(engine: &Engine, n: u8, mem_mib: u64) -> Self {
        Self::with_policy(engine, n, mem_mib, |_| {})
    }

    /// As [`FakeGuest::new`], with the policy changed by `tweak` first.
    pub fn with_policy(
        engine: &Engine,
        n: u8,
        mem_mib: u64,
        tweak: impl FnOnce(&mut GuestPolicy),
    ) -> Self {
        let mac = mac(n);
        let mem_len = mem_mib << 20;
        let mem =
            Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), mem_len as usize)]).unwrap());
        let mut policy = GuestPolicy::new(format!("guest{n}"), mac);
        tweak(&mut policy);
        let waker = EventWaker::new();
        let id = engine
            .add_guest(
                policy,
                mem.clone(),
                Some(waker.clone() as Arc<dyn GuestWaker>),
            )
            .unwrap();
        FakeGuest {
            id,
            mac,
            mem,
            waker,
            engine: engine.clone(),
            next_region: 0,
            mem_len,
        }
    }

    /// The address of this guest's channel at `endpoint`.
    pub fn addr(&self, endpoint: u32) -> ChannelAddr {
        ChannelAddr::new(self.mac, endpoint)
    }

    /// The next free region of `len` bytes in this guest's memory.
    pub fn alloc(&mut self, len: u64) -> u64 {
        let a = self.next_region;
        self.next_region += len;
        assert!(self.next_region <= self.mem_len, "fake guest out of memory");
        a
    }

    /// A create request for a channel at `endpoint` in the given region.
    pub fn request(
        &self,
        endpoint: u32,
        ring_size: u32,
        region_addr: u64,
        region_len: u64,
    ) -> CreateRequest {
        CreateRequest {
            mac: self.mac,
            endpoint,
            ring_size,
            region_addr,
            region_len,
        }
    }

    /// Creates a channel (2 MiB region, `ring_size` slots) and attaches a client to it.
    pub fn open_with(
        &mut self,
        endpoint: u32,
        ring_size: u32,
        len: u64,
    ) -> Result<Channel, FailureReason> {
        self.open_region(endpoint, ring_size, len).map(|(ch, _)| ch)
    }

    /// As [`FakeGuest::open_with`]; also returns the guest address of the channel's region.
    pub fn open_region(
        &mut self,
        endpoint: u32,
        ring_size: u32,
        len: u64,
    ) -> Result<(Channel, u64), FailureReason> {
        let doorbell = Arc::new(EngineDoorbell(self.engine.clone()));
        self.open_with_doorbell(endpoint, ring_size, len, doorbell)
    }

    /// As [`FakeGuest::open_with`], with the client ringing `doorbell`; also returns the guest
    /// address of the channel's region.
    pub fn open_with_doorbell(
        &mut self,
        endpoint: u32,
        ring_size: u32,
        len: u64,
        doorbell: Arc<dyn Doorbell>,
    ) -> Result<(Channel, u64), FailureReason> {
        let addr = self.alloc(len);
        let req = self.request(endpoint, ring_size, addr, len);
        let info = self.engine.create_channel(self.id, &req)?;
        assert_eq!(info.addr, self.addr(endpoint));
        Ok((self.attach_with(addr, len, endpoint, doorbell), addr))
    }

    /// Creates a channel (`ring_size` slots) at `endpoint` in the region at `addr` again, over
    /// memory zeroed first (what a fresh region looks like); its id and the client side.
    pub fn recreate_at(
        &self,
        endpoint: u32,
        ring_size: u32,
        addr: u64,
        len: u64,
    ) -> (ChannelId, Channel) {
        let zeros = vec![0u8; usize::try_from(len).unwrap()];
        self.mem.write_slice(&zeros, GuestAddress(addr)).unwrap();
        let req = self.request(endpoint, ring_size, addr, len);
        let info = self.engine.create_channel(self.id, &req).unwrap();
        (info.id, self.attach(addr, len, endpoint))
    }

    /// A channel at `endpoint` with 256 slots in a default-size region.
    pub fn open(&mut self, endpoint: u32) -> Channel {
        self.open_with(endpoint, 256, DEFAULT_REGION_LEN).unwrap()
    }

    /// The client side of the channel at `addr`, ringing the engine directly.
    pub fn attach(&self, addr: u64, len: u64, endpoint: u32) -> Channel {
        let doorbell = Arc::new(EngineDoorbell(self.engine.clone()));
        self.attach_with(addr, len, endpoint, doorbell)
    }

    /// The client side of the channel at `addr`, ringing `doorbell`.
    pub fn attach_with(
        &self,
        addr: u64,
        len: u64,
        endpoint: u32,
        doorbell: Arc<dyn Doorbell>,
    ) -> Channel {
        let region = SharedRegion::from_guest_memory(self.mem.clone(), addr, len).unwrap();
        Channel::attach(region, self.addr(endpoint), doorbell).unwrap()
    }
}

/// Guests 1 and 2 on `engine`, with `mem_mib` MiB of memory each and the default policy.
pub fn two_guests(engine: &Engine, mem_mib: u64) -> (FakeGuest, FakeGuest) {
    (
        FakeGuest::new(engine, 1, mem_mib),
        FakeGuest::new(engine, 2, mem_mib),
    )
}

/// Guests 1 and 2 (8 MiB each) with one default channel each, as `(ga, gb, a, b)`: channel `a` on
/// guest 1's endpoint 1, channel `b` on guest 2's endpoint 2.
pub fn guest_pair(engine: &Engine) -> (FakeGuest, FakeGuest, Channel, Channel) {
    let (mut ga, mut gb) = two_guests(engine, 8);
    let a = ga.open(1);
    let b = gb.open(2);
    (ga, gb, a, b)
}

/// Sends a DMA-data message of `len` bytes at `offset` of `ch`'s region to `dest`, and flushes.
pub fn send_dma_flushed(ch: &mut Channel, dest: ChannelAddr, cookie: u64, offset: u64, len: u32) {
    let queued = ch.send_dma(dest, cookie, DataRef { offset, len }).unwrap();
    assert!(queued, "TX ring full");
    ch.flush().unwrap();
}

/// Posts the receive buffer of `len` bytes at `offset` of `ch`'s region under `cookie`, and
/// flushes.
pub fn post_flushed(ch: &mut Channel, cookie: u64, offset: u64, len: u32) {
    assert!(
        ch.post_buffer(cookie, DataRef { offset, len }).unwrap(),
        "post ring full"
    );
    ch.flush().unwrap();
}

/// Queues user-data messages carrying `data` to `dest`, with cookies `*sent` up to `n`, while
/// `ch`'s TX ring has room (advancing `*sent`), then flushes.
pub fn send_user_while_room(
    ch: &mut Channel,
    dest: ChannelAddr,
    sent: &mut u64,
    n: u64,
    data: &[u8],
) {
    while *sent < n
        && ch
            .send_user(dest, *sent, data, Completions::OnError)
            .unwrap()
    {
        *sent += 1;
    }
    ch.flush().unwrap();
}

/// Sends an 8-byte DMA-data message from the start of `ch`'s data area to `dest`, which has no
/// buffer posted, and waits (up to 10 s, else panics) until the engine holds it for one.
pub fn send_dma_held(engine: &Engine, ch: &mut Channel, dest: ChannelAddr, cookie: u64) {
    let offset = ch.layout().data_offset;
    send_dma_flushed(ch, dest, cookie, offset, 8);
    let id = ChannelId(ch.id());
    wait_until(Duration::from_secs(10), || {
        engine
            .channel_stats(id)
            .is_some_and(|s| s.backpressure_holds > 0)
    });
}

/// Polls `ch` until `n` messages arrived or `timeout` passes (adaptive wait on the guest's waker).
pub fn recv_n(ch: &mut Channel, waker: &EventWaker, n: usize, timeout: Duration) -> Vec<Message> {
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + timeout;
    while out.len() < n {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let want = n - out.len();
        ch.wait_poll(&mut out, want, deadline - now, waker).unwrap();
    }
    out
}

/// Sends with retries while the TX ring is full (flushing and draining `rx` meanwhile).
pub fn send_user_blocking(ch: &mut Channel, dest: ChannelAddr, cookie: u64, data: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ch
        .send_user(dest, cookie, data, Completions::OnError)
        .unwrap()
    {
        ch.flush().unwrap();
        assert!(Instant::now() < deadline, "TX ring stayed full");
        std::thread::yield_now();
    }
}

/// Asserts that every message of `msgs` is a completion with one of the `allowed` statuses.
pub fn assert_completions_among(msgs: &[Message], allowed: &[CompletionStatus]) {
    for m in msgs {
        let Message::Completion(c) = m else {
            panic!("not a completion: {m:?}")
        };
        assert!(
            allowed.contains(&c.status),
            "{c:?}: expected one of {allowed:?}"
        );
    }
}
