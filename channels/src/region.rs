//! [`SharedRegion`]: an owned handle on a range of shared memory (a channel region, or a guest's
//! data), which keeps the mapping alive and hands out bounds-checked [`VolatileSlice`]s.
//!
//! `VolatileSlice` borrows the mapping it points into and is not `Send`; engine workers and client
//! threads need something they can own and move. A `SharedRegion` pairs the raw range with a
//! keep-alive handle (for the engine: the `Arc` of the guest memory snapshot that contains it), so
//! the range cannot be unmapped while any clone of the region exists.

use std::any::Any;
use std::sync::Arc;

use thiserror::Error;
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, VolatileSlice,
};

use crate::error::LayoutError;
use crate::layout::ChannelLayout;
use crate::ring::ChannelMem;

/// Why a guest-physical range cannot be turned into a region.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RegionError {
    /// Some part of the range is not guest memory.
    #[error("range {addr:#x}+{len:#x} is not inside guest memory")]
    OutsideMemory {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// The range starts in one memory-table region and ends in another.
    #[error("range {addr:#x}+{len:#x} straddles two guest memory regions")]
    Straddles {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
    },
}

/// An owned, `Send + Sync` handle on `len` bytes of shared memory.
#[derive(Clone)]
pub struct SharedRegion {
    ptr: *mut u8,
    len: usize,
    _keep: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedRegion({:p}, {} bytes)", self.ptr, self.len)
    }
}

// SAFETY: the region is plain shared memory accessed only through volatile/atomic operations of
// VolatileSlice (never through references), and the keep-alive handle is Send + Sync, so the
// handle may move to and be shared between threads.
unsafe impl Send for SharedRegion {}
// SAFETY: see the Send impl: all access is volatile/atomic, so concurrent use is sound.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Wraps a raw range.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be mapped readable and writable for as long as `keep` (or any clone of
    /// the returned region) is alive, and must only ever be accessed through volatile or atomic
    /// operations by anyone (it is shared with another party).
    pub unsafe fn new(ptr: *mut u8, len: usize, keep: Arc<dyn Any + Send + Sync>) -> Self {
        SharedRegion {
            ptr,
            len,
            _keep: keep,
        }
    }

    /// The range `addr..addr+len` of a guest's memory, which must lie inside one memory-table
    /// region. The region keeps `mem` (and so the mapping) alive.
    pub fn from_guest_memory(
        mem: Arc<GuestMemoryMmap>,
        addr: u64,
        len: u64,
    ) -> Result<Self, RegionError> {
        let outside = RegionError::OutsideMemory { addr, len };
        let last = addr
            .checked_add(len.checked_sub(1).ok_or(outside.clone())?)
            .ok_or(outside.clone())?;
        let first_region = mem.find_region(GuestAddress(addr)).ok_or(outside.clone())?;
        let last_region = mem.find_region(GuestAddress(last)).ok_or(outside.clone())?;
        if first_region.start_addr() != last_region.start_addr() {
            return Err(RegionError::Straddles { addr, len });
        }
        // A hole between two regions would also have a different last region; the same region
        // contains the whole range.
        let ulen = usize::try_from(len).map_err(|_| outside.clone())?;
        let ptr = {
            let slice = mem
                .get_slice(GuestAddress(addr), ulen)
                .map_err(|_| outside.clone())?;
            debug_assert_eq!(slice.len(), ulen);
            slice.ptr_guard_mut().as_ptr()
        };
        // SAFETY: get_slice checked that addr..addr+len lies inside one mapped region of `mem`;
        // the mapping lives as long as `mem`, which the region keeps alive. Guest memory is only
        // accessed through VolatileSlice by this crate's users.
        Ok(unsafe { Self::new(ptr, ulen, mem) })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A bounds-checked view of the whole region.
    pub fn slice(&self) -> VolatileSlice<'_> {
        // SAFETY: by the constructor's contract, ptr..ptr+len stays mapped while self (holding the
        // keep-alive) exists, and the returned slice borrows self.
        unsafe { VolatileSlice::new(self.ptr, self.len) }
    }

    /// A channel view of the region with `layout` (engine side, or a client that knows the layout).
    pub fn channel(&self, layout: ChannelLayout) -> Result<ChannelMem<'_>, LayoutError> {
        ChannelMem::new(self.slice(), layout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    fn two_regions() -> Arc<GuestMemoryMmap> {
        // 0..1 MiB and 1..2 MiB: adjacent but separate memory-table regions; a hole after 2 MiB.
        Arc::new(
            GuestMemoryMmap::from_ranges(&[
                (GuestAddress(0), 1 << 20),
                (GuestAddress(1 << 20), 1 << 20),
            ])
            .unwrap(),
        )
    }

    #[test]
    fn a_range_inside_one_region_maps_to_the_same_bytes() {
        let mem = two_regions();
        mem.write_obj(0xabcd_u32, GuestAddress(0x1000 + 8)).unwrap();
        let r = SharedRegion::from_guest_memory(mem.clone(), 0x1000, 0x2000).unwrap();
        assert_eq!(r.len(), 0x2000);
        assert_eq!(r.slice().read_obj::<u32>(8).unwrap(), 0xabcd);
    }

    #[test]
    fn outside_and_straddling_ranges_are_refused() {
        let mem = two_regions();
        assert!(matches!(
            SharedRegion::from_guest_memory(mem.clone(), (1 << 20) - 4096, 8192),
            Err(RegionError::Straddles { .. })
        ));
        assert!(matches!(
            SharedRegion::from_guest_memory(mem.clone(), (2 << 20) - 4096, 8192),
            Err(RegionError::OutsideMemory { .. })
        ));
        assert!(matches!(
            SharedRegion::from_guest_memory(mem.clone(), 16 << 20, 4096),
            Err(RegionError::OutsideMemory { .. })
        ));
        assert!(SharedRegion::from_guest_memory(mem.clone(), u64::MAX - 10, 4096).is_err());
        assert!(SharedRegion::from_guest_memory(mem, 0, 0).is_err());
    }
}
