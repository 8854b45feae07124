//! Guest memory that vanishes under the daemon costs its frontend the connection, never the
//! daemon its life.
//!
//! A frontend's memory is a file the daemon maps shared. If the file loses pages after the
//! mapping (truncated, a hole punched into a hugetlbfs file, a hugetlbfs pool exhausted under a
//! `MAP_NORESERVE` mapping), the next access raises SIGBUS, which would kill the daemon and every
//! guest with it. Sealing (`F_SEAL_SHRINK`) prevents only the first; QEMU's memfd backend and
//! svnic's own host-process guests seal, but DPDK virtio-user sends hugetlbfs files it cannot
//! seal. So every region of every table is guarded, sealed or not, and unsealed frontends keep
//! working by default:
//!
//! - A process-wide SIGBUS handler looks the faulting address up in a fixed table of guarded
//!   ranges. Inside one, it maps private zero memory over the whole range (in hugepages on
//!   hugetlbfs, where a partial replacement must be hugepage-aligned), so the access completes
//!   (reads see zeros, writes are lost) and no later access to the range faults, and wakes the
//!   guard thread. Outside, the previous disposition comes back and the signal kills the process
//!   as before.
//! - The guard thread calls the range's [`FaultOwner`] (the device, which closes its
//!   connection) outside signal context.
//! - The registry holds each guarded mapping alive (`Arc<MmapRegion>`) and releases it, clearing
//!   its slot first, once nobody else holds it: a range is guarded exactly as long as it is
//!   mapped. Releases happen at each registration, on [`release_unused`], and every
//!   [`SWEEP_PERIOD`] while anything is guarded.
//! - Regions are registered when the device accepts a table, before anything in the daemon
//!   touches them. A full table refuses the new memory table ([`GuardError::Full`]).

mod handler;

use std::io;
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use log::warn;
use thiserror::Error;
use vm_memory::mmap::MmapRegion;
use vm_memory::{Address, GuestMemoryRegion, GuestRegionMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use handler::SLOT_COUNT;

use crate::debug_fields::debug_fields;

/// Slots one owner (a guest's port) may hold: its live table and older tables its channels keep
/// mapped. One guest cannot take the slots every other guest's memory needs.
pub const OWNER_SHARE: usize = 128;

/// How often the guard thread releases mappings nobody uses any more, while any are guarded.
pub const SWEEP_PERIOD: Duration = Duration::from_millis(100);

/// Why regions cannot be guarded.
#[derive(Debug, Error)]
pub enum GuardError {
    /// Every slot of the guard is taken.
    #[error(
        "the SIGBUS guard has no room for {wanted} more region(s): all {capacity} slots are \
         guarding other guests' memory"
    )]
    Full {
        /// Regions asked for.
        wanted: usize,
        /// Slots in all.
        capacity: usize,
    },
    /// The owner already holds its share of the slots (old tables kept alive by its channels).
    #[error(
        "guest memory of owner {token} already holds {held} guarded region(s); {wanted} more \
         would pass its share of {share} (destroy channels created on older memory tables)"
    )]
    OwnerFull {
        /// The owner's token.
        token: u64,
        /// Regions it holds now.
        held: usize,
        /// Regions asked for.
        wanted: usize,
        /// Its share.
        share: usize,
    },
    /// A region's page size is no power of two, or its mapping is not aligned to it.
    #[error("region at {gpa:#x} (host {host:#x}) cannot be guarded in pages of {page_size:#x}")]
    BadGranularity {
        /// Guest-physical start of the region.
        gpa: u64,
        /// Where it is mapped.
        host: usize,
        /// The page size asked for.
        page_size: usize,
    },
    /// The guard's eventfd or thread could not be created.
    #[error("cannot start the SIGBUS guard thread: {0}")]
    Start(#[source] io::Error),
    /// The SIGBUS handler could not be installed.
    #[error("cannot install the SIGBUS handler: {0}")]
    Install(#[source] io::Error),
}

/// A fault the guard recovered from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestMemoryFault {
    /// The owner's token.
    pub token: u64,
    /// Guest-physical address of the faulting access.
    pub gpa: u64,
    /// Host address of the faulting access.
    pub host_addr: usize,
}

/// Who is told when a guarded region faults: called once per fault report, on the guard thread.
pub struct FaultOwner {
    token: u64,
    on_fault: Box<dyn Fn(GuestMemoryFault) + Send + Sync>,
}

impl FaultOwner {
    /// An owner identified by `token` (reported back in each [`GuestMemoryFault`]).
    pub fn new(
        token: u64,
        on_fault: impl Fn(GuestMemoryFault) + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(FaultOwner {
            token,
            on_fault: Box::new(on_fault),
        })
    }
}

debug_fields!(FaultOwner, |f| token: f.token);

/// One guarded mapping, in the slot of the same index.
struct Entry {
    /// Keeps the mapping alive while its slot is published.
    mapping: Arc<MmapRegion>,
    host_start: usize,
    gpa: u64,
    owner: Arc<FaultOwner>,
}

struct Registry {
    /// Index = slot index; grown to [`SLOT_COUNT`] at the first registration.
    entries: Vec<Option<Entry>>,
    /// The guard thread and its eventfd run.
    thread_started: bool,
    handler_installed: bool,
    /// The guard thread's eventfd, to wake it when the first region arrives.
    wake: Option<EventFd>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    entries: Vec::new(),
    thread_started: false,
    handler_installed: false,
    wake: None,
});

fn registry() -> MutexGuard<'static, Registry> {
    // A panic never leaves an entry half-written: the slot table is only written by `publish`
    // and `clear`, whole.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Guards every `(region, page_size)` of a memory table for `owner`; `page_size` is the file's
/// (hugepage size on hugetlbfs). A region already guarded (a table that keeps regions of the
/// previous one) moves to `owner`. All or nothing: on error, no region of this call is guarded.
pub fn guard_regions<'a>(
    regions: impl IntoIterator<Item = (&'a GuestRegionMmap, usize)>,
    owner: &Arc<FaultOwner>,
) -> Result<(), GuardError> {
    let mut asked = Vec::new();
    for (region, page_size) in regions {
        let mapping = region.get_mmap();
        let host = mapping.as_ptr() as usize;
        let gpa = region.start_addr().raw_value();
        if !page_size.is_power_of_two() || host % page_size != 0 {
            return Err(GuardError::BadGranularity {
                gpa,
                host,
                page_size,
            });
        }
        asked.push((mapping, host, gpa, page_size));
    }
    let mut reg = registry();
    reg.start()?;
    let released = reg.release_unused();
    let (known, fresh): (Vec<_>, Vec<_>) = asked
        .into_iter()
        .partition(|(mapping, ..)| reg.index_of(mapping).is_some());
    let held = reg
        .entries
        .iter()
        .flatten()
        .filter(|e| e.owner.token == owner.token)
        .count();
    if held + fresh.len() > OWNER_SHARE {
        return Err(GuardError::OwnerFull {
            token: owner.token,
            held,
            wanted: fresh.len(),
            share: OWNER_SHARE,
        });
    }
    let free: Vec<usize> = reg
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| e.is_none().then_some(i))
        .take(fresh.len())
        .collect();
    if free.len() < fresh.len() {
        return Err(GuardError::Full {
            wanted: fresh.len(),
            capacity: SLOT_COUNT,
        });
    }
    for (mapping, ..) in known {
        let index = reg.index_of(&mapping);
        if let Some(Some(entry)) = index.and_then(|i| reg.entries.get_mut(i)) {
            entry.owner = Arc::clone(owner);
        }
    }
    for ((mapping, host, gpa, page_size), index) in fresh.into_iter().zip(free) {
        handler::publish(index, host, mapping.size(), page_size);
        if let Some(e) = reg.entries.get_mut(index) {
            *e = Some(Entry {
                mapping,
                host_start: host,
                gpa,
                owner: Arc::clone(owner),
            });
        }
    }
    reg.wake_thread();
    drop(reg);
    // Unmapped here, outside the lock.
    drop(released);
    Ok(())
}

/// Releases (unmaps) every guarded mapping nobody else holds any more. The guard thread does it
/// every [`SWEEP_PERIOD`]; call it to release a guest's memory at once after dropping it.
pub fn release_unused() {
    let released = registry().release_unused();
    drop(released);
}

/// Faults the guard recovered from since the process started, every guest together.
pub fn recovered_faults() -> u64 {
    handler::recovered()
}

/// Regions guarded for owners with `token`.
pub fn guarded_regions_of(token: u64) -> usize {
    registry()
        .entries
        .iter()
        .flatten()
        .filter(|e| e.owner.token == token)
        .count()
}

impl Registry {
    /// Starts the guard thread and installs the handler, whichever is not done yet.
    fn start(&mut self) -> Result<(), GuardError> {
        if self.entries.is_empty() {
            self.entries.resize_with(SLOT_COUNT, || None);
        }
        if !self.thread_started {
            let events = EventFd::new(EFD_NONBLOCK).map_err(GuardError::Start)?;
            let wake = events.try_clone().map_err(GuardError::Start)?;
            let fd = events.as_raw_fd();
            std::thread::Builder::new()
                .name("svnic-sigbus-guard".into())
                .spawn(move || watch(&events))
                .map_err(GuardError::Start)?;
            // The thread owns `events` for the rest of the process: the fd stays valid.
            handler::set_notify_fd(fd);
            self.wake = Some(wake);
            self.thread_started = true;
        }
        if !self.handler_installed {
            handler::install().map_err(GuardError::Install)?;
            self.handler_installed = true;
        }
        Ok(())
    }

    fn index_of(&self, mapping: &Arc<MmapRegion>) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| e.as_ref().is_some_and(|e| Arc::ptr_eq(&e.mapping, mapping)))
    }

    /// Clears the slots of mappings only the registry holds and hands those back, to be dropped
    /// (unmapped) by the caller. A mapping only the registry holds cannot be reached by anyone
    /// else again, so nothing can fault in it once its slot is cleared.
    fn release_unused(&mut self) -> Vec<Entry> {
        let mut released = Vec::new();
        for (index, slot) in self.entries.iter_mut().enumerate() {
            if let Some(entry) = slot {
                if Arc::get_mut(&mut entry.mapping).is_some() {
                    handler::clear(index);
                    released.extend(slot.take());
                }
            }
        }
        released
    }

    /// Faults recorded by the handler since the last call, with their owners.
    fn take_faults(&self) -> Vec<(Arc<FaultOwner>, GuestMemoryFault)> {
        let mut faults = Vec::new();
        for (index, entry) in self.entries.iter().enumerate() {
            let Some(entry) = entry else { continue };
            if let Some(host_addr) = handler::take_fault(index) {
                let offset = host_addr.wrapping_sub(entry.host_start) as u64;
                faults.push((
                    Arc::clone(&entry.owner),
                    GuestMemoryFault {
                        token: entry.owner.token,
                        gpa: entry.gpa.wrapping_add(offset),
                        host_addr,
                    },
                ));
            }
        }
        faults
    }

    fn wake_thread(&self) {
        if let Some(wake) = &self.wake {
            let _ = wake.write(1);
        }
    }

    fn is_guarding(&self) -> bool {
        self.entries.iter().any(Option::is_some)
    }
}

/// The guard thread: reports faults to their owners and releases unused mappings.
fn watch(events: &EventFd) {
    loop {
        let timeout = if registry().is_guarding() {
            i32::try_from(SWEEP_PERIOD.as_millis()).unwrap_or(i32::MAX)
        } else {
            -1
        };
        let mut pfd = libc::pollfd {
            fd: events.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one pollfd that lives for the call.
        unsafe { libc::poll(&mut pfd, 1, timeout) };
        let _ = events.read();
        let (faults, released) = {
            let mut reg = registry();
            (reg.take_faults(), reg.release_unused())
        };
        drop(released);
        // Outside the registry lock: an owner may take its own locks, which are held around
        // registrations.
        for (owner, fault) in faults {
            if catch_unwind(AssertUnwindSafe(|| (owner.on_fault)(fault))).is_err() {
                warn!("the fault handler of token {} panicked", fault.token);
            }
        }
    }
}

#[cfg(test)]
mod tests;
