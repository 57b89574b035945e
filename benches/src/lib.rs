//! Benchmark harness: probe overhead, peer comparisons and analyzer throughput; each
//! benchmark prints ratios measured side by side in one run.
//!
//! Analyzer benchmarks (binaries; they print figures and assert nothing about speed):
//! * `analyzer_location`: location latency vs ranks per communicator, with a linear fit.
//! * `analyzer_ingest`: records per second into one shard (and 2-3 shards) on loopback.

#![warn(unreachable_pub)]

pub mod analyzer_util;
/// Command lines of the benchmark binaries (`--option value` pairs, `--help`).
pub mod cli;
/// End-to-end harness (ranks as threads, `CCLD_INJECT`, embedded analyzer) shared by e2e tests.
pub mod e2e_harness;
pub mod netns;
/// Side-by-side benchmarks of issue 18: our `all_reduce_perf` under `ccl-run`, the OpenMPI
/// peer, memcpy bandwidth, output parsing and medians (`bench-peers`, `lowp-bench`).
pub mod peers;
/// Real faults (issue 17): the independent C client, OS-level faults, incidents as a user
/// reads them, verdicts and the accuracy table.
pub mod real_faults;
