//! `rdma/fi_atomic.h`: atomics (not offered by the DGRAM core: every slot is a stub).

use std::os::raw::{c_int, c_void};

use super::FidEp;

ops_table! {
    /// `struct fi_ops_atomic`.
    FiOpsAtomic {
        write: fn(*mut FidEp, *const c_void, usize, *mut c_void, u64, u64, u64, c_int, c_int, *mut c_void) -> isize;
        writev: fn(*mut FidEp, *const c_void, *mut *mut c_void, usize, u64, u64, u64, c_int, c_int, *mut c_void) -> isize;
        writemsg: fn(*mut FidEp, *const c_void, u64) -> isize;
        inject: fn(*mut FidEp, *const c_void, usize, u64, u64, u64, c_int, c_int) -> isize;
        readwrite: fn(*mut FidEp, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, u64, u64, u64, c_int, c_int, *mut c_void) -> isize;
        readwritev: fn(*mut FidEp, *const c_void, *mut *mut c_void, usize, *mut c_void, *mut *mut c_void, usize, u64, u64, u64, c_int, c_int, *mut c_void) -> isize;
        readwritemsg: fn(*mut FidEp, *const c_void, *mut c_void, *mut *mut c_void, usize, u64) -> isize;
        compwrite: fn(*mut FidEp, *const c_void, usize, *mut c_void, *const c_void, *mut c_void, *mut c_void, *mut c_void, u64, u64, u64, c_int, c_int, *mut c_void) -> isize;
        compwritev: fn(*mut FidEp, *const c_void, *mut *mut c_void, usize, *const c_void, *mut *mut c_void, usize, *mut c_void, *mut *mut c_void, usize, u64, u64, u64, c_int, c_int, *mut c_void) -> isize;
        compwritemsg: fn(*mut FidEp, *const c_void, *const c_void, *mut *mut c_void, usize, *mut c_void, *mut *mut c_void, usize, u64) -> isize;
        writevalid: fn(*mut FidEp, c_int, c_int, *mut usize) -> c_int;
        readwritevalid: fn(*mut FidEp, c_int, c_int, *mut usize) -> c_int;
        compwritevalid: fn(*mut FidEp, c_int, c_int, *mut usize) -> c_int;
    }
}

assert_layout!(FiOpsAtomic, 112);
