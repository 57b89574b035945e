//! Human tables and JSON for diagnoses and communicator state.

use serde_json::{json, Value};

use super::table::{render, Align};
use analyzer_net::server::class_name;
use ccld_wire::{
    AnomalyList, BaselineKind, CommList, CommState, Diagnosis, Evidence, OpState, RankState,
    RootCause, Summary,
};

/// Formats ns since the epoch as `YYYY-MM-DD HH:MM:SS.mmm` UTC.
pub fn fmt_time(ns: u64) -> String {
    if ns == 0 {
        return "-".into();
    }
    let secs = ns / 1_000_000_000;
    let ms = (ns / 1_000_000) % 1000;
    let days = secs / 86_400;
    let sod = secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{ms:03}",
        sod / 3600,
        (sod / 60) % 60,
        sod % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) (proleptic Gregorian).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Formats a duration in ns with a unit (`850 ns`, `1.25 ms`, `3.0 s`, `5m02s`).
pub fn fmt_dur(ns: u64) -> String {
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} us", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else if ns < 120_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else {
        let s = ns / 1_000_000_000;
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

fn roots_short(roots: &[RootCause]) -> String {
    if roots.is_empty() {
        return "-".into();
    }
    let mut v: Vec<String> = roots
        .iter()
        .take(8)
        .map(|r| {
            let mut s = r.rank.to_string();
            if r.silent {
                s.push_str("(silent)");
            }
            s
        })
        .collect();
    if roots.len() > 8 {
        v.push(format!("+{}", roots.len() - 8));
    }
    v.join(",")
}

/// Table of diagnoses (newest first as given).
pub fn anomalies_table(l: &AnomalyList) -> String {
    let rows: Vec<Vec<String>> = l
        .diagnoses
        .iter()
        .map(|d| {
            vec![
                d.id.clone(),
                fmt_time(d.detected_at_ns),
                class_name(d.class).to_string(),
                format!("{:#018x}", d.comm_id),
                d.nranks.to_string(),
                roots_short(&d.roots),
                fmt_dur(d.location_latency_ns),
                d.shard.clone(),
                d.summary.clone(),
            ]
        })
        .collect();
    let mut s = render(
        &[
            ("ID", Align::Left),
            ("DETECTED (UTC)", Align::Left),
            ("CLASS", Align::Left),
            ("COMM", Align::Left),
            ("RANKS", Align::Right),
            ("ROOT RANKS", Align::Left),
            ("LATENCY", Align::Right),
            ("SHARD", Align::Left),
            ("SUMMARY", Align::Left),
        ],
        &rows,
    );
    if l.diagnoses.is_empty() {
        s.push_str("(no anomalies)\n");
    }
    if !l.unreachable_shards.is_empty() {
        s.push_str(&format!(
            "warning: unreachable shards (their anomalies are missing): {}\n",
            l.unreachable_shards.join(", ")
        ));
    }
    s
}

/// The incidents, newest first: each its summary line and chain (for `ccld anomalies`).
pub fn incidents_text(l: &ccld_wire::IncidentList) -> String {
    let mut s = String::from("Incidents (first causes across communicators):\n");
    if l.incidents.is_empty() {
        s.push_str("(no incidents)\n");
    }
    for i in &l.incidents {
        s.push_str(&format!("{} {}\n", fmt_time(i.detected_at_ns), i.summary));
        for c in &i.chain {
            s.push_str(&format!("    {c}\n"));
        }
    }
    if !l.unreachable_shards.is_empty() {
        s.push_str(&format!(
            "warning: unreachable shards (their incidents are missing): {}\n",
            l.unreachable_shards.join(", ")
        ));
    }
    s
}

/// One diagnosis as a multi-line human block (for `watch`).
pub fn diagnosis_block(d: &Diagnosis) -> String {
    let mut s = format!(
        "{} {} {} comm {:#018x} ({} ranks) on {}: {}\n",
        fmt_time(d.detected_at_ns),
        d.id,
        class_name(d.class),
        d.comm_id,
        d.nranks,
        if d.shard.is_empty() { "?" } else { &d.shard },
        d.summary
    );
    let rows: Vec<Vec<String>> = d
        .roots
        .iter()
        .map(|r| {
            vec![
                r.rank.to_string(),
                r.host.clone(),
                r.pid.to_string(),
                class_name(r.class).to_string(),
                if r.silent { "yes" } else { "no" }.to_string(),
                r.reason.clone(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        for line in render(
            &[
                ("ROOT RANK", Align::Right),
                ("HOST", Align::Left),
                ("PID", Align::Right),
                ("BRANCH", Align::Left),
                ("SILENT", Align::Left),
                ("REASON", Align::Left),
            ],
            &rows,
        )
        .lines()
        {
            s.push_str("    ");
            s.push_str(line);
            s.push('\n');
        }
    }
    s
}

fn op_state_name(v: i32) -> &'static str {
    match OpState::try_from(v) {
        Ok(OpState::InFlight) => "in-flight",
        Ok(OpState::Completed) => "completed",
        Ok(OpState::Failed) => "failed",
        Err(_) => "?",
    }
}

fn baseline_name(v: i32) -> &'static str {
    match BaselineKind::try_from(v) {
        Ok(BaselineKind::Static) => "static",
        Ok(BaselineKind::Dynamic) => "dynamic",
        _ => "none",
    }
}

/// Per-rank table of one communicator.
pub fn comm_table(c: &CommState) -> String {
    let mut s = format!(
        "communicator {:#018x}: {} ranks, {} rounds completed, {} tracked, baseline {} ({}), shard {}\n",
        c.comm_id,
        c.nranks,
        c.rounds_completed,
        c.tracked_rounds,
        fmt_dur(c.t_base_ns),
        baseline_name(c.baseline),
        c.shard
    );
    if !c.anomaly_ids.is_empty() {
        s.push_str(&format!("anomalies: {}\n", c.anomaly_ids.join(", ")));
    }
    if c.records_dropped > 0 {
        s.push_str(&format!(
            "warning: the probes dropped {} records (diagnoses may miss what they held)\n",
            c.records_dropped
        ));
    }
    let rows: Vec<Vec<String>> = c
        .ranks
        .iter()
        .map(|r: &RankState| {
            vec![
                r.rank.to_string(),
                r.host.clone(),
                r.pid.to_string(),
                r.last_op_counter.to_string(),
                if r.reported {
                    op_state_name(r.state).to_string()
                } else {
                    "never seen".into()
                },
                if r.in_flight_ns > 0 {
                    fmt_dur(r.in_flight_ns)
                } else {
                    "-".into()
                },
                fmt_dur(r.last_duration_ns),
                r.send_count.to_string(),
                r.recv_count.to_string(),
                format!("{:.3}", r.send_rate),
                format!("{:.3}", r.recv_rate),
                match (r.silent, r.records_dropped) {
                    (true, 0) => "SILENT".to_string(),
                    (true, d) => format!("SILENT, {d} dropped"),
                    (false, 0) => String::new(),
                    (false, d) => format!("{d} dropped"),
                },
            ]
        })
        .collect();
    s.push_str(&render(
        &[
            ("RANK", Align::Right),
            ("HOST", Align::Left),
            ("PID", Align::Right),
            ("OP", Align::Right),
            ("STATE", Align::Left),
            ("IN FLIGHT", Align::Right),
            ("LAST DUR", Align::Right),
            ("SEND", Align::Right),
            ("RECV", Align::Right),
            ("SEND RATE", Align::Right),
            ("RECV RATE", Align::Right),
            ("NOTE", Align::Left),
        ],
        &rows,
    ));
    s
}

/// Table of communicators.
pub fn comms_table(l: &CommList) -> String {
    let rows: Vec<Vec<String>> = l
        .comms
        .iter()
        .map(|c| {
            vec![
                format!("{:#018x}", c.comm_id),
                c.nranks.to_string(),
                c.rounds_completed.to_string(),
                c.tracked_rounds.to_string(),
                c.anomalies.to_string(),
                fmt_time(c.last_seen_ns),
                c.shard.clone(),
            ]
        })
        .collect();
    let mut s = render(
        &[
            ("COMM", Align::Left),
            ("RANKS", Align::Right),
            ("ROUNDS", Align::Right),
            ("TRACKED", Align::Right),
            ("ANOMALIES", Align::Right),
            ("LAST SEEN (UTC)", Align::Left),
            ("SHARD", Align::Left),
        ],
        &rows,
    );
    if !l.unreachable_shards.is_empty() {
        s.push_str(&format!(
            "warning: unreachable shards: {}\n",
            l.unreachable_shards.join(", ")
        ));
    }
    s
}

fn summary_json(s: &Option<Summary>) -> Value {
    match s {
        None => Value::Null,
        Some(s) => json!({
            "min": s.min, "max": s.max, "mean": s.mean,
            "min_rank": s.min_rank, "max_rank": s.max_rank, "n": s.n,
        }),
    }
}

fn evidence_json(e: &Option<Evidence>) -> Value {
    let Some(e) = e else { return Value::Null };
    json!({
        "r": e.r, "p": e.p,
        "t_max_ns": e.t_max_ns, "t_min_ns": e.t_min_ns, "t_base_ns": e.t_base_ns,
        "baseline": baseline_name(e.baseline), "baseline_rounds": e.baseline_rounds,
        "slow_windows": e.slow_windows,
        "window_start_ns": e.window_start_ns, "window_end_ns": e.window_end_ns,
        "theta_slow": e.theta_slow,
        "hang_threshold_ns": e.hang_threshold_ns, "max_in_flight_ns": e.max_in_flight_ns,
        "entered_ranks": e.entered_ranks, "hung_ranks": e.hung_ranks, "nranks": e.nranks,
        "duration_ns": summary_json(&e.duration_ns),
        "send_count": summary_json(&e.send_count),
        "recv_count": summary_json(&e.recv_count),
        "send_rate": summary_json(&e.send_rate),
        "recv_rate": summary_json(&e.recv_rate),
        "lagging_total": e.lagging_total,
        "lagging_ranks": e.lagging.iter().map(|r| r.rank).collect::<Vec<_>>(),
        "silent_ranks": e.silent_ranks, "silent_total": e.silent_total,
        "type_sets": e.type_sets.iter().map(|g| json!({
            "rank_count": g.rank_count, "ranks": g.ranks,
            "collective": g.op.as_ref().map(|o| o.collective),
            "count": g.op.as_ref().map(|o| o.count),
            "dtype": g.op.as_ref().map(|o| o.dtype),
        })).collect::<Vec<_>>(),
        "links": e.links.iter().map(|l| json!({
            "channel": l.channel, "from_rank": l.from_rank, "to_rank": l.to_rank,
            "sender_wait_downstream": l.sender_wait_downstream,
            "receiver_wait_upstream": l.receiver_wait_upstream,
        })).collect::<Vec<_>>(),
        "tree_layer": e.tree_layer,
        "lockstep": e.lockstep,
        "location_cost_ns": e.location_cost_ns,
    })
}

/// A diagnosis as JSON.
pub fn diagnosis_json(d: &Diagnosis) -> Value {
    json!({
        "id": d.id,
        "class": class_name(d.class),
        "comm_id": d.comm_id,
        "comm_id_hex": format!("{:#018x}", d.comm_id),
        "op_counter": d.trace.as_ref().map(|t| t.op_counter),
        "collective": d.collective,
        "nranks": d.nranks,
        "roots": d.roots.iter().map(|r| json!({
            "rank": r.rank, "host": r.host, "pid": r.pid, "reason": r.reason,
            "class": class_name(r.class), "silent": r.silent,
            "link_peer": r.link_peer, "channel": r.channel,
        })).collect::<Vec<_>>(),
        "detected_at_ns": d.detected_at_ns,
        "onset_ns": d.onset_ns,
        "location_latency_ns": d.location_latency_ns,
        "summary": d.summary,
        "shard": d.shard,
        "evidence": evidence_json(&d.evidence),
    })
}

/// An anomaly list as JSON.
pub fn anomalies_json(l: &AnomalyList) -> Value {
    json!({
        "anomalies": l.diagnoses.iter().map(diagnosis_json).collect::<Vec<_>>(),
        "unreachable_shards": l.unreachable_shards,
    })
}

/// A communicator state as JSON.
pub fn comm_json(c: &CommState) -> Value {
    json!({
        "comm_id": c.comm_id,
        "comm_id_hex": format!("{:#018x}", c.comm_id),
        "nranks": c.nranks,
        "tracked_rounds": c.tracked_rounds,
        "rounds_completed": c.rounds_completed,
        "t_base_ns": c.t_base_ns,
        "baseline": baseline_name(c.baseline),
        "first_seen_ns": c.first_seen_ns,
        "last_seen_ns": c.last_seen_ns,
        "anomaly_ids": c.anomaly_ids,
        "shard": c.shard,
        "records_dropped": c.records_dropped,
        "ranks": c.ranks.iter().map(|r| json!({
            "rank": r.rank, "host": r.host, "pid": r.pid,
            "last_op_counter": r.last_op_counter, "state": op_state_name(r.state),
            "in_flight_ns": r.in_flight_ns, "last_seen_ns": r.last_seen_ns,
            "last_duration_ns": r.last_duration_ns,
            "send_count": r.send_count, "recv_count": r.recv_count,
            "send_rate": r.send_rate, "recv_rate": r.recv_rate,
            "silent": r.silent, "reported": r.reported, "records": r.records,
            "records_dropped": r.records_dropped,
        })).collect::<Vec<_>>(),
    })
}

/// A communicator list as JSON.
pub fn comms_json(l: &CommList) -> Value {
    json!({
        "comms": l.comms.iter().map(|c| json!({
            "comm_id": c.comm_id, "comm_id_hex": format!("{:#018x}", c.comm_id),
            "nranks": c.nranks, "tracked_rounds": c.tracked_rounds,
            "rounds_completed": c.rounds_completed, "last_seen_ns": c.last_seen_ns,
            "shard": c.shard, "anomalies": c.anomalies,
        })).collect::<Vec<_>>(),
        "unreachable_shards": l.unreachable_shards,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_format_as_utc() {
        assert_eq!(fmt_time(0), "-");
        assert_eq!(fmt_time(1), "1970-01-01 00:00:00.000");
        // 2000-02-29 12:34:56.789 UTC = 951827696 s.
        assert_eq!(fmt_time(951_827_696_789_000_000), "2000-02-29 12:34:56.789");
        // 2026-11-21 00:00:00 UTC = 1795219200 s.
        assert_eq!(
            fmt_time(1_795_219_200_000_000_000),
            "2026-11-21 00:00:00.000"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(fmt_dur(850), "850 ns");
        assert_eq!(fmt_dur(1_500), "1.5 us");
        assert_eq!(fmt_dur(1_250_000), "1.25 ms");
        assert_eq!(fmt_dur(3_000_000_000), "3.00 s");
        assert_eq!(fmt_dur(302_000_000_000), "5m02s");
    }

    #[test]
    fn roots_are_capped() {
        let r: Vec<RootCause> = (0..10)
            .map(|i| RootCause {
                rank: i,
                silent: i == 1,
                ..Default::default()
            })
            .collect();
        assert_eq!(roots_short(&r), "0,1(silent),2,3,4,5,6,7,+2");
        assert_eq!(roots_short(&[]), "-");
    }
}
