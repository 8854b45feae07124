//! The signal side of the guard: the fixed table of guarded ranges and the SIGBUS handler that
//! reads it.
//!
//! Everything reachable from [`on_sigbus`] is async-signal-safe: atomics, `mmap`, `write`,
//! `sigaction`, `raise`; no allocation, no lock, no panic. The table is written only by the
//! registry (one writer at a time, under its mutex), as a seqlock per slot, so the handler never
//! sees a half-written range.

use std::ffi::c_void;
use std::io;
use std::sync::atomic::{fence, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Ranges guarded at once, for all guests together: 128 guests at their full share
/// ([`super::OWNER_SHARE`]: a table has at most 8 regions, and old tables stay mapped only
/// while channels created on them live).
pub(super) const SLOT_COUNT: usize = 16384;

/// One guarded range.
struct Slot {
    /// Seqlock: odd while the registry rewrites the slot.
    seq: AtomicU64,
    start: AtomicUsize,
    /// Bytes guarded from `start`; 0: the slot is free.
    len: AtomicUsize,
    /// Granularity of a replacement (a power of two; `start` is aligned to it).
    page: AtomicUsize,
    /// First faulting address not yet reported to the owner (0: none).
    fault: AtomicUsize,
}

impl Slot {
    const fn new() -> Self {
        Slot {
            seq: AtomicU64::new(0),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            page: AtomicUsize::new(0),
            fault: AtomicUsize::new(0),
        }
    }

    /// Rewrites the slot (seqlock writer; callers are serialised by the registry mutex).
    fn write(&self, start: usize, len: usize, page: usize) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.start.store(start, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
        self.page.store(page, Ordering::Relaxed);
        self.fault.store(0, Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// `(start, len, page)` if the slot holds a range and was not being rewritten meanwhile.
    fn read(&self) -> Option<(usize, usize, usize)> {
        let before = self.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let start = self.start.load(Ordering::Relaxed);
        let len = self.len.load(Ordering::Relaxed);
        let page = self.page.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let unchanged = self.seq.load(Ordering::Relaxed) == before;
        (unchanged && len != 0).then_some((start, len, page))
    }
}

static SLOTS: [Slot; SLOT_COUNT] = [const { Slot::new() }; SLOT_COUNT];

/// Faults recovered since the process started.
static RECOVERED: AtomicU64 = AtomicU64::new(0);

/// The eventfd the guard thread waits on (-1 until it runs).
static NOTIFY_FD: AtomicI32 = AtomicI32::new(-1);

/// The SIGBUS disposition found at installation, put back for a SIGBUS the guard does not own.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Publishes a guarded range in slot `index`.
pub(super) fn publish(index: usize, start: usize, len: usize, page: usize) {
    if let Some(slot) = SLOTS.get(index) {
        slot.write(start, len, page);
    }
}

/// Frees slot `index`. Call only once nothing can access its range any more.
pub(super) fn clear(index: usize) {
    if let Some(slot) = SLOTS.get(index) {
        slot.write(0, 0, 0);
    }
}

/// The first unreported faulting address in slot `index`, now reported.
pub(super) fn take_fault(index: usize) -> Option<usize> {
    let addr = SLOTS.get(index)?.fault.swap(0, Ordering::Relaxed);
    (addr != 0).then_some(addr)
}

/// Faults recovered so far (every guest, since the process started).
pub(super) fn recovered() -> u64 {
    RECOVERED.load(Ordering::Relaxed)
}

/// Lets the handler wake the guard thread through `fd`, an eventfd that stays open for the rest
/// of the process.
pub(super) fn set_notify_fd(fd: libc::c_int) {
    NOTIFY_FD.store(fd, Ordering::Release);
}

/// Installs [`on_sigbus`] for the process. Call once.
pub(super) fn install() -> io::Result<()> {
    // SAFETY: sigaction is plain old data; all-zero is a valid value (SIG_DFL, empty mask).
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current disposition into `previous`.
    if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Set before the handler can run; a second install keeps the first disposition found.
    let _ = PREVIOUS.set(previous);
    // SAFETY: as above.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigbus as extern "C" fn(_, _, _) as usize;
    // SA_ONSTACK: a fault may come from a thread close to the end of its stack.
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: sigemptyset initialises the mask it is given.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: `action` is a complete sigaction whose handler is an `extern "C"` function with
    // the SA_SIGINFO signature, valid for the life of the process.
    if unsafe { libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The SIGBUS handler: a fault inside a guarded range gets zero memory over the range and the
/// access is retried; any other SIGBUS gets the previous disposition back and re-raises.
extern "C" fn on_sigbus(_signal: libc::c_int, info: *mut libc::siginfo_t, _context: *mut c_void) {
    // SAFETY: __errno_location only returns the address of this thread's errno (async-signal-safe).
    let errno_slot = unsafe { libc::__errno_location() };
    // SAFETY: that address is valid for this thread's whole life.
    let errno = unsafe { *errno_slot };
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo for the duration of the handler.
    let info = unsafe { info.as_ref() };
    // si_code > 0: raised by the kernel for an access (si_addr is then the faulting address).
    let fault_addr = info.filter(|i| i.si_code > 0).map(|i| {
        // SAFETY: for a kernel-raised SIGBUS the union holds the fault fields.
        unsafe { i.si_addr() as usize }
    });
    match fault_addr {
        Some(addr) if recover(addr) => {}
        Some(_) => give_up(false),
        None => give_up(true),
    }
    // SAFETY: as above; the interrupted code finds errno as it left it.
    unsafe { *errno_slot = errno };
}

/// Replaces a guarded range that faulted at `addr` with zero memory; false if `addr` is not
/// guarded or the replacement failed.
///
/// The whole range is replaced at once, so that the range costs one mapping however many of its
/// pages a frontend makes fault (each page replaced alone would split the mapping, and a process
/// has a bounded number of them); only if that fails, the faulting page alone. Either way the
/// range is dead: its owner loses the connection.
fn recover(addr: usize) -> bool {
    let Some((slot, start, len, page)) = SLOTS.iter().find_map(|slot| {
        let (start, len, page) = slot.read()?;
        (addr.wrapping_sub(start) < len).then_some((slot, start, len, page))
    }) else {
        return false;
    };
    // `start` is aligned to `page`, a power of two, and the mapping extends to a multiple of it.
    // Wrapping arithmetic: nothing in a signal handler may panic.
    let mask = !page.wrapping_sub(1);
    let whole = len.wrapping_add(page.wrapping_sub(1)) & mask;
    let page_start = start.wrapping_add(addr.wrapping_sub(start) & mask);
    if !map_zeros(start, whole) && !map_zeros(page_start, page) {
        return false;
    }
    let _ = slot
        .fault
        .compare_exchange(0, addr, Ordering::Relaxed, Ordering::Relaxed);
    RECOVERED.fetch_add(1, Ordering::Relaxed);
    let fd = NOTIFY_FD.load(Ordering::Acquire);
    if fd >= 0 {
        let one = 1u64.to_ne_bytes();
        // SAFETY: write(2) of 8 bytes from a stack buffer to the guard's eventfd, which stays
        // open for the life of the process. Non-blocking: a full counter fails, harmlessly (the
        // slot keeps its fault for the next wake-up).
        let _ = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
    }
    true
}

/// Maps private zero memory over `[at, at + len)`, which must lie inside a guarded mapping.
fn map_zeros(at: usize, len: usize) -> bool {
    // SAFETY: the range belongs to a guest-memory mapping the registry keeps alive while its slot
    // is published, and nothing in this process holds references into it other than as guest
    // memory (accessed only through volatile copies), so replacing its pages in place (MAP_FIXED)
    // breaks no Rust aliasing rule. MAP_NORESERVE: a large range must not fail on commit
    // accounting; its pages are allocated only when touched.
    let mapped = unsafe {
        libc::mmap(
            at as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    mapped as usize == at
}

/// A SIGBUS the guard does not own: the disposition found at installation comes back (the
/// default: the process dies, as it would have without the guard). A fault re-raises itself when
/// the access is retried; a signal sent with kill(2) is raised again here.
fn give_up(sent_by_a_process: bool) {
    // SAFETY: all-zero sigaction is SIG_DFL with an empty mask.
    let default: libc::sigaction = unsafe { std::mem::zeroed() };
    let previous = PREVIOUS.get().unwrap_or(&default);
    // SAFETY: `previous` is a complete sigaction (the one the kernel gave us, or SIG_DFL).
    unsafe { libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut()) };
    if sent_by_a_process {
        // SAFETY: raise is async-signal-safe; SIGBUS stays blocked until the handler returns.
        unsafe { libc::raise(libc::SIGBUS) };
    }
}
