//! CCL-D probe: the Trace ID that labels one round of a communicator, the per-rank probing
//! frame with per-channel SendCount/RecvCount (plus wait-time extension slots), the
//! operation type set recorded for every operation, the per-process diagnostic thread
//! ([`diag`]) and the delivery of its records to an analyzer ([`embedded`], [`hub`] for the
//! embedded analyzer of a multi-process job, [`reporter`]).
//!
//! Dependency direction: `ccl-core -> probe -> {ccld-wire, analyzer, analyzer-net}`. This
//! crate must not depend on `ccl-core` (the runtime registers its communicators here); it
//! depends on `ccld-wire` for the record format, on `analyzer` for the pure engine
//! (embedded mode) and on `analyzer-net` for the client library (remote mode) and the hub's
//! shard. It must not reach `ccld` (the command line and its SQLite history): see
//! `docs/architecture.md`.

#![warn(unreachable_pub)]

mod asym;
pub mod diag;
pub mod embedded;
mod failure;
pub mod frame;
pub mod hub;
mod hublink;
pub mod linger;
mod optype;
mod report;
mod reporter;
pub mod sched;
mod seqspace;
mod standby;
pub mod thin;
pub mod wire;

pub use diag::{now_ns, register, Identity, PeerWire, Source};
pub use failure::{DescriptorMismatch, Failure, FailureCause, OpDescriptor, PeerLost};
pub use frame::{
    ext_bytes, ChannelCounts, ChannelWaits, Frame, FrameBlock, FrameHeader, FrameHeaderSnapshot,
    ProbingFrame, TraceId, EXT_WORDS_PER_CHANNEL, FRAME_BLOCKS, FRAME_HEADER_BYTES, PAPER_CHANNELS,
};
pub use optype::{Algo, CollKind, EndTime, Finished, OpLog, OpSnapshot, OpState, OpTypeSet, Proto};
pub use seqspace::{OpSeq, PeerSeq, SeqLog, SeqSpace};

use ccld_wire::{self as w, AnomalyClass};

/// True when the environment turns probing off (`CCLD_DISABLE=1`).
///
/// Any value other than `0`, `1` or empty is rejected so that a typo is not silently read
/// as "enabled".
pub fn disabled_from_env() -> Result<bool, String> {
    Ok(ccl_params::CCLD_DISABLE
        .flag()
        .map_err(|e| e.0)?
        .unwrap_or(false))
}

/// Where the records go (`CCLD_ANALYZER`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnalyzerTarget {
    /// In-process analyzer (`embedded`, the default).
    Embedded,
    /// No analyzer: the diagnostic thread is not started (`off`).
    Off,
    /// Analyzer shards `host:port`, comma separated.
    Remote(Vec<String>),
}

/// Parses `CCLD_ANALYZER` (pure).
pub fn parse_analyzer(v: Option<&str>) -> Result<AnalyzerTarget, String> {
    let v = v.map(str::trim).unwrap_or("");
    match v {
        "" | "embedded" => Ok(AnalyzerTarget::Embedded),
        "off" | "none" => Ok(AnalyzerTarget::Off),
        list => {
            let mut shards = Vec::new();
            for s in list.split(',').map(str::trim) {
                let ok = s
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
                if !ok {
                    return Err(format!(
                        "CCLD_ANALYZER={v:?}: {s:?} is not host:port (expected embedded, off or host:port[,host:port...])"
                    ));
                }
                shards.push(s.to_string());
            }
            Ok(AnalyzerTarget::Remote(shards))
        }
    }
}

/// Starts the diagnostic thread once per process as the environment says (`CCLD_DISABLE`,
/// `CCLD_ANALYZER`, `CCLD_SAMPLE_US`, ...). `Ok(false)`: probing is off. A malformed
/// variable is an error naming it (the runtime fails init with it).
pub fn start() -> Result<bool, String> {
    if disabled_from_env()? {
        return Ok(false);
    }
    let get = &diag::process_env;
    let cfg = diag::DiagConfig::resolve(get)?;
    match parse_analyzer(diag::process_env(ccl_params::CCLD_ANALYZER.name).as_deref())? {
        AnalyzerTarget::Off => Ok(false),
        AnalyzerTarget::Embedded => {
            let ecfg = diag::engine_config(get)?;
            let spool = reporter::SpoolSettings::from_env(get)?;
            let rep = report::from_env(get)?;
            diag::start_with(cfg, move || {
                let e = embedded::Embedded::install(ecfg);
                Ok(Box::new(embedded::EmbeddedSink::new(e, spool, rep)) as Box<dyn diag::Sink>)
            })?;
            Ok(true)
        }
        AnalyzerTarget::Remote(shards) => {
            // Checked for typos; the analyzer shards report, not this process.
            report::parse_report(get("CCLD_REPORT").as_deref())?;
            let spool = reporter::spool_from_env(get)?;
            diag::start_with(cfg, move || {
                Ok(Box::new(reporter::RemoteSink::new(shards, spool)?) as Box<dyn diag::Sink>)
            })?;
            Ok(true)
        }
    }
}

/// A diagnosis in plain words, e.g. `rank 2 (pid 4711, host h1) enters AllReduce #1234
/// late: computation-slow (P = 0.93, R = 4.1)`.
pub fn describe(d: &w::Diagnosis) -> String {
    let coll = w::coll_name(d.collective);
    let op = d.trace.as_ref().map_or(0, |t| t.op_counter);
    let ev = d.evidence.clone().unwrap_or_default();
    let class = d.class();
    let (what, label) = match class {
        AnomalyClass::S1ComputationSlow => {
            (format!("enters {coll} #{op} late"), "computation-slow")
        }
        AnomalyClass::S2CommunicationSlow => (
            format!("communicates slowly in {coll} #{op}"),
            "communication-slow",
        ),
        AnomalyClass::S3MixedSlow => (
            format!("is slow in {coll} #{op}"),
            "mixed computation/communication-slow",
        ),
        // A silent root may have stopped inside the operation as well as before it.
        AnomalyClass::H1NotEntered if !d.roots.is_empty() && d.roots.iter().all(|r| r.silent) => (
            format!("stopped at or before {coll} #{op}"),
            "not-entered hang",
        ),
        AnomalyClass::H1NotEntered => (format!("never entered {coll} #{op}"), "not-entered hang"),
        AnomalyClass::H2Inconsistent => (
            format!("issued an operation inconsistent with its peers at {coll} #{op}"),
            "inconsistent hang",
        ),
        AnomalyClass::H3Hardware => (
            format!("made the least progress in hung {coll} #{op}"),
            "hardware-fault hang",
        ),
        AnomalyClass::Unspecified => (format!("{coll} #{op}"), "anomaly"),
    };
    let figures = match class {
        AnomalyClass::S1ComputationSlow
        | AnomalyClass::S2CommunicationSlow
        | AnomalyClass::S3MixedSlow => format!(" (P = {:.2}, R = {:.1})", ev.p, ev.r),
        _ => format!(
            " ({} of {} ranks hung, longest {:.1} s)",
            ev.hung_ranks,
            d.nranks,
            ev.max_in_flight_ns as f64 / 1e9
        ),
    };
    let roots: Vec<String> = d
        .roots
        .iter()
        .map(|r| {
            let mut s = format!("rank {} (pid {}, host {})", r.rank, r.pid, r.host);
            if let (Some(p), Some(c)) = (r.link_peer, r.channel) {
                s.push_str(&format!(" [link to rank {p}, channel {c}]"));
            }
            if r.silent {
                s.push_str(" [silent: process stopped or dead]");
            }
            s
        })
        .collect();
    let who = if roots.is_empty() {
        "no rank".to_string()
    } else {
        roots.join(" and ")
    };
    format!("{who} {what}: {label}{figures}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analyzer_target_parsing() {
        assert_eq!(parse_analyzer(None), Ok(AnalyzerTarget::Embedded));
        assert_eq!(
            parse_analyzer(Some("embedded")),
            Ok(AnalyzerTarget::Embedded)
        );
        assert_eq!(parse_analyzer(Some("off")), Ok(AnalyzerTarget::Off));
        assert_eq!(
            parse_analyzer(Some("a:1, b.c:65535")),
            Ok(AnalyzerTarget::Remote(vec![
                "a:1".into(),
                "b.c:65535".into()
            ]))
        );
        for bad in ["a", "a:0", ":5", "a:1,,b:2", "a:99999", "emb"] {
            let e = parse_analyzer(Some(bad)).unwrap_err();
            assert!(e.contains("CCLD_ANALYZER"), "{e}");
        }
    }

    #[test]
    fn describe_in_plain_words() {
        let d = w::Diagnosis {
            class: AnomalyClass::S1ComputationSlow as i32,
            roots: vec![w::RootCause {
                rank: 2,
                host: "h1".into(),
                pid: 4711,
                ..Default::default()
            }],
            trace: Some(w::TraceId {
                comm_id: 1,
                op_counter: 1234,
                extension: 0,
            }),
            collective: w::CollKind::AllReduce as i32,
            evidence: Some(w::Evidence {
                p: 0.93,
                r: 4.1,
                ..Default::default()
            }),
            nranks: 4,
            ..Default::default()
        };
        assert_eq!(
            describe(&d),
            "rank 2 (pid 4711, host h1) enters AllReduce #1234 late: computation-slow (P = 0.93, R = 4.1)"
        );
        let h = w::Diagnosis {
            class: AnomalyClass::H1NotEntered as i32,
            roots: vec![w::RootCause {
                rank: 0,
                silent: true,
                ..Default::default()
            }],
            nranks: 4,
            evidence: Some(w::Evidence {
                hung_ranks: 3,
                max_in_flight_ns: 2_500_000_000,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            describe(&h),
            "rank 0 (pid 0, host ) [silent: process stopped or dead] stopped at or before AllReduce #0: not-entered hang (3 of 4 ranks hung, longest 2.5 s)"
        );
        let mut h = h;
        h.roots[0].silent = false;
        assert!(
            describe(&h).contains("never entered AllReduce #0"),
            "{}",
            describe(&h)
        );
    }
}
