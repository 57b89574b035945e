//! Failure records through the whole engine: exact class, root and observers.

use std::time::Duration;

use crate::engine::{Engine, EngineConfig};
use crate::wire::{
    AnomalyClass, ChannelStat, CollKind, DescriptorMismatch, FailureCause, Heartbeat, OpDescriptor,
    OpRecord, OpState, OpTypeSet, PeerLost, RankMembership, TraceId,
};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;
const T0: u64 = 1_000 * S;

fn cfg() -> EngineConfig {
    EngineConfig {
        hang_threshold: Duration::from_secs(5),
        silent_after: Duration::from_secs(2),
        ..EngineConfig::default()
    }
}

fn rec(comm: u64, c: u64, rank: u32, n: u32, state: OpState, coll: CollKind) -> OpRecord {
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
        op: Some(OpTypeSet {
            collective: coll as i32,
            bytes: 4096,
            count: 1024,
            dtype: 7,
            redop: 0,
            root: -1,
            peer: -1,
            n_channels: 1,
            ..Default::default()
        }),
        start_ns: c * S,
        duration_ns: MS,
        channels: vec![ChannelStat::default()],
        state: state as i32,
        seq: c,
        device: -1,
        ..Default::default()
    }
}

fn lost(comm: u64, c: u64, rank: u32, n: u32, dead: u32) -> OpRecord {
    let mut r = rec(comm, c, rank, n, OpState::Failed, CollKind::AllReduce);
    r.failure = FailureCause::PeerLost as i32;
    r.peer_lost = Some(PeerLost {
        rank: dead,
        pid: 100 + dead,
        host: format!("h{dead}"),
        detail: "process exited".into(),
    });
    r
}

fn desc(seq: u64, coll: CollKind, count: u64) -> OpDescriptor {
    OpDescriptor {
        seq,
        collective: coll as i32,
        dtype: 7,
        redop: 0,
        count,
        root: -1,
    }
}

/// Healthy rounds 0..k on every rank, then everyone heartbeats.
fn warm(e: &mut Engine, comm: u64, n: u32, k: u64, t: &mut u64) {
    for c in 0..k {
        for r in 0..n {
            e.ingest(
                &rec(comm, c, r, n, OpState::Completed, CollKind::AllReduce),
                *t,
            )
            .unwrap();
        }
        *t += 10 * MS;
    }
    assert!(e.tick(*t).is_empty());
}

#[test]
fn peer_lost_from_some_survivors_is_h1_process_exited_within_grace() {
    for dead in [0u32, 2, 3] {
        let mut e = Engine::new(cfg());
        let mut t = T0;
        warm(&mut e, 9, 4, 3, &mut t);
        // Only two of the three survivors report; the dead rank sends nothing more.
        let survivors: Vec<u32> = (0..4).filter(|r| *r != dead).take(2).collect();
        let first = t;
        for &s in &survivors {
            e.ingest(&lost(9, 3, s, 4, dead), t).unwrap();
            t += 20 * MS;
        }
        assert!(e.tick(t).is_empty(), "fires only after the grace");
        let mut got = Vec::new();
        let mut now = t;
        while got.is_empty() && now < first + 2 * S {
            now += 100 * MS;
            got = e.tick(now);
        }
        assert_eq!(got.len(), 1, "dead {dead}: {got:?}");
        let d = &got[0];
        assert!(now - first <= 2 * S);
        assert_eq!(d.class, AnomalyClass::H1NotEntered as i32);
        assert_eq!(d.roots.len(), 1);
        let r = &d.roots[0];
        assert_eq!(r.rank, dead);
        assert_eq!(r.pid, 100 + dead);
        assert_eq!(r.host, format!("h{dead}"));
        assert_eq!(r.reason, "process exited");
        assert!(r.exited);
        assert_eq!(r.observed_by, survivors);
        assert_eq!(d.trace.unwrap().op_counter, 3);
        let mut inc = e.take_incidents();
        while inc.is_empty() && now < first + 2 * S {
            now += 100 * MS;
            assert!(e.tick(now).is_empty());
            inc = e.take_incidents();
        }
        assert!(
            now - first <= 2 * S,
            "incident within 2 s of the first record"
        );
        assert_eq!(inc.len(), 1);
        assert_eq!(inc[0].roots[0].rank, dead);
        assert!(inc[0].roots[0].exited);
        // Heartbeats of the dead rank stopped: no later hang / silent diagnosis repeats it.
        for k in 1..30 {
            let hb = Heartbeat {
                host: "h".into(),
                pid: 100 + survivors[0],
                ranks: vec![RankMembership {
                    comm_id: 9,
                    rank: survivors[0],
                    nranks: 4,
                    last_op_counter: Some(3),
                    last_p2p_counter: None,
                    last_call_error: None,
                }],
                records_dropped: 0,
                time_ns: 0,
            };
            e.heartbeat(&hb, now + k * S);
            assert!(e.tick(now + k * S).is_empty());
        }
    }
}

#[test]
fn survivors_that_exit_later_are_not_roots() {
    let mut e = Engine::new(cfg());
    let mut t = T0;
    warm(&mut e, 1, 4, 2, &mut t);
    e.ingest(&lost(1, 2, 0, 4, 2), t).unwrap();
    // Rank 1 saw rank 2 die, then rank 0 exited too and rank 3 saw that.
    e.ingest(&lost(1, 2, 1, 4, 2), t + MS).unwrap();
    e.ingest(&lost(1, 2, 3, 4, 0), t + 2 * MS).unwrap();
    let d = e.tick(t + S);
    assert_eq!(d.len(), 1);
    let roots: Vec<u32> = d[0].roots.iter().map(|r| r.rank).collect();
    assert_eq!(roots, vec![2]);
    assert_eq!(d[0].roots[0].observed_by, vec![0, 1]);
}

fn inconsistent(
    comm: u64,
    c: u64,
    rank: u32,
    n: u32,
    local: OpDescriptor,
    peer: u32,
    remote: OpDescriptor,
) -> OpRecord {
    let mut r = rec(
        comm,
        c,
        rank,
        n,
        OpState::Failed,
        CollKind::try_from(local.collective).unwrap(),
    );
    r.failure = FailureCause::Inconsistent as i32;
    r.mismatch = Some(DescriptorMismatch {
        peer_rank: peer,
        local: Some(local),
        remote: Some(remote),
        channel: 0,
    });
    r
}

#[test]
fn inconsistent_call_names_the_minority_rank_and_victims_only_vote() {
    for bad in [0u32, 1, 3] {
        let n = 4;
        let mut e = Engine::new(cfg());
        let mut t = T0;
        warm(&mut e, 5, n, 5, &mut t);
        let good = desc(5, CollKind::AllReduce, 1024);
        let wrong = desc(5, CollKind::AllGather, 256);
        // Ring: bad's successor detects it; bad's own view comes from its predecessor.
        let next = (bad + 1) % n;
        let prev = (bad + n - 1) % n;
        e.ingest(&inconsistent(5, 5, next, n, good, bad, wrong), t)
            .unwrap();
        e.ingest(&inconsistent(5, 5, bad, n, wrong, prev, good), t + MS)
            .unwrap();
        // The others are told by a peer: victims.
        for r in (0..n).filter(|r| *r != next && *r != bad) {
            let mut v = rec(5, 5, r, n, OpState::Failed, CollKind::AllReduce);
            v.failure = FailureCause::PeerFailed as i32;
            e.ingest(&v, t + 2 * MS).unwrap();
        }
        let d = e.tick(t + S);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].class, AnomalyClass::H2Inconsistent as i32);
        let roots: Vec<u32> = d[0].roots.iter().map(|r| r.rank).collect();
        assert_eq!(roots, vec![bad]);
        assert!(d[0].roots[0].reason.contains("AllGather"));
        assert!(d[0].roots[0].observed_by.contains(&next));
    }
}

/// The real job's shape (DP comm with pipeline Send/Recv): the victims' records count
/// every operation (`op_counter` 9) while the descriptors count collectives (seq 5). The
/// victims still vote with the descriptor of their call, so the detecting rank is in the
/// majority and only the rank that called differently is named.
#[test]
fn victims_whose_op_counter_is_not_the_descriptor_seq_still_vote_with_their_call() {
    for detectors in [vec![3u32], vec![3, 2]] {
        let n = 4;
        let mut e = Engine::new(cfg());
        let mut t = T0;
        warm(&mut e, 8, n, 5, &mut t);
        let good = desc(5, CollKind::AllReduce, 1024);
        let wrong = desc(5, CollKind::AllGather, 256);
        e.ingest(&inconsistent(8, 9, 3, n, good, 2, wrong), t)
            .unwrap();
        if detectors.contains(&2) {
            e.ingest(&inconsistent(8, 9, 2, n, wrong, 1, good), t + MS)
                .unwrap();
        }
        for r in (0..n).filter(|r| !detectors.contains(r)) {
            let coll = if r == 2 {
                CollKind::AllGather
            } else {
                CollKind::AllReduce
            };
            let mut v = rec(8, 9, r, n, OpState::Failed, coll);
            v.failure = FailureCause::PeerFailed as i32;
            e.ingest(&v, t + 2 * MS).unwrap();
        }
        let d = e.tick(t + S);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].class, AnomalyClass::H2Inconsistent as i32);
        let roots: Vec<u32> = d[0].roots.iter().map(|r| r.rank).collect();
        assert_eq!(roots, vec![2], "detectors {detectors:?}: {d:?}");
        assert!(d[0].roots[0].reason.contains("AllGather"), "{d:?}");
    }
}

/// A victim whose call matches two checked descriptors up to the sequence (a skipped
/// call) does not vote; a victim with no checked descriptor like its call votes as is.
#[test]
fn ambiguous_victims_abstain_and_unmatched_ones_vote_as_they_are() {
    use super::{resolve_votes, Vote};
    let ar = |seq: u64| (seq, CollKind::AllReduce as i32, 7u32, 0i32, 1024u64, -1i32);
    let ag = (9u64, CollKind::AllGather as i32, 7u32, 0i32, 256u64, -1i32);
    let mut descs = std::collections::BTreeMap::new();
    descs.insert(
        0,
        Vote {
            desc: ar(4),
            checked: true,
        },
    );
    descs.insert(
        1,
        Vote {
            desc: ar(5),
            checked: true,
        },
    );
    descs.insert(
        2,
        Vote {
            desc: ar(9),
            checked: false,
        },
    );
    descs.insert(
        3,
        Vote {
            desc: ag,
            checked: false,
        },
    );
    let v = resolve_votes(&descs);
    assert_eq!(v.get(&0), Some(&ar(4)));
    assert_eq!(v.get(&1), Some(&ar(5)));
    assert_eq!(v.get(&2), None, "ambiguous: abstains");
    assert_eq!(v.get(&3), Some(&ag), "nothing like it checked: votes as is");
    // Without any checked descriptor every call votes as it is.
    descs.retain(|r, _| *r >= 2);
    let v = resolve_votes(&descs);
    assert_eq!(v.get(&2), Some(&ar(9)));
}

#[test]
fn skipped_call_is_the_rank_whose_sequence_is_off() {
    let n = 4;
    let mut e = Engine::new(cfg());
    let mut t = T0;
    warm(&mut e, 6, n, 4, &mut t);
    // Rank 2 skipped #4: its call is #5 while the others are in #4.
    e.ingest(
        &inconsistent(
            6,
            4,
            3,
            n,
            desc(4, CollKind::AllReduce, 1024),
            2,
            desc(5, CollKind::AllReduce, 1024),
        ),
        t,
    )
    .unwrap();
    for r in [0, 1] {
        let mut v = rec(6, 4, r, n, OpState::Failed, CollKind::AllReduce);
        v.failure = FailureCause::PeerFailed as i32;
        e.ingest(&v, t).unwrap();
    }
    let d = e.tick(t + S);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].class, AnomalyClass::H2Inconsistent as i32);
    assert_eq!(
        d[0].roots.iter().map(|r| r.rank).collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(
        d[0].roots[0].pid, 102,
        "pid known from the rank's earlier records"
    );
}

#[test]
fn other_causes_are_classified_by_cause_and_abort_raises_nothing() {
    let n = 2;
    for (cause, class) in [
        (FailureCause::InvalidUsage, Some(AnomalyClass::H1NotEntered)),
        (FailureCause::Internal, Some(AnomalyClass::H3Hardware)),
        (FailureCause::Aborted, None),
    ] {
        let mut e = Engine::new(cfg());
        let mut t = T0;
        warm(&mut e, 8, n, 2, &mut t);
        let mut r = rec(8, 2, 1, n, OpState::Failed, CollKind::AllReduce);
        r.failure = cause as i32;
        e.ingest(&r, t).unwrap();
        let mut a = rec(8, 2, 0, n, OpState::InFlight, CollKind::AllReduce);
        a.duration_ns = 0;
        e.ingest(&a, t).unwrap();
        let d = e.tick(t + S);
        match class {
            Some(c) => {
                assert_eq!(d.len(), 1);
                assert_eq!(d[0].class, c as i32);
                assert_ne!(d[0].class, AnomalyClass::H2Inconsistent as i32);
                assert_eq!(d[0].roots[0].rank, 1);
            }
            None => assert!(d.is_empty(), "{d:?}"),
        }
    }
}

#[test]
fn the_hang_of_the_failed_round_is_not_a_second_incident() {
    let mut e = Engine::new(cfg());
    let mut t = T0;
    warm(&mut e, 3, 4, 2, &mut t);
    // Ranks 0, 1 in flight in #2; rank 3 dead; rank 1 fails.
    for r in [0, 1, 2] {
        let mut x = rec(3, 2, r, 4, OpState::InFlight, CollKind::AllReduce);
        x.duration_ns = 0;
        e.ingest(&x, t).unwrap();
    }
    e.ingest(&lost(3, 2, 1, 4, 3), t + 100 * MS).unwrap();
    let d = e.tick(t + S);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].roots[0].rank, 3);
    assert!(e.tick(t + 10 * S).is_empty(), "hang of #2 absorbed");
}

/// `r` as rank `rank` of communicator `comm` for the process of global rank `g`
/// (pid 100 + g, host h{g}).
fn as_proc(mut r: OpRecord, g: u32) -> OpRecord {
    r.pid = 100 + g;
    r.host = format!("h{g}");
    r
}

/// Two TP pairs {0, 1} and {2, 3} (comms 21, 22) inside one DP communicator of four
/// processes (comm 20). Process 3 is killed; its TP partner, process 2, fails its TP call
/// (PEER_LOST), then exits on that error, and the DP survivors see process 2 lost.
fn tp_partner_exits(dp_sees_root_too: bool) -> Vec<crate::wire::Diagnosis> {
    let mut e = Engine::new(cfg());
    let mut t = T0;
    warm(&mut e, 20, 4, 3, &mut t);
    for (comm, pair) in [(21u64, [0u32, 1]), (22, [2, 3])] {
        for c in 0..3 {
            for (r, g) in pair.iter().enumerate() {
                let x = rec(
                    comm,
                    c,
                    r as u32,
                    2,
                    OpState::Completed,
                    CollKind::AllReduce,
                );
                e.ingest(&as_proc(x, *g), t).unwrap();
            }
        }
    }
    assert!(e.tick(t).is_empty());
    // Process 2 (TP rank 0 of comm 22) reports its partner lost, flushed before it exits.
    let mut tp = as_proc(lost(22, 3, 0, 2, 1), 2);
    tp.peer_lost.as_mut().unwrap().pid = 103;
    tp.peer_lost.as_mut().unwrap().host = "h3".into();
    e.ingest(&tp, t).unwrap();
    // The DP survivors see process 2 gone (and in one variant process 3 as well).
    e.ingest(&lost(20, 3, 0, 4, 2), t + 50 * MS).unwrap();
    let second = if dp_sees_root_too { 3 } else { 2 };
    e.ingest(&lost(20, 3, 1, 4, second), t + 60 * MS).unwrap();
    e.tick(t + S)
}

#[test]
fn a_process_that_failed_in_another_communicator_is_a_survivor_not_a_root() {
    for dp_sees_root_too in [false, true] {
        let mut d = tp_partner_exits(dp_sees_root_too);
        d.sort_by_key(|x| x.comm_id);
        assert_eq!(d.len(), 2, "{dp_sees_root_too}: {d:?}");
        // DP: rank 3 (process 3), found through the survivor when nobody in DP saw it.
        assert_eq!(d[0].comm_id, 20);
        let roots: Vec<(u32, u32)> = d[0].roots.iter().map(|r| (r.rank, r.pid)).collect();
        assert_eq!(roots, vec![(3, 103)], "{dp_sees_root_too}: {:?}", d[0]);
        assert!(d[0].roots[0].exited);
        // Who leads to it: DP rank 1 saw it, or else the survivor (DP rank 2).
        let via = if dp_sees_root_too { vec![1] } else { vec![2] };
        assert_eq!(d[0].roots[0].observed_by, via);
        // TP: its rank 1 (process 3).
        assert_eq!(d[1].comm_id, 22);
        assert_eq!(d[1].roots[0].rank, 1);
        assert_eq!(d[1].roots[0].pid, 103);
    }
}

#[test]
fn a_failure_reported_after_the_loss_was_seen_does_not_make_a_survivor() {
    let mut e = Engine::new(cfg());
    let mut t = T0;
    warm(&mut e, 30, 4, 3, &mut t);
    // Rank 2 is seen lost in comm 30 first; a report of its process in comm 31 arrives
    // only afterwards (it cannot have been alive before the loss was seen).
    e.ingest(&lost(30, 3, 0, 4, 2), t).unwrap();
    let late = as_proc(lost(31, 0, 0, 2, 1), 2);
    e.ingest(&late, t + 10 * MS).unwrap();
    let d: Vec<_> = e
        .tick(t + S)
        .into_iter()
        .filter(|d| d.comm_id == 30)
        .collect();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].roots[0].rank, 2);
}

#[test]
fn an_old_failure_report_of_a_reused_pid_does_not_make_a_survivor() {
    let mut e = Engine::new(cfg());
    let mut t = T0;
    // Process 102 reported a failure in comm 41 long ago (then exited; its pid is reused).
    e.ingest(&as_proc(lost(41, 0, 0, 2, 1), 2), t).unwrap();
    e.tick(t + S);
    t += 120 * S;
    warm(&mut e, 40, 4, 3, &mut t);
    // The new process with pid 102 is rank 2 of comm 40 and is killed.
    e.ingest(&lost(40, 3, 0, 4, 2), t).unwrap();
    let d: Vec<_> = e
        .tick(t + S)
        .into_iter()
        .filter(|d| d.comm_id == 40)
        .collect();
    assert_eq!(d.len(), 1);
    let roots: Vec<u32> = d[0].roots.iter().map(|r| r.rank).collect();
    assert_eq!(roots, vec![2]);
}

/// DP over four processes (comm 50) and a TP pair {0, 1} (comm 51). Process 3 is killed
/// and named. Process 0 then exits on its own error, but its failure report never
/// reaches the analyzer (a flush cut short at exit), and its TP partner reports it lost.
/// Process 0 survived a death already diagnosed: the same incident, not a new root.
/// (Seen once in CI as `sigkill_8_root7_serve`: `H1 [7] exited (+1: H1 [0] exited)`.)
fn survivor_exits_after_a_diagnosed_death(tp_loss_after_ms: u64) -> Vec<crate::wire::Diagnosis> {
    let mut e = Engine::new(cfg());
    let mut t = T0;
    warm(&mut e, 50, 4, 3, &mut t);
    for c in 0..3 {
        for r in 0..2u32 {
            let x = rec(51, c, r, 2, OpState::Completed, CollKind::AllReduce);
            e.ingest(&as_proc(x, r), t).unwrap();
        }
    }
    assert!(e.tick(t).is_empty());
    // DP survivors 1 and 2 report process 3 lost (process 0's report is lost).
    e.ingest(&lost(50, 3, 1, 4, 3), t).unwrap();
    e.ingest(&lost(50, 3, 2, 4, 3), t + 10 * MS).unwrap();
    let mut out = e.tick(t + 400 * MS);
    // Process 0 exits; its TP partner (process 1) reports it lost.
    let tp = as_proc(lost(51, 3, 1, 2, 0), 1);
    e.ingest(&tp, t + tp_loss_after_ms * MS).unwrap();
    out.extend(e.tick(t + tp_loss_after_ms * MS + S));
    out
}

#[test]
fn a_survivor_that_exits_after_a_diagnosed_death_is_not_a_new_root() {
    for after_ms in [200, 600, 3_000] {
        let d = survivor_exits_after_a_diagnosed_death(after_ms);
        let roots: Vec<(u64, Vec<u32>)> = d
            .iter()
            .map(|x| (x.comm_id, x.roots.iter().map(|r| r.rank).collect()))
            .collect();
        assert_eq!(
            roots,
            vec![(50, vec![3])],
            "TP loss after {after_ms} ms: {d:?}"
        );
    }
}

/// The same cascade, with both episodes due in one tick: process 3 dies, the DP survivors
/// report it, process 0 exits on its error and its TP partner reports it lost 100 ms
/// later, all before the first diagnosis. Whatever the communicator ids' order, the death
/// seen first is diagnosed first and the later loss is its survivor.
/// (Seen in CI as `sigkill_8_root7_serve`: `H1 [2] exited (+1: H1 [7] exited)`, the TP
/// communicator's id being the smaller.)
fn survivor_exit_due_in_the_same_tick(dp: u64, tp: u64) -> Vec<crate::wire::Diagnosis> {
    let mut e = Engine::new(cfg());
    let mut t = T0;
    warm(&mut e, dp, 4, 3, &mut t);
    for c in 0..3 {
        for r in 0..2u32 {
            let x = rec(tp, c, r, 2, OpState::Completed, CollKind::AllReduce);
            e.ingest(&as_proc(x, r), t).unwrap();
        }
    }
    assert!(e.tick(t).is_empty());
    e.ingest(&lost(dp, 3, 1, 4, 3), t).unwrap();
    e.ingest(&lost(dp, 3, 2, 4, 3), t + 10 * MS).unwrap();
    e.ingest(&as_proc(lost(tp, 3, 1, 2, 0), 1), t + 100 * MS)
        .unwrap();
    e.tick(t + S)
}

#[test]
fn the_death_seen_first_is_diagnosed_first_whatever_the_ids() {
    for (dp, tp) in [(50, 51), (61, 60)] {
        let d = survivor_exit_due_in_the_same_tick(dp, tp);
        let roots: Vec<(u64, Vec<u32>)> = d
            .iter()
            .map(|x| (x.comm_id, x.roots.iter().map(|r| r.rank).collect()))
            .collect();
        assert_eq!(roots, vec![(dp, vec![3])], "DP {dp}, TP {tp}: {d:?}");
    }
}

#[test]
fn a_death_long_after_a_diagnosed_one_is_a_new_root() {
    // 40 s later (past FAILURE_QUIET) the same loss is a root of its own.
    let d = survivor_exits_after_a_diagnosed_death(40_000);
    let roots: Vec<(u64, Vec<u32>)> = d
        .iter()
        .map(|x| (x.comm_id, x.roots.iter().map(|r| r.rank).collect()))
        .collect();
    assert_eq!(roots, vec![(50, vec![3]), (51, vec![0])], "{d:?}");
}

#[test]
fn make_room_evicts_the_oldest_only_for_a_new_key_in_a_full_map() {
    use std::collections::HashMap;
    let mut m: HashMap<u32, u64> = [(1, 30), (2, 10), (3, 20)].into_iter().collect();
    super::make_room(&mut m, &2, 3, |t| *t);
    assert_eq!(m.len(), 3, "a present key takes no room");
    super::make_room(&mut m, &9, 4, |t| *t);
    assert_eq!(m.len(), 3, "room left");
    super::make_room(&mut m, &9, 3, |t| *t);
    let mut keys: Vec<u32> = m.keys().copied().collect();
    keys.sort_unstable();
    assert_eq!(keys, vec![1, 3], "the oldest (2, at 10) went");
}
