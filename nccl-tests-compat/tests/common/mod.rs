//! Helpers shared by the integration tests: bounded process runs and output parsing.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Launcher variables that must not leak from the test's environment into a run.
pub const LAUNCHER_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_SIZE",
    "PMI_RANK",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_JOB_ID",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NCCL_COMM_ID",
    "NCCL_TESTS_UID_FILE",
    "NCCL_TESTS_SPLIT",
    "NCCL_TESTS_SPLIT_MASK",
    "NCCL_TESTS_MIN_BW",
    "NCCL_TESTS_DEVICE",
    "CCLD_TESTS_HANG_RANK",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "TORCHELASTIC_RUN_ID",
];

/// Result of a bounded run.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// A command for `exe` with a clean launcher environment, host buffers, and
/// LD_LIBRARY_PATH = `libdir`.
pub fn command(exe: &str, libdir: &Path) -> Command {
    let mut c = Command::new(exe);
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    c.env("LD_LIBRARY_PATH", libdir)
        .env("CCLD_TESTS_NO_CUDA", "1");
    c
}

/// Runs `c` to completion, killing it (and failing the test) after `limit`.
pub fn run(mut c: Command, limit: Duration) -> Run {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = c.spawn().expect("spawn");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let te = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{c:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = to.join().unwrap();
    let stderr = te.join().unwrap();
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    Run {
        code,
        stdout,
        stderr,
        elapsed: start.elapsed(),
    }
}

/// A parsed table row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub size: u64,
    pub count: u64,
    pub dtype: String,
    pub redop: String,
    pub root: i64,
    pub time: [f64; 2],
    pub algbw: [f64; 2],
    pub busbw: [f64; 2],
    pub wrong: [Option<f64>; 2],
}

/// Parses the data rows of nccl-tests output the way common parsing scripts do
/// (non-'#' lines with 13 whitespace-separated fields).
pub fn rows(stdout: &str) -> Vec<Row> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 13 {
                return None;
            }
            let num = |s: &str| s.parse::<f64>().ok();
            let wrong = |s: &str| if s == "N/A" { None } else { num(s) };
            Some(Row {
                size: f[0].parse().ok()?,
                count: f[1].parse().ok()?,
                dtype: f[2].to_string(),
                redop: f[3].to_string(),
                root: f[4].parse().ok()?,
                time: [num(f[5])?, num(f[9])?],
                algbw: [num(f[6])?, num(f[10])?],
                busbw: [num(f[7])?, num(f[11])?],
                wrong: [wrong(f[8]), wrong(f[12])],
            })
        })
        .collect()
}

/// The binary directory of this build (target/<profile>), where cargo put the perf
/// binaries and where `cargo build -p ccl-ffi` puts libnccl.so.2.
pub fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_all_reduce_perf"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Path of one of this crate's binaries.
pub fn exe(name: &str) -> String {
    bin_dir().join(name).to_string_lossy().into_owned()
}
