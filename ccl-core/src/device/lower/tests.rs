//! Lowering tests, including an emulator that executes lowered plans of all ranks with the
//! kernel's rules (conn wiring by [`ConnKey`], FIFO of `depth` slots, per-channel lanes
//! round-robin, counters per channel) and checks results against direct references.

use std::collections::{HashMap, VecDeque};

use ccl_optype::CollKind;

use super::*;
use crate::schedule::{self, CollDesc, BUF_RECV, BUF_SEND};
use crate::types::DataType;

type Fifos = HashMap<(usize, usize, LinkKind, usize), VecDeque<Vec<u8>>>;

fn rd(b: &[u8]) -> i32 {
    i32::from_le_bytes(b[..4].try_into().unwrap())
}

/// The kernel's element semantics for int32 (wrapping arithmetic).
fn elem(p: &RedParams, inc: Option<i32>, local: i32, finish: bool) -> i32 {
    let s = p.scalar_bits as u32 as i32;
    let pre = |x: i32| {
        if p.op == CCL_OP_PREMUL {
            x.wrapping_mul(s)
        } else {
            x
        }
    };
    let mut v = match inc {
        None => pre(local),
        Some(a) => match p.op {
            CCL_OP_PROD => a.wrapping_mul(local),
            CCL_OP_MAX => a.max(local),
            CCL_OP_MIN => a.min(local),
            _ => a.wrapping_add(pre(local)),
        },
    };
    if finish && p.avg_divisor != 0 {
        v /= p.avg_divisor as i32;
    }
    v
}

fn map_elems(p: &RedParams, inc: Option<&[u8]>, local: &[u8], finish: bool) -> Vec<u8> {
    local
        .chunks(4)
        .enumerate()
        .flat_map(|(i, l)| {
            let a = inc.map(|b| rd(&b[i * 4..]));
            elem(p, a, rd(l), finish).to_le_bytes()
        })
        .collect()
}

/// Runs every rank's lowered plan; returns per-rank per-channel (sends, recvs).
fn emulate(
    plans: &[LoweredPlan],
    bufs: &mut [Vec<Vec<u8>>],
    red: Option<&RedParams>,
    depth: usize,
) -> Vec<Vec<(u64, u64)>> {
    let n = plans.len();
    for (r, p) in plans.iter().enumerate() {
        for l in &p.locals {
            let u = p.unit as usize;
            let (s, d, c) = (
                l.src_off as usize * u,
                l.dst_off as usize * u,
                l.count as usize * u,
            );
            let src = bufs[r][l.src_buf as usize][s..s + c].to_vec();
            let v = if l.kind == CCL_LOCAL_REDUCE {
                map_elems(red.unwrap(), None, &src, true)
            } else {
                src
            };
            bufs[r][l.dst_buf as usize][d..d + c].copy_from_slice(&v);
        }
    }
    let fifo_key = |r: usize, k: &ConnKey| match k.dir {
        ConnDir::Out => (r, k.peer, k.link, k.channel),
        ConnDir::In => (k.peer, r, k.link, k.channel),
    };
    let mut fifos: Fifos = HashMap::new();
    let mut pos: Vec<Vec<usize>> = plans.iter().map(|p| vec![0; p.lanes.len()]).collect();
    let mut counts: Vec<Vec<(u64, u64)>> = plans
        .iter()
        .map(|p| vec![(0, 0); p.n_channels as usize])
        .collect();
    loop {
        let mut progressed = false;
        let mut done = true;
        for r in 0..n {
            let p = &plans[r];
            let u = p.unit as usize;
            for (li, lane) in p.lanes.iter().enumerate() {
                if pos[r][li] >= lane.n_steps as usize {
                    continue;
                }
                done = false;
                let st = p.steps[lane.first_step as usize + pos[r][li]];
                let recvs = st.kind != CCL_STEP_SEND;
                let sends = step_sends(st.kind);
                let kin = (lane.conn_in >= 0).then(|| fifo_key(r, &p.conns[lane.conn_in as usize]));
                let kout =
                    (lane.conn_out >= 0).then(|| fifo_key(r, &p.conns[lane.conn_out as usize]));
                if recvs && fifos.get(&kin.unwrap()).is_none_or(|q| q.is_empty()) {
                    continue;
                }
                if sends && fifos.get(&kout.unwrap()).is_some_and(|q| q.len() >= depth) {
                    continue;
                }
                let nb = st.count as usize * u;
                let inc = recvs.then(|| fifos.get_mut(&kin.unwrap()).unwrap().pop_front().unwrap());
                if let Some(m) = &inc {
                    assert_eq!(m.len(), nb, "rank {r}: message size");
                }
                let so = st.src_off as usize * u;
                let src = bufs[r][st.src_buf as usize][so..so + nb].to_vec();
                let val = match st.kind {
                    CCL_STEP_SEND => match red {
                        Some(rp) if rp.op == CCL_OP_PREMUL => map_elems(rp, None, &src, false),
                        _ => src,
                    },
                    CCL_STEP_RECV | CCL_STEP_RECV_COPY_SEND => inc.unwrap(),
                    CCL_STEP_RECV_REDUCE_SEND => {
                        map_elems(red.unwrap(), inc.as_deref(), &src, false)
                    }
                    _ => map_elems(red.unwrap(), inc.as_deref(), &src, true),
                };
                if matches!(
                    st.kind,
                    CCL_STEP_RECV
                        | CCL_STEP_RECV_COPY_SEND
                        | CCL_STEP_RECV_REDUCE_COPY_SEND
                        | CCL_STEP_RECV_REDUCE_COPY
                ) {
                    let d = st.dst_off as usize * u;
                    bufs[r][st.dst_buf as usize][d..d + nb].copy_from_slice(&val);
                }
                if sends {
                    fifos.entry(kout.unwrap()).or_default().push_back(val);
                }
                let c = &mut counts[r][lane.channel as usize];
                c.0 += u64::from(sends);
                c.1 += u64::from(recvs);
                pos[r][li] += 1;
                progressed = true;
            }
        }
        if done {
            break;
        }
        assert!(progressed, "deadlock");
    }
    assert!(fifos.values().all(|q| q.is_empty()), "unconsumed messages");
    counts
}

fn input(r: usize, i: usize) -> i32 {
    ((r * 131 + i * 7) % 97) as i32 - 40
}

/// Elements of the send and the receive buffer of one rank for `coll` of `count`.
pub(crate) fn buf_lens(coll: CollKind, count: usize, n: usize) -> (usize, usize) {
    let in_len = match coll {
        CollKind::ReduceScatter | CollKind::AlltoAll | CollKind::Scatter => count * n,
        _ => count,
    };
    let out_len = match coll {
        CollKind::AllGather | CollKind::AlltoAll | CollKind::Gather => count * n,
        _ => count,
    };
    (in_len, out_len)
}

/// Rank `rank`'s plan of `coll` over 4-byte elements, and its lowering (2 buffers).
pub(crate) fn lowered_plan(
    coll: CollKind,
    count: usize,
    n: usize,
    rank: usize,
    root: usize,
    nch: usize,
    slot: usize,
) -> (schedule::Plan, LoweredPlan) {
    lowered_plan_es(coll, count, n, rank, root, nch, slot, 4)
}

/// [`lowered_plan`] for elements of `elem_size` bytes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn lowered_plan_es(
    coll: CollKind,
    count: usize,
    n: usize,
    rank: usize,
    root: usize,
    nch: usize,
    slot: usize,
    elem_size: usize,
) -> (schedule::Plan, LoweredPlan) {
    let plan = schedule::collective(&CollDesc {
        coll,
        count,
        elem_size,
        nranks: n,
        rank,
        root,
        n_channels: nch,
        slot_bytes: slot,
    })
    .unwrap();
    let lowered = lower(&plan, 2).unwrap();
    (plan, lowered)
}

fn run_coll(coll: CollKind, count: usize, n: usize, op: RedOpKind, nch: usize, slot: usize) {
    let root = (count + 1) % n;
    let reducing = matches!(
        coll,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    );
    let scalar = 3i32.to_le_bytes();
    let reducer = reducing.then(|| {
        let s = (op == RedOpKind::PreMulSum).then_some(&scalar[..]);
        Reducer::new(DataType::Int32, op, s, n).unwrap()
    });
    let params = reducer.as_ref().map(|r| red_params(r, n).unwrap());
    let (in_len, out_len) = buf_lens(coll, count, n);
    let mut plans = Vec::new();
    let mut bufs = Vec::new();
    for rank in 0..n {
        let (plan, lowered) = lowered_plan(coll, count, n, rank, root, nch, slot);
        // The counters the kernel stores equal the schedule's expectation.
        let exp: Vec<(u64, u64)> = plan
            .expected_counts()
            .iter()
            .map(|c| (c.send, c.recv))
            .collect();
        assert_eq!(lowered.counts_per_channel(), exp);
        plans.push(lowered);
        let send: Vec<u8> = (0..in_len)
            .flat_map(|i| input(rank, i).to_le_bytes())
            .collect();
        bufs.push(vec![send, vec![0x55u8; out_len * 4]]);
    }
    let counts = emulate(&plans, &mut bufs, params.as_ref(), 2);
    for (r, p) in plans.iter().enumerate() {
        assert_eq!(counts[r], p.counts_per_channel(), "rank {r}: counters");
    }
    let red = |vals: Vec<i32>| -> i32 {
        match op {
            RedOpKind::Sum => vals.iter().fold(0i32, |a, b| a.wrapping_add(*b)),
            RedOpKind::Prod => vals.iter().fold(1i32, |a, b| a.wrapping_mul(*b)),
            RedOpKind::Max => *vals.iter().max().unwrap(),
            RedOpKind::Min => *vals.iter().min().unwrap(),
            RedOpKind::Avg => vals.iter().fold(0i32, |a, b| a.wrapping_add(*b)) / n as i32,
            RedOpKind::PreMulSum => vals.iter().fold(0i32, |a, b| a.wrapping_add(b * 3)),
        }
    };
    let all = |i: usize| red((0..n).map(|q| input(q, i)).collect());
    for (r, rb) in bufs.iter().enumerate() {
        let got: Vec<i32> = rb[BUF_RECV].chunks(4).map(rd).collect();
        let want: Option<Vec<i32>> = match coll {
            CollKind::AllReduce => Some((0..count).map(all).collect()),
            CollKind::Reduce => (r == root).then(|| (0..count).map(all).collect()),
            CollKind::ReduceScatter => Some((0..count).map(|i| all(r * count + i)).collect()),
            CollKind::Broadcast => Some((0..count).map(|i| input(root, i)).collect()),
            CollKind::AllGather => Some(
                (0..n * count)
                    .map(|k| input(k / count, k % count))
                    .collect(),
            ),
            CollKind::AlltoAll => Some(
                (0..n * count)
                    .map(|k| input(k / count, r * count + k % count))
                    .collect(),
            ),
            CollKind::Gather => (r == root).then(|| {
                (0..n * count)
                    .map(|k| input(k / count, k % count))
                    .collect()
            }),
            CollKind::Scatter => Some((0..count).map(|i| input(root, r * count + i)).collect()),
            _ => unreachable!(),
        };
        if let Some(w) = want {
            assert_eq!(
                got, w,
                "{coll:?} {op:?} n {n} rank {r} count {count} nch {nch}"
            );
        }
        assert_eq!(rb[BUF_SEND].len(), in_len * 4);
    }
}

#[test]
fn lowered_plans_run_by_the_kernel_rules_give_correct_results_and_counters() {
    let colls = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
        CollKind::Gather,
        CollKind::Scatter,
    ];
    for coll in colls {
        for n in [1, 2, 3, 4, 8] {
            for (count, nch, slot) in [(1, 1, 64), (37, 2, 16), (300, 3, 64)] {
                run_coll(coll, count, n, RedOpKind::Sum, nch, slot);
            }
        }
    }
    for op in [
        RedOpKind::Prod,
        RedOpKind::Max,
        RedOpKind::Min,
        RedOpKind::Avg,
        RedOpKind::PreMulSum,
    ] {
        for n in [1, 3, 4] {
            run_coll(CollKind::AllReduce, 41, n, op, 2, 16);
            run_coll(CollKind::ReduceScatter, 13, n, op, 1, 8);
            run_coll(CollKind::Reduce, 29, n, op, 2, 12);
        }
    }
}

#[test]
fn reduction_parameters_follow_the_reducer() {
    let p =
        |dt, op, s: Option<&[u8]>, n| red_params(&Reducer::new(dt, op, s, n).unwrap(), n).unwrap();
    let f = p(DataType::Float32, RedOpKind::Avg, None, 4);
    assert_eq!((f.op, f.avg_divisor), (CCL_OP_PREMUL, 0));
    assert_eq!(f32::from_bits(f.scalar_bits as u32), 0.25);
    let d = p(DataType::Float64, RedOpKind::Avg, None, 3);
    assert_eq!(f64::from_bits(d.scalar_bits), 1.0 / 3.0);
    let h = p(DataType::Float16, RedOpKind::Avg, None, 3);
    assert_eq!(
        h.scalar_bits,
        u64::from(crate::reduce::f32_to_f16_bits((1.0f64 / 3.0) as f32))
    );
    let i = p(DataType::Int64, RedOpKind::Avg, None, 6);
    assert_eq!((i.op, i.avg_divisor, i.scalar_bits), (CCL_OP_SUM, 6, 0));
    let m = p(DataType::Uint8, RedOpKind::PreMulSum, Some(&[7]), 2);
    assert_eq!((m.op, m.scalar_bits, m.dtype), (CCL_OP_PREMUL, 7, 1));
    assert_eq!(
        p(DataType::Bfloat16, RedOpKind::Max, None, 2).op,
        CCL_OP_MAX
    );
    assert_eq!(p(DataType::Int8, RedOpKind::Min, None, 2).op, CCL_OP_MIN);
    assert_eq!(
        p(DataType::Float8e4m3, RedOpKind::Prod, None, 2).op,
        CCL_OP_PROD
    );
    assert_eq!(p(DataType::Float8e5m2, RedOpKind::Sum, None, 2).dtype, 11);
}

#[test]
fn p2p_groups_lower_with_one_conn_per_peer_direction_and_channel() {
    use crate::schedule::{Dir, P2pOp};
    let ops: Vec<P2pOp> = (0..4)
        .flat_map(|peer| {
            [Dir::Send, Dir::Recv].map(|dir| P2pOp {
                dir,
                peer,
                buf: usize::from(dir == Dir::Recv),
                off: 0,
                bytes: 100,
                n_channels: 2,
            })
        })
        .collect();
    let plan = schedule::p2p(1, 4, 16, &ops).unwrap();
    let l = lower(&plan, 2).unwrap();
    // 3 remote peers x 2 directions x 2 channels; the self pair is a local copy.
    assert_eq!(l.conns.len(), 12);
    assert_eq!(l.locals.len(), 1);
    assert!(l
        .conns
        .iter()
        .all(|k| k.link == LinkKind::P2p && k.peer != 1));
    assert!(
        lower(&plan, 1).is_err(),
        "buffer index beyond n_bufs must be rejected"
    );
}

#[test]
fn limits_are_reported_as_errors() {
    let plan = schedule::collective(&CollDesc {
        coll: CollKind::AllReduce,
        count: 64,
        elem_size: 4,
        nranks: 2,
        rank: 0,
        root: 0,
        n_channels: 2,
        slot_bytes: 64,
    })
    .unwrap();
    assert!(lower(&plan, 2).is_ok());
    assert!(lower(&plan, 65).is_err());
    let mut p = plan.clone();
    p.n_channels = 0;
    assert!(lower(&p, 2).is_err());
    let mut p = plan.clone();
    p.unit = 16;
    assert!(lower(&p, 2).is_err());
    let mut p = plan.clone();
    p.lanes[0].channel = 5;
    assert!(lower(&p, 2).is_err());
    let mut p = plan.clone();
    p.lanes[0].send_to = None;
    assert!(lower(&p, 2).is_err());
    let mut p = plan;
    let dup = p.lanes[0].clone();
    p.lanes.push(dup);
    assert!(lower(&p, 2).is_err(), "two lanes on one connection");
}

#[test]
fn fault_fields_follow_the_host_rules() {
    use crate::inject::OpFault;
    use std::time::Duration;
    // Rank 1 of 4, ring AllReduce on 2 channels: every lane sends to rank 2.
    let (_, lp0) = lowered_plan(CollKind::AllReduce, 4096, 4, 1, 0, 2, 1024);
    let none = {
        let mut lp = lp0.clone();
        let f = apply_fault(&mut lp, &OpFault::default());
        assert_eq!(lp, lp0, "no fault: the arrays are unchanged");
        f
    };
    assert_eq!(
        none,
        FaultFields {
            throttle_gap_ns: 0,
            stall_channel: CCL_STALL_NONE,
            stall_after: 0
        }
    );
    let throttled = |link: Option<usize>| {
        let mut lp = lp0.clone();
        let f = apply_fault(
            &mut lp,
            &OpFault {
                throttle: Some((Duration::from_micros(1500), link)),
                ..OpFault::default()
            },
        );
        assert_eq!(f.throttle_gap_ns, 1_500_000);
        assert_eq!(f.stall_channel, CCL_STALL_NONE);
        lp
    };
    for link in [None, Some(2)] {
        let lp = throttled(link);
        assert_eq!(lp.lanes.len(), 2);
        for l in &lp.lanes {
            let peer = lp.conns[l.conn_out as usize].peer;
            assert_eq!(peer, 2);
            assert_eq!(
                l.flags, CCL_LANE_THROTTLED,
                "link {link:?}: lane sends to 2"
            );
        }
    }
    // A link that is not this rank's outbound peer throttles nothing (the gap is still
    // carried, the kernel applies it to flagged lanes only).
    let lp = throttled(Some(0));
    assert!(lp.lanes.iter().all(|l| l.flags == 0));
    // P2p: lanes that send to 3 are flagged, lanes to others and receive lanes are not.
    {
        use crate::schedule::{Dir, P2pOp};
        let ops: Vec<P2pOp> = (0..4)
            .flat_map(|peer| {
                [Dir::Send, Dir::Recv].map(|dir| P2pOp {
                    dir,
                    peer,
                    buf: usize::from(dir == Dir::Recv),
                    off: 0,
                    bytes: 100,
                    n_channels: 2,
                })
            })
            .collect();
        let plan = schedule::p2p(1, 4, 16, &ops).unwrap();
        let mut lp = lower(&plan, 2).unwrap();
        apply_fault(
            &mut lp,
            &OpFault {
                throttle: Some((Duration::from_millis(1), Some(3))),
                ..OpFault::default()
            },
        );
        let mut flagged = 0;
        for l in &lp.lanes {
            let out = usize::try_from(l.conn_out).ok().map(|i| lp.conns[i].peer);
            assert_eq!(
                l.flags == CCL_LANE_THROTTLED,
                out == Some(3),
                "{l:?} to {out:?}"
            );
            flagged += usize::from(l.flags != 0);
        }
        assert_eq!(flagged, 2, "one send lane to 3 per channel");
    }
    // Stalls: every channel, one channel, a channel the plan does not use.
    let st = |s: Option<usize>| {
        let mut lp = lp0.clone();
        apply_fault(
            &mut lp,
            &OpFault {
                stall: Some(s),
                ..OpFault::default()
            },
        )
        .stall_channel
    };
    assert_eq!(st(None), CCL_STALL_ALL);
    assert_eq!(st(Some(1)), 1);
    assert_eq!(st(Some(2)), CCL_STALL_NONE, "channel 2 of a 2-channel plan");
}

#[test]
fn a_halved_plan_keeps_the_first_half_of_every_lane() {
    let (plan, _) = lowered_plan(CollKind::AllReduce, 4096, 4, 1, 0, 2, 1024);
    let h = halved(&plan);
    assert_eq!(h.local, plan.local);
    assert_eq!(h.lanes.len(), plan.lanes.len());
    for (a, b) in h.lanes.iter().zip(&plan.lanes) {
        assert_eq!(a.steps.len(), b.steps.len().div_ceil(2));
        assert_eq!(a.steps[..], b.steps[..a.steps.len()]);
        assert_eq!(
            (a.channel, a.send_to, a.recv_from),
            (b.channel, b.send_to, b.recv_from)
        );
    }
    assert!(h.total_steps() < plan.total_steps());
}

/// One-rank plans: where `byte_copies` offers copies, applying them gives what the kernel
/// rules give (`emulate`); it refuses exactly the reductions whose element function changes
/// its input (PreMulSum, integer Avg's divisor); in place, nothing is left to copy.
#[test]
fn one_rank_byte_copies_do_what_the_kernel_does() {
    // Every collective (Send and Recv are not collective plans).
    let colls = CollKind::ALL
        .into_iter()
        .filter(|c| !matches!(c, CollKind::Send | CollKind::Recv));
    let ops = [
        RedOpKind::Sum,
        RedOpKind::Prod,
        RedOpKind::Max,
        RedOpKind::Min,
        RedOpKind::Avg,
        RedOpKind::PreMulSum,
    ];
    const BASE: [usize; 2] = [0x1000_0000, 0x2000_0000];
    let scalar = 3i32.to_le_bytes();
    for coll in colls {
        let reducing = matches!(
            coll,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        );
        for op in ops {
            if !reducing && op != RedOpKind::Sum {
                continue;
            }
            let params = reducing.then(|| {
                let s = (op == RedOpKind::PreMulSum).then_some(&scalar[..]);
                red_params(&Reducer::new(DataType::Int32, op, s, 1).unwrap(), 1).unwrap()
            });
            let count = 37;
            let (_, lp) = lowered_plan(coll, count, 1, 0, 0, 2, 64);
            let (in_len, out_len) = buf_lens(coll, count, 1);
            let send: Vec<u8> = (0..in_len)
                .flat_map(|i| input(0, i).to_le_bytes())
                .collect();
            let mut by_kernel = vec![vec![send.clone(), vec![0x55u8; out_len * 4]]];
            emulate(
                std::slice::from_ref(&lp),
                &mut by_kernel,
                params.as_ref(),
                2,
            );
            let copies = byte_copies(&lp, &BASE, params.as_ref());
            let needs_kernel = reducing && matches!(op, RedOpKind::PreMulSum | RedOpKind::Avg);
            assert_eq!(copies.is_none(), needs_kernel, "{coll:?} {op:?}");
            let Some(copies) = copies else { continue };
            let mut bufs = [send, vec![0x55u8; out_len * 4]];
            for c in &copies {
                let locate = |a: usize| {
                    let b = usize::from(a >= BASE[1]);
                    (b, a - BASE[b])
                };
                let ((sb, so), (db, dof)) = (locate(c.src), locate(c.dst));
                let bytes = bufs[sb][so..so + c.bytes].to_vec();
                bufs[db][dof..dof + c.bytes].copy_from_slice(&bytes);
            }
            assert_eq!(bufs[BUF_RECV], by_kernel[0][BUF_RECV], "{coll:?} {op:?}");
            // In place (the receive buffer is the send buffer): nothing to copy.
            let same = byte_copies(&lp, &[BASE[0], BASE[0]], params.as_ref()).unwrap();
            assert!(same.is_empty(), "{coll:?} {op:?} in place: {same:?}");
        }
    }
    // Plans with lanes always need the kernel.
    let (_, lp2) = lowered_plan(CollKind::Broadcast, 8, 2, 0, 0, 1, 64);
    assert_eq!(byte_copies(&lp2, &BASE, None), None);
}
