//! Memory registration: svnic requires none (every payload is copied through the channel's data
//! area), but applications may register anyway; a registration is a key and nothing else.

use std::os::raw::{c_int, c_void};

use super::SvnicDomain;
use crate::ffi::domain::{FiOpsMr, FidMr};
use crate::ffi::errno::*;
use crate::ffi::{Fid, FI_CLASS_MR};
use crate::{guard_fid, hand_out, FidObject};

fid_object! {
    /// A registration.
    pub struct SvnicMr: FidMr, FI_CLASS_MR {}
}

/// The `mr` table of every domain.
pub(crate) static MR_OPS: FiOpsMr = FiOpsMr {
    reg: Some(mr_reg::<c_void>),
    regv: Some(mr_reg::<libc::iovec>),
    ..FiOpsMr::ENOSYS
};

/// `fi_mr_reg` (`T = c_void`: a buffer of `len` bytes) and `fi_mr_regv` (`T = iovec`: `len`
/// entries): the memory itself is never used.
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn mr_reg<T>(
    domain: *mut Fid,
    mem: *const T,
    len: usize,
    _access: u64,
    _offset: u64,
    key: u64,
    flags: u64,
    out: *mut *mut FidMr,
    context: *mut c_void,
) -> c_int {
    guard_fid("fi_mr_reg", domain, |_: &SvnicDomain| {
        if (mem.is_null() && len > 0) || out.is_null() {
            return -FI_EINVAL;
        }
        if flags != 0 {
            return -FI_EBADFLAGS;
        }
        let mr = SvnicMr {
            c: FidMr {
                fid: SvnicMr::fid(context),
                mem_desc: std::ptr::null_mut(),
                key,
            },
        };
        // SAFETY: checked non-NULL.
        unsafe { hand_out(out, mr) };
        0
    })
}
