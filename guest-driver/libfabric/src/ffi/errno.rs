//! `rdma/fi_errno.h`: libfabric error numbers (positive; entry points return the negative).

use std::os::raw::c_int;

pub const FI_SUCCESS: c_int = 0;
pub const FI_ENOENT: c_int = 2;
pub const FI_EIO: c_int = 5;
pub const FI_EAGAIN: c_int = 11;
pub const FI_ENOMEM: c_int = 12;
pub const FI_EBUSY: c_int = 16;
pub const FI_ENODEV: c_int = 19;
pub const FI_EINVAL: c_int = 22;
pub const FI_ENOMSG: c_int = 42;
pub const FI_ENOSPC: c_int = 28;
pub const FI_ENOSYS: c_int = 38;
pub const FI_ENODATA: c_int = 61;
pub const FI_EMSGSIZE: c_int = 90;
pub const FI_ENOPROTOOPT: c_int = 92;
pub const FI_EOPNOTSUPP: c_int = 95;
pub const FI_ENETDOWN: c_int = 100;
pub const FI_ECONNABORTED: c_int = 103;
pub const FI_ECONNRESET: c_int = 104;
pub const FI_ETIMEDOUT: c_int = 110;
pub const FI_ECONNREFUSED: c_int = 111;
pub const FI_EHOSTUNREACH: c_int = 113;
pub const FI_ECANCELED: c_int = 125;
pub const FI_EOTHER: c_int = 256;
pub const FI_ETOOSMALL: c_int = 257;
pub const FI_EOPBADSTATE: c_int = 258;
pub const FI_EAVAIL: c_int = 259;
pub const FI_EBADFLAGS: c_int = 260;
pub const FI_ENOEQ: c_int = 261;
pub const FI_ENOCQ: c_int = 263;
pub const FI_ETRUNC: c_int = 265;
pub const FI_ENOAV: c_int = 267;
pub const FI_EOVERRUN: c_int = 268;
pub const FI_ENORX: c_int = 269;
