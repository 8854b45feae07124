//! Completion queues. Progress is manual: every read (and `fi_trywait`) first progresses the
//! endpoints bound to the queue, which turns channel messages into entries here.
//!
//! Locking: an endpoint's lock is taken before a queue's, never the other way round (a read
//! copies the list of bound endpoints and drops the queue's lock before progressing them).

use std::collections::VecDeque;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::ffi::eq::*;
use crate::ffi::errno::*;
use crate::ffi::*;
use crate::wait::{FdWait, Progress};
use crate::{close_object, eq, guard, guard_fid, guard_object, open_object, put, FidObject};

/// What failed, for an error entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrInfo {
    /// libfabric errno (positive).
    pub err: c_int,
    /// svnic status or provider code (see errors.rs).
    pub prov_errno: c_int,
    /// Bytes that did not fit (truncation).
    pub olen: usize,
}

/// One completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    /// The operation's context (an address, never dereferenced).
    pub ctx: usize,
    /// `FI_SEND` or `FI_RECV`, with `FI_MSG` or `FI_TAGGED` (and `FI_REMOTE_CQ_DATA`).
    pub flags: u64,
    /// Bytes received (0 for sends).
    pub len: usize,
    /// Where the data was received (0 for sends).
    pub buf: usize,
    /// Remote CQ data of a received message (with `FI_REMOTE_CQ_DATA`), else 0.
    pub data: u64,
    /// The tag of a received tagged message, else 0.
    pub tag: u64,
    /// `Some` for an error entry.
    pub err: Option<ErrInfo>,
}

#[derive(Debug, Default)]
struct CqState {
    entries: VecDeque<CqEntry>,
    sources: Vec<Weak<dyn Progress>>,
}

/// The queue, shared with the endpoints bound to it.
#[derive(Debug)]
pub struct CqInner {
    format: c_int,
    wait_obj: c_int,
    api_version: u32,
    /// Empty reads in a row after which each further empty read yields the CPU
    /// (`FI_SVNIC_YIELD_AFTER`; 0: never).
    yield_after: u32,
    empty_reads: AtomicU32,
    /// `FI_WAIT_FD` queues: the descriptor and its waker.
    fd_wait: Option<FdWait>,
    /// Set by a successful `fi_trywait`, cleared by the next read.
    armed: AtomicBool,
    state: Mutex<CqState>,
}

impl CqInner {
    /// A queue of entries in `format` (CONTEXT, MSG, DATA or TAGGED).
    pub fn new(
        format: c_int,
        wait_obj: c_int,
        api_version: u32,
        yield_after: u32,
        fd_wait: Option<FdWait>,
    ) -> CqInner {
        CqInner {
            format,
            wait_obj,
            api_version,
            yield_after,
            empty_reads: AtomicU32::new(0),
            fd_wait,
            armed: AtomicBool::new(false),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, CqState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends an entry (called by endpoints, under their own lock).
    pub fn push(&self, e: CqEntry) {
        self.lock().entries.push_back(e);
    }

    /// Binds an endpoint (its progress feeds this queue); held weakly, so closing the
    /// endpoint unbinds it.
    pub fn bind(&self, source: Weak<dyn Progress>) {
        let mut s = self.lock();
        if !s.sources.iter().any(|w| w.ptr_eq(&source)) {
            s.sources.push(source);
        }
    }

    fn live_sources(&self) -> Vec<Arc<dyn Progress>> {
        let mut s = self.lock();
        s.sources.retain(|w| w.strong_count() > 0);
        s.sources.iter().filter_map(Weak::upgrade).collect()
    }

    /// Progresses every live endpoint bound to the queue (without holding the queue's lock),
    /// after ending a wait `fi_trywait` armed.
    pub fn progress(&self) {
        let sources = self.live_sources();
        if self.armed.swap(false, Ordering::AcqRel) {
            if let Some(w) = &self.fd_wait {
                w.disarm();
            }
            for source in &sources {
                source.set_sleeping(false);
            }
        }
        for source in sources {
            source.progress();
        }
    }

    /// Entries waiting (after no progress).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// True when no entry waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn entry_size(&self) -> usize {
        match self.format {
            FI_CQ_FORMAT_CONTEXT => std::mem::size_of::<FiCqEntry>(),
            FI_CQ_FORMAT_MSG => std::mem::size_of::<FiCqMsgEntry>(),
            FI_CQ_FORMAT_DATA => std::mem::size_of::<FiCqDataEntry>(),
            _ => std::mem::size_of::<FiCqTaggedEntry>(),
        }
    }

    /// `fi_cq_read`/`readfrom`: up to `count` entries into `buf`; `-FI_EAGAIN` if none,
    /// `-FI_EAVAIL` if the next one is an error.
    ///
    /// # Safety
    /// `buf` must hold `count` entries of the queue's format; `src` NULL or `count` handles.
    pub unsafe fn read(&self, buf: *mut c_void, count: usize, src: *mut u64) -> isize {
        if count == 0 {
            return 0;
        }
        if buf.is_null() {
            return -(FI_EINVAL as isize);
        }
        self.progress();
        let mut s = self.lock();
        let mut n = 0usize;
        while n < count {
            match s.entries.front() {
                Some(e) if e.err.is_none() => {}
                Some(_) if n == 0 => return -(FI_EAVAIL as isize),
                _ => break,
            }
            let Some(e) = s.entries.pop_front() else {
                break;
            };
            // SAFETY: `buf` holds `count` > n entries of this format (caller's contract).
            let at = unsafe { buf.cast::<u8>().add(n * self.entry_size()) };
            // SAFETY: as above: `at` has room for one entry of this format.
            unsafe { self.write_entry(at, &e) };
            if !src.is_null() {
                // SAFETY: the caller's `src` holds `count` handles. No FI_SOURCE: not known.
                unsafe { put(src.wrapping_add(n), FI_ADDR_NOTAVAIL) };
            }
            n += 1;
        }
        drop(s);
        if n == 0 {
            self.idle();
            -(FI_EAGAIN as isize)
        } else {
            self.empty_reads.store(0, Ordering::Relaxed);
            n as isize
        }
    }

    /// An empty read. Applications poll CQs in tight loops (fi_pingpong, MPI), and the engine
    /// worker that must run for anything to arrive may share their CPU: after `yield_after`
    /// empty reads in a row, every empty read gives the CPU away once.
    fn idle(&self) {
        let n = self.empty_reads.fetch_add(1, Ordering::Relaxed);
        if self.yield_after > 0 && n >= self.yield_after {
            std::thread::yield_now();
        }
    }

    /// # Safety
    /// `at` must have room for one entry of the queue's format.
    unsafe fn write_entry(&self, at: *mut u8, e: &CqEntry) {
        let ctx = e.ctx as *mut c_void;
        let data = FiCqDataEntry {
            op_context: ctx,
            flags: e.flags,
            len: e.len,
            buf: e.buf as *mut c_void,
            data: e.data,
        };
        match self.format {
            // SAFETY: per the contract above (each arm).
            FI_CQ_FORMAT_CONTEXT => unsafe { put(at.cast(), FiCqEntry { op_context: ctx }) },
            // SAFETY: as above.
            FI_CQ_FORMAT_MSG => unsafe {
                put(
                    at.cast(),
                    FiCqMsgEntry {
                        op_context: ctx,
                        flags: e.flags,
                        len: e.len,
                    },
                )
            },
            // SAFETY: as above.
            FI_CQ_FORMAT_DATA => unsafe { put(at.cast(), data) },
            // SAFETY: as above.
            _ => unsafe {
                put(
                    at.cast(),
                    FiCqTaggedEntry {
                        data_entry: data,
                        tag: e.tag,
                    },
                )
            },
        }
    }

    /// `fi_cq_readerr`: the head error entry (1), or `-FI_EAGAIN` if the head is not an error.
    /// No error data is produced: `err_data` is NULL and `err_data_size` 0, and for callers of
    /// API 1.0 (whose entry is 72 bytes) nothing past `err_data` is written.
    ///
    /// # Safety
    /// `out` must be a valid error entry of the application's API version.
    pub unsafe fn readerr(&self, out: *mut FiCqErrEntry) -> isize {
        if out.is_null() {
            return -(FI_EINVAL as isize);
        }
        self.progress();
        let mut s = self.lock();
        let Some(e) = s.entries.front().copied() else {
            return -(FI_EAGAIN as isize);
        };
        let Some(err) = e.err else {
            return -(FI_EAGAIN as isize);
        };
        s.entries.pop_front();
        let o = out.cast::<u8>();
        let fields: [(usize, u64); 7] = [
            (0, e.ctx as u64),
            (8, e.flags),
            (16, e.len as u64),
            (24, e.buf as u64),
            (32, e.data),
            (40, e.tag),
            (48, err.olen as u64),
        ];
        for (off, v) in fields {
            // SAFETY: every offset lies in the 72 bytes every API version's entry has.
            unsafe { put(o.wrapping_add(off).cast::<u64>(), v) };
        }
        // SAFETY: as above (offsets 56 and 60).
        unsafe { put(o.wrapping_add(56).cast::<c_int>(), err.err) };
        // SAFETY: as above.
        unsafe { put(o.wrapping_add(60).cast::<c_int>(), err.prov_errno) };
        // SAFETY: as above (offset 64, the last field of the 1.0 entry).
        unsafe {
            put(
                o.wrapping_add(64).cast::<*mut c_void>(),
                std::ptr::null_mut(),
            )
        };
        if self.api_version >= fi_version(1, 5) {
            // SAFETY: entries of API 1.5 and later have err_data_size at 72.
            unsafe { put(o.wrapping_add(72).cast::<usize>(), 0) };
        }
        1
    }

    /// `fi_trywait` for this queue: `-FI_EAGAIN` if an entry is (or becomes, after progress)
    /// available, 0 if the caller may block, `-FI_EINVAL` without a wait object. For
    /// `FI_WAIT_FD`, 0 also means the descriptor will become readable when the engine wakes one
    /// of the bound endpoints (see the wait module).
    pub fn trywait(&self) -> c_int {
        if self.wait_obj == FI_WAIT_NONE {
            return -FI_EINVAL;
        }
        self.progress();
        if !self.is_empty() {
            return -FI_EAGAIN;
        }
        let Some(w) = &self.fd_wait else { return 0 };
        let sources = self.live_sources();
        for source in &sources {
            source.set_sleeping(true);
        }
        // Anything the engine published before it could see the flags is found here.
        for source in &sources {
            source.progress();
        }
        if !self.is_empty() {
            for source in &sources {
                source.set_sleeping(false);
            }
            return -FI_EAGAIN;
        }
        w.arm(sources.iter().map(Arc::downgrade).collect());
        self.armed.store(true, Ordering::Release);
        0
    }

    /// `fi_cq_sread` of an `FI_WAIT_FD` queue: read; if empty, trywait and poll the descriptor,
    /// until an entry (or error) arrives or `timeout` ms pass (-1: forever).
    ///
    /// # Safety
    /// As [`CqInner::read`].
    unsafe fn sread_fd(
        &self,
        w: &FdWait,
        buf: *mut c_void,
        count: usize,
        src: *mut u64,
        timeout: c_int,
    ) -> isize {
        let deadline = u64::try_from(timeout)
            .ok()
            .map(|ms| std::time::Instant::now() + std::time::Duration::from_millis(ms));
        loop {
            // SAFETY: per the contract above.
            let r = unsafe { self.read(buf, count, src) };
            if r != -(FI_EAGAIN as isize) {
                return r;
            }
            let left = match deadline {
                None => -1,
                Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                    Some(left) if !left.is_zero() => {
                        c_int::try_from(left.as_millis().max(1)).unwrap_or(c_int::MAX)
                    }
                    _ => return r,
                },
            };
            if self.trywait() == 0 {
                let mut p = libc::pollfd {
                    fd: w.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd.
                let _ = unsafe { libc::poll(&mut p, 1, left) };
            }
        }
    }
}

fid_object! {
    /// A completion queue.
    pub struct SvnicCq: FidCq, FI_CLASS_CQ {
        /// The shared queue (bound endpoints keep it when the CQ is closed).
        inner: Arc<CqInner>,
    }
    fi_ops = FiOps {
        close: Some(close_object::<SvnicCq>),
        control: Some(cq_control),
        ..FiOps::ENOSYS
    };
}

static CQ_OPS: FiOpsCq = FiOpsCq {
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    strerror: Some(cq_strerror),
    ..FiOpsCq::ENOSYS
};

/// `fi_cq_open`: formats UNSPEC (becomes CONTEXT, written back), CONTEXT, MSG, DATA, TAGGED;
/// wait objects NONE, YIELD, FD and UNSPEC (becomes FD); no flags, no wait sets.
pub(crate) fn open(
    api_version: u32,
    yield_after: u32,
    attr: Option<&mut FiCqAttr>,
    out: *mut *mut FidCq,
    context: *mut c_void,
) -> c_int {
    open_object(attr, out, |attr| {
        if attr.flags != 0 {
            return Err(FI_EBADFLAGS);
        }
        match attr.format {
            FI_CQ_FORMAT_UNSPEC => attr.format = FI_CQ_FORMAT_CONTEXT,
            FI_CQ_FORMAT_CONTEXT | FI_CQ_FORMAT_MSG | FI_CQ_FORMAT_DATA | FI_CQ_FORMAT_TAGGED => {}
            _ => return Err(FI_EINVAL),
        }
        let wait = match attr.wait_obj {
            FI_WAIT_NONE => FI_WAIT_NONE,
            FI_WAIT_YIELD => FI_WAIT_YIELD,
            FI_WAIT_UNSPEC | FI_WAIT_FD => FI_WAIT_FD,
            FI_WAIT_SET | FI_WAIT_MUTEX_COND => return Err(FI_ENOSYS),
            _ => return Err(FI_EINVAL),
        };
        let fd_wait = if wait == FI_WAIT_FD {
            match FdWait::new() {
                Ok(w) => Some(w),
                Err(e) => {
                    log::warn!("svnic provider: cannot create a CQ wait descriptor: {e}");
                    return Err(FI_ENOMEM);
                }
            }
        } else {
            None
        };
        let inner = CqInner::new(attr.format, wait, api_version, yield_after, fd_wait);
        Ok(SvnicCq {
            c: FidCq {
                fid: SvnicCq::fid(context),
                ops: &CQ_OPS,
            },
            inner: Arc::new(inner),
        })
    })
}

unsafe extern "C" fn cq_control(fid: *mut Fid, command: c_int, arg: *mut c_void) -> c_int {
    guard_fid("cq control", fid, |cq: &SvnicCq| {
        match command {
            FI_GETWAITOBJ if !arg.is_null() => {
                // SAFETY: FI_GETWAITOBJ's argument is an enum fi_wait_obj.
                unsafe { put(arg.cast::<c_int>(), cq.inner.wait_obj) };
                0
            }
            FI_GETWAIT if !arg.is_null() => match &cq.inner.fd_wait {
                Some(w) => {
                    // SAFETY: FI_GETWAIT's argument of an FI_WAIT_FD object is an int.
                    unsafe { put(arg.cast::<c_int>(), w.fd()) };
                    0
                }
                // No descriptor or mutex to hand out for NONE and YIELD.
                None => -FI_ENODATA,
            },
            FI_GETWAIT | FI_GETWAITOBJ => -FI_EINVAL,
            _ => -FI_ENOSYS,
        }
    })
}

unsafe extern "C" fn cq_read(c: *mut FidCq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: same contract as fi_cq_readfrom with no source array.
    unsafe { cq_readfrom(c, buf, count, std::ptr::null_mut()) }
}

unsafe extern "C" fn cq_readfrom(
    c: *mut FidCq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
) -> isize {
    guard_object("fi_cq_read", c, |cq: &SvnicCq| {
        // SAFETY: the application's buffers, per fi_cq_read's contract.
        unsafe { cq.inner.read(buf, count, src) }
    })
}

unsafe extern "C" fn cq_readerr(c: *mut FidCq, buf: *mut FiCqErrEntry, flags: u64) -> isize {
    guard_object("fi_cq_readerr", c, |cq: &SvnicCq| {
        if flags != 0 {
            return -(FI_EBADFLAGS as isize);
        }
        // SAFETY: the application's entry, per fi_cq_readerr's contract.
        unsafe { cq.inner.readerr(buf) }
    })
}

unsafe extern "C" fn cq_sread(
    c: *mut FidCq,
    buf: *mut c_void,
    count: usize,
    cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: same contract as fi_cq_sreadfrom with no source array.
    unsafe { cq_sreadfrom(c, buf, count, std::ptr::null_mut(), cond, timeout) }
}

/// `fi_cq_sread`: until something arrives or `timeout` ms pass (-1: forever; `-FI_EAGAIN` on
/// timeout): with a YIELD wait object, reads with a `sched_yield` between attempts; with FD,
/// blocks on the descriptor between attempts.
unsafe extern "C" fn cq_sreadfrom(
    c: *mut FidCq,
    buf: *mut c_void,
    count: usize,
    src: *mut u64,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    guard_object("fi_cq_sread", c, |cq: &SvnicCq| {
        if cq.inner.wait_obj == FI_WAIT_NONE {
            return -(FI_ENOSYS as isize);
        }
        if let Some(w) = &cq.inner.fd_wait {
            // SAFETY: the application's buffers, per fi_cq_sread's contract.
            return unsafe { cq.inner.sread_fd(w, buf, count, src, timeout) };
        }
        let deadline = u64::try_from(timeout)
            .ok()
            .map(|ms| std::time::Instant::now() + std::time::Duration::from_millis(ms));
        loop {
            // SAFETY: the application's buffers, per fi_cq_sread's contract.
            let r = unsafe { cq.inner.read(buf, count, src) };
            if r != -(FI_EAGAIN as isize)
                || deadline.is_some_and(|d| std::time::Instant::now() >= d)
            {
                return r;
            }
            std::thread::yield_now();
        }
    })
}

unsafe extern "C" fn cq_strerror(
    _: *mut FidCq,
    prov_errno: c_int,
    _: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    guard("fi_cq_strerror", || eq::strerror(prov_errno, buf, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::null_mut;

    /// Reads into `out`, whose element type must be the queue's format.
    fn read<T>(cq: &CqInner, out: &mut [T], src: *mut u64) -> isize {
        // SAFETY: `out` holds out.len() entries of the queue's format (the callers' choice of
        // T), and `src` is NULL or as long.
        unsafe { cq.read(out.as_mut_ptr().cast(), out.len(), src) }
    }

    fn readerr(cq: &CqInner, e: &mut FiCqErrEntry) -> isize {
        // SAFETY: a whole 1.17 error entry (larger than the 1.0 one).
        unsafe { cq.readerr(e) }
    }

    fn entry(ctx: usize, err: Option<ErrInfo>) -> CqEntry {
        CqEntry {
            ctx,
            flags: op_flags::FI_RECV | op_flags::FI_MSG,
            len: 10 + ctx,
            buf: 0x1000 + ctx,
            data: 0,
            tag: 0,
            err,
        }
    }

    #[test]
    fn entries_are_written_in_every_format_and_errors_stop_reads() {
        // CONTEXT
        let cq = CqInner::new(
            FI_CQ_FORMAT_CONTEXT,
            FI_WAIT_NONE,
            fi_version(1, 17),
            0,
            None,
        );
        cq.push(entry(1, None));
        cq.push(entry(2, None));
        let mut c = [FiCqEntry {
            op_context: null_mut(),
        }; 3];
        assert_eq!(read(&cq, &mut c, null_mut()), 2);
        assert_eq!((c[0].op_context as usize, c[1].op_context as usize), (1, 2));
        assert_eq!(read(&cq, &mut c, null_mut()), -(FI_EAGAIN as isize));

        // MSG, with a source array (no FI_SOURCE: not available)
        let cq = CqInner::new(FI_CQ_FORMAT_MSG, FI_WAIT_NONE, fi_version(1, 17), 0, None);
        cq.push(entry(3, None));
        let mut m = [FiCqMsgEntry {
            op_context: null_mut(),
            flags: 0,
            len: 0,
        }; 2];
        let mut src = [7u64; 2];
        assert_eq!(read(&cq, &mut m, src.as_mut_ptr()), 1);
        assert_eq!(
            (m[0].op_context as usize, m[0].flags, m[0].len),
            (3, op_flags::FI_RECV | op_flags::FI_MSG, 13)
        );
        assert_eq!(src, [FI_ADDR_NOTAVAIL, 7]);

        // TAGGED: the DATA fields, then the tag; an error entry stops the read at it.
        let cq = CqInner::new(
            FI_CQ_FORMAT_TAGGED,
            FI_WAIT_NONE,
            fi_version(1, 17),
            0,
            None,
        );
        let err = ErrInfo {
            err: FI_ETRUNC,
            prov_errno: 1001,
            olen: 5,
        };
        cq.push(CqEntry {
            flags: op_flags::FI_RECV | op_flags::FI_TAGGED | op_flags::FI_REMOTE_CQ_DATA,
            data: 0x66,
            tag: 0x77,
            ..entry(4, None)
        });
        cq.push(entry(5, Some(err)));
        let blank = FiCqTaggedEntry {
            data_entry: FiCqDataEntry {
                op_context: null_mut(),
                flags: 0,
                len: 0,
                buf: null_mut(),
                data: 9,
            },
            tag: 9,
        };
        let mut t = [blank; 2];
        assert_eq!(read(&cq, &mut t, null_mut()), 1);
        let d = t[0].data_entry;
        assert_eq!(
            (
                d.op_context as usize,
                d.len,
                d.buf as usize,
                d.data,
                t[0].tag
            ),
            (4, 14, 0x1004, 0x66, 0x77)
        );
        assert_eq!(t[1].tag, 9, "nothing written past the entries read");
        assert_eq!(read(&cq, &mut t, null_mut()), -(FI_EAVAIL as isize));
        let mut e = FiCqErrEntry {
            op_context: null_mut(),
            flags: 0,
            len: 0,
            buf: null_mut(),
            data: 0,
            tag: 0,
            olen: 0,
            err: 0,
            prov_errno: 0,
            err_data: null_mut(),
            err_data_size: 99,
        };
        assert_eq!(readerr(&cq, &mut e), 1);
        assert_eq!(
            (e.op_context as usize, e.err, e.prov_errno, e.olen, e.len),
            (5, FI_ETRUNC, 1001, 5, 15)
        );
        assert_eq!((e.err_data, e.err_data_size), (null_mut(), 0));
        assert_eq!(readerr(&cq, &mut e), -(FI_EAGAIN as isize));

        // API 1.0 callers have a 72-byte entry: nothing is written at err_data_size.
        let cq = CqInner::new(FI_CQ_FORMAT_DATA, FI_WAIT_NONE, fi_version(1, 0), 0, None);
        cq.push(entry(6, Some(err)));
        e.err_data_size = 99;
        assert_eq!(readerr(&cq, &mut e), 1);
        assert_eq!((e.op_context as usize, e.err_data_size), (6, 99));
    }

    #[test]
    fn trywait_needs_a_wait_object() {
        let cq = CqInner::new(FI_CQ_FORMAT_DATA, FI_WAIT_NONE, fi_version(1, 17), 0, None);
        assert_eq!(cq.trywait(), -FI_EINVAL);
        let cq = CqInner::new(FI_CQ_FORMAT_DATA, FI_WAIT_YIELD, fi_version(1, 17), 0, None);
        assert_eq!(cq.trywait(), 0);
        cq.push(entry(1, None));
        assert_eq!(cq.trywait(), -FI_EAGAIN);
    }
}
