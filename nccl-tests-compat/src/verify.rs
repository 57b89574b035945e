//! Verifiable inputs: every rank's input is a pure function of (seed, rank, index) chosen
//! per data type and operation so that any reduction order gives one exact result (small
//! integers whose partial sums stay exactly representable, products of +-1 and +-2 that
//! cannot overflow, ...). Averages of floats are checked within 2 ULP. Pure logic.

use crate::dtype::{DataType, RedOp};

/// What the inputs of one operation are generated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenParams {
    /// Element type.
    pub dtype: DataType,
    /// Reduction (None for copy collectives).
    pub op: Option<RedOp>,
    /// Ranks in the communicator.
    pub nranks: usize,
    /// Per-run seed (nccl-tests: a fresh one per check iteration).
    pub seed: u64,
}

/// The value an element must have.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expect {
    /// Exactly this integer-valued number, compared bit for bit after encoding.
    Exact(i64),
    /// Floating-point averages: `value` = S/n exactly; accepted within `ulps` ULP taken at
    /// `scale` = max(|S/n|, sum|x_i|/n). NCCL computes avg as a pre-multiplication of
    /// every input by fl(1/n) followed by a sum, so its rounding error is bounded by the
    /// magnitude of the terms (about n ULP of sum|x_i|/n), not of the result.
    Approx {
        /// The exact average.
        value: f64,
        /// Where the ULP is measured.
        scale: f64,
        /// How many ULP: max(2, nranks).
        ulps: f64,
    },
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hash(seed: u64, rank: usize, idx: usize) -> u64 {
    splitmix(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ splitmix((rank as u64) << 40 ^ idx as u64))
}

impl GenParams {
    fn signed(&self) -> bool {
        !self.dtype.is_unsigned()
    }

    /// Draws a value in [-b, b] (or [0, b] for unsigned types).
    fn draw(&self, h: u64, b: i64) -> i64 {
        if b <= 0 {
            return 0;
        }
        if self.signed() {
            (h % (2 * b as u64 + 1)) as i64 - b
        } else {
            (h % (b as u64 + 1)) as i64
        }
    }

    /// Bound for summed values; 0 means the one-hot scheme (too many ranks for the type).
    fn sum_bound(&self, scale: i64) -> i64 {
        (self.dtype.max_exact_int() / (self.nranks.max(1) as i64 * scale)).min(1000)
    }

    fn prod_twos(&self) -> usize {
        self.nranks.min(self.dtype.max_pow2() as usize).min(62)
    }

    /// The PreMulSum scalar of `rank` (1 or 2).
    pub fn scalar(&self, rank: usize) -> i64 {
        1 + (rank % 2) as i64
    }

    /// Logical value of element `idx` of `rank`'s input.
    pub fn input(&self, rank: usize, idx: usize) -> i64 {
        let h = hash(self.seed, rank, idx);
        let n = self.nranks.max(1);
        match self.op {
            None | Some(RedOp::Max) | Some(RedOp::Min) => {
                self.draw(h, self.dtype.max_exact_int().min(1000))
            }
            Some(RedOp::Sum) | Some(RedOp::Avg) | Some(RedOp::MulSum) => {
                let scale = if self.op == Some(RedOp::MulSum) { 2 } else { 1 };
                let b = self.sum_bound(scale);
                if b == 0 {
                    // One-hot: exactly one rank holds a 1 for each element.
                    i64::from(idx % n == rank)
                } else {
                    self.draw(h, b)
                }
            }
            Some(RedOp::Prod) => {
                let mag = if rank < self.prod_twos() && h & 1 == 1 {
                    2
                } else {
                    1
                };
                if self.signed() && (h >> 1) & 3 == 0 {
                    -mag
                } else {
                    mag
                }
            }
        }
    }

    /// The reduction over all ranks of element `idx` (`idx` indexes the inputs).
    pub fn reduced(&self, idx: usize) -> Expect {
        let n = self.nranks.max(1);
        let vals = (0..n).map(|r| self.input(r, idx));
        match self.op {
            None | Some(RedOp::Sum) => Expect::Exact(vals.sum()),
            Some(RedOp::MulSum) => {
                Expect::Exact((0..n).map(|r| self.scalar(r) * self.input(r, idx)).sum())
            }
            Some(RedOp::Prod) => Expect::Exact(vals.fold(1i64, |a, v| a.wrapping_mul(v))),
            Some(RedOp::Max) => Expect::Exact(vals.max().unwrap_or(0)),
            Some(RedOp::Min) => Expect::Exact(vals.min().unwrap_or(0)),
            Some(RedOp::Avg) => {
                let s: i64 = vals.sum();
                if self.dtype.is_float() {
                    let value = s as f64 / n as f64;
                    let abs: i64 = (0..n).map(|r| self.input(r, idx).abs()).sum();
                    let scale = (abs as f64 / n as f64).max(value.abs());
                    Expect::Approx {
                        value,
                        scale,
                        ulps: (n as f64).max(2.0),
                    }
                } else {
                    // C integer division (truncation toward zero), as NCCL does.
                    Expect::Exact(s / n as i64)
                }
            }
        }
    }

    /// Fills `out` (count * size bytes) with `rank`'s input elements `first..first+count`.
    pub fn fill(&self, rank: usize, first: usize, out: &mut [u8]) {
        let sz = self.dtype.size();
        for (k, chunk) in out.chunks_exact_mut(sz).enumerate() {
            self.dtype.encode_int(self.input(rank, first + k), chunk);
        }
    }

    /// Whether `got` (one element's bytes) satisfies `want`.
    pub fn matches(&self, want: Expect, got: &[u8]) -> bool {
        let sz = self.dtype.size();
        match want {
            Expect::Exact(v) => {
                let mut b = [0u8; 8];
                self.dtype.encode_int(v, &mut b);
                b[..sz] == got[..sz]
            }
            Expect::Approx { value, scale, ulps } => {
                let g = self.dtype.decode(got);
                !g.is_nan() && (g - value).abs() <= ulps * self.dtype.ulp_at(scale)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{ALL_OPS, ALL_TYPES};

    /// Simulates a reduction in the element type itself in several orders and checks the
    /// result equals the expectation: the inputs really make the result order-independent.
    #[test]
    fn reductions_are_exact_in_every_order() {
        for t in ALL_TYPES {
            for op in ALL_OPS {
                if op == RedOp::Avg && t.is_float() {
                    continue;
                }
                for n in [1usize, 2, 3, 4, 7, 8, 16] {
                    let p = GenParams {
                        dtype: t,
                        op: Some(op),
                        nranks: n,
                        seed: 7,
                    };
                    for idx in 0..200 {
                        let want = p.reduced(idx);
                        for order in 0..3 {
                            let mut ranks: Vec<usize> = (0..n).collect();
                            if order == 1 {
                                ranks.reverse();
                            } else if order == 2 {
                                ranks.rotate_left(n / 2);
                            }
                            let got = simulate(&p, &ranks, idx);
                            assert!(p.matches(want, &got), "{t:?} {op:?} n={n} idx={idx}");
                        }
                    }
                }
            }
        }
    }

    /// Reduces in element precision: every partial result is encoded and decoded.
    fn simulate(p: &GenParams, order: &[usize], idx: usize) -> Vec<u8> {
        let t = p.dtype;
        let mut b = vec![0u8; 8];
        let term = |r: usize| {
            let v = p.input(r, idx);
            if p.op == Some(RedOp::MulSum) {
                v * p.scalar(r)
            } else {
                v
            }
        };
        let mut acc = term(order[0]);
        for &r in &order[1..] {
            let v = term(r);
            acc = match p.op {
                Some(RedOp::Prod) => acc.wrapping_mul(v),
                Some(RedOp::Max) => acc.max(v),
                Some(RedOp::Min) => acc.min(v),
                _ => acc + v,
            };
            // Every partial result must be representable: round trip it.
            t.encode_int(acc, &mut b);
            if !t.is_float() {
                continue;
            }
            assert_eq!(t.decode(&b), acc as f64, "{t:?} partial {acc} not exact");
        }
        if p.op == Some(RedOp::Avg) {
            acc /= p.nranks as i64;
        }
        t.encode_int(acc, &mut b);
        b
    }

    #[test]
    fn inputs_vary_and_fill_matches_input() {
        let p = GenParams {
            dtype: DataType::Float,
            op: Some(RedOp::Sum),
            nranks: 4,
            seed: 1,
        };
        let distinct: std::collections::HashSet<i64> = (0..100).map(|i| p.input(0, i)).collect();
        assert!(distinct.len() > 10);
        let mut buf = vec![0u8; 40];
        p.fill(2, 5, &mut buf);
        for k in 0..10 {
            assert_eq!(
                DataType::Float.decode(&buf[k * 4..]),
                p.input(2, 5 + k) as f64
            );
        }
        let q = GenParams { seed: 2, ..p };
        assert_ne!(
            (0..50).map(|i| p.input(0, i)).collect::<Vec<_>>(),
            (0..50).map(|i| q.input(0, i)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn float_avg_tolerance() {
        let p = GenParams {
            dtype: DataType::Float,
            op: Some(RedOp::Avg),
            nranks: 3,
            seed: 3,
        };
        // An exactly representable value, so the ULP steps below are exact.
        let x = (1.0f64 / 3.0) as f32 as f64;
        let e = Expect::Approx {
            value: x,
            scale: x,
            ulps: 2.0,
        };
        let near = (x as f32).to_le_bytes();
        assert!(p.matches(e, &near));
        let two_ulp = f32::from_bits((x as f32).to_bits() + 2).to_le_bytes();
        assert!(p.matches(e, &two_ulp));
        let three_ulp = f32::from_bits((x as f32).to_bits() + 3).to_le_bytes();
        assert!(!p.matches(e, &three_ulp));
        let far = ((x as f32) * 1.001).to_le_bytes();
        assert!(!p.matches(e, &far));
        assert!(!p.matches(e, &f32::NAN.to_le_bytes()));
    }

    /// Simulates NCCL's avg (premultiply by fl(1/n) in the element precision, then sum)
    /// in every order: always within the tolerance; a wrong result (the sum, not the
    /// average) never is.
    #[test]
    fn premultiplied_average_is_accepted_and_sum_is_not() {
        for n in [2usize, 3, 5, 7, 8] {
            for t in [DataType::Float, DataType::Double] {
                let p = GenParams {
                    dtype: t,
                    op: Some(RedOp::Avg),
                    nranks: n,
                    seed: 11,
                };
                for idx in 0..500 {
                    let want = p.reduced(idx);
                    let round = |x: f64| {
                        if t == DataType::Float {
                            x as f32 as f64
                        } else {
                            x
                        }
                    };
                    let r = round(1.0 / n as f64);
                    for rev in [false, true] {
                        let mut ranks: Vec<usize> = (0..n).collect();
                        if rev {
                            ranks.reverse();
                        }
                        let mut acc = 0.0;
                        for q in ranks {
                            acc = round(acc + round(p.input(q, idx) as f64 * r));
                        }
                        let mut b = [0u8; 8];
                        if t == DataType::Float {
                            b[..4].copy_from_slice(&(acc as f32).to_le_bytes());
                        } else {
                            b.copy_from_slice(&acc.to_le_bytes());
                        }
                        assert!(
                            p.matches(want, &b),
                            "{t:?} n={n} idx={idx} got {acc} want {want:?}"
                        );
                    }
                    let sum: i64 = (0..n).map(|q| p.input(q, idx)).sum();
                    if sum != 0 {
                        let mut b = [0u8; 8];
                        t.encode_int(sum, &mut b);
                        assert!(!p.matches(want, &b), "{t:?} n={n} idx={idx}");
                    }
                }
            }
        }
    }

    #[test]
    fn one_hot_when_type_too_small() {
        let p = GenParams {
            dtype: DataType::F8e5m2,
            op: Some(RedOp::Sum),
            nranks: 16,
            seed: 3,
        };
        for idx in 0..64 {
            assert_eq!(p.reduced(idx), Expect::Exact(1));
        }
    }
}
