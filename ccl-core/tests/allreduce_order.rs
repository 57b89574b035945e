//! Host AllReduce is bit-identical to the reduction order its algorithm documents
//! (docs/host-backend.md, "Algorithms and protocols"), on every rank:
//! - Tree (recursive doubling, `NCCL_ALGO=Tree`) with `NCCL_PROTO=LL` and `Simple`: the
//!   result is `T(0, p)`, `T(r, 2m) = T(r, m) OP T(r + m, m)`, `T(r, 1) = v_r` with
//!   `v_r = pre(x_r) OP pre(x_{r+p})` for `r < n - p` and `pre(x_r)` otherwise;
//! - Ring (`NCCL_ALGO=Ring`, one channel): element `e` of the part `k` of its slot region
//!   is `((pre(x_k) OP pre(x_{k+1})) OP ..) OP pre(x_{k-1})`.
//!
//! Every dtype and reduction (Sum, Prod, Max, Min, Avg, PreMulSum), random inputs (floats
//! with fractions, so that the order shows in the bits), counts that are not powers of two
//! (one of them several LL and Simple messages long), in and out of place, at 2, 3, 4, 5
//! and 8 ranks (threads of this process). The reference computes each element on its own,
//! in the documented order: native arithmetic for Float32/Float64 and the integer types
//! (wrapping), the library's `Reducer` on single elements for the 16- and 8-bit float
//! formats (their arithmetic is checked against independent code by the reduce tests).

use std::sync::Arc;

use ccl_core::bootstrap::get_unique_id;
use ccl_core::{enqueue, CollArgs, Comm, CommConfig, DataType, RedOpKind, Reducer, ScalarArg};
use ccl_optype::CollKind;

/// `NCCL_BUFFSIZE` of these tests: 8 slots of 1 KiB, so that Simple Tree messages and ring
/// regions are short and the larger counts take several of them.
const BUFFSIZE: usize = 8192;
const SLOT: usize = BUFFSIZE / 8;
const COUNTS: [usize; 4] = [1, 7, 1000, 2500];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMul,
}

const OPS: [Op; 6] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg, Op::PreMul];

fn raw_op(op: Op) -> i32 {
    match op {
        Op::Sum => 0,
        Op::Prod => 1,
        Op::Max => 2,
        Op::Min => 3,
        Op::Avg => 4,
        Op::PreMul => -1, // created per communicator
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of rank `r`'s input for case `case` (little-endian bytes of `dt`).
fn input(dt: DataType, case: u64, r: usize, i: usize, out: &mut [u8]) {
    let h = splitmix(case.wrapping_mul(1_000_003) ^ ((r as u64) << 40) ^ i as u64);
    match dt {
        DataType::Float32 => {
            let v = ((h % 2_000_000) as f32 - 1_000_000.0) / 997.0;
            out.copy_from_slice(&v.to_le_bytes());
        }
        DataType::Float64 => {
            let v = ((h % 2_000_000_000) as f64 - 1e9) / 99_991.0;
            out.copy_from_slice(&v.to_le_bytes());
        }
        _ => out.copy_from_slice(&h.to_le_bytes()[..out.len()]),
    }
}

/// The PreMulSum scalar of a case (`dt` bytes): a fraction for floats, 3 for integers.
fn scalar(dt: DataType) -> Vec<u8> {
    match dt {
        DataType::Float32 => 0.37f32.to_le_bytes().to_vec(),
        DataType::Float64 => 0.37f64.to_le_bytes().to_vec(),
        DataType::Float16 => 0x35ec_u16.to_le_bytes().to_vec(), // ~0.37
        DataType::Bfloat16 => 0x3ebd_u16.to_le_bytes().to_vec(), // ~0.37
        DataType::Float8e4m3 => vec![0x2e],                     // 0.375
        DataType::Float8e5m2 => vec![0x37],                     // 0.4375
        _ => {
            let mut v = vec![0u8; dt.size()];
            v[0] = 3;
            v
        }
    }
}

/// Element arithmetic of the reference.
struct Arith {
    dt: DataType,
    op: Op,
    n: usize,
    /// The library's reducer, used only for the small float formats.
    small: Option<Reducer>,
}

fn signed(dt: DataType) -> bool {
    matches!(dt, DataType::Int8 | DataType::Int32 | DataType::Int64)
}

impl Arith {
    fn new(dt: DataType, op: Op, n: usize) -> Arith {
        let small = matches!(
            dt,
            DataType::Float16 | DataType::Bfloat16 | DataType::Float8e4m3 | DataType::Float8e5m2
        )
        .then(|| {
            let (kind, s) = match op {
                Op::Sum => (RedOpKind::Sum, None),
                Op::Prod => (RedOpKind::Prod, None),
                Op::Max => (RedOpKind::Max, None),
                Op::Min => (RedOpKind::Min, None),
                Op::Avg => (RedOpKind::Avg, None),
                Op::PreMul => (RedOpKind::PreMulSum, Some(scalar(dt))),
            };
            Reducer::new(dt, kind, s.as_deref(), n).expect("reducer")
        });
        Arith { dt, op, n, small }
    }

    fn int(&self, b: &[u8]) -> i128 {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        let raw = u64::from_le_bytes(w);
        let bits = 8 * b.len() as u32;
        if signed(self.dt) {
            let sh = 64 - bits;
            i128::from(((raw << sh) as i64) >> sh)
        } else {
            i128::from(raw)
        }
    }

    fn int_out(&self, v: i128, out: &mut [u8]) {
        // Wrapping to the width: the low bytes of the two's complement value.
        let n = out.len();
        out.copy_from_slice(&(v as u128).to_le_bytes()[..n]);
    }

    /// `pre(x)`.
    fn pre(&self, x: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; x.len()];
        if let Some(r) = &self.small {
            r.load(&mut out, x);
            return out;
        }
        match self.dt {
            DataType::Float32 => {
                let v = f32::from_le_bytes(x.try_into().unwrap());
                let v = match self.op {
                    Op::PreMul => v * 0.37f32,
                    Op::Avg => v * ((1.0 / self.n as f64) as f32),
                    _ => v,
                };
                out.copy_from_slice(&v.to_le_bytes());
            }
            DataType::Float64 => {
                let v = f64::from_le_bytes(x.try_into().unwrap());
                let v = match self.op {
                    Op::PreMul => v * 0.37f64,
                    Op::Avg => v * (1.0 / self.n as f64),
                    _ => v,
                };
                out.copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                let v = self.int(x);
                let v = if self.op == Op::PreMul { v * 3 } else { v };
                self.int_out(v, &mut out);
            }
        }
        out
    }

    /// `a OP b` (both prescaled).
    fn op(&self, a: &[u8], b: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; a.len()];
        if let Some(r) = &self.small {
            r.merge(&mut out, a, b);
            return out;
        }
        match self.dt {
            DataType::Float32 => {
                let (x, y) = (
                    f32::from_le_bytes(a.try_into().unwrap()),
                    f32::from_le_bytes(b.try_into().unwrap()),
                );
                let v = match self.op {
                    Op::Prod => x * y,
                    Op::Max => x.max(y),
                    Op::Min => x.min(y),
                    _ => x + y,
                };
                out.copy_from_slice(&v.to_le_bytes());
            }
            DataType::Float64 => {
                let (x, y) = (
                    f64::from_le_bytes(a.try_into().unwrap()),
                    f64::from_le_bytes(b.try_into().unwrap()),
                );
                let v = match self.op {
                    Op::Prod => x * y,
                    Op::Max => x.max(y),
                    Op::Min => x.min(y),
                    _ => x + y,
                };
                out.copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                let (x, y) = (self.int(a), self.int(b));
                let v = match self.op {
                    // Products of two wrapped 64-bit values fit i128 before wrapping.
                    Op::Prod => x.wrapping_mul(y),
                    Op::Max => x.max(y),
                    Op::Min => x.min(y),
                    _ => x + y,
                };
                self.int_out(v, &mut out);
            }
        }
        out
    }

    /// Applied once to the full result (integer Avg: truncating division by n).
    fn finish(&self, a: &mut [u8]) {
        if let Some(r) = &self.small {
            r.finish(a);
            return;
        }
        if self.op == Op::Avg && !matches!(self.dt, DataType::Float32 | DataType::Float64) {
            let v = self.int(a) / self.n as i128;
            self.int_out(v, a);
        }
    }
}

/// Tree order for one element: `ins[r]` are the ranks' input elements.
fn tree_ref(ar: &Arith, ins: &[Vec<u8>]) -> Vec<u8> {
    let n = ins.len();
    let mut p = 1;
    while p * 2 <= n {
        p *= 2;
    }
    let e = n - p;
    let v: Vec<Vec<u8>> = (0..p)
        .map(|r| {
            if r < e {
                ar.op(&ar.pre(&ins[r]), &ar.pre(&ins[r + p]))
            } else {
                ar.pre(&ins[r])
            }
        })
        .collect();
    fn t(ar: &Arith, v: &[Vec<u8>], r: usize, size: usize) -> Vec<u8> {
        if size == 1 {
            return v[r].clone();
        }
        ar.op(&t(ar, v, r, size / 2), &t(ar, v, r + size / 2, size / 2))
    }
    let mut out = t(ar, &v, 0, p);
    ar.finish(&mut out);
    out
}

/// Ring order for element `i` of `count` (one channel, slot regions of `n` parts).
fn ring_ref(ar: &Arith, ins: &[Vec<u8>], i: usize, count: usize) -> Vec<u8> {
    let n = ins.len();
    let se = (SLOT / ar.dt.size()).max(1);
    // The region holding i, and i's part in it (the first `len % n` parts one longer).
    let start = i / (n * se) * (n * se);
    let len = (count - start).min(n * se);
    let (base, rem) = (len / n, len % n);
    let at = i - start;
    let k = (0..n)
        .find(|&k| {
            let s = k * base + k.min(rem);
            at >= s && at < s + base + usize::from(k < rem)
        })
        .expect("part");
    let mut acc = ar.pre(&ins[k]);
    for j in 1..n {
        acc = ar.op(&acc, &ar.pre(&ins[(k + j) % n]));
    }
    ar.finish(&mut acc);
    acc
}

fn make_comms(n: usize) -> Vec<Arc<Comm>> {
    let id = get_unique_id().expect("unique id");
    let hs: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                Comm::init_rank(n as i32, id, r as i32, CommConfig::default())
            })
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("init thread").expect("init_rank"))
        .collect()
}

/// The cases, in the order every rank runs them: (case id, dtype, op, count, in place).
fn cases() -> Vec<(u64, DataType, Op, usize, bool)> {
    let mut v = Vec::new();
    for dt in DataType::ALL {
        for op in OPS {
            for (ci, &count) in COUNTS.iter().enumerate() {
                v.push((v.len() as u64 + 1, dt, op, count, ci == 2));
            }
        }
    }
    v
}

/// Runs every case on `n` ranks with the current environment, then checks every rank's
/// output against the reference (`tree` selects the order). Returns the first mismatch.
fn run_all(n: usize, tree: bool) -> Result<(), String> {
    let comms = make_comms(n);
    let hs: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            std::thread::spawn(move || -> Result<Vec<Vec<u8>>, String> {
                let mut outs = Vec::new();
                let mut premul: Option<(DataType, i32)> = None;
                for (case, dt, op, count, in_place) in cases() {
                    let es = dt.size();
                    let raw = match op {
                        Op::PreMul => match premul {
                            Some((d, o)) if d == dt => o,
                            _ => {
                                let o = comm
                                    .create_premulsum(ScalarArg::HostImmediate(scalar(dt)), dt)
                                    .map_err(|e| e.to_string())?;
                                premul = Some((dt, o));
                                o
                            }
                        },
                        _ => raw_op(op),
                    };
                    let mut send = vec![0u8; count * es];
                    for (i, c) in send.chunks_exact_mut(es).enumerate() {
                        input(dt, case, rank, i, c);
                    }
                    let mut recv = if in_place {
                        send.clone()
                    } else {
                        vec![0u8; count * es]
                    };
                    let sendbuf = if in_place {
                        recv.as_ptr() as usize
                    } else {
                        send.as_ptr() as usize
                    };
                    let args = CollArgs {
                        kind: CollKind::AllReduce,
                        sendbuf,
                        recvbuf: recv.as_mut_ptr() as usize,
                        count,
                        dtype: dt as i32,
                        op: raw,
                        root: -1,
                        stream: 0,
                    };
                    enqueue(&comm, args).map_err(|e| format!("{dt:?} {op:?}: {e}"))?;
                    outs.push(recv);
                }
                Ok(outs)
            })
        })
        .collect();
    let mut outs = Vec::new();
    for h in hs {
        outs.push(h.join().map_err(|_| "rank thread panicked".to_string())??);
    }
    for (k, (case, dt, op, count, _)) in cases().into_iter().enumerate() {
        let es = dt.size();
        let ar = Arith::new(dt, op, n);
        let mut ins = vec![vec![0u8; es]; n];
        for i in 0..count {
            for (r, b) in ins.iter_mut().enumerate() {
                input(dt, case, r, i, b);
            }
            let want = if tree {
                tree_ref(&ar, &ins)
            } else {
                ring_ref(&ar, &ins, i, count)
            };
            for (rank, o) in outs.iter().enumerate() {
                let got = &o[k][i * es..(i + 1) * es];
                if got != want.as_slice() {
                    return Err(format!(
                        "{n} ranks, rank {rank}: {dt:?} {op:?} count {count} element {i}: \
                         got {got:02x?}, want {want:02x?}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// One test for all configurations: the algorithm is read from the environment when a
/// communicator is created, so the configurations run one after the other.
#[test]
fn allreduce_is_bit_identical_to_the_documented_order() {
    std::env::set_var("NCCL_BUFFSIZE", BUFFSIZE.to_string());
    std::env::set_var("NCCL_MAX_CTAS", "1");
    std::env::remove_var("CCLD_INJECT");
    for (algo, proto, ranks) in [
        ("Tree", "LL", &[2usize, 3, 4, 5, 8][..]),
        ("Tree", "Simple", &[2, 3, 4, 5, 8][..]),
        ("Ring", "Simple", &[2, 3, 5][..]),
    ] {
        std::env::set_var("NCCL_ALGO", algo);
        std::env::set_var("NCCL_PROTO", proto);
        for &n in ranks {
            let t0 = std::time::Instant::now();
            if let Err(e) = run_all(n, algo == "Tree") {
                panic!("NCCL_ALGO={algo} NCCL_PROTO={proto}: {e}");
            }
            eprintln!("{algo}/{proto} {n} ranks: {:?}", t0.elapsed());
        }
    }
}
