//! Where the agent may serve its socket. Another local user must not be able to replace the
//! socket file (and receive applications' connections, or make the agent change the mode of
//! some other file), so:
//! - the directory is owned by root or by the agent's user, and is not writable by group or
//!   others unless it is sticky (then they cannot remove or rename a file they do not own);
//! - a file already at the path is replaced only if it is a socket of the agent's user (a stale
//!   one: [`SeqPacketListener::bind`] also refuses one that answers); a symlink, anything that
//!   is not a socket, or another user's socket is refused.
//!
//! The mode is set on the bound socket's inode, never by path ([`SeqPacketListener::bind`]).
//!
//! [`SeqPacketListener::bind`]: svnic_client::vm::seqpacket::SeqPacketListener::bind

use std::fs::{DirBuilder, Metadata};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Group- or other-writable bits.
const SHARED_WRITE: u32 = 0o022;

/// A socket path the agent will not serve on.
#[derive(Debug, Error)]
pub enum SocketPathError {
    /// The directory could not be created or examined.
    #[error("socket directory {dir}: {source}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The directory belongs to another user.
    #[error(
        "socket directory {dir} is owned by uid {owner}, not root or this agent's uid {euid}: \
         its owner could replace the socket"
    )]
    DirOwner {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        owner: u32,
        /// The agent's effective uid.
        euid: u32,
    },
    /// Others may add and remove files in the directory.
    #[error(
        "socket directory {dir} (mode {mode:o}) is writable by group or others and not sticky: \
         they could replace the socket; use a directory such as /run/svnic (0755)"
    )]
    DirShared {
        /// The directory.
        dir: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// Something that is not a socket is at the path.
    #[error("{path} is {what}, not a socket; refusing to replace it")]
    NotASocket {
        /// The socket path.
        path: PathBuf,
        /// What is there.
        what: &'static str,
    },
    /// Another user's socket is at the path.
    #[error("{path} is a socket of uid {owner}; refusing to replace another user's socket")]
    ForeignSocket {
        /// The socket path.
        path: PathBuf,
        /// Its owner.
        owner: u32,
    },
}

fn describe(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

/// Checks (creating the directory, 0755, if missing) that the agent may bind `path`.
pub(super) fn check_socket_path(path: &Path) -> Result<(), SocketPathError> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir_error = |source| SocketPathError::Dir {
        dir: dir.to_path_buf(),
        source,
    };
    if !dir.exists() {
        DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(dir_error)?;
    }
    let meta = std::fs::metadata(dir).map_err(dir_error)?;
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(SocketPathError::DirOwner {
            dir: dir.to_path_buf(),
            owner: meta.uid(),
            euid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & SHARED_WRITE != 0 && mode & libc::S_ISVTX == 0 {
        return Err(SocketPathError::DirShared {
            dir: dir.to_path_buf(),
            mode,
        });
    }
    let existing = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(dir_error(source)),
    };
    if !existing.file_type().is_socket() {
        return Err(SocketPathError::NotASocket {
            path: path.to_path_buf(),
            what: describe(&existing),
        });
    }
    if existing.uid() != euid {
        return Err(SocketPathError::ForeignSocket {
            path: path.to_path_buf(),
            owner: existing.uid(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("svnic-sockpath-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn a_missing_directory_is_created_and_a_private_one_accepted() {
        let d = dir("fresh");
        let sock = d.join("a/b/agent.sock");
        check_socket_path(&sock).unwrap();
        let mode = std::fs::metadata(d.join("a/b")).unwrap().mode() & 0o777;
        assert_eq!(mode & SHARED_WRITE, 0, "created {mode:o}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_shared_directory_is_refused_unless_sticky() {
        let d = dir("shared");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let sock = d.join("agent.sock");
        assert!(matches!(
            check_socket_path(&sock),
            Err(SocketPathError::DirShared { mode: 0o777, .. })
        ));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        check_socket_path(&sock).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn what_is_not_our_socket_is_never_replaced() {
        let d = dir("occupied");
        let target = d.join("precious");
        std::fs::write(&target, "keep").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = d.join("link.sock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for (path, what) in [(&link, "a symbolic link"), (&target, "a regular file")] {
            match check_socket_path(path) {
                Err(SocketPathError::NotASocket { what: w, .. }) => assert_eq!(w, what),
                other => panic!("{}: {other:?}", path.display()),
            }
        }
        // Through the agent: the listener is never bound and the target keeps its mode.
        let cfg = super::super::AgentConfig {
            socket: link.clone(),
            ..Default::default()
        };
        let (nic, _wire) =
            super::super::nic::DatagramNic::pair(svnic_channels::MacAddr::ENGINE).unwrap();
        let mem = std::sync::Arc::new(
            svnic_host_frontend::virtio_user::MemfdMemory::new(4 << 20).unwrap(),
        );
        let backend = super::super::memory::MemfdBackend::new(mem).unwrap();
        let refused = super::super::Agent::new(cfg, Box::new(nic), Box::new(backend));
        assert!(matches!(
            refused,
            Err(super::super::AgentError::SocketPath(
                SocketPathError::NotASocket { .. }
            ))
        ));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        let mode = std::fs::metadata(&target).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn another_users_socket_or_directory_is_refused() {
        if !is_root() {
            eprintln!("skipped: needs root (to give files to another uid)");
            return;
        }
        let d = dir("foreign");
        let sock = d.join("agent.sock");
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        drop(l);
        std::os::unix::fs::lchown(&sock, Some(65534), Some(65534)).unwrap();
        assert!(matches!(
            check_socket_path(&sock),
            Err(SocketPathError::ForeignSocket { owner: 65534, .. })
        ));
        std::fs::remove_file(&sock).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        assert!(matches!(
            check_socket_path(&sock),
            Err(SocketPathError::DirOwner { owner: 65534, .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
