//! `rdma/fi_endpoint.h`: the endpoint and its `ep` and `msg` operations; the other operation
//! tables of `struct fid_ep`, one header each, are child modules.

use std::os::raw::{c_int, c_void};

pub mod atomic;
pub mod cm;
pub mod collective;
pub mod rma;
pub mod tagged;

use self::atomic::FiOpsAtomic;
use self::cm::FiOpsCm;
use self::collective::FiOpsCollective;
use self::rma::FiOpsRma;
use self::tagged::FiOpsTagged;

use super::{FiRxAttr, FiTxAttr, Fid};

ops_table! {
    /// `struct fi_ops_ep`.
    FiOpsEp {
        cancel: fn(*mut Fid, *mut c_void) -> isize;
        getopt: fn(*mut Fid, c_int, c_int, *mut c_void, *mut usize) -> c_int;
        setopt: fn(*mut Fid, c_int, c_int, *const c_void, usize) -> c_int;
        tx_ctx: fn(*mut FidEp, c_int, *mut FiTxAttr, *mut *mut FidEp, *mut c_void) -> c_int;
        rx_ctx: fn(*mut FidEp, c_int, *mut FiRxAttr, *mut *mut FidEp, *mut c_void) -> c_int;
        rx_size_left: fn(*mut FidEp) -> isize;
        tx_size_left: fn(*mut FidEp) -> isize;
    }
}

/// `struct fi_msg`.
#[repr(C)]
#[derive(Debug)]
pub struct FiMsg {
    pub msg_iov: *const libc::iovec,
    pub desc: *mut *mut c_void,
    pub iov_count: usize,
    pub addr: u64,
    pub context: *mut c_void,
    pub data: u64,
}

ops_table! {
    /// `struct fi_ops_msg`.
    FiOpsMsg {
        recv: fn(*mut FidEp, *mut c_void, usize, *mut c_void, u64, *mut c_void) -> isize;
        recvv: fn(*mut FidEp, *const libc::iovec, *mut *mut c_void, usize, u64, *mut c_void) -> isize;
        recvmsg: fn(*mut FidEp, *const FiMsg, u64) -> isize;
        send: fn(*mut FidEp, *const c_void, usize, *mut c_void, u64, *mut c_void) -> isize;
        sendv: fn(*mut FidEp, *const libc::iovec, *mut *mut c_void, usize, u64, *mut c_void) -> isize;
        sendmsg: fn(*mut FidEp, *const FiMsg, u64) -> isize;
        inject: fn(*mut FidEp, *const c_void, usize, u64) -> isize;
        senddata: fn(*mut FidEp, *const c_void, usize, *mut c_void, u64, u64, *mut c_void) -> isize;
        injectdata: fn(*mut FidEp, *const c_void, usize, u64, u64) -> isize;
    }
}

/// `struct fid_ep`.
#[repr(C)]
#[derive(Debug)]
pub struct FidEp {
    pub fid: Fid,
    pub ops: *const FiOpsEp,
    pub cm: *const FiOpsCm,
    pub msg: *const FiOpsMsg,
    pub rma: *const FiOpsRma,
    pub tagged: *const FiOpsTagged,
    pub atomic: *const FiOpsAtomic,
    pub collective: *const FiOpsCollective,
}

assert_layout!(FiOpsEp, 64);
assert_layout!(FiMsg, 48);
assert_layout!(FiOpsMsg, 80);
assert_layout!(FidEp, 80, ops @ 24, cm @ 32, msg @ 40, rma @ 48, tagged @ 56, atomic @ 64, collective @ 72);
