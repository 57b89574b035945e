//! What the user sees by default: each new incident, once, as one plain line on stderr
//! (`CCLD_REPORT`).
//!
//! Printed by the process that hosts the job's active analyzer: the active hub of a
//! multi-process job ([`crate::hub`], [`crate::standby`]) or the local engine of a job whose
//! ranks are threads of one process. `CCLD_REPORT=stderr` (default) prints the line,
//! `off` nothing, `FILE.jsonl` appends one JSON object per incident to the file (flushed
//! line by line) instead.
//!
//! The line ends with how to query more (`ccld anomalies --server ADDR`), ADDR being the
//! job's hubs (primary first; the CLI tries the next when the first is down).

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use ccld_wire as wire;

/// Where incidents go (`CCLD_REPORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReportTarget {
    /// One plain line per incident on stderr (the default).
    Stderr,
    /// Nothing.
    Off,
    /// One JSON object per line, appended to this file.
    File(PathBuf),
}

/// Parses `CCLD_REPORT` (pure): unset or empty = `stderr`; `off`/`none`; a path ending in
/// `.jsonl`. Anything else is an error naming the variable.
pub(crate) fn parse_report(v: Option<&str>) -> Result<ReportTarget, String> {
    let v = v.map(str::trim).unwrap_or("");
    match v {
        "" | "stderr" => Ok(ReportTarget::Stderr),
        "off" | "none" => Ok(ReportTarget::Off),
        p if p.ends_with(".jsonl") && p.len() > ".jsonl".len() => {
            Ok(ReportTarget::File(PathBuf::from(p)))
        }
        other => Err(format!(
            "CCLD_REPORT={other:?}: expected stderr, off or a FILE.jsonl path"
        )),
    }
}

pub(crate) use analyzer::report::{incident_json, incident_line};

/// The plain line of `inc` pointing `ccld anomalies` at the job's analyzer (`servers`, the
/// `--server` list) when known.
pub(crate) fn line_with_query(inc: &wire::Incident, servers: Option<&str>) -> String {
    let line = incident_line(inc);
    let Some(q) = servers else {
        return line;
    };
    const BARE: &str = "`ccld anomalies`";
    if line.contains(BARE) {
        line.replacen(BARE, &format!("`ccld anomalies --server {q}`"), 1)
    } else {
        format!("{line} (query more: ccld anomalies --server {q})")
    }
}

/// Prints each new incident once where `CCLD_REPORT` says.
pub(crate) struct Reporter {
    out: Option<(Box<dyn Write + Send>, bool)>,
    seen: HashSet<String>,
    query: Option<String>,
}

impl Reporter {
    /// Opens the target (a file is created or appended to; an unwritable file is an error
    /// naming `CCLD_REPORT`).
    pub(crate) fn open(target: &ReportTarget) -> Result<Reporter, String> {
        let out: Option<(Box<dyn Write + Send>, bool)> = match target {
            ReportTarget::Off => None,
            ReportTarget::Stderr => Some((Box::new(std::io::stderr()), false)),
            ReportTarget::File(p) => Some((Box::new(open_append(p)?), true)),
        };
        Ok(Reporter {
            out,
            seen: HashSet::new(),
            query: None,
        })
    }

    /// A reporter writing to `w` (`json`: JSON lines, else plain lines). For tests.
    #[cfg(test)]
    pub(crate) fn to_writer(w: Box<dyn Write + Send>, json: bool) -> Reporter {
        Reporter {
            out: Some((w, json)),
            seen: HashSet::new(),
            query: None,
        }
    }

    /// The `ccld anomalies --server` list the plain line points to.
    pub(crate) fn set_query(&mut self, servers: String) {
        self.query = Some(servers);
    }

    /// Prints `inc` unless an incident with its id was printed already; returns whether it
    /// printed. A write error is logged, never fatal.
    pub(crate) fn report(&mut self, inc: &wire::Incident) -> bool {
        if !self.seen.insert(inc.id.clone()) {
            return false;
        }
        let Some((w, json)) = self.out.as_mut() else {
            return false;
        };
        let mut line = if *json {
            incident_json(inc)
        } else {
            line_with_query(inc, self.query.as_deref())
        };
        line.push('\n');
        let r = w.write_all(line.as_bytes()).and_then(|_| w.flush());
        if let Err(e) = r {
            tracing::warn!(target: "nccl::COLL", "CCL-D: cannot write an incident report: {e}");
            return false;
        }
        true
    }
}

fn open_append(p: &Path) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .map_err(|e| format!("CCLD_REPORT={}: {e}", p.display()))
}

/// The reporter `CCLD_REPORT` asks for (strict).
pub(crate) fn from_env(get: crate::diag::EnvGet<'_>) -> Result<Reporter, String> {
    Reporter::open(&parse_report(get("CCLD_REPORT").as_deref())?)
}

/// Test helpers shared with other modules' tests.
#[cfg(test)]
pub(crate) mod tests_support {
    use parking_lot::Mutex;
    use std::io::Write;
    use std::sync::Arc;

    /// A shared in-memory writer.
    #[derive(Clone, Default)]
    pub(crate) struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Buf {
        /// Everything written so far.
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().clone()).unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::tests_support::Buf;

    fn inc(id: &str, rank: u32, exited: bool) -> wire::Incident {
        wire::Incident {
            id: id.into(),
            class: wire::AnomalyClass::H1NotEntered as i32,
            roots: vec![wire::RootCause {
                rank,
                pid: 4711,
                host: "h\"1".into(),
                reason: if exited {
                    "process exited"
                } else {
                    "not entered"
                }
                .into(),
                exited,
                ..Default::default()
            }],
            comm_id: 0xabc,
            trace: Some(wire::TraceId {
                comm_id: 0xabc,
                op_counter: 77,
                extension: 0,
            }),
            collective: wire::CollKind::AllReduce as i32,
            detected_at_ns: 5,
            onset_ns: 3,
            ..Default::default()
        }
    }

    #[test]
    fn report_values_are_strict() {
        assert_eq!(parse_report(None), Ok(ReportTarget::Stderr));
        assert_eq!(parse_report(Some(" ")), Ok(ReportTarget::Stderr));
        assert_eq!(parse_report(Some("stderr")), Ok(ReportTarget::Stderr));
        assert_eq!(parse_report(Some("off")), Ok(ReportTarget::Off));
        assert_eq!(
            parse_report(Some("/tmp/x/inc.jsonl")),
            Ok(ReportTarget::File("/tmp/x/inc.jsonl".into()))
        );
        for bad in ["stdout", "stdrr", "/tmp/inc.json", ".jsonl", "1"] {
            let e = parse_report(Some(bad)).unwrap_err();
            assert!(e.contains("CCLD_REPORT") && e.contains("FILE.jsonl"), "{e}");
        }
        let e = Reporter::open(&ReportTarget::File("/nonexistent-dir/x.jsonl".into()))
            .err()
            .unwrap();
        assert!(e.contains("CCLD_REPORT=/nonexistent-dir/x.jsonl"), "{e}");
    }

    #[test]
    fn each_incident_is_printed_once_with_where_to_query() {
        let b = Buf::default();
        let mut r = Reporter::to_writer(Box::new(b.clone()), false);
        r.set_query("127.0.0.1:5000,127.0.0.1:6000".into());
        assert!(r.report(&inc("s0-1", 2, false)));
        assert!(!r.report(&inc("s0-1", 2, false)), "same id twice");
        assert!(r.report(&inc("s0-2", 3, true)));
        let text = b.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains("H1"), "{}", lines[0]);
        assert!(lines[0].contains("rank 2 (pid 4711"), "{}", lines[0]);
        assert!(lines[0].contains("AllReduce #77"), "{}", lines[0]);
        assert!(
            lines[0].contains("ccld anomalies --server 127.0.0.1:5000,127.0.0.1:6000"),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("rank 3") && lines[1].contains("process exited"));
        // Without a known analyzer the line is the analyzer's own.
        let i = inc("x", 1, false);
        assert_eq!(line_with_query(&i, None), incident_line(&i));
    }

    #[test]
    fn json_lines_follow_the_contract() {
        let b = Buf::default();
        let mut r = Reporter::to_writer(Box::new(b.clone()), true);
        r.report(&inc("s0-1", 2, false));
        r.report(&inc("s0-2", 0, true));
        let text = b.text();
        let v: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0]["id"], "s0-1");
        assert_eq!(v[0]["class"], "H1");
        assert_eq!(v[0]["exited"], false);
        assert_eq!(v[0]["comm_id"], "0x0000000000000abc");
        assert_eq!(v[0]["collective"], "AllReduce");
        assert_eq!(v[0]["op"], 77);
        assert_eq!(v[0]["roots"][0]["rank"], 2);
        assert_eq!(v[0]["roots"][0]["host"], "h\"1");
        assert_eq!(v[0]["roots"][0]["reason"], "not entered");
        assert_eq!(v[1]["exited"], true);
        assert_eq!(v[1]["roots"][0]["reason"], "process exited");
        assert_eq!(
            (v[1]["detected_at_ns"].as_u64(), v[1]["onset_ns"].as_u64()),
            (Some(5), Some(3))
        );
    }

    #[test]
    fn off_prints_nothing() {
        let mut r = Reporter::open(&ReportTarget::Off).unwrap();
        assert!(!r.report(&inc("s0-1", 2, false)));
    }

    #[test]
    fn a_file_is_appended_line_by_line() {
        let p = std::env::temp_dir().join(format!("ccld-report-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let t = ReportTarget::File(p.clone());
        Reporter::open(&t).unwrap().report(&inc("a", 1, false));
        let mut r = Reporter::open(&t).unwrap();
        r.report(&inc("b", 2, false));
        // Flushed per line: readable while the reporter lives.
        let text = std::fs::read_to_string(&p).unwrap();
        let ids: Vec<String> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
            .collect();
        assert_eq!(ids, vec!["\"a\"", "\"b\""]);
        let _ = std::fs::remove_file(&p);
    }
}
