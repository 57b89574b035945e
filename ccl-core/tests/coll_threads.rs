//! Correctness matrix with ranks as threads of this process (shared-memory transport
//! between threads): every collective x dtype x reduction (Sum, Prod, Max, Min, Avg,
//! PreMulSum host-immediate and device-resident) x in/out-of-place x counts
//! {0, 1, 7, 1023, 65537} for 1..=8 ranks, plus ~4 MiB counts for a subset (AllReduce with
//! every reduction on Float32/Bfloat16/Int8, Sum on Float32 for Reduce/ReduceScatter, the
//! other collectives on Float32/Uint8; 1, 2, 3, 4, 5 and 8 ranks), each checked
//! against an independent reference and the probe counters against the schedule.
//!
//! With `CCL_TEST_FULL_MATRIX=1` the ~4 MiB counts run the whole cross product too (every
//! collective x dtype x reduction x placement, 1..=8 ranks); `scripts/test-all.sh` sets it.
//!
//! `NCCL_BUFFSIZE=64K` (8 KiB slots) so that the mid-size counts run many pipelined
//! iterations; odd rank counts use `minCTAs = 3` so that tiny operations also spread over
//! several (partly empty) channels. Communicators are built once per rank count.

mod common;

use std::sync::Arc;
use std::time::Instant;

use ccl_core::bootstrap::get_unique_id;
use ccl_core::{group_end, group_start, CollArgs, Comm, CommConfig, DataType};
use ccl_optype::CollKind;
use common::*;

const SMALL_COUNTS: [usize; 5] = [0, 1, 7, 1023, 65537];
const BIG_BYTES: usize = 4 << 20;

fn setup_env() {
    // Same value in every test of this binary, so concurrent tests agree.
    std::env::set_var("NCCL_BUFFSIZE", "65536");
}

fn make_comms(n: usize) -> Vec<Arc<Comm>> {
    setup_env();
    let id = get_unique_id().expect("unique id");
    let cfg = CommConfig {
        min_ctas: (n % 2 == 1).then_some(3),
        ..CommConfig::default()
    };
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let cfg = cfg.clone();
            std::thread::spawn(move || Comm::init_rank(n as i32, id, r as i32, cfg))
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("init thread").expect("init_rank"))
        .collect()
}

/// The case list of one rank (identical on all ranks but for PreMulSum op values, which
/// each rank creates on its own communicator in the same order).
/// Whether the ~4 MiB counts run the full cross product (`CCL_TEST_FULL_MATRIX=1`).
fn full_big_matrix() -> bool {
    std::env::var("CCL_TEST_FULL_MATRIX").is_ok_and(|v| v == "1")
}

fn cases(comm: &Comm, big: bool, dev_scalars: &mut [[u8; 8]]) -> Vec<Case> {
    let n = comm.nranks() as usize;
    let subset = big && !full_big_matrix();
    let mut v = Vec::new();
    let counts = |dt: DataType| -> Vec<usize> {
        if big {
            vec![BIG_BYTES / dt.size() + 3]
        } else {
            SMALL_COUNTS.to_vec()
        }
    };
    for (di, dt) in DataType::ALL.into_iter().enumerate() {
        let reds = reductions(comm, dt, &mut dev_scalars[di]);
        for coll in [
            CollKind::AllReduce,
            CollKind::Reduce,
            CollKind::ReduceScatter,
        ] {
            for &(red, op) in &reds {
                // Big counts: every reduction for AllReduce on a few types, Sum elsewhere.
                if subset
                    && !(coll == CollKind::AllReduce
                        && matches!(dt, DataType::Float32 | DataType::Bfloat16 | DataType::Int8)
                        || red == Red::Sum && dt == DataType::Float32)
                {
                    continue;
                }
                for in_place in [false, true] {
                    for count in counts(dt) {
                        v.push(Case {
                            coll,
                            dt,
                            red,
                            op,
                            count,
                            root: (count + 1) % n,
                            in_place,
                        });
                    }
                }
            }
        }
        for coll in [
            CollKind::Broadcast,
            CollKind::AllGather,
            CollKind::AlltoAll,
            CollKind::Gather,
            CollKind::Scatter,
        ] {
            if subset && dt != DataType::Float32 && dt != DataType::Uint8 {
                continue;
            }
            for in_place in [false, true] {
                for count in counts(dt) {
                    let count = if big && coll != CollKind::Broadcast {
                        count / n // per-rank count: keep the total near BIG_BYTES
                    } else {
                        count
                    };
                    v.push(Case {
                        coll,
                        dt,
                        red: Red::Sum,
                        op: SUM,
                        count,
                        root: (count + 2) % n,
                        in_place,
                    });
                }
            }
        }
    }
    v
}

/// Ring exchange with ncclSend/ncclRecv in one group: rank r sends `count` elements to
/// r+1 and receives from r-1 (even ranks post the receive first, odd ranks the send).
fn sendrecv_ring(comm: &Arc<Comm>, dt: DataType, count: usize) -> Result<(), String> {
    let n = comm.nranks() as usize;
    let r = comm.rank() as usize;
    let es = dt.size();
    let mut send = vec![0u8; (count * es).max(1)];
    let mut recv = vec![0xA5u8; (count * es).max(1)];
    fill(dt, Red::Sum, r, 0, &mut send[..count * es]);
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let s = CollArgs {
        kind: CollKind::Send,
        sendbuf: send.as_ptr() as usize,
        recvbuf: 0,
        count,
        dtype: dt as i32,
        op: 0,
        root: next as i32,
        stream: 0,
    };
    let rv = CollArgs {
        kind: CollKind::Recv,
        sendbuf: 0,
        recvbuf: recv.as_mut_ptr() as usize,
        root: prev as i32,
        ..s
    };
    let order = if r.is_multiple_of(2) {
        [rv, s]
    } else {
        [s, rv]
    };
    let before = comm.ops_started();
    group_start().map_err(|e| e.to_string())?;
    for a in order {
        ccl_core::enqueue(comm, a).map_err(|e| format!("enqueue {a:?}: {e}"))?;
    }
    group_end().map_err(|e| format!("sendrecv {dt:?} x{count} rank {r}: {e}"))?;
    for k in 0..count {
        let got = dec(dt, &recv[k * es..]);
        let want = input(dt, Red::Sum, prev, k);
        if got != want {
            return Err(format!(
                "sendrecv {dt:?} x{count} rank {r}: element {k} got {got} want {want}"
            ));
        }
    }
    if comm.ops_started() != before + 1 {
        return Err("a p2p group must count as one operation".into());
    }
    let want =
        ccl_core::internal::group::expected_counts(comm, &order).map_err(|e| e.to_string())?;
    check_probe(comm, before, &want).map_err(|e| format!("sendrecv {dt:?} x{count}: {e}"))
}

fn run_matrix(n: usize, big: bool) {
    let comms = make_comms(n);
    let t0 = Instant::now();
    let results: Vec<Result<usize, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let mut dev = vec![[0u8; 8]; DataType::ALL.len()];
                    let list = cases(comm, big, &mut dev);
                    let mut b = Bufs::default();
                    for c in &list {
                        run_case(comm, c, &mut b)?;
                    }
                    if !big {
                        for dt in DataType::ALL {
                            for count in SMALL_COUNTS {
                                sendrecv_ring(comm, dt, count)?;
                            }
                        }
                    } else if full_big_matrix() {
                        for dt in DataType::ALL {
                            sendrecv_ring(comm, dt, BIG_BYTES / dt.size() + 3)?;
                        }
                    }
                    Ok(list.len())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("rank thread panicked".into()))
            })
            .collect()
    });
    let errs: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    if !errs.is_empty() {
        // Abort so that ranks stuck waiting for a failed peer return.
        for c in &comms {
            let _ = c.abort();
        }
        panic!(
            "{n} ranks: {} rank(s) failed; first: {}",
            errs.len(),
            errs[0]
        );
    }
    for c in &comms {
        c.destroy().expect("destroy");
    }
    eprintln!(
        "{n} ranks{}: {} cases per rank in {:.1?}",
        if big { " (4 MiB)" } else { "" },
        results[0].as_ref().map_or(0, |v| *v),
        t0.elapsed()
    );
}

#[test]
fn matrix_1_rank() {
    run_matrix(1, false);
}

#[test]
fn matrix_2_ranks() {
    run_matrix(2, false);
}

#[test]
fn matrix_3_ranks() {
    run_matrix(3, false);
}

#[test]
fn matrix_4_ranks() {
    run_matrix(4, false);
}

#[test]
fn matrix_5_ranks() {
    run_matrix(5, false);
}

#[test]
fn matrix_6_ranks() {
    run_matrix(6, false);
}

#[test]
fn matrix_7_ranks() {
    run_matrix(7, false);
}

#[test]
fn matrix_8_ranks() {
    run_matrix(8, false);
}

#[test]
fn big_1_rank() {
    run_matrix(1, true);
}

#[test]
fn big_2_ranks() {
    run_matrix(2, true);
}

#[test]
fn big_3_ranks() {
    run_matrix(3, true);
}

#[test]
fn big_4_ranks() {
    run_matrix(4, true);
}

#[test]
fn big_5_ranks() {
    run_matrix(5, true);
}

#[test]
fn big_6_ranks() {
    if full_big_matrix() {
        run_matrix(6, true);
    }
}

#[test]
fn big_7_ranks() {
    if full_big_matrix() {
        run_matrix(7, true);
    }
}

#[test]
fn big_8_ranks() {
    run_matrix(8, true);
}

/// The block-wise output check finds the first wrong element wherever it is: in the first
/// period, past the first compared block, in the last partial block, for a start index
/// that is not a multiple of the period.
#[test]
fn the_output_check_finds_the_first_wrong_element() {
    let es = 4;
    let table: Vec<u8> = (0..PERIOD * es).map(|b| (b * 7 + 1) as u8).collect();
    let start = 17;
    let len = 64 * PERIOD * 3 + 11; // three whole blocks and a partial one
    let mut out = vec![0u8; len * es];
    for k in 0..len {
        let i = (start + k) % PERIOD;
        out[k * es..(k + 1) * es].copy_from_slice(&table[i * es..(i + 1) * es]);
    }
    assert_eq!(first_mismatch(&out, &table, start, es), None);
    assert_eq!(first_mismatch(&out, &table, start + 1, es), Some(0));
    for wrong in [0, 5, PERIOD - 1, 64 * PERIOD, 64 * PERIOD * 2 + 3, len - 1] {
        let mut bad = out.clone();
        bad[wrong * es + 2] ^= 0x10;
        assert_eq!(
            first_mismatch(&bad, &table, start, es),
            Some(wrong),
            "wrong element {wrong}"
        );
        let mut two = bad.clone();
        two[(len - 1) * es] ^= 1;
        assert_eq!(first_mismatch(&two, &table, start, es), Some(wrong));
    }
}
