//! Kernel-level GPU self-test (scripts/gpu-suite.sh runs it): every collective on 1, 2, 4
//! and 8 ranks sharing the current GPU, results and probe counters checked, then AllReduce
//! bus bandwidth next to the device's copy bandwidth. Prints one line per case and exits
//! 0 (all passed), 1 (a failure) or 2 (no device / built without kernels).
//!
//! Every case runs with the Simple and the LL protocol (LL: FIFO slots start with stale
//! words that look like flags, so the kernels' scrub is checked too).
//!
//! Usage: device_selftest [--quick]

use std::time::Duration;

use ccl_core::device::{choose_backend, probe_device, selftest, Backend};
use ccl_core::internal::proto::Proto;
use ccl_core::DataType;
use ccl_optype::CollKind;

fn main() {
    // 8 ranks as threads need 16 hardware queues (see ccl_core::device::queues).
    ccl_core::device::queues::most_queues_for_this_program();
    let quick = std::env::args().any(|a| a == "--quick");
    let (backend, why) = choose_backend(&probe_device());
    println!("# {why}");
    if !matches!(backend, Backend::Device { .. }) {
        println!("SKIP: no usable device");
        std::process::exit(2);
    }
    let colls = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
        CollKind::Gather,
        CollKind::Scatter,
    ];
    let counts: &[usize] = if quick {
        &[1, 1000]
    } else {
        &[1, 7, 1000, 65_536, 1_000_003]
    };
    let mut failed = 0;
    let mut total = 0;
    for n in [1usize, 2, 4, 8] {
        for coll in colls {
            for dtype in [DataType::Float32, DataType::Int32] {
                for &count in counts {
                    for proto in [Proto::Simple, Proto::Ll] {
                        let nch = if count > 100_000 { 4 } else { 1 + count % 2 };
                        total += 1;
                        let r = selftest::run_case_proto(
                            coll,
                            dtype,
                            count,
                            n,
                            nch,
                            64 * 1024,
                            proto,
                            Duration::from_secs(20),
                        );
                        let pn = proto.name();
                        match r {
                        Ok(c) => println!(
                            "PASS {:<13} {:<6} {pn:<6} ranks {n} count {count:>8} channels {nch} {:>9.3} ms counters {:?}",
                            coll.name(),
                            dtype.name(),
                            c.elapsed.as_secs_f64() * 1e3,
                            c.counters.first().map(|v| v.iter().map(|x| x.0).collect::<Vec<_>>())
                        ),
                        Err(e) => {
                            failed += 1;
                            println!("FAIL {:<13} {:<6} {pn:<6} ranks {n} count {count:>8}: {e}", coll.name(), dtype.name());
                        }
                    }
                    }
                }
            }
        }
    }
    // Bandwidth: AllReduce of 256 MiB float on n ranks of this device vs the copy bandwidth.
    let bytes = if quick { 16 << 20 } else { 256 << 20 };
    match selftest::copy_bandwidth(bytes, 20) {
        Ok(g) => println!("BW copy {:.1} GB/s (device-to-device, read+write)", g),
        Err(e) => println!("BW copy failed: {e}"),
    }
    for n in [2usize, 4, 8] {
        let count = bytes / 4;
        match selftest::run_case(
            CollKind::AllReduce,
            DataType::Float32,
            count,
            n,
            8,
            512 * 1024,
            Duration::from_secs(60),
        ) {
            Ok(c) => {
                let t = c.elapsed.as_secs_f64();
                let algbw = bytes as f64 / t / 1e9;
                let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
                println!(
                    "BW allreduce ranks {n} bytes {bytes} time {:.3} ms algbw {algbw:.2} GB/s busbw {busbw:.2} GB/s (one launch, includes launch latency)",
                    t * 1e3
                );
            }
            Err(e) => {
                failed += 1;
                println!("FAIL allreduce bandwidth ranks {n}: {e}");
            }
        }
    }
    println!("# {} of {total} cases passed", total - failed);
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
