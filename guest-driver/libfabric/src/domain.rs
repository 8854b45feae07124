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
use crate::{guard_object, open_object, FidObject};

fid_object! {
    /// A domain.
    pub struct SvnicDomain: FidDomain, FI_CLASS_DOMAIN {
        /// The shared state. Endpoints, CQs and AVs keep it (and the guest connection) alive
        /// until they close, so closing the domain only drops its own reference.
        inner: Arc<DomainInner>,
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
pub(crate) fn open(
    api_version: u32,
    info: Option<&FiInfo>,
    out: *mut *mut FidDomain,
    context: *mut c_void,
) -> c_int {
    open_object(info, out, |info| {
        // SAFETY: NULL or the application's attributes.
        if let Some(d) = unsafe { info.domain_attr.as_ref() } {
            // SAFETY: NULL or a C string.
            if !d.name.is_null() && unsafe { CStr::from_ptr(d.name) } != FABRIC_NAME {
                return Err(FI_EINVAL);
            }
        }
        Ok(SvnicDomain {
            c: FidDomain {
                fid: SvnicDomain::fid(context),
                ops: &DOMAIN_OPS,
                mr: &mr::MR_OPS,
            },
            inner: Arc::new(DomainInner::connect(api_version)?),
        })
    })
}

unsafe extern "C" fn domain_av_open(
    d: *mut FidDomain,
    attr: *mut FiAvAttr,
    out: *mut *mut FidAv,
    context: *mut c_void,
) -> c_int {
    guard_object("fi_av_open", d, |_: &SvnicDomain| {
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
    guard_object("fi_cq_open", d, |dom: &SvnicDomain| {
        let inner = dom.inner();
        // SAFETY: NULL or the application's attributes (written back: the chosen format).
        let attr = unsafe { attr.as_mut() };
        cq::open(inner.api_version, inner.cfg.yield_after, attr, out, context)
    })
}

unsafe extern "C" fn domain_endpoint(
    d: *mut FidDomain,
    info: *mut FiInfo,
    out: *mut *mut FidEp,
    context: *mut c_void,
) -> c_int {
    guard_object("fi_endpoint", d, |dom: &SvnicDomain| {
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
