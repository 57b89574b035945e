//! Probe overhead: AllReduce busbw with CCL-D probes on vs off (paused: the `CCLD_DISABLE=1`
//! path), interleaved in one run (docs/performance.md: target >= 0.997 at sizes >= 1 MiB,
//! >= 0.99 below).
//!
//! ```text
//! cargo run --release -p benches --bin probe-overhead -- [--ranks 2,4] [--max-bytes 256M] [--rounds 15] [--block-ms 100]
//! ```
//! Ranks are threads of this process (host backend). Each rank count has one communicator
//! with the defaults (frame and op-log updates, record thinning, the diagnostic thread and
//! the embedded analyzer) that runs in two states: `on`, and `off`, with probing paused
//! through the frame's mode flag (`Comm::set_probing(false)`: the collective path skips
//! every probe update exactly as with `CCLD_DISABLE=1`). One communicator for both, because
//! two communicators have their own FIFOs and buffers whose placement alone makes them
//! differ by up to a few percent at cache-resident sizes. Each round runs a block of
//! iterations (about `--block-ms`) in one state then the other, order alternating; each
//! round gives one paired ratio busbw(on) / busbw(off). `ratio` is the median of those
//! ratios and `q1..q3` their interquartile range, the noise of this machine: read a ratio
//! as met when its range reaches the target.
//!
//! The low-noise reading is `est.`, the ratio the probe's measured costs imply at each
//! size: off / (off + c_path + rec/op x c_rec), where
//! - `rec/op` is the share of the `on` communicator's operations whose completion was
//!   reported (the rest were left out by record thinning, `probe::thin`), counted over the
//!   size's rounds;
//! - `c_path` (the probe's work on the collective path of every operation) and `c_rec`
//!   (what one reported record costs the ranks, through the probe threads competing for
//!   their cores) are measured first, per rank count, where operations are mostly
//!   per-operation work, as medians of paired per-round differences over three times the
//!   rounds: on - off at 8 B is c_path + rec/op x c_rec; at 32 KiB a second
//!   communicator, `every` (`CCLD_RECORD_US=0`: every completion reported), runs against
//!   `on`, and every - on = (1 - rec/op) x c_rec. (32 KiB, not 8 B: there the probe threads
//!   keep up with a record per operation instead of dropping them, which would hide their
//!   cost; two communicators, so that difference carries their placement noise, about 1 %
//!   of an operation.) Both are printed per rank count.
//!
//! `diag %` and `rep. %` are the CPU the probe's own threads used over the size's rounds, in
//! percent of one core (`probe::diag::pipeline_cpu_ns`): the diagnostic thread (its sampling
//! tick, which backs off while no operation runs longer than `CCLD_SAMPLE_US`) and the
//! reporter with the embedded analyzer it feeds. They run for the whole process, during
//! the `off` blocks too; on a machine without spare cores (host backend, every core running
//! a rank) their work is taken from the ranks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use ccl_core::{enqueue, CollArgs, Comm, DataType};
use probe::CollKind;

fn parse_bytes(s: &str) -> Option<usize> {
    let (d, m) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    d.parse::<usize>().ok()?.checked_mul(m)
}

fn median(v: &mut [f64]) -> f64 {
    quantile(v, 0.5)
}

/// The `q` quantile (nearest rank) of `v`, sorting it.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// Iterations for a block of about `block_ms`: after one warm-up AllReduce of `count`
/// floats on `comms` (every rank in its own thread), doubles the number of timed
/// iterations until they take at least 20 ms on rank 0; at least 2 and at most 100,000.
fn calibrate(comms: &[Arc<Comm>], count: usize, block_ms: usize) -> usize {
    let barrier = Arc::new(Barrier::new(comms.len()));
    let per_ns = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = comms
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let (c, barrier, per_ns) = (Arc::clone(c), Arc::clone(&barrier), Arc::clone(&per_ns));
            std::thread::spawn(move || {
                let mut buf = vec![1.0f32; count.max(1)];
                allreduce(&c, &mut buf, count);
                let mut k = 1u64;
                loop {
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..k {
                        allreduce(&c, &mut buf, count);
                    }
                    let el = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    if r == 0 && (el >= 20_000_000 || k >= 100_000) {
                        per_ns.store((el / k).max(1), Ordering::Release);
                    }
                    barrier.wait();
                    if per_ns.load(Ordering::Acquire) > 0 {
                        return;
                    }
                    k *= 2;
                }
            })
        })
        .collect();
    for h in hs {
        let _ = h.join();
    }
    let per = per_ns.load(Ordering::Acquire).max(1) as f64 / 1e9;
    ((block_ms as f64 / 1e3 / per) as usize).clamp(2, 100_000)
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

fn main() {
    let mut ranks = vec![2usize, 4];
    let mut max_bytes = 256usize << 20;
    let mut rounds = 15usize;
    let mut block_ms = 100usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().unwrap_or_default();
        match a.as_str() {
            "--ranks" => ranks = v.split(',').filter_map(|x| x.parse().ok()).collect(),
            "--max-bytes" => max_bytes = parse_bytes(&v).unwrap_or(max_bytes),
            "--rounds" => rounds = v.parse().unwrap_or(rounds).max(1),
            "--block-ms" => block_ms = v.parse().unwrap_or(block_ms).max(1),
            _ => {
                eprintln!("usage: probe-overhead [--ranks 2,4] [--max-bytes 256M] [--rounds 15] [--block-ms 100]");
                std::process::exit(2);
            }
        }
    }
    println!("# probe overhead: AllReduce float32 sum, busbw ratio probes on / paused (the CCLD_DISABLE=1 path) on one communicator (median and q1..q3 of {rounds} interleaved paired rounds of ~{block_ms} ms)");
    for &n in &ranks {
        let init = |env: &[(&str, &str)]| {
            for (k, v) in env {
                std::env::set_var(k, v);
            }
            let c = Comm::init_all(n as i32, None).unwrap_or_else(|e| panic!("init: {e}"));
            for (k, _) in env {
                std::env::remove_var(k);
            }
            c
        };
        let on = init(&[]);
        let every = init(&[("CCLD_RECORD_US", "0")]);
        assert!(on[0].probe_enabled());
        let sizes = [
            8usize,
            64,
            512,
            4 << 10,
            32 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
            16 << 20,
            64 << 20,
            256 << 20,
        ];
        // The cost model (see the module docs). A second of operations first: what a fresh
        // communicator does once (first epoch unthinned, first batches, page faults) is not
        // a per-operation cost. Three times the rounds: these differences are small next to
        // an operation.
        let warm = calibrate(&on, 2, 1000);
        let _ = measure(&[(&on, true)], 2, warm, 1, &on);
        let (c8, q8) = {
            let iters = calibrate(&on, 2, block_ms);
            let m = measure(&[(&on, true), (&on, false)], 2, iters, 3 * rounds, &on);
            (m.paired_difference(0, 1), m.rec_per_op)
        };
        let (d32, q32, dropped) = {
            let count = (32 << 10) / 4;
            let iters = calibrate(&on, count, block_ms);
            let m = measure(
                &[(&every, true), (&on, true)],
                count,
                iters,
                3 * rounds,
                &on,
            );
            (m.paired_difference(0, 1), m.rec_per_op, m.dropped)
        };
        let c_rec = (d32 / (1.0 - q32).max(1e-9)).max(0.0);
        let c_path = (c8 - q8 * c_rec).max(0.0);
        println!(
            "# {n} ranks: c_path = {:.3} us per operation (on - off at 8 B: {:.3} us with {q8:.4} records per operation), c_rec = {:.3} us per record (every - on at 32 KiB: {:.3} us with {q32:.4}){}",
            c_path * 1e6,
            c8 * 1e6,
            c_rec * 1e6,
            d32 * 1e6,
            if dropped > 0 { format!("; {dropped} records dropped (queue full): c_rec is a lower bound") } else { String::new() }
        );
        println!(
            "{:>6} {:>12} {:>10} {:>10} {:>14} {:>14} {:>8} {:>17} {:>8} {:>8} {:>7} {:>7}",
            "ranks",
            "bytes",
            "off us",
            "on us",
            "off GB/s",
            "on GB/s",
            "ratio",
            "q1..q3",
            "rec/op",
            "est.",
            "diag %",
            "rep. %"
        );
        for &bytes in sizes.iter().filter(|&&b| b <= max_bytes) {
            let count = bytes / 4;
            let iters = calibrate(&on, count, block_ms);
            let m = measure(&[(&on, true), (&on, false)], count, iters, rounds, &on);
            let (rec_per_op, (diag_pct, report_pct)) = (m.rec_per_op, m.cpu_pct);
            let mut t_on = m.times[0].clone();
            let mut t_off = m.times[1].clone();
            let f = 2.0 * (n as f64 - 1.0) / n as f64 * bytes as f64 / 1e9;
            let mut ratios: Vec<f64> = t_on.iter().zip(&t_off).map(|(on, off)| off / on).collect();
            let (on_t, off_t) = (median(&mut t_on), median(&mut t_off));
            let est = off_t / (off_t + c_path + rec_per_op * c_rec);
            let (q1, q2, q3) = (
                quantile(&mut ratios, 0.25),
                quantile(&mut ratios, 0.5),
                quantile(&mut ratios, 0.75),
            );
            println!(
                "{n:>6} {bytes:>12} {:>10.2} {:>10.2} {:>14.4} {:>14.4} {q2:>8.4} {:>17} {rec_per_op:>8.4} {est:>8.4} {diag_pct:>7.2} {report_pct:>7.2}",
                off_t * 1e6,
                on_t * 1e6,
                f / off_t,
                f / on_t,
                format!("{q1:.4}..{q3:.4}")
            );
        }
        for c in on.iter().chain(every.iter()) {
            let _ = c.destroy();
        }
    }
}

/// Completions reported and left out by thinning, summed over the ranks of `comms`.
fn record_counts(comms: &[Arc<Comm>]) -> (u64, u64) {
    comms
        .iter()
        .filter_map(|c| c.probe_record_counts())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// What [`measure`] found.
struct Measured {
    /// Rank 0's time per operation of every block, per state.
    times: Vec<Vec<f64>>,
    /// CPU share (percent of one core) of the probe's diagnostic and reporter threads.
    cpu_pct: (f64, f64),
    /// Share of the counted communicator's operations whose completion was reported.
    rec_per_op: f64,
    /// Records dropped by the probe meanwhile (queue full).
    dropped: u64,
}

impl Measured {
    /// Median over the rounds of (time of state `a` - time of state `b`), per operation:
    /// each round's two blocks ran back to back, so slow drifts of the machine cancel.
    fn paired_difference(&self, a: usize, b: usize) -> f64 {
        let mut d: Vec<f64> = self.times[a]
            .iter()
            .zip(&self.times[b])
            .map(|(x, y)| x - y)
            .collect();
        median(&mut d)
    }
}

/// Runs `rounds` rounds of one block of `iters` AllReduces of `count` floats in each
/// state of `sets` (a communicator and whether its probing is on; all ranks in their own
/// threads, the states' order rotating from round to round) after one warm-up block each;
/// counts the reported and thinned completions of `counted`.
fn measure(
    sets: &[(&Vec<Arc<Comm>>, bool)],
    count: usize,
    iters: usize,
    rounds: usize,
    counted: &[Arc<Comm>],
) -> Measured {
    let records0 = record_counts(counted);
    let dropped0 = probe::diag::dropped();
    let (times, cpu_pct) = run_states(sets, count, iters, rounds);
    let records1 = record_counts(counted);
    let reported = records1.0 - records0.0;
    let total = reported + (records1.1 - records0.1);
    Measured {
        times,
        cpu_pct,
        rec_per_op: reported as f64 / total.max(1) as f64,
        dropped: probe::diag::dropped() - dropped0,
    }
}

/// The rounds of [`measure`]: rank 0's times per state and the probe threads' CPU share.
fn run_states(
    sets: &[(&Vec<Arc<Comm>>, bool)],
    count: usize,
    iters: usize,
    rounds: usize,
) -> (Vec<Vec<f64>>, (f64, f64)) {
    let n = sets[0].0.len();
    let barrier = Arc::new(Barrier::new(n));
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let comms: Vec<(Arc<Comm>, bool)> = sets
                .iter()
                .map(|(s, on)| (Arc::clone(&s[r]), *on))
                .collect();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut buf = vec![1.0f32; count.max(1)];
                let run = |(c, on): &(Arc<Comm>, bool), buf: &mut Vec<f32>| {
                    // Every rank switches its own rank before the barrier.
                    c.set_probing(*on);
                    barrier.wait();
                    let t = Instant::now();
                    for _ in 0..iters {
                        allreduce(c, buf, count);
                    }
                    let per_op = t.elapsed().as_secs_f64() / iters as f64;
                    c.set_probing(true);
                    per_op
                };
                for c in &comms {
                    run(c, &mut buf); // warm-up
                }
                let mut times = vec![Vec::with_capacity(rounds); comms.len()];
                let (cpu0, wall) = (probe::diag::pipeline_cpu_ns(), Instant::now());
                for k in 0..rounds {
                    for j in 0..comms.len() {
                        // Rotate the order so that no set always runs first or last.
                        let i = (j + k) % comms.len();
                        times[i].push(run(&comms[i], &mut buf));
                    }
                }
                let cpu1 = probe::diag::pipeline_cpu_ns();
                let wall_ns = wall.elapsed().as_nanos().max(1) as f64;
                let share = |a: u64, b: u64| b.saturating_sub(a) as f64 / wall_ns * 100.0;
                (times, (share(cpu0.0, cpu1.0), share(cpu0.1, cpu1.1)))
            })
        })
        .collect();
    let res: Vec<_> = hs
        .into_iter()
        .map(|h| h.join().unwrap_or_default())
        .collect();
    res.into_iter().next().unwrap_or_default()
}
