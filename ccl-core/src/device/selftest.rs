//! Kernel-level self-test for a machine with a GPU (run by scripts/gpu-suite.sh through the
//! `device_selftest` example): `n` ranks on ONE device, each with its own stream, execute
//! their lowered plans concurrently over FIFOs in device memory; results are compared with
//! a host reference and the probe counters (mapped host memory, written by the kernels)
//! with the schedule's expectation. No communicator is involved: this checks the kernels,
//! the ABI and the lowering, not the (not yet written) device runtime.
//!
//! NOT VERIFIED: written without access to a GPU; on machines without one every entry point
//! returns an error saying so.

use std::collections::HashMap;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use ccl_optype::CollKind;
use kernels::ffi as k;

use super::lower::{lower, red_params, ConnDir};
use crate::error::{CclError, Result};
use crate::proto::{ll_chunk_bytes, Proto};
use crate::reduce::Reducer;
use crate::schedule::{self, CollDesc, LinkKind, BUF_RECV, BUF_SEND};
use crate::types::{DataType, RedOpKind};

/// FIFO slots per connection (the host backend uses 8 as well).
const NSLOTS: u32 = 8;

fn dev(code: i32, what: &str) -> Result<()> {
    kernels::check_code(code).map_err(|e| CclError::System(format!("{what}: {e}")))
}

/// Device allocations freed on drop.
#[derive(Default)]
struct Allocs {
    dev: Vec<*mut c_void>,
    host: Vec<*mut c_void>,
    streams: Vec<k::ccl_stream_t>,
}

impl Allocs {
    fn malloc(&mut self, bytes: usize) -> Result<*mut c_void> {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the returned allocation is owned by `self`.
        let code = unsafe { k::ccl_dev_malloc(bytes.max(1), &mut p) };
        dev(code, "cudaMalloc")?;
        self.dev.push(p);
        // SAFETY: p is a fresh allocation of at least `bytes` bytes.
        let code = unsafe { k::ccl_dev_memset(p, 0, bytes.max(1)) };
        dev(code, "cudaMemset")?;
        Ok(p)
    }

    fn upload<T: Copy>(&mut self, v: &[T]) -> Result<*mut c_void> {
        let bytes = std::mem::size_of_val(v);
        let p = self.malloc(bytes)?;
        if bytes > 0 {
            // SAFETY: p holds `bytes` bytes; v is a live slice of `bytes` bytes.
            let code = unsafe { k::ccl_dev_memcpy(p, v.as_ptr().cast(), bytes) };
            dev(code, "cudaMemcpy H2D")?;
        }
        Ok(p)
    }

    fn mapped(&mut self, bytes: usize) -> Result<(*mut c_void, *mut c_void)> {
        let (mut h, mut d) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers; the allocation is owned by `self`.
        let code = unsafe { k::ccl_dev_host_alloc_mapped(bytes, &mut h, &mut d) };
        dev(code, "cudaHostAlloc")?;
        self.host.push(h);
        Ok((h, d))
    }
}

impl Drop for Allocs {
    fn drop(&mut self) {
        for s in self.streams.drain(..) {
            // SAFETY: s was created by ccl_dev_stream_create and is destroyed once.
            unsafe { k::ccl_dev_stream_destroy(s) };
        }
        for p in self.dev.drain(..) {
            // SAFETY: p came from ccl_dev_malloc and is freed once (after the streams).
            unsafe { k::ccl_dev_free(p) };
        }
        for p in self.host.drain(..) {
            // SAFETY: p came from ccl_dev_host_alloc_mapped and is freed once.
            unsafe { k::ccl_dev_host_free(p) };
        }
    }
}

/// Per channel: ((SendCount, RecvCount) read back, (expected SendCount, RecvCount)).
pub type ChannelCounters = Vec<((u64, u64), (u64, u64))>;

/// Outcome of one self-test case.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// Wall time from the first launch to the last stream's completion.
    pub elapsed: Duration,
    /// Per rank, per channel: (SendCount, RecvCount) read from the probe frame after the
    /// kernels finished, and the expected values.
    pub counters: Vec<ChannelCounters>,
}

fn input(dtype: DataType, r: usize, i: usize) -> f64 {
    let v = ((r * 131 + i * 7) % 17) as f64 - 8.0;
    if dtype == DataType::Float32 {
        v * 0.5
    } else {
        v
    }
}

fn to_bytes(dtype: DataType, v: f64) -> Vec<u8> {
    match dtype {
        DataType::Int32 => (v as i32).to_le_bytes().to_vec(),
        _ => (v as f32).to_le_bytes().to_vec(),
    }
}

/// Runs `coll` (Sum where it reduces) over `count` elements of `dtype` (Int32 or Float32)
/// on `n` ranks of the current device with `nch` channels and `slot_bytes` FIFO slots.
/// Fails with the first mismatching element, a counter mismatch, or a timeout.
pub fn run_case(
    coll: CollKind,
    dtype: DataType,
    count: usize,
    n: usize,
    nch: usize,
    slot_bytes: usize,
    timeout: Duration,
) -> Result<CaseResult> {
    run_case_proto(
        coll,
        dtype,
        count,
        n,
        nch,
        slot_bytes,
        Proto::Simple,
        timeout,
    )
}

/// [`run_case`] with protocol `proto`. LL: the plans are chunked to the LL payload of the
/// slots, and every slot starts filled with 32-bit words equal to 1 (what an earlier
/// Simple message could leave: the flags of message 1) with `ll_sync` = 1 on every
/// connection, so the kernels must scrub before the first message or take stale data.
#[allow(clippy::too_many_arguments)]
pub fn run_case_proto(
    coll: CollKind,
    dtype: DataType,
    count: usize,
    n: usize,
    nch: usize,
    slot_bytes: usize,
    proto: Proto,
    timeout: Duration,
) -> Result<CaseResult> {
    let ll = proto == Proto::Ll;
    let plan_slot = if ll {
        ll_chunk_bytes(slot_bytes)
    } else {
        slot_bytes
    };
    if !matches!(dtype, DataType::Int32 | DataType::Float32) {
        return Err(CclError::arg("self-test dtypes: Int32, Float32"));
    }
    let es = dtype.size();
    let root = count % n;
    let reducing = matches!(
        coll,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    );
    let reducer = Reducer::new(dtype, RedOpKind::Sum, None, n)?;
    let rp = red_params(&reducer, n)?;
    let per_rank_in = matches!(
        coll,
        CollKind::ReduceScatter | CollKind::AlltoAll | CollKind::Scatter
    );
    let per_rank_out = matches!(
        coll,
        CollKind::AllGather | CollKind::AlltoAll | CollKind::Gather
    );
    let in_len = if per_rank_in { count * n } else { count };
    let out_len = if per_rank_out { count * n } else { count };
    let mut a = Allocs::default();
    let mut lowered = Vec::new();
    let mut expected = Vec::new();
    for rank in 0..n {
        let plan = schedule::collective(&CollDesc {
            coll,
            count,
            elem_size: es,
            nranks: n,
            rank,
            root,
            n_channels: nch,
            slot_bytes: plan_slot,
        })?;
        expected.push(plan.expected_counts());
        lowered.push(lower(&plan, 2)?);
    }
    // One FIFO per (sender, receiver, link, channel): slots + tail, head and the LL scrub
    // word (head[1]) in device memory.
    let stale: Vec<u32> = if ll {
        vec![1; slot_bytes * NSLOTS as usize / 4]
    } else {
        Vec::new()
    };
    let mut fifos: HashMap<(usize, usize, LinkKind, usize), k::ccl_dev_conn_t> = HashMap::new();
    for (r, l) in lowered.iter().enumerate() {
        for key in &l.conns {
            let id = match key.dir {
                ConnDir::Out => (r, key.peer, key.link, key.channel),
                ConnDir::In => (key.peer, r, key.link, key.channel),
            };
            if let std::collections::hash_map::Entry::Vacant(e) = fifos.entry(id) {
                let slots = if ll {
                    a.upload(&stale)?
                } else {
                    a.malloc(slot_bytes * NSLOTS as usize)?
                };
                let ctr = a.malloc(24)?.cast::<u64>();
                e.insert(k::ccl_dev_conn_t {
                    slots,
                    tail: ctr,
                    // SAFETY: ctr points to 24 bytes: tail, head, scrub word.
                    head: unsafe { ctr.add(1) },
                    slot_bytes: slot_bytes as u64,
                    nslots: NSLOTS,
                    ll_sync: u32::from(ll),
                    // The self-test runs without the descriptor check.
                    descs: std::ptr::null_mut(),
                });
            }
        }
    }
    let abort = a.mapped(64)?;
    let mut sendbufs = Vec::new();
    let mut recvbufs = Vec::new();
    let mut frames = Vec::new();
    let mut plans = Vec::new();
    for (r, l) in lowered.iter().enumerate() {
        let input_bytes: Vec<u8> = (0..in_len)
            .flat_map(|i| to_bytes(dtype, input(dtype, r, i)))
            .collect();
        let sb = a.upload(&input_bytes)?;
        let rb = a.malloc(out_len * es)?;
        sendbufs.push(sb);
        recvbufs.push(rb);
        let conns: Vec<k::ccl_dev_conn_t> = l
            .conns
            .iter()
            .map(|key| {
                let id = match key.dir {
                    ConnDir::Out => (r, key.peer, key.link, key.channel),
                    ConnDir::In => (key.peer, r, key.link, key.channel),
                };
                fifos[&id]
            })
            .collect();
        let cap = l.n_channels;
        let frame = a.mapped(k::frame_total_bytes(u64::from(cap)) as usize)?;
        frames.push((frame.0.cast::<u64>(), cap));
        let mut bufs = [std::ptr::null_mut(); k::CCL_MAX_BUFS];
        bufs[BUF_SEND] = sb;
        bufs[BUF_RECV] = rb;
        plans.push(k::ccl_dev_plan_t {
            n_channels: l.n_channels,
            n_lanes: l.lanes.len() as u32,
            n_locals: l.locals.len() as u32,
            n_steps: l.steps.len() as u32,
            n_conns: conns.len() as u32,
            unit: l.unit,
            dtype: rp.dtype,
            op: rp.op,
            reduce: u32::from(reducing),
            avg_divisor: rp.avg_divisor,
            scalar_bits: rp.scalar_bits,
            steps: a.upload(&l.steps)?.cast(),
            lanes: a.upload(&l.lanes)?.cast(),
            locals: a.upload(&l.locals)?.cast(),
            conns: a.upload(&conns)?.cast(),
            bufs,
            frame: frame.1.cast(),
            frame_capacity: cap,
            proto: proto.abi(),
            abort_flag: abort.1.cast(),
            rank: r as u32,
            ..k::ccl_dev_plan_t::idle()
        });
    }
    for _ in 0..n {
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the stream is owned by `a`.
        let code = unsafe { k::ccl_dev_stream_create(&mut s) };
        dev(code, "cudaStreamCreate")?;
        a.streams.push(s);
    }
    let t0 = Instant::now();
    for (p, s) in plans.iter().zip(&a.streams) {
        // SAFETY: every pointer in `p` refers to live allocations owned by `a`, which
        // outlives the kernels (we wait for the streams below before dropping `a`).
        dev(unsafe { k::ccl_dev_launch_plan(p, *s) }, "launch")?;
    }
    let deadline = t0 + timeout;
    for s in &a.streams {
        loop {
            // SAFETY: s is a live stream.
            let q = unsafe { k::ccl_dev_stream_query(*s) };
            if q == k::CCL_DEV_OK {
                break;
            }
            if q != k::CCL_DEV_NOT_READY {
                dev(q, "kernel")?;
            }
            if Instant::now() > deadline {
                // SAFETY: abort.0 is mapped host memory of 64 bytes (the flag, then the start gate) owned by `a`; the kernel
                // only reads it.
                unsafe { std::ptr::write_volatile(abort.0.cast::<u32>(), 1) };
                for s in &a.streams {
                    // SAFETY: live stream; the abort flag makes the kernels return.
                    unsafe { k::ccl_dev_stream_synchronize(*s) };
                }
                return Err(CclError::Timeout(format!(
                    "{} on {n} ranks did not finish within {timeout:?}",
                    coll.name()
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    let elapsed = t0.elapsed();
    // Results.
    let val = |b: &[u8]| -> f64 {
        match dtype {
            DataType::Int32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            _ => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        }
    };
    let sum = |i: usize| -> f64 { (0..n).map(|q| input(dtype, q, i)).sum() };
    for (r, rb) in recvbufs.iter().enumerate() {
        let mut host = vec![0u8; out_len * es];
        if !host.is_empty() {
            // SAFETY: rb holds out_len * es bytes; host is a live buffer of that size.
            let code = unsafe { k::ccl_dev_memcpy(host.as_mut_ptr().cast(), *rb, host.len()) };
            dev(code, "cudaMemcpy D2H")?;
        }
        let want: Option<Vec<f64>> = match coll {
            CollKind::AllReduce => Some((0..count).map(sum).collect()),
            CollKind::Reduce => (r == root).then(|| (0..count).map(sum).collect()),
            CollKind::ReduceScatter => Some((0..count).map(|i| sum(r * count + i)).collect()),
            CollKind::Broadcast => Some((0..count).map(|i| input(dtype, root, i)).collect()),
            CollKind::AllGather => Some(
                (0..n * count)
                    .map(|x| input(dtype, x / count, x % count))
                    .collect(),
            ),
            CollKind::AlltoAll => Some(
                (0..n * count)
                    .map(|x| input(dtype, x / count, r * count + x % count))
                    .collect(),
            ),
            CollKind::Gather => (r == root).then(|| {
                (0..n * count)
                    .map(|x| input(dtype, x / count, x % count))
                    .collect()
            }),
            CollKind::Scatter => Some(
                (0..count)
                    .map(|i| input(dtype, root, r * count + i))
                    .collect(),
            ),
            other => return Err(CclError::arg(format!("self-test: {}", other.name()))),
        };
        if let Some(w) = want {
            for (i, (g, w)) in host.chunks(es).map(val).zip(w).enumerate() {
                // Inputs are small multiples of 0.5: every partial sum is exact in f32.
                if g != w {
                    return Err(CclError::Internal(format!(
                        "{} {} n {n} count {count}: rank {r} element {i} = {g}, expected {w}",
                        coll.name(),
                        dtype.name()
                    )));
                }
            }
        }
    }
    // Probe counters: written by the kernels into mapped host memory.
    let mut counters = Vec::new();
    for (r, (frame, cap)) in frames.iter().enumerate() {
        let mut per = Vec::new();
        for (ch, e) in expected[r].iter().enumerate() {
            let off = k::frame_send_offset(u64::from(*cap), 0, ch as u64) as usize / 8;
            // SAFETY: the frame is frame_total_bytes(cap) bytes of mapped host memory and
            // ch < n_channels = cap, so both words lie inside it; the kernels finished.
            let got = unsafe {
                (
                    std::ptr::read_volatile(frame.add(off)),
                    std::ptr::read_volatile(frame.add(off + 1)),
                )
            };
            let want = (e.send, e.recv);
            if got != want {
                return Err(CclError::Internal(format!(
                    "{} n {n}: rank {r} channel {ch} probe counters {got:?}, expected {want:?}",
                    coll.name()
                )));
            }
            per.push((got, want));
        }
        counters.push(per);
    }
    Ok(CaseResult { elapsed, counters })
}

/// Device-to-device copy bandwidth in GB/s (read + write bytes per second) of the current
/// device, over `bytes` and `iters` copies.
pub fn copy_bandwidth(bytes: usize, iters: i32) -> Result<f64> {
    let mut g = 0.0;
    // SAFETY: valid out-pointer.
    let code = unsafe { k::ccl_dev_copy_bandwidth(bytes, iters, &mut g) };
    dev(code, "copy bandwidth")?;
    Ok(g)
}
