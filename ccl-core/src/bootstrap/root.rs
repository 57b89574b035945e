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
    prepare, read_full, write_full, Header, ReadFail, Registration, Reply, ReplyError,
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

struct Slot {
    stream: TcpStream,
    reg: Registration,
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

fn fail_all(slots: &mut BTreeMap<u32, Slot>, magic: u64, r: &Reply) {
    for (rank, s) in slots.iter_mut() {
        reply(&mut s.stream, magic, r, *rank);
    }
    slots.clear();
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

fn run(listener: TcpListener, addr: SocketAddr, magic: u64, idle: Duration) {
    let (tx, rx) = mpsc::channel::<(TcpStream, Registration)>();
    let inflight = Arc::new(AtomicUsize::new(0));
    let mut slots: BTreeMap<u32, Slot> = BTreeMap::new();
    let mut nranks: Option<(u32, u32)> = None; // (nranks, first rank that said so)
    let mut failed: Option<Reply> = None;
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
                if let Some(r) = &failed {
                    reply(&mut stream, magic, r, rank);
                    continue;
                }
                if reg.rank >= reg.nranks {
                    let msg = format!(
                        "rank {} is out of range for nranks {}",
                        reg.rank, reg.nranks
                    );
                    reply(
                        &mut stream,
                        magic,
                        &Reply::Error(ReplyError::Argument, msg),
                        rank,
                    );
                    continue;
                }
                match nranks {
                    None => nranks = Some((reg.nranks, reg.rank)),
                    Some((n, first)) if n != reg.nranks => {
                        let msg = format!(
                            "ranks disagree on nranks: rank {first} says {n}, rank {rank} says {}",
                            reg.nranks
                        );
                        tracing::warn!(target: T, "bootstrap root: {msg}");
                        let r = Reply::Error(ReplyError::Usage, msg);
                        reply(&mut stream, magic, &r, rank);
                        fail_all(&mut slots, magic, &r);
                        failed = Some(r);
                        continue;
                    }
                    Some(_) => {}
                }
                if let Some(old) = slots.get(&rank) {
                    if is_closed(&old.stream) {
                        tracing::warn!(target: T, rank, "bootstrap root: replacing a registration whose connection closed");
                        slots.remove(&rank);
                    } else {
                        let msg = format!(
                            "rank {rank} was claimed twice (pid {} on {} at {}, and pid {} on {} at {})",
                            old.reg.info.pid,
                            old.reg.info.host,
                            old.reg.info.addr,
                            reg.info.pid,
                            reg.info.host,
                            reg.info.addr
                        );
                        tracing::warn!(target: T, rank, "bootstrap root: {msg}");
                        let r = Reply::Error(ReplyError::Usage, msg);
                        reply(&mut stream, magic, &r, rank);
                        fail_all(&mut slots, magic, &r);
                        failed = Some(r);
                        continue;
                    }
                }
                tracing::debug!(target: T, rank, nranks = reg.nranks, peer = %reg.info.addr, "bootstrap root: registered");
                let n = reg.nranks;
                slots.insert(rank, Slot { stream, reg });
                if slots.len() as u32 == n {
                    let table: Vec<_> = slots.values().map(|s| s.reg.info.clone()).collect();
                    let r = Reply::Table(table);
                    for (rank, s) in slots.iter_mut() {
                        reply(&mut s.stream, magic, &r, *rank);
                    }
                    tracing::info!(target: T, %addr, nranks = n, "bootstrap root: job formed, root exits");
                    return;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if last_progress.elapsed() >= idle {
            let have = slots.len();
            let msg = match nranks {
                Some((n, _)) => format!(
                    "the job never formed: {have} of {n} ranks registered with the root at {addr} within {idle:?}"
                ),
                None => format!("no rank registered with the root at {addr} within {idle:?}"),
            };
            if failed.is_none() {
                tracing::warn!(target: T, "bootstrap root: {msg}; exiting");
            }
            fail_all(&mut slots, magic, &Reply::Error(ReplyError::Timeout, msg));
            return;
        }
    }
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
