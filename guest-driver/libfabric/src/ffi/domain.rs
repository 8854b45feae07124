//! `rdma/fi_domain.h`: the domain, memory regions and address vectors.

use std::os::raw::{c_char, c_int, c_void};

use super::endpoint::FidEp;
use super::eq::{FiCqAttr, FidCq};
use super::{FiInfo, FiRxAttr, FiTxAttr, Fid};

ops_table! {
    /// `struct fi_ops_domain`.
    FiOpsDomain {
        av_open: fn(*mut FidDomain, *mut FiAvAttr, *mut *mut FidAv, *mut c_void) -> c_int;
        cq_open: fn(*mut FidDomain, *mut FiCqAttr, *mut *mut FidCq, *mut c_void) -> c_int;
        endpoint: fn(*mut FidDomain, *mut FiInfo, *mut *mut FidEp, *mut c_void) -> c_int;
        scalable_ep: fn(*mut FidDomain, *mut FiInfo, *mut *mut FidEp, *mut c_void) -> c_int;
        cntr_open: fn(*mut FidDomain, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int;
        poll_open: fn(*mut FidDomain, *mut c_void, *mut *mut c_void) -> c_int;
        stx_ctx: fn(*mut FidDomain, *mut FiTxAttr, *mut *mut c_void, *mut c_void) -> c_int;
        srx_ctx: fn(*mut FidDomain, *mut FiRxAttr, *mut *mut FidEp, *mut c_void) -> c_int;
        query_atomic: fn(*mut FidDomain, c_int, c_int, *mut c_void, u64) -> c_int;
        query_collective: fn(*mut FidDomain, c_int, *mut c_void, u64) -> c_int;
        endpoint2: fn(*mut FidDomain, *mut FiInfo, *mut *mut FidEp, u64, *mut c_void) -> c_int;
    }
}

ops_table! {
    /// `struct fi_ops_mr` (called with `&domain->fid`).
    FiOpsMr {
        reg: fn(*mut Fid, *const c_void, usize, u64, u64, u64, u64, *mut *mut FidMr, *mut c_void) -> c_int;
        regv: fn(*mut Fid, *const libc::iovec, usize, u64, u64, u64, u64, *mut *mut FidMr, *mut c_void) -> c_int;
        regattr: fn(*mut Fid, *const c_void, u64, *mut *mut FidMr) -> c_int;
    }
}

#[repr(C)]
#[derive(Debug)]
pub struct FidDomain {
    pub fid: Fid,
    pub ops: *const FiOpsDomain,
    pub mr: *const FiOpsMr,
}

#[repr(C)]
#[derive(Debug)]
pub struct FidMr {
    pub fid: Fid,
    pub mem_desc: *mut c_void,
    pub key: u64,
}

#[repr(C)]
#[derive(Debug)]
pub struct FiAvAttr {
    pub type_: c_int,
    pub rx_ctx_bits: c_int,
    pub count: usize,
    pub ep_per_node: usize,
    pub name: *const c_char,
    pub map_addr: *mut c_void,
    pub flags: u64,
}

ops_table! {
    /// `struct fi_ops_av`.
    FiOpsAv {
        insert: fn(*mut FidAv, *const c_void, usize, *mut u64, u64, *mut c_void) -> c_int;
        insertsvc: fn(*mut FidAv, *const c_char, *const c_char, *mut u64, u64, *mut c_void) -> c_int;
        insertsym: fn(*mut FidAv, *const c_char, usize, *const c_char, usize, *mut u64, u64, *mut c_void) -> c_int;
        remove: fn(*mut FidAv, *mut u64, usize, u64) -> c_int;
        lookup: fn(*mut FidAv, u64, *mut c_void, *mut usize) -> c_int;
        straddr: fn(*mut FidAv, *const c_void, *mut c_char, *mut usize) -> *const c_char;
        av_set: fn(*mut FidAv, *mut c_void, *mut *mut c_void, *mut c_void) -> c_int;
    }
}

#[repr(C)]
#[derive(Debug)]
pub struct FidAv {
    pub fid: Fid,
    pub ops: *const FiOpsAv,
}

assert_layout!(FiOpsDomain, 96);
assert_layout!(FiOpsMr, 32);
assert_layout!(FidDomain, 40, ops @ 24, mr @ 32);
assert_layout!(FidMr, 40, mem_desc @ 24, key @ 32);
assert_layout!(FiAvAttr, 48, rx_ctx_bits @ 4, count @ 8, ep_per_node @ 16, name @ 24, map_addr @ 32, flags @ 40);
assert_layout!(FiOpsAv, 64);
assert_layout!(FidAv, 32, ops @ 24);
