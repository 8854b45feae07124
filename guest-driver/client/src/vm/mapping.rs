//! [`Mapping`]: a shared memory mapping of a file descriptor that is unmapped when dropped, and
//! [`memfd`], which creates the memory behind channel regions.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use svnic_channels::SharedRegion;

/// `MFD_HUGE_2MB`: the 2 MiB page size, encoded in memfd_create's flags (log2(2 MiB) << 26).
pub const MFD_HUGE_2MB: libc::c_uint = 21 << 26;

/// A `MAP_SHARED` read-write mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory that this crate accesses only through volatile or
// atomic operations (SharedRegion / VolatileSlice); the raw pointer is owned by the Mapping and
// unmapped only in Drop, so moving the owner to another thread is sound.
unsafe impl Send for Mapping {}
// SAFETY: see Send; &Mapping only exposes the address and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` at `offset`, shared and read-write. `populate` faults every page
    /// in at once (`MAP_POPULATE`).
    pub fn map_shared(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        populate: bool,
    ) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot map 0 bytes",
            ));
        }
        let off = libc::off_t::try_from(offset).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("mapping offset {offset:#x} out of range"),
            )
        })?;
        let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a new mapping chosen by the kernel (null hint), of a descriptor we borrow for
        // the call; it aliases no Rust object. Failure is MAP_FAILED, checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd.as_raw_fd(),
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// Start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a mapping has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Locks the pages in memory (`mlock`): they are faulted in and never swapped.
    pub fn lock(&self) -> io::Result<()> {
        // SAFETY: mlock on a range this Mapping owns; it changes no memory contents.
        if unsafe { libc::mlock(self.ptr.cast(), self.len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads the byte at `offset` (volatile), which faults its page in if it is not present.
    pub fn touch(&self, offset: usize) -> Option<u8> {
        if offset >= self.len {
            return None;
        }
        // SAFETY: offset < len, so the address lies inside this live mapping; a volatile read
        // of shared memory is the sanctioned way to access it.
        Some(unsafe { self.ptr.wrapping_add(offset).read_volatile() })
    }

    /// A [`SharedRegion`] over the whole mapping, which keeps the mapping alive.
    pub fn into_region(self) -> SharedRegion {
        let (ptr, len) = (self.ptr, self.len);
        let keep: std::sync::Arc<dyn std::any::Any + Send + Sync> = std::sync::Arc::new(self);
        // SAFETY: ptr..ptr+len is this mapping, readable and writable, and stays mapped while
        // `keep` (which owns it) lives; the region's users access it only through volatile or
        // atomic operations.
        unsafe { SharedRegion::new(ptr, len, keep) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing refers to the range after the
        // Mapping is gone (SharedRegions keep the Mapping alive through their Arc).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Creates a memfd of `len` bytes named `name` (close-on-exec, sealing allowed); backed by
/// 2 MiB hugepages when `huge`.
pub fn memfd(name: &str, len: u64, huge: bool) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd name contains NUL"))?;
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if huge {
        flags |= libc::MFD_HUGETLB | MFD_HUGE_2MB;
    }
    // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd length out of range"))?;
    // SAFETY: ftruncate on a descriptor we own, integer length.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Adds `seals` (`F_SEAL_*`) to a memfd.
pub fn add_seals(fd: BorrowedFd<'_>, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: fcntl F_ADD_SEALS on a borrowed descriptor with an integer argument.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The seals of a memfd.
pub fn seals(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: fcntl F_GET_SEALS on a borrowed descriptor.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::fd::AsFd;
    use vm_memory::Bytes;

    #[test]
    fn two_mappings_of_one_memfd_share_bytes() {
        let fd = memfd("t", 8192, false).unwrap();
        let a = Mapping::map_shared(fd.as_fd(), 0, 8192, true).unwrap();
        let b = Mapping::map_shared(fd.as_fd(), 4096, 4096, false).unwrap();
        a.lock().unwrap();
        let ra = a.into_region();
        ra.slice().write_obj(0xabcd_u32, 4096 + 8).unwrap();
        assert_eq!(b.touch(8), Some(0xcd));
        assert_eq!(b.touch(4096), None);
        assert!(Mapping::map_shared(fd.as_fd(), 0, 0, false).is_err());
        assert!(Mapping::map_shared(fd.as_fd(), u64::MAX, 4096, false).is_err());
    }

    #[test]
    fn seals_stop_truncation_and_hole_punching() {
        let fd = memfd("t", 8192, false).unwrap();
        let m = Mapping::map_shared(fd.as_fd(), 0, 8192, true).unwrap();
        add_seals(
            fd.as_fd(),
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL,
        )
        .unwrap();
        assert_ne!(seals(fd.as_fd()).unwrap() & libc::F_SEAL_FUTURE_WRITE, 0);
        // SAFETY: ftruncate/fallocate on a descriptor we own.
        assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) }, 0);
        // SAFETY: as above.
        let punched = unsafe {
            libc::fallocate(
                fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                8192,
            )
        };
        assert_ne!(punched, 0);
        assert!(Mapping::map_shared(fd.as_fd(), 0, 8192, false).is_err());
        // The existing mapping keeps working.
        let r = m.into_region();
        r.slice().write_obj(7u8, 0).unwrap();
        assert_eq!(r.slice().read_obj::<u8>(0).unwrap(), 7);
    }
}
