//! Raw access to a split virtqueue's memory, for hostile tests: write any descriptor, any
//! avail-ring entry, any `avail.idx` or `used.idx`, at the addresses the real driver's
//! [`RingLayout`] gives. The only hand-written ring code of the kit; everything polite goes
//! through the real [`SplitRing`](svnic_host_frontend::virtio_user::SplitRing).

use std::sync::atomic::Ordering;

use svnic_host_frontend::virtio_user::RingLayout;
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub use svnic_host_frontend::virtio_user::Descriptor as Desc;

/// `VIRTQ_DESC_F_NEXT`: the chain continues at `next`.
pub const DESC_F_NEXT: u16 = VRING_DESC_F_NEXT as u16;
/// `VIRTQ_DESC_F_WRITE`: device-writable buffer.
pub const DESC_F_WRITE: u16 = VRING_DESC_F_WRITE as u16;
/// `VIRTQ_DESC_F_INDIRECT`: the buffer is a table of descriptors.
pub const DESC_F_INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

/// One ring's memory, written without any of the driver's rules.
#[derive(Debug, Clone, Copy)]
pub struct RawRing<'a> {
    /// The memory the ring lives in.
    pub mem: &'a GuestMemoryMmap,
    /// Where its parts are.
    pub layout: RingLayout,
}

impl RawRing<'_> {
    fn write(&self, what: &str, gpa: u64, data: &[u8]) -> Result<(), String> {
        self.mem
            .write_slice(data, GuestAddress(gpa))
            .map_err(|e| format!("{what} at {gpa:#x}: {e}"))
    }

    /// Writes descriptor `index` (any index: one past the table is the test's business).
    pub fn write_desc(&self, index: u16, d: Desc) -> Result<(), String> {
        self.write("descriptor", self.layout.desc_addr(index), &d.to_le_bytes())
    }

    /// Writes a table of descriptors at `gpa` (for an indirect descriptor to point at).
    pub fn write_table(&self, gpa: u64, descs: &[Desc]) -> Result<(), String> {
        for (i, d) in descs.iter().enumerate() {
            self.write("descriptor table", gpa + 16 * i as u64, &d.to_le_bytes())?;
        }
        Ok(())
    }

    /// Writes any value into `avail.ring[slot]` without publishing.
    pub fn set_avail_entry(&self, slot: u16, head: u16) -> Result<(), String> {
        let at = self.layout.avail_entry_addr(slot);
        self.write("avail entry", at, &head.to_le_bytes())
    }

    /// `avail.idx` as it is in memory.
    pub fn avail_idx(&self) -> Result<u16, String> {
        self.load("avail idx", self.layout.avail_idx_addr())
    }

    /// Stores any `avail.idx` (release: entries written before are visible first).
    pub fn set_avail_idx(&self, idx: u16) -> Result<(), String> {
        let at = self.layout.avail_idx_addr();
        self.mem
            .store(idx.to_le(), GuestAddress(at), Ordering::Release)
            .map_err(|e| format!("avail idx at {at:#x}: {e}"))
    }

    /// `used.idx` as the device left it (acquire).
    pub fn used_idx(&self) -> Result<u16, String> {
        self.load("used idx", self.layout.used_idx_addr())
    }

    /// Writes `used.idx` (drivers never do: for attacks).
    pub fn set_used_idx(&self, idx: u16) -> Result<(), String> {
        self.write("used idx", self.layout.used_idx_addr(), &idx.to_le_bytes())
    }

    fn load(&self, what: &str, at: u64) -> Result<u16, String> {
        self.mem
            .load::<u16>(GuestAddress(at), Ordering::Acquire)
            .map(u16::from_le)
            .map_err(|e| format!("{what} at {at:#x}: {e}"))
    }

    /// Puts `head` in the avail entry `avail.idx` names and publishes it (`avail.idx` + 1).
    pub fn publish(&self, head: u16) -> Result<(), String> {
        let idx = self.avail_idx()?;
        self.set_avail_entry(idx % self.layout.size.max(1), head)?;
        self.set_avail_idx(idx.wrapping_add(1))
    }

    /// Writes `descs` at `head`, `head + 1`, ... (their `NEXT` flags and `next` fields as given)
    /// and publishes `head`.
    pub fn publish_chain(&self, head: u16, descs: &[Desc]) -> Result<(), String> {
        for (i, d) in descs.iter().enumerate() {
            let index = head.wrapping_add(u16::try_from(i).unwrap_or(u16::MAX));
            self.write_desc(index, *d)?;
        }
        self.publish(head)
    }
}
