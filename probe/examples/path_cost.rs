//! The probe's work on the collective path of one operation, in nanoseconds, step by step
//! (what the host executor calls per operation with probing on), one thread, no
//! communicator: a low-noise companion of `probe-overhead`'s `c_path`.
//!
//! ```text
//! cargo run --release -p probe --example path_cost [-- ITERATIONS]
//! ```
//! Each step runs ITERATIONS times (default 2,000,000) in 9 rounds; the median round is
//! printed, with the whole sequence last (its start time given, as the executor's peer
//! check reads it anyway; its end read from the clock only where `Source::end_time` says).

use std::sync::Arc;
use std::time::Instant;

use probe::{Algo, CollKind, Frame, Identity, OpLog, OpSeq, OpTypeSet, Proto, SeqSpace};

fn info() -> OpTypeSet {
    OpTypeSet {
        coll: CollKind::AllReduce,
        algo: Algo::Tree,
        proto: Proto::Simple,
        dtype: 7,
        redop: 0,
        count: 2,
        bytes: 8,
        root: -1,
        peer: -1,
        n_channels: 1,
    }
}

/// Median over 9 rounds of the time per call of `f` (called with a growing counter).
fn time(iters: u64, counter: &mut u64, mut f: impl FnMut(u64)) -> f64 {
    let mut rounds: Vec<f64> = (0..9)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f(*counter);
                *counter += 1;
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[4]
}

fn main() {
    let iters: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let frame = Arc::new(Frame::new(2));
    let log = Arc::new(OpLog::new());
    let ident = Identity {
        comm_id: 0x1234,
        rank: 0,
        nranks: 2,
        device: -1,
        ring_prev: 1,
        ring_next: 1,
    };
    let src = probe::diag::register_with_target(
        ident,
        Arc::clone(&frame),
        Arc::clone(&log),
        probe::diag::RankGroup::new(),
        std::time::Duration::from_micros(100),
    );
    let info = info();
    let mut c = 0u64;
    let seq = |n: u64| OpSeq {
        space: SeqSpace::Collective,
        number: n,
        p2p: Vec::new(),
    };
    let rows: Vec<(&str, f64)> = vec![
        (
            "is_measuring",
            time(iters, &mut c, |_| {
                std::hint::black_box(frame.is_measuring());
            }),
        ),
        (
            "start_op (sequence, thinning)",
            time(iters, &mut c, |n| {
                std::hint::black_box(src.start_op(n, &seq(n), n));
            }),
        ),
        (
            "begin_op + add_expected",
            time(iters, &mut c, |n| {
                let b = frame.begin_op(0x1234, n, 1);
                frame.add_expected(b, 0, 1, 1);
            }),
        ),
        (
            "now_ns",
            time(iters, &mut c, |_| {
                std::hint::black_box(probe::now_ns());
            }),
        ),
        (
            "op_log start + finish",
            time(iters, &mut c, |n| {
                log.start(n, &info, n);
                std::hint::black_box(log.finish(n, probe::EndTime::exact(n + 1), true));
            }),
        ),
        (
            "whole sequence",
            time(iters, &mut c, |n| {
                if frame.is_measuring() {
                    // (The executor reads the start time anyway, for its peer check.)
                    let t = n;
                    let timed = src.start_op(n, &seq(n), t);
                    let b = frame.begin_op(0x1234, n, 1);
                    frame.add_expected(b, 0, 1, 1);
                    log.start(n, &info, t);
                    frame.add_send(b, 0, 1);
                    frame.add_recv(b, 0, 1);
                    let end = src.end_time(n, t, timed, true);
                    if let Some(fin) = log.finish(n, end, true) {
                        src.op_done(&fin);
                    }
                }
            }),
        ),
    ];
    // op_done alone needs a finished entry: time it after the sequence above filled the log.
    for (name, ns) in rows {
        println!("{name:<26} {ns:>7.1} ns");
    }
}
