//! A hostile vhost-user frontend: any sequence of messages, with any fds, against a real port.
//!
//! One daemon (`Daemon::start`, exactly as `svnic serve` runs it, one worker) lives for the
//! whole process, with one guest whose socket is in a private (0700) temporary directory. Each
//! input is a sequence of vhost-user messages (see `svnic_fuzz::vhost_user_input`): request
//! code, flags, a structured or raw body, a header size that may lie, and attached fds (memfds
//! of any size, sealed or not; memfds truncated to 0 later in the sequence; eventfds; pipe
//! ends). They are sent over a fresh connection, replies read without blocking, then the
//! connection is closed. After every input:
//! - no thread panicked (libfuzzer-sys aborts the process on a panic in any thread), and the
//!   process is alive (a SIGBUS from a truncated memfd would end it);
//! - the process's open fd count returns to within [`FD_SLACK`] of its baseline within
//!   [`SETTLE_TIMEOUT`]: the connection and everything it brought are released, and its
//!   teardown does not hang;
//! - every [`PROBE_EVERY`] inputs, a polite host-process guest (`HostGuest`) connects to the
//!   same socket, creates a channel, sends itself a message and receives it, and destroys the
//!   channel.
//!
//! `SVNIC_FUZZ_NO_TRUNCATE=1` leaves the "truncated later" memfds at their size, for exploring
//! the rest while the daemon still dies of SIGBUS on a truncated memory region.
#![no_main]

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use svnic_backend::config::{DaemonConfig, EngineOverrides};
use svnic_backend::daemon::Daemon;
use svnic_channels::Message as ChannelMessage;
use svnic_fuzz::vhost_user_input::{
    req, Addr, Attach, Body, Input, Message, Region, MAX_FDS, MAX_MEMFD, MAX_MESSAGES,
    MAX_RAW_BODY, MAX_REGIONS, NEED_REPLY,
};
use svnic_guest::virtio_user::HostGuest;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Open fds the process may have above its baseline once a connection is gone.
const FD_SLACK: usize = 4;
/// How long a closed connection may take to release its resources.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A polite guest checks the port every this many inputs.
const PROBE_EVERY: u64 = 64;
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
        let daemon = Daemon::start(&cfg, false).expect("daemon starts");
        // The first probe brings up whatever the daemon sets up lazily before the baseline.
        probe(&socket);
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
fn probe(socket: &std::path::Path) {
    let guest = HostGuest::connect(socket, PROBE_MEMORY)
        .unwrap_or_else(|e| panic!("a polite frontend cannot connect: {e}"));
    let mut ch = guest
        .create_channel(1, 64, PROBE_TIMEOUT)
        .unwrap_or_else(|e| panic!("a polite frontend cannot create a channel: {e}"));
    let me = ch.addr();
    assert!(
        ch.send_user(me, 0x5eed, b"probe", false).expect("send"),
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
    /// Everything created (including the ends of pipes the harness keeps).
    owned: Vec<OwnedFd>,
    /// Memfds to truncate at the next `truncate_before`.
    to_truncate: Vec<RawFd>,
}

fn check(rc: libc::c_int, what: &str) -> RawFd {
    assert!(rc >= 0, "{what}: {}", io::Error::last_os_error());
    rc
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful syscall and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

impl Fds {
    /// Creates the fd `attach` describes; the one to send.
    fn create(&mut self, attach: Attach) -> RawFd {
        match attach {
            Attach::Memfd { size, sealed } => {
                let flags = libc::MFD_CLOEXEC | if sealed { libc::MFD_ALLOW_SEALING } else { 0 };
                let fd = self.memfd(size, flags);
                if sealed {
                    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
                    // SAFETY: fcntl on a memfd we own, with an integer argument.
                    check(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) }, "seal");
                }
                fd
            }
            Attach::MemfdTruncatedLater { size } => {
                let fd = self.memfd(size, libc::MFD_CLOEXEC);
                self.to_truncate.push(fd);
                fd
            }
            Attach::EventFd => {
                // SAFETY: eventfd takes an initial value and flags, no pointers.
                let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) }, "eventfd");
                self.owned.push(owned(fd));
                fd
            }
            Attach::PipeRead | Attach::PipeWrite => {
                let mut ends = [0; 2];
                // SAFETY: `ends` is a valid array of two ints for pipe2 to fill.
                check(
                    unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) },
                    "pipe",
                );
                self.owned.push(owned(ends[0]));
                self.owned.push(owned(ends[1]));
                if attach == Attach::PipeRead {
                    ends[0]
                } else {
                    ends[1]
                }
            }
        }
    }

    fn memfd(&mut self, size: u32, flags: libc::c_uint) -> RawFd {
        // SAFETY: the name is a NUL-terminated C string literal; flags are valid.
        let fd = check(
            unsafe { libc::memfd_create(c"svnic-fuzz-guest".as_ptr(), flags) },
            "memfd_create",
        );
        let fd = owned(fd);
        let raw = fd.as_raw_fd();
        let file = File::from(fd);
        file.set_len(u64::from(size) % (MAX_MEMFD + 1))
            .expect("memfd size");
        self.owned.push(OwnedFd::from(file));
        raw
    }

    fn truncate_pending(&mut self) {
        for fd in self.to_truncate.drain(..) {
            // SAFETY: ftruncate on a memfd this struct owns (still open).
            check(unsafe { libc::ftruncate(fd, 0) }, "truncate");
        }
    }
}

/// One input's connection and the last memory table it sent (for `Addr::InRegion`).
struct Conn {
    sock: UnixStream,
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
        let mut b = Vec::new();
        let put_region = |b: &mut Vec<u8>, r: Region| {
            let (gpa, size, user, offset) = r.fields();
            for v in [gpa, size, user, offset] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        };
        match body {
            Body::Empty => {}
            Body::U64(v) => b.extend_from_slice(&v.to_le_bytes()),
            Body::VringState { index, num } => {
                b.extend_from_slice(&index.to_le_bytes());
                b.extend_from_slice(&num.to_le_bytes());
            }
            Body::VringFd { index, no_fd } => {
                let v = u64::from(*index) | (u64::from(*no_fd) << 8);
                b.extend_from_slice(&v.to_le_bytes());
            }
            Body::VringAddr {
                index,
                flags,
                desc,
                used,
                avail,
                log,
            } => {
                b.extend_from_slice(&index.to_le_bytes());
                b.extend_from_slice(&flags.to_le_bytes());
                for a in [*desc, *used, *avail] {
                    b.extend_from_slice(&self.addr(a).to_le_bytes());
                }
                b.extend_from_slice(&log.to_le_bytes());
            }
            Body::MemTable { regions, claimed } => {
                let regions = &regions[..regions.len().min(MAX_REGIONS)];
                let count = claimed.unwrap_or(regions.len() as u32);
                b.extend_from_slice(&count.to_le_bytes());
                b.extend_from_slice(&0u32.to_le_bytes());
                self.regions.clear();
                for r in regions {
                    put_region(&mut b, *r);
                    let (_, size, user, _) = r.fields();
                    self.regions.push((user, size));
                }
            }
            Body::SingleRegion(r) => {
                b.extend_from_slice(&0u64.to_le_bytes());
                put_region(&mut b, *r);
            }
            Body::Raw(bytes) => b.extend_from_slice(&bytes[..bytes.len().min(MAX_RAW_BODY)]),
        }
        b
    }

    fn send(&mut self, m: &Message, fds: &mut Fds, truncate: bool) -> Sent {
        if m.truncate_before && truncate {
            fds.truncate_pending();
        }
        let body = self.body(&m.body);
        let code = m.request.code();
        let flags = m.flags.bits();
        let size = m.size.unwrap_or(body.len() as u32);
        let mut bytes = Vec::with_capacity(12 + body.len());
        for v in [code, flags, size] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        bytes.extend_from_slice(&body);
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
        if drain_replies(
            &self.sock,
            if wants_reply {
                REPLY_WAIT
            } else {
                Duration::ZERO
            },
        ) {
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

fn run(input: &Input) {
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
    if f.inputs.is_multiple_of(PROBE_EVERY) {
        probe(&f.socket);
        assert!(
            settle_fds(bound).is_some(),
            "the probe's connection did not release its fds"
        );
    }
}

fuzz_target!(|input: Input| {
    run(&input);
});
