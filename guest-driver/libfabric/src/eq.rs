//! A minimal event queue: applications open one even for connectionless endpoints (fi_pingpong
//! does). svnic has no connection events, so it is always empty.

use std::os::raw::{c_char, c_int, c_void};
use std::time::Duration;

use crate::errors::prov_strerror;
use crate::ffi::eq::*;
use crate::ffi::errno::*;
use crate::ffi::{FiOps, Fid, FI_CLASS_EQ};
use crate::{free_object, guard, object, put, FidObject};

/// An event queue.
#[repr(C)]
#[derive(Debug)]
pub struct SvnicEq {
    c: FidEq,
}

// SAFETY: repr(C), FidEq (which begins with struct fid) first, EQ_FI_OPS is its own.
unsafe impl FidObject for SvnicEq {
    const CLASS: usize = FI_CLASS_EQ;
    fn fi_ops() -> *const FiOps {
        &EQ_FI_OPS
    }
}

static EQ_FI_OPS: FiOps = FiOps {
    close: Some(eq_close),
    ..FiOps::ENOSYS
};

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
    let eq = Box::new(SvnicEq {
        c: FidEq {
            fid: Fid {
                fclass: FI_CLASS_EQ,
                context,
                ops: &EQ_FI_OPS,
            },
            ops: &EQ_OPS,
        },
    });
    // SAFETY: checked non-NULL.
    unsafe { put(out, Box::into_raw(eq).cast::<FidEq>()) };
    0
}

unsafe extern "C" fn eq_close(fid: *mut Fid) -> c_int {
    guard("eq close", || {
        // SAFETY: the application's fid, recognised before use.
        if unsafe { object::<SvnicEq>(fid) }.is_none() {
            return -FI_EINVAL;
        }
        // SAFETY: recognised, from Box::into_raw, closed once.
        unsafe { free_object::<SvnicEq>(fid) };
        0
    })
}

fn check(eq: *mut FidEq) -> isize {
    // SAFETY: a fid_eq begins with its fid; recognised before use.
    if unsafe { object::<SvnicEq>(eq.cast()) }.is_none() {
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
