//! Pure schedules: for one operation on one rank, the per-channel list of steps the
//! executor runs, and therefore the EXPECTED per-channel SendCount/RecvCount of the probe.
//!
//! No I/O, no clocks, no shared state: every function here is deterministic in its inputs,
//! so every rank computes the same plan shape and the k-th send of a rank on a link always
//! matches the k-th receive of its peer on that link.
//!
//! # Model
//! A [`Plan`] is a set of [`Lane`]s plus local copies. A lane belongs to one channel and
//! uses at most one inbound link (from `recv_from`) and one outbound link (to `send_to`);
//! its steps run strictly in order, and a step can run only when its inbound message is
//! there and its outbound slot is free. Lanes progress independently. Element offsets refer
//! to buffers by index: for collectives [`BUF_SEND`] and [`BUF_RECV`]; for a p2p batch the
//! index of the p2p operation in the batch.
//!
//! # Ring algorithms (`Algo::Ring`)
//! Rank `r` sends to `r+1` and receives from `r-1` (mod `nranks`). Each channel owns a
//! contiguous slice of the data; a channel walks its slice in iterations sized by the FIFO
//! slot (pipelining across ranks comes from the slot FIFOs).
//! - AllReduce: an iteration covers up to `nranks` slots, split into `nranks` parts;
//!   reduce-scatter then allgather with fused steps: `Send`, `RecvReduceSend` x (n-2),
//!   `RecvReduceCopySend`, `RecvCopySend` x (n-2), `Recv`.
//! - ReduceScatter: `Send`, `RecvReduceSend` x (n-2), `RecvReduceCopy` (rank r ends with
//!   part r).
//! - AllGather: local copy of the own part, `Send`, `RecvCopySend` x (n-2), `Recv`.
//! - Broadcast: a chain starting at the root; Reduce: a chain ending at the root.
//!
//! # P2p (`Algo::P2p`)
//! Send/Recv, AlltoAll, Gather and Scatter: a lane per (direction, peer, channel), steps in
//! issue order, offsets in BYTES (no reduction happens on these links).

use std::time::Duration;

use ccl_optype::CollKind;

use crate::error::{CclError, Result};

/// Channel/buffer settings of a communicator (from config and environment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tuning {
    pub min_channels: usize,
    pub max_channels: usize,
    pub buffsize: usize,
    pub nslots: usize,
    pub slot_bytes: usize,
    pub peer_check: Duration,
}

/// Buffer index of the send buffer in collective plans.
pub const BUF_SEND: usize = 0;
/// Buffer index of the receive buffer in collective plans.
pub const BUF_RECV: usize = 1;

/// Largest channel count a communicator supports.
pub const MAX_CHANNELS: usize = 32;

/// One step of a lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// Send `src` (with the reduction's pre-operation for reducing collectives).
    Send,
    /// Copy the incoming message to `dst`.
    Recv,
    /// out = in OP pre(src); send out.
    RecvReduceSend,
    /// out = finish(in OP pre(src)); copy out to `dst`; send out.
    RecvReduceCopySend,
    /// Copy the incoming message to `dst` and forward it.
    RecvCopySend,
    /// dst = finish(in OP pre(src)).
    RecvReduceCopy,
}

impl StepKind {
    /// True when the step sends one message.
    pub fn sends(self) -> bool {
        matches!(
            self,
            StepKind::Send
                | StepKind::RecvReduceSend
                | StepKind::RecvReduceCopySend
                | StepKind::RecvCopySend
        )
    }

    /// True when the step consumes one incoming message.
    pub fn recvs(self) -> bool {
        !matches!(self, StepKind::Send)
    }

    /// True when the step reads the local source buffer.
    pub fn reads_src(self) -> bool {
        matches!(
            self,
            StepKind::Send
                | StepKind::RecvReduceSend
                | StepKind::RecvReduceCopySend
                | StepKind::RecvReduceCopy
        )
    }

    /// True when the step writes the destination buffer.
    pub fn writes_dst(self) -> bool {
        matches!(
            self,
            StepKind::Recv
                | StepKind::RecvReduceCopySend
                | StepKind::RecvCopySend
                | StepKind::RecvReduceCopy
        )
    }
}

/// One step: `count` units (elements for ring plans, bytes for p2p plans).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// What the step does.
    pub kind: StepKind,
    /// Buffer index of the local source (meaningful when `kind.reads_src()`).
    pub src_buf: usize,
    /// Unit offset into the source buffer.
    pub src_off: usize,
    /// Buffer index of the destination (meaningful when `kind.writes_dst()`).
    pub dst_buf: usize,
    /// Unit offset into the destination buffer.
    pub dst_off: usize,
    /// Units moved by the step (> 0).
    pub count: usize,
}

/// Which set of connections a lane uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// The ring neighbours' connections (created at init).
    Ring,
    /// Per-peer connections (created lazily).
    P2p,
}

/// A sequence of steps of one channel over at most one inbound and one outbound link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    /// Channel index (< the plan's `n_channels`).
    pub channel: usize,
    /// Connection set used.
    pub link: LinkKind,
    /// Peer rank messages come from (required if any step receives).
    pub recv_from: Option<usize>,
    /// Peer rank messages go to (required if any step sends).
    pub send_to: Option<usize>,
    /// Steps, run in order.
    pub steps: Vec<Step>,
}

impl Lane {
    /// (sending steps, receiving steps) of this lane: what the probe's counters reach.
    /// Descriptor-only messages (`count == 0`, see `crate::desc`) are not counted.
    pub fn step_counts(&self) -> (u64, u64) {
        self.steps
            .iter()
            .filter(|st| st.count > 0)
            .fold((0, 0), |(s, r), st| {
                (
                    s + u64::from(st.kind.sends()),
                    r + u64::from(st.kind.recvs()),
                )
            })
    }
}

/// A purely local data movement of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalKind {
    /// dst = src.
    Copy,
    /// dst = finish(pre(src)) (the reduction of a single rank).
    Reduce,
}

/// A local step (run once, before the lanes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalStep {
    /// Copy or single-rank reduction.
    pub kind: LocalKind,
    /// Source buffer index.
    pub src_buf: usize,
    /// Source unit offset.
    pub src_off: usize,
    /// Destination buffer index.
    pub dst_buf: usize,
    /// Destination unit offset.
    pub dst_off: usize,
    /// Units.
    pub count: usize,
}

/// The full plan of one operation on one rank.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Plan {
    /// Channels of the operation (what the probe frame and op type set report).
    pub n_channels: usize,
    /// Unit size in bytes (element size for ring plans, 1 for p2p plans).
    pub unit: usize,
    /// Lanes.
    pub lanes: Vec<Lane>,
    /// Local steps.
    pub local: Vec<LocalStep>,
}

impl Plan {
    /// A plan of one channel without steps: what the probe and the op type set see of an
    /// operation the host executor runs without a schedule (a Tree AllReduce).
    pub fn stepless() -> Plan {
        Plan {
            n_channels: 1,
            unit: 1,
            lanes: Vec::new(),
            local: Vec::new(),
        }
    }
}

/// Expected probe counters of one channel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpectedCounts {
    /// Send steps.
    pub send: u64,
    /// Receive steps.
    pub recv: u64,
}

impl Plan {
    /// Expected SendCount/RecvCount per channel (`n_channels` entries).
    pub fn expected_counts(&self) -> Vec<ExpectedCounts> {
        let mut v = vec![ExpectedCounts::default(); self.n_channels];
        for lane in &self.lanes {
            let Some(c) = v.get_mut(lane.channel) else {
                continue;
            };
            let (send, recv) = lane.step_counts();
            c.send += send;
            c.recv += recv;
        }
        v
    }

    /// Total steps over all lanes.
    pub fn total_steps(&self) -> usize {
        self.lanes.iter().map(|l| l.steps.len()).sum()
    }
}

/// Splits `total` units into `parts` near-equal contiguous pieces; returns piece `i` as
/// (start, len). The first `total % parts` pieces are one unit longer.
pub fn split(total: usize, parts: usize, i: usize) -> (usize, usize) {
    let parts = parts.max(1);
    let base = total / parts;
    let rem = total % parts;
    (i * base + i.min(rem), base + usize::from(i < rem))
}

/// Bytes of data per channel below which another channel is not worth it.
pub const BYTES_PER_CHANNEL: usize = 256 * 1024;

/// Channel count for an operation moving `bytes` per rank: one channel per
/// [`BYTES_PER_CHANNEL`] (at least one), clamped to `[min_ch, max_ch]` and
/// `[1, MAX_CHANNELS]`.
pub fn channels_for(bytes: usize, min_ch: usize, max_ch: usize) -> usize {
    let max_ch = max_ch.clamp(1, MAX_CHANNELS);
    let min_ch = min_ch.clamp(1, max_ch);
    bytes.div_ceil(BYTES_PER_CHANNEL).clamp(min_ch, max_ch)
}

/// Bytes a rank contributes to / receives from one "unit" of the operation that drives the
/// channel choice: the caller's `count` times the element size (the per-rank count for
/// AllGather/ReduceScatter/AlltoAll/Gather/Scatter).
pub fn channel_bytes(count: usize, elem_size: usize) -> usize {
    count.saturating_mul(elem_size)
}

/// Description of a collective on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollDesc {
    /// Operation (not Send/Recv: those go through [`p2p`]).
    pub coll: CollKind,
    /// Count as passed by the caller (per-rank count for AllGather/ReduceScatter/...).
    pub count: usize,
    /// Element size in bytes.
    pub elem_size: usize,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// Root (rooted collectives), else ignored.
    pub root: usize,
    /// Channels.
    pub n_channels: usize,
    /// Bytes of one FIFO slot.
    pub slot_bytes: usize,
}

fn m(a: isize, n: usize) -> usize {
    a.rem_euclid(n as isize) as usize
}

struct RingBuilder {
    lanes: Vec<Lane>,
}

impl RingBuilder {
    fn new(n_channels: usize, recv: bool, send: bool, prev: usize, next: usize) -> Self {
        RingBuilder {
            lanes: (0..n_channels)
                .map(|channel| Lane {
                    channel,
                    link: LinkKind::Ring,
                    recv_from: recv.then_some(prev),
                    send_to: send.then_some(next),
                    steps: Vec::new(),
                })
                .collect(),
        }
    }

    fn push(&mut self, ch: usize, kind: StepKind, src_off: usize, dst_off: usize, count: usize) {
        if count == 0 {
            return;
        }
        self.lanes[ch].steps.push(Step {
            kind,
            src_buf: BUF_SEND,
            src_off,
            dst_buf: BUF_RECV,
            dst_off,
            count,
        });
    }

    fn finish(mut self) -> Vec<Lane> {
        // Drop link declarations a lane never uses (e.g. an empty channel).
        for l in &mut self.lanes {
            if !l.steps.iter().any(|s| s.kind.recvs()) {
                l.recv_from = None;
            }
            if !l.steps.iter().any(|s| s.kind.sends()) {
                l.send_to = None;
            }
        }
        self.lanes.retain(|l| !l.steps.is_empty());
        self.lanes
    }
}

/// The plan of a ring collective (AllReduce, Broadcast, Reduce, AllGather, ReduceScatter)
/// or a p2p-built collective (AlltoAll, Gather, Scatter; offsets in bytes).
pub fn collective(d: &CollDesc) -> Result<Plan> {
    let n = d.nranks;
    if n == 0 || d.rank >= n {
        return Err(CclError::Internal(format!(
            "schedule: rank {} of {} ranks",
            d.rank, n
        )));
    }
    if d.elem_size == 0 || d.slot_bytes == 0 {
        return Err(CclError::Internal(
            "schedule: zero element or slot size".into(),
        ));
    }
    let rooted = matches!(
        d.coll,
        CollKind::Broadcast | CollKind::Reduce | CollKind::Gather | CollKind::Scatter
    );
    if rooted && d.root >= n {
        return Err(CclError::Internal(format!(
            "schedule: root {} of {} ranks",
            d.root, n
        )));
    }
    let nch = d.n_channels.clamp(1, MAX_CHANNELS);
    match d.coll {
        CollKind::AlltoAll | CollKind::Gather | CollKind::Scatter => return p2p_collective(d, nch),
        CollKind::Send | CollKind::Recv => {
            return Err(CclError::Internal(
                "schedule: Send/Recv are planned with schedule::p2p".into(),
            ))
        }
        _ => {}
    }
    let r = d.rank as isize;
    let se = (d.slot_bytes / d.elem_size).max(1);
    let prev = m(r - 1, n);
    let next = m(r + 1, n);
    let c = d.count;
    let mut plan = Plan {
        n_channels: nch,
        unit: d.elem_size,
        lanes: Vec::new(),
        local: Vec::new(),
    };
    let local = |kind, src_off, dst_off, count| LocalStep {
        kind,
        src_buf: BUF_SEND,
        src_off,
        dst_buf: BUF_RECV,
        dst_off,
        count,
    };
    if n == 1 {
        let kind = match d.coll {
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter => LocalKind::Reduce,
            _ => LocalKind::Copy,
        };
        if c > 0 {
            plan.local.push(local(kind, 0, 0, c));
        }
        return Ok(plan);
    }
    match d.coll {
        CollKind::AllReduce => {
            let mut b = RingBuilder::new(nch, true, true, prev, next);
            for ch in 0..nch {
                let (cs, cl) = split(c, nch, ch);
                let mut off = 0;
                while off < cl {
                    let region = (cl - off).min(n * se);
                    let base = cs + off;
                    let part = |k: usize| {
                        let (ps, pl) = split(region, n, k);
                        (base + ps, pl)
                    };
                    let (o, l) = part(m(r, n));
                    b.push(ch, StepKind::Send, o, o, l);
                    for j in 1..n - 1 {
                        let (o, l) = part(m(r - j as isize, n));
                        b.push(ch, StepKind::RecvReduceSend, o, o, l);
                    }
                    let (o, l) = part(m(r + 1, n));
                    b.push(ch, StepKind::RecvReduceCopySend, o, o, l);
                    for t in 1..n - 1 {
                        let (o, l) = part(m(r + 1 - t as isize, n));
                        b.push(ch, StepKind::RecvCopySend, o, o, l);
                    }
                    let (o, l) = part(m(r + 2, n));
                    b.push(ch, StepKind::Recv, o, o, l);
                    off += region;
                }
            }
            plan.lanes = b.finish();
        }
        CollKind::ReduceScatter | CollKind::AllGather => {
            let rs = d.coll == CollKind::ReduceScatter;
            let mut b = RingBuilder::new(nch, true, true, prev, next);
            if !rs && c > 0 {
                plan.local.push(local(LocalKind::Copy, 0, d.rank * c, c));
            }
            for ch in 0..nch {
                let (cs, cl) = split(c, nch, ch);
                let mut off = 0;
                while off < cl {
                    let len = (cl - off).min(se);
                    let x = cs + off;
                    if rs {
                        let p = m(r - 1, n);
                        b.push(ch, StepKind::Send, p * c + x, 0, len);
                        for j in 1..n - 1 {
                            let p = m(r - 1 - j as isize, n);
                            b.push(ch, StepKind::RecvReduceSend, p * c + x, 0, len);
                        }
                        b.push(ch, StepKind::RecvReduceCopy, d.rank * c + x, x, len);
                    } else {
                        b.push(ch, StepKind::Send, x, 0, len);
                        for j in 1..n - 1 {
                            let p = m(r - j as isize, n);
                            b.push(ch, StepKind::RecvCopySend, 0, p * c + x, len);
                        }
                        let p = m(r + 1, n);
                        b.push(ch, StepKind::Recv, 0, p * c + x, len);
                    }
                    off += len;
                }
            }
            plan.lanes = b.finish();
        }
        CollKind::Broadcast | CollKind::Reduce => {
            let bcast = d.coll == CollKind::Broadcast;
            // Position in the chain: Broadcast starts at the root, Reduce ends at it.
            let p = if bcast {
                m(r - d.root as isize, n)
            } else {
                m(r - d.root as isize - 1, n)
            };
            let first = p == 0;
            let last = p == n - 1;
            let mut b = RingBuilder::new(nch, !first, !last, prev, next);
            if bcast && first && c > 0 {
                plan.local.push(local(LocalKind::Copy, 0, 0, c));
            }
            let kind = match (bcast, first, last) {
                (_, true, _) => StepKind::Send,
                (true, false, false) => StepKind::RecvCopySend,
                (true, false, true) => StepKind::Recv,
                (false, false, false) => StepKind::RecvReduceSend,
                (false, false, true) => StepKind::RecvReduceCopy,
            };
            for ch in 0..nch {
                let (cs, cl) = split(c, nch, ch);
                let mut off = 0;
                while off < cl {
                    let len = (cl - off).min(se);
                    b.push(ch, kind, cs + off, cs + off, len);
                    off += len;
                }
            }
            plan.lanes = b.finish();
        }
        _ => unreachable_coll(d.coll)?,
    }
    Ok(plan)
}

fn unreachable_coll(c: CollKind) -> Result<()> {
    Err(CclError::Internal(format!(
        "schedule: unexpected {}",
        c.name()
    )))
}

/// Direction of a p2p operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dir {
    /// ncclSend.
    Send,
    /// ncclRecv.
    Recv,
}

/// One p2p operation of a batch: `bytes` from/to buffer `buf` at byte offset `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct P2pOp {
    /// Send or receive.
    pub dir: Dir,
    /// Peer rank (may be this rank: a local copy matched in order with the self-receive).
    pub peer: usize,
    /// Buffer index.
    pub buf: usize,
    /// Byte offset into the buffer.
    pub off: usize,
    /// Bytes.
    pub bytes: usize,
    /// Channels used for this operation (same rule on both sides: from `bytes`).
    pub n_channels: usize,
}

/// Plans a batch of p2p operations of one rank (a group's Send/Recv, or the parts of an
/// AlltoAll/Gather/Scatter). Operations to the same peer in the same direction run in
/// issue order; everything else progresses concurrently. Self sends are matched in order
/// with self receives (a count mismatch is an error).
pub fn p2p(rank: usize, nranks: usize, slot_bytes: usize, ops: &[P2pOp]) -> Result<Plan> {
    if slot_bytes == 0 {
        return Err(CclError::Internal("schedule: zero slot size".into()));
    }
    let mut plan = Plan {
        n_channels: 1,
        unit: 1,
        lanes: Vec::new(),
        local: Vec::new(),
    };
    let mut index: std::collections::HashMap<(Dir, usize, usize), usize> =
        std::collections::HashMap::new();
    let mut self_sends = Vec::new();
    let mut self_recvs = Vec::new();
    for op in ops {
        if op.peer >= nranks {
            return Err(CclError::arg(format!(
                "peer {} out of range (nranks {nranks})",
                op.peer
            )));
        }
        let nch = op.n_channels.clamp(1, MAX_CHANNELS);
        plan.n_channels = plan.n_channels.max(nch);
        if op.peer == rank {
            match op.dir {
                Dir::Send => self_sends.push(*op),
                Dir::Recv => self_recvs.push(*op),
            }
            continue;
        }
        for ch in 0..nch {
            let (cs, cl) = split(op.bytes, nch, ch);
            if cl == 0 {
                continue;
            }
            let li = *index.entry((op.dir, op.peer, ch)).or_insert_with(|| {
                plan.lanes.push(Lane {
                    channel: ch,
                    link: LinkKind::P2p,
                    recv_from: (op.dir == Dir::Recv).then_some(op.peer),
                    send_to: (op.dir == Dir::Send).then_some(op.peer),
                    steps: Vec::new(),
                });
                plan.lanes.len() - 1
            });
            let mut off = 0;
            while off < cl {
                let len = (cl - off).min(slot_bytes);
                let at = op.off + cs + off;
                let kind = match op.dir {
                    Dir::Send => StepKind::Send,
                    Dir::Recv => StepKind::Recv,
                };
                plan.lanes[li].steps.push(Step {
                    kind,
                    src_buf: op.buf,
                    src_off: at,
                    dst_buf: op.buf,
                    dst_off: at,
                    count: len,
                });
                off += len;
            }
        }
    }
    if self_sends.len() != self_recvs.len() {
        return Err(CclError::usage(format!(
            "rank {rank}: {} send(s) to itself but {} receive(s) from itself in one group",
            self_sends.len(),
            self_recvs.len()
        )));
    }
    for (s, r) in self_sends.iter().zip(&self_recvs) {
        if s.bytes != r.bytes {
            return Err(CclError::usage(format!(
                "rank {rank}: send to itself of {} bytes matched with a receive of {} bytes",
                s.bytes, r.bytes
            )));
        }
        if s.bytes > 0 {
            plan.local.push(LocalStep {
                kind: LocalKind::Copy,
                src_buf: s.buf,
                src_off: s.off,
                dst_buf: r.buf,
                dst_off: r.off,
                count: s.bytes,
            });
        }
    }
    Ok(plan)
}

fn p2p_collective(d: &CollDesc, nch: usize) -> Result<Plan> {
    let n = d.nranks;
    let r = d.rank;
    let cb = d.count * d.elem_size;
    let mut ops = Vec::new();
    let mut op = |dir, peer, buf, off| {
        ops.push(P2pOp {
            dir,
            peer,
            buf,
            off,
            bytes: cb,
            n_channels: nch,
        })
    };
    match d.coll {
        CollKind::AlltoAll => {
            for j in 0..n {
                op(Dir::Send, j, BUF_SEND, j * cb);
                op(Dir::Recv, j, BUF_RECV, j * cb);
            }
        }
        CollKind::Gather => {
            op(Dir::Send, d.root, BUF_SEND, 0);
            if r == d.root {
                for j in 0..n {
                    op(Dir::Recv, j, BUF_RECV, j * cb);
                }
            }
        }
        CollKind::Scatter => {
            if r == d.root {
                for j in 0..n {
                    op(Dir::Send, j, BUF_SEND, j * cb);
                }
            }
            op(Dir::Recv, d.root, BUF_RECV, 0);
        }
        other => unreachable_coll(other)?,
    }
    let mut plan = p2p(r, n, d.slot_bytes, &ops)?;
    plan.n_channels = nch;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, VecDeque};

    const ALL_COLLS: [CollKind; 8] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
        CollKind::Gather,
        CollKind::Scatter,
    ];

    fn in_len(coll: CollKind, count: usize, n: usize) -> usize {
        match coll {
            CollKind::ReduceScatter | CollKind::AlltoAll | CollKind::Scatter => count * n,
            _ => count,
        }
    }
    fn out_len(coll: CollKind, count: usize, n: usize) -> usize {
        match coll {
            CollKind::AllGather | CollKind::AlltoAll | CollKind::Gather => count * n,
            _ => count,
        }
    }

    /// Input element `i` of rank `r`: small distinct integers.
    fn input(r: usize, i: usize) -> i64 {
        ((r * 131 + i * 7) % 97) as i64 + 1
    }

    /// Independent reference of rank `r`'s output (Sum as the reduction).
    fn reference(
        coll: CollKind,
        count: usize,
        n: usize,
        r: usize,
        root: usize,
    ) -> Option<Vec<i64>> {
        let sum = |i: usize| (0..n).map(|q| input(q, i)).sum::<i64>();
        Some(match coll {
            CollKind::AllReduce => (0..count).map(sum).collect(),
            CollKind::Reduce => {
                if r != root {
                    return None;
                }
                (0..count).map(sum).collect()
            }
            CollKind::Broadcast => (0..count).map(|i| input(root, i)).collect(),
            CollKind::ReduceScatter => (0..count).map(|i| sum(r * count + i)).collect(),
            CollKind::AllGather => (0..n * count)
                .map(|k| input(k / count.max(1), k % count.max(1)))
                .collect(),
            CollKind::AlltoAll => (0..n * count)
                .map(|k| input(k / count.max(1), r * count + k % count.max(1)))
                .collect(),
            CollKind::Gather => {
                if r != root {
                    return None;
                }
                (0..n * count)
                    .map(|k| input(k / count.max(1), k % count.max(1)))
                    .collect()
            }
            CollKind::Scatter => (0..count).map(|i| input(root, r * count + i)).collect(),
            _ => unreachable!(),
        })
    }

    /// (outputs, writes per output byte, lane reads per input byte), per rank.
    type SimResult = (Vec<Vec<u8>>, Vec<Vec<u32>>, Vec<Vec<u32>>);

    fn rd(b: &[u8], elem: usize) -> i64 {
        let mut v = [0u8; 8];
        v[..elem].copy_from_slice(&b[..elem]);
        i64::from_le_bytes(v)
    }

    /// Runs the plans of all ranks against in-memory FIFOs of `depth` messages, round-robin,
    /// one step at a time per lane, with the executor's readiness rules. Buffers are bytes
    /// (elements little-endian, `elem` bytes); returns every rank's receive buffer and the
    /// number of writes per output byte.
    fn simulate(
        plans: &[Plan],
        elem: usize,
        inputs: &[Vec<u8>],
        out_bytes: usize,
        depth: usize,
    ) -> SimResult {
        let n = plans.len();
        // Reads of each input byte by lane steps.
        let mut reads: Vec<Vec<u32>> = inputs.iter().map(|i| vec![0u32; i.len()]).collect();
        let mut fifos: HashMap<(LinkKind, usize, usize, usize), VecDeque<Vec<u8>>> = HashMap::new();
        let mut outs = vec![vec![0xEEu8; out_bytes]; n];
        let mut writes = vec![vec![0u32; out_bytes]; n];
        let mut pos: Vec<Vec<usize>> = plans.iter().map(|p| vec![0; p.lanes.len()]).collect();
        for (r, p) in plans.iter().enumerate() {
            for l in &p.local {
                let (s, d, c) = (l.src_off * p.unit, l.dst_off * p.unit, l.count * p.unit);
                outs[r][d..d + c].copy_from_slice(&inputs[r][s..s + c]);
                writes[r][d..d + c].iter_mut().for_each(|w| *w += 1);
            }
        }
        loop {
            let mut progressed = false;
            let mut done = true;
            for r in 0..n {
                let p = &plans[r];
                for (li, lane) in p.lanes.iter().enumerate() {
                    let Some(step) = lane.steps.get(pos[r][li]) else {
                        continue;
                    };
                    done = false;
                    let in_key = lane.recv_from.map(|f| (lane.link, f, r, lane.channel));
                    let out_key = lane.send_to.map(|t| (lane.link, r, t, lane.channel));
                    if step.kind.recvs() && fifos.get(&in_key.unwrap()).is_none_or(|q| q.is_empty())
                    {
                        continue;
                    }
                    if step.kind.sends()
                        && fifos
                            .get(&out_key.unwrap())
                            .is_some_and(|q| q.len() >= depth)
                    {
                        continue;
                    }
                    let nb = step.count * p.unit;
                    let incoming = if step.kind.recvs() {
                        let m = fifos
                            .get_mut(&in_key.unwrap())
                            .unwrap()
                            .pop_front()
                            .unwrap();
                        assert_eq!(m.len(), nb, "message size mismatch");
                        Some(m)
                    } else {
                        None
                    };
                    let so = step.src_off * p.unit;
                    let local: &[u8] = if step.kind.reads_src() {
                        reads[r][so..so + nb].iter_mut().for_each(|x| *x += 1);
                        &inputs[r][so..so + nb]
                    } else {
                        &[]
                    };
                    let val: Vec<u8> = match step.kind {
                        StepKind::Send => local.to_vec(),
                        StepKind::Recv | StepKind::RecvCopySend => incoming.unwrap(),
                        _ => {
                            assert_eq!(p.unit, elem);
                            let inc = incoming.unwrap();
                            let mut v = vec![0u8; nb];
                            for k in 0..step.count {
                                let x = k * elem;
                                let s = rd(&inc[x..], elem) + rd(&local[x..], elem);
                                v[x..x + elem].copy_from_slice(&s.to_le_bytes()[..elem]);
                            }
                            v
                        }
                    };
                    if step.kind.writes_dst() {
                        let d = step.dst_off * p.unit;
                        outs[r][d..d + nb].copy_from_slice(&val);
                        writes[r][d..d + nb].iter_mut().for_each(|w| *w += 1);
                    }
                    if step.kind.sends() {
                        fifos.entry(out_key.unwrap()).or_default().push_back(val);
                    }
                    pos[r][li] += 1;
                    progressed = true;
                }
            }
            if done {
                break;
            }
            assert!(progressed, "deadlock at {pos:?}");
        }
        assert!(fifos.values().all(|q| q.is_empty()), "unconsumed messages");
        (outs, writes, reads)
    }

    #[allow(clippy::too_many_arguments)]
    fn check(
        coll: CollKind,
        count: usize,
        n: usize,
        root: usize,
        nch: usize,
        slot: usize,
        elem: usize,
        depth: usize,
    ) {
        let plans: Vec<Plan> = (0..n)
            .map(|rank| {
                collective(&CollDesc {
                    coll,
                    count,
                    elem_size: elem,
                    nranks: n,
                    rank,
                    root,
                    n_channels: nch,
                    slot_bytes: slot,
                })
                .unwrap()
            })
            .collect();
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|r| {
                (0..in_len(coll, count, n))
                    .flat_map(|i| input(r, i).to_le_bytes()[..elem].to_vec())
                    .collect()
            })
            .collect();
        let ol = out_len(coll, count, n);
        let (outs, writes, reads) = simulate(&plans, elem, &inputs, ol * elem, depth);
        // Every input element is read at most once by the lanes; for reductions over more
        // than one rank exactly once (each contribution enters the result once).
        for (r, rd) in reads.iter().enumerate() {
            assert!(
                rd.iter().all(|x| *x <= 1),
                "{coll:?} n {n} rank {r}: element read twice"
            );
            let reduction = matches!(
                coll,
                CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
            );
            if reduction && n > 1 {
                assert!(
                    rd.iter().all(|x| *x == 1),
                    "{coll:?} n {n} rank {r}: element not read"
                );
            }
        }
        for r in 0..n {
            let ctx =
                format!("{coll:?} count {count} n {n} rank {r} root {root} nch {nch} slot {slot}");
            match reference(coll, count, n, r, root) {
                Some(want) => {
                    let got: Vec<i64> = outs[r].chunks(elem).map(|c| rd(c, elem)).collect();
                    assert_eq!(got, want, "{ctx}");
                    // Every output element written exactly once.
                    assert!(
                        writes[r].iter().all(|w| *w == 1),
                        "{ctx}: writes {:?}",
                        writes[r]
                    );
                }
                None => assert!(writes[r].iter().all(|w| *w == 0), "{ctx}: non-root wrote"),
            }
            let p = &plans[r];
            assert_eq!(p.expected_counts().len(), p.n_channels);
            for lane in &p.lanes {
                assert!(lane.channel < p.n_channels);
                for s in &lane.steps {
                    assert!(s.count > 0);
                    assert!(
                        s.count * (if p.unit == 1 { 1 } else { elem }) <= slot,
                        "{ctx}: step exceeds slot"
                    );
                }
            }
        }
        // Sends on every link match receives of the peer, per channel.
        let mut sent: HashMap<(LinkKind, usize, usize, usize), u64> = HashMap::new();
        let mut recvd: HashMap<(LinkKind, usize, usize, usize), u64> = HashMap::new();
        for (r, p) in plans.iter().enumerate() {
            for l in &p.lanes {
                for s in &l.steps {
                    if s.kind.sends() {
                        *sent
                            .entry((l.link, r, l.send_to.unwrap(), l.channel))
                            .or_default() += 1;
                    }
                    if s.kind.recvs() {
                        *recvd
                            .entry((l.link, l.recv_from.unwrap(), r, l.channel))
                            .or_default() += 1;
                    }
                }
            }
        }
        assert_eq!(sent, recvd);
    }

    #[test]
    fn every_collective_is_correct_and_covers_each_element_once() {
        for coll in ALL_COLLS {
            for n in 1..=8 {
                for count in [0usize, 1, 2, 7, 13, 64, 1023] {
                    for nch in [1, 2, 3] {
                        for slot in [8usize, 24, 4096] {
                            let root = (n * 5 + count) % n;
                            check(coll, count, n, root, nch, slot, 4, 8);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn fifo_depth_two_never_deadlocks() {
        // A ring rank has sent at most one message more than it has received, so if every
        // rank were blocked on a full outbound FIFO each link would hold exactly one
        // message: depth 2 is enough (depth 1 can deadlock). The executor uses 8 slots.
        for coll in ALL_COLLS {
            for n in [2, 3, 5, 8] {
                check(coll, 300, n, n - 1, 4, 16, 2, 2);
                check(coll, 300, n, 0, 1, 8, 8, 2);
            }
        }
    }

    #[test]
    fn allreduce_counts_match_the_textbook_formula() {
        // With count divisible so that every part is non-empty: 2(n-1) sends and receives
        // per iteration per channel.
        for n in 2..=8usize {
            let slot = 64; // 16 f32 per slot
            let iters = 3;
            let count = 2 * n * 16 * iters; // 2 channels, 3 full iterations each
            let plan = collective(&CollDesc {
                coll: CollKind::AllReduce,
                count,
                elem_size: 4,
                nranks: n,
                rank: 1 % n,
                root: 0,
                n_channels: 2,
                slot_bytes: slot,
            })
            .unwrap();
            for c in plan.expected_counts() {
                assert_eq!(c.send, (2 * (n - 1) * iters) as u64);
                assert_eq!(c.recv, (2 * (n - 1) * iters) as u64);
            }
        }
    }

    #[test]
    fn broadcast_chain_counts() {
        for n in 2..=6usize {
            for rank in 0..n {
                let plan = collective(&CollDesc {
                    coll: CollKind::Broadcast,
                    count: 100,
                    elem_size: 1,
                    nranks: n,
                    rank,
                    root: 2 % n,
                    n_channels: 1,
                    slot_bytes: 10,
                })
                .unwrap();
                let c = plan.expected_counts()[0];
                let p = (rank + n - 2 % n) % n;
                assert_eq!(c.send, if p == n - 1 { 0 } else { 10 });
                assert_eq!(c.recv, if p == 0 { 0 } else { 10 });
            }
        }
    }

    #[test]
    fn zero_count_and_single_rank_plans_have_no_lanes() {
        for coll in ALL_COLLS {
            let d = CollDesc {
                coll,
                count: 0,
                elem_size: 4,
                nranks: 4,
                rank: 1,
                root: 0,
                n_channels: 2,
                slot_bytes: 64,
            };
            let p = collective(&d).unwrap();
            assert_eq!(p.total_steps(), 0, "{coll:?}");
            assert!(p
                .expected_counts()
                .iter()
                .all(|c| c.send == 0 && c.recv == 0));
            let p1 = collective(&CollDesc {
                nranks: 1,
                rank: 0,
                count: 5,
                ..d
            })
            .unwrap();
            assert_eq!(p1.total_steps(), 0);
            assert_eq!(p1.local.len(), 1, "{coll:?}");
        }
    }

    #[test]
    fn p2p_batches_match_in_any_issue_order_and_self_sends_pair_up() {
        // Rank 0 sends 10 bytes then 20 to rank 1; rank 1 posts its receives; both also
        // exchange the other way, issued in opposite orders.
        let mk = |dir, peer, buf, bytes| P2pOp {
            dir,
            peer,
            buf,
            off: 0,
            bytes,
            n_channels: 2,
        };
        let a = p2p(
            0,
            2,
            4,
            &[
                mk(Dir::Send, 1, 0, 10),
                mk(Dir::Recv, 1, 1, 7),
                mk(Dir::Send, 1, 2, 20),
            ],
        )
        .unwrap();
        let b = p2p(
            1,
            2,
            4,
            &[
                mk(Dir::Send, 0, 0, 7),
                mk(Dir::Recv, 0, 1, 10),
                mk(Dir::Recv, 0, 2, 20),
            ],
        )
        .unwrap();
        let sends_a: u64 = a.expected_counts().iter().map(|c| c.send).sum();
        let recvs_b: u64 = b.expected_counts().iter().map(|c| c.recv).sum();
        assert_eq!(sends_a, recvs_b);
        // 10 bytes over 2 channels: 5+5 -> 2 steps each; 20: 10+10 -> 3 each.
        assert_eq!(sends_a, 10);
        let s = p2p(0, 2, 4, &[mk(Dir::Send, 0, 0, 8), mk(Dir::Recv, 0, 1, 8)]).unwrap();
        assert_eq!(s.local.len(), 1);
        assert!(s.lanes.is_empty());
        assert!(p2p(0, 2, 4, &[mk(Dir::Send, 0, 0, 8)]).is_err());
        assert!(p2p(0, 2, 4, &[mk(Dir::Send, 0, 0, 8), mk(Dir::Recv, 0, 1, 9)]).is_err());
        assert!(p2p(0, 2, 4, &[mk(Dir::Send, 2, 0, 8)]).is_err());
    }

    #[test]
    fn channel_choice_grows_with_size_and_respects_bounds() {
        assert_eq!(channels_for(0, 1, 4), 1);
        assert_eq!(channels_for(1, 1, 4), 1);
        assert_eq!(channels_for(BYTES_PER_CHANNEL, 1, 4), 1);
        assert_eq!(channels_for(BYTES_PER_CHANNEL + 1, 1, 4), 2);
        assert_eq!(channels_for(100 * BYTES_PER_CHANNEL, 1, 4), 4);
        assert_eq!(channels_for(1, 3, 4), 3);
        assert_eq!(channels_for(1, 9, 4), 4);
        assert_eq!(channels_for(usize::MAX, 1, 1000), MAX_CHANNELS);
        assert_eq!(channels_for(usize::MAX, 0, 0), 1);
    }

    #[test]
    fn split_covers_exactly() {
        for total in 0..50 {
            for parts in 1..9 {
                let mut next = 0;
                for i in 0..parts {
                    let (s, l) = split(total, parts, i);
                    assert_eq!(s, next);
                    next += l;
                }
                assert_eq!(next, total);
            }
        }
    }
}
