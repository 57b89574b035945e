//! Command-line behaviour of the perf binaries against a one-rank stand-in library
//! (tests/mock/mock_nccl.c, compiled here with `cc`): flags and exit codes, the printed
//! table, JSON output validated against the schema, verification catching corruption,
//! NCCL errors, -T. Multi-rank runs against the real library are in e2e.rs.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use common::{command, exe, rows, run, Run};

fn mock_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("nccl-tests-mock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mock/mock_nccl.c");
        let st = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(dir.join("libnccl.so.2"))
            .arg(&src)
            .status()
            .expect("a C compiler (cc) is needed to build the stand-in libnccl.so.2");
        assert!(st.success(), "compiling {src:?} failed");
        dir
    })
}

fn perf(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = command(&exe(bin), mock_dir());
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(c, Duration::from_secs(60))
}

#[test]
fn usage_and_bad_flags() {
    let r = perf("all_reduce_perf", &["-h"], &[]);
    assert_eq!(r.code, 0);
    assert!(
        r.stdout
            .starts_with("USAGE: all_reduce_perf \n\t[-t,--nthreads <num threads>]"),
        "{}",
        r.stdout
    );
    let r = perf("all_reduce_perf", &["-Q"], &[]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("invalid option") && r.stdout.contains("USAGE:"));
    let r = perf("all_reduce_perf", &["--nosuch=1"], &[]);
    assert_eq!(r.code, 0);
    let r = perf("all_reduce_perf", &["-b", "1M", "-e", "1K"], &[]);
    assert_eq!(r.code, 255);
    assert!(
        r.stderr
            .contains("invalid sizes for 'minbytes' and 'maxbytes': 1048576 > 1024"),
        "{}",
        r.stderr
    );
    let r = perf("all_reduce_perf", &["-b", "lots"], &[]);
    assert_eq!(r.code, 255);
    assert!(r.stderr.contains("invalid size specified for 'minbytes'"));
    for bad in [
        &["-t", "0"][..],
        &["-d", "float128"],
        &["-o", "xor"],
        &["-J", "out.csv"],
        &["-a", "7"],
    ] {
        let r = perf("all_reduce_perf", bad, &[]);
        assert_eq!(r.code, 6, "{bad:?}: {}", r.stderr);
        assert!(!r.stderr.is_empty());
    }
    let r = perf("all_reduce_perf", &["-G", "1"], &[]);
    assert_eq!(r.code, 5);
    let r = perf(
        "all_reduce_perf",
        &["-b", "8", "-e", "8"],
        &[("NCCL_TESTS_MIN_BW", "fast")],
    );
    assert_eq!(r.code, 6);
    assert!(r.stderr.contains("NCCL_TESTS_MIN_BW"));
    let r = perf(
        "all_reduce_perf",
        &["-b", "8", "-e", "8"],
        &[("WORLD_SIZE", "2"), ("RANK", "x")],
    );
    assert_eq!(r.code, 6);
    assert!(r.stderr.contains("RANK"));
}

#[test]
fn full_output_shape() {
    let r = perf(
        "all_reduce_perf",
        &["-b", "8", "-e", "1M", "-f", "4", "-n", "2", "-w", "1"],
        &[],
    );
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "# nccl-tests version 2.19.6 nccl-headers=23007 nccl-library=23007"
    );
    assert_eq!(lines[1], "# Collective test starting: all_reduce_perf");
    assert_eq!(lines[2], "# nThread 1 nGpus 1 minBytes 8 maxBytes 1048576 step: 4(factor) warmup iters: 1 iters: 2 agg iters: 1 validation: 1 graph: 0 unalign: 0");
    assert_eq!(lines[3], "#");
    assert_eq!(lines[4], "# Using devices");
    assert!(
        lines[5].starts_with("#  Rank  0 Group  0 Pid "),
        "{}",
        lines[5]
    );
    assert!(lines[5].ends_with("device  0 [0000:00:00] host memory (no CUDA device)"));
    assert_eq!(lines[6], "#");
    let rs = rows(&r.stdout);
    let sizes: Vec<u64> = rs.iter().map(|r| r.size).collect();
    assert_eq!(
        sizes,
        vec![8, 32, 128, 512, 2048, 8192, 32768, 131072, 524288]
    );
    for row in &rs {
        assert_eq!(
            (row.count, row.dtype.as_str(), row.redop.as_str(), row.root),
            (row.size / 4, "float", "sum", -1)
        );
        assert_eq!(row.wrong, [Some(0.0), Some(0.0)]);
        assert!(row.time[0] > 0.0 && row.algbw[0] >= 0.0);
        // One rank: busbw = algbw * 2(n-1)/n = 0.
        assert_eq!(row.busbw, [0.0, 0.0]);
    }
    // Every data row has the exact column layout.
    for l in lines
        .iter()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        assert_eq!(
            l.len(),
            12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6 + 2 * (2 + 7 + 2 + 6 + 2 + 6 + 2 + 6),
            "{l:?}"
        );
    }
    let tail: Vec<&str> = lines[lines.len() - 5..].to_vec();
    assert_eq!(tail[0], "# Out of bounds values : 0 OK");
    assert!(tail[1].starts_with("# Avg bus bandwidth    : 0 "));
    assert_eq!(tail[2], "#");
    assert_eq!(tail[3], "# Collective test concluded: all_reduce_perf");
    assert_eq!(tail[4], "");
}

#[test]
fn every_type_op_and_collective_verifies() {
    let r = perf(
        "all_reduce_perf",
        &[
            "-b", "1K", "-e", "1K", "-o", "all", "-d", "all", "-n", "1", "-c", "2",
        ],
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stdout);
    let rs = rows(&r.stdout);
    assert_eq!(rs.len(), 12 * 6);
    assert!(rs.iter().all(|r| r.wrong == [Some(0.0), Some(0.0)]));
    for bin in [
        "all_gather_perf",
        "broadcast_perf",
        "reduce_perf",
        "reduce_scatter_perf",
        "alltoall_perf",
        "gather_perf",
        "scatter_perf",
        "sendrecv_perf",
        "hypercube_perf",
    ] {
        let r = perf(
            bin,
            &["-b", "1K", "-e", "4K", "-f", "2", "-d", "all", "-n", "1"],
            &[],
        );
        assert_eq!(r.code, 0, "{bin}: {}{}", r.stdout, r.stderr);
        let rs = rows(&r.stdout);
        assert_eq!(rs.len(), 36, "{bin}");
        // In-place SendRecv/AlltoAll errors are not reported (nccl-tests' rule).
        let in_place = if matches!(bin, "sendrecv_perf" | "alltoall_perf") {
            None
        } else {
            Some(0.0)
        };
        assert!(rs.iter().all(|r| r.wrong == [Some(0.0), in_place]), "{bin}");
        let rooted = matches!(
            bin,
            "broadcast_perf" | "reduce_perf" | "gather_perf" | "scatter_perf"
        );
        assert!(
            rs.iter().all(|r| r.root == if rooted { 0 } else { -1 }),
            "{bin}"
        );
        let reduces = matches!(bin, "reduce_perf" | "reduce_scatter_perf");
        assert!(
            rs.iter()
                .all(|r| (r.redop == "sum") == reduces && (r.redop == "none") != reduces),
            "{bin}"
        );
    }
}

#[test]
fn check_off_prints_na() {
    let r = perf(
        "all_reduce_perf",
        &["-b", "64", "-e", "64", "-c", "0", "-n", "1"],
        &[],
    );
    assert_eq!(r.code, 0);
    let rs = rows(&r.stdout);
    assert_eq!(rs[0].wrong, [None, None]);
    assert!(r.stdout.lines().any(|l| l.ends_with("    N/A")));
}

/// nccl-tests does not report in-place errors of SendRecv and AlltoAll (their in-place
/// forms overwrite data peers may still read): `N/A` there, counts everywhere else.
#[test]
fn in_place_sendrecv_and_alltoall_print_na_like_nccl_tests() {
    for (bin, reported) in [
        ("sendrecv_perf", false),
        ("alltoall_perf", false),
        ("all_reduce_perf", true),
    ] {
        let r = perf(bin, &["-b", "64", "-e", "64", "-c", "1", "-n", "1"], &[]);
        assert_eq!(r.code, 0, "{bin}: {}", r.stdout);
        let rs = rows(&r.stdout);
        let in_place = if reported { Some(0.0) } else { None };
        assert_eq!(rs[0].wrong, [Some(0.0), in_place], "{bin}: {}", r.stdout);
    }
}

#[test]
fn corruption_is_counted_and_fails() {
    let r = perf(
        "all_reduce_perf",
        &["-b", "1K", "-e", "2K", "-f", "2", "-n", "1"],
        &[("MOCK_NCCL_CORRUPT", "1")],
    );
    assert_eq!(r.code, 7, "{}", r.stdout);
    let rs = rows(&r.stdout);
    assert!(
        rs.iter().all(|r| r.wrong == [Some(1.0), Some(1.0)]),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("# Out of bounds values : 4 FAILED"));
}

#[test]
fn nccl_error_exits_3() {
    let r = perf(
        "all_reduce_perf",
        &["-b", "1K", "-e", "1K", "-n", "1"],
        &[("MOCK_NCCL_FAIL", "1")],
    );
    assert_eq!(r.code, 3);
    assert!(
        r.stdout.contains(": Test NCCL failure ") && r.stdout.contains("'mock error / '"),
        "{}",
        r.stdout
    );
}

#[test]
fn min_bw_check() {
    let r = perf(
        "sendrecv_perf",
        &["-b", "1K", "-e", "1K", "-n", "1"],
        &[("NCCL_TESTS_MIN_BW", "1e12")],
    );
    assert_eq!(r.code, 7);
    assert!(r
        .stdout
        .lines()
        .any(|l| l.starts_with("# Avg bus bandwidth    : ") && l.ends_with(" FAILED")));
    let r = perf(
        "sendrecv_perf",
        &["-b", "1K", "-e", "1K", "-n", "1"],
        &[("NCCL_TESTS_MIN_BW", "0")],
    );
    assert_eq!(r.code, 0);
    assert!(r
        .stdout
        .lines()
        .any(|l| l.starts_with("# Avg bus bandwidth    : ") && l.ends_with(" OK")));
}

#[test]
fn timeout_aborts_with_exit_4() {
    // Test hook: rank 0 never enters its first collective; -T 1 must end the run.
    let r = perf(
        "all_reduce_perf",
        &["-b", "1K", "-e", "1K", "-T", "1"],
        &[("CCLD_TESTS_HANG_RANK", "0")],
    );
    assert_eq!(r.code, 4, "{}", r.stdout);
    assert!(r.stdout.contains(": Test timeout (1s) "));
    assert!(r.elapsed < Duration::from_secs(10));
}

#[test]
fn json_output_matches_schema_and_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.json");
    let p = path.to_str().unwrap();
    let r = perf(
        "reduce_scatter_perf",
        &[
            "-b", "1K", "-e", "8K", "-f", "2", "-n", "1", "-o", "all", "-J", p,
        ],
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert!(r
        .stdout
        .starts_with(&format!("# Writing JSON output to {p}\n")));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        nccl_tests_compat::report::check_schema(&doc),
        Vec::<String>::new()
    );
    let table = rows(&r.stdout);
    let res = doc["results"].as_array().unwrap();
    assert_eq!(res.len(), table.len());
    for (j, t) in res.iter().zip(&table) {
        assert_eq!(j["size"].as_u64(), Some(t.size));
        assert_eq!(j["count"].as_u64(), Some(t.count));
        assert_eq!(j["redop"].as_str(), Some(t.redop.as_str()));
        assert_eq!(j["out_of_place"]["nwrong"].as_f64(), t.wrong[0]);
    }
    assert_eq!(doc["config"]["step_factor"], 2);
    assert_eq!(doc["config"]["devices"].as_array().unwrap().len(), 1);
    assert_eq!(doc["nccl_version"], 23007);
    assert!(doc["args"].as_array().unwrap().iter().any(|a| a == "-J"));
    // An existing name is not overwritten: the next free suffix is used.
    let r = perf(
        "reduce_scatter_perf",
        &["-b", "1K", "-e", "1K", "-n", "1", "-J", p],
        &[],
    );
    assert_eq!(r.code, 0);
    assert!(r
        .stdout
        .starts_with(&format!("# Writing JSON output to {p}.0\n")));
    assert!(dir.path().join("out.json.0").exists());
}

#[test]
fn missing_library_is_an_nccl_error() {
    let empty = tempfile::tempdir().unwrap();
    let mut c = command(&exe("all_reduce_perf"), empty.path());
    c.args(["-b", "8", "-e", "8"]);
    let r = run(c, Duration::from_secs(30));
    // Unless a system libnccl.so.2 exists, loading fails with a clear message.
    if r.code != 0 {
        assert_eq!(r.code, 3);
        assert!(r.stderr.contains("libnccl.so.2"), "{}", r.stderr);
    }
}

#[test]
fn multi_process_without_rendezvous_is_usage_error() {
    let r = perf(
        "all_reduce_perf",
        &["-b", "8", "-e", "8"],
        &[("WORLD_SIZE", "2"), ("RANK", "0")],
    );
    assert_eq!(r.code, 6, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("NCCL_COMM_ID") && r.stderr.contains("NCCL_TESTS_UID_FILE"));
}

#[test]
fn ccl_run_tags_output_and_sets_variables() {
    let mut c = command(&exe("ccl-run"), mock_dir());
    c.args(["-n", "3", "--tag-output", "sh", "-c", "echo out $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE; echo err $RANK >&2; test -n \"$NCCL_TESTS_UID_FILE\""]);
    let r = run(c, Duration::from_secs(30));
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    let mut out: Vec<&str> = r.stdout.lines().collect();
    out.sort();
    assert_eq!(
        out,
        vec!["[0] out 0 3 0 3", "[1] out 1 3 1 3", "[2] out 2 3 2 3"]
    );
    let mut err: Vec<&str> = r.stderr.lines().collect();
    err.sort();
    assert_eq!(err, vec!["[0] err 0", "[1] err 1", "[2] err 2"]);
}

#[test]
fn ccl_run_forwards_sigterm_and_reports_rank_status() {
    let mut c = command(&exe("ccl-run"), mock_dir());
    c.args([
        "-n",
        "2",
        "sh",
        "-c",
        "trap 'exit 42' TERM; sleep 20 & wait",
    ]);
    c.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let start = std::time::Instant::now();
    let mut child = c.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // Deliver SIGTERM with kill(1), as a user or a scheduler would.
    let st = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "ccl-run did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(42));
}

#[test]
fn ccl_run_usage() {
    let mut c = command(&exe("ccl-run"), mock_dir());
    c.args(["all_reduce_perf"]);
    let r = run(c, Duration::from_secs(10));
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("usage: ccl-run -n N"));
}

#[test]
fn ccl_run_rendezvous_file_multi_process() {
    // Two processes of the one-rank mock cannot form a communicator, but the unique-id
    // exchange through NCCL_TESTS_UID_FILE happens before init: rank 1 must get past it
    // and fail in ncclCommInitRank (mock: nranks != 1 -> error 5), not time out.
    let mut c = command(&exe("ccl-run"), mock_dir());
    c.args(["-n", "2", "--grace", "1"])
        .arg(exe("all_reduce_perf"))
        .args(["-b", "8", "-e", "8", "-T", "20"]);
    let r = run(c, Duration::from_secs(60));
    assert_eq!(r.code, 3, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("Test NCCL failure"), "{}", r.stdout);
}
