//! `rdma/fi_collective.h`: collectives (not offered by the DGRAM core: every slot is a stub).

use std::os::raw::{c_int, c_void};

use super::FidEp;

ops_table! {
    /// `struct fi_ops_collective`.
    FiOpsCollective {
        barrier: fn(*mut FidEp, u64, *mut c_void) -> isize;
        broadcast: fn(*mut FidEp, *mut c_void, usize, *mut c_void, u64, u64, c_int, u64, *mut c_void) -> isize;
        alltoall: fn(*mut FidEp, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, u64, c_int, u64, *mut c_void) -> isize;
        allreduce: fn(*mut FidEp, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, u64, c_int, c_int, u64, *mut c_void) -> isize;
        allgather: fn(*mut FidEp, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, u64, c_int, u64, *mut c_void) -> isize;
        reduce_scatter: fn(*mut FidEp, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, u64, c_int, c_int, u64, *mut c_void) -> isize;
        reduce: fn(*mut FidEp, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, u64, u64, c_int, c_int, u64, *mut c_void) -> isize;
        scatter: fn(*mut FidEp, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, u64, u64, c_int, u64, *mut c_void) -> isize;
        gather: fn(*mut FidEp, *const c_void, usize, *mut c_void, *mut c_void, *mut c_void, u64, u64, c_int, u64, *mut c_void) -> isize;
        msg: fn(*mut FidEp, *const c_void, c_int, u64) -> isize;
        barrier2: fn(*mut FidEp, u64, u64, *mut c_void) -> isize;
    }
}

assert_layout!(FiOpsCollective, 96);
