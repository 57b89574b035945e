//! Wire formats of the bootstrap (pure encode/decode) and the abort/deadline-aware socket
//! read/write loops.
//!
//! Every connection starts with a 16-byte header `{u64 magic, u32 type, u32 body_len}`
//! (little-endian) followed by `body_len` bytes. The magic is per job (a hash of the unique
//! id), so a connection from another job or from junk is dropped at once.
//!
//! * `TYPE_REGISTER` (rank -> root): [`Registration`].
//! * `TYPE_REPLY` (root -> rank, on the same connection): [`Reply`].
//! * `TYPE_PEER` (rank -> rank): body `{u32 src_rank, u32 nranks}`, then a stream of frames
//!   `{u64 namespace, u32 src, u32 kind, u32 tag, u32 len}` + `len` payload bytes.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::id::{decode_sockaddr, encode_sockaddr, SOCKADDR_BYTES};
use crate::error::{CclError, Result};

pub(crate) const HEADER_BYTES: usize = 16;
pub(crate) const TYPE_REGISTER: u32 = 1;
pub(crate) const TYPE_REPLY: u32 = 2;
pub(crate) const TYPE_PEER: u32 = 3;
/// Largest registration body the root accepts.
pub(crate) const MAX_REGISTER_BODY: u32 = 4096;
/// Largest reply a rank accepts from the root.
pub(crate) const MAX_REPLY_BODY: u32 = 64 << 20;
/// Largest rank-to-rank frame payload (send() refuses larger).
pub const MAX_FRAME_PAYLOAD: usize = 256 << 20;
pub(crate) const FRAME_BYTES: usize = 24;
pub(crate) const MAX_HOST_BYTES: usize = 255;

/// Header of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub magic: u64,
    pub ty: u32,
    pub len: u32,
}

impl Header {
    pub(super) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..12].copy_from_slice(&self.ty.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    pub(super) fn decode(b: &[u8; HEADER_BYTES]) -> Header {
        let mut c = Cursor::new(b);
        // The slice has exactly HEADER_BYTES bytes, so these reads cannot fail.
        Header {
            magic: c.u64().unwrap_or(0),
            ty: c.u32().unwrap_or(0),
            len: c.u32().unwrap_or(0),
        }
    }
}

/// Header of one rank-to-rank message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub ns: u64,
    pub src: u32,
    pub kind: u32,
    pub tag: u32,
    pub len: u32,
}

impl Frame {
    pub(super) fn encode(&self) -> [u8; FRAME_BYTES] {
        let mut b = [0u8; FRAME_BYTES];
        b[0..8].copy_from_slice(&self.ns.to_le_bytes());
        b[8..12].copy_from_slice(&self.src.to_le_bytes());
        b[12..16].copy_from_slice(&self.kind.to_le_bytes());
        b[16..20].copy_from_slice(&self.tag.to_le_bytes());
        b[20..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }
    pub(super) fn decode(b: &[u8; FRAME_BYTES]) -> Frame {
        let mut c = Cursor::new(b);
        // Fixed-size input: the reads cannot fail.
        Frame {
            ns: c.u64().unwrap_or(0),
            src: c.u32().unwrap_or(0),
            kind: c.u32().unwrap_or(0),
            tag: c.u32().unwrap_or(0),
            len: c.u32().unwrap_or(0),
        }
    }
}

/// Bounds-checked little-endian reader.
pub(crate) struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(b: &'a [u8]) -> Self {
        Cursor { b, at: 0 }
    }
    pub(super) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    pub(super) fn u16(&mut self) -> Option<u16> {
        self.bytes(2).map(|s| u16::from_le_bytes([s[0], s[1]]))
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        self.bytes(4)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    pub(super) fn u64(&mut self) -> Option<u64> {
        let s = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Some(u64::from_le_bytes(a))
    }
    pub(super) fn addr(&mut self) -> Option<SocketAddr> {
        let s = self.bytes(SOCKADDR_BYTES)?;
        let mut a = [0u8; SOCKADDR_BYTES];
        a.copy_from_slice(s);
        decode_sockaddr(&a)
    }
    pub(super) fn string(&mut self) -> Option<String> {
        let n = self.u16()? as usize;
        let s = self.bytes(n)?;
        String::from_utf8(s.to_vec()).ok()
    }
    pub(super) fn done(&self) -> bool {
        self.at == self.b.len()
    }
}

fn put_addr(out: &mut Vec<u8>, a: &SocketAddr) {
    let mut sa = [0u8; SOCKADDR_BYTES];
    encode_sockaddr(a, &mut sa);
    out.extend_from_slice(&sa);
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    // Truncate on a char boundary so the u16 length always fits.
    let mut end = s.len().min(MAX_HOST_BYTES);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..end]);
}

/// What each rank tells the root, and what the root hands back to everyone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// Where this rank's bootstrap listener accepts peer connections.
    pub addr: SocketAddr,
    /// Process id.
    pub pid: u32,
    /// Hash of host name + boot id: equal for ranks on the same host.
    pub host_hash: u64,
    /// Hash of the boot id alone: equal for ranks on one running kernel, which share its
    /// CPUs even where their host hashes differ (containers, network namespaces with
    /// host names of their own, `NCCL_HOSTID`).
    pub machine_hash: u64,
    /// Host name (for logs and diagnostics).
    pub host: String,
}

fn put_peer(out: &mut Vec<u8>, p: &PeerInfo) {
    put_addr(out, &p.addr);
    out.extend_from_slice(&p.pid.to_le_bytes());
    out.extend_from_slice(&p.host_hash.to_le_bytes());
    out.extend_from_slice(&p.machine_hash.to_le_bytes());
    put_string(out, &p.host);
}

fn get_peer(c: &mut Cursor<'_>) -> Option<PeerInfo> {
    Some(PeerInfo {
        addr: c.addr()?,
        pid: c.u32()?,
        host_hash: c.u64()?,
        machine_hash: c.u64()?,
        host: c.string()?,
    })
}

/// A rank's registration with the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Registration {
    pub nranks: u32,
    pub rank: u32,
    pub info: PeerInfo,
}

impl Registration {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(&self.nranks.to_le_bytes());
        out.extend_from_slice(&self.rank.to_le_bytes());
        put_peer(&mut out, &self.info);
        out
    }
    pub(super) fn decode(b: &[u8]) -> Option<Registration> {
        let mut c = Cursor::new(b);
        let r = Registration {
            nranks: c.u32()?,
            rank: c.u32()?,
            info: get_peer(&mut c)?,
        };
        c.done().then_some(r)
    }
}

/// Error class carried in a root reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReplyError {
    Usage = 1,
    Argument = 2,
    Timeout = 3,
}

/// The root's answer to a registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Table(Vec<PeerInfo>),
    Error(ReplyError, String),
}

impl Reply {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Reply::Table(peers) => {
                out.extend_from_slice(&0u32.to_le_bytes());
                out.extend_from_slice(&(peers.len() as u32).to_le_bytes());
                for p in peers {
                    put_peer(&mut out, p);
                }
            }
            Reply::Error(kind, msg) => {
                out.extend_from_slice(&(*kind as u32).to_le_bytes());
                let mut end = msg.len().min(60_000);
                while !msg.is_char_boundary(end) {
                    end -= 1;
                }
                out.extend_from_slice(&(end as u16).to_le_bytes());
                out.extend_from_slice(&msg.as_bytes()[..end]);
            }
        }
        out
    }
    pub(super) fn decode(b: &[u8]) -> Option<Reply> {
        let mut c = Cursor::new(b);
        let r = match c.u32()? {
            0 => {
                let n = c.u32()? as usize;
                // Each entry takes at least 42 bytes: reject absurd counts before allocating.
                if n > b.len() / 42 {
                    return None;
                }
                let mut peers = Vec::with_capacity(n);
                for _ in 0..n {
                    peers.push(get_peer(&mut c)?);
                }
                Reply::Table(peers)
            }
            1 => Reply::Error(ReplyError::Usage, c.string()?),
            2 => Reply::Error(ReplyError::Argument, c.string()?),
            3 => Reply::Error(ReplyError::Timeout, c.string()?),
            _ => return None,
        };
        c.done().then_some(r)
    }
}

/// When a blocking socket loop must give up.
pub(crate) struct Stop<'a> {
    pub abort: Option<&'a AtomicBool>,
    pub deadline: Option<Instant>,
    /// What the deadline error says, e.g. "waiting for the root's reply".
    pub what: &'a str,
}

impl Stop<'_> {
    pub(super) fn check(&self) -> Result<()> {
        if let Some(a) = self.abort {
            if a.load(Ordering::Acquire) {
                return Err(CclError::Aborted(format!(
                    "bootstrap aborted while {}",
                    self.what
                )));
            }
        }
        if let Some(d) = self.deadline {
            if Instant::now() >= d {
                return Err(CclError::Timeout(format!(
                    "bootstrap timed out while {}",
                    self.what
                )));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for ReadFail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadFail::Eof { got } => write!(f, "connection closed after {got} bytes"),
            ReadFail::Io(e) => write!(f, "{e}"),
            ReadFail::Stop(e) => write!(f, "{e}"),
        }
    }
}

/// Why [`read_full`] stopped early.
#[derive(Debug)]
pub(crate) enum ReadFail {
    /// The peer closed after `got` bytes of this read (0 = clean close at a boundary).
    Eof { got: usize },
    /// Socket error.
    Io(std::io::Error),
    /// Abort flag or deadline.
    Stop(CclError),
}

/// Slice used for socket read/write timeouts so abort flags are polled often.
pub(crate) const POLL_SLICE: Duration = Duration::from_millis(50);

/// Reads exactly `buf.len()` bytes. The stream must have a read timeout (POLL_SLICE) so the
/// `stop` condition is checked between slices without losing partial progress.
pub(crate) fn read_full(
    s: &mut TcpStream,
    buf: &mut [u8],
    stop: &dyn Fn() -> Result<()>,
) -> std::result::Result<(), ReadFail> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(ReadFail::Eof { got }),
            Ok(n) => got += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                stop().map_err(ReadFail::Stop)?
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadFail::Io(e)),
        }
    }
    Ok(())
}

/// Writes all of `buf`; the stream must have a write timeout (POLL_SLICE).
pub(crate) fn write_full(
    s: &mut TcpStream,
    buf: &[u8],
    stop: &dyn Fn() -> Result<()>,
) -> std::result::Result<(), ReadFail> {
    let mut put = 0;
    while put < buf.len() {
        match s.write(&buf[put..]) {
            Ok(0) => return Err(ReadFail::Eof { got: put }),
            Ok(n) => put += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                stop().map_err(ReadFail::Stop)?
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadFail::Io(e)),
        }
    }
    Ok(())
}

/// Sets the read/write poll slices and TCP_NODELAY on a fresh stream.
pub(crate) fn prepare(s: &TcpStream) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(POLL_SLICE))?;
    s.set_write_timeout(Some(POLL_SLICE))?;
    s.set_nodelay(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(i: u32) -> PeerInfo {
        PeerInfo {
            addr: format!("127.0.0.{}:{}", i + 1, 1000 + i).parse().unwrap(),
            pid: 100 + i,
            host_hash: 0xabc ^ u64::from(i),
            machine_hash: 0xdef,
            host: format!("host-{i}-é"),
        }
    }

    #[test]
    fn header_and_frame_round_trip() {
        let h = Header {
            magic: 0x1122334455667788,
            ty: 3,
            len: 99,
        };
        assert_eq!(Header::decode(&h.encode()), h);
        let f = Frame {
            ns: 7,
            src: 1,
            kind: 2,
            tag: u32::MAX,
            len: 5,
        };
        assert_eq!(Frame::decode(&f.encode()), f);
    }

    #[test]
    fn registration_round_trip_and_truncation() {
        let r = Registration {
            nranks: 8,
            rank: 3,
            info: peer(3),
        };
        let b = r.encode();
        assert_eq!(Registration::decode(&b), Some(r));
        for n in 0..b.len() {
            assert_eq!(Registration::decode(&b[..n]), None, "prefix {n}");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(Registration::decode(&longer), None);
    }

    #[test]
    fn reply_round_trip_and_truncation() {
        let t = Reply::Table((0..5).map(peer).collect());
        let b = t.encode();
        assert_eq!(Reply::decode(&b), Some(t));
        for n in 0..b.len() {
            assert_eq!(Reply::decode(&b[..n]), None, "prefix {n}");
        }
        let e = Reply::Error(ReplyError::Usage, "rank 1 claimed twice".into());
        assert_eq!(Reply::decode(&e.encode()), Some(e));
        // A huge count in a short body is rejected without allocating.
        let mut bad = 0u32.to_le_bytes().to_vec();
        bad.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Reply::decode(&bad), None);
        assert_eq!(Reply::decode(&[9, 0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn long_host_names_are_truncated_on_char_boundary() {
        let mut p = peer(0);
        p.host = "é".repeat(300);
        let r = Registration {
            nranks: 1,
            rank: 0,
            info: p,
        };
        let d = Registration::decode(&r.encode()).unwrap();
        assert!(d.info.host.len() <= MAX_HOST_BYTES);
        assert!(d.info.host.chars().all(|c| c == 'é'));
    }

    #[test]
    fn stop_reports_abort_then_deadline() {
        let a = AtomicBool::new(false);
        let s = Stop {
            abort: Some(&a),
            deadline: None,
            what: "x",
        };
        assert!(s.check().is_ok());
        a.store(true, Ordering::Release);
        assert!(matches!(s.check(), Err(CclError::Aborted(_))));
        let s = Stop {
            abort: None,
            deadline: Some(Instant::now()),
            what: "x",
        };
        assert!(matches!(s.check(), Err(CclError::Timeout(_))));
    }
}
