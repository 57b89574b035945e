//! The socket transport: FIFO messages between ranks on different hosts (or on one host
//! with `NCCL_P2P_DISABLE=1` and `NCCL_SHM_DISABLE=1`) over TCP.
//!
//! The executor does not know about sockets. For a remote peer it gets FIFOs in private
//! (anonymous) memory instead of a peer's `/dev/shm` segment, a doorbell that wakes this
//! communicator's proxy thread ([`proxy`]) instead of the peer's, and a private word in
//! place of the peer's poison word. The proxy moves the messages between those FIFOs and
//! TCP connections (a large outbound message may leave from the user's buffer instead of
//! its slot, [`sendref`]): per stream (each channel of a ring, Tree or p2p link)
//! `NCCL_SOCKET_NTHREADS` x `NCCL_NSOCKS_PERTHREAD` of them (1 by default; a payload is
//! striped over them, [`frame::stripe`]), plus one control connection per pair of ranks
//! ([`frame::StreamId`]).
//!
//! Set-up ([`Remote::connect`], collective): each rank listens on the address its
//! bootstrap connection uses (so `NCCL_SOCKET_IFNAME`/`NCCL_SOCKET_FAMILY` choose the
//! interface, as for the bootstrap), and one allgather shares the listeners and rank 0's
//! random secret. Of each pair, the lower rank connects and sends a [`frame::Hello`]
//! naming the communicator, both ranks, the stream and the secret; the higher rank accepts,
//! checks every field and drops (with a `WARN`) a connection that fails any check.
//! Connecting never waits for the peer, and accepting waits only for lower ranks, so no
//! order of set-up calls deadlocks.
//!
//! Failure: the end of a control connection without a goodbye (a killed process, a reset)
//! marks the peer lost; TCP keep-alive and `TCP_USER_TIMEOUT` bound the time to notice a
//! link that went silent ([`LINK_TIMEOUT`]). The executor's peer check
//! (`CCLD_PEER_CHECK_MS`) then fails the operation with `ncclRemoteError`.

pub(crate) mod ends;
pub(crate) mod frame;
pub(crate) mod peers;
pub(crate) mod proxy;
pub(crate) mod sendref;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use frame::{Hello, StreamId, HELLO_BYTES, MAX_SOCKETS, SECRET_BYTES};
use proxy::{Cmd, DataStream, Inbound, Outbound, Proxy, ProxyLocal};

use crate::bootstrap::Bootstrap;
use crate::error::{CclError, Result};
use crate::transport::shm::{Doorbell, SharedWord, ShmRegion, CACHE_LINE};
use crate::transport::wake::{poll, EventFd};

/// How long a silent link may stay unanswered before the peer counts as lost (TCP
/// keep-alive probes after 1 s idle, every 1 s, 3 of them; `TCP_USER_TIMEOUT` for data that
/// stays unacknowledged).
pub(crate) const LINK_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the per-peer words start in the wake region (the proxy's doorbell comes first).
const PEER_WORDS_AT: usize = CACHE_LINE;
/// Words per peer in the wake region: its poison word, its four current-collective words,
/// the query word.
const PEER_WORDS: usize = 6;

/// How long reading a hello may take before the connection is dropped.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// One rank's socket transport in one communicator.
#[derive(Debug)]
pub(crate) struct Remote {
    me: usize,
    comm_hash: u64,
    secret: [u8; SECRET_BYTES],
    /// Which ranks this rank reaches over sockets.
    remote: Vec<bool>,
    /// Sockets per data stream (the same on every rank, checked at set-up).
    sockets: usize,
    /// Send and receive buffer set on each connection, `None`: autotuning ([`tune`]).
    buffer: Option<libc::c_int>,
    addrs: Vec<Option<SocketAddr>>,
    listener: TcpListener,
    /// Accepted and checked connections not yet claimed by a set-up step.
    stash: HashMap<(usize, StreamId), TcpStream>,
    /// Per (peer, stream) with an inbound side: its wire-time counter (`DataStream::wire`).
    wire: HashMap<(usize, StreamId), Arc<AtomicU64>>,
    timeout: Duration,
    /// Offset 0: the proxy's doorbell; from [`PEER_WORDS_AT`]: [`PEER_WORDS`] words per
    /// rank (poison, current collective, query; [`Remote::peer_word`]).
    wake_region: Arc<ShmRegion>,
    wake: Arc<EventFd>,
    proxy: Proxy,
}

/// What each rank offers at set-up: its secret (rank 0's is the communicator's), its
/// sockets per data stream, and its listener's address.
#[derive(Debug, PartialEq, Eq)]
struct Offer {
    secret: [u8; SECRET_BYTES],
    sockets: usize,
    addr: SocketAddr,
}

fn encode_offer(o: &Offer) -> Vec<u8> {
    let mut v = o.secret.to_vec();
    v.push(o.sockets as u8);
    v.extend_from_slice(o.addr.to_string().as_bytes());
    v
}

fn decode_offer(b: &[u8]) -> Result<Offer> {
    let bad = || CclError::Remote("malformed socket-transport offer from a peer".into());
    if b.len() <= SECRET_BYTES + 1 {
        return Err(bad());
    }
    let mut secret = [0u8; SECRET_BYTES];
    secret.copy_from_slice(&b[..SECRET_BYTES]);
    let sockets = usize::from(b[SECRET_BYTES]);
    if !(1..=MAX_SOCKETS).contains(&sockets) {
        return Err(bad());
    }
    let addr = std::str::from_utf8(&b[SECRET_BYTES + 1..])
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(bad)?;
    Ok(Offer {
        secret,
        sockets,
        addr,
    })
}

/// Sockets per data stream from `NCCL_SOCKET_NTHREADS` and `NCCL_NSOCKS_PERTHREAD` (pure):
/// their product, and as NVIDIA's socket transport does, at most [`MAX_SOCKETS`]: past it
/// the sockets per thread shrink to `MAX_SOCKETS / nthreads` (the second value says so,
/// for a warning).
fn sockets_per_stream(nthreads: usize, per_thread: usize) -> (usize, Option<String>) {
    let (t, p) = (nthreads.max(1), per_thread.max(1));
    if t * p <= MAX_SOCKETS {
        return (t * p, None);
    }
    let p2 = (MAX_SOCKETS / t).max(1);
    let why = format!(
        "NCCL_SOCKET_NTHREADS={t} x NCCL_NSOCKS_PERTHREAD={p} exceeds {MAX_SOCKETS} sockets; using {p2} per thread"
    );
    (t * p2, Some(why))
}

/// Every rank must stripe over as many sockets (pure; every rank sees every offer, so a
/// disagreement fails every rank alike, naming the first rank that differs from rank 0).
fn check_same_sockets(offers: &[Offer]) -> Result<()> {
    let Some(first) = offers.first() else {
        return Ok(());
    };
    match offers.iter().enumerate().find(|(_, o)| o.sockets != first.sockets) {
        None => Ok(()),
        Some((r, o)) => Err(CclError::usage(format!(
            "rank {r} uses {} sockets per connection, rank 0 uses {}: set the same NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD on every rank",
            o.sockets, first.sockets
        ))),
    }
}

/// [`sockets_per_stream`] from the environment.
fn sockets_from_env(rank: usize) -> Result<usize> {
    let t = crate::env::u64_or(&ccl_params::NCCL_SOCKET_NTHREADS, 1)?;
    let p = crate::env::u64_or(&ccl_params::NCCL_NSOCKS_PERTHREAD, 1)?;
    let (k, warn) = sockets_per_stream(t as usize, p as usize);
    if let Some(why) = warn {
        tracing::warn!(target: "nccl::NET", rank, "socket transport: {why}");
    }
    Ok(k)
}

/// The send and receive buffer per connection that `CCLD_SOCKET_BUFFER` defaults to where
/// the ranks fit the cores ([`default_buffer`]).
const SOCKET_BUFFER: u64 = 4 << 20;

/// `CCLD_SOCKET_BUFFER`'s default (pure): [`SOCKET_BUFFER`] when this machine's `ranks_here`
/// ranks of the communicator are no more than the `cores` this process may run on, 0
/// (autotuning) otherwise. Measured on 2 cores over veth (docs/perf-net.md): with a rank
/// per core, 4 MiB took 0.73-0.85x the time of autotuning at 1 MiB (jobs of 64 operations)
/// and 0.92-1.00x at 4-16 MiB; with 4 ranks on the 2 cores 1.1-1.4x at 4-16 MiB, where a
/// receive window open from the start lets a sender queue megabytes for a receiver that is
/// not running.
fn default_buffer(ranks_here: usize, cores: usize) -> u64 {
    if ranks_here <= cores {
        SOCKET_BUFFER
    } else {
        0
    }
}

/// The send and receive buffer to set on each connection (pure): `requested` bytes when
/// the system allows that much of both (`rmem_max`, `wmem_max`: `net.core.rmem_max` and
/// `net.core.wmem_max`, `None` where unreadable); otherwise `None`, the kernel's
/// autotuning. A buffer the kernel would clamp below `requested` is not set: a fixed one
/// turns autotuning off for good, and autotuning may grow past a small system maximum
/// (to `net.ipv4.tcp_rmem`'s), which a link whose round trip is long needs.
fn fixed_buffer(
    requested: u64,
    rmem_max: Option<u64>,
    wmem_max: Option<u64>,
) -> Option<libc::c_int> {
    let allowed = rmem_max?.min(wmem_max?);
    if requested == 0 || requested > allowed {
        return None;
    }
    libc::c_int::try_from(requested).ok()
}

/// [`fixed_buffer`] from `CCLD_SOCKET_BUFFER` (default [`default_buffer`] for `ranks_here`
/// ranks of the communicator on this machine) and the system's maxima; says in an `INFO`
/// line when a requested buffer is left to autotuning.
fn buffer_from_env(rank: usize, ranks_here: usize) -> Result<Option<libc::c_int>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let requested = crate::env::u64_or(
        &ccl_params::CCLD_SOCKET_BUFFER,
        default_buffer(ranks_here, cores),
    )?;
    let read_max = |name: &str| {
        crate::bootstrap::read_trimmed(&format!("/proc/sys/net/core/{name}"))
            .and_then(|t| t.parse::<u64>().ok())
    };
    let (rmem, wmem) = (read_max("rmem_max"), read_max("wmem_max"));
    let fixed = fixed_buffer(requested, rmem, wmem);
    if fixed.is_none() && requested > 0 {
        let show = |m: Option<u64>| m.map_or_else(|| "unreadable".to_string(), |v| v.to_string());
        tracing::info!(target: "nccl::NET", rank,
            "socket transport: CCLD_SOCKET_BUFFER={requested} exceeds net.core.rmem_max ({}) or net.core.wmem_max ({}); leaving the buffers to the kernel's autotuning",
            show(rmem), show(wmem));
    }
    Ok(fixed)
}

/// Keep-alive and user timeout on a connection ([`LINK_TIMEOUT`]), `TCP_NODELAY`, and the
/// send and receive buffer when `buffer` fixes one ([`fixed_buffer`]): autotuning starts
/// a connection at 128 KiB of receive buffer and grows it over round trips, so that the
/// first operations of a job, each a new burst on every stream, wait on windows
/// ([`default_buffer`]).
fn tune(s: &TcpStream, buffer: Option<libc::c_int>) -> Result<()> {
    s.set_nodelay(true)
        .map_err(|e| CclError::sys("socket transport: TCP_NODELAY", e))?;
    if let Some(bytes) = buffer {
        [libc::SO_SNDBUF, libc::SO_RCVBUF]
            .into_iter()
            .try_for_each(|opt| set_int_option(s, libc::SOL_SOCKET, opt, bytes))
            .map_err(|e| CclError::sys("socket transport: SO_SNDBUF / SO_RCVBUF", e))?;
    }
    let ms = LINK_TIMEOUT.as_millis() as libc::c_int;
    [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms),
    ]
    .into_iter()
    .try_for_each(|(level, opt, v)| set_int_option(s, level, opt, v))
    .map_err(|e| CclError::sys("socket transport: keep-alive options", e))
}

/// `setsockopt(2)` of an `int`-valued option on `s`.
fn set_int_option(
    s: &TcpStream,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> std::io::Result<()> {
    // SAFETY: `s` owns the open socket for the call; the option value is a c_int on our
    // stack, passed with its size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Remote {
    /// Collective over the communicator (every rank calls it when any pair is remote):
    /// listens, shares listeners and the secret, starts the proxy and connects the control
    /// stream with every remote peer. `exec_bell`, `poison` and `current` are this rank's
    /// doorbell, poison word and current-collective words.
    pub(crate) fn connect(
        boot: &Bootstrap,
        remote: Vec<bool>,
        exec_bell: Arc<Doorbell>,
        poison: SharedWord,
        current: [SharedWord; 4],
    ) -> Result<Remote> {
        let me = boot.rank();
        let n = boot.nranks();
        let ip: IpAddr = boot
            .peer_addr(me)
            .map_or_else(|| boot.listen_addr().ip(), |a| a.ip());
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| CclError::sys(&format!("socket transport: listening on {ip}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CclError::sys("socket transport: listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| CclError::sys("socket transport: listener address", e))?;
        let sockets = sockets_from_env(me)?;
        let buffer = buffer_from_env(me, boot.ranks_on_this_machine())?;
        let offers = boot.allgather(&encode_offer(&Offer {
            secret: crate::bootstrap::random_nonce(),
            sockets,
            addr,
        }))?;
        let offers = offers
            .iter()
            .enumerate()
            .map(|(r, b)| {
                decode_offer(b).map_err(|e| crate::error::with_context(e, &format!("rank {r}")))
            })
            .collect::<Result<Vec<Offer>>>()?;
        check_same_sockets(&offers)?;
        let secret = offers[0].secret;
        let addrs: Vec<_> = offers
            .iter()
            .zip(&remote)
            .map(|(o, is_remote)| is_remote.then_some(o.addr))
            .collect();
        let wake = Arc::new(EventFd::new()?);
        let wake_region = Arc::new(ShmRegion::anonymous(PEER_WORDS_AT + PEER_WORDS * 8 * n)?);
        let proxy = Proxy::start(ProxyLocal {
            rank: me,
            nranks: n,
            exec_bell,
            poison,
            current: Some(current),
            wake_bell: Doorbell::new(Arc::clone(&wake_region), 0)?,
            wake: Arc::clone(&wake),
            flush: LINK_TIMEOUT,
            drive_lease: proxy::DRIVE_LEASE,
        })?;
        let mut r = Remote {
            me,
            comm_hash: boot.comm_hash(),
            secret,
            remote,
            sockets,
            buffer,
            addrs,
            listener,
            stash: HashMap::new(),
            wire: HashMap::new(),
            timeout: boot.timeout(),
            wake_region,
            wake,
            proxy,
        };
        let never = AtomicBool::new(false);
        for p in 0..n {
            if !r.remote[p] {
                continue;
            }
            let sock = r.stream(p, StreamId::CONTROL, &never)?;
            r.proxy.add(Cmd::Control {
                peer: p,
                sock,
                poison_out: r.poison_word(p)?,
                query_in: r.query_word(p)?,
                current_out: r.peer_current(p)?,
            })?;
        }
        tracing::info!(target: "nccl::NET", rank = me,
            "comm {:#018x}: socket transport on {addr} to ranks {:?}, socket buffers {}",
            r.comm_hash, (0..n).filter(|&p| r.remote[p]).collect::<Vec<_>>(),
            r.buffer.map_or_else(|| "autotuned".to_string(), |b| format!("{b} bytes")));
        Ok(r)
    }

    /// Whether `peer` is reached over sockets.
    pub(crate) fn is_remote(&self, peer: usize) -> bool {
        self.remote.get(peer).copied().unwrap_or(false)
    }

    /// See [`Proxy::drive`].
    pub(crate) fn drive(&self) -> bool {
        self.proxy.drive()
    }

    /// See [`Proxy::settle`].
    pub(crate) fn settle(&self) {
        self.proxy.settle()
    }

    /// See [`Proxy::release`].
    pub(crate) fn release(&self) {
        self.proxy.release()
    }

    /// See [`Proxy::while_idle`].
    pub(crate) fn while_proxy_idle(&self, f: impl FnOnce()) {
        self.proxy.while_idle(f)
    }

    /// Why the connection to `peer` was lost, `None` while it is fine.
    pub(crate) fn lost(&self, peer: usize) -> Option<String> {
        self.proxy.peers.lost(peer)
    }

    /// The doorbell the executor rings for a remote peer: it wakes the proxy.
    pub(crate) fn peer_bell(&self) -> Result<Doorbell> {
        Doorbell::with_event(Arc::clone(&self.wake_region), 0, Arc::clone(&self.wake))
    }

    /// The word standing for `peer`'s poison word: the proxy sends what is stored there.
    pub(crate) fn poison_word(&self, peer: usize) -> Result<SharedWord> {
        self.peer_word(peer, 0)
    }

    /// The words standing for `peer`'s current-collective words: the proxy stores there
    /// what `peer` answered to the last query ([`Remote::query_word`]); word 3 (the CPU)
    /// stays 0.
    pub(crate) fn peer_current(&self, peer: usize) -> Result<[SharedWord; 4]> {
        Ok([
            self.peer_word(peer, 1)?,
            self.peer_word(peer, 2)?,
            self.peer_word(peer, 3)?,
            self.peer_word(peer, 4)?,
        ])
    }

    /// The word the executor sets (non-zero, then rings [`Remote::peer_bell`]) to have the
    /// proxy ask `peer` which collective it runs; the answer lands in
    /// [`Remote::peer_current`].
    pub(crate) fn query_word(&self, peer: usize) -> Result<SharedWord> {
        self.peer_word(peer, 5)
    }

    /// Word `k` of `peer`'s block in the wake region (see [`PEER_WORDS`]).
    fn peer_word(&self, peer: usize, k: usize) -> Result<SharedWord> {
        SharedWord::new(
            Arc::clone(&self.wake_region),
            PEER_WORDS_AT + 8 * (PEER_WORDS * peer + k),
        )
    }

    /// Connects stream `id` with `peer` and hands it to the proxy with the FIFO ends the
    /// proxy serves.
    pub(crate) fn attach(
        &mut self,
        peer: usize,
        id: StreamId,
        out: Option<Outbound>,
        inb: Option<Inbound>,
        abort: &AtomicBool,
    ) -> Result<()> {
        let sock = self.stream(peer, id, abort)?;
        let extra = (1..self.sockets)
            .map(|j| self.stream(peer, id.socket(j), abort))
            .collect::<Result<Vec<_>>>()?;
        let wire = Arc::new(AtomicU64::new(0));
        if inb.is_some() {
            self.wire.insert((peer, id), Arc::clone(&wire));
        }
        self.proxy.add(Cmd::Data(Box::new(DataStream {
            peer,
            id,
            sock,
            extra,
            out,
            inb,
            wire,
        })))
    }

    /// The wire-time counter of the inbound side of stream `id` from `peer`
    /// ([`DataStream::wire`]), `None` when there is no such stream.
    pub(crate) fn wire_ns(&self, peer: usize, id: StreamId) -> Option<&Arc<AtomicU64>> {
        self.wire.get(&(peer, id))
    }

    /// The connection of stream `id` with `peer`, non-blocking and tuned: the lower rank
    /// connects, the higher accepts.
    fn stream(&mut self, peer: usize, id: StreamId, abort: &AtomicBool) -> Result<TcpStream> {
        let s = if self.me < peer {
            self.connect_to(peer, id)?
        } else {
            self.accept_from(peer, id, abort)?
        };
        tune(&s, self.buffer)?;
        s.set_nonblocking(true)
            .map_err(|e| CclError::sys("socket transport: non-blocking mode", e))?;
        Ok(s)
    }

    fn connect_to(&self, peer: usize, id: StreamId) -> Result<TcpStream> {
        let addr = self.addrs[peer].ok_or_else(|| {
            CclError::Internal(format!("no socket-transport address for rank {peer}"))
        })?;
        let mut s = TcpStream::connect_timeout(&addr, self.timeout).map_err(|e| {
            CclError::Remote(format!(
                "socket transport: connecting to rank {peer} at {addr} ({id}): {e}"
            ))
        })?;
        let hello = Hello {
            stream: id,
            comm_hash: self.comm_hash,
            from: self.me as u32,
            to: peer as u32,
            secret: self.secret,
        };
        s.write_all(&hello.encode()).map_err(|e| {
            CclError::Remote(format!(
                "socket transport: greeting rank {peer} at {addr} ({id}): {e}"
            ))
        })?;
        Ok(s)
    }

    fn accept_from(&mut self, peer: usize, id: StreamId, abort: &AtomicBool) -> Result<TcpStream> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(s) = self.stash.remove(&(peer, id)) {
                return Ok(s);
            }
            if abort.load(Ordering::Acquire) {
                return Err(CclError::Aborted(format!(
                    "ncclCommAbort called while waiting for rank {peer} to connect ({id})"
                )));
            }
            if Instant::now() >= deadline {
                return Err(CclError::Timeout(format!(
                    "socket transport: rank {peer} did not connect its {id} within {:?}",
                    self.timeout
                )));
            }
            match self.listener.accept() {
                Ok((s, from)) => self.admit(s, from),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let mut fds = [libc::pollfd {
                        fd: self.listener.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    }];
                    poll(&mut fds, Duration::from_millis(100))?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CclError::sys("socket transport: accept", e)),
            }
        }
    }

    /// Reads and checks the hello of an accepted connection; stashes it, or drops it with a
    /// `WARN` naming what was wrong.
    fn admit(&mut self, mut s: TcpStream, from: SocketAddr) {
        let mut b = [0u8; HELLO_BYTES];
        let read = s
            .set_nonblocking(false)
            .and_then(|()| s.set_read_timeout(Some(HELLO_TIMEOUT)))
            .and_then(|()| s.read_exact(&mut b));
        let n = self.remote.len();
        let checked = match read {
            Ok(()) => Hello::decode_checked(&b, self.comm_hash, self.me, n, &self.secret),
            Err(e) => Err(format!("no complete hello ({e})")),
        };
        match checked {
            Ok(h) if self.is_remote(h.from as usize) => {
                let _ = s.set_read_timeout(None);
                self.stash.insert((h.from as usize, h.stream), s);
            }
            Ok(h) => tracing::warn!(target: "nccl::NET", rank = self.me,
                "socket transport: dropping a connection from {from} claiming rank {}, which this rank reaches through shared memory", h.from),
            Err(why) => tracing::warn!(target: "nccl::NET", rank = self.me,
                "socket transport: dropping a connection from {from}: {why}"),
        }
    }
}

#[cfg(test)]
mod tests;
