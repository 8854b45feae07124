//! Thin wrappers over the socket calls the packet socket makes: socket options, interface
//! ioctls and the kernel's statistics. Each returns the OS error; callers add context.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A new AF_PACKET raw socket, non-blocking and close-on-exec, bound to no protocol yet (it
/// receives nothing until [`bind`]), in the network namespace of the calling thread.
pub(super) fn packet_socket() -> io::Result<OwnedFd> {
    let flags = libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: plain syscall with constant arguments; no memory is passed.
    let fd = unsafe { libc::socket(libc::AF_PACKET, flags, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket() and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets socket option `name` at `level` to `value`.
///
/// `T` must be the C type the kernel expects for that option (an int, `tpacket_req`,
/// `packet_mreq`, `sock_fprog`...): the kernel reads `size_of::<T>()` bytes from `value`.
pub(super) fn set_option<T>(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` is a live `T` of exactly `len` bytes that the kernel only reads, and the
    // caller picks `T` as the option's C type (see above).
    let r =
        unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, (value as *const T).cast(), len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The id of the fanout group `fd` belongs to (PACKET_FANOUT reads back id | type << 16).
pub(super) fn fanout_group(fd: RawFd) -> io::Result<u16> {
    let v: libc::c_int = get_option(fd, libc::SOL_PACKET, libc::PACKET_FANOUT)?;
    Ok((v & 0xffff) as u16)
}

/// Reads socket option `name` at `level`, whose C type is the plain-data `T` (an int,
/// `tpacket_stats`): every bit pattern of `T` must be a valid value.
fn get_option<T: Copy>(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<T> {
    let mut value = MaybeUninit::<T>::zeroed();
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `value`, which has room for exactly
    // that many, and updates `len`, a live local.
    let r = unsafe { libc::getsockopt(fd, level, name, value.as_mut_ptr().cast(), &mut len) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `value` was zero-initialised and the kernel wrote at most its size; `T` is
    // plain data for which any bytes (zeros included) are a valid value.
    Ok(unsafe { value.assume_init() })
}

/// The kernel's receive counters since the last call (PACKET_STATISTICS resets them):
/// (frames seen, frames dropped for want of a free ring slot).
pub(super) fn packet_statistics(fd: RawFd) -> io::Result<(u32, u32)> {
    let s: libc::tpacket_stats = get_option(fd, libc::SOL_PACKET, libc::PACKET_STATISTICS)?;
    Ok((s.tp_packets, s.tp_drops))
}

/// The socket's pending error (SO_ERROR), cleared by the read; 0 when there is none.
pub(super) fn take_socket_error(fd: RawFd) -> io::Result<libc::c_int> {
    get_option(fd, libc::SOL_SOCKET, libc::SO_ERROR)
}

/// An interface request for `name` (at most IFNAMSIZ - 1 bytes, no NUL), or None if the name
/// cannot be an interface name.
pub(super) fn ifreq_for(name: &str) -> Option<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return None;
    }
    // SAFETY: ifreq is plain data (a name array and a union of integers, addresses and a
    // pointer), for which all zeros is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    Some(req)
}

/// Runs interface ioctl `request` (SIOCGIFINDEX, SIOCGIFFLAGS, SIOCGIFMTU) on `req`. On a
/// socket, it looks the interface up in the socket's network namespace, whatever the calling
/// thread's.
fn interface_ioctl(fd: RawFd, request: libc::c_ulong, req: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: the three requests used here read the name and write one integer member of
    // `req`, a live, NUL-terminated ifreq (`ifreq_for`).
    let r = unsafe { libc::ioctl(fd, request as _, req as *mut libc::ifreq) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The index of interface `req` names.
pub(super) fn interface_index(fd: RawFd, mut req: libc::ifreq) -> io::Result<libc::c_int> {
    interface_ioctl(fd, libc::SIOCGIFINDEX, &mut req)?;
    // SAFETY: SIOCGIFINDEX succeeded, so it wrote the `ifru_ifindex` member.
    Ok(unsafe { req.ifr_ifru.ifru_ifindex })
}

/// The flags (IFF_*) of the interface `req` names.
pub(super) fn interface_flags(fd: RawFd, mut req: libc::ifreq) -> io::Result<libc::c_int> {
    interface_ioctl(fd, libc::SIOCGIFFLAGS, &mut req)?;
    // SAFETY: SIOCGIFFLAGS succeeded, so it wrote the `ifru_flags` member.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    Ok(libc::c_int::from(flags) & 0xffff)
}

/// The MTU of the interface `req` names.
pub(super) fn interface_mtu(fd: RawFd, mut req: libc::ifreq) -> io::Result<libc::c_int> {
    interface_ioctl(fd, libc::SIOCGIFMTU, &mut req)?;
    // SAFETY: SIOCGIFMTU succeeded, so it wrote the `ifru_mtu` member.
    Ok(unsafe { req.ifr_ifru.ifru_mtu })
}

/// Binds the packet socket to interface `ifindex` for every protocol (ETH_P_ALL).
pub(super) fn bind_all_protocols(fd: &OwnedFd, ifindex: libc::c_int) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain data; all zeros is a valid value.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as libc::c_ushort;
    addr.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    addr.sll_ifindex = ifindex;
    let len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: `addr` is a live sockaddr_ll of `len` bytes, which the kernel only reads.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks the kernel to transmit every frame marked TP_STATUS_SEND_REQUEST in the TX ring
/// (the socket is non-blocking, so it does not wait for their completion). Returns the bytes
/// handed over.
pub(super) fn send_tx_ring(fd: RawFd) -> io::Result<usize> {
    loop {
        // SAFETY: a zero-length send with no buffer; with a TX ring the kernel reads the
        // frames from the ring, which stays mapped for the socket's life.
        let r = unsafe { libc::send(fd, std::ptr::null(), 0, libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}
