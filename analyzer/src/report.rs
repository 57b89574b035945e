//! What the user sees of an incident: the one plain stderr line and the JSON line
//! (`CCLD_REPORT=stderr|FILE.jsonl`, `ccld anomalies --json`).
//!
//! Pure formatting of a [`wire::Incident`]; no I/O.
//!
//! JSON line (one object per line):
//! `{"id":"...","class":"H1","exited":true,"comm_id":"0x<16 hex>","collective":"AllReduce",
//! "op":812,"roots":[{"rank":2,"pid":4711,"host":"h","reason":"process exited","exited":true}],
//! "chain":["..."],"summary":"...","detected_at_ns":N,"onset_ns":N}`

use crate::wire::{self, AnomalyClass};

/// Plain words of an anomaly class (`"process / rank not entered (hang)"`).
pub fn class_words(class: i32) -> &'static str {
    match AnomalyClass::try_from(class) {
        Ok(AnomalyClass::H1NotEntered) => "hang: rank not entered or stopped",
        Ok(AnomalyClass::H2Inconsistent) => "hang: inconsistent call",
        Ok(AnomalyClass::H3Hardware) => "hang: communication stuck",
        Ok(AnomalyClass::S1ComputationSlow) => "slow: computation",
        Ok(AnomalyClass::S2CommunicationSlow) => "slow: communication",
        Ok(AnomalyClass::S3MixedSlow) => "slow: mixed",
        _ => "anomaly",
    }
}

fn class_code(class: i32) -> &'static str {
    AnomalyClass::try_from(class).map_or("--", wire::class_code)
}

fn op_counter(inc: &wire::Incident) -> u64 {
    inc.trace.as_ref().map_or(0, |t| t.op_counter)
}

/// True when any root's process exited.
pub fn exited(inc: &wire::Incident) -> bool {
    inc.roots.iter().any(|r| r.exited)
}

fn rank_list(v: &[u32]) -> String {
    let shown: Vec<String> = v.iter().take(8).map(u32::to_string).collect();
    let more = v.len().saturating_sub(8);
    if more > 0 {
        format!("{} (+{more} more)", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// The one plain line printed on stderr for a new incident: root rank(s) with pid and
/// host, class, operation, and how to query more. Never contains a newline.
pub fn incident_line(inc: &wire::Incident) -> String {
    let mut s = format!(
        "ccl-d: {} ({}) ",
        class_code(inc.class),
        class_words(inc.class)
    );
    if inc.roots.is_empty() {
        s.push_str("no root located");
    }
    for (i, r) in inc.roots.iter().take(4).enumerate() {
        if i > 0 {
            s.push_str("; ");
        }
        s.push_str(&format!(
            "root rank {} (pid {}, host {})",
            r.rank, r.pid, r.host
        ));
        if !r.reason.is_empty() {
            s.push_str(&format!(": {}", r.reason));
        }
        if !r.observed_by.is_empty() {
            s.push_str(&format!(
                ", observed by ranks {}",
                rank_list(&r.observed_by)
            ));
        }
    }
    if inc.roots.len() > 4 {
        s.push_str(&format!(" (+{} more roots)", inc.roots.len() - 4));
    }
    s.push_str(&format!(
        " | in {} #{} of comm 0x{:016x} | incident {}; more: `ccld anomalies` (or `ccld comm 0x{:016x}`)",
        wire::coll_name(inc.collective),
        op_counter(inc),
        inc.comm_id,
        inc.id,
        inc.comm_id
    ));
    s.replace(['\n', '\r'], " ")
}

/// The incident as one JSON object on one line (the `CCLD_REPORT=FILE.jsonl` and
/// `ccld anomalies --json` format; see the module documentation).
pub fn incident_json(inc: &wire::Incident) -> String {
    let roots: Vec<serde_json::Value> = inc
        .roots
        .iter()
        .map(|r| {
            serde_json::json!({
                "rank": r.rank,
                "pid": r.pid,
                "host": r.host,
                "reason": r.reason,
                "exited": r.exited,
                "observed_by": r.observed_by,
            })
        })
        .collect();
    let v = serde_json::json!({
        "id": inc.id,
        "class": class_code(inc.class),
        "exited": exited(inc),
        "comm_id": format!("0x{:016x}", inc.comm_id),
        "collective": wire::coll_name(inc.collective),
        "op": op_counter(inc),
        "roots": roots,
        "chain": inc.chain,
        "summary": inc.summary,
        "detected_at_ns": inc.detected_at_ns,
        "onset_ns": inc.onset_ns,
    });
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Incident, RootCause, TraceId};

    fn h1() -> Incident {
        Incident {
            id: "inc-1".into(),
            class: AnomalyClass::H1NotEntered as i32,
            roots: vec![RootCause {
                rank: 2,
                host: "h1".into(),
                pid: 4711,
                reason: "process exited".into(),
                exited: true,
                observed_by: vec![0, 1, 3],
                ..Default::default()
            }],
            comm_id: 0xabc,
            trace: Some(TraceId {
                comm_id: 0xabc,
                op_counter: 812,
                extension: 0,
            }),
            collective: wire::CollKind::AllReduce as i32,
            chain: vec!["DP AllReduce #812 waits for rank 2".into(), "x\"y".into()],
            evidence: vec![],
            detected_at_ns: 5,
            onset_ns: 3,
            summary: "sum\nmary".into(),
        }
    }

    #[test]
    fn line_names_root_pid_host_class_operation_and_query() {
        let l = incident_line(&h1());
        for want in [
            "H1",
            "root rank 2 (pid 4711, host h1)",
            "process exited",
            "observed by ranks 0, 1, 3",
            "AllReduce #812",
            "0x0000000000000abc",
            "ccld anomalies",
        ] {
            assert!(l.contains(want), "{want:?} missing in {l:?}");
        }
        assert!(!l.contains('\n'));
    }

    #[test]
    fn json_line_parses_back_with_every_contract_field() {
        let j = incident_json(&h1());
        assert!(!j.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["id"], "inc-1");
        assert_eq!(v["class"], "H1");
        assert_eq!(v["exited"], true);
        assert_eq!(v["comm_id"], "0x0000000000000abc");
        assert_eq!(v["collective"], "AllReduce");
        assert_eq!(v["op"], 812);
        assert_eq!(v["roots"][0]["rank"], 2);
        assert_eq!(v["roots"][0]["pid"], 4711);
        assert_eq!(v["roots"][0]["host"], "h1");
        assert_eq!(v["roots"][0]["reason"], "process exited");
        assert_eq!(v["roots"][0]["exited"], true);
        assert_eq!(v["chain"][1], "x\"y");
        assert_eq!(v["summary"], "sum\nmary");
        assert_eq!(v["detected_at_ns"], 5);
        assert_eq!(v["onset_ns"], 3);
        let mut no_exit = h1();
        no_exit.roots[0].exited = false;
        let v: serde_json::Value = serde_json::from_str(&incident_json(&no_exit)).unwrap();
        assert_eq!(v["exited"], false);
    }
}
