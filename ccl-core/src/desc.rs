//! The descriptor check (pure logic): every message on every link carries the descriptor of
//! the operation it belongs to, and the receiver compares it with its own.
//!
//! A descriptor is the per-communicator collective sequence number, the collective kind,
//! datatype, reduction op, count and root; for Send/Recv it is the pair's own sequence
//! number (the k-th Send from `a` to `b` matches the k-th Recv on `b` from `a`), the count
//! and the datatype. It travels in the FIFO slot header next to the length word
//! ([`crate::transport::shm::FifoLayout::DESC_WORDS`] words), so the check costs three
//! stores and three compares per message and no extra cache line. An operation that moves
//! no data still sends one descriptor-only message per link ([`add_descriptor_only_steps`]).
//!
//! On a mismatch the receiver fails the operation with `ncclInvalidUsage` and poisons its
//! peers: it stores [`poison_value`] into the poison word next to every peer's doorbell, so
//! that peers blocked in the operation fail too (`ncclRemoteError`) instead of hanging.
//! A rank that finds a peer it waits on gone poisons the others the same way
//! ([`peer_lost_poison_value`]), so that ranks not waiting on that peer name it too.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use ccl_optype::CollKind;
use probe::{Failure, FailureCause};

use crate::channel::Transport;
use crate::error::CclError;
use crate::op::WorkItem;
use crate::schedule::{Dir, Lane, LinkKind, Plan, Step, StepKind};
use crate::transport::shm::{FifoLayout, SharedWord};

/// Marks a descriptor word 1 as present (a slot committed without a descriptor reads 0).
const MAGIC: u64 = 0xCD;

/// The check is always on; only the cost benchmark turns it off ([`bench_only_set_check`]).
static CHECK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns the descriptor check off or back on for the whole process. Only for the
/// `desc-check-cost` benchmark, which measures the check's cost side by side: not an
/// environment variable or configuration, nothing a user can set. Every rank of a
/// communicator must see the same state (the benchmark toggles it only while all ranks
/// wait at a barrier).
#[doc(hidden)]
pub fn bench_only_set_check(on: bool) {
    CHECK.store(on, Ordering::Relaxed);
}

/// Whether operations starting now check descriptors.
pub(crate) fn check_on() -> bool {
    CHECK.load(Ordering::Relaxed)
}

/// What one rank called, as carried on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpDesc {
    /// Collective sequence number, or the pair's p2p sequence number.
    pub seq: u64,
    /// Collective kind (`Send` for both directions of a point-to-point transfer).
    pub coll: CollKind,
    /// `ncclDataType_t` value.
    pub dtype: u8,
    /// `ncclRedOp_t` value, -1 when the operation does not reduce.
    pub redop: i32,
    /// Elements (per rank, as passed to the call).
    pub count: u64,
    /// Root rank, -1 when the operation has none.
    pub root: i32,
}

impl OpDesc {
    /// Whether this is a point-to-point descriptor.
    pub fn is_p2p(&self) -> bool {
        matches!(self.coll, CollKind::Send | CollKind::Recv)
    }

    /// The descriptor words of the slot header.
    pub fn encode(&self) -> [u64; FifoLayout::DESC_WORDS] {
        let redop = u64::from((self.redop.wrapping_add(1)) as u16);
        let root = u64::from((self.root.wrapping_add(1)) as u32) & 0xFF_FFFF;
        [
            self.seq,
            (MAGIC << 56)
                | (u64::from(self.coll as u8) << 48)
                | (u64::from(self.dtype) << 40)
                | (redop << 24)
                | root,
            self.count,
        ]
    }

    /// Decodes slot-header words; `None` when the slot carries no descriptor.
    pub fn decode(w: [u64; FifoLayout::DESC_WORDS]) -> Option<OpDesc> {
        if w[1] >> 56 != MAGIC {
            return None;
        }
        let coll = CollKind::from_u8(((w[1] >> 48) & 0xFF) as u8)?;
        Some(OpDesc {
            seq: w[0],
            coll,
            dtype: ((w[1] >> 40) & 0xFF) as u8,
            redop: i32::from(((w[1] >> 24) & 0xFFFF) as u16) - 1,
            count: w[2],
            root: ((w[1] & 0xFF_FFFF) as i32) - 1,
        })
    }

    /// The probe's form of this descriptor.
    pub fn to_probe(&self) -> probe::OpDescriptor {
        probe::OpDescriptor {
            seq: self.seq,
            coll: self.coll,
            dtype: u32::from(self.dtype),
            redop: self.redop,
            count: self.count,
            root: self.root,
        }
    }
}

impl std::fmt::Display for OpDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_p2p() {
            write!(
                f,
                "Send/Recv pair seq {} count {} datatype {}",
                self.seq, self.count, self.dtype
            )
        } else {
            write!(
                f,
                "{} seq {} count {} datatype {} op {} root {}",
                self.coll.name(),
                self.seq,
                self.count,
                self.dtype,
                self.redop,
                self.root
            )
        }
    }
}

/// A failed descriptor check on this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The peer whose message disagreed.
    pub peer: usize,
    /// Channel of the link.
    pub channel: usize,
    /// What this rank called.
    pub local: OpDesc,
    /// What arrived (`None`: a message without a descriptor).
    pub remote: Option<OpDesc>,
}

impl Mismatch {
    /// The text of the WARN line and of the error (`ncclGetLastError`): names both ranks
    /// and both descriptors.
    pub fn text(&self, rank: usize, comm_id: u64) -> String {
        let remote = self
            .remote
            .map_or_else(|| "no descriptor".to_string(), |d| d.to_string());
        format!(
            "{INCONSISTENT} {comm_id:#018x}: rank {rank} called {} but rank {} called {} (link {} -> {rank}, channel {})",
            self.local, self.peer, remote, self.peer, self.channel
        )
    }

    /// The probe's form of this mismatch.
    pub fn to_probe(&self) -> probe::DescriptorMismatch {
        probe::DescriptorMismatch {
            peer_rank: u32::try_from(self.peer).unwrap_or(u32::MAX),
            local: self.local.to_probe(),
            remote: self.remote.map(|d| d.to_probe()),
            channel: u32::try_from(self.channel).unwrap_or(u32::MAX),
        }
    }
}

/// The start of every mismatch text (also how [`breaks_comm`] recognises the error).
const INCONSISTENT: &str = "inconsistent call on comm";

/// Whether `e` is a descriptor mismatch: unlike other invalid usage, it leaves the
/// communicator unusable (its peers are out of step), so it breaks the communicator and
/// `ncclCommGetAsyncError` reports it.
pub(crate) fn breaks_comm(e: &CclError) -> bool {
    matches!(e, CclError::InvalidUsage(m) if m.contains(INCONSISTENT))
}

/// The probe's failure cause of an error that carried no more specific information.
pub(crate) fn classify(e: &CclError) -> Failure {
    Failure::cause(match e {
        CclError::Remote(_) => FailureCause::PeerLost,
        CclError::Aborted(_) => FailureCause::Aborted,
        CclError::InvalidUsage(_) | CclError::InvalidArgument(_) => FailureCause::InvalidUsage,
        CclError::Internal(_) => FailureCause::Internal,
        CclError::System(_) | CclError::Timeout(_) | CclError::InProgress => {
            FailureCause::Unspecified
        }
    })
}

/// A mismatch detected by `rank`: logs the WARN line, poisons every peer (so ranks blocked
/// in the operation fail instead of hanging) and returns the operation's error
/// (`ncclInvalidUsage`) with the probe's failure.
/// `collectives` is the number of collectives this rank has issued, the failing one
/// included ([`SeqState::collectives`]).
pub(crate) fn on_mismatch(
    t: &Transport,
    rank: usize,
    comm_id: u64,
    collectives: u64,
    m: &Mismatch,
) -> (CclError, Failure) {
    let text = m.text(rank, comm_id);
    tracing::warn!(target: "nccl::COLL", rank, "{text}");
    poison_peers(t, poison_value(rank, collectives));
    let f = Failure {
        cause: FailureCause::Inconsistent,
        peer_lost: None,
        mismatch: Some(m.to_probe()),
    };
    (CclError::InvalidUsage(text), f)
}

/// Stores the poison value `v` into every peer's poison word (the first poison wins) and
/// rings their doorbells, so that peers blocked in an operation notice it.
pub(crate) fn poison_peers(t: &Transport, v: u64) {
    for (p, w) in t.peer_poison.iter().enumerate() {
        if let Some(w) = w {
            // Release: pairs with the Acquire in `poisoned`.
            let _ = w
                .get()
                .compare_exchange(0, v, Ordering::Release, Ordering::Relaxed);
            if let Some(Some(b)) = t.peer_bells.get(p) {
                b.ring();
            }
        }
    }
}

/// The poison in `word` that fails this rank's current operation, `None` while clear.
///
/// `collectives`: the collectives this rank has issued, its current one included. A poison
/// is ignored while this rank is in a collective the detecting rank had completed (fewer
/// collectives issued than the detector's count): this rank's part of such an operation
/// does not depend on the detector's failure (an inconsistent call elsewhere, or a peer this
/// rank is not waiting on), so it may complete; failing it would fail a good call. A rank
/// that does wait on a lost peer finds that out by itself.
pub(crate) fn poisoned(word: &SharedWord, collectives: u64) -> Option<Poison> {
    let p = poison_decode(word.get().load(Ordering::Acquire))?;
    (collectives >= p.at()).then_some(p)
}

/// The communicator's error once a peer poisoned this rank, whatever this rank runs
/// (`ncclCommGetAsyncError`), `None` while `word` is clear.
pub(crate) fn poison_async_error(word: &SharedWord, rank: usize) -> Option<CclError> {
    Some(match poison_decode(word.get().load(Ordering::Acquire))? {
        Poison::Inconsistent { by, at } => inconsistent_poison_error(by, at, rank),
        Poison::PeerLost { lost, .. } => CclError::Remote(format!(
            "rank {lost} was lost (its process exited or its connection broke); rank {rank} fails too: the communicator is unusable"
        )),
    })
}

/// The error of a rank poisoned after rank `by` detected an inconsistent call in the
/// collective it counted as its `at`-th (`ncclRemoteError`).
pub(crate) fn inconsistent_poison_error(by: usize, at: u64, rank: usize) -> CclError {
    CclError::Remote(format!(
        "rank {by} detected an inconsistent call (in its collective #{}) and failed; rank {rank} fails too: the communicator is unusable",
        at.saturating_sub(1)
    ))
}

/// Sequence numbers of the descriptors: the communicator's collective sequence and one
/// sequence per (direction, peer) pair for Send/Recv, so that p2p traffic between some
/// ranks never shifts the collective sequence.
#[derive(Debug, Default)]
pub(crate) struct SeqState {
    coll: u64,
    pairs: HashMap<(Dir, usize), u64>,
    /// p2p groups issued so far (this rank's own count).
    p2p_groups: u64,
}

impl SeqState {
    /// Collectives issued so far (the current one included once its descriptors were
    /// made).
    pub(crate) fn collectives(&self) -> u64 {
        self.coll
    }

    /// The descriptors of `item` (see [`descriptors`]) and its sequence-space identity for
    /// the probe (collective number, or p2p group count with each call's pair sequence),
    /// advancing the sequences.
    pub(crate) fn descriptors(&mut self, item: &WorkItem) -> (Descs, probe::OpSeq) {
        let seq = self.coll;
        let id = match item {
            WorkItem::Coll(_) => {
                self.coll += 1;
                probe::OpSeq {
                    space: probe::SeqSpace::Collective,
                    number: seq,
                    p2p: Vec::new(),
                }
            }
            WorkItem::P2p(_) => {
                self.p2p_groups += 1;
                probe::OpSeq {
                    space: probe::SeqSpace::P2p,
                    number: self.p2p_groups - 1,
                    p2p: Vec::new(),
                }
            }
        };
        let pairs = &mut self.pairs;
        let descs = descriptors(item, seq, |dir, peer| {
            let e = pairs.entry((dir, peer)).or_insert(0);
            *e += 1;
            *e - 1
        });
        let id = with_peer_seqs(item, id, &descs);
        (descs, id)
    }
}

/// An operation's descriptors by buffer index (a collective's two buffers without an
/// allocation per call).
pub(crate) type Descs = smallvec::SmallVec<[[u64; FifoLayout::DESC_WORDS]; 2]>;

/// `id` with the Send/Recv calls of a p2p `item` and the pair sequence numbers of their
/// descriptors `descs` (same order) added.
fn with_peer_seqs(
    item: &WorkItem,
    mut id: probe::OpSeq,
    descs: &[[u64; FifoLayout::DESC_WORDS]],
) -> probe::OpSeq {
    if let WorkItem::P2p(calls) = item {
        id.p2p = calls
            .iter()
            .zip(descs)
            .map(|(c, d)| probe::PeerSeq {
                peer: c.peer as u32,
                send: c.dir == Dir::Send,
                seq: OpDesc::decode(*d).map_or(d[0], |x| x.seq),
                count: c.count as u64,
                dtype: c.dtype as u8,
            })
            .collect();
    }
    id
}

/// How a rank poisoned with a lost peer ([`Poison::PeerLost`]) describes the loss while it
/// does not see it itself (its connection to the peer still drains, or it has none).
pub const LOST_ELSEWHERE: &str = "gone (process exited or connection lost; found by another rank)";

/// Bits of the collective count in a poison word.
const POISON_COUNT_BITS: u32 = 38;
/// Bit 63: the word holds a poison. Bit 62: its kind is a lost peer.
const POISON_SET: u64 = 1 << 63;
const POISON_LOST: u64 = 1 << 62;

/// What a poison word says (bits: set, kind, 38-bit collective count, 24-bit rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poison {
    /// Rank `by` detected an inconsistent call after issuing `at` collectives.
    Inconsistent { by: usize, at: u64 },
    /// A rank found peer `lost` gone (process exited, connection lost) after issuing `at`
    /// collectives.
    PeerLost { lost: usize, at: u64 },
}

impl Poison {
    /// The detecting rank's collective count.
    pub fn at(&self) -> u64 {
        match *self {
            Poison::Inconsistent { at, .. } | Poison::PeerLost { at, .. } => at,
        }
    }
}

fn poison_word(kind: u64, rank: usize, collectives: u64) -> u64 {
    let max = (1u64 << POISON_COUNT_BITS) - 1;
    POISON_SET | kind | (collectives.min(max) << 24) | (rank as u64 & 0xFF_FFFF)
}

/// The poison word value a rank that detected a mismatch after issuing `collectives`
/// collectives stores into its peers' poison words (never 0; the count saturates at 2^38-1).
pub fn poison_value(rank: usize, collectives: u64) -> u64 {
    poison_word(0, rank, collectives)
}

/// The poison word value a rank that found peer `lost` gone after issuing `collectives`
/// collectives stores into its peers' poison words (never 0; the count saturates).
pub fn peer_lost_poison_value(lost: usize, collectives: u64) -> u64 {
    poison_word(POISON_LOST, lost, collectives)
}

/// What a poison word says, `None` when clear.
pub fn poison_decode(v: u64) -> Option<Poison> {
    let max = (1u64 << POISON_COUNT_BITS) - 1;
    let (rank, at) = ((v & 0xFF_FFFF) as usize, (v >> 24) & max);
    (v & POISON_SET != 0).then_some(if v & POISON_LOST != 0 {
        Poison::PeerLost { lost: rank, at }
    } else {
        Poison::Inconsistent { by: rank, at }
    })
}

/// The descriptors of a work item by buffer index (what its steps' `src_buf`/`dst_buf`
/// address): a collective's one descriptor for both buffers, a p2p group's calls each
/// with its pair sequence number from `next_pair_seq(dir, peer)` (called once per call, in
/// call order).
pub(crate) fn descriptors(
    item: &WorkItem,
    coll_seq: u64,
    mut next_pair_seq: impl FnMut(Dir, usize) -> u64,
) -> Descs {
    match item {
        WorkItem::Coll(c) => {
            let rooted = matches!(
                c.kind,
                CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
            );
            let d = OpDesc {
                seq: coll_seq,
                coll: c.kind,
                dtype: c.dtype as u8,
                redop: if c.red.is_some() { c.raw_op } else { -1 },
                count: c.count as u64,
                root: if rooted { c.root as i32 } else { -1 },
            }
            .encode();
            smallvec::smallvec![d, d]
        }
        WorkItem::P2p(calls) => calls
            .iter()
            .map(|c| {
                OpDesc {
                    seq: next_pair_seq(c.dir, c.peer),
                    coll: CollKind::Send,
                    dtype: c.dtype as u8,
                    redop: -1,
                    count: c.count as u64,
                    root: -1,
                }
                .encode()
            })
            .collect(),
    }
}

fn zero_step(kind: StepKind, buf: usize) -> Step {
    Step {
        kind,
        src_buf: buf,
        src_off: 0,
        dst_buf: buf,
        dst_off: 0,
        count: 0,
    }
}

/// Adds the descriptor-only messages of an operation that moves no data on a link it would
/// otherwise use: a collective without any step (count 0) exchanges one message around the
/// ring on channel 0; a Send/Recv of count 0 to another rank sends/receives one message on
/// channel 0 of the pair's link, in call order with the pair's other transfers of the group.
pub(crate) fn add_descriptor_only_steps(
    plan: &mut Plan,
    item: &WorkItem,
    rank: usize,
    nranks: usize,
) {
    match item {
        WorkItem::Coll(_) => {
            if nranks > 1 && plan.lanes.iter().all(|l| l.steps.is_empty()) {
                plan.lanes.push(Lane {
                    channel: 0,
                    link: LinkKind::Ring,
                    recv_from: Some((rank + nranks - 1) % nranks),
                    send_to: Some((rank + 1) % nranks),
                    steps: vec![zero_step(StepKind::Send, 0), zero_step(StepKind::Recv, 1)],
                });
            }
        }
        WorkItem::P2p(calls) => {
            for (i, c) in calls.iter().enumerate() {
                if c.count != 0 || c.peer == rank {
                    continue;
                }
                let (kind, recv_from, send_to) = match c.dir {
                    Dir::Send => (StepKind::Send, None, Some(c.peer)),
                    Dir::Recv => (StepKind::Recv, Some(c.peer), None),
                };
                let lane = plan.lanes.iter_mut().find(|l| {
                    l.link == LinkKind::P2p
                        && l.channel == 0
                        && l.recv_from == recv_from
                        && l.send_to == send_to
                });
                match lane {
                    Some(l) => {
                        // Before the first step of a later call (steps are in call order).
                        let at = l
                            .steps
                            .iter()
                            .position(|s| s.src_buf > i)
                            .unwrap_or(l.steps.len());
                        l.steps.insert(at, zero_step(kind, i));
                    }
                    None => plan.lanes.push(Lane {
                        channel: 0,
                        link: LinkKind::P2p,
                        recv_from,
                        send_to,
                        steps: vec![zero_step(kind, i)],
                    }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::label::OpPlace;
    use crate::op::{CollOp, P2pCall, RedSpec};
    use crate::types::{DataType, RedOpKind};

    fn d(seq: u64, coll: CollKind, dtype: u8, redop: i32, count: u64, root: i32) -> OpDesc {
        OpDesc {
            seq,
            coll,
            dtype,
            redop,
            count,
            root,
        }
    }

    #[test]
    fn descriptors_round_trip_and_differ_on_every_field() {
        let base = d(41, CollKind::AllReduce, 7, 0, 1 << 20, -1);
        let variants = [
            base,
            d(42, CollKind::AllReduce, 7, 0, 1 << 20, -1),
            d(41, CollKind::AllGather, 7, 0, 1 << 20, -1),
            d(41, CollKind::AllReduce, 6, 0, 1 << 20, -1),
            d(41, CollKind::AllReduce, 7, 2, 1 << 20, -1),
            d(41, CollKind::AllReduce, 7, -1, 1 << 20, -1),
            d(41, CollKind::AllReduce, 7, 0, (1 << 20) / 4, -1),
            d(41, CollKind::AllReduce, 7, 0, 1 << 20, 0),
            d(41, CollKind::AllReduce, 7, 0, 1 << 20, 3),
            d(u64::MAX, CollKind::Send, 11, 300, u64::MAX, 70_000),
        ];
        for (i, a) in variants.iter().enumerate() {
            assert_eq!(OpDesc::decode(a.encode()), Some(*a), "{a:?}");
            for b in &variants[i + 1..] {
                assert_ne!(a.encode(), b.encode(), "{a:?} vs {b:?}");
            }
        }
        assert_eq!(OpDesc::decode([0; 3]), None, "a slot without descriptor");
        assert_eq!(
            OpDesc::decode([1, 0xCD << 56 | 99 << 48, 0]),
            None,
            "bad kind"
        );
    }

    #[test]
    fn display_and_warn_text_name_both_ranks_and_descriptors() {
        let m = Mismatch {
            peer: 2,
            channel: 0,
            local: d(5, CollKind::AllReduce, 7, 0, 1024, -1),
            remote: Some(d(5, CollKind::AllGather, 7, -1, 256, -1)),
        };
        assert_eq!(
            m.text(3, 0xab),
            "inconsistent call on comm 0x00000000000000ab: rank 3 called AllReduce seq 5 count 1024 datatype 7 op 0 root -1 but rank 2 called AllGather seq 5 count 256 datatype 7 op -1 root -1 (link 2 -> 3, channel 0)"
        );
        assert_eq!(
            d(3, CollKind::Send, 2, -1, 9, -1).to_string(),
            "Send/Recv pair seq 3 count 9 datatype 2"
        );
    }

    #[test]
    fn poison_words() {
        assert_eq!(poison_decode(0), None);
        for (r, c, want) in [
            (0usize, 0u64, 0u64),
            (7, 1 << 37 | 5, 1 << 37 | 5),
            (0xFF_FFFF, u64::MAX, (1 << 38) - 1),
        ] {
            let v = poison_value(r, c);
            assert_ne!(v, 0);
            assert_eq!(
                poison_decode(v),
                Some(Poison::Inconsistent { by: r, at: want })
            );
            let v = peer_lost_poison_value(r, c);
            assert_ne!(v, 0);
            assert_eq!(
                poison_decode(v),
                Some(Poison::PeerLost { lost: r, at: want })
            );
        }
    }

    fn coll(kind: CollKind, count: usize) -> WorkItem {
        WorkItem::Coll(CollOp {
            kind,
            dtype: DataType::Float32,
            count,
            sendbuf: 8,
            recvbuf: 16,
            root: 2,
            red: (kind == CollKind::AllReduce).then_some(RedSpec::Builtin(RedOpKind::Sum)),
            raw_op: 0,
            place: OpPlace::default(),
        })
    }

    #[test]
    fn descriptor_of_items() {
        let ds = descriptors(&coll(CollKind::AllReduce, 10), 4, |_, _| unreachable!());
        assert_eq!(ds.len(), 2);
        assert_eq!(ds[0], ds[1]);
        assert_eq!(
            OpDesc::decode(ds[0]),
            Some(d(4, CollKind::AllReduce, 7, 0, 10, -1))
        );
        let b = descriptors(&coll(CollKind::Broadcast, 10), 0, |_, _| 0);
        assert_eq!(OpDesc::decode(b[0]).unwrap().root, 2);
        assert_eq!(OpDesc::decode(b[0]).unwrap().redop, -1);
        let call = |dir, peer, count| P2pCall {
            dir,
            peer,
            buf: 64,
            count,
            dtype: DataType::Int32,
            place: OpPlace::default(),
        };
        let item = WorkItem::P2p(vec![
            call(Dir::Send, 1, 5),
            call(Dir::Send, 1, 0),
            call(Dir::Recv, 1, 7),
        ]);
        let mut seqs = std::collections::HashMap::new();
        let ds = descriptors(&item, 99, |dir, p| {
            let s = seqs.entry((dir, p)).or_insert(0u64);
            *s += 1;
            *s - 1
        });
        let got: Vec<(u64, u64)> = ds
            .iter()
            .map(|w| {
                let x = OpDesc::decode(*w).unwrap();
                (x.seq, x.count)
            })
            .collect();
        assert_eq!(got, vec![(0, 5), (1, 0), (0, 7)]);
    }

    #[test]
    fn zero_count_operations_get_descriptor_only_messages() {
        let t = crate::schedule::Tuning {
            min_channels: 1,
            max_channels: 2,
            buffsize: 1 << 20,
            nslots: 8,
            slot_bytes: 1 << 17,
            peer_check: std::time::Duration::from_millis(200),
        };
        let item = coll(CollKind::AllReduce, 0);
        let mut plan = crate::op::plan_for(&item, 1, 4, &t).unwrap();
        add_descriptor_only_steps(&mut plan, &item, 1, 4);
        let busy: Vec<&Lane> = plan.lanes.iter().filter(|l| !l.steps.is_empty()).collect();
        assert_eq!(busy.len(), 1);
        assert_eq!((busy[0].recv_from, busy[0].send_to), (Some(0), Some(2)));
        assert_eq!(busy[0].steps.len(), 2);
        // A non-empty collective is left alone.
        let item = coll(CollKind::AllReduce, 100);
        let mut plan = crate::op::plan_for(&item, 1, 4, &t).unwrap();
        let before = plan.lanes.clone();
        add_descriptor_only_steps(&mut plan, &item, 1, 4);
        assert_eq!(plan.lanes, before);
        // One rank: nothing to exchange.
        let item = coll(CollKind::AllReduce, 0);
        let mut plan = crate::op::plan_for(&item, 0, 1, &t).unwrap();
        add_descriptor_only_steps(&mut plan, &item, 0, 1);
        assert!(plan.lanes.iter().all(|l| l.steps.is_empty()));
        // p2p: the zero-count send sits between the two non-empty sends to the same peer.
        let call = |dir, peer, count| P2pCall {
            dir,
            peer,
            buf: 64,
            count,
            dtype: DataType::Int32,
            place: OpPlace::default(),
        };
        let item = WorkItem::P2p(vec![
            call(Dir::Send, 2, 5),
            call(Dir::Send, 2, 0),
            call(Dir::Send, 2, 6),
            call(Dir::Recv, 3, 0),
            call(Dir::Send, 1, 0),
            call(Dir::Recv, 1, 0),
        ]);
        let mut plan = crate::op::plan_for(&item, 1, 4, &t).unwrap();
        add_descriptor_only_steps(&mut plan, &item, 1, 4);
        let lane = plan
            .lanes
            .iter()
            .find(|l| l.send_to == Some(2) && l.channel == 0)
            .unwrap();
        let order: Vec<(usize, usize)> = lane.steps.iter().map(|s| (s.src_buf, s.count)).collect();
        assert_eq!(order, vec![(0, 20), (1, 0), (2, 24)]);
        let recv = plan.lanes.iter().find(|l| l.recv_from == Some(3)).unwrap();
        assert_eq!(recv.steps.len(), 1);
        assert_eq!(recv.steps[0].kind, StepKind::Recv);
        assert!(
            !plan
                .lanes
                .iter()
                .any(|l| l.send_to == Some(1) || l.recv_from == Some(1)),
            "no message to itself"
        );
    }
}
