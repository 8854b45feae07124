//! `rdma/fi_eq.h`: completion queues and event queues.

use std::os::raw::{c_char, c_int, c_void};

use super::Fid;

pub const FI_CQ_FORMAT_UNSPEC: c_int = 0;
pub const FI_CQ_FORMAT_CONTEXT: c_int = 1;
pub const FI_CQ_FORMAT_MSG: c_int = 2;
pub const FI_CQ_FORMAT_DATA: c_int = 3;
pub const FI_CQ_FORMAT_TAGGED: c_int = 4;

pub const FI_WAIT_NONE: c_int = 0;
pub const FI_WAIT_UNSPEC: c_int = 1;
pub const FI_WAIT_SET: c_int = 2;
pub const FI_WAIT_FD: c_int = 3;
pub const FI_WAIT_MUTEX_COND: c_int = 4;
pub const FI_WAIT_YIELD: c_int = 5;

#[repr(C)]
#[derive(Debug)]
pub struct FiCqAttr {
    pub size: usize,
    pub flags: u64,
    pub format: c_int,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_cond: c_int,
    pub wait_set: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FiCqEntry {
    pub op_context: *mut c_void,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FiCqMsgEntry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FiCqDataEntry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FiCqTaggedEntry {
    /// The fields of `struct fi_cq_data_entry`, in the same order.
    pub data_entry: FiCqDataEntry,
    pub tag: u64,
}

/// `struct fi_cq_err_entry` (1.5 and later; callers of API 1.0 have only the first 72 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FiCqErrEntry {
    pub op_context: *mut c_void,
    pub flags: u64,
    pub len: usize,
    pub buf: *mut c_void,
    pub data: u64,
    pub tag: u64,
    pub olen: usize,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

ops_table! {
    /// `struct fi_ops_cq`.
    FiOpsCq {
        read: fn(*mut FidCq, *mut c_void, usize) -> isize;
        readfrom: fn(*mut FidCq, *mut c_void, usize, *mut u64) -> isize;
        readerr: fn(*mut FidCq, *mut FiCqErrEntry, u64) -> isize;
        sread: fn(*mut FidCq, *mut c_void, usize, *const c_void, c_int) -> isize;
        sreadfrom: fn(*mut FidCq, *mut c_void, usize, *mut u64, *const c_void, c_int) -> isize;
        signal: fn(*mut FidCq) -> c_int;
        strerror: fn(*mut FidCq, c_int, *const c_void, *mut c_char, usize) -> *const c_char;
    }
}

#[repr(C)]
#[derive(Debug)]
pub struct FidCq {
    pub fid: Fid,
    pub ops: *const FiOpsCq,
}

#[repr(C)]
#[derive(Debug)]
pub struct FiEqAttr {
    pub size: usize,
    pub flags: u64,
    pub wait_obj: c_int,
    pub signaling_vector: c_int,
    pub wait_set: *mut c_void,
}

#[repr(C)]
#[derive(Debug)]
pub struct FiEqErrEntry {
    pub fid: *mut Fid,
    pub context: *mut c_void,
    pub data: u64,
    pub err: c_int,
    pub prov_errno: c_int,
    pub err_data: *mut c_void,
    pub err_data_size: usize,
}

ops_table! {
    /// `struct fi_ops_eq`.
    FiOpsEq {
        read: fn(*mut FidEq, *mut u32, *mut c_void, usize, u64) -> isize;
        readerr: fn(*mut FidEq, *mut FiEqErrEntry, u64) -> isize;
        write: fn(*mut FidEq, u32, *const c_void, usize, u64) -> isize;
        sread: fn(*mut FidEq, *mut u32, *mut c_void, usize, c_int, u64) -> isize;
        strerror: fn(*mut FidEq, c_int, *const c_void, *mut c_char, usize) -> *const c_char;
    }
}

#[repr(C)]
#[derive(Debug)]
pub struct FidEq {
    pub fid: Fid,
    pub ops: *const FiOpsEq,
}

assert_layout!(FiCqAttr, 40, flags @ 8, format @ 16, wait_obj @ 20, signaling_vector @ 24, wait_cond @ 28, wait_set @ 32);
assert_layout!(FiCqEntry, 8);
assert_layout!(FiCqMsgEntry, 24);
assert_layout!(FiCqDataEntry, 40);
assert_layout!(FiCqTaggedEntry, 48);
assert_layout!(FiCqErrEntry, 80, olen @ 48, err @ 56, prov_errno @ 60, err_data @ 64, err_data_size @ 72);
assert_layout!(FiOpsCq, 64);
assert_layout!(FidCq, 32, ops @ 24);
assert_layout!(FiEqAttr, 32, flags @ 8, wait_obj @ 16, signaling_vector @ 20, wait_set @ 24);
assert_layout!(FiEqErrEntry, 48);
assert_layout!(FiOpsEq, 48);
assert_layout!(FidEq, 32, ops @ 24);
