//! `rdma/fi_tagged.h`: tagged messages (not offered by the DGRAM core: every slot is a stub).

use std::os::raw::c_void;

use super::FidEp;

ops_table! {
    /// `struct fi_ops_tagged`.
    FiOpsTagged {
        recv: fn(*mut FidEp, *mut c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize;
        recvv: fn(*mut FidEp, *const libc::iovec, *mut *mut c_void, usize, u64, u64, u64, *mut c_void) -> isize;
        recvmsg: fn(*mut FidEp, *const c_void, u64) -> isize;
        send: fn(*mut FidEp, *const c_void, usize, *mut c_void, u64, u64, *mut c_void) -> isize;
        sendv: fn(*mut FidEp, *const libc::iovec, *mut *mut c_void, usize, u64, u64, *mut c_void) -> isize;
        sendmsg: fn(*mut FidEp, *const c_void, u64) -> isize;
        inject: fn(*mut FidEp, *const c_void, usize, u64, u64) -> isize;
        senddata: fn(*mut FidEp, *const c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize;
        injectdata: fn(*mut FidEp, *const c_void, usize, u64, u64, u64) -> isize;
    }
}

assert_layout!(FiOpsTagged, 80);
