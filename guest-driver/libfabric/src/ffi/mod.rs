//! Hand-written `#[repr(C)]` mirrors of the libfabric 1.17 headers (`/usr/include/rdma`): this
//! module is `rdma/fabric.h` (`struct fid`, `fi_info` and its attributes, the fabric object,
//! constants), and one child module per other header (the endpoint's extensions — `fi_cm.h`,
//! `fi_tagged.h`, `fi_rma.h`, `fi_atomic.h`, `fi_collective.h` — under [`endpoint`]). Every struct carries compile-time size (and key offset) assertions with
//! the values measured against the installed headers on x86_64 (docs/libfabric.md, "Layouts").
//!
//! Rules: `usize` for `size_t`, `u64` for `uint64_t`/`fi_addr_t`, `c_int` for `int` and for every
//! C enum field (an out-of-range value from C must not be undefined behaviour), raw pointers for
//! pointers, and `Option<unsafe extern "C" fn ..>` for function pointers.

use std::os::raw::{c_char, c_int, c_void};

use self::domain::FidDomain;
use self::eq::{FiEqAttr, FidEq};

/// What a slot of an operations table returns when it is not implemented: `-FI_ENOSYS` for
/// integer results, NULL for string results.
pub trait StubReturn {
    /// The "not implemented" value.
    fn enosys() -> Self;
}

impl StubReturn for isize {
    fn enosys() -> Self {
        -(errno::FI_ENOSYS as isize)
    }
}

impl StubReturn for c_int {
    fn enosys() -> Self {
        -errno::FI_ENOSYS
    }
}

impl StubReturn for *const c_char {
    fn enosys() -> Self {
        std::ptr::null()
    }
}

/// Declares a libfabric operations table: a `#[repr(C)]` struct with `size` and one nullable
/// function pointer per slot, and the constant `ENOSYS` whose every slot is a function returning
/// [`StubReturn::enosys`] (libfabric's inline wrappers call slots without checking them, so no
/// slot the provider hands out may be NULL).
macro_rules! ops_table {
    ($(#[$m:meta])* $name:ident { $($field:ident : fn($($arg:ty),*) -> $ret:ty;)* }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug)]
        pub struct $name {
            /// `sizeof` this table (read by `FI_CHECK_OP`).
            pub size: usize,
            $(#[allow(missing_docs)] pub $field: Option<unsafe extern "C" fn($($arg),*) -> $ret>,)*
        }

        impl $name {
            /// The table with every slot returning "not implemented".
            pub const ENOSYS: $name = $name {
                size: std::mem::size_of::<$name>(),
                $($field: {
                    unsafe extern "C" fn stub($(_: $arg),*) -> $ret {
                        <$ret as $crate::ffi::StubReturn>::enosys()
                    }
                    Some(stub)
                },)*
            };
        }
    };
}

/// `const _: () = assert_layout!(Type, size, field @ offset, ..);` in one line per struct.
macro_rules! assert_layout {
    ($t:ty, $size:expr $(, $field:ident @ $off:expr)*) => {
        const _: () = {
            assert!(std::mem::size_of::<$t>() == $size);
            $(assert!(std::mem::offset_of!($t, $field) == $off);)*
        };
    };
}

pub mod domain;
pub mod endpoint;
pub mod eq;
pub mod errno;
pub mod prov;

/// `FI_VERSION(major, minor)`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

pub const FI_CLASS_FABRIC: usize = 1;
pub const FI_CLASS_DOMAIN: usize = 2;
pub const FI_CLASS_EP: usize = 3;
pub const FI_CLASS_AV: usize = 11;
pub const FI_CLASS_MR: usize = 12;
pub const FI_CLASS_EQ: usize = 13;
pub const FI_CLASS_CQ: usize = 14;
pub const FI_CLASS_CNTR: usize = 15;

/// `fi_control` commands.
pub const FI_GETWAIT: c_int = 5;
pub const FI_ENABLE: c_int = 6;
pub const FI_GETWAITOBJ: c_int = 16;

/// Capability bits (`fi_info.caps`, tx/rx/domain caps).
pub mod caps {
    pub const FI_MSG: u64 = 1 << 1;
    pub const FI_TAGGED: u64 = 1 << 3;
    pub const FI_RECV: u64 = 1 << 10;
    pub const FI_SEND: u64 = 1 << 11;
    pub const FI_DIRECTED_RECV: u64 = 1 << 59;
    pub const FI_LOCAL_COMM: u64 = 1 << 51;
    pub const FI_REMOTE_COMM: u64 = 1 << 52;
}

/// Operation flags (send/recv `flags`, completion entry `flags`) and bind flags.
pub mod op_flags {
    pub const FI_MSG: u64 = 1 << 1;
    pub const FI_TAGGED: u64 = 1 << 3;
    pub const FI_RECV: u64 = 1 << 10;
    pub const FI_SEND: u64 = 1 << 11;
    pub const FI_TRANSMIT: u64 = FI_SEND;
    pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
    pub const FI_MORE: u64 = 1 << 18;
    pub const FI_PEEK: u64 = 1 << 19;
    /// With `FI_PEEK`: take the message found out of matching for a later `FI_CLAIM` receive; on a
    /// receive: the message claimed with the same context (the same bit as `FI_SELECTIVE_COMPLETION`).
    pub const FI_CLAIM: u64 = 1 << 59;
    /// With `FI_PEEK` or `FI_CLAIM`: drop the message instead of receiving it.
    pub const FI_DISCARD: u64 = 1 << 58;
    pub const FI_COMPLETION: u64 = 1 << 24;
    pub const FI_INJECT: u64 = 1 << 25;
    pub const FI_INJECT_COMPLETE: u64 = 1 << 26;
    pub const FI_TRANSMIT_COMPLETE: u64 = 1 << 27;
    pub const FI_DELIVERY_COMPLETE: u64 = 1 << 28;
    /// Bind flag of `fi_ep_bind(ep, cq, ..)` (the same bit as `FI_DIRECTED_RECV` in caps).
    pub const FI_SELECTIVE_COMPLETION: u64 = 1 << 59;
}

/// `fi_getinfo` flags libfabric passes internally (`include/ofi.h` of 1.17).
pub const OFI_CORE_PROV_ONLY: u64 = 1 << 59;

pub const FI_ADDR_NOTAVAIL: u64 = u64::MAX;
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
pub const FI_FORMAT_UNSPEC: u32 = 0;
pub const FI_PROV_SPECIFIC: u32 = 1 << 31;

pub const FI_EP_UNSPEC: c_int = 0;
pub const FI_EP_DGRAM: c_int = 2;
pub const FI_EP_RDM: c_int = 3;
/// `msg_order` bit: sends to one peer are delivered in the order they were posted.
pub const FI_ORDER_SAS: u64 = 1 << 8;
/// `mem_tag_format` of a provider that leaves all 64 tag bits to the application.
pub const FI_TAG_GENERIC: u64 = 0xAAAA_AAAA_AAAA_AAAA;
pub const FI_AV_UNSPEC: c_int = 0;
pub const FI_AV_MAP: c_int = 1;
pub const FI_AV_TABLE: c_int = 2;
pub const FI_THREAD_UNSPEC: c_int = 0;
pub const FI_THREAD_SAFE: c_int = 1;
pub const FI_PROGRESS_UNSPEC: c_int = 0;
pub const FI_PROGRESS_AUTO: c_int = 1;
pub const FI_PROGRESS_MANUAL: c_int = 2;
pub const FI_RM_ENABLED: c_int = 2;

/// `struct fid`: the head of every libfabric object.
#[repr(C)]
#[derive(Debug)]
pub struct Fid {
    pub fclass: usize,
    pub context: *mut c_void,
    pub ops: *const FiOps,
}

ops_table! {
    /// `struct fi_ops`: close, bind, control, ... of every fid.
    FiOps {
        close: fn(*mut Fid) -> c_int;
        bind: fn(*mut Fid, *mut Fid, u64) -> c_int;
        control: fn(*mut Fid, c_int, *mut c_void) -> c_int;
        ops_open: fn(*mut Fid, *const c_char, u64, *mut *mut c_void, *mut c_void) -> c_int;
        tostr: fn(*const Fid, *mut c_char, usize) -> c_int;
        ops_set: fn(*mut Fid, *const c_char, u64, *mut c_void, *mut c_void) -> c_int;
    }
}

#[repr(C)]
#[derive(Debug)]
pub struct FiTxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub inject_size: usize,
    pub size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub tclass: u32,
}

#[repr(C)]
#[derive(Debug)]
pub struct FiRxAttr {
    pub caps: u64,
    pub mode: u64,
    pub op_flags: u64,
    pub msg_order: u64,
    pub comp_order: u64,
    pub total_buffered_recv: usize,
    pub size: usize,
    pub iov_limit: usize,
}

#[repr(C)]
#[derive(Debug)]
pub struct FiEpAttr {
    pub type_: c_int,
    pub protocol: u32,
    pub protocol_version: u32,
    pub max_msg_size: usize,
    pub msg_prefix_size: usize,
    pub max_order_raw_size: usize,
    pub max_order_war_size: usize,
    pub max_order_waw_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub auth_key_size: usize,
    pub auth_key: *mut u8,
}

#[repr(C)]
#[derive(Debug)]
pub struct FiDomainAttr {
    pub domain: *mut FidDomain,
    pub name: *mut c_char,
    pub threading: c_int,
    pub control_progress: c_int,
    pub data_progress: c_int,
    pub resource_mgmt: c_int,
    pub av_type: c_int,
    pub mr_mode: c_int,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub cq_cnt: usize,
    pub ep_cnt: usize,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub max_ep_tx_ctx: usize,
    pub max_ep_rx_ctx: usize,
    pub max_ep_stx_ctx: usize,
    pub max_ep_srx_ctx: usize,
    pub cntr_cnt: usize,
    pub mr_iov_limit: usize,
    pub caps: u64,
    pub mode: u64,
    pub auth_key: *mut u8,
    pub auth_key_size: usize,
    pub max_err_data: usize,
    pub mr_cnt: usize,
    pub tclass: u32,
}

#[repr(C)]
#[derive(Debug)]
pub struct FiFabricAttr {
    pub fabric: *mut FidFabric,
    pub name: *mut c_char,
    pub prov_name: *mut c_char,
    pub prov_version: u32,
    pub api_version: u32,
}

/// `struct fi_info`. Every pointer in a returned list is released by libfabric with `free()`.
#[repr(C)]
#[derive(Debug)]
pub struct FiInfo {
    pub next: *mut FiInfo,
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub src_addrlen: usize,
    pub dest_addrlen: usize,
    pub src_addr: *mut c_void,
    pub dest_addr: *mut c_void,
    pub handle: *mut Fid,
    pub tx_attr: *mut FiTxAttr,
    pub rx_attr: *mut FiRxAttr,
    pub ep_attr: *mut FiEpAttr,
    pub domain_attr: *mut FiDomainAttr,
    pub fabric_attr: *mut FiFabricAttr,
    pub nic: *mut c_void,
}

ops_table! {
    /// `struct fi_ops_fabric`.
    FiOpsFabric {
        domain: fn(*mut FidFabric, *mut FiInfo, *mut *mut FidDomain, *mut c_void) -> c_int;
        passive_ep: fn(*mut FidFabric, *mut FiInfo, *mut *mut c_void, *mut c_void) -> c_int;
        eq_open: fn(*mut FidFabric, *mut FiEqAttr, *mut *mut FidEq, *mut c_void) -> c_int;
        wait_open: fn(*mut FidFabric, *mut c_void, *mut *mut c_void) -> c_int;
        trywait: fn(*mut FidFabric, *mut *mut Fid, c_int) -> c_int;
        domain2: fn(*mut FidFabric, *mut FiInfo, *mut *mut FidDomain, u64, *mut c_void) -> c_int;
    }
}

#[repr(C)]
#[derive(Debug)]
pub struct FidFabric {
    pub fid: Fid,
    pub ops: *const FiOpsFabric,
    pub api_version: u32,
}

assert_layout!(Fid, 24, fclass @ 0, context @ 8, ops @ 16);
assert_layout!(FiOps, 56);
assert_layout!(FiTxAttr, 80, inject_size @ 40, size @ 48, iov_limit @ 56, rma_iov_limit @ 64, tclass @ 72);
assert_layout!(FiRxAttr, 64, total_buffered_recv @ 40, size @ 48, iov_limit @ 56);
assert_layout!(FiEpAttr, 96, type_ @ 0, protocol @ 4, protocol_version @ 8, max_msg_size @ 16, msg_prefix_size @ 24, mem_tag_format @ 56, tx_ctx_cnt @ 64, rx_ctx_cnt @ 72, auth_key_size @ 80, auth_key @ 88);
assert_layout!(FiDomainAttr, 192, name @ 8, threading @ 16, control_progress @ 20, data_progress @ 24, resource_mgmt @ 28, av_type @ 32, mr_mode @ 36, mr_key_size @ 40, cq_data_size @ 48, cq_cnt @ 56, mr_iov_limit @ 128, caps @ 136, mode @ 144, auth_key @ 152, auth_key_size @ 160, max_err_data @ 168, mr_cnt @ 176, tclass @ 184);
assert_layout!(FiFabricAttr, 32, prov_version @ 24, api_version @ 28);
assert_layout!(FiInfo, 120, caps @ 8, mode @ 16, addr_format @ 24, src_addrlen @ 32, dest_addrlen @ 40, src_addr @ 48, dest_addr @ 56, handle @ 64, tx_attr @ 72, rx_attr @ 80, ep_attr @ 88, domain_attr @ 96, fabric_attr @ 104, nic @ 112);
assert_layout!(FidFabric, 40, ops @ 24, api_version @ 32);
assert_layout!(FiOpsFabric, 56);
