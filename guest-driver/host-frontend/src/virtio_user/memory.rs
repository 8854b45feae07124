//! [`MemfdMemory`]: the "guest memory" of a host-process guest — one memfd, mapped shared, that
//! the backend maps too (its fd goes to the backend in the vhost-user memory table) — and the
//! allocator that hands out ring areas, packet buffers and channel regions inside it.
//!
//! Guest-physical addresses start at 0 and run to the memory size; the backend sees the same
//! bytes at the same guest-physical addresses. Every allocation starts zeroed: the memfd is zero
//! when created, and a freed range is zeroed (its pages returned to the kernel with
//! `FALLOC_FL_PUNCH_HOLE`) before it can be handed out again.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use svnic_channels::SharedRegion;
use thiserror::Error;
use vhost::VhostUserMemoryRegionInfo;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};

use super::allocator::{AllocError, RangeAllocator, PAGE};

/// Default size of a host-process guest's memory: 256 MiB.
pub const DEFAULT_MEMORY_SIZE: u64 = 256 << 20;
/// Alignment of channel regions: 2 MiB, like a hugepage-backed region in a VM guest.
pub const REGION_ALIGN: u64 = 2 << 20;
/// Smallest memory accepted (rings and buffers of two queues need about 1.5 MiB).
pub const MIN_MEMORY_SIZE: u64 = 4 << 20;

/// Whether the memfd may still change size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sealing {
    /// Sealed against shrinking, growing and further seals (`F_SEAL_SHRINK | F_SEAL_GROW |
    /// F_SEAL_SEAL`), as QEMU's memory-backend-memfd seals it by default: neither side can
    /// change the size under the other's mapping. What a guest uses.
    Sealed,
    /// No seals: whoever holds the fd can truncate it, and every mapping then faults (SIGBUS)
    /// past the new end, this process's included. Only for tests of a backend facing such a
    /// frontend.
    Unsealed,
}

/// Errors of the guest memory.
#[derive(Debug, Error)]
pub enum MemoryError {
    /// The size is not a multiple of 4 KiB, or out of range.
    #[error("guest memory size {size:#x} invalid: must be a multiple of 4096 between {min:#x} and {max:#x}")]
    BadSize {
        /// Size requested.
        size: u64,
        /// Smallest size.
        min: u64,
        /// Largest size.
        max: u64,
    },
    /// memfd_create, ftruncate or sealing failed.
    #[error("cannot create the guest memory memfd ({step}): {source}")]
    Memfd {
        /// Which call failed.
        step: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Mapping the memfd failed.
    #[error("cannot map the guest memory memfd: {0}")]
    Map(#[source] vm_memory::mmap::FromRangesError),
    /// The allocator refused.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// A range that should lie inside the memory does not (a bug, reported rather than panicking).
    #[error("guest memory range {addr:#x}+{len:#x} is not accessible: {why}")]
    Access {
        /// Start.
        addr: u64,
        /// Length.
        len: u64,
        /// What vm-memory said.
        why: String,
    },
}

/// A host-process guest's memory: one shared memfd mapping at guest-physical 0, plus its allocator.
///
/// Cheap to share (`Arc<MemfdMemory>`); the allocator is behind a mutex.
#[derive(Debug)]
pub struct MemfdMemory {
    mem: Arc<GuestMemoryMmap>,
    file: Arc<File>,
    size: u64,
    alloc: Mutex<RangeAllocator>,
}

fn os_err(step: &'static str) -> MemoryError {
    MemoryError::Memfd {
        step,
        source: std::io::Error::last_os_error(),
    }
}

impl MemfdMemory {
    /// Creates a memfd of `size` bytes (a multiple of 4 KiB, at least [`MIN_MEMORY_SIZE`]),
    /// seals its size, and maps it shared at guest-physical address 0.
    pub fn new(size: u64) -> Result<Self, MemoryError> {
        Self::with_sealing(size, Sealing::Sealed)
    }

    /// [`MemfdMemory::new`] with the seals chosen by `sealing`.
    pub fn with_sealing(size: u64, sealing: Sealing) -> Result<Self, MemoryError> {
        let max = isize::MAX as u64;
        if size % PAGE != 0 || !(MIN_MEMORY_SIZE..=max).contains(&size) {
            return Err(MemoryError::BadSize {
                size,
                min: MIN_MEMORY_SIZE,
                max,
            });
        }
        let file = create_memfd(size, sealing)?;
        let file = Arc::new(file);
        let ranges = [(
            GuestAddress(0),
            size as usize,
            Some(FileOffset::from_arc(file.clone(), 0)),
        )];
        let mem = GuestMemoryMmap::from_ranges_with_files(ranges).map_err(MemoryError::Map)?;
        Ok(MemfdMemory {
            mem: Arc::new(mem),
            file,
            size,
            alloc: Mutex::new(RangeAllocator::new(size)),
        })
    }

    /// The vm-memory view of the whole memory (guest-physical addresses from 0).
    pub fn guest_memory(&self) -> &Arc<GuestMemoryMmap> {
        &self.mem
    }

    /// The memfd (what the memory table sends). With [`Sealing::Unsealed`] a `set_len` on it
    /// makes every access past the new end fault, in this process too.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes not allocated.
    pub fn free_bytes(&self) -> u64 {
        self.allocator().free_bytes()
    }

    fn allocator(&self) -> MutexGuard<'_, RangeAllocator> {
        self.alloc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `len` bytes (rounded up to 4 KiB) aligned to `align` (a power of two >= 4 KiB).
    /// The range is zeroed. Returns its guest-physical address.
    pub fn alloc(&self, len: u64, align: u64) -> Result<u64, MemoryError> {
        Ok(self.allocator().alloc(len, align)?)
    }

    /// Frees a range returned by [`MemfdMemory::alloc`]; it is zeroed before it can be reused.
    ///
    /// Only free what the backend no longer uses: a ring after the device stopped, a channel
    /// region after the engine acknowledged its destroy.
    pub fn free(&self, gpa: u64) -> Result<(), MemoryError> {
        let mut alloc = self.allocator();
        let len = alloc
            .allocation_len(gpa)
            .ok_or(AllocError::NotAllocated { addr: gpa })?;
        // Zero before the range becomes allocatable again (under the lock, so nobody gets it
        // half-zeroed).
        self.zero(gpa, len)?;
        alloc.free(gpa)?;
        Ok(())
    }

    /// Allocates a channel region of `len` bytes, 2 MiB aligned and zeroed, and returns its
    /// guest-physical address with a [`SharedRegion`] on it (which keeps the mapping alive).
    ///
    /// Free it with [`MemfdMemory::free_region`] only after the engine acknowledged the
    /// channel's destroy (the control client does that); until then the engine may write it.
    pub fn alloc_region(&self, len: u64) -> Result<(u64, SharedRegion), MemoryError> {
        let gpa = self.alloc(len, REGION_ALIGN)?;
        match SharedRegion::from_guest_memory(self.mem.clone(), gpa, len) {
            Ok(region) => Ok((gpa, region)),
            Err(e) => {
                let _ = self.allocator().free(gpa);
                Err(MemoryError::Access {
                    addr: gpa,
                    len,
                    why: e.to_string(),
                })
            }
        }
    }

    /// Frees a channel region returned by [`MemfdMemory::alloc_region`] (see there for when).
    pub fn free_region(&self, gpa: u64) -> Result<(), MemoryError> {
        self.free(gpa)
    }

    /// Zeroes `gpa..gpa+len`: punches a hole in the memfd (the pages go back to the kernel and
    /// read as zeros in every mapping), or writes zeros if that is not supported.
    fn zero(&self, gpa: u64, len: u64) -> Result<(), MemoryError> {
        let (Ok(off), Ok(ilen)) = (i64::try_from(gpa), i64::try_from(len)) else {
            return Err(MemoryError::Access {
                addr: gpa,
                len,
                why: "offset out of range".into(),
            });
        };
        // SAFETY: fallocate on a file descriptor we own; it touches no memory of this process
        // directly (the mapping reads zeros afterwards), and all arguments are plain integers.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                ilen,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let zeros = [0u8; 4096];
        let mut at = gpa;
        while at < gpa + len {
            let n = (gpa + len - at).min(zeros.len() as u64) as usize;
            self.mem
                .write_slice(&zeros[..n], GuestAddress(at))
                .map_err(|e| MemoryError::Access {
                    addr: at,
                    len: n as u64,
                    why: e.to_string(),
                })?;
            at += n as u64;
        }
        Ok(())
    }

    /// The memory table entry the backend needs (fd, guest-physical base, size, and this
    /// process's mapping address, which is what vring addresses are expressed in).
    pub fn vhost_region(&self) -> Result<VhostUserMemoryRegionInfo, MemoryError> {
        let region = self
            .mem
            .find_region(GuestAddress(0))
            .ok_or(MemoryError::Access {
                addr: 0,
                len: self.size,
                why: "no memory region at 0".into(),
            })?;
        VhostUserMemoryRegionInfo::from_guest_region(region).map_err(|e| MemoryError::Access {
            addr: 0,
            len: region.len(),
            why: e.to_string(),
        })
    }

    /// This process's address of guest-physical `gpa` (what vhost-user vring addresses are).
    pub fn host_address(&self, gpa: u64) -> Result<u64, MemoryError> {
        self.mem
            .get_host_address(GuestAddress(gpa))
            .map(|p| p as u64)
            .map_err(|e| MemoryError::Access {
                addr: gpa,
                len: 0,
                why: e.to_string(),
            })
    }
}

fn create_memfd(size: u64, sealing: Sealing) -> Result<File, MemoryError> {
    let name = c"svnic-guest-memory";
    // SAFETY: memfd_create reads the NUL-terminated name (a valid C string literal) and returns
    // a new file descriptor or -1; it has no other memory effects.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(os_err("memfd_create"));
    }
    // SAFETY: fd is a freshly created descriptor that nothing else owns; File takes ownership
    // and closes it on drop.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size).map_err(|source| MemoryError::Memfd {
        step: "ftruncate",
        source,
    })?;
    if sealing == Sealing::Unsealed {
        return Ok(file);
    }
    // Neither side may change the size under the other's mapping (a shrink would make the
    // backend's accesses fault with SIGBUS).
    // SAFETY: fcntl F_ADD_SEALS on a descriptor we own, with an integer argument.
    let rc = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    };
    if rc < 0 {
        return Err(os_err("F_ADD_SEALS"));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::fd::AsRawFd;
    use vm_memory::GuestMemoryRegion;

    const MIB: u64 = 1 << 20;

    #[test]
    fn memory_is_a_shared_memfd_at_zero() {
        let m = MemfdMemory::new(8 * MIB).unwrap();
        let info = m.vhost_region().unwrap();
        assert_eq!(info.guest_phys_addr, 0);
        assert_eq!(info.memory_size, 8 * MIB);
        assert_eq!(info.mmap_offset, 0);
        assert!(info.mmap_handle >= 0);
        assert_eq!(info.userspace_addr, m.host_address(0).unwrap());
        // The fd is the memfd: writes through the mapping are visible through the file.
        m.guest_memory()
            .write_obj(0x1234_5678_u32, GuestAddress(4096))
            .unwrap();
        let mut buf = [0u8; 4];
        // SAFETY: pread into a 4-byte buffer we own, from a valid fd.
        let n = unsafe { libc::pread(info.mmap_handle, buf.as_mut_ptr().cast(), 4, 4096) };
        assert_eq!(n, 4);
        assert_eq!(u32::from_le_bytes(buf), 0x1234_5678);
        let region = m.guest_memory().find_region(GuestAddress(0)).unwrap();
        assert_eq!(
            region.file_offset().unwrap().file().as_raw_fd(),
            info.mmap_handle
        );
    }

    #[test]
    fn the_memfd_is_sealed_against_resizing() {
        // The backend maps this file: a shrink would fault its accesses (SIGBUS).
        let m = MemfdMemory::new(8 * MIB).unwrap();
        let fd = m.vhost_region().unwrap().mmap_handle;
        // SAFETY: fcntl(F_GET_SEALS) on the memory's own descriptor.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        let wanted = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        assert_eq!(seals & wanted, wanted, "seals {seals:#x}");
        // SAFETY: ftruncate on the memory's own descriptor; the seal makes it fail.
        assert_ne!(unsafe { libc::ftruncate(fd, 0) }, 0);
        assert_eq!(m.size(), 8 * MIB);
    }

    #[test]
    fn unsealed_memory_can_be_resized_through_its_file() {
        let m = MemfdMemory::with_sealing(8 * MIB, Sealing::Unsealed).unwrap();
        let fd = m.file().as_raw_fd();
        assert_eq!(fd, m.vhost_region().unwrap().mmap_handle);
        // SAFETY: fcntl(F_GET_SEALS) on the memory's own descriptor.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        assert_eq!(seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW), 0);
        // Growing keeps every mapped byte valid (shrinking would fault this test's accesses).
        m.file().set_len(16 * MIB).unwrap();
        assert_eq!(m.file().metadata().unwrap().len(), 16 * MIB);
    }

    #[test]
    fn bad_sizes_are_refused() {
        for size in [0, MIN_MEMORY_SIZE - PAGE, 8 * MIB + 1, u64::MAX] {
            assert!(matches!(
                MemfdMemory::new(size),
                Err(MemoryError::BadSize { .. })
            ));
        }
    }

    #[test]
    fn regions_are_2mib_aligned_and_zeroed_on_reuse() {
        let m = MemfdMemory::new(8 * MIB).unwrap();
        let ring = m.alloc(8192, PAGE).unwrap();
        let (gpa, region) = m.alloc_region(2 * MIB).unwrap();
        assert_eq!(gpa % REGION_ALIGN, 0);
        assert!(gpa >= ring + 8192);
        assert_eq!(region.len(), 2 * MIB as usize);
        region.slice().write_obj(0xdead_beef_u32, 100).unwrap();
        assert_eq!(
            m.guest_memory()
                .read_obj::<u32>(GuestAddress(gpa + 100))
                .unwrap(),
            0xdead_beef
        );
        m.free_region(gpa).unwrap();
        let (again, region2) = m.alloc_region(2 * MIB).unwrap();
        assert_eq!(again, gpa);
        assert_eq!(region2.slice().read_obj::<u32>(100).unwrap(), 0);
        assert!(m.free_region(gpa + 4096).is_err());
        // 8 MiB memory: the first 2 MiB hold the ring, so two more regions fit, then none.
        m.alloc_region(2 * MIB).unwrap();
        m.alloc_region(2 * MIB).unwrap();
        assert!(matches!(
            m.alloc_region(2 * MIB),
            Err(MemoryError::Alloc(AllocError::OutOfMemory { .. }))
        ));
    }
}
