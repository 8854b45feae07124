//! A minimal event queue: applications open one even for connectionless endpoints (fi_pingpong
//! does). svnic has no connection events, so it is always empty.

use std::os::raw::{c_char, c_int, c_void};
use std::time::Duration;

use crate::errors::prov_strerror;
use crate::ffi::eq::*;
use crate::ffi::errno::*;
use crate::ffi::FI_CLASS_EQ;
use crate::{guard, guard_object, open_object, put, FidObject};

fid_object! {
    /// An event queue.
    pub struct SvnicEq: FidEq, FI_CLASS_EQ {}
}

static EQ_OPS: FiOpsEq = FiOpsEq {
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
    ..FiOpsEq::ENOSYS
};

/// `fi_eq_open`: wait objects NONE, UNSPEC and YIELD (there is never anything to wait for).
pub(crate) fn open(attr: Option<&FiEqAttr>, out: *mut *mut FidEq, context: *mut c_void) -> c_int {
    open_object(attr, out, |attr| {
        if attr.flags != 0 {
            return Err(FI_EBADFLAGS);
        }
        if !matches!(attr.wait_obj, FI_WAIT_NONE | FI_WAIT_UNSPEC | FI_WAIT_YIELD) {
            return Err(FI_ENOSYS);
        }
        Ok(SvnicEq {
            c: FidEq {
                fid: SvnicEq::fid(context),
                ops: &EQ_OPS,
            },
        })
    })
}

/// What every read of the (always empty) queue returns.
const EMPTY: isize = -(FI_EAGAIN as isize);

unsafe extern "C" fn eq_read(
    eq: *mut FidEq,
    _: *mut u32,
    _: *mut c_void,
    _: usize,
    _: u64,
) -> isize {
    guard_object("fi_eq_read", eq, |_: &SvnicEq| EMPTY)
}

unsafe extern "C" fn eq_readerr(eq: *mut FidEq, _: *mut FiEqErrEntry, _: u64) -> isize {
    guard_object("fi_eq_readerr", eq, |_: &SvnicEq| EMPTY)
}

unsafe extern "C" fn eq_sread(
    eq: *mut FidEq,
    _: *mut u32,
    _: *mut c_void,
    _: usize,
    timeout: c_int,
    _: u64,
) -> isize {
    guard_object("fi_eq_sread", eq, |_: &SvnicEq| {
        // Nothing ever arrives: wait out a finite timeout, never block forever.
        if let Ok(ms) = u64::try_from(timeout) {
            std::thread::sleep(Duration::from_millis(ms.min(60_000)));
        }
        EMPTY
    })
}

/// `fi_eq_strerror` and `fi_cq_strerror`: the provider string of `prov_errno`, copied into
/// `buf` when the caller gives one (it may pass NULL and 0).
pub(crate) fn strerror(prov_errno: c_int, buf: *mut c_char, len: usize) -> *const c_char {
    let s = prov_strerror(prov_errno);
    if buf.is_null() || len == 0 {
        return s.as_ptr();
    }
    let bytes = s.to_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: the caller's buffer holds `len` bytes; n + 1 <= len.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n) };
    // SAFETY: as above.
    unsafe { put(buf.wrapping_add(n), 0) };
    buf
}

unsafe extern "C" fn eq_strerror(
    _: *mut FidEq,
    prov_errno: c_int,
    _: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    guard("fi_eq_strerror", || strerror(prov_errno, buf, len))
}
