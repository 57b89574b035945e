//! Cost of the descriptor check (every message carries its operation's descriptor, checked
//! by the receiver): AllReduce busbw and latency with the check on vs off, interleaved in
//! one run on one communicator per rank count.
//!
//! ```text
//! cargo run --release -p benches --bin desc-check-cost -- [--ranks 2,4] [--max-bytes 64M] [--rounds 15] [--block-ms 100]
//! ```
//! Ranks are threads of this process (host backend). "off" uses a benchmark-only hook
//! (`ccl_core::internal::desc::bench_only_set_check`), not a user setting: the check cannot be
//! turned off in a job. Each round runs a block of iterations (about `--block-ms`) in one
//! state then the other, order alternating, and gives one paired ratio; the columns are the
//! median busbw ratio on/off (targets: >= 0.997 at >= 1 MiB) and the median extra latency
//! of "on" in percent (target at 8 B: <= 3 %), with the interquartile range of the ratios
//! (this machine's noise).

use std::sync::{Arc, Barrier};
use std::time::Instant;

use ccl_core::{enqueue, CollArgs, Comm, DataType};
use probe::CollKind;

/// Sizes measured: latency-bound, middle, and the bandwidth-bound range of the target.
const SIZES: [usize; 8] = [
    8,
    1 << 10,
    64 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    32 << 20,
    64 << 20,
];

fn parse_bytes(s: &str) -> Option<usize> {
    let (d, m) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    d.parse::<usize>().ok()?.checked_mul(m)
}

/// The `q` quantile (nearest rank) of `v`, sorting it.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

fn allreduce(c: &Arc<Comm>, buf: &mut [f32], count: usize) {
    let a = CollArgs {
        kind: CollKind::AllReduce,
        sendbuf: buf.as_ptr() as usize,
        recvbuf: buf.as_mut_ptr() as usize,
        count,
        dtype: DataType::Float32 as i32,
        op: 0,
        root: -1,
        stream: 0,
    };
    enqueue(c, a).unwrap_or_else(|e| panic!("allreduce: {e}"));
}

/// Runs `rounds` paired blocks of `iters` AllReduces of `count` floats; returns per round
/// (seconds per op with the check on, off). Rank 0 switches the check while every rank
/// waits at the barrier, so all ranks run each block in the same state.
fn measure(comms: &[Arc<Comm>], count: usize, iters: usize, rounds: usize) -> Vec<(f64, f64)> {
    let n = comms.len();
    let barrier = Arc::new(Barrier::new(n));
    let hs: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let (c, barrier) = (Arc::clone(c), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut buf = vec![1.0f32; count.max(1)];
                let mut out = Vec::with_capacity(rounds);
                for round in 0..rounds {
                    let mut t = [0f64; 2];
                    let order = if round % 2 == 0 {
                        [true, false]
                    } else {
                        [false, true]
                    };
                    for on in order {
                        if r == 0 {
                            ccl_core::internal::desc::bench_only_set_check(on);
                        }
                        barrier.wait();
                        let t0 = Instant::now();
                        for _ in 0..iters {
                            allreduce(&c, &mut buf, count);
                        }
                        t[usize::from(!on)] = t0.elapsed().as_secs_f64() / iters as f64;
                        barrier.wait();
                    }
                    out.push((t[0], t[1]));
                }
                out
            })
        })
        .collect();
    let mut per_rank: Vec<Vec<(f64, f64)>> =
        hs.into_iter().map(|h| h.join().expect("rank")).collect();
    ccl_core::internal::desc::bench_only_set_check(true);
    per_rank.swap_remove(0)
}

fn main() {
    let mut ranks = vec![2usize, 4];
    let mut max_bytes = 64usize << 20;
    let mut rounds = 15usize;
    let mut block_ms = 100usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().unwrap_or_default();
        match a.as_str() {
            "--ranks" => ranks = v.split(',').filter_map(|x| x.parse().ok()).collect(),
            "--max-bytes" => max_bytes = parse_bytes(&v).unwrap_or(max_bytes),
            "--rounds" => rounds = v.parse().unwrap_or(rounds).max(2),
            "--block-ms" => block_ms = v.parse().unwrap_or(block_ms).max(1),
            _ => {
                eprintln!("usage: desc-check-cost [--ranks 2,4] [--max-bytes 64M] [--rounds 15] [--block-ms 100]");
                std::process::exit(2);
            }
        }
    }
    println!(
        "{:>6} {:>10} {:>12} {:>12} {:>8} {:>17} {:>10}",
        "ranks", "bytes", "busbw on", "busbw off", "ratio", "q1..q3", "lat +%"
    );
    for &n in &ranks {
        let comms = Comm::init_all(n as i32, None).expect("init");
        for bytes in SIZES.into_iter().filter(|b| *b <= max_bytes) {
            let count = bytes / 4;
            // Calibrate: one warm-up block of 3 paired iterations, then size the blocks.
            let warm = measure(&comms, count, 3, 2);
            let per = warm.iter().map(|x| x.1).fold(f64::MAX, f64::min).max(1e-7);
            let iters = ((block_ms as f64 / 1e3 / per) as usize).clamp(2, 100_000);
            let rs = measure(&comms, count, iters, rounds);
            let mut ratios: Vec<f64> = rs.iter().map(|(on, off)| off / on).collect();
            let mut on: Vec<f64> = rs.iter().map(|x| x.0).collect();
            let mut off: Vec<f64> = rs.iter().map(|x| x.1).collect();
            let ratio = quantile(&mut ratios, 0.5);
            let (q1, q3) = (quantile(&mut ratios, 0.25), quantile(&mut ratios, 0.75));
            let factor = 2.0 * (n as f64 - 1.0) / n as f64;
            let bw = |t: f64| bytes as f64 * factor / t / 1e9;
            let (ton, toff) = (quantile(&mut on, 0.5), quantile(&mut off, 0.5));
            println!(
                "{n:>6} {bytes:>10} {:>10.3}GB {:>10.3}GB {ratio:>8.4} {q1:>8.4}..{q3:<8.4} {:>9.2}%",
                bw(ton),
                bw(toff),
                (1.0 / ratio - 1.0) * 100.0
            );
        }
        for c in &comms {
            c.destroy().expect("destroy");
        }
    }
}
