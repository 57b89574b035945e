//! Failed operations as direct evidence (`OpRecord.failure`, issue 17 point 1).
//!
//! A failed record says why the operation failed; the analyzer does not wait for the hang
//! threshold. Per communicator, failure records open an *episode*; [`FAILURE_GRACE`] after
//! the episode's first record (so that the other survivors' reports join it) it is
//! diagnosed once, by cause, in this order:
//!
//! * `PEER_LOST` -> **H1**, root = the lost rank(s), reason `"process exited"`,
//!   `exited = true`, `observed_by` = the ranks that reported it. A rank that itself
//!   reported a failure in the episode was alive when the fault happened and is not a root
//!   (survivors that exit after the error are reported lost in turn), unless nothing else
//!   remains. The same holds across communicators: a process that reported a failure in
//!   *any* communicator before its loss was seen is a survivor (a tensor-parallel partner
//!   that exits on its own error). When only such survivors are lost, the roots are the
//!   ranks of this communicator whose processes they saw lost.
//!   And once a process death is diagnosed, the other processes of that communicator are
//!   its survivors for [`FAILURE_QUIET`]: when they exit in turn (a job exits on its first
//!   error) and a partner in another communicator reports them lost, that is the same
//!   incident, not a new root, even when their own failure report never arrived (a flush
//!   cut short at exit). An episode whose every lost rank is such a survivor, with no root
//!   of its own, raises nothing. Episodes due at once are diagnosed in the order they
//!   began, so that this holds when both are due in the same tick.
//! * `INCONSISTENT` -> **H2**, by a vote over the descriptors seen: each rank's own call
//!   (its `mismatch.local`, else its failed record's operation), and for ranks that sent
//!   nothing, what their peers received from them (`mismatch.remote`). The descriptor most
//!   ranks share is the majority; the roots are the ranks whose descriptor differs. With
//!   no unique majority (a 2-rank communicator), every disagreeing rank is named.
//!   `PEER_FAILED` ranks are victims: they only vote, with the checked descriptor of
//!   their call (a record's `op_counter` counts p2p operations too, the descriptor's
//!   sequence only collectives; see `resolve_votes`).
//! * `INVALID_USAGE` -> **H1**, root = the rank whose call failed, reason
//!   `"call failed: invalid usage"`.
//! * `INTERNAL` -> **H3**, root = the rank whose call failed, reason
//!   `"call failed: internal or system error"`.
//! * `ABORTED` (and an episode of `PEER_FAILED` alone) raises nothing: an abort is the
//!   application's decision, and a victim does not say who failed.
//!
//! After an episode is diagnosed, further failure records of the same communicator are
//! absorbed for [`FAILURE_QUIET`] (the survivors' later calls fail too), and the
//! communicator's hang detection is held back as long (the dead rank is already named).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::wire::{self, AnomalyClass, Diagnosis, FailureCause, OpDescriptor, OpRecord};

/// Time from an episode's first failure record to its diagnosis (collects the other
/// survivors' reports; well inside the 2 s budget of issue 17).
pub(crate) const FAILURE_GRACE: Duration = Duration::from_millis(300);
/// Time after a diagnosed episode during which its communicator's failures are absorbed.
pub(crate) const FAILURE_QUIET: Duration = Duration::from_secs(30);

/// Episodes kept at most (communicators); the oldest diagnosed ones go first.
const MAX_EPISODES: usize = 4096;
/// Processes whose failure reports are remembered at most; the oldest go first.
const MAX_PROCS: usize = 16_384;

/// Comparable part of a descriptor.
type Desc = (u64, i32, u32, i32, u64, i32);

fn desc_key(d: &OpDescriptor) -> Desc {
    (d.seq, d.collective, d.dtype, d.redop, d.count, d.root)
}

fn desc_text(d: Desc) -> String {
    format!(
        "{} #{} count {} dtype {} redop {} root {}",
        wire::coll_name(d.1),
        d.0,
        d.4,
        d.2,
        d.3,
        d.5
    )
}

/// One rank's descriptor in an H2 vote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Vote {
    desc: Desc,
    /// From the descriptor check (`mismatch.local` / `.remote`): its `seq` is the
    /// descriptor's own sequence. Otherwise it is the failed record's operation, whose
    /// `seq` is the record's `op_counter` and need not be in the descriptor's space.
    checked: bool,
}

impl Vote {
    fn checked(desc: Desc) -> Vote {
        Vote {
            desc,
            checked: true,
        }
    }
}

/// The descriptor each rank votes with (pure). Checked descriptors vote as they are. A
/// rank known only from its failed record (a victim) votes with the checked descriptor
/// equal to its call, else with the only checked descriptor that differs from its call
/// in the sequence number alone (the record counts operations, p2p included, while the
/// check counts collectives); when several do (a skipped call: the same call with two
/// sequence numbers) it does not vote. With no checked descriptor at all every call votes
/// as it is.
fn resolve_votes(descs: &BTreeMap<u32, Vote>) -> BTreeMap<u32, Desc> {
    let checked: BTreeSet<Desc> = descs
        .values()
        .filter(|v| v.checked)
        .map(|v| v.desc)
        .collect();
    let same_call = |a: &Desc, b: &Desc| (a.1, a.2, a.3, a.4, a.5) == (b.1, b.2, b.3, b.4, b.5);
    let mut out = BTreeMap::new();
    for (r, v) in descs {
        let d = if v.checked || checked.is_empty() || checked.contains(&v.desc) {
            Some(v.desc)
        } else {
            let mut like = checked.iter().filter(|c| same_call(c, &v.desc));
            match (like.next(), like.next()) {
                (Some(c), None) => Some(*c),
                (None, _) => Some(v.desc),
                (Some(_), Some(_)) => None,
            }
        };
        if let Some(d) = d {
            out.insert(*r, d);
        }
    }
    out
}

#[derive(Debug, Default)]
struct Lost {
    pid: u32,
    host: String,
    detail: String,
    observers: BTreeSet<u32>,
    first_ns: u64,
}

#[derive(Debug, Default)]
struct Episode {
    nranks: u32,
    first_ns: u64,
    op_counter: u64,
    collective: i32,
    /// Ranks that reported any failure, with their pid / host and cause.
    reporters: BTreeMap<u32, (u32, String, i32)>,
    lost: BTreeMap<u32, Lost>,
    /// rank -> its vote in an H2 episode.
    descs: BTreeMap<u32, Vote>,
    /// Ranks whose descriptor check failed (witnesses of an inconsistency).
    witnesses: BTreeSet<u32>,
    /// Diagnosed at this time (absorbing until + FAILURE_QUIET).
    fired_ns: Option<u64>,
}

/// A process (pid, host) that reported a failure in some communicator.
type Proc = (u32, String);

/// What a process reported across all its communicators.
#[derive(Debug, Default)]
struct ProcReport {
    /// Arrival of its first failure record.
    first_ns: u64,
    /// Arrival of its latest failure record.
    last_ns: u64,
    /// Processes it reported lost (`PEER_LOST`), in any communicator.
    saw_lost: BTreeSet<Proc>,
}

/// Failure episodes of every communicator.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    eps: HashMap<u64, Episode>,
    /// Every process that reported a failure, across communicators (bounded).
    procs: HashMap<Proc, ProcReport>,
    /// Processes that survived a diagnosed death (members of its communicator, not its
    /// roots), with the first record of that episode (bounded).
    cascade: HashMap<Proc, u64>,
}

impl Failures {
    /// Takes one accepted record with `state = FAILED` and a cause, received at `now_ns`.
    pub(crate) fn observe(&mut self, rec: &OpRecord, now_ns: u64) {
        let Some(trace) = rec.trace.as_ref() else {
            return;
        };
        let cause = FailureCause::try_from(rec.failure).unwrap_or(FailureCause::Unspecified);
        if cause == FailureCause::Unspecified || rec.state != wire::OpState::Failed as i32 {
            return;
        }
        let quiet = u64::try_from(FAILURE_QUIET.as_nanos()).unwrap_or(u64::MAX);
        make_room(&mut self.eps, &trace.comm_id, MAX_EPISODES, |e| {
            (e.fired_ns.is_none(), e.first_ns)
        });
        let ep = self.eps.entry(trace.comm_id).or_default();
        if ep
            .fired_ns
            .is_some_and(|f| now_ns >= f.saturating_add(quiet))
        {
            *ep = Episode::default();
        }
        if ep.fired_ns.is_none() && ep.reporters.is_empty() {
            ep.first_ns = now_ns;
            ep.op_counter = trace.op_counter;
            ep.collective = rec.op.as_ref().map_or(0, |o| o.collective);
        }
        ep.nranks = rec.nranks;
        let collective_space = rec.seq_space == wire::SeqSpace::Collective as i32;
        if collective_space && trace.op_counter < ep.op_counter && ep.fired_ns.is_none() {
            ep.op_counter = trace.op_counter;
            ep.collective = rec.op.as_ref().map_or(ep.collective, |o| o.collective);
        }
        ep.reporters
            .entry(rec.rank)
            .or_insert_with(|| (rec.pid, rec.host.clone(), rec.failure));
        self.note_process(rec, now_ns);
        let Some(ep) = self.eps.get_mut(&trace.comm_id) else {
            return;
        };
        match cause {
            FailureCause::PeerLost => {
                if let Some(pl) = rec.peer_lost.as_ref().filter(|p| p.rank < rec.nranks) {
                    let l = ep.lost.entry(pl.rank).or_insert_with(|| Lost {
                        first_ns: now_ns,
                        ..Lost::default()
                    });
                    if l.pid == 0 {
                        l.pid = pl.pid;
                    }
                    if l.host.is_empty() {
                        l.host.clone_from(&pl.host);
                    }
                    if l.detail.is_empty() {
                        l.detail.clone_from(&pl.detail);
                    }
                    l.observers.insert(rec.rank);
                }
            }
            FailureCause::Inconsistent => {
                ep.witnesses.insert(rec.rank);
                if let Some(m) = rec.mismatch.as_ref() {
                    if let Some(l) = &m.local {
                        ep.descs.insert(rec.rank, Vote::checked(desc_key(l)));
                    }
                    if let Some(r) = m.remote.as_ref().filter(|_| m.peer_rank < rec.nranks) {
                        let v = ep
                            .descs
                            .entry(m.peer_rank)
                            .or_insert(Vote::checked(desc_key(r)));
                        if !v.checked {
                            *v = Vote::checked(desc_key(r));
                        }
                    }
                }
                own_desc(ep, rec, collective_space);
            }
            FailureCause::PeerFailed => own_desc(ep, rec, collective_space),
            _ => {}
        }
    }

    /// Records that `rec`'s process reported a failure (and whom it saw lost), for the
    /// cross-communicator survivor rule. Bounded: the oldest process goes first.
    fn note_process(&mut self, rec: &OpRecord, now_ns: u64) {
        if rec.pid == 0 {
            return;
        }
        let key = (rec.pid, rec.host.clone());
        make_room(&mut self.procs, &key, MAX_PROCS, |p| p.first_ns);
        let p = self.procs.entry(key).or_insert_with(|| ProcReport {
            first_ns: now_ns,
            last_ns: now_ns,
            saw_lost: BTreeSet::new(),
        });
        p.last_ns = p.last_ns.max(now_ns);
        if rec.failure == FailureCause::PeerLost as i32 {
            if let Some(pl) = rec.peer_lost.as_ref().filter(|pl| pl.pid != 0) {
                p.saw_lost.insert((pl.pid, pl.host.clone()));
            }
        }
    }

    /// True while `comm_id` has a diagnosed failure episode within its quiet period: its
    /// hang diagnoses would only repeat what the failure said.
    pub(crate) fn holds_back(&self, comm_id: u64, now_ns: u64) -> bool {
        let quiet = u64::try_from(FAILURE_QUIET.as_nanos()).unwrap_or(u64::MAX);
        self.eps.get(&comm_id).is_some_and(|e| match e.fired_ns {
            Some(f) => now_ns < f.saturating_add(quiet),
            None => !e.reporters.is_empty(),
        })
    }

    /// Diagnoses every episode whose grace ended by `now_ns` (once each). `rank_info`
    /// gives the pid and host the analyzer knows of a rank of a communicator.
    pub(crate) fn due(
        &mut self,
        now_ns: u64,
        rank_info: &dyn Fn(u64, u32) -> Option<(u32, String)>,
    ) -> Vec<Diagnosis> {
        let grace = u64::try_from(FAILURE_GRACE.as_nanos()).unwrap_or(u64::MAX);
        let mut out = Vec::new();
        // In the order the episodes began: a death seen first is diagnosed first, so that
        // its survivors (`cascade`) are known when their own exits, seen later in another
        // communicator, are diagnosed in the same call.
        let mut ids: Vec<(u64, u64)> = self.eps.iter().map(|(id, e)| (e.first_ns, *id)).collect();
        ids.sort_unstable();
        for (_, id) in ids {
            let Some(ep) = self.eps.get_mut(&id) else {
                continue;
            };
            if ep.fired_ns.is_some()
                || ep.reporters.is_empty()
                || now_ns < ep.first_ns.saturating_add(grace)
            {
                continue;
            }
            ep.fired_ns = Some(now_ns);
            let Some(d) = diagnose(id, ep, &self.procs, &self.cascade, now_ns, rank_info) else {
                continue;
            };
            if d.roots.iter().any(|r| r.exited) {
                let roots: BTreeSet<u32> = d.roots.iter().map(|r| r.rank).collect();
                for r in (0..ep.nranks).filter(|r| !roots.contains(r)) {
                    let proc = ep
                        .reporters
                        .get(&r)
                        .map(|(p, h, _)| (*p, h.clone()))
                        .or_else(|| rank_info(id, r));
                    if let Some(proc) = proc.filter(|(pid, _)| *pid != 0) {
                        make_room(&mut self.cascade, &proc, MAX_PROCS, |t| *t);
                        self.cascade.insert(proc, ep.first_ns);
                    }
                }
            }
            out.push(d);
        }
        out
    }
}

/// Before `key` goes into `map` (bounded by `cap`): when it is new and the map is full,
/// removes the entry that `age` ranks first (the oldest).
fn make_room<K, V, A>(map: &mut HashMap<K, V>, key: &K, cap: usize, age: impl Fn(&V) -> A)
where
    K: Clone + Eq + std::hash::Hash,
    A: Ord,
{
    if map.contains_key(key) || map.len() < cap {
        return;
    }
    let oldest = map
        .iter()
        .min_by_key(|(_, v)| age(v))
        .map(|(k, _)| k.clone());
    if let Some(k) = oldest {
        map.remove(&k);
    }
}

fn own_desc(ep: &mut Episode, rec: &OpRecord, collective_space: bool) {
    // A descriptor from the check (the rank's own or what a peer received from it) is
    // exact; the failed record's operation only fills in for a rank that has none.
    if ep.descs.contains_key(&rec.rank) {
        return;
    }
    let (Some(op), Some(t)) = (rec.op.as_ref(), rec.trace.as_ref()) else {
        return;
    };
    let p2p = op.collective == wire::CollKind::Send as i32
        || op.collective == wire::CollKind::Recv as i32;
    if !collective_space || p2p {
        return;
    }
    let d = (
        t.op_counter,
        op.collective,
        op.dtype,
        op.redop,
        op.count,
        op.root,
    );
    ep.descs.insert(
        rec.rank,
        Vote {
            desc: d,
            checked: false,
        },
    );
}

fn ranks_text(v: &[u32]) -> String {
    let s: Vec<String> = v.iter().take(8).map(u32::to_string).collect();
    let more = v.len().saturating_sub(8);
    if more > 0 {
        format!("{} (+{more} more)", s.join(", "))
    } else {
        s.join(", ")
    }
}

fn root(rank: u32, pid: u32, host: String, reason: String, class: AnomalyClass) -> wire::RootCause {
    wire::RootCause {
        rank,
        host,
        pid,
        reason,
        class: class as i32,
        ..Default::default()
    }
}

fn diagnose(
    comm_id: u64,
    ep: &Episode,
    procs: &HashMap<Proc, ProcReport>,
    cascade: &HashMap<Proc, u64>,
    now_ns: u64,
    rank_info: &dyn Fn(u64, u32) -> Option<(u32, String)>,
) -> Option<Diagnosis> {
    let info = |r: u32, pid: u32, host: &str| -> (u32, String) {
        if pid != 0 || !host.is_empty() {
            return (pid, host.to_string());
        }
        ep.reporters
            .get(&r)
            .map(|(p, h, _)| (*p, h.clone()))
            .or_else(|| rank_info(comm_id, r))
            .unwrap_or_default()
    };
    let coll = wire::coll_name(ep.collective);
    let (class, roots, what) = if !ep.lost.is_empty() {
        let lost = lost_roots(ep, procs, cascade, &info);
        if lost.is_empty() {
            // Only survivors of a death already diagnosed exited (see the module doc).
            return None;
        }
        let detail: Vec<&str> = lost
            .iter()
            .map(|l| l.detail.as_str())
            .filter(|d| !d.is_empty() && *d != "process exited")
            .collect();
        let what = if detail.is_empty() {
            "process exited".to_string()
        } else {
            format!("process exited ({})", detail.join("; "))
        };
        let roots: Vec<wire::RootCause> = lost
            .into_iter()
            .map(|l| {
                let mut rc = root(
                    l.rank,
                    l.pid,
                    l.host,
                    "process exited".into(),
                    AnomalyClass::H1NotEntered,
                );
                rc.exited = true;
                rc.silent = true;
                rc.observed_by = l.observers;
                rc
            })
            .collect();
        (AnomalyClass::H1NotEntered, roots, what)
    } else if !ep.witnesses.is_empty() {
        let (roots, what) = vote(ep, &info);
        if roots.is_empty() {
            return None;
        }
        (AnomalyClass::H2Inconsistent, roots, what)
    } else {
        let mut roots = Vec::new();
        let mut class = AnomalyClass::Unspecified;
        for (r, (pid, host, cause)) in &ep.reporters {
            let (c, reason) = match FailureCause::try_from(*cause) {
                Ok(FailureCause::InvalidUsage) => {
                    (AnomalyClass::H1NotEntered, "call failed: invalid usage")
                }
                Ok(FailureCause::Internal) => (
                    AnomalyClass::H3Hardware,
                    "call failed: internal or system error",
                ),
                _ => continue,
            };
            // Invalid usage outranks an internal error when both are present.
            if class != AnomalyClass::H1NotEntered {
                class = c;
            }
            roots.push(root(*r, *pid, host.clone(), reason.into(), c));
        }
        if roots.is_empty() {
            return None;
        }
        roots.retain(|r| r.class == class as i32);
        let what = roots.first().map(|r| r.reason.clone()).unwrap_or_default();
        (class, roots, what)
    };
    let root_ranks: Vec<u32> = roots.iter().map(|r| r.rank).collect();
    let observers: BTreeSet<u32> = roots.iter().flat_map(|r| r.observed_by.clone()).collect();
    let observers: Vec<u32> = if observers.is_empty() {
        ep.reporters.keys().copied().collect()
    } else {
        observers.into_iter().collect()
    };
    let summary = format!(
        "{coll} #{} of comm {comm_id:#018x}: rank{} {} {what}; reported by rank{} {}",
        ep.op_counter,
        if root_ranks.len() == 1 { "" } else { "s" },
        ranks_text(&root_ranks),
        if observers.len() == 1 { "" } else { "s" },
        ranks_text(&observers),
    );
    Some(Diagnosis {
        id: format!(
            "{comm_id:016x}-{}-{}",
            ep.op_counter,
            wire::class_code(class)
        ),
        class: class as i32,
        roots,
        comm_id,
        trace: Some(wire::TraceId {
            comm_id,
            op_counter: ep.op_counter,
            extension: 0,
        }),
        collective: ep.collective,
        evidence: Some(wire::Evidence {
            nranks: ep.nranks,
            hung_ranks: u32::try_from(ep.reporters.len()).unwrap_or(u32::MAX),
            ..Default::default()
        }),
        detected_at_ns: now_ns,
        location_latency_ns: 0,
        summary,
        onset_ns: ep.first_ns,
        nranks: ep.nranks,
        shard: String::new(),
    })
}

/// One root of a process-death episode.
#[derive(Debug)]
struct LostRoot {
    rank: u32,
    pid: u32,
    host: String,
    /// Ranks of this communicator that reported it lost (or, for a root found through a
    /// survivor, the survivors that lead to it).
    observers: Vec<u32>,
    detail: String,
}

/// The roots of a process-death episode (pure). A lost rank is a survivor, not a root,
/// when it reported a failure itself: in this communicator, or (its process) in any
/// communicator no later than its loss was seen here and at most [`FAILURE_QUIET`] before. When only survivors are lost, the
/// roots are the ranks of this communicator whose processes the survivors reported lost
/// elsewhere; failing that, the survivor seen lost first (nothing else remains).
fn lost_roots(
    ep: &Episode,
    procs: &HashMap<Proc, ProcReport>,
    cascade: &HashMap<Proc, u64>,
    info: &dyn Fn(u32, u32, &str) -> (u32, String),
) -> Vec<LostRoot> {
    let mut roots = Vec::new();
    let mut survivors = Vec::new();
    let mut cascaded = false;
    for (r, l) in &ep.lost {
        let (pid, host) = info(*r, l.pid, &l.host);
        // Reported no later than its loss was seen, and recently (a pid reused by a later
        // process must not inherit an old report).
        let quiet = u64::try_from(FAILURE_QUIET.as_nanos()).unwrap_or(u64::MAX);
        let reported_elsewhere = procs.get(&(pid, host.clone())).is_some_and(|p| {
            p.first_ns <= l.first_ns && l.first_ns <= p.last_ns.saturating_add(quiet)
        });
        // A survivor of a death already diagnosed, lost after that death.
        let after_a_death = cascade
            .get(&(pid, host.clone()))
            .is_some_and(|&t| t <= l.first_ns && l.first_ns <= t.saturating_add(quiet));
        let root = LostRoot {
            rank: *r,
            pid,
            host,
            observers: l.observers.iter().copied().collect(),
            detail: l.detail.clone(),
        };
        cascaded |= after_a_death;
        if ep.reporters.contains_key(r) || reported_elsewhere || after_a_death {
            survivors.push((l.first_ns, root));
        } else {
            roots.push(root);
        }
    }
    if !roots.is_empty() || survivors.is_empty() {
        return roots;
    }
    let seen: BTreeSet<&Proc> = survivors
        .iter()
        .filter_map(|(_, s)| procs.get(&(s.pid, s.host.clone())))
        .flat_map(|p| p.saw_lost.iter())
        .collect();
    let survivor_ranks: Vec<u32> = survivors.iter().map(|(_, s)| s.rank).collect();
    if !seen.is_empty() {
        for r in (0..ep.nranks).filter(|r| !survivor_ranks.contains(r)) {
            let (pid, host) = info(r, 0, "");
            if pid != 0 && seen.contains(&(pid, host.clone())) {
                roots.push(LostRoot {
                    rank: r,
                    pid,
                    host,
                    observers: survivor_ranks.clone(),
                    detail: String::new(),
                });
            }
        }
    }
    if roots.is_empty() && !cascaded {
        survivors.sort_by_key(|(first, _)| *first);
        roots.extend(survivors.into_iter().take(1).map(|(_, s)| s));
    }
    roots
}

/// H2 vote: the ranks whose descriptor differs from the majority's.
fn vote(
    ep: &Episode,
    info: &dyn Fn(u32, u32, &str) -> (u32, String),
) -> (Vec<wire::RootCause>, String) {
    let votes = resolve_votes(&ep.descs);
    let mut count: BTreeMap<Desc, u32> = BTreeMap::new();
    for d in votes.values() {
        *count.entry(*d).or_insert(0) += 1;
    }
    let best = count.values().copied().max().unwrap_or(0);
    let tops: Vec<Desc> = count
        .iter()
        .filter(|(_, c)| **c == best)
        .map(|(d, _)| *d)
        .collect();
    let majority = (tops.len() == 1).then(|| tops[0]);
    let mut roots = Vec::new();
    for (r, d) in &votes {
        if majority.is_some_and(|m| m == *d) {
            continue;
        }
        let (pid, host) = info(*r, 0, "");
        let reason = match majority {
            Some(m) => format!(
                "inconsistent call: {} where the others called {}",
                desc_text(*d),
                desc_text(m)
            ),
            None => format!("inconsistent call: {} (no majority)", desc_text(*d)),
        };
        let mut rc = root(*r, pid, host, reason, AnomalyClass::H2Inconsistent);
        rc.observed_by = ep.witnesses.iter().copied().filter(|w| w != r).collect();
        roots.push(rc);
    }
    let what = match majority {
        Some(m) => format!("called differently from the majority ({})", desc_text(m)),
        None => "called differently (no majority)".to_string(),
    };
    (roots, what)
}

#[cfg(test)]
mod tests;
