//! Low-precision reductions (issue 18 part 2): how fast the host backend reduces f16, bf16
//! and fp8 compared with f32, side by side in one run.
//!
//! ```text
//! cargo build --release -p ccl-ffi -p nccl-tests-compat -p benches
//! target/release/lowp-bench [--rounds 7] [--ranks 2] [--sizes 131072,2097152,33554432] [--kernel-bytes 1048576]
//! ```
//!
//! 1. Kernel: `Reducer::combine` (dst = a + b, sum) over `--kernel-bytes` of each type, in
//!    GB/s of output bytes, against an element-at-a-time loop written like the code before
//!    the block path (decode one element, add in f32, round, store), interleaved rounds,
//!    median.
//! 2. AllReduce: our `all_reduce_perf` (`ccl-run -n RANKS`, processes, `-c 1`) in `float`,
//!    `bfloat16`, `half` and `f8e4m3` at the same byte sizes, order rotating per round; median busbw
//!    of each and the ratios to f32 (issue 18's target: bf16 >= 0.8).

use std::hint::black_box;
use std::time::Instant;

use benches::peers::{median, release_dir, run_ours};
use ccl_core::reduce::{self, Reducer};
use ccl_core::types::{DataType, RedOpKind};

const USAGE: &str = "usage: lowp-bench [--rounds 7] [--ranks 2] \
    [--sizes 131072,2097152,33554432] [--kernel-bytes 1048576]";

/// The element-at-a-time sum, as the reduction ran before the block path (the baseline).
fn scalar_sum(d: DataType, dst: &mut [u8], a: &[u8], b: &[u8]) {
    let n = d.size();
    for ((o, x), y) in dst
        .chunks_exact_mut(n)
        .zip(a.chunks_exact(n))
        .zip(b.chunks_exact(n))
    {
        match d {
            DataType::Float32 => {
                let v = f32::from_le_bytes([x[0], x[1], x[2], x[3]])
                    + f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
                o.copy_from_slice(&v.to_le_bytes());
            }
            DataType::Float16 => {
                let v = reduce::f16_bits_to_f32(u16::from_le_bytes([x[0], x[1]]))
                    + reduce::f16_bits_to_f32(u16::from_le_bytes([y[0], y[1]]));
                o.copy_from_slice(&reduce::f32_to_f16_bits(v).to_le_bytes());
            }
            DataType::Bfloat16 => {
                let v = reduce::bf16_bits_to_f32(u16::from_le_bytes([x[0], x[1]]))
                    + reduce::bf16_bits_to_f32(u16::from_le_bytes([y[0], y[1]]));
                o.copy_from_slice(&reduce::f32_to_bf16_bits(v).to_le_bytes());
            }
            DataType::Float8e4m3 => {
                o[0] = reduce::f32_to_e4m3(reduce::e4m3_to_f32(x[0]) + reduce::e4m3_to_f32(y[0]))
            }
            DataType::Float8e5m2 => {
                o[0] = reduce::f32_to_e5m2(reduce::e5m2_to_f32(x[0]) + reduce::e5m2_to_f32(y[0]))
            }
            _ => unreachable!("not benchmarked"),
        }
    }
}

/// GB/s of output bytes of `f` over `bytes`, one timed batch of about 20 ms.
fn time_gbps(bytes: usize, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    let mut reps = 0usize;
    while t.elapsed().as_secs_f64() < 0.02 {
        f();
        reps += 1;
    }
    (bytes * reps) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut rounds, mut ranks, mut kbytes) = (7usize, 2usize, 1usize << 20);
    let mut sizes: Vec<u64> = vec![131_072, 2_097_152, 33_554_432];
    let known = ["--rounds", "--ranks", "--sizes", "--kernel-bytes"];
    for (opt, v) in benches::cli::option_pairs("lowp-bench", USAGE, &args, &known) {
        let num = |v: &str| benches::cli::number("lowp-bench", USAGE, &opt, v);
        match opt.as_str() {
            "--rounds" => rounds = num(&v) as usize,
            "--ranks" => ranks = num(&v) as usize,
            "--kernel-bytes" => kbytes = num(&v) as usize,
            _ => sizes = v.split(',').map(num).collect(),
        }
    }
    if rounds == 0 || ranks == 0 || kbytes == 0 || sizes.contains(&0) {
        benches::cli::fail(
            "lowp-bench",
            USAGE,
            "rounds, ranks, kernel bytes and sizes must be >= 1",
        );
    }

    println!("# kernel: dst = a + b over {kbytes} bytes, GB/s of output, median of {rounds} interleaved rounds");
    let types = [
        DataType::Float32,
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];
    let a: Vec<u8> = (0..kbytes).map(|i| (i * 7 % 61) as u8).collect();
    let b: Vec<u8> = (0..kbytes).map(|i| (i * 13 % 59) as u8).collect();
    let mut dst = vec![0u8; kbytes];
    let mut block = vec![Vec::new(); types.len()];
    let mut elem = vec![Vec::new(); types.len()];
    for _ in 0..rounds {
        for (k, &d) in types.iter().enumerate() {
            let r = Reducer::new(d, RedOpKind::Sum, None, 2).expect("reducer");
            block[k].push(time_gbps(kbytes, || {
                r.combine(black_box(&mut dst), black_box(&a), black_box(&b))
            }));
            elem[k].push(time_gbps(kbytes, || {
                scalar_sum(d, black_box(&mut dst), black_box(&a), black_box(&b))
            }));
        }
    }
    println!("| type | Reducer::combine GB/s | element loop GB/s | speed-up |");
    println!("|---|---|---|---|");
    for (k, d) in types.iter().enumerate() {
        let (x, y) = (median(&block[k]), median(&elem[k]));
        println!("| {} | {x:.2} | {y:.2} | {:.1}x |", d.name(), x / y);
    }

    let dir = release_dir();
    println!(
        "\n# AllReduce sum, {ranks} ranks as processes (ccl-run), -c 1, busbw GB/s, median of {rounds} rounds, order of float / bfloat16 / half / f8e4m3 rotating"
    );
    let dts = ["float", "bfloat16", "half", "f8e4m3"];
    let mut bw = vec![vec![Vec::new(); sizes.len()]; dts.len()];
    for round in 0..rounds {
        for (i, &s) in sizes.iter().enumerate() {
            for k in 0..dts.len() {
                let d = (k + round) % dts.len();
                let rows = run_ours(&dir, ranks, (s, s, 2), dts[d], 20).unwrap_or_else(|e| {
                    eprintln!("lowp-bench: {e}");
                    std::process::exit(1)
                });
                bw[d][i].push(rows[0].busbw);
            }
        }
    }
    println!(
        "| bytes | float busbw | bfloat16 busbw | half busbw | f8e4m3 busbw | bf16 / f32 | half / f32 | f8e4m3 / f32 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (i, s) in sizes.iter().enumerate() {
        let m: Vec<f64> = (0..dts.len()).map(|d| median(&bw[d][i])).collect();
        println!(
            "| {s} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            m[0],
            m[1],
            m[2],
            m[3],
            m[1] / m[0],
            m[2] / m[0],
            m[3] / m[0]
        );
    }
}
