//! Access to a channel region in shared memory, for both sides and both roles.
//!
//! All access is within a [`VolatileSlice`] (vm-memory) of the region: bounds-checked, volatile
//! for slots and atomic for indices (the per-message accessors check bounds and alignment once,
//! then access the slice's memory directly). The memory is shared with a party we do not trust,
//! so:
//! - each side keeps its *own* index in a private field and only ever writes it out; it never reads
//!   its own index back from shared memory (the other side could have scribbled on it);
//! - each index read from the other side is checked against what is possible before it is used:
//!   a producer index more than a ring ahead (or behind) our consumer index, or a consumer index
//!   outside `[last seen, our producer index]`, is a [`RingError`], never a panic or a wild access.
//!
//! Memory ordering: a producer writes slots, then stores its index with `Release`; a consumer loads
//! that index with `Acquire` and only then reads the slots, so it sees the slot contents. The
//! consumer stores its own index with `Release` after it has read the slots, and the producer
//! loads it with `Acquire` before reusing them, so a slot is never overwritten while being read.

use std::sync::atomic::{fence, AtomicU32, Ordering};

use vm_memory::{Bytes, VolatileMemory, VolatileSlice};

use crate::error::{LayoutError, RingError};
use crate::layout::{header, ChannelLayout, CHANNEL_MAGIC, CHANNEL_VERSION};
use crate::message::{RawMessage, MESSAGE_SIZE};
use crate::status::FaultReason;

/// A ring slot (one message) in 64-bit words.
const SLOT_WORDS: usize = MESSAGE_SIZE / 8;
// The slot accessors walk a message in 8-byte chunks: exactly SLOT_WORDS of them.
const _: () = assert!(SLOT_WORDS * 8 == MESSAGE_SIZE);

/// The three rings of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingKind {
    /// Guest -> engine messages.
    Tx,
    /// Engine -> guest messages and completions.
    Rx,
    /// Guest -> engine receive buffers.
    Post,
}

impl RingKind {
    fn name(self) -> &'static str {
        match self {
            RingKind::Tx => "TX",
            RingKind::Rx => "RX",
            RingKind::Post => "post",
        }
    }
    fn head(self) -> usize {
        match self {
            RingKind::Tx => header::TX_HEAD,
            RingKind::Rx => header::RX_HEAD,
            RingKind::Post => header::POST_HEAD,
        }
    }
    fn tail(self) -> usize {
        match self {
            RingKind::Tx => header::TX_TAIL,
            RingKind::Rx => header::RX_TAIL,
            RingKind::Post => header::POST_TAIL,
        }
    }
    #[inline]
    fn base(self, l: &ChannelLayout) -> usize {
        match self {
            RingKind::Tx => l.tx_ring,
            RingKind::Rx => l.rx_ring,
            RingKind::Post => l.post_ring,
        }
    }

    /// The offset in a channel of layout `l` of this ring's slot for index `index` (taken
    /// modulo the ring size).
    #[inline]
    pub fn slot_offset(self, l: &ChannelLayout, index: u32) -> usize {
        self.base(l) + (index & l.mask()) as usize * MESSAGE_SIZE
    }
}

/// A channel region: its memory and its layout. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ChannelMem<'a> {
    mem: VolatileSlice<'a>,
    layout: ChannelLayout,
}

impl<'a> ChannelMem<'a> {
    /// Wraps `mem` (the whole channel region) with `layout`. Fails if `mem` is shorter.
    pub fn new(mem: VolatileSlice<'a>, layout: ChannelLayout) -> Result<Self, LayoutError> {
        if (mem.len() as u64) < layout.region_len {
            return Err(LayoutError::MemoryTooShort {
                have: mem.len(),
                need: layout.region_len,
            });
        }
        Ok(ChannelMem { mem, layout })
    }

    /// Reads and validates the header the engine wrote, then wraps `mem` (client side).
    pub fn from_header(mem: VolatileSlice<'a>) -> Result<Self, LayoutError> {
        let bad = |what: String| LayoutError::BadHeader(what);
        let ld32 = |off| {
            mem.load::<u32>(off, Ordering::Acquire)
                .map_err(|_| LayoutError::MemoryTooShort {
                    have: mem.len(),
                    need: header::END as u64,
                })
        };
        if ld32(header::READY)? != 1 {
            return Err(bad("channel not initialised by the engine".into()));
        }
        if ld32(header::MAGIC)? != CHANNEL_MAGIC {
            return Err(bad("bad magic".into()));
        }
        let version = ld32(header::VERSION)? & 0xffff;
        if version != u32::from(CHANNEL_VERSION) {
            return Err(bad(format!(
                "version {version}, expected {CHANNEL_VERSION}"
            )));
        }
        let ring_size = ld32(header::RING_SIZE)?;
        let region_len =
            u64::from(ld32(header::REGION_LEN)?) | (u64::from(ld32(header::REGION_LEN + 4)?) << 32);
        let layout = ChannelLayout::new(ring_size, region_len)?;
        let same = u64::from(ld32(header::DATA_OFFSET)?) == layout.data_offset
            && ld32(header::TX_RING)? as usize == layout.tx_ring
            && ld32(header::RX_RING)? as usize == layout.rx_ring
            && ld32(header::POST_RING)? as usize == layout.post_ring;
        if !same {
            return Err(bad("ring/data offsets disagree with the layout".into()));
        }
        Self::new(mem, layout)
    }

    /// The layout.
    pub fn layout(&self) -> &ChannelLayout {
        &self.layout
    }

    /// The whole region.
    pub fn slice(&self) -> &VolatileSlice<'a> {
        &self.mem
    }

    /// Engine side: writes the header and zeroes every index and flag, `READY` last (Release),
    /// so a client that sees `READY == 1` sees the whole header.
    pub fn init_header(
        &self,
        channel_id: u32,
        worker: u32,
        cpu: Option<u32>,
    ) -> Result<(), RingError> {
        let l = &self.layout;
        self.store(header::READY, 0, Ordering::Relaxed)?;
        for off in header::INDICES.into_iter().chain([header::FAULT]) {
            self.store(off, 0, Ordering::Relaxed)?;
        }
        self.store(header::MAGIC, CHANNEL_MAGIC, Ordering::Relaxed)?;
        self.store(
            header::VERSION,
            u32::from(CHANNEL_VERSION),
            Ordering::Relaxed,
        )?;
        self.store(header::RING_SIZE, l.ring_size, Ordering::Relaxed)?;
        self.store_u64(header::REGION_LEN, l.region_len)?;
        self.store_u64(header::DATA_OFFSET, l.data_offset)?;
        self.store(header::TX_RING, l.tx_ring as u32, Ordering::Relaxed)?;
        self.store(header::RX_RING, l.rx_ring as u32, Ordering::Relaxed)?;
        self.store(header::POST_RING, l.post_ring as u32, Ordering::Relaxed)?;
        self.store(header::CHANNEL_ID, channel_id, Ordering::Relaxed)?;
        self.store(header::WORKER, worker, Ordering::Relaxed)?;
        self.store(header::CPU, cpu.map_or(u32::MAX, |c| c), Ordering::Relaxed)?;
        // Release: everything above is visible to whoever loads READY == 1 with Acquire.
        self.store(header::READY, 1, Ordering::Release)
    }

    /// Channel id, serving worker and CPU as the engine wrote them in the header.
    pub fn served_by(&self) -> (u32, u32, Option<u32>) {
        let ld = |off| self.load(off, Ordering::Relaxed).unwrap_or(u32::MAX);
        let cpu = ld(header::CPU);
        (
            ld(header::CHANNEL_ID),
            ld(header::WORKER),
            (cpu != u32::MAX).then_some(cpu),
        )
    }

    fn load(&self, off: usize, order: Ordering) -> Result<u32, RingError> {
        self.with_u32(off, |a| a.load(order))
    }

    fn store(&self, off: usize, v: u32, order: Ordering) -> Result<(), RingError> {
        self.with_u32(off, |a| a.store(v, order))
    }

    /// Stores a u64 header field as two relaxed u32 words, low word first.
    fn store_u64(&self, off: usize, v: u64) -> Result<(), RingError> {
        self.store(off, v as u32, Ordering::Relaxed)?;
        self.store(off + 4, (v >> 32) as u32, Ordering::Relaxed)
    }

    /// Runs `f` on the 32-bit word at `off` of the region as an atomic: one bounds and alignment
    /// check, then a plain atomic access. (vm-memory's `load`/`store` do the same through more
    /// layers; indices are read and written several times per message on both sides.)
    #[inline]
    fn with_u32<R>(&self, off: usize, f: impl FnOnce(&AtomicU32) -> R) -> Result<R, RingError> {
        self.with_ptr::<AtomicU32, R>(
            off,
            || "header",
            |ptr| {
                // SAFETY: `with_ptr` checked that the 4 bytes at `ptr` lie inside the slice and are
                // aligned for AtomicU32, and keeps them mapped while `f` runs (which cannot keep the
                // reference). The guest may write them at any time: every access here is atomic, as
                // with vm-memory's own atomic accessors.
                f(unsafe { AtomicU32::from_ptr(ptr.cast::<u32>()) })
            },
        )
    }

    /// Runs `f` on the address of the `size_of::<T>()` bytes at `off` of the region, after
    /// checking that they lie inside it and that the address is aligned for `T`; the region
    /// stays mapped while `f` runs. `ring` names the ring in the error otherwise (called only
    /// then: looking the name up first costs two loads per access on the hot path).
    #[inline]
    fn with_ptr<T, R>(
        &self,
        off: usize,
        ring: impl FnOnce() -> &'static str,
        f: impl FnOnce(*mut u8) -> R,
    ) -> Result<R, RingError> {
        let guard = self.mem.ptr_guard_mut();
        let ptr = guard.as_ptr().wrapping_add(off);
        let inside = off
            .checked_add(std::mem::size_of::<T>())
            .is_some_and(|end| end <= self.mem.len());
        if !inside || ptr as usize % std::mem::align_of::<T>() != 0 {
            return Err(RingError::Memory {
                ring: ring(),
                offset: off,
            });
        }
        Ok(f(ptr))
    }

    /// Engine side: records a fault in the header (the guest can read why its channel stopped).
    pub fn set_fault(&self, reason: FaultReason) {
        // Best effort: if even the header is unreachable there is nobody to tell.
        let _ = self.store(header::FAULT, reason.code(), Ordering::Release);
    }

    /// The fault word: `None` while healthy, else the raw code (see [`FaultReason`]).
    pub fn fault(&self) -> Option<u32> {
        match self.load(header::FAULT, Ordering::Acquire) {
            Ok(0) => None,
            Ok(code) => Some(code),
            Err(_) => Some(u32::MAX),
        }
    }

    /// Sets or clears a sleeping flag ([`header::ENGINE_SLEEPING`] or [`header::GUEST_SLEEPING`]).
    ///
    /// Setting is followed by a SeqCst fence: the sleeper must re-check its rings *after* this
    /// call, and the other side publishes, fences, then reads the flag ([`ChannelMem::peer_sleeping`]).
    /// With a fence on both sides at least one of them sees the other's write, so a wakeup is never
    /// lost (the classic store-fence-load handshake).
    pub fn set_sleeping(&self, flag_offset: usize, sleeping: bool) {
        let _ = self.store(flag_offset, u32::from(sleeping), Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// After publishing: fence, then read the other side's sleeping flag. True means "notify it".
    pub fn peer_sleeping(&self, flag_offset: usize) -> bool {
        fence(Ordering::SeqCst);
        self.peer_flag_set(flag_offset)
    }

    /// [`ChannelMem::peer_sleeping`] without the fence, for a caller that made one SeqCst fence
    /// after all its publishes and checks several channels' flags after it.
    pub fn peer_flag_set(&self, flag_offset: usize) -> bool {
        // If the flag cannot be read, notify anyway: a spurious doorbell costs little, a lost
        // wakeup stalls the peer.
        self.load(flag_offset, Ordering::Relaxed)
            .ok()
            .is_none_or(|v| v != 0)
    }

    #[inline]
    fn slot_offset(&self, kind: RingKind, index: u32) -> usize {
        kind.slot_offset(&self.layout, index)
    }

    /// Runs `f` on the slot of `index` in ring `kind`, as a pointer to [`SLOT_WORDS`] aligned
    /// 64-bit words: one bounds and alignment check per message.
    #[inline]
    fn with_slot<R>(
        &self,
        kind: RingKind,
        index: u32,
        f: impl FnOnce(*mut u64) -> R,
    ) -> Result<R, RingError> {
        let off = self.slot_offset(kind, index);
        self.with_ptr::<[u64; SLOT_WORDS], R>(off, || kind.name(), |ptr| f(ptr.cast::<u64>()))
    }

    // Slots are read and written as eight volatile 64-bit accesses rather than with
    // `read_obj`/`write_obj`, whose generic byte path zeroes a temporary and calls `memcpy`: this
    // is the per-message cost of every ring operation, engine and client alike.
    fn read_slot(&self, kind: RingKind, index: u32) -> Result<RawMessage, RingError> {
        self.with_slot(kind, index, |words| {
            let mut msg = RawMessage::default();
            for (i, bytes) in msg.0.chunks_exact_mut(8).enumerate() {
                // SAFETY: `words` points to SLOT_WORDS aligned u64 inside the mapped slice (see
                // `with_slot`, which keeps it mapped during this call) and i < SLOT_WORDS.
                // A volatile read: the guest may be writing the slot; we get some value of it.
                let word = unsafe { words.wrapping_add(i).read_volatile() };
                bytes.copy_from_slice(&word.to_ne_bytes());
            }
            msg
        })
    }

    fn write_slot(&self, kind: RingKind, index: u32, msg: &RawMessage) -> Result<(), RingError> {
        self.with_slot(kind, index, |words| {
            for (i, bytes) in msg.0.chunks_exact(8).enumerate() {
                let mut b = [0u8; 8];
                b.copy_from_slice(bytes);
                // SAFETY: as in `read_slot`; a volatile write into memory the guest shares.
                unsafe { words.wrapping_add(i).write_volatile(u64::from_ne_bytes(b)) };
            }
        })
    }
}

/// Prefetches the cache line at `ptr` (a hint: never faults, whatever the address).
#[inline]
fn prefetch_line(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is in the x86-64 baseline (SSE) and only hints the cache: it does not
    // access memory architecturally and cannot fault, whatever the pointer.
    unsafe {
        std::arch::x86_64::_mm_prefetch(ptr.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// Asks for the cache line at `ptr` in a writable state (PREFETCHW: a hint that never faults,
/// whatever the address; executed as a NOP by x86-64 CPUs that lack it).
#[inline]
fn prefetch_line_for_write(ptr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW (0F 0D /1) only hints the cache: it does not access memory
    // architecturally, cannot fault, and decodes as a NOP on CPUs without it.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) ptr, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// The producing end of one ring. Keeps its own index privately.
#[derive(Debug, Clone)]
pub struct Producer {
    kind: RingKind,
    size: u32,
    /// Next index to write (private; published with [`Producer::publish`]).
    head: u32,
    /// Last index published.
    published: u32,
    /// Last consumer index seen (validated).
    tail: u32,
}

impl Producer {
    /// A producer for `kind` in a freshly initialised channel (indices at 0).
    pub fn new(kind: RingKind, layout: &ChannelLayout) -> Self {
        Producer {
            kind,
            size: layout.ring_size,
            head: 0,
            published: 0,
            tail: 0,
        }
    }

    /// Free slots, reading (and validating) the consumer's index.
    pub fn free(&mut self, mem: &ChannelMem<'_>) -> Result<u32, RingError> {
        // Acquire: pairs with the consumer's Release store; the slots it released are read.
        let t = mem.load(self.kind.tail(), Ordering::Acquire)?;
        // The consumer can only move forward, and never past what we published.
        if t.wrapping_sub(self.tail) > self.published.wrapping_sub(self.tail) {
            return Err(RingError::ConsumerOutOfRange {
                ring: self.kind.name(),
                tail: t,
                head: self.published,
                last: self.tail,
            });
        }
        self.tail = t;
        Ok(self.size - self.head.wrapping_sub(t))
    }

    /// Free slots as of the last [`Producer::free`] call, without reading shared memory.
    pub fn cached_free(&self) -> u32 {
        self.size - self.head.wrapping_sub(self.tail)
    }

    /// Writes `msg` into the next slot (not yet visible). The caller has checked there is room
    /// (`free` or `cached_free` > 0); without room this returns false and writes nothing.
    pub fn push(&mut self, mem: &ChannelMem<'_>, msg: &RawMessage) -> Result<bool, RingError> {
        if self.cached_free() == 0 {
            return Ok(false);
        }
        mem.write_slot(self.kind, self.head, msg)?;
        self.head = self.head.wrapping_add(1);
        Ok(true)
    }

    /// Hints the CPU to fetch, for writing, the slot `ahead` pushes after the next one (0: the
    /// one the next [`Producer::push`] writes): a producer about to spend time elsewhere (a DMA
    /// copy, or the pushes before it) then finds the line in its cache instead of waiting for
    /// the consumer's core to give it up. Reads nothing, changes nothing.
    #[inline]
    pub fn prefetch(&self, mem: &ChannelMem<'_>, ahead: u32) {
        let off = mem.slot_offset(self.kind, self.head.wrapping_add(ahead));
        if let Ok(slot) = mem.mem.get_slice(off, MESSAGE_SIZE) {
            prefetch_line_for_write(slot.ptr_guard().as_ptr());
        }
    }

    /// Makes every pushed message visible to the consumer.
    pub fn publish(&mut self, mem: &ChannelMem<'_>) -> Result<(), RingError> {
        if self.published != self.head {
            // Release: the slot writes above happen-before the consumer's Acquire load of head.
            mem.store(self.kind.head(), self.head, Ordering::Release)?;
            self.published = self.head;
        }
        Ok(())
    }

    /// Pushed but not yet published.
    pub fn unpublished(&self) -> u32 {
        self.head.wrapping_sub(self.published)
    }

    /// Published and not yet consumed, as of the last `free` call.
    pub fn in_flight(&self) -> u32 {
        self.published.wrapping_sub(self.tail)
    }
}

/// The consuming end of one ring. Keeps its own index privately.
#[derive(Debug, Clone)]
pub struct Consumer {
    kind: RingKind,
    size: u32,
    /// Next index to read (private; written out by [`Consumer::release`]).
    tail: u32,
    /// Last index released.
    released: u32,
    /// Last producer index seen (validated).
    head: u32,
}

impl Consumer {
    /// A consumer for `kind` in a freshly initialised channel (indices at 0).
    pub fn new(kind: RingKind, layout: &ChannelLayout) -> Self {
        Consumer {
            kind,
            size: layout.ring_size,
            tail: 0,
            released: 0,
            head: 0,
        }
    }

    /// Messages available, reading (and validating) the producer's index.
    pub fn available(&mut self, mem: &ChannelMem<'_>) -> Result<u32, RingError> {
        // Acquire: pairs with the producer's Release store, so the slots it wrote are visible.
        let h = mem.load(self.kind.head(), Ordering::Acquire)?;
        let ahead = h.wrapping_sub(self.tail);
        if ahead > self.size {
            return Err(RingError::ProducerOutOfRange {
                ring: self.kind.name(),
                head: h,
                tail: self.tail,
                ahead,
                size: self.size,
            });
        }
        if h.wrapping_sub(self.head) > self.size {
            return Err(RingError::ProducerBackwards {
                ring: self.kind.name(),
                head: h,
                last: self.head,
            });
        }
        self.head = h;
        Ok(ahead)
    }

    /// Messages available as of the last `available` call.
    pub fn cached_available(&self) -> u32 {
        self.head.wrapping_sub(self.tail)
    }

    /// Reads the next message and advances (privately). `None` if none is available as of the
    /// last `available` call.
    pub fn pop(&mut self, mem: &ChannelMem<'_>) -> Result<Option<RawMessage>, RingError> {
        if self.cached_available() == 0 {
            return Ok(None);
        }
        let m = mem.read_slot(self.kind, self.tail)?;
        self.tail = self.tail.wrapping_add(1);
        Ok(Some(m))
    }

    /// Reads the next message without advancing.
    pub fn peek(&self, mem: &ChannelMem<'_>) -> Result<Option<RawMessage>, RingError> {
        if self.cached_available() == 0 {
            return Ok(None);
        }
        mem.read_slot(self.kind, self.tail).map(Some)
    }

    /// Hints the CPU to start loading the slot `ahead` messages after the next one, whether or
    /// not the producer has written it yet: a consumer that is about to spend time on the current
    /// message (a DMA copy) finds the next one in its cache instead of waiting for the line to
    /// come over from the producer's core. Reads nothing, changes nothing; a no-op off x86-64.
    #[inline]
    pub fn prefetch(&self, mem: &ChannelMem<'_>, ahead: u32) {
        let off = mem.slot_offset(self.kind, self.tail.wrapping_add(ahead));
        if let Ok(slot) = mem.mem.get_slice(off, MESSAGE_SIZE) {
            prefetch_line(slot.ptr_guard().as_ptr());
        }
    }

    /// Starts loading the producer's index and the next slot (published or not) into the cache.
    /// A consumer about to wait anyway (on a fence, a locked instruction, a copy) issues this
    /// first, so that both lines' trips from the producer's core overlap with that wait and with
    /// each other, instead of being paid one after the other when it next reads the ring. Reads
    /// nothing, changes nothing; a no-op off x86-64.
    #[inline]
    pub fn prefetch_incoming(&self, mem: &ChannelMem<'_>) {
        if let Ok(index) = mem.mem.get_slice(self.kind.head(), 4) {
            prefetch_line(index.ptr_guard().as_ptr());
        }
        self.prefetch(mem, 0);
    }

    /// Advances past a message obtained with [`Consumer::peek`].
    pub fn skip(&mut self) {
        if self.cached_available() > 0 {
            self.tail = self.tail.wrapping_add(1);
        }
    }

    /// Gives the consumed slots back to the producer.
    pub fn release(&mut self, mem: &ChannelMem<'_>) -> Result<(), RingError> {
        if self.released != self.tail {
            // Release: our reads of the slots happen-before the producer's reuse of them.
            mem.store(self.kind.tail(), self.tail, Ordering::Release)?;
            self.released = self.tail;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, UserData};
    use crate::types::ChannelAddr;

    fn region(len: usize) -> Vec<u64> {
        vec![0u64; len / 8]
    }

    /// The layout of a 64 KiB channel with `ring_size` slots per ring, and a zeroed region for it.
    fn channel(ring_size: u32) -> (ChannelLayout, Vec<u64>) {
        (
            ChannelLayout::new(ring_size, 64 << 10).unwrap(),
            region(64 << 10),
        )
    }

    fn mem_of(buf: &mut [u64]) -> VolatileSlice<'_> {
        // SAFETY: buf is a live, exclusively borrowed allocation of buf.len()*8 bytes that outlives
        // the returned slice (same lifetime).
        unsafe { VolatileSlice::new(buf.as_mut_ptr().cast(), buf.len() * 8) }
    }

    fn msg(i: u64) -> RawMessage {
        Message::UserData(UserData::new(ChannelAddr::default(), i, &i.to_le_bytes()).unwrap())
            .encode()
    }

    #[test]
    fn header_round_trips_through_init_and_from_header() {
        let (layout, mut buf) = channel(64);
        let m = ChannelMem::new(mem_of(&mut buf), layout).unwrap();
        assert!(
            ChannelMem::from_header(*m.slice()).is_err(),
            "not ready yet"
        );
        m.init_header(7, 1, Some(3)).unwrap();
        let c = ChannelMem::from_header(*m.slice()).unwrap();
        assert_eq!(*c.layout(), layout);
        assert_eq!(c.served_by(), (7, 1, Some(3)));
        assert_eq!(c.fault(), None);
        m.set_fault(FaultReason::TxIndex);
        assert_eq!(c.fault(), Some(FaultReason::TxIndex.code()));
    }

    #[test]
    fn push_pop_in_order_with_wraparound() {
        let (layout, mut buf) = channel(16);
        let m = ChannelMem::new(mem_of(&mut buf), layout).unwrap();
        m.init_header(0, 0, None).unwrap();
        let mut p = Producer::new(RingKind::Tx, &layout);
        let mut c = Consumer::new(RingKind::Tx, &layout);
        let mut next_out = 0u64;
        let mut next_in = 0u64;
        for round in 0..100u64 {
            let free = p.free(&m).unwrap();
            for _ in 0..free.min((round % 17) as u32 + 1) {
                assert!(p.push(&m, &msg(next_out)).unwrap());
                next_out += 1;
            }
            p.publish(&m).unwrap();
            let n = c.available(&m).unwrap();
            for _ in 0..n {
                let got = c.pop(&m).unwrap().unwrap();
                assert_eq!(got.cookie(), next_in);
                next_in += 1;
            }
            c.release(&m).unwrap();
        }
        assert_eq!(next_in, next_out);
        assert!(next_out > 16 * 5);
    }

    #[test]
    fn full_ring_refuses_push() {
        let (layout, mut buf) = channel(16);
        let m = ChannelMem::new(mem_of(&mut buf), layout).unwrap();
        let mut p = Producer::new(RingKind::Rx, &layout);
        assert_eq!(p.free(&m).unwrap(), 16);
        for i in 0..16 {
            assert!(p.push(&m, &msg(i)).unwrap());
        }
        assert!(!p.push(&m, &msg(99)).unwrap());
        p.publish(&m).unwrap();
        assert_eq!(p.free(&m).unwrap(), 0);
    }

    #[test]
    fn impossible_indices_are_errors_not_panics() {
        let (layout, mut buf) = channel(16);
        let m = ChannelMem::new(mem_of(&mut buf), layout).unwrap();
        let mut c = Consumer::new(RingKind::Tx, &layout);
        // The guest claims 17 messages in a 16-slot ring.
        m.store(header::TX_HEAD, 17, Ordering::Relaxed).unwrap();
        assert!(matches!(
            c.available(&m),
            Err(RingError::ProducerOutOfRange { ahead: 17, .. })
        ));
        // A head "behind" the tail wraps to a huge distance: also refused.
        m.store(header::TX_HEAD, u32::MAX, Ordering::Relaxed)
            .unwrap();
        assert!(c.available(&m).is_err());
        // Moving backwards after a valid head.
        m.store(header::TX_HEAD, 5, Ordering::Relaxed).unwrap();
        assert_eq!(c.available(&m).unwrap(), 5);
        c.pop(&m).unwrap();
        m.store(header::TX_HEAD, 3, Ordering::Relaxed).unwrap();
        assert!(c.available(&m).is_err());

        // Producer side: the guest's RX consumer index jumping past what was published.
        let mut p = Producer::new(RingKind::Rx, &layout);
        p.push(&m, &msg(1)).unwrap();
        p.publish(&m).unwrap();
        m.store(header::RX_TAIL, 2, Ordering::Relaxed).unwrap();
        assert!(matches!(
            p.free(&m),
            Err(RingError::ConsumerOutOfRange { .. })
        ));
        m.store(header::RX_TAIL, 1, Ordering::Relaxed).unwrap();
        assert_eq!(p.free(&m).unwrap(), 16);
        // ... and backwards.
        m.store(header::RX_TAIL, 0, Ordering::Relaxed).unwrap();
        assert!(p.free(&m).is_err());
    }

    #[test]
    fn a_misaligned_region_gives_errors_not_wild_accesses() {
        // A region whose mapping starts 4 bytes off an 8-byte boundary: every index is still
        // 4-aligned, no slot is 8-aligned; one starting 1 byte off aligns nothing.
        let layout = ChannelLayout::new(16, 64 << 10).unwrap();
        let mut buf = region((64 << 10) + 8);
        let whole = mem_of(&mut buf);
        let off4 = ChannelMem::new(whole.offset(4).unwrap(), layout).unwrap();
        off4.init_header(1, 0, None).unwrap();
        let mut tx = Producer::new(RingKind::Tx, &layout);
        assert!(matches!(
            tx.push(&off4, &msg(1)),
            Err(RingError::Memory { ring: "TX", .. })
        ));
        let off1 = ChannelMem::new(whole.offset(1).unwrap(), layout).unwrap();
        assert!(matches!(
            off1.init_header(1, 0, None),
            Err(RingError::Memory { ring: "header", .. })
        ));
        let mut rx = Consumer::new(RingKind::Tx, &layout);
        assert!(matches!(
            rx.available(&off1),
            Err(RingError::Memory { ring: "header", .. })
        ));
    }

    #[test]
    fn short_memory_is_refused() {
        let layout = ChannelLayout::new(16, 64 << 10).unwrap();
        let mut buf = region(32 << 10);
        assert!(matches!(
            ChannelMem::new(mem_of(&mut buf), layout),
            Err(LayoutError::MemoryTooShort { .. })
        ));
    }
}
