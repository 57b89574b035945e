//! The start and end of one operation on the host executor, and the probe's part of them.
//! The start ([`Worker::begin_item`]) counts the operation, reads its start time, starts
//! the probe (sequence space and record thinning, frame block and expected counts, op-log
//! entry) and logs the call; the end ([`Worker::finish_item`]) gives the probe the end
//! time, op-log entry and completion or failure record. A Tree AllReduce defers its start
//! until its first message is on its way (`executor_tree.rs` calls
//! [`Worker::start_pending`]), so that the bookkeeping overlaps the partner's receiving
//! that message instead of delaying it; every other operation starts before its first
//! step.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ccl_optype::{Algo, Proto};

use super::{call_logged, log_call, now_ns, publish_current, tree_counts, Worker};
use crate::error::Result;
use crate::hostalgo::HostProto;
use crate::op::{type_set, WorkItem};
use crate::schedule::{Lane, Plan};
use crate::transport::shm::FifoLayout;

/// Longest wait for the probe to deliver the record of a failed operation.
const FAILURE_FLUSH: Duration = Duration::from_millis(500);

/// What the probe's start of one operation needs ([`Worker::probe_start`]), borrowed from
/// [`Worker::begin_item`]'s arguments (nothing is moved or copied per operation).
struct ProbeStart<'a> {
    counter: u64,
    seq: &'a probe::OpSeq,
    info: &'a probe::OpTypeSet,
    t_start: u64,
    n_channels: usize,
    /// What the schedule expects of each channel: a ring plan's lanes, or a Tree
    /// AllReduce's messages on channel 0 (sent, received).
    expected: Expected<'a>,
}

/// The per-channel step counts an operation is expected to complete ([`ProbeStart`]).
enum Expected<'a> {
    Lanes(&'a [Lane]),
    Tree(u64, u64),
}

/// The current operation as [`Worker::begin_item`] started it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct OpStart {
    /// The communicator's operation counter (op log, frame block).
    pub(super) counter: u64,
    /// Start time, [`super::now_ns`] clock.
    pub(super) t_start: u64,
    /// Whether the probe records this operation.
    pub(super) probing: bool,
    /// Its frame block, when probing.
    pub(super) block: Option<usize>,
}

/// A Tree operation's start, deferred to its first message ([`Worker::start_pending`]).
#[derive(Clone, Debug)]
pub(super) struct PendingStart {
    pub(super) seq: probe::OpSeq,
    pub(super) desc: [u64; FifoLayout::DESC_WORDS],
    pub(super) proto: HostProto,
    pub(super) probing: bool,
}

impl Worker {
    /// Starts operation `item` (numbered `seq` in its sequence space) into `self.cur`:
    /// counts it, reads its start time, starts the probe when `probing` (with the expected
    /// counts of `plan`'s lanes, or for a Tree operation, `tree` = its protocol, of its
    /// Tree steps) and logs the call (NCCL's INFO line). `halve`: an injected h2 fault
    /// makes this rank run half of it.
    pub(super) fn begin_item(
        &mut self,
        item: &WorkItem,
        seq: &probe::OpSeq,
        probing: bool,
        tree: Option<HostProto>,
        plan: &Plan,
        halve: bool,
    ) {
        let sh = &self.shared;
        // The operation's type set, for the probe's op log and NCCL's INFO line: not
        // built when neither wants it (probe off and INFO not logged).
        let logging = call_logged(item);
        let info = (probing || logging).then(|| {
            let mut info = type_set(item, sh.nranks, plan);
            if let Some(proto) = tree {
                info.algo = Algo::Tree;
                info.proto = match proto {
                    HostProto::Ll => Proto::Ll,
                    HostProto::Simple => Proto::Simple,
                };
            }
            if halve {
                info.count /= 2;
                info.bytes /= 2;
            }
            info
        });
        // Only this executor (under the worker lock) counts this communicator's
        // operations: a plain load and store, no locked read-modify-write.
        let counter = sh.op_counter.load(Ordering::Relaxed);
        sh.op_counter.store(counter + 1, Ordering::Release);
        // One clock read for the op log's start time and the peer-check timer.
        let t_start = now_ns();
        // The operation's frame block (`Frame::begin_op` claims `counter % FRAME_BLOCKS`).
        let block = probing.then_some((counter % probe::FRAME_BLOCKS as u64) as usize);
        if let (true, Some(info)) = (probing, &info) {
            let expected = match (tree, item) {
                (Some(proto), WorkItem::Coll(c)) => {
                    let (send, recv) = tree_counts(c, proto, self.tree_msgs, &sh.tuning);
                    Expected::Tree(send, recv)
                }
                (Some(_), WorkItem::P2p(_)) => Expected::Lanes(&[]),
                (None, _) => Expected::Lanes(&plan.lanes),
            };
            self.probe_timed = self.probe_start(&ProbeStart {
                counter,
                seq,
                info,
                t_start,
                n_channels: plan.n_channels,
                expected,
            });
        }
        if let (true, Some(info)) = (logging, &info) {
            let sh = &self.shared;
            log_call(item, info, sh.rank, sh.nranks, sh.comm_id, counter, None);
        }
        self.cur = OpStart {
            counter,
            t_start,
            probing,
            block,
        };
    }

    /// Runs a Tree operation's deferred start ([`PendingStart`]), if it is still pending:
    /// after its first message is committed, at its first wait, or at its end (a failure
    /// before its first message). It publishes the operation's descriptor then.
    pub(super) fn start_pending(&mut self, item: &WorkItem) {
        if let Some(p) = self.pending.take() {
            publish_current(&self.t.current, Some(p.desc));
            let plan = Plan::stepless();
            self.begin_item(item, &p.seq, p.probing, Some(p.proto), &plan, false);
        }
    }

    /// The end of operation `item` with result `r`: a start still pending runs first; an
    /// injected h2 fault (`halve`) leaves this rank diverged; a lost peer is logged; the
    /// probe gets the end ([`Worker::probe_end`]).
    pub(super) fn finish_item(
        &mut self,
        item: &WorkItem,
        r: Result<()>,
        halve: bool,
    ) -> Result<()> {
        self.start_pending(item);
        if halve {
            self.diverged = true;
        }
        let sh = &self.shared;
        if let (Err(e), Some(f)) = (&r, &self.failure) {
            if f.cause == probe::FailureCause::PeerLost {
                tracing::warn!(target: "nccl::NET", rank = sh.rank,
                    "comm {:#018x} rank {}: peer lost during {}: {e}", sh.comm_id, sh.rank,
                    item.label());
            }
        }
        let OpStart {
            counter,
            t_start,
            probing,
            ..
        } = self.cur;
        if probing {
            self.probe_end(counter, t_start, &r);
        }
        r
    }

    /// The probe's start of operation `s`: its sequence space and record thinning
    /// (`Source::start_op`), its frame block with what the schedule expects of each
    /// channel (the analyzer's progress fractions of a hung operation, H3), its op-log
    /// entry. Returns whether its end is read from the clock.
    #[inline]
    fn probe_start(&self, s: &ProbeStart<'_>) -> bool {
        let sh = &self.shared;
        // Before the frame shows the operation: its records and the heartbeats number it
        // in its sequence space (collective / p2p), not by the local counter.
        let timed = sh
            .source
            .as_ref()
            .is_none_or(|src| src.start_op(s.counter, s.seq, s.t_start));
        let b = sh.frame.begin_op(sh.comm_id, s.counter, s.n_channels);
        match s.expected {
            Expected::Lanes(lanes) => {
                for lane in lanes {
                    let (send, recv) = lane.step_counts();
                    sh.frame.add_expected(b, lane.channel, send, recv);
                }
            }
            Expected::Tree(send, recv) => sh.frame.add_expected(b, 0, send, recv),
        }
        sh.op_log.start(s.counter, s.info, s.t_start);
        timed
    }

    /// The probe's end of operation `counter` (started at `t_start`) with result `r`: its
    /// end time (`Source::end_time`), its op-log entry, and its completion record, or for a
    /// failure the record with its cause, delivered before the error returns (the process
    /// may end right after it).
    fn probe_end(&mut self, counter: u64, t_start: u64, r: &Result<()>) {
        let sh = &self.shared;
        let end = match &sh.source {
            Some(src) => src.end_time(counter, t_start, self.probe_timed, r.is_ok()),
            None => probe::EndTime::exact(now_ns()),
        };
        let fin = sh.op_log.finish(counter, end, r.is_ok());
        if let (Some(src), Some(fin)) = (&sh.source, fin) {
            match r {
                Ok(()) => src.op_done_wire(&fin, &self.peer_wire),
                Err(e) => {
                    let f = self
                        .failure
                        .take()
                        .unwrap_or_else(|| crate::desc::classify(e));
                    src.op_failed(&fin, f);
                    probe::diag::flush(FAILURE_FLUSH);
                }
            }
        }
        self.peer_wire.clear();
    }
}
