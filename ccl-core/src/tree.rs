//! The Tree algorithm of host AllReduce: recursive doubling, log2 N exchange steps
//! (pure: the step list of one rank, and the reduction order it produces).
//!
//! With `n` ranks, `p` the largest power of two `<= n` and `e = n - p` "extra" ranks:
//! 1. fold-in: extra rank `p + i` sends its (prescaled) input to rank `i`, which computes
//!    `v_i = pre(x_i) OP pre(x_{p+i})`; every other rank `r < p` has `v_r = pre(x_r)`;
//! 2. doubling: for `m = 1, 2, 4, .. < p`, rank `r < p` exchanges its partial result with
//!    rank `r XOR m` and both compute `lower OP higher` (the partial of the lower ranks
//!    first), so after the step every rank of each aligned group of `2m` ranks holds the
//!    group's result;
//! 3. `finish` (integer Avg's division) on ranks `< p`, then fold-out: rank `i` sends the
//!    result to rank `p + i`.
//!
//! Every rank therefore ends with the same bits: the result is `T(0, p)` with
//! `T(r, 1) = v_r` and `T(r, 2m) = T(r, m) OP T(r + m, m)` (docs/host-backend.md), for every
//! element independently. Messages larger than one FIFO message are cut into chunks of
//! whole elements, and each chunk runs the steps above on its own.

/// One step of a rank's Tree AllReduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TreeStep {
    /// Extra rank: send the prescaled input to `to` (fold-in).
    SendInput {
        /// Receiving rank (`rank - p`).
        to: usize,
    },
    /// Extra rank: receive the final result from `from` into the receive buffer.
    RecvResult {
        /// Sending rank (`rank - p`).
        from: usize,
    },
    /// Rank `< e`: receive the extra rank's input and fold it in (`acc = acc OP in`).
    FoldIn {
        /// Sending rank (`rank + p`).
        from: usize,
    },
    /// Send the partial result to `peer`, receive its one, combine lower-ranked first.
    Exchange {
        /// Partner rank (`rank XOR m`).
        peer: usize,
    },
    /// Rank `< e`: send the final (finished) result to `to` (fold-out).
    SendResult {
        /// Receiving rank (`rank + p`).
        to: usize,
    },
}

impl TreeStep {
    /// Messages the step sends and receives.
    pub(crate) fn messages(self) -> (u64, u64) {
        match self {
            TreeStep::SendInput { .. } | TreeStep::SendResult { .. } => (1, 0),
            TreeStep::RecvResult { .. } | TreeStep::FoldIn { .. } => (0, 1),
            TreeStep::Exchange { .. } => (1, 1),
        }
    }

    /// The other rank of the step.
    pub(crate) fn peer(self) -> usize {
        match self {
            TreeStep::SendInput { to }
            | TreeStep::SendResult { to }
            | TreeStep::RecvResult { from: to }
            | TreeStep::FoldIn { from: to }
            | TreeStep::Exchange { peer: to } => to,
        }
    }
}

/// Largest power of two `<= n` (`n >= 1`).
pub(crate) fn pow2_floor(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// The steps of `rank` of `nranks` (empty for one rank).
pub(crate) fn steps(rank: usize, nranks: usize) -> Vec<TreeStep> {
    let mut v = Vec::new();
    if nranks < 2 || rank >= nranks {
        return v;
    }
    let p = pow2_floor(nranks);
    let e = nranks - p;
    if rank >= p {
        v.push(TreeStep::SendInput { to: rank - p });
        v.push(TreeStep::RecvResult { from: rank - p });
        return v;
    }
    if rank < e {
        v.push(TreeStep::FoldIn { from: rank + p });
    }
    let mut m = 1;
    while m < p {
        v.push(TreeStep::Exchange { peer: rank ^ m });
        m <<= 1;
    }
    if rank < e {
        v.push(TreeStep::SendResult { to: rank + p });
    }
    v
}

/// Every peer `rank` exchanges messages with (for link setup), in step order.
pub(crate) fn peers(rank: usize, nranks: usize) -> Vec<usize> {
    steps(rank, nranks).iter().map(|s| s.peer()).collect()
}

/// Elements per chunk for messages of at most `msg_bytes` bytes (at least one element).
pub(crate) fn chunk_elems(msg_bytes: usize, elem_size: usize) -> usize {
    (msg_bytes / elem_size.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the steps of all ranks symbolically, as sets of contributing ranks in order
    /// (an expression tree), and checks the message pairing and the documented order.
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn every_rank_ends_with_the_documented_expression() {
        #[derive(Clone, Debug, PartialEq)]
        enum E {
            Leaf(usize),
            Op(Box<E>, Box<E>),
        }
        fn t(r: usize, size: usize, v: &dyn Fn(usize) -> E) -> E {
            if size == 1 {
                return v(r);
            }
            E::Op(
                Box::new(t(r, size / 2, v)),
                Box::new(t(r + size / 2, size / 2, v)),
            )
        }
        for n in 1..=17 {
            let p = pow2_floor(n);
            let e = n - p;
            let v = |r: usize| {
                if r < e {
                    E::Op(Box::new(E::Leaf(r)), Box::new(E::Leaf(r + p)))
                } else {
                    E::Leaf(r)
                }
            };
            let want = t(0, p, &v);
            // Simulate in lock-step phases: fold-in, each doubling round, fold-out.
            let mut acc: Vec<E> = (0..n).map(E::Leaf).collect();
            let all: Vec<Vec<TreeStep>> = (0..n).map(|r| steps(r, n)).collect();
            for r in 0..n {
                for s in &all[r] {
                    let q = s.peer();
                    assert!(q < n && q != r, "n={n} rank {r}: {s:?}");
                }
            }
            for i in 0..e {
                assert_eq!(all[p + i][0], TreeStep::SendInput { to: i });
                assert_eq!(all[i][0], TreeStep::FoldIn { from: p + i });
                acc[i] = E::Op(Box::new(acc[i].clone()), Box::new(acc[p + i].clone()));
            }
            let mut m = 1;
            let mut round = 0;
            while m < p {
                let before = acc.clone();
                for r in 0..p {
                    let idx = round + usize::from(r < e);
                    assert_eq!(all[r][idx], TreeStep::Exchange { peer: r ^ m }, "n={n}");
                    let q = r ^ m;
                    let (lo, hi) = if r < q { (r, q) } else { (q, r) };
                    acc[r] = E::Op(Box::new(before[lo].clone()), Box::new(before[hi].clone()));
                }
                m <<= 1;
                round += 1;
            }
            for i in 0..e {
                assert_eq!(all[i].last(), Some(&TreeStep::SendResult { to: p + i }));
                assert_eq!(all[p + i][1], TreeStep::RecvResult { from: i });
                acc[p + i] = acc[i].clone();
            }
            if n > 1 {
                for (r, a) in acc.iter().enumerate() {
                    assert_eq!(a, &want, "n={n} rank {r}");
                }
                // Messages pair up: what r sends to q, q receives from r.
                let count = |from: usize, to: usize, sending: bool| -> usize {
                    all[from]
                        .iter()
                        .filter(|s| s.peer() == to)
                        .map(|s| {
                            let (sn, rc) = s.messages();
                            (if sending { sn } else { rc }) as usize
                        })
                        .sum()
                };
                for a in 0..n {
                    for b in 0..n {
                        assert_eq!(count(a, b, true), count(b, a, false), "n={n} {a}->{b}");
                    }
                }
            } else {
                assert!(all[0].is_empty());
            }
        }
    }

    #[test]
    fn pow2_and_chunks() {
        assert_eq!(
            (1..=9).map(pow2_floor).collect::<Vec<_>>(),
            [1, 2, 2, 4, 4, 4, 4, 8, 8]
        );
        assert_eq!(chunk_elems(8192, 4), 2048);
        assert_eq!(chunk_elems(8192, 3), 2730);
        assert_eq!(chunk_elems(2, 8), 1);
    }
}
