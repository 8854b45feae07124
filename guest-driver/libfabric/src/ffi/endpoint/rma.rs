//! `rdma/fi_rma.h`: RMA (not offered by the DGRAM core: every slot is a stub).

use std::os::raw::c_void;

use super::FidEp;

ops_table! {
    /// `struct fi_ops_rma`.
    FiOpsRma {
        read: fn(*mut FidEp, *mut c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize;
        readv: fn(*mut FidEp, *const libc::iovec, *mut *mut c_void, usize, u64, u64, u64, *mut c_void) -> isize;
        readmsg: fn(*mut FidEp, *const c_void, u64) -> isize;
        write: fn(*mut FidEp, *const c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize;
        writev: fn(*mut FidEp, *const libc::iovec, *mut *mut c_void, usize, u64, u64, u64, *mut c_void) -> isize;
        writemsg: fn(*mut FidEp, *const c_void, u64) -> isize;
        inject: fn(*mut FidEp, *const c_void, usize, u64, u64, u64) -> isize;
        writedata: fn(*mut FidEp, *const c_void, usize, *mut c_void, u64, u64, u64, u64, *mut c_void) -> isize;
        injectdata: fn(*mut FidEp, *const c_void, usize, u64, u64, u64, u64) -> isize;
    }
}

assert_layout!(FiOpsRma, 80);
