//! Unix `SOCK_SEQPACKET` sockets with file-descriptor passing (`SCM_RIGHTS`): the transport of
//! the agent's application protocol. std has no seqpacket sockets, so this is a thin libc layer.
//!
//! Received descriptors come back as [`OwnedFd`]s (close-on-exec), so a peer that sends
//! descriptors nobody asked for cannot leak them into this process: dropping them closes them.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

/// Most descriptors accepted in one message (more are closed by the kernel: `MSG_CTRUNC`).
pub const MAX_FDS: usize = 4;

/// Control buffer for [`MAX_FDS`] descriptors, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

const CMSG_HDR: usize = size_of::<libc::cmsghdr>();

/// `CMSG_ALIGN`: rounds up to the alignment of `size_t`.
const fn cmsg_align(n: usize) -> usize {
    (n + size_of::<usize>() - 1) & !(size_of::<usize>() - 1)
}

/// `CMSG_LEN` for `fds` descriptors: header (aligned) plus the data.
const fn cmsg_len(fds: usize) -> usize {
    cmsg_align(CMSG_HDR) + fds * size_of::<RawFd>()
}

/// `CMSG_SPACE` for `fds` descriptors: header and data, each aligned.
const fn cmsg_space(fds: usize) -> usize {
    cmsg_align(CMSG_HDR) + cmsg_align(fds * size_of::<RawFd>())
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} must be 1..{} bytes without NUL",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn new_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket() takes integer arguments and returns a new descriptor or -1.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Credentials of the process at the other end of a connection (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id when it connected.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// What one `recv` returned.
#[derive(Debug)]
pub struct Received {
    /// Bytes of the message stored in the buffer (0 with no fds: the peer closed).
    pub len: usize,
    /// The message was longer than the buffer (the rest is lost).
    pub truncated: bool,
    /// Descriptors that came with it.
    pub fds: Vec<OwnedFd>,
}

/// A connected seqpacket socket.
#[derive(Debug)]
pub struct SeqPacket {
    fd: OwnedFd,
}

impl SeqPacket {
    /// Connects to the listener at `path`.
    pub fn connect(path: impl AsRef<Path>) -> io::Result<Self> {
        let fd = new_socket()?;
        let (addr, len) = sockaddr(path.as_ref())?;
        // SAFETY: addr is a valid sockaddr_un of `len` bytes that outlives the call.
        cvt(unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        })?;
        Ok(SeqPacket { fd })
    }

    /// A connected pair (tests, in-process use).
    pub fn pair() -> io::Result<(Self, Self)> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: socketpair writes two descriptors into the 2-element array we pass.
        cvt(unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        })?;
        // SAFETY: fds[0] was just created and is owned by nobody else.
        let a = unsafe { OwnedFd::from_raw_fd(fds[0]) };
        // SAFETY: likewise fds[1].
        let b = unsafe { OwnedFd::from_raw_fd(fds[1]) };
        Ok((SeqPacket { fd: a }, SeqPacket { fd: b }))
    }

    /// Switches non-blocking mode on or off.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        set_nonblocking(self.fd.as_fd(), on)
    }

    /// Sends one message with `fds` attached. Never raises SIGPIPE (`EPIPE` instead).
    pub fn send(&self, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} descriptors, at most {MAX_FDS} per message", fds.len()),
            ));
        }
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut cbuf = CmsgBuf([0; 64]);
        // SAFETY: msghdr is plain old data; all zeroes is a valid empty header.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            // One SCM_RIGHTS header at the start of the buffer, the descriptors after it.
            let hdr = libc::cmsghdr {
                cmsg_len: cmsg_len(fds.len()) as _,
                cmsg_level: libc::SOL_SOCKET,
                cmsg_type: libc::SCM_RIGHTS,
            };
            // SAFETY: cbuf is at least CMSG_HDR bytes long (a test checks cmsg_space(MAX_FDS)
            // fits) and is ours; the write is unaligned-safe.
            unsafe { std::ptr::write_unaligned(cbuf.0.as_mut_ptr().cast::<libc::cmsghdr>(), hdr) };
            let mut at = cmsg_len(0);
            for fd in fds {
                cbuf.0[at..at + size_of::<RawFd>()].copy_from_slice(&fd.as_raw_fd().to_ne_bytes());
                at += size_of::<RawFd>();
            }
            msg.msg_control = cbuf.0.as_mut_ptr().cast();
            msg.msg_controllen = cmsg_space(fds.len()) as _;
        }
        loop {
            // SAFETY: msg points to an iovec over `data` and a control buffer that both
            // outlive the call; sendmsg only reads them.
            let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return if n as usize == data.len() {
                    Ok(())
                } else {
                    Err(io::Error::other(format!(
                        "short send: {n} of {} bytes",
                        data.len()
                    )))
                };
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives one message into `buf` with up to [`MAX_FDS`] descriptors.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Received> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut cbuf = CmsgBuf([0; 64]);
        // SAFETY: msghdr is plain old data; all zeroes is a valid empty header.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_space(MAX_FDS) as _;
        let n = loop {
            // SAFETY: msg points to an iovec over `buf` (writable, buf.len() bytes) and to cbuf
            // (CMSG_SPACE(MAX_FDS) bytes); both outlive the call. MSG_CMSG_CLOEXEC makes the
            // received descriptors close-on-exec.
            let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if n >= 0 {
                break n as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let fds = take_fds(&cbuf.0[..(msg.msg_controllen as usize).min(cbuf.0.len())]);
        Ok(Received {
            len: n.min(buf.len()),
            truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
            fds,
        })
    }

    /// Waits until a message (or hang-up) is readable, at most `timeout`. True if readable.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        poll_readable(self.fd.as_fd(), timeout)
    }

    /// The credentials of the peer process.
    pub fn peer_cred(&self) -> io::Result<PeerCred> {
        // SAFETY: ucred is plain old data; all zeroes is valid.
        let mut cred: libc::ucred = unsafe { zeroed() };
        let mut len = size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into cred, which is that large.
        cvt(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        })?;
        Ok(PeerCred {
            pid: cred.pid,
            uid: cred.uid,
            gid: cred.gid,
        })
    }
}

impl AsFd for SeqPacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for SeqPacket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The descriptors of every `SCM_RIGHTS` message in the control data the kernel wrote.
fn take_fds(control: &[u8]) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    let mut at = 0;
    while at + CMSG_HDR <= control.len() {
        // SAFETY: control[at..at + CMSG_HDR] is in bounds (checked above); the read is
        // unaligned-safe and cmsghdr is plain old data.
        let hdr: libc::cmsghdr =
            unsafe { std::ptr::read_unaligned(control[at..].as_ptr().cast::<libc::cmsghdr>()) };
        let len = hdr.cmsg_len as usize;
        if len < cmsg_len(0) || at + len > control.len() {
            break;
        }
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            let data = &control[at + cmsg_len(0)..at + len];
            for raw in data.chunks_exact(size_of::<RawFd>()) {
                let mut b = [0u8; size_of::<RawFd>()];
                b.copy_from_slice(raw);
                // SAFETY: the kernel installed this descriptor in this process for this
                // message; nobody else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(RawFd::from_ne_bytes(b)) });
            }
        }
        at += cmsg_align(len);
    }
    fds
}

/// A listening seqpacket socket bound to a path. The path is removed when it is dropped.
#[derive(Debug)]
pub struct SeqPacketListener {
    fd: OwnedFd,
    path: std::path::PathBuf,
}

impl SeqPacketListener {
    /// Binds `path` (replacing a stale socket nobody listens on; anything else there is
    /// refused), gives the socket file exactly `mode` (e.g. 0o666 so that unprivileged
    /// processes may connect) before anyone can connect, and listens. Non-blocking.
    ///
    /// The mode is set on the socket before `bind` (the file it creates gets that mode less the
    /// umask, never more), then made exact on the inode `bind` created, found without following
    /// a symlink; a `chmod` by path could follow whatever another process put there.
    pub fn bind(path: impl AsRef<Path>, mode: u32) -> io::Result<Self> {
        let path = path.as_ref();
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{} exists and is not a socket; not replaced",
                        path.display()
                    ),
                ));
            }
            if SeqPacket::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{}: another agent is listening there", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        let fd = new_socket()?;
        // SAFETY: fchmod on a descriptor we own, integer arguments.
        cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode & 0o777) })?;
        let (addr, len) = sockaddr(path)?;
        // SAFETY: addr is a valid sockaddr_un of `len` bytes that outlives the call.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        })?;
        let listener = SeqPacketListener {
            fd,
            path: path.to_path_buf(),
        };
        set_socket_file_mode(path, mode & 0o777)?;
        // SAFETY: listen on a descriptor we own, integer arguments.
        cvt(unsafe { libc::listen(listener.fd.as_raw_fd(), 64) })?;
        set_nonblocking(listener.fd.as_fd(), true)?;
        Ok(listener)
    }

    /// Accepts one pending connection (non-blocking: `None` when there is none).
    pub fn accept(&self) -> io::Result<Option<SeqPacket>> {
        loop {
            // SAFETY: accept4 with null address pointers returns a new descriptor or -1.
            let rc = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if rc >= 0 {
                // SAFETY: rc is a new descriptor nobody else owns.
                let fd = unsafe { OwnedFd::from_raw_fd(rc) };
                return Ok(Some(SeqPacket { fd }));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl AsRawFd for SeqPacketListener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for SeqPacketListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Gives the socket file this process just bound at `path` exactly `mode`: the inode is opened
/// with `O_PATH | O_NOFOLLOW`, checked to be a socket owned by this process's user, and changed
/// through its `/proc/self/fd` link (which names that inode, not the path).
fn set_socket_file_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)?;
    let meta = file.metadata()?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if meta.mode() & libc::S_IFMT != libc::S_IFSOCK || meta.uid() != euid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} was replaced after bind (not a socket of uid {euid})",
                path.display()
            ),
        ));
    }
    if meta.mode() & 0o7777 == mode {
        return Ok(());
    }
    let link = format!("/proc/self/fd/{}", file.as_raw_fd());
    std::fs::set_permissions(link, std::fs::Permissions::from_mode(mode))
}

/// Sets or clears `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: fcntl F_GETFL/F_SETFL on a valid borrowed descriptor, integer arguments.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) })?;
    Ok(())
}

/// Waits until `fd` is readable (or hung up), at most `timeout`. True if it is.
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let ms = timeout
        .as_millis()
        .saturating_add(u128::from(timeout.subsec_nanos() % 1_000_000 != 0))
        .min(i32::MAX as u128) as i32;
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: poll on one pollfd we own, for at most `ms` milliseconds.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc >= 0 {
            return Ok(rc > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn the_control_buffer_holds_max_fds_and_the_macros_agree_with_libc() {
        assert!(cmsg_space(MAX_FDS) <= std::mem::size_of::<CmsgBuf>());
        for n in 0..=MAX_FDS {
            let bytes = (n * size_of::<RawFd>()) as u32;
            // SAFETY: CMSG_LEN is arithmetic only.
            let len = unsafe { libc::CMSG_LEN(bytes) } as usize;
            // SAFETY: CMSG_SPACE is arithmetic only.
            let space = unsafe { libc::CMSG_SPACE(bytes) } as usize;
            assert_eq!((cmsg_len(n), cmsg_space(n)), (len, space));
        }
    }

    #[test]
    fn messages_keep_their_boundaries_and_carry_fds() {
        let (a, b) = SeqPacket::pair().unwrap();
        let mut f = std::fs::File::from(crate::vm::mapping::memfd("t", 4096, false).unwrap());
        f.write_all(b"hello").unwrap();
        a.send(b"one", &[f.as_fd()]).unwrap();
        a.send(b"two!", &[]).unwrap();
        let mut buf = [0u8; 16];
        let r = b.recv(&mut buf).unwrap();
        assert_eq!(
            (&buf[..r.len], r.truncated, r.fds.len()),
            (&b"one"[..], false, 1)
        );
        let mut g = std::fs::File::from(r.fds.into_iter().next().unwrap());
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(&s[..5], "hello");
        let r = b.recv(&mut buf[..3]).unwrap();
        assert_eq!((r.len, r.truncated), (3, true));
        drop(a);
        let r = b.recv(&mut buf).unwrap();
        assert_eq!((r.len, r.fds.len()), (0, 0), "EOF");
    }

    #[test]
    fn too_many_fds_are_refused_before_sending() {
        let (a, _b) = SeqPacket::pair().unwrap();
        let fds: Vec<_> = (0..=MAX_FDS).map(|_| a.as_fd()).collect();
        assert_eq!(
            a.send(b"x", &fds).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn a_listener_accepts_reports_credentials_and_removes_its_path() {
        let dir = std::env::temp_dir().join(format!("svnic-seqpacket-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l.sock");
        let _ = std::fs::remove_file(&path);
        std::fs::write(&path, b"not a socket").unwrap();
        let e = SeqPacketListener::bind(&path, 0o666).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
        std::fs::remove_file(&path).unwrap();
        // A stale socket (nobody listening) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let l = SeqPacketListener::bind(&path, 0o666).unwrap();
        assert!(l.accept().unwrap().is_none());
        assert!(
            SeqPacketListener::bind(&path, 0o666).is_err(),
            "a live listener is not replaced"
        );
        let c = SeqPacket::connect(&path).unwrap();
        let s = l.accept().unwrap().unwrap();
        let cred = s.peer_cred().unwrap();
        assert_eq!(cred.pid, std::process::id() as i32);
        c.send(b"x", &[]).unwrap();
        assert!(s.wait_readable(Duration::from_secs(1)).unwrap());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        // Exactly the mode asked for, whatever the umask took away at bind.
        assert_eq!(mode & 0o777, 0o666);
        drop(l);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
        let long = Path::new("/tmp").join("x".repeat(200));
        assert!(SeqPacket::connect(long).is_err());
    }
}
