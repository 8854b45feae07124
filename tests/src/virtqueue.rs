//! The driver side of a split virtqueue (VIRTIO 1.2, 2.7 "Split Virtqueues") written by hand
//! in a test frontend's memory, so that a test can publish any descriptor (lengths near the
//! integer limits, chains that loop, addresses outside memory) and any ring index.

use std::sync::atomic::Ordering;

use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::raw_frontend::{MemRegion, Memfd, Sealing};

/// `VIRTQ_DESC_F_NEXT`: the chain continues at `next`.
pub const DESC_F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE`: device-writable buffer.
pub const DESC_F_WRITE: u16 = 2;
/// `VIRTQ_DESC_F_INDIRECT`: the buffer is a table of descriptors.
pub const DESC_F_INDIRECT: u16 = 4;

/// A test frontend's memory: a memfd mapped shared at guest-physical 0 (also mapped here, so
/// its address here is the `user_addr` the memory table announces).
#[derive(Debug)]
pub struct GuestMem {
    /// The memfd.
    pub memfd: Memfd,
    /// The mapping.
    pub mem: GuestMemoryMmap,
    size: u64,
}

impl GuestMem {
    /// `size` bytes of memfd memory.
    pub fn new(size: u64, sealing: Sealing) -> Result<GuestMem, String> {
        let memfd = Memfd::new(size, sealing).map_err(|e| format!("memfd: {e}"))?;
        let file = memfd.file().try_clone().map_err(|e| format!("dup: {e}"))?;
        let len = usize::try_from(size).map_err(|e| format!("size {size}: {e}"))?;
        let mem = GuestMemoryMmap::from_ranges_with_files(&[(
            GuestAddress(0),
            len,
            Some(FileOffset::new(file, 0)),
        )])
        .map_err(|e| format!("mmap: {e}"))?;
        Ok(GuestMem { memfd, mem, size })
    }

    /// Its size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// This process's address of guest-physical `gpa` (also for addresses past the end: the
    /// vhost-user frontend address of a range a test wants to lie about).
    pub fn user_addr(&self, gpa: u64) -> u64 {
        let base = self
            .mem
            .get_host_address(GuestAddress(0))
            .map_or(0, |p| p as u64);
        base.wrapping_add(gpa)
    }

    /// The whole memory as one region of the memory table.
    pub fn region(&self) -> MemRegion {
        MemRegion {
            gpa: 0,
            size: self.size,
            user_addr: self.user_addr(0),
            mmap_offset: 0,
        }
    }

    /// Writes `data` at `gpa`.
    pub fn write(&self, gpa: u64, data: &[u8]) -> Result<(), String> {
        self.mem
            .write_slice(data, GuestAddress(gpa))
            .map_err(|e| format!("write at {gpa:#x}: {e}"))
    }

    /// Reads `out.len()` bytes at `gpa`.
    pub fn read(&self, gpa: u64, out: &mut [u8]) -> Result<(), String> {
        self.mem
            .read_slice(out, GuestAddress(gpa))
            .map_err(|e| format!("read at {gpa:#x}: {e}"))
    }
}

/// One descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Desc {
    /// Buffer guest-physical address.
    pub addr: u64,
    /// Buffer length.
    pub len: u32,
    /// `DESC_F_*`.
    pub flags: u16,
    /// Next descriptor, with `DESC_F_NEXT`.
    pub next: u16,
}

impl Desc {
    /// Its 16 bytes (le64 addr, le32 len, le16 flags, le16 next).
    pub fn bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

/// A split virtqueue's three areas in [`GuestMem`], driver side.
#[derive(Debug, Clone)]
pub struct SplitQueue {
    /// Slots (what the driver lays out; a test may tell the device another number).
    pub size: u16,
    /// Descriptor table (guest-physical).
    pub desc: u64,
    /// Available ring.
    pub avail: u64,
    /// Used ring.
    pub used: u64,
    next_avail: u16,
    last_used: u16,
}

impl SplitQueue {
    /// A queue of `size` slots laid out from `base` (desc, then avail, then used aligned to 4).
    pub fn new(base: u64, size: u16) -> SplitQueue {
        let desc = base;
        let avail = desc + 16 * u64::from(size);
        let used = (avail + 6 + 2 * u64::from(size) + 3) & !3;
        SplitQueue {
            size,
            desc,
            avail,
            used,
            next_avail: 0,
            last_used: 0,
        }
    }

    /// Bytes the three areas take from `base`.
    pub fn footprint(size: u16) -> u64 {
        let q = SplitQueue::new(0, size);
        q.used + 6 + 8 * u64::from(size)
    }

    /// Writes descriptor `index` (any index: one past the table is a test's business).
    pub fn write_desc(&self, mem: &GuestMem, index: u16, d: Desc) -> Result<(), String> {
        mem.write(self.desc + 16 * u64::from(index), &d.bytes())
    }

    /// Writes a table of descriptors at `gpa` (for an indirect descriptor to point at).
    pub fn write_table(mem: &GuestMem, gpa: u64, descs: &[Desc]) -> Result<(), String> {
        for (i, d) in descs.iter().enumerate() {
            mem.write(gpa + 16 * i as u64, &d.bytes())?;
        }
        Ok(())
    }

    /// Puts `head` in the next available slot and publishes it (release store of `avail.idx`).
    pub fn publish(&mut self, mem: &GuestMem, head: u16) -> Result<(), String> {
        let slot = u64::from(self.next_avail % self.size.max(1));
        mem.write(self.avail + 4 + 2 * slot, &head.to_le_bytes())?;
        let idx = self.next_avail.wrapping_add(1);
        self.set_avail_idx(mem, idx)
    }

    /// Stores any `avail.idx` (release: ring entries written before are visible first).
    pub fn set_avail_idx(&mut self, mem: &GuestMem, idx: u16) -> Result<(), String> {
        self.next_avail = idx;
        mem.mem
            .store(idx.to_le(), GuestAddress(self.avail + 2), Ordering::Release)
            .map_err(|e| format!("avail idx: {e}"))
    }

    /// Writes any value into `avail.ring[slot]` without publishing.
    pub fn set_avail_entry(&self, mem: &GuestMem, slot: u16, head: u16) -> Result<(), String> {
        mem.write(self.avail + 4 + 2 * u64::from(slot), &head.to_le_bytes())
    }

    /// Writes `used.idx` (drivers never do: for attacks and for resetting a ring).
    pub fn set_used_idx(&self, mem: &GuestMem, idx: u16) -> Result<(), String> {
        mem.write(self.used + 2, &idx.to_le_bytes())
    }

    /// The driver's available index.
    pub fn avail_idx(&self) -> u16 {
        self.next_avail
    }

    /// The device's `used.idx` (acquire).
    pub fn used_idx(&self, mem: &GuestMem) -> Result<u16, String> {
        mem.mem
            .load::<u16>(GuestAddress(self.used + 2), Ordering::Acquire)
            .map(u16::from_le)
            .map_err(|e| format!("used idx: {e}"))
    }

    /// How far the driver has read the used ring.
    pub fn last_used(&self) -> u16 {
        self.last_used
    }

    /// Stores `used_event` (VIRTIO_F_EVENT_IDX: the device signals once `used.idx` passes it;
    /// release, as the driver publishes it).
    pub fn set_used_event(&self, mem: &GuestMem, idx: u16) -> Result<(), String> {
        let at = self.avail + 4 + 2 * u64::from(self.size);
        mem.mem
            .store(idx.to_le(), GuestAddress(at), Ordering::Release)
            .map_err(|e| format!("used event: {e}"))
    }

    /// The next used element (id, len), if the device published one.
    pub fn pop_used(&mut self, mem: &GuestMem) -> Result<Option<(u32, u32)>, String> {
        if self.used_idx(mem)? == self.last_used {
            return Ok(None);
        }
        let slot = u64::from(self.last_used % self.size.max(1));
        let mut elem = [0u8; 8];
        mem.read(self.used + 4 + 8 * slot, &mut elem)?;
        self.last_used = self.last_used.wrapping_add(1);
        let word = |i: usize| u32::from_le_bytes([elem[i], elem[i + 1], elem[i + 2], elem[i + 3]]);
        Ok(Some((word(0), word(4))))
    }
}
