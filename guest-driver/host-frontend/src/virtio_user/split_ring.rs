//! The driver side of a virtio 1.x split virtqueue (virtio 1.2, section 2.7 "Split Virtqueues"),
//! in shared memory the device also maps.
//!
//! A buffer is one descriptor ([`SplitRing::push`], the data path of virtio-net here) or a chain
//! of several, NEXT-linked ([`SplitRing::push_chain`]); no indirect descriptors. Every descriptor
//! id is in one of three states: free, claimed (held by the driver code above, between
//! [`SplitRing::claim`] or [`SplitRing::pop_used`] and [`SplitRing::push`] or
//! [`SplitRing::unclaim`]), or owned by the device (made available, not yet returned). A chain is
//! owned by the device as a whole and comes back as one used element naming its head: the head
//! is then claimed by the caller, and the chain's other ids go straight back to the free list
//! (the caller keys its buffers by head). The device is not trusted: every used element it
//! writes is checked against that state (a chain's tail id is never a valid used id), and an
//! impossible one breaks the ring with a [`RingError`] (sticky: the ring is unusable after it),
//! never a panic.
//!
//! Ordering (2.7.13 "Supplying Buffers to The Device", 2.7.14 "Receiving Used Buffers From The
//! Device"): descriptors and avail-ring slots are written first, then `avail.idx` is stored with
//! Release, so a device that loads it with Acquire sees them. `used.idx` is loaded with Acquire
//! before the used elements it covers are read. The notification checks (2.7.7, 2.7.10) need a
//! full fence between publishing an index and reading the other side's event index.

use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use thiserror::Error;
use virtio_bindings::virtio_ring::{
    VRING_AVAIL_F_NO_INTERRUPT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Largest queue size the split format allows (2.7: "Queue Size ... maximum 32768").
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// Size of one descriptor (2.7.5 "The Virtqueue Descriptor Table": addr u64, len u32, flags u16,
/// next u16).
const DESC_SIZE: u64 = 16;
/// Size of one used element (2.7.8 "The Virtqueue Used Ring": id u32, len u32).
const USED_ELEM_SIZE: u64 = 8;
/// `flags` and `idx` before the ring array, in both the avail and the used ring.
const RING_HEADER: u64 = 4;

/// Where the three parts of a split virtqueue lie (guest-physical addresses) and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Queue size (power of two, 1..=32768).
    pub size: u16,
    /// Descriptor table (16-byte aligned).
    pub desc: u64,
    /// Available ring, "driver area" (2-byte aligned).
    pub avail: u64,
    /// Used ring, "device area" (4-byte aligned).
    pub used: u64,
}

impl RingLayout {
    /// Bytes of the descriptor table for `size` entries.
    pub fn desc_bytes(size: u16) -> u64 {
        DESC_SIZE * u64::from(size)
    }

    /// Bytes of the available ring (flags, idx, `ring[size]`, used_event).
    pub fn avail_bytes(size: u16) -> u64 {
        RING_HEADER + 2 * u64::from(size) + 2
    }

    /// Bytes of the used ring (flags, idx, `ring[size]`, avail_event).
    pub fn used_bytes(size: u16) -> u64 {
        RING_HEADER + USED_ELEM_SIZE * u64::from(size) + 2
    }

    /// The three parts laid out one after the other from `base` (descriptor table, avail ring,
    /// used ring at the next 4-byte boundary). `base` must be 16-byte aligned.
    pub fn contiguous(base: u64, size: u16) -> Self {
        let avail = base + Self::desc_bytes(size);
        let used = (avail + Self::avail_bytes(size) + 3) & !3;
        RingLayout {
            size,
            desc: base,
            avail,
            used,
        }
    }

    /// Address of descriptor `id` (any id: one past the table is the caller's business).
    pub fn desc_addr(&self, id: u16) -> u64 {
        self.desc.wrapping_add(DESC_SIZE * u64::from(id))
    }

    /// Address of `avail.idx`.
    pub fn avail_idx_addr(&self) -> u64 {
        self.avail.wrapping_add(2)
    }

    /// Address of `avail.ring[slot]` (any slot).
    pub fn avail_entry_addr(&self, slot: u16) -> u64 {
        self.avail.wrapping_add(RING_HEADER + 2 * u64::from(slot))
    }

    /// Address of `used.idx`.
    pub fn used_idx_addr(&self) -> u64 {
        self.used.wrapping_add(2)
    }

    /// Address of `used.ring[slot]` (any slot).
    pub fn used_elem_addr(&self, slot: u16) -> u64 {
        self.used
            .wrapping_add(RING_HEADER + USED_ELEM_SIZE * u64::from(slot))
    }

    fn used_event_addr(&self) -> u64 {
        self.avail_entry_addr(self.size)
    }

    fn avail_event_addr(&self) -> u64 {
        self.used_elem_addr(self.size)
    }
}

/// One descriptor as the table holds it (2.7.5: le64 addr, le32 len, le16 flags, le16 next).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Guest-physical address of the buffer.
    pub addr: u64,
    /// Buffer length.
    pub len: u32,
    /// `VRING_DESC_F_*`.
    pub flags: u16,
    /// Next descriptor of the chain, with `VRING_DESC_F_NEXT`.
    pub next: u16,
}

impl Descriptor {
    /// Its 16 bytes in the table.
    pub fn to_le_bytes(&self) -> [u8; DESC_SIZE as usize] {
        let mut b = [0u8; DESC_SIZE as usize];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..16].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

/// A device (or driver-code) error on a split virtqueue. Once returned, the ring is broken.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The layout is unusable (size, alignment, or outside memory).
    #[error("{queue} queue: invalid layout: {why}")]
    BadLayout {
        /// Queue name.
        queue: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The device returned a descriptor id outside the queue.
    #[error("{queue} queue: device returned descriptor id {id}, but the queue has only {size} descriptors; queue broken")]
    BadUsedId {
        /// Queue name.
        queue: &'static str,
        /// Id written by the device.
        id: u32,
        /// Queue size.
        size: u16,
    },
    /// The device returned a descriptor it does not own (never made available, or already used).
    #[error("{queue} queue: device returned descriptor {id}, which it does not own (not available or already returned); queue broken")]
    NotOutstanding {
        /// Queue name.
        queue: &'static str,
        /// Id written by the device.
        id: u32,
    },
    /// The device claims to have written more than the buffer holds.
    #[error("{queue} queue: device says it wrote {len} bytes into descriptor {id}, whose buffer has {buffer_len}; queue broken")]
    UsedLenTooLarge {
        /// Queue name.
        queue: &'static str,
        /// Descriptor id.
        id: u16,
        /// Length written by the device.
        len: u32,
        /// Writable bytes of the buffer (of the whole chain).
        buffer_len: u32,
    },
    /// `used.idx` moved by more than the number of buffers the device holds.
    #[error("{queue} queue: device moved used idx from {last_used} to {used_idx}, but held only {in_flight} buffers; queue broken")]
    UsedIdxJump {
        /// Queue name.
        queue: &'static str,
        /// The used idx the device wrote.
        used_idx: u16,
        /// The driver's last consumed used idx.
        last_used: u16,
        /// Buffers the device held.
        in_flight: u16,
    },
    /// A driver-side misuse (a bug in the code above the ring), reported instead of panicking.
    #[error("{queue} queue: driver error: {why}")]
    Misuse {
        /// Queue name.
        queue: &'static str,
        /// What went wrong.
        why: String,
    },
    /// Ring memory could not be accessed.
    #[error("{queue} queue: cannot access {what} at {addr:#x}: {why}")]
    Memory {
        /// Queue name.
        queue: &'static str,
        /// Which field.
        what: &'static str,
        /// Guest-physical address.
        addr: u64,
        /// vm-memory's error.
        why: String,
    },
}

/// A buffer the device returned: its descriptor id (the head, for a chain; now claimed by the
/// caller) and the number of bytes the device wrote (validated against the writable part of the
/// buffer when it has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsedBuffer {
    /// Descriptor id (head of the chain).
    pub id: u16,
    /// Bytes written by the device.
    pub len: u32,
}

/// One descriptor of a chain given to [`SplitRing::push_chain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainSegment {
    /// A claimed descriptor id.
    pub id: u16,
    /// Guest-physical address of the buffer.
    pub addr: u64,
    /// Buffer length.
    pub len: u32,
    /// The device writes this buffer (else it reads it).
    pub writable: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    Claimed,
    /// Head of a buffer the device owns: `len` writable bytes in total (saturating), `writable`
    /// if any part is device-writable, `tail` further descriptors chained after it.
    Device {
        len: u32,
        writable: bool,
        tail: u16,
    },
    /// A descriptor after the head of a chain the device owns.
    Chained,
}

/// `links` entry of an id that continues no chain.
const NO_LINK: u16 = u16::MAX;

/// True if an index moving from `old` to `new` passes `event` (the `vring_need_event` rule of
/// 2.7.7.2 and 2.7.10.2: notify when the index moves past the event index).
pub(crate) fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// The driver side of one split virtqueue.
#[derive(Debug)]
pub struct SplitRing {
    queue: &'static str,
    mem: Arc<GuestMemoryMmap>,
    layout: RingLayout,
    event_idx: bool,
    slots: Vec<Slot>,
    /// For an id inside a chain the device owns: the next id of that chain (our own record; the
    /// descriptor table is shared and may have been rewritten by the device).
    links: Vec<u16>,
    free: Vec<u16>,
    /// Our avail idx: the next avail-ring entry we write (the private copy; never read back).
    next_avail: Wrapping<u16>,
    /// avail idx at the last kick decision ("old" of vring_need_event).
    kick_checked: Wrapping<u16>,
    /// used idx up to which we have consumed used elements.
    last_used: Wrapping<u16>,
    in_flight: u16,
    broken: Option<RingError>,
}

impl SplitRing {
    /// Sets up the driver side over `layout` in `mem`: checks size, alignment (2.7 "Virtqueue
    /// Part Alignment") and that all three parts lie in memory, and zeroes them (avail idx,
    /// used idx and both event indices start at 0). `event_idx`: VIRTIO_F_EVENT_IDX was negotiated.
    pub fn new(
        queue: &'static str,
        mem: Arc<GuestMemoryMmap>,
        layout: RingLayout,
        event_idx: bool,
    ) -> Result<Self, RingError> {
        let bad = |why: String| RingError::BadLayout { queue, why };
        let size = layout.size;
        if !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return Err(bad(format!(
                "size {size} is not a power of two in 1..={MAX_QUEUE_SIZE}"
            )));
        }
        let parts = [
            (
                "descriptor table",
                layout.desc,
                16,
                RingLayout::desc_bytes(size),
            ),
            (
                "available ring",
                layout.avail,
                2,
                RingLayout::avail_bytes(size),
            ),
            ("used ring", layout.used, 4, RingLayout::used_bytes(size)),
        ];
        for (what, addr, align, len) in parts {
            if addr % align != 0 {
                return Err(bad(format!(
                    "{what} at {addr:#x} is not {align}-byte aligned"
                )));
            }
            let zeros = vec![0u8; len as usize];
            mem.write_slice(&zeros, GuestAddress(addr))
                .map_err(|e| bad(format!("{what} at {addr:#x}+{len:#x}: {e}")))?;
        }
        Ok(SplitRing {
            queue,
            mem,
            layout,
            event_idx,
            slots: vec![Slot::Free; usize::from(size)],
            links: vec![NO_LINK; usize::from(size)],
            free: (0..size).rev().collect(),
            next_avail: Wrapping(0),
            kick_checked: Wrapping(0),
            last_used: Wrapping(0),
            in_flight: 0,
            broken: None,
        })
    }

    /// The layout.
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.layout.size
    }

    /// The driver's avail idx: how many buffers were made available since the ring was set up
    /// (wrapping), published or not.
    pub fn avail_idx(&self) -> u16 {
        self.next_avail.0
    }

    /// The used idx up to which used elements were consumed.
    pub fn last_used(&self) -> u16 {
        self.last_used.0
    }

    /// Buffers the device holds.
    pub fn in_flight(&self) -> u16 {
        self.in_flight
    }

    /// Free descriptors (neither claimed nor held by the device).
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// The error that broke the ring, if any.
    pub fn broken(&self) -> Option<&RingError> {
        self.broken.as_ref()
    }

    fn check(&self) -> Result<(), RingError> {
        match &self.broken {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn fail<T>(&mut self, e: RingError) -> Result<T, RingError> {
        self.broken = Some(e.clone());
        Err(e)
    }

    fn mem_err(&self, what: &'static str, addr: u64, e: impl std::fmt::Display) -> RingError {
        RingError::Memory {
            queue: self.queue,
            what,
            addr,
            why: e.to_string(),
        }
    }

    fn load_u16(&self, what: &'static str, addr: u64, order: Ordering) -> Result<u16, RingError> {
        self.mem
            .load::<u16>(GuestAddress(addr), order)
            .map(u16::from_le)
            .map_err(|e| self.mem_err(what, addr, e))
    }

    fn store_u16(
        &self,
        what: &'static str,
        addr: u64,
        val: u16,
        order: Ordering,
    ) -> Result<(), RingError> {
        self.mem
            .store(val.to_le(), GuestAddress(addr), order)
            .map_err(|e| self.mem_err(what, addr, e))
    }

    /// Claims a free descriptor id for a buffer the caller will [`SplitRing::push`]; `None` if
    /// all are claimed or held by the device.
    pub fn claim(&mut self) -> Option<u16> {
        if self.broken.is_some() {
            return None;
        }
        let id = self.free.pop()?;
        self.slots[usize::from(id)] = Slot::Claimed;
        Some(id)
    }

    /// Gives a claimed id back to the free list (a transmitted buffer that came back, or a
    /// claim the caller could not use).
    pub fn unclaim(&mut self, id: u16) -> Result<(), RingError> {
        match self.slots.get(usize::from(id)) {
            Some(Slot::Claimed) => {
                self.slots[usize::from(id)] = Slot::Free;
                self.free.push(id);
                Ok(())
            }
            other => Err(RingError::Misuse {
                queue: self.queue,
                why: format!("unclaim of descriptor {id} in state {other:?}"),
            }),
        }
    }

    /// Makes a claimed descriptor available to the device: writes the descriptor (2.7.5) and
    /// the next avail-ring entry (2.7.13.2). Not visible to the device until
    /// [`SplitRing::publish`]. `writable`: the device writes the buffer (RX), else reads it (TX).
    pub fn push(&mut self, id: u16, addr: u64, len: u32, writable: bool) -> Result<(), RingError> {
        self.check()?;
        if self.slots.get(usize::from(id)) != Some(&Slot::Claimed) {
            return Err(RingError::Misuse {
                queue: self.queue,
                why: format!("push of descriptor {id}, which is not claimed"),
            });
        }
        let flags = if writable {
            VRING_DESC_F_WRITE as u16
        } else {
            0
        };
        // next = 0: no VIRTQ_DESC_F_NEXT, a chain of one.
        self.write_desc(id, addr, len, flags, 0)?;
        self.make_available(id)?;
        self.slots[usize::from(id)] = Slot::Device {
            len,
            writable,
            tail: 0,
        };
        Ok(())
    }

    /// Makes a chain of claimed descriptors available as one buffer, in the order given
    /// (2.7.5: each descriptor but the last has VIRTQ_DESC_F_NEXT and names the next). Rules
    /// (2.7.4.2): 1..=size distinct claimed ids, device-readable segments before device-writable
    /// ones; a violation is a [`RingError::Misuse`] and leaves every id claimed. The device
    /// returns the chain by its head (the first id); see the module documentation for the rest.
    pub fn push_chain(&mut self, chain: &[ChainSegment]) -> Result<(), RingError> {
        self.check()?;
        let (Some(head), Some(last)) = (chain.first(), chain.last()) else {
            return Err(self.misuse("push_chain of an empty chain".into()));
        };
        let Some(tail) = u16::try_from(chain.len() - 1)
            .ok()
            .filter(|t| *t < self.layout.size)
        else {
            return Err(self.misuse(format!(
                "push_chain of {} descriptors on a queue of {}",
                chain.len(),
                self.layout.size
            )));
        };
        // Mark as we check, so that a repeated id is seen; undo on any error.
        let mut seen_writable = false;
        for (i, seg) in chain.iter().enumerate() {
            let why = if self.slots.get(usize::from(seg.id)) != Some(&Slot::Claimed) {
                Some(format!(
                    "push_chain of descriptor {}, which is not claimed (or repeated)",
                    seg.id
                ))
            } else if seen_writable && !seg.writable {
                Some(format!(
                    "push_chain: device-readable descriptor {} after a device-writable one",
                    seg.id
                ))
            } else {
                None
            };
            if let Some(why) = why {
                self.unmark(&chain[..i]);
                return Err(self.misuse(why));
            }
            seen_writable |= seg.writable;
            self.slots[usize::from(seg.id)] = Slot::Chained;
        }
        let mut writable_len = 0u32;
        for (seg, next) in chain
            .iter()
            .zip(chain.iter().skip(1).map(Some).chain([None]))
        {
            let mut flags = if seg.writable {
                VRING_DESC_F_WRITE as u16
            } else {
                0
            };
            if next.is_some() {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            let next_id = next.map_or(0, |n| n.id);
            if let Err(e) = self.write_desc(seg.id, seg.addr, seg.len, flags, next_id) {
                self.unmark(chain);
                return Err(e);
            }
            if seg.writable {
                writable_len = writable_len.saturating_add(seg.len);
            }
        }
        if let Err(e) = self.make_available(head.id) {
            self.unmark(chain);
            return Err(e);
        }
        for pair in chain.windows(2) {
            self.links[usize::from(pair[0].id)] = pair[1].id;
        }
        self.links[usize::from(last.id)] = NO_LINK;
        self.slots[usize::from(head.id)] = Slot::Device {
            len: writable_len,
            writable: seen_writable,
            tail,
        };
        Ok(())
    }

    fn misuse(&self, why: String) -> RingError {
        RingError::Misuse {
            queue: self.queue,
            why,
        }
    }

    /// Gives the ids of a chain that [`SplitRing::push_chain`] refused back to the caller.
    fn unmark(&mut self, segs: &[ChainSegment]) {
        for seg in segs {
            if let Some(slot) = self.slots.get_mut(usize::from(seg.id)) {
                *slot = Slot::Claimed;
            }
        }
    }

    fn write_desc(
        &self,
        id: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> Result<(), RingError> {
        let desc = Descriptor {
            addr,
            len,
            flags,
            next,
        };
        let desc_addr = self.layout.desc_addr(id);
        self.mem
            .write_slice(&desc.to_le_bytes(), GuestAddress(desc_addr))
            .map_err(|e| self.mem_err("descriptor", desc_addr, e))
    }

    /// Writes `head` into the next avail-ring entry and counts the buffer as the device's.
    fn make_available(&mut self, head: u16) -> Result<(), RingError> {
        let entry = self
            .layout
            .avail_entry_addr(self.next_avail.0 & (self.layout.size - 1));
        // Relaxed: the Release store of avail.idx in publish() orders this write before it.
        self.store_u16("avail ring entry", entry, head, Ordering::Relaxed)?;
        self.next_avail += 1;
        self.in_flight += 1;
        Ok(())
    }

    /// Returns the tail of the chain headed by `head` (`tail` ids) to the free list.
    fn free_tail(&mut self, head: u16, tail: u16) {
        let mut id = head;
        for _ in 0..tail {
            let next = self.links[usize::from(id)];
            self.links[usize::from(id)] = NO_LINK;
            let Some(slot) = self.slots.get_mut(usize::from(next)) else {
                return;
            };
            *slot = Slot::Free;
            self.free.push(next);
            id = next;
        }
    }

    /// Publishes every pushed buffer: stores avail.idx with Release (2.7.13.3 "Updating idx":
    /// the device must see the descriptors and ring entries before the new idx).
    pub fn publish(&mut self) -> Result<(), RingError> {
        self.check()?;
        self.store_u16(
            "avail idx",
            self.layout.avail_idx_addr(),
            self.next_avail.0,
            Ordering::Release,
        )
    }

    /// Whether the device wants a notification for what was published since the last call
    /// (2.7.13.4 "Notifying the device", 2.7.10 "Available Buffer Notification Suppression"):
    /// with EVENT_IDX, when avail idx moved past the device's `avail_event`; without it, unless
    /// the device set VIRTQ_USED_F_NO_NOTIFY. Call after [`SplitRing::publish`].
    pub fn kick_needed(&mut self) -> Result<bool, RingError> {
        self.check()?;
        let new = self.next_avail;
        let old = self.kick_checked;
        if new == old {
            return Ok(false);
        }
        self.kick_checked = new;
        // The avail idx store must be visible before we read the device's suppression state,
        // or both sides could decide the other will act (the lost-kick race).
        fence(Ordering::SeqCst);
        if self.event_idx {
            let event = self.load_u16(
                "avail_event",
                self.layout.avail_event_addr(),
                Ordering::Relaxed,
            )?;
            Ok(need_event(event, new.0, old.0))
        } else {
            let flags = self.load_u16("used flags", self.layout.used, Ordering::Relaxed)?;
            Ok(flags & VRING_USED_F_NO_NOTIFY as u16 == 0)
        }
    }

    /// Returns the next used buffer, if the device returned one, after checking it
    /// (2.7.8 "The Virtqueue Used Ring"). The id is claimed by the caller afterwards.
    pub fn pop_used(&mut self) -> Result<Option<UsedBuffer>, RingError> {
        self.check()?;
        // Acquire: the used elements up to used.idx are visible once we see it.
        let used_idx = self.load_u16("used idx", self.layout.used_idx_addr(), Ordering::Acquire)?;
        let pending = used_idx.wrapping_sub(self.last_used.0);
        if pending == 0 {
            return Ok(None);
        }
        if pending > self.in_flight {
            return self.fail(RingError::UsedIdxJump {
                queue: self.queue,
                used_idx,
                last_used: self.last_used.0,
                in_flight: self.in_flight,
            });
        }
        let addr = self
            .layout
            .used_elem_addr(self.last_used.0 & (self.layout.size - 1));
        let elem: [u8; 8] = match self.mem.read_obj(GuestAddress(addr)) {
            Ok(e) => e,
            Err(e) => {
                let err = self.mem_err("used element", addr, e);
                return self.fail(err);
            }
        };
        let id = u32::from_le_bytes([elem[0], elem[1], elem[2], elem[3]]);
        let len = u32::from_le_bytes([elem[4], elem[5], elem[6], elem[7]]);
        let size = self.layout.size;
        let Some(id16) = u16::try_from(id).ok().filter(|i| *i < size) else {
            return self.fail(RingError::BadUsedId {
                queue: self.queue,
                id,
                size,
            });
        };
        match self.slots[usize::from(id16)] {
            Slot::Device {
                len: buffer_len,
                writable,
                tail,
            } => {
                // For a device-readable buffer (TX) len means nothing (the device wrote
                // nothing; some devices report 0, some the frame length): it is ignored.
                if writable && len > buffer_len {
                    return self.fail(RingError::UsedLenTooLarge {
                        queue: self.queue,
                        id: id16,
                        len,
                        buffer_len,
                    });
                }
                if tail != 0 {
                    self.free_tail(id16, tail);
                }
            }
            Slot::Free | Slot::Claimed | Slot::Chained => {
                return self.fail(RingError::NotOutstanding {
                    queue: self.queue,
                    id,
                })
            }
        }
        self.slots[usize::from(id16)] = Slot::Claimed;
        self.in_flight -= 1;
        self.last_used += 1;
        Ok(Some(UsedBuffer { id: id16, len }))
    }

    /// Asks the device for a used-buffer notification as soon as it returns another buffer
    /// (2.7.7 "Used Buffer Notification Suppression": `used_event` = our last used idx with
    /// EVENT_IDX, else clear VIRTQ_AVAIL_F_NO_INTERRUPT), then re-checks used.idx. Returns true
    /// if buffers are already waiting (do not sleep then: their notification may have been
    /// suppressed before we asked).
    pub fn enable_used_notification(&mut self) -> Result<bool, RingError> {
        self.check()?;
        if self.event_idx {
            self.store_u16(
                "used_event",
                self.layout.used_event_addr(),
                self.last_used.0,
                Ordering::Relaxed,
            )?;
        } else {
            self.store_u16("avail flags", self.layout.avail, 0, Ordering::Relaxed)?;
        }
        // The request must be visible before we re-read used.idx, or a buffer returned in
        // between could go unnotified while we sleep.
        fence(Ordering::SeqCst);
        let used_idx = self.load_u16("used idx", self.layout.used_idx_addr(), Ordering::Acquire)?;
        Ok(used_idx != self.last_used.0)
    }

    /// Tells the device that no used-buffer notification is wanted (best effort: the device
    /// may still notify). With EVENT_IDX `used_event` is set just behind our last used idx, an
    /// index the device has already passed and cannot pass again before wrapping 65536 buffers.
    pub fn disable_used_notification(&mut self) -> Result<(), RingError> {
        self.check()?;
        if self.event_idx {
            self.store_u16(
                "used_event",
                self.layout.used_event_addr(),
                self.last_used.0.wrapping_sub(1),
                Ordering::Relaxed,
            )
        } else {
            self.store_u16(
                "avail flags",
                self.layout.avail,
                VRING_AVAIL_F_NO_INTERRUPT as u16,
                Ordering::Relaxed,
            )
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
