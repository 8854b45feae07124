//! The optional allow-list of peer uids: the kernel's `SO_PEERCRED` of a connection is checked
//! before a byte of it is read. A refused peer is closed at once and counted; its log line is
//! rate-limited, since the peer decides how often it happens.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use svnic_control_plane::log_limited;

/// The uid of the process at the other end of `stream`, as the kernel recorded it at connect.
pub fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    peer_credentials(stream).map(|cred| cred.uid)
}

/// The pid, uid and gid of the process at the other end of `stream`, as the kernel recorded them
/// at connect.
pub fn peer_credentials(stream: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let cred_ptr: *mut libc::ucred = &mut cred;
    // SAFETY: cred_ptr points to a live ucred and `len` holds its size, as SO_PEERCRED needs.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            cred_ptr.cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// Admits connections by peer uid and counts those it refuses.
#[derive(Debug, Clone, Default)]
pub struct PeerFilter {
    allow_uids: Option<Arc<[u32]>>,
    refused: Arc<AtomicU64>,
}

impl PeerFilter {
    /// Admits peers whose uid is in `allow_uids`; `None` admits everyone who can connect.
    pub fn new(allow_uids: Option<&[u32]>) -> Self {
        PeerFilter {
            allow_uids: allow_uids.map(Arc::from),
            refused: Arc::new(AtomicU64::new(0)),
        }
    }

    /// True if `stream`'s peer may be served; otherwise it is counted and logged, and the caller
    /// drops (closes) it. `socket` names the socket in the log line.
    pub fn admits(&self, stream: &UnixStream, socket: &dyn std::fmt::Display) -> bool {
        let Some(allowed) = &self.allow_uids else {
            return true;
        };
        let why = match peer_uid(stream) {
            Ok(uid) if allowed.contains(&uid) => return true,
            Ok(uid) => format!("from uid {uid}: not in the allowed uids {allowed:?}"),
            Err(e) => format!("whose peer credentials cannot be read: {e}"),
        };
        self.refused.fetch_add(1, Ordering::Relaxed);
        log_limited!(log::Level::Warn, "{socket}: refusing a connection {why}");
        false
    }

    /// Connections refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The counter itself, to be read after the filter moved to its thread.
    pub fn refused_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sockets::test_support::{
        access_with_mode, connect_as, open_dir, private_dir, require_root, Seen,
    };
    use crate::sockets::{bind_socket, SocketAccess};
    use std::time::Duration;

    #[test]
    fn the_peer_uid_is_the_connecting_process_uid() {
        let dir = private_dir("peeruid");
        let path = dir.join("p.sock");
        let listener = bind_socket(&path, &SocketAccess::default()).unwrap();
        let _client = UnixStream::connect(&path).unwrap();
        let (server_side, _) = listener.accept().unwrap();
        assert_eq!(
            peer_uid(&server_side).unwrap(),
            crate::sockets::sys::effective_uid()
        );
    }

    #[test]
    fn a_peer_outside_the_allow_list_is_closed_at_once_and_counted() {
        require_root!("connecting as another uid needs root");
        // Reachable by everyone: only the allow-list keeps uid 65534 out.
        let dir = open_dir("peer");
        let path = dir.join("p.sock");
        let listener = bind_socket(&path, &access_with_mode(0o666)).unwrap();
        let filter = PeerFilter::new(Some(&[0]));
        let server = {
            let filter = filter.clone();
            std::thread::spawn(move || {
                let mut kept = Vec::new();
                for _ in 0..2 {
                    let (stream, _) = listener.accept().unwrap();
                    if filter.admits(&stream, &"test socket") {
                        std::io::Write::write_all(&mut &stream, b"hello").unwrap();
                        kept.push(stream);
                    }
                }
                kept.len()
            })
        };
        let wait = Duration::from_secs(10);
        assert_eq!(connect_as(65534, &path, b"", wait), Seen::ClosedAtOnce);
        assert_eq!(connect_as(0, &path, b"", wait), Seen::Answered);
        assert_eq!(server.join().unwrap(), 1, "only root's connection kept");
        assert_eq!(filter.refused(), 1);
        // Without an allow-list the mode alone decides.
        assert!(PeerFilter::new(None).admits(&UnixStream::pair().unwrap().0, &"x"));
    }
}
