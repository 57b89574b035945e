//! `e2e-latency`: detection and location latency of every anomaly class, end to end
//! (ranks as threads, host backend, embedded analyzer, `CCLD_INJECT`).
//!
//! ```text
//! cargo run --release -p benches --bin e2e-latency -- [--ranks 4]
//! ```
//! Detection latency = analyzer time of the diagnosis - onset of the anomaly as the analyzer
//! saw it (`detected_at_ns - onset_ns`); it is bounded below by the hang threshold (hangs) or
//! by `CCLD_SLOW_REPEAT` detection windows (slow). Location latency = time from the moment
//! the anomaly became detectable to the diagnosis (`location_latency_ns`); the CPU cost of
//! the decision tree itself is `Evidence::location_cost_ns`. Windows are shortened as in the
//! end-to-end tests (hang 1.5 s, window 0.5 s x 3).

use std::time::Duration;

use benches::e2e_harness::run_case;
use ccld_wire::{self as wire, AnomalyClass};
use probe::CollKind;

fn main() {
    const USAGE: &str = "usage: e2e-latency [--ranks 4]";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut n = 4usize;
    for (opt, v) in benches::cli::option_pairs("e2e-latency", USAGE, &args, &["--ranks"]) {
        n = benches::cli::number("e2e-latency", USAGE, &opt, &v) as usize;
    }
    if !(2..=16).contains(&n) {
        benches::cli::fail("e2e-latency", USAGE, &format!("--ranks {n}: need 2 to 16"));
    }
    println!(
        "# e2e latency, {n} ranks, AllReduce 64 KiB, root rank {}",
        n / 2
    );
    println!(
        "{:<22} {:>6} {:>6} {:>14} {:>14} {:>14}",
        "class", "got", "rank", "detect (ms)", "locate (ms)", "loc. cpu (us)"
    );
    for class in [
        AnomalyClass::H1NotEntered,
        AnomalyClass::H2Inconsistent,
        AnomalyClass::H3Hardware,
        AnomalyClass::S1ComputationSlow,
        AnomalyClass::S2CommunicationSlow,
        AnomalyClass::S3MixedSlow,
    ] {
        let ds = run_case(
            class,
            n,
            n / 2,
            CollKind::AllReduce,
            Duration::from_secs(20),
        );
        match ds.first() {
            None => println!("{:<22} {:>6}", format!("{class:?}"), "none"),
            Some(d) => {
                let ev = d.evidence.clone().unwrap_or_default();
                println!(
                    "{:<22} {:>6} {:>6} {:>14.1} {:>14.2} {:>14.1}",
                    format!("{class:?}"),
                    wire::class_code(d.class()),
                    d.roots.first().map_or(-1, |r| i64::from(r.rank)),
                    d.detected_at_ns.saturating_sub(d.onset_ns) as f64 / 1e6,
                    d.location_latency_ns as f64 / 1e6,
                    ev.location_cost_ns as f64 / 1e3
                );
            }
        }
    }
}
