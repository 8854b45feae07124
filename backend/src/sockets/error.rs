//! Why a socket could not be created where asked.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use super::DEFAULT_SOCKET_DIR;

/// Why a socket could not be created where asked.
#[derive(Debug, Error)]
pub enum SocketError {
    /// The directory is missing (or is not a directory).
    #[error("{path}: the directory {dir} does not exist or is not a directory; create it (mode 0700) or choose another path")]
    NoDirectory {
        /// The socket path.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },
    /// Someone other than the daemon's user or root owns the directory.
    #[error("{path}: the directory {dir} is owned by uid {owner}, not by this daemon (uid {euid}) or root, so its owner could replace the socket; choose a directory of your own such as {DEFAULT_SOCKET_DIR}")]
    DirectoryNotOurs {
        /// The socket path.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// The directory's owner.
        owner: u32,
        /// The daemon's effective uid.
        euid: u32,
    },
    /// Other users may create and remove files in the directory.
    #[error("{path}: the directory {dir} (mode {mode:04o}) is writable by group or others without the sticky bit, so they could replace the socket; use a private directory such as {DEFAULT_SOCKET_DIR}")]
    DirectoryWritable {
        /// The socket path.
        path: PathBuf,
        /// Its directory.
        dir: PathBuf,
        /// The directory's mode bits.
        mode: u32,
    },
    /// Something that is not a socket is at the path.
    #[error("{path} exists and is not a socket; remove it or choose another path")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A socket of another user is at the path.
    #[error("{path} is a socket owned by uid {owner}, not by this daemon (uid {euid}); svnic serve does not take over a path it does not own")]
    NotOurs {
        /// The path.
        path: PathBuf,
        /// The socket's owner.
        owner: u32,
        /// The daemon's effective uid.
        euid: u32,
    },
    /// A live socket is at the path.
    #[error("{path} is already served by another process")]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// The path does not fit in a Unix socket address.
    #[error("{path}: a Unix socket path may have at most {max} bytes, this one has {len}")]
    PathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A system call failed.
    #[error("{path}: cannot {op}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
}
