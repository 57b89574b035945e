//! The proxy thread of one communicator's socket transport: it moves FIFO messages
//! between the executor's local FIFOs and TCP connections, with non-blocking I/O and
//! `poll(2)`, so that one slow peer never stops the others.
//!
//! - Outbound: the executor commits into a local FIFO as it would for a peer on this host;
//!   the proxy writes the message (a [`DataHeader`] and the payload, straight from the
//!   slot, or from the operation's buffer when the executor sent it by reference:
//!   [`super::sendref`]) to the stream's socket, and releases a Simple slot at the peer's
//!   credit.
//! - Inbound: the proxy reads a header, reserves a slot in the executor's local receive
//!   FIFO and reads the payload straight into it, then commits. While the FIFO is full it
//!   stops reading that socket (TCP's window then slows the sender).
//! - Control: per remote peer, a stream carrying poison values (an inconsistent call
//!   detected here or there), queries for the collective the peer is running (and their
//!   answers, from the current-collective words its executor publishes) and a goodbye at
//!   destroy. The end of that stream without a goodbye means the peer's process or link is
//!   gone ([`PeerStates`]).
//!
//! The executor rings the proxy's doorbell (made with [`Doorbell::with_event`]) after a
//! commit or release on a remote link; the proxy sleeps in `poll` on its sockets and that
//! doorbell's eventfd, and rings the executor's doorbell when it committed or released.
//!
//! This file holds the proxy's set-up, its thread and its rounds, and the control
//! streams; a data stream's writes and reads are `pump.rs`.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::frame::{stripe, Control, DataHeader, StreamId, CONTROL_BYTES, DATA_HEADER_BYTES};
use super::peers::{PeerStates, CLOSED, LOST};
use crate::error::{CclError, Result};
use crate::transport::current;
use crate::transport::shm::{Doorbell, SharedWord};
use crate::transport::wake::{poll, EventFd};

pub(crate) use super::ends::{Inbound, Outbound};

#[path = "pump.rs"]
mod pump;
#[path = "readable.rs"]
mod readable;
use readable::Readable;

/// One stream (a channel of a link) with one peer; either side may be absent (a ring
/// link's stream carries one direction unless the ring has two ranks). Its first socket
/// carries the headers, credits and each payload's first piece; `extra` sockets (when
/// `NCCL_SOCKET_NTHREADS` x `NCCL_NSOCKS_PERTHREAD` > 1) carry the other pieces
/// ([`stripe`]).
#[derive(Debug)]
pub(crate) struct DataStream {
    pub peer: usize,
    pub id: StreamId,
    pub sock: TcpStream,
    pub extra: Vec<TcpStream>,
    pub out: Option<Outbound>,
    pub inb: Option<Inbound>,
    /// Nanoseconds the inbound messages spent on the wire, summed: from a message's first
    /// byte (or, when the receive FIFO was full, from the moment a slot was free) to its
    /// last. The executor charges the growth to its operation's channel (probe metric).
    pub wire: Arc<AtomicU64>,
}

impl DataStream {
    /// Sockets per stream.
    fn ways(&self) -> usize {
        1 + self.extra.len()
    }

    fn shutdown(&self, how: Shutdown) {
        for s in std::iter::once(&self.sock).chain(&self.extra) {
            let _ = s.shutdown(how);
        }
    }
}

/// Messages from the set-up code (init, lazy p2p connections) to the proxy.
pub(crate) enum Cmd {
    Data(Box<DataStream>),
    Control {
        peer: usize,
        sock: TcpStream,
        /// The word where this rank's executor stores a poison value for `peer`.
        poison_out: SharedWord,
        /// Set (non-zero) by this rank's executor to ask which collective `peer` runs.
        query_in: SharedWord,
        /// Where the answer goes: `peer`'s current-collective words as this rank's
        /// executor reads them ([`crate::transport::current`]).
        current_out: [SharedWord; 4],
    },
}

/// The handle of a running proxy: stops and joins it on drop, after it flushed what the
/// executor committed and said goodbye to every peer.
#[derive(Debug)]
pub(crate) struct Proxy {
    cmds: Sender<Cmd>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub peers: Arc<PeerStates>,
}

/// What the proxy thread and a waiting executor share: the proxy's state, behind a lock
/// that the executor only tries ([`Proxy::drive`]), and the lease by which an executor
/// that runs the rounds itself keeps the proxy thread asleep.
struct Shared {
    state: Mutex<Loop>,
    /// Until when (nanoseconds from `epoch`) a waiting executor runs the rounds; 0: no
    /// executor does. Renewed by every [`Proxy::drive`], so that an executor that stops
    /// without [`Proxy::release`] (an error path) holds the thread off for at most
    /// [`DRIVE_LEASE`].
    driven_until: AtomicU64,
    lease_ns: u64,
    epoch: Instant,
    wake: Arc<EventFd>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("driven_until", &self.driven_until)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// How much of an executor's lease is left (`None`: no executor drives).
    fn lease_left(&self) -> Option<Duration> {
        let until = self.driven_until.load(Ordering::Acquire);
        let now = self.now();
        (until > now).then(|| Duration::from_nanos(until - now))
    }
}

/// How long one [`Proxy::drive`] keeps the proxy thread off the sockets by default. A
/// waiting executor renews it at every poll; it lapses when the executor stops polling (it
/// went to sleep, returned, or the scheduler took its CPU for longer), and the proxy
/// thread takes over.
pub(crate) const DRIVE_LEASE: Duration = Duration::from_millis(2);

/// What the proxy thread needs of its rank.
pub(crate) struct ProxyLocal {
    pub rank: usize,
    pub nranks: usize,
    /// The executor's doorbell (rung after a commit or release here).
    pub exec_bell: Arc<Doorbell>,
    /// This rank's poison word (set when a peer sends a poison value).
    pub poison: SharedWord,
    /// This rank's current-collective words, read to answer a peer's query (`None`: the
    /// answer is "none").
    pub current: Option<[SharedWord; 4]>,
    /// The proxy's own doorbell (announced before sleeping), and its eventfd.
    pub wake_bell: Doorbell,
    pub wake: Arc<EventFd>,
    /// How long a destroy waits for committed data to leave.
    pub flush: Duration,
    /// How long one [`Proxy::drive`] keeps the proxy thread off the sockets
    /// ([`DRIVE_LEASE`]; tests take longer ones).
    pub drive_lease: Duration,
}

impl Proxy {
    pub(crate) fn start(local: ProxyLocal) -> Result<Proxy> {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let peers = Arc::new(PeerStates::new(local.nranks));
        let wake = Arc::clone(&local.wake);
        let lease_ns = u64::try_from(local.drive_lease.as_nanos()).unwrap_or(u64::MAX);
        let (s, p) = (Arc::clone(&stop), Arc::clone(&peers));
        let shared = Arc::new(Shared {
            state: Mutex::new(Loop::new(local, rx, s, p)),
            driven_until: AtomicU64::new(0),
            lease_ns,
            epoch: Instant::now(),
            wake,
        });
        let (sh, st) = (Arc::clone(&shared), Arc::clone(&stop));
        let rank = sh.state.lock().l.rank;
        let thread = std::thread::Builder::new()
            .name(format!("ccld-proxy-{rank}"))
            .spawn(move || run(&sh, &st, rank))
            .map_err(|e| CclError::sys("starting the socket proxy thread", e))?;
        Ok(Proxy {
            cmds: tx,
            shared,
            stop,
            thread: Some(thread),
            peers,
        })
    }

    /// Hands a connected stream to the proxy.
    pub(crate) fn add(&self, cmd: Cmd) -> Result<()> {
        self.cmds
            .send(cmd)
            .map_err(|_| CclError::Internal("the socket proxy thread has stopped".into()))?;
        self.shared.wake.signal();
        Ok(())
    }

    /// Runs one round of the proxy on the calling thread (a waiting executor), unless the
    /// proxy thread is in one; whether anything moved. Until [`Proxy::release`] (or the
    /// lease's end) the proxy thread sleeps, so that one thread per rank does the socket
    /// work while the executor waits, instead of two that hand each message between them
    /// across CPUs.
    pub(crate) fn drive(&self) -> bool {
        let until = self.shared.now().saturating_add(self.shared.lease_ns);
        self.shared.driven_until.store(until, Ordering::Release);
        let Some(mut lp) = self.shared.state.try_lock() else {
            return false;
        };
        lp.take_cmds();
        lp.round(true)
    }

    /// Runs `f` while no round of the proxy runs, on its thread or a driving executor's
    /// (by-reference sends are revoked so: `sendref.rs`). Rounds never block, so this
    /// waits for one round at most.
    pub(crate) fn while_idle<R>(&self, f: impl FnOnce() -> R) -> R {
        let _round = self.shared.state.lock();
        f()
    }

    /// Ends a job's share of the socket work without waking the proxy thread when it can:
    /// one more round on this thread (what the job committed last, and the credits for
    /// what it consumed, leave now), then the lease runs out by itself, so that a job that
    /// follows at once (a loop of small operations) drives on with the proxy thread still
    /// asleep, instead of waking it at every job's end: a wake-up and a context switch,
    /// on a CPU the partner's messages may be waiting for. Hands back at once
    /// ([`Proxy::release`]) when the proxy thread was in a round (the round could not run
    /// here) or bytes are left to write. Nothing to do when no lease is held. While the
    /// lease runs out, what arrives waits for the next job's first drive or the lease's
    /// end ([`DRIVE_LEASE`]).
    pub(crate) fn settle(&self) {
        if self.shared.driven_until.load(Ordering::Acquire) == 0 {
            return;
        }
        let pending = match self.shared.state.try_lock() {
            Some(mut lp) => {
                lp.take_cmds();
                lp.round(true);
                lp.out_pending()
            }
            None => true,
        };
        if pending {
            self.release();
        }
    }

    /// Ends a [`Proxy::drive`] lease (the executor stops waiting): the proxy thread takes
    /// the sockets over at once. Nothing to do when no lease is held.
    pub(crate) fn release(&self) {
        if self.shared.driven_until.swap(0, Ordering::AcqRel) != 0 {
            self.shared.wake.signal();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.shared.driven_until.store(0, Ordering::Release);
        self.shared.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The proxy thread: rounds while something moves, then yields, then sleeps in `poll` on
/// its sockets and eventfd; while an executor drives ([`Proxy::drive`]), it sleeps on the
/// eventfd alone until the lease ends. The lock is held for a round, never while sleeping
/// or yielding.
fn run(sh: &Shared, stop: &AtomicBool, rank: usize) {
    let mut idle = 0u32;
    loop {
        if let Some(left) = sh.lease_left() {
            if !stop.load(Ordering::Acquire) {
                let mut fds = [libc::pollfd {
                    fd: sh.wake.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                if poll(&mut fds, left.min(MAX_SLEEP)).is_err() {
                    std::thread::sleep(Duration::from_micros(100));
                }
                sh.wake.drain();
                idle = 0;
                continue;
            }
        }
        let mut lp = sh.state.lock();
        lp.take_cmds();
        if lp.stop.load(Ordering::Acquire) {
            lp.finish();
            return;
        }
        if lp.round(false) {
            idle = 0;
            continue;
        }
        idle += 1;
        if idle < IDLE_YIELDS {
            drop(lp);
            std::thread::yield_now();
            continue;
        }
        // Announce, re-check, then sleep: a ring after the announcement signals the
        // eventfd, one before it is seen by the re-check.
        let _seen = lp.l.wake_bell.announce();
        if !lp.round(false) && !lp.stop.load(Ordering::Acquire) {
            let mut fds = lp.poll_fds();
            drop(lp);
            if let Err(e) = poll(&mut fds, MAX_SLEEP) {
                tracing::warn!(target: "nccl::NET", rank, "socket proxy: {e}");
                std::thread::sleep(Duration::from_millis(1));
            }
            lp = sh.state.lock();
        } else {
            idle = 0;
        }
        lp.l.wake.drain();
        lp.l.wake_bell.unannounce();
    }
}

struct Data {
    s: DataStream,
    /// Payload length of the outbound message being written (`None`: between messages).
    out_len: Option<usize>,
    /// Bytes of the current outbound message written so far on the first socket (header +
    /// first piece) and on each extra socket (its piece).
    sent: usize,
    extra_sent: Vec<usize>,
    /// Simple-FIFO messages sent whose slots wait for the peer's credit: the executor sees
    /// its send FIFO drain only as fast as the remote executor consumes, as over shared
    /// memory (the wait metrics of the probe then mean the same).
    unacked: usize,
    /// Credits owed to the peer (messages the executor consumed from the receive FIFO).
    credit_owed: u64,
    /// Messages the executor had consumed at the last look.
    consumed_seen: u64,
    /// A credit frame being written, and how much of it is written.
    credit_frame: Option<([u8; DATA_HEADER_BYTES], usize)>,
    hdr: [u8; DATA_HEADER_BYTES],
    hdr_len: usize,
    /// The decoded header of the message being received.
    incoming: Option<DataHeader>,
    /// Bytes of its first piece received (first socket), and of each extra socket's piece.
    got: usize,
    extra_got: Vec<usize>,
    /// Inbound side waits for a free slot.
    blocked: bool,
    done: bool,
    /// When the inbound message being received started arriving (see `DataStream::wire`).
    wire_t0: Option<Instant>,
}

impl Data {
    /// Whether frames can arrive: the inbound side, or credits for a Simple outbound side.
    fn reads(&self) -> bool {
        self.s.inb.is_some() || matches!(self.s.out, Some(Outbound::Fifo(..)))
    }

    /// The events to poll socket `j` of the stream for (0: nothing to do there now).
    fn poll_events(&self, j: usize) -> libc::c_short {
        let k = self.s.ways();
        let mut ev = 0;
        let reading = match &self.incoming {
            // Between messages only the first socket has something to read (a header).
            None => j == 0 && self.reads(),
            Some(h) => !self.blocked && self.got_on(j) < stripe(h.len, k, j).len(),
        };
        if reading {
            ev |= libc::POLLIN;
        }
        let writing = match self.out_len {
            // Between messages the first socket owes credits.
            None => j == 0 && (self.credit_frame.is_some() || self.credit_owed > 0),
            Some(len) => {
                let header = if j == 0 { DATA_HEADER_BYTES } else { 0 };
                (j == 0 && self.credit_frame.is_some())
                    || self.sent_on(j) < header + stripe(len, k, j).len()
            }
        };
        if writing {
            ev |= libc::POLLOUT;
        }
        ev
    }

    /// The stream stops: nothing more is sent or received on it, and an executor waiting
    /// for a referenced message to be written learns that it never will be.
    fn stop(&mut self) {
        self.done = true;
        if let Some(r) = self.s.out.as_ref().and_then(Outbound::refs) {
            r.set_broken();
        }
    }

    fn got_on(&self, j: usize) -> usize {
        if j == 0 {
            self.got
        } else {
            self.extra_got[j - 1]
        }
    }

    fn sent_on(&self, j: usize) -> usize {
        if j == 0 {
            self.sent
        } else {
            self.extra_sent[j - 1]
        }
    }

    /// Counts the messages the executor consumed since the last look as credits owed.
    fn note_consumed(&mut self) {
        if let Some(Inbound::Fifo(f)) = &self.s.inb {
            let consumed = f.committed() - f.in_flight() as u64;
            if consumed > self.consumed_seen {
                self.credit_owed += consumed - self.consumed_seen;
                self.consumed_seen = consumed;
            }
        }
    }
}

struct Ctl {
    peer: usize,
    sock: TcpStream,
    poison_out: SharedWord,
    poison_sent: bool,
    query_in: SharedWord,
    current_out: [SharedWord; 4],
    /// A query was sent and its answer has not come yet.
    query_pending: bool,
    out: Vec<u8>,
    sent: usize,
    buf: [u8; CONTROL_BYTES],
    got: usize,
    bye_seen: bool,
    bye_queued: bool,
    done: bool,
    /// The stream ended without a goodbye: the peer is marked lost, with this reason, once
    /// its inbound data streams ended too or at the deadline ([`Loop::settle_losses`]).
    losing: Option<(Instant, String)>,
}

struct Loop {
    l: ProxyLocal,
    cmds: Receiver<Cmd>,
    stop: Arc<AtomicBool>,
    peers: Arc<PeerStates>,
    data: Vec<Data>,
    ctl: Vec<Ctl>,
    /// Set when something was committed or released: ring the executor once per round.
    ring_exec: bool,
    /// Which streams have something to read this round ([`Readable::refresh`]).
    ready: Readable,
}

/// Most control bytes queued for one peer before further answers to its queries are
/// dropped (see `pump_ctl`).
const MAX_CONTROL_BACKLOG: usize = 64 * CONTROL_BYTES;

/// Rounds without progress spent yielding before the proxy sleeps in `poll`.
const IDLE_YIELDS: u32 = 64;
/// The longest sleep in `poll` (a lost wake-up costs at most this).
const MAX_SLEEP: Duration = Duration::from_millis(20);
/// How long a peer whose control stream ended without a goodbye may still deliver what
/// its data streams hold before it is marked lost. A process that exits closes every
/// socket at once, so its data streams end (after their last bytes) within this; what is
/// still in flight from a peer that finished its part and exited is not lost.
const LOSS_DRAIN: Duration = Duration::from_millis(250);

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted)
}

impl Loop {
    fn new(
        l: ProxyLocal,
        cmds: Receiver<Cmd>,
        stop: Arc<AtomicBool>,
        peers: Arc<PeerStates>,
    ) -> Loop {
        Loop {
            l,
            cmds,
            stop,
            peers,
            data: Vec::new(),
            ctl: Vec::new(),
            ring_exec: false,
            ready: Readable::default(),
        }
    }

    fn take_cmds(&mut self) {
        loop {
            match self.cmds.try_recv() {
                Ok(Cmd::Data(s)) => self.data.push(Data {
                    out_len: None,
                    sent: 0,
                    extra_sent: vec![0; s.extra.len()],
                    extra_got: vec![0; s.extra.len()],
                    s: *s,
                    unacked: 0,
                    credit_owed: 0,
                    consumed_seen: 0,
                    credit_frame: None,
                    hdr: [0; DATA_HEADER_BYTES],
                    hdr_len: 0,
                    incoming: None,
                    got: 0,
                    blocked: false,
                    done: false,
                    wire_t0: None,
                }),
                Ok(Cmd::Control {
                    peer,
                    sock,
                    poison_out,
                    query_in,
                    current_out,
                }) => self.ctl.push(Ctl {
                    peer,
                    sock,
                    poison_out,
                    poison_sent: false,
                    query_in,
                    current_out,
                    query_pending: false,
                    out: Vec::new(),
                    sent: 0,
                    buf: [0; CONTROL_BYTES],
                    got: 0,
                    bye_seen: false,
                    bye_queued: false,
                    done: false,
                    losing: None,
                }),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            }
        }
    }

    /// One pass over every connection; whether anything moved. `poll_first`: read only
    /// the sockets one `poll` finds readable ([`Readable::refresh`]), as an executor's
    /// rounds do (latency-bound, most find nothing); the proxy thread's rounds, which
    /// carry the large transfers, try every socket (there the extra system call per round
    /// measured 2-28 % slower from 1 MiB at 2 hosts, docs/perf-net.md).
    fn round(&mut self, poll_first: bool) -> bool {
        let mut progress = false;
        if poll_first {
            self.ready.refresh(&self.data, &self.ctl);
        } else {
            self.ready.all();
        }
        for i in 0..self.data.len() {
            progress |= self.pump_out(i);
            if self.ready.data(i) {
                progress |= self.pump_in(i);
            }
        }
        for i in 0..self.ctl.len() {
            let read = self.ready.ctl(i);
            progress |= self.pump_ctl(i, read);
        }
        self.settle_losses();
        if self.ring_exec {
            self.ring_exec = false;
            self.l.exec_bell.ring_if_waiting();
        }
        progress
    }

    /// Whether a data stream has something to write that the last round could not: a
    /// message (or its rest), a credit frame, credits owed.
    fn out_pending(&mut self) -> bool {
        self.data.iter_mut().any(|d| {
            if d.done {
                return false;
            }
            if d.out_len.is_some() || d.credit_frame.is_some() || d.credit_owed > 0 {
                return true;
            }
            let unacked = d.unacked;
            d.s.out
                .as_mut()
                .is_some_and(|o| !matches!(o.peek(unacked), Ok(None)))
        })
    }

    /// What the proxy sleeps on: its eventfd and every socket with something to do.
    fn poll_fds(&self) -> Vec<libc::pollfd> {
        let mut fds = Vec::with_capacity(1 + self.data.len() + self.ctl.len());
        fds.push(libc::pollfd {
            fd: self.l.wake.fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for d in &self.data {
            if d.done {
                continue;
            }
            for (j, sock) in std::iter::once(&d.s.sock).chain(&d.s.extra).enumerate() {
                let ev = d.poll_events(j);
                if ev != 0 {
                    fds.push(libc::pollfd {
                        fd: sock.as_raw_fd(),
                        events: ev,
                        revents: 0,
                    });
                }
            }
        }
        for c in &self.ctl {
            if c.done {
                continue;
            }
            let mut ev = libc::POLLIN;
            if c.sent < c.out.len() {
                ev |= libc::POLLOUT;
            }
            fds.push(libc::pollfd {
                fd: c.sock.as_raw_fd(),
                events: ev,
                revents: 0,
            });
        }
        fds
    }

    /// A data stream broke the protocol (junk, a frame that does not fit, data lost in the
    /// middle of a message): the connection is dropped and its peer is lost (the executor
    /// fails its operations with `ncclRemoteError` at its next peer check).
    fn fail_data(&mut self, i: usize, why: String) {
        let d = &mut self.data[i];
        d.stop();
        d.s.shutdown(Shutdown::Both);
        tracing::warn!(target: "nccl::NET", rank = self.l.rank,
            "connection to rank {} ({}) failed: {why}", d.s.peer, d.s.id);
        let peer = d.s.peer;
        self.peers.mark(peer, LOST, Some(why));
        self.ring_exec = true;
    }

    /// A data stream's socket ended or failed between frames (the peer destroyed its
    /// communicator, died, or its link went silent): the stream stops. Whether the peer is
    /// lost is the control connection's call (it ends without a goodbye on a death, and
    /// its keep-alive notices a silent link), so a peer that destroyed cleanly while this
    /// rank still sent it credits is not reported lost.
    fn end_data(&mut self, i: usize, why: String) {
        let d = &mut self.data[i];
        d.stop();
        d.s.shutdown(Shutdown::Both);
        tracing::debug!(target: "nccl::NET", rank = self.l.rank,
            "connection to rank {} ({}) ended: {why}", d.s.peer, d.s.id);
        self.ring_exec = true;
    }

    /// One round of the control stream `i`: what is queued for the peer is written, and
    /// what the peer sent is read if `read` (its socket was found readable).
    fn pump_ctl(&mut self, i: usize, read: bool) -> bool {
        let mut progress = false;
        let stopping = self.stop.load(Ordering::Acquire);
        let c = &mut self.ctl[i];
        if c.done {
            return false;
        }
        if !c.poison_sent {
            let v = c.poison_out.get().load(Ordering::Acquire);
            if v != 0 {
                c.out.extend_from_slice(&Control::Poison(v).encode());
                c.poison_sent = true;
            }
        }
        if !c.query_pending && c.query_in.get().swap(0, Ordering::AcqRel) != 0 {
            c.out.extend_from_slice(&Control::Query.encode());
            c.query_pending = true;
        }
        if stopping && !c.bye_queued {
            c.out.extend_from_slice(&Control::Bye.encode());
            c.bye_queued = true;
        }
        while c.sent < c.out.len() {
            match c.sock.write(&c.out[c.sent..]) {
                Ok(0) => break,
                Ok(n) => {
                    c.sent += n;
                    progress = true;
                }
                Err(e) if would_block(&e) => break,
                Err(_) => break, // a dead peer shows on the read side
            }
        }
        if c.sent == c.out.len() {
            c.out.clear();
            c.sent = 0;
        }
        if !read {
            return progress;
        }
        loop {
            let c = &mut self.ctl[i];
            match c.sock.read(&mut c.buf[c.got..]) {
                Ok(0) => {
                    c.done = true;
                    let peer = c.peer;
                    if c.bye_seen {
                        self.peers.mark(peer, CLOSED, None);
                    } else {
                        let why =
                            "connection closed without a goodbye (process exited or link lost)";
                        tracing::warn!(target: "nccl::NET", rank = self.l.rank,
                            "rank {peer}: {why}");
                        c.losing = Some((Instant::now() + LOSS_DRAIN, why.into()));
                    }
                    return true;
                }
                Ok(n) => {
                    c.got += n;
                    progress = true;
                }
                Err(e) if would_block(&e) => return progress,
                Err(e) => {
                    c.done = true;
                    let peer = c.peer;
                    let why = format!("connection failed: {e}");
                    tracing::warn!(target: "nccl::NET", rank = self.l.rank, "rank {peer}: {why}");
                    c.losing = Some((Instant::now() + LOSS_DRAIN, why));
                    return true;
                }
            }
            if c.got < CONTROL_BYTES {
                continue;
            }
            c.got = 0;
            match Control::decode(&c.buf) {
                Ok(Control::Poison(v)) => {
                    // The first poison wins (as for shared memory, `desc::on_mismatch`).
                    let _ = self.l.poison.get().compare_exchange(
                        0,
                        v,
                        Ordering::Release,
                        Ordering::Relaxed,
                    );
                    self.l.exec_bell.ring();
                }
                Ok(Control::Bye) => c.bye_seen = true,
                // A peer has at most one query outstanding: answers piling up unsent (a peer
                // that asks and never reads) are not queued without bound.
                Ok(Control::Query) if c.out.len() < MAX_CONTROL_BACKLOG => {
                    let now = self.l.current.as_ref().and_then(current::load);
                    c.out
                        .extend_from_slice(&Control::Current(now.unwrap_or([0; 3])).encode());
                    // Written on the next round (`progress` keeps the proxy awake).
                    progress = true;
                }
                Ok(Control::Query) => {}
                Ok(Control::Current(w)) => {
                    current::store(&c.current_out, w);
                    c.query_pending = false;
                }
                Err(why) => {
                    c.done = true;
                    let _ = c.sock.shutdown(Shutdown::Both);
                    let peer = c.peer;
                    tracing::warn!(target: "nccl::NET", rank = self.l.rank,
                        "control connection to rank {peer}: {why}; dropping it");
                    self.peers.mark(peer, LOST, Some(why));
                    self.ring_exec = true;
                    return true;
                }
            }
        }
    }

    /// Marks lost each peer whose control stream ended without a goodbye once its inbound
    /// data streams ended too (everything it sent was delivered) or its drain time is over.
    fn settle_losses(&mut self) {
        let now = Instant::now();
        for c in &mut self.ctl {
            let Some((deadline, _)) = &c.losing else {
                continue;
            };
            let draining = self
                .data
                .iter()
                .any(|d| d.s.peer == c.peer && d.s.inb.is_some() && !d.done);
            if draining && now < *deadline {
                continue;
            }
            if let Some((_, why)) = c.losing.take() {
                self.peers.mark(c.peer, LOST, Some(why));
                self.ring_exec = true;
            }
        }
    }

    /// Destroy: sends what the executor committed (bounded by `flush`), says goodbye on
    /// every control stream, then closes everything.
    fn finish(&mut self) {
        let deadline = Instant::now() + self.l.flush;
        loop {
            let moved = (0..self.data.len()).fold(false, |m, i| self.pump_out(i) | m);
            let pending = self.data.iter().any(|d| {
                !d.done
                    && (d.out_len.is_some()
                        || matches!(&d.s.out, Some(Outbound::Fifo(f, _)) if f.pending() > d.unacked))
            });
            if !pending || Instant::now() >= deadline {
                break;
            }
            if !moved {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        for i in 0..self.ctl.len() {
            self.pump_ctl(i, true);
        }
        let deadline = Instant::now() + Duration::from_millis(200).min(self.l.flush);
        while self.ctl.iter().any(|c| !c.done && c.sent < c.out.len()) && Instant::now() < deadline
        {
            for i in 0..self.ctl.len() {
                self.pump_ctl(i, true);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        for d in &self.data {
            d.s.shutdown(Shutdown::Write);
        }
        for c in &self.ctl {
            let _ = c.sock.shutdown(Shutdown::Write);
        }
    }
}
