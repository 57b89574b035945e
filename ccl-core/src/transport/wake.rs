//! An eventfd that wakes a thread sleeping in `poll(2)`: the socket transport's proxy
//! sleeps on its sockets and on this, and the doorbell that executors ring for remote
//! peers signals it ([`crate::transport::shm::Doorbell::with_event`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::error::{CclError, Result};

/// A non-blocking eventfd.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> Result<EventFd> {
        // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(CclError::sys("eventfd", std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable (wakes a poller). Never blocks: a full counter (2^64-2
    /// signals unread) is already readable.
    pub fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live stack buffer to our own descriptor.
        unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Consumes pending signals (the descriptor is then not readable until the next one).
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live stack buffer from our own descriptor
        // (non-blocking: EAGAIN when nothing is pending).
        unsafe { libc::read(self.0.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// `poll(2)` over `fds`, at most `timeout`; EINTR counts as "nothing ready".
pub fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> Result<()> {
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `fds` is a live, exclusively borrowed slice of pollfd of the given length.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(CclError::sys("poll", e));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_wakes_poll_and_drain_clears_it() {
        let ev = EventFd::new().unwrap();
        let mut fds = [libc::pollfd {
            fd: ev.fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        poll(&mut fds, Duration::ZERO).unwrap();
        assert_eq!(fds[0].revents, 0);
        ev.signal();
        ev.signal();
        poll(&mut fds, Duration::from_secs(5)).unwrap();
        assert_ne!(fds[0].revents & libc::POLLIN, 0);
        ev.drain();
        fds[0].revents = 0;
        poll(&mut fds, Duration::ZERO).unwrap();
        assert_eq!(fds[0].revents, 0);
    }
}
