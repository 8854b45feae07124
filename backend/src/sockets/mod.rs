//! The Unix sockets the daemon listens on (each guest's vhost-user socket, the admin socket),
//! made safe against other local users and against accept failures.
//!
//! - [`bind`]: where a socket may be created (a directory only the daemon or root controls, no
//!   file of someone else in the way) and its explicit mode, independent of the umask.
//! - [`peer`]: the optional allow-list of peer uids (`SO_PEERCRED`).
//! - [`accept`]: waiting for connections with backoff after accept errors, ending at once when
//!   the stop signal rises.

pub mod accept;
pub mod bind;
pub mod error;
pub mod peer;
pub mod sys;

#[cfg(test)]
pub(crate) mod test_support;

pub use accept::{next_connection, Backoff, StopWatch};
pub use bind::{bind_socket, parse_mode, SocketAccess, DEFAULT_SOCKET_MODE};
pub use error::SocketError;
pub use peer::{peer_credentials, peer_uid, PeerFilter};

/// The directory of the default admin socket; created 0700 when missing.
pub const DEFAULT_SOCKET_DIR: &str = "/run/svnic";
