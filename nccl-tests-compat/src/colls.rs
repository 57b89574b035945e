//! The ten collectives: per-call element counts and in-place offsets, bandwidth
//! formulas, the NCCL calls one operation consists of, and what every received element
//! must be. Pure logic (no buffers, no library).

use crate::dtype::DataType;
use crate::nccl::{Call, CallKind};
use crate::verify::{Expect, GenParams};

/// A test program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    /// all_reduce_perf
    AllReduce,
    /// all_gather_perf
    AllGather,
    /// broadcast_perf
    Broadcast,
    /// reduce_perf
    Reduce,
    /// reduce_scatter_perf
    ReduceScatter,
    /// alltoall_perf
    AlltoAll,
    /// gather_perf
    Gather,
    /// scatter_perf
    Scatter,
    /// sendrecv_perf
    SendRecv,
    /// hypercube_perf
    HyperCube,
}

/// All programs.
pub const ALL_COLLS: [Coll; 10] = [
    Coll::AllReduce,
    Coll::AllGather,
    Coll::Broadcast,
    Coll::Reduce,
    Coll::ReduceScatter,
    Coll::AlltoAll,
    Coll::Gather,
    Coll::Scatter,
    Coll::SendRecv,
    Coll::HyperCube,
];

/// Element counts of one operation (nccl-tests' getCollByteCount, in elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Elements in each rank's send buffer.
    pub send: usize,
    /// Elements in each rank's receive buffer (the verified region).
    pub recv: usize,
    /// The count argument passed to NCCL.
    pub param: usize,
    /// In-place: send = recvbuf + send_inplace * rank (elements).
    pub send_inplace: usize,
    /// In-place: recv = recvbuf + recv_inplace * rank (elements).
    pub recv_inplace: usize,
}

impl Coll {
    /// Whether the in-place run's wrong elements are counted and printed: not for SendRecv
    /// and AlltoAll, whose in-place forms overwrite data that peers may still be reading
    /// (nccl-tests sets `reportErrors = in_place ? 0 : 1` in their `InitData` and prints
    /// `N/A` in the `#wrong` column).
    pub fn reports_in_place_errors(self) -> bool {
        !matches!(self, Coll::SendRecv | Coll::AlltoAll)
    }

    /// Binary name.
    pub fn program(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce_perf",
            Coll::AllGather => "all_gather_perf",
            Coll::Broadcast => "broadcast_perf",
            Coll::Reduce => "reduce_perf",
            Coll::ReduceScatter => "reduce_scatter_perf",
            Coll::AlltoAll => "alltoall_perf",
            Coll::Gather => "gather_perf",
            Coll::Scatter => "scatter_perf",
            Coll::SendRecv => "sendrecv_perf",
            Coll::HyperCube => "hypercube_perf",
        }
    }

    /// Looks a program up by binary name.
    pub fn from_program(name: &str) -> Option<Coll> {
        ALL_COLLS.iter().copied().find(|c| c.program() == name)
    }

    /// Whether the operation reduces (takes -o).
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }

    /// Whether the operation has a root (takes -r).
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }

    /// The optional NCCL symbol the program needs, if any.
    pub fn needs_symbol(self) -> Option<&'static str> {
        match self {
            Coll::AlltoAll => Some("ncclAlltoAll"),
            Coll::Gather => Some("ncclGather"),
            Coll::Scatter => Some("ncclScatter"),
            _ => None,
        }
    }

    /// Counts for a size of `count` elements of `elt` bytes over `n` ranks. Sharded
    /// operations round the per-rank count down to a multiple of 16 bytes (hypercube: of
    /// 4 elements).
    pub fn counts(self, count: usize, n: usize, elt: usize) -> Counts {
        let n = n.max(1);
        let align = (16 / elt).max(1);
        let shard = (count / n) / align * align;
        let c = |send, recv, param, si, ri| Counts {
            send,
            recv,
            param,
            send_inplace: si,
            recv_inplace: ri,
        };
        match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => {
                c(count, count, count, 0, 0)
            }
            Coll::AllGather | Coll::Gather => c(shard, shard * n, shard, shard, 0),
            Coll::ReduceScatter | Coll::Scatter => c(shard * n, shard, shard, 0, shard),
            Coll::AlltoAll => c(shard * n, shard * n, shard, 0, 0),
            Coll::HyperCube => {
                let base = (count / (4 * n)) * 4;
                c(base, base * n, base, base, 0)
            }
        }
    }

    /// (algbw, busbw) in GB/s (1e9) for `param` elements of `elt` bytes taking `sec`.
    pub fn bandwidth(self, param: usize, elt: usize, sec: f64, n: usize) -> (f64, f64) {
        let nf = n as f64;
        let bytes = (param * elt) as f64;
        let (data, factor) = match self {
            Coll::AllReduce => (bytes, 2.0 * (nf - 1.0) / nf),
            Coll::AllGather
            | Coll::ReduceScatter
            | Coll::AlltoAll
            | Coll::Gather
            | Coll::Scatter => (bytes * nf, (nf - 1.0) / nf),
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => (bytes, 1.0),
            Coll::HyperCube => (bytes * (nf - 1.0), 1.0),
        };
        let alg = data / 1.0e9 / sec;
        (alg, alg * factor)
    }

    /// The NCCL calls of one operation as phases, written into `phases` (reusing its vectors:
    /// no allocation per operation once they have grown, as the timed loop calls this every
    /// iteration); each phase is one group (phases run in order). `send`/`recv` are the
    /// addresses to use (already offset for in-place). Hypercube's first, local copy is not
    /// a call: see [`Coll::local_copy`].
    #[allow(clippy::too_many_arguments)]
    pub fn calls_into(
        self,
        phases: &mut Vec<Vec<Call>>,
        send: usize,
        recv: usize,
        param: usize,
        dtype: DataType,
        op: i32,
        root: i32,
        rank: usize,
        n: usize,
    ) {
        let t = dtype.nccl();
        let call = |kind, send, recv, count, op, root| Call {
            kind,
            send,
            recv,
            count,
            dtype: t,
            op,
            root,
        };
        let nphases = match self {
            Coll::HyperCube => n.next_power_of_two().trailing_zeros() as usize,
            _ => 1,
        };
        phases.resize_with(nphases, Vec::new);
        phases.iter_mut().for_each(Vec::clear);
        let one = |kind, op, root| call(kind, send, recv, param, op, root);
        match self {
            Coll::AllReduce => phases[0].push(one(CallKind::AllReduce, op, -1)),
            Coll::Reduce => phases[0].push(one(CallKind::Reduce, op, root)),
            Coll::ReduceScatter => phases[0].push(one(CallKind::ReduceScatter, op, -1)),
            Coll::Broadcast => phases[0].push(one(CallKind::Broadcast, 0, root)),
            Coll::AllGather => phases[0].push(one(CallKind::AllGather, 0, -1)),
            Coll::AlltoAll => phases[0].push(one(CallKind::AlltoAll, 0, -1)),
            Coll::Gather => phases[0].push(one(CallKind::Gather, 0, root)),
            Coll::Scatter => phases[0].push(one(CallKind::Scatter, 0, root)),
            Coll::SendRecv => {
                let next = ((rank + 1) % n) as i32;
                let prev = ((rank + n - 1) % n) as i32;
                phases[0].push(call(CallKind::Send, send, 0, param, 0, next));
                phases[0].push(call(CallKind::Recv, 0, recv, param, 0, prev));
            }
            Coll::HyperCube => {
                let bytes = param * dtype.size();
                for (k, phase) in phases.iter_mut().enumerate() {
                    let mask = 1usize << k;
                    let s = rank & !(mask - 1);
                    let r = s ^ mask;
                    let peer = (rank ^ mask) as i32;
                    let count = param * mask;
                    phase.push(call(CallKind::Send, recv + s * bytes, 0, count, 0, peer));
                    phase.push(call(CallKind::Recv, 0, recv + r * bytes, count, 0, peer));
                }
            }
        }
    }

    /// Hypercube first copies the rank's own block into place: (src, dst, bytes), or None
    /// when in place already.
    pub fn local_copy(
        self,
        send: usize,
        recv: usize,
        param: usize,
        elt: usize,
        rank: usize,
    ) -> Option<(usize, usize, usize)> {
        if self != Coll::HyperCube {
            return None;
        }
        let dst = recv + rank * param * elt;
        (dst != send).then_some((send, dst, param * elt))
    }

    /// What element `j` of `rank`'s receive region must hold (`None`: not checked, e.g.
    /// non-root ranks of Reduce and Gather). `c` are the counts of the operation.
    pub fn expected(
        self,
        p: &GenParams,
        c: &Counts,
        rank: usize,
        root: usize,
        j: usize,
    ) -> Option<Expect> {
        let n = p.nranks;
        let exact = |r: usize, i: usize| Some(Expect::Exact(p.input(r, i)));
        let pc = c.param.max(1);
        match self {
            Coll::AllReduce => Some(p.reduced(j)),
            Coll::Reduce => (rank == root).then(|| p.reduced(j)),
            Coll::ReduceScatter => Some(p.reduced(rank * c.recv + j)),
            Coll::Broadcast => exact(root, j),
            Coll::AllGather | Coll::HyperCube => exact(j / pc, j % pc),
            Coll::AlltoAll => exact(j / pc, rank * c.param + j % pc),
            Coll::Gather => {
                if rank == root {
                    exact(j / pc, j % pc)
                } else {
                    None
                }
            }
            Coll::Scatter => exact(root, rank * c.recv + j),
            Coll::SendRecv => exact((rank + n - 1) % n, j),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_nccl_tests() {
        // 1 MiB of float over 8 ranks.
        let count = (1 << 20) / 4;
        assert_eq!(
            Coll::AllReduce.counts(count, 8, 4),
            Counts {
                send: count,
                recv: count,
                param: count,
                send_inplace: 0,
                recv_inplace: 0
            }
        );
        let s = count / 8;
        assert_eq!(
            Coll::AllGather.counts(count, 8, 4),
            Counts {
                send: s,
                recv: s * 8,
                param: s,
                send_inplace: s,
                recv_inplace: 0
            }
        );
        assert_eq!(
            Coll::ReduceScatter.counts(count, 8, 4),
            Counts {
                send: s * 8,
                recv: s,
                param: s,
                send_inplace: 0,
                recv_inplace: s
            }
        );
        assert_eq!(Coll::AlltoAll.counts(count, 8, 4).param, s);
        // Rounding to 16 bytes: 100 floats over 3 ranks -> 33 -> 32.
        assert_eq!(Coll::AllGather.counts(100, 3, 4).param, 32);
        assert_eq!(Coll::Scatter.counts(100, 3, 1).param, 32);
        assert_eq!(Coll::Gather.counts(100, 3, 8).param, 32);
        assert_eq!(Coll::AllGather.counts(7, 2, 4).param, 0);
        assert_eq!(Coll::HyperCube.counts(100, 4, 4).param, 24);
    }

    #[test]
    fn bandwidth_formulas() {
        let sec = 1e-3;
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let (alg, bus) = Coll::AllReduce.bandwidth(1_000_000, 4, sec, 4);
        assert!(close(alg, 4.0) && close(bus, 6.0));
        let (alg, bus) = Coll::AllGather.bandwidth(250_000, 4, sec, 4);
        assert!(close(alg, 4.0) && close(bus, 3.0));
        let (alg, bus) = Coll::Broadcast.bandwidth(1_000_000, 4, sec, 4);
        assert!(close(alg, 4.0) && close(bus, 4.0));
        let (alg, bus) = Coll::HyperCube.bandwidth(1_000_000, 4, sec, 4);
        assert!(close(alg, 12.0) && close(bus, 12.0));
        let (alg, bus) = Coll::SendRecv.bandwidth(1_000_000, 4, sec, 2);
        assert!(close(alg, 4.0) && close(bus, 4.0));
        let (_, bus) = Coll::AllReduce.bandwidth(10, 4, sec, 1);
        assert!(close(bus, 0.0));
    }

    #[test]
    fn hypercube_phases_cover_all_blocks() {
        // Simulate the exchanges: every rank must end with every block.
        for n in [1usize, 2, 4, 8] {
            let mut have: Vec<Vec<bool>> =
                (0..n).map(|r| (0..n).map(|b| b == r).collect()).collect();
            let phases: Vec<_> = (0..n)
                .map(|r| {
                    let mut ph = Vec::new();
                    Coll::HyperCube.calls_into(&mut ph, 0, 0, 1, DataType::Int8, 0, -1, r, n);
                    ph
                })
                .collect();
            #[allow(clippy::needless_range_loop)]
            for k in 0..phases[0].len() {
                let snapshot = have.clone();
                for r in 0..n {
                    let recv = phases[r][k][1];
                    let peer = recv.root as usize;
                    for b in recv.recv..recv.recv + recv.count {
                        assert!(
                            snapshot[peer][b],
                            "n={n} rank {r} receives block {b} that {peer} lacks"
                        );
                        have[r][b] = true;
                    }
                }
            }
            assert!(have.iter().all(|h| h.iter().all(|&x| x)), "n={n}");
        }
    }

    #[test]
    fn sendrecv_ring_peers() {
        let mut ph = vec![vec![]; 3];
        Coll::SendRecv.calls_into(&mut ph, 1, 2, 3, DataType::Float, 0, 0, 0, 4);
        assert_eq!(
            (ph.len(), ph[0].len()),
            (1, 2),
            "reused vectors cut to one phase"
        );
        assert_eq!(ph[0][0].root, 1);
        assert_eq!(ph[0][1].root, 3);
    }

    #[test]
    fn names_round_trip() {
        for c in ALL_COLLS {
            assert_eq!(Coll::from_program(c.program()), Some(c));
        }
    }
}
