//! Real faults in a real job (issue 17): an independent C training loop (`benches/c/
//! train_client.c`, built against NVIDIA's `nccl.h`, linked to our `libnccl.so.2`) runs as
//! N processes with a data-parallel communicator, tensor-parallel pairs (`ncclCommSplit`)
//! and pipeline Send/Recv; faults are applied from outside (SIGSTOP, SIGKILL, SIGSTOP/SIGCONT
//! duty cycling) or by the client's own switches (slow computation, an inconsistent call, a
//! skipped call, a refused call). `CCLD_INJECT` is never used.
//!
//! The diagnosis is read where a user reads it: from the default embedded analyzer through
//! `CCLD_REPORT=FILE.jsonl`, or from a `ccld serve` started on 127.0.0.1 with shortened
//! windows through `ccld anomalies --json`. Verdict: the right class and exactly the right
//! root set; a clean run raises nothing. The detection delay is recorded.
//!
//! This module holds the pure part (cases, expectations, parsing of incident JSON, verdict,
//! accuracy table); [`setup`] builds the client, [`run`] runs one case.

pub mod run;
pub mod setup;

use std::fmt::Write as _;
use std::time::Duration;

/// A fault of one rank.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// No fault: the run must raise nothing.
    None,
    /// SIGSTOP of the rank's process (never continued during the observation).
    Stop,
    /// SIGKILL of the rank's process.
    Kill,
    /// SIGSTOP for `stop_ms`, SIGCONT for `run_ms`, repeated (a CPU-throttled process).
    DutyCycle {
        /// Milliseconds stopped per cycle.
        stop_ms: u64,
        /// Milliseconds running per cycle.
        run_ms: u64,
    },
    /// The client's `--slow-rank`: its computation takes `factor` times longer.
    Slow {
        /// Slowdown factor of the computation.
        factor: u32,
    },
    /// The client's `--inconsistent-rank`: ncclAllGather(count/n) once instead of
    /// ncclAllReduce(count).
    Inconsistent,
    /// The client's `--skip-rank`: one DP AllReduce is skipped.
    Skip,
    /// The client's `--bad-call-rank`: its DP AllReduce goes in a group with an AllReduce
    /// of an invalid data type, `ncclGroupEnd` fails (the group is cancelled) and the rank
    /// waits in its error handling, alive.
    BadCall,
}

impl Fault {
    /// Short name used in case names and the table.
    pub fn name(&self) -> String {
        match self {
            Fault::None => "clean".into(),
            Fault::Stop => "SIGSTOP".into(),
            Fault::Kill => "SIGKILL".into(),
            Fault::DutyCycle { stop_ms, run_ms } => format!("STOP/CONT {stop_ms}/{run_ms} ms"),
            Fault::Slow { factor } => format!("compute x{factor}"),
            Fault::Inconsistent => "AllGather for AllReduce".into(),
            Fault::Skip => "skipped AllReduce".into(),
            Fault::BadCall => "refused call".into(),
        }
    }

    /// Whether the client applies the fault itself (a command-line switch).
    pub fn by_client(&self) -> bool {
        matches!(
            self,
            Fault::Slow { .. } | Fault::Inconsistent | Fault::Skip | Fault::BadCall
        )
    }
}

/// Where the diagnosis is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Analyzer {
    /// The default embedded analyzer (hub in a rank process), `CCLD_REPORT=FILE.jsonl`.
    Embedded,
    /// A `ccld serve` shard on 127.0.0.1, `ccld anomalies --json`.
    Serve,
}

/// One case of the matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Case {
    /// The fault.
    pub fault: Fault,
    /// The faulty rank (ignored for [`Fault::None`]).
    pub root: usize,
    /// Rank processes.
    pub ranks: usize,
    /// Where the diagnosis is read.
    pub analyzer: Analyzer,
    /// Only the DP communicator (the client's `--no-tp --no-pipeline`): the single
    /// communicator of the earlier end-to-end tests.
    pub one_comm: bool,
}

impl Case {
    /// `SIGSTOP n=4 root=2 embedded`.
    pub fn name(&self) -> String {
        let a = match self.analyzer {
            Analyzer::Embedded => "embedded",
            Analyzer::Serve => "serve",
        };
        let one = if self.one_comm { " one-comm" } else { "" };
        match self.fault {
            Fault::None => format!("clean n={} {a}{one}", self.ranks),
            f => format!("{} n={} root={} {a}{one}", f.name(), self.ranks, self.root),
        }
    }

    /// What a right diagnosis is.
    pub fn expected(&self) -> Expect {
        let roots = vec![self.root as u32];
        match self.fault {
            Fault::None => Expect::Nothing,
            Fault::Stop => Expect::Incident {
                classes: &["H1"],
                roots,
                exited: Some(false),
                reason_has: None,
            },
            Fault::Kill => Expect::Incident {
                classes: &["H1"],
                roots,
                exited: Some(true),
                reason_has: None,
            },
            // A process stopped most of the time is measured frozen by its own probe and
            // named computation-slow (slow itself, not its links), the rank alone.
            Fault::DutyCycle { .. } => Expect::Incident {
                classes: &["S1"],
                roots,
                exited: None,
                reason_has: None,
            },
            Fault::Slow { .. } => Expect::Incident {
                classes: &["S1"],
                roots,
                exited: None,
                reason_has: None,
            },
            Fault::Inconsistent | Fault::Skip => Expect::Incident {
                classes: &["H2"],
                roots,
                exited: None,
                reason_has: None,
            },
            // It never enters the DP AllReduce its peers wait in, and says why.
            Fault::BadCall => Expect::Incident {
                classes: &["H1"],
                roots,
                exited: Some(false),
                reason_has: Some("its last call failed: ncclGroupEnd cancelled its group"),
            },
        }
    }
}

/// A right diagnosis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// No incident at all.
    Nothing,
    /// The first incident has one of `classes` and exactly `roots` (and `exited` when
    /// given); no incident names a rank outside `roots`.
    Incident {
        /// Accepted classes (`H1`, ..., `S3`).
        classes: &'static [&'static str],
        /// The root set, sorted.
        roots: Vec<u32>,
        /// Required value of the incident's `exited` flag.
        exited: Option<bool>,
        /// Text every root's reason must contain.
        reason_has: Option<&'static str>,
    },
}

impl Expect {
    /// Whether `i` is a right diagnosis on its own: an accepted class, exactly the roots
    /// (and the `exited` flag when required). Never true for [`Expect::Nothing`].
    pub fn matches(&self, i: &Incident) -> bool {
        match self {
            Expect::Nothing => false,
            Expect::Incident {
                classes,
                roots,
                exited,
                reason_has,
            } => {
                classes.contains(&i.class.as_str())
                    && &i.roots == roots
                    && exited.is_none_or(|e| e == i.exited)
                    && reason_has.is_none_or(|t| {
                        !i.reasons.is_empty() && i.reasons.iter().all(|r| r.contains(t))
                    })
            }
        }
    }

    /// `H1 [2] exited` / `nothing`.
    pub fn describe(&self) -> String {
        match self {
            Expect::Nothing => "nothing".into(),
            Expect::Incident {
                classes,
                roots,
                exited,
                reason_has,
            } => {
                let mut s = format!("{} {roots:?}", classes.join("|"));
                if *exited == Some(true) {
                    s.push_str(" exited");
                }
                if let Some(t) = reason_has {
                    s.push_str(&format!(" \"{t}\""));
                }
                s
            }
        }
    }
}

/// One incident as the analyzer reported it (the fields of the contract's JSON line the
/// verdict uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incident {
    /// Incident (or diagnosis) id; used to drop repeats.
    pub id: String,
    /// `H1` .. `S3`.
    pub class: String,
    /// Root ranks, sorted.
    pub roots: Vec<u32>,
    /// The root process exited.
    pub exited: bool,
    /// Detection time, ns since the Unix epoch (0 when absent).
    pub detected_at_ns: u64,
    /// The one-line summary.
    pub summary: String,
    /// The roots' reasons, in the order of `roots` before sorting (empty where the JSON
    /// has none).
    pub reasons: Vec<String>,
}

impl Incident {
    /// `H1 [2] exited`.
    pub fn describe(&self) -> String {
        format!(
            "{} {:?}{}",
            self.class,
            self.roots,
            if self.exited { " exited" } else { "" }
        )
    }
}

fn incident_from(v: &serde_json::Value) -> Result<Incident, String> {
    let class = v
        .get("class")
        .and_then(|c| c.as_str())
        .ok_or_else(|| format!("no \"class\" in {v}"))?
        .to_string();
    let roots_v = v
        .get("roots")
        .and_then(|r| r.as_array())
        .ok_or_else(|| format!("no \"roots\" array in {v}"))?;
    let mut roots = Vec::new();
    let mut reasons = Vec::new();
    let mut exited = v.get("exited").and_then(|e| e.as_bool()).unwrap_or(false);
    for r in roots_v {
        if let Some(why) = r.get("reason").and_then(|x| x.as_str()) {
            reasons.push(why.to_string());
        }
        let rank = r
            .get("rank")
            .and_then(|x| x.as_u64())
            .ok_or_else(|| format!("root without a rank in {v}"))?;
        roots.push(rank as u32);
        exited |= r.get("exited").and_then(|e| e.as_bool()).unwrap_or(false);
    }
    roots.sort_unstable();
    roots.dedup();
    let id = match v.get("id") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(x) => x.to_string(),
        None => String::new(),
    };
    Ok(Incident {
        id,
        class,
        roots,
        exited,
        detected_at_ns: v
            .get("detected_at_ns")
            .and_then(|x| x.as_u64())
            .unwrap_or(0),
        summary: v
            .get("summary")
            .and_then(|x| x.as_str())
            .unwrap_or("")
            .to_string(),
        reasons,
    })
}

/// Parses what an analyzer printed: JSON lines of incidents (`CCLD_REPORT=FILE.jsonl`,
/// `ccld anomalies --json`), or one JSON document holding an `incidents` or `anomalies`
/// array (older `ccld anomalies --json`: diagnoses, which carry the same `class` and
/// `roots`). Blank lines are skipped; anything else that is not such JSON is an error.
/// Repeats of an id are dropped; the result is in detection order (`detected_at_ns`, the
/// input order among equal times: `ccld anomalies` lists newest first).
pub fn parse_incidents(text: &str) -> Result<Vec<Incident>, String> {
    let mut v = parse_unsorted(text)?;
    v.sort_by_key(|i| i.detected_at_ns);
    Ok(v)
}

fn parse_unsorted(text: &str) -> Result<Vec<Incident>, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let mut out: Vec<Incident> = Vec::new();
    let push = |i: Incident, out: &mut Vec<Incident>| {
        if i.id.is_empty() || !out.iter().any(|o| o.id == i.id) {
            out.push(i);
        }
    };
    if let Ok(doc) = serde_json::from_str::<serde_json::Value>(trimmed) {
        let list = ["incidents", "anomalies", "diagnoses"]
            .iter()
            .find_map(|k| doc.get(*k).and_then(|x| x.as_array()));
        match list {
            Some(items) => {
                for v in items {
                    push(incident_from(v)?, &mut out);
                }
            }
            None => push(incident_from(&doc)?, &mut out),
        }
        return Ok(out);
    }
    for (n, line) in trimmed.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}: {line}", n + 1))?;
        push(incident_from(&v)?, &mut out);
    }
    Ok(out)
}

/// The verdict on what the analyzer reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Right class and exactly the right roots (or nothing, for a clean run).
    pub pass: bool,
    /// What was reported, for the table: `H1 [2]`, `nothing`, `S1 [1] (+1: H1 [0, 1])`.
    pub got: String,
}

/// Judges `seen` (in reporting order) against `want`.
pub fn verdict(want: &Expect, seen: &[Incident]) -> Verdict {
    let got = match seen.split_first() {
        None => "nothing".to_string(),
        Some((first, [])) => first.describe(),
        Some((first, rest)) => format!(
            "{} (+{}: {})",
            first.describe(),
            rest.len(),
            rest.iter()
                .map(Incident::describe)
                .collect::<Vec<_>>()
                .join("; ")
        ),
    };
    let pass = match want {
        Expect::Nothing => seen.is_empty(),
        Expect::Incident { roots, .. } => seen.first().is_some_and(|first| {
            want.matches(first)
                && seen
                    .iter()
                    .all(|i| i.roots.iter().all(|r| roots.contains(r)))
        }),
    };
    Verdict { pass, got }
}

/// One line per incident: `S2 [2] at -2.31 s: <summary>`, times relative to `origin_ns`
/// (the fault, or the start of a clean run); `?` when the incident has no time stamp.
pub fn timeline(seen: &[Incident], origin_ns: u64) -> Vec<String> {
    seen.iter()
        .map(|i| {
            let at = if i.detected_at_ns == 0 {
                "?".to_string()
            } else {
                format!(
                    "{:+.2} s",
                    (i.detected_at_ns as f64 - origin_ns as f64) / 1e9
                )
            };
            format!("{} at {at}: {}", i.describe(), i.summary)
        })
        .collect()
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The case.
    pub case: Case,
    /// Verdict.
    pub verdict: Verdict,
    /// Fault to first incident: the incident's `detected_at_ns` minus the fault's time when
    /// both are known, else when the harness first saw it.
    pub delay: Option<Duration>,
    /// Problems of the run itself (the client failed to start, a clean run's client failed,
    /// the analyzer could not be read) and the tail of the client's stderr on failure.
    pub notes: Vec<String>,
    /// Every incident reported, with its detection time relative to the fault (or to the
    /// start of a clean run) and its summary: tells a pre-fault false positive from a
    /// consequence of the fault.
    pub timeline: Vec<String>,
}

impl Outcome {
    /// Pass: right verdict and no problem of the run itself.
    pub fn pass(&self) -> bool {
        self.verdict.pass && self.notes.is_empty()
    }
}

/// The accuracy table (markdown): case, expected, got, delay, verdict; then one line per
/// class with the median and largest delay of its passing cases.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s =
        String::from("| case | expected | got | delay | verdict |\n|---|---|---|---|---|\n");
    for o in outcomes {
        let delay = o
            .delay
            .map_or("-".to_string(), |d| format!("{:.2} s", d.as_secs_f64()));
        let v = if o.pass() { "pass" } else { "FAIL" };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {delay} | {v} |",
            o.case.name(),
            o.case.expected().describe(),
            o.verdict.got.replace('|', "/")
        );
    }
    let passed = outcomes.iter().filter(|o| o.pass()).count();
    let _ = writeln!(s, "\n{passed}/{} cases pass.", outcomes.len());
    for class in ["H1", "H2", "S1", "S1|S2|S3"] {
        let mut d: Vec<f64> = outcomes
            .iter()
            .filter(|o| o.pass())
            .filter(|o| matches!(o.case.expected(), Expect::Incident { classes, .. } if classes.join("|") == class))
            .filter_map(|o| o.delay.map(|d| d.as_secs_f64()))
            .collect();
        if d.is_empty() {
            continue;
        }
        d.sort_by(f64::total_cmp);
        let _ = writeln!(
            s,
            "Detection delay {class}: median {:.2} s, max {:.2} s ({} cases).",
            d[d.len() / 2],
            d[d.len() - 1],
            d.len()
        );
    }
    s
}

/// Root positions for `n` ranks: the first, the middle and the last (rank 0 hosts the
/// embedded hub; the middle rank starts a TP pair and a pipeline stage).
pub fn root_positions(n: usize) -> [usize; 3] {
    [0, n / 2, n - 1]
}

/// The SIGSTOP/SIGCONT duty cycle of the matrix: stopped 3/4 of the time (about 4x slower).
pub const DUTY: Fault = Fault::DutyCycle {
    stop_ms: 60,
    run_ms: 20,
};

/// Every fault of the matrix.
pub fn faults() -> [Fault; 7] {
    [
        Fault::Stop,
        Fault::Kill,
        DUTY,
        Fault::Slow { factor: 4 },
        Fault::Inconsistent,
        Fault::Skip,
        Fault::BadCall,
    ]
}

/// The full matrix: {embedded, serve} x {4, 8} ranks x (clean + 7 faults x 3 roots), then
/// the controls: the same on one communicator (`one_comm`), clean and SIGSTOP x 3 roots,
/// the shape the earlier end-to-end tests cover.
pub fn full_matrix() -> Vec<Case> {
    let mut v = Vec::new();
    for analyzer in [Analyzer::Embedded, Analyzer::Serve] {
        for ranks in [4, 8] {
            let one = |fault, root| Case {
                fault,
                root,
                ranks,
                analyzer,
                one_comm: true,
            };
            v.push(one(Fault::None, 0));
            v.extend(root_positions(ranks).map(|r| one(Fault::Stop, r)));
        }
    }
    for analyzer in [Analyzer::Embedded, Analyzer::Serve] {
        for ranks in [4, 8] {
            v.push(Case {
                fault: Fault::None,
                root: 0,
                ranks,
                analyzer,
                one_comm: false,
            });
            for fault in faults() {
                for root in root_positions(ranks) {
                    v.push(Case {
                        fault,
                        root,
                        ranks,
                        analyzer,
                        one_comm: false,
                    });
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inc(class: &str, roots: &[u32], exited: bool) -> Incident {
        Incident {
            id: format!("{class}{roots:?}"),
            class: class.into(),
            roots: roots.to_vec(),
            exited,
            detected_at_ns: 0,
            summary: String::new(),
            reasons: Vec::new(),
        }
    }

    #[test]
    fn parses_contract_lines_and_old_anomaly_documents() {
        let lines = r#"{"id":"a1","class":"H1","exited":true,"comm_id":"0x00000000000000ff","collective":"AllReduce","op":17,"roots":[{"rank":2,"pid":4711,"host":"h","reason":"process exited","exited":true}],"chain":["x"],"summary":"s","detected_at_ns":5,"onset_ns":4}

{"id":"a2","class":"H2","exited":false,"roots":[{"rank":3,"pid":1,"host":"h","reason":"r","exited":false},{"rank":1,"pid":2,"host":"h","reason":"r","exited":false}],"summary":"t","detected_at_ns":9}
{"id":"a1","class":"H1","exited":true,"roots":[{"rank":2}],"summary":"s","detected_at_ns":5}"#;
        let got = parse_incidents(lines).unwrap();
        assert_eq!(got.len(), 2, "the repeated id a1 is dropped");
        assert_eq!(
            (
                got[0].class.as_str(),
                got[0].roots.as_slice(),
                got[0].exited
            ),
            ("H1", &[2u32][..], true)
        );
        assert_eq!(got[0].detected_at_ns, 5);
        assert_eq!(got[0].reasons, ["process exited"]);
        assert_eq!(got[1].roots, vec![1, 3], "roots are sorted");
        let doc = r#"{
  "anomalies": [ {"id": 7, "class": "S1", "roots": [{"rank": 1, "silent": false}], "detected_at_ns": 3} ],
  "unreachable_shards": []
}"#;
        let got = parse_incidents(doc).unwrap();
        assert_eq!(got.len(), 1);
        let newest_first = r#"{"anomalies": [
            {"id": 9, "class": "H1", "roots": [{"rank": 3}], "detected_at_ns": 20},
            {"id": 8, "class": "H1", "roots": [{"rank": 2}], "detected_at_ns": 10}]}"#;
        let order: Vec<String> = parse_incidents(newest_first)
            .unwrap()
            .into_iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(order, ["8", "9"], "detection order");
        assert_eq!((got[0].id.as_str(), got[0].class.as_str()), ("7", "S1"));
        assert!(parse_incidents("  \n").unwrap().is_empty());
        assert!(parse_incidents("{\"anomalies\": []}").unwrap().is_empty());
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert!(parse_incidents("not json").is_err());
        assert!(parse_incidents("{\"class\":\"H1\"}").is_err(), "no roots");
        assert!(parse_incidents("{\"class\":\"H1\",\"roots\":[{\"pid\":1}]}").is_err());
        assert!(parse_incidents("{\"roots\":[]}").is_err(), "no class");
    }

    #[test]
    fn verdict_wants_class_and_exactly_the_roots() {
        let kill = Case {
            fault: Fault::Kill,
            root: 2,
            ranks: 4,
            analyzer: Analyzer::Embedded,
            one_comm: false,
        }
        .expected();
        assert!(verdict(&kill, &[inc("H1", &[2], true)]).pass);
        assert!(!verdict(&kill, &[inc("H1", &[2], false)]).pass, "exited");
        assert!(
            !verdict(&kill, &[inc("H1", &[2, 3], true)]).pass,
            "extra root"
        );
        assert!(!verdict(&kill, &[inc("H1", &[3], true)]).pass, "wrong root");
        assert!(
            !verdict(&kill, &[inc("H2", &[2], true)]).pass,
            "wrong class"
        );
        assert!(!verdict(&kill, &[]).pass, "nothing");
        let v = verdict(&kill, &[inc("H1", &[2], true), inc("H1", &[0], true)]);
        assert!(!v.pass, "a later incident blames a survivor");
        assert_eq!(v.got, "H1 [2] exited (+1: H1 [0] exited)");
        assert!(verdict(&kill, &[inc("H1", &[2], true), inc("S1", &[2], false)]).pass);

        // A refused call: H1 at the rank, alive, and its reason must say the call failed.
        let bad = Case {
            fault: Fault::BadCall,
            root: 1,
            ranks: 4,
            analyzer: Analyzer::Embedded,
            one_comm: false,
        }
        .expected();
        let with = |why: &str| Incident {
            reasons: vec![why.to_string()],
            ..inc("H1", &[1], false)
        };
        assert!(verdict(&bad, &[with("stuck before the collective; its last call failed: ncclGroupEnd cancelled its group after ...")]).pass);
        assert!(
            !verdict(&bad, &[with("stuck before the collective")]).pass,
            "no reason"
        );
        assert!(
            !verdict(&bad, &[inc("H1", &[1], false)]).pass,
            "no reasons at all"
        );

        let duty = Case {
            fault: DUTY,
            root: 0,
            ranks: 8,
            analyzer: Analyzer::Serve,
            one_comm: false,
        }
        .expected();
        assert!(verdict(&duty, &[inc("S1", &[0], false)]).pass);
        for c in ["S2", "S3", "H1"] {
            assert!(!verdict(&duty, &[inc(c, &[0], false)]).pass, "{c}");
        }

        let clean = Case {
            fault: Fault::None,
            root: 0,
            ranks: 4,
            analyzer: Analyzer::Serve,
            one_comm: false,
        }
        .expected();
        assert_eq!(
            verdict(&clean, &[]),
            Verdict {
                pass: true,
                got: "nothing".into()
            }
        );
        assert!(!verdict(&clean, &[inc("S1", &[1], false)]).pass);
    }

    #[test]
    fn matrix_covers_both_analyzers_both_sizes_three_roots() {
        let m = full_matrix();
        assert_eq!(m.len(), 2 * 2 * (1 + 7 * 3) + 2 * 2 * (1 + 3));
        assert_eq!(m.iter().filter(|c| c.one_comm).count(), 16);
        for n in [4, 8] {
            let roots: std::collections::BTreeSet<usize> = m
                .iter()
                .filter(|c| c.ranks == n && c.fault != Fault::None)
                .map(|c| c.root)
                .collect();
            assert_eq!(roots.len(), 3);
            assert!(roots.iter().all(|&r| r < n));
        }
        let names: std::collections::BTreeSet<String> = m.iter().map(Case::name).collect();
        assert_eq!(names.len(), m.len(), "case names are unique");
    }

    #[test]
    fn table_lists_every_case_and_delays_per_class() {
        let case = |fault, root| Case {
            fault,
            root,
            ranks: 4,
            analyzer: Analyzer::Embedded,
            one_comm: false,
        };
        let out = vec![
            Outcome {
                case: case(Fault::Stop, 2),
                verdict: Verdict {
                    pass: true,
                    got: "H1 [2]".into(),
                },
                delay: Some(Duration::from_millis(1700)),
                notes: vec![],
                timeline: vec![],
            },
            Outcome {
                case: case(Fault::Kill, 0),
                verdict: Verdict {
                    pass: false,
                    got: "nothing".into(),
                },
                delay: None,
                notes: vec![],
                timeline: vec![],
            },
        ];
        let t = table(&out);
        assert!(
            t.contains("| SIGSTOP n=4 root=2 embedded | H1 [2] | H1 [2] | 1.70 s | pass |"),
            "{t}"
        );
        assert!(
            t.contains("| SIGKILL n=4 root=0 embedded | H1 [0] exited | nothing | - | FAIL |"),
            "{t}"
        );
        assert!(t.contains("1/2 cases pass."), "{t}");
        assert!(
            t.contains("Detection delay H1: median 1.70 s, max 1.70 s (1 cases)."),
            "{t}"
        );
    }
}
