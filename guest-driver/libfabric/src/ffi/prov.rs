//! `rdma/providers/fi_prov.h`: what `fi_prov_ini` returns.

use std::os::raw::{c_char, c_int, c_void};

use super::{FiFabricAttr, FiInfo, FidFabric};

/// `struct fi_context`: four pointers of scratch space (libfabric's own state in the provider).
#[repr(C)]
#[derive(Debug)]
pub struct FiContext {
    /// Opaque to the provider.
    pub internal: [*mut c_void; 4],
}

/// `getinfo` of `struct fi_provider`: (version, node, service, flags, hints, info).
pub type GetinfoFn = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const FiInfo,
    *mut *mut FiInfo,
) -> c_int;
/// `fabric` of `struct fi_provider`.
pub type FabricFn = unsafe extern "C" fn(
    attr: *mut FiFabricAttr,
    fabric: *mut *mut FidFabric,
    context: *mut c_void,
) -> c_int;

/// `struct fi_provider`. libfabric writes `context` at registration: the instance must be in
/// writable memory.
#[repr(C)]
#[derive(Debug)]
pub struct FiProvider {
    pub version: u32,
    pub fi_version: u32,
    pub context: FiContext,
    pub name: *const c_char,
    pub getinfo: Option<GetinfoFn>,
    pub fabric: Option<FabricFn>,
    pub cleanup: Option<unsafe extern "C" fn()>,
}

assert_layout!(FiContext, 32);
assert_layout!(FiProvider, 72, version @ 0, fi_version @ 4, context @ 8, name @ 40, getinfo @ 48, fabric @ 56, cleanup @ 64);
