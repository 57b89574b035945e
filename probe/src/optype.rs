//! The per-rank log of the last [`FRAME_BLOCKS`] operations and their state. The operation
//! type set itself (CCL-D section 5: collective, algorithm, protocol, dtype, count, redop,
//! root/peer, channels) is the leaf crate `ccl-optype`, re-exported here.
//!
//! Ranks of one round must agree on the type set; a disagreement is the H2 "inconsistent"
//! evidence. The log is written by the executor and read lock-free by the diagnostic thread
//! through a sequence lock per slot.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::frame::FRAME_BLOCKS;

pub use ccl_optype::{Algo, CollKind, OpTypeSet, Proto};

/// Where an operation is in its life.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpState {
    /// Started, not finished.
    InFlight = 0,
    /// Finished successfully.
    Completed = 1,
    /// Finished with an error (abort, peer failure).
    Failed = 2,
}

/// A consistent copy of one log slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSnapshot {
    /// Full operation counter.
    pub op_counter: u64,
    /// Type set.
    pub info: OpTypeSet,
    /// Start time, nanoseconds on the rank's monotonic clock.
    pub start_ns: u64,
    /// End time (0 while in flight).
    pub end_ns: u64,
    /// Whether `end_ns` was read from the clock at the end (false: an estimate to within
    /// the diagnostic thread's sampling period, [`EndTime::estimate`]).
    pub timed: bool,
    /// State.
    pub state: OpState,
}

/// An operation's end as [`OpLog::finish`] stored it: what its completion needs to be
/// thinned (`Source::op_done`), without the type set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    /// Full operation counter.
    pub op_counter: u64,
    /// Start time (the entry's).
    pub start_ns: u64,
    /// End time.
    pub end_ns: u64,
    /// Whether `end_ns` was read from the clock.
    pub timed: bool,
    /// `Completed` or `Failed`.
    pub state: OpState,
}

/// When an operation ended, as [`OpLog::finish`] records it.
///
/// The probe reads the clock at the end of the operations whose records it may report
/// (`Source::start_op`); a completion that record thinning leaves out gets an estimate
/// instead, since one clock read is a few percent of a sub-microsecond operation. An
/// estimated end serves the diagnostic thread's "idle since" check and, should the
/// completion be reported after all (`Sampler::backfill`), a duration the analyzer
/// counts the round's completion by but never times a round with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndTime {
    /// Nanoseconds on the rank's monotonic clock ([`crate::now_ns`]).
    pub ns: u64,
    /// Read from the clock at the end (false: estimated).
    pub timed: bool,
}

impl EndTime {
    /// An end read from the clock.
    pub fn exact(ns: u64) -> EndTime {
        EndTime { ns, timed: true }
    }

    /// An estimated end.
    pub fn estimate(ns: u64) -> EndTime {
        EndTime { ns, timed: false }
    }
}

const SLOT_WORDS: usize = 8;

#[derive(Debug)]
struct Slot {
    /// Even: stable; odd: being written.
    seq: AtomicU64,
    words: [AtomicU64; SLOT_WORDS],
}

/// Ring of the last [`FRAME_BLOCKS`] operations of one rank (slot = counter % blocks, like
/// the frame), single writer, lock-free readers.
#[derive(Debug)]
pub struct OpLog {
    slots: [Slot; FRAME_BLOCKS],
}

impl Default for OpLog {
    fn default() -> Self {
        Self::new()
    }
}

/// Bit of the state word (word 1): the end time was read from the clock.
const TIMED_BIT: u64 = 1 << 40;

#[inline]
fn encode(op_counter: u64, i: &OpTypeSet, start_ns: u64, end_ns: u64, st: OpState) -> [u64; 8] {
    [
        op_counter,
        u64::from(i.coll as u8)
            | u64::from(i.algo as u8) << 8
            | u64::from(i.proto as u8) << 16
            | u64::from(i.dtype) << 24
            | u64::from(st as u8) << 32
            | TIMED_BIT,
        u64::from(i.redop as u32) | u64::from(i.n_channels) << 32,
        i.count,
        i.bytes,
        u64::from(i.root as u32) | u64::from(i.peer as u32) << 32,
        start_ns,
        end_ns,
    ]
}

fn decode(w: &[u64; 8]) -> Option<OpSnapshot> {
    let state = match (w[1] >> 32) as u8 {
        0 => OpState::InFlight,
        1 => OpState::Completed,
        2 => OpState::Failed,
        _ => return None,
    };
    Some(OpSnapshot {
        op_counter: w[0],
        info: OpTypeSet {
            coll: CollKind::from_u8(w[1] as u8)?,
            algo: Algo::from_u8((w[1] >> 8) as u8)?,
            proto: Proto::from_u8((w[1] >> 16) as u8)?,
            dtype: (w[1] >> 24) as u8,
            redop: w[2] as u32 as i32,
            n_channels: (w[2] >> 32) as u32,
            count: w[3],
            bytes: w[4],
            root: w[5] as u32 as i32,
            peer: (w[5] >> 32) as u32 as i32,
        },
        start_ns: w[6],
        end_ns: w[7],
        timed: w[1] & TIMED_BIT != 0,
        state,
    })
}

impl OpLog {
    /// An empty log.
    pub fn new() -> Self {
        OpLog {
            slots: std::array::from_fn(|_| Slot {
                seq: AtomicU64::new(0),
                words: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
        }
    }

    #[inline]
    fn write(&self, op_counter: u64, words: [u64; 8]) {
        let slot = &self.slots[(op_counter % FRAME_BLOCKS as u64) as usize];
        let s = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        for (dst, v) in slot.words.iter().zip(words) {
            dst.store(v, Ordering::Relaxed);
        }
        slot.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// Records the start of operation `op_counter` (single writer).
    #[inline]
    pub fn start(&self, op_counter: u64, info: &OpTypeSet, start_ns: u64) {
        self.write(
            op_counter,
            encode(op_counter, info, start_ns, 0, OpState::InFlight),
        );
    }

    /// Records the end of operation `op_counter` (single writer) and returns what its
    /// completion needs to be thinned ([`Finished`]); a completion that is reported reads
    /// the whole entry afterwards ([`OpLog::get`]). Ignored (`None`) if the slot was
    /// already reused by a later operation.
    ///
    /// Only the writer changes a slot, so it reads its own slot without the sequence
    /// check, reads only the words a thinned completion needs (counter, state, start
    /// time) and rewrites only the two that change (state, end time): most completions
    /// are thinned out, and this runs on the operation's return path.
    #[inline]
    pub fn finish(&self, op_counter: u64, end: EndTime, ok: bool) -> Option<Finished> {
        let slot = &self.slots[(op_counter % FRAME_BLOCKS as u64) as usize];
        if slot.seq.load(Ordering::Relaxed) == 0
            || slot.words[0].load(Ordering::Relaxed) != op_counter
        {
            return None;
        }
        let state = if ok {
            OpState::Completed
        } else {
            OpState::Failed
        };
        let timed = if end.timed { TIMED_BIT } else { 0 };
        let w1 = slot.words[1].load(Ordering::Relaxed);
        let state_word = (w1 & !(0xff << 32) & !TIMED_BIT) | u64::from(state as u8) << 32 | timed;
        let start_ns = slot.words[6].load(Ordering::Relaxed);
        let s = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        slot.words[1].store(state_word, Ordering::Relaxed);
        slot.words[7].store(end.ns, Ordering::Relaxed);
        slot.seq.store(s.wrapping_add(2), Ordering::Release);
        Some(Finished {
            op_counter,
            start_ns,
            end_ns: end.ns,
            timed: end.timed,
            state,
        })
    }

    /// Consistent copy of the slot of `op_counter`, if it still holds that operation.
    pub fn get(&self, op_counter: u64) -> Option<OpSnapshot> {
        let slot = &self.slots[(op_counter % FRAME_BLOCKS as u64) as usize];
        loop {
            let s1 = slot.seq.load(Ordering::Acquire);
            if s1 == 0 {
                return None;
            }
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mut w = [0u64; 8];
            for (d, src) in w.iter_mut().zip(&slot.words) {
                *d = src.load(Ordering::Relaxed);
            }
            std::sync::atomic::fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) == s1 {
                let snap = decode(&w)?;
                return (snap.op_counter == op_counter).then_some(snap);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> OpTypeSet {
        OpTypeSet {
            coll: CollKind::ReduceScatter,
            algo: Algo::Ring,
            proto: Proto::Simple,
            dtype: 9,
            redop: 4,
            count: 1 << 40,
            bytes: 3 << 40,
            root: -1,
            peer: 7,
            n_channels: 8,
        }
    }

    #[test]
    fn start_finish_round_trip_and_slot_reuse() {
        let log = OpLog::new();
        assert!(log.get(0).is_none());
        log.start(3, &info(), 111);
        let s = log.get(3).unwrap();
        assert_eq!(s.info, info());
        assert_eq!((s.start_ns, s.end_ns, s.state), (111, 0, OpState::InFlight));
        let fin = log.finish(3, EndTime::exact(222), true).unwrap();
        assert_eq!(
            fin,
            Finished {
                op_counter: 3,
                start_ns: 111,
                end_ns: 222,
                timed: true,
                state: OpState::Completed
            },
            "finish returns what it stored"
        );
        assert_eq!(log.get(3).unwrap().state, OpState::Completed);
        assert_eq!(log.get(3).unwrap().end_ns, 222);
        log.start(11, &info(), 333);
        assert!(log.get(3).is_none(), "slot reused by op 11");
        assert!(
            log.finish(3, EndTime::exact(444), false).is_none(),
            "stale finish is ignored"
        );
        assert_eq!(log.get(11).unwrap().state, OpState::InFlight);
        let fin = log.finish(11, EndTime::exact(555), false).unwrap();
        assert_eq!(
            (fin.start_ns, fin.end_ns, fin.state),
            (333, 555, OpState::Failed)
        );
        let failed = log.get(11).unwrap();
        assert_eq!(
            (failed.info, failed.start_ns, failed.end_ns, failed.state),
            (info(), 333, 555, OpState::Failed)
        );
        assert!(failed.timed);
    }

    #[test]
    fn an_estimated_end_is_kept_apart_from_a_timed_one() {
        let log = OpLog::new();
        log.start(5, &info(), 100);
        let fin = log.finish(5, EndTime::estimate(900), true).unwrap();
        assert_eq!(
            (fin.end_ns, fin.timed, fin.state),
            (900, false, OpState::Completed)
        );
        let entry = log.get(5).unwrap();
        assert_eq!(
            (entry.end_ns, entry.timed, entry.state, entry.start_ns),
            (900, false, OpState::Completed, 100)
        );
        // The slot's next operation starts timed again, whatever the last one was.
        log.start(13, &info(), 1_000);
        let fin = log.finish(13, EndTime::exact(1_200), true).unwrap();
        assert!(fin.timed && log.get(13).unwrap().timed);
        assert_eq!(log.get(13).unwrap().info, info());
    }

    #[test]
    fn enums_round_trip() {
        for k in CollKind::ALL {
            assert_eq!(CollKind::from_u8(k as u8), Some(k));
        }
        assert_eq!(CollKind::from_u8(10), None);
        assert_eq!(Algo::from_u8(2), Some(Algo::P2p));
        assert_eq!(Proto::from_u8(3), None);
    }
}
