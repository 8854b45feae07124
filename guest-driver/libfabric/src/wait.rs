//! Waiting for completions: what a CQ's bound endpoints must offer ([`Progress`]), and the file
//! descriptor of an `FI_WAIT_FD` queue ([`FdWait`]).
//!
//! `FI_WAIT_FD` protocol: the application reads the CQ until it is empty, calls `fi_trywait`,
//! and if that returns 0 blocks in `poll` on the descriptor. `fi_trywait` advertises sleeping
//! in every bound channel (the channel header's guest flag), re-checks the channels, and arms
//! the queue's waker thread, which blocks until the engine wakes one of the channels and then
//! makes the descriptor (an eventfd) readable. The next CQ read drains the descriptor and clears
//! the flags. The thread exists as long as the queue, and is stopped by libfabric's `cleanup`
//! at process exit too.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Something bound to a queue whose progress feeds it (an endpoint).
pub trait Progress: Send + Sync + std::fmt::Debug {
    /// Polls for completions and writes them into the queues the source is bound to.
    fn progress(&self);
    /// Advertises (or withdraws) that the application sleeps, so that the engine wakes it.
    fn set_sleeping(&self, sleeping: bool);
    /// Blocks until the engine wakes this source or `timeout` passes; true if woken.
    fn wait_wake(&self, timeout: Duration) -> bool;
}

/// How long the waker blocks on one source before it looks at the others (or at a stop).
const SLICE_ONE: Duration = Duration::from_millis(100);
const SLICE_MANY: Duration = Duration::from_millis(10);

#[derive(Debug, Default)]
struct WaitState {
    /// What the waker waits on; empty when disarmed.
    armed: Vec<Weak<dyn Progress>>,
    /// Bumped by every arm, so that the waker never disarms a newer arming.
    generation: u64,
    stop: bool,
}

#[derive(Debug)]
struct WaitShared {
    state: Mutex<WaitState>,
    cond: Condvar,
    fd: OwnedFd,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl WaitShared {
    fn lock(&self) -> MutexGuard<'_, WaitState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to the eventfd this struct owns.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        if n != 8 {
            log::debug!(
                "svnic provider: eventfd write: {}",
                io::Error::last_os_error()
            );
        }
    }

    fn drain(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from the (non-blocking) eventfd
        // this struct owns; nothing to read is EAGAIN, ignored.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    }

    fn stop_and_join(&self) {
        self.lock().stop = true;
        self.cond.notify_all();
        let handle = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            if h.join().is_err() {
                log::error!("svnic provider: the CQ waker thread panicked");
            }
        }
    }

    fn run(&self) {
        loop {
            let (sources, generation) = {
                let mut s = self.lock();
                while s.armed.is_empty() && !s.stop {
                    s = self
                        .cond
                        .wait_timeout(s, SLICE_ONE)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                if s.stop {
                    return;
                }
                (s.armed.clone(), s.generation)
            };
            let slice = if sources.len() == 1 {
                SLICE_ONE
            } else {
                SLICE_MANY
            };
            let mut woke = false;
            let mut alive = false;
            for source in sources.iter().filter_map(Weak::upgrade) {
                alive = true;
                if source.wait_wake(slice) {
                    woke = true;
                    break;
                }
            }
            if woke || !alive {
                if woke {
                    self.signal();
                }
                let mut s = self.lock();
                if s.generation == generation {
                    s.armed.clear();
                }
            }
        }
    }
}

/// Every waker, so that libfabric's cleanup can stop them before the library is unloaded.
static WAKERS: Mutex<Vec<Weak<WaitShared>>> = Mutex::new(Vec::new());

/// The wait object of an `FI_WAIT_FD` CQ.
#[derive(Debug)]
pub struct FdWait {
    shared: Arc<WaitShared>,
}

impl FdWait {
    /// A non-blocking eventfd and the waker thread.
    pub fn new() -> io::Result<FdWait> {
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let shared = Arc::new(WaitShared {
            state: Mutex::default(),
            cond: Condvar::new(),
            fd,
            thread: Mutex::new(None),
        });
        let worker = shared.clone();
        let handle = std::thread::Builder::new()
            .name("svnic-fi-wait".into())
            .spawn(move || worker.run())?;
        *shared.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        let mut wakers = WAKERS.lock().unwrap_or_else(|e| e.into_inner());
        wakers.retain(|w| w.strong_count() > 0);
        wakers.push(Arc::downgrade(&shared));
        Ok(FdWait { shared })
    }

    /// The descriptor (`fi_control(FI_GETWAIT)`).
    pub fn fd(&self) -> RawFd {
        self.shared.fd.as_raw_fd()
    }

    /// Makes the waker wait for a wake of any of `sources`.
    pub fn arm(&self, sources: Vec<Weak<dyn Progress>>) {
        let mut s = self.shared.lock();
        s.armed = sources;
        s.generation = s.generation.wrapping_add(1);
        drop(s);
        self.shared.cond.notify_all();
    }

    /// Stops waiting and drains the descriptor.
    pub fn disarm(&self) {
        let mut s = self.shared.lock();
        s.armed.clear();
        s.generation = s.generation.wrapping_add(1);
        drop(s);
        self.shared.drain();
    }
}

impl Drop for FdWait {
    fn drop(&mut self) {
        self.shared.stop_and_join();
    }
}

/// Stops every waker thread (libfabric's `cleanup`, before the library is unloaded).
pub fn stop_all() {
    let wakers: Vec<Arc<WaitShared>> = WAKERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain(..)
        .filter_map(|w| w.upgrade())
        .collect();
    for w in wakers {
        w.stop_and_join();
    }
}
