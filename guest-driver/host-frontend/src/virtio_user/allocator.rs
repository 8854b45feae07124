//! A first-fit allocator of guest-physical address ranges: plain bookkeeping, no memory.
//!
//! Ranges are page-granular (every length is rounded up to [`PAGE`]); each allocation has an
//! alignment (a power of two, at least a page). Freed ranges merge with their free neighbours, so
//! a 2 MiB channel region freed after its destroy can be handed out again as one piece.

use std::collections::BTreeMap;

use thiserror::Error;

/// Allocation granule.
pub const PAGE: u64 = 4096;

/// Why an allocation or a free failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// No free range is large enough (at the requested alignment).
    #[error(
        "out of guest memory: no free range of {len:#x} bytes aligned to {align:#x} \
         ({free:#x} bytes free in all); create the guest with more memory"
    )]
    OutOfMemory {
        /// Bytes requested (after rounding up to a page).
        len: u64,
        /// Alignment requested.
        align: u64,
        /// Bytes free in all (possibly fragmented).
        free: u64,
    },
    /// A zero length, or an alignment that is not a power of two of at least a page.
    #[error("invalid allocation: length {len:#x}, alignment {align:#x} (alignment must be a power of two >= 4096)")]
    Invalid {
        /// Length requested.
        len: u64,
        /// Alignment requested.
        align: u64,
    },
    /// `free` of an address that does not start an allocation.
    #[error("free of {addr:#x}, which does not start an allocated range")]
    NotAllocated {
        /// The address passed to free.
        addr: u64,
    },
}

/// First-fit range allocator over `[0, size)`.
#[derive(Debug, Clone)]
pub struct RangeAllocator {
    /// Free ranges: start -> length. Never adjacent (merged on free), never empty.
    free: BTreeMap<u64, u64>,
    /// Allocated ranges: start -> length.
    used: BTreeMap<u64, u64>,
    size: u64,
}

impl RangeAllocator {
    /// An allocator of `[0, size)`, `size` rounded down to a page.
    pub fn new(size: u64) -> Self {
        let size = size - size % PAGE;
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        RangeAllocator {
            free,
            used: BTreeMap::new(),
            size,
        }
    }

    /// Total size managed.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes currently free (possibly fragmented).
    pub fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    /// Allocates `len` bytes (rounded up to a page) at an address aligned to `align`.
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<u64, AllocError> {
        if len == 0 || !align.is_power_of_two() || align < PAGE {
            return Err(AllocError::Invalid { len, align });
        }
        let oom = |free: u64| AllocError::OutOfMemory { len, align, free };
        let len = len
            .checked_next_multiple_of(PAGE)
            .ok_or_else(|| oom(self.free_bytes()))?;
        let mut found = None;
        for (&start, &flen) in &self.free {
            let Some(aligned) = start.checked_next_multiple_of(align) else {
                continue;
            };
            let end = start + flen;
            if aligned.checked_add(len).is_some_and(|e| e <= end) {
                found = Some((start, flen, aligned));
                break;
            }
        }
        let (start, flen, aligned) = found.ok_or_else(|| oom(self.free_bytes()))?;
        self.free.remove(&start);
        if aligned > start {
            self.free.insert(start, aligned - start);
        }
        let tail = start + flen - (aligned + len);
        if tail > 0 {
            self.free.insert(aligned + len, tail);
        }
        self.used.insert(aligned, len);
        Ok(aligned)
    }

    /// Length of the allocation starting at `addr`, if any.
    pub fn allocation_len(&self, addr: u64) -> Option<u64> {
        self.used.get(&addr).copied()
    }

    /// Frees the allocation starting at `addr`, merging it with free neighbours.
    pub fn free(&mut self, addr: u64) -> Result<u64, AllocError> {
        let len = self
            .used
            .remove(&addr)
            .ok_or(AllocError::NotAllocated { addr })?;
        let mut start = addr;
        let mut end = addr + len;
        if let Some((&pstart, &plen)) = self.free.range(..addr).next_back() {
            if pstart + plen == addr {
                self.free.remove(&pstart);
                start = pstart;
            }
        }
        if let Some(nlen) = self.free.remove(&end) {
            end += nlen;
        }
        self.free.insert(start, end - start);
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn allocations_are_aligned_page_rounded_and_disjoint() {
        let mut a = RangeAllocator::new(16 * MIB);
        let r1 = a.alloc(100, PAGE).unwrap();
        let r2 = a.alloc(5000, PAGE).unwrap();
        let big = a.alloc(2 * MIB, 2 * MIB).unwrap();
        assert_eq!(r1, 0);
        assert_eq!(r2, PAGE);
        assert_eq!(a.allocation_len(r2), Some(2 * PAGE));
        assert_eq!(big % (2 * MIB), 0);
        assert!(big >= 3 * PAGE);
        assert_eq!(a.free_bytes(), 16 * MIB - 3 * PAGE - 2 * MIB);
        // The gap before the aligned region is still usable.
        let r3 = a.alloc(PAGE, PAGE).unwrap();
        assert_eq!(r3, 3 * PAGE);
    }

    #[test]
    fn freed_ranges_merge_and_are_reused() {
        let mut a = RangeAllocator::new(8 * MIB);
        let x = a.alloc(2 * MIB, 2 * MIB).unwrap();
        let y = a.alloc(2 * MIB, 2 * MIB).unwrap();
        let z = a.alloc(2 * MIB, 2 * MIB).unwrap();
        a.free(y).unwrap();
        a.free(x).unwrap();
        a.free(z).unwrap();
        assert_eq!(a.free_bytes(), 8 * MIB);
        // One merged range again: a 8 MiB allocation fits.
        assert_eq!(a.alloc(8 * MIB, PAGE).unwrap(), 0);
    }

    #[test]
    fn exhaustion_bad_arguments_and_double_free_are_errors() {
        let mut a = RangeAllocator::new(4 * MIB);
        assert!(matches!(
            a.alloc(8 * MIB, PAGE),
            Err(AllocError::OutOfMemory { .. })
        ));
        assert!(matches!(a.alloc(0, PAGE), Err(AllocError::Invalid { .. })));
        assert!(matches!(a.alloc(10, 3000), Err(AllocError::Invalid { .. })));
        assert!(matches!(
            a.alloc(u64::MAX, PAGE),
            Err(AllocError::OutOfMemory { .. })
        ));
        let r = a.alloc(PAGE, PAGE).unwrap();
        a.free(r).unwrap();
        assert_eq!(a.free(r), Err(AllocError::NotAllocated { addr: r }));
        assert_eq!(a.free(12345), Err(AllocError::NotAllocated { addr: 12345 }));
        // Alignment larger than the space: nothing fits.
        let mut small = RangeAllocator::new(3 * MIB);
        small.alloc(PAGE, PAGE).unwrap();
        assert!(small.alloc(2 * MIB, 2 * MIB).is_err());
    }
}
