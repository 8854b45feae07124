//! Channel memory for the agent.
//!
//! - [`MemoryBackend`]: allocate one channel's memory (a descriptor an application can map),
//!   then, once the application mapped it, lock it down and say its guest-physical address.
//! - [`HugepageBackend`]: the real one. One 2 MiB hugepage per channel (`memfd_create` with
//!   `MFD_HUGETLB | MFD_HUGE_2MB`): physically contiguous, mapped and `mlock`ed by the agent,
//!   its address read from `/proc/self/pagemap` (root). Before the engine hears of it the memfd
//!   is sealed (`F_SEAL_SHRINK | F_SEAL_GROW`, and after the application mapped it
//!   `F_SEAL_FUTURE_WRITE | F_SEAL_SEAL`), so an application can neither truncate it nor punch a
//!   hole into it: the page cannot go back to the kernel while the engine uses it.
//! - [`MemfdBackend`]: channel regions carved out of a host-process "guest memory" memfd
//!   ([`MemfdMemory`]), for running the agent against an in-process engine on a host.
//!
//! A [`ChannelMemory`] is freed when it is dropped; the agent drops it only after the engine
//! acknowledged the channel's destruction (or refused to create it).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use log::warn;
use thiserror::Error;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use svnic_client::vm::mapping::{add_seals, memfd, seals, Mapping};
use svnic_host_frontend::virtio_user::{MemfdMemory, REGION_ALIGN};

/// A 2 MiB hugepage: the size of every channel region the agent allocates.
pub const HUGEPAGE: u64 = 2 << 20;
/// The small page size pagemap entries describe.
const PAGE: u64 = 4096;

/// Errors of channel memory.
#[derive(Debug, Error)]
pub enum MemoryError {
    /// Creating the memfd failed.
    #[error("memfd_create(MFD_HUGETLB) of {len} bytes: {source}")]
    Memfd {
        /// Bytes.
        len: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Mapping failed; with hugetlb, usually no free hugepage.
    #[error(
        "cannot map a {len}-byte hugepage: {source} (no free 2 MiB hugepage? see --hugepages)"
    )]
    Map {
        /// Bytes.
        len: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// mlock failed.
    #[error("mlock of the channel memory: {0}")]
    Lock(#[source] io::Error),
    /// Sealing failed.
    #[error("cannot seal the channel memory ({what}): {source}")]
    Seal {
        /// Which seals.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// /proc/self/pagemap could not be read or says the page is unusable.
    #[error("pagemap: {0}")]
    Pagemap(String),
    /// The region is not one physically contiguous, aligned block.
    #[error("channel memory at {first:#x} is not physically contiguous (last page at {last:#x})")]
    NotContiguous {
        /// Guest-physical address of the first 4 KiB page.
        first: u64,
        /// Guest-physical address of the last 4 KiB page.
        last: u64,
    },
    /// The host-process memory allocator refused.
    #[error("guest memory: {0}")]
    Guest(String),
}

/// One channel's memory: a descriptor an application maps (at `fd_offset`), and whatever keeps
/// it alive in the agent. Dropping it frees it.
pub struct ChannelMemory {
    fd: OwnedFd,
    fd_offset: u64,
    len: u64,
    mapping: Option<Mapping>,
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for ChannelMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelMemory")
            .field("fd_offset", &self.fd_offset)
            .field("len", &self.len)
            .finish()
    }
}

impl ChannelMemory {
    /// Memory behind `fd` at `fd_offset..+len`; `mapping` is the agent's own view (kept until
    /// the memory is freed); `release` runs when it is freed.
    pub fn new(
        fd: OwnedFd,
        fd_offset: u64,
        len: u64,
        mapping: Option<Mapping>,
        release: Option<Box<dyn FnOnce() + Send>>,
    ) -> Self {
        ChannelMemory {
            fd,
            fd_offset,
            len,
            mapping,
            release,
        }
    }

    /// The descriptor an application maps.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Where the region starts in the descriptor.
    pub fn fd_offset(&self) -> u64 {
        self.fd_offset
    }

    /// Length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The agent's own mapping, if it keeps one.
    pub fn mapping(&self) -> Option<&Mapping> {
        self.mapping.as_ref()
    }
}

impl Drop for ChannelMemory {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Where channel memory comes from.
pub trait MemoryBackend: Send {
    /// Length of every region.
    fn region_len(&self) -> u64;
    /// Allocates one channel's memory, ready to pass to an application.
    fn allocate(&mut self) -> Result<ChannelMemory, MemoryError>;
    /// Called once the application mapped the memory and before the engine hears of it: makes
    /// sure nobody can free it any more, and returns its guest-physical address.
    fn finalize(&mut self, mem: &ChannelMemory) -> Result<u64, MemoryError>;
    /// For logs.
    fn describe(&self) -> String;
}

/// Physical address of `vaddr` from its pagemap entry (Documentation/admin-guide/mm/pagemap.rst:
/// bit 63 present, bit 62 swapped, bits 0-54 the page frame number, which reads as 0 without
/// CAP_SYS_ADMIN).
pub fn pagemap_phys(entry: u64, vaddr: u64) -> Result<u64, MemoryError> {
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const PFN_MASK: u64 = (1 << 55) - 1;
    if entry & PRESENT == 0 {
        return Err(MemoryError::Pagemap(format!(
            "page at {vaddr:#x} is not present (entry {entry:#x})"
        )));
    }
    if entry & SWAPPED != 0 {
        return Err(MemoryError::Pagemap(format!(
            "page at {vaddr:#x} is swapped out"
        )));
    }
    let pfn = entry & PFN_MASK;
    if pfn == 0 {
        return Err(MemoryError::Pagemap(format!(
            "page frame number of {vaddr:#x} reads as 0: the agent must run as root \
             (CAP_SYS_ADMIN) to see physical addresses"
        )));
    }
    pfn.checked_mul(PAGE)
        .and_then(|p| p.checked_add(vaddr % PAGE))
        .ok_or_else(|| MemoryError::Pagemap(format!("page frame number {pfn:#x} overflows")))
}

/// Channel memory in 2 MiB hugepages, addressed by guest-physical address (see the module
/// documentation). Needs root: pagemap hides frame numbers from others.
#[derive(Debug)]
pub struct HugepageBackend {
    pagemap: File,
    allow_unsealed: bool,
}

impl HugepageBackend {
    /// Opens `/proc/self/pagemap`. With `allow_unsealed`, a kernel that cannot seal hugetlb
    /// memfds is tolerated (with a warning): an application could then free channel memory
    /// under the engine.
    pub fn new(allow_unsealed: bool) -> Result<Self, MemoryError> {
        let pagemap = File::open("/proc/self/pagemap")
            .map_err(|e| MemoryError::Pagemap(format!("open /proc/self/pagemap: {e}")))?;
        Ok(HugepageBackend {
            pagemap,
            allow_unsealed,
        })
    }

    fn phys(&self, vaddr: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.pagemap
            .read_exact_at(&mut b, (vaddr / PAGE) * 8)
            .map_err(|e| MemoryError::Pagemap(format!("read entry of {vaddr:#x}: {e}")))?;
        pagemap_phys(u64::from_le_bytes(b), vaddr)
    }

    fn seal(
        &self,
        fd: BorrowedFd<'_>,
        what: &'static str,
        s: libc::c_int,
    ) -> Result<(), MemoryError> {
        match add_seals(fd, s).and_then(|()| seals(fd)) {
            Ok(have) if have & s == s => Ok(()),
            Ok(_) => self.unsealed(what, io::Error::other("seals not set")),
            Err(e) => self.unsealed(what, e),
        }
    }

    fn unsealed(&self, what: &'static str, source: io::Error) -> Result<(), MemoryError> {
        if self.allow_unsealed {
            warn!("cannot seal channel memory ({what}: {source}); continuing (--allow-unsealed)");
            Ok(())
        } else {
            Err(MemoryError::Seal { what, source })
        }
    }
}

impl MemoryBackend for HugepageBackend {
    fn region_len(&self) -> u64 {
        HUGEPAGE
    }

    fn allocate(&mut self) -> Result<ChannelMemory, MemoryError> {
        let len = HUGEPAGE;
        let fd = memfd("svnic-channel", len, true)
            .map_err(|source| MemoryError::Memfd { len, source })?;
        let map = Mapping::map_shared(fd.as_fd(), 0, len as usize, true)
            .map_err(|source| MemoryError::Map { len, source })?;
        map.lock().map_err(MemoryError::Lock)?;
        self.seal(
            fd.as_fd(),
            "F_SEAL_SHRINK | F_SEAL_GROW",
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )?;
        Ok(ChannelMemory::new(fd, 0, len, Some(map), None))
    }

    fn finalize(&mut self, mem: &ChannelMemory) -> Result<u64, MemoryError> {
        // No new writable mappings and no hole punching from now on; the mappings that exist
        // (ours, the application's) keep working.
        self.seal(
            mem.fd(),
            "F_SEAL_FUTURE_WRITE | F_SEAL_SEAL",
            libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL,
        )?;
        let map = mem
            .mapping()
            .ok_or_else(|| MemoryError::Pagemap("no agent mapping to translate".into()))?;
        // Fault the page in (again, should the application have punched a hole before the
        // seal) and keep it locked, then translate its first and last 4 KiB page.
        map.touch(0);
        map.lock().map_err(MemoryError::Lock)?;
        let base = map.as_ptr() as u64;
        let first = self.phys(base)?;
        let last = self.phys(base + mem.len() - PAGE)?;
        if first % HUGEPAGE != 0 || last != first + mem.len() - PAGE {
            return Err(MemoryError::NotContiguous { first, last });
        }
        Ok(first)
    }

    fn describe(&self) -> String {
        "2 MiB hugepages (memfd, sealed, mlocked; addresses from /proc/self/pagemap)".into()
    }
}

/// Channel regions inside a host-process guest memory (one memfd at guest-physical 0): the
/// descriptor handed to applications is the whole memory, with the region's address as offset.
/// For host tests and in-process engines; it neither seals nor locks anything.
#[derive(Debug)]
pub struct MemfdBackend {
    memory: Arc<MemfdMemory>,
    file: File,
}

impl MemfdBackend {
    /// Regions of `memory`.
    pub fn new(memory: Arc<MemfdMemory>) -> Result<Self, MemoryError> {
        let mem = memory.guest_memory();
        let file = mem
            .find_region(GuestAddress(0))
            .and_then(|r| r.file_offset())
            .ok_or_else(|| MemoryError::Guest("the guest memory has no file at 0".into()))?
            .file()
            .try_clone()
            .map_err(|e| MemoryError::Guest(format!("dup of the guest memory fd: {e}")))?;
        Ok(MemfdBackend { memory, file })
    }
}

impl MemoryBackend for MemfdBackend {
    fn region_len(&self) -> u64 {
        HUGEPAGE
    }

    fn allocate(&mut self) -> Result<ChannelMemory, MemoryError> {
        let gpa = self
            .memory
            .alloc(HUGEPAGE, REGION_ALIGN)
            .map_err(|e| MemoryError::Guest(e.to_string()))?;
        let release = {
            let memory = self.memory.clone();
            Box::new(move || {
                if let Err(e) = memory.free_region(gpa) {
                    warn!("guest memory region {gpa:#x}: cannot free: {e}");
                }
            })
        };
        let fd = match self.file.try_clone() {
            Ok(f) => OwnedFd::from(f),
            Err(e) => {
                release();
                return Err(MemoryError::Guest(format!(
                    "dup of the guest memory fd: {e}"
                )));
            }
        };
        Ok(ChannelMemory::new(fd, gpa, HUGEPAGE, None, Some(release)))
    }

    fn finalize(&mut self, mem: &ChannelMemory) -> Result<u64, MemoryError> {
        Ok(mem.fd_offset())
    }

    fn describe(&self) -> String {
        format!(
            "regions of a {} MiB host-process guest memory",
            self.memory.size() >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn pagemap_entries_translate_or_say_why_not() {
        let present = 1u64 << 63;
        assert_eq!(
            pagemap_phys(present | 0x1bfe00, 0x7f00_0000_0123).unwrap(),
            0x1bfe00 * 4096 + 0x123
        );
        for (entry, why) in [
            (0x1bfe00, "not present"),
            (present | (1 << 62) | 5, "swapped"),
            (present, "root"),
        ] {
            let e = pagemap_phys(entry, 0x1000).unwrap_err().to_string();
            assert!(e.contains(why), "{entry:#x}: {e}");
        }
        // Flag bits 55..62 are not part of the frame number.
        assert_eq!(
            pagemap_phys(present | (1 << 56) | (1 << 61) | 2, 0).unwrap(),
            2 * 4096
        );
    }

    #[test]
    fn memfd_regions_are_freed_when_dropped() {
        let memory = Arc::new(MemfdMemory::new(16 << 20).unwrap());
        let mut b = MemfdBackend::new(memory.clone()).unwrap();
        let free = memory.free_bytes();
        let m = b.allocate().unwrap();
        assert_eq!(m.len(), HUGEPAGE);
        assert_eq!(m.fd_offset() % REGION_ALIGN, 0);
        assert_eq!(b.finalize(&m).unwrap(), m.fd_offset());
        assert_eq!(memory.free_bytes(), free - HUGEPAGE);
        drop(m);
        assert_eq!(memory.free_bytes(), free);
    }

    /// Needs root and a free 2 MiB hugepage (e.g. `echo 4 > /proc/sys/vm/nr_hugepages`);
    /// skipped otherwise.
    #[test]
    fn a_hugepage_is_sealed_locked_and_translated() {
        let free =
            std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
        // SAFETY: geteuid has no preconditions.
        if free == 0 || unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root and a free 2 MiB hugepage");
            return;
        }
        let mut b = HugepageBackend::new(false).unwrap();
        let m = b.allocate().unwrap();
        let app = Mapping::map_shared(m.fd(), 0, HUGEPAGE as usize, false).unwrap();
        let gpa = b.finalize(&m).unwrap();
        assert_eq!(gpa % HUGEPAGE, 0);
        assert!(gpa > 0);
        // Sealed: no new writable mapping, no truncation.
        assert!(Mapping::map_shared(m.fd(), 0, HUGEPAGE as usize, false).is_err());
        let s = seals(m.fd()).unwrap();
        assert_eq!(
            s & (libc::F_SEAL_SHRINK | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL),
            libc::F_SEAL_SHRINK | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL
        );
        // The application's mapping and the agent's see the same bytes.
        let region = app.into_region();
        use vm_memory::Bytes;
        region.slice().write_obj(0x5a_u8, 12345).unwrap();
        assert_eq!(m.mapping().unwrap().touch(12345), Some(0x5a));
    }
}
