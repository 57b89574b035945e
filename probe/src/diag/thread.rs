//! The diagnostic thread and its reporter thread: the loop, batching, flushing.

use super::*;

pub(super) fn live_sources() -> Vec<Arc<Source>> {
    let mut v = global().sources.lock();
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
            let rx = g
                .done_rx
                .lock()
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
pub(super) static FLUSH_REQ: AtomicU64 = AtomicU64::new(0);
pub(super) static FLUSH_DONE: AtomicU64 = AtomicU64::new(0);
/// The diagnostic thread (woken by [`flush`]) and the pid of the process that started it
/// (a forked child has no such thread).
pub(super) static DIAG_THREAD: OnceLock<(std::thread::Thread, u32)> = OnceLock::new();
/// Bound of the flush at process exit.
pub(super) const EXIT_FLUSH: Duration = Duration::from_millis(500);
/// Longest wait of the reporter thread for a flushed batch to leave the process
/// ([`Sink::settle`]; a hub that hangs must not hold the reporter for longer).
pub(super) const FLUSH_SETTLE: Duration = Duration::from_secs(1);

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

pub(super) fn send_batch(btx: &SyncSender<(wire::Batch, u64)>, batch: &mut wire::Batch) -> bool {
    send_batch_marked(btx, batch, 0)
}

/// Sends `batch` (possibly empty) with the flush request it serves (0: none).
pub(super) fn send_batch_marked(
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

pub(super) fn diag_loop(cfg: DiagConfig, rx: Receiver<Done>, btx: SyncSender<(wire::Batch, u64)>) {
    // The snapshot handshake's costly side is this thread's (`crate::asym`).
    crate::asym::enable();
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
        set_coarse_now(now);
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
        if ticks.is_multiple_of(16) {
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
