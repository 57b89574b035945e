//! Root-cause location: the decision tree of CCL-D Figure 7, as pure O(N) functions over
//! per-rank views that the engine prepares.
//!
//! Hang (a round in which some rank is in flight longer than the hang threshold):
//! 1. some ranks did not reach the round (operation counter below it)  -> **H1**, those ranks;
//! 2. all entered, but the op type sets disagree                      -> **H2**, the minority;
//! 3. all entered, some ranks are not hung (completed / failed / moved past the round)
//!    -> **H2**, those ranks; except in a ring where every such rank completed the same
//!    schedule in full: then a silent hung rank -> **H1**, those; else a hung rank whose
//!    ring upstream is one of them waits for data that was sent and never arrived -> **H3**,
//!    those starved ranks ([`starved_receivers`]);
//! 4. all hung: ranks that went silent (no record or heartbeat for `silent_after`; the process
//!    is stopped or dead, its counters are stale) -> **H1**, those ranks; otherwise
//!    [`fewest_counts`] -> **H3**.
//!
//! A silent rank is H1 whether its process stopped just before the round or inside it: the
//! fault is the same (the host side of the rank stopped: SIGSTOP, a hung or swapped-out
//! process, a dead host), and where the stop lands is a race that must not change the class.
//! H3 is kept for a round stuck while every process still reports (a link or a device).
//!
//! Slow (see [`crate::detect`]): P > beta -> **S1**, [`min_duration`]; P < alpha -> **S2**,
//! [`slow_links`] when the per-channel wait metrics are present, else [`lowest_rate`];
//! otherwise **S3**, both candidate sets.
//!
//! Ring: every rank is compared with every other. Tree: counts and rates are compared only
//! among ranks with the same tree layers (the `group` of a view); S1 compares durations over
//! all ranks, because every rank of a tree waits for a late one.

use std::collections::HashMap;

use crate::wire::AnomalyClass;

/// Where a rank stands in the hung round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HangState {
    /// Its operation counter did not reach the round.
    NotEntered,
    /// In flight in the round.
    InFlight,
    /// Completed the round.
    Completed,
    /// The operation failed (aborted) on this rank.
    Failed,
    /// No record for the round, but the rank already started a later round.
    PassedBeyond,
    /// A heartbeat says the rank started the round, but no record arrived yet.
    EnteredNoRecord,
    /// Not a participant of the round (point-to-point rounds involve only the peers).
    NotInvolved,
}

/// One rank of a hung round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HangView {
    /// State in the round.
    pub state: HangState,
    /// No record / heartbeat for `silent_after`.
    pub silent: bool,
    /// Op type set group (index of the distinct type set); `u32::MAX` when unknown.
    pub type_group: u32,
    /// SendCount summed over channels.
    pub send: u64,
    /// RecvCount summed over channels.
    pub recv: u64,
    /// Expected SendCount / RecvCount of the whole operation (0 = unknown).
    pub exp_send: u64,
    /// Expected RecvCount.
    pub exp_recv: u64,
    /// Comparison group: 0 for ring, a hash of the per-channel tree layers for tree.
    pub group: u64,
    /// Tree depth (0 for ring).
    pub depth: u32,
}

/// Result of [`locate_hang`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HangFinding {
    /// H1: these ranks did not enter the round.
    NotEntered(Vec<u32>),
    /// H2: these ranks issued an operation whose type set differs from the majority's.
    InconsistentTypes(Vec<u32>),
    /// H2: these ranks are not hung in the round while the others are.
    NotHung(Vec<u32>),
    /// H1: these stopped reporting mid-operation (their process stopped or died) while the
    /// others hang.
    Silent(Vec<u32>),
    /// H3: every rank hangs; these made the least progress.
    FewestCounts(Vec<u32>),
    /// H3: these ranks hang waiting for data that their ring upstream, which completed the
    /// round, already sent (the link into them, or the rank itself, stalled).
    Starved(Vec<u32>),
}

impl HangFinding {
    /// The anomaly class.
    pub(crate) fn class(&self) -> AnomalyClass {
        match self {
            HangFinding::NotEntered(_) | HangFinding::Silent(_) => AnomalyClass::H1NotEntered,
            HangFinding::InconsistentTypes(_) | HangFinding::NotHung(_) => {
                AnomalyClass::H2Inconsistent
            }
            HangFinding::FewestCounts(_) | HangFinding::Starved(_) => AnomalyClass::H3Hardware,
        }
    }

    /// The root-cause ranks, ascending.
    pub(crate) fn ranks(&self) -> &[u32] {
        match self {
            HangFinding::NotEntered(r)
            | HangFinding::InconsistentTypes(r)
            | HangFinding::NotHung(r)
            | HangFinding::Silent(r)
            | HangFinding::FewestCounts(r)
            | HangFinding::Starved(r) => r,
        }
    }
}

fn ranks_where(v: &[HangView], f: impl Fn(&HangView) -> bool) -> Vec<u32> {
    v.iter()
        .enumerate()
        .filter(|(_, x)| f(x))
        .map(|(i, _)| i as u32)
        .collect()
}

/// The decision tree for a hung round; `v[rank]` describes each rank, `rings[channel][rank]`
/// is the rank's ring next on that channel (empty when the round is not a ring or the rings
/// are unknown).
pub(crate) fn locate_hang(v: &[HangView], rings: &[Vec<u32>]) -> HangFinding {
    let not_entered = ranks_where(v, |x| x.state == HangState::NotEntered);
    if !not_entered.is_empty() {
        // A stopped or dead process among them explains the others: a live rank that did
        // not enter either is held up before the round, in practice by that process through
        // another communicator (a pipeline Send to it, a tensor-parallel AllReduce with it).
        let stopped: Vec<u32> = not_entered
            .iter()
            .copied()
            .filter(|&r| v[r as usize].silent)
            .collect();
        return HangFinding::NotEntered(if stopped.is_empty() {
            not_entered
        } else {
            stopped
        });
    }
    let minority = type_minority(v);
    if !minority.is_empty() {
        return HangFinding::InconsistentTypes(minority);
    }
    let not_hung = ranks_where(v, |x| {
        matches!(
            x.state,
            HangState::Completed | HangState::Failed | HangState::PassedBeyond
        )
    });
    let involved = v
        .iter()
        .filter(|x| x.state != HangState::NotInvolved)
        .count();
    let silent = ranks_where(v, |x| x.silent && x.state != HangState::NotInvolved);
    if !not_hung.is_empty() {
        let starved = starved_receivers(v, rings);
        if starved.is_empty() {
            return HangFinding::NotHung(not_hung);
        }
        // A stopped rank among the hung ones explains the stall better than a link.
        let silent_hung = ranks_where(v, |x| {
            x.silent && matches!(x.state, HangState::InFlight | HangState::EnteredNoRecord)
        });
        if !silent_hung.is_empty() {
            return HangFinding::Silent(silent_hung);
        }
        return HangFinding::Starved(starved);
    }
    if !silent.is_empty() && silent.len() < involved {
        return HangFinding::Silent(silent);
    }
    let idx: Vec<u32> = ranks_where(v, |x| x.state != HangState::NotInvolved);
    let counts: Vec<CountView> = idx
        .iter()
        .map(|&i| {
            let x = &v[i as usize];
            CountView {
                send: x.send,
                recv: x.recv,
                exp_send: x.exp_send,
                exp_recv: x.exp_recv,
                group: x.group,
                depth: x.depth,
            }
        })
        .collect();
    HangFinding::FewestCounts(
        fewest_counts(&counts)
            .into_iter()
            .map(|i| idx[i as usize])
            .collect(),
    )
}

/// A ring round that some ranks completed and the others hang in. When every rank that is
/// not hung completed in full (its counts reached its expected counts, known), it ran the
/// schedule its peers run, so it cannot be the cause: in a ring a rank completes once its
/// upstream has sent it everything. A hung rank whose ring upstream is such a rank, with the
/// same expected counts, and which still misses inbound data (RecvCount below expected; or
/// it entered the round by its heartbeat and no record of it arrived, counts unknown)
/// waits for data that was sent and did not arrive: the link into it (or the rank itself)
/// stalled. Those hung ranks are returned; none when a rank that is not hung failed, moved
/// past the round, or completed short of its schedule (an inconsistent call: H2 stands),
/// when the rings are unknown, or when the channels' rings differ (the counts are summed
/// over channels, so only one ring order lets them speak for one link).
/// `rings[channel][rank]` is the rank's ring next.
pub(crate) fn starved_receivers(v: &[HangView], rings: &[Vec<u32>]) -> Vec<u32> {
    let n = v.len();
    let Some(next) = rings.first() else {
        return Vec::new();
    };
    if next.len() != n || rings.iter().any(|r| r != next) {
        return Vec::new();
    }
    let full = |x: &HangView| {
        x.state == HangState::Completed
            && x.exp_send + x.exp_recv > 0
            && x.send >= x.exp_send
            && x.recv >= x.exp_recv
    };
    let clean = v.iter().all(|x| {
        x.group == 0
            && match x.state {
                HangState::Completed => full(x),
                HangState::Failed | HangState::PassedBeyond => false,
                _ => true,
            }
    });
    if !clean {
        return Vec::new();
    }
    let mut starved: Vec<u32> = next
        .iter()
        .enumerate()
        .filter_map(|(up, &down)| {
            let (a, b) = (&v[up], v.get(down as usize)?);
            let missing = match b.state {
                HangState::InFlight => {
                    b.recv < b.exp_recv && (a.exp_send, a.exp_recv) == (b.exp_send, b.exp_recv)
                }
                // Entered (a heartbeat says so) without a record: its counts are unknown.
                HangState::EnteredNoRecord => true,
                _ => false,
            };
            (full(a) && missing).then_some(down)
        })
        .collect();
    starved.sort_unstable();
    starved.dedup();
    starved
}

/// Ranks outside the largest op-type-set group (ties: the group with the smallest id, the
/// first type set seen, is the majority). Empty when all known type sets agree.
pub(crate) fn type_minority(v: &[HangView]) -> Vec<u32> {
    let mut sizes: HashMap<u32, u32> = HashMap::new();
    for x in v.iter().filter(|x| x.type_group != u32::MAX) {
        *sizes.entry(x.type_group).or_default() += 1;
    }
    if sizes.len() <= 1 {
        return Vec::new();
    }
    let majority = sizes
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(g, _)| *g)
        .unwrap_or(0);
    ranks_where(v, |x| x.type_group != u32::MAX && x.type_group != majority)
}

/// One rank's progress in a hung round, for [`fewest_counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CountView {
    /// SendCount summed over channels.
    pub send: u64,
    /// RecvCount summed over channels.
    pub recv: u64,
    /// Expected SendCount of the whole operation (0 = unknown).
    pub exp_send: u64,
    /// Expected RecvCount (0 = unknown).
    pub exp_recv: u64,
    /// Comparison group (0 for ring, tree layers hash for tree).
    pub group: u64,
    /// Tree depth (0 for ring).
    pub depth: u32,
}

/// H3 "fewest SendCount/RecvCount".
///
/// Progress of a rank = (send + recv) / (expected send + expected recv) when every rank
/// reports its expected counts (the schedule knows them; this makes ranks with different
/// roles, e.g. tree layers, comparable), else (send + recv) relative to the largest
/// (send + recv) in the rank's group (same tree layers; the whole ring). The ranks with the
/// smallest progress are returned. In a tree a frozen rank starves its ancestors, which then
/// show the same relative progress: among tied ranks only the deepest are kept (the chain is
/// blocked from below). When every rank ties (nobody lags relative to its group), the smallest
/// absolute progress decides.
pub(crate) fn fewest_counts(v: &[CountView]) -> Vec<u32> {
    let use_expected = !v.is_empty() && v.iter().all(|x| x.exp_send + x.exp_recv > 0);
    let mut group_max: HashMap<u64, u128> = HashMap::new();
    if !use_expected {
        for x in v {
            let e = group_max.entry(x.group).or_default();
            *e = (*e).max(u128::from(x.send) + u128::from(x.recv));
        }
    }
    // Progress as an exact fraction p/q; compare p1*q2 with p2*q1.
    let frac = |x: &CountView| -> (u128, u128) {
        let p = u128::from(x.send) + u128::from(x.recv);
        let q = if use_expected {
            u128::from(x.exp_send) + u128::from(x.exp_recv)
        } else {
            group_max.get(&x.group).copied().unwrap_or(0)
        };
        if q == 0 {
            (1, 1)
        } else {
            (p.min(q), q)
        }
    };
    let mut best: Vec<u32> = Vec::new();
    let mut best_f = (u128::MAX, 1u128);
    for (i, x) in v.iter().enumerate() {
        let f = frac(x);
        let lhs = f.0 * best_f.1;
        let rhs = best_f.0.saturating_mul(f.1);
        if best.is_empty() || lhs < rhs {
            best.clear();
            best.push(i as u32);
            best_f = f;
        } else if lhs == rhs {
            best.push(i as u32);
        }
    }
    if best.len() == v.len() && v.len() > 1 {
        let min = v
            .iter()
            .map(|x| u128::from(x.send) + u128::from(x.recv))
            .min();
        return v
            .iter()
            .enumerate()
            .filter(|(_, x)| Some(u128::from(x.send) + u128::from(x.recv)) == min)
            .map(|(i, _)| i as u32)
            .collect();
    }
    let deepest = best.iter().map(|&i| v[i as usize].depth).max().unwrap_or(0);
    best.retain(|&i| v[i as usize].depth == deepest);
    best
}

/// S1: the ranks with the minimal duration in the round (the last to enter: every other
/// rank waited for it). `durations[rank]`, `None` for ranks without a duration.
pub(crate) fn min_duration(durations: &[Option<u64>]) -> Vec<u32> {
    let min = durations.iter().flatten().min();
    match min {
        None => Vec::new(),
        Some(&m) => durations
            .iter()
            .enumerate()
            .filter(|(_, d)| **d == Some(m))
            .map(|(i, _)| i as u32)
            .collect(),
    }
}

/// S2 without wait metrics: the paper's "minimal SendRate/RecvRate" rule. `v[rank] =
/// (send_rate, recv_rate, group)`; each rate is divided by the median send (recv) rate of
/// the rank's group (of all ranks for groups smaller than 3); the rank with the lowest relative send rate wins, ties broken by the
/// relative recv rate. Returns the ranks and whether the ranks advanced in lockstep (all
/// relative send rates within 2 %: the rule cannot discriminate then and the answer is weak).
/// When every rank has exactly the same rates (or none reported) no rank is returned.
pub(crate) fn lowest_rate(v: &[(f64, f64, u64)]) -> (Vec<u32>, bool) {
    if v.is_empty() {
        return (Vec::new(), false);
    }
    let mut by_group: HashMap<u64, (Vec<f64>, Vec<f64>)> = HashMap::new();
    for &(s, r, g) in v {
        let e = by_group.entry(g).or_default();
        e.0.push(s);
        e.1.push(r);
    }
    let mut all_s: Vec<f64> = v.iter().map(|x| x.0).collect();
    let mut all_r: Vec<f64> = v.iter().map(|x| x.1).collect();
    let global = (median(&mut all_s), median(&mut all_r));
    // Groups of fewer than 3 ranks have no meaningful median of their own (a rank alone in
    // its layer would always look normal): they are compared with the global median.
    let medians: HashMap<u64, (f64, f64)> = by_group
        .into_iter()
        .map(|(g, (mut s, mut r))| {
            if s.len() < 3 {
                (g, global)
            } else {
                (g, (median(&mut s), median(&mut r)))
            }
        })
        .collect();
    let rel = |x: f64, m: f64| if m > 0.0 { x / m } else { x };
    let norm: Vec<(f64, f64)> = v
        .iter()
        .map(|&(s, r, g)| {
            let (ms, mr) = medians.get(&g).copied().unwrap_or((0.0, 0.0));
            (rel(s, ms), rel(r, mr))
        })
        .collect();
    let mut best: Vec<u32> = Vec::new();
    let mut best_v = (f64::INFINITY, f64::INFINITY);
    for (i, &(s, r)) in norm.iter().enumerate() {
        if s < best_v.0 || (s == best_v.0 && r < best_v.1) {
            best.clear();
            best.push(i as u32);
            best_v = (s, r);
        } else if s == best_v.0 && r == best_v.1 {
            best.push(i as u32);
        }
    }
    let max = norm.iter().map(|x| x.0).fold(f64::NEG_INFINITY, f64::max);
    let lockstep = max <= 0.0 || (max - best_v.0) / max < 0.02;
    if best.len() == v.len() && v.len() > 1 {
        // Every rank identical (or no rate reported at all): nobody stands out.
        return (Vec::new(), true);
    }
    (best, lockstep)
}

/// Median of a scratch slice (mean of the two middle values for even lengths); 0 if empty.
pub(crate) fn median(x: &mut [f64]) -> f64 {
    if x.is_empty() {
        return 0.0;
    }
    x.sort_unstable_by(f64::total_cmp);
    let n = x.len();
    if n % 2 == 1 {
        x[n / 2]
    } else {
        (x[n / 2 - 1] + x[n / 2]) / 2.0
    }
}

/// One rank's waiting on one channel over the detection window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ChanWait {
    /// Fraction of its operation time spent waiting for data from the upstream peer.
    pub up: f64,
    /// Fraction spent waiting for free slots at the downstream peer.
    pub down: f64,
    /// The downstream peer (ring next) on this channel.
    pub next: u32,
}

/// A slow ring link found by [`slow_links`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SlowLink {
    /// Channel.
    pub channel: u32,
    /// Sender.
    pub from: u32,
    /// Receiver.
    pub to: u32,
    /// The sender's downstream wait fraction.
    pub sender_down: f64,
    /// The receiver's upstream wait fraction.
    pub receiver_up: f64,
}

/// Minimal margin, in fraction of operation time, by which the bottleneck sender's
/// (down - up) wait must exceed the channel's median.
pub(crate) const LINK_MARGIN: f64 = 0.1;

/// S2 with wait metrics, for pipelined rings where every rank advances in lockstep (rates
/// and durations are equal everywhere, so the paper's min-rate rule cannot tell).
///
/// Rule: on a ring channel the bottleneck link a -> b makes its sender a wait for free
/// downstream slots (data piles up in front of the slow link) while every other rank,
/// starved by the ring, waits for upstream data. So per channel the sender of the slow link
/// is the rank maximising (down - up), provided it exceeds the channel's median by
/// [`LINK_MARGIN`] and its down wait is at least [`LINK_MARGIN`]. Each link found gives one
/// vote to both ends; the ranks with the most votes are the root (a rank whose transport is
/// slow is an end of the slow link on every channel, and channels with different ring
/// orders pair it with different peers). When every link found is the same pair, the two
/// ends cannot be told apart from waits alone and both are returned, sender first.
///
/// `chans[channel][rank]` (`None`: no metric from that rank). Returns (roots, links).
pub(crate) fn slow_links(chans: &[Vec<Option<ChanWait>>]) -> (Vec<u32>, Vec<SlowLink>) {
    let mut links = Vec::new();
    let mut scratch = Vec::new();
    for (c, ranks) in chans.iter().enumerate() {
        scratch.clear();
        let mut best: Option<(usize, f64)> = None;
        for (j, w) in ranks.iter().enumerate() {
            if let Some(w) = w {
                let s = w.down - w.up;
                scratch.push(s);
                if best.is_none_or(|(_, b)| s > b) {
                    best = Some((j, s));
                }
            }
        }
        let Some((a, s_a)) = best else { continue };
        if scratch.len() < 2 {
            continue;
        }
        let med = median(&mut scratch);
        let Some(wa) = ranks[a] else { continue };
        if s_a - med < LINK_MARGIN || wa.down < LINK_MARGIN {
            continue;
        }
        let b = wa.next as usize;
        let receiver_up = ranks.get(b).copied().flatten().map_or(0.0, |w| w.up);
        links.push(SlowLink {
            channel: c as u32,
            from: a as u32,
            to: wa.next,
            sender_down: wa.down,
            receiver_up,
        });
    }
    let mut votes: HashMap<u32, (u32, u32)> = HashMap::new();
    for l in &links {
        votes.entry(l.from).or_default().0 += 1;
        votes.entry(l.from).or_default().1 += 1;
        votes.entry(l.to).or_default().0 += 1;
    }
    let top = votes.values().map(|v| v.0).max().unwrap_or(0);
    let mut roots: Vec<(u32, u32)> = votes
        .iter()
        .filter(|(_, v)| v.0 == top)
        .map(|(r, v)| (*r, v.1))
        .collect();
    // Senders first, then by rank.
    roots.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    (roots.into_iter().map(|(r, _)| r).collect(), links)
}

/// A slow link found by [`slow_wires`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct WireLink {
    /// Channel (`None`: a link of an algorithm whose peers differ by step, [`slow_senders`]).
    pub channel: Option<u32>,
    /// Sender.
    pub from: u32,
    /// Receiver.
    pub to: u32,
    /// The share of the receiver's operation time its inbound messages spent on the wire.
    pub wire: f64,
    /// The median share of the channel's links.
    pub median: f64,
}

/// S2 by time on the wire (socket transport), for rings where the wait metrics cannot tell:
/// a ring advances in lockstep and every rank waits upstream alike, because no data piles
/// up in front of a slow link (each lane moves one chunk through its steps at a time). The
/// receiving proxy measures how long each inbound message took from its first byte to its
/// last; on a slow link that share of the window stands out from the channel's other links.
///
/// Rule: per channel, the receiver with the largest wire share, provided it is at least
/// [`LINK_MARGIN`] and exceeds the channel's median by [`LINK_MARGIN`]; the link's sender
/// (the rank whose ring next it is) gets a vote. The senders with the most votes are the
/// root: a rate limit or a slow NIC on a host's egress slows every link it sends on. (A
/// receiver's slow ingress looks the same on one ring order; the reason says so.)
///
/// `chans[channel][rank]`: `(wire share, ring next)` of that rank, the share `None` without
/// the metric. Returns (roots, links).
pub(crate) fn slow_wires(chans: &[Vec<(Option<f64>, u32)>]) -> (Vec<u32>, Vec<WireLink>) {
    let mut links = Vec::new();
    let mut scratch = Vec::new();
    for (c, ranks) in chans.iter().enumerate() {
        scratch.clear();
        scratch.extend(ranks.iter().filter_map(|w| w.0));
        if scratch.len() < 2 {
            continue;
        }
        let med = median(&mut scratch);
        let best = ranks
            .iter()
            .enumerate()
            .filter_map(|(j, w)| w.0.map(|s| (j, s)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((to, share)) = best else { continue };
        if share < LINK_MARGIN || share - med < LINK_MARGIN {
            continue;
        }
        let from = ranks.iter().position(|w| w.1 as usize == to);
        let Some(from) = from.filter(|&f| f != to) else {
            continue;
        };
        links.push(WireLink {
            channel: Some(c as u32),
            from: from as u32,
            to: to as u32,
            wire: share,
            median: med,
        });
    }
    (most_voted_senders(&links), links)
}

/// S2 by time on the wire for algorithms whose inbound messages come from a different peer
/// at each step (Tree: recursive doubling), where the rates advance in lockstep and a
/// channel has no single upstream: every link `(from, to, share)` is a sending peer's
/// share of the receiver's operation time on the wire (`OpRecord.peer_wire`). A link
/// stands out when its share is at least [`LINK_MARGIN`] and exceeds the median of all
/// links by [`LINK_MARGIN`]; each such link gives its sender a vote and the senders with
/// the most votes are the root (a slow egress slows every link the rank sends on; a slow
/// ingress spreads its votes over the receiver's partners instead). Returns (roots, links).
pub(crate) fn slow_senders(links: &[(u32, u32, f64)]) -> (Vec<u32>, Vec<WireLink>) {
    if links.len() < 2 {
        return (Vec::new(), Vec::new());
    }
    let mut shares: Vec<f64> = links.iter().map(|l| l.2).collect();
    let med = median(&mut shares);
    let found: Vec<WireLink> = links
        .iter()
        .filter(|&&(from, to, share)| {
            from != to && share >= LINK_MARGIN && share - med >= LINK_MARGIN
        })
        .map(|&(from, to, wire)| WireLink {
            channel: None,
            from,
            to,
            wire,
            median: med,
        })
        .collect();
    (most_voted_senders(&found), found)
}

/// The senders of the most links in `links` (one vote per link), in rank order.
fn most_voted_senders(links: &[WireLink]) -> Vec<u32> {
    let mut votes: HashMap<u32, u32> = HashMap::new();
    for l in links {
        *votes.entry(l.from).or_default() += 1;
    }
    let top = votes.values().copied().max().unwrap_or(0);
    let mut roots: Vec<u32> = votes
        .iter()
        .filter(|(_, v)| **v == top)
        .map(|(r, _)| *r)
        .collect();
    roots.sort_unstable();
    roots
}

/// S2 when no slow link stands out: the rank that waited least. In a lockstep ring a rank
/// that is slow itself (starved of CPU, descheduled, a slow copy engine) makes every other
/// rank wait for it, while its own lost time is not waiting: its wait fraction (up + down,
/// averaged over its channels) is the lowest. Returns that rank when it lies at least
/// [`LINK_MARGIN`] below the median of all ranks, else nothing. `chans` as [`slow_links`].
pub(crate) fn least_waiting(chans: &[Vec<Option<ChanWait>>]) -> Vec<u32> {
    let nranks = chans.iter().map(Vec::len).max().unwrap_or(0);
    let mut per_rank: Vec<(u32, f64)> = Vec::with_capacity(nranks);
    for r in 0..nranks {
        let (sum, k) = chans
            .iter()
            .filter_map(|c| c.get(r).copied().flatten())
            .fold((0.0, 0u32), |(s, k), w| (s + w.up + w.down, k + 1));
        if k > 0 {
            per_rank.push((r as u32, sum / f64::from(k)));
        }
    }
    if per_rank.len() < 3 {
        return Vec::new();
    }
    let mut v: Vec<f64> = per_rank.iter().map(|x| x.1).collect();
    let med = median(&mut v);
    let Some(&(rank, w)) = per_rank.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        return Vec::new();
    };
    if med - w >= LINK_MARGIN {
        vec![rank]
    } else {
        Vec::new()
    }
}

/// Minimal share of the window a rank must have spent waiting for a CPU (runnable, not
/// running) to be called CPU-starved.
pub(crate) const STARVED_MIN: f64 = 0.25;

/// Minimal margin by which a CPU-starved rank's share exceeds the median of all ranks.
pub(crate) const STARVED_MARGIN: f64 = 0.2;

/// S2 by the scheduler's evidence: on the host backend communication is CPU work, and a
/// rank kept off its CPU (a competing process, oversubscribed cores) holds the ring back
/// while its own wait metrics look like waiting for peers (it waits while descheduled). The
/// run-queue delay tells it apart: `cpu_wait[rank]` is the share of the window the rank's
/// threads were runnable but not running (`None`: unknown). Returns the ranks at or above
/// [`STARVED_MIN`] and at least [`STARVED_MARGIN`] above the median of the known shares
/// (at least two known), most starved first.
pub(crate) fn cpu_starved(cpu_wait: &[Option<f64>]) -> Vec<u32> {
    standing_out(cpu_wait, STARVED_MIN, STARVED_MARGIN)
}

/// Minimal share of the window a rank's process must have been frozen (neither running
/// nor runnable: SIGSTOP, a debugger, a cgroup freezer) to be named for it.
pub(crate) const FROZEN_MIN: f64 = 0.2;

/// Minimal margin by which a frozen rank's share exceeds the median of all ranks (ranks
/// that are threads of one process share one value and never stand out).
pub(crate) const FROZEN_MARGIN: f64 = 0.15;

/// The ranks whose process was frozen a share of the window (`frozen[rank]`, `None`:
/// unknown) at or above [`FROZEN_MIN`] and at least [`FROZEN_MARGIN`] above the median of
/// the known shares (at least two known), most frozen first. Such a rank holds back every
/// peer that needs it while none of its own metrics move; short stops fall inside
/// operations and show as no entry skew.
pub(crate) fn frozen(frozen: &[Option<f64>]) -> Vec<u32> {
    standing_out(frozen, FROZEN_MIN, FROZEN_MARGIN)
}

/// The ranks whose known share is at least `min` and `margin` above the median of the
/// known shares (at least two known), largest first (ties by rank).
fn standing_out(shares: &[Option<f64>], min: f64, margin: f64) -> Vec<u32> {
    let mut known: Vec<f64> = shares.iter().flatten().copied().collect();
    if known.len() < 2 {
        return Vec::new();
    }
    let med = median(&mut known);
    let mut hit: Vec<(u32, f64)> = shares
        .iter()
        .enumerate()
        .filter_map(|(r, w)| w.map(|w| (r as u32, w)))
        .filter(|&(_, w)| w >= min && w - med >= margin)
        .collect();
    hit.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    hit.into_iter().map(|(r, _)| r).collect()
}

/// S2 when neither a slow link nor a least-waiting rank stands out: the rank that entered
/// last (with a positive computation lateness) in more than half of the window's rounds, at
/// least 3 of them, and in at least twice the share a fair draw gives it (1/N of the
/// rounds) or `dominant` of them, whichever is less. `last_in[rank]` counts those rounds. A
/// rank slowed down as a whole (CPU starvation) is late into every operation by a little
/// and slow inside it by a lot: P says communication, but who is late says who.
///
/// The fair-draw bound matters for small communicators: of 2 ranks one is last in more
/// than half of the rounds almost always, and in a loop of several communicators the same
/// one tends to be (it leaves the previous operation last). With only "more than half", a
/// tensor-parallel pair slowed by the host's CPU contention had its rank named (8 processes
/// on 2 cores, 2 of 30 runs of `real-faults`, 2026-12-02); on 2 ranks it now takes
/// `dominant` (the self-calibrated rule's root share, 0.75).
pub(crate) fn usual_latecomer(last_in: &[u32], dominant: f64) -> Vec<u32> {
    let total: u32 = last_in.iter().sum();
    let n = last_in.len().max(1) as f64;
    let share = (2.0 / n).min(dominant).max(0.5);
    match last_in.iter().enumerate().max_by_key(|(_, v)| **v) {
        Some((r, &v))
            if total >= 3 && 2 * v > total && f64::from(v) >= share * f64::from(total) =>
        {
            vec![r as u32]
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
