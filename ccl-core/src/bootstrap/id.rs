//! The 128-byte unique id: layout, validation, `NCCL_COMM_ID` parsing and hashing.
//! Pure code (no sockets, no clocks) except [`random_nonce`].
//!
//! Layout (little-endian integers, Linux `sockaddr` layout for the address):
//!
//! | bytes    | field                                                            |
//! |----------|------------------------------------------------------------------|
//! | 0..8     | magic: [`ID_MAGIC`] (from `ncclGetUniqueId`) or [`COMM_ID_MAGIC`] |
//! | 8..36    | root address as `sockaddr_in` / `sockaddr_in6` (28 bytes)         |
//! | 36..40   | nranks (`i32`, 0 = not known when the id was made)               |
//! | 40..56   | random nonce (all zero for `NCCL_COMM_ID` ids)                   |
//! | 56..120  | zero                                                             |
//! | 120..128 | checksum: [`hash64`] of bytes 0..120                             |

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::error::{CclError, Result};

/// Bytes in an `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// Magic of ids made by [`super::get_unique_id`] ("CCLDBTS1").
pub const ID_MAGIC: u64 = 0x4343_4c44_4254_5331;
/// Fixed magic of ids built from `NCCL_COMM_ID` (NVIDIA's value).
pub const COMM_ID_MAGIC: u64 = 0x0280_0280_0280_0280;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
pub(crate) const SOCKADDR_BYTES: usize = 28;
const ADDR_AT: usize = 8;
const NRANKS_AT: usize = 36;
const NONCE_AT: usize = 40;
const NONCE_BYTES: usize = 16;
const SUM_AT: usize = 120;

/// `ncclUniqueId`: opaque 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({:02x?}..)", &self.0[..16])
    }
}

/// How an id was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdKind {
    /// By `ncclGetUniqueId`: a root listener already runs in the process that made it.
    Root,
    /// From `NCCL_COMM_ID`: rank 0 starts the root inside init.
    CommId,
}

/// The decoded content of a valid id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdInfo {
    /// How the id was made.
    pub kind: IdKind,
    /// Where the root listens.
    pub root: SocketAddr,
    /// nranks stored in the id (0 = unknown).
    pub nranks: u32,
}

impl UniqueId {
    /// Decodes and validates the id (magic, checksum, address).
    pub fn info(&self) -> Result<IdInfo> {
        parse_id(self)
    }

    /// The root's socket address, after validating the id.
    pub fn root_addr(&self) -> Result<SocketAddr> {
        Ok(parse_id(self)?.root)
    }
}

/// 64-bit hash (FNV-1a with a splitmix64 finaliser). Stable across processes and builds:
/// it names communicators on the wire.
pub fn hash64(seed: u64, bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// splitmix64 finaliser.
pub(super) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Writes `addr` as a Linux `sockaddr_in`/`sockaddr_in6` into 28 bytes.
pub(crate) fn encode_sockaddr(addr: &SocketAddr, out: &mut [u8; SOCKADDR_BYTES]) {
    *out = [0; SOCKADDR_BYTES];
    match addr {
        SocketAddr::V4(a) => {
            out[0..2].copy_from_slice(&AF_INET.to_le_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..8].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            out[0..2].copy_from_slice(&AF_INET6.to_le_bytes());
            out[2..4].copy_from_slice(&a.port().to_be_bytes());
            out[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            out[8..24].copy_from_slice(&a.ip().octets());
            out[24..28].copy_from_slice(&a.scope_id().to_le_bytes());
        }
    }
}

/// Reads a `sockaddr` written by [`encode_sockaddr`]; `None` for an unknown family, port 0
/// or an unspecified address.
pub(crate) fn decode_sockaddr(b: &[u8; SOCKADDR_BYTES]) -> Option<SocketAddr> {
    let family = u16::from_le_bytes([b[0], b[1]]);
    let port = u16::from_be_bytes([b[2], b[3]]);
    if port == 0 {
        return None;
    }
    let addr = match family {
        AF_INET => {
            if b[8..].iter().any(|&x| x != 0) {
                return None;
            }
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            SocketAddr::V4(SocketAddrV4::new(ip, port))
        }
        AF_INET6 => {
            let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            let mut oct = [0u8; 16];
            oct.copy_from_slice(&b[8..24]);
            let scope = u32::from_le_bytes([b[24], b[25], b[26], b[27]]);
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(oct), port, flow, scope))
        }
        _ => return None,
    };
    if addr.ip().is_unspecified() {
        return None;
    }
    Some(addr)
}

/// Builds a valid id. `nonce` is all zero for `NCCL_COMM_ID` ids so every rank builds the
/// same bytes from the same string.
pub fn build_id(kind: IdKind, root: SocketAddr, nranks: u32, nonce: [u8; 16]) -> UniqueId {
    let mut b = [0u8; UNIQUE_ID_BYTES];
    let magic = match kind {
        IdKind::Root => ID_MAGIC,
        IdKind::CommId => COMM_ID_MAGIC,
    };
    b[0..8].copy_from_slice(&magic.to_le_bytes());
    let mut sa = [0u8; SOCKADDR_BYTES];
    encode_sockaddr(&root, &mut sa);
    b[ADDR_AT..ADDR_AT + SOCKADDR_BYTES].copy_from_slice(&sa);
    b[NRANKS_AT..NRANKS_AT + 4].copy_from_slice(&nranks.to_le_bytes());
    b[NONCE_AT..NONCE_AT + NONCE_BYTES].copy_from_slice(&nonce);
    let sum = hash64(0, &b[..SUM_AT]);
    b[SUM_AT..].copy_from_slice(&sum.to_le_bytes());
    UniqueId(b)
}

fn invalid(why: &str) -> CclError {
    CclError::arg(format!(
        "unique id is not valid ({why}); pass the bytes returned by ncclGetUniqueId unchanged"
    ))
}

/// Validates and decodes an id. Never touches the network.
pub fn parse_id(id: &UniqueId) -> Result<IdInfo> {
    let b = &id.0;
    let mut m = [0u8; 8];
    m.copy_from_slice(&b[0..8]);
    let kind = match u64::from_le_bytes(m) {
        ID_MAGIC => IdKind::Root,
        COMM_ID_MAGIC => IdKind::CommId,
        other => return Err(invalid(&format!("bad magic {other:#018x}"))),
    };
    let mut s = [0u8; 8];
    s.copy_from_slice(&b[SUM_AT..]);
    if u64::from_le_bytes(s) != hash64(0, &b[..SUM_AT]) {
        return Err(invalid("checksum mismatch"));
    }
    if b[NONCE_AT + NONCE_BYTES..SUM_AT].iter().any(|&x| x != 0) {
        return Err(invalid("reserved bytes are not zero"));
    }
    let mut sa = [0u8; SOCKADDR_BYTES];
    sa.copy_from_slice(&b[ADDR_AT..ADDR_AT + SOCKADDR_BYTES]);
    let root = decode_sockaddr(&sa).ok_or_else(|| invalid("bad root socket address"))?;
    let mut n = [0u8; 4];
    n.copy_from_slice(&b[NRANKS_AT..NRANKS_AT + 4]);
    Ok(IdInfo {
        kind,
        root,
        nranks: u32::from_le_bytes(n),
    })
}

/// Parses the value of `NCCL_COMM_ID`: `host:port`, `a.b.c.d:port` or `[v6]:port`. A host
/// name is resolved (first address wins); the port must be non-zero.
pub fn parse_comm_id(value: &str) -> Result<SocketAddr> {
    let v = value.trim();
    let bad = |why: &str| CclError::arg(format!("NCCL_COMM_ID={value:?}: {why}"));
    if let Ok(a) = v.parse::<SocketAddr>() {
        if a.port() == 0 {
            return Err(bad("port must not be 0"));
        }
        if a.ip().is_unspecified() {
            return Err(bad("address must not be unspecified (0.0.0.0 / ::)"));
        }
        return Ok(a);
    }
    let (host, port) = v
        .rsplit_once(':')
        .ok_or_else(|| bad("expected host:port or [v6]:port"))?;
    if host.is_empty() || host.contains(':') || host.starts_with('[') {
        return Err(bad("expected host:port or [v6]:port"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| bad("port is not a number in 1..65535"))?;
    if port == 0 {
        return Err(bad("port must not be 0"));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    use std::net::ToSocketAddrs;
    let mut addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| bad(&format!("cannot resolve host {host:?}: {e}")))?;
    // A numeric form the resolver accepts but Rust does not parse ("0", "0x0") can still
    // mean 0.0.0.0, which no rank can connect to.
    addrs.find(|a| !a.ip().is_unspecified()).ok_or_else(|| {
        bad(&format!(
            "host {host:?} has no address (or only the unspecified 0.0.0.0 / ::)"
        ))
    })
}

/// 16 random bytes from the OS (`/dev/urandom`); falls back to hashing the std random
/// hasher keys, the clock, the pid and a counter.
pub(crate) fn random_nonce() -> [u8; 16] {
    use std::io::Read;
    let mut out = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if f.read_exact(&mut out).is_ok() && out.iter().any(|&x| x != 0) {
            return out;
        }
    }
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(now);
        h.write_u32(std::process::id());
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn round_trip_v4_and_v6() {
        for a in [
            v4("127.0.0.1:4567"),
            v4("10.1.2.3:1"),
            "[::1]:65535".parse().unwrap(),
            SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 99, 7, 3)),
        ] {
            let id = build_id(IdKind::Root, a, 0, [7; 16]);
            let info = parse_id(&id).unwrap();
            assert_eq!(info.root, a);
            assert_eq!(info.kind, IdKind::Root);
            assert_eq!(info.nranks, 0);
        }
        let id = build_id(IdKind::CommId, v4("1.2.3.4:5"), 9, [0; 16]);
        assert_eq!(parse_id(&id).unwrap().kind, IdKind::CommId);
        assert_eq!(parse_id(&id).unwrap().nranks, 9);
        assert_eq!(&id.0[0..8], &COMM_ID_MAGIC.to_le_bytes());
    }

    #[test]
    fn sockaddr_layout_matches_linux() {
        let mut sa = [0u8; SOCKADDR_BYTES];
        encode_sockaddr(&v4("192.168.1.2:8080"), &mut sa);
        assert_eq!(&sa[..8], &[2, 0, 0x1f, 0x90, 192, 168, 1, 2]);
    }

    #[test]
    fn rejects_random_and_corrupted_ids() {
        let mut x: u64 = 0x1234_5678;
        for _ in 0..1000 {
            let mut b = [0u8; UNIQUE_ID_BYTES];
            for byte in b.iter_mut() {
                x = mix64(x.wrapping_add(1));
                *byte = x as u8;
            }
            let e = parse_id(&UniqueId(b)).unwrap_err();
            assert!(matches!(e, CclError::InvalidArgument(_)), "{e}");
            assert!(e.to_string().contains("unique id is not valid"), "{e}");
        }
        assert!(parse_id(&UniqueId([0; UNIQUE_ID_BYTES])).is_err());
        let good = build_id(IdKind::Root, v4("127.0.0.1:9"), 0, [1; 16]);
        for i in 0..UNIQUE_ID_BYTES {
            let mut b = good;
            b.0[i] ^= 0x40;
            assert!(parse_id(&b).is_err(), "flipping byte {i} went unnoticed");
        }
    }

    #[test]
    fn rejects_bad_addresses_even_with_valid_checksum() {
        for a in [v4("0.0.0.0:5"), "[::]:5".parse().unwrap()] {
            let id = build_id(IdKind::Root, a, 0, [1; 16]);
            assert!(parse_id(&id).is_err());
        }
    }

    #[test]
    fn comm_id_parsing() {
        assert_eq!(
            parse_comm_id("127.0.0.1:1234").unwrap(),
            v4("127.0.0.1:1234")
        );
        assert_eq!(
            parse_comm_id(" [::1]:77 ").unwrap(),
            "[::1]:77".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(parse_comm_id("localhost:99").unwrap().port(), 99);
        for bad in [
            "",
            "1234",
            "host",
            "127.0.0.1:0",
            "127.0.0.1:x",
            "127.0.0.1:70000",
            "::1:5",
            "[::1]",
            "0.0.0.0:5",
            ":5",
        ] {
            let e = parse_comm_id(bad).unwrap_err();
            assert!(e.to_string().contains("NCCL_COMM_ID"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(random_nonce(), random_nonce());
    }

    #[test]
    fn hash_is_stable_and_seeded() {
        assert_eq!(hash64(0, b"abc"), hash64(0, b"abc"));
        assert_ne!(hash64(0, b"abc"), hash64(1, b"abc"));
        assert_ne!(hash64(0, b"abc"), hash64(0, b"abd"));
    }
}
