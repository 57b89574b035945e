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
    /// Per data stream and per control stream: something to read.
    pub(super) data: Vec<bool>,
    pub(super) ctl: Vec<bool>,
}

#[derive(Clone, Copy)]
enum Ready {
    Data(usize),
    Ctl(usize),
}

impl Readable {
    /// Every stream reads this round (`data` data streams, `ctl` control streams).
    pub(super) fn all(&mut self, data: usize, ctl: usize) {
        self.data.clear();
        self.data.resize(data, true);
        self.ctl.clear();
        self.ctl.resize(ctl, true);
    }

    /// Finds the streams whose sockets have something to read, or an end or error to
    /// report, with one `poll` that does not wait: a round then reads only those, one
    /// system call where it would try every socket (a waiting executor's rounds, most of
    /// which find nothing, cost a seventh of what they did on a communicator with six data
    /// streams and a control stream per peer). Where `poll` fails, every stream reads.
    /// The proxy thread's rounds skip it ([`Readable::all`]).
    pub(super) fn refresh(&mut self, data: &[Data], ctl: &[Ctl]) {
        let r = self;
        r.fds.clear();
        r.of.clear();
        for (i, d) in data.iter().enumerate() {
            if d.done || !d.reads() {
                continue;
            }
            for sock in std::iter::once(&d.s.sock).chain(&d.s.extra) {
                r.fds.push(libc::pollfd {
                    fd: sock.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                r.of.push(Ready::Data(i));
            }
        }
        for (i, c) in ctl.iter().enumerate() {
            if !c.done {
                r.fds.push(libc::pollfd {
                    fd: c.sock.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
                r.of.push(Ready::Ctl(i));
            }
        }
        let polled = poll(&mut r.fds, Duration::ZERO).is_ok();
        r.data.clear();
        r.data.resize(data.len(), !polled);
        r.ctl.clear();
        r.ctl.resize(ctl.len(), !polled);
        for (fd, of) in r.fds.iter().zip(&r.of) {
            if fd.revents != 0 {
                match *of {
                    Ready::Data(i) => r.data[i] = true,
                    Ready::Ctl(i) => r.ctl[i] = true,
                }
            }
        }
    }
}
