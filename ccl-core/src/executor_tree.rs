//! The Tree AllReduce of the host executor ([`crate::tree`]: recursive doubling) over the
//! Tree links of the partners (made at init, `crate::channel`), with the LL or the Simple
//! protocol. Every message carries the collective's descriptor, which the receiver checks
//! as on the ring; the probe counts every message on channel 0.

use std::sync::atomic::Ordering;

use super::{mem, ring_bell, PeerCheck, Worker};
use crate::error::{CclError, Result};
use crate::hostalgo::{HostAlgo, HostProto, Selection};
use crate::op::{CollOp, WorkItem};
use crate::reduce::Reducer;
use crate::schedule;
use crate::schedule::Tuning;
use crate::transport::shm::{Backoff, FifoLayout};
use crate::tree::{self, TreeStep};

/// Everything the Tree steps of one operation share.
pub(super) struct TreeOp<'a> {
    /// The operation, for its deferred start ([`Worker::start_pending`]).
    pub item: &'a WorkItem,
    pub proto: HostProto,
    pub red: &'a Reducer,
    pub sendbuf: usize,
    pub recvbuf: usize,
    pub bytes: usize,
    pub elem: usize,
    pub desc: [u64; FifoLayout::DESC_WORDS],
    pub check: bool,
    /// Whether the probe records the operation. Its counts go into its frame block
    /// (`Worker::cur`) only after its start, which the Tree run defers to its first sent
    /// message or first wait ([`Worker::start_pending`]).
    pub probing: bool,
}

/// Payload bytes of one Tree message with `proto` (whole elements of `elem` bytes).
pub(super) fn message_bytes(proto: HostProto, slot_bytes: usize, elem: usize) -> usize {
    let cap = match proto {
        HostProto::Simple => slot_bytes,
        HostProto::Ll => crate::channel::LL_LAYOUT.cap,
    };
    tree::chunk_elems(cap, elem) * elem
}

/// The wait state of one operation (see `Worker::run_lanes`: the same back-off, doorbell
/// announcement, abort, poison and peer checks). Tree operations record no wait times:
/// the analyzer reads those slots as waits on ring neighbours. The doorbell is this
/// rank's own (`Transport::bell`), reached through the worker: no reference count is
/// taken per operation.
struct Waiter {
    backoff: Backoff,
    announced: Option<u32>,
    peer_check: PeerCheck,
    /// Whether the first wait checked for a peer on this rank's CPU.
    spin_checked: bool,
    /// Polls without progress in the current wait (the peer check reads the clock on
    /// every [`Backoff::CLOCK_EVERY`]-th while spinning).
    polls: u32,
    driver: super::wait::SocketDriver,
}

impl Worker {
    /// Runs a Tree AllReduce (chunk by chunk).
    pub(super) fn run_tree(&mut self, op: &TreeOp<'_>) -> Result<()> {
        let steps = std::mem::take(&mut self.tree_steps);
        let chunk = message_bytes(op.proto, self.shared.tuning.slot_bytes, op.elem);
        let mut w = Waiter {
            backoff: self.backoff(),
            announced: None,
            // Armed with the start time at the first wait (the start is deferred).
            peer_check: PeerCheck::unarmed(self.shared.tuning.peer_check),
            spin_checked: false,
            polls: 0,
            driver: self.socket_driver(if self.t.uses_sockets() {
                chunk.min(op.bytes)
            } else {
                usize::MAX
            }),
        };
        if op.probing && self.t.uses_sockets() {
            self.mark_tree_wire(&steps);
        }
        let mut acc = std::mem::take(&mut self.scratch);
        let mut tmp = std::mem::take(&mut self.scratch2);
        acc.resize(chunk.min(op.bytes), 0);
        let mut off = 0;
        let mut r = Ok(());
        while off < op.bytes && r.is_ok() {
            let len = chunk.min(op.bytes - off);
            r = self.tree_chunk(op, &steps, off, &mut acc[..len], &mut tmp, &mut w);
            off += len;
        }
        // However the operation ended, this rank no longer waits on its doorbell.
        if w.announced.take().is_some() {
            self.t.bell.unannounce();
        }
        self.scratch = acc;
        self.scratch2 = tmp;
        self.tree_steps = steps;
        if op.probing && r.is_ok() {
            self.take_tree_wire();
        }
        r
    }

    /// Notes the wire-time counters of the peers this rank receives from (over sockets)
    /// at the operation's start. Each peer sends to this rank in one step of the operation
    /// at most (fold-in, one exchange per doubling step, fold-out: all different ranks),
    /// so a counter's growth is that step's; a neighbouring operation's messages that
    /// overlap blur it by at most one message, as on the ring.
    fn mark_tree_wire(&mut self, steps: &[crate::tree::TreeStep]) {
        if self.tree_wire.is_none() {
            let mut v = Vec::new();
            for st in steps.iter().filter(|st| st.messages().1 > 0) {
                for c in self.t.tree_wire(st.peer()) {
                    v.push((st.peer() as u32, c));
                }
            }
            self.tree_wire = Some(v);
        }
        let counters = self.tree_wire.as_deref().unwrap_or(&[]);
        self.tree_wire_start.clear();
        self.tree_wire_start
            .extend(counters.iter().map(|(_, c)| c.load(Ordering::Relaxed)));
    }

    /// The counters' growth since [`Worker::mark_tree_wire`], by sending peer, into
    /// `peer_wire` for the operation's completion record.
    fn take_tree_wire(&mut self) {
        let counters = self.tree_wire.as_deref().unwrap_or(&[]);
        for ((from, c), start) in counters.iter().zip(&self.tree_wire_start) {
            let ns = c.load(Ordering::Relaxed).saturating_sub(*start);
            match self.peer_wire.iter_mut().find(|w| w.from == *from) {
                Some(w) => w.wire_ns += ns,
                None => self.peer_wire.push(probe::PeerWire {
                    from: *from,
                    wire_ns: ns,
                }),
            }
        }
        self.tree_wire_start.clear();
    }

    fn tree_chunk(
        &mut self,
        op: &TreeOp<'_>,
        steps: &[TreeStep],
        off: usize,
        acc: &mut [u8],
        tmp: &mut Vec<u8>,
        w: &mut Waiter,
    ) -> Result<()> {
        let len = acc.len();
        let rank = self.shared.rank;
        if let [TreeStep::Exchange { peer }] = *steps {
            if len >= PAIR_MIN_BYTES
                && (op.sendbuf == op.recvbuf || !overlap(op.sendbuf, op.recvbuf, op.bytes))
            {
                return self.tree_pair_chunk(op, peer, off, len, tmp, w);
            }
        }
        // SAFETY: the chunk lies inside the send buffer (off + len <= count * elem size,
        // enqueue contract); acc is our scratch, disjoint from user memory.
        op.red.load(acc, unsafe { mem::src(op.sendbuf, off, len) });
        let mut finished = false;
        for &s in steps {
            match s {
                TreeStep::SendInput { to } => self.tree_send(op, to, acc, w)?,
                TreeStep::RecvResult { from } => {
                    // SAFETY: the chunk lies inside the receive buffer; no other live
                    // reference to it (acc is scratch).
                    let dst = unsafe { mem::dst(op.recvbuf, off, len) };
                    return self.tree_recv(op, from, len, w, |inb| dst.copy_from_slice(inb));
                }
                TreeStep::FoldIn { from } => {
                    self.tree_recv(op, from, len, w, |inb| op.red.merge_inplace(acc, inb))?
                }
                TreeStep::Exchange { peer } => {
                    self.tree_send(op, peer, acc, w)?;
                    if peer > rank {
                        self.tree_recv(op, peer, len, w, |inb| op.red.merge_inplace(acc, inb))?;
                    } else {
                        tmp.resize(len, 0);
                        self.tree_recv(op, peer, len, w, |inb| op.red.merge(tmp, inb, acc))?;
                        acc.copy_from_slice(tmp);
                    }
                }
                TreeStep::SendResult { to } => {
                    if !finished {
                        op.red.finish(acc);
                        finished = true;
                    }
                    self.tree_send(op, to, acc, w)?;
                }
            }
        }
        if !finished {
            op.red.finish(acc);
        }
        // SAFETY: as for RecvResult; the send-buffer slice of this chunk is dead.
        unsafe { mem::dst(op.recvbuf, off, len) }.copy_from_slice(acc);
        Ok(())
    }

    /// One chunk of a 2-rank Tree (a single exchange) without the scratch accumulator: the
    /// prescaled input goes straight from the send buffer into the slot, and the result
    /// straight into the receive buffer, lower rank's contribution first as in
    /// [`Self::tree_chunk`] (the same operations on the same values, so the same bits).
    /// The buffers are the same or disjoint (the caller checks).
    fn tree_pair_chunk(
        &mut self,
        op: &TreeOp<'_>,
        peer: usize,
        off: usize,
        len: usize,
        tmp: &mut Vec<u8>,
        w: &mut Waiter,
    ) -> Result<()> {
        let red = op.red;
        let in_place = op.sendbuf == op.recvbuf;
        // SAFETY: the chunk lies inside the send buffer (enqueue contract), which nothing
        // writes while this slice is used: in place, the receive-buffer slice below is
        // made only after its last use.
        let x = unsafe { mem::src(op.sendbuf, off, len) };
        self.tree_send_with(op, peer, len, w, |slot| red.load(slot, x))?;
        let lower = peer > self.shared.rank;
        if in_place && (!lower || red.prescale().is_some()) {
            // The result needs the input after the receive buffer (the same memory) is
            // written: reduce into scratch, then copy.
            tmp.resize(len, 0);
            if lower {
                red.load(tmp, x);
                self.tree_recv(op, peer, len, w, |inb| red.merge_inplace(tmp, inb))?;
            } else {
                self.tree_recv(op, peer, len, w, |inb| red.combine(tmp, inb, x))?;
            }
            // SAFETY: the chunk lies inside the receive buffer; x is no longer used.
            let dst = unsafe { mem::dst(op.recvbuf, off, len) };
            dst.copy_from_slice(tmp);
            red.finish(dst);
            return Ok(());
        }
        // SAFETY: the chunk lies inside the receive buffer, disjoint from the send buffer
        // (or, in place for the lower rank without prescale, the same bytes, after x's last
        // use: the receive buffer already holds pre(x) = x).
        let dst = unsafe { mem::dst(op.recvbuf, off, len) };
        if lower {
            if !in_place {
                red.load(dst, x);
            }
            self.tree_recv(op, peer, len, w, |inb| red.merge_inplace(dst, inb))?;
        } else {
            self.tree_recv(op, peer, len, w, |inb| red.combine(dst, inb, x))?;
        }
        red.finish(dst);
        Ok(())
    }

    /// Sends `data` to `peer` as one message (waits for a free slot).
    fn tree_send(
        &mut self,
        op: &TreeOp<'_>,
        peer: usize,
        data: &[u8],
        w: &mut Waiter,
    ) -> Result<()> {
        self.tree_send_with(op, peer, data.len(), w, |buf| buf.copy_from_slice(data))
    }

    /// Sends a message of `len` bytes to `peer` that `fill` writes into the reserved slot
    /// (waits for a free slot; `fill` runs once, on the slot's first `len` bytes).
    fn tree_send_with(
        &mut self,
        op: &TreeOp<'_>,
        peer: usize,
        len: usize,
        w: &mut Waiter,
        fill: impl Fn(&mut [u8]),
    ) -> Result<()> {
        self.tree_wait(op, peer, w, |me| {
            let links =
                me.t.tree
                    .get_mut(&peer)
                    .ok_or_else(|| CclError::Internal(format!("no Tree link to rank {peer}")))?;
            match op.proto {
                HostProto::Ll => {
                    let tx = links
                        .ll_tx
                        .as_mut()
                        .ok_or_else(|| CclError::Internal(format!("no LL link to rank {peer}")))?;
                    let Some(buf) = tx.try_reserve() else {
                        return Ok(None);
                    };
                    fill(
                        buf.get_mut(..len)
                            .ok_or_else(|| CclError::Internal("LL message too long".into()))?,
                    );
                    tx.commit_with_desc(len, if op.check { op.desc } else { [0; 3] })?;
                }
                HostProto::Simple => {
                    let tx = links
                        .tx
                        .first_mut()
                        .ok_or_else(|| CclError::Internal(format!("no link to rank {peer}")))?;
                    let Some(slot) = tx.try_reserve() else {
                        return Ok(None);
                    };
                    fill(
                        slot.get_mut(..len)
                            .ok_or_else(|| CclError::Internal("Tree message too long".into()))?,
                    );
                    if op.check {
                        tx.commit_with_desc(len, op.desc);
                    } else {
                        tx.commit(len);
                    }
                }
            }
            ring_bell(&me.t.peer_bells, Some(peer));
            // The message is on its way: the operation's start, deferred to here, overlaps
            // the partner's receiving it.
            me.start_pending(op.item);
            if let Some(b) = me.cur.block {
                me.shared.frame.add_send(b, 0, 1);
            }
            Ok(Some(()))
        })?;
        // Over sockets, on its way now rather than at this rank's next wait.
        w.driver.flush(&self.t);
        Ok(())
    }

    /// Receives one message of `len` bytes from `peer` and hands it to `f`.
    fn tree_recv(
        &mut self,
        op: &TreeOp<'_>,
        peer: usize,
        len: usize,
        w: &mut Waiter,
        mut f: impl FnMut(&[u8]),
    ) -> Result<()> {
        self.tree_wait(op, peer, w, |me| {
            let links =
                me.t.tree
                    .get_mut(&peer)
                    .ok_or_else(|| CclError::Internal(format!("no Tree link to rank {peer}")))?;
            let got = match op.proto {
                HostProto::Ll => {
                    let rx = links
                        .ll_rx
                        .as_mut()
                        .ok_or_else(|| CclError::Internal(format!("no LL link to rank {peer}")))?;
                    let Some((inb, d)) = rx.try_peek_with_desc()? else {
                        return Ok(None);
                    };
                    if op.check && d != op.desc {
                        Some(d)
                    } else if inb.len() != len {
                        return Err(wrong_len(inb.len(), len, peer));
                    } else {
                        f(inb);
                        rx.release();
                        None
                    }
                }
                HostProto::Simple => {
                    let rx = links
                        .rx
                        .first_mut()
                        .ok_or_else(|| CclError::Internal(format!("no link to rank {peer}")))?;
                    let peeked = if op.check {
                        rx.try_peek_with_desc()?
                    } else {
                        rx.try_peek_checked()?.map(|s| (s, [0; 3]))
                    };
                    let Some((inb, d)) = peeked else {
                        return Ok(None);
                    };
                    if op.check && d != op.desc {
                        Some(d)
                    } else if inb.len() != len {
                        return Err(wrong_len(inb.len(), len, peer));
                    } else {
                        f(inb);
                        rx.release();
                        None
                    }
                }
            };
            if let Some(got) = got {
                let m = crate::desc::Mismatch {
                    peer,
                    channel: 0,
                    local: crate::desc::OpDesc::decode(op.desc)
                        .ok_or_else(|| CclError::Internal("bad local descriptor".into()))?,
                    remote: crate::desc::OpDesc::decode(got),
                };
                return Err(me.inconsistent(&m));
            }
            ring_bell(&me.t.peer_bells, Some(peer));
            me.start_pending(op.item);
            if let Some(b) = me.cur.block {
                me.shared.frame.add_recv(b, 0, 1);
            }
            Ok(Some(()))
        })
    }

    /// Polls `poll` until it returns `Some`, waiting like the ring executor between polls.
    fn tree_wait<T>(
        &mut self,
        op: &TreeOp<'_>,
        peer: usize,
        w: &mut Waiter,
        mut poll: impl FnMut(&mut Worker) -> Result<Option<T>>,
    ) -> Result<T> {
        loop {
            if let Some(v) = poll(self)? {
                if w.announced.take().is_some() {
                    self.t.bell.unannounce();
                }
                w.backoff.reset();
                w.peer_check.progressed();
                w.driver.progressed();
                return Ok(v);
            }
            if self.shared.abort.load(Ordering::Acquire) {
                return Err(CclError::Aborted(format!(
                    "rank {}: ncclCommAbort called while the operation was in flight",
                    self.shared.rank
                )));
            }
            self.check_poison()?;
            if w.backoff.is_parking() {
                self.check_partner(op, peer)?;
            }
            w.polls = w.polls.wrapping_add(1);
            let check_now =
                !w.backoff.is_timed_spin() || w.polls.is_multiple_of(Backoff::CLOCK_EVERY);
            if check_now && self.check_peers(&mut w.peer_check, super::now_ns(), [peer])? {
                continue;
            }
            if !w.spin_checked {
                // First wait of the operation: no spinning if a peer shares our CPU; a
                // start still pending runs now, while the partner is awaited, and the
                // peer checks count from it.
                w.spin_checked = true;
                self.start_pending(op.item);
                w.peer_check.arm(self.cur.t_start);
                if self.peer_on_my_cpu() {
                    w.backoff = Backoff::with_yield(self.yield_for);
                }
            }
            match w.announced.take() {
                Some(seen) => {
                    self.t.bell.wait_announced(seen, w.backoff.park_duration());
                    self.t.bell.unannounce();
                    w.backoff.pause();
                }
                None if w.backoff.is_parking() => {
                    self.t.release_sockets();
                    w.announced = Some(self.t.bell.announce());
                }
                None if w.driver.drive(&self.t) => {}
                None => w.backoff.pause(),
            }
        }
    }
}

impl Worker {
    /// A rank that waits long for `peer` compares the collective `peer` is running with its
    /// own: the same sequence number with another descriptor is an inconsistent call
    /// (which may run another algorithm, so that no message would ever show it).
    /// A peer on another host is asked through the socket proxy; its answer is compared
    /// at the next check (this one compares the previous answer, if any).
    fn check_partner(&mut self, op: &TreeOp<'_>, peer: usize) -> Result<()> {
        if let Some(Some(query)) = self.t.peer_query.get(peer) {
            query.get().store(1, Ordering::Release);
            if let Some(Some(proxy)) = self.t.peer_bells.get(peer) {
                proxy.ring();
            }
        }
        let Some(Some(words)) = self.t.peer_current.get(peer) else {
            return Ok(());
        };
        let Some(got) = super::read_current(words) else {
            return Ok(());
        };
        if !op.check || got[0] != op.desc[0] || got == op.desc {
            return Ok(());
        }
        let m = crate::desc::Mismatch {
            peer,
            channel: 0,
            local: crate::desc::OpDesc::decode(op.desc)
                .ok_or_else(|| CclError::Internal("bad local descriptor".into()))?,
            remote: crate::desc::OpDesc::decode(got),
        };
        Err(self.inconsistent(&m))
    }
}

/// Smallest chunk a 2-rank Tree runs without its scratch accumulator
/// ([`Worker::tree_pair_chunk`]). Below it the two saved copies are a few cache lines;
/// with the direct path at every size, 8-64 B measured 6 % slower in two runs (about
/// this VM's run-to-run spread), so small chunks keep the path they had
/// (docs/performance.md, "Tree on 2 ranks without the scratch copies").
const PAIR_MIN_BYTES: usize = 2048;

/// Whether the `bytes`-long buffers at `a` and `b` share any byte.
fn overlap(a: usize, b: usize, bytes: usize) -> bool {
    a < b.saturating_add(bytes) && b < a.saturating_add(bytes)
}

fn wrong_len(got: usize, want: usize, peer: usize) -> CclError {
    CclError::Remote(format!(
        "Tree message of {got} bytes from rank {peer}, expected {want} (mismatched operations?)"
    ))
}

/// Algorithm and protocol of `item` on a host communicator of `nranks` ranks (with socket
/// links if `over_sockets`) with selection `sel`. Injected faults (`CCLD_INJECT`,
/// `injecting`) act on ring schedules, so such runs keep to Ring/Simple.
pub(crate) fn host_choice(
    item: &WorkItem,
    nranks: usize,
    t: &Tuning,
    sel: &Selection,
    injecting: bool,
    over_sockets: bool,
) -> (HostAlgo, HostProto) {
    match item {
        WorkItem::Coll(c) if !injecting => sel.choose(
            c.kind,
            c.count * c.dtype.size(),
            nranks,
            t.min_channels,
            over_sockets,
        ),
        _ => (HostAlgo::Ring, HostProto::Simple),
    }
}

/// Per-channel message counts `item` is expected to make on `rank` (the probe's expected
/// SendCount/RecvCount), for the algorithm [`host_choice`] picks with the process
/// environment's `NCCL_ALGO`, `NCCL_PROTO` and `CCLD_INJECT`.
pub(crate) fn expected_counts(
    item: &WorkItem,
    rank: usize,
    nranks: usize,
    t: &Tuning,
    over_sockets: bool,
) -> Result<Vec<schedule::ExpectedCounts>> {
    let sel = Selection::parse(
        crate::env::var(crate::hostalgo::ENV_ALGO)?.as_deref(),
        crate::env::var(crate::proto::ENV_PROTO)?.as_deref(),
    )?;
    let injecting = crate::env::var(&ccl_params::CCLD_INJECT)?.is_some();
    match (
        host_choice(item, nranks, t, &sel, injecting, over_sockets),
        item,
    ) {
        ((HostAlgo::Tree, proto), WorkItem::Coll(c)) => {
            let steps = crate::tree::steps(rank, nranks);
            let (send, recv) = tree_counts(c, proto, step_messages(&steps), t);
            Ok(vec![schedule::ExpectedCounts { send, recv }])
        }
        _ => Ok(super::plan_for(item, rank, nranks, t)?.expected_counts()),
    }
}

/// Messages one pass of `steps` sends and receives.
pub(super) fn step_messages(steps: &[crate::tree::TreeStep]) -> (u64, u64) {
    steps
        .iter()
        .map(|s| s.messages())
        .fold((0, 0), |(a, b), (s, r)| (a + s, b + r))
}

/// Messages a Tree AllReduce sends and receives on a rank whose Tree steps send and
/// receive `step_msgs` ([`step_messages`]) per chunk (all on channel 0).
pub(super) fn tree_counts(
    c: &CollOp,
    proto: HostProto,
    (send, recv): (u64, u64),
    t: &Tuning,
) -> (u64, u64) {
    let es = c.dtype.size();
    let msg = message_bytes(proto, t.slot_bytes, es);
    let chunks = (c.count * es).div_ceil(msg) as u64;
    (send * chunks, recv * chunks)
}
