//! The root: collects one registration per rank, then sends every rank the full table of
//! peer addresses and exits. Junk connections are dropped with a warning; each connection is
//! read by a short-lived thread with a bounded deadline so a stalled client cannot stall the
//! root. The root exits after `idle` without a new registration if the job never forms.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wire::{
    prepare, read_full, write_full, Header, PeerInfo, ReadFail, Registration, Reply, ReplyError,
    HEADER_BYTES, MAX_REGISTER_BODY, TYPE_REGISTER, TYPE_REPLY,
};
use crate::error::{CclError, Result};

const T: &str = "nccl::BOOTSTRAP";
/// How long a client may take to send its registration after connecting.
const REGISTER_DEADLINE: Duration = Duration::from_secs(5);
/// How long the root tries to deliver one reply.
const REPLY_DEADLINE: Duration = Duration::from_secs(5);
/// Connections being read at once; more are refused with a warning.
const MAX_INFLIGHT: usize = 1024;

/// Starts the root thread on `listener`. `magic` is the job's connection magic.
pub(crate) fn spawn(listener: TcpListener, magic: u64, idle: Duration) -> Result<()> {
    let addr = listener
        .local_addr()
        .map_err(|e| CclError::sys("bootstrap root: local_addr", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| CclError::sys("bootstrap root: set_nonblocking", e))?;
    std::thread::Builder::new()
        .name("ccl-bootstrap-root".into())
        .spawn(move || run(listener, addr, magic, idle))
        .map_err(|e| CclError::sys("bootstrap root: spawning thread", e))?;
    tracing::info!(target: T, %addr, "bootstrap root listening");
    Ok(())
}

fn reply(stream: &mut TcpStream, magic: u64, r: &Reply, rank: u32) {
    let body = r.encode();
    let h = Header {
        magic,
        ty: TYPE_REPLY,
        len: body.len() as u32,
    };
    let mut msg = h.encode().to_vec();
    msg.extend_from_slice(&body);
    let deadline = Instant::now() + REPLY_DEADLINE;
    let stop = || {
        if Instant::now() >= deadline {
            Err(CclError::Timeout("sending root reply".into()))
        } else {
            Ok(())
        }
    };
    if let Err(e) = write_full(stream, &msg, &stop) {
        tracing::warn!(target: T, rank, error = %e, "bootstrap root: could not send reply");
    }
}

/// True when the peer of `s` has closed its side (a rank that gave up).
fn is_closed(s: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let closed = match s.peek(&mut b) {
        Ok(n) => n == 0,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    let _ = s.set_nonblocking(false);
    closed
}

/// What the root does with one registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Keep the connection; wait for more ranks.
    Wait,
    /// Send this reply to the new connection only and drop it.
    Reject(Reply),
    /// Send this reply to the new connection and to every waiting rank; the job is dead.
    FailAll(Reply),
    /// Every rank is in: send this table to all (the new one included) and exit.
    Complete(Reply),
}

/// The root's bookkeeping, free of I/O so it can be tested exhaustively.
#[derive(Debug, Default)]
pub(crate) struct RootState {
    /// (nranks, the rank that first said so).
    nranks: Option<(u32, u32)>,
    slots: BTreeMap<u32, Registration>,
    failed: Option<Reply>,
}

impl RootState {
    /// Handles one registration. `closed(rank)` tells whether the connection of the rank
    /// already registered under that number has been closed by its peer (a rank that gave
    /// up and retried may take its slot back).
    pub(super) fn register(&mut self, reg: Registration, closed: &dyn Fn(u32) -> bool) -> Decision {
        if let Some(r) = &self.failed {
            return Decision::Reject(r.clone());
        }
        let rank = reg.rank;
        if reg.nranks == 0 || rank >= reg.nranks {
            let msg = format!("rank {rank} is out of range for nranks {}", reg.nranks);
            return Decision::Reject(Reply::Error(ReplyError::Argument, msg));
        }
        match self.nranks {
            Some((n, first)) if n != reg.nranks => {
                let msg = format!(
                    "ranks disagree on nranks: rank {first} says {n}, rank {rank} says {}",
                    reg.nranks
                );
                return self.fail(msg);
            }
            Some(_) => {}
            None => self.nranks = Some((reg.nranks, rank)),
        }
        if let Some(old) = self.slots.get(&rank) {
            if !closed(rank) {
                let msg = format!(
                    "rank {rank} was claimed twice (pid {} on {} at {}, and pid {} on {} at {})",
                    old.info.pid,
                    old.info.host,
                    old.info.addr,
                    reg.info.pid,
                    reg.info.host,
                    reg.info.addr
                );
                return self.fail(msg);
            }
        }
        let n = reg.nranks;
        self.slots.insert(rank, reg);
        if self.slots.len() as u32 == n {
            let table = self.slots.values().map(|r| r.info.clone()).collect();
            return Decision::Complete(Reply::Table(table));
        }
        Decision::Wait
    }

    fn fail(&mut self, msg: String) -> Decision {
        let r = Reply::Error(ReplyError::Usage, msg);
        self.failed = Some(r.clone());
        self.slots.clear();
        Decision::FailAll(r)
    }

    /// The reply for waiting ranks when the root gives up after `idle` without progress.
    pub(super) fn idle_reply(&self, addr: SocketAddr, idle: Duration) -> Reply {
        let msg = match self.nranks {
            Some((n, _)) => format!(
                "the job never formed: {} of {n} ranks registered with the root at {addr} within {idle:?}",
                self.slots.len()
            ),
            None => format!("no rank registered with the root at {addr} within {idle:?}"),
        };
        Reply::Error(ReplyError::Timeout, msg)
    }
}

fn run(listener: TcpListener, addr: SocketAddr, magic: u64, idle: Duration) {
    let (tx, rx) = mpsc::channel::<(TcpStream, Registration)>();
    let inflight = Arc::new(AtomicUsize::new(0));
    let mut state = RootState::default();
    let mut streams: BTreeMap<u32, TcpStream> = BTreeMap::new();
    let mut last_progress = Instant::now();
    loop {
        loop {
            match listener.accept() {
                Ok((stream, from)) => {
                    if inflight.load(Ordering::Acquire) >= MAX_INFLIGHT {
                        tracing::warn!(target: T, %from, "bootstrap root: too many pending connections, dropping one");
                        continue;
                    }
                    inflight.fetch_add(1, Ordering::AcqRel);
                    let tx = tx.clone();
                    let inflight2 = Arc::clone(&inflight);
                    let spawned = std::thread::Builder::new()
                        .name("ccl-bootstrap-root-conn".into())
                        .spawn(move || {
                            if let Some(r) = read_registration(stream, from, magic) {
                                let _ = tx.send(r);
                            }
                            inflight2.fetch_sub(1, Ordering::AcqRel);
                        });
                    if let Err(e) = spawned {
                        inflight.fetch_sub(1, Ordering::AcqRel);
                        tracing::warn!(target: T, error = %e, "bootstrap root: cannot spawn reader");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(target: T, error = %e, "bootstrap root: accept failed");
                    break;
                }
            }
        }
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok((mut stream, reg)) => {
                last_progress = Instant::now();
                let rank = reg.rank;
                let nranks = reg.nranks;
                let peer = reg.info.addr;
                let closed = |r: u32| streams.get(&r).is_none_or(is_closed);
                match state.register(reg, &closed) {
                    Decision::Wait => {
                        tracing::debug!(target: T, rank, nranks, %peer, "bootstrap root: registered");
                        if streams.insert(rank, stream).is_some() {
                            tracing::warn!(target: T, rank, "bootstrap root: replaced a registration whose connection closed");
                        }
                    }
                    Decision::Reject(r) => reply(&mut stream, magic, &r, rank),
                    Decision::FailAll(r) => {
                        if let Reply::Error(_, m) = &r {
                            tracing::warn!(target: T, rank, "bootstrap root: {m}");
                        }
                        reply(&mut stream, magic, &r, rank);
                        for (rk, s) in streams.iter_mut() {
                            reply(s, magic, &r, *rk);
                        }
                        streams.clear();
                    }
                    Decision::Complete(r) => {
                        streams.insert(rank, stream);
                        let order = match &r {
                            Reply::Table(t) => {
                                delivery_order(t, (std::process::id(), super::host_identity().1))
                            }
                            Reply::Error(..) => streams.keys().copied().collect(),
                        };
                        for rk in order {
                            if let Some(s) = streams.get_mut(&rk) {
                                reply(s, magic, &r, rk);
                            }
                        }
                        tracing::info!(target: T, %addr, nranks, "bootstrap root: job formed, root exits");
                        return;
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if last_progress.elapsed() >= idle {
            let r = state.idle_reply(addr, idle);
            if let Reply::Error(_, m) = &r {
                tracing::warn!(target: T, "bootstrap root: {m}; exiting");
            }
            for (rk, s) in streams.iter_mut() {
                reply(s, magic, &r, *rk);
            }
            return;
        }
    }
}

/// The ranks of `table` in the order the root sends them the table: ranks of other
/// processes first, ranks of the root's own process (`own` = pid, host hash) last. A rank
/// in the root's process may fail right after reading the table (ranks on two hosts, on
/// the host backend) and end the process, root thread included; the other ranks must have
/// their table by then, or they see the root vanish instead of the reason.
pub(super) fn delivery_order(table: &[PeerInfo], own: (u32, u64)) -> Vec<u32> {
    let (mut others, mut mine): (Vec<u32>, Vec<u32>) = (Vec::new(), Vec::new());
    for (r, p) in table.iter().enumerate() {
        if (p.pid, p.host_hash) == own {
            mine.push(r as u32);
        } else {
            others.push(r as u32);
        }
    }
    others.extend(mine);
    others
}

/// Reads and validates one registration; `None` (after a warning) for anything else.
fn read_registration(
    mut stream: TcpStream,
    from: SocketAddr,
    magic: u64,
) -> Option<(TcpStream, Registration)> {
    if let Err(e) = prepare(&stream) {
        tracing::warn!(target: T, %from, error = %e, "bootstrap root: cannot configure connection");
        return None;
    }
    let deadline = Instant::now() + REGISTER_DEADLINE;
    let stop = || {
        if Instant::now() >= deadline {
            Err(CclError::Timeout("registration".into()))
        } else {
            Ok(())
        }
    };
    let mut hb = [0u8; HEADER_BYTES];
    let describe = |e: ReadFail| match e {
        ReadFail::Eof { got } => format!("connection closed after {got} bytes"),
        ReadFail::Io(e) => e.to_string(),
        ReadFail::Stop(_) => format!("nothing complete within {REGISTER_DEADLINE:?}"),
    };
    if let Err(e) = read_full(&mut stream, &mut hb, &stop) {
        tracing::warn!(target: T, %from, "bootstrap root: dropping connection: truncated header ({})", describe(e));
        return None;
    }
    let h = Header::decode(&hb);
    if h.magic != magic {
        tracing::warn!(target: T, %from, magic = format_args!("{:#018x}", h.magic), "bootstrap root: dropping connection with wrong magic");
        return None;
    }
    if h.ty != TYPE_REGISTER {
        tracing::warn!(target: T, %from, ty = h.ty, "bootstrap root: dropping connection of unexpected type");
        return None;
    }
    if h.len > MAX_REGISTER_BODY {
        tracing::warn!(target: T, %from, len = h.len, "bootstrap root: dropping oversized registration");
        return None;
    }
    let mut body = vec![0u8; h.len as usize];
    if let Err(e) = read_full(&mut stream, &mut body, &stop) {
        tracing::warn!(target: T, %from, "bootstrap root: dropping connection: truncated registration ({})", describe(e));
        return None;
    }
    match Registration::decode(&body) {
        Some(r) => Some((stream, r)),
        None => {
            tracing::warn!(target: T, %from, "bootstrap root: dropping malformed registration");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::wire::PeerInfo;

    fn reg(nranks: u32, rank: u32, pid: u32) -> Registration {
        Registration {
            nranks,
            rank,
            info: PeerInfo {
                addr: format!("127.0.0.1:{}", 2000 + rank).parse().unwrap(),
                pid,
                host_hash: 1,
                machine_hash: 1,
                host: "h".into(),
            },
        }
    }

    const OPEN: &dyn Fn(u32) -> bool = &|_| false;
    const CLOSED: &dyn Fn(u32) -> bool = &|_| true;

    fn usage(d: &Decision) -> &str {
        match d {
            Decision::FailAll(Reply::Error(ReplyError::Usage, m)) => m,
            Decision::Reject(Reply::Error(ReplyError::Usage, m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn forms_in_any_order_with_table_in_rank_order() {
        for order in [[0u32, 1, 2], [2, 0, 1], [1, 2, 0]] {
            let mut s = RootState::default();
            for (i, &r) in order.iter().enumerate() {
                let d = s.register(reg(3, r, 10 + r), OPEN);
                if i < 2 {
                    assert_eq!(d, Decision::Wait);
                } else {
                    let Decision::Complete(Reply::Table(t)) = d else {
                        panic!("{d:?}")
                    };
                    assert_eq!(
                        t.iter().map(|p| p.pid).collect::<Vec<_>>(),
                        vec![10, 11, 12]
                    );
                }
            }
        }
        let mut s = RootState::default();
        assert!(matches!(
            s.register(reg(1, 0, 1), OPEN),
            Decision::Complete(_)
        ));
    }

    #[test]
    fn duplicate_claim_fails_the_job_and_later_arrivals() {
        let mut s = RootState::default();
        assert_eq!(s.register(reg(3, 1, 5), OPEN), Decision::Wait);
        assert_eq!(s.register(reg(3, 0, 6), OPEN), Decision::Wait);
        let d = s.register(reg(3, 1, 7), OPEN);
        assert!(matches!(d, Decision::FailAll(_)));
        let m = usage(&d).to_string();
        assert!(
            m.contains("rank 1 was claimed twice") && m.contains("pid 5") && m.contains("pid 7"),
            "{m}"
        );
        // The job is dead: a latecomer gets the same error instead of waiting forever.
        let late = s.register(reg(3, 2, 8), OPEN);
        assert_eq!(late, Decision::Reject(Reply::Error(ReplyError::Usage, m)));
    }

    #[test]
    fn a_closed_previous_claim_is_replaced() {
        let mut s = RootState::default();
        assert_eq!(s.register(reg(2, 1, 5), OPEN), Decision::Wait);
        assert_eq!(s.register(reg(2, 1, 6), CLOSED), Decision::Wait);
        let Decision::Complete(Reply::Table(t)) = s.register(reg(2, 0, 4), OPEN) else {
            panic!()
        };
        assert_eq!(t[1].pid, 6);
    }

    #[test]
    fn nranks_disagreement_and_bad_rank() {
        let mut s = RootState::default();
        assert_eq!(s.register(reg(4, 0, 1), OPEN), Decision::Wait);
        assert!(matches!(
            s.register(reg(4, 4, 1), OPEN),
            Decision::Reject(Reply::Error(ReplyError::Argument, _))
        ));
        assert!(matches!(
            s.register(reg(0, 0, 1), OPEN),
            Decision::Reject(Reply::Error(ReplyError::Argument, _))
        ));
        let d = s.register(reg(3, 1, 1), OPEN);
        assert!(matches!(d, Decision::FailAll(_)));
        assert!(
            usage(&d).contains("rank 0 says 4, rank 1 says 3"),
            "{}",
            usage(&d)
        );
    }

    #[test]
    fn the_roots_own_process_gets_the_table_last() {
        let p = |pid: u32, host_hash: u64| PeerInfo {
            addr: "127.0.0.1:1".parse().unwrap(),
            pid,
            host_hash,
            machine_hash: 1,
            host: "h".into(),
        };
        // Ranks 0 and 2 share the root's process; rank 1 is another process on the same
        // host, rank 3 the same pid on another host.
        let t = [p(10, 7), p(11, 7), p(10, 7), p(10, 8)];
        assert_eq!(delivery_order(&t, (10, 7)), vec![1, 3, 0, 2]);
        // The root in none of them (a standalone root): rank order.
        assert_eq!(delivery_order(&t, (99, 7)), vec![0, 1, 2, 3]);
    }

    #[test]
    fn idle_reply_counts_registrations() {
        let mut s = RootState::default();
        let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let Reply::Error(ReplyError::Timeout, m) = s.idle_reply(a, Duration::from_secs(3)) else {
            panic!()
        };
        assert!(m.contains("no rank registered"), "{m}");
        s.register(reg(5, 2, 1), OPEN);
        let Reply::Error(ReplyError::Timeout, m) = s.idle_reply(a, Duration::from_secs(3)) else {
            panic!()
        };
        assert!(m.contains("1 of 5 ranks"), "{m}");
    }
}
