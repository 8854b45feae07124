//! The domain: one attachment to svnic (a host-process guest's vhost-user connection to the
//! daemon, or a connection to the VM's guest agent), shared by the endpoints, AVs and CQs opened
//! on it. Memory registration ([`mr`]) is a domain operation.

pub mod mr;

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;

use crate::attach::DomainInner;
use crate::ffi::domain::*;
use crate::ffi::endpoint::FidEp;
use crate::ffi::eq::{FiCqAttr, FidCq};
use crate::ffi::errno::*;
use crate::ffi::*;
use crate::info::FABRIC_NAME;
use crate::{av, cq, ep};
use crate::{close_object, guard, hand_out, object_of, FidObject};

/// A domain.
#[repr(C)]
#[derive(Debug)]
pub struct SvnicDomain {
    c: FidDomain,
    inner: Arc<DomainInner>,
}

// Endpoints, CQs and AVs keep the shared state (and the guest connection) alive until they
// close, so closing the domain only drops its own reference.
fid_object! {
    SvnicDomain: FidDomain, FI_CLASS_DOMAIN,
    static DOMAIN_FI_OPS = FiOps {
        close: Some(close_object::<SvnicDomain>),
        ..FiOps::ENOSYS
    };
}

impl SvnicDomain {
    /// The shared state.
    pub fn inner(&self) -> &Arc<DomainInner> {
        &self.inner
    }
}

static DOMAIN_OPS: FiOpsDomain = FiOpsDomain {
    av_open: Some(domain_av_open),
    cq_open: Some(domain_cq_open),
    endpoint: Some(domain_endpoint),
    endpoint2: Some(domain_endpoint2),
    ..FiOpsDomain::ENOSYS
};

/// `fi_domain`: attaches as [`crate::attach::choose`] says (host-process or VM mode).
///
/// # Safety
/// `out` must be NULL or writable.
pub(crate) unsafe fn open(
    api_version: u32,
    info: Option<&FiInfo>,
    out: *mut *mut FidDomain,
    context: *mut c_void,
) -> c_int {
    let Some(info) = info else { return -FI_EINVAL };
    if out.is_null() {
        return -FI_EINVAL;
    }
    // SAFETY: NULL or the application's attributes.
    if let Some(d) = unsafe { info.domain_attr.as_ref() } {
        // SAFETY: NULL or a C string.
        if !d.name.is_null() && unsafe { CStr::from_ptr(d.name) } != FABRIC_NAME {
            return -FI_EINVAL;
        }
    }
    let inner = match DomainInner::connect(api_version) {
        Ok(i) => i,
        Err(e) => return -e,
    };
    let d = SvnicDomain {
        c: FidDomain {
            fid: SvnicDomain::fid(context),
            ops: &DOMAIN_OPS,
            mr: &mr::MR_OPS,
        },
        inner: Arc::new(inner),
    };
    // SAFETY: checked non-NULL.
    unsafe { hand_out(out, d) };
    0
}

unsafe extern "C" fn domain_av_open(
    d: *mut FidDomain,
    attr: *mut FiAvAttr,
    out: *mut *mut FidAv,
    context: *mut c_void,
) -> c_int {
    guard("fi_av_open", || {
        // SAFETY: recognised before use.
        let Some(_dom) = (unsafe { object_of::<SvnicDomain>(d) }) else {
            return -FI_EINVAL;
        };
        // SAFETY: NULL or the application's attributes (written back: the chosen type).
        av::open(unsafe { attr.as_mut() }, out, context)
    })
}

unsafe extern "C" fn domain_cq_open(
    d: *mut FidDomain,
    attr: *mut FiCqAttr,
    out: *mut *mut FidCq,
    context: *mut c_void,
) -> c_int {
    guard("fi_cq_open", || {
        // SAFETY: recognised before use.
        let Some(dom) = (unsafe { object_of::<SvnicDomain>(d) }) else {
            return -FI_EINVAL;
        };
        // SAFETY: NULL or the application's attributes.
        cq::open(
            dom.inner().api_version,
            dom.inner().cfg.yield_after,
            unsafe { attr.as_mut() },
            out,
            context,
        )
    })
}

unsafe extern "C" fn domain_endpoint(
    d: *mut FidDomain,
    info: *mut FiInfo,
    out: *mut *mut FidEp,
    context: *mut c_void,
) -> c_int {
    guard("fi_endpoint", || {
        // SAFETY: recognised before use.
        let Some(dom) = (unsafe { object_of::<SvnicDomain>(d) }) else {
            return -FI_EINVAL;
        };
        // SAFETY: NULL or the application's fi_info.
        ep::open(dom.inner(), unsafe { info.as_ref() }, out, context)
    })
}

unsafe extern "C" fn domain_endpoint2(
    d: *mut FidDomain,
    info: *mut FiInfo,
    out: *mut *mut FidEp,
    flags: u64,
    context: *mut c_void,
) -> c_int {
    if flags != 0 {
        return -FI_EBADFLAGS;
    }
    // SAFETY: same contract as fi_endpoint.
    unsafe { domain_endpoint(d, info, out, context) }
}
