use super::*;
use crate::wire::{ChannelStat, CollKind, OpRecord, OpState, OpTypeSet, TraceId};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const T0: u64 = 1_000 * S;

fn op(coll: CollKind, bytes: u64) -> OpTypeSet {
    OpTypeSet {
        collective: coll as i32,
        bytes,
        count: bytes / 4,
        redop: -1,
        root: -1,
        peer: -1,
        n_channels: 1,
        ..Default::default()
    }
}

fn rec(comm: u64, c: u64, rank: u32, n: u32, state: OpState, dur: u64) -> OpRecord {
    OpRecord {
        trace: Some(TraceId {
            comm_id: comm,
            op_counter: c,
            extension: 0,
        }),
        rank,
        nranks: n,
        host: format!("h{rank}"),
        pid: 100 + rank,
        op: Some(op(CollKind::AllReduce, 1 << 20)),
        start_ns: c * 10 * S,
        duration_ns: dur,
        channels: vec![ChannelStat {
            send_count: 10,
            recv_count: 10,
            expected_send: 10,
            expected_recv: 10,
            ..Default::default()
        }],
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

fn cfg() -> EngineConfig {
    EngineConfig {
        hang_threshold: Duration::from_secs(300),
        silent_after: Duration::from_secs(60),
        ..EngineConfig::default()
    }
}

#[test]
fn bad_records_are_rejected_with_typed_reasons() {
    let mut e = Engine::new(EngineConfig {
        max_ranks: 100,
        max_channels: 2,
        max_comms: 2,
        ..cfg()
    });
    let ok = rec(1, 5, 0, 4, OpState::InFlight, S);
    let mut r = ok.clone();
    r.trace = None;
    assert_eq!(e.ingest(&r, T0), Err(Reject::MissingTrace));
    let mut r = ok.clone();
    r.op = None;
    assert!(matches!(
        e.ingest(&r, T0),
        Err(Reject::MissingOpTypeSet { .. })
    ));
    let mut r = ok.clone();
    r.nranks = 0;
    assert_eq!(e.ingest(&r, T0), Err(Reject::ZeroRanks { comm_id: 1 }));
    let mut r = ok.clone();
    r.nranks = 101;
    assert!(matches!(
        e.ingest(&r, T0),
        Err(Reject::TooManyRanks {
            nranks: 101,
            max: 100,
            ..
        })
    ));
    let mut r = ok.clone();
    r.rank = 4;
    let err = e.ingest(&r, T0).unwrap_err();
    assert_eq!(
        err,
        Reject::RankOutOfRange {
            comm_id: 1,
            rank: 4,
            nranks: 4
        }
    );
    assert_eq!(
        err.to_string(),
        "comm 0x1: rank 4 out of range for nranks 4"
    );
    let mut r = ok.clone();
    r.op.as_mut().unwrap().collective = 42;
    assert_eq!(
        e.ingest(&r, T0),
        Err(Reject::UnknownEnum {
            field: "collective",
            value: 42
        })
    );
    let mut r = ok.clone();
    r.state = 7;
    assert_eq!(
        e.ingest(&r, T0),
        Err(Reject::UnknownEnum {
            field: "state",
            value: 7
        })
    );
    let mut r = ok.clone();
    r.channels = vec![ChannelStat::default(); 3];
    assert_eq!(
        e.ingest(&r, T0),
        Err(Reject::TooManyChannels { got: 3, max: 2 })
    );
    let mut r = ok.clone();
    r.channels[0].ring_next = Some(9);
    assert!(matches!(
        e.ingest(&r, T0),
        Err(Reject::BadRingNeighbour { neighbour: 9, .. })
    ));
    let mut r = ok.clone();
    r.duration_ns = 30 * 24 * 3600 * S;
    assert!(matches!(
        e.ingest(&r, T0),
        Err(Reject::AbsurdDuration { .. })
    ));
    let mut r = ok.clone();
    r.start_ns = u64::MAX - 5;
    assert!(matches!(
        e.ingest(&r, T0),
        Err(Reject::AbsurdDuration { .. })
    ));
    // Now valid records, then inconsistencies against what is known.
    assert_eq!(e.ingest(&ok, T0), Ok(()));
    let mut r = ok.clone();
    r.nranks = 8;
    assert_eq!(
        e.ingest(&r, T0),
        Err(Reject::NranksMismatch {
            comm_id: 1,
            got: 8,
            expected: 4
        })
    );
    let mut r = ok.clone();
    r.duration_ns = 0; // earlier snapshot said 1 s, skew tolerance 5 s: still fine
    assert_eq!(e.ingest(&r, T0), Ok(()));
    let mut r = ok.clone();
    r.duration_ns = 20 * S;
    assert_eq!(e.ingest(&r, T0), Ok(()));
    let mut r = ok.clone();
    r.duration_ns = S; // 19 s shorter than the snapshot before
    assert!(matches!(
        e.ingest(&r, T0),
        Err(Reject::ClockBackwards { .. })
    ));
    let mut done = ok.clone();
    done.state = OpState::Completed as i32;
    done.duration_ns = 21 * S;
    assert_eq!(e.ingest(&done, T0), Ok(()));
    assert!(matches!(
        e.ingest(&done, T0),
        Err(Reject::DuplicateCompleted { op_counter: 5, .. })
    ));
    // A late in-flight snapshot of a completed op is accepted and ignored.
    assert_eq!(e.ingest(&ok, T0), Ok(()));
    // A heartbeat far ahead does not make older records "backwards".
    e.heartbeat(
        &wire::Heartbeat {
            host: "h0".into(),
            pid: 100,
            ranks: vec![wire::RankMembership {
                comm_id: 1,
                rank: 0,
                nranks: 4,
                last_op_counter: Some(500),
                last_p2p_counter: None,
                last_call_error: None,
            }],
            records_dropped: 0,
            time_ns: 0,
        },
        T0,
    );
    // Rank 0 reaches op 80: op 15 is more than max_reorder (64) behind.
    let mut r = rec(1, 80, 0, 4, OpState::InFlight, S);
    r.start_ns = 300 * S;
    assert_eq!(e.ingest(&r, T0), Ok(()));
    let r = rec(1, 15, 0, 4, OpState::InFlight, S);
    assert_eq!(
        e.ingest(&r, T0),
        Err(Reject::CounterBackwards {
            comm_id: 1,
            rank: 0,
            got: 15,
            newest: 80
        })
    );
    // Op 81 starting 100 s before op 80 on the same rank's clock.
    let mut r = rec(1, 81, 0, 4, OpState::InFlight, S);
    r.start_ns = 200 * S;
    assert!(matches!(
        e.ingest(&r, T0),
        Err(Reject::ClockBackwards { .. })
    ));
    // Communicator limit.
    assert_eq!(e.ingest(&rec(2, 0, 0, 4, OpState::InFlight, 0), T0), Ok(()));
    assert_eq!(
        e.ingest(&rec(3, 0, 0, 4, OpState::InFlight, 0), T0),
        Err(Reject::TooManyComms { max: 2 })
    );
    assert!(e.stats().rejected >= 15);
    assert!(e.tick(T0 + S).is_empty());
}

fn feed_hang(e: &mut Engine, n: u32, skip: Option<u32>, coll_bytes: (CollKind, u64)) -> u64 {
    feed_hang_with(e, n, skip, coll_bytes, None)
}

/// [`feed_hang`] whose skipped rank's heartbeats carry `call_error`.
fn feed_hang_with(
    e: &mut Engine,
    n: u32,
    skip: Option<u32>,
    coll_bytes: (CollKind, u64),
    call_error: Option<&str>,
) -> u64 {
    // Round 7 completed by all; round 8 entered by all but `skip`, in flight.
    for r in 0..n {
        e.ingest(&rec(9, 7, r, n, OpState::Completed, 100 * MS), T0)
            .unwrap();
    }
    let mut t = T0;
    while t <= T0 + 400 * S {
        for r in 0..n {
            if Some(r) == skip {
                continue;
            }
            let mut x = rec(9, 8, r, n, OpState::InFlight, t - T0);
            x.op = Some(op(coll_bytes.0, coll_bytes.1));
            x.channels[0].send_count = 3 + u64::from(r != 2);
            e.ingest(&x, t).unwrap();
        }
        if let Some(s) = skip {
            e.heartbeat(
                &wire::Heartbeat {
                    host: format!("h{s}"),
                    pid: 100 + s,
                    ranks: vec![wire::RankMembership {
                        comm_id: 9,
                        rank: s,
                        nranks: n,
                        last_op_counter: Some(7),
                        last_p2p_counter: None,
                        last_call_error: call_error.map(str::to_string),
                    }],
                    records_dropped: 0,
                    time_ns: 0,
                },
                t,
            );
        }
        t += 10 * S;
    }
    t
}

#[test]
fn engine_can_move_between_threads() {
    fn send<T: Send + 'static>() {}
    send::<Engine>();
    send::<wire::Diagnosis>();
}

#[test]
fn config_validation_names_the_bad_field() {
    assert_eq!(EngineConfig::default().validate(), Ok(()));
    let c = EngineConfig {
        alpha: 0.7,
        beta: 0.6,
        ..EngineConfig::default()
    };
    assert_eq!(c.validate().unwrap_err().field, "alpha/beta");
    let c = EngineConfig {
        theta_slow: f64::NAN,
        ..EngineConfig::default()
    };
    assert_eq!(c.validate().unwrap_err().field, "theta_slow");
    let c = EngineConfig {
        theta_slow: f64::INFINITY,
        ..EngineConfig::default()
    };
    assert_eq!(c.validate(), Ok(()));
    let c = EngineConfig {
        hang_threshold: Duration::ZERO,
        ..EngineConfig::default()
    };
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "invalid analyzer setting hang_threshold: must be > 0"
    );
}

#[test]
fn non_finite_or_negative_metrics_are_rejected() {
    let mut e = Engine::new(cfg());
    let mut r = rec(1, 1, 0, 2, OpState::Completed, MS);
    r.channels[0].send_rate = f64::NAN;
    assert!(matches!(
        e.ingest(&r, T0),
        Err(Reject::BadMetric {
            field: "send_rate",
            channel: 0,
            ..
        })
    ));
    r.channels[0].send_rate = 0.5;
    r.channels[0].recv_per_sec = -1.0;
    assert!(matches!(
        e.ingest(&r, T0),
        Err(Reject::BadMetric {
            field: "recv_per_sec",
            ..
        })
    ));
}

#[test]
fn after_a_pause_of_the_ticking_process_hang_checks_wait_one_threshold() {
    // Rank 3 finished op 8, ranks 0-2 are still in flight in the engine's view (their
    // ends have not arrived): past the threshold that is a hang naming rank 3.
    let start = |e: &mut Engine| {
        for r in 0..3 {
            e.ingest(&rec(9, 8, r, 4, OpState::InFlight, 0), T0)
                .unwrap();
        }
        e.ingest(&rec(9, 8, 3, 4, OpState::Completed, S), T0 + S)
            .unwrap();
    };
    let t = T0 + 310 * S;
    let mut e = Engine::new(cfg());
    start(&mut e);
    assert_eq!(e.tick(t).len(), 1, "the engine's stale view is a hang");
    // The same after a pause: nothing while the ends arrive, nothing after.
    let mut e = Engine::new(cfg());
    start(&mut e);
    e.note_pause(t);
    assert!(e.tick(t).is_empty());
    for r in 0..3 {
        e.ingest(&rec(9, 8, r, 4, OpState::Completed, 311 * S), t + S)
            .unwrap();
    }
    assert!(e.tick(t + 2 * S).is_empty());
    assert!(e.tick(t + 301 * S).is_empty());
    // A hang that lasts is named once the wait is over.
    let mut e = Engine::new(cfg());
    start(&mut e);
    e.note_pause(t);
    assert!(e.tick(t + 299 * S).is_empty());
    assert_eq!(e.tick(t + 301 * S).len(), 1);
}

#[test]
fn a_pause_is_ten_tick_periods_and_at_least_a_second() {
    let ms = Duration::from_millis;
    assert!(!is_pause(ms(500), ms(50)));
    assert!(is_pause(ms(1000), ms(50)));
    assert!(!is_pause(ms(1500), ms(200)));
    assert!(is_pause(ms(2000), ms(200)));
}

#[test]
fn hang_fires_once_just_after_the_threshold() {
    let mut e = Engine::new(cfg());
    let mut got = Vec::new();
    for r in 0..4 {
        e.ingest(&rec(9, 8, r, 4, OpState::InFlight, 0), T0)
            .unwrap();
    }
    // Snapshots every 10 s; rank 2 has the fewest sends.
    for step in 1..=40u64 {
        let t = T0 + step * 10 * S;
        for r in 0..4 {
            let mut x = rec(9, 8, r, 4, OpState::InFlight, step * 10 * S);
            x.channels[0].send_count = if r == 2 { 3 } else { 4 };
            e.ingest(&x, t).unwrap();
        }
        let d = e.tick(t);
        if step * 10 <= 300 {
            assert!(d.is_empty(), "no hang at {} s", step * 10);
        }
        got.extend(d);
    }
    assert_eq!(got.len(), 1, "one diagnosis per episode");
    let d = &got[0];
    assert_eq!(d.class(), AnomalyClass::H3Hardware);
    assert_eq!(d.roots.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![2]);
    assert_eq!(d.detected_at_ns, T0 + 310 * S);
    assert_eq!(d.onset_ns, T0);
    assert_eq!(d.location_latency_ns, 10 * S);
    let ev = d.evidence.as_ref().unwrap();
    assert_eq!((ev.entered_ranks, ev.hung_ranks, ev.nranks), (4, 4, 4));
    assert_eq!(ev.max_in_flight_ns, 310 * S);
    assert_eq!(
        ev.send_count.as_ref().map(|s| (s.min, s.min_rank)),
        Some((3.0, 2))
    );
    assert!(
        d.summary
            .starts_with("rank 2 (pid 102, host h2) made the least progress in AllReduce #8"),
        "{}",
        d.summary
    );
}

/// A ring whose host 2 lost its link late in round 8: ranks 0 and 1 had all their data and
/// completed, rank 2 waits for what rank 1 sent, rank 3 for rank 2. Rank 2 is named (H3),
/// not the ranks that completed (the round's schedule is the same on every rank).
#[test]
fn a_rank_starved_after_its_upstream_completed_is_the_root_not_the_completers() {
    let mut e = Engine::new(cfg());
    let ring = |mut x: OpRecord| {
        x.channels[0].ring_next = Some((x.rank + 1) % 4);
        x.channels[0].ring_prev = Some((x.rank + 3) % 4);
        x
    };
    for r in 0..4 {
        e.ingest(&ring(rec(9, 7, r, 4, OpState::Completed, 100 * MS)), T0)
            .unwrap();
    }
    for r in 0..2 {
        e.ingest(&ring(rec(9, 8, r, 4, OpState::Completed, 100 * MS)), T0)
            .unwrap();
    }
    let mut got = Vec::new();
    for step in 0..=32u64 {
        let t = T0 + step * 10 * S;
        for r in 2..4 {
            let mut x = ring(rec(9, 8, r, 4, OpState::InFlight, step * 10 * S));
            x.channels[0].recv_count = 9;
            x.channels[0].send_count = 10 - u64::from(r == 3);
            e.ingest(&x, t).unwrap();
        }
        got.extend(e.tick(t));
    }
    assert_eq!(got.len(), 1, "{got:?}");
    let d = &got[0];
    assert_eq!(d.class(), AnomalyClass::H3Hardware, "{}", d.summary);
    assert_eq!(d.roots.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![2]);
    assert!(
        d.roots[0].reason.contains("ring upstream rank 1"),
        "{}",
        d.roots[0].reason
    );
    assert!(d.summary.contains("(2 of 4 ranks hang)"), "{}", d.summary);
}

#[test]
fn a_rank_that_went_silent_still_counts_by_analyzer_time() {
    // One snapshot at T0 (duration 0), then nothing from anybody; the estimate grows with
    // the analyzer's clock.
    let mut e = Engine::new(cfg());
    for r in 0..3 {
        e.ingest(&rec(9, 1, r, 3, OpState::InFlight, 0), T0)
            .unwrap();
    }
    assert!(e.tick(T0 + 300 * S).is_empty());
    let d = e.tick(T0 + 300 * S + 1);
    assert_eq!(d.len(), 1);
    // Everyone silent: no discrimination by silence, fewest counts all tie.
    assert_eq!(d[0].roots.len(), 3);
    assert_eq!(d[0].evidence.as_ref().unwrap().silent_total, 3);
}

#[test]
fn h1_alive_rank_behind_the_round_is_the_root() {
    let mut e = Engine::new(cfg());
    let t = feed_hang(&mut e, 4, Some(1), (CollKind::AllReduce, 1 << 20));
    let d = e.tick(t);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].class(), AnomalyClass::H1NotEntered);
    assert_eq!(d[0].roots[0].rank, 1);
    assert!(!d[0].roots[0].silent);
    assert!(
        d[0].roots[0].reason.contains("newest op #7"),
        "{}",
        d[0].roots[0].reason
    );
    let ev = d[0].evidence.as_ref().unwrap();
    assert_eq!(
        (ev.lagging_total, ev.entered_ranks, ev.hung_ranks),
        (1, 3, 3)
    );
    assert_eq!(ev.lagging[0].last_op_counter, 7);
}

#[test]
fn h1_names_the_failed_call_of_the_rank_that_did_not_enter() {
    let why = "invalid argument: AllReduce: invalid data type 99";
    // Rank 1 of 4 did not enter; its heartbeats carry `call_error`.
    let hang = |call_error: Option<&str>| {
        let mut e = Engine::new(cfg());
        let t = feed_hang_with(
            &mut e,
            4,
            Some(1),
            (CollKind::AllReduce, 1 << 20),
            call_error,
        );
        (e, t)
    };
    let (mut e, t) = hang(Some(why));
    let d = e.tick(t);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].class(), AnomalyClass::H1NotEntered);
    let root = &d[0].roots[0];
    assert_eq!(root.rank, 1);
    assert!(
        root.reason.ends_with(&format!(
            "stuck before the collective; its last call failed: {why}"
        )),
        "{}",
        root.reason
    );
    // A heartbeat without it (the rank started an operation since, or never failed):
    // nothing about a failed call.
    let (mut e, t) = hang(Some(why));
    e.heartbeat(
        &wire::Heartbeat {
            host: "h1".into(),
            pid: 101,
            ranks: vec![wire::RankMembership {
                comm_id: 9,
                rank: 1,
                nranks: 4,
                last_op_counter: Some(7),
                last_p2p_counter: None,
                last_call_error: None,
            }],
            records_dropped: 0,
            time_ns: 0,
        },
        t,
    );
    let d = e.tick(t);
    assert_eq!(d[0].roots[0].rank, 1);
    assert!(
        !d[0].roots[0].reason.contains("failed"),
        "{}",
        d[0].roots[0].reason
    );
    // An overlong one (not from our probe) is cut to 512 characters.
    let long = "x".repeat(5000);
    let (mut e, t) = hang(Some(&long));
    let r = &e.tick(t)[0].roots[0].reason;
    assert!(
        r.ends_with(&format!("failed: {}", "x".repeat(512))),
        "{}",
        r.len()
    );
}

#[test]
fn entered_barriers_never_hang_but_five_byte_allreduce_does() {
    let mut e = Engine::new(cfg());
    let t = feed_hang(&mut e, 4, None, (CollKind::AllReduce, 4));
    assert!(e.tick(t).is_empty(), "AllReduce of 4 bytes is a barrier");
    let mut e = Engine::new(cfg());
    let t = feed_hang(&mut e, 4, None, (CollKind::AllReduce, 5));
    assert_eq!(e.tick(t).len(), 1);
}

#[test]
fn p2p_round_involves_only_the_peers() {
    let mut e = Engine::new(cfg());
    let mut x = rec(5, 3, 1, 8, OpState::InFlight, 0);
    x.op = Some(OpTypeSet {
        peer: 6,
        algorithm: wire::Algorithm::P2p as i32,
        ..op(CollKind::Send, 1 << 20)
    });
    e.ingest(&x, T0).unwrap();
    x.duration_ns = 301 * S;
    e.ingest(&x, T0 + 301 * S).unwrap();
    let d = e.tick(T0 + 301 * S);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].class(), AnomalyClass::H1NotEntered);
    assert_eq!(
        d[0].roots.iter().map(|r| r.rank).collect::<Vec<_>>(),
        vec![6]
    );
    // A completed send/recv pair finalizes the round.
    let mut e = Engine::new(cfg());
    for (r, peer, coll) in [(1, 6, CollKind::Send), (6, 1, CollKind::Recv)] {
        let mut y = rec(5, 3, r, 8, OpState::Completed, MS);
        y.op = Some(OpTypeSet {
            peer,
            algorithm: wire::Algorithm::P2p as i32,
            ..op(coll, 1 << 20)
        });
        e.ingest(&y, T0).unwrap();
    }
    assert_eq!(e.comm_state(5, T0).unwrap().rounds_completed, 1);
    assert_eq!(e.comm_state(5, T0).unwrap().tracked_rounds, 0);
}

/// Completes round `c` of comm 4 (4 ranks) at `t` with the given durations. As in a ring,
/// every rank ends at the same moment (c x 10 s + 5 s on the ranks' clocks): a shorter
/// duration means a later start, i.e. a longer computation gap before the round.
fn round(e: &mut Engine, c: u64, t: u64, durs: [u64; 4]) {
    for (r, d) in durs.into_iter().enumerate() {
        let mut x = rec(4, c, r as u32, 4, OpState::Completed, d);
        x.start_ns = c * 10 * S + 5 * S - d;
        e.ingest(&x, t).unwrap();
    }
}

fn slow_cfg() -> EngineConfig {
    EngineConfig {
        baseline_rounds_max: 3,
        repeat_threshold: 1,
        theta_slow: 3.0,
        detect_window: Duration::from_secs(60),
        record_windows: true,
        ..cfg()
    }
}

/// Over a rate-limited link the sender's records arrive late, so a round can complete in
/// the window after the one that took its peers' records (CI, netns rate limit: S2 named
/// on the lowest rate, weak, with no channel evidence). The peers' channel evidence is
/// then that of their latest window with a completed operation: the link 1 -> 2, whose
/// messages crawl, is still found by its wire time.
#[test]
fn a_round_completed_by_a_late_record_keeps_its_peers_channel_evidence() {
    let mut e = Engine::new(slow_cfg());
    let done = |c: u64, r: u32, d: u64, wire_ms: u64| {
        let mut x = rec(4, c, r, 4, OpState::Completed, d);
        x.start_ns = c * 10 * S + 5 * S - d;
        x.channels[0].ring_next = Some((r + 1) % 4);
        x.channels[0].ring_prev = Some((r + 3) % 4);
        x.channels[0]
            .ext
            .insert(wire::EXT_WIRE_NS.to_string(), (wire_ms * MS) as f64);
        x
    };
    for c in 1..=4 {
        for r in 0..4 {
            e.ingest(&done(c, r, 100 * MS, 1), T0 + c * S).unwrap();
        }
    }
    assert!(e.tick(T0 + 61 * S).is_empty());
    // Round 5 takes 1 s on every rank; rank 2's inbound messages spent 0.9 s on the wire.
    for r in [0, 2, 3] {
        let wire_ms = if r == 2 { 900 } else { 5 };
        e.ingest(&done(5, r, 1000 * MS, wire_ms), T0 + 100 * S)
            .unwrap();
    }
    assert!(
        e.tick(T0 + 121 * S + 1).is_empty(),
        "round 5 is not complete"
    );
    e.ingest(&done(5, 1, 1000 * MS, 5), T0 + 130 * S).unwrap();
    let d = e.tick(T0 + 182 * S);
    assert_eq!(d.len(), 1);
    let d = &d[0];
    assert_eq!(
        d.class(),
        AnomalyClass::S2CommunicationSlow,
        "{}",
        d.summary
    );
    assert_eq!(d.roots.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![1]);
    assert!(
        d.roots[0].reason.contains("1 -> 2") && d.roots[0].reason.contains("on the wire"),
        "{}",
        d.roots[0].reason
    );
}

/// Tree operations (recursive doubling on 4 ranks) advance in lockstep and have no ring:
/// the link is found by the time each sending peer's messages spent on the wire
/// (`peer_wire`). Rank 1's egress is slow: its messages to rank 0 (step 1) and to rank 3
/// (step 2) crawl, every other link is fast; the lowest-rate rule alone named [1, 2] in the
/// netns test before this rule.
#[test]
fn a_slow_sender_of_tree_operations_is_found_by_its_peers_wire_time() {
    let mut e = Engine::new(slow_cfg());
    // (receiver, [partner in step 1, partner in step 2])
    let partners = |r: u32| [r ^ 1, r ^ 2];
    let done = |c: u64, r: u32, d: u64, slow_ms: u64| {
        let mut x = rec(4, c, r, 4, OpState::Completed, d);
        x.start_ns = c * 10 * S + 5 * S - d;
        if let Some(o) = x.op.as_mut() {
            o.algorithm = wire::Algorithm::Tree as i32;
        }
        x.peer_wire = partners(r)
            .iter()
            .map(|&from| wire::PeerWire {
                from,
                wire_ns: if from == 1 { slow_ms * MS } else { MS / 10 },
            })
            .collect();
        x
    };
    for c in 1..=4 {
        for r in 0..4 {
            e.ingest(&done(c, r, 100 * MS, 0), T0 + c * S).unwrap();
        }
    }
    assert!(e.tick(T0 + 61 * S).is_empty());
    for r in 0..4 {
        e.ingest(&done(5, r, 1000 * MS, 450), T0 + 70 * S).unwrap();
    }
    let d = e.tick(T0 + 122 * S);
    assert_eq!(d.len(), 1);
    let d = &d[0];
    assert_eq!(
        d.class(),
        AnomalyClass::S2CommunicationSlow,
        "{}",
        d.summary
    );
    assert_eq!(d.roots.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![1]);
    let reason = &d.roots[0].reason;
    assert!(
        reason.contains("1 -> 0") && reason.contains("1 -> 3") && !reason.contains("ch "),
        "{reason}"
    );
}

/// Window 1 (T0 .. T0+60 s) of comm 4 under `slow_cfg`: rounds 1..3, T_max 100, 120,
/// 140 ms (baseline collecting); round 4 fixes T_base = (100 + 120 + 140) / 3 = 120 ms,
/// m = 3.
fn slow_baseline(e: &mut Engine) {
    round(e, 1, T0 + S, [100 * MS, 90 * MS, 95 * MS, 99 * MS]);
    round(e, 2, T0 + 2 * S, [120 * MS, 90 * MS, 95 * MS, 99 * MS]);
    round(e, 3, T0 + 3 * S, [140 * MS, 90 * MS, 95 * MS, 99 * MS]);
    round(e, 4, T0 + 4 * S, [110 * MS; 4]);
}

#[test]
fn slow_detection_matches_hand_computed_r_and_p() {
    let mut e = Engine::new(slow_cfg());
    slow_baseline(&mut e);
    assert!(
        e.tick(T0 + 61 * S).is_empty(),
        "static T_base 10 s: nothing is slow"
    );
    // Window 2: a round with rank 3 entering late: T_max 500, T_min 100.
    // R = (500 - 120) / 120 = 3.1667 > 3; P = (500 - 100) / (500 - 120) > 1 -> 1.
    round(
        &mut e,
        5,
        T0 + 70 * S,
        [500 * MS, 500 * MS, 500 * MS, 100 * MS],
    );
    // A round with a larger T_max but a smaller range does not replace it (eq. 2).
    round(
        &mut e,
        6,
        T0 + 71 * S,
        [600 * MS, 590 * MS, 595 * MS, 599 * MS],
    );
    // The comm was first seen at T0 + 1 s: windows end at T0 + 61 s, 121 s, 181 s.
    let d = e.tick(T0 + 122 * S);
    assert_eq!(d.len(), 1);
    let ev = d[0].evidence.as_ref().unwrap();
    // Eq. (4) on the widest round (5) says computation-slow (P = 1); over the window,
    // round 6 is 480 ms slower than T_base with only 9 ms of lateness (rank 1's gap
    // above the lower median), so the weighted share is (380 + 9) / (380 + 480): mixed.
    assert_eq!(d[0].class(), AnomalyClass::S3MixedSlow, "{}", d[0].summary);
    assert_eq!(d[0].roots[0].rank, 3);
    assert_eq!(ev.p_paper, 1.0);
    assert!((ev.p - 389.0 / 860.0).abs() < 1e-12, "P = {}", ev.p);
    assert_eq!(
        (ev.t_max_ns, ev.t_min_ns, ev.t_base_ns),
        (500 * MS, 100 * MS, 120 * MS)
    );
    assert!((ev.r - 380.0 / 120.0).abs() < 1e-12, "R = {}", ev.r);
    assert_eq!(ev.baseline(), BaselineKind::Dynamic);
    assert_eq!(ev.baseline_rounds, 3);
    assert_eq!(d[0].trace.as_ref().unwrap().op_counter, 5);
    assert_eq!(
        d[0].location_latency_ns, S,
        "window ended at T0 + 121 s, tick at 122 s"
    );
    assert_eq!(ev.window_end_ns, T0 + 121 * S);
    assert!(
        d[0].summary.contains("(P = 0.45 [") && d[0].summary.contains("1.00], R = 3.2)"),
        "{}",
        d[0].summary
    );
    let log = e.take_window_log();
    assert_eq!(log.len(), 2);
    assert!(!log[0].dynamic && log[1].dynamic);
    // Same episode: another slow window gives nothing new.
    round(
        &mut e,
        7,
        T0 + 130 * S,
        [500 * MS, 500 * MS, 500 * MS, 100 * MS],
    );
    assert!(e.tick(T0 + 181 * S).is_empty());
}

/// A completion whose end the probe estimated (`duration_estimated`: a thinned round
/// reported after all, before a suspected hang) completes its round, but the round times
/// nothing: the slow round of `slow_detection_matches_hand_computed_r_and_p` raises no
/// diagnosis when one of its records is estimated, and no gap is measured from it.
#[test]
fn a_round_with_an_estimated_duration_counts_but_is_not_timed() {
    let mut e = Engine::new(slow_cfg());
    slow_baseline(&mut e);
    assert!(e.tick(T0 + 61 * S).is_empty());
    let before = e.stats().rounds_completed;
    for (r, d) in [500 * MS, 500 * MS, 500 * MS, 100 * MS]
        .into_iter()
        .enumerate()
    {
        let mut x = rec(4, 5, r as u32, 4, OpState::Completed, d);
        x.start_ns = 5 * 10 * S + 5 * S - d;
        x.duration_estimated = r == 0;
        e.ingest(&x, T0 + 70 * S).unwrap();
    }
    assert_eq!(e.stats().rounds_completed, before + 1, "round 5 completed");
    assert!(e.tick(T0 + 122 * S).is_empty(), "but it times nothing");
    // The same round with every duration timed is slow (the control).
    let mut e = Engine::new(slow_cfg());
    slow_baseline(&mut e);
    assert!(e.tick(T0 + 61 * S).is_empty());
    round(
        &mut e,
        5,
        T0 + 70 * S,
        [500 * MS, 500 * MS, 500 * MS, 100 * MS],
    );
    assert_eq!(e.tick(T0 + 122 * S).len(), 1);

    // An estimated completion may close an in-flight snapshot with a shorter duration
    // than the snapshot's (the estimate is up to a sampling period old): accepted, with
    // the snapshot's duration as the better bound. A timed one is still rejected.
    let mut e = Engine::new(cfg());
    e.ingest(&rec(9, 1, 0, 2, OpState::InFlight, 20 * S), T0)
        .unwrap();
    let mut done = rec(9, 1, 0, 2, OpState::Completed, S);
    assert!(matches!(
        e.ingest(&done, T0 + S),
        Err(Reject::ClockBackwards { .. })
    ));
    done.duration_estimated = true;
    e.ingest(&done, T0 + S).unwrap();
    let st = e.comm_state(9, T0 + S).unwrap();
    let r0 = st.ranks.iter().find(|r| r.rank == 0).unwrap();
    assert_eq!(r0.last_duration_ns, 20 * S);
    // No computation gap is measured from an estimated end: the next round's gap is
    // unknown unless its record carries one.
    let comm = &e.comms[&9];
    assert!(!comm.ranks[0].last_done_timed);
}

#[test]
fn thinned_rounds_with_probe_gaps_read_like_consecutive_ones() {
    // The scenario of `entry_skew_inherited_from_the_previous_operation_is_not_computation`
    // as a thinning probe reports it: only every 16th round, each record carrying the
    // rank's computation gap (1 ms) since the unreported operation before it.
    let run = |with_gap: bool| {
        let mut e = Engine::new(slow_cfg());
        let mut k = 0u64;
        let mut run = |e: &mut Engine, t: u64, starts: [u64; 4], ends: [u64; 4]| {
            k += 1;
            for r in 0..4 {
                let mut x = rec(4, 16 * k, r as u32, 4, OpState::Completed, 0);
                x.start_ns = starts[r];
                x.duration_ns = ends[r] - starts[r];
                x.stride = 16;
                x.gap_ns = with_gap.then_some(MS);
                e.ingest(&x, t).unwrap();
            }
        };
        for i in 1..=4 {
            let s0 = 10 * S + i * 101 * MS;
            run(&mut e, T0 + i * S, [s0; 4], [s0 + 100 * MS; 4]);
        }
        // A slow link staggered the ends of the (unreported) operation before: the
        // reported one starts staggered, 1 ms after each rank's previous end.
        let base = 20 * S;
        let starts = [0, 1, 2, 3].map(|i| base + i * 250 * MS);
        run(&mut e, T0 + 70 * S, starts, [starts[3] + S; 4]);
        let d = e.tick(T0 + 122 * S);
        assert_eq!(d.len(), 1);
        let stats = e.stats().clone();
        assert_eq!(stats.rounds_evicted_incomplete, 0);
        assert_eq!(e.comm_state(4, T0 + 122 * S).unwrap().tracked_rounds, 0);
        d[0].clone()
    };
    let d = run(true);
    let ev = d.evidence.as_ref().unwrap();
    assert_eq!(ev.computation_lateness_ns, Some(0));
    assert_eq!(
        d.class(),
        AnomalyClass::S2CommunicationSlow,
        "{}",
        d.summary
    );
    assert_eq!(d.trace.as_ref().unwrap().op_counter, 80);
    // Without the gaps the rounds are not consecutive: eq. 4 decides (computation).
    let d = run(false);
    let ev = d.evidence.as_ref().unwrap();
    assert_eq!(ev.computation_lateness_ns, None);
    assert_ne!(
        d.class(),
        AnomalyClass::S2CommunicationSlow,
        "{}",
        d.summary
    );
}

#[test]
fn ranks_on_different_strides_complete_the_common_rounds() {
    // Ranks 0..2 report every 8th round, rank 3 (briefly on a larger stride) every
    // 16th: the rounds all four report complete; the others stay partial and are
    // evicted once more than `max_rounds_per_comm` rounds are held: no hang, nothing
    // unbounded, and later complete rounds are not held back.
    let mut e = Engine::new(EngineConfig {
        max_rounds_per_comm: 8,
        ..slow_cfg()
    });
    for k in 1..=40u64 {
        let c = 8 * k;
        for r in 0..4u32 {
            if r == 3 && c % 16 != 0 {
                continue;
            }
            let mut x = rec(4, c, r, 4, OpState::Completed, 100 * MS);
            x.stride = if r == 3 { 16 } else { 8 };
            e.ingest(&x, T0 + k * MS).unwrap();
        }
    }
    let st = e.comm_state(4, T0 + S).unwrap();
    assert_eq!(st.rounds_completed, 20, "rounds 16, 32, .., 320");
    assert!(st.tracked_rounds <= 8, "{}", st.tracked_rounds);
    assert!(e.stats().rounds_evicted_incomplete >= 12);
    let hangs = [
        AnomalyClass::H1NotEntered,
        AnomalyClass::H2Inconsistent,
        AnomalyClass::H3Hardware,
    ];
    assert!(e
        .tick(T0 + 400 * S)
        .iter()
        .all(|d| !hangs.contains(&d.class())));
    // A second completion of a round already finalized does not reopen it.
    let late = rec(4, 320, 3, 4, OpState::Completed, 100 * MS);
    assert!(matches!(
        e.ingest(&late, T0 + 2 * S),
        Err(Reject::DuplicateCompleted {
            op_counter: 320,
            ..
        })
    ));
    assert_eq!(e.comm_state(4, T0 + 2 * S).unwrap().rounds_completed, 20);
}

#[test]
fn entry_skew_inherited_from_the_previous_operation_is_not_computation() {
    // Ranks enter every round 1 ms after their previous round ended (constant gap). The
    // baseline rounds end together. Round 5 (a slow ring link) ends staggered by 250 ms
    // per rank, so round 6 starts staggered although nobody computed longer; round 6 is
    // slow for everyone and ends together.
    let mut e = Engine::new(slow_cfg());
    let mut end = [10 * S; 4];
    let mut c = 0;
    let mut run = |e: &mut Engine, t: u64, ends: [u64; 4]| {
        c += 1;
        for r in 0..4 {
            let mut x = rec(4, c, r as u32, 4, OpState::Completed, 0);
            x.start_ns = end[r] + MS;
            x.duration_ns = ends[r] - x.start_ns;
            e.ingest(&x, t).unwrap();
        }
        end = ends;
    };
    for k in 1..=4 {
        let e_k = 10 * S + k * 101 * MS;
        run(&mut e, T0 + k * S, [e_k; 4]);
    }
    // T_base = 100 ms. Round 5 in a new window: durations 100 .. 850 ms, ends staggered.
    let base = 10 * S + 404 * MS;
    let staggered = [0, 1, 2, 3].map(|i| base + 101 * MS + i * 250 * MS);
    run(&mut e, T0 + 70 * S, staggered);
    // Round 6: everybody ends 1 s after the last start.
    run(&mut e, T0 + 71 * S, [staggered[3] + S; 4]);
    let d = e.tick(T0 + 122 * S);
    assert_eq!(d.len(), 1);
    let ev = d[0].evidence.as_ref().unwrap();
    // Eq. (4) sees T_max - T_min = 750 ms of entry skew and calls it computation...
    assert!(ev.p_paper > 0.6, "{}", ev.p_paper);
    // ...the gaps show it was inherited.
    assert_eq!(ev.computation_lateness_ns, Some(0));
    assert_eq!(ev.p, 0.0);
    assert_eq!(
        d[0].class(),
        AnomalyClass::S2CommunicationSlow,
        "{}",
        d[0].summary
    );
    assert!(d[0].summary.contains("eq. 4"), "{}", d[0].summary);
}

/// A 2-rank TP pair whose rank 0 also works in a DP group: from round 5 on a slow DP
/// operation holds rank 0 up for 600 ms before each TP operation (its probe reports the
/// time elsewhere; its computation gap stays 1 ms), and rank 1 waits for it in TP. The
/// TP rounds take 700 ms on rank 1 against a 100 ms T_base, but nothing in TP is slow:
/// without the time elsewhere (another client) the same rounds are diagnosed.
#[test]
fn a_round_whose_latest_entrant_was_held_up_elsewhere_is_not_slow_here() {
    let run = |reported: bool| {
        let mut e = Engine::new(slow_cfg());
        let ingest = |e: &mut Engine, c: u64, t: u64, late_ms: u64| {
            for r in 0..2u32 {
                let mut x = rec(4, c, r, 2, OpState::Completed, 0);
                let late = if r == 0 { late_ms * MS } else { 0 };
                x.start_ns = c * 10 * S + late;
                x.duration_ns = 100 * MS + late_ms * MS - late;
                x.gap_ns = Some(MS);
                x.elsewhere_ns = reported.then_some(50 * MS + late);
                e.ingest(&x, t).unwrap();
            }
        };
        for c in 1..=4 {
            ingest(&mut e, c, T0 + c * S, 0);
        }
        assert!(e.tick(T0 + 61 * S).is_empty());
        for c in 5..=8 {
            ingest(&mut e, c, T0 + 65 * S + c * S, 600);
        }
        e.tick(T0 + 122 * S)
    };
    assert!(run(true).is_empty(), "{:?}", run(true));
    let d = run(false);
    assert_eq!(d.len(), 1, "the rounds are 7x T_base: {d:?}");
}

#[test]
fn a_rank_starved_of_cpu_is_named_by_its_run_queue_delay() {
    // Communication-slow round (everyone 800 ms, no latecomer); rank 2's threads were
    // runnable but off the CPU for 6 s of the 10 s between its last two records.
    let mut e = Engine::new(slow_cfg());
    let round_cpu = |e: &mut Engine, c: u64, t: u64, d: u64, waits: [u64; 4]| {
        for (r, w) in waits.into_iter().enumerate() {
            let mut x = rec(4, c, r as u32, 4, OpState::Completed, d);
            x.start_ns = c * 10 * S + 5 * S - d;
            x.cpu_wait_ns = Some(w);
            e.ingest(&x, t).unwrap();
        }
    };
    for c in 1..=4 {
        round_cpu(&mut e, c, T0 + c * S, 100 * MS, [c * MS; 4]);
    }
    round_cpu(
        &mut e,
        5,
        T0 + 70 * S,
        800 * MS,
        [5 * MS, 5 * MS, 4 * MS + 6 * S, 5 * MS],
    );
    let d = e.tick(T0 + 121 * S);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].class(), AnomalyClass::S2CommunicationSlow);
    assert_eq!(d[0].roots.len(), 1, "{}", d[0].summary);
    assert_eq!(d[0].roots[0].rank, 2);
    assert!(
        d[0].roots[0].reason.contains("waited for a CPU 60%"),
        "{}",
        d[0].roots[0].reason
    );
    assert!(d[0].summary.contains("starved of CPU"), "{}", d[0].summary);
    // The same share spread over every rank (an oversubscribed machine) names nobody by
    // CPU wait.
    let mut e = Engine::new(slow_cfg());
    for c in 1..=4 {
        round_cpu(&mut e, c, T0 + c * S, 100 * MS, [c * MS; 4]);
    }
    round_cpu(&mut e, 5, T0 + 70 * S, 800 * MS, [4 * MS + 6 * S; 4]);
    let d = e.tick(T0 + 121 * S);
    assert_eq!(d.len(), 1);
    assert!(!d[0].summary.contains("starved of CPU"), "{}", d[0].summary);
}

/// A 4-rank job whose rank 2 is stopped (SIGSTOP/SIGCONT) for 60 ms inside every 8th
/// operation from round 1500 on: every rank's duration grows in those rounds, nobody
/// enters late. `frozen(r)` is the frozen time rank r's record of a stopped round adds
/// (`None`: records without the field). Returns the diagnoses.
fn stopped_inside_operations(frozen: impl Fn(u32) -> Option<u64>) -> Vec<wire::Diagnosis> {
    let mut e = Engine::new(EngineConfig {
        detect_window: Duration::from_secs(1),
        repeat_threshold: 3,
        ..cfg()
    });
    let (mut t, mut totals, mut out) = (T0, [0u64; 4], Vec::new());
    for c in 1..=2100u64 {
        let stopped = c > 1500 && c % 8 == 0;
        for r in 0..4u32 {
            let jitter = ((c * 7 + u64::from(r) * 3) % 5) * 50_000;
            let dur = MS + jitter + if stopped { 60 * MS } else { 0 };
            let mut x = rec(9, c, r, 4, OpState::Completed, dur);
            x.start_ns = t + MS;
            if stopped {
                totals[r as usize] += frozen(r).unwrap_or(0);
            }
            x.frozen_ns = frozen(r).map(|_| totals[r as usize]);
            e.ingest(&x, t + MS + dur).unwrap();
        }
        t += MS + MS + if stopped { 60 * MS } else { 0 };
        out.extend(e.tick(t));
    }
    out
}

#[test]
fn a_process_stopped_inside_operations_is_named_by_its_frozen_time() {
    let d = stopped_inside_operations(|r| Some(if r == 2 { 60 * MS } else { 0 }));
    assert!(!d.is_empty(), "no diagnosis");
    for x in &d {
        assert_eq!(x.roots.len(), 1, "{}", x.summary);
        assert_eq!(x.roots[0].rank, 2, "{}", x.summary);
        assert!(
            x.roots[0].reason.contains("frozen"),
            "{}",
            x.roots[0].reason
        );
        assert!(x.summary.contains("was frozen"), "{}", x.summary);
        assert_eq!(x.class(), AnomalyClass::S1ComputationSlow, "{}", x.summary);
    }
    // Without the frozen time the window verdicts see no late or long window: the stops
    // fall inside operations, one round in eight.
    assert!(stopped_inside_operations(|_| None).is_empty());
    // Every rank a thread of the stopped process: nobody stands out.
    assert!(stopped_inside_operations(|_| Some(60 * MS))
        .iter()
        .all(|x| !x.roots.iter().any(|r| r.reason.contains("frozen"))));
}

#[test]
fn r_equal_to_theta_is_not_slow_and_p_picks_the_class() {
    let mut e = Engine::new(slow_cfg());
    for c in 1..=4 {
        round(&mut e, c, T0 + c * S, [100 * MS; 4]);
    }
    // T_base = 100 ms. T_max 400: R = 3.0, not > 3.
    round(
        &mut e,
        5,
        T0 + 70 * S,
        [400 * MS, 400 * MS, 400 * MS, 390 * MS],
    );
    assert!(e.tick(T0 + 121 * S).is_empty());
    // Communication-slow: everyone 800 ms, spread 20: R = 7, P = 20 / 700 < 0.4.
    round(
        &mut e,
        6,
        T0 + 130 * S,
        [800 * MS, 790 * MS, 780 * MS, 795 * MS],
    );
    let d = e.tick(T0 + 181 * S);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].class(), AnomalyClass::S2CommunicationSlow);
    let ev = d[0].evidence.as_ref().unwrap();
    assert!((ev.p_paper - 20.0 / 700.0).abs() < 1e-12);
    // Adjusted: rank 2 entered last with a gap 15 ms above the (lower) median gap.
    assert_eq!(ev.computation_lateness_ns, Some(15 * MS));
    assert!((ev.p - 15.0 / 700.0).abs() < 1e-12, "{}", ev.p);
    // Mixed: T_max 800, T_min 450 (entered 350 ms late): P = 350 / 700 = 0.5.
    let mut e = Engine::new(slow_cfg());
    for c in 1..=4 {
        round(&mut e, c, T0 + c * S, [100 * MS; 4]);
    }
    round(
        &mut e,
        5,
        T0 + 70 * S,
        [800 * MS, 450 * MS, 800 * MS, 800 * MS],
    );
    let d = e.tick(T0 + 121 * S);
    assert_eq!(d[0].class(), AnomalyClass::S3MixedSlow);
    assert_eq!(d[0].evidence.as_ref().unwrap().p, 0.5);
    // S1 candidate: rank 1; S2 candidates: none (no rank reports different rates).
    assert_eq!(d[0].roots.len(), 1);
    assert_eq!(
        (d[0].roots[0].rank, d[0].roots[0].class()),
        (1, AnomalyClass::S1ComputationSlow)
    );
}

#[test]
fn operation_kinds_keep_separate_baselines() {
    // Small (1 ms) and large (500 ms) AllReduces alternate; one baseline for both would
    // be about 250 ms and flag every large one (R = 1 at theta 0.5 here).
    let mut e = Engine::new(EngineConfig {
        theta_slow: 0.5,
        ..slow_cfg()
    });
    let mut t = T0;
    for c in 1..=200u64 {
        let (bytes, d) = if c % 2 == 0 {
            (1 << 30, 500 * MS)
        } else {
            (1 << 10, MS)
        };
        for r in 0..4 {
            let mut x = rec(4, c, r, 4, OpState::Completed, d + u64::from(r) * MS / 10);
            x.op = Some(op(CollKind::AllReduce, bytes));
            e.ingest(&x, t).unwrap();
        }
        t += 2 * S;
        assert!(e.tick(t).is_empty(), "round {c}");
    }
    let log = e.take_window_log();
    assert!(log.iter().filter(|w| w.dynamic).count() >= 10);
    assert!(log.iter().all(|w| w.r < 0.5), "{log:?}");
}

#[test]
fn random_junk_never_panics_and_stays_bounded() {
    let mut rng = crate::sim::Rng::new(42);
    let mut e = Engine::new(EngineConfig {
        max_comms: 8,
        max_rounds_per_comm: 8,
        hang_threshold: Duration::from_secs(5),
        detect_window: Duration::from_secs(3),
        silent_after: Duration::from_secs(2),
        ..EngineConfig::default()
    });
    let mut now = T0;
    let mut accepted = 0;
    for i in 0..20_000u64 {
        // Mostly consistent sizes per communicator (so that records get deep into the
        // engine), sometimes not.
        let comm = 1 + rng.below(12);
        let n = if rng.below(10) == 0 {
            1 + rng.below(6) as u32
        } else {
            1 + (comm % 6) as u32
        };
        let mut x = rec(
            comm,
            rng.below(40),
            rng.below(n.into()) as u32,
            n,
            match rng.below(3) {
                0 => OpState::InFlight,
                1 => OpState::Completed,
                _ => OpState::Failed,
            },
            rng.below(20 * S),
        );
        let o = x.op.as_mut().unwrap();
        o.collective = if rng.below(20) == 0 {
            10
        } else {
            rng.below(10) as i32
        };
        o.algorithm = if rng.below(20) == 0 {
            3
        } else {
            rng.below(3) as i32
        };
        o.bytes = rng.below(8);
        o.peer = rng.below(9) as i32 - 1;
        o.tree_layer = (0..rng.below(3)).map(|_| rng.below(4) as u32).collect();
        x.start_ns = rng.below(1 << 40);
        x.channels = (0..rng.below(4))
            .map(|_| ChannelStat {
                send_count: rng.below(100),
                recv_count: rng.below(100),
                expected_send: rng.below(3) * 50,
                send_rate: rng.unit(),
                wait_upstream_ns: (rng.below(2) == 0).then(|| rng.below(S)),
                ring_next: (rng.below(2) == 0).then(|| rng.below(u64::from(n) + 1) as u32),
                ..Default::default()
            })
            .collect();
        if e.ingest(&x, now).is_ok() {
            accepted += 1;
        }
        if i % 7 == 0 {
            e.heartbeat(
                &wire::Heartbeat {
                    host: "j".into(),
                    pid: 1,
                    ranks: vec![wire::RankMembership {
                        comm_id: 1 + rng.below(12),
                        rank: rng.below(8) as u32,
                        nranks: 1 + rng.below(6) as u32,
                        last_op_counter: (rng.below(2) == 0).then(|| rng.below(50)),
                        last_p2p_counter: None,
                        last_call_error: None,
                    }],
                    records_dropped: 0,
                    time_ns: 0,
                },
                now,
            );
        }
        if i % 50 == 0 {
            now += rng.below(2 * S);
            for d in e.tick(now) {
                assert!(!d.summary.is_empty());
            }
            for id in e.comm_ids() {
                assert!(e.comm_state(id, now).is_some());
            }
        }
    }
    // Deep paths were reached: rounds completed, hangs located, rounds evicted.
    let st = e.stats();
    assert!(accepted > 500, "{accepted}");
    assert!(
        st.rounds_completed > 0 && st.diagnoses > 0 && st.stale_records > 0,
        "{st:?}"
    );
    assert!(e.comm_ids().len() <= 8);
    assert!(e.memory_bytes() < 8 << 20, "{}", e.memory_bytes());
}

#[test]
fn memory_is_bounded_when_rounds_never_complete() {
    let mut e = Engine::new(EngineConfig {
        max_rounds_per_comm: 16,
        ..cfg()
    });
    let n = 64;
    let mut mem = Vec::new();
    for c in 0..3000u64 {
        // Rank 0's completion records are lost: no round ever completes.
        for r in 1..n {
            e.ingest(&rec(8, c, r, n, OpState::Completed, MS), T0 + c * MS)
                .unwrap();
        }
        if c == 1000 || c == 2999 {
            mem.push(e.memory_bytes());
        }
    }
    let st = e.comm_state(8, T0 + 3 * S).unwrap();
    assert_eq!(st.tracked_rounds, 16);
    assert!(mem[1] <= mem[0] + 4096, "memory grew: {mem:?}");
    assert!(e.stats().rounds_evicted_incomplete >= 2984);
    assert!(e.tick(T0 + 4 * S).is_empty());
}

#[test]
fn comm_state_reports_every_rank_and_idle_comms_are_dropped() {
    let mut e = Engine::new(EngineConfig {
        comm_idle_evict: Duration::from_secs(100),
        ..cfg()
    });
    e.ingest(&rec(3, 1, 0, 3, OpState::Completed, 7 * MS), T0)
        .unwrap();
    e.ingest(&rec(3, 2, 0, 3, OpState::InFlight, 2 * S), T0 + 5 * S)
        .unwrap();
    let st = e.comm_state(3, T0 + 65 * S + 1).unwrap();
    assert_eq!(st.nranks, 3);
    assert_eq!(st.ranks.len(), 3);
    let r0 = &st.ranks[0];
    assert_eq!(
        (r0.last_op_counter, r0.state(), r0.records),
        (2, OpState::InFlight, 2)
    );
    assert_eq!(r0.in_flight_ns, 62 * S + 1);
    assert_eq!((r0.host.as_str(), r0.pid), ("h0", 100));
    assert!(r0.silent, "65 s without a report > silent_after 60 s");
    assert!(!st.ranks[1].reported && st.ranks[1].silent);
    assert_eq!(e.comm_ids(), vec![3]);
    assert_eq!(e.comm_summaries()[0].nranks, 3);
    assert!(e.comm_state(4, T0).is_none());
    e.tick(T0 + 106 * S);
    assert!(e.comm_ids().is_empty());
    assert_eq!(e.stats().comms_evicted, 1);
}

#[test]
fn a_stored_cost_clock_measures_windows_closed_by_ingest() {
    // Slow windows close on the first record after their end (no tick): with a stored
    // clock the location step is still timed.
    fn fake_clock() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static T: AtomicU64 = AtomicU64::new(0);
        T.fetch_add(400, Ordering::Relaxed) + 400
    }
    let mut e = Engine::new(slow_cfg());
    e.set_cost_clock(fake_clock);
    round(&mut e, 1, T0 + S, [100 * MS, 90 * MS, 95 * MS, 99 * MS]);
    round(&mut e, 2, T0 + 2 * S, [120 * MS, 90 * MS, 95 * MS, 99 * MS]);
    round(&mut e, 3, T0 + 3 * S, [140 * MS, 90 * MS, 95 * MS, 99 * MS]);
    round(&mut e, 4, T0 + 4 * S, [110 * MS; 4]);
    assert!(e.tick(T0 + 61 * S).is_empty());
    let late = [500 * MS, 500 * MS, 500 * MS, 100 * MS];
    round(&mut e, 5, T0 + 70 * S, late);
    // Window 2 ends at T0 + 121 s: this round's records close it (no tick).
    round(&mut e, 6, T0 + 130 * S, [110 * MS; 4]);
    // Before window 3 ends: the tick only hands out what ingest found.
    let d = e.tick(T0 + 131 * S);
    assert_eq!(d.len(), 1);
    let cost = d[0].evidence.as_ref().unwrap().location_cost_ns;
    assert!(
        cost >= 400 && cost.is_multiple_of(400),
        "location cost {cost}"
    );
}

#[test]
fn tick_with_clock_measures_location_cost() {
    let mut e = Engine::new(cfg());
    let t = feed_hang(&mut e, 4, None, (CollKind::AllReduce, 1 << 20));
    let mut fake = 1000u64;
    let mut clock = || {
        fake += 250;
        fake
    };
    let d = e.tick_with_clock(t, &mut clock);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].evidence.as_ref().unwrap().location_cost_ns, 250);
}

#[test]
fn heartbeats_create_ranks_and_bad_memberships_are_skipped() {
    let mut e = Engine::new(cfg());
    let hb = wire::Heartbeat {
        host: "hx".into(),
        pid: 7,
        ranks: vec![
            wire::RankMembership {
                comm_id: 1,
                rank: 2,
                nranks: 4,
                last_op_counter: Some(9),
                last_p2p_counter: None,
                last_call_error: None,
            },
            wire::RankMembership {
                comm_id: 1,
                rank: 5,
                nranks: 4,
                last_op_counter: None,
                last_p2p_counter: None,
                last_call_error: None,
            },
            wire::RankMembership {
                comm_id: 2,
                rank: 0,
                nranks: 0,
                last_op_counter: None,
                last_p2p_counter: None,
                last_call_error: None,
            },
        ],
        records_dropped: 0,
        time_ns: 0,
    };
    e.heartbeat(&hb, T0);
    assert_eq!(e.comm_ids(), vec![1]);
    let st = e.comm_state(1, T0).unwrap();
    assert!(st.ranks[2].reported);
    assert_eq!(st.ranks[2].last_op_counter, 9);
    assert_eq!(st.ranks[2].host, "hx");
}

/// `peer_wire` entries that name no other rank of the communicator (a client's junk) are
/// not kept: the per-rank list stays bounded by the communicator's size.
#[test]
fn peer_wire_entries_of_unknown_ranks_are_skipped() {
    let mut acc = state::PeerWireAcc::default();
    let junk: Vec<wire::PeerWire> = (0..10_000u32)
        .map(|from| wire::PeerWire {
            from: from.wrapping_mul(2_654_435_761),
            wire_ns: u64::MAX,
        })
        .chain([
            wire::PeerWire {
                from: 1,
                wire_ns: 7,
            },
            wire::PeerWire {
                from: 2,
                wire_ns: u64::MAX,
            },
        ])
        .collect();
    for _ in 0..3 {
        acc.add(10, &junk, 1, 4);
    }
    let mut from: Vec<u32> = acc.from.iter().map(|x| x.0).collect();
    from.sort_unstable();
    // rank 1 itself and everything >= 4 dropped; 0, 2 and 3 may come from the junk
    assert!(from.iter().all(|&f| f < 4 && f != 1), "{from:?}");
    assert!(from.contains(&2));
    // saturating sums, shares capped at 1
    assert!(acc.shares().all(|(_, s)| (0.0..=1.0).contains(&s)));
}
