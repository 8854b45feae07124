//! Which file pages back a guest-physical range, so that a changed memory table can be told apart
//! from a re-sent one.
//!
//! vhost-user frontends re-send the memory table (new fds) for reasons that do not move guest
//! memory. A channel's old mapping stays coherent with the guest if, and only if, the new table
//! maps its range to the same file at the same offset (MAP_SHARED mappings of one file share
//! pages). Anonymous memory (no file) can never be proven the same.

use std::os::unix::fs::MetadataExt;

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// The file pages behind the start of a range: device, inode, and file offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backing {
    dev: u64,
    ino: u64,
    offset: u64,
}

/// The backing of `addr` in `mem`, or None for anonymous memory or an unmapped address.
pub(crate) fn backing_of(mem: &GuestMemoryMmap, addr: u64) -> Option<Backing> {
    let region = mem.find_region(GuestAddress(addr))?;
    let fo = region.file_offset()?;
    let meta = fo.file().metadata().ok()?;
    let within = addr.checked_sub(region.start_addr().0)?;
    Some(Backing {
        dev: meta.dev(),
        ino: meta.ino(),
        offset: fo.start().checked_add(within)?,
    })
}
