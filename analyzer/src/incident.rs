//! Incidents: the first cause of an anomaly across communicators, with the per-communicator
//! diagnoses as evidence (see `Incident` in `ccld-wire/proto/ccld.proto`; Holmes §4.3-4.4).
//!
//! Pure; the engine hands every new diagnosis to [`Incidents::add`] with a [`ProcView`]
//! (every process's memberships and what it is doing in each communicator), and the
//! service takes the finished incidents with [`crate::Engine::take_incidents`].
//!
//! # Correlation rule
//! Ranks are tied across communicators by their process (host, pid). For a root `p` that a
//! diagnosis of communicator A names:
//! 1. **Live state** (hangs): if `p` is in flight in another communicator B, in an
//!    operation some ranks of B have not entered, `p` is waiting there, not a root: follow
//!    it to those ranks (recursively, each process once). The same for a Send/Recv group
//!    in flight in any communicator, A included, whose peers have not entered the matching
//!    Send/Recv (a pipeline stage waiting for a stopped stage; see [`crate::p2pwait`]).
//! 2. **Other diagnoses** (hang and slow): if another recent diagnosis of the same family
//!    (hang or slow) in a communicator B that `p` belongs to names other roots and not `p`,
//!    `p` is their victim in B: follow it to B's roots.
//!
//! Where following ends is the first cause. Diagnoses whose first causes overlap are one
//! incident (its roots: the processes they share); a diagnosis whose first causes are
//! those of an incident made within [`RECENT`] is added to nothing new (it is the same
//! incident seen in another communicator). The roots of an incident are given as ranks
//! of the largest communicator their process belongs to (the world-like one), and
//! `Incident.comm_id` names it.
//!
//! # Hold
//! So that the other communicators' diagnoses of the same fault can join, a diagnosis is
//! held before its incident is made: failure diagnoses (process exited, inconsistent call)
//! [`FAILURE_HOLD`], slow ones the detection window (at most [`SLOW_HOLD_MAX`]); hangs not at
//! all (live state is enough).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use crate::report;
use crate::wire::{self, AnomalyClass, Diagnosis, Incident};

/// Hold of failure-record diagnoses (total delay stays within 2 s of the first record).
pub const FAILURE_HOLD: Duration = Duration::from_millis(500);
/// Longest hold of slow diagnoses.
pub const SLOW_HOLD_MAX: Duration = Duration::from_secs(10);
/// A diagnosis naming the roots of an incident made this recently is the same incident.
pub const RECENT: Duration = Duration::from_secs(120);

/// A process: (host, pid).
pub type Proc = (String, u32);

/// What a process is doing in one communicator.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Member {
    /// Communicator.
    pub comm_id: u64,
    /// Rank of the process in it.
    pub rank: u32,
    /// Ranks of the communicator.
    pub nranks: u32,
    /// In flight in an operation some ranks have not entered: (op counter, collective,
    /// ranks not entered).
    pub waiting: Option<(u64, i32, Vec<u32>)>,
    /// In flight in a Send/Recv group whose peers have not entered the matching operation:
    /// (pair sequence, Send or Recv, those peers).
    pub p2p_waiting: Option<(u64, i32, Vec<u32>)>,
}

/// Every known process's memberships (built by the engine at diagnosis time).
#[derive(Clone, Debug, Default)]
pub struct ProcView {
    /// Memberships of each process.
    pub procs: HashMap<Proc, Vec<Member>>,
    /// Process of each (communicator, rank).
    pub ranks: HashMap<(u64, u32), Proc>,
}

impl ProcView {
    fn proc_of(&self, comm: u64, rank: u32) -> Option<&Proc> {
        self.ranks.get(&(comm, rank))
    }

    fn members(&self, p: &Proc) -> &[Member] {
        self.procs.get(p).map_or(&[], Vec::as_slice)
    }
}

#[derive(Debug)]
struct Held {
    d: Diagnosis,
    ready_ns: u64,
    view: ProcView,
}

#[derive(Debug)]
struct Made {
    roots: BTreeSet<Proc>,
    family: bool,
    at_ns: u64,
}

/// Incidents being made and made.
#[derive(Debug, Default)]
pub struct Incidents {
    held: Vec<Held>,
    recent: Vec<Made>,
    /// Recent diagnoses (for rule 2), with their family and time.
    diags: Vec<(Diagnosis, u64)>,
    pending: Vec<Incident>,
}

fn hang_family(class: i32) -> bool {
    matches!(
        AnomalyClass::try_from(class),
        Ok(AnomalyClass::H1NotEntered | AnomalyClass::H2Inconsistent | AnomalyClass::H3Hardware)
    )
}

fn from_failure(d: &Diagnosis) -> bool {
    d.roots.iter().any(|r| r.exited)
        || (d.class == AnomalyClass::H2Inconsistent as i32
            && d.roots
                .iter()
                .any(|r| r.reason.starts_with("inconsistent call")))
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Incident id of a diagnosis (`inc-<diagnosis id>`).
pub fn incident_id(d: &Diagnosis) -> String {
    format!("inc-{}", d.id)
}

fn who(p: &Proc, rank: u32) -> String {
    format!("rank {rank} (pid {}, host {})", p.1, p.0)
}

fn ranks_text(v: &[u32]) -> String {
    let s: Vec<String> = v.iter().take(6).map(u32::to_string).collect();
    let more = v.len().saturating_sub(6);
    let tail = if more > 0 {
        format!(" (+{more} more)")
    } else {
        String::new()
    };
    format!(
        "rank{} {}{tail}",
        if v.len() == 1 { "" } else { "s" },
        s.join(", ")
    )
}

fn comm_text(view: &ProcView, comm: u64) -> String {
    let n = view
        .procs
        .values()
        .flatten()
        .find(|m| m.comm_id == comm)
        .map_or(0, |m| m.nranks);
    format!("comm {comm:#018x} ({n} ranks)")
}

/// The incident whose only evidence is `d` (no correlation).
pub fn from_diagnosis(d: &Diagnosis) -> Incident {
    let mut chain = Vec::new();
    for r in &d.roots {
        let mut s = format!("root: rank {} (pid {}, host {})", r.rank, r.pid, r.host);
        if !r.reason.is_empty() {
            s.push_str(&format!(", {}", r.reason));
        }
        chain.push(s);
    }
    let mut inc = Incident {
        id: incident_id(d),
        class: d.class,
        roots: d.roots.clone(),
        comm_id: d.comm_id,
        trace: d.trace,
        collective: d.collective,
        chain,
        evidence: vec![d.clone()],
        detected_at_ns: d.detected_at_ns,
        onset_ns: d.onset_ns,
        summary: String::new(),
    };
    inc.summary = report::incident_line(&inc);
    inc
}

/// The root of a deadlock across communicators among the processes `cycle`: the one that
/// the most ranks wait for (in flight in an operation it has not entered), ties to the
/// lowest (host, pid). Returns it as (process, communicator, rank, reason), in the
/// communicator where most ranks wait for it; `None` when nobody waits for any of them.
fn deadlock_root(view: &ProcView, cycle: &BTreeSet<Proc>) -> Option<(Proc, u64, u32, String)> {
    // For each process of the cycle and each of its communicators: who waits for it there.
    let mut best: Option<(usize, Proc, &Member, usize, &Member)> = None;
    for p in cycle {
        let mine = view.members(p);
        let mut total = 0;
        let mut top: Option<(usize, &Member)> = None;
        for m in mine {
            let waiters = view
                .procs
                .values()
                .flatten()
                .filter(|w| {
                    w.comm_id == m.comm_id
                        && w.waiting
                            .as_ref()
                            .is_some_and(|(_, _, f)| f.contains(&m.rank))
                })
                .count();
            total += waiters;
            if waiters > 0 && top.is_none_or(|(n, _)| waiters > n) {
                top = Some((waiters, m));
            }
        }
        let Some((n, m)) = top else { continue };
        // Where the process itself is stuck (in flight elsewhere).
        let Some(own) = mine.iter().find(|x| x.waiting.is_some()) else {
            continue;
        };
        if best.as_ref().is_none_or(|b| total > b.0) {
            best = Some((total, p.clone(), m, n, own));
        }
    }
    let (_, p, m, n, own) = best?;
    // The operation the waiters are in (where the root never arrived).
    let waited_op = view
        .procs
        .values()
        .flatten()
        .filter(|w| w.comm_id == m.comm_id)
        .find_map(|w| w.waiting.as_ref().filter(|(_, _, f)| f.contains(&m.rank)))
        .map_or(String::new(), |(c, coll, _)| {
            format!(" {} #{c}", wire::coll_name(*coll))
        });
    let (own_op, own_coll, waiting_for) = own
        .waiting
        .as_ref()
        .map_or((0, 0, &[][..]), |w| (w.0, w.1, w.2.as_slice()));
    let reason = format!(
        "calls in a different order than its peers (a skipped or extra call): {n} rank{} \
         wait{} for it in {}{waited_op} while it waits in {} {} #{own_op} for {}: a deadlock \
         across communicators",
        if n == 1 { "" } else { "s" },
        if n == 1 { "s" } else { "" },
        comm_text(view, m.comm_id),
        comm_text(view, own.comm_id),
        wire::coll_name(own_coll),
        ranks_text(waiting_for)
    );
    Some((p, m.comm_id, m.rank, reason))
}

/// Rank `r`'s duration in the deciding round of slow diagnosis `d`: from its detailed
/// evidence when it is a root, else from the round's per-rank durations (0 there: the rank
/// had not entered).
fn round_duration(d: &Diagnosis, r: u32) -> Option<u64> {
    let ev = d.evidence.as_ref()?;
    ev.ranks
        .iter()
        .find(|e| e.rank == r)
        .map(|e| e.duration_ns)
        .or_else(|| {
            ev.round_durations_ns
                .get(r as usize)
                .copied()
                .filter(|&v| v > 0)
        })
}

/// Where following one root ends: first causes (process, communicator, rank, reason).
struct Walk<'a> {
    view: &'a ProcView,
    others: &'a [&'a Diagnosis],
    family: bool,
    seen: BTreeSet<Proc>,
    chain: Vec<String>,
    ends: Vec<(Proc, u64, u32, String)>,
}

impl Walk<'_> {
    /// Follows `p` (rank `rank` of `comm`); false only if it led nowhere new.
    fn follow(&mut self, p: Proc, comm: u64, rank: u32, reason: String, depth: usize) -> bool {
        if !self.seen.insert(p.clone()) {
            // Already followed on another path (or a cycle): its end is known there.
            return true;
        }
        if depth < 8 {
            // Rule 1: live state.
            if self.family {
                let waits = self.view.members(&p).iter().flat_map(|m| {
                    let coll = m.waiting.as_ref().filter(|_| m.comm_id != comm);
                    [coll, m.p2p_waiting.as_ref()]
                        .into_iter()
                        .flatten()
                        .map(move |w| (m, w))
                });
                for (m, (c, coll, wait_for)) in waits {
                    if wait_for.is_empty() {
                        continue;
                    }
                    self.chain.push(format!(
                        "rank {rank} is in {} {} #{c} (as rank {}) waiting for {}",
                        comm_text(self.view, m.comm_id),
                        wire::coll_name(*coll),
                        m.rank,
                        ranks_text(wait_for)
                    ));
                    let mut led = false;
                    for &w in wait_for {
                        if let Some(q) = self.view.proc_of(m.comm_id, w).cloned() {
                            led |= self.follow(q, m.comm_id, w, "not entered".into(), depth + 1);
                        }
                    }
                    if led {
                        return true;
                    }
                }
            }
            // Rule 2: another diagnosis in which p is a victim.
            let view = self.view;
            for d in self.others {
                if d.comm_id == comm || hang_family(d.class) != self.family {
                    continue;
                }
                let mine = view.members(&p).iter().any(|m| m.comm_id == d.comm_id);
                let names_p = d
                    .roots
                    .iter()
                    .any(|r| view.proc_of(d.comm_id, r.rank) == Some(&p));
                if !mine || names_p || d.roots.is_empty() {
                    continue;
                }
                // Slow: p is a victim in B only if it waited there for B's roots longer
                // than they waited for it where it was named (the TP partner of a slow
                // rank waits in TP; both then arrive late in DP).
                if !self.family {
                    let pb = view
                        .members(&p)
                        .iter()
                        .find(|m| m.comm_id == d.comm_id)
                        .map(|m| m.rank);
                    let dur = round_duration;
                    let q = &d.roots[0];
                    let wait_b = pb
                        .and_then(|pb| dur(d, pb))
                        .unwrap_or(0)
                        .saturating_sub(dur(d, q.rank).unwrap_or(u64::MAX));
                    let from = self.others.iter().find(|x| x.comm_id == comm);
                    let qa = view.proc_of(d.comm_id, q.rank).and_then(|qp| {
                        view.members(qp)
                            .iter()
                            .find(|m| m.comm_id == comm)
                            .map(|m| m.rank)
                    });
                    let wait_a = match (from, qa) {
                        (Some(a), Some(qa)) => dur(a, qa)
                            .unwrap_or(0)
                            .saturating_sub(dur(a, rank).unwrap_or(u64::MAX)),
                        _ => 0,
                    };
                    // And p's wait in B explains at least half of the lateness it caused
                    // where it was named (a rank that hardly waited in B is slow itself).
                    let caused_a = from
                        .and_then(|a| a.evidence.as_ref())
                        .and_then(|e| e.round_durations_ns.iter().max().copied())
                        .zip(from.and_then(|a| dur(a, rank)))
                        .map_or(0, |(max, own)| max.saturating_sub(own));
                    if wait_b == 0 || wait_b <= wait_a || wait_b < caused_a / 2 {
                        continue;
                    }
                }
                let rs: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
                self.chain.push(format!(
                    "rank {rank} waits in {} {} #{} for {} ({})",
                    comm_text(view, d.comm_id),
                    wire::coll_name(d.collective),
                    d.trace.map_or(0, |t| t.op_counter),
                    ranks_text(&rs),
                    wire::class_code(AnomalyClass::try_from(d.class).unwrap_or_default())
                ));
                let mut led = false;
                for r in &d.roots {
                    if let Some(q) = view.proc_of(d.comm_id, r.rank).cloned() {
                        led |= self.follow(q, d.comm_id, r.rank, r.reason.clone(), depth + 1);
                    }
                }
                if led {
                    return true;
                }
            }
        }
        self.ends.push((p, comm, rank, reason));
        true
    }
}

impl Incidents {
    /// Takes the diagnoses of one tick (with detection times) and the processes' state.
    pub fn add(&mut self, diags: &[Diagnosis], view: &ProcView, detect_window: Duration) {
        for d in diags {
            let hold = if from_failure(d) {
                FAILURE_HOLD
            } else if hang_family(d.class) {
                Duration::ZERO
            } else {
                detect_window.min(SLOW_HOLD_MAX)
            };
            self.diags.push((d.clone(), d.detected_at_ns));
            self.held.push(Held {
                d: d.clone(),
                ready_ns: d.detected_at_ns.saturating_add(ns(hold)),
                view: view.clone(),
            });
        }
    }

    /// Makes the incidents of the diagnoses whose hold ended by `now_ns`.
    pub fn flush(&mut self, now_ns: u64) {
        let recent = ns(RECENT);
        self.recent
            .retain(|m| now_ns.saturating_sub(m.at_ns) <= recent);
        self.diags
            .retain(|(_, t)| now_ns.saturating_sub(*t) <= recent);
        let (ready, keep): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.ready_ns <= now_ns);
        self.held = keep;
        for h in ready {
            let inc = self.correlate(&h);
            if let Some(inc) = inc {
                self.pending.push(inc);
            }
        }
    }

    fn correlate(&mut self, h: &Held) -> Option<Incident> {
        let d = &h.d;
        let view = &h.view;
        let family = hang_family(d.class);
        // Every recent diagnosis (the current one included: rule 2 looks up the durations
        // of the communicator a root was named in).
        let others: Vec<&Diagnosis> = self.diags.iter().map(|(x, _)| x).collect();
        let mut walk = Walk {
            view,
            others: &others,
            family,
            seen: BTreeSet::new(),
            chain: Vec::new(),
            ends: Vec::new(),
        };
        let root_ranks: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
        walk.chain.push(format!(
            "{} {} #{} waits for {}",
            comm_text(view, d.comm_id),
            wire::coll_name(d.collective),
            d.trace.map_or(0, |t| t.op_counter),
            ranks_text(&root_ranks)
        ));
        let direct = d.roots.iter().any(|r| r.exited) || from_failure(d);
        for r in &d.roots {
            match view.proc_of(d.comm_id, r.rank).cloned() {
                Some(p) if !direct => {
                    walk.follow(p, d.comm_id, r.rank, r.reason.clone(), 0);
                }
                Some(p) => walk.ends.push((p, d.comm_id, r.rank, r.reason.clone())),
                None => {
                    walk.ends
                        .push(((r.host.clone(), r.pid), d.comm_id, r.rank, r.reason.clone()))
                }
            }
        }
        let Walk {
            mut chain,
            mut ends,
            seen: walk_seen,
            ..
        } = walk;
        let mut deadlock = false;
        if ends.is_empty() {
            // Every path closed a cycle. Among hangs that is a deadlock across
            // communicators, caused by a call order that differs between ranks (a skipped
            // or extra call): name the process most ranks wait for, whichever
            // communicator's diagnosis came first. (Slow diagnoses keep their own roots.)
            let deadlock_end = if family {
                deadlock_root(view, &walk_seen)
            } else {
                None
            };
            if let Some(end) = deadlock_end {
                chain.push(end.3.clone());
                ends = vec![end];
                deadlock = true;
            } else {
                ends = d
                    .roots
                    .iter()
                    .map(|r| {
                        let p = view
                            .proc_of(d.comm_id, r.rank)
                            .cloned()
                            .unwrap_or((r.host.clone(), r.pid));
                        (p, d.comm_id, r.rank, r.reason.clone())
                    })
                    .collect();
            }
        }
        let procs: BTreeSet<Proc> = ends.iter().map(|e| e.0.clone()).collect();
        // The same first cause seen through another communicator: one incident.
        if self
            .recent
            .iter()
            .any(|m| m.family == family && !m.roots.is_disjoint(&procs))
        {
            return None;
        }
        self.recent.push(Made {
            roots: procs.clone(),
            family,
            at_ns: d.detected_at_ns,
        });
        // Roots as ranks of the largest communicator of their process.
        let mut roots = Vec::new();
        let mut inc_comm = d.comm_id;
        let mut done = BTreeSet::new();
        for (p, comm, rank, reason) in ends {
            if !done.insert(p.clone()) {
                continue;
            }
            let orig = d.roots.iter().find(|x| x.rank == rank && comm == d.comm_id);
            let mut rc = orig.cloned().unwrap_or_else(|| {
                let cls = others
                    .iter()
                    .find(|o| o.comm_id == comm)
                    .and_then(|o| o.roots.iter().find(|x| x.rank == rank))
                    .map_or(d.class, |x| x.class);
                wire::RootCause {
                    rank,
                    host: p.0.clone(),
                    pid: p.1,
                    reason: reason.clone(),
                    class: cls,
                    ..Default::default()
                }
            });
            let best = view
                .members(&p)
                .iter()
                .max_by_key(|m| (m.nranks, m.comm_id == comm))
                .filter(|m| m.nranks > 0);
            if let Some(m) = best.filter(|m| m.comm_id != comm) {
                rc.observed_by = rc
                    .observed_by
                    .iter()
                    .filter_map(|o| view.proc_of(comm, *o))
                    .filter_map(|q| {
                        view.members(q)
                            .iter()
                            .find(|x| x.comm_id == m.comm_id)
                            .map(|x| x.rank)
                    })
                    .collect();
                rc.rank = m.rank;
            }
            if deadlock {
                rc.class = AnomalyClass::H2Inconsistent as i32;
                rc.reason.clone_from(&reason);
            }
            if roots.is_empty() {
                inc_comm = best.map_or(comm, |m| m.comm_id);
            }
            chain.push(format!(
                "root: {}, {}",
                who(&p, rc.rank),
                if rc.reason.is_empty() {
                    &reason
                } else {
                    &rc.reason
                }
            ));
            roots.push(rc);
        }
        let mut evidence = vec![d.clone()];
        for o in others.iter().filter(|o| o.id != d.id) {
            let overlaps = o.roots.iter().any(|r| {
                view.proc_of(o.comm_id, r.rank)
                    .is_some_and(|p| procs.contains(p))
            });
            if overlaps && hang_family(o.class) == family {
                evidence.push((*o).clone());
            }
        }
        // The root's communicator first.
        evidence.sort_by_key(|e| e.comm_id != inc_comm);
        let class = roots
            .first()
            .and_then(|r| {
                (r.class != 0 && r.class != AnomalyClass::S3MixedSlow as i32).then_some(r.class)
            })
            .filter(|_| d.class != AnomalyClass::S3MixedSlow as i32)
            .unwrap_or(d.class);
        let mut inc = Incident {
            id: incident_id(d),
            class,
            roots,
            comm_id: inc_comm,
            trace: d.trace,
            collective: d.collective,
            chain,
            evidence,
            detected_at_ns: d.detected_at_ns,
            onset_ns: d.onset_ns,
            summary: String::new(),
        };
        inc.summary = report::incident_line(&inc);
        Some(inc)
    }

    /// Incidents made since the last call.
    pub fn take(&mut self) -> Vec<Incident> {
        std::mem::take(&mut self.pending)
    }
}

/// Puts the service's diagnosis ids and shard names (assigned after the engine made the
/// incidents) into an incident's evidence, matching by communicator, operation and class.
pub fn adopt_ids(inc: &mut Incident, diags: &[Diagnosis]) {
    for ev in &mut inc.evidence {
        let same = diags.iter().find(|d| {
            d.comm_id == ev.comm_id
                && d.class == ev.class
                && d.trace.map(|t| t.op_counter) == ev.trace.map(|t| t.op_counter)
        });
        if let Some(d) = same {
            ev.id.clone_from(&d.id);
            ev.shard.clone_from(&d.shard);
        }
    }
}

#[cfg(test)]
mod tests;
