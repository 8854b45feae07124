//! Waiting for the next connection: poll the listening socket and the stop eventfd together;
//! after an accept error (EMFILE, ENFILE, ENOBUFS...) wait with exponential backoff instead of
//! retrying at once, since the pending connection keeps the socket readable and a retry loop
//! would spin and log without end. The stop signal still ends the wait at once.

use std::fmt::Display;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use svnic_control_plane::log_limited;

use crate::debug_fields::debug_fields;

/// The first wait after an accept error.
pub const FIRST_DELAY: Duration = Duration::from_millis(10);
/// The longest wait between two accept attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// Exponential backoff between failed accepts: doubles from its first delay up to its cap, back
/// to the first delay after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(FIRST_DELAY, MAX_DELAY)
    }
}

impl Backoff {
    /// Starts at `first`, doubles up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The wait after one more failure.
    pub fn failed(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// A success: the next failure waits the first delay again.
    pub fn succeeded(&mut self) {
        self.next = self.first;
    }
}

/// The stop signal as an accept loop sees it: an fd that becomes readable when stopped (and is
/// never read), and a check of the flag behind it.
#[derive(Clone, Copy)]
pub struct StopWatch<'a> {
    /// Readable once stopped.
    pub fd: RawFd,
    /// True once stopped.
    pub is_stopped: &'a dyn Fn() -> bool,
}

debug_fields!(StopWatch<'_>, |s| stopped: (s.is_stopped)());

enum Woken {
    Connection,
    Stopped,
    TimedOut,
}

/// Polls `stop` and, if given, `listener` until one is readable or `timeout` passes.
fn wait(
    listener: Option<BorrowedFd<'_>>,
    stop: &StopWatch<'_>,
    timeout: Option<Duration>,
) -> io::Result<Woken> {
    let poll_timeout = timeout.map_or(-1, |t| {
        libc::c_int::try_from(t.as_millis()).unwrap_or(libc::c_int::MAX)
    });
    loop {
        if (stop.is_stopped)() {
            return Ok(Woken::Stopped);
        }
        let mut fds = [
            libc::pollfd {
                fd: stop.fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: listener.map_or(-1, |l| l.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd structures that outlives the call, and
        // its length is passed with it (a negative fd is ignored by poll).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, poll_timeout) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if (stop.is_stopped)() || fds[0].revents != 0 {
            return Ok(Woken::Stopped);
        }
        if fds[1].revents != 0 {
            return Ok(Woken::Connection);
        }
        if n == 0 {
            return Ok(Woken::TimedOut);
        }
    }
}

/// Errors that say nothing about the listening socket: the next connection may do better.
fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
    ) || e.raw_os_error() == Some(libc::EPROTO)
}

/// The next accepted connection, or `None` once `stop` is raised. `accept` is called only when
/// `listener` is readable; after each failure the next attempt waits per `backoff`, logged
/// (rate-limited) with `socket` naming the socket; a failing poll is retried the same way.
pub fn next_connection<T>(
    backoff: &mut Backoff,
    listener: BorrowedFd<'_>,
    stop: &StopWatch<'_>,
    socket: &dyn Display,
    mut accept: impl FnMut() -> io::Result<T>,
) -> io::Result<Option<T>> {
    loop {
        match wait(Some(listener), stop, None) {
            Ok(Woken::Stopped) => return Ok(None),
            Ok(Woken::TimedOut) => continue,
            Ok(Woken::Connection) => {}
            Err(e) => {
                // poll itself failed (ENOMEM, or a descriptor limit below two): a listener that
                // gave up would leave its guest unserved for good, so it retries, backing off.
                if back_off(backoff, stop, socket, "wait for connections", &e) {
                    return Ok(None);
                }
                continue;
            }
        }
        match accept() {
            Ok(conn) => {
                backoff.succeeded();
                return Ok(Some(conn));
            }
            Err(e) if is_transient(&e) => {}
            Err(e) => {
                if back_off(backoff, stop, socket, "accept a connection", &e) {
                    return Ok(None);
                }
            }
        }
    }
}

/// After a failure to `what` (`e`): logs it (rate-limited) and waits out the next backoff delay,
/// or until `stop` is raised. True if stopped. Should waiting fail too, it sleeps the delay.
fn back_off(
    backoff: &mut Backoff,
    stop: &StopWatch<'_>,
    socket: &dyn Display,
    what: &str,
    e: &io::Error,
) -> bool {
    let delay = backoff.failed();
    log_limited!(
        log::Level::Warn,
        "{socket}: cannot {what}: {e}; next try in {} ms",
        delay.as_millis()
    );
    match wait(None, stop, Some(delay)) {
        Ok(woken) => matches!(woken, Woken::Stopped),
        Err(_) => {
            std::thread::sleep(delay);
            (stop.is_stopped)()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Instant;
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

    use crate::sockets::test_support::private_dir;

    #[test]
    fn the_backoff_doubles_to_its_cap_and_restarts_after_a_success() {
        let mut b = Backoff::default();
        let waits: Vec<u128> = (0..9).map(|_| b.failed().as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(), FIRST_DELAY);
    }

    struct Stop {
        flag: AtomicBool,
        fd: EventFd,
    }

    impl Stop {
        fn raise(&self) {
            self.flag.store(true, Ordering::SeqCst);
            self.fd.write(1).unwrap();
        }
    }

    /// Runs `next_connection` on a listener with a connection pending and an accept that always
    /// fails with EMFILE, as when the daemon is out of fds; returns the attempts counter, the
    /// stop and the thread.
    fn failing_accept_loop(
        backoff: Backoff,
    ) -> (
        Arc<AtomicUsize>,
        Arc<Stop>,
        std::thread::JoinHandle<Option<()>>,
        UnixStream,
    ) {
        let dir = private_dir("accept");
        let listener = UnixListener::bind(dir.join("l.sock")).unwrap();
        // The pending connection keeps the listener readable, as an unacceptable one does.
        let client = UnixStream::connect(dir.join("l.sock")).unwrap();
        let attempts = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(Stop {
            flag: AtomicBool::new(false),
            fd: EventFd::new(EFD_NONBLOCK).unwrap(),
        });
        let thread = {
            let (attempts, stop) = (attempts.clone(), stop.clone());
            std::thread::spawn(move || {
                let _dir = dir;
                let mut backoff = backoff;
                let is_stopped = || stop.flag.load(Ordering::SeqCst);
                let watch = StopWatch {
                    fd: stop.fd.as_raw_fd(),
                    is_stopped: &is_stopped,
                };
                next_connection(&mut backoff, listener.as_fd(), &watch, &"test", || {
                    attempts.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(io::Error::from_raw_os_error(libc::EMFILE))
                })
                .unwrap()
            })
        };
        (attempts, stop, thread, client)
    }

    fn join_within(thread: std::thread::JoinHandle<Option<()>>, limit: Duration) -> Option<()> {
        let deadline = Instant::now() + limit;
        while !thread.is_finished() {
            assert!(Instant::now() < deadline, "the accept loop did not stop");
            std::thread::sleep(Duration::from_millis(10));
        }
        thread.join().unwrap()
    }

    #[test]
    fn failing_accepts_back_off_instead_of_spinning() {
        let (attempts, stop, thread, _client) = failing_accept_loop(Backoff::default());
        std::thread::sleep(Duration::from_secs(1));
        let n = attempts.load(Ordering::SeqCst);
        // 10+20+...+640 ms: about 7 tries in a second; a spinning loop makes millions.
        assert!((2..20).contains(&n), "{n} accept attempts in one second");
        stop.raise();
        assert_eq!(join_within(thread, Duration::from_secs(10)), None);
    }

    #[test]
    fn stop_ends_a_backoff_wait_at_once() {
        // A wait of a minute after the first failure: only the stop fd can end it in time.
        let backoff = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
        let (attempts, stop, thread, _client) = failing_accept_loop(backoff);
        let deadline = Instant::now() + Duration::from_secs(20);
        while attempts.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "accept never tried");
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.raise();
        assert_eq!(join_within(thread, Duration::from_secs(20)), None);
        assert_eq!(attempts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_connection_is_returned_and_resets_the_backoff() {
        let dir = private_dir("accept-ok");
        let listener = UnixListener::bind(dir.join("l.sock")).unwrap();
        let _client = UnixStream::connect(dir.join("l.sock")).unwrap();
        let fd = EventFd::new(EFD_NONBLOCK).unwrap();
        let is_stopped = || false;
        let watch = StopWatch {
            fd: fd.as_raw_fd(),
            is_stopped: &is_stopped,
        };
        let mut backoff = Backoff::default();
        backoff.failed();
        backoff.failed();
        let mut failures_left = 1;
        let got = next_connection(&mut backoff, listener.as_fd(), &watch, &"test", || {
            if failures_left > 0 {
                failures_left -= 1;
                return Err(io::Error::from_raw_os_error(libc::ENFILE));
            }
            listener.accept().map(|(s, _)| s)
        })
        .unwrap();
        assert!(got.is_some());
        assert_eq!(backoff.failed(), FIRST_DELAY);
    }

    const CHILD_MODE: &str = "SVNIC_ACCEPT_TEST_CHILD";

    /// poll fails with EINVAL while the descriptor limit is below the two descriptors it watches;
    /// the loop must wait and retry, and accept the connection once the limit is back. Runs in a
    /// child process: the limit is process-wide.
    #[test]
    fn a_failing_poll_is_retried_not_fatal() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "sockets::accept::tests::poll_failure_child",
                "--exact",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD_MODE, "poll-failure")
            .status()
            .unwrap();
        assert!(status.success(), "{status:?}");
    }

    /// The body of [`a_failing_poll_is_retried_not_fatal`]; does nothing in a normal run.
    #[test]
    fn poll_failure_child() {
        if std::env::var(CHILD_MODE).as_deref() != Ok("poll-failure") {
            return;
        }
        let dir = private_dir("poll-failure");
        let path = dir.join("l.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let stop = EventFd::new(EFD_NONBLOCK).unwrap();
        let limit = |soft: libc::rlim_t| {
            let mut r = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `r` is a valid rlimit for getrlimit to fill.
            assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
            r.rlim_cur = soft;
            // SAFETY: `r` is a valid rlimit with a soft limit below its hard limit.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
        };
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `r` is a valid rlimit for getrlimit to fill.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        let normal = r.rlim_cur;
        limit(1);
        let restorer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            limit(normal);
            UnixStream::connect(&path).unwrap()
        });
        let is_stopped = || false;
        let watch = StopWatch {
            fd: stop.as_raw_fd(),
            is_stopped: &is_stopped,
        };
        let started = Instant::now();
        let accepted = next_connection(
            &mut Backoff::default(),
            listener.as_fd(),
            &watch,
            &"test",
            || listener.accept(),
        );
        let _client = restorer.join().unwrap();
        assert!(matches!(accepted, Ok(Some(_))), "{accepted:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
