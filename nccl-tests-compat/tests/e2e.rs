//! End to end against OUR libnccl.so.2 (crate ccl-ffi): every binary as 4 processes
//! started by `ccl-run`, verification on (-c 1), 0 wrong elements expected; threads as
//! ranks; NCCL_COMM_ID rendezvous; -T aborting a hung run with exit 4.
//!
//! The library is taken from the binaries' directory (`target/<profile>/libnccl.so.2`);
//! when it is missing the test builds it with `cargo build -p ccl-ffi` (same profile).
//! Buffers are host memory (CCLD_TESTS_NO_CUDA=1): our library is the host backend.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use common::{bin_dir, command, exe, rows, run, Run};

fn lib_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = bin_dir();
        if !dir.join("libnccl.so.2").exists() {
            let cargo = option_env!("CARGO").unwrap_or("cargo");
            let mut c = std::process::Command::new(cargo);
            c.args(["build", "-p", "ccl-ffi"])
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if dir.file_name().is_some_and(|n| n == "release") {
                c.arg("--release");
            }
            let st = c.status().expect("running cargo build -p ccl-ffi");
            assert!(st.success(), "cargo build -p ccl-ffi failed");
        }
        if dir.join("libnccl.so.2").exists() {
            return dir;
        }
        // The build produced only libnccl.so: offer it under its soname.
        let so = dir.join("libnccl.so");
        assert!(
            so.exists(),
            "no libnccl.so.2 or libnccl.so in {}",
            dir.display()
        );
        let alt = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ourlib");
        std::fs::create_dir_all(&alt).unwrap();
        std::fs::copy(&so, alt.join("libnccl.so.2")).unwrap();
        alt
    })
}

const LIMIT: Duration = Duration::from_secs(180);

fn ccl_run(n: usize, bin: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = command(&exe("ccl-run"), lib_dir());
    c.arg("-n").arg(n.to_string()).arg(exe(bin)).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    run(c, LIMIT)
}

fn assert_clean(bin: &str, r: &Run, expect_rows: usize) {
    assert_eq!(
        r.code, 0,
        "{bin} exit {}\n{}\n{}",
        r.code, r.stdout, r.stderr
    );
    let rs = rows(&r.stdout);
    assert_eq!(rs.len(), expect_rows, "{bin}\n{}", r.stdout);
    // nccl-tests does not report in-place errors of these two (`N/A`).
    let in_place = if bin.starts_with("sendrecv_perf") || bin.starts_with("alltoall_perf") {
        None
    } else {
        Some(0.0)
    };
    for row in &rs {
        assert_eq!(
            row.wrong,
            [Some(0.0), in_place],
            "{bin}: {row:?}\n{}",
            r.stdout
        );
    }
    assert!(
        r.stdout.contains("# Out of bounds values : 0 OK"),
        "{}",
        r.stdout
    );
}

const SMALL: &[&str] = &[
    "-b", "8", "-e", "64K", "-f", "8", "-w", "1", "-n", "2", "-c", "1", "-T", "120",
];

macro_rules! four_process_test {
    ($name:ident, $bin:literal) => {
        #[test]
        fn $name() {
            let r = ccl_run(4, $bin, SMALL, &[]);
            assert_clean($bin, &r, 5);
            // Rank lines of all four processes reached rank 0.
            assert_eq!(
                r.stdout
                    .lines()
                    .filter(|l| l.starts_with("#  Rank "))
                    .count(),
                4,
                "{}",
                r.stdout
            );
        }
    };
}

four_process_test!(all_reduce_4p, "all_reduce_perf");
four_process_test!(all_gather_4p, "all_gather_perf");
four_process_test!(broadcast_4p, "broadcast_perf");
four_process_test!(reduce_4p, "reduce_perf");
four_process_test!(reduce_scatter_4p, "reduce_scatter_perf");
four_process_test!(alltoall_4p, "alltoall_perf");
four_process_test!(gather_4p, "gather_perf");
four_process_test!(scatter_4p, "scatter_perf");
four_process_test!(sendrecv_4p, "sendrecv_perf");
four_process_test!(hypercube_4p, "hypercube_perf");

#[test]
fn all_ops_and_types_three_processes() {
    let r = ccl_run(
        3,
        "all_reduce_perf",
        &[
            "-b", "1K", "-e", "1K", "-o", "all", "-d", "all", "-w", "0", "-n", "1", "-T", "120",
        ],
        &[],
    );
    assert_clean("all_reduce_perf -o all -d all", &r, 6 * 12);
}

#[test]
fn every_root_three_processes() {
    let r = ccl_run(
        3,
        "reduce_perf",
        &[
            "-b", "1K", "-e", "1K", "-r", "-1", "-o", "max", "-w", "0", "-n", "1", "-T", "120",
        ],
        &[],
    );
    assert_clean("reduce_perf -r -1", &r, 3);
    let roots: Vec<i64> = rows(&r.stdout).iter().map(|r| r.root).collect();
    assert_eq!(roots, vec![0, 1, 2]);
}

#[test]
fn threads_as_ranks() {
    let mut c = command(&exe("all_reduce_perf"), lib_dir());
    c.args([
        "-t", "2", "-g", "2", "-b", "8", "-e", "4K", "-f", "8", "-w", "1", "-n", "2", "-T", "120",
    ]);
    let r = run(c, LIMIT);
    assert_clean("all_reduce_perf -t 2 -g 2", &r, 4);
    let mut c = command(&exe("alltoall_perf"), lib_dir());
    c.args([
        "-t", "3", "-p", "1", "-b", "1K", "-e", "1K", "-w", "1", "-n", "2", "-T", "120",
    ]);
    let r = run(c, LIMIT);
    assert_clean("alltoall_perf -t 3 -p 1", &r, 1);
}

#[test]
fn comm_id_rendezvous() {
    let mut c = command(&exe("ccl-run"), lib_dir());
    c.args(["-n", "2", "--comm-id"])
        .arg(exe("sendrecv_perf"))
        .args([
            "-b", "1K", "-e", "4K", "-f", "4", "-w", "1", "-n", "2", "-T", "120",
        ]);
    let r = run(c, LIMIT);
    assert_clean("sendrecv_perf via NCCL_COMM_ID", &r, 2);
}

#[test]
fn json_from_two_processes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.json");
    let r = ccl_run(
        2,
        "all_gather_perf",
        &[
            "-b",
            "1K",
            "-e",
            "2K",
            "-f",
            "2",
            "-w",
            "1",
            "-n",
            "2",
            "-J",
            path.to_str().unwrap(),
        ],
        &[],
    );
    assert_clean("all_gather_perf -J", &r, 2);
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        nccl_tests_compat::report::check_schema(&doc),
        Vec::<String>::new()
    );
    assert_eq!(doc["config"]["devices"].as_array().unwrap().len(), 2);
    assert_eq!(doc["results"].as_array().unwrap().len(), 2);
}

#[test]
fn timeout_aborts_a_hung_run() {
    // Test hook CCLD_TESTS_HANG_RANK: rank 1 completes init, then never joins the first
    // collective; rank 0 blocks in it until -T 3 aborts its communicator.
    let r = ccl_run(
        2,
        "all_reduce_perf",
        &["-b", "1K", "-e", "1K", "-T", "3"],
        &[("CCLD_TESTS_HANG_RANK", "1")],
    );
    assert_eq!(r.code, 4, "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(": Test timeout (3s) "), "{}", r.stdout);
    assert!(r.elapsed < Duration::from_secs(60), "{:?}", r.elapsed);
}

#[test]
fn split_into_two_communicators() {
    // NCCL_TESTS_SPLIT="MOD 2": processes 0,2 and 1,3 form two 2-rank communicators, each
    // with its own rendezvous file; process 0 prints its colour's table.
    let r = ccl_run(
        4,
        "all_reduce_perf",
        &[
            "-b", "1K", "-e", "4K", "-f", "4", "-w", "1", "-n", "2", "-T", "120",
        ],
        &[("NCCL_TESTS_SPLIT", "MOD 2")],
    );
    assert_clean("all_reduce_perf NCCL_TESTS_SPLIT", &r, 2);
    assert_eq!(
        r.stdout
            .lines()
            .filter(|l| l.starts_with("#  Rank "))
            .count(),
        2,
        "{}",
        r.stdout
    );
}
