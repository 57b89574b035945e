//! Tests of the location rules (`locate.rs`).

use super::*;

fn hv(state: HangState) -> HangView {
    HangView {
        state,
        silent: false,
        type_group: 0,
        send: 10,
        recv: 10,
        exp_send: 0,
        exp_recv: 0,
        group: 0,
        depth: 0,
    }
}

#[test]
fn h1_not_entered_ranks_win_over_everything() {
    let mut v = vec![hv(HangState::InFlight); 6];
    v[4].state = HangState::NotEntered;
    v[4].type_group = u32::MAX;
    v[1].state = HangState::Completed; // would be H2 otherwise
    v[2].silent = true;
    let f = locate_hang(&v, &[]);
    assert_eq!(f, HangFinding::NotEntered(vec![4]));
    assert_eq!(f.class(), AnomalyClass::H1NotEntered);
}

#[test]
fn h2_type_set_minority_then_not_hung_ranks() {
    let mut v = vec![hv(HangState::InFlight); 5];
    v[3].type_group = 1;
    assert_eq!(
        locate_hang(&v, &[]),
        HangFinding::InconsistentTypes(vec![3])
    );
    // 2 vs 2 vs 1: the tie between groups 0 and 1 goes to the first seen (0).
    v[0].type_group = 1;
    v[4].type_group = 2;
    assert_eq!(
        locate_hang(&v, &[]),
        HangFinding::InconsistentTypes(vec![0, 3, 4])
    );
    let mut w = vec![hv(HangState::InFlight); 5];
    w[0].state = HangState::Completed;
    w[2].state = HangState::PassedBeyond;
    w[2].type_group = u32::MAX;
    w[3].state = HangState::EnteredNoRecord; // counts as hung
    w[3].type_group = u32::MAX;
    let f = locate_hang(&w, &[]);
    assert_eq!(f, HangFinding::NotHung(vec![0, 2]));
    assert_eq!(f.class(), AnomalyClass::H2Inconsistent);
}

/// Ring 0 -> 1 -> 2 -> 3 -> 0 with expected counts 6/6: ranks 0 and 1 completed in
/// full, 2 and 3 hang with part of their data (host 2's link went down after the last
/// data into 0 and 1 had passed).
fn ring_completed_in_part() -> (Vec<HangView>, Vec<Vec<u32>>) {
    let mut v = vec![hv(HangState::InFlight); 4];
    for x in &mut v {
        (x.exp_send, x.exp_recv) = (6, 6);
    }
    for x in &mut v[..2] {
        x.state = HangState::Completed;
        (x.send, x.recv) = (6, 6);
    }
    (v[2].send, v[2].recv) = (6, 5);
    (v[3].send, v[3].recv) = (5, 5);
    (v, vec![vec![1, 2, 3, 0]; 2])
}

#[test]
fn a_hung_rank_whose_upstream_completed_in_full_is_starved_not_the_completers() {
    let (v, rings) = ring_completed_in_part();
    let f = locate_hang(&v, &rings);
    assert_eq!(f, HangFinding::Starved(vec![2]));
    assert_eq!(f.class(), AnomalyClass::H3Hardware);
    // Without the rings (a tree, or unknown) the completers stay the H2 answer.
    assert_eq!(locate_hang(&v, &[]), HangFinding::NotHung(vec![0, 1]));
    // Channels with different ring orders: summed counts cannot speak for one link.
    let varied = vec![vec![1, 2, 3, 0], vec![3, 0, 1, 2]];
    assert_eq!(locate_hang(&v, &varied), HangFinding::NotHung(vec![0, 1]));
    // A stopped rank among the hung ones is named before a link.
    let mut w = v.clone();
    w[3].silent = true;
    let f = locate_hang(&w, &rings);
    assert_eq!(f, HangFinding::Silent(vec![3]));
    assert_eq!(f.class(), AnomalyClass::H1NotEntered);
}

#[test]
fn a_completer_short_of_its_schedule_or_a_failed_rank_keeps_h2() {
    let (v, rings) = ring_completed_in_part();
    // Rank 1 completed having sent less than the schedule: it ran another operation.
    let mut w = v.clone();
    w[1].send = 3;
    assert_eq!(locate_hang(&w, &rings), HangFinding::NotHung(vec![0, 1]));
    // Rank 1 completed a schedule of other expected counts than its peers'.
    let mut w = v.clone();
    (w[1].exp_send, w[1].exp_recv, w[1].send, w[1].recv) = (3, 3, 3, 3);
    assert_eq!(locate_hang(&w, &rings), HangFinding::NotHung(vec![0, 1]));
    // Expected counts unknown: nothing says the completion was in full.
    let mut w = v.clone();
    for x in &mut w {
        (x.exp_send, x.exp_recv) = (0, 0);
    }
    assert_eq!(locate_hang(&w, &rings), HangFinding::NotHung(vec![0, 1]));
    // A rank whose operation failed is not a clean completion.
    let mut w = v.clone();
    w[0].state = HangState::Failed;
    assert_eq!(locate_hang(&w, &rings), HangFinding::NotHung(vec![0, 1]));
    // Entered by its heartbeat, no record of the round yet: counts unknown, still named.
    let mut w = v.clone();
    w[2] = hv(HangState::EnteredNoRecord);
    assert_eq!(locate_hang(&w, &rings), HangFinding::Starved(vec![2]));
    // The rank after the completers received everything (it waits on its sends only):
    // nothing was lost on the way into it.
    let mut w = v;
    w[2].recv = 6;
    assert_eq!(locate_hang(&w, &rings), HangFinding::NotHung(vec![0, 1]));
}

/// Rank 4's process is stopped before the round and rank 0, still reporting, did not
/// enter either: it waits on rank 4 through another communicator (8 processes of the C
/// client, DP + TP + pipeline, SIGSTOP of rank 4: H1 [0, 4] before this rule). Only the
/// stopped rank is named; without a stopped one, every rank that did not enter.
#[test]
fn a_stopped_rank_that_did_not_enter_is_named_before_a_live_one() {
    let mut v = vec![hv(HangState::InFlight); 8];
    v[0].state = HangState::NotEntered;
    v[4].state = HangState::NotEntered;
    v[4].silent = true;
    let f = locate_hang(&v, &[]);
    assert_eq!(f, HangFinding::NotEntered(vec![4]));
    assert_eq!(f.class(), AnomalyClass::H1NotEntered);
    v[6].state = HangState::NotEntered;
    v[6].silent = true;
    assert_eq!(locate_hang(&v, &[]), HangFinding::NotEntered(vec![4, 6]));
    v[4].silent = false;
    v[6].silent = false;
    assert_eq!(locate_hang(&v, &[]), HangFinding::NotEntered(vec![0, 4, 6]));
}

#[test]
fn ranks_not_involved_in_a_p2p_round_are_ignored() {
    let mut v = vec![hv(HangState::NotInvolved); 6];
    v[1] = hv(HangState::InFlight);
    v[4] = hv(HangState::InFlight);
    v[4].send = 2;
    v[0].silent = true;
    assert_eq!(locate_hang(&v, &[]), HangFinding::FewestCounts(vec![4]));
    v[4].state = HangState::NotEntered;
    assert_eq!(locate_hang(&v, &[]), HangFinding::NotEntered(vec![4]));
}

#[test]
fn a_silent_rank_in_flight_is_h1_else_fewest_counts_h3() {
    let mut v = vec![hv(HangState::InFlight); 4];
    v[2].silent = true;
    v[0].send = 1;
    let f = locate_hang(&v, &[]);
    assert_eq!(f, HangFinding::Silent(vec![2]));
    assert_eq!(f.class(), AnomalyClass::H1NotEntered);
    v[2].silent = false;
    let f = locate_hang(&v, &[]);
    assert_eq!(f, HangFinding::FewestCounts(vec![0]));
    assert_eq!(f.class(), AnomalyClass::H3Hardware);
    // Everyone silent is no discrimination: fall back to counts.
    for x in &mut v {
        x.silent = true;
    }
    assert_eq!(locate_hang(&v, &[]), HangFinding::FewestCounts(vec![0]));
}

fn cv(send: u64, recv: u64, group: u64) -> CountView {
    CountView {
        send,
        recv,
        group,
        ..Default::default()
    }
}

#[test]
fn fewest_counts_ring_uses_send_plus_recv() {
    // Stalled rank 1 at s = 5: (5, 5); its successor (6, 5); others further.
    let v = [cv(9, 8, 0), cv(5, 5, 0), cv(6, 5, 0), cv(7, 6, 0)];
    assert_eq!(fewest_counts(&v), vec![1]);
    let tie = [cv(4, 4, 0), cv(9, 9, 0), cv(4, 4, 0)];
    assert_eq!(fewest_counts(&tie), vec![0, 2]);
}

#[test]
fn fewest_counts_without_expected_compares_within_layers() {
    // Layer A (group 1): max 100, rank 1 at 60 = 0.6 of its layer.
    // Layer B (group 2): max 300, rank 3 at 0.8, rank 4 at 0.667.
    let v = [
        cv(50, 50, 1),
        cv(30, 30, 1),
        cv(150, 150, 2),
        cv(120, 120, 2),
        cv(100, 100, 2),
    ];
    assert_eq!(fewest_counts(&v), vec![1]);
    // group 2: 120/300 = 0.4 < group 1: 90/100 = 0.9; absolute 120 > 90 would pick rank 1.
    let w = [cv(50, 50, 1), cv(45, 45, 1), cv(150, 150, 2), cv(60, 60, 2)];
    assert_eq!(fewest_counts(&w), vec![3]);
    // Single-rank groups only: absolute fallback.
    assert_eq!(
        fewest_counts(&[cv(5, 5, 1), cv(3, 3, 2), cv(9, 9, 3)]),
        vec![1]
    );
    assert_eq!(fewest_counts(&[]), Vec::<u32>::new());
}

#[test]
fn fewest_counts_with_expected_uses_fractions_and_prefers_the_deepest_tie() {
    let x = |send, recv, es, er, depth| CountView {
        send,
        recv,
        exp_send: es,
        exp_recv: er,
        group: depth as u64,
        depth,
    };
    // Root (depth 0): 8/32 = 0.25; internal rank 1 (depth 1): 12/48 = 0.25, rank 3
    // (depth 2): 4/16 = 0.25, leaf 4 at 10/16. All three tie; rank 3 is the deepest.
    let v = [
        x(0, 8, 16, 16, 0),
        x(4, 8, 24, 24, 1),
        x(10, 14, 24, 24, 1),
        x(4, 0, 8, 8, 2),
        x(6, 4, 8, 8, 2),
    ];
    assert_eq!(fewest_counts(&v), vec![3]);
    // Fractions, not absolute counts: rank 0 has more absolute progress (20) than rank 1
    // (6) but a smaller fraction (20/100 < 6/8).
    let w = [x(10, 10, 50, 50, 0), x(3, 3, 4, 4, 1), x(50, 50, 50, 50, 1)];
    assert_eq!(fewest_counts(&w), vec![0]);
}

#[test]
fn min_duration_returns_all_minima() {
    assert_eq!(min_duration(&[Some(9), Some(3), None, Some(3)]), vec![1, 3]);
    assert_eq!(min_duration(&[None, None]), Vec::<u32>::new());
}

#[test]
fn lowest_rate_normalises_by_group_median() {
    // Ring, rank 2 has the lowest send rate.
    let (r, lock) = lowest_rate(&[(0.5, 0.5, 0), (0.5, 0.4, 0), (0.2, 0.5, 0), (0.5, 0.5, 0)]);
    assert_eq!((r, lock), (vec![2], false));
    // Tree: layer 1 runs at 0.1, layer 2 at 1.0. Rank 1 (0.08) is the lowest in absolute
    // terms but only 0.8 of its layer's median; rank 3 (0.5) is 0.5 of its layer's: root.
    let (r, _) = lowest_rate(&[
        (0.1, 0.1, 1),
        (0.08, 0.1, 1),
        (0.1, 0.1, 1),
        (0.5, 1.0, 2),
        (1.0, 1.0, 2),
        (1.0, 1.0, 2),
    ]);
    assert_eq!(r, vec![3]);
    // Lockstep: all equal within 2 %.
    let (r, lock) = lowest_rate(&[(0.25, 0.25, 0), (0.249, 0.25, 0), (0.25, 0.25, 0)]);
    assert_eq!((r, lock), (vec![1], true));
    // Tie on send broken by recv.
    let (r, _) = lowest_rate(&[(0.2, 0.5, 0), (0.2, 0.4, 0), (0.9, 0.9, 0)]);
    assert_eq!(r, vec![1]);
    // No information at all.
    assert_eq!(lowest_rate(&[(0.0, 0.0, 0); 4]), (vec![], true));
    // Singleton layers are compared with the global median: rank 0 (alone in layer 0)
    // at 0.1 against a global median of 1.0.
    let (r, _) = lowest_rate(&[(0.1, 1.0, 0), (1.0, 1.0, 1), (1.0, 1.0, 1), (0.9, 1.0, 1)]);
    assert_eq!(r, vec![0]);
}

fn ring_waits(n: u32, slow_from: u32, stride: u32) -> Vec<Option<ChanWait>> {
    // Lockstep ring with the link slow_from -> next slow: its sender waits downstream,
    // everyone else upstream.
    (0..n)
        .map(|j| {
            let next = (j + stride) % n;
            Some(if j == slow_from {
                ChanWait {
                    up: 0.0,
                    down: 0.7,
                    next,
                }
            } else {
                ChanWait {
                    up: 0.7,
                    down: 0.0,
                    next,
                }
            })
        })
        .collect()
}

#[test]
fn slow_links_single_ring_order_names_both_ends_sender_first() {
    let chans = vec![ring_waits(8, 5, 1), ring_waits(8, 5, 1)];
    let (roots, links) = slow_links(&chans);
    assert_eq!(roots, vec![5, 6]);
    assert_eq!(links.len(), 2);
    assert_eq!((links[0].from, links[0].to), (5, 6));
    assert!((links[0].receiver_up - 0.7).abs() < 1e-12);
}

#[test]
fn slow_links_varied_ring_orders_isolate_the_rank() {
    // Rank 5's transport is slow: forward ring 5 -> 6, reverse ring 5 -> 4.
    let chans = vec![ring_waits(8, 5, 1), ring_waits(8, 5, 7)];
    let (roots, _) = slow_links(&chans);
    assert_eq!(roots, vec![5]);
    // Receiver side slow at rank 5: forward link 4 -> 5, reverse link 6 -> 5.
    let chans = vec![ring_waits(8, 4, 1), ring_waits(8, 6, 7)];
    let (roots, links) = slow_links(&chans);
    assert_eq!(roots, vec![5]);
    assert_eq!(links.len(), 2);
}

#[test]
fn cpu_starved_needs_a_large_share_well_above_the_median() {
    // One rank of four waited for a CPU 60% of the window.
    assert_eq!(
        cpu_starved(&[Some(0.01), Some(0.02), Some(0.0), Some(0.6)]),
        vec![3]
    );
    // Everybody waits (an oversubscribed machine): nobody stands out.
    assert!(cpu_starved(&[Some(0.5), Some(0.55), Some(0.6), Some(0.5)]).is_empty());
    // Above the median but small in absolute terms.
    assert!(cpu_starved(&[Some(0.0), Some(0.0), Some(0.2), Some(0.0)]).is_empty());
    // Unknown ranks are ignored; one known share has no median to compare with.
    assert!(cpu_starved(&[None, None, Some(0.9)]).is_empty());
    assert_eq!(cpu_starved(&[None, Some(0.0), Some(0.9)]), vec![2]);
    // Two starved ranks of eight, most starved first.
    let mut v = vec![Some(0.02); 8];
    v[5] = Some(0.5);
    v[1] = Some(0.7);
    assert_eq!(cpu_starved(&v), vec![1, 5]);
    assert!(cpu_starved(&[]).is_empty());
}

#[test]
fn a_frozen_process_stands_out_and_one_shared_by_all_ranks_does_not() {
    // A SIGSTOP/SIGCONT duty cycle of 60/20 ms on rank 5 of 8.
    let mut v = vec![Some(0.0); 8];
    v[5] = Some(0.7);
    assert_eq!(frozen(&v), vec![5]);
    // Below the minimum share, or every rank a thread of one stopped process.
    v[5] = Some(0.15);
    assert!(frozen(&v).is_empty());
    assert!(frozen(&[Some(0.6); 4]).is_empty());
    // A 2-rank communicator: the median is the mean of the two.
    assert_eq!(frozen(&[Some(0.01), Some(0.5)]), vec![1]);
    assert!(frozen(&[Some(0.1), Some(0.35)]).is_empty());
    assert!(frozen(&[None, Some(0.9)]).is_empty());
}

#[test]
fn usual_latecomer_needs_a_majority_of_enough_rounds() {
    assert_eq!(usual_latecomer(&[1, 0, 0, 5], 0.75), vec![3]);
    assert!(
        usual_latecomer(&[3, 0, 0, 3], 0.75).is_empty(),
        "no majority"
    );
    assert!(
        usual_latecomer(&[0, 2, 0, 0], 0.75).is_empty(),
        "too few rounds"
    );
    assert!(usual_latecomer(&[], 0.75).is_empty());
    // From 4 ranks a majority is at least twice a fair draw's share.
    assert_eq!(usual_latecomer(&[3, 2, 1, 7], 0.75), vec![3]);
}

#[test]
fn usual_latecomer_of_few_ranks_needs_twice_a_fair_draw_or_the_dominant_share() {
    // 2 ranks: a majority is what a fair draw gives one of them; 3 of 4 is dominant.
    assert!(
        usual_latecomer(&[14, 23], 0.75).is_empty(),
        "62 % of 2 ranks"
    );
    assert_eq!(usual_latecomer(&[9, 28], 0.75), vec![1]);
    assert_eq!(usual_latecomer(&[3, 1], 0.75), vec![0]);
    // 3 ranks: two thirds (twice 1/3).
    assert!(
        usual_latecomer(&[2, 3, 1], 0.75).is_empty(),
        "half of 3 ranks' rounds"
    );
    assert_eq!(usual_latecomer(&[1, 4, 1], 0.75), vec![1]);
}

#[test]
fn least_waiting_names_the_rank_everybody_waited_for() {
    let w = |up: f64, down: f64| Some(ChanWait { up, down, next: 0 });
    // Rank 3 is descheduled: its ring neighbours and everybody else wait for it.
    let ch = vec![
        w(0.5, 0.1),
        w(0.4, 0.2),
        w(0.2, 0.5),
        w(0.05, 0.02),
        w(0.6, 0.0),
    ];
    assert_eq!(least_waiting(&[ch.clone(), ch.clone()]), vec![3]);
    // Uniform waiting: nobody stands out.
    let flat = vec![w(0.3, 0.1); 5];
    assert!(least_waiting(&[flat]).is_empty());
    // Too few ranks with metrics.
    assert!(least_waiting(&[vec![w(0.5, 0.0), None, w(0.0, 0.0)]]).is_empty());
}

/// A ring 0 -> 1 -> 2 -> 3 -> 0 on every channel, each rank's wire share given.
fn wire_ring(shares: &[Option<f64>]) -> Vec<(Option<f64>, u32)> {
    let n = shares.len() as u32;
    (0..n).map(|j| (shares[j as usize], (j + 1) % n)).collect()
}

#[test]
fn slow_wires_names_the_sender_of_the_link_whose_messages_crawl() {
    // Link 1 -> 2 is slow: rank 2's inbound messages spend 25% of the window on the wire.
    let ch = wire_ring(&[Some(0.01), Some(0.012), Some(0.25), Some(0.008)]);
    let (roots, links) = slow_wires(&[ch.clone(), ch]);
    assert_eq!(roots, vec![1]);
    assert_eq!(links.len(), 2);
    assert_eq!(
        (links[0].from, links[0].to, links[1].channel),
        (1, 2, Some(1))
    );
    assert!((links[0].wire - 0.25).abs() < 1e-12);
    // Another ring order on channel 1 (0 -> 2 -> 1 -> 3 -> 0) with the sender 1 slow
    // again: its receiver there is 3; the votes still name rank 1 alone.
    let other = vec![
        (Some(0.01), 2),
        (Some(0.01), 3),
        (Some(0.02), 1),
        (Some(0.3), 0),
    ];
    let ch0 = wire_ring(&[Some(0.01), Some(0.012), Some(0.25), Some(0.008)]);
    assert_eq!(slow_wires(&[ch0, other]).0, vec![1]);
}

#[test]
fn slow_senders_names_the_rank_whose_links_crawl() {
    // Recursive doubling on 4 ranks, rank 1's egress slow: its messages to 0 (step 1)
    // and to 3 (step 2) spend half the receivers' time on the wire; its slow
    // acknowledgements slow 0 -> 1 a little too.
    let links = [
        (1, 0, 0.5),
        (0, 1, 0.08),
        (3, 2, 0.01),
        (2, 3, 0.01),
        (2, 0, 0.02),
        (0, 2, 0.01),
        (1, 3, 0.45),
        (3, 1, 0.02),
    ];
    let (roots, found) = slow_senders(&links);
    assert_eq!(roots, vec![1]);
    let got: Vec<(u32, u32)> = found.iter().map(|l| (l.from, l.to)).collect();
    assert_eq!(got, vec![(1, 0), (1, 3)]);
    assert!(found.iter().all(|l| l.channel.is_none()));
    // Two ranks: the slow direction stands out from the median of the two.
    assert_eq!(slow_senders(&[(0, 1, 0.02), (1, 0, 0.6)]).0, vec![1]);
}

#[test]
fn slow_senders_needs_a_link_that_stands_out() {
    let uniform = [(0, 1, 0.3), (1, 0, 0.31), (2, 3, 0.29), (3, 2, 0.3)];
    let small = [(0, 1, 0.0), (1, 0, 0.09), (2, 3, 0.0), (3, 2, 0.01)];
    for l in [&uniform[..], &small[..], &[(0, 1, 0.9)][..], &[][..]] {
        assert_eq!(slow_senders(l), (Vec::new(), Vec::new()));
    }
    // A slow ingress at rank 2: every link into it stands out, one vote per sender.
    let ingress = [
        (0, 2, 0.4),
        (3, 2, 0.45),
        (2, 0, 0.0),
        (2, 3, 0.01),
        (0, 1, 0.0),
    ];
    assert_eq!(slow_senders(&ingress).0, vec![0, 3]);
}

#[test]
fn slow_wires_needs_a_share_that_stands_out() {
    // Uniform (a slow network everywhere), small, or missing metrics: nothing named.
    let uniform = wire_ring(&[Some(0.3), Some(0.31), Some(0.29), Some(0.3)]);
    let small = wire_ring(&[Some(0.0), Some(0.01), Some(0.09), Some(0.0)]);
    let missing = wire_ring(&[None, None, Some(0.5), None]);
    for ch in [uniform, small, missing] {
        assert_eq!(slow_wires(&[ch]), (Vec::new(), Vec::new()));
    }
    // Ranks without the metric (their inbound link is shared memory) are not compared,
    // but still name the sender when the slow receiver is theirs.
    let mixed = wire_ring(&[None, Some(0.02), Some(0.4), Some(0.01)]);
    assert_eq!(slow_wires(&[mixed]).0, vec![1]);
}

#[test]
fn slow_links_ignores_uniform_waiting_and_missing_metrics() {
    let flat: Vec<Option<ChanWait>> = (0..4)
        .map(|j| {
            Some(ChanWait {
                up: 0.3,
                down: 0.3,
                next: (j + 1) % 4,
            })
        })
        .collect();
    assert_eq!(slow_links(&[flat]), (vec![], vec![]));
    assert_eq!(slow_links(&[vec![None, None, None]]), (vec![], vec![]));
}
