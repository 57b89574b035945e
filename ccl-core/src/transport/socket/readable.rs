//! Which of the socket proxy's streams have something to read in a round.

use std::os::fd::AsRawFd;
use std::time::Duration;

use super::{Ctl, Data};
use crate::transport::wake::poll;

/// The result of [`Readable::refresh`], kept from round to round so that a round
/// allocates nothing.
#[derive(Default)]
pub(super) struct Readable {
    fds: Vec<libc::pollfd>,
    /// The stream of each entry of `fds`.
    of: Vec<Ready>,
    /// Whether this round was polled; if not, every stream reads.
    polled: bool,
    /// Per data stream and per control stream: something to read (when polled).
    data: Vec<bool>,
    ctl: Vec<bool>,
}

#[derive(Clone, Copy)]
enum Ready {
    Data(usize),
    Ctl(usize),
}

impl Readable {
    /// Every stream reads this round (the proxy thread's rounds).
    pub(super) fn all(&mut self) {
        self.polled = false;
    }

    /// Whether data stream `i` is to be read this round.
    pub(super) fn data(&self, i: usize) -> bool {
        !self.polled || self.data.get(i).copied().unwrap_or(true)
    }

    /// Whether control stream `i` is to be read this round.
    pub(super) fn ctl(&self, i: usize) -> bool {
        !self.polled || self.ctl.get(i).copied().unwrap_or(true)
    }

    /// Finds the streams whose sockets have something to read, or an end or error to
    /// report, with one `poll` that does not wait: a round then reads only those, one
    /// system call where it would try every socket (seven on a communicator with six data
    /// streams and a control stream per peer; a waiting executor runs such rounds back to
    /// back, most finding nothing). Where `poll` fails, every stream reads.
    /// The proxy thread's rounds skip it ([`Readable::all`]).
    pub(super) fn refresh(&mut self, data: &[Data], ctl: &[Ctl]) {
        self.polled = true;
        self.fds.clear();
        self.of.clear();
        for (i, d) in data.iter().enumerate() {
            if d.done || !d.reads() {
                continue;
            }
            for sock in std::iter::once(&d.s.sock).chain(&d.s.extra) {
                self.fds.push(libc::pollfd {
                    fd: sock.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                self.of.push(Ready::Data(i));
            }
        }
        for (i, c) in ctl.iter().enumerate() {
            if !c.done {
                self.fds.push(libc::pollfd {
                    fd: c.sock.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                self.of.push(Ready::Ctl(i));
            }
        }
        let polled = poll(&mut self.fds, Duration::ZERO).is_ok();
        self.data.clear();
        self.data.resize(data.len(), !polled);
        self.ctl.clear();
        self.ctl.resize(ctl.len(), !polled);
        for (fd, of) in self.fds.iter().zip(&self.of) {
            if fd.revents != 0 {
                match *of {
                    Ready::Data(i) => self.data[i] = true,
                    Ready::Ctl(i) => self.ctl[i] = true,
                }
            }
        }
    }
}
