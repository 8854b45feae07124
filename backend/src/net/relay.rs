//! A vhost-user message relay between a frontend and the daemon serving it.
//!
//! Why: QEMU 7.2's virtio-net sends `SET_VRING_ENABLE` for its rings when the NIC is realized
//! (`peer_attach`), right after the protocol-feature handshake and before any `SET_FEATURES`.
//! The vhost 0.18 crate accepts `SET_VRING_ENABLE` only once `VHOST_USER_F_PROTOCOL_FEATURES`
//! has been acked by `SET_FEATURES`, and otherwise ends the connection; QEMU could then never
//! start the device. And QEMU does not enable the rings again when it starts the device: those
//! early messages are the only ones. So the relay holds them back (acknowledging them itself if
//! asked), and right after forwarding the `SET_FEATURES` that acks `PROTOCOL_FEATURES` it sends
//! the last enable state of each ring, which is the effect they would have had. Everything else
//! passes through unchanged, file descriptors included.
//!
//! The relay frames messages (a 12-byte header, then `size` bytes) and refuses a header that
//! announces more than the vhost-user maximum of 4096 bytes; all other validation is the
//! daemon's. It ends when either side closes, and then closes the other.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use log::debug;
use thiserror::Error;
use vhost::vhost_user::message::{VhostUserVirtioFeatures, MAX_ATTACHED_FD_ENTRIES, MAX_MSG_SIZE};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::port::PortId;

const HEADER_LEN: usize = 12;

/// A message header: request, flags, body size (little-endian u32 each).
type Header = [u8; HEADER_LEN];
const SET_FEATURES: u32 = 2;
const SET_VRING_ENABLE: u32 = 18;
const FLAG_VERSION_1: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;

/// Why a relayed connection ended abnormally.
#[derive(Debug, Error)]
pub enum RelayError {
    /// A header announced a body larger than any vhost-user message.
    #[error("message {request} announces a {size}-byte body (the limit is {MAX_MSG_SIZE})")]
    Oversized {
        /// The request code.
        request: u32,
        /// The announced size.
        size: u32,
    },
    /// The stream ended inside a message.
    #[error("connection closed in the middle of message {request} ({got} of {size} bytes)")]
    Truncated {
        /// The request code (0 if the header itself was cut).
        request: u32,
        /// Bytes received.
        got: usize,
        /// Bytes announced.
        size: usize,
    },
    /// A socket failed.
    #[error("relay I/O: {0}")]
    Io(#[from] io::Error),
}

/// The two relay threads of one connection.
pub(crate) struct Relay {
    requests: JoinHandle<Result<(), RelayError>>,
    replies: JoinHandle<Result<(), RelayError>>,
}

impl Relay {
    /// Relays between `frontend` (the accepted frontend connection) and `daemon` (a connection
    /// the daemon accepted).
    pub(crate) fn spawn(
        port: PortId,
        frontend: UnixStream,
        daemon: UnixStream,
    ) -> io::Result<Self> {
        let frontend_writer = Arc::new(Mutex::new(frontend.try_clone()?));
        let (f2, d2, w2) = (
            frontend.try_clone()?,
            daemon.try_clone()?,
            frontend_writer.clone(),
        );
        let (f3, d3) = (frontend.try_clone()?, daemon.try_clone()?);
        let requests = std::thread::Builder::new()
            .name(format!("svnic-relay-{}", port.0))
            .spawn(move || {
                let r = relay_requests(port, &frontend, &daemon, &frontend_writer);
                let _ = daemon.shutdown(Shutdown::Both);
                r
            })?;
        let replies = std::thread::Builder::new()
            .name(format!("svnic-replies-{}", port.0))
            .spawn(move || {
                let r = relay_replies(&d2, &w2);
                let _ = f2.shutdown(Shutdown::Both);
                r
            });
        match replies {
            Ok(replies) => Ok(Relay { requests, replies }),
            Err(e) => {
                // The request thread ends when its sockets are shut down.
                let _ = f3.shutdown(Shutdown::Both);
                let _ = d3.shutdown(Shutdown::Both);
                Err(e)
            }
        }
    }

    /// Waits for both directions to end; the first error, if any.
    pub(crate) fn join(self) -> Result<(), RelayError> {
        let requests = self.requests.join().unwrap_or(Ok(()));
        let replies = self.replies.join().unwrap_or(Ok(()));
        requests.and(replies)
    }
}

/// Reads exactly `buf.len()` bytes, or reports how many came before the end of the stream.
fn read_full(mut sock: &UnixStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match sock.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The next header and the descriptors that came with it; `None` at a clean end of stream.
fn recv_header(sock: &UnixStream) -> Result<Option<(Header, Vec<File>)>, RelayError> {
    let mut header = [0u8; HEADER_LEN];
    let mut raw_fds: [RawFd; MAX_ATTACHED_FD_ENTRIES] = [-1; MAX_ATTACHED_FD_ENTRIES];
    let mut iov = [libc::iovec {
        iov_base: header.as_mut_ptr().cast(),
        iov_len: HEADER_LEN,
    }];
    let (n, nfds) = loop {
        // SAFETY: the iovec describes `header`, which outlives the call and may receive any
        // bytes; `raw_fds` receives at most its length of descriptors.
        match unsafe { sock.recv_with_fds(&mut iov, &mut raw_fds) } {
            Ok(r) => break r,
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        }
    };
    let files = raw_fds[..nfds.min(MAX_ATTACHED_FD_ENTRIES)]
        .iter()
        // SAFETY: recvmsg installed these descriptors for us and nothing else owns them.
        .map(|&fd| unsafe { File::from_raw_fd(fd) })
        .collect();
    if n == 0 {
        return Ok(None);
    }
    let got = n + read_full(sock, &mut header[n..])?;
    if got < HEADER_LEN {
        return Err(RelayError::Truncated {
            request: 0,
            got,
            size: HEADER_LEN,
        });
    }
    Ok(Some((header, files)))
}

fn field(header: &Header, at: usize) -> u32 {
    field_of(header, at)
}

fn field_of(bytes: &[u8], at: usize) -> u32 {
    match bytes.get(at..at + 4) {
        Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        None => 0,
    }
}

/// Reads the body announced by `header`.
fn recv_body(sock: &UnixStream, header: &Header) -> Result<Vec<u8>, RelayError> {
    let (request, size) = (field(header, 0), field(header, 8));
    if size as usize > MAX_MSG_SIZE {
        return Err(RelayError::Oversized { request, size });
    }
    let mut body = vec![0u8; size as usize];
    let got = read_full(sock, &mut body)?;
    if got < body.len() {
        return Err(RelayError::Truncated {
            request,
            got,
            size: body.len(),
        });
    }
    Ok(body)
}

/// Frontend -> daemon.
fn relay_requests(
    port: PortId,
    frontend: &UnixStream,
    daemon: &UnixStream,
    frontend_writer: &Mutex<UnixStream>,
) -> Result<(), RelayError> {
    // Mirrors the vhost crate: set by every SET_FEATURES, never reset.
    let mut protocol_features_acked = false;
    // Enable states held back until then: ring index -> last value (the 8-byte body).
    let mut held_enables: BTreeMap<u32, [u8; 8]> = BTreeMap::new();
    while let Some((header, files)) = recv_header(frontend)? {
        let body = recv_body(frontend, &header)?;
        let (request, flags) = (field(&header, 0), field(&header, 4));
        if request == SET_FEATURES {
            if let Some(bytes) = body.get(..8) {
                let mut value = [0u8; 8];
                value.copy_from_slice(bytes);
                protocol_features_acked = u64::from_le_bytes(value)
                    & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
                    != 0;
            }
        }
        if request == SET_VRING_ENABLE && !protocol_features_acked {
            debug!("{port}: SET_VRING_ENABLE before SET_FEATURES held back");
            if let Some(state) = body.get(..8) {
                let mut value = [0u8; 8];
                value.copy_from_slice(state);
                held_enables.insert(field_of(&value, 0), value);
            }
            if flags & FLAG_NEED_REPLY != 0 {
                let mut reply = Vec::with_capacity(HEADER_LEN + 8);
                reply.extend_from_slice(&request.to_le_bytes());
                reply.extend_from_slice(&(FLAG_VERSION_1 | FLAG_REPLY).to_le_bytes());
                reply.extend_from_slice(&8u32.to_le_bytes());
                reply.extend_from_slice(&0u64.to_le_bytes());
                frontend_writer
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .write_all(&reply)?;
            }
            continue;
        }
        send_message(daemon, &header, &body, &files)?;
        if request == SET_FEATURES && protocol_features_acked {
            for (_, state) in std::mem::take(&mut held_enables) {
                // No NEED_REPLY: the daemon answers nothing, so no stray reply reaches the
                // frontend.
                let mut replay = [0u8; HEADER_LEN];
                replay[..4].copy_from_slice(&SET_VRING_ENABLE.to_le_bytes());
                replay[4..8].copy_from_slice(&FLAG_VERSION_1.to_le_bytes());
                replay[8..].copy_from_slice(&8u32.to_le_bytes());
                send_message(daemon, &replay, &state, &[])?;
            }
        }
    }
    Ok(())
}

/// Sends one message with its descriptors (attached to the first bytes, as the receiver
/// expects).
fn send_message(
    sock: &UnixStream,
    header: &Header,
    body: &[u8],
    files: &[File],
) -> Result<(), RelayError> {
    let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    let total = HEADER_LEN + body.len();
    let sent = loop {
        match sock.send_with_fds(&[&header[..], body], &fds) {
            Ok(n) => break n,
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        }
    };
    if sent < total {
        let mut rest = Vec::with_capacity(total - sent);
        rest.extend_from_slice(header);
        rest.extend_from_slice(body);
        (&*sock).write_all(&rest[sent..])?;
    }
    Ok(())
}

/// Daemon -> frontend: replies, framed so that they never interleave with a reply the relay
/// writes itself. The daemon attaches no descriptors to replies for the features it offers.
fn relay_replies(daemon: &UnixStream, frontend: &Mutex<UnixStream>) -> Result<(), RelayError> {
    loop {
        let mut header = [0u8; HEADER_LEN];
        match read_full(daemon, &mut header)? {
            0 => return Ok(()),
            HEADER_LEN => {}
            got => {
                return Err(RelayError::Truncated {
                    request: 0,
                    got,
                    size: HEADER_LEN,
                })
            }
        }
        let body = recv_body(daemon, &header)?;
        let mut out = frontend.lock().unwrap_or_else(|e| e.into_inner());
        out.write_all(&header)?;
        out.write_all(&body)?;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn message(request: u32, flags: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&request.to_le_bytes());
        m.extend_from_slice(&flags.to_le_bytes());
        m.extend_from_slice(&(body.len() as u32).to_le_bytes());
        m.extend_from_slice(body);
        m
    }

    struct Pair {
        frontend: UnixStream,
        daemon: UnixStream,
        relay: Relay,
    }

    fn relayed() -> Pair {
        let (frontend, frontend_end) = UnixStream::pair().unwrap();
        let (daemon_end, daemon) = UnixStream::pair().unwrap();
        for s in [&frontend, &daemon] {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        }
        let relay = Relay::spawn(svnic_control::GuestId(1), frontend_end, daemon_end).unwrap();
        Pair {
            frontend,
            daemon,
            relay,
        }
    }

    fn read_n(mut s: &UnixStream, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        s.read_exact(&mut b).unwrap();
        b
    }

    fn read_rest(mut s: &UnixStream) -> Vec<u8> {
        let mut b = Vec::new();
        s.read_to_end(&mut b).unwrap();
        b
    }

    #[test]
    fn early_vring_enables_are_held_until_features_then_replayed() {
        let p = relayed();
        let enable =
            |index: u8, on: u8| message(SET_VRING_ENABLE, 1, &[index, 0, 0, 0, on, 0, 0, 0]);
        let asked = message(
            SET_VRING_ENABLE,
            1 | FLAG_NEED_REPLY,
            &[1, 0, 0, 0, 1, 0, 0, 0],
        );
        let features = message(SET_FEATURES, 1, &(1u64 << 30 | 1 << 32).to_le_bytes());
        // As QEMU 7.2 does: ring 0 enabled, disabled, enabled again; ring 1 enabled (here
        // asking for a reply).
        for m in [enable(0, 1), enable(0, 0), enable(0, 1)] {
            (&p.frontend).write_all(&m).unwrap();
        }
        (&p.frontend).write_all(&asked).unwrap();
        let ack = read_n(&p.frontend, HEADER_LEN + 8);
        assert_eq!(ack, message(SET_VRING_ENABLE, 1 | FLAG_REPLY, &[0; 8]));
        (&p.frontend).write_all(&features).unwrap();
        // The daemon sees SET_FEATURES, then the last state of each ring.
        assert_eq!(read_n(&p.daemon, features.len()), features);
        assert_eq!(read_n(&p.daemon, enable(0, 1).len()), enable(0, 1));
        assert_eq!(read_n(&p.daemon, enable(1, 1).len()), enable(1, 1));
        // After it, enables pass straight through.
        (&p.frontend).write_all(&enable(1, 0)).unwrap();
        assert_eq!(read_n(&p.daemon, enable(1, 0).len()), enable(1, 0));

        // Replies flow back.
        let reply = message(1, 1 | FLAG_REPLY, &[7; 8]);
        (&p.daemon).write_all(&reply).unwrap();
        assert_eq!(read_n(&p.frontend, reply.len()), reply);

        drop(p.frontend);
        assert!(
            read_rest(&p.daemon).is_empty(),
            "the daemon side is closed too"
        );
        assert!(p.relay.join().is_ok());
    }

    #[test]
    fn descriptors_travel_with_their_message() {
        let p = relayed();
        let (a, _b) = UnixStream::pair().unwrap();
        let call = message(13, 1, &0u64.to_le_bytes());
        p.frontend
            .send_with_fds(
                &[&call[..HEADER_LEN], &call[HEADER_LEN..]],
                &[a.as_raw_fd()],
            )
            .unwrap();
        let mut buf = vec![0u8; call.len()];
        let mut fds = [-1; 4];
        let mut iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        // SAFETY: the iovec describes `buf`, alive across the call.
        let (n, nfds) = unsafe { p.daemon.recv_with_fds(&mut iov, &mut fds) }.unwrap();
        assert_eq!((n, nfds), (call.len(), 1));
        assert_eq!(buf, call);
        // SAFETY: received descriptor, owned by nobody else.
        drop(unsafe { File::from_raw_fd(fds[0]) });
    }

    #[test]
    fn an_oversized_header_ends_the_connection() {
        let p = relayed();
        let mut bad = message(5, 1, &[]);
        bad[8..12].copy_from_slice(&0x10_0000u32.to_le_bytes());
        (&p.frontend).write_all(&bad).unwrap();
        assert!(matches!(
            p.relay.join(),
            Err(RelayError::Oversized {
                request: 5,
                size: 0x10_0000
            })
        ));
        assert!(read_rest(&p.daemon).is_empty());
    }

    #[test]
    fn a_message_cut_short_is_reported() {
        let p = relayed();
        let m = message(SET_FEATURES, 1, &[1, 2, 3, 4, 5, 6, 7, 8]);
        (&p.frontend).write_all(&m[..15]).unwrap();
        p.frontend.shutdown(Shutdown::Write).unwrap();
        assert!(matches!(
            p.relay.join(),
            Err(RelayError::Truncated {
                request: SET_FEATURES,
                got: 3,
                size: 8
            })
        ));
    }
}
