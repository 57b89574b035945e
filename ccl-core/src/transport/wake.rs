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

/// Writes `bufs` to the socket `fd` in one `sendmsg(2)` with `MSG_NOSIGNAL` and
/// `MSG_DONTWAIT`: a peer that closed its end is an `EPIPE` error, never a `SIGPIPE` that
/// would kill a host program which keeps the default disposition (`writev`, which std's
/// `write_vectored` uses, raises it).
pub fn send_vectored(fd: RawFd, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec on Unix (documented); sendmsg only reads them.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len() as _;
    // SAFETY: `msg` points at `bufs`, live and unchanged for the call; `fd` is the caller's
    // open socket.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as usize)
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
    use std::io::{IoSlice, Read};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn send_vectored_sends_all_parts_and_a_closed_peer_is_an_error_not_a_signal() {
        // As in a C host program (Rust test binaries ignore SIGPIPE): a send that raised it
        // would end this test's process (nextest runs each test in its own).
        // SAFETY: restores the default disposition of one signal; no handler is involved.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let n = send_vectored(a.as_raw_fd(), &[IoSlice::new(b"abc"), IoSlice::new(b"de")]).unwrap();
        assert_eq!(n, 5);
        let mut got = [0u8; 5];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"abcde");
        drop(b);
        // The first send after the peer closed may succeed (the RST comes back); a later
        // one fails with EPIPE or ECONNRESET, and this process is still alive.
        let mut failed = false;
        for _ in 0..100 {
            if send_vectored(a.as_raw_fd(), &[IoSlice::new(&[0u8; 1024])]).is_err() {
                failed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(failed, "sending to a closed peer never failed");
    }

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
