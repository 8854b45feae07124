//! A vhost-user message relay between a frontend and the daemon serving it, and the protocol
//! gate every frontend message passes.
//!
//! The gate (module `gate`) passes only what svnic offered and serves: requests of an allowlist,
//! features that were offered, the right descriptors of the right kind, ring indices of the
//! device; any other message ends the connection before the daemon sees it (its descriptors
//! closed), with a [`Refusal`] naming what was wrong.
//!
//! QEMU 7.2's virtio-net sends `SET_VRING_ENABLE` for its rings when the NIC is realized
//! (`peer_attach`), right after the protocol-feature handshake and before any `SET_FEATURES`.
//! The vhost 0.18 crate accepts `SET_VRING_ENABLE` only once `VHOST_USER_F_PROTOCOL_FEATURES`
//! has been acked by `SET_FEATURES`, and otherwise ends the connection; QEMU could then never
//! start the device. And QEMU does not enable the rings again when it starts the device: those
//! early messages are the only ones. So the relay holds them back (one slot per ring,
//! acknowledging them itself if asked), and right after forwarding the `SET_FEATURES` that acks
//! `PROTOCOL_FEATURES` it sends the last enable state of each ring, which is the effect they
//! would have had. Everything else the gate accepts passes through unchanged, descriptors
//! included.
//!
//! The relay frames messages (a 12-byte header, then `size` bytes) and refuses a header that
//! announces more than the vhost-user maximum of 4096 bytes. Every write, to either side, has a
//! timeout ([`WRITE_TIMEOUT`]): a peer that does not read ends the connection instead of
//! blocking the relay. When either direction ends, both sockets are shut down, so the other
//! direction ends too and nothing stays blocked.

mod gate;

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use svnic_control_plane::log_limited;
use thiserror::Error;
use vhost::vhost_user::message::{MAX_ATTACHED_FD_ENTRIES, MAX_MSG_SIZE};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub use self::gate::{Refusal, RequestCode, MAX_REGIONS};
use self::gate::{RequestGate, Verdict, FLAG_REPLY, FLAG_VERSION_1};
use super::port::PortId;

const HEADER_LEN: usize = 12;

/// A message header: request, flags, body size (little-endian u32 each).
type Header = [u8; HEADER_LEN];
const SET_VRING_ENABLE: u32 = 18;

/// How long a write to the frontend or the daemon may block before the connection ends.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// One side of the relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The vhost-user frontend (QEMU, DPDK, a host-process guest).
    Frontend,
    /// The daemon serving the port's device.
    Daemon,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Peer::Frontend => "frontend",
            Peer::Daemon => "daemon",
        })
    }
}

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
    /// The frontend sent a message the gate refuses.
    #[error("protocol violation: {0}")]
    Refused(#[from] Refusal),
    /// A peer did not take a message within the write timeout.
    #[error("the {peer} did not take a message within {timeout:?}; it does not read")]
    WriteTimeout {
        /// The side that stopped reading.
        peer: Peer,
        /// The timeout.
        timeout: Duration,
    },
    /// A socket failed.
    #[error("relay I/O: {0}")]
    Io(#[from] io::Error),
}

/// The two relay threads of one connection.
pub(crate) struct Relay {
    requests: JoinHandle<Result<(), RelayError>>,
    replies: JoinHandle<Result<(), RelayError>>,
    frontend: UnixStream,
    daemon: UnixStream,
}

/// Shuts both sockets down: every thread blocked on either wakes up and ends.
fn shut_down(a: &UnixStream, b: &UnixStream) {
    let _ = a.shutdown(Shutdown::Both);
    let _ = b.shutdown(Shutdown::Both);
}

impl Relay {
    /// Relays between `frontend` (the accepted frontend connection) and `daemon` (a connection
    /// the daemon accepted), with [`WRITE_TIMEOUT`].
    pub(crate) fn spawn(
        port: PortId,
        frontend: UnixStream,
        daemon: UnixStream,
    ) -> io::Result<Self> {
        Self::spawn_with_timeout(port, frontend, daemon, WRITE_TIMEOUT)
    }

    fn spawn_with_timeout(
        port: PortId,
        frontend: UnixStream,
        daemon: UnixStream,
        write_timeout: Duration,
    ) -> io::Result<Self> {
        // Socket options: they hold for every clone.
        frontend.set_write_timeout(Some(write_timeout))?;
        daemon.set_write_timeout(Some(write_timeout))?;
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
                let r = relay_requests(port, &frontend, &daemon, &frontend_writer, write_timeout);
                shut_down(&frontend, &daemon);
                r
            });
        let requests = match requests {
            Ok(requests) => requests,
            Err(e) => {
                shut_down(&f3, &d3);
                return Err(e);
            }
        };
        let replies = std::thread::Builder::new()
            .name(format!("svnic-replies-{}", port.0))
            .spawn(move || {
                let r = relay_replies(&d2, &w2, write_timeout);
                shut_down(&f2, &d2);
                r
            });
        match replies {
            Ok(replies) => Ok(Relay {
                requests,
                replies,
                frontend: f3,
                daemon: d3,
            }),
            Err(e) => {
                // The request thread ends when its sockets are shut down.
                shut_down(&f3, &d3);
                Err(e)
            }
        }
    }

    /// Ends the connection now: both sockets are shut down, so both threads end at once, even
    /// one blocked writing to a peer that does not read.
    pub(crate) fn shutdown(&self) {
        shut_down(&self.frontend, &self.daemon);
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

/// A failed write: a timeout names the peer that does not read.
fn write_error(e: io::Error, peer: Peer, timeout: Duration) -> RelayError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            RelayError::WriteTimeout { peer, timeout }
        }
        _ => RelayError::Io(e),
    }
}

/// Writes `parts` to the frontend as one message, or reports a timeout.
fn write_frontend(
    frontend: &Mutex<UnixStream>,
    parts: &[&[u8]],
    timeout: Duration,
) -> Result<(), RelayError> {
    let mut out = frontend.lock().unwrap_or_else(|e| e.into_inner());
    for part in parts {
        out.write_all(part)
            .map_err(|e| write_error(e, Peer::Frontend, timeout))?;
    }
    Ok(())
}

/// The next header and the descriptors that came with it; `None` at a clean end of stream.
/// Descriptors beyond [`MAX_ATTACHED_FD_ENTRIES`] are closed by the kernel.
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

/// The u32 at `at` in a header (0 past its end).
fn field(header: &Header, at: usize) -> u32 {
    match header.get(at..at + 4) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
        _ => 0,
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

/// Frontend -> daemon, through the gate. A refused message ends the connection; its
/// descriptors are dropped (closed) with it.
fn relay_requests(
    port: PortId,
    frontend: &UnixStream,
    daemon: &UnixStream,
    frontend_writer: &Mutex<UnixStream>,
    timeout: Duration,
) -> Result<(), RelayError> {
    let mut gate = RequestGate::for_device();
    while let Some((header, files)) = recv_header(frontend)? {
        let body = recv_body(frontend, &header)?;
        let (request, flags) = (field(&header, 0), field(&header, 4));
        match gate.check(request, flags, &body, &files)? {
            Verdict::Forward => send_message(daemon, &header, &body, &files, timeout)?,
            Verdict::Hold { ack } => {
                log_limited!(
                    log::Level::Debug,
                    "{port}: SET_VRING_ENABLE before SET_FEATURES held back"
                );
                if ack {
                    let mut reply = [0u8; HEADER_LEN];
                    reply[..4].copy_from_slice(&request.to_le_bytes());
                    reply[4..8].copy_from_slice(&(FLAG_VERSION_1 | FLAG_REPLY).to_le_bytes());
                    reply[8..].copy_from_slice(&8u32.to_le_bytes());
                    write_frontend(frontend_writer, &[&reply, &0u64.to_le_bytes()], timeout)?;
                }
            }
            Verdict::ForwardThenReplay(states) => {
                send_message(daemon, &header, &body, &files, timeout)?;
                for state in states {
                    // No NEED_REPLY: the daemon answers nothing, so no stray reply reaches the
                    // frontend.
                    let mut replay = [0u8; HEADER_LEN];
                    replay[..4].copy_from_slice(&SET_VRING_ENABLE.to_le_bytes());
                    replay[4..8].copy_from_slice(&FLAG_VERSION_1.to_le_bytes());
                    replay[8..].copy_from_slice(&8u32.to_le_bytes());
                    send_message(daemon, &replay, &state, &[], timeout)?;
                }
            }
        }
    }
    Ok(())
}

/// Sends one message to the daemon with its descriptors (attached to the first bytes, as the
/// receiver expects).
fn send_message(
    sock: &UnixStream,
    header: &Header,
    body: &[u8],
    files: &[File],
    timeout: Duration,
) -> Result<(), RelayError> {
    let fds: Vec<RawFd> = files.iter().map(|f| f.as_raw_fd()).collect();
    let total = HEADER_LEN + body.len();
    let sent = loop {
        match sock.send_with_fds(&[&header[..], body], &fds) {
            Ok(n) => break n,
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) => return Err(write_error(e.into(), Peer::Daemon, timeout)),
        }
    };
    if sent < total {
        let mut rest = Vec::with_capacity(total - sent);
        rest.extend_from_slice(header);
        rest.extend_from_slice(body);
        (&*sock)
            .write_all(rest.get(sent..).unwrap_or_default())
            .map_err(|e| write_error(e, Peer::Daemon, timeout))?;
    }
    Ok(())
}

/// Daemon -> frontend: replies, framed so that they never interleave with a reply the relay
/// writes itself. The daemon attaches no descriptors to replies for the features it offers.
fn relay_replies(
    daemon: &UnixStream,
    frontend: &Mutex<UnixStream>,
    timeout: Duration,
) -> Result<(), RelayError> {
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
        write_frontend(frontend, &[&header, &body], timeout)?;
    }
}

#[cfg(test)]
mod tests;
