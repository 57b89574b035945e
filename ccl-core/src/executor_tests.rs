//! Unit tests of the executor's pure parts (plans, type sets, errors, completion).

use super::*;
use crate::op::{type_set, P2pCall};
use crate::schedule::Dir;
use ccl_optype::{Algo, Proto};

fn tuning() -> Tuning {
    Tuning {
        min_channels: 1,
        max_channels: 4,
        buffsize: 1 << 20,
        nslots: 8,
        slot_bytes: 1 << 17,
        peer_check: Duration::from_millis(200),
    }
}

fn coll(kind: CollKind, count: usize, dtype: DataType) -> WorkItem {
    WorkItem::Coll(CollOp {
        kind,
        dtype,
        count,
        sendbuf: 8,
        recvbuf: 16,
        root: 1,
        red: (kind == CollKind::AllReduce).then_some(RedSpec::Builtin(RedOpKind::Sum)),
        raw_op: 0,
        place: OpPlace::default(),
    })
}

#[test]
fn channels_grow_with_size_and_p2p_is_capped() {
    let t = tuning();
    let small = plan_for(&coll(CollKind::AllReduce, 10, DataType::Float32), 0, 4, &t).unwrap();
    assert_eq!(small.n_channels, 1);
    let big = plan_for(
        &coll(CollKind::AllReduce, 1 << 22, DataType::Float32),
        0,
        4,
        &t,
    )
    .unwrap();
    assert_eq!(big.n_channels, 4);
    let a2a = plan_for(
        &coll(CollKind::AlltoAll, 1 << 22, DataType::Float32),
        0,
        4,
        &t,
    )
    .unwrap();
    assert_eq!(a2a.n_channels, 2, "p2p links have at most P2P_MAX_CHANNELS");
    assert!(a2a.lanes.iter().all(|l| l.channel < 2));
}

#[test]
fn type_sets() {
    let t = tuning();
    let item = coll(CollKind::AllGather, 100, DataType::Float16);
    let plan = plan_for(&item, 0, 4, &t).unwrap();
    let ts = type_set(&item, 4, &plan);
    assert_eq!(
        (ts.coll, ts.algo, ts.proto),
        (CollKind::AllGather, Algo::Ring, Proto::Simple)
    );
    assert_eq!(
        (ts.count, ts.bytes, ts.redop, ts.root, ts.peer),
        (100, 800, -1, -1, -1)
    );
    let ar = coll(CollKind::AllReduce, 100, DataType::Float32);
    let ts = type_set(&ar, 4, &plan_for(&ar, 0, 4, &t).unwrap());
    assert_eq!((ts.bytes, ts.redop), (400, 0));
    let g = coll(CollKind::Gather, 10, DataType::Int8);
    let ts = type_set(&g, 4, &plan_for(&g, 0, 4, &t).unwrap());
    assert_eq!((ts.algo, ts.root, ts.bytes), (Algo::P2p, 1, 40));
    let call = |dir, peer, count| P2pCall {
        dir,
        peer,
        buf: 64,
        count,
        dtype: DataType::Int32,
        place: OpPlace::default(),
    };
    let p = WorkItem::P2p(vec![call(Dir::Recv, 2, 5), call(Dir::Send, 2, 7)]);
    let ts = type_set(&p, 4, &plan_for(&p, 0, 4, &t).unwrap());
    assert_eq!(
        (ts.coll, ts.peer, ts.count, ts.bytes),
        (CollKind::Send, 2, 12, 48)
    );
    let p = WorkItem::P2p(vec![call(Dir::Recv, 1, 5), call(Dir::Recv, 3, 7)]);
    let ts = type_set(&p, 4, &plan_for(&p, 0, 4, &t).unwrap());
    assert_eq!((ts.coll, ts.peer), (CollKind::Recv, -1));
}

#[test]
fn context_keeps_the_error_kind() {
    let e = with_context(CclError::Remote("boom".into()), "AllReduce #1");
    assert_eq!(e, CclError::Remote("AllReduce #1: boom".into()));
    assert_eq!(
        with_context(CclError::InProgress, "x"),
        CclError::InProgress
    );
}

#[test]
fn completion_first_result_wins_and_dropped_jobs_complete() {
    let done = Arc::new(Completion::default());
    drop(Job {
        items: Vec::new(),
        done: Arc::clone(&done),
    });
    assert!(matches!(done.wait(), Err(CclError::Internal(_))));
    let done = Arc::new(Completion::default());
    done.set(Ok(()));
    done.set(Err(CclError::Internal("late".into())));
    assert_eq!(done.wait(), Ok(()));
}

#[test]
fn overlap_detection() {
    assert!(mem::overlap(100, 100, 1));
    assert!(mem::overlap(100, 150, 51));
    assert!(!mem::overlap(100, 150, 50));
    assert!(!mem::overlap(100, 100, 0));
}
