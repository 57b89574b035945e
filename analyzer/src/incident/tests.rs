//! Cross-communicator correlation: DP over 4 processes, TP pairs {0,1} and {2,3}.

use std::time::Duration;

use super::*;
use crate::engine::{Engine, EngineConfig};
use crate::wire::{
    ChannelStat, CollKind, Heartbeat, OpRecord, OpState, OpTypeSet, RankMembership, RootCause,
    TraceId,
};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;
const T0: u64 = 1_000 * S;
const DP: u64 = 0xd0;
const TP: [u64; 2] = [0x70, 0x71];

fn rec(comm: u64, c: u64, rank: u32, n: u32, pid: u32, state: OpState) -> OpRecord {
    OpRecord {
        trace: Some(TraceId {
            comm_id: comm,
            op_counter: c,
            extension: 0,
        }),
        rank,
        nranks: n,
        host: "h".into(),
        pid,
        op: Some(OpTypeSet {
            collective: CollKind::AllReduce as i32,
            bytes: 1 << 20,
            count: 1 << 18,
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

fn pid(p: u32) -> u32 {
    100 + p
}

/// Process p's records of one training step k: TP AllReduce #k, then DP AllReduce #k.
fn step(e: &mut Engine, k: u64, t: u64, procs: &[u32]) {
    for &p in procs {
        e.ingest(
            &rec(
                TP[(p / 2) as usize],
                k,
                p % 2,
                2,
                pid(p),
                OpState::Completed,
            ),
            t,
        )
        .unwrap();
    }
    for &p in procs {
        e.ingest(&rec(DP, k, p, 4, pid(p), OpState::Completed), t)
            .unwrap();
    }
}

fn hb(e: &mut Engine, p: u32, dp_op: u64, tp_op: u64, t: u64) {
    e.heartbeat(
        &Heartbeat {
            host: "h".into(),
            pid: pid(p),
            ranks: vec![
                RankMembership {
                    comm_id: DP,
                    rank: p,
                    nranks: 4,
                    last_op_counter: Some(dp_op),
                    last_p2p_counter: None,
                    last_call_error: None,
                },
                RankMembership {
                    comm_id: TP[(p / 2) as usize],
                    rank: p % 2,
                    nranks: 2,
                    last_op_counter: Some(tp_op),
                    last_p2p_counter: None,
                    last_call_error: None,
                },
            ],
            records_dropped: 0,
            time_ns: 0,
        },
        t,
    );
}

#[test]
fn stopped_rank_is_the_one_root_and_its_tp_partner_is_a_victim() {
    for stopped in [2u32, 0, 3] {
        let partner = stopped ^ 1;
        let cfg = EngineConfig {
            hang_threshold: Duration::from_secs(2),
            silent_after: Duration::from_secs(1),
            ..EngineConfig::default()
        };
        let mut e = Engine::new(cfg);
        let mut t = T0;
        for k in 0..5 {
            step(&mut e, k, t, &[0, 1, 2, 3]);
            t += 50 * MS;
        }
        assert!(e.tick(t).is_empty());
        // Step 5: `stopped` never starts. Its partner waits in TP #5; the other pair passed
        // TP #5 and waits in DP #5.
        let others: Vec<u32> = (0..4).filter(|p| p / 2 != stopped / 2).collect();
        for &p in &others {
            e.ingest(
                &rec(
                    TP[(p / 2) as usize],
                    5,
                    p % 2,
                    2,
                    pid(p),
                    OpState::Completed,
                ),
                t,
            )
            .unwrap();
            e.ingest(&rec(DP, 5, p, 4, pid(p), OpState::InFlight), t)
                .unwrap();
        }
        e.ingest(
            &rec(
                TP[(partner / 2) as usize],
                5,
                partner % 2,
                2,
                pid(partner),
                OpState::InFlight,
            ),
            t,
        )
        .unwrap();
        let mut all = Vec::new();
        let mut incidents = Vec::new();
        for i in 1..60 {
            let now = t + i * 100 * MS;
            for p in (0..4).filter(|&p| p != stopped) {
                let dp = if p == partner { 4 } else { 5 };
                hb(&mut e, p, dp, 5, now);
            }
            all.extend(e.tick(now));
            incidents.extend(e.take_incidents());
        }
        assert!(all.len() >= 2, "both communicators diagnose: {all:?}");
        assert_eq!(incidents.len(), 1, "stopped {stopped}: {incidents:#?}");
        let inc = &incidents[0];
        assert_eq!(inc.roots.len(), 1, "{inc:#?}");
        assert_eq!(inc.roots[0].pid, pid(stopped));
        assert_eq!(
            inc.roots[0].rank, stopped,
            "rank of the DP (largest) communicator"
        );
        assert_eq!(inc.comm_id, DP);
        assert!(inc.chain.len() >= 2, "{:?}", inc.chain);
        assert!(inc
            .chain
            .last()
            .unwrap()
            .starts_with(&format!("root: rank {stopped} (pid {}", pid(stopped))));
        assert!(inc.evidence.len() >= 2);
    }
}

fn view() -> ProcView {
    let mut v = ProcView::default();
    for p in 0..4u32 {
        let pr: Proc = ("h".into(), pid(p));
        v.ranks.insert((DP, p), pr.clone());
        v.ranks.insert((TP[(p / 2) as usize], p % 2), pr.clone());
        v.procs.insert(
            pr,
            vec![
                Member {
                    comm_id: DP,
                    rank: p,
                    nranks: 4,
                    waiting: None,
                    p2p_waiting: None,
                },
                Member {
                    comm_id: TP[(p / 2) as usize],
                    rank: p % 2,
                    nranks: 2,
                    waiting: None,
                    p2p_waiting: None,
                },
            ],
        );
    }
    v
}

fn slow(comm: u64, rank: u32, p: u32, at: u64) -> Diagnosis {
    slow_with(comm, rank, p, at, &[])
}

fn slow_with(comm: u64, rank: u32, p: u32, at: u64, durs: &[(u32, u64)]) -> Diagnosis {
    Diagnosis {
        evidence: Some(wire::Evidence {
            ranks: durs
                .iter()
                .map(|&(rank, duration_ns)| wire::RankEvidence {
                    rank,
                    duration_ns,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        id: format!("{comm:x}-9-S1"),
        class: AnomalyClass::S1ComputationSlow as i32,
        roots: vec![RootCause {
            rank,
            pid: pid(p),
            host: "h".into(),
            reason: "computation late".into(),
            class: AnomalyClass::S1ComputationSlow as i32,
            ..Default::default()
        }],
        comm_id: comm,
        trace: Some(TraceId {
            comm_id: comm,
            op_counter: 9,
            extension: 0,
        }),
        detected_at_ns: at,
        ..Default::default()
    }
}

#[test]
fn slow_tp_partner_named_in_dp_is_followed_to_the_slow_rank() {
    // DP names process 2 (it waited in TP for 3); TP {2,3} names process 3. Either order,
    // within the hold: one incident, root process 3.
    for tp_first in [false, true] {
        let w = Duration::from_secs(2);
        let mut inc = Incidents::default();
        let v = view();
        // DP: 2 and 3 both arrive late (3 a little earlier), 0 and 1 wait ~20 ms.
        let dp = slow_with(
            DP,
            2,
            2,
            T0,
            &[(0, 20 * MS), (1, 20 * MS), (2, MS), (3, MS + MS / 10)],
        );
        // TP {2,3}: 2 waited for the slow 3.
        let tp = slow_with(TP[1], 1, 3, T0 + S, &[(0, 19 * MS), (1, MS / 2)]);
        if tp_first {
            inc.add(std::slice::from_ref(&tp), &v, w);
            inc.add(std::slice::from_ref(&dp), &v, w);
        } else {
            inc.add(std::slice::from_ref(&dp), &v, w);
            inc.flush(T0 + S / 2);
            assert!(inc.take().is_empty(), "held");
            inc.add(std::slice::from_ref(&tp), &v, w);
        }
        inc.flush(T0 + 10 * S);
        let got = inc.take();
        assert_eq!(got.len(), 1, "{got:#?}");
        assert_eq!(got[0].roots.len(), 1);
        assert_eq!(got[0].roots[0].pid, pid(3));
        assert_eq!(got[0].roots[0].rank, 3);
        assert_eq!(got[0].comm_id, DP);
        assert_eq!(got[0].class, AnomalyClass::S1ComputationSlow as i32);
    }
}

/// A slow diagnosis as the engine makes it: detailed evidence for the root only, and every
/// rank's duration in the deciding round.
fn slow_round(comm: u64, rank: u32, p: u32, at: u64, round: &[u64]) -> Diagnosis {
    let mut d = slow_with(comm, rank, p, at, &[(rank, round[rank as usize])]);
    if let Some(ev) = d.evidence.as_mut() {
        ev.round_durations_ns = round.to_vec();
    }
    d
}

#[test]
fn a_tp_rank_late_after_waiting_in_dp_for_the_slow_rank_is_its_victim() {
    // Process 0 computes slowly: DP names it (everyone else waited ~7 ms for it). Leaving
    // that DP AllReduce in ring order, process 2 enters its TP pair {2,3} ~1 ms after 3,
    // and TP names process 2. Process 2 waited far longer in DP for process 0 than 3 waited
    // for it in TP: one incident, root process 0, in either order within the hold.
    for tp_first in [false, true] {
        let w = Duration::from_secs(1);
        let mut inc = Incidents::default();
        let v = view();
        let dp = slow_round(DP, 0, 0, T0, &[MS / 5, 7 * MS, 7 * MS, 7 * MS]);
        let tp = slow_round(TP[1], 0, 2, T0 + S / 10, &[MS / 10, MS + MS / 10]);
        if tp_first {
            inc.add(std::slice::from_ref(&tp), &v, w);
            inc.add(std::slice::from_ref(&dp), &v, w);
        } else {
            inc.add(std::slice::from_ref(&dp), &v, w);
            inc.add(std::slice::from_ref(&tp), &v, w);
        }
        inc.flush(T0 + 10 * S);
        let got = inc.take();
        assert_eq!(got.len(), 1, "tp_first={tp_first}: {got:#?}");
        assert_eq!(got[0].roots.len(), 1);
        assert_eq!(got[0].roots[0].pid, pid(0));
        assert_eq!(got[0].comm_id, DP);
    }
}

#[test]
fn a_tp_rank_that_waited_little_in_dp_stays_its_own_root() {
    // The same shapes, but process 2 hardly waited in DP (0.3 ms) while 3 waited 5 ms for
    // it in TP: process 2 is slow itself, a second incident.
    let w = Duration::from_secs(1);
    let mut inc = Incidents::default();
    let v = view();
    let dp = slow_round(DP, 0, 0, T0, &[MS / 5, 7 * MS, MS / 2, 7 * MS]);
    let tp = slow_round(TP[1], 0, 2, T0 + S / 10, &[MS / 10, 5 * MS]);
    inc.add(&[dp, tp], &v, w);
    inc.flush(T0 + 10 * S);
    let mut pids: Vec<u32> = inc.take().iter().map(|i| i.roots[0].pid).collect();
    pids.sort_unstable();
    assert_eq!(pids, vec![pid(0), pid(2)]);
}

#[test]
fn unrelated_anomalies_stay_separate_incidents() {
    let mut inc = Incidents::default();
    let v = view();
    // Process 0 slow in TP0, process 3 slow in TP1: different roots, two incidents.
    inc.add(
        &[slow(TP[0], 0, 0, T0), slow(TP[1], 1, 3, T0)],
        &v,
        Duration::from_secs(1),
    );
    inc.flush(T0 + 5 * S);
    let got = inc.take();
    let mut pids: Vec<u32> = got.iter().map(|i| i.roots[0].pid).collect();
    pids.sort_unstable();
    assert_eq!(pids, vec![pid(0), pid(3)]);
}

#[test]
fn adopt_ids_copies_service_ids() {
    let d = slow(DP, 2, 2, T0);
    let mut i = from_diagnosis(&d);
    let mut served = d.clone();
    served.id = "s0-1".into();
    served.shard = "a:1".into();
    adopt_ids(&mut i, &[served]);
    assert_eq!(i.evidence[0].id, "s0-1");
    assert_eq!(i.evidence[0].shard, "a:1");
}

#[test]
fn a_rank_waiting_in_another_communicator_is_followed_there() {
    // DP #7 waits for 2 and 3; 3 is in flight in TP1 #4 waiting for TP rank 0 (process 2),
    // which is in flight nowhere: root 2 only, even with no TP diagnosis.
    let mut v = view();
    let p3: Proc = ("h".into(), pid(3));
    v.procs.get_mut(&p3).unwrap()[1].waiting = Some((4, CollKind::AllReduce as i32, vec![0]));
    let d = Diagnosis {
        id: "d0-7-H1".into(),
        class: AnomalyClass::H1NotEntered as i32,
        roots: [2u32, 3]
            .iter()
            .map(|&r| RootCause {
                rank: r,
                pid: pid(r),
                host: "h".into(),
                reason: "not entered".into(),
                class: AnomalyClass::H1NotEntered as i32,
                ..Default::default()
            })
            .collect(),
        comm_id: DP,
        trace: Some(TraceId {
            comm_id: DP,
            op_counter: 7,
            extension: 0,
        }),
        detected_at_ns: T0,
        ..Default::default()
    };
    let mut inc = Incidents::default();
    inc.add(&[d], &v, Duration::from_secs(1));
    inc.flush(T0);
    let got = inc.take();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].roots.iter().map(|r| r.pid).collect::<Vec<_>>(),
        vec![pid(2)]
    );
    assert_eq!(got[0].roots[0].rank, 2);
    assert_eq!(got[0].chain.len(), 3, "{:?}", got[0].chain);
    assert!(got[0].chain[0].contains("AllReduce #7 waits for ranks 2, 3"));
    assert!(got[0].chain[1].contains("rank 3 is in comm 0x0000000000000071 (2 ranks) AllReduce #4 (as rank 1) waiting for rank 0"));
    assert!(got[0].chain[2].starts_with("root: rank 2 (pid 102, host h)"));
}

fn h1(comm: u64, op: u64, roots: &[(u32, u32)], at: u64) -> Diagnosis {
    Diagnosis {
        id: format!("d{comm:x}-{op}-H1"),
        class: AnomalyClass::H1NotEntered as i32,
        roots: roots
            .iter()
            .map(|&(r, p)| RootCause {
                rank: r,
                pid: pid(p),
                host: "h".into(),
                reason: "not entered".into(),
                class: AnomalyClass::H1NotEntered as i32,
                ..Default::default()
            })
            .collect(),
        comm_id: comm,
        trace: Some(TraceId {
            comm_id: comm,
            op_counter: op,
            extension: 0,
        }),
        detected_at_ns: at,
        ..Default::default()
    }
}

#[test]
fn a_skipped_call_that_deadlocks_two_communicators_is_one_h2_on_the_skipper() {
    // Process `skipper` skipped DP AllReduce #7 and went on to its TP AllReduce #8, where
    // it waits for its partner; the partner and the other pair wait in DP #7 for it. Each
    // communicator names its own missing rank (H1); following either closes a cycle. Both
    // orders of arrival must give one incident: H2, root the skipper (3 ranks wait for it).
    for skipper in [3u32, 0] {
        let partner = skipper ^ 1;
        for dp_first in [true, false] {
            let mut v = view();
            let coll = CollKind::AllReduce as i32;
            for p in 0..4u32 {
                let pr: Proc = ("h".into(), pid(p));
                let ms = v.procs.get_mut(&pr).unwrap();
                if p == skipper {
                    ms[1].waiting = Some((8, coll, vec![partner % 2]));
                } else {
                    ms[0].waiting = Some((7, coll, vec![skipper]));
                }
            }
            let tp = TP[(skipper / 2) as usize];
            let dp_d = h1(DP, 7, &[(skipper, skipper)], T0);
            let tp_d = h1(tp, 8, &[(partner % 2, partner)], T0);
            let ds = if dp_first {
                vec![dp_d, tp_d]
            } else {
                vec![tp_d, dp_d]
            };
            let mut inc = Incidents::default();
            inc.add(&ds, &v, Duration::from_secs(1));
            inc.flush(T0);
            let got = inc.take();
            assert_eq!(
                got.len(),
                1,
                "skipper {skipper} dp_first {dp_first}: {got:#?}"
            );
            let g = &got[0];
            assert_eq!(g.class, AnomalyClass::H2Inconsistent as i32, "{g:#?}");
            assert_eq!(g.roots.len(), 1);
            assert_eq!((g.roots[0].pid, g.roots[0].rank), (pid(skipper), skipper));
            assert_eq!(g.roots[0].class, AnomalyClass::H2Inconsistent as i32);
            let why = &g.roots[0].reason;
            assert!(
                why.contains(
                    "3 ranks wait for it in comm 0x00000000000000d0 (4 ranks) AllReduce #7"
                ),
                "{why}"
            );
            assert!(
                why.contains(&format!("AllReduce #8 for rank {}", partner % 2)),
                "{why}"
            );
            assert!(g.summary.contains("H2"), "{}", g.summary);
        }
    }
}

/// A p2p record of process `p` (DP rank p) in DP: its `local`-th group, with items
/// (peer, send, pair sequence).
fn p2p(p: u32, local: u64, state: OpState, items: &[(u32, bool, u64)]) -> OpRecord {
    let mut r = rec(DP, local, p, 4, pid(p), state);
    r.seq_space = crate::wire::SeqSpace::P2p as i32;
    if let Some(op) = r.op.as_mut() {
        op.collective = CollKind::Recv as i32;
    }
    r.p2p = items
        .iter()
        .map(|&(peer, send, seq)| crate::wire::P2pPeerSeq {
            peer,
            send,
            seq,
            count: 4,
            dtype: 2,
        })
        .collect();
    r
}

#[test]
fn a_pipeline_receiver_waiting_for_a_stopped_stage_is_followed_to_it() {
    // DP over 4 processes, no TP; pipeline on DP: p sends to p + 2, receives from p - 2,
    // after each DP AllReduce. Process 0 stops after DP #5: process 2 waits in its Recv
    // from 0, processes 1 and 3 finish their pipeline step and wait in DP #6. DP #6
    // misses 0 and 2; only 0 is a root. Process 0 is stopped (silent) or stuck while its
    // diagnostic thread still reports (live).
    let cfg = EngineConfig {
        hang_threshold: Duration::from_secs(2),
        silent_after: Duration::from_secs(1),
        ..EngineConfig::default()
    };
    let items = |p: u32, s: u64| -> Vec<(u32, bool, u64)> {
        if p < 2 {
            vec![(p + 2, true, s)]
        } else {
            vec![(p - 2, false, s)]
        }
    };
    for (with_p2p, stopped) in [(true, true), (false, true), (true, false), (false, false)] {
        let mut e = Engine::new(cfg.clone());
        let mut t = T0;
        for k in 0..6u64 {
            for p in 0..4 {
                e.ingest(&rec(DP, k, p, 4, pid(p), OpState::Completed), t)
                    .unwrap();
            }
            for p in 0..4 {
                if k == 5 && p == 0 {
                    continue; // stopped before its Send of step 5
                }
                let last = k == 5 && p == 2;
                let state = if last {
                    OpState::InFlight
                } else {
                    OpState::Completed
                };
                if with_p2p || !last {
                    e.ingest(&p2p(p, k, state, &items(p, k)), t).unwrap();
                }
            }
            t += 50 * MS;
        }
        for p in [1, 3] {
            e.ingest(&rec(DP, 6, p, 4, pid(p), OpState::InFlight), t)
                .unwrap();
        }
        let mut incidents = Vec::new();
        for i in 1..60 {
            let now = t + i * 100 * MS;
            for p in (if stopped { 1 } else { 0 })..4u32 {
                let dp = if p == 2 || p == 0 { 5 } else { 6 };
                e.heartbeat(
                    &Heartbeat {
                        host: "h".into(),
                        pid: pid(p),
                        ranks: vec![RankMembership {
                            comm_id: DP,
                            rank: p,
                            nranks: 4,
                            last_op_counter: Some(dp),
                            last_p2p_counter: Some(6),
                            last_call_error: None,
                        }],
                        records_dropped: 0,
                        time_ns: 0,
                    },
                    now,
                );
            }
            e.tick(now);
            incidents.extend(e.take_incidents());
        }
        assert_eq!(incidents.len(), 1, "{incidents:#?}");
        let roots: Vec<u32> = incidents[0].roots.iter().map(|r| r.pid).collect();
        let chain_through_recv = incidents[0]
            .chain
            .iter()
            .any(|c| c.contains("Recv #5") && c.contains("waiting for rank 0"));
        if stopped {
            // Process 0 is silent and process 2 still reports: a live rank that did not
            // enter is held up by the stopped one, which alone is named (`locate_hang`),
            // whether or not the receiver's in-flight record says what it waits for.
            // Before that rule both were named without it.
            assert_eq!(roots, vec![pid(0)], "{:#?}", incidents[0]);
        } else if with_p2p {
            // Both live: the receiver's in-flight Recv leads to process 0.
            assert_eq!(roots, vec![pid(0)], "{:#?}", incidents[0]);
            assert!(chain_through_recv, "{:?}", incidents[0].chain);
        } else {
            // Without the receiver's in-flight record nothing says it waits: both named.
            assert_eq!(roots, vec![pid(0), pid(2)], "{:#?}", incidents[0]);
        }
    }
}
