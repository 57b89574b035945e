//! Dataflow models of a hang's counts: a pipelined ring (send/recv per step over `slots`
//! FIFO slots) and a tree (reduce up, broadcast down, chunked), run to their fixed point with
//! some ranks limited (frozen after a number of primitives, or never started).

/// Per-rank (send, recv) counts of a frozen pipeline and the expected totals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frozen {
    /// Counts reached by each rank.
    pub counts: Vec<(u64, u64)>,
    /// Counts each rank would reach when the operation completes.
    pub expected: Vec<(u64, u64)>,
}

/// Ring allreduce, `steps` = 2 (N - 1) x loops, each step one send; rank j's program:
/// send(0), then (recv(t - 1), send(t)) for t = 1..steps, then recv(steps - 1). A send needs
/// a free slot at the next rank (sent - next's received < slots), a recv needs the previous
/// rank to have sent it. `limit[j]` caps the primitives rank j executes (frozen rank), None =
/// unlimited. Runs to the fixed point.
pub fn ring_dataflow(n: usize, steps: u64, slots: u64, limit: &[Option<u64>]) -> Frozen {
    let mut sent = vec![0u64; n];
    let mut recvd = vec![0u64; n];
    let mut done = vec![0u64; n]; // primitives executed
    let total = 2 * steps;
    loop {
        let mut progress = false;
        for j in 0..n {
            loop {
                let d = done[j];
                if d >= total || limit.get(j).copied().flatten().is_some_and(|l| d >= l) {
                    break;
                }
                let prev = (j + n - 1) % n;
                let next = (j + 1) % n;
                // Primitive d: even = send, odd = recv (send(0), recv(0), send(1), ...).
                let ok = if d.is_multiple_of(2) {
                    sent[j] < recvd[next] + slots
                } else {
                    sent[prev] > recvd[j]
                };
                if !ok {
                    break;
                }
                if d.is_multiple_of(2) {
                    sent[j] += 1;
                } else {
                    recvd[j] += 1;
                }
                done[j] += 1;
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    Frozen {
        counts: sent.into_iter().zip(recvd).collect(),
        expected: vec![(steps, steps); n],
    }
}

pub(super) fn tree_children(j: usize, n: usize) -> impl Iterator<Item = usize> {
    [2 * j + 1, 2 * j + 2].into_iter().filter(move |&c| c < n)
}

/// Depth of rank j in the heap-layout binary tree (root 0 at layer 0).
pub fn tree_layer(j: u32) -> u32 {
    31 - (j + 1).leading_zeros()
}

/// Tree allreduce on the heap-layout binary tree with `chunks` chunks: per chunk, receive
/// from each child and send to the parent (reduce), then receive from the parent and send to
/// each child (broadcast); the root turns the reduction around. FIFO of `slots` per edge.
/// `limit` as in [`ring_dataflow`].
pub fn tree_dataflow(n: usize, chunks: u64, slots: u64, limit: &[Option<u64>]) -> Frozen {
    // Program of rank j as a list of primitives: (kind, peer), kind 0 recv-up from child,
    // 1 send-up, 2 recv-down, 3 send-down to child.
    let progs: Vec<Vec<(u8, usize)>> = (0..n)
        .map(|j| {
            let kids: Vec<usize> = tree_children(j, n).collect();
            let mut p = Vec::new();
            for _ in 0..chunks {
                for &c in &kids {
                    p.push((0, c));
                }
                if j != 0 {
                    p.push((1, (j - 1) / 2));
                }
            }
            for _ in 0..chunks {
                if j != 0 {
                    p.push((2, (j - 1) / 2));
                }
                for &c in &kids {
                    p.push((3, c));
                }
            }
            p
        })
        .collect();
    let mut up_sent = vec![0u64; n]; // j -> parent
    let mut up_recvd = vec![0u64; n]; // parent received from child j
    let mut down_sent = vec![0u64; n]; // parent -> j
    let mut down_recvd = vec![0u64; n]; // j received from parent
    let mut pc = vec![0usize; n];
    let mut sends = vec![0u64; n];
    let mut recvs = vec![0u64; n];
    loop {
        let mut progress = false;
        for j in 0..n {
            loop {
                let i = pc[j];
                if i >= progs[j].len()
                    || limit
                        .get(j)
                        .copied()
                        .flatten()
                        .is_some_and(|l| i as u64 >= l)
                {
                    break;
                }
                let (kind, peer) = progs[j][i];
                let ok = match kind {
                    0 => up_sent[peer] > up_recvd[peer],
                    1 => up_sent[j] < up_recvd[j] + slots,
                    2 => down_sent[j] > down_recvd[j],
                    _ => down_sent[peer] < down_recvd[peer] + slots,
                };
                if !ok {
                    break;
                }
                match kind {
                    0 => {
                        up_recvd[peer] += 1;
                        recvs[j] += 1;
                    }
                    1 => {
                        up_sent[j] += 1;
                        sends[j] += 1;
                    }
                    2 => {
                        down_recvd[j] += 1;
                        recvs[j] += 1;
                    }
                    _ => {
                        down_sent[peer] += 1;
                        sends[j] += 1;
                    }
                }
                pc[j] += 1;
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    let expected = progs
        .iter()
        .map(|p| {
            let s = p.iter().filter(|x| x.0 == 1 || x.0 == 3).count() as u64;
            (s, p.len() as u64 - s)
        })
        .collect();
    Frozen {
        counts: sends.into_iter().zip(recvs).collect(),
        expected,
    }
}
