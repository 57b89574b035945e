//! Wire format of the socket transport. Pure code: bytes in, values or errors out.
//!
//! A connection joins two ranks of one communicator for one [`StreamId`]. The rank that
//! connects (the lower of the pair) first sends a [`Hello`] (48 bytes):
//!
//! | bytes  | field                                                   |
//! |--------|---------------------------------------------------------|
//! | 0..8   | magic [`HELLO_MAGIC`] ("CCLDSOK1")                       |
//! | 8..12  | version ([`VERSION`])                                   |
//! | 12..16 | stream id                                               |
//! | 16..24 | communicator hash                                       |
//! | 24..28 | sender's rank                                           |
//! | 28..32 | receiver's rank                                         |
//! | 32..48 | the communicator's secret (agreed at bootstrap)         |
//!
//! Then each direction carries the frames of its stream, little-endian:
//! - a data stream (one channel of a ring, Tree or p2p link): a [`DataHeader`] of 32 bytes
//!   (payload length, [`DATA_TAG`], the three descriptor words of the FIFO message), then
//!   the payload; and, the other way, credit frames (32 bytes: a count, a tag, zeros) for
//!   the messages the receiver consumed ([`StreamFrame`]). A data stream may run over
//!   several sockets (`NCCL_SOCKET_NTHREADS` x `NCCL_NSOCKS_PERTHREAD`): socket 0 carries
//!   the headers, the credits and the first piece of each payload, socket `j` the payload's
//!   piece `j` ([`stripe`]), raw; each socket's hello names its index ([`StreamId::socket`]);
//! - the control stream (one per pair of ranks): [`Control`] frames of 32 bytes (kind,
//!   [`CONTROL_TAG`], three value words).
//!
//! Every field is checked on receipt: a wrong magic, tag, version, communicator, rank or
//! secret, or a length over the receiving slot, is an error naming what was wrong, and the
//! connection is dropped.

use crate::transport::shm::FifoLayout;

/// Magic of a [`Hello`] ("CCLDSOK1").
pub(crate) const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"CCLDSOK1");
/// Version of this wire format (2: striped streams, 32-byte control frames with the
/// current-collective query).
pub(crate) const VERSION: u32 = 2;
/// Bytes of a [`Hello`].
pub(crate) const HELLO_BYTES: usize = 48;
/// Bytes of a [`DataHeader`].
pub(crate) const DATA_HEADER_BYTES: usize = 32;
/// Second word of every [`DataHeader`].
pub(crate) const DATA_TAG: u32 = 0xDA7A_C01D;
/// Bytes of a [`Control`] frame.
pub(crate) const CONTROL_BYTES: usize = 32;
/// Second word of every [`Control`] frame.
const CONTROL_TAG: u32 = 0xC0DE_C01D;
/// Bytes of the communicator's secret.
pub(crate) const SECRET_BYTES: usize = 16;

/// Which stream of a pair of ranks a connection carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StreamId(pub u32);

const KIND_SHIFT: u32 = 24;
/// Bits 16..24 of a stream id: the socket's index within its stream.
const SOCKET_SHIFT: u32 = 16;
const CHANNEL_MASK: u32 = (1 << SOCKET_SHIFT) - 1;
const RING: u32 = 1;
const TREE: u32 = 2;
const TREE_LL: u32 = 3;
const P2P: u32 = 4;

impl StreamId {
    /// The pair's control stream (poison words, goodbye, liveness).
    pub(crate) const CONTROL: StreamId = StreamId(0);

    /// Channel `c` of the ring link.
    pub(crate) fn ring(c: usize) -> StreamId {
        Self::of(RING, c)
    }

    /// Channel `c` of a Tree link (Simple protocol).
    pub(crate) fn tree(c: usize) -> StreamId {
        Self::of(TREE, c)
    }

    /// The LL FIFO of a Tree link.
    pub(crate) fn tree_ll() -> StreamId {
        Self::of(TREE_LL, 0)
    }

    /// Channel `c` of a p2p link.
    pub(crate) fn p2p(c: usize) -> StreamId {
        Self::of(P2P, c)
    }

    fn of(kind: u32, c: usize) -> StreamId {
        // Channels are at most 32 (Tuning's bound), far below 2^16.
        StreamId((kind << KIND_SHIFT) | (c as u32 & CHANNEL_MASK))
    }

    /// Socket `j` (`j < MAX_SOCKETS`) of this data stream; socket 0 is the stream itself.
    pub(crate) fn socket(self, j: usize) -> StreamId {
        StreamId((self.0 & !(0xff << SOCKET_SHIFT)) | ((j as u32 & 0xff) << SOCKET_SHIFT))
    }

    /// This connection's index among its stream's sockets.
    pub(crate) fn socket_index(self) -> usize {
        ((self.0 >> SOCKET_SHIFT) & 0xff) as usize
    }

    /// Whether a peer may name this stream in its hello.
    pub(crate) fn is_known(self) -> bool {
        self == Self::CONTROL
            || ((RING..=P2P).contains(&(self.0 >> KIND_SHIFT)) && self.socket_index() < MAX_SOCKETS)
    }
}

/// Most sockets one data stream may use (NVIDIA's bound on
/// `NCCL_SOCKET_NTHREADS` x `NCCL_NSOCKS_PERTHREAD`).
pub(crate) const MAX_SOCKETS: usize = 64;

/// Smallest piece of a payload striped over several sockets (but the last): a payload of
/// at most this goes whole over socket 0 (NVIDIA's socket transport splits at the same
/// grain).
pub(crate) const STRIPE_MIN: usize = 64 * 1024;

/// The bytes of a `len`-byte payload that socket `j` of a `k`-socket stream carries (pure;
/// both ends compute it from the header's length). Pieces are `max(STRIPE_MIN, len / k)`
/// rounded up to a cache line, in socket order; sockets past the last piece carry nothing.
pub(crate) fn stripe(len: usize, k: usize, j: usize) -> std::ops::Range<usize> {
    if k <= 1 {
        return if j == 0 { 0..len } else { len..len };
    }
    let piece = len.div_ceil(k).max(STRIPE_MIN).next_multiple_of(64);
    let start = piece.saturating_mul(j).min(len);
    start..start.saturating_add(piece).min(len)
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.0 & CHANNEL_MASK;
        match self.0 >> KIND_SHIFT {
            0 => write!(f, "control"),
            RING => write!(f, "ring channel {c}"),
            TREE => write!(f, "tree channel {c}"),
            TREE_LL => write!(f, "tree LL"),
            P2P => write!(f, "p2p channel {c}"),
            k => write!(f, "unknown stream kind {k}"),
        }?;
        match self.socket_index() {
            0 => Ok(()),
            j => write!(f, " socket {j}"),
        }
    }
}

/// The first bytes of every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub stream: StreamId,
    pub comm_hash: u64,
    pub from: u32,
    pub to: u32,
    pub secret: [u8; SECRET_BYTES],
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.stream.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.comm_hash.to_le_bytes());
        b[24..28].copy_from_slice(&self.from.to_le_bytes());
        b[28..32].copy_from_slice(&self.to.to_le_bytes());
        b[32..48].copy_from_slice(&self.secret);
        b
    }

    /// Decodes a hello and checks it against what this rank expects: its communicator,
    /// itself as receiver, a sender among `nranks` other than itself, a known stream and
    /// the communicator's secret (compared in constant time).
    pub(crate) fn decode_checked(
        b: &[u8; HELLO_BYTES],
        comm_hash: u64,
        me: usize,
        nranks: usize,
        secret: &[u8; SECRET_BYTES],
    ) -> Result<Hello, String> {
        let magic = u64_at(b, 0);
        if magic != HELLO_MAGIC {
            return Err(format!(
                "not a ccld socket-transport hello (magic {magic:#018x})"
            ));
        }
        let version = u32_at(b, 8);
        if version != VERSION {
            return Err(format!(
                "socket-transport version {version}, this library speaks {VERSION}"
            ));
        }
        let mut s = [0u8; SECRET_BYTES];
        s.copy_from_slice(&b[32..48]);
        let h = Hello {
            stream: StreamId(u32_at(b, 12)),
            comm_hash: u64_at(b, 16),
            from: u32_at(b, 24),
            to: u32_at(b, 28),
            secret: s,
        };
        if !same_secret(&h.secret, secret) {
            return Err("wrong secret (not a rank of this job's communicator)".into());
        }
        if h.comm_hash != comm_hash {
            return Err(format!(
                "for communicator {:#018x}, this is {comm_hash:#018x}",
                h.comm_hash
            ));
        }
        if h.to as usize != me {
            return Err(format!("addressed to rank {}, this is rank {me}", h.to));
        }
        if h.from as usize >= nranks || h.from as usize == me {
            return Err(format!(
                "from rank {}, not a peer of rank {me} among {nranks} ranks",
                h.from
            ));
        }
        if !h.stream.is_known() {
            return Err(format!("unknown stream id {:#010x}", h.stream.0));
        }
        Ok(h)
    }
}

/// Constant-time comparison: a peer guessing the secret learns nothing from timing.
fn same_secret(a: &[u8; SECRET_BYTES], b: &[u8; SECRET_BYTES]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Header of one FIFO message on a data stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DataHeader {
    pub len: usize,
    pub desc: [u64; FifoLayout::DESC_WORDS],
}

impl DataHeader {
    pub(crate) fn encode(&self) -> [u8; DATA_HEADER_BYTES] {
        let mut b = [0u8; DATA_HEADER_BYTES];
        // Lengths are at most a FIFO slot (1 GiB bound), so they fit u32.
        b[0..4].copy_from_slice(&(self.len as u32).to_le_bytes());
        b[4..8].copy_from_slice(&DATA_TAG.to_le_bytes());
        for (i, d) in self.desc.iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&d.to_le_bytes());
        }
        b
    }

    /// Decodes a header whose payload must fit `max_len` bytes (the receiving slot).
    pub(crate) fn decode(b: &[u8; DATA_HEADER_BYTES], max_len: usize) -> Result<Self, String> {
        let tag = u32_at(b, 4);
        if tag != DATA_TAG {
            return Err(format!(
                "corrupt data frame (tag {tag:#010x}, expected {DATA_TAG:#010x})"
            ));
        }
        let len = u32_at(b, 0) as usize;
        if len > max_len {
            return Err(format!(
                "data frame of {len} bytes, the receiving slot holds {max_len}"
            ));
        }
        let mut desc = [0u64; FifoLayout::DESC_WORDS];
        for (i, d) in desc.iter_mut().enumerate() {
            *d = u64_at(b, 8 + 8 * i);
        }
        Ok(DataHeader { len, desc })
    }
}

/// Second word of a credit frame on a data stream.
const CREDIT_TAG: u32 = 0xC4ED_C01D;

/// What a data stream carries: FIFO messages one way, and credits the other way (the
/// receiver consumed that many messages, so the sender may free their slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamFrame {
    Data(DataHeader),
    Credit(u32),
}

impl StreamFrame {
    /// A credit frame for `n` consumed messages (at least 1).
    pub(crate) fn credit(n: u32) -> [u8; DATA_HEADER_BYTES] {
        let mut b = [0u8; DATA_HEADER_BYTES];
        b[0..4].copy_from_slice(&n.to_le_bytes());
        b[4..8].copy_from_slice(&CREDIT_TAG.to_le_bytes());
        b
    }

    /// Decodes a frame header: a data header whose payload fits `max_len` bytes, or a
    /// credit of 1..=`max_credit` messages.
    pub(crate) fn decode(
        b: &[u8; DATA_HEADER_BYTES],
        max_len: usize,
        max_credit: u32,
    ) -> Result<StreamFrame, String> {
        if u32_at(b, 4) != CREDIT_TAG {
            return DataHeader::decode(b, max_len).map(StreamFrame::Data);
        }
        let n = u32_at(b, 0);
        if n == 0 || n > max_credit || b[8..].iter().any(|x| *x != 0) {
            return Err(format!(
                "corrupt credit frame ({n} messages, at most {max_credit} outstanding)"
            ));
        }
        Ok(StreamFrame::Credit(n))
    }
}

/// A frame of the control stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Control {
    /// The sender detected an inconsistent call: store this poison value in the
    /// receiver's poison word (`desc::poison_value`).
    Poison(u64),
    /// The sender is closing the communicator: the connections that follow close cleanly.
    Bye,
    /// The sender waits long for the receiver: which collective is the receiver running?
    Query,
    /// The answer to a [`Control::Query`]: the sender's current-collective words as its
    /// executor published them (`executor_wait::publish_current`): word 0 is the
    /// collective's sequence number plus one, 0 when it runs none (or was rewriting them),
    /// then the descriptor's two other words.
    Current([u64; 3]),
}

const CONTROL_POISON: u32 = 1;
const CONTROL_BYE: u32 = 2;
const CONTROL_QUERY: u32 = 3;
const CONTROL_CURRENT: u32 = 4;

impl Control {
    pub(crate) fn encode(&self) -> [u8; CONTROL_BYTES] {
        let (kind, values) = match *self {
            Control::Poison(v) => (CONTROL_POISON, [v, 0, 0]),
            Control::Bye => (CONTROL_BYE, [0; 3]),
            Control::Query => (CONTROL_QUERY, [0; 3]),
            Control::Current(w) => (CONTROL_CURRENT, w),
        };
        let mut b = [0u8; CONTROL_BYTES];
        b[0..4].copy_from_slice(&kind.to_le_bytes());
        b[4..8].copy_from_slice(&CONTROL_TAG.to_le_bytes());
        for (i, v) in values.iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub(crate) fn decode(b: &[u8; CONTROL_BYTES]) -> Result<Control, String> {
        let tag = u32_at(b, 4);
        if tag != CONTROL_TAG {
            return Err(format!("corrupt control frame (tag {tag:#010x})"));
        }
        let values = [u64_at(b, 8), u64_at(b, 16), u64_at(b, 24)];
        match (u32_at(b, 0), values) {
            (CONTROL_POISON, [v, 0, 0]) if v != 0 => Ok(Control::Poison(v)),
            (CONTROL_BYE, [0, 0, 0]) => Ok(Control::Bye),
            (CONTROL_QUERY, [0, 0, 0]) => Ok(Control::Query),
            (CONTROL_CURRENT, w) => Ok(Control::Current(w)),
            (k, [v, ..]) => Err(format!("unknown control frame (kind {k}, value {v:#x})")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: [u8; SECRET_BYTES] = *b"0123456789abcdef";

    fn hello() -> Hello {
        Hello {
            stream: StreamId::ring(3),
            comm_hash: 0xfeed,
            from: 1,
            to: 2,
            secret: SECRET,
        }
    }

    #[test]
    fn a_hello_round_trips_and_is_checked() {
        let b = hello().encode();
        assert_eq!(
            Hello::decode_checked(&b, 0xfeed, 2, 4, &SECRET).unwrap(),
            hello()
        );
        let err = |b: &[u8; HELLO_BYTES], comm: u64, me: usize| {
            Hello::decode_checked(b, comm, me, 4, &SECRET).unwrap_err()
        };
        assert!(err(&b, 0xbeef, 2).contains("communicator"));
        assert!(err(&b, 0xfeed, 3).contains("addressed to rank 2"));
        let mut other = SECRET;
        other[15] ^= 1;
        let e = Hello::decode_checked(&b, 0xfeed, 2, 4, &other).unwrap_err();
        assert!(e.contains("wrong secret"), "{e}");
        let mut junk = b;
        junk[0] ^= 0xff;
        assert!(err(&junk, 0xfeed, 2).contains("magic"));
        let mut v2 = b;
        v2[8] = 9;
        assert!(err(&v2, 0xfeed, 2).contains("version 9"));
        let mut far = hello();
        far.from = 4;
        assert!(err(&far.encode(), 0xfeed, 2).contains("from rank 4"));
        let mut own = hello();
        own.from = 2;
        assert!(err(&own.encode(), 0xfeed, 2).contains("from rank 2"));
        let mut odd = hello();
        odd.stream = StreamId(9 << 24);
        assert!(err(&odd.encode(), 0xfeed, 2).contains("unknown stream"));
    }

    #[test]
    fn stream_ids_are_distinct_and_named() {
        let ids = [
            StreamId::CONTROL,
            StreamId::ring(0),
            StreamId::ring(31),
            StreamId::tree(0),
            StreamId::tree_ll(),
            StreamId::p2p(0),
            StreamId::p2p(7),
        ];
        for (i, a) in ids.iter().enumerate() {
            assert!(a.is_known());
            for b in &ids[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(StreamId::p2p(7).to_string(), "p2p channel 7");
        assert_eq!(StreamId::CONTROL.to_string(), "control");
        // The sockets of one stream are distinct streams on the wire, and named.
        let s = StreamId::ring(31).socket(5);
        assert_ne!(s, StreamId::ring(31));
        assert_eq!((s.socket_index(), s.socket(0)), (5, StreamId::ring(31)));
        assert_eq!(s.to_string(), "ring channel 31 socket 5");
        assert!(StreamId::p2p(7).socket(MAX_SOCKETS - 1).is_known());
        assert!(!StreamId::p2p(7).socket(MAX_SOCKETS).is_known());
        assert!(!StreamId::CONTROL.socket(1).is_known());
    }

    /// Concatenates the pieces of every socket in order.
    fn pieces(len: usize, k: usize) -> Vec<std::ops::Range<usize>> {
        (0..k).map(|j| stripe(len, k, j)).collect()
    }

    #[test]
    fn a_striped_payload_is_cut_into_ordered_disjoint_pieces_that_cover_it() {
        for k in [1, 2, 3, 4, 7, 16, MAX_SOCKETS] {
            for len in [
                0,
                1,
                63,
                4096,
                STRIPE_MIN,
                2 * STRIPE_MIN - 1,
                2 * STRIPE_MIN + 1,
                1 << 20,
                (4 << 20) + 17,
                123_456_789,
            ] {
                let p = pieces(len, k);
                let mut at = 0;
                for r in &p {
                    assert_eq!(r.start, at.min(len), "k={k} len={len}: {p:?}");
                    assert!(r.start <= r.end && r.end <= len, "k={k} len={len}: {p:?}");
                    at = r.end;
                }
                assert_eq!(at, len, "k={k} len={len}: pieces do not cover: {p:?}");
                let used = p.iter().filter(|r| !r.is_empty()).count();
                if k > 1 && len >= STRIPE_MIN {
                    // Every piece but the last is at least STRIPE_MIN, and no more pieces
                    // than sockets are used.
                    assert!(p[..used - 1].iter().all(|r| r.len() >= STRIPE_MIN));
                    assert!(used <= k);
                }
            }
        }
        // A payload of at most one minimum piece goes whole on socket 0.
        assert_eq!(pieces(STRIPE_MIN, 4)[0], 0..STRIPE_MIN);
        // 4 MiB over 4 sockets: four equal pieces.
        assert_eq!(
            pieces(4 << 20, 4),
            vec![
                0..1 << 20,
                1 << 20..2 << 20,
                2 << 20..3 << 20,
                3 << 20..4 << 20
            ]
        );
    }

    #[test]
    fn data_headers_round_trip_and_reject_junk_and_oversize() {
        let h = DataHeader {
            len: 4096,
            desc: [1, u64::MAX, 7],
        };
        assert_eq!(DataHeader::decode(&h.encode(), 4096).unwrap(), h);
        let e = DataHeader::decode(&h.encode(), 4095).unwrap_err();
        assert!(e.contains("4096 bytes") && e.contains("4095"), "{e}");
        let mut junk = h.encode();
        junk[5] ^= 0x10;
        assert!(DataHeader::decode(&junk, 1 << 20)
            .unwrap_err()
            .contains("corrupt"));
        let zero = DataHeader {
            len: 0,
            desc: [5, 6, 7],
        };
        assert_eq!(DataHeader::decode(&zero.encode(), 0).unwrap(), zero);
    }

    #[test]
    fn credits_round_trip_and_are_bounded() {
        assert_eq!(
            StreamFrame::decode(&StreamFrame::credit(3), 0, 8).unwrap(),
            StreamFrame::Credit(3)
        );
        assert!(StreamFrame::decode(&StreamFrame::credit(9), 0, 8)
            .unwrap_err()
            .contains("9 messages"));
        assert!(StreamFrame::decode(&StreamFrame::credit(0), 0, 8).is_err());
        let mut dirty = StreamFrame::credit(1);
        dirty[20] = 1;
        assert!(StreamFrame::decode(&dirty, 0, 8).is_err());
        let h = DataHeader {
            len: 4,
            desc: [1, 2, 3],
        };
        assert_eq!(
            StreamFrame::decode(&h.encode(), 4, 8).unwrap(),
            StreamFrame::Data(h)
        );
    }

    #[test]
    fn control_frames_round_trip_and_reject_junk() {
        for c in [
            Control::Poison(0x1234),
            Control::Bye,
            Control::Query,
            Control::Current([8, 0x0102_0304, u64::MAX]),
            Control::Current([0; 3]),
        ] {
            assert_eq!(Control::decode(&c.encode()).unwrap(), c);
        }
        assert!(Control::decode(&[0u8; CONTROL_BYTES]).is_err());
        let mut zero_poison = Control::Poison(1).encode();
        zero_poison[8] = 0;
        assert!(Control::decode(&zero_poison)
            .unwrap_err()
            .contains("unknown control"));
        // Stray values in a frame that has none are junk too.
        let mut bye = Control::Bye.encode();
        bye[20] = 1;
        assert!(Control::decode(&bye).is_err());
        let mut tag = Control::Query.encode();
        tag[5] ^= 1;
        assert!(Control::decode(&tag)
            .unwrap_err()
            .contains("corrupt control"));
    }
}
