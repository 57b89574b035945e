//! Probe overhead: AllReduce busbw with CCL-D probes on vs `CCLD_DISABLE=1`, interleaved in
//! one run (design.md section 8: target >= 0.997 at sizes >= 1 MiB, >= 0.99 below).
//!
//! ```text
//! cargo run --release -p benches --bin probe-overhead -- [--ranks 2,4] [--max-bytes 256M] [--rounds 7]
//! ```
//! Ranks are threads of this process (host backend). For every size two communicators of
//! each rank count exist side by side, one initialised with `CCLD_DISABLE=1` (no frame
//! updates, no registration) and one with probes on (frame and op-log updates, completion
//! messages, sampled by the diagnostic thread with the embedded analyzer). Each round runs a
//! block of iterations on one then the other (order alternating); the printed ratio is
//! median(busbw on) / median(busbw off). The diagnostic thread runs for the whole process, so
//! its (small) CPU share weighs on both sides; the ratio isolates the per-operation cost.

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
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut ranks = vec![2usize, 4];
    let mut max_bytes = 256usize << 20;
    let mut rounds = 7usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().unwrap_or_default();
        match a.as_str() {
            "--ranks" => ranks = v.split(',').filter_map(|x| x.parse().ok()).collect(),
            "--max-bytes" => max_bytes = parse_bytes(&v).unwrap_or(max_bytes),
            "--rounds" => rounds = v.parse().unwrap_or(rounds).max(1),
            _ => {
                eprintln!("usage: probe-overhead [--ranks 2,4] [--max-bytes 256M] [--rounds 7]");
                std::process::exit(2);
            }
        }
    }
    println!("# probe overhead: AllReduce float32 sum, busbw ratio probes-on / CCLD_DISABLE=1 (median of {rounds} interleaved rounds)");
    println!(
        "{:>6} {:>12} {:>14} {:>14} {:>8}",
        "ranks", "bytes", "off GB/s", "on GB/s", "ratio"
    );
    for &n in &ranks {
        std::env::set_var("CCLD_DISABLE", "1");
        let off = Comm::init_all(n as i32, None).unwrap_or_else(|e| panic!("init: {e}"));
        std::env::remove_var("CCLD_DISABLE");
        let on = Comm::init_all(n as i32, None).unwrap_or_else(|e| panic!("init: {e}"));
        assert!(on[0].probe_enabled() && !off[0].probe_enabled());
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
        for &bytes in sizes.iter().filter(|&&b| b <= max_bytes) {
            let count = bytes / 4;
            // Enough iterations for ~20 ms per block at 1 GB/s, at least 2, at most 1000.
            let iters = (20_000_000 / bytes.max(1)).clamp(2, 1000);
            let barrier = Arc::new(Barrier::new(n));
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let (c_on, c_off) = (Arc::clone(&on[r]), Arc::clone(&off[r]));
                    let barrier = Arc::clone(&barrier);
                    std::thread::spawn(move || {
                        let mut buf = vec![1.0f32; count.max(1)];
                        let mut t_on = Vec::new();
                        let mut t_off = Vec::new();
                        let run = |c: &Arc<Comm>, buf: &mut Vec<f32>| {
                            barrier.wait();
                            let t = Instant::now();
                            for _ in 0..iters {
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
                            t.elapsed().as_secs_f64() / iters as f64
                        };
                        run(&c_on, &mut buf); // warm-up
                        run(&c_off, &mut buf);
                        for k in 0..rounds {
                            if k % 2 == 0 {
                                t_on.push(run(&c_on, &mut buf));
                                t_off.push(run(&c_off, &mut buf));
                            } else {
                                t_off.push(run(&c_off, &mut buf));
                                t_on.push(run(&c_on, &mut buf));
                            }
                        }
                        (t_on, t_off)
                    })
                })
                .collect();
            let res: Vec<_> = hs
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect();
            let (mut t_on, mut t_off) = res.into_iter().next().unwrap_or_default();
            let f = 2.0 * (n as f64 - 1.0) / n as f64 * bytes as f64 / 1e9;
            let (on_t, off_t) = (median(&mut t_on), median(&mut t_off));
            println!(
                "{n:>6} {bytes:>12} {:>14.4} {:>14.4} {:>8.4}",
                f / off_t,
                f / on_t,
                off_t / on_t
            );
        }
        for c in on.iter().chain(off.iter()) {
            let _ = c.destroy();
        }
    }
}
