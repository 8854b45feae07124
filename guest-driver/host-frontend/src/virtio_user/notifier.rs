//! The eventfds of the two queues — kick (driver -> device, "available buffer notification") and
//! call (device -> driver, "used buffer notification") — and [`CallWaiter`], which blocks on the
//! call eventfds like a kernel driver waits for its interrupt.
//!
//! A `CallWaiter` is a cheap clone of the eventfds, so a thread can block on it without holding
//! whatever lock guards the [`super::VirtioNet`] (the control client relies on that).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::error::VirtioUserError;

/// Index of the receive queue (virtio 1.2, 5.1.2 "Virtqueues": receiveq1 is queue 0).
pub const RX_QUEUE: usize = 0;
/// Index of the transmit queue (transmitq1 is queue 1).
pub const TX_QUEUE: usize = 1;

fn eventfd(what: &'static str) -> Result<EventFd, VirtioUserError> {
    EventFd::new(EFD_NONBLOCK).map_err(|source| VirtioUserError::EventFd { what, source })
}

/// Kick and call eventfds of the RX and TX queues (non-blocking eventfds).
#[derive(Debug)]
pub struct QueueEventFds {
    /// Kick eventfds, by queue index: the driver writes, the device waits.
    pub kick: [EventFd; 2],
    /// Call eventfds, by queue index: the device writes, the driver waits.
    pub call: [Arc<EventFd>; 2],
}

impl QueueEventFds {
    /// Creates the four eventfds.
    pub fn new() -> Result<Self, VirtioUserError> {
        Ok(QueueEventFds {
            kick: [eventfd("RX kick")?, eventfd("TX kick")?],
            call: [Arc::new(eventfd("RX call")?), Arc::new(eventfd("TX call")?)],
        })
    }

    /// Notifies the device that queue `index` has new available buffers.
    pub fn kick(&self, index: usize) -> Result<(), VirtioUserError> {
        let Some(fd) = self.kick.get(index) else {
            return Ok(());
        };
        match fd.write(1) {
            Ok(()) => Ok(()),
            // The counter is saturated: the device has a kick pending anyway.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(source) => Err(VirtioUserError::EventFd {
                what: "kick",
                source,
            }),
        }
    }
}

/// What a [`CallWaiter::block`] ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// A call eventfd fired (or a signal interrupted the wait): look at the rings.
    Notified,
    /// The timeout passed.
    TimedOut,
}

/// Blocks on the call eventfds of both queues, and notices when the backend hangs up the
/// vhost-user socket (so that nobody sleeps forever on a dead device).
#[derive(Debug, Clone)]
pub struct CallWaiter {
    calls: [Arc<EventFd>; 2],
    socket: Option<Arc<OwnedFd>>,
}

impl CallWaiter {
    /// A waiter on `fds`' call eventfds and, if given, the vhost-user socket `socket` (duplicated,
    /// so the waiter stays valid on its own).
    pub fn new(fds: &QueueEventFds, socket: Option<RawFd>) -> Result<Self, VirtioUserError> {
        let socket = match socket {
            Some(raw) => {
                // SAFETY: the caller passes the descriptor of a socket it owns and keeps open for
                // the duration of this call; we only borrow it to duplicate it.
                let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
                let owned =
                    borrowed
                        .try_clone_to_owned()
                        .map_err(|source| VirtioUserError::EventFd {
                            what: "dup of the vhost-user socket",
                            source,
                        })?;
                Some(Arc::new(owned))
            }
            None => None,
        };
        Ok(CallWaiter {
            calls: fds.call.clone(),
            socket,
        })
    }

    /// Blocks until a call eventfd fires or `timeout` passes, then drains the call eventfds.
    /// `Err(Disconnected)` if the backend closed the socket.
    pub fn block(&self, timeout: Duration) -> Result<WaitOutcome, VirtioUserError> {
        let mut fds = [
            pollfd(self.calls[RX_QUEUE].as_raw_fd(), libc::POLLIN),
            pollfd(self.calls[TX_QUEUE].as_raw_fd(), libc::POLLIN),
            pollfd(-1, 0),
        ];
        if let Some(s) = &self.socket {
            fds[2] = pollfd(s.as_raw_fd(), libc::POLLRDHUP);
        }
        // Round up so that a sub-millisecond timeout still sleeps rather than spins.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid array of 3 pollfd structs that outlives the call; poll only
        // writes their revents fields. A negative fd is ignored by poll.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(WaitOutcome::Notified);
            }
            return Err(VirtioUserError::EventFd {
                what: "poll on the call eventfds",
                source: e,
            });
        }
        if fds[2].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
            return Err(VirtioUserError::Disconnected);
        }
        self.drain();
        Ok(if rc == 0 {
            WaitOutcome::TimedOut
        } else {
            WaitOutcome::Notified
        })
    }

    /// Resets both call eventfds (non-blocking; an empty eventfd is fine).
    pub fn drain(&self) {
        for c in &self.calls {
            // WouldBlock when nothing was signalled; any other error would show in poll.
            let _ = c.read();
        }
    }

    /// True if the backend has closed the vhost-user socket.
    pub fn backend_gone(&self) -> bool {
        let Some(s) = &self.socket else {
            return false;
        };
        let mut fd = [pollfd(s.as_raw_fd(), libc::POLLRDHUP)];
        // SAFETY: one valid pollfd that outlives the call; zero timeout.
        let rc = unsafe { libc::poll(fd.as_mut_ptr(), 1, 0) };
        rc > 0 && fd[0].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::Instant;

    #[test]
    fn block_wakes_on_a_call_and_times_out_without_one() {
        let fds = QueueEventFds::new().unwrap();
        let w = CallWaiter::new(&fds, None).unwrap();
        let t = Instant::now();
        assert_eq!(
            w.block(Duration::from_millis(20)).unwrap(),
            WaitOutcome::TimedOut
        );
        assert!(t.elapsed() >= Duration::from_millis(15));
        fds.call[TX_QUEUE].write(1).unwrap();
        assert_eq!(
            w.block(Duration::from_secs(5)).unwrap(),
            WaitOutcome::Notified
        );
        // Drained: the next wait times out again.
        assert_eq!(
            w.block(Duration::from_millis(1)).unwrap(),
            WaitOutcome::TimedOut
        );
    }

    #[test]
    fn a_closed_socket_is_reported_as_disconnected() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fds = QueueEventFds::new().unwrap();
        let w = CallWaiter::new(&fds, Some(a.as_raw_fd())).unwrap();
        assert!(!w.backend_gone());
        drop(b);
        assert!(w.backend_gone());
        assert!(matches!(
            w.block(Duration::from_secs(5)),
            Err(VirtioUserError::Disconnected)
        ));
    }
}
