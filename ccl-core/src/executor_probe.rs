//! The probe's part of running one operation on the host executor: its start (sequence
//! space and record thinning, frame block and expected counts, op-log entry) and its end
//! (end time, op-log entry, completion or failure record). A Tree AllReduce defers the
//! start until its first message is on its way (`executor_tree.rs` calls
//! [`Worker::start_pending_probe`]), so that the bookkeeping overlaps the wait for the
//! partner's message; every other operation starts the probe before its first step.

use std::time::Duration;

use super::{now_ns, Worker};
use crate::error::Result;
use crate::schedule::Lane;

/// Longest wait for the probe to deliver the record of a failed operation.
const FAILURE_FLUSH: Duration = Duration::from_millis(500);

/// What the probe's start of one operation needs ([`Worker::probe_begin`]); the worker
/// keeps one and fills it in place for every probed operation.
#[derive(Debug, Default)]
pub(super) struct ProbeStart {
    pub(super) counter: u64,
    pub(super) seq: probe::OpSeq,
    /// Set for every operation started (`None` only before the first).
    pub(super) info: Option<probe::OpTypeSet>,
    pub(super) t_start: u64,
    pub(super) n_channels: usize,
    /// A Tree AllReduce's messages on channel 0 (sent, received); ring plans' expected
    /// counts come from their lanes.
    pub(super) tree_expected: Option<(u64, u64)>,
}

impl Worker {
    /// Starts the probe of the operation in `probe_next`: now, with the expected counts of
    /// `lanes`, or (`None`: a Tree AllReduce) once its first message is sent (the
    /// executor runs a start still pending before [`Worker::probe_end`], which sets
    /// `probe_timed`).
    pub(super) fn probe_begin(&mut self, lanes: Option<&[Lane]>) {
        match lanes {
            Some(lanes) => self.probe_timed = self.probe_start(lanes),
            None => self.probe_pending = true,
        }
    }

    /// The probe's start of the current operation (`probe_next`): its sequence space and
    /// record thinning (`Source::start_op`), its frame block with what the schedule
    /// expects of each channel (the analyzer's progress fractions of a hung operation,
    /// H3), its op-log entry. Returns whether its end is read from the clock.
    fn probe_start(&self, lanes: &[Lane]) -> bool {
        let (sh, s) = (&self.shared, &self.probe_next);
        // Before the frame shows the operation: its records and the heartbeats number it
        // in its sequence space (collective / p2p), not by the local counter.
        let timed = sh
            .source
            .as_ref()
            .is_none_or(|src| src.start_op(s.counter, &s.seq, s.t_start));
        let b = sh.frame.begin_op(sh.comm_id, s.counter, s.n_channels);
        for lane in lanes {
            let (send, recv) = lane.step_counts();
            sh.frame.add_expected(b, lane.channel, send, recv);
        }
        if let Some((send, recv)) = s.tree_expected {
            sh.frame.add_expected(b, 0, send, recv);
        }
        if let Some(info) = &s.info {
            sh.op_log.start(s.counter, info, s.t_start);
        }
        timed
    }

    /// Runs the probe start a Tree operation deferred, if it is still pending: before the
    /// operation's first count goes into its frame block, at its first wait, or at its end.
    pub(super) fn start_pending_probe(&mut self) {
        if self.probe_pending {
            self.probe_pending = false;
            self.probe_timed = self.probe_start(&[]);
        }
    }

    /// The probe's end of operation `counter` (started at `t_start`) with result `r`: its
    /// end time (`Source::end_time`), its op-log entry, and its completion record, or for a
    /// failure the record with its cause, delivered before the error returns (the process
    /// may end right after it).
    pub(super) fn probe_end(&mut self, counter: u64, t_start: u64, r: &Result<()>) {
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
