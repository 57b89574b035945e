//! The diagnostic thread (CCL-D section 5.2): one per process, serving
//! every communicator.
//!
//! # Registration
//! The runtime registers each communicator rank with [`register`] at init (its frame, op
//! log, identity and ring neighbours, and the [`RankGroup`] of the rank's communicators,
//! whose operations' time comes out of its computation gaps) and keeps the returned
//! [`Source`]; dropping the last `Arc<Source>` (the executor's, at destroy) unregisters
//! it. The probe never depends on the runtime. On completion of an operation the executor
//! calls [`Source::op_done`], which copies the operation's counters into a small message
//! and `try_send`s it to a bounded queue: the collective path never blocks; a full queue
//! drops the message and counts it.
//!
//! # Sampling
//! Every `CCLD_SAMPLE_US` (default 1000) the thread reads every registered frame. For the
//! operation in flight it counts, per channel, the sampling ticks in which SendCount /
//! RecvCount changed: the paper's SendRate / RecvRate is the reciprocal of that number
//! (`send_rate`, `recv_rate`); plain counts per second are reported too (`send_per_sec`,
//! `recv_per_sec`). Completed operations become one record each; an operation still in
//! flight after `CCLD_INFLIGHT_MS` (default 1000) gets an in-flight snapshot every
//! `CCLD_INFLIGHT_MS` (a hung operation never completes). A heartbeat per process (every
//! `CCLD_HEARTBEAT_MS`, default 1000) carries every rank's newest operation counter and the
//! cumulative drop count.
//!
//! # Delivery
//! Records and heartbeats go in batches to a [`Sink`] on a separate reporter thread (bounded
//! queue again, drops counted): the embedded analyzer ([`crate::embedded`]), a remote
//! analyzer cluster ([`crate::reporter`]) or nowhere.
//!
//! # Rooms
//! This file: the clock, [`Identity`], [`Source`] and the registry of sources.
//! `diag/config.rs`: [`DiagConfig`] from the environment; `diag/sampler.rs`: the
//! [`Sampler`] that reads frames into records; `diag/thread.rs`: the diagnostic and
//! reporter threads, batching and [`flush`].

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use ccld_wire as wire;

use crate::frame::Frame;
use crate::optype::{EndTime, Finished, OpLog, OpSnapshot, OpState};
use crate::sched::CpuWaitTracker;
use crate::seqspace::{OpSeq, SeqLog, SeqSpace};
use crate::thin;

mod config;
mod rank_group;
mod sampler;
#[cfg(test)]
mod tests;
mod thread;

pub use config::*;
pub use rank_group::RankGroup;
pub use sampler::*;
pub use thread::*;

/// `CLOCK_MONOTONIC` in nanoseconds (the clock `Instant` reads on Linux), as one integer.
fn clock_monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on every Linux,
    // so the call cannot fail (a failure would leave zeros: time 0, never a fault).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Monotonic nanoseconds since the first call in this process (the clock of op-log
/// timestamps, of the executors' wait timers and of the embedded analyzer). One clock read
/// and a subtraction: it runs at least twice per operation, where converting an `Instant`
/// (a `Duration` and a 128-bit multiply) cost as many instructions again as the read.
pub fn now_ns() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    let now = clock_monotonic_ns();
    now.saturating_sub(*BASE.get_or_init(|| now))
}

/// The diagnostic thread's latest [`now_ns`] reading, stored at every sampling tick (0
/// before its first): what an operation whose end is not timed takes as its end
/// ([`Source::end_time`]), at most one sampling period old while the thread runs.
static COARSE_NS: AtomicU64 = AtomicU64::new(0);

/// [`COARSE_NS`]: a load, no clock read.
fn coarse_now_ns() -> u64 {
    COARSE_NS.load(Ordering::Relaxed)
}

/// Stored by the diagnostic thread at each tick.
pub(crate) fn set_coarse_now(now_ns: u64) {
    COARSE_NS.store(now_ns, Ordering::Relaxed);
}

/// Identity of one communicator rank, given at registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Communicator id (Trace ID).
    pub comm_id: u64,
    /// Rank in the communicator.
    pub rank: u32,
    /// Communicator size.
    pub nranks: u32,
    /// Device ordinal, -1 on the host backend.
    pub device: i32,
    /// Ring predecessor / successor of this rank (every channel uses the same ring).
    pub ring_prev: u32,
    /// See `ring_prev`.
    pub ring_next: u32,
}

/// A registered communicator rank (see the module docs).
#[derive(Debug)]
pub struct Source {
    id: u64,
    ident: Identity,
    frame: Arc<Frame>,
    op_log: Arc<OpLog>,
    /// Kernel thread id of the thread that completed the latest operation on the host
    /// backend (0: none yet): whose run-queue delay is this rank's CPU wait (`sched`).
    exec_tid: AtomicI32,
    thin: ThinState,
    /// Target interval between reported completions (`CCLD_RECORD_US` at registration).
    record_ns: u64,
    /// Sequence-space identity of the recent operations ([`crate::seqspace`]).
    seqs: SeqLog,
    /// The rank's communicators ([`RankGroup`]): their operations' time is taken out of
    /// this one's computation gaps.
    group: Arc<RankGroup>,
    /// This source's cumulative time in its operations (ns), its member counter in
    /// `group`. Written by the completing thread only.
    busy: Arc<rank_group::BusyCounter>,
    /// The latest call that failed before it became an operation ([`Source::note_call_failed`]).
    call_error: Mutex<Option<CallError>>,
}

/// A call of a rank that failed before it became an operation, and where the rank's
/// sequence spaces stood then.
#[derive(Debug)]
struct CallError {
    /// (latest collective, p2p groups started) when it failed.
    at: (Option<u64>, Option<u64>),
    text: String,
}

/// One rank's record thinning ([`thin`]) and computation-gap bookkeeping. Written by the
/// thread completing the rank's operations (one at a time, in counter order); counters are
/// stored plus one so that 0 means "none".
#[derive(Debug, Default)]
struct ThinState {
    /// Stride in force (0 and 1: every operation reported).
    stride: AtomicU32,
    /// Counter + 1 and start time of the operation that opened the current epoch.
    epoch_counter: AtomicU64,
    epoch_start_ns: AtomicU64,
    /// Counter + 1 and end time of the latest completed operation, and whether that end
    /// was timed (else the next operation's computation gap is unknown).
    last_counter: AtomicU64,
    last_end_ns: AtomicU64,
    last_timed: AtomicBool,
    /// The group's time in operations ([`RankGroup::busy_ns`]) at that end, read when it
    /// was timed.
    last_end_busy_ns: AtomicU64,
    /// Counter + 1 of the latest operation whose start read the group's time in
    /// operations (`start_busy_ns`): a start whose completion is reported.
    start_busy_of: AtomicU64,
    start_busy_ns: AtomicU64,
    /// Counter + 1 of the latest operation whose start decided to report its completion
    /// ([`Source::start_op`]).
    report_of: AtomicU64,
    /// The latest start's prediction for the next collective: its number + 1, shifted
    /// left by one, with the selection (under the stride of that start) in bit 0.
    predicted: AtomicU64,
    /// Counter + 1 of the latest operation the diagnostic thread sent an in-flight
    /// snapshot of: its completion is reported whatever the stride.
    snapshotted: AtomicU64,
    /// Completions reported / left out by thinning (operations run while probing was
    /// paused are neither).
    reported: AtomicU64,
    skipped: AtomicU64,
    /// Bit `c % 64` set: the completion of operation `c` (of the last 64) was reported.
    recent: AtomicU64,
}

/// Counters of one channel at completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ChanDone {
    send: u64,
    recv: u64,
    up: u64,
    down: u64,
    exp_send: u64,
    exp_recv: u64,
    wire: u64,
}

/// One channel's counters in `block` of `frame`.
fn chan_done(frame: &Frame, block: usize, c: usize) -> ChanDone {
    let k = frame.counts(block, c);
    let w = frame.waits(block, c);
    let (exp_send, exp_recv) = frame.expected(block, c);
    ChanDone {
        send: k.send_count,
        recv: k.recv_count,
        up: w.upstream_ns,
        down: w.downstream_ns,
        exp_send,
        exp_recv,
        wire: w.wire_ns,
    }
}

/// Channels whose counters travel inline in a completion message (more spill to the heap).
const INLINE_CHANS: usize = 4;

/// The channels of a completion: inline up to [`INLINE_CHANS`] (no allocation on the
/// collective path for the host backend's default of at most 4 channels), else on the heap.
/// The inline variant is large on purpose (it replaces an allocation per operation).
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum DoneChans {
    Inline(usize, [ChanDone; INLINE_CHANS]),
    Heap(Vec<ChanDone>),
}

impl DoneChans {
    fn collect(n: usize, f: impl Fn(usize) -> ChanDone) -> DoneChans {
        if n <= INLINE_CHANS {
            let mut a = [ChanDone::default(); INLINE_CHANS];
            for (c, slot) in a.iter_mut().enumerate().take(n) {
                *slot = f(c);
            }
            DoneChans::Inline(n, a)
        } else {
            DoneChans::Heap((0..n).map(f).collect())
        }
    }

    fn as_slice(&self) -> &[ChanDone] {
        match self {
            DoneChans::Inline(n, a) => &a[..*n],
            DoneChans::Heap(v) => v,
        }
    }
}

/// What the executor hands over at completion.
#[derive(Debug)]
struct Done {
    source: u64,
    counter: u64,
    /// The operation's op-log entry, copied at completion: the op log keeps only the last
    /// few operations, which fast operations overwrite long before the next tick.
    snap: OpSnapshot,
    chans: DoneChans,
    thinning: Thinning,
    /// Why the operation failed (failed operations only; boxed: the common case is `None`).
    failure: Option<Box<crate::failure::Failure>>,
    /// Its sequence-space identity, copied at completion (the ring is as short as the op
    /// log's).
    id: Option<OpSeq>,
    /// Inbound wire time by sending peer ([`Source::op_done_wire`]); empty (no
    /// allocation) for every operation without socket peers that differ by step.
    peer_wire: Vec<PeerWire>,
}

/// The time one sending peer's inbound messages of an operation spent on the wire, first
/// byte to last, measured by the receiving socket proxy (the record's `peer_wire`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerWire {
    /// The sending rank.
    pub from: u32,
    pub wire_ns: u64,
}

/// A rank's computation gap before an operation ([`Source::gap_before`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Gap {
    /// Time from the end of the rank's previous operation on the communicator to the start
    /// of this one, less `elsewhere_ns`.
    gap_ns: Option<u64>,
    /// The part of that time the rank spent in operations of its other communicators.
    elsewhere_ns: Option<u64>,
}

/// What a record says about thinning and the computation gap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Thinning {
    /// The computation gap before the operation.
    gap: Gap,
    /// Stride in force ([`thin`]).
    stride: u32,
}

struct Global {
    sources: Mutex<Vec<(u64, Weak<Source>)>>,
    done_tx: SyncSender<Done>,
    done_rx: Mutex<Option<Receiver<Done>>>,
    dropped: AtomicU64,
    next_id: AtomicU64,
    started: OnceLock<Result<(), String>>,
    /// CPU nanoseconds used so far by the diagnostic and the reporter thread.
    cpu_ns: [AtomicU64; 2],
}

/// Operations before a suspected hang (an operation in flight for an in-flight period)
/// whose thinned completions are reported after all: the frame still holds their counters
/// beside the one in flight. A rank idle for that long after its last operation reports
/// that one too.
pub const BACKFILL_OPS: u64 = crate::FRAME_BLOCKS as u64 - 1;

/// Capacity of the completion queue (operations).
pub const DONE_QUEUE: usize = 16_384;

fn global() -> &'static Global {
    static G: OnceLock<Global> = OnceLock::new();
    G.get_or_init(|| {
        let (tx, rx) = mpsc::sync_channel(DONE_QUEUE);
        Global {
            sources: Mutex::new(Vec::new()),
            done_tx: tx,
            done_rx: Mutex::new(Some(rx)),
            dropped: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            started: OnceLock::new(),
            cpu_ns: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    })
}

/// Records and batches lost by the probe so far (queue full, sink down without spool).
pub fn dropped() -> u64 {
    global().dropped.load(Ordering::Relaxed)
}

/// CPU time (nanoseconds) the probe's own threads have used so far in this process:
/// (diagnostic thread, reporter thread, which also runs the embedded analyzer). The probe's
/// cost outside the collective path, for benchmarks; each thread updates its figure once per
/// loop.
pub fn pipeline_cpu_ns() -> (u64, u64) {
    let g = global();
    (
        g.cpu_ns[0].load(Ordering::Relaxed),
        g.cpu_ns[1].load(Ordering::Relaxed),
    )
}

/// CPU time of the calling thread in nanoseconds (0 if the clock is unavailable).
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`;
    // CLOCK_THREAD_CPUTIME_ID needs no other argument.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

pub(crate) fn count_drop(n: u64) {
    global().dropped.fetch_add(n, Ordering::Relaxed);
}

impl Source {
    /// Identity given at registration.
    pub fn identity(&self) -> &Identity {
        &self.ident
    }

    /// The completion message of the operation whose final op-log entry is `snap`: that
    /// entry and the operation's counters.
    fn done_message(&self, snap: &OpSnapshot, thinning: Thinning) -> Done {
        let counter = snap.op_counter;
        let block = (counter % crate::FRAME_BLOCKS as u64) as usize;
        let n = self.frame.header().n_channels as usize;
        Done {
            source: self.id,
            counter,
            snap: *snap,
            chans: DoneChans::collect(n, |c| chan_done(&self.frame, block, c)),
            thinning,
            failure: None,
            id: self.seqs.get(counter),
            peer_wire: Vec::new(),
        }
    }

    /// Whether operation `counter - 1` is the latest completed one and its end was timed:
    /// a computation gap before operation `counter` can be measured.
    fn gap_known(&self, counter: u64) -> bool {
        let t = &self.thin;
        counter > 0
            && t.last_counter.load(Ordering::Relaxed) == counter
            && t.last_timed.load(Ordering::Relaxed)
    }

    /// The rank's computation gap before operation `counter` starting at `start_ns`: the
    /// time since its previous operation (`counter - 1`) ended, if that one completed,
    /// less the time the rank's operations on its other communicators took meanwhile
    /// ([`RankGroup`]; read at the start when [`Source::start_op`] did, else now, which
    /// may also take out operations that overlapped this one); and that time elsewhere.
    fn gap_before(&self, counter: u64, start_ns: u64) -> Gap {
        let t = &self.thin;
        if !self.gap_known(counter) {
            return Gap::default();
        }
        let raw = start_ns.saturating_sub(t.last_end_ns.load(Ordering::Relaxed));
        let busy_at_start = if t.start_busy_of.load(Ordering::Relaxed) == counter + 1 {
            t.start_busy_ns.load(Ordering::Relaxed)
        } else {
            self.group.busy_ns()
        };
        let elsewhere = busy_at_start
            .wrapping_sub(t.last_end_busy_ns.load(Ordering::Relaxed))
            .min(raw);
        Gap {
            gap_ns: Some(raw - elsewhere),
            elsewhere_ns: Some(elsewhere),
        }
    }

    /// The stride for operation `counter` starting at `start_ns`: reconsidered at every
    /// epoch boundary from the time the last epoch took ([`thin::next_stride`]).
    #[inline]
    fn stride_for(&self, counter: u64, start_ns: u64) -> u32 {
        let t = &self.thin;
        let mut stride = t.stride.load(Ordering::Relaxed).max(1);
        if counter.is_multiple_of(thin::EPOCH_OPS) {
            let prev = t.epoch_counter.load(Ordering::Relaxed);
            if counter >= thin::EPOCH_OPS && prev == counter - thin::EPOCH_OPS + 1 {
                let took = start_ns.saturating_sub(t.epoch_start_ns.load(Ordering::Relaxed));
                stride = thin::next_stride(stride, took, self.record_ns);
            }
            t.stride.store(stride, Ordering::Relaxed);
            t.epoch_counter.store(counter + 1, Ordering::Relaxed);
            t.epoch_start_ns.store(start_ns, Ordering::Relaxed);
        }
        stride
    }

    /// Called by the executor before it starts local operation `local` (the op-log
    /// counter) at `start_ns`, before the frame's `begin_op`:
    /// - numbers it in its sequence space (collective / p2p), which its records and the
    ///   heartbeats carry ([`crate::seqspace`]);
    /// - at an epoch boundary, reconsiders the thinning stride ([`thin`]);
    /// - decides whether its completion is reported (a failure or an in-flight snapshot
    ///   reports it anyway, [`Source::op_done`]);
    /// - returns whether its end must be read from the clock ([`Source::end_time`]): when
    ///   its own record may be reported, and when the next collective's may be (its
    ///   computation gap is measured from this end), i.e. when the next collective number
    ///   is in the sample or the next operation opens an epoch (the stride may change
    ///   there). A p2p group's gap is not predicted (the analyzer times no p2p round).
    #[inline]
    pub fn start_op(&self, local: u64, id: &OpSeq, start_ns: u64) -> bool {
        let t = &self.thin;
        let (key, next_coll) = match id.space {
            SeqSpace::Collective => (id.number, id.number + 1),
            SeqSpace::P2p => (local, self.seqs.last_collective().map_or(0, |n| n + 1)),
        };
        self.seqs.set(local, id);
        let stride = self.stride_for(local, start_ns);
        let comm = self.ident.comm_id;
        // The previous start predicted this collective's selection under the same stride,
        // unless the stride changed here.
        let predicted = t.predicted.load(Ordering::Relaxed);
        let report = if predicted >> 1 == key + 1 && !local.is_multiple_of(thin::EPOCH_OPS) {
            predicted & 1 == 1
        } else {
            thin::selected(comm, key, stride)
        };
        if report {
            t.report_of.store(local + 1, Ordering::Relaxed);
            if self.gap_known(local) {
                // The end of the gap this record will carry (`gap_before`).
                t.start_busy_ns
                    .store(self.group.busy_ns(), Ordering::Relaxed);
                t.start_busy_of.store(local + 1, Ordering::Relaxed);
            }
        }
        let next = thin::selected(comm, next_coll, stride);
        t.predicted
            .store((next_coll + 1) << 1 | u64::from(next), Ordering::Relaxed);
        report || next || (local + 1).is_multiple_of(thin::EPOCH_OPS)
    }

    /// When operation `local`, started at `start_ns`, ended: the clock when `timed` (what
    /// [`Source::start_op`] returned), when it failed, or when the diagnostic thread sent
    /// an in-flight snapshot of it (its completion closes that snapshot); otherwise an
    /// estimate, the diagnostic thread's latest tick (not before the start), which costs
    /// a load instead of a clock read.
    #[inline]
    pub fn end_time(&self, local: u64, start_ns: u64, timed: bool, ok: bool) -> EndTime {
        if timed || !ok || self.thin.snapshotted.load(Ordering::Relaxed) == local + 1 {
            EndTime::exact(now_ns())
        } else {
            EndTime::estimate(coarse_now_ns().max(start_ns))
        }
    }

    /// Notes that a call of this rank failed before it became an operation (a bad argument,
    /// a group that such a call cancelled): the heartbeats carry `text` (at most
    /// [`wire::MAX_CALL_ERROR_CHARS`]) until the rank starts its next operation, so that the
    /// analyzer can say why a rank did not enter an operation its peers wait in. Error
    /// paths only (a lock).
    pub fn note_call_failed(&self, text: &str) {
        let at = (self.seqs.last_collective(), self.seqs.p2p_groups());
        let text = text.chars().take(wire::MAX_CALL_ERROR_CHARS).collect();
        *self.call_error.lock() = Some(CallError { at, text });
    }

    /// The noted call error, while no operation started since it ([`Source::note_call_failed`]).
    pub(crate) fn pending_call_error(&self) -> Option<String> {
        let e = self.call_error.lock();
        let e = e.as_ref()?;
        (e.at == (self.seqs.last_collective(), self.seqs.p2p_groups())).then(|| e.text.clone())
    }

    /// Completions of this rank reported so far and left out by thinning.
    pub fn thinning_counts(&self) -> (u64, u64) {
        (
            self.thin.reported.load(Ordering::Relaxed),
            self.thin.skipped.load(Ordering::Relaxed),
        )
    }

    /// Called by the executor when an operation finished, with what `OpLog::finish`
    /// returned: unless thinning leaves it out ([`thin`]), reads its op-log entry, copies
    /// its counters and queues them for the diagnostic thread without blocking.
    pub fn op_done(&self, fin: &Finished) {
        self.op_done_wire(fin, &[]);
    }

    /// [`Source::op_done`] with the operation's inbound wire time by sending peer, for
    /// operations whose inbound messages come from a different peer at each step (a Tree
    /// over sockets; a ring's wire time goes into its frame channels instead). Copied into
    /// the record only if the completion is reported.
    ///
    /// Inlined into the executor's end of an operation: most completions are thinned out
    /// and cost only [`Source::thin_completion`]'s bookkeeping; a reported one is built
    /// out of line ([`Source::report_done`]).
    #[inline]
    pub fn op_done_wire(&self, fin: &Finished, peer_wire: &[PeerWire]) {
        if let Some(thinning) = self.thin_completion(fin) {
            self.report_done(fin, thinning, peer_wire);
        }
    }

    /// The reported completion of [`Source::op_done_wire`]: its record, queued for the
    /// diagnostic thread without blocking.
    #[cold]
    #[inline(never)]
    fn report_done(&self, fin: &Finished, thinning: Thinning, peer_wire: &[PeerWire]) {
        // The whole entry (the type set), only for a record that is sent. The completing
        // thread is the log's only writer: the entry is the one it just finished.
        let Some(snap) = self.op_log.get(fin.op_counter) else {
            return;
        };
        // On the host backend the completing thread ran the operation (on the device
        // backend it is a CUDA callback thread, whose CPU wait says nothing). Noted at
        // reported completions (a thread-local read in a shared library is not free):
        // the run-queue delay sampled every few tens of ms belongs to the thread that ran
        // the rank's recent operations.
        if self.ident.device < 0 {
            self.note_exec_tid();
        }
        let mut msg = self.done_message(&snap, thinning);
        msg.peer_wire = peer_wire.to_vec();
        if global().done_tx.try_send(msg).is_err() {
            // Full queue (or no diagnostic thread): dropped, counted.
            count_drop(1);
        }
    }

    /// [`Source::op_done`] for an operation that failed (`fin.state` is `Failed`), with
    /// why it failed: the record carries `failure`, `peer_lost` and `mismatch`. Failed
    /// operations are always reported (never thinned out).
    pub fn op_failed(&self, fin: &Finished, failure: crate::failure::Failure) {
        if self.ident.device < 0 {
            self.note_exec_tid();
        }
        let thinning = self.thin_completion(fin).unwrap_or(Thinning {
            gap: Gap::default(),
            stride: 1,
        });
        let Some(snap) = self.op_log.get(fin.op_counter) else {
            return;
        };
        let mut msg = self.done_message(&snap, thinning);
        msg.failure = Some(Box::new(failure));
        if global().done_tx.try_send(msg).is_err() {
            count_drop(1);
        }
    }

    /// Records the completing thread as the one that runs this rank's operations. Written
    /// only when it changes: the diagnostic thread reads the word, and a store on every
    /// operation would take its cache line away from that thread's core each time.
    fn note_exec_tid(&self) {
        let tid = crate::sched::current_tid();
        if self.exec_tid.load(Ordering::Relaxed) != tid {
            self.exec_tid.store(tid, Ordering::Relaxed);
        }
    }

    /// The bookkeeping of a completion (gap, epoch, stride) and whether it is reported:
    /// `Some` with what its record says about thinning, `None` when thinning leaves it out.
    #[inline]
    fn thin_completion(&self, fin: &Finished) -> Option<Thinning> {
        let c = fin.op_counter;
        let t = &self.thin;
        let report =
            fin.state != OpState::Completed || t.report_of.load(Ordering::Relaxed) == c + 1 || {
                // Pairs with the heavy barrier in `Sampler::sample` (the op log's finish
                // store came before this): either the diagnostic thread sees this
                // operation finished and sends no snapshot, or this load sees its mark and
                // the snapshot is closed by this completion. The costs of the store-load
                // barrier are on the sampler's side ([`crate::asym`]).
                crate::asym::light();
                t.snapshotted.load(Ordering::Relaxed) == c + 1
            };
        // Read before this completion becomes the latest.
        let gap = if report {
            self.gap_before(c, fin.start_ns)
        } else {
            Gap::default()
        };
        // Single writer: a plain read-modify-write (no locked instruction).
        let busy = self.busy.0.load(Ordering::Relaxed);
        let took = fin.end_ns.saturating_sub(fin.start_ns);
        self.busy
            .0
            .store(busy.wrapping_add(took), Ordering::Relaxed);
        if fin.timed {
            // The start of the next operation's gap (this source's own time included, so
            // that only the other members' time differs at the gap's end).
            t.last_end_busy_ns
                .store(self.group.busy_ns(), Ordering::Relaxed);
        }
        t.last_counter.store(c + 1, Ordering::Relaxed);
        t.last_end_ns.store(fin.end_ns, Ordering::Relaxed);
        t.last_timed.store(fin.timed, Ordering::Relaxed);
        // Single writer: plain read-modify-writes (no locked instruction).
        let bump = |a: &AtomicU64| a.store(a.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let bit = 1u64 << (c % 64);
        let recent = t.recent.load(Ordering::Relaxed);
        if !report {
            t.recent.store(recent & !bit, Ordering::Relaxed);
            bump(&t.skipped);
            return None;
        }
        t.recent.store(recent | bit, Ordering::Relaxed);
        bump(&t.reported);
        Some(Thinning {
            gap,
            stride: t.stride.load(Ordering::Relaxed).max(1),
        })
    }
}

/// Registers a communicator rank with the diagnostic thread (started on first use by
/// [`start`]). Keep the `Arc`: the source is sampled while it lives. Its record thinning
/// target is `CCLD_RECORD_US` as the environment says now (validated by `crate::start`,
/// which the runtime calls first; like NCCL's variables it is read at every init and
/// must be the same on every rank of a communicator). `group` holds the rank's other
/// communicators ([`RankGroup`]).
pub fn register(
    ident: Identity,
    frame: Arc<Frame>,
    op_log: Arc<OpLog>,
    group: Arc<RankGroup>,
) -> Arc<Source> {
    let record =
        DiagConfig::resolve(&process_env).map_or(DiagConfig::default().record, |c| c.record);
    register_with_target(ident, frame, op_log, group, record)
}

/// [`register`] with an explicit record thinning target (zero: report every completion).
pub fn register_with_target(
    ident: Identity,
    frame: Arc<Frame>,
    op_log: Arc<OpLog>,
    group: Arc<RankGroup>,
    record: Duration,
) -> Arc<Source> {
    let g = global();
    let id = g.next_id.fetch_add(1, Ordering::Relaxed);
    let busy = group.join();
    let s = Arc::new(Source {
        id,
        ident,
        frame,
        op_log,
        exec_tid: AtomicI32::new(0),
        thin: ThinState::default(),
        record_ns: u64::try_from(record.as_nanos()).unwrap_or(u64::MAX),
        seqs: SeqLog::new(),
        group,
        busy,
        call_error: Mutex::new(None),
    });
    let mut v = g.sources.lock();
    v.retain(|(_, w)| w.strong_count() > 0);
    v.push((id, Arc::downgrade(&s)));
    s
}
