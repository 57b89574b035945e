//! The diagnostic thread (CCL-D section 5.2, design.md section 4): one per process, serving
//! every communicator.
//!
//! # Registration
//! The runtime registers each communicator rank with [`register`] at init (its frame, op
//! log, identity and ring neighbours) and keeps the returned [`Source`]; dropping the last
//! `Arc<Source>` (the executor's, at destroy) unregisters it. The probe never depends on the
//! runtime. On completion of an operation the executor calls [`Source::op_done`], which
//! copies the operation's counters into a small message and `try_send`s it to a bounded
//! queue: the collective path never blocks; a full queue drops the message and counts it.
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

use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use ccld_wire as wire;

use crate::frame::Frame;
use crate::optype::{OpLog, OpSnapshot, OpState};
use crate::sched::CpuWaitTracker;
use crate::seqspace::{OpSeq, SeqLog, SeqSpace};
use crate::thin;

fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// Monotonic nanoseconds since the first call in this process (the clock of op-log
/// timestamps and of the embedded analyzer).
pub fn now_ns() -> u64 {
    ns_at(Instant::now())
}

/// [`now_ns`] of an instant the caller read already (saves a clock read on a path that
/// needs the time for something else too); 0 for an instant before the clock's start.
pub fn ns_at(t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(clock_base()).as_nanos()).unwrap_or(u64::MAX)
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
    /// Counter + 1 and end time of the latest completed operation.
    last_counter: AtomicU64,
    last_end_ns: AtomicU64,
    /// Counter + 1 of the latest operation the diagnostic thread sent an in-flight
    /// snapshot of: its completion is reported whatever the stride.
    snapshotted: AtomicU64,
    /// Completions reported / left out by thinning.
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
    }
}

/// Channels whose counters travel inline in a completion message (more spill to the heap).
const INLINE_CHANS: usize = 4;

/// The channels of a completion: inline up to [`INLINE_CHANS`] (no allocation on the
/// collective path for the host backend's default of at most 4 channels), else on the heap.
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
}

/// What a record says about thinning and the computation gap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Thinning {
    /// Time from the end of the rank's previous operation to the start of this one.
    gap_ns: Option<u64>,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the plain data is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
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
        }
    }

    /// The rank's computation gap before operation `counter` starting at `start_ns`: the
    /// time since its previous operation (`counter - 1`) ended, if that one completed.
    fn gap_before(&self, counter: u64, start_ns: u64) -> Option<u64> {
        let t = &self.thin;
        (counter > 0 && t.last_counter.load(Ordering::Relaxed) == counter)
            .then(|| start_ns.saturating_sub(t.last_end_ns.load(Ordering::Relaxed)))
    }

    /// The stride for operation `counter` starting at `start_ns`: reconsidered at every
    /// epoch boundary from the time the last epoch took ([`thin::next_stride`]).
    fn stride_for(&self, counter: u64, start_ns: u64) -> u32 {
        let t = &self.thin;
        let mut stride = t.stride.load(Ordering::Relaxed).max(1);
        if counter % thin::EPOCH_OPS == 0 {
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
    /// counter): the operation's collective or p2p sequence numbers, which its records and
    /// the heartbeats carry ([`crate::seqspace`]).
    pub fn set_seq(&self, local: u64, id: OpSeq) {
        self.seqs.set(local, id);
    }

    /// Completions of this rank reported so far and left out by thinning.
    pub fn thinning_counts(&self) -> (u64, u64) {
        (
            self.thin.reported.load(Ordering::Relaxed),
            self.thin.skipped.load(Ordering::Relaxed),
        )
    }

    /// Called by the executor when an operation finished, with the entry `OpLog::finish`
    /// returned: unless thinning leaves it out ([`thin`]), copies its counters and queues
    /// them for the diagnostic thread without blocking.
    pub fn op_done(&self, snap: &OpSnapshot) {
        // On the host backend the completing thread ran the operation (on the device
        // backend it is a CUDA callback thread, whose CPU wait says nothing).
        if self.ident.device < 0 {
            self.exec_tid
                .store(crate::sched::current_tid(), Ordering::Relaxed);
        }
        let Some(thinning) = self.thin_completion(snap) else {
            return;
        };
        let msg = self.done_message(snap, thinning);
        if global().done_tx.try_send(msg).is_err() {
            // Full queue (or no diagnostic thread): dropped, counted.
            count_drop(1);
        }
    }

    /// [`Source::op_done`] for an operation that failed (`snap.state` is `Failed`), with
    /// why it failed: the record carries `failure`, `peer_lost` and `mismatch`. Failed
    /// operations are always reported (never thinned out).
    pub fn op_failed(&self, snap: &OpSnapshot, failure: crate::failure::Failure) {
        if self.ident.device < 0 {
            self.exec_tid
                .store(crate::sched::current_tid(), Ordering::Relaxed);
        }
        let thinning = self.thin_completion(snap).unwrap_or(Thinning {
            gap_ns: None,
            stride: 1,
        });
        let mut msg = self.done_message(snap, thinning);
        msg.failure = Some(Box::new(failure));
        if global().done_tx.try_send(msg).is_err() {
            count_drop(1);
        }
    }

    /// The bookkeeping of a completion (gap, epoch, stride) and whether it is reported:
    /// `Some` with what its record says about thinning, `None` when thinning leaves it out.
    fn thin_completion(&self, snap: &OpSnapshot) -> Option<Thinning> {
        let c = snap.op_counter;
        let gap_ns = self.gap_before(c, snap.start_ns);
        let t = &self.thin;
        t.last_counter.store(c + 1, Ordering::Relaxed);
        t.last_end_ns.store(snap.end_ns, Ordering::Relaxed);
        let stride = self.stride_for(c, snap.start_ns);
        let report = snap.state != OpState::Completed
            || thin::selected(self.ident.comm_id, self.seqs.thin_key(c), stride)
            || {
                // Pairs with the fence in `Sampler::sample` (the op log's finish store came
                // before this): either the diagnostic thread sees this operation finished
                // and sends no snapshot, or this load sees its mark and the snapshot is
                // closed by this completion. (A fence costs a few ns here; skipping it for
                // short operations would need a clock read, as the sampler's clock and the
                // op log's end time are read at different moments.)
                fence(Ordering::SeqCst);
                t.snapshotted.load(Ordering::Relaxed) == c + 1
            };
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
        Some(Thinning { gap_ns, stride })
    }
}

/// Registers a communicator rank with the diagnostic thread (started on first use by
/// [`start`]). Keep the `Arc`: the source is sampled while it lives. Its record thinning
/// target is `CCLD_RECORD_US` as the environment says now (validated by `crate::start`,
/// which the runtime calls first; like NCCL's variables it is read at every init and
/// must be the same on every rank of a communicator).
pub fn register(ident: Identity, frame: Arc<Frame>, op_log: Arc<OpLog>) -> Arc<Source> {
    let record =
        DiagConfig::resolve(&process_env).map_or(DiagConfig::default().record, |c| c.record);
    register_with_target(ident, frame, op_log, record)
}

/// [`register`] with an explicit record thinning target (zero: report every completion).
pub fn register_with_target(
    ident: Identity,
    frame: Arc<Frame>,
    op_log: Arc<OpLog>,
    record: Duration,
) -> Arc<Source> {
    let g = global();
    let id = g.next_id.fetch_add(1, Ordering::Relaxed);
    let s = Arc::new(Source {
        id,
        ident,
        frame,
        op_log,
        exec_tid: AtomicI32::new(0),
        thin: ThinState::default(),
        record_ns: u64::try_from(record.as_nanos()).unwrap_or(u64::MAX),
        seqs: SeqLog::new(),
    });
    let mut v = lock(&g.sources);
    v.retain(|(_, w)| w.strong_count() > 0);
    v.push((id, Arc::downgrade(&s)));
    s
}

/// Default sampling period of a process whose communicators all run on the host backend:
/// there communication is CPU work on every core, and each wake-up of the diagnostic
/// thread is taken from a rank (27 us of CPU on the 2-core development VM: 2.7 % of a
/// core at 1 kHz, 0.3 % at 100 Hz).
pub const HOST_SAMPLE: Duration = Duration::from_millis(10);

/// Default sampling period of a process with a device communicator (the paper's 1 ms:
/// the host CPU is mostly idle while the GPU works).
pub const DEVICE_SAMPLE: Duration = Duration::from_millis(1);

/// Settings of the diagnostic thread (from the environment).
#[derive(Clone, Debug, PartialEq)]
pub struct DiagConfig {
    /// Sampling period (`CCLD_SAMPLE_US`); `None`: [`HOST_SAMPLE`] or [`DEVICE_SAMPLE`]
    /// by the communicators registered ([`DiagConfig::sample_period`]).
    pub sample: Option<Duration>,
    /// In-flight snapshot period (`CCLD_INFLIGHT_MS`).
    pub inflight: Duration,
    /// Heartbeat period (`CCLD_HEARTBEAT_MS`).
    pub heartbeat: Duration,
    /// Longest time records wait before a batch is sent; also the longest sampling period
    /// while no operation in flight is older than `sample` (see [`next_period`]).
    pub flush: Duration,
    /// Target interval between a rank's reported completions of one communicator
    /// (`CCLD_RECORD_US`, read again at every registration; zero: every completion, see
    /// [`thin`]).
    pub record: Duration,
}

impl Default for DiagConfig {
    fn default() -> Self {
        DiagConfig {
            sample: None,
            inflight: Duration::from_millis(1000),
            heartbeat: Duration::from_millis(1000),
            flush: Duration::from_millis(50),
            record: Duration::from_nanos(thin::DEFAULT_RECORD_NS),
        }
    }
}

/// Looks an environment variable up; `None` when unset or empty.
pub type EnvGet<'a> = &'a dyn Fn(&str) -> Option<String>;

pub(crate) fn env_u64(
    get: EnvGet<'_>,
    name: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, String> {
    match get(name) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "{name}={v:?} must be an integer between {min} and {max}"
            )),
        },
    }
}

pub(crate) fn env_f64(
    get: EnvGet<'_>,
    name: &str,
    min: f64,
    max: f64,
) -> Result<Option<f64>, String> {
    match get(name) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(n) if n.is_finite() && n >= min && n <= max => Ok(Some(n)),
            _ => Err(format!(
                "{name}={v:?} must be a number between {min} and {max}"
            )),
        },
    }
}

/// The process environment as an [`EnvGet`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl DiagConfig {
    /// The sampling period while `sources` are registered: `CCLD_SAMPLE_US` when set,
    /// else [`DEVICE_SAMPLE`] if one of them is a device communicator, else
    /// [`HOST_SAMPLE`].
    pub fn sample_period(&self, sources: &[Arc<Source>]) -> Duration {
        self.sample.unwrap_or_else(|| {
            if sources.iter().any(|s| s.ident.device >= 0) {
                DEVICE_SAMPLE
            } else {
                HOST_SAMPLE
            }
        })
    }

    /// Pure resolution from `get` (strict: a malformed value is an error naming it).
    pub fn resolve(get: EnvGet<'_>) -> Result<DiagConfig, String> {
        let d = DiagConfig::default();
        Ok(DiagConfig {
            sample: env_u64(get, "CCLD_SAMPLE_US", 10, 10_000_000)?
                .map(Duration::from_micros)
                .or(d.sample),
            inflight: env_u64(get, "CCLD_INFLIGHT_MS", 1, 3_600_000)?
                .map_or(d.inflight, Duration::from_millis),
            heartbeat: env_u64(get, "CCLD_HEARTBEAT_MS", 1, 3_600_000)?
                .map_or(d.heartbeat, Duration::from_millis),
            flush: d.flush,
            record: env_u64(get, "CCLD_RECORD_US", 0, 60_000_000)?
                .map_or(d.record, Duration::from_micros),
        })
    }
}

/// Where batches go.
pub trait Sink: Send {
    /// Delivers one batch (may block; runs on the reporter thread).
    fn deliver(&mut self, batch: wire::Batch);
    /// Called every reporter loop (about every 20 ms) even without batches.
    fn idle(&mut self) {}
    /// Waits, at most `timeout`, until every batch delivered so far has left the process
    /// (sent, or spooled). A sink whose `deliver` returns only then needs nothing here.
    fn settle(&mut self, _timeout: Duration) {}
}

/// Per-channel tick state of the operation in flight.
#[derive(Clone, Debug, Default)]
struct ChanTicks {
    last_send: u64,
    last_recv: u64,
    send_ticks: u32,
    recv_ticks: u32,
}

#[derive(Debug, Default)]
struct Track {
    counter: Option<u64>,
    chans: Vec<ChanTicks>,
    last_snapshot_ns: u64,
    seq_done: Option<u64>,
    /// Operations before this counter were looked at for a backfill already.
    backfilled_to: u64,
}

/// The sampler: pure bookkeeping over frames, op logs and completions.
pub struct Sampler {
    cfg: DiagConfig,
    host: String,
    pid: u32,
    tracks: HashMap<u64, Track>,
    /// Ticks of operations that finished before their completion message was processed.
    finished_ticks: HashMap<(u64, u64), Vec<ChanTicks>>,
    seq: u64,
    /// Each host-backend rank's accumulated CPU wait (run-queue delay).
    cpu_wait: CpuWaitTracker,
    /// The process's accumulated frozen time (measured by the diagnostic thread's parks).
    frozen_ns: Option<u64>,
    /// See [`Sampler::busy`].
    busy: bool,
    /// See [`Sampler::base_period`].
    base: Duration,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

fn rate(ticks: u32) -> f64 {
    if ticks == 0 {
        0.0
    } else {
        1.0 / f64::from(ticks)
    }
}

impl Sampler {
    /// A sampler for this process.
    pub fn new(cfg: DiagConfig) -> Sampler {
        Sampler {
            cfg,
            host: hostname(),
            pid: std::process::id(),
            tracks: HashMap::new(),
            finished_ticks: HashMap::new(),
            seq: 0,
            cpu_wait: CpuWaitTracker::default(),
            frozen_ns: None,
            busy: false,
            base: DEVICE_SAMPLE,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        seq: u64,
        s: &Source,
        snap: &OpSnapshot,
        chans: &[ChanDone],
        ticks: Option<&[ChanTicks]>,
        thinning: Thinning,
        now: u64,
    ) -> wire::OpRecord {
        let counter = snap.op_counter;
        let end = if snap.state == OpState::InFlight {
            now
        } else {
            snap.end_ns
        };
        let dur = end.saturating_sub(snap.start_ns);
        let secs = (dur as f64 / 1e9).max(1e-9);
        let channels = chans
            .iter()
            .enumerate()
            .map(|(c, k)| {
                let t = ticks.and_then(|t| t.get(c)).cloned().unwrap_or_default();
                // An operation shorter than one tick may change its counts between two
                // samples without the sampler seeing it: count at least one tick then.
                let st = if k.send > 0 { t.send_ticks.max(1) } else { 0 };
                let rt = if k.recv > 0 { t.recv_ticks.max(1) } else { 0 };
                wire::ChannelStat {
                    send_count: k.send,
                    recv_count: k.recv,
                    expected_send: k.exp_send,
                    expected_recv: k.exp_recv,
                    send_rate: rate(st),
                    recv_rate: rate(rt),
                    send_per_sec: k.send as f64 / secs,
                    recv_per_sec: k.recv as f64 / secs,
                    wait_upstream_ns: Some(k.up),
                    wait_downstream_ns: Some(k.down),
                    ring_prev: Some(s.ident.ring_prev),
                    ring_next: Some(s.ident.ring_next),
                    ext: HashMap::new(),
                }
            })
            .collect();
        let mut rec = wire::OpRecord {
            trace: Some(wire::TraceId {
                comm_id: s.ident.comm_id,
                op_counter: counter,
                extension: 0,
            }),
            rank: s.ident.rank,
            nranks: s.ident.nranks,
            host: self.host.clone(),
            pid: self.pid,
            op: Some(crate::wire::type_set(&snap.info, &[])),
            start_ns: snap.start_ns,
            duration_ns: dur,
            channels,
            state: crate::wire::op_state(snap.state) as i32,
            seq,
            device: s.ident.device,
            cpu_wait_ns: self.cpu_wait.total(s.id),
            frozen_ns: self.frozen_ns,
            gap_ns: thinning.gap_ns,
            stride: thinning.stride,
            failure: 0,
            peer_lost: None,
            mismatch: None,
            seq_space: wire::SeqSpace::Collective as i32,
            p2p: Vec::new(),
        };
        // Numbered in its sequence space when the runtime registered it (not when a test
        // drives the op log directly).
        if let Some(id) = s.seqs.get(counter) {
            set_identity(&mut rec, &id);
        }
        rec
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn live_chans(s: &Source, counter: u64) -> Vec<ChanDone> {
        let block = (counter % crate::FRAME_BLOCKS as u64) as usize;
        Self::block_chans(s, block, s.frame.header().n_channels as usize)
    }

    /// The first `n` channels' counters in `block` of `s`'s frame.
    fn block_chans(s: &Source, block: usize, n: usize) -> Vec<ChanDone> {
        (0..n).map(|c| chan_done(&s.frame, block, c)).collect()
    }

    /// One sampling tick over `sources` at `now` (process clock): updates the change
    /// counts and returns in-flight snapshots that are due. Afterwards [`Sampler::busy`]
    /// says whether an operation in flight had run for a sampling period or longer.
    pub fn sample(&mut self, sources: &[Arc<Source>], now: u64) -> Vec<wire::OpRecord> {
        let mut out = Vec::new();
        let inflight_ns = u64::try_from(self.cfg.inflight.as_nanos()).unwrap_or(u64::MAX);
        self.base = self.cfg.sample_period(sources);
        let period_ns = u64::try_from(self.base.as_nanos()).unwrap_or(u64::MAX);
        self.busy = false;
        for s in sources {
            let h = s.frame.header();
            if !h.mode {
                continue;
            }
            let Some(snap) = s.op_log.get(h.op_counter) else {
                continue;
            };
            if snap.state == OpState::InFlight && now.saturating_sub(snap.start_ns) >= period_ns {
                self.busy = true;
            }
            let tr = self.tracks.entry(s.id).or_default();
            if tr.counter != Some(h.op_counter) {
                if let Some(old) = tr.counter.take() {
                    // Kept for the completion message, if thinning lets one come.
                    let stride = s.thin.stride.load(Ordering::Relaxed);
                    if thin::selected(s.ident.comm_id, old, stride)
                        || s.thin.snapshotted.load(Ordering::Relaxed) == old + 1
                    {
                        self.finished_ticks
                            .insert((s.id, old), std::mem::take(&mut tr.chans));
                    }
                }
                tr.counter = Some(h.op_counter);
                tr.chans = vec![ChanTicks::default(); h.n_channels as usize];
                tr.last_snapshot_ns = 0;
            }
            let live = Self::live_chans(s, h.op_counter);
            for (t, k) in tr.chans.iter_mut().zip(&live) {
                if k.send != t.last_send {
                    t.send_ticks += 1;
                    t.last_send = k.send;
                }
                if k.recv != t.last_recv {
                    t.recv_ticks += 1;
                    t.last_recv = k.recv;
                }
            }
            if snap.state == OpState::InFlight
                && now.saturating_sub(snap.start_ns) >= inflight_ns
                && now.saturating_sub(tr.last_snapshot_ns) >= inflight_ns
            {
                // Mark first, then look again (pairs with the fence in `Source::op_done`):
                // an operation that finished meanwhile gets no snapshot, one still running
                // is sure to report its completion.
                s.thin
                    .snapshotted
                    .store(h.op_counter + 1, Ordering::Relaxed);
                fence(Ordering::SeqCst);
                let running = s
                    .op_log
                    .get(h.op_counter)
                    .is_some_and(|x| x.state == OpState::InFlight);
                if running {
                    tr.last_snapshot_ns = now;
                    let ticks = tr.chans.clone();
                    // A suspected hang: the thinned completions before it.
                    let from = std::mem::replace(&mut tr.backfilled_to, h.op_counter);
                    let from = from.max(h.op_counter.saturating_sub(BACKFILL_OPS));
                    self.backfill(s, from, h.op_counter, now, &mut out);
                    let seq = self.next_seq();
                    let thinning = Thinning {
                        gap_ns: s.gap_before(h.op_counter, snap.start_ns),
                        stride: s.thin.stride.load(Ordering::Relaxed).max(1),
                    };
                    out.push(self.record(seq, s, &snap, &live, Some(&ticks), thinning, now));
                }
            } else if snap.state != OpState::InFlight
                && now.saturating_sub(snap.end_ns) >= inflight_ns
                && tr.backfilled_to <= h.op_counter
            {
                // Idle for an in-flight period after its last operation: a rank that does
                // not enter the next one (H1) or whose peers hang in it (an inconsistent
                // call that completed here, H2) is the analyzer's next question; the
                // thinned completions up to that last operation go out.
                let end = h.op_counter + 1;
                let from = std::mem::replace(&mut tr.backfilled_to, end);
                let from = from.max(end.saturating_sub(BACKFILL_OPS + 1));
                self.backfill(s, from, end, now, &mut out);
            }
        }
        // Keep the finished-ticks map small (completions normally arrive within a tick).
        if self.finished_ticks.len() > 4096 {
            self.finished_ticks.clear();
        }
        out
    }

    /// Reports the completions of operations `from..to` of `s` that thinning left out, from
    /// the op log and the frame (both keep the last [`crate::FRAME_BLOCKS`] operations; an
    /// operation whose frame block was reused meanwhile is skipped). Called when operation
    /// `to` gets its first in-flight snapshot, or when the rank has been idle for an
    /// in-flight period after operation `to - 1`: the analyzer of a hang needs every rank's
    /// last rounds before it (an inconsistent call, H2, often completes on the rank that
    /// made it, which then waits in the next call or before it).
    fn backfill(
        &mut self,
        s: &Source,
        from: u64,
        to: u64,
        now: u64,
        out: &mut Vec<wire::OpRecord>,
    ) {
        let recent = s.thin.recent.load(Ordering::Relaxed);
        for k in from..to {
            if recent & (1u64 << (k % 64)) != 0 {
                continue;
            }
            let Some(snap) = s.op_log.get(k).filter(|x| x.state != OpState::InFlight) else {
                continue;
            };
            let gap_ns = k
                .checked_sub(1)
                .and_then(|p| s.op_log.get(p))
                .filter(|p| p.state != OpState::InFlight)
                .map(|p| snap.start_ns.saturating_sub(p.end_ns));
            let thinning = Thinning {
                gap_ns,
                stride: s.thin.stride.load(Ordering::Relaxed).max(1),
            };
            let block = (k % crate::FRAME_BLOCKS as u64) as usize;
            if u64::from(s.frame.trace(block).op_counter) != k & 0xffff_ffff {
                continue; // the frame block was reused meanwhile
            }
            let n = (snap.info.n_channels as usize).min(s.frame.channel_capacity());
            let chans = Self::block_chans(s, block, n);
            let seq = self.next_seq();
            out.push(self.record(seq, s, &snap, &chans, None, thinning, now));
        }
    }

    /// Whether the last [`Sampler::sample`] saw an operation in flight for a sampling
    /// period or longer: one whose SendRate/RecvRate the ticks are measuring.
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// The sampling period in force at the last [`Sampler::sample`]
    /// ([`DiagConfig::sample_period`]).
    pub fn base_period(&self) -> Duration {
        self.base
    }

    fn complete(&mut self, s: &Source, d: &Done, now: u64) -> wire::OpRecord {
        let mut rec = self.complete_plain(s, d, now);
        if let Some(f) = &d.failure {
            crate::failure::fill(&mut rec, f);
        }
        rec
    }

    fn complete_plain(&mut self, s: &Source, d: &Done, now: u64) -> wire::OpRecord {
        let seq = self.next_seq();
        let chans = d.chans.as_slice();
        let mut rec = match self.tracks.get_mut(&s.id) {
            Some(tr) if tr.counter == Some(d.counter) => {
                tr.seq_done = Some(d.counter);
                let tr = &self.tracks[&s.id];
                self.record(seq, s, &d.snap, chans, Some(&tr.chans), d.thinning, now)
            }
            _ => {
                let ticks = self.finished_ticks.remove(&(s.id, d.counter));
                self.record(seq, s, &d.snap, chans, ticks.as_deref(), d.thinning, now)
            }
        };
        if let Some(id) = &d.id {
            set_identity(&mut rec, id);
        }
        rec
    }

    /// Reads the run-queue delay of the threads running the host-backend ranks' operations
    /// (every [`crate::sched::SCHED_SAMPLE`]).
    pub fn sample_cpu_wait(&mut self, sources: &[Arc<Source>]) {
        let threads: Vec<(u64, i32)> = sources
            .iter()
            .filter(|s| s.ident.device < 0)
            .map(|s| (s.id, s.exec_tid.load(Ordering::Relaxed)))
            .collect();
        self.cpu_wait.sample(&threads);
    }

    /// Sets the process's accumulated frozen time that the next records carry.
    pub fn set_frozen_ns(&mut self, total: Option<u64>) {
        self.frozen_ns = total;
    }

    /// The process heartbeat.
    pub fn heartbeat(&self, sources: &[Arc<Source>], now: u64) -> wire::Heartbeat {
        wire::Heartbeat {
            host: self.host.clone(),
            pid: self.pid,
            ranks: sources
                .iter()
                .map(|s| {
                    let h = s.frame.header();
                    let runtime =
                        s.seqs.last_collective().is_some() || s.seqs.p2p_groups().is_some();
                    wire::RankMembership {
                        comm_id: s.ident.comm_id,
                        rank: s.ident.rank,
                        nranks: s.ident.nranks,
                        last_op_counter: if runtime {
                            s.seqs.last_collective()
                        } else {
                            // Op log driven without sequence identities (tests).
                            s.op_log.get(h.op_counter).map(|_| h.op_counter)
                        },
                        last_p2p_counter: s.seqs.p2p_groups(),
                    }
                })
                .collect(),
            records_dropped: dropped(),
            time_ns: now,
        }
    }
}

/// Numbers `rec` in the sequence space of `id` ([`crate::seqspace`]).
fn set_identity(rec: &mut wire::OpRecord, id: &OpSeq) {
    if let Some(t) = rec.trace.as_mut() {
        t.op_counter = id.number;
    }
    rec.seq_space = match id.space {
        SeqSpace::Collective => wire::SeqSpace::Collective,
        SeqSpace::P2p => wire::SeqSpace::P2p,
    } as i32;
    rec.p2p = id
        .p2p
        .iter()
        .map(|p| wire::P2pPeerSeq {
            peer: p.peer,
            send: p.send,
            seq: p.seq,
            count: p.count,
            dtype: u32::from(p.dtype),
        })
        .collect();
}

fn live_sources() -> Vec<Arc<Source>> {
    let mut v = lock(&global().sources);
    v.retain(|(_, w)| w.strong_count() > 0);
    v.iter().filter_map(|(_, w)| w.upgrade()).collect()
}

/// Capacity of the batch queue between the diagnostic and the reporter thread.
pub const BATCH_QUEUE: usize = 256;

/// Starts the diagnostic and reporter threads once per process with the sink `make_sink`
/// builds (called once). Later calls return the first call's outcome.
pub fn start_with(
    cfg: DiagConfig,
    make_sink: impl FnOnce() -> Result<Box<dyn Sink>, String>,
) -> Result<(), String> {
    let g = global();
    g.started
        .get_or_init(|| {
            let rx = lock(&g.done_rx)
                .take()
                .ok_or_else(|| "diagnostic thread already started".to_string())?;
            let mut sink = make_sink()?;
            let (btx, brx) = mpsc::sync_channel::<(wire::Batch, u64)>(BATCH_QUEUE);
            std::thread::Builder::new()
                .name("ccld-report".into())
                .spawn(move || loop {
                    match brx.recv_timeout(REPORTER_IDLE) {
                        Ok((b, flush)) => {
                            if !b.records.is_empty() || !b.heartbeats.is_empty() {
                                sink.deliver(b);
                            }
                            if flush > 0 {
                                sink.settle(FLUSH_SETTLE);
                                FLUSH_DONE.fetch_max(flush, Ordering::AcqRel);
                            }
                        }
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                    sink.idle();
                    global().cpu_ns[1].store(thread_cpu_ns(), Ordering::Relaxed);
                })
                .map_err(|e| format!("spawning the CCL-D reporter thread: {e}"))?;
            let diag = std::thread::Builder::new()
                .name("ccld-diag".into())
                .spawn(move || diag_loop(cfg, rx, btx))
                .map_err(|e| format!("spawning the CCL-D diagnostic thread: {e}"))?;
            let _ = DIAG_THREAD.set((diag.thread().clone(), std::process::id()));
            extern "C" fn flush_at_exit() {
                flush(EXIT_FLUSH);
            }
            // SAFETY: registers a plain `extern "C" fn()` without captured state; it only
            // touches process-global atomics and sleeps, which is valid during exit.
            unsafe { libc::atexit(flush_at_exit) };
            Ok(())
        })
        .clone()
}

/// How long the reporter thread waits for a batch before it calls [`Sink::idle`] (the
/// embedded analyzer ticks every 100 ms from there).
pub const REPORTER_IDLE: Duration = Duration::from_millis(50);

/// Quiet sampling ticks (no operation in flight for a period or longer) after which the
/// sampling period doubles.
pub const QUIET_TICKS: u32 = 4;

/// The next sampling period and quiet-tick count after a tick (pure).
///
/// The tick only learns something while an operation runs longer than one period: it
/// counts the periods in which the counters moved (SendRate/RecvRate). Operations shorter
/// than a period show one change however often they are sampled, and completions carry
/// their own counts and times. So while the last [`QUIET_TICKS`] ticks saw no operation in
/// flight for `base` or longer, the period doubles, up to `max`; the first tick that sees
/// one returns to `base`. A long operation that starts while the period is long loses at
/// most one long period of tick counting.
pub fn next_period(
    cur: Duration,
    quiet: u32,
    busy: bool,
    base: Duration,
    max: Duration,
) -> (Duration, u32) {
    let max = max.max(base);
    if busy {
        return (base, 0);
    }
    if quiet + 1 >= QUIET_TICKS {
        ((cur * 2).clamp(base, max), 0)
    } else {
        (cur.clamp(base, max), quiet + 1)
    }
}

/// Records per batch at most: a batch's record array (about 200 bytes a record) stays
/// below glibc's 128 KiB mmap threshold, so batch memory is recycled from the heap instead
/// of being mapped and page-faulted afresh for every batch.
pub const BATCH_RECORDS: usize = 512;

/// Hands `batch` to the reporter (a full queue drops it, counted) and starts a new one.
/// Returns false when the reporter is gone.
/// Flush requests made so far ([`flush`]) and the latest one whose records were delivered.
static FLUSH_REQ: AtomicU64 = AtomicU64::new(0);
static FLUSH_DONE: AtomicU64 = AtomicU64::new(0);
/// The diagnostic thread (woken by [`flush`]) and the pid of the process that started it
/// (a forked child has no such thread).
static DIAG_THREAD: OnceLock<(std::thread::Thread, u32)> = OnceLock::new();
/// Bound of the flush at process exit.
const EXIT_FLUSH: Duration = Duration::from_millis(500);
/// Longest wait of the reporter thread for a flushed batch to leave the process
/// ([`Sink::settle`]; a hub that hangs must not hold the reporter for longer).
const FLUSH_SETTLE: Duration = Duration::from_secs(1);

/// Delivers every record of operations completed (or failed) before the call to the sink,
/// waiting at most `timeout`; true when delivered (or when no diagnostic thread runs).
/// Called by the runtime on the error path of a failed operation, at `ncclCommAbort` /
/// `ncclCommDestroy`, and (500 ms) at process exit, so that the analyzer hears of a failure
/// even when the process ends right after it.
pub fn flush(timeout: Duration) -> bool {
    let Some((t, pid)) = DIAG_THREAD.get() else {
        return true;
    };
    if *pid != std::process::id() {
        return false; // forked after the start: the threads stayed in the parent
    }
    let want = FLUSH_REQ.fetch_add(1, Ordering::AcqRel) + 1;
    t.unpark();
    let deadline = Instant::now() + timeout;
    loop {
        if FLUSH_DONE.load(Ordering::Acquire) >= want {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn send_batch(btx: &SyncSender<(wire::Batch, u64)>, batch: &mut wire::Batch) -> bool {
    send_batch_marked(btx, batch, 0)
}

/// Sends `batch` (possibly empty) with the flush request it serves (0: none).
fn send_batch_marked(
    btx: &SyncSender<(wire::Batch, u64)>,
    batch: &mut wire::Batch,
    flush: u64,
) -> bool {
    let full = std::mem::replace(
        batch,
        wire::Batch {
            records: Vec::with_capacity(BATCH_RECORDS),
            heartbeats: Vec::new(),
        },
    );
    let n = full.records.len() as u64;
    match btx.try_send((full, flush)) {
        Ok(()) => true,
        Err(TrySendError::Full(_)) => {
            count_drop(n);
            true
        }
        Err(TrySendError::Disconnected(_)) => false,
    }
}

fn diag_loop(cfg: DiagConfig, rx: Receiver<Done>, btx: SyncSender<(wire::Batch, u64)>) {
    let mut sampler = Sampler::new(cfg.clone());
    let mut batch = wire::Batch {
        records: Vec::with_capacity(BATCH_RECORDS),
        heartbeats: Vec::new(),
    };
    let mut last_flush = Instant::now();
    let mut last_hb: Option<Instant> = None;
    let mut last_sched = Instant::now();
    let mut ticks = 0u64;
    let (mut period, mut quiet) = (DEVICE_SAMPLE, 0u32);
    let mut frozen = crate::sched::FrozenClock::for_current_thread();
    loop {
        // Read before draining: every completion queued before the request is sent with it.
        let flush_req = FLUSH_REQ.load(Ordering::Acquire);
        let sources = live_sources();
        let now = now_ns();
        // Completions first (their tick counts are still tracked), then the new tick.
        while let Ok(d) = rx.try_recv() {
            if let Some(s) = sources.iter().find(|s| s.id == d.source) {
                batch.records.push(sampler.complete(s, &d, now));
                if batch.records.len() >= BATCH_RECORDS {
                    if !send_batch(&btx, &mut batch) {
                        return;
                    }
                    last_flush = Instant::now();
                }
            }
        }
        batch.records.extend(sampler.sample(&sources, now));
        (period, quiet) = next_period(
            period,
            quiet,
            sampler.busy(),
            sampler.base_period(),
            cfg.flush,
        );
        if last_hb.is_none_or(|t| t.elapsed() >= cfg.heartbeat) && !sources.is_empty() {
            batch.heartbeats.push(sampler.heartbeat(&sources, now));
            last_hb = Some(Instant::now());
        }
        if flush_req > FLUSH_DONE.load(Ordering::Acquire) {
            if !send_batch_marked(&btx, &mut batch, flush_req) {
                return;
            }
            last_flush = Instant::now();
        }
        let due = last_flush.elapsed() >= cfg.flush || batch.records.len() >= BATCH_RECORDS;
        if due && (!batch.records.is_empty() || !batch.heartbeats.is_empty()) {
            if !send_batch(&btx, &mut batch) {
                return;
            }
            last_flush = Instant::now();
        }
        if last_sched.elapsed() >= crate::sched::SCHED_SAMPLE {
            sampler.sample_cpu_wait(&sources);
            last_sched = Instant::now();
        }
        // The thread clock is a system call: read it every 16th tick only.
        ticks += 1;
        if ticks % 16 == 0 {
            global().cpu_ns[0].store(thread_cpu_ns(), Ordering::Relaxed);
        }
        // Parked rather than slept: `flush` wakes the thread early. An overshoot of the park
        // that scheduling does not explain is time the process was frozen.
        frozen.before_park();
        std::thread::park_timeout(period);
        frozen.after_park(period);
        sampler.set_frozen_ns(frozen.total());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algo, CollKind, OpTypeSet, Proto};

    fn info() -> OpTypeSet {
        OpTypeSet {
            coll: CollKind::AllReduce,
            algo: Algo::Ring,
            proto: Proto::Simple,
            dtype: 7,
            redop: 0,
            count: 1024,
            bytes: 4096,
            root: -1,
            peer: -1,
            n_channels: 2,
        }
    }

    fn src(rank: u32) -> Arc<Source> {
        register(
            Identity {
                comm_id: 0xabc,
                rank,
                nranks: 4,
                device: -1,
                ring_prev: (rank + 3) % 4,
                ring_next: (rank + 1) % 4,
            },
            Arc::new(Frame::new(2)),
            Arc::new(OpLog::new()),
        )
    }

    #[test]
    fn rates_are_reciprocal_change_ticks_and_completion_makes_a_record() {
        let s = src(1);
        let mut sm = Sampler::new(DiagConfig::default());
        let b = s.frame.begin_op(0xabc, 5, 2);
        s.op_log.start(5, &info(), 1_000);
        // Channel 0 changes in 4 ticks, channel 1 in 1 tick.
        for t in 0..4u64 {
            s.frame.add_send(b, 0, 2);
            if t == 0 {
                s.frame.add_recv(b, 1, 8);
            }
            assert!(sm.sample(std::slice::from_ref(&s), 2_000 + t).is_empty());
        }
        s.frame.add_wait_upstream(b, 0, 300);
        let fin = s.op_log.finish(5, 1_000 + 2_000_000_000, true).unwrap();
        let d = Done {
            source: s.id,
            counter: 5,
            snap: fin,
            chans: DoneChans::Heap(Sampler::live_chans(&s, 5)),
            thinning: Thinning::default(),
            failure: None,
            id: None,
        };
        let r = sm.complete(&s, &d, 0);
        assert_eq!(r.trace.unwrap().op_counter, 5);
        assert_eq!((r.rank, r.nranks, r.duration_ns), (1, 4, 2_000_000_000));
        assert_eq!(r.state, wire::OpState::Completed as i32);
        let c0 = &r.channels[0];
        assert_eq!((c0.send_count, c0.send_rate, c0.recv_rate), (8, 0.25, 0.0));
        assert!((c0.send_per_sec - 4.0).abs() < 1e-9);
        assert_eq!(
            (c0.wait_upstream_ns, c0.ring_prev, c0.ring_next),
            (Some(300), Some(0), Some(2))
        );
        let c1 = &r.channels[1];
        assert_eq!((c1.recv_count, c1.recv_rate), (8, 1.0));
        assert_eq!(r.op.unwrap().bytes, 4096);
    }

    #[test]
    fn records_carry_the_cpu_wait_of_the_thread_that_ran_the_operations() {
        if std::fs::metadata("/proc/self/schedstat").is_err() {
            eprintln!("skipped: no schedstat on this kernel");
            return;
        }
        let s = src(3);
        let mut sm = Sampler::new(DiagConfig::default());
        let op = |c: u64| {
            let b = s.frame.begin_op(0xabc, c, 2);
            s.frame.add_send(b, 0, 1);
            s.op_log.start(c, &info(), 1_000);
            let fin = s.op_log.finish(c, 2_000, true).unwrap();
            // This thread completes the operation: it is the one whose CPU wait counts.
            s.op_done(&fin);
            Done {
                source: s.id,
                counter: c,
                snap: fin,
                chans: DoneChans::Heap(Sampler::live_chans(&s, c)),
                thinning: Thinning::default(),
                failure: None,
                id: None,
            }
        };
        // Before any reading the metric is unknown.
        let d = op(1);
        assert_eq!(sm.complete(&s, &d, 0).cpu_wait_ns, None);
        assert_eq!(
            s.exec_tid.load(Ordering::Relaxed),
            crate::sched::current_tid()
        );
        sm.sample_cpu_wait(std::slice::from_ref(&s));
        let d = op(2);
        assert_eq!(sm.complete(&s, &d, 0).cpu_wait_ns, Some(0), "first reading");
        sm.sample_cpu_wait(std::slice::from_ref(&s));
        let d = op(3);
        assert!(sm.complete(&s, &d, 0).cpu_wait_ns.is_some());
    }

    #[test]
    fn a_long_operation_gets_periodic_in_flight_snapshots_and_a_heartbeat() {
        let s = src(2);
        let cfg = DiagConfig {
            inflight: Duration::from_millis(10),
            ..DiagConfig::default()
        };
        let ms = 1_000_000;
        let mut sm = Sampler::new(cfg);
        s.frame.begin_op(0xabc, 0, 2);
        s.op_log.start(0, &info(), 0);
        let one = std::slice::from_ref(&s);
        assert!(sm.sample(one, 5 * ms).is_empty(), "too young");
        let r = sm.sample(one, 10 * ms);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].state, wire::OpState::InFlight as i32);
        assert_eq!(r[0].duration_ns, 10 * ms);
        assert!(sm.sample(one, 15 * ms).is_empty(), "not yet due again");
        assert_eq!(sm.sample(one, 20 * ms).len(), 1);
        let hb = sm.heartbeat(one, 21 * ms);
        assert_eq!(hb.ranks.len(), 1);
        assert_eq!(hb.ranks[0].last_op_counter, Some(0));
        assert_eq!((hb.ranks[0].rank, hb.ranks[0].nranks), (2, 4));
        // No op started yet on a fresh source: no counter in the heartbeat.
        let fresh = src(3);
        assert_eq!(sm.heartbeat(&[fresh], 0).ranks[0].last_op_counter, None);
    }

    #[test]
    fn env_is_strict() {
        let get = |v: &'static str| move |n: &str| (n == "CCLD_SAMPLE_US").then(|| v.to_string());
        let set = DiagConfig::resolve(&get("250")).unwrap();
        assert_eq!(set.sample, Some(Duration::from_micros(250)));
        for bad in ["0", "x", "-1", "1e3"] {
            let e = DiagConfig::resolve(&get(bad)).unwrap_err();
            assert!(e.contains("CCLD_SAMPLE_US"), "{e}");
        }
        let unset = DiagConfig::resolve(&|_| None).unwrap();
        assert_eq!(unset, DiagConfig::default());
        // Unset: 10 ms while only host-backend communicators are registered, 1 ms with a
        // device communicator; a value set applies to both.
        let host = src(0);
        let dev = register(
            Identity {
                device: 0,
                ..host.identity().clone()
            },
            Arc::new(Frame::new(2)),
            Arc::new(OpLog::new()),
        );
        assert_eq!(
            unset.sample_period(std::slice::from_ref(&host)),
            HOST_SAMPLE
        );
        assert_eq!(
            unset.sample_period(&[host.clone(), dev.clone()]),
            DEVICE_SAMPLE
        );
        assert_eq!(set.sample_period(&[host, dev]), Duration::from_micros(250));
    }

    #[test]
    fn completions_of_fast_operations_keep_their_records() {
        // 3 x FRAME_BLOCKS operations finish before the diagnostic thread looks at any of
        // them (operations shorter than a tick): the op log and the frame have long been
        // reused, yet every completion must become a record with its own times and counts.
        let s = src(2);
        let mut sm = Sampler::new(DiagConfig::default());
        let n_ops = 3 * crate::FRAME_BLOCKS as u64;
        let msgs: Vec<Done> = (0..n_ops)
            .map(|k| {
                let b = s.frame.begin_op(0xabc, k, 2);
                s.op_log.start(k, &info(), 1_000 * k);
                s.frame.add_send(b, 0, k + 1);
                s.frame.add_recv(b, 1, 2 * k + 1);
                let fin = s.op_log.finish(k, 1_000 * k + 10 * (k + 1), true).unwrap();
                s.done_message(&fin, Thinning::default())
            })
            .collect();
        for (k, d) in (0..n_ops).zip(&msgs) {
            let r = sm.complete(&s, d, 10_000_000);
            assert_eq!(r.trace.unwrap().op_counter, k);
            assert_eq!((r.start_ns, r.duration_ns), (1_000 * k, 10 * (k + 1)));
            assert_eq!(r.channels[0].send_count, k + 1);
            assert_eq!(r.channels[1].recv_count, 2 * k + 1);
            assert_eq!(r.state, wire::OpState::Completed as i32);
        }
    }

    #[test]
    fn thread_cpu_clock_counts_this_threads_work_only() {
        let t0 = thread_cpu_ns();
        assert!(t0 > 0, "CLOCK_THREAD_CPUTIME_ID unavailable");
        // Sleeping uses no CPU; spinning does (bounded in wall time for a loaded machine).
        std::thread::sleep(Duration::from_millis(30));
        let t1 = thread_cpu_ns();
        assert!(
            t1 - t0 < 10_000_000,
            "slept 30 ms, clock advanced {} ns",
            t1 - t0
        );
        let spin = Instant::now();
        let mut x = 0u64;
        while thread_cpu_ns() - t1 < 5_000_000 {
            x = std::hint::black_box(x.wrapping_add(1));
            assert!(
                spin.elapsed() < Duration::from_secs(10),
                "10 s of spinning did not advance the thread clock by 5 ms"
            );
        }
    }

    /// Runs operation `c` on `s` from `start` to `end` (ns) and returns what thinning
    /// decides for its completion.
    fn finish_op(s: &Source, c: u64, start: u64, end: u64) -> Option<Thinning> {
        let b = s.frame.begin_op(0xabc, c, 2);
        s.frame.add_send(b, 0, 1);
        s.op_log.start(c, &info(), start);
        let fin = s.op_log.finish(c, end, true).unwrap();
        s.thin_completion(&fin)
    }

    #[test]
    fn fast_ranks_report_the_same_thinned_rounds_with_their_gaps() {
        // Two ranks of one communicator run 2000 operations of 50 us, one every 60 us,
        // rank 1 entering 7 us later than rank 0 (default target: one report per 5 ms, so
        // 83 operations per report: stride 64).
        let (a, b) = (src(0), src(1));
        let mut reported = [Vec::new(), Vec::new()];
        let mut strides = [Vec::new(), Vec::new()];
        for c in 0..2000u64 {
            for (k, s) in [&a, &b].into_iter().enumerate() {
                let start = 1_000_000 + c * 60_000 + 7_000 * k as u64;
                if let Some(t) = finish_op(s, c, start, start + 50_000) {
                    reported[k].push(c);
                    strides[k].push(t.stride);
                    if c > 0 {
                        assert_eq!(t.gap_ns, Some(10_000), "op {c}: 60 - 50 us");
                    } else {
                        assert_eq!(t.gap_ns, None, "nothing before the first operation");
                    }
                }
            }
        }
        assert_eq!(
            reported[0], reported[1],
            "both ranks report the same rounds"
        );
        // The first epoch is complete (the baseline), then about one round in 32.
        assert!(reported[0].starts_with(&(0..thin::EPOCH_OPS).collect::<Vec<_>>()));
        let later = reported[0].iter().filter(|&&c| c >= 64).count();
        assert!((10..80).contains(&later), "{later} of 1936 reported");
        assert_eq!(*strides[0].last().unwrap(), 64);
        for &c in reported[0].iter().filter(|&&c| c >= 64) {
            assert!(thin::selected(0xabc, c, 64), "round {c} not in the sample");
        }
        let (rep, skip) = a.thinning_counts();
        assert_eq!(rep + skip, 2000);
        assert_eq!(rep as usize, reported[0].len());
        // Target zero (CCLD_RECORD_US=0): every completion.
        let all = register_with_target(
            a.identity().clone(),
            Arc::new(Frame::new(2)),
            Arc::new(OpLog::new()),
            Duration::ZERO,
        );
        for c in 0..2000u64 {
            let t = finish_op(&all, c, c * 60_000, c * 60_000 + 50_000).unwrap();
            assert_eq!(t.stride, 1);
        }
    }

    #[test]
    fn slow_operations_and_snapshotted_ones_are_always_reported() {
        let s = src(2);
        // 32 fast operations raise the stride ...
        for c in 0..=32u64 {
            finish_op(&s, c, c * 10_000, c * 10_000 + 5_000);
        }
        let stride = s.thin.stride.load(Ordering::Relaxed);
        assert!(stride >= 64, "{stride}");
        // ... rounds outside the sample are left out (at least 8 in a row here) ...
        let c = (41..)
            .find(|&c| (c - 8..=c).all(|k| !thin::selected(0xabc, k, stride)))
            .unwrap();
        let mut skipped = Vec::new();
        for k in 33..c {
            if finish_op(&s, k, k * 10_000, k * 10_000 + 5_000).is_none() {
                skipped.push(k);
            }
        }
        assert!(
            skipped.ends_with(&(c - 8..c).collect::<Vec<_>>()),
            "{c} {stride} {skipped:?}"
        );
        // ... unless it got an in-flight snapshot: then its completion closes it.
        let cfg = DiagConfig {
            inflight: Duration::from_millis(10),
            ..DiagConfig::default()
        };
        let mut sm = Sampler::new(cfg);
        let start = c * 10_000;
        s.frame.begin_op(0xabc, c, 2);
        s.op_log.start(c, &info(), start);
        let snaps = sm.sample(std::slice::from_ref(&s), start + 20_000_000);
        assert!(sm.busy(), "an operation in flight for 20 ms");
        // The suspected hang brings the completions of the 7 operations before it that
        // thinning left out (the analyzer compares the ranks' last rounds), with their
        // counts and gaps, then the snapshot.
        assert_eq!(snaps.len(), 8);
        for (r, k) in snaps.iter().zip(c - 7..c) {
            assert_eq!(r.trace.unwrap().op_counter, k);
            assert_eq!(r.state, wire::OpState::Completed as i32);
            assert_eq!((r.start_ns, r.duration_ns), (k * 10_000, 5_000));
            // (The op log no longer holds the end of the operation before the first.)
            let gap = (k > c - 7).then_some(5_000);
            assert_eq!(r.gap_ns, gap);
            assert_eq!(r.channels[0].send_count, 1);
        }
        let snap = &snaps[7];
        assert_eq!(snap.state, wire::OpState::InFlight as i32);
        assert_eq!(snap.stride, stride);
        // Later snapshots of the same operation bring nothing again.
        let again = sm.sample(std::slice::from_ref(&s), start + 40_000_000);
        assert_eq!(again.len(), 1);
        let fin = s.op_log.finish(c, start + 2_000_000_000, true).unwrap();
        assert!(s.thin_completion(&fin).is_some(), "snapshotted round {c}");
        // The next unselected round without a snapshot is left out; a failed one is not.
        let d = (c + 1..)
            .find(|&k| !thin::selected(0xabc, k, stride) && k % thin::EPOCH_OPS != 0)
            .unwrap();
        for k in c + 1..d {
            finish_op(
                &s,
                k,
                start + 2_001_000_000 + k,
                start + 2_001_000_000 + k + 1,
            );
        }
        let t0 = start + 2_010_000_000;
        s.frame.begin_op(0xabc, d, 2);
        s.op_log.start(d, &info(), t0);
        let fin = s.op_log.finish(d, t0 + 1_000, true).unwrap();
        assert!(s.thin_completion(&fin).is_none(), "round {d} left out");
        s.frame.begin_op(0xabc, d + 1, 2);
        s.op_log.start(d + 1, &info(), t0 + 2_000);
        let fin = s.op_log.finish(d + 1, t0 + 3_000, false).unwrap();
        let failed = s.thin_completion(&fin);
        assert_eq!(
            failed.map(|t| t.gap_ns),
            Some(Some(1_000)),
            "failed: reported"
        );
    }

    #[test]
    fn a_rank_idle_after_thinned_operations_reports_its_last_ones() {
        // Fast operations (stride well above 1), then the rank stops issuing (it does not
        // enter the next operation, or waits before it): after an in-flight period, the
        // thinned completions among its last 8 operations go out, once.
        let s = src(1);
        let mut left_out = Vec::new();
        for c in 0..200u64 {
            if finish_op(&s, c, c * 10_000, c * 10_000 + 5_000).is_none() {
                left_out.push(c);
            }
        }
        let last_end = 199 * 10_000 + 5_000;
        let cfg = DiagConfig {
            inflight: Duration::from_millis(10),
            ..DiagConfig::default()
        };
        let mut sm = Sampler::new(cfg);
        let one = std::slice::from_ref(&s);
        assert!(
            sm.sample(one, last_end + 5_000_000).is_empty(),
            "idle 5 ms: not yet"
        );
        let got: Vec<u64> = sm
            .sample(one, last_end + 10_000_000)
            .iter()
            .map(|r| r.trace.unwrap().op_counter)
            .collect();
        let want: Vec<u64> = left_out.into_iter().filter(|&c| c >= 192).collect();
        assert!(!want.is_empty());
        assert_eq!(got, want);
        assert!(!sm.busy());
        assert!(sm.sample(one, last_end + 30_000_000).is_empty(), "once");
    }

    #[test]
    fn sampling_period_backs_off_while_nothing_runs_long() {
        let (base, max) = (Duration::from_millis(1), Duration::from_millis(50));
        let (mut p, mut q) = (base, 0);
        let mut seen = Vec::new();
        for _ in 0..40 {
            (p, q) = next_period(p, q, false, base, max);
            seen.push(p.as_millis());
        }
        // Doubles every QUIET_TICKS ticks: 1 (x3), 2 (x4), 4, ... up to 50.
        assert_eq!(&seen[..8], &[1, 1, 1, 2, 2, 2, 2, 4]);
        assert_eq!(*seen.last().unwrap(), 50);
        // One busy tick: straight back to the base period.
        assert_eq!(next_period(p, q, true, base, max), (base, 0));
        // A base period above the cap is kept.
        let long = Duration::from_millis(200);
        assert_eq!(next_period(long, 3, false, long, max).0, long);
    }

    #[test]
    fn dropped_sources_unregister() {
        let s = src(0);
        let id = s.id;
        assert!(live_sources().iter().any(|x| x.id == id));
        drop(s);
        assert!(!live_sources().iter().any(|x| x.id == id));
    }
}
