//! Location and the diagnosis: evidence, root cause and the English text of hang and slow
//! diagnoses.

use super::*;

pub(super) fn state_wire(s: u8) -> wire::OpState {
    match s {
        ST_DONE => wire::OpState::Completed,
        ST_FAILED => wire::OpState::Failed,
        _ => wire::OpState::InFlight,
    }
}

// ---------------------------------------------------------------------------------------
// Diagnosis assembly
// ---------------------------------------------------------------------------------------

/// Rank `r` of `comm` is in flight in round `c`: (c, collective, ranks that have not
/// entered it; for a point-to-point round only its peer), `None` when all entered.
pub(super) fn waiting_for(comm: &Comm, r: usize, c: u64) -> Option<(u64, i32, Vec<u32>)> {
    let round = comm
        .rounds
        .iter()
        .find(|x| x.op_counter == c && !x.finalized);
    let (coll, missing): (i32, Vec<u32>) = match round {
        Some(rd) if !rd.entries.is_empty() => {
            let ty = rd
                .entries
                .get(r)
                .and_then(|e| rd.types.get(e.type_idx as usize));
            let coll = ty.map_or(0, |t| t.coll);
            let missing = match ty.filter(|t| t.p2p()) {
                Some(t) => usize::try_from(t.peer)
                    .ok()
                    .filter(|&p| rd.entries.get(p).is_some_and(|e| e.state == ST_NONE))
                    .map(|p| vec![p as u32])
                    .unwrap_or_default(),
                None => (0..comm.nranks)
                    .filter(|&j| rd.entries[j as usize].state == ST_NONE)
                    .collect(),
            };
            (coll, missing)
        }
        _ => (
            0,
            (0..comm.nranks)
                .filter(|&j| comm.ranks[j as usize].newest_op.is_none_or(|n| n < c))
                .collect(),
        ),
    };
    (!missing.is_empty()).then_some((c, coll, missing))
}

pub(super) fn who(comm: &Comm, rank: u32) -> String {
    match comm.ranks.get(rank as usize) {
        Some(i) if i.reported => format!("rank {rank} (pid {}, host {})", i.pid, i.host),
        _ => format!("rank {rank} (never reported)"),
    }
}

pub(super) fn ranks_phrase(comm: &Comm, ranks: &[u32]) -> String {
    match ranks {
        [] => "no rank".to_string(),
        [r] => who(comm, *r),
        _ => {
            let shown: Vec<String> = ranks.iter().take(5).map(u32::to_string).collect();
            let more = ranks.len().saturating_sub(5);
            if more > 0 {
                format!("ranks {} (+{more} more)", shown.join(", "))
            } else {
                format!("ranks {}", shown.join(", "))
            }
        }
    }
}

pub(super) fn secs(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e9)
}

pub(super) fn summary_of(vals: impl Iterator<Item = (u32, f64)>) -> Option<wire::Summary> {
    let mut s = wire::Summary {
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
        ..Default::default()
    };
    let mut sum = 0.0;
    for (r, v) in vals {
        if v < s.min {
            s.min = v;
            s.min_rank = r;
        }
        if v > s.max {
            s.max = v;
            s.max_rank = r;
        }
        sum += v;
        s.n += 1;
    }
    if s.n == 0 {
        return None;
    }
    s.mean = sum / f64::from(s.n);
    Some(s)
}

pub(super) fn root_cause(
    comm: &Comm,
    rank: u32,
    class: AnomalyClass,
    reason: String,
    silent: bool,
) -> wire::RootCause {
    let info = comm.ranks.get(rank as usize);
    wire::RootCause {
        rank,
        host: info.map(|i| i.host.clone()).unwrap_or_default(),
        pid: info.map_or(0, |i| i.pid),
        reason,
        class: class as i32,
        silent,
        link_peer: None,
        channel: None,
        exited: false,
        observed_by: Vec::new(),
    }
}

pub(super) fn rank_evidence(
    comm: &Comm,
    rank: u32,
    e: Option<&Entry>,
    now_ns: u64,
    silent_after: u64,
) -> wire::RankEvidence {
    let info = &comm.ranks[rank as usize];
    let mut ev = wire::RankEvidence {
        rank,
        host: info.host.clone(),
        pid: info.pid,
        last_op_counter: info.newest_op.unwrap_or(0),
        silent: info.silent(now_ns, silent_after),
        last_seen_ns: info.last_seen_ns,
        ..Default::default()
    };
    if let Some(e) = e.filter(|e| e.state != ST_NONE) {
        ev.entered = true;
        ev.state = state_wire(e.state) as i32;
        ev.duration_ns = if e.state == ST_INFLIGHT {
            now_ns.saturating_sub(e.start_est_ns)
        } else {
            e.duration_ns
        };
        ev.send_count = e.send;
        ev.recv_count = e.recv;
        ev.send_rate = f64::from(e.send_rate);
        ev.recv_rate = f64::from(e.recv_rate);
        ev.wait_upstream_ns = e.wait_up;
        ev.wait_downstream_ns = e.wait_down;
        if e.group != 0 {
            ev.tree_layer = Some(e.depth);
        }
    }
    ev
}

pub(super) fn diag_id(comm_id: u64, op_counter: u64, class: AnomalyClass) -> String {
    format!("{comm_id:016x}-{op_counter}-{}", wire::class_code(class))
}

/// The ring next of rank `j` on channel `ch`, from its latest completed records (the rank
/// order when it has none).
fn ring_next(comm: &Comm, j: usize, ch: usize) -> u32 {
    comm.ranks[j]
        .win_ch
        .get(ch)
        .map_or((j as u32 + 1) % comm.nranks.max(1), |a| a.next)
}

/// Every channel's ring next of each rank (`[channel][rank]`) for a collective ring round;
/// empty for other rounds.
fn hang_rings(comm: &Comm, round: &Round) -> Vec<Vec<u32>> {
    let algo = round.types.first().map_or(comm.algo, |t| t.algo);
    if round.p2p() || algo != wire::Algorithm::Ring as i32 {
        return Vec::new();
    }
    let nch = comm.ranks.iter().map(|r| r.win_ch.len()).max().unwrap_or(0);
    (0..nch)
        .map(|ch| {
            (0..comm.ranks.len())
                .map(|j| ring_next(comm, j, ch))
                .collect()
        })
        .collect()
}

pub(super) fn locate_hang_round(
    cfg: &EngineConfig,
    comm: &Comm,
    idx: usize,
    now_ns: u64,
) -> wire::Diagnosis {
    let round = &comm.rounds[idx];
    let c = round.op_counter;
    let n = comm.nranks as usize;
    let silent_after = dur_ns(cfg.silent_after);
    let thr = dur_ns(cfg.hang_threshold);
    let p2p = round.p2p();
    let none = Entry::default();
    let entry = |j: usize| round.entries.get(j).unwrap_or(&none);
    // Point-to-point rounds involve only the ranks that reported and their peers.
    let mut involved = vec![!p2p; n];
    if p2p {
        for (j, e) in round.entries.iter().enumerate() {
            if e.state != ST_NONE {
                involved[j] = true;
                if let Some(peer) = round
                    .types
                    .get(e.type_idx as usize)
                    .and_then(|t| usize::try_from(t.peer).ok())
                    .filter(|&p| p < n)
                {
                    involved[peer] = true;
                }
            }
        }
    }
    let views: Vec<HangView> = (0..n)
        .map(|j| {
            let e = entry(j);
            let info = &comm.ranks[j];
            // Expected counts: reported by the probe, else the rank's own counts in its
            // latest completed operation with the same type set.
            let exp = if e.exp_send + e.exp_recv > 0 {
                (e.exp_send, e.exp_recv)
            } else if e.state != ST_NONE
                && info.done_ty.is_some()
                && info.done_ty == round.types.get(e.type_idx as usize).copied()
            {
                (info.done_send, info.done_recv)
            } else {
                (0, 0)
            };
            let state = match e.state {
                _ if !involved[j] => HangState::NotInvolved,
                ST_INFLIGHT => HangState::InFlight,
                ST_DONE => HangState::Completed,
                ST_FAILED => HangState::Failed,
                _ => match info.newest_op {
                    Some(x) if x > c => HangState::PassedBeyond,
                    Some(x) if x == c => HangState::EnteredNoRecord,
                    _ => HangState::NotEntered,
                },
            };
            HangView {
                state,
                silent: info.silent(now_ns, silent_after),
                type_group: if e.state != ST_NONE && !p2p {
                    u32::from(e.type_idx)
                } else {
                    u32::MAX
                },
                send: e.send,
                recv: e.recv,
                exp_send: exp.0,
                exp_recv: exp.1,
                group: e.group,
                depth: e.depth,
            }
        })
        .collect();
    let rings = hang_rings(comm, round);
    let finding = locate::locate_hang(&views, &rings);
    let class = finding.class();
    let roots_all = finding.ranks();
    let cap = cfg.evidence_cap.max(1);
    // Majority type set (the reference for names).
    let mut type_counts = vec![0u32; round.types.len().max(1)];
    for v in &views {
        if let Some(x) = type_counts.get_mut(v.type_group as usize) {
            *x += 1;
        }
    }
    let major = type_counts
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i);
    let major_ty = round.types.get(major).copied();
    let coll = major_ty.map_or(0, |t| t.coll);
    let coll_name = wire::coll_name(coll);
    let earliest = round
        .entries
        .iter()
        .filter(|e| e.state == ST_INFLIGHT)
        .map(|e| e.start_est_ns)
        .min()
        .unwrap_or(now_ns);
    let max_in_flight = now_ns.saturating_sub(earliest);
    let hung = views
        .iter()
        .filter(|v| matches!(v.state, HangState::InFlight | HangState::EnteredNoRecord))
        .count();
    let entered = views
        .iter()
        .filter(|v| !matches!(v.state, HangState::NotEntered | HangState::NotInvolved))
        .count();
    let silent: Vec<u32> = views
        .iter()
        .enumerate()
        .filter(|(_, v)| v.silent && v.state != HangState::NotInvolved)
        .map(|(j, _)| j as u32)
        .collect();
    // Roots with reasons.
    let mut roots = Vec::new();
    for &r in roots_all.iter().take(cap) {
        let info = &comm.ranks[r as usize];
        let v = views[r as usize];
        let e = entry(r as usize);
        let quiet = now_ns.saturating_sub(info.last_seen_ns);
        let newest = info
            .newest_op
            .map_or_else(|| "none".to_string(), |x| format!("#{x}"));
        let mut reason = match &finding {
            HangFinding::NotEntered(_) if !info.reported => format!(
                "did not enter op #{c}: never reported (no record or heartbeat): process likely not started, stopped or dead"
            ),
            HangFinding::NotEntered(_) if v.silent => format!(
                "did not enter op #{c} (newest op {newest}); no record or heartbeat for {} s: process likely stopped or dead",
                secs(quiet)
            ),
            HangFinding::NotEntered(_) => format!(
                "did not enter op #{c} (newest op {newest}); still reporting ({} s ago): stuck before the collective",
                secs(quiet)
            ),
            HangFinding::InconsistentTypes(_) => {
                let t = round.types.get(e.type_idx as usize).copied();
                match (t, major_ty) {
                    (Some(t), Some(m)) => format!(
                        "issued {} ({} B, count {}, dtype {}, {}) as op #{c} where the majority issued {} ({} B, count {}, dtype {}, {})",
                        wire::coll_name(t.coll), t.bytes, t.count, t.dtype, wire::algo_name(t.algo),
                        wire::coll_name(m.coll), m.bytes, m.count, m.dtype, wire::algo_name(m.algo)
                    ),
                    _ => format!("issued a different operation as op #{c}"),
                }
            }
            HangFinding::NotHung(_) => match v.state {
                HangState::Failed => format!("op #{c} failed on this rank while its peers hang"),
                HangState::PassedBeyond => format!(
                    "already moved past op #{c} (newest op {newest}) while its peers hang in it"
                ),
                _ => format!("completed op #{c} while its peers hang in it"),
            },
            HangFinding::Silent(_) => format!(
                "stopped reporting during op #{c} (no record or heartbeat for {} s): process likely stopped or dead",
                secs(quiet)
            ),
            HangFinding::Starved(_) => {
                // Every channel has the same ring order (`starved_receivers` requires it).
                let up = rings
                    .first()
                    .and_then(|next| next.iter().position(|&d| d == r))
                    .map_or_else(|| "?".to_string(), |u| u.to_string());
                let counts = if v.state == HangState::EnteredNoRecord {
                    "entered by its heartbeat, no record of it yet".to_string()
                } else {
                    format!(
                        "SendCount/RecvCount {}/{} of expected {}/{}",
                        e.send, e.recv, v.exp_send, v.exp_recv
                    )
                };
                format!(
                    "hangs in op #{c} waiting for data: its ring upstream rank {up} completed op #{c}, so what it sent did not arrive ({counts}): the link from rank {up} into this rank, or this rank, stalled"
                )
            }
            HangFinding::FewestCounts(_) => {
                let exp = if e.exp_send + e.exp_recv > 0 {
                    format!(" of expected {}/{}", e.exp_send, e.exp_recv)
                } else {
                    String::new()
                };
                format!(
                    "least progress in op #{c}: SendCount/RecvCount {}/{}{exp} while every rank hangs",
                    e.send, e.recv
                )
            }
        };
        if let (HangFinding::NotEntered(_), Some(err)) = (&finding, &info.call_error) {
            // Why it did not enter: its call was refused (or its group cancelled) and the
            // rank started no operation since.
            reason.push_str(&format!("; its last call failed: {err}"));
        }
        roots.push(root_cause(comm, r, class, reason, v.silent));
    }
    let present = || {
        round
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.state != ST_NONE)
            .map(|(j, e)| (j as u32, e))
    };
    let mut type_sets = Vec::new();
    if round.types.len() > 1 {
        let mut order: Vec<usize> = (0..round.types.len()).collect();
        order.sort_by(|a, b| type_counts[*b].cmp(&type_counts[*a]).then(a.cmp(b)));
        for t in order {
            let ranks: Vec<u32> = views
                .iter()
                .enumerate()
                .filter(|(_, v)| v.type_group as usize == t)
                .map(|(j, _)| j as u32)
                .take(cap)
                .collect();
            type_sets.push(wire::TypeSetGroup {
                op: Some(round.types[t].to_wire()),
                rank_count: type_counts[t],
                ranks,
            });
        }
    }
    let lagging_all: Vec<u32> = views
        .iter()
        .enumerate()
        .filter(|(_, v)| v.state == HangState::NotEntered)
        .map(|(j, _)| j as u32)
        .collect();
    let evidence = wire::Evidence {
        hang_threshold_ns: thr,
        max_in_flight_ns: max_in_flight,
        entered_ranks: entered as u32,
        hung_ranks: hung as u32,
        nranks: comm.nranks,
        duration_ns: summary_of(present().map(|(j, e)| {
            let d = if e.state == ST_INFLIGHT {
                now_ns.saturating_sub(e.start_est_ns)
            } else {
                e.duration_ns
            };
            (j, d as f64)
        })),
        send_count: summary_of(present().map(|(j, e)| (j, e.send as f64))),
        recv_count: summary_of(present().map(|(j, e)| (j, e.recv as f64))),
        send_rate: summary_of(present().map(|(j, e)| (j, f64::from(e.send_rate)))),
        recv_rate: summary_of(present().map(|(j, e)| (j, f64::from(e.recv_rate)))),
        lagging: lagging_all
            .iter()
            .take(cap)
            .map(|&j| rank_evidence(comm, j, None, now_ns, silent_after))
            .collect(),
        lagging_total: lagging_all.len() as u32,
        silent_ranks: silent.iter().take(cap).copied().collect(),
        silent_total: silent.len() as u32,
        type_sets,
        ranks: roots_all
            .iter()
            .take(cap)
            .map(|&j| rank_evidence(comm, j, round.entries.get(j as usize), now_ns, silent_after))
            .collect(),
        algorithm: major_ty.map_or(0, |t| t.algo),
        ..Default::default()
    };
    let phrase = ranks_phrase(comm, roots_all);
    let summary = match &finding {
        HangFinding::NotEntered(_) => format!(
            "{phrase} did not enter {coll_name} #{c}: not-entered hang ({hung} of {n} ranks in flight for {} s)",
            secs(max_in_flight)
        ),
        HangFinding::InconsistentTypes(_) => format!(
            "{phrase} issued a different operation than the other ranks at {coll_name} #{c}: inconsistent hang ({hung} of {n} ranks in flight for {} s)",
            secs(max_in_flight)
        ),
        HangFinding::NotHung(_) => format!(
            "{phrase} left {coll_name} #{c} while {hung} of {n} ranks hang in it: inconsistent hang ({} s)",
            secs(max_in_flight)
        ),
        HangFinding::Silent(_) => format!(
            "{phrase} stopped reporting during {coll_name} #{c} while {hung} of {n} ranks hang: stopped or dead process ({} s)",
            secs(max_in_flight)
        ),
        HangFinding::FewestCounts(_) => format!(
            "{phrase} made the least progress in {coll_name} #{c} while all {n} ranks hang: hardware fault ({} s)",
            secs(max_in_flight)
        ),
        HangFinding::Starved(_) => format!(
            "{phrase} hung in {coll_name} #{c}, waiting for data sent by a ring upstream that completed it ({hung} of {n} ranks hang): link or hardware fault ({} s)",
            secs(max_in_flight)
        ),
    };
    let onset = earliest;
    wire::Diagnosis {
        id: diag_id(comm.id, c, class),
        class: class as i32,
        roots,
        comm_id: comm.id,
        trace: Some(wire::TraceId {
            comm_id: comm.id,
            op_counter: c,
            extension: 0,
        }),
        collective: coll,
        evidence: Some(evidence),
        detected_at_ns: now_ns,
        location_latency_ns: now_ns.saturating_sub(onset.saturating_add(thr)),
        summary,
        onset_ns: onset,
        nranks: comm.nranks,
        shard: String::new(),
    }
}

pub(super) fn locate_slow(
    cfg: &EngineConfig,
    comm: &Comm,
    ki: usize,
    r: f64,
    judged: Option<JudgedRoot>,
    window_end: u64,
    now_ns: u64,
) -> wire::Diagnosis {
    let silent_after = dur_ns(cfg.silent_after);
    let cap = cfg.evidence_cap.max(1);
    let kind = &comm.kinds[ki];
    let empty: Vec<Entry> = Vec::new();
    let (t_max, t_min, best) = match kind.best.get() {
        Some((a, b, c)) => (*a, *b, Some(c)),
        None => (0, 0, None),
    };
    let entries = best.map_or(&empty, |b| &b.entries);
    let t_base = best.map_or(0, |b| b.t_base_ns);
    let op_counter = best.map_or(0, |b| b.op_counter);
    let ty = best.map(|b| b.ty);
    let coll = ty.map_or(0, |t| t.coll);
    let coll_name = wire::coll_name(coll);
    let algo = ty.map_or(comm.algo, |t| t.algo);
    let p_paper = detect::p_ratio(t_max, t_min, t_base).unwrap_or(0.0);
    let lateness = round_lateness(entries);
    // The class is decided with the window's slowdown-weighted lateness share when the
    // gaps are known (detect::LatenessShare), else with eq. (4) on the widest round.
    let p = kind
        .share
        .share()
        .or_else(|| detect::p_ratio_adjusted(t_max, t_min, t_base, lateness))
        .unwrap_or(0.0);
    let frozen_root = judged.filter(JudgedRoot::frozen);
    // A frozen process is slow itself, whatever the operations' timing says of its links.
    let kind_s = if frozen_root.is_some() {
        SlowKind::Computation
    } else {
        detect::classify_slow(p, cfg.alpha, cfg.beta)
    };
    let class = match kind_s {
        SlowKind::Computation => AnomalyClass::S1ComputationSlow,
        SlowKind::Communication => AnomalyClass::S2CommunicationSlow,
        SlowKind::Mixed => AnomalyClass::S3MixedSlow,
    };
    // S1 candidates.
    let durations: Vec<Option<u64>> = entries.iter().map(|e| Some(e.duration_ns)).collect();
    let mut s1 = locate::min_duration(&durations);
    // S2 candidates: wait metrics on ring channels, else rates.
    let mut links = Vec::new();
    let mut s2: Vec<u32> = Vec::new();
    let mut lockstep = false;
    let mut by_links = false;
    let mut wire_links: Vec<locate::WireLink> = Vec::new();
    let mut by_least_wait = false;
    let mut by_latecomer = false;
    let cpu_wait: Vec<Option<f64>> = comm.ranks.iter().map(RankInfo::win_cpu_wait).collect();
    let starved = locate::cpu_starved(&cpu_wait);
    let by_starved = kind_s != SlowKind::Computation && !starved.is_empty();
    if by_starved {
        s2 = starved;
    } else if kind_s != SlowKind::Computation {
        if algo == wire::Algorithm::Ring as i32 {
            let nch = comm.ranks.iter().map(|r| r.win_ch.len()).max().unwrap_or(0);
            let mut chans: Vec<Vec<Option<ChanWait>>> = Vec::with_capacity(nch);
            for ch in 0..nch {
                chans.push(
                    comm.ranks
                        .iter()
                        .map(|ri| {
                            ri.window_channels()
                                .get(ch)
                                .filter(|a| a.has_wait && a.dur_ns > 0)
                                .map(|a| ChanWait {
                                    up: a.up_ns as f64 / a.dur_ns as f64,
                                    down: a.down_ns as f64 / a.dur_ns as f64,
                                    next: a.next,
                                })
                        })
                        .collect(),
                );
            }
            let (roots, found) = locate::slow_links(&chans);
            let wires: Vec<Vec<(Option<f64>, u32)>> = (0..nch)
                .map(|ch| {
                    comm.ranks
                        .iter()
                        .enumerate()
                        .map(|(j, ri)| {
                            let a = ri.window_channels().get(ch);
                            let share = a
                                .filter(|a| a.has_wire && a.dur_ns > 0)
                                // A message of the next operation may start arriving
                                // before this one ends: the share can pass 1 by a little.
                                .map(|a| (a.wire_ns as f64 / a.dur_ns as f64).min(1.0));
                            (share, ring_next(comm, j, ch))
                        })
                        .collect()
                })
                .collect();
            let (by_wire, found_wires) = locate::slow_wires(&wires);
            if !roots.is_empty() {
                s2 = roots;
                links = found;
                by_links = true;
            } else if !by_wire.is_empty() {
                s2 = by_wire;
                wire_links = found_wires;
            } else {
                let r = locate::least_waiting(&chans);
                if !r.is_empty() {
                    s2 = r;
                    by_least_wait = true;
                }
            }
        }
        if algo == wire::Algorithm::Tree as i32 {
            let links: Vec<(u32, u32, f64)> = comm
                .ranks
                .iter()
                .enumerate()
                .flat_map(|(j, ri)| {
                    ri.window_peer_wire()
                        .shares()
                        .map(move |(from, share)| (from, j as u32, share))
                })
                .collect();
            let (by_wire, found) = locate::slow_senders(&links);
            if !by_wire.is_empty() {
                s2 = by_wire;
                wire_links = found;
            }
        }
        let by_wire = !wire_links.is_empty();
        if !by_links && !by_wire && !by_least_wait && algo == wire::Algorithm::Ring as i32 {
            let r = locate::usual_latecomer(
                &comm
                    .ranks
                    .iter()
                    .map(|ri| ri.win_last_in)
                    .collect::<Vec<_>>(),
                cfg.self_calibration
                    .as_ref()
                    .map_or(ThetaConfig::default().root_share, |t| t.root_share),
            );
            if !r.is_empty() {
                s2 = r;
                by_latecomer = true;
            }
        }
        if !by_links && !by_wire && !by_least_wait && !by_latecomer {
            let rates: Vec<(f64, f64, u64)> = comm
                .ranks
                .iter()
                .enumerate()
                .map(|(j, ri)| {
                    let g = entries.get(j).map_or(0, |e| e.group);
                    if ri.win_ops > 0 {
                        let n = f64::from(ri.win_ops);
                        (ri.win_send_rate / n, ri.win_recv_rate / n, g)
                    } else {
                        let e = entries.get(j);
                        (
                            e.map_or(0.0, |e| f64::from(e.send_rate)),
                            e.map_or(0.0, |e| f64::from(e.recv_rate)),
                            g,
                        )
                    }
                })
                .collect();
            let (roots, ls) = locate::lowest_rate(&rates);
            s2 = roots;
            lockstep = ls;
        }
    }
    // The scheduler's evidence says why the judged rank held the others back, when it was
    // starved of CPU: keep it in the reason. (Read before the candidates are replaced.)
    let judged_starved = by_starved && judged.is_some_and(|jr| s2.contains(&jr.rank));
    // The self-calibrated verdict counted every round of the window; the widest round alone
    // can belong to a victim. Its rank replaces both candidate sets.
    if let Some(jr) = judged {
        s1 = vec![jr.rank];
        if kind_s != SlowKind::Computation {
            s2 = vec![jr.rank];
            links.clear();
            wire_links.clear();
            (by_links, by_least_wait, by_latecomer, lockstep) = (false, false, false, false);
        }
    }
    let by_starved = by_starved && judged.is_none();
    let starved_reason = |j: u32| {
        let mut known: Vec<f64> = cpu_wait.iter().flatten().copied().collect();
        let med = locate::median(&mut known);
        format!(
            "waited for a CPU {:.0}% of the window (runnable but not running; median of the ranks {:.0}%): CPU starvation (a competing process or thread on its cores), its peers waited for it inside the operations",
            cpu_wait[j as usize].unwrap_or(0.0) * 100.0,
            med * 100.0
        )
    };
    let fmt_pr = if (p - p_paper).abs() >= 0.005 {
        format!(
            "P = {p:.2} [the latecomers' own share of the window's slowdown; eq. 4 on the widest round: {p_paper:.2}], R = {r:.1}"
        )
    } else {
        format!("P = {p:.2}, R = {r:.1}")
    };
    let mut roots: Vec<wire::RootCause> = Vec::new();
    let add = |rank: u32, cls: AnomalyClass, reason: String, roots: &mut Vec<wire::RootCause>| {
        if let Some(x) = roots.iter_mut().find(|x| x.rank == rank) {
            x.class = AnomalyClass::S3MixedSlow as i32;
            x.reason = format!("{}; {}", x.reason, reason);
        } else if roots.len() < cap {
            let silent = comm.ranks[rank as usize].silent(now_ns, silent_after);
            roots.push(root_cause(comm, rank, cls, reason, silent));
        }
    };
    if let Some(jr) = judged {
        let inside = if judged_starved {
            starved_reason(jr.rank)
        } else {
            "the others also waited for it inside the operations".to_string()
        };
        let (cls, reason) = match kind_s {
            SlowKind::Computation => (AnomalyClass::S1ComputationSlow, jr.reason()),
            SlowKind::Communication if judged_starved => (
                AnomalyClass::S2CommunicationSlow,
                format!("{inside}; {}", jr.reason()),
            ),
            SlowKind::Communication => (AnomalyClass::S2CommunicationSlow, jr.reason()),
            SlowKind::Mixed => (
                AnomalyClass::S3MixedSlow,
                format!("{}; {inside}", jr.reason()),
            ),
        };
        add(jr.rank, cls, reason, &mut roots);
    } else if kind_s != SlowKind::Communication {
        for &j in &s1 {
            let d = entries.get(j as usize).map_or(0, |e| e.duration_ns);
            add(
                j,
                AnomalyClass::S1ComputationSlow,
                format!(
                    "shortest duration in {coll_name} #{op_counter} ({} ms vs T_max {} ms): entered last, the others waited for it",
                    d / 1_000_000,
                    t_max / 1_000_000
                ),
                &mut roots,
            );
        }
    }
    if kind_s != SlowKind::Computation && judged.is_none() {
        for &j in &s2 {
            let reason = if by_starved {
                starved_reason(j)
            } else if by_links {
                let mine: Vec<&locate::SlowLink> =
                    links.iter().filter(|l| l.from == j || l.to == j).collect();
                let desc: Vec<String> = mine
                    .iter()
                    .take(4)
                    .map(|l| {
                        format!(
                            "ch {}: {} -> {} (sender waits downstream {:.0}%, receiver waits upstream {:.0}%)",
                            l.channel,
                            l.from,
                            l.to,
                            l.sender_down * 100.0,
                            l.receiver_up * 100.0
                        )
                    })
                    .collect();
                format!("end of the slow link(s) {}", desc.join("; "))
            } else if !wire_links.is_empty() {
                let desc: Vec<String> = wire_links
                    .iter()
                    .filter(|l| l.from == j)
                    .take(4)
                    .map(|l| {
                        let ch = l.channel.map_or(String::new(), |c| format!("ch {c}: "));
                        format!(
                            "{ch}{} -> {} (its messages spent {:.0}% of the receiver's time on the wire, median link {:.0}%)",
                            l.from,
                            l.to,
                            l.wire * 100.0,
                            l.median * 100.0
                        )
                    })
                    .collect();
                format!(
                    "sender of the slow link(s) {}: its egress (or the receiver's ingress) is slow",
                    desc.join("; ")
                )
            } else if by_latecomer {
                let total: u32 = comm.ranks.iter().map(|ri| ri.win_last_in).sum();
                format!(
                    "entered last in {} of the window's {total} rounds with a computation lateness while every rank communicated slowly: the others waited for it inside the operations too (CPU starvation, descheduling)",
                    comm.ranks.get(j as usize).map_or(0, |ri| ri.win_last_in)
                )
            } else if by_least_wait {
                "waited least for its peers while they waited for it: slow itself (CPU starvation, descheduling, a slow copy), no single slow link".to_string()
            } else if lockstep {
                "lowest SendRate/RecvRate, but all ranks advance in lockstep: weak evidence (no wait metrics)".to_string()
            } else {
                "lowest SendRate/RecvRate among its peers".to_string()
            };
            add(j, AnomalyClass::S2CommunicationSlow, reason, &mut roots);
            if let (Some(l), Some(x)) = (
                wire_links.iter().find(|l| l.from == j),
                roots.iter_mut().find(|x| x.rank == j),
            ) {
                x.link_peer = Some(l.to);
                x.channel = l.channel;
            }
            if by_links {
                if let (Some(l), Some(x)) = (
                    links.iter().find(|l| l.from == j || l.to == j),
                    roots.iter_mut().find(|x| x.rank == j),
                ) {
                    x.link_peer = Some(if l.from == j { l.to } else { l.from });
                    x.channel = Some(l.channel);
                }
            }
        }
    }
    let s1_phrase = ranks_phrase(comm, &s1);
    let s2_phrase = if judged_starved {
        format!(
            "{} is starved of CPU and holds the others back",
            ranks_phrase(comm, &s2)
        )
    } else if judged.is_some() {
        format!("{} holds the others back", ranks_phrase(comm, &s2))
    } else if by_starved {
        format!(
            "{} is starved of CPU and holds the ring back",
            ranks_phrase(comm, &s2)
        )
    } else if by_links {
        match s2.as_slice() {
            [a, b] if links.iter().all(|l| (l.from, l.to) == (*a, *b)) => {
                format!("the link {} -> {} is slow", who(comm, *a), who(comm, *b))
            }
            _ => format!("{} has a slow transport", ranks_phrase(comm, &s2)),
        }
    } else if !wire_links.is_empty() {
        format!(
            "{} sends over a slow link (its messages crawl on the wire)",
            ranks_phrase(comm, &s2)
        )
    } else if by_latecomer {
        format!(
            "{} holds the ring back (entered last in most rounds)",
            ranks_phrase(comm, &s2)
        )
    } else if by_least_wait {
        format!(
            "{} holds the ring back (the others wait for it)",
            ranks_phrase(comm, &s2)
        )
    } else if s2.is_empty() {
        "no rank stands out (equal send/recv rates, no wait metrics)".to_string()
    } else {
        format!(
            "{} has the lowest send rate{}",
            ranks_phrase(comm, &s2),
            if lockstep {
                " (lockstep: weak evidence)"
            } else {
                ""
            }
        )
    };
    let baseline = best.map_or(BaselineKind::None, |b| b.baseline);
    let phase = if baseline == BaselineKind::Static {
        " [slow-at-start]"
    } else {
        ""
    };
    let summary = match kind_s {
        SlowKind::Computation if frozen_root.is_some() => {
            format!("{s1_phrase} was frozen (its process stopped) and the others waited for it in {coll_name} #{op_counter}: computation-slow ({fmt_pr}){phase}")
        }
        SlowKind::Computation => {
            format!("{s1_phrase} enters {coll_name} #{op_counter} late: computation-slow ({fmt_pr}){phase}")
        }
        SlowKind::Communication => {
            format!("{s2_phrase} in {coll_name} #{op_counter}: communication-slow ({fmt_pr}){phase}")
        }
        SlowKind::Mixed => format!(
            "{s1_phrase} enters {coll_name} #{op_counter} late and {s2_phrase}: mixed-slow ({fmt_pr}){phase}"
        ),
    };
    let root_ranks: Vec<u32> = roots.iter().map(|x| x.rank).collect();
    let window = dur_ns(cfg.detect_window);
    let win_rates = |j: usize, send: bool| -> f64 {
        let ri = &comm.ranks[j];
        if ri.win_ops == 0 {
            return 0.0;
        }
        (if send {
            ri.win_send_rate
        } else {
            ri.win_recv_rate
        }) / f64::from(ri.win_ops)
    };
    let evidence = wire::Evidence {
        r,
        p,
        p_paper,
        computation_lateness_ns: lateness,
        round_durations_ns: entries
            .iter()
            .map(|e| if e.state == ST_NONE { 0 } else { e.duration_ns })
            .collect(),
        t_max_ns: t_max,
        t_min_ns: t_min,
        t_base_ns: t_base,
        baseline: baseline as i32,
        baseline_rounds: best.map_or(0, |b| b.m),
        slow_windows: comm.streak.count(),
        window_start_ns: window_end.saturating_sub(window),
        window_end_ns: window_end,
        theta_slow: cfg.theta_slow,
        nranks: comm.nranks,
        duration_ns: summary_of(
            entries
                .iter()
                .enumerate()
                .map(|(j, e)| (j as u32, e.duration_ns as f64)),
        ),
        send_count: summary_of(
            entries
                .iter()
                .enumerate()
                .map(|(j, e)| (j as u32, e.send as f64)),
        ),
        recv_count: summary_of(
            entries
                .iter()
                .enumerate()
                .map(|(j, e)| (j as u32, e.recv as f64)),
        ),
        send_rate: summary_of((0..comm.ranks.len()).map(|j| (j as u32, win_rates(j, true)))),
        recv_rate: summary_of((0..comm.ranks.len()).map(|j| (j as u32, win_rates(j, false)))),
        silent_ranks: Vec::new(),
        ranks: root_ranks
            .iter()
            .map(|&j| rank_evidence(comm, j, entries.get(j as usize), now_ns, silent_after))
            .collect(),
        links: links
            .iter()
            .take(cap)
            .map(|l| wire::LinkEvidence {
                channel: l.channel,
                from_rank: l.from,
                to_rank: l.to,
                sender_wait_downstream: l.sender_down,
                receiver_wait_upstream: l.receiver_up,
            })
            .collect(),
        lockstep,
        algorithm: algo,
        tree_layer: root_ranks
            .first()
            .and_then(|&j| entries.get(j as usize))
            .filter(|e| e.group != 0)
            .map(|e| e.depth),
        ..Default::default()
    };
    wire::Diagnosis {
        id: diag_id(comm.id, op_counter, class),
        class: class as i32,
        roots,
        comm_id: comm.id,
        trace: Some(wire::TraceId {
            comm_id: comm.id,
            op_counter,
            extension: 0,
        }),
        collective: coll,
        evidence: Some(evidence),
        detected_at_ns: now_ns,
        location_latency_ns: now_ns.saturating_sub(window_end),
        summary,
        onset_ns: comm.slow_onset_ns,
        nranks: comm.nranks,
        shard: String::new(),
    }
}
