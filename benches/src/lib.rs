//! Benchmark harness: probe overhead, peer comparisons and analyzer throughput; each
//! benchmark prints ratios measured side by side in one run.
