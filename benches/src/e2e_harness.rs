//! End-to-end harness shared by the `e2e-latency` benchmark and the `e2e_threads` test: ranks
//! as threads (host backend, embedded analyzer), an anomaly injected through `CCLD_INJECT`,
//! and the diagnoses the embedded analyzer raises for that communicator.
//!
//! Windows are shortened through the environment (hang 1.5 s, slow window 0.5 s x 3); see
//! `setup` for the values.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use ccl_core::device::api::{DeviceApi, Stream};
use ccl_core::{enqueue, CollArgs, Comm, CommConfig, DataType};
use ccld_wire::{self as wire, AnomalyClass};
use probe::CollKind;

/// First operation of an injected anomaly: after the analyzer's learning. The engine's
/// dynamic baseline is the first 100 reported rounds within `CCLD_BASELINE_S` (0.5 s
/// here); the self-calibrated long rule learns over a kind's first 3 clean windows (1.5 s
/// here, `theta::ThetaConfig::long_min_windows`): a slowdown that starts within them
/// becomes the norm. This loop runs about 700 operations a second, so operation 1300
/// comes about 1.9 s after the communicators' creation.
const ONSET: u64 = 1300;

/// The shortened detection windows of the end-to-end tests (hang 1.5 s, slow window 0.5 s
/// x 3), as environment variables for the probe and the embedded analyzer.
pub const WINDOW_ENV: [(&str, &str); 8] = [
    ("CCLD_SLOW_WINDOW_S", "0.5"),
    ("CCLD_BASELINE_S", "0.5"),
    ("CCLD_T_BASE_INIT_MS", "1000"),
    ("CCLD_HANG_TIMEOUT_S", "1.5"),
    ("CCLD_INFLIGHT_MS", "200"),
    ("CCLD_SILENT_S", "1"),
    ("CCLD_SLOW_REPEAT", "3"),
    // theta for an oversubscribed 2-core machine, where a rank thread descheduled for a few
    // ms is routine (paper: about 3 on a dedicated cluster). Measured on clean 4-rank runs
    // (36 runs, 446 windows, half of them beside two busy loops): R p99 = 7.5 .. 11.8, and
    // single windows up to 34 (T_base is 0.2 .. 0.5 ms, so one 17 ms descheduling gives
    // R = 34); never three windows in a row above 10 here, but one CI run saw that with
    // theta = 10 and its clean run got a diagnosis. A slow verdict needs three windows in a
    // row above theta (`CCLD_SLOW_REPEAT`).
    ("CCLD_SLOW_THETA", "25"),
];

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("CCLD_ANALYZER", "embedded");
        for (k, v) in WINDOW_ENV {
            std::env::set_var(k, v);
        }
    });
}

/// Ring steps of one operation on each channel: 2(n-1) for AllReduce, n-1 otherwise.
fn ring_steps(n: usize, kind: CollKind) -> usize {
    if kind == CollKind::AllReduce {
        2 * (n - 1)
    } else {
        n - 1
    }
}

/// The "computation" before operation `i` of rank `r` in the harness's training loop: about
/// 1 ms with up to 0.3 ms of per-rank jitter, and at operation [`ONSET`] + 1100 a pause of
/// every rank below the hang threshold (checkpoint-like).
fn compute_step(i: u64, r: usize) {
    let jitter = (i * 7919 + r as u64 * 104_729) % 300;
    std::thread::sleep(Duration::from_micros(1000 + jitter));
    if i == ONSET + 1100 {
        std::thread::sleep(Duration::from_millis(800));
    }
}

/// Serialises "set CCLD_INJECT, init, unset" and the runs themselves (timing).
static RUN: Mutex<()> = Mutex::new(());

/// How much the injected slowdowns exceed the ones first tuned for theta = 10 (S1: 25 ms).
/// Scaled with theta so that an 8-rank AllReduce (T_base about 1 ms) still gives R about
/// twice theta.
const SLOW_SCALE: usize = 3;

/// The `CCLD_INJECT` value of a case: an anomaly of `class` at rank `root` of `n`-rank
/// communicators from operation [`ONSET`] on (empty for `AnomalyClass::Unspecified`).
pub fn spec(class: AnomalyClass, root: usize, n: usize, kind: CollKind) -> String {
    let sel = format!("rank={root},nranks={n},ops={ONSET}..");
    let steps = ring_steps(n, kind);
    // S3: an entry delay about as long as the slowdown the throttle causes, so that P ~ 0.5
    // (between alpha = 0.4 and beta = 0.6). The throttle delays one send per ring step and
    // channel (2(n-1) steps for AllReduce, n-1 otherwise) by up to the gap; with a 6 ms gap
    // an operation was measured 4.2 (4-rank AllGather) .. 6.1 ms (8-rank AllReduce) slower
    // per step, so a delay of 0.85 gap per step gives P = 0.45 .. 0.55.
    let mixed_gap_us = SLOW_SCALE * 2000;
    let mixed_delay_us = steps * mixed_gap_us * 17 / 20;
    // S2: a send gap that slows each operation by about as much as S1's entry delay. With a
    // gap independent of the step count, a ReduceScatter / AllGather of 4 ranks (3 sends a
    // channel) was only about a third as slow: R near theta when the baseline had been
    // learned during a descheduling hiccup, and detection then waited for a window with R
    // above theta (seen: up to 15 s, once more than the tests' 20 s).
    let s2_gap_us = SLOW_SCALE * (25_000 / steps).max(3000);
    let s1_delay_us = SLOW_SCALE * 25_000;
    match class {
        AnomalyClass::S1ComputationSlow => format!("s1:{sel},delay={s1_delay_us}us"),
        AnomalyClass::S2CommunicationSlow => format!("s2:{sel},gap={s2_gap_us}us"),
        AnomalyClass::S3MixedSlow => {
            format!("s3:{sel},delay={mixed_delay_us}us,gap={mixed_gap_us}us")
        }
        AnomalyClass::H1NotEntered => format!("h1:{sel}"),
        AnomalyClass::H2Inconsistent => format!("h2:rank={root},nranks={n},ops={ONSET}"),
        AnomalyClass::H3Hardware => format!("h3:rank={root},nranks={n},ops={ONSET}"),
        AnomalyClass::Unspecified => String::new(),
    }
}

/// Polls the embedded analyzer every 50 ms for diagnoses of communicator `comm_id`, at most
/// `wait`; returns at the first one unless `class` is `Unspecified` (a clean run waits the
/// whole time to see that nothing comes).
fn await_diagnoses(
    emb: &probe::embedded::Embedded,
    comm_id: u64,
    class: AnomalyClass,
    wait: Duration,
) -> Vec<wire::Diagnosis> {
    let t0 = Instant::now();
    let mut found = Vec::new();
    while t0.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(50));
        found = emb
            .diagnoses()
            .into_iter()
            .filter(|d| d.comm_id == comm_id)
            .collect();
        if !found.is_empty() && class != AnomalyClass::Unspecified {
            break;
        }
    }
    found
}

/// Issues one collective `kind` of the harness's shape (AllGather: `send.len() / n` floats
/// per rank; ReduceScatter: `recv.len() / n`; AlltoAll and Gather: `send.len() / n` per
/// peer; Scatter: `recv.len() / n`; Gather and Scatter rooted at rank 0); false when the
/// communicator refused it.
pub fn op(c: &Arc<Comm>, kind: CollKind, send: &[f32], recv: &mut [f32], n: usize) -> bool {
    let count = match kind {
        CollKind::AllReduce => send.len(),
        CollKind::AllGather | CollKind::AlltoAll | CollKind::Gather => send.len() / n,
        _ => recv.len() / n,
    };
    let rooted = matches!(kind, CollKind::Gather | CollKind::Scatter);
    let a = CollArgs {
        kind,
        sendbuf: send.as_ptr() as usize,
        recvbuf: recv.as_mut_ptr() as usize,
        count,
        dtype: DataType::Float32 as i32,
        op: 0,
        root: if rooted { 0 } else { -1 },
        stream: 0,
    };
    enqueue(c, a).is_ok()
}

/// A barrier as the analyzer knows one: an AllReduce of less than 4 bytes (one byte
/// here), never diagnosed. (One float, 4 bytes, would be an operation kind of its own,
/// analysed like any other: a slowdown injected from an operation on slows it too.)
pub fn barrier(c: &Arc<Comm>) -> bool {
    let one = [1u8];
    let mut out = [0u8];
    let a = CollArgs {
        kind: CollKind::AllReduce,
        sendbuf: one.as_ptr() as usize,
        recvbuf: out.as_mut_ptr() as usize,
        count: 1,
        dtype: DataType::Uint8 as i32,
        op: 0,
        root: -1,
        stream: 0,
    };
    enqueue(c, a).is_ok()
}

/// Runs one case: `n` ranks as threads running collective `kind` in a loop, with an
/// anomaly of `class` injected at rank `root` from operation [`ONSET`] on (none for
/// `AnomalyClass::Unspecified`); polls the embedded analyzer for up to `wait` (returning
/// at the first diagnosis unless `class` is `Unspecified`) and returns the diagnoses of the
/// case's communicator. Cases are serialised (one at a time per process).
///
/// # Panics
/// If the communicators cannot be initialised or the embedded analyzer is not running: a
/// test/benchmark harness, where either means the case cannot run at all.
pub fn run_case(
    class: AnomalyClass,
    n: usize,
    root: usize,
    kind: CollKind,
    wait: Duration,
) -> Vec<wire::Diagnosis> {
    run_threads(class, n, root, kind, wait, true).0
}

/// [`run_case`] without the computation step and with 1 KiB buffers: the ranks issue
/// their collectives back to back (tens of microseconds each), so record thinning runs at a
/// large stride. Returns the diagnoses and rank 0's reported / thinned completion counts.
///
/// # Panics
/// As [`run_case`].
pub fn run_fast_case(
    class: AnomalyClass,
    n: usize,
    root: usize,
    kind: CollKind,
    wait: Duration,
) -> (Vec<wire::Diagnosis>, (u64, u64)) {
    run_threads(class, n, root, kind, wait, false)
}

fn run_threads(
    class: AnomalyClass,
    n: usize,
    root: usize,
    kind: CollKind,
    wait: Duration,
    compute: bool,
) -> (Vec<wire::Diagnosis>, (u64, u64)) {
    setup();
    let _g = RUN.lock().unwrap_or_else(|p| p.into_inner());
    let s = spec(class, root, n, kind);
    if !s.is_empty() {
        std::env::set_var("CCLD_INJECT", &s);
    }
    let comms = Comm::init_all(n as i32, None).expect("init");
    std::env::remove_var("CCLD_INJECT");
    let id = comms[0].comm_id();
    let stop = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let c = Arc::clone(c);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                // 64 KiB per rank buffer; 1 KiB in the fast loop.
                let floats = if compute { 16 << 10 } else { 256 };
                let send = vec![1.0f32; floats];
                let mut recv =
                    vec![0.0f32; floats * if kind == CollKind::AllGather { n } else { 1 }];
                let mut i = 0u64;
                while !stop.load(Ordering::Acquire) {
                    if compute {
                        compute_step(i, r);
                    }
                    if i % 50 == 49 && !barrier(&c) {
                        return;
                    }
                    if !op(&c, kind, &send, &mut recv, n) {
                        return;
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let emb = probe::embedded::embedded().expect("embedded analyzer started at init");
    let found = await_diagnoses(&emb, id, class, wait);
    let records = comms[0].probe_record_counts().unwrap_or_default();
    stop.store(true, Ordering::Release);
    for c in &comms {
        let _ = c.abort();
    }
    for h in hs {
        let _ = h.join();
    }
    (found, records)
}

/// One rank of a device case: its stream and device buffers (allocated once; freeing
/// device memory synchronizes the whole device on CUDA).
struct DevBufs {
    api: Arc<dyn DeviceApi>,
    stream: Stream,
    send: usize,
    recv: usize,
    one: usize,
    out: usize,
}

impl DevBufs {
    fn new(api: Arc<dyn DeviceApi>, floats: usize, recv_floats: usize) -> Result<DevBufs, String> {
        let e = |e: ccl_core::CclError| e.to_string();
        let stream = api.stream_create().map_err(e)?;
        let send = api.malloc(floats * 4).map_err(e)?;
        let recv = api.malloc(recv_floats * 4).map_err(e)?;
        let one = api.malloc(64).map_err(e)?;
        let out = api.malloc(64).map_err(e)?;
        let ones = vec![1.0f32; floats];
        // SAFETY: `send` has floats * 4 bytes (just allocated), `ones` as many; `one` has
        // 64 bytes, the source 4.
        unsafe {
            api.memcpy(send, ones.as_ptr() as usize, floats * 4)
                .map_err(e)?;
            api.memcpy(one, ones.as_ptr() as usize, 4).map_err(e)?;
        }
        Ok(DevBufs {
            api,
            stream,
            send,
            recv,
            one,
            out,
        })
    }

    /// Waits for the stream (polling, so a stop request after abort is seen): true when
    /// it drained, false when `stop` was set and it did not drain within 10 s after.
    fn drain(&self, stop: &AtomicBool) -> bool {
        let mut stopped_at: Option<Instant> = None;
        loop {
            match self.api.stream_query(self.stream) {
                Ok(true) => return true,
                Ok(false) => {}
                Err(_) => return false,
            }
            if stop.load(Ordering::Acquire) {
                let t = *stopped_at.get_or_insert_with(Instant::now);
                if t.elapsed() > Duration::from_secs(10) {
                    return false;
                }
            }
            std::thread::sleep(Duration::from_micros(300));
        }
    }

    fn release(self, stop: &AtomicBool) {
        if self.drain(stop) {
            for p in [self.send, self.recv, self.one, self.out] {
                let _ = self.api.free(p);
            }
            let _ = self.api.stream_destroy(self.stream);
        }
        // else: leaked on purpose (a kernel may still use them).
    }
}

/// Issues one collective on device buffers and stream (shapes as [`op`]); `tiny`: the
/// [`barrier`] (one byte) instead.
fn dev_op(c: &Arc<Comm>, kind: CollKind, b: &DevBufs, floats: usize, n: usize, tiny: bool) -> bool {
    let (send, recv, count, dtype) = if tiny {
        (b.one, b.out, 1, DataType::Uint8)
    } else {
        let count = match kind {
            CollKind::AllReduce | CollKind::AllGather => floats,
            _ => floats / n,
        };
        (b.send, b.recv, count, DataType::Float32)
    };
    let a = CollArgs {
        kind: if tiny { CollKind::AllReduce } else { kind },
        sendbuf: send,
        recvbuf: recv,
        count,
        dtype: dtype as i32,
        op: 0,
        root: -1,
        stream: b.stream,
    };
    enqueue(c, a).is_ok()
}

/// [`run_case`] with device communicators: `n` ranks as threads of this process, each
/// with its own communicator (`Comm::init_rank` on a shared id, device `device` of `api`:
/// the CPU emulator with `CCLD_DEVICE_EMULATION=1`, or a GPU), stream and device buffers;
/// after every collective the rank waits for its stream (device collectives return before
/// they complete), like a training step that uses the result. Same loop, anomaly and
/// analyzer polling as `run_case`; `Err` when the ranks could not be set up (e.g. the
/// communicators chose the host backend).
pub fn run_case_device(
    api: &Arc<dyn DeviceApi>,
    device: i32,
    class: AnomalyClass,
    n: usize,
    root: usize,
    kind: CollKind,
    wait: Duration,
) -> Result<Vec<wire::Diagnosis>, String> {
    let case = DeviceCase {
        class,
        n,
        root,
        kind,
        wait,
    };
    device_case(api, device, &case, None)
}

/// One rank's real inconsistent call (no `CCLD_INJECT`): at its operation `at` (counted
/// from 0, after the loop's start), rank `rank` passes half the count its peers pass.
#[derive(Clone, Copy, Debug)]
pub struct WrongCount {
    pub rank: usize,
    pub at: u64,
}

/// [`run_case_device`] where the anomaly is `wrong` (class H2, root `wrong.rank`): the
/// kernels' descriptor check fails the operation and the analyzer must name the rank.
pub fn run_case_device_wrong_count(
    api: &Arc<dyn DeviceApi>,
    device: i32,
    n: usize,
    kind: CollKind,
    wait: Duration,
    wrong: WrongCount,
) -> Result<Vec<wire::Diagnosis>, String> {
    let case = DeviceCase {
        class: AnomalyClass::H2Inconsistent,
        n,
        root: wrong.rank,
        kind,
        wait,
    };
    device_case(api, device, &case, Some(wrong))
}

/// What [`device_case`] runs and waits for.
#[derive(Clone, Copy)]
struct DeviceCase {
    class: AnomalyClass,
    n: usize,
    root: usize,
    kind: CollKind,
    wait: Duration,
}

fn device_case(
    api: &Arc<dyn DeviceApi>,
    device: i32,
    case: &DeviceCase,
    wrong: Option<WrongCount>,
) -> Result<Vec<wire::Diagnosis>, String> {
    let DeviceCase {
        class,
        n,
        root,
        kind,
        wait,
    } = *case;
    setup();
    let _g = RUN.lock().unwrap_or_else(|p| p.into_inner());
    let s = if wrong.is_some() {
        String::new()
    } else {
        spec(class, root, n, kind)
    };
    if !s.is_empty() {
        std::env::set_var("CCLD_INJECT", &s);
    }
    let id = ccl_core::bootstrap::get_unique_id().map_err(|e| e.to_string());
    let id = match id {
        Ok(id) => id,
        Err(e) => {
            std::env::remove_var("CCLD_INJECT");
            return Err(e);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel::<Result<Arc<Comm>, String>>();
    // Set once every rank is set up (or, with `stop`, when the case is abandoned).
    let go = Arc::new(AtomicBool::new(false));
    let floats = 16 << 10; // 64 KiB per rank buffer
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (api, stop, tx, go) = (
                Arc::clone(api),
                Arc::clone(&stop),
                tx.clone(),
                Arc::clone(&go),
            );
            std::thread::spawn(move || {
                let init = api
                    .set_device(device)
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        Comm::init_rank(n as i32, id, r as i32, CommConfig::default())
                            .map_err(|e| e.to_string())
                    })
                    .and_then(|c| {
                        if c.is_device() {
                            Ok(c)
                        } else {
                            let _ = c.destroy();
                            Err("the communicator chose the host backend".to_string())
                        }
                    });
                let recv_floats = floats * if kind == CollKind::AllGather { n } else { 1 };
                let setup = init.and_then(|c| {
                    DevBufs::new(Arc::clone(&api), floats, recv_floats).map(|b| (c, b))
                });
                let (c, b) = match setup {
                    Ok((c, b)) => {
                        let _ = tx.send(Ok(Arc::clone(&c)));
                        (c, b)
                    }
                    Err(e) => {
                        let _ = tx.send(Err(format!("rank {r}: {e}")));
                        return;
                    }
                };
                while !go.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let mut i = 0u64;
                while !stop.load(Ordering::Acquire) {
                    compute_step(i, r);
                    if i % 50 == 49 && (!dev_op(&c, kind, &b, floats, n, true) || !b.drain(&stop)) {
                        break;
                    }
                    let half = wrong.is_some_and(|w| w.rank == r && w.at == i);
                    let count = if half { floats / 2 } else { floats };
                    if !dev_op(&c, kind, &b, count, n, false) || !b.drain(&stop) {
                        break;
                    }
                    i += 1;
                }
                b.release(&stop);
            })
        })
        .collect();
    drop(tx);
    let mut comms = Vec::new();
    let mut errs = Vec::new();
    for _ in 0..n {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(c)) => comms.push(c),
            Ok(Err(e)) => errs.push(e),
            Err(_) => errs.push("a rank did not finish init within 60 s".into()),
        }
    }
    std::env::remove_var("CCLD_INJECT");
    if !errs.is_empty() {
        stop.store(true, Ordering::Release);
        abort_together(&comms);
        for h in hs {
            let _ = h.join();
        }
        return Err(errs.join("; "));
    }
    let cid = comms[0].comm_id();
    go.store(true, Ordering::Release);
    let emb = probe::embedded::embedded().ok_or("embedded analyzer not running")?;
    let found = await_diagnoses(&emb, cid, class, wait);
    stop.store(true, Ordering::Release);
    // Ranks that are not hung finish their operation and stop on their own; then abort.
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(2) && !hs.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(10));
    }
    abort_together(&comms);
    for h in hs {
        let _ = h.join();
    }
    Ok(found)
}

/// Aborts every communicator at once (one thread each, released together). `abort` frees
/// a rank's inbound FIFOs once its own operations ended, and the kernels of its peers in
/// this process read those FIFOs' counters until their own abort flag is set: aborting
/// one rank after the other would free memory under a peer's running kernel (on CUDA,
/// `cudaFree` would wait for that kernel, which waits for an abort that never comes).
fn abort_together(comms: &[Arc<Comm>]) {
    let go = Arc::new(std::sync::Barrier::new(comms.len()));
    let hs: Vec<_> = comms
        .iter()
        .map(|c| {
            let (c, go) = (Arc::clone(c), Arc::clone(&go));
            std::thread::spawn(move || {
                go.wait();
                let _ = c.abort();
            })
        })
        .collect();
    for h in hs {
        let _ = h.join();
    }
}

/// The collectives of the end-to-end matrix.
pub const COLLS: [CollKind; 3] = [
    CollKind::AllReduce,
    CollKind::AllGather,
    CollKind::ReduceScatter,
];

/// The full matrix of one class when `CCLD_E2E_FULL=1`: {4, 8} ranks x roots {0, 1, n-1} x
/// [`COLLS`] (18 cases); `None` otherwise.
pub fn full_cases() -> Option<Vec<(usize, usize, CollKind)>> {
    if std::env::var("CCLD_E2E_FULL").as_deref() != Ok("1") {
        return None;
    }
    let mut v = Vec::new();
    for n in [4, 8] {
        for root in [0, 1, n - 1] {
            for k in COLLS {
                v.push((n, root, k));
            }
        }
    }
    Some(v)
}

/// The end-to-end verdict on the roots of a diagnosis of the injected `class` at `root`:
/// hangs and S1 name the rank alone; S2/S3 name the slow link, sender first (with one ring
/// order on every channel its two ends cannot be told apart by wait times alone, see
/// docs/diagnosis.md), so the roots are [throttled sender, ring successor].
pub fn roots_ok(class: AnomalyClass, root: usize, roots: &[u32]) -> bool {
    match class {
        AnomalyClass::S2CommunicationSlow | AnomalyClass::S3MixedSlow => {
            roots.first() == Some(&(root as u32))
        }
        _ => roots == [root as u32],
    }
}
