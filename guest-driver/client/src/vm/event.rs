//! [`Event`]: an eventfd (non-blocking, close-on-exec) as the agent and applications share it for
//! doorbells and wakes. Signalling adds to its counter; draining reads and resets it; several
//! signals before a drain coalesce into one wake-up (notifications are per batch anyway).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use super::seqpacket::poll_readable;

/// A non-blocking eventfd.
#[derive(Debug)]
pub struct Event(File);

impl Event {
    /// A new eventfd with counter 0.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes integer arguments and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new descriptor nobody else owns.
        Ok(Event(File::from(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Wraps a descriptor received from the other side. It must be an eventfd; an agent or
    /// application that passes something else only breaks its own notifications (reads and
    /// writes of 8 bytes on another kind of file fail or do nothing harmful).
    pub fn from_fd(fd: OwnedFd) -> Self {
        Event(File::from(fd))
    }

    /// Adds 1 to the counter (wakes a waiter). A counter at its maximum means a wake is already
    /// pending, so `WouldBlock` counts as success.
    pub fn signal(&self) -> io::Result<()> {
        match (&self.0).write(&1u64.to_ne_bytes()) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Reads and resets the counter; 0 if nothing was signalled.
    pub fn drain(&self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        match (&self.0).read(&mut b) {
            Ok(8) => Ok(u64::from_ne_bytes(b)),
            Ok(n) => Err(io::Error::other(format!("eventfd read returned {n} bytes"))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Waits up to `timeout` for a signal and drains it. True if one came.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        if poll_readable(self.0.as_fd(), timeout)? {
            return Ok(self.drain()? > 0);
        }
        Ok(false)
    }
}

impl AsFd for Event {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for Event {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn signals_coalesce_and_drain_resets() {
        let e = Event::new().unwrap();
        assert_eq!(e.drain().unwrap(), 0);
        assert!(!e.wait(Duration::from_millis(1)).unwrap());
        e.signal().unwrap();
        e.signal().unwrap();
        let twin = Event::from_fd(e.as_fd().try_clone_to_owned().unwrap());
        assert!(twin.wait(Duration::from_secs(1)).unwrap());
        assert_eq!(e.drain().unwrap(), 0);
    }
}
