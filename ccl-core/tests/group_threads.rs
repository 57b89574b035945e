//! Group semantics with ranks as threads: one thread driving every rank of
//! `ncclCommInitAll` in one group, p2p in any order (self included), nested groups, two
//! communicators in one group, several collectives in one group, errors naming the failing
//! operation, split, non-blocking init.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::{
    enqueue, group_end, group_start, CclError, CollArgs, Comm, CommConfig, DataType, ResultCode,
};
use ccl_optype::CollKind;

fn allreduce_args(send: &[f32], recv: &mut [f32]) -> CollArgs {
    CollArgs {
        kind: CollKind::AllReduce,
        sendbuf: send.as_ptr() as usize,
        recvbuf: recv.as_mut_ptr() as usize,
        count: send.len(),
        dtype: DataType::Float32 as i32,
        op: common::SUM,
        root: -1,
        stream: 0,
    }
}

fn p2p(kind: CollKind, buf: usize, count: usize, peer: usize) -> CollArgs {
    CollArgs {
        kind,
        sendbuf: if kind == CollKind::Send { buf } else { 0 },
        recvbuf: if kind == CollKind::Recv { buf } else { 0 },
        count,
        dtype: DataType::Int32 as i32,
        op: 0,
        root: peer as i32,
        stream: 0,
    }
}

fn destroy_all(comms: &[Arc<Comm>]) {
    for c in comms {
        c.destroy().expect("destroy");
    }
}

#[test]
fn one_thread_drives_all_ranks_of_init_all_in_one_group() {
    let n = 4;
    let comms = Comm::init_all(n as i32, Some(vec![3, 2, 1, 0])).expect("init_all");
    let live = Comm::live();
    for c in &comms {
        assert!(
            live.iter().any(|l| Arc::ptr_eq(l, c)),
            "registered for the diagnostic thread"
        );
    }
    drop(live);
    for (i, c) in comms.iter().enumerate() {
        assert_eq!(c.rank() as usize, i);
        assert_eq!(c.nranks() as usize, n);
        assert_eq!(c.cuda_device(), 3 - i as i32);
        c.async_error().expect("ready");
    }
    let count = 100_003;
    let sends: Vec<Vec<f32>> = (0..n)
        .map(|r| (0..count).map(|i| ((i + r) % 5) as f32).collect())
        .collect();
    let mut recvs = vec![vec![0f32; count]; n];
    // Three collectives per rank in one group, run in issue order.
    let mut recvs2 = vec![vec![0f32; count]; n];
    group_start().unwrap();
    for r in 0..n {
        let a = allreduce_args(&sends[r], &mut recvs[r]);
        enqueue(&comms[r], a).unwrap();
        enqueue(
            &comms[r],
            CollArgs {
                op: common::MAX,
                ..a
            },
        )
        .unwrap();
        let b = allreduce_args(&sends[r], &mut recvs2[r]);
        enqueue(&comms[r], b).unwrap();
    }
    assert_eq!(comms[0].ops_started(), 0, "nothing runs before group_end");
    group_end().expect("group_end");
    for r in 0..n {
        for i in 0..count {
            let max = (0..n).map(|q| ((i + q) % 5) as f32).fold(0.0, f32::max);
            let sum: f32 = (0..n).map(|q| ((i + q) % 5) as f32).sum();
            assert_eq!(recvs[r][i], max, "rank {r} elem {i}: second op (Max) wins");
            assert_eq!(recvs2[r][i], sum);
        }
        assert_eq!(comms[r].ops_started(), 3);
    }
    destroy_all(&comms);
    let weak: Vec<_> = comms.iter().map(Arc::downgrade).collect();
    drop(comms);
    let live = Comm::live();
    assert!(
        weak.iter().all(|w| w.upgrade().is_none()),
        "no leaked references"
    );
    assert!(!live.iter().any(|l| weak
        .iter()
        .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(l)))));
}

#[test]
fn p2p_in_any_order_including_self_never_deadlocks() {
    let n = 3;
    let comms = Comm::init_all(n as i32, None).expect("init_all");
    let count = 20_000;
    // sends[r][p]: what r sends to p; recvs[r][p]: what r got from p.
    let sends: Vec<Vec<Vec<i32>>> = (0..n)
        .map(|r| {
            (0..n)
                .map(|p| {
                    (0..count)
                        .map(|i| (r * 1000 + p * 100 + i) as i32)
                        .collect()
                })
                .collect()
        })
        .collect();
    let mut recvs = vec![vec![vec![-1i32; count]; n]; n];
    group_start().unwrap();
    for r in 0..n {
        // Rank-dependent scrambled order: receives before sends on some ranks.
        let mut calls = Vec::new();
        for p in 0..n {
            calls.push(p2p(CollKind::Send, sends[r][p].as_ptr() as usize, count, p));
            calls.push(p2p(
                CollKind::Recv,
                recvs[r][p].as_mut_ptr() as usize,
                count,
                p,
            ));
        }
        if r % 2 == 1 {
            calls.reverse();
        }
        calls.rotate_left(r);
        for c in calls {
            enqueue(&comms[r], c).unwrap();
        }
    }
    group_end().expect("group_end");
    // Every segment (doorbells, ring and the lazily created p2p links) was unlinked as soon
    // as its peers had mapped it.
    let hash = format!("{:016x}", comms[0].comm_id());
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&hash))
        .collect();
    assert!(left.is_empty(), "segments still linked: {left:?}");
    for r in 0..n {
        for p in 0..n {
            assert_eq!(recvs[r][p], sends[p][r], "rank {r} from {p}");
        }
        assert_eq!(comms[r].ops_started(), 1, "one op counter per p2p group");
    }
    // Reuse the cached p2p links, one peer at a time, outside a group for a single pair.
    let mut got = vec![0i32; 7];
    group_start().unwrap();
    enqueue(
        &comms[0],
        p2p(CollKind::Send, sends[0][2].as_ptr() as usize, 7, 2),
    )
    .unwrap();
    enqueue(
        &comms[2],
        p2p(CollKind::Recv, got.as_mut_ptr() as usize, 7, 0),
    )
    .unwrap();
    group_end().unwrap();
    assert_eq!(got[..], sends[0][2][..7]);
    destroy_all(&comms);
}

#[test]
fn nested_groups_run_at_the_outermost_end_and_two_comms_share_a_group() {
    let a = Comm::init_all(2, None).expect("init_all a");
    let b = Comm::init_all(2, None).expect("init_all b");
    assert_ne!(a[0].comm_id(), b[0].comm_id());
    let send: Vec<Vec<f32>> = (0..2).map(|r| vec![r as f32 + 1.0; 1000]).collect();
    let mut ra = vec![vec![0f32; 1000]; 2];
    let mut rb = vec![vec![0f32; 1000]; 2];
    group_start().unwrap();
    group_start().unwrap();
    assert_eq!(ccl_core::internal::group::group_depth(), 2);
    for r in 0..2 {
        enqueue(&a[r], allreduce_args(&send[r], &mut ra[r])).unwrap();
    }
    group_end().unwrap();
    assert_eq!(a[0].ops_started(), 0, "inner group_end must not launch");
    for r in 0..2 {
        enqueue(&b[r], allreduce_args(&send[r], &mut rb[r])).unwrap();
    }
    group_end().unwrap();
    assert_eq!(ccl_core::internal::group::group_depth(), 0);
    assert!(ra.iter().chain(&rb).all(|v| v.iter().all(|x| *x == 3.0)));
    // Unbalanced end.
    let e = group_end().unwrap_err();
    assert_eq!(e.code(), ResultCode::InvalidUsage);
    destroy_all(&a);
    destroy_all(&b);
}

/// As NCCL (`ncclGroupErrCheck`): a call that fails inside a group fails the whole group
/// at its outermost end, with that call's error, and none of the group's operations run;
/// the next group is unaffected.
#[test]
fn a_call_that_fails_inside_a_group_cancels_the_group() {
    let c = Comm::init_all(2, None).expect("init_all");
    let send: Vec<Vec<f32>> = (0..2).map(|r| vec![r as f32 + 1.0; 300]).collect();
    let mut recv = vec![vec![-7f32; 300]; 2];
    group_start().unwrap();
    group_start().unwrap();
    enqueue(&c[0], allreduce_args(&send[0], &mut recv[0])).unwrap();
    let bad = CollArgs {
        dtype: 99,
        ..allreduce_args(&send[1], &mut recv[1])
    };
    let e = enqueue(&c[1], bad).unwrap_err();
    assert_eq!(e.code(), ResultCode::InvalidArgument);
    enqueue(&c[1], allreduce_args(&send[1], &mut recv[1])).unwrap();
    // The inner end only closes a level.
    group_end().unwrap();
    let e = group_end().unwrap_err();
    assert_eq!(e.code(), ResultCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("invalid data type 99"), "{e}");
    assert_eq!(ccl_core::internal::group::group_depth(), 0);
    assert!(
        recv.iter().all(|v| v.iter().all(|x| *x == -7.0)),
        "an operation of the failed group ran"
    );
    assert_eq!((c[0].ops_started(), c[1].ops_started()), (0, 0));
    // The failure does not outlive its group, nor break the communicators.
    group_start().unwrap();
    for r in 0..2 {
        enqueue(&c[r], allreduce_args(&send[r], &mut recv[r])).unwrap();
    }
    group_end().unwrap();
    assert!(recv.iter().all(|v| v.iter().all(|x| *x == 3.0)));
    // A failed call outside a group leaves no error behind for a later group.
    let bad = CollArgs {
        op: 1234,
        ..allreduce_args(&send[0], &mut recv[0])
    };
    assert!(enqueue(&c[0], bad).is_err());
    group_start().unwrap();
    for r in 0..2 {
        enqueue(&c[r], allreduce_args(&send[r], &mut recv[r])).unwrap();
    }
    group_end().unwrap();
    destroy_all(&c);
}

#[test]
fn group_end_error_names_the_failing_operation() {
    let c = Comm::init_all(2, None).expect("init_all");
    let data = vec![1i32; 64];
    let mut sink = vec![0i32; 64];
    group_start().unwrap();
    enqueue(&c[0], p2p(CollKind::Send, data.as_ptr() as usize, 10, 1)).unwrap();
    enqueue(
        &c[1],
        p2p(CollKind::Recv, sink.as_mut_ptr() as usize, 20, 0),
    )
    .unwrap();
    let e = group_end().unwrap_err();
    let msg = e.to_string();
    // The descriptor check catches the count mismatch (ncclInvalidUsage).
    assert_eq!(e.code(), ResultCode::InvalidUsage, "{msg}");
    assert!(
        msg.contains("Recv peer 0") && msg.contains("count 20"),
        "{msg}"
    );
    assert!(
        c[1].async_error().is_err(),
        "the receiving comm is broken now"
    );
    assert!(c[1].last_error().unwrap().contains("Recv peer 0"));
    for x in &c {
        let _ = x.abort();
    }
}

#[test]
fn split_orders_by_key_and_nocolor_returns_none() {
    let n = 5;
    let comms = Comm::init_all(n, None).expect("init_all");
    let results: Vec<Option<Arc<Comm>>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let r = c.rank();
                    // Rank 4 opts out; evens and odds form two comms, keys reverse the order.
                    let color = if r == 4 { -1 } else { r % 2 };
                    c.split(color, -r, CommConfig::default()).expect("split")
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results[4].is_none());
    let evens = [results[0].clone().unwrap(), results[2].clone().unwrap()];
    let odds = [results[1].clone().unwrap(), results[3].clone().unwrap()];
    assert_eq!((evens[0].rank(), evens[1].rank()), (1, 0));
    assert_eq!((odds[0].rank(), odds[1].rank()), (1, 0));
    assert_eq!(evens[0].nranks(), 2);
    assert_ne!(evens[0].comm_id(), odds[0].comm_id());
    assert_ne!(evens[0].comm_id(), comms[0].comm_id());
    assert_eq!(evens[0].comm_id(), evens[1].comm_id());
    assert_eq!(evens[0].unique_id().unwrap(), comms[0].unique_id().unwrap());
    // AllReduce on both children at once from one thread.
    let sends: Vec<Vec<f32>> = (0..4).map(|r| vec![r as f32; 333]).collect();
    let mut recvs = vec![vec![0f32; 333]; 4];
    group_start().unwrap();
    for (r, rv) in recvs.iter_mut().enumerate() {
        let c = if r % 2 == 0 {
            &evens[r / 2]
        } else {
            &odds[r / 2]
        };
        enqueue(c, allreduce_args(&sends[r], rv)).unwrap();
    }
    group_end().unwrap();
    assert!(recvs[0].iter().all(|x| *x == 2.0));
    assert!(recvs[1].iter().all(|x| *x == 4.0));
    for c in evens.iter().chain(&odds) {
        c.destroy().unwrap();
    }
    destroy_all(&comms);
}

#[test]
fn nonblocking_init_reports_in_progress_then_works() {
    let id = ccl_core::bootstrap::get_unique_id().unwrap();
    let cfg = CommConfig {
        blocking: Some(false),
        ..CommConfig::default()
    };
    // Rank 0 alone: init cannot finish until rank 1 joins.
    let c0 = Comm::init_rank(2, id, 0, cfg.clone()).expect("nonblocking init returns");
    assert_eq!(c0.async_error().unwrap_err(), CclError::InProgress);
    let mut sink = [0f32; 4];
    let e = enqueue(&c0, allreduce_args(&[1.0; 4], &mut sink)).unwrap_err();
    assert_eq!(e.code(), ResultCode::InvalidUsage);
    let c1 = Comm::init_rank(2, id, 1, cfg).expect("init rank 1");
    let deadline = Instant::now() + Duration::from_secs(20);
    for c in [&c0, &c1] {
        while c.async_error() == Err(CclError::InProgress) {
            assert!(Instant::now() < deadline, "init did not finish");
            std::thread::sleep(Duration::from_millis(5));
        }
        c.async_error().expect("init ok");
    }
    let comms = [c0, c1];
    let mut out = vec![vec![0f32; 4]; 2];
    group_start().unwrap();
    for (c, o) in comms.iter().zip(out.iter_mut()) {
        enqueue(c, allreduce_args(&[1.5; 4], o)).unwrap();
    }
    group_end().unwrap();
    assert_eq!(out[1], vec![3.0; 4]);
    destroy_all(&comms);
}
