//! Checks on a guest memory table received from a vhost-user frontend.
//!
//! vhost-user-backend maps each region of `SET_MEM_TABLE` with `mmap(MAP_SHARED | MAP_NORESERVE)`
//! of the file descriptor the frontend sent. `mmap` does not compare the requested size with the
//! file's: a region larger than its file maps fine, and the first access past the end of the file
//! raises SIGBUS, which kills the whole daemon (every guest). So before anything touches a new
//! table, every region must be backed by a regular file (memfd, hugetlbfs, tmpfs) at least as long
//! as `mmap_offset + memory_size`.
//!
//! Residual risk: a frontend can still shrink the file afterwards. QEMU's memory-backend-memfd
//! seals its memfd against shrinking by default (`seal=on`); other backends are trusted here.

use std::io;

use thiserror::Error;
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Why a memory table cannot be used.
#[derive(Debug, Error)]
pub enum MemoryTableError {
    /// The table has no region.
    #[error("the memory table has no region")]
    Empty,
    /// A region is not backed by a file descriptor.
    #[error("region at {gpa:#x} is not backed by a file")]
    NotFileBacked {
        /// Guest-physical start of the region.
        gpa: u64,
    },
    /// The region's file cannot be examined.
    #[error("region at {gpa:#x}: cannot stat its file: {source}")]
    Stat {
        /// Guest-physical start of the region.
        gpa: u64,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The region's file is not a regular file (a device, a pipe, a socket...).
    #[error("region at {gpa:#x} is backed by something that is not a regular file")]
    NotRegularFile {
        /// Guest-physical start of the region.
        gpa: u64,
    },
    /// The region extends past the end of its file: touching it would raise SIGBUS.
    #[error(
        "region at {gpa:#x} maps {size:#x} bytes at file offset {offset:#x}, \
         but the file has only {file_len:#x} bytes"
    )]
    BeyondFile {
        /// Guest-physical start of the region.
        gpa: u64,
        /// Its size.
        size: u64,
        /// Its offset in the file.
        offset: u64,
        /// The file's length.
        file_len: u64,
    },
}

/// Checks every region of `mem` against its backing file.
pub fn validate_memory_table(mem: &GuestMemoryMmap) -> Result<(), MemoryTableError> {
    if mem.num_regions() == 0 {
        return Err(MemoryTableError::Empty);
    }
    for region in mem.iter() {
        let gpa = region.start_addr().raw_value();
        let size = region.len();
        let file_offset = region
            .file_offset()
            .ok_or(MemoryTableError::NotFileBacked { gpa })?;
        let meta = file_offset
            .file()
            .metadata()
            .map_err(|source| MemoryTableError::Stat { gpa, source })?;
        if !meta.file_type().is_file() {
            return Err(MemoryTableError::NotRegularFile { gpa });
        }
        let offset = file_offset.start();
        let beyond = MemoryTableError::BeyondFile {
            gpa,
            size,
            offset,
            file_len: meta.len(),
        };
        match offset.checked_add(size) {
            Some(end) if end <= meta.len() => {}
            _ => return Err(beyond),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use vm_memory::{FileOffset, GuestAddress};
    use vmm_sys_util::tempfile::TempFile;

    use super::*;

    fn file_of(len: u64) -> File {
        let f = TempFile::new().unwrap().into_file();
        f.set_len(len).unwrap();
        f
    }

    fn mapped(file: File, offset: u64, size: usize) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges_with_files(&[(
            GuestAddress(0x10_0000),
            size,
            Some(FileOffset::new(file, offset)),
        )])
        .unwrap()
    }

    #[test]
    fn a_region_inside_its_file_is_accepted() {
        let mem = mapped(file_of(0x20_0000), 0x10_0000, 0x10_0000);
        validate_memory_table(&mem).unwrap();
    }

    #[test]
    fn a_region_past_the_end_of_its_file_is_refused() {
        // mmap accepts this; touching the second half would be SIGBUS.
        let mem = mapped(file_of(0x10_0000), 0, 0x20_0000);
        let err = validate_memory_table(&mem).unwrap_err();
        assert!(matches!(
            err,
            MemoryTableError::BeyondFile {
                size: 0x20_0000,
                file_len: 0x10_0000,
                ..
            }
        ));
        assert!(err.to_string().contains("only 0x100000 bytes"), "{err}");
        let mem = mapped(file_of(0x10_0000), 0x1000, 0x10_0000);
        assert!(validate_memory_table(&mem).is_err(), "offset counts");
    }

    #[test]
    fn anonymous_and_empty_tables_are_refused() {
        let anon = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
        assert!(matches!(
            validate_memory_table(&anon),
            Err(MemoryTableError::NotFileBacked { gpa: 0 })
        ));
        assert!(matches!(
            validate_memory_table(&GuestMemoryMmap::new()),
            Err(MemoryTableError::Empty)
        ));
    }
}
