//! The admin socket's server: peers admitted by uid, each connection served on a thread of its
//! own (a bounded number at once), a bounded request line, and a deadline to send the request
//! and another to take the answer, so that no client can hold up another or the shutdown.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{info, warn};
use svnic_control_plane::log_limited;
use thiserror::Error;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{AdminRequest, AdminResponse, AdminSource};
use crate::sockets::sys::effective_uid;
use crate::sockets::{
    bind_socket, next_connection, Backoff, PeerFilter, SocketAccess, SocketError, StopWatch,
};

/// The longest request line the admin server reads.
pub const MAX_REQUEST_LINE: usize = 4096;
/// How long a connection may take to send its request, and then to take its answer.
pub const ADMIN_IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once; more are answered "busy" and closed.
pub const MAX_ADMIN_CONNECTIONS: usize = 8;

/// How the admin server admits and bounds its connections.
#[derive(Debug, Clone)]
pub struct AdminOptions {
    /// The socket's mode and the peer uids allowed.
    pub access: SocketAccess,
    /// Time for a connection to send its request, and again to take its answer.
    pub io_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for AdminOptions {
    /// Mode 0600; the daemon's own uid and root; [`ADMIN_IO_TIMEOUT`]; [`MAX_ADMIN_CONNECTIONS`].
    fn default() -> Self {
        AdminOptions {
            access: SocketAccess {
                allow_uids: Some(vec![effective_uid(), 0]),
                ..SocketAccess::default()
            },
            io_timeout: ADMIN_IO_TIMEOUT,
            max_connections: MAX_ADMIN_CONNECTIONS,
        }
    }
}

/// What the admin server refused or cut, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdminCounters {
    /// Connections from a uid not allowed.
    pub refused_peers: u64,
    /// Connections refused because [`AdminOptions::max_connections`] were being served.
    pub busy: u64,
    /// Connections cut because their request or the taking of the answer timed out.
    pub timed_out: u64,
    /// Requests longer than [`MAX_REQUEST_LINE`].
    pub oversized: u64,
}

#[derive(Debug, Default)]
struct Counts {
    busy: AtomicU64,
    timed_out: AtomicU64,
    oversized: AtomicU64,
}

#[derive(Debug)]
struct Stop {
    raised: AtomicBool,
    /// Readable once raised; never read.
    fd: EventFd,
}

/// A running admin server; stops (cutting its connections) and removes its socket when dropped.
#[derive(Debug)]
pub struct AdminServer {
    path: PathBuf,
    stop: Arc<Stop>,
    refused_peers: Arc<AtomicU64>,
    counts: Arc<Counts>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AdminServer {
    /// Binds `path` under the rules of [`crate::sockets::bind`] and serves `source` on a thread.
    pub fn start(
        path: &Path,
        source: Arc<dyn AdminSource>,
        options: &AdminOptions,
    ) -> Result<Self, SocketError> {
        let listener = bind_socket(path, &options.access)?;
        let io_err = |op| {
            move |source| SocketError::Io {
                path: path.into(),
                op,
                source,
            }
        };
        listener
            .set_nonblocking(true)
            .map_err(io_err("make the socket non-blocking"))?;
        let stop = Arc::new(Stop {
            raised: AtomicBool::new(false),
            fd: EventFd::new(EFD_NONBLOCK).map_err(io_err("create the stop eventfd"))?,
        });
        let peers = PeerFilter::new(options.access.allow_uids.as_deref());
        let refused_peers = peers.refused_counter();
        let counts = Arc::new(Counts::default());
        let acceptor = Acceptor {
            listener,
            source,
            stop: stop.clone(),
            peers,
            counts: counts.clone(),
            io_timeout: options.io_timeout,
            max_connections: options.max_connections,
        };
        let thread = std::thread::Builder::new()
            .name("svnic-admin".into())
            .spawn(move || acceptor.run())
            .map_err(io_err("start the admin thread"))?;
        info!("admin socket at {}", path.display());
        Ok(AdminServer {
            path: path.to_path_buf(),
            stop,
            refused_peers,
            counts,
            thread: Some(thread),
        })
    }

    /// What was refused or cut so far.
    pub fn counters(&self) -> AdminCounters {
        AdminCounters {
            refused_peers: self.refused_peers.load(Ordering::Relaxed),
            busy: self.counts.busy.load(Ordering::Relaxed),
            timed_out: self.counts.timed_out.load(Ordering::Relaxed),
            oversized: self.counts.oversized.load(Ordering::Relaxed),
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.raised.store(true, Ordering::SeqCst);
        let _ = self.stop.fd.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The accepting thread: admits peers, serves each connection on a thread of its own, at most
/// `max_connections` at once.
struct Acceptor {
    listener: UnixListener,
    source: Arc<dyn AdminSource>,
    stop: Arc<Stop>,
    peers: PeerFilter,
    counts: Arc<Counts>,
    io_timeout: Duration,
    max_connections: usize,
}

/// A connection being served: the thread, and a handle to cut the stream at shutdown.
struct Live {
    stream: UnixStream,
    thread: std::thread::JoinHandle<()>,
}

impl Acceptor {
    fn run(self) {
        let is_stopped = || self.stop.raised.load(Ordering::SeqCst);
        let watch = StopWatch {
            fd: self.stop.fd.as_raw_fd(),
            is_stopped: &is_stopped,
        };
        let mut backoff = Backoff::default();
        let mut live: Vec<Live> = Vec::new();
        loop {
            let stream = match next_connection(
                &mut backoff,
                self.listener.as_fd(),
                &watch,
                &"admin socket",
                || self.listener.accept().map(|(stream, _)| stream),
            ) {
                Ok(Some(stream)) => stream,
                Ok(None) => break,
                Err(e) => {
                    warn!("admin socket: waiting for connections failed: {e}");
                    break;
                }
            };
            live.retain(|c| !c.thread.is_finished());
            if !self.peers.admits(&stream, &"admin socket") {
                continue;
            }
            if live.len() >= self.max_connections {
                self.counts.busy.fetch_add(1, Ordering::Relaxed);
                refuse_busy(stream, self.max_connections);
                continue;
            }
            match self.spawn_connection(stream) {
                Ok(conn) => live.push(conn),
                Err(e) => log_limited!(log::Level::Warn, "admin connection: cannot serve: {e}"),
            }
        }
        // Stopping: cut every connection still served, then wait for their threads.
        for conn in &live {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        for conn in live {
            let _ = conn.thread.join();
        }
    }

    fn spawn_connection(&self, mut stream: UnixStream) -> std::io::Result<Live> {
        stream.set_nonblocking(false)?;
        let handle = stream.try_clone()?;
        let source = self.source.clone();
        let counts = self.counts.clone();
        let timeout = self.io_timeout;
        let thread = std::thread::Builder::new()
            .name("svnic-admin-conn".into())
            .spawn(move || {
                let served = serve_one(&mut stream, &*source, timeout);
                let counter = match &served {
                    Err(ConnError::TimedOut(_)) => Some(&counts.timed_out),
                    Err(ConnError::TooLong) => Some(&counts.oversized),
                    Err(ConnError::Io(_)) | Ok(()) => None,
                };
                if let Some(c) = counter {
                    c.fetch_add(1, Ordering::Relaxed);
                }
                // The acceptor's handle keeps the socket open: end the connection here.
                let _ = stream.shutdown(Shutdown::Both);
                if let Err(e) = served {
                    log_limited!(log::Level::Warn, "admin connection: {e}");
                }
            })?;
        Ok(Live {
            stream: handle,
            thread,
        })
    }
}

/// Tells a connection over the limit that the server is busy (if it can take the line at once)
/// and closes it.
fn refuse_busy(mut stream: UnixStream, max: usize) {
    log_limited!(
        log::Level::Warn,
        "admin socket: refusing a connection: {max} connections are being served"
    );
    let answer = AdminResponse::Error {
        message: format!("the daemon is busy serving {max} admin connections; try again"),
    };
    if let Ok(mut line) = serde_json::to_vec(&answer) {
        line.push(b'\n');
        if stream.set_nonblocking(true).is_ok() {
            let _ = stream.write(&line);
        }
    }
}

/// Why an admin connection was cut.
#[derive(Debug, Error)]
enum ConnError {
    #[error("timed out {0}")]
    TimedOut(&'static str),
    #[error("request longer than {MAX_REQUEST_LINE} bytes")]
    TooLong,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Reads one request line (without its newline) before `deadline`; `None` if the peer closed
/// without sending anything.
fn read_request(stream: &mut UnixStream, deadline: Instant) -> Result<Option<Vec<u8>>, ConnError> {
    let mut line = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ConnError::TimedOut("reading the request"));
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if is_timeout(&e) => return Err(ConnError::TimedOut("reading the request")),
            Err(e) => return Err(e.into()),
        };
        let chunk = buf.get(..n).unwrap_or_default();
        if n == 0 {
            return Ok((!line.is_empty()).then_some(line));
        }
        let end = chunk.iter().position(|b| *b == b'\n');
        line.extend_from_slice(chunk.get(..end.unwrap_or(n)).unwrap_or_default());
        if line.len() > MAX_REQUEST_LINE {
            return Err(ConnError::TooLong);
        }
        if end.is_some() {
            return Ok(Some(line));
        }
    }
}

/// Writes `bytes` before `deadline`, however slowly the peer reads.
fn write_answer(stream: &mut UnixStream, bytes: &[u8], deadline: Instant) -> Result<(), ConnError> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ConnError::TimedOut("writing the answer"));
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(rest) {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
            Ok(n) => rest = rest.get(n..).unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(ConnError::TimedOut("writing the answer")),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn serve_one(
    stream: &mut UnixStream,
    source: &dyn AdminSource,
    timeout: Duration,
) -> Result<(), ConnError> {
    let response = match read_request(stream, Instant::now() + timeout) {
        Ok(None) => return Ok(()),
        Ok(Some(line)) => match serde_json::from_slice::<AdminRequest>(line.trim_ascii()) {
            Ok(req) => source.answer(req),
            Err(e) => AdminResponse::Error {
                message: format!("bad request: {e}"),
            },
        },
        Err(ConnError::TooLong) => {
            let answer = AdminResponse::Error {
                message: format!("bad request: longer than {MAX_REQUEST_LINE} bytes"),
            };
            let mut out = serde_json::to_vec(&answer).map_err(std::io::Error::other)?;
            out.push(b'\n');
            write_answer(stream, &out, Instant::now() + timeout)?;
            return Err(ConnError::TooLong);
        }
        Err(e) => return Err(e),
    };
    let mut out = serde_json::to_vec(&response).map_err(std::io::Error::other)?;
    out.push(b'\n');
    write_answer(stream, &out, Instant::now() + timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::query;
    use crate::sockets::test_support::{
        connect_as, open_dir, private_dir, require_root, Scratch, Seen,
    };
    use std::io::{BufRead, BufReader};

    /// Answers every request with an error of `size` bytes.
    struct Sized(usize);

    impl AdminSource for Sized {
        fn answer(&self, _req: AdminRequest) -> AdminResponse {
            AdminResponse::Error {
                message: "x".repeat(self.0),
            }
        }
    }

    fn server(
        tag: &str,
        answer_size: usize,
        io_timeout: Duration,
        max_connections: usize,
    ) -> (Scratch, PathBuf, AdminServer) {
        let dir = private_dir(tag);
        let path = dir.join("admin.sock");
        let options = AdminOptions {
            io_timeout,
            max_connections,
            ..AdminOptions::default()
        };
        let server = AdminServer::start(&path, Arc::new(Sized(answer_size)), &options).unwrap();
        (dir, path, server)
    }

    fn still_open(stream: &UnixStream) -> bool {
        stream.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let open = matches!(
            (&*stream).read(&mut byte),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        );
        stream.set_nonblocking(false).unwrap();
        open
    }

    fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_silent_client_does_not_hold_up_another_and_stop_cuts_it() {
        // A long timeout: only serving connections side by side answers the second in time.
        let (_dir, path, server) = server("silent", 10, Duration::from_secs(60), 8);
        let silent = UnixStream::connect(&path).unwrap();
        let answer = query(&path, AdminRequest::Guests).unwrap();
        assert!(matches!(answer, AdminResponse::Error { ref message } if message.len() == 10));
        assert!(
            still_open(&silent),
            "the silent client is still being waited for"
        );
        let t0 = Instant::now();
        drop(server);
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "stopping waited for the silent client's timeout"
        );
        let mut rest = Vec::new();
        assert_eq!((&silent).read_to_end(&mut rest).unwrap_or(0), 0, "cut");
    }

    #[test]
    fn a_client_that_never_reads_its_answer_is_cut_after_the_timeout() {
        // Far more than the socket buffers hold: the write blocks until the deadline.
        let size = 32 << 20;
        let (_dir, path, server) = server("stalled", size, Duration::from_millis(500), 8);
        let mut stalled = UnixStream::connect(&path).unwrap();
        stalled.write_all(b"{\"cmd\":\"guests\"}\n").unwrap();
        wait_until(
            "the stalled reader was never cut",
            Duration::from_secs(30),
            || server.counters().timed_out == 1,
        );
        let mut got = Vec::new();
        let _ = stalled.read_to_end(&mut got);
        assert!(got.len() < size, "the whole answer went through");
        // The server keeps serving.
        assert!(query(&path, AdminRequest::Engine).is_ok());
    }

    #[test]
    fn a_client_that_never_sends_a_request_is_cut_after_the_timeout() {
        let (_dir, path, server) = server("noreq", 10, Duration::from_millis(300), 8);
        let mut idle = UnixStream::connect(&path).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut got = Vec::new();
        assert_eq!(
            idle.read_to_end(&mut got).unwrap(),
            0,
            "closed without an answer"
        );
        assert_eq!(server.counters().timed_out, 1);
    }

    #[test]
    fn an_oversized_request_line_is_refused() {
        let (_dir, path, server) = server("oversized", 10, Duration::from_secs(10), 8);
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(&vec![b'a'; MAX_REQUEST_LINE * 3]).unwrap();
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).unwrap();
        assert!(answer.contains("longer than 4096 bytes"), "{answer}");
        wait_until("not counted", Duration::from_secs(30), || {
            server.counters().oversized == 1
        });
        // A line just under the limit is read as a request (and refused as JSON, not length).
        let mut s = UnixStream::connect(&path).unwrap();
        let mut line = vec![b' '; MAX_REQUEST_LINE - 20];
        line.extend_from_slice(b"{\"cmd\":\"guests\"}\n");
        s.write_all(&line).unwrap();
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).unwrap();
        assert!(answer.contains("xxxxxxxxxx"), "{answer}");
    }

    #[test]
    fn connections_past_the_limit_are_told_busy() {
        let (_dir, path, server) = server("busy", 10, Duration::from_secs(60), 2);
        let held = [
            UnixStream::connect(&path).unwrap(),
            UnixStream::connect(&path).unwrap(),
        ];
        // The two are accepted (and wait for their requests) before the third arrives.
        std::thread::sleep(Duration::from_millis(200));
        match query(&path, AdminRequest::Guests).unwrap() {
            AdminResponse::Error { message } => assert!(message.contains("busy"), "{message}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(server.counters().busy, 1);
        drop(held);
        wait_until(
            "a freed slot is not reused",
            Duration::from_secs(30),
            || matches!(query(&path, AdminRequest::Guests), Ok(AdminResponse::Error { message }) if message.len() == 10),
        );
    }

    #[test]
    fn a_uid_not_allowed_is_closed_at_once() {
        require_root!("connecting as another uid needs root");
        let dir = open_dir("admin-peer");
        let path = dir.join("admin.sock");
        let mut options = AdminOptions::default();
        // Reachable by every uid: only the allow-list (root and this process) decides.
        options.access.mode = 0o666;
        let server = AdminServer::start(&path, Arc::new(Sized(10)), &options).unwrap();
        let request = b"{\"cmd\":\"guests\"}\n";
        let wait = Duration::from_secs(10);
        assert_eq!(connect_as(65534, &path, request, wait), Seen::ClosedAtOnce);
        assert_eq!(server.counters().refused_peers, 1);
        assert_eq!(connect_as(0, &path, request, wait), Seen::Answered);
        assert_eq!(server.counters().refused_peers, 1);
    }
}
