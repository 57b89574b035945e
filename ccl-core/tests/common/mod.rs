//! Shared helpers of the collective tests: an independent codec for every dtype (small
//! exact values only), deterministic inputs chosen per (dtype, op) so results are exact, a
//! reference implementation of every collective, and the probe check.
//!
//! Exactness: inputs are small integers. Sums of at most 8 ranks stay within the exactly
//! representable integers of every type (e5m2 inputs are 0/1: sums <= 8; other types
//! 0..=2: sums <= 16); Prod uses {1, 2, -1} with at most two 2s per element (|p| <= 4);
//! PreMulSum scalars are 2 (host) and 4 (device), powers of two. Max/Min use -2..=2
//! (0..=4 unsigned). Integer Avg is exact (truncating division); floating Avg is computed
//! by the library as a sum of x * (1/n rounded to the type), so it is compared within
//! n * 2^-mantissa_bits * max(1, |avg|) (exact when n is a power of two).

#![allow(dead_code)]

pub mod procs;

use std::sync::Arc;

use ccl_core::internal::group::expected_counts;
use ccl_core::{CollArgs, Comm, DataType};
use ccl_optype::CollKind;

/// Raw op values.
pub const SUM: i32 = 0;
pub const PROD: i32 = 1;
pub const MAX: i32 = 2;
pub const MIN: i32 = 3;
pub const AVG: i32 = 4;

/// The reduction a test case uses (PreMulSum with its scalar value).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Red {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMul(f64),
}

fn is_signed_int(dt: DataType) -> bool {
    matches!(dt, DataType::Int8 | DataType::Int32 | DataType::Int64)
}

fn is_unsigned(dt: DataType) -> bool {
    matches!(dt, DataType::Uint8 | DataType::Uint32 | DataType::Uint64)
}

/// (exponent bits, mantissa bits, bias) of the small float formats.
fn fmt(dt: DataType) -> Option<(u32, u32, i32)> {
    match dt {
        DataType::Float16 => Some((5, 10, 15)),
        DataType::Bfloat16 => Some((8, 7, 127)),
        DataType::Float8e4m3 => Some((4, 3, 7)),
        DataType::Float8e5m2 => Some((5, 2, 15)),
        _ => None,
    }
}

/// Mantissa bits of a float type.
pub fn mant_bits(dt: DataType) -> u32 {
    match dt {
        DataType::Float32 => 23,
        DataType::Float64 => 52,
        _ => fmt(dt).map_or(0, |f| f.1),
    }
}

fn enc_small_float(v: f64, e: u32, m: u32, bias: i32) -> u64 {
    if v == 0.0 {
        return 0;
    }
    let sign = u64::from(v < 0.0) << (e + m);
    let a = v.abs();
    let ex = a.log2().floor() as i32;
    let frac = a / 2f64.powi(ex) - 1.0;
    let mant = frac * f64::from(1u32 << m);
    assert!(mant.fract() == 0.0, "{v} not exactly representable");
    let be = ex + bias;
    assert!(
        be > 0 && be < (1 << e) - 1 || (e == 4 && be == 15),
        "{v} out of range"
    );
    sign | ((be as u64) << m) | mant as u64
}

fn dec_small_float(bits: u64, e: u32, m: u32, bias: i32) -> f64 {
    let sign = if bits >> (e + m) & 1 == 1 { -1.0 } else { 1.0 };
    let be = ((bits >> m) & ((1 << e) - 1)) as i32;
    let mant = (bits & ((1 << m) - 1)) as f64;
    if be == 0 {
        return sign * mant / f64::from(1u32 << m) * 2f64.powi(1 - bias);
    }
    if e == 4 && m == 3 && be == 15 && mant == 7.0 {
        return f64::NAN;
    }
    if e != 4 && be == (1 << e) - 1 {
        return if mant == 0.0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    sign * (1.0 + mant / f64::from(1u32 << m)) * 2f64.powi(be - bias)
}

/// Writes `v` (exactly representable) as one element of `dt`.
pub fn enc(dt: DataType, v: f64, out: &mut [u8]) {
    let n = dt.size();
    let bits: u64 = match dt {
        DataType::Float32 => u64::from((v as f32).to_bits()),
        DataType::Float64 => v.to_bits(),
        d if fmt(d).is_some() => {
            let (e, m, b) = fmt(d).unwrap();
            enc_small_float(v, e, m, b)
        }
        _ => (v as i64) as u64,
    };
    out[..n].copy_from_slice(&bits.to_le_bytes()[..n]);
}

/// Reads one element of `dt`.
pub fn dec(dt: DataType, b: &[u8]) -> f64 {
    let n = dt.size();
    let mut w = [0u8; 8];
    w[..n].copy_from_slice(&b[..n]);
    let raw = u64::from_le_bytes(w);
    match dt {
        DataType::Float32 => f64::from(f32::from_bits(raw as u32)),
        DataType::Float64 => f64::from_bits(raw),
        d if fmt(d).is_some() => {
            let (e, m, bias) = fmt(d).unwrap();
            dec_small_float(raw, e, m, bias)
        }
        d if is_signed_int(d) => {
            let shift = 64 - 8 * n as u32;
            (((raw << shift) as i64) >> shift) as f64
        }
        _ => raw as f64,
    }
}

/// Input element `i` of rank `r` for (dtype, red).
pub fn input(dt: DataType, red: Red, r: usize, i: usize) -> f64 {
    let unsigned = is_unsigned(dt);
    match red {
        Red::Sum | Red::Avg | Red::PreMul(_) => {
            let range = if dt == DataType::Float8e5m2 { 2 } else { 3 };
            ((r * 7 + i * 3) % range) as f64
        }
        Red::Prod => {
            if (i + r).is_multiple_of(4) {
                2.0
            } else if !unsigned && (i + 2 * r).is_multiple_of(3) {
                -1.0
            } else {
                1.0
            }
        }
        Red::Max | Red::Min => {
            let v = ((r * 5 + i * 3) % 5) as f64;
            if unsigned {
                v
            } else {
                v - 2.0
            }
        }
    }
}

/// Reference reduction of element `i` (input index) over `n` ranks, plus the tolerance.
pub fn reduce_ref(dt: DataType, red: Red, n: usize, i: usize) -> (f64, f64) {
    let vals = (0..n).map(|r| input(dt, red, r, i));
    match red {
        Red::Sum => (vals.sum(), 0.0),
        Red::Prod => (vals.product(), 0.0),
        Red::Max => (vals.fold(f64::MIN, f64::max), 0.0),
        Red::Min => (vals.fold(f64::MAX, f64::min), 0.0),
        Red::PreMul(s) => (vals.map(|v| v * s).sum(), 0.0),
        Red::Avg => {
            let s: f64 = vals.sum();
            if dt.is_float() {
                let avg = s / n as f64;
                let eps = 2f64.powi(-(mant_bits(dt) as i32));
                (avg, n as f64 * eps * avg.abs().max(1.0))
            } else {
                ((s / n as f64).trunc(), 0.0)
            }
        }
    }
}

/// Every input sequence is periodic in the element index with a period dividing this.
pub const PERIOD: usize = 60;

/// Fills `buf` (elements of `dt`) with rank `r`'s inputs starting at input index `base`.
pub fn fill(dt: DataType, red: Red, r: usize, base: usize, buf: &mut [u8]) {
    let es = dt.size();
    let mut table = vec![0u8; PERIOD * es];
    for (i, c) in table.chunks_exact_mut(es).enumerate() {
        enc(dt, input(dt, red, r, i), c);
    }
    let len = buf.len() / es * es;
    write_periodic(&mut buf[..len], &table, base, es);
}

/// Writes the periodic sequence `table` (`PERIOD` elements of `es` bytes) read from
/// element `start` on over the whole of `buf`: one period, then doubling copies (a
/// multi-MiB buffer takes a few large copies instead of one small copy per element).
fn write_periodic(buf: &mut [u8], table: &[u8], start: usize, es: usize) {
    let head = buf.len().min(PERIOD * es);
    for (j, c) in buf[..head].chunks_exact_mut(es).enumerate() {
        let i = (start + j) % PERIOD;
        c.copy_from_slice(&table[i * es..(i + 1) * es]);
    }
    let mut done = head;
    while done > 0 && done < buf.len() {
        let n = done.min(buf.len() - done);
        buf.copy_within(..n, done);
        done += n;
    }
}

/// Index of the first element of `out` (elements of `es` bytes) that differs from the
/// periodic sequence `table` (`PERIOD` elements) read from element `start` on; `None` when
/// all agree. Compares whole blocks, not one element at a time.
pub fn first_mismatch(out: &[u8], table: &[u8], start: usize, es: usize) -> Option<usize> {
    const BLOCK_PERIODS: usize = 64;
    let mut want = vec![0u8; (BLOCK_PERIODS * PERIOD * es).min(out.len())];
    write_periodic(&mut want, table, start, es);
    for (b, chunk) in out.chunks(want.len().max(1)).enumerate() {
        if chunk != &want[..chunk.len()] {
            let k = chunk
                .chunks_exact(es)
                .zip(want.chunks_exact(es))
                .position(|(g, w)| g != w)
                .expect("a differing block has a differing element");
            return Some(b * want.len() / es + k);
        }
    }
    None
}

/// A collective test case.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub coll: CollKind,
    pub dt: DataType,
    pub red: Red,
    /// Raw op value passed to the library.
    pub op: i32,
    pub count: usize,
    pub root: usize,
    pub in_place: bool,
}

/// (send elements, recv elements) of a case for `n` ranks.
pub fn sizes(coll: CollKind, count: usize, n: usize) -> (usize, usize) {
    match coll {
        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => (count, count),
        CollKind::AllGather => (count, count * n),
        CollKind::ReduceScatter => (count * n, count),
        CollKind::AlltoAll => (count * n, count * n),
        CollKind::Gather => (count, count * n),
        CollKind::Scatter => (count * n, count),
        CollKind::Send | CollKind::Recv => (count, count),
    }
}

/// Per-rank buffers, reused across cases (grown as needed).
#[derive(Default)]
pub struct Bufs {
    pub send: Vec<u8>,
    pub recv: Vec<u8>,
}

/// Runs one case on rank `comm.rank()` and checks its output and probe counters.
/// Returns an error string naming the case and the first mismatch.
pub fn run_case(comm: &Arc<Comm>, c: &Case, b: &mut Bufs) -> Result<(), String> {
    let n = comm.nranks() as usize;
    let r = comm.rank() as usize;
    let es = c.dt.size();
    let (sn, rn) = sizes(c.coll, c.count, n);
    let ctx = || format!("{c:?} rank {r}/{n}");
    // Layout: in-place cases use one buffer; the send part sits where NCCL puts it.
    let big = sn.max(rn) * es;
    b.send.resize(big.max(1), 0);
    b.recv.resize(big.max(1), 0);
    let in_place_off = match c.coll {
        CollKind::AllGather | CollKind::Gather => r * c.count * es,
        _ => 0,
    };
    let (sendbuf, recvbuf);
    // Poison the output, write the input.
    b.recv.fill(0xA5);
    let is_root = r == c.root;
    let fills_send = !matches!(c.coll, CollKind::Broadcast | CollKind::Scatter) || is_root;
    if c.in_place {
        let (recv_off, send_off) = match c.coll {
            CollKind::ReduceScatter | CollKind::Scatter => (r * c.count * es, 0),
            _ => (0, in_place_off),
        };
        if fills_send {
            fill(c.dt, c.red, r, 0, &mut b.recv[send_off..send_off + sn * es]);
        }
        let base = b.recv.as_mut_ptr() as usize;
        sendbuf = base + send_off;
        recvbuf = base + recv_off;
    } else {
        if fills_send {
            fill(c.dt, c.red, r, 0, &mut b.send[..sn * es]);
        }
        sendbuf = b.send.as_ptr() as usize;
        recvbuf = b.recv.as_mut_ptr() as usize;
    }
    let args = CollArgs {
        kind: c.coll,
        sendbuf,
        recvbuf,
        count: c.count,
        dtype: c.dt as i32,
        op: c.op,
        root: c.root as i32,
        stream: 0,
    };
    let before = comm.ops_started();
    ccl_core::enqueue(comm, args).map_err(|e| format!("{}: {e}", ctx()))?;
    // Check the output.
    let out_base = recvbuf - b.recv.as_ptr() as usize;
    let out = &b.recv[out_base..];
    let check = |k: usize, want: f64, tol: f64| -> Result<(), String> {
        let got = dec(c.dt, &out[k * es..]);
        if (got - want).abs() > tol || got.is_nan() {
            return Err(format!(
                "{}: element {k}: got {got}, want {want} (tol {tol})",
                ctx()
            ));
        }
        Ok(())
    };
    let writes_out = match c.coll {
        CollKind::Reduce | CollKind::Gather => is_root,
        _ => true,
    };
    let table: Vec<(f64, f64)> = (0..PERIOD).map(|i| reduce_ref(c.dt, c.red, n, i)).collect();
    let exact = table.iter().all(|t| t.1 == 0.0);
    // Encoded expectations: the reduced values, and every rank's inputs, per period.
    let enc_table = |vals: &mut dyn Iterator<Item = f64>| -> Vec<u8> {
        let mut t = vec![0u8; PERIOD * es];
        for (i, v) in vals.enumerate() {
            enc(c.dt, v, &mut t[i * es..]);
        }
        t
    };
    let reduced = if exact
        && matches!(
            c.coll,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        ) {
        enc_table(&mut table.iter().map(|t| t.0))
    } else {
        Vec::new()
    };
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|q| enc_table(&mut (0..PERIOD).map(|i| input(c.dt, c.red, q, i))))
        .collect();
    if writes_out {
        let reduces = matches!(
            c.coll,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        );
        // Input index of output element 0 (reductions).
        let first_input = if c.coll == CollKind::ReduceScatter {
            r * c.count
        } else {
            0
        };
        if reduces && !exact {
            for k in 0..rn {
                let (want, tol) = table[(first_input + k) % PERIOD];
                check(k, want, tol)?;
            }
        } else {
            // The output as segments of `len` elements, each a periodic sequence read from
            // `table` starting at input index `start`: (first output element, len, table,
            // start).
            let segments: Vec<(usize, usize, &[u8], usize)> = match c.coll {
                CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter => {
                    vec![(0, rn, &reduced, first_input)]
                }
                CollKind::Broadcast => vec![(0, rn, &inputs[c.root], 0)],
                CollKind::AllGather | CollKind::Gather => (0..n)
                    .map(|q| (q * c.count, c.count, inputs[q].as_slice(), 0))
                    .collect(),
                CollKind::AlltoAll => (0..n)
                    .map(|q| (q * c.count, c.count, inputs[q].as_slice(), r * c.count))
                    .collect(),
                CollKind::Scatter => vec![(0, rn, &inputs[c.root], r * c.count)],
                CollKind::Send | CollKind::Recv => unreachable!(),
            };
            for (k0, len, t, start) in segments {
                let Some(j) = first_mismatch(&out[k0 * es..(k0 + len) * es], t, start, es) else {
                    continue;
                };
                let (k, i) = (k0 + j, (start + j) % PERIOD);
                let want = dec(c.dt, &t[i * es..]);
                check(k, want, 0.0)?;
                return Err(format!(
                    "{}: element {k}: bytes {:02x?} != {:02x?}",
                    ctx(),
                    &out[k * es..(k + 1) * es],
                    &t[i * es..(i + 1) * es]
                ));
            }
        }
    }
    // Probe: this rank's counters for this operation equal the schedule's.
    if comm.probe_enabled() {
        let after = comm.ops_started();
        if after != before + 1 {
            return Err(format!("{}: op counter {before} -> {after}", ctx()));
        }
        let want = expected_counts(comm, &[args]).map_err(|e| format!("{}: {e}", ctx()))?;
        check_probe(comm, before, &want).map_err(|e| format!("{}: {e}", ctx()))?;
    }
    Ok(())
}

/// Checks the frame block and op log of operation `counter` against `want`.
pub fn check_probe(
    comm: &Comm,
    counter: u64,
    want: &[ccl_core::internal::schedule::ExpectedCounts],
) -> Result<(), String> {
    // First the operation's completion (it runs after the operation's start, which wrote
    // the frame's header and block), then the frame.
    let snap = settled_op(comm, counter).ok_or_else(|| format!("op log has no op {counter}"))?;
    let f = comm.probe_frame();
    let block = (counter % probe::FRAME_BLOCKS as u64) as usize;
    let tr = f.trace(block);
    if tr.comm_id != comm.comm_id() || u64::from(tr.op_counter) != counter & 0xffff_ffff {
        return Err(format!("trace id {tr:?} for op {counter}"));
    }
    let h = f.header();
    if h.op_counter != counter || h.n_channels as usize != want.len() {
        return Err(format!(
            "frame header {h:?}, want counter {counter} nch {}",
            want.len()
        ));
    }
    for ch in 0..f.channel_capacity() {
        let got = f.counts(block, ch);
        let (s, r) = want.get(ch).map_or((0, 0), |w| (w.send, w.recv));
        if got.send_count != s || got.recv_count != r {
            return Err(format!(
                "channel {ch}: probe send/recv {}/{}, schedule {s}/{r}",
                got.send_count, got.recv_count
            ));
        }
        if f.expected(block, ch) != (s, r) {
            return Err(format!(
                "channel {ch}: frame's expected send/recv {:?}, schedule {s}/{r}",
                f.expected(block, ch)
            ));
        }
    }
    if snap.state != probe::OpState::Completed || snap.end_ns < snap.start_ns {
        return Err(format!("op log entry {snap:?}"));
    }
    if snap.info.n_channels as usize != want.len() {
        return Err(format!(
            "op log nChannels {} != {}",
            snap.info.n_channels,
            want.len()
        ));
    }
    Ok(())
}

/// The op log's entry of operation `counter` once it is no longer in flight (at most 5 s):
/// on the device backend an operation's completion runs shortly after its stream went
/// idle (an event polled by the communicator's completion thread, `device::completion`).
pub fn settled_op(comm: &Comm, counter: u64) -> Option<probe::OpSnapshot> {
    let t0 = std::time::Instant::now();
    loop {
        let snap = comm.op_log().get(counter)?;
        if snap.state != probe::OpState::InFlight
            || t0.elapsed() > std::time::Duration::from_secs(5)
        {
            return Some(snap);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The reductions tested for `dt`, with raw op values; PreMulSum ops are created on
/// `comm`: host-immediate scalar 2, and a device-resident scalar in `dev_scalar` that holds
/// 1 when the op is created and 4 afterwards (so only an execution-time read gives the
/// expected x4). `dev_scalar` must stay in place while the ops are used.
pub fn reductions(comm: &Comm, dt: DataType, dev_scalar: &mut [u8; 8]) -> Vec<(Red, i32)> {
    let mut host = vec![0u8; dt.size()];
    enc(dt, 2.0, &mut host);
    let h = comm
        .create_premulsum(ccl_core::ScalarArg::HostImmediate(host), dt)
        .expect("create host premulsum");
    enc(dt, 1.0, &mut dev_scalar[..]);
    let d = comm
        .create_premulsum(
            ccl_core::ScalarArg::Device(dev_scalar.as_ptr() as usize),
            dt,
        )
        .expect("create device premulsum");
    enc(dt, 4.0, &mut dev_scalar[..]);
    vec![
        (Red::Sum, SUM),
        (Red::Prod, PROD),
        (Red::Max, MAX),
        (Red::Min, MIN),
        (Red::Avg, AVG),
        (Red::PreMul(2.0), h),
        (Red::PreMul(4.0), d),
    ]
}

/// A float sum AllReduce of `send` into `recv` on the default stream.
pub fn all_reduce_f32(send: &[f32], recv: &mut [f32]) -> CollArgs {
    CollArgs {
        kind: CollKind::AllReduce,
        sendbuf: send.as_ptr() as usize,
        recvbuf: recv.as_mut_ptr() as usize,
        count: send.len().min(recv.len()),
        dtype: DataType::Float32 as i32,
        op: 0,
        root: -1,
        stream: 0,
    }
}

/// Hex of a unique id (for child processes).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Inverse of [`hex`].
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}
