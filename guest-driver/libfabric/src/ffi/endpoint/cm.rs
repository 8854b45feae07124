//! `rdma/fi_cm.h`: connection management (only `getname` matters for DGRAM).

use std::os::raw::{c_int, c_void};

use super::FidEp;
use crate::ffi::Fid;

ops_table! {
    /// `struct fi_ops_cm`.
    FiOpsCm {
        setname: fn(*mut Fid, *mut c_void, usize) -> c_int;
        getname: fn(*mut Fid, *mut c_void, *mut usize) -> c_int;
        getpeer: fn(*mut FidEp, *mut c_void, *mut usize) -> c_int;
        connect: fn(*mut FidEp, *const c_void, *const c_void, usize) -> c_int;
        listen: fn(*mut c_void) -> c_int;
        accept: fn(*mut FidEp, *const c_void, usize) -> c_int;
        reject: fn(*mut c_void, *mut Fid, *const c_void, usize) -> c_int;
        shutdown: fn(*mut FidEp, u64) -> c_int;
        join: fn(*mut FidEp, *const c_void, u64, *mut *mut c_void, *mut c_void) -> c_int;
    }
}

assert_layout!(FiOpsCm, 80);
