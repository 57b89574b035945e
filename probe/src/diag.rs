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
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use analyzer::wire;

use crate::frame::Frame;
use crate::optype::{OpLog, OpSnapshot, OpState};
use crate::sched::CpuWaitTracker;

/// Monotonic nanoseconds since the first call in this process (the clock of op-log
/// timestamps and of the embedded analyzer).
pub fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
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
    fn done_message(&self, snap: &OpSnapshot) -> Done {
        let counter = snap.op_counter;
        let block = (counter % crate::FRAME_BLOCKS as u64) as usize;
        let n = self.frame.header().n_channels as usize;
        Done {
            source: self.id,
            counter,
            snap: *snap,
            chans: DoneChans::collect(n, |c| chan_done(&self.frame, block, c)),
        }
    }

    /// Called by the executor when an operation finished, with the entry `OpLog::finish`
    /// returned: copies its counters and queues them for the diagnostic thread without
    /// blocking.
    pub fn op_done(&self, snap: &OpSnapshot) {
        // On the host backend the completing thread ran the operation (on the device
        // backend it is a CUDA callback thread, whose CPU wait says nothing).
        if self.ident.device < 0 {
            self.exec_tid
                .store(crate::sched::current_tid(), Ordering::Relaxed);
        }
        if global().done_tx.try_send(self.done_message(snap)).is_err() {
            // Full queue (or no diagnostic thread): dropped, counted.
            count_drop(1);
        }
    }
}

/// Registers a communicator rank with the diagnostic thread (started on first use by
/// [`start`]). Keep the `Arc`: the source is sampled while it lives.
pub fn register(ident: Identity, frame: Arc<Frame>, op_log: Arc<OpLog>) -> Arc<Source> {
    let g = global();
    let id = g.next_id.fetch_add(1, Ordering::Relaxed);
    let s = Arc::new(Source {
        id,
        ident,
        frame,
        op_log,
        exec_tid: AtomicI32::new(0),
    });
    let mut v = lock(&g.sources);
    v.retain(|(_, w)| w.strong_count() > 0);
    v.push((id, Arc::downgrade(&s)));
    s
}

/// Settings of the diagnostic thread (from the environment).
#[derive(Clone, Debug, PartialEq)]
pub struct DiagConfig {
    /// Sampling period (`CCLD_SAMPLE_US`).
    pub sample: Duration,
    /// In-flight snapshot period (`CCLD_INFLIGHT_MS`).
    pub inflight: Duration,
    /// Heartbeat period (`CCLD_HEARTBEAT_MS`).
    pub heartbeat: Duration,
    /// Longest time records wait before a batch is sent.
    pub flush: Duration,
}

impl Default for DiagConfig {
    fn default() -> Self {
        DiagConfig {
            sample: Duration::from_micros(1000),
            inflight: Duration::from_millis(1000),
            heartbeat: Duration::from_millis(1000),
            flush: Duration::from_millis(50),
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
    /// Pure resolution from `get` (strict: a malformed value is an error naming it).
    pub fn resolve(get: EnvGet<'_>) -> Result<DiagConfig, String> {
        let d = DiagConfig::default();
        Ok(DiagConfig {
            sample: env_u64(get, "CCLD_SAMPLE_US", 10, 10_000_000)?
                .map_or(d.sample, Duration::from_micros),
            inflight: env_u64(get, "CCLD_INFLIGHT_MS", 1, 3_600_000)?
                .map_or(d.inflight, Duration::from_millis),
            heartbeat: env_u64(get, "CCLD_HEARTBEAT_MS", 1, 3_600_000)?
                .map_or(d.heartbeat, Duration::from_millis),
            flush: d.flush,
        })
    }
}

/// Where batches go.
pub trait Sink: Send {
    /// Delivers one batch (may block; runs on the reporter thread).
    fn deliver(&mut self, batch: wire::Batch);
    /// Called every reporter loop (about every 20 ms) even without batches.
    fn idle(&mut self) {}
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
        wire::OpRecord {
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
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn live_chans(s: &Source, counter: u64) -> Vec<ChanDone> {
        let block = (counter % crate::FRAME_BLOCKS as u64) as usize;
        let n = s.frame.header().n_channels as usize;
        (0..n).map(|c| chan_done(&s.frame, block, c)).collect()
    }

    /// One sampling tick over `sources` at `now` (process clock): updates the change
    /// counts and returns in-flight snapshots that are due.
    pub fn sample(&mut self, sources: &[Arc<Source>], now: u64) -> Vec<wire::OpRecord> {
        let mut out = Vec::new();
        let inflight_ns = u64::try_from(self.cfg.inflight.as_nanos()).unwrap_or(u64::MAX);
        for s in sources {
            let h = s.frame.header();
            if !h.mode {
                continue;
            }
            let Some(snap) = s.op_log.get(h.op_counter) else {
                continue;
            };
            let tr = self.tracks.entry(s.id).or_default();
            if tr.counter != Some(h.op_counter) {
                if let Some(old) = tr.counter.take() {
                    self.finished_ticks
                        .insert((s.id, old), std::mem::take(&mut tr.chans));
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
                tr.last_snapshot_ns = now;
                let ticks = tr.chans.clone();
                let seq = self.next_seq();
                out.push(self.record(seq, s, &snap, &live, Some(&ticks), now));
            }
        }
        // Keep the finished-ticks map small (completions normally arrive within a tick).
        if self.finished_ticks.len() > 4096 {
            self.finished_ticks.clear();
        }
        out
    }

    fn complete(&mut self, s: &Source, d: &Done, now: u64) -> wire::OpRecord {
        let seq = self.next_seq();
        let chans = d.chans.as_slice();
        match self.tracks.get_mut(&s.id) {
            Some(tr) if tr.counter == Some(d.counter) => {
                tr.seq_done = Some(d.counter);
                let tr = &self.tracks[&s.id];
                self.record(seq, s, &d.snap, chans, Some(&tr.chans), now)
            }
            _ => {
                let ticks = self.finished_ticks.remove(&(s.id, d.counter));
                self.record(seq, s, &d.snap, chans, ticks.as_deref(), now)
            }
        }
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

    /// The process heartbeat.
    pub fn heartbeat(&self, sources: &[Arc<Source>], now: u64) -> wire::Heartbeat {
        wire::Heartbeat {
            host: self.host.clone(),
            pid: self.pid,
            ranks: sources
                .iter()
                .map(|s| {
                    let h = s.frame.header();
                    wire::RankMembership {
                        comm_id: s.ident.comm_id,
                        rank: s.ident.rank,
                        nranks: s.ident.nranks,
                        last_op_counter: s.op_log.get(h.op_counter).map(|_| h.op_counter),
                    }
                })
                .collect(),
            records_dropped: dropped(),
            time_ns: now,
        }
    }
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
            let (btx, brx) = mpsc::sync_channel::<wire::Batch>(BATCH_QUEUE);
            std::thread::Builder::new()
                .name("ccld-report".into())
                .spawn(move || loop {
                    match brx.recv_timeout(Duration::from_millis(20)) {
                        Ok(b) => sink.deliver(b),
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                    sink.idle();
                    global().cpu_ns[1].store(thread_cpu_ns(), Ordering::Relaxed);
                })
                .map_err(|e| format!("spawning the CCL-D reporter thread: {e}"))?;
            std::thread::Builder::new()
                .name("ccld-diag".into())
                .spawn(move || diag_loop(cfg, rx, btx))
                .map_err(|e| format!("spawning the CCL-D diagnostic thread: {e}"))?;
            Ok(())
        })
        .clone()
}

/// Records per batch at most: a batch's record array (about 200 bytes a record) stays
/// below glibc's 128 KiB mmap threshold, so batch memory is recycled from the heap instead
/// of being mapped and page-faulted afresh for every batch.
pub const BATCH_RECORDS: usize = 512;

/// Hands `batch` to the reporter (a full queue drops it, counted) and starts a new one.
/// Returns false when the reporter is gone.
fn send_batch(btx: &SyncSender<wire::Batch>, batch: &mut wire::Batch) -> bool {
    let full = std::mem::replace(
        batch,
        wire::Batch {
            records: Vec::with_capacity(BATCH_RECORDS),
            heartbeats: Vec::new(),
        },
    );
    let n = full.records.len() as u64;
    match btx.try_send(full) {
        Ok(()) => true,
        Err(TrySendError::Full(_)) => {
            count_drop(n);
            true
        }
        Err(TrySendError::Disconnected(_)) => false,
    }
}

fn diag_loop(cfg: DiagConfig, rx: Receiver<Done>, btx: SyncSender<wire::Batch>) {
    let mut sampler = Sampler::new(cfg.clone());
    let mut batch = wire::Batch {
        records: Vec::with_capacity(BATCH_RECORDS),
        heartbeats: Vec::new(),
    };
    let mut last_flush = Instant::now();
    let mut last_hb: Option<Instant> = None;
    let mut last_sched = Instant::now();
    let mut ticks = 0u64;
    loop {
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
        if last_hb.is_none_or(|t| t.elapsed() >= cfg.heartbeat) && !sources.is_empty() {
            batch.heartbeats.push(sampler.heartbeat(&sources, now));
            last_hb = Some(Instant::now());
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
        std::thread::sleep(cfg.sample);
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
        assert_eq!(
            DiagConfig::resolve(&get("250")).unwrap().sample,
            Duration::from_micros(250)
        );
        for bad in ["0", "x", "-1", "1e3"] {
            let e = DiagConfig::resolve(&get(bad)).unwrap_err();
            assert!(e.contains("CCLD_SAMPLE_US"), "{e}");
        }
        assert_eq!(
            DiagConfig::resolve(&|_| None).unwrap(),
            DiagConfig::default()
        );
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
                s.done_message(&fin)
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

    #[test]
    fn dropped_sources_unregister() {
        let s = src(0);
        let id = s.id;
        assert!(live_sources().iter().any(|x| x.id == id));
        drop(s);
        assert!(!live_sources().iter().any(|x| x.id == id));
    }
}
