//! Test helpers: private scratch directories and connecting as another uid.

use std::ops::Deref;
use std::path::Path;
use std::time::Duration;

use vmm_sys_util::tempdir::TempDir;

use super::sys::socket_address;

/// A 0700 scratch directory, removed when dropped.
pub(crate) struct Scratch(TempDir);

impl Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.as_path()
    }
}

pub(crate) fn private_dir(tag: &str) -> Scratch {
    Scratch(TempDir::new_with_prefix(format!("/tmp/svnic-sock-{tag}-")).unwrap())
}

/// A scratch directory (mode 0755) that every uid can reach, removed when dropped.
pub(crate) fn open_dir(tag: &str) -> Scratch {
    let dir = private_dir(tag);
    std::fs::set_permissions(&*dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    dir
}

/// The default access with socket mode `mode`.
pub(crate) fn access_with_mode(mode: u32) -> super::SocketAccess {
    super::SocketAccess {
        mode,
        ..super::SocketAccess::default()
    }
}

pub(crate) fn is_root() -> bool {
    super::sys::effective_uid() == 0
}

/// Returns from the calling test, saying why it is skipped, unless the process runs as root.
macro_rules! require_root {
    ($why:literal) => {
        if !$crate::sockets::test_support::is_root() {
            eprintln!(concat!("skipped: ", $why));
            return;
        }
    };
}
pub(crate) use require_root;

/// What a connection made by another uid saw.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// connect failed (the socket's mode kept it out).
    ConnectFailed,
    /// The server closed (or reset) the connection without a byte.
    ClosedAtOnce,
    /// The server answered.
    Answered,
    /// Nothing came within the wait: the connection was kept.
    KeptOpen,
    /// The child could not become `uid` or failed otherwise.
    ChildFailed(i32),
}

/// Forks a child that drops to `uid`, connects to `path`, sends `request`, and waits up to
/// `wait` for a byte. Needs root. The child makes system calls only (the parent has threads).
pub(crate) fn connect_as(uid: u32, path: &Path, request: &[u8], wait: Duration) -> Seen {
    let (addr, len) = socket_address(path).unwrap();
    let timeout = libc::timeval {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_usec: wait.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: the child below only makes async-signal-safe system calls and exits with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = child_connect(uid, &addr, len, &timeout, request);
        // SAFETY: _exit ends the forked child at once, running nothing of the parent's.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    loop {
        // SAFETY: pid is our child; status is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        assert!(
            std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted,
            "waitpid failed"
        );
    }
    match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
        Some(10) => Seen::ConnectFailed,
        Some(11) => Seen::ClosedAtOnce,
        Some(12) => Seen::Answered,
        Some(13) => Seen::KeptOpen,
        Some(code) => Seen::ChildFailed(code),
        None => Seen::ChildFailed(-1),
    }
}

/// The forked child's part of [`connect_as`]: system calls only, an exit code for the result.
fn child_connect(
    uid: u32,
    addr: &libc::sockaddr_un,
    len: libc::socklen_t,
    timeout: &libc::timeval,
    request: &[u8],
) -> i32 {
    // SAFETY: a null list with length 0 is valid for setgroups.
    let dropped_groups =
        unsafe { libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) };
    // SAFETY: setgid takes a plain integer.
    let dropped_gid = unsafe { libc::syscall(libc::SYS_setgid, uid) };
    // SAFETY: setuid takes a plain integer.
    let dropped_uid = unsafe { libc::syscall(libc::SYS_setuid, uid) };
    if dropped_groups != 0 || dropped_gid != 0 || dropped_uid != 0 {
        return 20;
    }
    // SAFETY: socket has no memory preconditions.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return 21;
    }
    let addr_ptr: *const libc::sockaddr_un = addr;
    // SAFETY: addr_ptr points to a live sockaddr_un of at least `len` bytes.
    if unsafe { libc::connect(fd, addr_ptr.cast(), len) } != 0 {
        return 10;
    }
    let tv: *const libc::timeval = timeout;
    // SAFETY: tv points to a live timeval whose size is passed with it.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            tv.cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if !request.is_empty() {
        // SAFETY: request is a live buffer of request.len() bytes.
        unsafe { libc::write(fd, request.as_ptr().cast(), request.len()) };
    }
    let mut byte = 0u8;
    let p: *mut u8 = &mut byte;
    // SAFETY: p points to one writable byte.
    let n = unsafe { libc::read(fd, p.cast(), 1) };
    // Reads errno without allocating.
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    match n {
        // A server that closes with our request unread resets the connection.
        0 => 11,
        _ if n < 0 && errno == libc::ECONNRESET => 11,
        n if n > 0 => 12,
        _ if errno == libc::EAGAIN => 13,
        _ => 14,
    }
}
