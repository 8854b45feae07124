//! Checks on a guest memory table received from a vhost-user frontend.
//!
//! vhost-user-backend maps each region of `SET_MEM_TABLE` with `mmap(MAP_SHARED | MAP_NORESERVE)`
//! of the file descriptor the frontend sent. `mmap` does not compare the requested size with the
//! file's: a region larger than its file maps fine, and the first access past the end of the file
//! raises SIGBUS, which kills the whole daemon (every guest). So before anything touches a new
//! table, every region must be backed by a regular file (memfd, hugetlbfs, tmpfs) at least as long
//! as `mmap_offset + memory_size`.
//!
//! A frontend can still take pages away after the check: shrink an unsealed file, punch a hole in
//! a hugetlbfs file, or exhaust the hugepage pool under a `MAP_NORESERVE` mapping. The check
//! reports per region whether its file is sealed against shrinking (`F_SEAL_SHRINK`) and its page
//! size (the hugepage size on hugetlbfs); the device then guards every region with
//! [`sigbus_guard`](super::sigbus_guard), sealed or not, so that such a fault costs only that
//! frontend its connection.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use thiserror::Error;
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// `statfs.f_type` of hugetlbfs (linux/magic.h).
const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;

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
    /// A hugetlbfs file reports a page size that is no power of two of at least the base page.
    #[error("region at {gpa:#x}: its hugetlbfs file reports a page size of {page_size:#x}")]
    OddPageSize {
        /// Guest-physical start of the region.
        gpa: u64,
        /// What `st_blksize` said.
        page_size: u64,
    },
}

/// What the check learnt about the file behind one region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionBacking {
    /// Guest-physical start of the region.
    pub gpa: u64,
    /// The file is sealed against shrinking (`F_SEAL_SHRINK`): truncation cannot fault it.
    pub sealed: bool,
    /// The file lives on hugetlbfs: a hole or an exhausted pool can still fault it.
    pub hugetlbfs: bool,
    /// The granularity at which its mapping can fault and be replaced: the hugepage size on
    /// hugetlbfs, the base page size otherwise. A power of two.
    pub page_size: usize,
}

/// Checks every region of `mem` against its backing file; on success, what each file is (in the
/// order of `mem.iter()`).
pub fn validate_memory_table(
    mem: &GuestMemoryMmap,
) -> Result<Vec<RegionBacking>, MemoryTableError> {
    if mem.num_regions() == 0 {
        return Err(MemoryTableError::Empty);
    }
    let mut backings = Vec::with_capacity(mem.num_regions());
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
        let fd = file_offset.file().as_raw_fd();
        let hugetlbfs =
            on_hugetlbfs(fd).map_err(|source| MemoryTableError::Stat { gpa, source })?;
        let page_size = if hugetlbfs {
            // hugetlbfs reports its page size as the block size.
            usize::try_from(meta.blksize())
                .ok()
                .filter(|p| p.is_power_of_two() && *p >= base_page_size())
                .ok_or(MemoryTableError::OddPageSize {
                    gpa,
                    page_size: meta.blksize(),
                })?
        } else {
            base_page_size()
        };
        backings.push(RegionBacking {
            gpa,
            sealed: sealed_against_shrinking(fd),
            hugetlbfs,
            page_size,
        });
    }
    Ok(backings)
}

/// How a table's regions are protected against losing pages, for its log line.
pub fn protection(backings: &[RegionBacking]) -> String {
    let unsealed = backings.iter().filter(|b| !b.sealed).count();
    let huge = backings.iter().filter(|b| b.hugetlbfs).count();
    match (unsealed, huge) {
        (0, 0) => "sealed against shrinking".to_string(),
        _ => format!(
            "{unsealed} region(s) not sealed against shrinking, {huge} on hugetlbfs: guarded \
             against SIGBUS only"
        ),
    }
}

/// True if the file carries `F_SEAL_SHRINK`. Files that cannot be sealed (hugetlbfs or tmpfs
/// files opened by path) answer EINVAL: not sealed.
fn sealed_against_shrinking(fd: libc::c_int) -> bool {
    // SAFETY: fcntl(F_GET_SEALS) on a descriptor the region owns; it only returns an integer.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

fn on_hugetlbfs(fd: libc::c_int) -> io::Result<bool> {
    // SAFETY: statfs is plain old data; all-zero is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one `statfs` into `fs`, which lives for the call.
    if unsafe { libc::fstatfs(fd, &mut fs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // f_type is a signed word on some targets; the magic is its low 32 bits.
    Ok(fs.f_type as u32 == HUGETLBFS_MAGIC)
}

/// The base page size (4 KiB on the targets svnic runs on).
pub fn base_page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|s| s.is_power_of_two())
        .unwrap_or(4096)
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

    fn memfd(flags: libc::c_uint, len: u64) -> Option<File> {
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"svnic-table-test".as_ptr(), flags) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just created and nothing else owns it.
        let f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.set_len(len).ok()?;
        Some(f)
    }

    #[test]
    fn each_region_reports_its_seal_and_page_size() {
        let sealed = memfd(libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING, 0x10_0000).unwrap();
        // SAFETY: fcntl(F_ADD_SEALS) on a descriptor we own, integer argument.
        let rc = unsafe { libc::fcntl(sealed.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        assert_eq!(rc, 0);
        let plain = memfd(libc::MFD_CLOEXEC, 0x10_0000).unwrap();
        let mem = GuestMemoryMmap::from_ranges_with_files(&[
            (GuestAddress(0), 0x10_0000, Some(FileOffset::new(sealed, 0))),
            (
                GuestAddress(0x10_0000),
                0x10_0000,
                Some(FileOffset::new(plain, 0)),
            ),
            (
                GuestAddress(0x20_0000),
                0x10_0000,
                Some(FileOffset::new(file_of(0x10_0000), 0)),
            ),
        ])
        .unwrap();
        let base = RegionBacking {
            gpa: 0,
            sealed: true,
            hugetlbfs: false,
            page_size: base_page_size(),
        };
        assert_eq!(
            validate_memory_table(&mem).unwrap(),
            [
                base,
                RegionBacking {
                    gpa: 0x10_0000,
                    sealed: false,
                    ..base
                },
                RegionBacking {
                    gpa: 0x20_0000,
                    sealed: false,
                    ..base
                },
            ]
        );
    }

    #[test]
    fn a_hugetlbfs_region_reports_its_hugepage_size() {
        const HUGE: u64 = 2 << 20;
        let Some(f) = memfd(
            libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
            HUGE,
        ) else {
            eprintln!("skipped: no 2 MiB hugetlbfs memfd on this machine");
            return;
        };
        // Mapped MAP_NORESERVE and never touched: no hugepage needed.
        let mem = mapped(f, 0, HUGE as usize);
        let backing = validate_memory_table(&mem).unwrap();
        assert_eq!(
            backing,
            [RegionBacking {
                gpa: 0x10_0000,
                sealed: false,
                hugetlbfs: true,
                page_size: HUGE as usize,
            }]
        );
    }

    #[test]
    fn the_log_says_whether_a_table_is_sealed_or_guarded_only() {
        let sealed = RegionBacking {
            gpa: 0,
            sealed: true,
            hugetlbfs: false,
            page_size: 4096,
        };
        assert_eq!(protection(&[sealed, sealed]), "sealed against shrinking");
        let huge = RegionBacking {
            hugetlbfs: true,
            ..sealed
        };
        let open = RegionBacking {
            sealed: false,
            ..sealed
        };
        assert_eq!(
            protection(&[sealed, huge, open]),
            "1 region(s) not sealed against shrinking, 1 on hugetlbfs: guarded against SIGBUS only"
        );
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
