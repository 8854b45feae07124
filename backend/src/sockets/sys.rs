//! Thin system calls of the socket layer: the `sockaddr_un` of a path, the daemon's own uid.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::error::SocketError;

/// The daemon's effective uid.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The `sockaddr_un` of `path` and its length; a path too long (or empty) is refused.
pub(crate) fn socket_address(
    path: &Path,
) -> Result<(libc::sockaddr_un, libc::socklen_t), SocketError> {
    // SAFETY: sockaddr_un is plain data for which all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = OsStr::as_bytes(path.as_os_str());
    // One byte stays for the terminating NUL.
    let max = addr.sun_path.len().saturating_sub(1);
    if bytes.len() > max || bytes.is_empty() {
        return Err(SocketError::PathTooLong {
            path: path.into(),
            len: bytes.len(),
            max,
        });
    }
    for (slot, byte) in addr.sun_path.iter_mut().zip(bytes) {
        *slot = *byte as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    let len = libc::socklen_t::try_from(len).map_err(|_| SocketError::PathTooLong {
        path: path.into(),
        len: bytes.len(),
        max,
    })?;
    Ok((addr, len))
}
