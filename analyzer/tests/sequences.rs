//! Sequences real jobs use (issue 17 point 5): p2p sequence space, barriers, dropped records.

use std::time::Duration;

use analyzer::wire::{
    AnomalyClass, ChannelStat, CollKind, Heartbeat, OpRecord, OpState, OpTypeSet, P2pPeerSeq,
    RankMembership, SeqSpace, TraceId,
};
use analyzer::{Engine, EngineConfig};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;
const T0: u64 = 1_000 * S;

fn rec(
    comm: u64,
    c: u64,
    rank: u32,
    n: u32,
    state: OpState,
    coll: CollKind,
    bytes: u64,
) -> OpRecord {
    OpRecord {
        trace: Some(TraceId {
            comm_id: comm,
            op_counter: c,
            extension: 0,
        }),
        rank,
        nranks: n,
        host: "h".into(),
        pid: 100 + rank,
        op: Some(OpTypeSet {
            collective: coll as i32,
            bytes,
            count: bytes / 4,
            redop: 0,
            root: -1,
            peer: -1,
            n_channels: 1,
            ..Default::default()
        }),
        start_ns: c * S,
        duration_ns: if state == OpState::InFlight { 0 } else { MS },
        channels: vec![ChannelStat::default()],
        state: state as i32,
        seq: c,
        device: -1,
        ..Default::default()
    }
}

fn cfg() -> EngineConfig {
    EngineConfig {
        hang_threshold: Duration::from_secs(2),
        silent_after: Duration::from_secs(1),
        ..EngineConfig::default()
    }
}

#[test]
fn p2p_between_two_stages_never_shifts_the_collective_rounds() {
    let n = 4;
    let mut e = Engine::new(cfg());
    let mut t = T0;
    for c in 0..20u64 {
        // Pipeline: ranks 1 -> 2 exchange 3 p2p groups per step, counted in their own space.
        for k in 0..3 {
            for (r, peer, send) in [(1u32, 2u32, true), (2, 1, false)] {
                let mut x = rec(
                    7,
                    c * 3 + k,
                    r,
                    n,
                    OpState::Completed,
                    if send { CollKind::Send } else { CollKind::Recv },
                    4096,
                );
                x.seq_space = SeqSpace::P2p as i32;
                x.p2p = vec![P2pPeerSeq {
                    peer,
                    send,
                    seq: c * 3 + k,
                    count: 1024,
                    dtype: 7,
                }];
                e.ingest(&x, t).unwrap();
            }
        }
        for r in 0..n {
            e.ingest(
                &rec(7, c, r, n, OpState::Completed, CollKind::AllReduce, 1 << 20),
                t,
            )
            .unwrap();
        }
        t += 100 * MS;
        assert!(e.tick(t).is_empty(), "step {c}");
    }
    let st = e.comm_state(7, t).unwrap();
    assert_eq!(st.rounds_completed, 20, "exactly the collective rounds");
    assert_eq!(e.stats().p2p_space_records, 20 * 3 * 2);
    // Every rank's collective counter is 19 (not shifted by its p2p count).
    assert!(st.ranks.iter().all(|r| r.last_op_counter == 19), "{st:?}");
}

#[test]
fn barrier_is_a_hang_only_when_a_rank_never_reaches_it_after_twice_the_threshold() {
    for (absent, want) in [(None, false), (Some(2u32), true)] {
        let n = 4;
        let mut e = Engine::new(cfg());
        for r in 0..n {
            e.ingest(
                &rec(3, 0, r, n, OpState::Completed, CollKind::AllReduce, 1 << 20),
                T0,
            )
            .unwrap();
        }
        for r in (0..n).filter(|&r| Some(r) != absent) {
            e.ingest(
                &rec(3, 1, r, n, OpState::InFlight, CollKind::AllReduce, 4),
                T0,
            )
            .unwrap();
        }
        let mut first = None;
        for i in 1..=60u64 {
            let now = T0 + i * 100 * MS;
            for r in 0..n {
                let hb = Heartbeat {
                    host: "h".into(),
                    pid: 100 + r,
                    ranks: vec![RankMembership {
                        comm_id: 3,
                        rank: r,
                        nranks: n,
                        last_op_counter: Some(if Some(r) == absent { 0 } else { 1 }),
                        last_p2p_counter: None,
                        last_call_error: None,
                    }],
                    records_dropped: 0,
                    time_ns: 0,
                };
                e.heartbeat(&hb, now);
            }
            let d = e.tick(now);
            if !d.is_empty() && first.is_none() {
                first = Some((now - T0, d));
            }
        }
        match (want, first) {
            (false, None) => {}
            (true, Some((after, d))) => {
                assert!(after > 4 * S && after <= 5 * S, "2 x threshold: {after}");
                assert_eq!(d[0].class, AnomalyClass::H1NotEntered as i32);
                assert_eq!(d[0].roots[0].rank, 2);
            }
            (w, f) => panic!("absent {absent:?}: want {w}, got {f:?}"),
        }
    }
}

#[test]
fn records_dropped_from_heartbeats_are_shown_per_rank_and_per_process() {
    let mut e = Engine::new(cfg());
    // Process 100 hosts ranks 0 and 1 of the same comm (one process, counted once).
    let hb = |pid: u32, ranks: &[u32], dropped: u64| Heartbeat {
        host: "h".into(),
        pid,
        ranks: ranks
            .iter()
            .map(|&r| RankMembership {
                comm_id: 5,
                rank: r,
                nranks: 3,
                last_op_counter: None,
                last_p2p_counter: None,
                last_call_error: None,
            })
            .collect(),
        records_dropped: dropped,
        time_ns: 0,
    };
    e.heartbeat(&hb(100, &[0, 1], 7), T0);
    e.heartbeat(&hb(102, &[2], 5), T0);
    e.heartbeat(&hb(102, &[2], 3), T0 + S); // cumulative: never decreases
    let st = e.comm_state(5, T0 + S).unwrap();
    let per: Vec<u64> = st.ranks.iter().map(|r| r.records_dropped).collect();
    assert_eq!(per, vec![7, 7, 5]);
    assert_eq!(st.records_dropped, 12);
}
