//! A hostile vhost-user frontend: any sequence of messages, with any fds, against a real port.
//!
//! One daemon (`Daemon::start`, exactly as `svnic serve` runs it, one worker) lives for the
//! whole process, with one guest whose socket is in a private (0700) temporary directory. Each
//! [`Input`] is sent over a fresh connection, replies read without blocking, then the connection
//! is closed. [`run`] panics unless, after every input:
//! - the process is alive (a SIGBUS from a truncated memfd would end it; a panic in any thread
//!   ends a fuzzing process too, as libfuzzer-sys aborts on a panic);
//! - the process's open fd count returns to within [`FD_SLACK`] of its baseline within
//!   [`SETTLE_TIMEOUT`]: the connection and everything it brought are released, and its teardown
//!   does not hang;
//! - every [`PROBE_EVERY`] inputs, a polite host-process guest (`HostGuest`) connects to the same
//!   socket, creates a channel, sends itself a message and receives it, and destroys the channel
//!   ([`probe`]), after which the fd count settles again.
//!
//! `SVNIC_FUZZ_NO_TRUNCATE=1` leaves the "truncated later" memfds at their size.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use svnic_backend::config::{DaemonConfig, EngineOverrides};
use svnic_backend::daemon::{AdminSocket, Daemon};
use svnic_channels::Message as ChannelMessage;
use svnic_client::Completions;
use svnic_host_frontend::HostGuest;
use svnic_tests::raw_frontend::flags::NEED_REPLY;
use svnic_tests::raw_frontend::{
    encode_with_size, mem_table_claiming, req, single_region, u64_body, vring_fd_body, vring_state,
    Memfd, Pipe, Sealing, VringAddr,
};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::input::{
    Addr, Attach, Body, Input, Message, MAX_FDS, MAX_MEMFD, MAX_MESSAGES, MAX_RAW_BODY, MAX_REGIONS,
};

/// Open fds the process may have above its baseline once a connection is gone.
pub const FD_SLACK: usize = 4;
/// How long a closed connection may take to release its resources.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A polite guest checks the port every this many inputs.
pub const PROBE_EVERY: u64 = 64;
/// Generous: the machine may be loaded (libFuzzer's `-timeout` must be longer).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for the reply of a message that asks for one.
const REPLY_WAIT: Duration = Duration::from_millis(20);
/// The probe's guest memory.
const PROBE_MEMORY: u64 = 16 << 20;
const MAC: &str = "52:54:00:f0:00:01";

struct Fixture {
    _daemon: Daemon,
    socket: PathBuf,
    fd_baseline: usize,
    inputs: u64,
    truncate: bool,
}

/// The scratch directory, removed at exit (libFuzzer ends the process with exit(3)).
static SCRATCH: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_scratch() {
    if let Some(dir) = SCRATCH.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

impl Fixture {
    fn new() -> Self {
        // `svnic serve` runs with SIGPIPE ignored (the Rust runtime does it in main); a
        // libFuzzer binary's main is libFuzzer's, so do it here.
        // SAFETY: installs the SIG_IGN disposition, no handler code runs.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let dir = std::env::temp_dir().join(format!("svnic-fuzz-vu-{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .expect("scratch directory");
        let _ = SCRATCH.set(dir.clone());
        // SAFETY: registers a function without arguments that only removes a directory.
        unsafe { libc::atexit(remove_scratch) };
        let socket = dir.join("fuzz.sock");
        let spec = format!("name=fuzz,socket={},mac={MAC}", socket.display());
        let overrides = EngineOverrides {
            workers: Some(1),
            ..Default::default()
        };
        let cfg = DaemonConfig::load(None, &[spec], &overrides, Some(dir.join("admin.sock")))
            .expect("daemon config");
        let daemon = Daemon::start(&cfg, AdminSocket::Off).expect("daemon starts");
        // The first probe brings up whatever the daemon sets up lazily before the baseline.
        probe_socket(&socket);
        let fd_baseline = settle_fds(usize::MAX).expect("fd count settles");
        Fixture {
            _daemon: daemon,
            socket,
            fd_baseline,
            inputs: 0,
            truncate: std::env::var_os("SVNIC_FUZZ_NO_TRUNCATE").is_none(),
        }
    }
}

fn fixture() -> &'static Mutex<Fixture> {
    static F: OnceLock<Mutex<Fixture>> = OnceLock::new();
    F.get_or_init(|| Mutex::new(Fixture::new()))
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Waits until the open fd count is at most `bound` and stops changing; the count, or None
/// on timeout.
fn settle_fds(bound: usize) -> Option<usize> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let mut last = open_fds();
    loop {
        std::thread::sleep(Duration::from_millis(5));
        let now = open_fds();
        if now <= bound && now == last {
            return Some(now);
        }
        if Instant::now() >= deadline {
            return None;
        }
        last = now;
    }
}

/// A polite host-process guest: connect, create a channel, a message to itself, destroy.
fn probe_socket(socket: &Path) {
    let guest = HostGuest::connect(socket, PROBE_MEMORY)
        .unwrap_or_else(|e| panic!("a polite frontend cannot connect: {e}"));
    let mut ch = guest
        .create_channel(1, 64, PROBE_TIMEOUT)
        .unwrap_or_else(|e| panic!("a polite frontend cannot create a channel: {e}"));
    let me = ch.addr();
    assert!(
        ch.send_user(me, 0x5eed, b"probe", Completions::OnError)
            .expect("send"),
        "a fresh channel's TX ring is full"
    );
    ch.flush().expect("flush");
    let waiter = guest.waiter(&ch);
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let mut got = Vec::new();
    loop {
        ch.wait_poll(&mut got, 8, Duration::from_millis(100), &waiter)
            .expect("poll");
        if got
            .iter()
            .any(|m| matches!(m, ChannelMessage::UserData(u) if u.cookie == 0x5eed))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the probe's message did not come back: {got:?}"
        );
    }
    guest
        .destroy_channel(ch, PROBE_TIMEOUT)
        .unwrap_or_else(|e| panic!("a polite frontend cannot destroy its channel: {e}"));
}

/// The fds of one input, kept open until the connection is closed.
#[derive(Default)]
struct Fds {
    memfds: Vec<Memfd>,
    eventfds: Vec<EventFd>,
    pipes: Vec<Pipe>,
    /// Indices in `memfds` of those to truncate at the next `truncate_before`.
    to_truncate: Vec<usize>,
}

impl Fds {
    /// Creates the fd `attach` describes; the one to send.
    fn create(&mut self, attach: Attach) -> RawFd {
        match attach {
            Attach::Memfd { size, sealed } => {
                let sealing = if sealed {
                    Sealing::Sealed
                } else {
                    Sealing::Unsealed
                };
                self.memfd(size, sealing)
            }
            Attach::MemfdTruncatedLater { size } => {
                self.to_truncate.push(self.memfds.len());
                self.memfd(size, Sealing::Unsealed)
            }
            Attach::EventFd => {
                let e = EventFd::new(libc::EFD_CLOEXEC).expect("eventfd");
                let fd = e.as_raw_fd();
                self.eventfds.push(e);
                fd
            }
            Attach::PipeRead | Attach::PipeWrite => {
                let p = Pipe::small().expect("pipe");
                let fd = if attach == Attach::PipeRead {
                    p.read.as_raw_fd()
                } else {
                    p.write.as_raw_fd()
                };
                self.pipes.push(p);
                fd
            }
        }
    }

    fn memfd(&mut self, size: u32, sealing: Sealing) -> RawFd {
        let m = Memfd::new(u64::from(size) % (MAX_MEMFD + 1), sealing).expect("memfd");
        let fd = m.fd();
        self.memfds.push(m);
        fd
    }

    fn truncate_pending(&mut self) {
        for i in self.to_truncate.drain(..) {
            self.memfds[i].set_len(0).expect("truncate");
        }
    }
}

/// One input's connection and the last memory table it sent (for `Addr::InRegion`).
struct Conn {
    sock: UnixStream,
    /// Frontend address and size of each region.
    regions: Vec<(u64, u64)>,
}

enum Sent {
    Ok,
    /// The daemon closed the connection or stopped reading: the rest of the input is moot.
    Closed,
}

impl Conn {
    fn addr(&self, a: Addr) -> u64 {
        match a {
            Addr::Raw(v) => v,
            Addr::InRegion { region, offset } => match self.regions.len() {
                0 => u64::from(offset),
                n => {
                    let (user, size) = self.regions[usize::from(region) % n];
                    user.wrapping_add(u64::from(offset) % size.max(1))
                }
            },
        }
    }

    fn body(&mut self, body: &Body) -> Vec<u8> {
        match body {
            Body::Empty => Vec::new(),
            Body::U64(v) => u64_body(*v),
            Body::VringState { index, num } => vring_state(*index, *num),
            Body::VringFd { index, no_fd } => vring_fd_body(*index, *no_fd),
            Body::VringAddr {
                index,
                flags,
                desc,
                used,
                avail,
                log,
            } => VringAddr {
                index: *index,
                flags: *flags,
                desc: self.addr(*desc),
                used: self.addr(*used),
                avail: self.addr(*avail),
                log: *log,
            }
            .body(),
            Body::MemTable { regions, claimed } => {
                let regions: Vec<_> = regions.iter().take(MAX_REGIONS).map(|r| r.wire()).collect();
                self.regions = regions.iter().map(|r| (r.user_addr, r.size)).collect();
                let count = claimed.unwrap_or(regions.len() as u32);
                mem_table_claiming(count, &regions)
            }
            Body::SingleRegion(r) => single_region(r.wire()),
            Body::Raw(bytes) => bytes[..bytes.len().min(MAX_RAW_BODY)].to_vec(),
        }
    }

    fn send(&mut self, m: &Message, fds: &mut Fds, truncate: bool) -> Sent {
        if m.truncate_before && truncate {
            fds.truncate_pending();
        }
        let body = self.body(&m.body);
        let code = m.request.code();
        let flags = m.flags.bits();
        let size = m.size.unwrap_or(body.len() as u32);
        let bytes = encode_with_size(code, flags, size, &body);
        let attached: Vec<RawFd> = m.fds.iter().take(MAX_FDS).map(|a| fds.create(*a)).collect();
        if !send_all(&self.sock, &bytes, &attached) {
            return Sent::Closed;
        }
        let wants_reply = flags & NEED_REPLY != 0
            || matches!(
                code,
                req::GET_FEATURES
                    | req::GET_PROTOCOL_FEATURES
                    | req::GET_VRING_BASE
                    | req::GET_QUEUE_NUM
                    | req::GET_CONFIG
            );
        let wait = if wants_reply {
            REPLY_WAIT
        } else {
            Duration::ZERO
        };
        if drain_replies(&self.sock, wait) {
            Sent::Ok
        } else {
            Sent::Closed
        }
    }
}

/// Sends `bytes` with `fds` attached to the first part; false if the daemon closed the
/// connection or does not read it.
fn send_all(sock: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> bool {
    let mut sent = 0;
    let mut attach = fds;
    let deadline = Instant::now() + Duration::from_millis(200);
    while sent < bytes.len() {
        match sock.send_with_fds(&[&bytes[sent..]], attach) {
            Ok(n) => {
                sent += n;
                attach = &[];
            }
            Err(e) if e.errno() == libc::EAGAIN && Instant::now() < deadline => {
                // The daemon reads slower than we write: let it, and read its replies meanwhile.
                if !drain_replies(sock, Duration::from_millis(5)) {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    true
}

/// Reads whatever replies arrived (waiting up to `wait` for the first); false at EOF or error.
fn drain_replies(sock: &UnixStream, wait: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, living across the call.
    unsafe { libc::poll(&mut pfd, 1, wait.as_millis() as libc::c_int) };
    let mut buf = [0u8; 4096];
    loop {
        match (&*sock).read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// Sends one input over a fresh connection to the process's daemon (started by the first call),
/// then checks the invariants of the [module](self); panics if one does not hold.
pub fn run(input: &Input) {
    let mut f = fixture().lock().unwrap_or_else(|e| e.into_inner());
    {
        let sock = UnixStream::connect(&f.socket).expect("the port's socket accepts");
        sock.set_nonblocking(true).expect("non-blocking");
        let mut conn = Conn {
            sock,
            regions: Vec::new(),
        };
        let mut fds = Fds::default();
        for m in input.messages.iter().take(MAX_MESSAGES) {
            if let Sent::Closed = conn.send(m, &mut fds, f.truncate) {
                break;
            }
        }
        // Closing the connection and every fd of the input (the daemon's copies are its own).
    }
    let bound = f.fd_baseline + FD_SLACK;
    if settle_fds(bound).is_none() {
        panic!(
            "{} fds open {SETTLE_TIMEOUT:?} after the connection closed, baseline {}: the \
             connection's resources leaked or its teardown hangs",
            open_fds(),
            f.fd_baseline
        );
    }
    f.inputs += 1;
    if f.inputs % PROBE_EVERY == 0 {
        probe_checked(&f);
    }
}

/// The polite guest's round trip ([`run`] does it every [`PROBE_EVERY`] inputs), then the fd
/// count settles.
pub fn probe() {
    let f = fixture().lock().unwrap_or_else(|e| e.into_inner());
    probe_checked(&f);
}

fn probe_checked(f: &Fixture) {
    probe_socket(&f.socket);
    assert!(
        settle_fds(f.fd_baseline + FD_SLACK).is_some(),
        "the probe's connection did not release its fds"
    );
}
