//! A minimal event queue: applications open one even for connectionless endpoints (fi_pingpong
//! does). svnic has no connection events, so it is always empty.

use std::os::raw::{c_char, c_int, c_void};
use std::time::Duration;

use crate::errors::prov_strerror;
use crate::ffi::eq::*;
use crate::ffi::errno::*;
use crate::ffi::{FiOps, FI_CLASS_EQ};
use crate::{close_object, guard, hand_out, object_of, put, FidObject};

/// An event queue.
#[repr(C)]
#[derive(Debug)]
pub struct SvnicEq {
    c: FidEq,
}

fid_object! {
    SvnicEq: FidEq, FI_CLASS_EQ,
    static EQ_FI_OPS = FiOps {
        close: Some(close_object::<SvnicEq>),
        ..FiOps::ENOSYS
    };
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
    let Some(attr) = attr else { return -FI_EINVAL };
    if out.is_null() {
        return -FI_EINVAL;
    }
    if attr.flags != 0 {
        return -FI_EBADFLAGS;
    }
    if !matches!(attr.wait_obj, FI_WAIT_NONE | FI_WAIT_UNSPEC | FI_WAIT_YIELD) {
        return -FI_ENOSYS;
    }
    let eq = SvnicEq {
        c: FidEq {
            fid: SvnicEq::fid(context),
            ops: &EQ_OPS,
        },
    };
    // SAFETY: checked non-NULL.
    unsafe { hand_out(out, eq) };
    0
}

fn check(eq: *mut FidEq) -> isize {
    // SAFETY: the application's EQ, recognised before use.
    if unsafe { object_of::<SvnicEq>(eq) }.is_none() {
        -(FI_EINVAL as isize)
    } else {
        -(FI_EAGAIN as isize)
    }
}

unsafe extern "C" fn eq_read(
    eq: *mut FidEq,
    _: *mut u32,
    _: *mut c_void,
    _: usize,
    _: u64,
) -> isize {
    guard("fi_eq_read", || check(eq))
}

unsafe extern "C" fn eq_readerr(eq: *mut FidEq, _: *mut FiEqErrEntry, _: u64) -> isize {
    guard("fi_eq_readerr", || check(eq))
}

unsafe extern "C" fn eq_sread(
    eq: *mut FidEq,
    _: *mut u32,
    _: *mut c_void,
    _: usize,
    timeout: c_int,
    _: u64,
) -> isize {
    guard("fi_eq_sread", || {
        let r = check(eq);
        if r == -(FI_EAGAIN as isize) {
            // Nothing ever arrives: wait out a finite timeout, never block forever.
            if let Ok(ms) = u64::try_from(timeout) {
                std::thread::sleep(Duration::from_millis(ms.min(60_000)));
            }
        }
        r
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
