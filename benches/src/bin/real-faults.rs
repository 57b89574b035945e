//! `real-faults`: the issue-17 accuracy matrix. The independent C client (NVIDIA's
//! `nccl.h`, our `libnccl.so.2`) runs as 4 and 8 processes with DP + TP communicators and
//! pipeline Send/Recv; faults come from outside (SIGSTOP, SIGKILL, SIGSTOP/SIGCONT duty
//! cycling) or from the client's own switches (slow computation, inconsistent call, skipped
//! call); the diagnosis is read from the embedded analyzer (`CCLD_REPORT=FILE.jsonl`) and
//! from a `ccld serve` shard (`ccld anomalies --json`). Prints one line per case, then the
//! markdown accuracy table for docs/diagnosis.md.
//!
//! ```text
//! cargo run --release -p benches --bin real-faults                 # full matrix (~20 min)
//! cargo run --release -p benches --bin real-faults -- --only SIGSTOP --only 'n=4'
//! ```
//! `--only TEXT` (repeatable) keeps the cases whose name contains every TEXT;
//! `--table FILE` also writes the table to FILE. Exit status 1 when a case fails. With
//! `CCLD_REAL_FAULTS_KEEP=1` each case's incidents file (embedded analyzer) and the client's
//! stderr stay in `target/*/real-faults-work/` for a post-mortem (paths on stderr).

use std::process::ExitCode;

use benches::real_faults::{full_matrix, run::run_case, setup::prepare, table};

fn main() -> ExitCode {
    let mut only: Vec<String> = Vec::new();
    let mut table_file = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--only", Some(v)) => only.push(v),
            ("--table", Some(v)) => table_file = Some(v),
            _ => {
                eprintln!("usage: real-faults [--only TEXT]... [--table FILE]");
                return ExitCode::from(2);
            }
        }
    }
    let env = match prepare() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("real-faults: cannot prepare the run: {e}");
            return ExitCode::from(2);
        }
    };
    let cases: Vec<_> = full_matrix()
        .into_iter()
        .filter(|c| only.iter().all(|o| c.name().contains(o.as_str())))
        .collect();
    if cases.is_empty() {
        eprintln!("real-faults: no case matches {only:?}");
        return ExitCode::from(2);
    }
    let mut outcomes = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let o = run_case(&env, case);
        println!(
            "[{}/{}] {}: expected {}, got {}, delay {}: {}",
            i + 1,
            cases.len(),
            case.name(),
            case.expected().describe(),
            o.verdict.got,
            o.delay
                .map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64())),
            if o.pass() { "pass" } else { "FAIL" }
        );
        if !o.pass() {
            for t in &o.timeline {
                println!("    incident {t}");
            }
        }
        for n in &o.notes {
            println!("    {}", n.replace('\n', "\n    "));
        }
        outcomes.push(o);
    }
    let t = table(&outcomes);
    println!("\n{t}");
    if let Some(f) = table_file {
        if let Err(e) = std::fs::write(&f, &t) {
            eprintln!("real-faults: writing {f}: {e}");
            return ExitCode::from(2);
        }
    }
    if outcomes.iter().all(|o| o.pass()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
