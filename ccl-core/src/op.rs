//! One operation of ccl-core, as both backends run it: a validated collective
//! ([`CollOp`]) or a group's Send/Recv calls ([`P2pCall`]) as a [`WorkItem`], its
//! reduction ([`RedSpec`], [`ScalarArg`]), its schedule ([`plan_for`]) and the operation
//! type set the probe records for it ([`type_set`]), and NCCL's per-call INFO line
//! ([`log_call`]).
//!
//! The host executor (`executor.rs`) and the device runtime (`device/`) both start from
//! here; neither goes through the other.

use ccl_optype::{Algo, CollKind, OpTypeSet, Proto};

use crate::error::Result;
use crate::label::{LabelExtra, OpPlace};
use crate::schedule::{self, CollDesc, Dir, P2pOp, Plan, Tuning};
use crate::types::{DataType, RedOpKind};

/// The scalar of a PreMulSum op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScalarArg {
    /// `ncclScalarHostImmediate`: the value, copied at creation.
    HostImmediate(Vec<u8>),
    /// `ncclScalarDevice`: address of the value, read when each operation executes.
    Device(usize),
}

/// The reduction of a validated operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RedSpec {
    Builtin(RedOpKind),
    PreMul(ScalarArg),
}

/// A validated collective.
#[derive(Clone, Debug)]
pub(crate) struct CollOp {
    pub kind: CollKind,
    pub dtype: DataType,
    pub count: usize,
    pub sendbuf: usize,
    pub recvbuf: usize,
    pub root: usize,
    pub red: Option<RedSpec>,
    pub raw_op: i32,
    pub place: OpPlace,
}

/// A validated Send or Recv.
#[derive(Clone, Debug)]
pub(crate) struct P2pCall {
    pub dir: Dir,
    pub peer: usize,
    pub buf: usize,
    pub count: usize,
    pub dtype: DataType,
    pub place: OpPlace,
}

/// One unit of work: a collective, or all Send/Recv of one group on this communicator.
#[derive(Clone, Debug)]
pub(crate) enum WorkItem {
    Coll(CollOp),
    P2p(Vec<P2pCall>),
}

/// Whether `k` has a root rank.
pub(crate) fn is_rooted(k: CollKind) -> bool {
    matches!(
        k,
        CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
    )
}

impl CollOp {
    /// The operation's name for messages (formatted here, on error and log paths only).
    pub(crate) fn label(&self) -> String {
        let extra = if is_rooted(self.kind) {
            LabelExtra::Root(self.root)
        } else {
            LabelExtra::None
        };
        self.place
            .label(self.kind.name(), extra, self.count, self.dtype.name())
    }
}

impl P2pCall {
    /// The call's name for messages.
    pub(crate) fn label(&self) -> String {
        let name = if self.dir == Dir::Send {
            "Send"
        } else {
            "Recv"
        };
        self.place.label(
            name,
            LabelExtra::Peer(self.peer),
            self.count,
            self.dtype.name(),
        )
    }
}

impl WorkItem {
    pub(crate) fn label(&self) -> String {
        match self {
            WorkItem::Coll(c) => c.label(),
            WorkItem::P2p(v) => {
                let names: Vec<String> = v.iter().map(P2pCall::label).collect();
                format!("p2p group [{}]", names.join(", "))
            }
        }
    }
}

/// Channels for a ring collective moving `count` elements of `dtype` per rank.
fn coll_channels(t: &Tuning, count: usize, dtype: DataType) -> usize {
    schedule::channels_for(
        schedule::channel_bytes(count, dtype.size()),
        t.min_channels,
        t.max_channels,
    )
}

/// Channels for a p2p transfer of `count` elements of `dtype` (at most the p2p link's).
fn p2p_channels(t: &Tuning, count: usize, dtype: DataType) -> usize {
    schedule::channels_for(
        schedule::channel_bytes(count, dtype.size()),
        1,
        t.p2p_channels(),
    )
}

/// The plan of a work item on `rank` (pure; also used by tests for expected counts).
pub(crate) fn plan_for(item: &WorkItem, rank: usize, nranks: usize, t: &Tuning) -> Result<Plan> {
    match item {
        WorkItem::Coll(c) => {
            let p2p_based = matches!(
                c.kind,
                CollKind::AlltoAll | CollKind::Gather | CollKind::Scatter
            );
            schedule::collective(&CollDesc {
                coll: c.kind,
                count: c.count,
                elem_size: c.dtype.size(),
                nranks,
                rank,
                root: c.root,
                n_channels: if p2p_based {
                    p2p_channels(t, c.count, c.dtype)
                } else {
                    coll_channels(t, c.count, c.dtype)
                },
                slot_bytes: t.slot_bytes,
            })
        }
        WorkItem::P2p(calls) => {
            let ops: Vec<P2pOp> = calls
                .iter()
                .enumerate()
                .map(|(i, c)| P2pOp {
                    dir: c.dir,
                    peer: c.peer,
                    buf: i,
                    off: 0,
                    bytes: c.count * c.dtype.size(),
                    n_channels: p2p_channels(t, c.count, c.dtype),
                })
                .collect();
            schedule::p2p(rank, nranks, t.slot_bytes, &ops)
        }
    }
}

/// The operation type set of a work item.
pub(crate) fn type_set(item: &WorkItem, nranks: usize, plan: &Plan) -> OpTypeSet {
    let n_channels = u32::try_from(plan.n_channels).unwrap_or(u32::MAX);
    match item {
        WorkItem::Coll(c) => {
            let es = c.dtype.size() as u64;
            let count = c.count as u64;
            let per_rank_total = matches!(
                c.kind,
                CollKind::AllGather
                    | CollKind::ReduceScatter
                    | CollKind::AlltoAll
                    | CollKind::Gather
                    | CollKind::Scatter
            );
            let bytes = if per_rank_total {
                count * es * nranks as u64
            } else {
                count * es
            };
            let rooted = matches!(
                c.kind,
                CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
            );
            OpTypeSet {
                coll: c.kind,
                algo: if matches!(
                    c.kind,
                    CollKind::AlltoAll | CollKind::Gather | CollKind::Scatter
                ) {
                    Algo::P2p
                } else {
                    Algo::Ring
                },
                proto: Proto::Simple,
                dtype: c.dtype as u8,
                redop: if c.red.is_some() { c.raw_op } else { -1 },
                count,
                bytes,
                root: if rooted { c.root as i32 } else { -1 },
                peer: -1,
                n_channels,
            }
        }
        WorkItem::P2p(calls) => {
            let any_send = calls.iter().any(|c| c.dir == Dir::Send);
            let first = calls.first();
            let same_peer = first.is_some_and(|f| calls.iter().all(|c| c.peer == f.peer));
            let same_dtype = first.is_some_and(|f| calls.iter().all(|c| c.dtype == f.dtype));
            OpTypeSet {
                coll: if any_send {
                    CollKind::Send
                } else {
                    CollKind::Recv
                },
                algo: Algo::P2p,
                proto: Proto::Simple,
                dtype: first.map_or(0, |f| f.dtype as u8),
                redop: -1,
                count: if same_dtype {
                    calls.iter().map(|c| c.count as u64).sum()
                } else {
                    0
                },
                bytes: calls
                    .iter()
                    .map(|c| (c.count * c.dtype.size()) as u64)
                    .sum(),
                root: -1,
                peer: match (same_peer, first) {
                    (true, Some(f)) => f.peer as i32,
                    _ => -1,
                },
                n_channels,
            }
        }
    }
}

/// ` stream 0x...` after a call's log line (device backend), nothing otherwise; formats only
/// when the line is actually logged.
struct StreamSuffix(Option<usize>);

impl std::fmt::Display for StreamSuffix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(s) => write!(f, " stream {s:#x}"),
            None => Ok(()),
        }
    }
}

/// Whether [`log_call`] would write `item`'s INFO line (`NCCL_DEBUG=INFO` with its
/// subsystem): a level comparison when INFO is off, so that a call that is not logged
/// does not build what the line needs.
#[inline]
pub(crate) fn call_logged(item: &WorkItem) -> bool {
    match item {
        WorkItem::Coll(_) => tracing::event_enabled!(target: "nccl::COLL", tracing::Level::INFO),
        WorkItem::P2p(_) => tracing::event_enabled!(target: "nccl::P2P", tracing::Level::INFO),
    }
}

/// NCCL's per-call INFO line (subsystem COLL / P2P) of operation `counter`; `stream` is
/// the caller's stream on the device backend.
pub(crate) fn log_call(
    item: &WorkItem,
    info: &OpTypeSet,
    rank: usize,
    nranks: usize,
    comm_id: u64,
    counter: u64,
    stream: Option<usize>,
) {
    let st = StreamSuffix(stream);
    match item {
        WorkItem::Coll(c) => tracing::info!(target: "nccl::COLL", rank,
            "{}: opCount {counter:x} sendbuff {:#x} recvbuff {:#x} count {} datatype {} op {} root {} comm {comm_id:#018x} [nranks={nranks}] nChannels {}{st}",
            c.kind.name(), c.sendbuf, c.recvbuf, c.count, c.dtype as i32, info.redop,
            info.root, info.n_channels),
        WorkItem::P2p(calls) => {
            for c in calls {
                tracing::info!(target: "nccl::P2P", rank,
                    "{}: opCount {counter:x} buff {:#x} count {} datatype {} peer {} comm {comm_id:#018x} [nranks={nranks}]{st}",
                    if c.dir == Dir::Send { "Send" } else { "Recv" }, c.buf, c.count,
                    c.dtype as i32, c.peer);
            }
        }
    }
}
