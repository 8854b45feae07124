//! The fabric object: `fi_fabric` and the fabric operations (domain, eq_open, trywait).

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};

use crate::cq::SvnicCq;
use crate::domain;
use crate::eq;
use crate::ffi::domain::FidDomain;
use crate::ffi::eq::{FiEqAttr, FidEq};
use crate::ffi::errno::*;
use crate::ffi::*;
use crate::info::FABRIC_NAME;
use crate::{guard, guard_object, object, open_object, FidObject};

fid_object! {
    /// A fabric: nothing but its fid (every domain connects on its own).
    pub struct SvnicFabric: FidFabric, FI_CLASS_FABRIC {}
}

static FABRIC_OPS: FiOpsFabric = FiOpsFabric {
    domain: Some(fabric_domain),
    eq_open: Some(fabric_eq_open),
    trywait: Some(fabric_trywait),
    domain2: Some(fabric_domain2),
    ..FiOpsFabric::ENOSYS
};

impl SvnicFabric {
    /// The API version libfabric recorded in the fabric (it writes it after `fi_fabric`).
    pub fn api_version(&self) -> u32 {
        self.c.api_version
    }
}

/// `fabric` of `struct fi_provider`.
pub(crate) unsafe extern "C" fn svnic_fabric(
    attr: *mut FiFabricAttr,
    fabric: *mut *mut FidFabric,
    context: *mut c_void,
) -> c_int {
    guard("fi_fabric", || {
        // SAFETY: libfabric passes NULL or a valid attribute struct.
        open_object(unsafe { attr.as_ref() }, fabric, |attr| {
            // SAFETY: NULL or a C string of the application's attributes.
            if attr.name.is_null() || unsafe { CStr::from_ptr(attr.name) } != FABRIC_NAME {
                return Err(FI_EINVAL);
            }
            Ok(SvnicFabric {
                c: FidFabric {
                    fid: SvnicFabric::fid(context),
                    ops: &FABRIC_OPS,
                    api_version: attr.api_version,
                },
            })
        })
    })
}

unsafe extern "C" fn fabric_domain(
    fabric: *mut FidFabric,
    info: *mut FiInfo,
    dom: *mut *mut FidDomain,
    context: *mut c_void,
) -> c_int {
    guard_object("fi_domain", fabric, |f: &SvnicFabric| {
        // SAFETY: NULL or the application's fi_info.
        domain::open(f.api_version(), unsafe { info.as_ref() }, dom, context)
    })
}

unsafe extern "C" fn fabric_domain2(
    fabric: *mut FidFabric,
    info: *mut FiInfo,
    dom: *mut *mut FidDomain,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    if flags != 0 {
        return -FI_EBADFLAGS;
    }
    // SAFETY: same contract as fi_domain.
    unsafe { fabric_domain(fabric, info, dom, context) }
}

unsafe extern "C" fn fabric_eq_open(
    fabric: *mut FidFabric,
    attr: *mut FiEqAttr,
    out: *mut *mut FidEq,
    context: *mut c_void,
) -> c_int {
    guard_object("fi_eq_open", fabric, |_: &SvnicFabric| {
        // SAFETY: NULL or the application's attributes.
        eq::open(unsafe { attr.as_ref() }, out, context)
    })
}

/// `fi_trywait`: 0 when every fid may be waited on (nothing pending), `-FI_EAGAIN` when one
/// has something to read, `-FI_EINVAL` for a fid that is not an svnic CQ/EQ with a wait object.
unsafe extern "C" fn fabric_trywait(
    fabric: *mut FidFabric,
    fids: *mut *mut Fid,
    count: c_int,
) -> c_int {
    guard_object("fi_trywait", fabric, |_: &SvnicFabric| {
        let Ok(n) = usize::try_from(count) else {
            return -FI_EINVAL;
        };
        if fids.is_null() && n > 0 {
            return -FI_EINVAL;
        }
        for k in 0..n {
            // SAFETY: the application passes `count` fid pointers.
            let fid = unsafe { fids.wrapping_add(k).read() };
            // SAFETY: the application's fid, recognised before use.
            if let Some(cq) = unsafe { object::<SvnicCq>(fid) } {
                let r = cq.inner().trywait();
                if r != 0 {
                    return r;
                }
            // SAFETY: as above.
            } else if unsafe { object::<eq::SvnicEq>(fid) }.is_none() {
                return -FI_EINVAL;
            }
        }
        0
    })
}
