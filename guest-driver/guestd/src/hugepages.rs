//! Reserving 2 MiB hugepages for channel memory: raise the pool (`nr_hugepages`) until enough
//! pages are free. The pool is never lowered by the agent: hugepages freed by a destroyed channel
//! go back to the pool, not to the kernel's general allocator.

use std::path::{Path, PathBuf};

use log::info;
use thiserror::Error;

/// The sysfs directory of the 2 MiB pool.
pub const SYSFS_2M_POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

/// Errors reserving hugepages.
#[derive(Debug, Error)]
pub enum HugepageError {
    /// A pool file could not be read or written.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A pool file does not hold a number.
    #[error("{path}: {text:?} is not a number")]
    Parse {
        /// The file.
        path: String,
        /// Its content.
        text: String,
    },
    /// The kernel could not find enough memory for the pool.
    #[error("wanted {wanted} free 2 MiB hugepages, the kernel provides {free} (pool of {total}); free memory or ask for fewer")]
    NotEnough {
        /// Pages wanted free.
        wanted: u64,
        /// Pages free.
        free: u64,
        /// Pool size.
        total: u64,
    },
}

/// The 2 MiB hugepage pool (a sysfs directory with `nr_hugepages` and `free_hugepages`).
#[derive(Debug, Clone)]
pub struct HugepagePool {
    dir: PathBuf,
}

impl HugepagePool {
    /// The system's 2 MiB pool.
    pub fn system() -> Self {
        Self::at(SYSFS_2M_POOL)
    }

    /// A pool at `dir` (tests use a temporary directory).
    pub fn at(dir: impl AsRef<Path>) -> Self {
        HugepagePool {
            dir: dir.as_ref().to_path_buf(),
        }
    }

    fn read(&self, name: &str) -> Result<u64, HugepageError> {
        let path = self.dir.join(name);
        let text = std::fs::read_to_string(&path).map_err(|source| HugepageError::File {
            path: path.display().to_string(),
            source,
        })?;
        text.trim().parse().map_err(|_| HugepageError::Parse {
            path: path.display().to_string(),
            text: text.trim().to_string(),
        })
    }

    /// (pool size, free pages).
    pub fn counts(&self) -> Result<(u64, u64), HugepageError> {
        Ok((self.read("nr_hugepages")?, self.read("free_hugepages")?))
    }

    /// Makes at least `wanted` pages free, raising the pool if needed. Returns (pool, free).
    pub fn reserve(&self, wanted: u64) -> Result<(u64, u64), HugepageError> {
        let (total, free) = self.counts()?;
        if free >= wanted {
            info!("hugepages: {free} of {total} free 2 MiB pages (wanted {wanted})");
            return Ok((total, free));
        }
        let target = total.saturating_add(wanted - free);
        let path = self.dir.join("nr_hugepages");
        std::fs::write(&path, format!("{target}\n")).map_err(|source| HugepageError::File {
            path: path.display().to_string(),
            source,
        })?;
        let (total, free) = self.counts()?;
        if free < wanted {
            return Err(HugepageError::NotEnough {
                wanted,
                free,
                total,
            });
        }
        info!("hugepages: raised the 2 MiB pool to {total} ({free} free, wanted {wanted})");
        Ok((total, free))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pool(name: &str, total: &str, free: &str) -> HugepagePool {
        let dir = std::env::temp_dir().join(format!("svnic-hp-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nr_hugepages"), total).unwrap();
        std::fs::write(dir.join("free_hugepages"), free).unwrap();
        HugepagePool::at(dir)
    }

    #[test]
    fn enough_free_pages_change_nothing() {
        let p = pool("enough", "8\n", "6\n");
        assert_eq!(p.reserve(4).unwrap(), (8, 6));
        assert_eq!(
            std::fs::read_to_string(p.dir.join("nr_hugepages")).unwrap(),
            "8\n"
        );
    }

    #[test]
    fn the_pool_is_raised_by_what_is_missing() {
        // A fake sysfs does not update free_hugepages by itself: the kernel refused.
        let p = pool("raise", "2", "1");
        let e = p.reserve(4).unwrap_err();
        assert!(matches!(
            e,
            HugepageError::NotEnough {
                wanted: 4,
                free: 1,
                total: 5
            }
        ));
        // Pretend the kernel found the pages.
        std::fs::write(p.dir.join("free_hugepages"), "4").unwrap();
        assert_eq!(p.reserve(4).unwrap(), (5, 4));
    }

    #[test]
    fn unreadable_pools_are_reported() {
        let p = pool("bad", "many", "1");
        assert!(matches!(p.reserve(1), Err(HugepageError::Parse { .. })));
        assert!(matches!(
            HugepagePool::at("/nonexistent").reserve(1),
            Err(HugepageError::File { .. })
        ));
    }
}
