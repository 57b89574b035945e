//! A hub's process lingers at exit (bounded) to report the failure it has just witnessed.
//!
//! When a peer's process dies, the survivors' calls fail (`ncclRemoteError`) and a real job
//! then exits, the hub's processes included: without a pause, the incident (the dead rank,
//! "process exited") would die with them. So a process that runs one of the job's hubs
//! and has seen a failed operation among the batches it forwarded, with no incident
//! reported since, waits at exit (an `atexit` handler) until its hub reports one, at most
//! [`AT_EXIT`]. Clean exits, and processes without a hub, do not wait.
//!
//! Limits: `_exit`, SIGKILL or a signal's default action (SIGTERM from a launcher) skip
//! `atexit` handlers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ccld_wire as wire;

/// Longest wait at exit.
pub const AT_EXIT: Duration = Duration::from_millis(3000);
/// Once an incident is reported, how long to leave for the ones made with it.
const SETTLE: Duration = Duration::from_millis(200);

/// Reports made by this process's [`crate::report::Reporter`] as the active hub.
static REPORTED: AtomicU64 = AtomicU64::new(0);
/// [`REPORTED`] when the first unreported failure was seen, plus one (0: none pending).
static FAILED_AT_REPORT: AtomicU64 = AtomicU64::new(0);
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// True when a batch carries a failed operation.
pub fn has_failure(b: &wire::Batch) -> bool {
    b.records
        .iter()
        .any(|r| r.state == wire::OpState::Failed as i32 || r.failure != 0)
}

/// Notes a batch forwarded by this process (failed operations arm the wait).
pub(crate) fn note_batch(b: &wire::Batch) {
    if has_failure(b) {
        let now = REPORTED.load(Ordering::Relaxed);
        let _ = FAILED_AT_REPORT.compare_exchange(0, now + 1, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// Notes an incident reported by this process.
pub(crate) fn note_reported() {
    REPORTED.fetch_add(1, Ordering::Relaxed);
}

/// Whether to wait (pure): this process runs a hub, a failure was seen (`failed_at`:
/// reports at that moment plus one, 0 = none) and nothing was reported since.
pub fn must_wait(runs_hub: bool, failed_at: u64, reported: u64) -> bool {
    runs_hub && failed_at != 0 && reported < failed_at
}

/// Waits, at most `max`, while [`must_wait`] holds for this process; returns whether an
/// incident was reported meanwhile.
pub fn linger(max: Duration) -> bool {
    // The exit handler is registered exactly when this process starts a hub.
    let runs = REGISTERED.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut waited = false;
    while must_wait(
        runs,
        FAILED_AT_REPORT.load(Ordering::Relaxed),
        REPORTED.load(Ordering::Relaxed),
    ) {
        if t0.elapsed() >= max {
            return false;
        }
        waited = true;
        std::thread::sleep(Duration::from_millis(20));
    }
    if waited {
        std::thread::sleep(SETTLE);
    }
    waited
}

extern "C" fn at_exit() {
    // Never unwind into libc's exit.
    let _ = std::panic::catch_unwind(|| linger(AT_EXIT));
}

/// Registers the exit handler once (called when this process starts a hub).
pub(crate) fn register_at_exit() {
    if REGISTERED.swap(true, Ordering::Relaxed) {
        return;
    }
    // SAFETY: `at_exit` is a plain `extern "C" fn()` with no arguments that never unwinds
    // (catch_unwind); atexit only stores the pointer, which stays valid for the life of
    // the process (the function is part of this library's code).
    let rc = unsafe { libc::atexit(at_exit) };
    if rc != 0 {
        tracing::debug!(target: "nccl::INIT", "CCL-D: atexit registration failed ({rc})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_hub_that_saw_an_unreported_failure_waits() {
        assert!(!must_wait(false, 1, 0), "no hub here");
        assert!(!must_wait(true, 0, 5), "no failure seen");
        // Failure seen when 2 incidents had been reported: wait until a third.
        assert!(must_wait(true, 3, 2));
        assert!(!must_wait(true, 3, 3));
    }

    #[test]
    fn failed_operations_arm_the_wait() {
        let mut b = wire::Batch::default();
        b.records.push(wire::OpRecord {
            state: wire::OpState::Completed as i32,
            ..Default::default()
        });
        assert!(!has_failure(&b));
        b.records.push(wire::OpRecord {
            state: wire::OpState::Failed as i32,
            ..Default::default()
        });
        assert!(has_failure(&b));
        let peer_lost = wire::Batch {
            records: vec![wire::OpRecord {
                state: wire::OpState::InFlight as i32,
                failure: wire::FailureCause::PeerLost as i32,
                ..Default::default()
            }],
            heartbeats: vec![],
        };
        assert!(has_failure(&peer_lost));
        // The process-wide counters: armed by a failure, disarmed by a report; without a
        // hub in this process nothing waits.
        note_batch(&peer_lost);
        let armed = FAILED_AT_REPORT.load(Ordering::Relaxed);
        assert!(armed >= 1);
        note_reported();
        assert!(!must_wait(true, armed, REPORTED.load(Ordering::Relaxed)));
    }

    /// A child process: runs the job's (only) hub, forwards a hang of rank 3 in comm 0x4242
    /// (and, with `CCLD_LINGER_TEST=failed`, a failed operation), then exits at once.
    #[test]
    #[ignore = "child process of the exit tests below"]
    fn linger_child() {
        use crate::embedded::{Embedded, EmbeddedSink};
        use crate::report::{ReportTarget, Reporter};
        use crate::reporter::SpoolSettings;
        use std::sync::Arc;
        let Ok(mode) = std::env::var(ccl_params::CCLD_LINGER_TEST.name) else {
            return;
        };
        let engine = analyzer::EngineConfig {
            hang_threshold: Duration::from_millis(300),
            ..analyzer::EngineConfig::default()
        };
        let addr = crate::hub::start_with("127.0.0.1".parse().unwrap(), engine.clone()).unwrap();
        crate::hub::adopt(crate::hub::Hubs {
            primary: addr,
            standby: None,
        });
        register_at_exit();
        let e = Arc::new(Embedded::new(engine));
        let spool = SpoolSettings {
            dir: std::env::temp_dir().join(format!("ccld-linger-{}", std::process::id())),
            max_bytes: 1 << 20,
        };
        let rep = Reporter::open(&ReportTarget::Stderr).unwrap();
        let mut sink = EmbeddedSink::new(e, spool, rep);
        let mut b = wire::Batch::default();
        for op in 0..5 {
            for r in 0..4 {
                b.records.push(crate::embedded::tests::rec(op, r, false));
            }
        }
        for r in 0..3 {
            let mut x = crate::embedded::tests::rec(5, r, true);
            if mode == "failed" && r == 0 {
                x.failure = wire::FailureCause::PeerLost as i32;
            }
            b.records.push(x);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use crate::diag::Sink;
            sink.deliver(b);
            let _ = tx.send(());
            loop {
                sink.idle();
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        rx.recv().unwrap();
        std::process::exit(0);
    }

    fn run_child(mode: &str) -> (String, Duration) {
        let t0 = Instant::now();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "linger::tests::linger_child",
                "--ignored",
                "--nocapture",
            ])
            .env("CCLD_LINGER_TEST", mode)
            .env_remove("CCLD_REPORT")
            .output()
            .unwrap();
        let took = t0.elapsed();
        assert!(out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("ccl-d: ")).collect();
        (lines.join("\n"), took)
    }

    /// The hub's process exits right after forwarding a failed operation: it waits until
    /// its hub has reported the incident (rank 3 never entered), then exits; without a
    /// failed operation it exits at once and prints nothing.
    #[test]
    fn a_hubs_process_reports_a_witnessed_failure_before_it_exits() {
        let (lines, took) = run_child("failed");
        assert_eq!(lines.lines().count(), 1, "{lines}");
        assert!(
            lines.contains("H1") && lines.contains("root rank 3"),
            "{lines}"
        );
        assert!(took < AT_EXIT + Duration::from_secs(2), "{took:?}");
        let (lines, _) = run_child("clean");
        assert!(lines.is_empty(), "a clean exit does not wait: {lines}");
    }
}
