//! The benchmark binaries' command lines: `--help` prints the usage and succeeds; an
//! unknown option, a missing or non-numeric value and a value out of range print what is
//! wrong and exit with status 2 before anything runs (no sweep of zero rounds, no silent
//! clamping of what the user asked for).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `bin` with `args`: (exit status, stderr). A binary that accepted its arguments and
/// went on to benchmark (what a regression would do) is killed after 20 s: `None`.
fn run(bin: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{bin}: {e}"));
    let start = Instant::now();
    let code = loop {
        match child.try_wait().expect("wait") {
            Some(st) => break st.code(),
            None if start.elapsed() > Duration::from_secs(20) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (code, err)
}

/// `bin args` exits with status 2 and its stderr contains `want` and the usage line.
fn refused(bin: &str, args: &[&str], want: &str) {
    let (code, err) = run(bin, args);
    assert_eq!(code, Some(2), "{bin} {args:?}: {err}");
    assert!(
        err.contains(want),
        "{bin} {args:?}: wanted {want:?} in {err}"
    );
    assert!(err.contains("usage:"), "{bin} {args:?}: {err}");
}

const NET: &str = env!("CARGO_BIN_EXE_net-bench");
const PEERS: &str = env!("CARGO_BIN_EXE_bench-peers");
const LOWP: &str = env!("CARGO_BIN_EXE_lowp-bench");
const E2E: &str = env!("CARGO_BIN_EXE_e2e-latency");

#[test]
fn help_prints_the_usage_and_succeeds() {
    for bin in [NET, PEERS, LOWP, E2E] {
        let (code, err) = run(bin, &["--help"]);
        assert_eq!(code, Some(0), "{bin}: {err}");
        assert!(err.contains("usage:"), "{bin}: {err}");
    }
}

#[test]
fn unknown_options_and_missing_or_bad_values_are_refused() {
    refused(NET, &["--bogus", "1"], "unknown option --bogus");
    refused(NET, &["--rounds"], "--rounds needs a value");
    refused(NET, &["--rounds", "three"], "--rounds: not a number: three");
    refused(NET, &["--budget", "lots"], "--budget: not a number: lots");
    refused(
        PEERS,
        &["--ranks", "2,x", "--mpi-bin", "m"],
        "not a number: x",
    );
    refused(E2E, &["--ranks", "-1"], "not a number: -1");
}

#[test]
fn sweeps_out_of_range_are_refused_not_clamped() {
    // net-bench used to turn 0 rounds or iterations into 1 and a factor of 1 into 2.
    refused(NET, &["--rounds", "0"], "rounds (0) >= 1");
    refused(NET, &["--iters", "0"], "iters (0) >= 1");
    refused(NET, &["--factor", "1"], "factor (1) >= 2");
    refused(NET, &["--min", "2"], "4 <= min (2)");
    refused(NET, &["--min", "1024", "--max", "512"], "<= max (512)");
    // 2^32 + 1 used to wrap around to one iteration.
    refused(
        NET,
        &["--iters", "4294967297"],
        "--iters: 4294967297 is too large",
    );
    let m = ["--mpi-bin", "m"];
    refused(
        PEERS,
        &[&m[..], &["--iters", "0"]].concat(),
        "iters (0) >= 1",
    );
    refused(
        PEERS,
        &[&m[..], &["--iters", "4294967296"]].concat(),
        "too large",
    );
    refused(PEERS, &[&m[..], &["--ranks", "2,0"]].concat(), "rank count");
    refused(PEERS, &["--rounds", "2"], "--mpi-bin is required");
    refused(LOWP, &["--rounds", "0"], ">= 1");
    // e2e-latency used to clamp the rank count into 2..=16.
    refused(E2E, &["--ranks", "1"], "--ranks 1: need 2 to 16");
    refused(E2E, &["--ranks", "17"], "--ranks 17: need 2 to 16");
}
