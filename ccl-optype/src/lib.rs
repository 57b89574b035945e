//! The operation type set (CCL-D section 5): collective kind, algorithm, protocol, dtype,
//! count, reduction op, root or peer, channels. A leaf crate with no dependencies, shared by
//! the runtime (`ccl-core`, `ccl-ffi`), which fills it in, and the probe, which records it;
//! neither imports the other for these types.
//!
//! Ranks of one round must agree on the type set; a disagreement is the H2 "inconsistent"
//! evidence. The enum values are stable: they go on the wire (`ccld-wire`'s enums carry the
//! same numbers, checked by `probe::wire`'s tests).

#![warn(unreachable_pub)]

/// Kind of operation. Values are stable (they go on the wire).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollKind {
    /// ncclAllReduce
    AllReduce = 0,
    /// ncclBroadcast / ncclBcast
    Broadcast = 1,
    /// ncclReduce
    Reduce = 2,
    /// ncclAllGather
    AllGather = 3,
    /// ncclReduceScatter
    ReduceScatter = 4,
    /// ncclAlltoAll
    AlltoAll = 5,
    /// ncclGather
    Gather = 6,
    /// ncclScatter
    Scatter = 7,
    /// ncclSend
    Send = 8,
    /// ncclRecv
    Recv = 9,
}

impl CollKind {
    /// All kinds, in value order.
    pub const ALL: [CollKind; 10] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Send,
        CollKind::Recv,
    ];

    /// NCCL's name of the operation, e.g. `"AllReduce"`.
    pub fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "AllReduce",
            CollKind::Broadcast => "Broadcast",
            CollKind::Reduce => "Reduce",
            CollKind::AllGather => "AllGather",
            CollKind::ReduceScatter => "ReduceScatter",
            CollKind::AlltoAll => "AlltoAll",
            CollKind::Gather => "Gather",
            CollKind::Scatter => "Scatter",
            CollKind::Send => "Send",
            CollKind::Recv => "Recv",
        }
    }

    /// Inverse of `as u8`.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(usize::from(v)).copied()
    }
}

/// Algorithm. Values are stable.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Ring (pipelined).
    Ring = 0,
    /// Tree (double binary tree).
    Tree = 1,
    /// Point-to-point (send/recv and collectives built from them).
    P2p = 2,
}

impl Algo {
    /// NCCL's name, e.g. `"Ring"`.
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "Ring",
            Algo::Tree => "Tree",
            Algo::P2p => "P2P",
        }
    }

    /// Inverse of `as u8`.
    pub fn from_u8(v: u8) -> Option<Self> {
        [Algo::Ring, Algo::Tree, Algo::P2p]
            .get(usize::from(v))
            .copied()
    }
}

/// Protocol. Values are stable.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    /// Simple (bulk slots with head/tail counters).
    Simple = 0,
    /// LL (8-byte flag+data lines).
    Ll = 1,
    /// LL128.
    Ll128 = 2,
}

impl Proto {
    /// NCCL's name, e.g. `"Simple"`.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Simple => "Simple",
            Proto::Ll => "LL",
            Proto::Ll128 => "LL128",
        }
    }

    /// Inverse of `as u8`.
    pub fn from_u8(v: u8) -> Option<Self> {
        [Proto::Simple, Proto::Ll, Proto::Ll128]
            .get(usize::from(v))
            .copied()
    }
}

/// The operation type set of one operation on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpTypeSet {
    /// Collective or p2p kind.
    pub coll: CollKind,
    /// Algorithm used.
    pub algo: Algo,
    /// Protocol used.
    pub proto: Proto,
    /// `ncclDataType_t` value.
    pub dtype: u8,
    /// `ncclRedOp_t` value, or -1 for operations without reduction.
    pub redop: i32,
    /// Element count as passed by the caller.
    pub count: u64,
    /// Bytes moved by this rank's call (the nccl-tests "size" of the call).
    pub bytes: u64,
    /// Root rank, or -1.
    pub root: i32,
    /// Peer rank (send/recv), or -1.
    pub peer: i32,
    /// Channels used.
    pub n_channels: u32,
}
