//! `ncclCommAbort` from another thread unblocks ranks stuck in an operation whose peer
//! never joins: in a ring collective, and in a p2p send whose receiver never posts (stuck
//! in the lazy connection handshake). Bound: 1 s after the abort.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::{enqueue, CclError, CollArgs, Comm, DataType, ResultCode};
use ccl_optype::CollKind;

fn run_blocked_then_abort(
    comms: Vec<Arc<Comm>>,
    stuck: Vec<usize>,
    args: impl Fn(usize) -> CollArgs,
) {
    let started = Instant::now();
    let hs: Vec<_> = stuck
        .iter()
        .map(|&r| {
            let c = Arc::clone(&comms[r]);
            let a = args(r);
            std::thread::spawn(move || {
                let res = enqueue(&c, a);
                (res, Instant::now())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(400));
    for h in &hs {
        assert!(
            !h.is_finished(),
            "the operation must be blocked on the missing rank"
        );
    }
    let abort_at = Instant::now();
    for &r in &stuck {
        comms[r].abort().expect("abort");
    }
    for h in hs {
        let (res, at) = h.join().expect("rank thread");
        let e = res.expect_err("aborted op must fail");
        assert_eq!(e.code(), ResultCode::RemoteError, "{e}");
        assert!(matches!(e, CclError::Aborted(_)), "{e}");
        let took = at.saturating_duration_since(abort_at);
        assert!(
            took < Duration::from_secs(1),
            "returned {took:?} after abort"
        );
    }
    for &r in &stuck {
        assert!(comms[r].async_error().is_err());
        assert_eq!(
            enqueue(&comms[r], args(r)).unwrap_err().code(),
            ResultCode::InvalidUsage,
            "ops on an aborted comm are refused"
        );
    }
    for (r, c) in comms.iter().enumerate() {
        if !stuck.contains(&r) {
            c.destroy().expect("destroy idle rank");
        }
    }
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn abort_unblocks_a_collective_whose_peer_never_joins() {
    let comms = Comm::init_all(3, None).expect("init_all");
    let bufs: Vec<Vec<f32>> = (0..3).map(|_| vec![1.0; 1 << 16]).collect();
    let ptrs: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
    run_blocked_then_abort(comms, vec![0, 1], |r| CollArgs {
        kind: CollKind::AllReduce,
        sendbuf: ptrs[r],
        recvbuf: ptrs[r],
        count: 1 << 16,
        dtype: DataType::Float32 as i32,
        op: 0,
        root: -1,
        stream: 0,
    });
    drop(bufs);
}

#[test]
fn abort_unblocks_a_send_stuck_in_the_p2p_handshake() {
    let comms = Comm::init_all(2, None).expect("init_all");
    let buf = vec![7u8; 4096];
    let p = buf.as_ptr() as usize;
    run_blocked_then_abort(comms, vec![0], move |_| CollArgs {
        kind: CollKind::Send,
        sendbuf: p,
        recvbuf: 0,
        count: 4096,
        dtype: DataType::Uint8 as i32,
        op: 0,
        root: 1,
        stream: 0,
    });
    drop(buf);
}

#[test]
fn abort_ends_a_nonblocking_init_that_waits_for_missing_ranks() {
    let id = ccl_core::bootstrap::get_unique_id().unwrap();
    let cfg = ccl_core::CommConfig {
        blocking: Some(false),
        ..Default::default()
    };
    let c = Comm::init_rank(2, id, 0, cfg).expect("returns at once");
    assert_eq!(c.async_error().unwrap_err(), CclError::InProgress);
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    c.abort().expect("abort");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "abort took {:?}",
        t.elapsed()
    );
    let e = c.async_error().unwrap_err();
    assert_ne!(e, CclError::InProgress);
}

#[test]
fn abort_of_a_split_child_unblocks_its_p2p_handshake() {
    let parents = Comm::init_all(2, None).expect("init_all");
    let children: Vec<Arc<Comm>> = std::thread::scope(|s| {
        let hs: Vec<_> = parents
            .iter()
            .map(|p| s.spawn(move || p.split(0, 0, Default::default()).unwrap().unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let buf = vec![7u8; 64];
    let p = buf.as_ptr() as usize;
    run_blocked_then_abort(children, vec![0], move |_| CollArgs {
        kind: CollKind::Send,
        sendbuf: p,
        recvbuf: 0,
        count: 64,
        dtype: DataType::Uint8 as i32,
        op: 0,
        root: 1,
        stream: 0,
    });
    // The parents are unaffected.
    for c in &parents {
        c.async_error().expect("parent still fine");
        c.destroy().unwrap();
    }
    drop(buf);
}
