//! Creating a listening socket other local users can neither pre-empt nor reach unless allowed.
//!
//! Rules, checked before every bind:
//! - the socket's directory exists (the default [`DEFAULT_SOCKET_DIR`] is created 0700), is
//!   owned by the daemon's euid or root, and is not writable by group or others unless sticky:
//!   otherwise another user could replace the socket and receive a guest's memory;
//! - a file already at the path must be a socket of the daemon's euid that nobody serves (a
//!   stale socket, replaced); anything else is refused;
//! - the socket gets its mode (and group) between bind and listen, so the umask never decides
//!   who may connect and nobody can connect before it is set.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use super::error::SocketError;
use super::sys::{effective_uid, socket_address};
use super::DEFAULT_SOCKET_DIR;

/// The mode of a socket unless configured otherwise: the daemon's user only.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;
/// Connections waiting to be accepted.
const BACKLOG: libc::c_int = 128;

/// Who may connect to a socket: its file mode and group, and optionally the peer uids accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketAccess {
    /// Permission bits of the socket file (at most 0777, owner read and write included).
    pub mode: u32,
    /// Group of the socket file; `None` keeps the daemon's group.
    pub group: Option<u32>,
    /// Peer uids accepted (`SO_PEERCRED`); `None` accepts whoever can reach the socket.
    pub allow_uids: Option<Vec<u32>>,
}

impl Default for SocketAccess {
    fn default() -> Self {
        SocketAccess {
            mode: DEFAULT_SOCKET_MODE,
            group: None,
            allow_uids: None,
        }
    }
}

/// Parses an octal socket mode such as `0600` or `0660`; the error says what is expected.
pub fn parse_mode(s: &str) -> Result<u32, &'static str> {
    const EXPECTED: &str = "an octal mode such as 0600 or 0660 (at most 0777)";
    let digits = s.strip_prefix("0o").unwrap_or(s);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return Err(EXPECTED);
    }
    let mode = u32::from_str_radix(digits, 8).map_err(|_| EXPECTED)?;
    if mode > 0o777 {
        return Err(EXPECTED);
    }
    if mode & 0o600 != 0o600 {
        return Err("a mode that lets the owner read and write (0600 at least)");
    }
    Ok(mode)
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> SocketError + 'a {
    move |source| SocketError::Io {
        path: path.into(),
        op,
        source,
    }
}

/// Binds and listens on `path` with `access`'s mode and group, after checking the rules of this
/// module. The peer allow-list is applied by whoever accepts (see [`super::PeerFilter`]).
pub fn bind_socket(path: &Path, access: &SocketAccess) -> Result<UnixListener, SocketError> {
    let euid = effective_uid();
    check_directory(path, euid)?;
    clear_stale(path, euid)?;
    bind_with_mode(path, access)
}

fn directory_of(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Creates `dir` with mode 0700 whatever the umask; an existing directory is left as it is.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn check_directory(path: &Path, euid: u32) -> Result<(), SocketError> {
    let dir = directory_of(path);
    if dir == Path::new(DEFAULT_SOCKET_DIR) {
        ensure_private_dir(dir).map_err(io_err(
            path,
            "create the directory /run/svnic (without root, choose a directory of your own)",
        ))?;
    }
    let meta = match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => meta,
        Ok(_) => {
            return Err(SocketError::NoDirectory {
                path: path.into(),
                dir: dir.into(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(SocketError::NoDirectory {
                path: path.into(),
                dir: dir.into(),
            })
        }
        Err(e) => return Err(io_err(path, "inspect its directory")(e)),
    };
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(SocketError::DirectoryNotOurs {
            path: path.into(),
            dir: dir.into(),
            owner: meta.uid(),
            euid,
        });
    }
    let mode = meta.mode() & 0o7777;
    let sticky = mode & libc::S_ISVTX != 0;
    if mode & 0o022 != 0 && !sticky {
        return Err(SocketError::DirectoryWritable {
            path: path.into(),
            dir: dir.into(),
            mode,
        });
    }
    Ok(())
}

/// Removes a stale socket of ours at `path`; refuses anything else that is there.
fn clear_stale(path: &Path, euid: u32) -> Result<(), SocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path, "inspect the path")(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket { path: path.into() });
    }
    if meta.uid() != euid {
        return Err(SocketError::NotOurs {
            path: path.into(),
            owner: meta.uid(),
            euid,
        });
    }
    if UnixStream::connect(path).is_ok() {
        return Err(SocketError::InUse { path: path.into() });
    }
    std::fs::remove_file(path).map_err(io_err(path, "remove the stale socket"))
}

/// socket, bind, chown/chmod, listen: the mode is set before anyone can connect.
fn bind_with_mode(path: &Path, access: &SocketAccess) -> Result<UnixListener, SocketError> {
    let (addr, len) = socket_address(path)?;
    // SAFETY: socket has no memory preconditions; its result is checked below.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io_err(path, "create a socket")(io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a descriptor just returned by socket, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let addr_ptr: *const libc::sockaddr_un = &addr;
    // SAFETY: addr_ptr points to an initialised sockaddr_un living across the call, and `len`
    // does not exceed its size.
    let r = unsafe { libc::bind(fd.as_raw_fd(), addr_ptr.cast::<libc::sockaddr>(), len) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EADDRINUSE) {
            // Someone created the path between our check and the bind.
            return Err(SocketError::InUse { path: path.into() });
        }
        return Err(io_err(path, "bind")(e));
    }
    let finish = || -> Result<(), SocketError> {
        if let Some(gid) = access.group {
            std::os::unix::fs::lchown(path, None, Some(gid))
                .map_err(io_err(path, "set the socket's group"))?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(access.mode))
            .map_err(io_err(path, "set the socket's mode"))?;
        // SAFETY: fd is a bound socket we own; listen has no memory preconditions.
        if unsafe { libc::listen(fd.as_raw_fd(), BACKLOG) } < 0 {
            return Err(io_err(path, "listen")(io::Error::last_os_error()));
        }
        Ok(())
    };
    if let Err(e) = finish() {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(UnixListener::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sockets::test_support::{access_with_mode, private_dir, require_root};

    fn mode_of(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    /// Binds `$path` with the default access, expects a refusal matching `$pattern`, and
    /// returns it.
    macro_rules! assert_refused {
        ($path:expr, $pattern:pat) => {{
            let e = bind_socket($path, &SocketAccess::default()).unwrap_err();
            assert!(matches!(e, $pattern), "{e}");
            e
        }};
    }

    #[test]
    fn modes_parse_as_octal_and_bad_ones_are_refused() {
        assert_eq!(parse_mode("0600"), Ok(0o600));
        assert_eq!(parse_mode("660"), Ok(0o660));
        assert_eq!(parse_mode("0o666"), Ok(0o666));
        for bad in [
            "", "0o", "0800", "rw", "4755", "01777", "0400", "0066", "06600",
        ] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_socket_gets_its_mode_whatever_the_umask() {
        let dir = private_dir("mode");
        // Under the test's umask a plain bind would give 0755 (or 0775): neither mode below.
        for mode in [0o600, 0o660, 0o666] {
            let path = dir.join(format!("m{mode:o}.sock"));
            let listener = bind_socket(&path, &access_with_mode(mode)).unwrap();
            assert_eq!(mode_of(&path), mode, "{}", path.display());
            assert!(UnixStream::connect(&path).is_ok(), "it listens");
            drop(listener);
        }
    }

    #[test]
    fn a_stale_socket_of_ours_is_replaced_and_a_live_one_refused() {
        let dir = private_dir("stale");
        let path = dir.join("s.sock");
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists(), "the stale file stays after its listener");
        let live = bind_socket(&path, &SocketAccess::default()).unwrap();
        assert_refused!(&path, SocketError::InUse { .. });
        drop(live);
    }

    #[test]
    fn a_file_that_is_not_a_socket_is_refused() {
        let dir = private_dir("notsock");
        let file = dir.join("f.sock");
        std::fs::write(&file, b"data").unwrap();
        assert_refused!(&file, SocketError::NotASocket { .. });
        assert_eq!(std::fs::read(&file).unwrap(), b"data", "left alone");
        let link = dir.join("l.sock");
        std::os::unix::fs::symlink(dir.join("elsewhere.sock"), &link).unwrap();
        assert_refused!(&link, SocketError::NotASocket { .. });
    }

    #[test]
    fn a_directory_writable_by_others_is_refused_unless_sticky() {
        let dir = private_dir("writable");
        let open = dir.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = assert_refused!(
            &open.join("a.sock"),
            SocketError::DirectoryWritable { mode: 0o777, .. }
        );
        assert!(e.to_string().contains("0777"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(bind_socket(&open.join("a.sock"), &SocketAccess::default()).is_err());
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let ok = bind_socket(&open.join("a.sock"), &SocketAccess::default());
        assert!(ok.is_ok(), "{:?}", ok.err());
    }

    #[test]
    fn a_missing_directory_and_a_too_long_path_are_refused() {
        let dir = private_dir("missing");
        assert_refused!(&dir.join("no/such/x.sock"), SocketError::NoDirectory { .. });
        let long = dir.join("x".repeat(120));
        assert_refused!(&long, SocketError::PathTooLong { .. });
    }

    #[test]
    fn a_private_directory_is_created_0700_whatever_the_umask() {
        let dir = private_dir("mkdir");
        let sub = dir.join("run-svnic");
        ensure_private_dir(&sub).unwrap();
        assert_eq!(mode_of(&sub), 0o700);
        // An existing directory is left as it is.
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o750)).unwrap();
        ensure_private_dir(&sub).unwrap();
        assert_eq!(mode_of(&sub), 0o750);
    }

    #[test]
    fn files_and_directories_of_another_user_are_refused() {
        require_root!("chown to another uid needs root");
        let dir = private_dir("owner");
        // A socket that another user left (or planted) at the path.
        let path = dir.join("theirs.sock");
        drop(UnixListener::bind(&path).unwrap());
        std::os::unix::fs::lchown(&path, Some(65534), None).unwrap();
        let e = assert_refused!(&path, SocketError::NotOurs { owner: 65534, .. });
        assert!(e.to_string().contains("does not own"), "{e}");
        assert!(path.exists(), "their file is left alone");
        // A directory of another user.
        let theirs = dir.join("their-dir");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::lchown(&theirs, Some(65534), None).unwrap();
        assert_refused!(
            &theirs.join("a.sock"),
            SocketError::DirectoryNotOurs { owner: 65534, .. }
        );
    }

    #[test]
    fn the_group_is_set_when_asked() {
        require_root!("giving a socket to another group needs root");
        let dir = private_dir("group");
        let path = dir.join("g.sock");
        let access = SocketAccess {
            mode: 0o660,
            group: Some(65534),
            allow_uids: None,
        };
        let _listener = bind_socket(&path, &access).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!((meta.gid(), meta.mode() & 0o777), (65534, 0o660));
    }
}
