//! Shared by `tests/device_emu.rs` and `examples/device_matrix.rs` (included there with
//! `#[path]`, next to `tests/common/mod.rs`, which must be in scope as `crate::common`):
//!
//! - [`check_output`]: a rank's output of a collective against the host reference of
//!   `common` (inputs, reductions), bit for bit where the reference is exact;
//! - [`DevRank`]: one rank driving its own communicator from its own thread with buffers
//!   allocated through the runtime's [`DeviceApi`] (the same code on the CPU emulator and
//!   on CUDA), its own stream, results read back with copies, probe counters checked
//!   against `group::expected_counts`.
//!
//! Everything is bounded in time: a stream that does not drain within the rank's limit
//! aborts the communicator and reports the case as timed out.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ccl_core::device::api::{DeviceApi, Stream};
use ccl_core::internal::group::expected_counts;
use ccl_core::{group_end, group_start, CollArgs, Comm, CommConfig, DataType};
use ccl_optype::CollKind;

use crate::common::{
    check_probe, dec, enc, fill, input, reduce_ref, sizes, Red, AVG, MAX, PERIOD, SUM,
};

/// Where element `k` of a rank's output comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    /// The reduction over all ranks of input index `i`.
    Reduced(usize),
    /// Input index `i` of rank `q`.
    Input(usize, usize),
    /// Not specified (Reduce on a non-root rank).
    Unspecified,
}

/// Source of output element `k` of rank `r` (of `n`) for `coll` with `count` and `root`.
pub fn source(coll: CollKind, n: usize, r: usize, root: usize, count: usize, k: usize) -> Src {
    match coll {
        CollKind::AllReduce => Src::Reduced(k),
        CollKind::Reduce if r == root => Src::Reduced(k),
        CollKind::Reduce | CollKind::Gather if r != root => Src::Unspecified,
        CollKind::ReduceScatter => Src::Reduced(r * count + k),
        CollKind::Broadcast => Src::Input(root, k),
        CollKind::AllGather | CollKind::Gather => Src::Input(k / count, k % count),
        CollKind::AlltoAll => Src::Input(k / count, r * count + k % count),
        CollKind::Scatter => Src::Input(root, r * count + k),
        // Ring Send/Recv: rank r receives from r - 1.
        CollKind::Send | CollKind::Recv => Src::Input((r + n - 1) % n, k),
        _ => Src::Unspecified,
    }
}

/// Checks rank `r`'s output `out` (the receive buffer, `rn` elements of `dt`) against the
/// reference: byte equality with the encoded reference value (every case with a
/// power-of-two rank count), else within the reference's tolerance (float Avg). Names the first
/// mismatching element.
#[allow(clippy::too_many_arguments)]
pub fn check_output(
    coll: CollKind,
    dt: DataType,
    red: Red,
    n: usize,
    r: usize,
    root: usize,
    count: usize,
    out: &[u8],
) -> Result<(), String> {
    let es = dt.size();
    let rn = out.len() / es;
    let reduced: Vec<(f64, f64)> = (0..PERIOD).map(|i| reduce_ref(dt, red, n, i)).collect();
    let enc1 = |v: f64| {
        let mut b = vec![0u8; es];
        enc(dt, v, &mut b);
        b
    };
    let reduced_bytes: Vec<Vec<u8>> = reduced.iter().map(|t| enc1(t.0)).collect();
    let inputs: Vec<Vec<Vec<u8>>> = (0..n)
        .map(|q| (0..PERIOD).map(|i| enc1(input(dt, red, q, i))).collect())
        .collect();
    for k in 0..rn {
        let got = &out[k * es..(k + 1) * es];
        let (want, tol): (&[u8], f64) = match source(coll, n, r, root, count, k) {
            Src::Unspecified => continue,
            // Power-of-two rank counts: exact (float Avg multiplies by an exact 1/n).
            Src::Reduced(i) if n.is_power_of_two() => (&reduced_bytes[i % PERIOD], 0.0),
            Src::Reduced(i) => (&reduced_bytes[i % PERIOD], reduced[i % PERIOD].1),
            Src::Input(q, i) => (&inputs[q][i % PERIOD], 0.0),
        };
        if got == want {
            continue;
        }
        let (g, w) = (dec(dt, got), dec(dt, want));
        if tol > 0.0 && (g - w).abs() <= tol {
            continue;
        }
        return Err(format!(
            "element {k}: got {g} ({got:02x?}), want {w} ({want:02x?}){}",
            if tol > 0.0 {
                format!(" (tolerance {tol})")
            } else {
                String::new()
            }
        ));
    }
    Ok(())
}

/// One case of the device matrix.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DevCase {
    /// Collective; `Send` stands for the Send/Recv ring (every rank sends to the next and
    /// receives from the previous in one group).
    pub coll: CollKind,
    pub dt: DataType,
    pub red: Red,
    /// Raw op value passed to the library.
    pub op: i32,
    pub count: usize,
}

impl DevCase {
    /// Root of rooted collectives for `n` ranks (varies with the count).
    pub fn root(&self, n: usize) -> usize {
        (self.count + 1) % n
    }

    /// "AllReduce float32 sum count 999" (Send/Recv ring: "SendRecvRing ...").
    pub fn name(&self) -> String {
        let coll = if self.coll == CollKind::Send {
            "SendRecvRing"
        } else {
            self.coll.name()
        };
        let red = match self.coll {
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter => {
                format!(" {:?}", self.red).to_lowercase()
            }
            _ => String::new(),
        };
        format!("{coll} {}{red} count {}", self.dt.name(), self.count)
    }

    /// Bytes of the larger of the two buffers for `n` ranks.
    pub fn max_bytes(&self, n: usize) -> usize {
        let (s, r) = sizes(self.coll, self.count, n);
        s.max(r) * self.dt.size()
    }
}

/// Why a case failed.
#[derive(Clone, Debug, PartialEq)]
pub enum CaseErr {
    /// Wrong output or probe counters; the communicator is still usable.
    Wrong(String),
    /// Enqueue failed or the operation did not complete (the communicator was aborted):
    /// later cases cannot run.
    Broken(String),
}

impl std::fmt::Display for CaseErr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaseErr::Wrong(s) | CaseErr::Broken(s) => f.write_str(s),
        }
    }
}

fn broken(e: impl std::fmt::Display) -> CaseErr {
    CaseErr::Broken(e.to_string())
}

/// One rank of a device matrix run: its communicator, stream and device buffers.
pub struct DevRank {
    pub api: Arc<dyn DeviceApi>,
    pub comm: Arc<Comm>,
    pub stream: Stream,
    send: usize,
    recv: usize,
    cap: usize,
    limit: Duration,
}

impl std::fmt::Debug for DevRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevRank(rank {}, cap {})", self.comm.rank(), self.cap)
    }
}

impl DevRank {
    /// A stream and two device buffers of `cap` bytes each (allocated once: freeing device
    /// memory synchronizes the whole device on CUDA, which would stall the other ranks'
    /// kernels that wait for this rank). `limit`: how long one case may take.
    pub fn new(
        api: Arc<dyn DeviceApi>,
        comm: Arc<Comm>,
        cap: usize,
        limit: Duration,
    ) -> Result<DevRank, String> {
        let cap = cap.max(64);
        let stream = api.stream_create().map_err(|e| e.to_string())?;
        let send = api.malloc(cap).map_err(|e| e.to_string())?;
        let recv = match api.malloc(cap) {
            Ok(p) => p,
            Err(e) => {
                let _ = api.free(send);
                return Err(e.to_string());
            }
        };
        Ok(DevRank {
            api,
            comm,
            stream,
            send,
            recv,
            cap,
            limit,
        })
    }

    fn n(&self) -> usize {
        self.comm.nranks() as usize
    }

    pub fn r(&self) -> usize {
        self.comm.rank() as usize
    }

    /// Waits (polling, bounded) until the stream drained; on timeout aborts the
    /// communicator (the kernels stop at the abort flag).
    pub fn wait(&self, what: &str) -> Result<(), String> {
        let t0 = Instant::now();
        loop {
            match self.api.stream_query(self.stream) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(format!("{what}: stream query: {e}")),
            }
            if t0.elapsed() > self.limit {
                let _ = self.comm.abort();
                return Err(format!(
                    "{what}: did not complete within {:?} (communicator aborted)",
                    self.limit
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Copies `host` to device address `dst` on the stream.
    fn upload(&self, dst: usize, host: &[u8]) -> Result<(), String> {
        // SAFETY: `dst` is one of our buffers of `cap >= host.len()` bytes (checked by the
        // callers); `host` stays alive until `wait` returned (every caller waits before
        // dropping it).
        unsafe {
            self.api
                .memcpy_async(dst, host.as_ptr() as usize, host.len(), self.stream)
        }
        .map_err(|e| e.to_string())
    }

    /// Copies `host.len()` bytes from device address `src` and waits.
    fn download(&self, src: usize, host: &mut [u8]) -> Result<(), String> {
        // SAFETY: as in `upload`; we wait before returning.
        unsafe {
            self.api
                .memcpy_async(host.as_mut_ptr() as usize, src, host.len(), self.stream)
        }
        .map_err(|e| e.to_string())?;
        self.wait("copy back")
    }

    /// Runs one case on this rank (every rank of the communicator must run the same case)
    /// and checks its output and probe counters.
    pub fn run(&mut self, c: &DevCase) -> Result<(), CaseErr> {
        if c.coll == CollKind::Send {
            return self.sendrecv_ring(c);
        }
        let (n, r) = (self.n(), self.r());
        let es = c.dt.size();
        let (sn, rn) = sizes(c.coll, c.count, n);
        if sn.max(rn) * es > self.cap {
            return Err(broken(format!("buffers of {} bytes too small", self.cap)));
        }
        let root = c.root(n);
        let mut send = vec![0u8; sn * es];
        fill(c.dt, c.red, r, 0, &mut send);
        let poison = vec![0xA5u8; rn * es];
        self.upload(self.send, &send).map_err(broken)?;
        self.upload(self.recv, &poison).map_err(broken)?;
        let args = CollArgs {
            kind: c.coll,
            sendbuf: self.send,
            recvbuf: self.recv,
            count: c.count,
            dtype: c.dt as i32,
            op: c.op,
            root: if matches!(c.coll, CollKind::Broadcast | CollKind::Reduce) {
                root as i32
            } else {
                -1
            },
            stream: self.stream,
        };
        let before = self.comm.ops_started();
        ccl_core::enqueue(&self.comm, args).map_err(|e| broken(format!("enqueue: {e}")))?;
        self.wait("collective").map_err(broken)?;
        drop(send);
        let mut out = poison;
        self.download(self.recv, &mut out).map_err(broken)?;
        check_output(c.coll, c.dt, c.red, n, r, root, c.count, &out).map_err(CaseErr::Wrong)?;
        self.check_probe(before, &[args]).map_err(CaseErr::Wrong)
    }

    fn check_probe(&self, before: u64, args: &[CollArgs]) -> Result<(), String> {
        if !self.comm.probe_enabled() {
            return Ok(());
        }
        let after = self.comm.ops_started();
        if after != before + 1 {
            return Err(format!("op counter {before} -> {after}"));
        }
        let want = expected_counts(&self.comm, args).map_err(|e| e.to_string())?;
        check_probe(&self.comm, before, &want).map_err(|e| format!("probe: {e}"))
    }

    /// Send/Recv ring: every rank sends `count` elements to the next rank and receives
    /// from the previous one, in one group.
    fn sendrecv_ring(&mut self, c: &DevCase) -> Result<(), CaseErr> {
        let (n, r) = (self.n(), self.r());
        let es = c.dt.size();
        if c.count * es > self.cap {
            return Err(broken(format!("buffers of {} bytes too small", self.cap)));
        }
        let mut send = vec![0u8; c.count * es];
        fill(c.dt, c.red, r, 0, &mut send);
        let poison = vec![0xA5u8; c.count * es];
        self.upload(self.send, &send).map_err(broken)?;
        self.upload(self.recv, &poison).map_err(broken)?;
        let mk = |kind, buf: usize, peer: usize| CollArgs {
            kind,
            sendbuf: buf,
            recvbuf: buf,
            count: c.count,
            dtype: c.dt as i32,
            op: 0,
            root: peer as i32,
            stream: self.stream,
        };
        let recv_a = mk(CollKind::Recv, self.recv, (r + n - 1) % n);
        let send_a = mk(CollKind::Send, self.send, (r + 1) % n);
        let before = self.comm.ops_started();
        group_start().map_err(broken)?;
        let e1 = ccl_core::enqueue(&self.comm, recv_a);
        let e2 = ccl_core::enqueue(&self.comm, send_a);
        let e3 = group_end();
        e1.and(e2)
            .and(e3)
            .map_err(|e| broken(format!("send/recv enqueue: {e}")))?;
        self.wait("send/recv").map_err(broken)?;
        drop(send);
        let mut out = poison;
        self.download(self.recv, &mut out).map_err(broken)?;
        check_output(CollKind::Recv, c.dt, c.red, n, r, 0, c.count, &out)
            .map_err(CaseErr::Wrong)?;
        self.check_probe(before, &[recv_a, send_a])
            .map_err(CaseErr::Wrong)
    }

    /// Runs `iters` AllReduces of `count` float32 back to back (after one warm-up) and
    /// returns the time of the timed ones (enqueue of the first to the drained stream).
    /// `sync` (a barrier across the ranks) is called exactly once, right before the timed
    /// loop, also when the warm-up failed (so no rank is left waiting in it).
    pub fn time_allreduce(
        &mut self,
        count: usize,
        iters: usize,
        sync: &dyn Fn(),
    ) -> Result<Duration, String> {
        let args = CollArgs {
            kind: CollKind::AllReduce,
            sendbuf: self.send,
            recvbuf: self.recv,
            count,
            dtype: DataType::Float32 as i32,
            op: crate::common::SUM,
            root: -1,
            stream: self.stream,
        };
        let warm = if count * 4 > self.cap {
            Err(format!("buffers of {} bytes too small", self.cap))
        } else {
            ccl_core::enqueue(&self.comm, args)
                .map_err(|e| format!("warm-up: {e}"))
                .and_then(|()| self.wait("warm-up"))
        };
        sync();
        warm?;
        let t0 = Instant::now();
        for _ in 0..iters {
            ccl_core::enqueue(&self.comm, args).map_err(|e| format!("enqueue: {e}"))?;
        }
        self.wait("timed allreduces")?;
        Ok(t0.elapsed())
    }
}

/// Runs `cases` in order on `rank`; once a case broke the communicator (on this rank, or
/// on any rank sharing `broken`) the rest are reported as not run.
pub fn run_cases(
    rank: &mut DevRank,
    cases: &[DevCase],
    broken_flag: &AtomicBool,
) -> Vec<Result<(), CaseErr>> {
    // CCLD_MATRIX_TRACE (any value): each rank logs every case's start and end on stderr
    // as it happens (to see where a run hangs on a device).
    let trace = std::env::var_os("CCLD_MATRIX_TRACE").is_some();
    cases
        .iter()
        .map(|c| {
            if broken_flag.load(Ordering::Acquire) {
                return Err(CaseErr::Broken(
                    "not run: an earlier case broke the communicator".into(),
                ));
            }
            if trace {
                eprintln!("trace rank {} start {}", rank.r(), c.name());
            }
            let r = rank.run(c);
            if trace {
                match &r {
                    Ok(()) => eprintln!("trace rank {} end {} ok", rank.r(), c.name()),
                    Err(e) => eprintln!("trace rank {} end {} {e:?}", rank.r(), c.name()),
                }
            }
            if matches!(r, Err(CaseErr::Broken(_))) {
                broken_flag.store(true, Ordering::Release);
            }
            r
        })
        .collect()
}

/// Results of [`run_threads`]: per case, the first failing rank's error (or Ok); per
/// bandwidth size, the slowest rank's time.
#[derive(Debug)]
pub struct ThreadsReport {
    pub cases: Vec<Result<(), String>>,
    pub bw: Vec<(usize, Result<Duration, String>)>,
}

/// `n` ranks as threads of this process, each with its own communicator
/// (`Comm::init_rank` on a shared unique id), stream and device buffers on `device`:
/// runs `cases`, then times `bw_iters` AllReduces per count in `bw_counts`.
pub fn run_threads(
    api: Arc<dyn DeviceApi>,
    device: i32,
    n: usize,
    cases: &[DevCase],
    bw_counts: &[usize],
    bw_iters: usize,
    limit: Duration,
) -> Result<ThreadsReport, String> {
    let id = ccl_core::bootstrap::get_unique_id().map_err(|e| e.to_string())?;
    let cap = cases
        .iter()
        .map(|c| c.max_bytes(n))
        .chain(bw_counts.iter().map(|c| c * 4))
        .max()
        .unwrap_or(0);
    let barrier = Arc::new(Barrier::new(n));
    let broken_flag = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (api, barrier, broken_flag) = (
                Arc::clone(&api),
                Arc::clone(&barrier),
                Arc::clone(&broken_flag),
            );
            let cases = cases.to_vec();
            let bw_counts = bw_counts.to_vec();
            std::thread::Builder::new()
                .name(format!("matrix-r{r}"))
                .spawn(move || {
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
                        })
                        .and_then(|c| {
                            DevRank::new(Arc::clone(&api), Arc::clone(&c), cap, limit)
                                .map(|d| (c, d))
                                .map_err(|e| format!("buffers: {e}"))
                        });
                    let (comm, mut rank, init_err) = match init {
                        Ok((c, d)) => (Some(c), Some(d), String::new()),
                        Err(e) => {
                            broken_flag.store(true, Ordering::Release);
                            (None, None, format!("rank {r} init: {e}"))
                        }
                    };
                    let results = match &mut rank {
                        Some(d) => run_cases(d, &cases, &broken_flag),
                        None => cases
                            .iter()
                            .map(|_| Err(CaseErr::Broken(init_err.clone())))
                            .collect(),
                    };
                    barrier.wait();
                    let ok = !broken_flag.load(Ordering::Acquire);
                    let mut bw = Vec::new();
                    for &count in &bw_counts {
                        match (&mut rank, ok) {
                            (Some(d), true) => bw.push(d.time_allreduce(count, bw_iters, &|| {
                                barrier.wait();
                            })),
                            _ => {
                                barrier.wait();
                                bw.push(Err("not run: a case broke the communicators".into()))
                            }
                        }
                    }
                    barrier.wait();
                    drop(rank);
                    if let Some(c) = comm {
                        let _ = c.destroy();
                    }
                    (results, bw)
                })
                .map_err(|e| format!("spawning rank {r}: {e}"))
        })
        .collect();
    let mut cases_out: Vec<Result<(), String>> = vec![Ok(()); cases.len()];
    let mut bw_out: Vec<(usize, Result<Duration, String>)> =
        bw_counts.iter().map(|c| (*c, Ok(Duration::ZERO))).collect();
    let mut first_err = None;
    for (r, h) in handles.into_iter().enumerate() {
        let (res, bw) = match h.and_then(|h| h.join().map_err(|_| format!("rank {r} panicked"))) {
            Ok(v) => v,
            Err(e) => {
                first_err.get_or_insert(e);
                continue;
            }
        };
        for (o, x) in cases_out.iter_mut().zip(res) {
            if let (Ok(()), Err(e)) = (&o, x) {
                *o = Err(format!("rank {r}: {e}"));
            }
        }
        for ((_, o), x) in bw_out.iter_mut().zip(bw) {
            match (&o, x) {
                (Ok(t), Ok(u)) => *o = Ok((*t).max(u)),
                (Ok(_), Err(e)) => *o = Err(format!("rank {r}: {e}")),
                _ => {}
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(ThreadsReport {
            cases: cases_out,
            bw: bw_out,
        }),
    }
}

impl Drop for DevRank {
    fn drop(&mut self) {
        // Bounded: a stuck stream was aborted by `wait`.
        let _ = self.wait("drop");
        let _ = self.api.free(self.send);
        let _ = self.api.free(self.recv);
        let _ = self.api.stream_destroy(self.stream);
    }
}

/// The runtime matrix's cases for `counts`: Float32 and Int32; AllReduce, Reduce and
/// ReduceScatter with Sum/Max/Avg; AllGather, Broadcast, AlltoAll and the Send/Recv ring
/// with Sum, the last two at the end of each dtype (by then every rank has connected p2p
/// with every peer).
pub fn matrix_cases(counts: &[usize]) -> Vec<DevCase> {
    let mut v = Vec::new();
    for dt in [DataType::Float32, DataType::Int32] {
        for coll in [
            CollKind::AllReduce,
            CollKind::Reduce,
            CollKind::ReduceScatter,
        ] {
            for (red, op) in [(Red::Sum, SUM), (Red::Max, MAX), (Red::Avg, AVG)] {
                for &count in counts {
                    v.push(DevCase {
                        coll,
                        dt,
                        red,
                        op,
                        count,
                    });
                }
            }
        }
        for coll in [
            CollKind::AllGather,
            CollKind::Broadcast,
            CollKind::AlltoAll,
            CollKind::Send,
        ] {
            for &count in counts {
                v.push(DevCase {
                    coll,
                    dt,
                    red: Red::Sum,
                    op: SUM,
                    count,
                });
            }
        }
    }
    v
}
