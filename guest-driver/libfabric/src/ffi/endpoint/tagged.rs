//! `rdma/fi_tagged.h`: tagged messages (offered by the RDM endpoint; the DGRAM endpoint's table
//! is all stubs).

use std::os::raw::c_void;

use super::FidEp;

/// `struct fi_msg_tagged`.
#[repr(C)]
#[derive(Debug)]
pub struct FiMsgTagged {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub tag: u64,
    pub ignore: u64,
    pub context: *mut c_void,
    pub data: u64,
}

assert_layout!(FiMsgTagged, 64, addr @ 24, tag @ 32, ignore @ 40, context @ 48, data @ 56);

ops_table! {
    /// `struct fi_ops_tagged`.
    FiOpsTagged {
        recv: fn(*mut FidEp, *mut c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize;
        recvv: fn(*mut FidEp, *const libc::iovec, *mut *mut c_void, usize, u64, u64, u64, *mut c_void) -> isize;
        recvmsg: fn(*mut FidEp, *const FiMsgTagged, u64) -> isize;
        send: fn(*mut FidEp, *const c_void, usize, *mut c_void, u64, u64, *mut c_void) -> isize;
        sendv: fn(*mut FidEp, *const libc::iovec, *mut *mut c_void, usize, u64, u64, *mut c_void) -> isize;
        sendmsg: fn(*mut FidEp, *const FiMsgTagged, u64) -> isize;
        inject: fn(*mut FidEp, *const c_void, usize, u64, u64) -> isize;
        senddata: fn(*mut FidEp, *const c_void, usize, *mut c_void, u64, u64, u64, *mut c_void) -> isize;
        injectdata: fn(*mut FidEp, *const c_void, usize, u64, u64, u64) -> isize;
    }
}

assert_layout!(FiOpsTagged, 80);
