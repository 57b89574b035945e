use super::*;

#[test]
fn same_seed_same_stream_other_seed_other_stream() {
    let cfg = SimConfig {
        duration_ns: 60_000_000_000,
        ..SimConfig::default()
    };
    let a: Vec<wire::TimedBatch> = Sim::new(cfg.clone()).unwrap().collect();
    let b: Vec<wire::TimedBatch> = Sim::new(cfg.clone()).unwrap().collect();
    assert_eq!(a, b);
    assert_eq!(a.len(), 60, "one batch per simulated second");
    let c: Vec<wire::TimedBatch> = Sim::new(SimConfig { seed: 2, ..cfg }).unwrap().collect();
    assert_ne!(a, c);
    // Batches are in time order, records carry the analyzer's notion of time only via
    // now_ns; every rank completes every round it started.
    assert!(a.windows(2).all(|w| w[0].now_ns < w[1].now_ns));
    let recs: Vec<&wire::OpRecord> = a
        .iter()
        .flat_map(|b| &b.batch.as_ref().unwrap().records)
        .collect();
    assert!(recs
        .iter()
        .all(|r| r.state == wire::OpState::Completed as i32));
    assert_eq!(recs.len() % 8, 0);
}

#[test]
fn long_operations_emit_in_flight_snapshots() {
    let cfg = SimConfig {
        op_ns: 12_000_000_000,
        period_ns: 20_000_000_000,
        duration_ns: 60_000_000_000,
        nranks: 2,
        ..SimConfig::default()
    };
    let recs: Vec<wire::OpRecord> = Sim::new(cfg)
        .unwrap()
        .flat_map(|b| b.batch.unwrap().records)
        .collect();
    let snaps: Vec<&wire::OpRecord> = recs
        .iter()
        .filter(|r| r.state == wire::OpState::InFlight as i32)
        .collect();
    assert!(snaps.len() >= 4, "{}", snaps.len());
    // Snapshots of one rank's op grow in duration and counts, then it completes.
    let first_op = snaps[0].trace.as_ref().unwrap().op_counter;
    let mine: Vec<&&wire::OpRecord> = snaps
        .iter()
        .filter(|r| r.rank == snaps[0].rank && r.trace.as_ref().unwrap().op_counter == first_op)
        .collect();
    assert!(mine.windows(2).all(|w| w[0].duration_ns < w[1].duration_ns));
    assert!(mine
        .windows(2)
        .all(|w| w[0].channels[0].send_count <= w[1].channels[0].send_count));
}

#[test]
fn bad_configs_are_typed_errors() {
    let bad = |c: SimConfig| Sim::new(c).unwrap_err();
    assert!(matches!(
        bad(SimConfig {
            nranks: 1,
            ..SimConfig::default()
        }),
        SimError::Invalid {
            field: "nranks",
            ..
        }
    ));
    assert!(matches!(
        bad(SimConfig {
            comms: 0,
            ..SimConfig::default()
        }),
        SimError::Invalid { field: "comms", .. }
    ));
    assert!(matches!(
        bad(SimConfig {
            jitter: 1.5,
            ..SimConfig::default()
        }),
        SimError::Invalid {
            field: "jitter",
            ..
        }
    ));
    assert!(matches!(
        bad(SimConfig {
            period_ns: 1,
            ..SimConfig::default()
        }),
        SimError::Invalid {
            field: "period_ns",
            ..
        }
    ));
    let i = Injection {
        class: AnomalyClass::H1NotEntered,
        rank: 8,
        start_ns: 0,
        silent: false,
        h2: H2Variant::Completes,
    };
    let e = bad(SimConfig {
        inject: Some(i),
        ..SimConfig::default()
    });
    assert_eq!(
        e.to_string(),
        "invalid simulator parameter inject.rank: must be < nranks"
    );
}

#[test]
fn dataflow_models_complete_when_nobody_stalls_and_freeze_otherwise() {
    for n in [2usize, 3, 8, 33] {
        let steps = 2 * (n as u64 - 1);
        let f = ring_dataflow(n, steps, 1, &[]);
        assert_eq!(f.counts, f.expected, "ring n={n}");
        let t = tree_dataflow(n, 5, 1, &[]);
        assert_eq!(t.counts, t.expected, "tree n={n}");
        // Root 0 of a tree sends down to and receives up from its children only.
        let kids = tree_children(0, n).count() as u64;
        assert_eq!(t.expected[0], (5 * kids, 5 * kids));
    }
    // Ring of 4, rank 2 frozen after 3 primitives (send, recv, send): everyone stops
    // with rank 2 owning the fewest send + recv.
    let f = ring_dataflow(4, 6, 1, &[None, None, Some(3), None]);
    assert_eq!(f.counts[2], (2, 1));
    let total: Vec<u64> = f.counts.iter().map(|c| c.0 + c.1).collect();
    let min = *total.iter().min().unwrap();
    assert_eq!(total.iter().filter(|&&x| x == min).count(), 1);
    assert_eq!(total[2], min);
    assert_eq!(tree_layer(0), 0);
    assert_eq!(
        (
            tree_layer(1),
            tree_layer(2),
            tree_layer(3),
            tree_layer(6),
            tree_layer(7)
        ),
        (1, 1, 2, 2, 3)
    );
}
