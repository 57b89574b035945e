//! The descriptor check with thread ranks: every kind of inconsistent call (another
//! collective, count, datatype, reduction op, root, a skipped operation, a zero-count call,
//! Send/Recv counts) fails on every rank instead of returning success with shifted data;
//! the detecting ranks get `ncclInvalidUsage` with a WARN line naming both ranks and both
//! descriptors, the others `ncclRemoteError` (poisoned); `ncclCommGetAsyncError` reports it,
//! and the probe reports FAILED records with failure INCONSISTENT (and the mismatch) or
//! PEER_FAILED. Consistent calls, zero-count ones included, still succeed.

use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use ccl_core::{enqueue, group_end, group_start, CollArgs, Comm, DataType, ResultCode};
use ccl_optype::CollKind;
use ccld_wire as wire;

static RECORDS: Mutex<Vec<wire::OpRecord>> = Mutex::new(Vec::new());

struct Capture;

impl probe::diag::Sink for Capture {
    fn deliver(&mut self, batch: wire::Batch) {
        RECORDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(batch.records);
    }
}

fn log_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ccld-desc-threads-{}.log", std::process::id()))
}

/// WARN lines to a file, probe records to [`RECORDS`] (once per test binary).
fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("NCCL_DEBUG", "WARN");
        std::env::set_var("NCCL_DEBUG_FILE", log_path());
        ccl_core::debug::init();
        probe::diag::start_with(probe::diag::DiagConfig::default(), || {
            Ok(Box::new(Capture) as Box<dyn probe::diag::Sink>)
        })
        .expect("diagnostic thread");
    });
}

/// One call of a rank (buffers owned by the test, large enough for any call below).
#[derive(Clone, Copy)]
struct Call {
    kind: CollKind,
    count: usize,
    dtype: DataType,
    op: i32,
    root: i32,
}

fn ar(count: usize) -> Call {
    Call {
        kind: CollKind::AllReduce,
        count,
        dtype: DataType::Float32,
        op: 0,
        root: -1,
    }
}

const BUF: usize = 1 << 16;

/// Runs each rank's calls in order on its own thread (a call that fails ends the rank's
/// sequence); returns each rank's results. Aborts everything and panics if a rank is
/// still blocked after 10 s (the check must never hang).
fn run(comms: &[Arc<Comm>], calls: Vec<Vec<Call>>) -> Vec<Vec<ccl_core::Result<()>>> {
    let hs: Vec<_> = calls
        .into_iter()
        .enumerate()
        .map(|(r, seq)| {
            let c = Arc::clone(&comms[r]);
            std::thread::spawn(move || {
                let send = vec![1u8; BUF * 8];
                let mut recv = vec![0u8; BUF * 8];
                let mut out = Vec::new();
                for k in seq {
                    let res = enqueue(
                        &c,
                        CollArgs {
                            kind: k.kind,
                            sendbuf: send.as_ptr() as usize,
                            recvbuf: recv.as_mut_ptr() as usize,
                            count: k.count,
                            dtype: k.dtype as i32,
                            op: k.op,
                            root: k.root,
                            stream: 0,
                        },
                    );
                    let failed = res.is_err();
                    out.push(res);
                    if failed {
                        break;
                    }
                }
                out
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while hs.iter().any(|h| !h.is_finished()) {
        if Instant::now() > deadline {
            for c in comms {
                let _ = c.abort();
            }
            panic!("a rank is still blocked 10 s after an inconsistent call");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    hs.into_iter().map(|h| h.join().expect("rank")).collect()
}

fn records_of(comm_id: u64, want: usize) -> Vec<wire::OpRecord> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let v: Vec<wire::OpRecord> = RECORDS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|r| {
                r.trace.as_ref().is_some_and(|t| t.comm_id == comm_id)
                    && r.state == wire::OpState::Failed as i32
            })
            .cloned()
            .collect();
        if v.len() >= want || want == 0 || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Checks the outcome of a mismatch where `culprit` called `bad` and the others `good`
/// (as their last call): nobody succeeded at that call, detectors got InvalidUsage whose
/// text names both ranks and descriptors, the others RemoteError; the communicators are
/// broken; WARN lines and probe records say the same.
fn check(comms: &[Arc<Comm>], res: &[Vec<ccl_core::Result<()>>], culprit: usize, bad: &str) {
    let n = comms.len();
    let mut detectors = Vec::new();
    for (r, calls) in res.iter().enumerate() {
        let last = calls.last().expect("a call");
        if last.is_ok() {
            // Only a rank that receives nothing in the operation (a Broadcast root) can
            // finish it before a peer detects the mismatch; it is poisoned, so it learns of
            // it from ncclCommGetAsyncError and its next call.
            let deadline = Instant::now() + Duration::from_secs(2);
            while comms[r].async_error().is_ok() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let e = comms[r].async_error().expect_err("poisoned rank");
            assert_eq!(e.code(), ResultCode::RemoteError, "rank {r}: {e}");
            continue;
        }
        let e = last
            .as_ref()
            .expect_err(&format!("rank {r}: an inconsistent call returned success"));
        match e.code() {
            ResultCode::InvalidUsage => {
                let t = e.to_string();
                assert!(t.contains("inconsistent call on comm"), "rank {r}: {t}");
                assert!(t.contains(&format!("rank {r} called")), "rank {r}: {t}");
                assert!(t.contains(" but rank "), "rank {r}: {t}");
                assert!(
                    t.contains(bad),
                    "rank {r}: culprit's descriptor {bad:?} in {t}"
                );
                detectors.push(r);
            }
            ResultCode::RemoteError => {
                assert!(
                    e.to_string().contains("detected an inconsistent call"),
                    "{e}"
                );
            }
            other => panic!("rank {r}: unexpected {other:?}: {e}"),
        }
    }
    assert!(!detectors.is_empty(), "some rank detects the mismatch");
    // The detectors are the culprit and/or the ranks it sends to.
    for &d in &detectors {
        let t = res[d].last().unwrap().as_ref().unwrap_err().to_string();
        assert!(
            d == culprit || t.contains(&format!("but rank {culprit} called")),
            "rank {d} must blame rank {culprit}: {t}"
        );
    }
    for (r, c) in comms.iter().enumerate() {
        assert!(c.async_error().is_err(), "rank {r}: async error reports it");
    }
    let log = std::fs::read_to_string(log_path()).unwrap_or_default();
    assert!(
        log.lines().any(|l| l.contains("NCCL WARN")
            && l.contains("inconsistent call on comm")
            && l.contains(bad)),
        "WARN line with both descriptors in:\n{log}"
    );
    // Records of failed operations are flushed before the call returns: the detectors'
    // are there without waiting.
    let now = records_of(comms[0].comm_id(), 0);
    for d in &detectors {
        assert!(
            now.iter()
                .any(|x| x.rank as usize == *d && x.failure() == wire::FailureCause::Inconsistent),
            "rank {d}: record flushed before the call returned"
        );
    }
    let finished: Vec<usize> = (0..n).filter(|r| res[*r].last().unwrap().is_ok()).collect();
    let recs = records_of(comms[0].comm_id(), n - finished.len());
    for r in (0..n).filter(|r| !finished.contains(r)) {
        let rec = recs
            .iter()
            .find(|x| x.rank as usize == r)
            .unwrap_or_else(|| panic!("rank {r}: no FAILED record in {recs:?}"));
        if detectors.contains(&r) {
            assert_eq!(rec.failure(), wire::FailureCause::Inconsistent, "rank {r}");
            let m = rec.mismatch.as_ref().expect("mismatch");
            assert!(m.local.is_some() && m.remote.is_some());
            assert_ne!(m.local, m.remote);
        } else {
            assert_eq!(rec.failure(), wire::FailureCause::PeerFailed, "rank {r}");
        }
    }
    for c in comms {
        let _ = c.abort();
    }
}

fn mismatch_case(n: usize, culprit: usize, good: Call, bad: Call, bad_text: &str) {
    setup();
    let comms = Comm::init_all(n as i32, None).expect("init");
    let calls = (0..n)
        .map(|r| vec![ar(64), if r == culprit { bad } else { good }])
        .collect();
    let res = run(&comms, calls);
    for (r, calls) in res.iter().enumerate() {
        assert!(
            calls[0].is_ok(),
            "rank {r}: the consistent first call succeeds"
        );
    }
    check(&comms, &res, culprit, bad_text);
}

#[test]
fn allgather_where_peers_allreduce() {
    let bad = Call {
        kind: CollKind::AllGather,
        count: 1024 / 4,
        op: -1,
        ..ar(0)
    };
    mismatch_case(4, 2, ar(1024), bad, "AllGather seq 1 count 256");
}

#[test]
fn wrong_count() {
    mismatch_case(4, 1, ar(4096), ar(2048), "AllReduce seq 1 count 2048");
}

#[test]
fn wrong_dtype_of_the_same_size() {
    let bad = Call {
        dtype: DataType::Int32,
        ..ar(1000)
    };
    mismatch_case(3, 0, ar(1000), bad, "count 1000 datatype 2");
}

#[test]
fn wrong_reduction_op() {
    let bad = Call { op: 3, ..ar(500) };
    mismatch_case(2, 1, ar(500), bad, "datatype 7 op 3");
}

#[test]
fn wrong_root() {
    let bc = |root| Call {
        kind: CollKind::Broadcast,
        root,
        ..ar(300)
    };
    mismatch_case(
        4,
        3,
        bc(0),
        bc(1),
        "Broadcast seq 1 count 300 datatype 7 op -1 root 1",
    );
    // The culprit is the root it names: a root that sends where its peers expect rank 0.
    mismatch_case(
        4,
        1,
        bc(0),
        bc(1),
        "Broadcast seq 1 count 300 datatype 7 op -1 root 1",
    );
}

#[test]
fn zero_count_where_peers_move_data() {
    mismatch_case(3, 1, ar(100), ar(0), "AllReduce seq 1 count 0");
}

#[test]
fn a_skipped_operation() {
    setup();
    let comms = Comm::init_all(4, None).expect("init");
    // Rank 3 skips the second of three AllReduces (the third has the same arguments as the
    // second had): without sequence numbers its third call would pair with the others'
    // second one and return success, with every later round shifted.
    let calls = (0..4)
        .map(|r| {
            if r == 3 {
                vec![ar(64), ar(256)]
            } else {
                vec![ar(64), ar(128), ar(256)]
            }
        })
        .collect();
    let res = run(&comms, calls);
    for (r, calls) in res.iter().enumerate() {
        assert!(calls[0].is_ok(), "rank {r}");
        assert_eq!(calls.len(), 2, "rank {r}: the round after the skip fails");
    }
    check(&comms, &res, 3, "AllReduce seq 1 count 256");
}

fn p2p(comms: &[Arc<Comm>], sends: usize, recvs: usize) -> Vec<ccl_core::Result<()>> {
    let calls = vec![
        vec![Call {
            kind: CollKind::Send,
            root: 1,
            ..ar(sends)
        }],
        vec![Call {
            kind: CollKind::Recv,
            root: 0,
            ..ar(recvs)
        }],
    ];
    run(comms, calls)
        .into_iter()
        .map(|mut v| v.remove(0))
        .collect()
}

#[test]
fn send_recv_count_mismatch_and_zero_count_pairs() {
    setup();
    let comms = Comm::init_all(2, None).expect("init");
    // Consistent pairs pass, zero-count ones included (a descriptor-only message).
    for (s, r) in [(100, 100), (0, 0), (7, 7)] {
        for (rank, x) in p2p(&comms, s, r).into_iter().enumerate() {
            assert!(x.is_ok(), "rank {rank}: {x:?}");
        }
    }
    let res = p2p(&comms, 100, 50);
    let e = res[1].as_ref().expect_err("receiver detects the count");
    assert_eq!(e.code(), ResultCode::InvalidUsage, "{e}");
    assert!(
        e.to_string()
            .contains("rank 1 called Send/Recv pair seq 3 count 50")
            && e.to_string()
                .contains("rank 0 called Send/Recv pair seq 3 count 100"),
        "{e}"
    );
    for c in &comms {
        let _ = c.abort();
    }
    // A zero-count Send where the peer receives data: caught too.
    let comms = Comm::init_all(2, None).expect("init");
    let res = p2p(&comms, 0, 10);
    let e = res[1].as_ref().expect_err("zero-count send caught");
    assert_eq!(e.code(), ResultCode::InvalidUsage, "{e}");
    for c in &comms {
        let _ = c.abort();
    }
}

#[test]
fn consistent_calls_still_succeed_with_right_data() {
    setup();
    let comms = Comm::init_all(3, None).expect("init");
    // Zero-count collectives, p2p between a pair only (their own sequence space: the
    // collectives after them still line up), then an AllReduce checked for its result.
    let res = run(&comms, (0..3).map(|_| vec![ar(0), ar(0)]).collect());
    assert!(res.iter().flatten().all(|x| x.is_ok()), "{res:?}");
    for _ in 0..3 {
        let calls = vec![
            vec![Call {
                kind: CollKind::Send,
                root: 2,
                ..ar(10)
            }],
            vec![],
            vec![Call {
                kind: CollKind::Recv,
                root: 0,
                ..ar(10)
            }],
        ];
        assert!(run(&comms, calls).iter().flatten().all(|x| x.is_ok()));
    }
    let sends: Vec<Vec<f32>> = (0..3).map(|r| vec![r as f32 + 1.0; 1000]).collect();
    let mut recvs = vec![vec![0f32; 1000]; 3];
    group_start().unwrap();
    for (r, c) in comms.iter().enumerate() {
        enqueue(
            c,
            CollArgs {
                kind: CollKind::AllReduce,
                sendbuf: sends[r].as_ptr() as usize,
                recvbuf: recvs[r].as_mut_ptr() as usize,
                count: 1000,
                dtype: DataType::Float32 as i32,
                op: 0,
                root: -1,
                stream: 0,
            },
        )
        .unwrap();
    }
    group_end().unwrap();
    assert!(recvs.iter().all(|v| v.iter().all(|x| *x == 6.0)));
    for c in &comms {
        assert!(c.async_error().is_ok());
        c.destroy().unwrap();
    }
}
