//! Rank-to-rank control network: one listener per rank (shared by the communicators split
//! from it), one cached outgoing TCP connection per peer, one reader thread per incoming
//! connection that files frames into a mailbox keyed by (namespace, kind, src, tag).
//! Frames from one sender to one receiver arrive in order.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::wire::{
    prepare, read_full, write_full, Frame, Header, ReadFail, Stop, FRAME_BYTES, HEADER_BYTES,
    MAX_FRAME_PAYLOAD, TYPE_PEER,
};
use crate::error::{CclError, Result};

const T: &str = "nccl::BOOTSTRAP";
/// Time a new incoming connection has to complete its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// How long a sender keeps retrying a refused connection before declaring the peer gone.
const CONNECT_RETRY: Duration = Duration::from_secs(2);
/// How often a waiting recv re-checks abort/deadline.
const WAIT_SLICE: Duration = Duration::from_millis(20);

type Key = (u64, u32, u32, u32); // (namespace, kind, src, tag)

#[derive(Default)]
struct Mailbox {
    msgs: HashMap<Key, VecDeque<Vec<u8>>>,
    /// Network ranks whose connection to us ended: `None` = closed cleanly, `Some` = broken.
    gone: HashMap<usize, Option<String>>,
    /// Open incoming connections per network rank.
    live: HashMap<usize, usize>,
}

pub(crate) struct Shared {
    closed: AtomicBool,
    mailbox: Mutex<Mailbox>,
    cv: Condvar,
    magic: u64,
    rank: usize,
    nranks: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Mailbox> {
        self.mailbox.lock()
    }

    fn deliver(&self, key: Key, data: Vec<u8>) {
        self.lock().msgs.entry(key).or_default().push_back(data);
        self.cv.notify_all();
    }
}

/// The network of one top-level rank.
pub(crate) struct Network {
    shared: Arc<Shared>,
    listen: SocketAddr,
    peers: Vec<SocketAddr>,
    conns: Vec<Mutex<Option<TcpStream>>>,
}

impl Drop for Network {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.cv.notify_all();
        // Wake the blocking accept so the thread sees `closed` and exits (frees the port).
        let _ = TcpStream::connect_timeout(&self.listen, Duration::from_millis(200));
    }
}

impl Network {
    /// Starts accepting on `listener` (already bound, advertised to peers as `peers[rank]`).
    pub(super) fn start(
        listener: TcpListener,
        magic: u64,
        rank: usize,
        peers: Vec<SocketAddr>,
    ) -> Result<Network> {
        let listen = listener
            .local_addr()
            .map_err(|e| CclError::sys("bootstrap: listener address", e))?;
        let nranks = peers.len();
        let shared = Arc::new(Shared {
            closed: AtomicBool::new(false),
            mailbox: Mutex::new(Mailbox::default()),
            cv: Condvar::new(),
            magic,
            rank,
            nranks: peers.len(),
        });
        let s2 = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("ccl-bootstrap-accept-{rank}"))
            .spawn(move || accept_loop(listener, s2))
            .map_err(|e| CclError::sys("bootstrap: spawning accept thread", e))?;
        Ok(Network {
            shared,
            listen,
            peers,
            conns: (0..nranks).map(|_| Mutex::new(None)).collect(),
        })
    }

    pub(super) fn listen_addr(&self) -> SocketAddr {
        self.listen
    }

    /// Sends one frame to network rank `peer` (which may be this rank).
    pub(super) fn send(
        &self,
        peer: usize,
        frame: Frame,
        payload: &[u8],
        stop: &Stop<'_>,
    ) -> Result<()> {
        if peer == self.shared.rank {
            let key = (frame.ns, frame.kind, frame.src, frame.tag);
            self.shared.deliver(key, payload.to_vec());
            return Ok(());
        }
        let addr = *self
            .peers
            .get(peer)
            .ok_or_else(|| CclError::Internal(format!("bootstrap: no address for rank {peer}")))?;
        let slot = self
            .conns
            .get(peer)
            .ok_or_else(|| CclError::Internal(format!("bootstrap: no slot for rank {peer}")))?;
        // One lock per peer: senders to the same peer serialise (frames never interleave) and
        // at most one connection per (sender, receiver) pair exists, keeping frames in order.
        let mut guard = slot.lock();
        if guard.is_none() {
            *guard = Some(self.connect(peer, addr, stop)?);
        }
        let Some(s) = guard.as_mut() else {
            return Err(CclError::Internal(
                "bootstrap: connection slot empty".into(),
            ));
        };
        let mut msg = Vec::with_capacity(FRAME_BYTES + payload.len());
        msg.extend_from_slice(&frame.encode());
        msg.extend_from_slice(payload);
        let check = || stop.check();
        if let Err(e) = write_full(s, &msg, &check) {
            // A partly written frame leaves the stream unusable: forget it.
            *guard = None;
            return Err(match e {
                ReadFail::Stop(e) => e,
                ReadFail::Eof { .. } => CclError::Remote(format!(
                    "bootstrap: rank {peer} at {addr} closed the connection"
                )),
                ReadFail::Io(e) => {
                    CclError::Remote(format!("bootstrap: sending to rank {peer} at {addr}: {e}"))
                }
            });
        }
        Ok(())
    }

    fn connect(&self, peer: usize, addr: SocketAddr, stop: &Stop<'_>) -> Result<TcpStream> {
        let mut s = connect_retry(addr, stop, CONNECT_RETRY).map_err(|e| match e {
            CclError::Remote(m) => CclError::Remote(format!("bootstrap: rank {peer}: {m}")),
            other => other,
        })?;
        prepare(&s).map_err(|e| CclError::sys("bootstrap: configuring socket", e))?;
        let mut hello = Header {
            magic: self.shared.magic,
            ty: TYPE_PEER,
            len: 8,
        }
        .encode()
        .to_vec();
        hello.extend_from_slice(&(self.shared.rank as u32).to_le_bytes());
        hello.extend_from_slice(&(self.shared.nranks as u32).to_le_bytes());
        let check = || stop.check();
        write_full(&mut s, &hello, &check).map_err(|e| match e {
            ReadFail::Stop(e) => e,
            other => CclError::Remote(format!(
                "bootstrap: handshake with rank {peer} at {addr} failed: {other}"
            )),
        })?;
        Ok(s)
    }

    /// Waits for the next message under `key` sent by network rank `from`.
    pub(super) fn recv(&self, key: Key, from: usize, stop: &Stop<'_>) -> Result<Vec<u8>> {
        let mut mb = self.shared.lock();
        loop {
            if let Some(q) = mb.msgs.get_mut(&key) {
                if let Some(m) = q.pop_front() {
                    if q.is_empty() {
                        mb.msgs.remove(&key);
                    }
                    return Ok(m);
                }
            }
            if let Some(why) = mb.gone.get(&from) {
                return Err(CclError::Remote(match why {
                    None => format!("bootstrap: rank {from} closed its connection before sending the awaited message"),
                    Some(w) => format!("bootstrap: connection from rank {from} broke: {w}"),
                }));
            }
            stop.check()?;
            self.shared.cv.wait_for(&mut mb, WAIT_SLICE);
        }
    }
}

/// Connects to `addr`, retrying refused/failed attempts until `stop` fires or, when
/// `give_up` elapses, returning `Remote` naming the address.
pub(crate) fn connect_retry(
    addr: SocketAddr,
    stop: &Stop<'_>,
    give_up: Duration,
) -> Result<TcpStream> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(5);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(s) => return Ok(s),
            Err(e) => {
                if start.elapsed() >= give_up {
                    return Err(CclError::Remote(format!(
                        "cannot connect to {addr} (tried for {:?}): {e}",
                        start.elapsed()
                    )));
                }
                if let Err(stopped) = stop.check() {
                    return Err(match stopped {
                        CclError::Timeout(_) => CclError::Remote(format!(
                            "cannot connect to {addr} (tried for {:?}): {e}",
                            start.elapsed()
                        )),
                        other => other,
                    });
                }
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_millis(100));
            }
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.closed.load(Ordering::Acquire) {
            break;
        }
        match conn {
            Ok(stream) => {
                let s2 = Arc::clone(&shared);
                let spawned = std::thread::Builder::new()
                    .name(format!("ccl-bootstrap-rx-{}", shared.rank))
                    .spawn(move || reader(stream, s2));
                if let Err(e) = spawned {
                    tracing::warn!(target: T, rank = shared.rank, error = %e, "bootstrap: cannot spawn reader thread");
                }
            }
            Err(e) => {
                tracing::warn!(target: T, rank = shared.rank, error = %e, "bootstrap: accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn reader(mut s: TcpStream, shared: Arc<Shared>) {
    let me = shared.rank;
    let from = s
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    if shared.closed.load(Ordering::Acquire) {
        return;
    }
    if let Err(e) = prepare(&s) {
        tracing::warn!(target: T, rank = me, %from, error = %e, "bootstrap: cannot configure connection");
        return;
    }
    let deadline = Instant::now() + HANDSHAKE_DEADLINE;
    let hs_stop = || {
        if shared.closed.load(Ordering::Acquire) || Instant::now() >= deadline {
            Err(CclError::Timeout("handshake".into()))
        } else {
            Ok(())
        }
    };
    let mut hb = [0u8; HEADER_BYTES + 8];
    if let Err(e) = read_full(&mut s, &mut hb, &hs_stop) {
        if !shared.closed.load(Ordering::Acquire) {
            tracing::warn!(target: T, rank = me, %from, error = %e, "bootstrap: dropping connection with truncated handshake");
        }
        return;
    }
    let mut h16 = [0u8; HEADER_BYTES];
    h16.copy_from_slice(&hb[..HEADER_BYTES]);
    let h = Header::decode(&h16);
    let src = u32::from_le_bytes([hb[16], hb[17], hb[18], hb[19]]) as usize;
    let n = u32::from_le_bytes([hb[20], hb[21], hb[22], hb[23]]) as usize;
    if h.magic != shared.magic || h.ty != TYPE_PEER || h.len != 8 {
        tracing::warn!(target: T, rank = me, %from, magic = format_args!("{:#018x}", h.magic), ty = h.ty, "bootstrap: dropping connection with bad handshake");
        return;
    }
    if n != shared.nranks || src >= n || src == me {
        tracing::warn!(target: T, rank = me, %from, src, nranks = n, "bootstrap: dropping connection from an unknown rank");
        return;
    }
    {
        let mut mb = shared.lock();
        mb.gone.remove(&src);
        *mb.live.entry(src).or_insert(0) += 1;
    }
    let end = frames(&mut s, &shared, src);
    let mut mb = shared.lock();
    let live = mb.live.entry(src).or_insert(1);
    *live = live.saturating_sub(1);
    let last = *live == 0;
    match end {
        End::Stopped => {}
        End::Clean if last => {
            tracing::debug!(target: T, rank = me, src, "bootstrap: peer closed its connection");
            mb.gone.insert(src, None);
        }
        End::Clean => {}
        End::Broken(why) => {
            tracing::warn!(target: T, rank = me, src, "bootstrap: {why}");
            mb.gone.insert(src, Some(why));
        }
    }
    drop(mb);
    shared.cv.notify_all();
}

enum End {
    Clean,
    Broken(String),
    Stopped,
}

fn frames(s: &mut TcpStream, shared: &Shared, src: usize) -> End {
    let run_stop = || {
        if shared.closed.load(Ordering::Acquire) {
            Err(CclError::Aborted("network closed".into()))
        } else {
            Ok(())
        }
    };
    loop {
        let mut fb = [0u8; FRAME_BYTES];
        match read_full(s, &mut fb, &run_stop) {
            Ok(()) => {}
            Err(ReadFail::Eof { got: 0 }) => return End::Clean,
            Err(ReadFail::Stop(_)) => return End::Stopped,
            Err(e) => return End::Broken(format!("truncated frame header from rank {src}: {e}")),
        }
        let f = Frame::decode(&fb);
        if f.len as usize > MAX_FRAME_PAYLOAD {
            return End::Broken(format!("oversized frame ({} bytes) from rank {src}", f.len));
        }
        let mut payload = vec![0u8; f.len as usize];
        match read_full(s, &mut payload, &run_stop) {
            Ok(()) => {}
            Err(ReadFail::Stop(_)) => return End::Stopped,
            Err(e) => {
                return End::Broken(format!(
                    "rank {src} closed mid-message ({} byte payload): {e}",
                    f.len
                ))
            }
        }
        shared.deliver((f.ns, f.kind, f.src, f.tag), payload);
    }
}
