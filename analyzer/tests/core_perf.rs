//! Rough cost figures of the engine (ignored by default: `cargo test -p analyzer --test
//! core_perf -- --ignored --nocapture`). Not timed assertions: the numbers are printed.

use std::time::Instant;

use analyzer::wire::{ChannelStat, CollKind, OpRecord, OpState, OpTypeSet, TraceId};
use analyzer::{Engine, EngineConfig};

fn rec(comm: u64, c: u64, rank: u32, n: u32, state: OpState, dur: u64) -> OpRecord {
    OpRecord {
        trace: Some(TraceId {
            comm_id: comm,
            op_counter: c,
            extension: 0,
        }),
        rank,
        nranks: n,
        host: format!("h{}", rank / 8),
        pid: 1000 + rank,
        op: Some(OpTypeSet {
            collective: CollKind::AllReduce as i32,
            bytes: 1 << 26,
            count: 1 << 24,
            redop: 0,
            root: -1,
            peer: -1,
            n_channels: 2,
            ..Default::default()
        }),
        start_ns: c * 1_000_000,
        duration_ns: dur,
        channels: vec![
            ChannelStat {
                send_count: 10,
                recv_count: 10,
                expected_send: 10,
                expected_recv: 10,
                send_rate: 0.5,
                recv_rate: 0.5,
                wait_upstream_ns: Some(5),
                wait_downstream_ns: Some(6),
                ..Default::default()
            };
            2
        ],
        state: state as i32,
        seq: c,
        device: -1,
        cpu_wait_ns: None,
        frozen_ns: None,
        duration_estimated: false,
        elsewhere_ns: None,
        peer_wire: Vec::new(),
        gap_ns: None,
        stride: 0,
        failure: 0,
        peer_lost: None,
        mismatch: None,
        seq_space: 0,
        p2p: Vec::new(),
    }
}

#[test]
#[ignore]
fn ingest_throughput_and_location_latency() {
    // Ingest: 64 comms x 64 ranks x 200 rounds, completed records.
    let (k, n, rounds) = (64u64, 64u32, 200u64);
    let mut recs = Vec::new();
    for c in 0..rounds {
        for comm in 0..k {
            for r in 0..n {
                recs.push(rec(
                    comm + 1,
                    c,
                    r,
                    n,
                    OpState::Completed,
                    1_000_000 + u64::from(r),
                ));
            }
        }
    }
    let mut e = Engine::new(EngineConfig::default());
    let t = Instant::now();
    let mut now = 1_000_000_000_000u64;
    for (i, x) in recs.iter().enumerate() {
        if i % 4096 == 0 {
            now += 1_000_000;
        }
        e.ingest(x, now).unwrap();
    }
    let el = t.elapsed();
    println!(
        "ingest: {} records in {:?}: {:.0} records/s; memory {} KiB",
        recs.len(),
        el,
        recs.len() as f64 / el.as_secs_f64(),
        e.memory_bytes() / 1024
    );
    // Location: one comm of 4096 ranks hung (H3), time the tick that locates it.
    for n in [1024u32, 4096] {
        let mut e = Engine::new(EngineConfig::default());
        let t0 = 1_000_000_000_000u64;
        for r in 0..n {
            let mut x = rec(7, 5, r, n, OpState::InFlight, 0);
            x.channels[0].send_count = if r == n / 3 { 2 } else { 5 };
            e.ingest(&x, t0).unwrap();
        }
        let t = Instant::now();
        let d = e.tick(t0 + 301_000_000_000);
        let el = t.elapsed();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].roots[0].rank, n / 3);
        println!("hang location at N = {n}: {:?} (whole tick)", el);
    }
}
