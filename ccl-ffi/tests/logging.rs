//! NCCL_DEBUG / NCCL_DEBUG_SUBSYS / NCCL_DEBUG_FILE end to end. Logging is set up once
//! per process, so each case re-runs this test binary as a child with its own environment
//! (the child runs `child_entry`, which does nothing in a normal test run).

use std::process::Command;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "CCL_FFI_LOGGING_CHILD";

#[test]
fn child_entry() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    // A failing call logs a WARN line naming the function.
    // SAFETY: null is handled.
    let r = unsafe { nccl::api::ncclGetVersion(null_mut()) };
    assert_eq!(r, 4);
    ccl_core::debug::show_version();
    tracing::info!(target: "nccl::INIT", rank = 3, peers = 2, "init line");
    tracing::info!(target: "nccl::COLL", rank = 3, "coll line");
    tracing::debug!(target: "nccl::INIT", "trace line");
    tracing::info!(target: "other::crate", "foreign line");
}

/// Child of [`per_call_info_line_with_the_probe_on_and_off`]: one AllReduce of 4 floats
/// on a 1-rank communicator, through the C API.
#[test]
fn child_call_entry() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let mut comm: *mut std::ffi::c_void = null_mut();
    let mut buf = [1.0f32, 2.0, 3.0, 4.0];
    let p = buf.as_mut_ptr().cast::<std::ffi::c_void>();
    // SAFETY: a valid out-pointer; `buf` outlives the call, which completes before it
    // returns on the host backend; the communicator is destroyed once.
    unsafe {
        assert_eq!(nccl::api::ncclCommInitAll(&mut comm, 1, null()), 0);
        assert_eq!(nccl::api::ncclAllReduce(p, p, 4, 7, 0, comm, null_mut()), 0);
        assert_eq!(nccl::api::ncclCommDestroy(comm), 0);
    }
    assert_eq!(buf, [1.0, 2.0, 3.0, 4.0]);
}

/// Runs the child with `env`; returns the log file's text.
fn run_child(case: &str, env: &[(&str, &str)]) -> String {
    run_child_test("child_entry", case, env)
}

/// Runs this binary's test `entry` as the child with `env`; returns the log file's text.
fn run_child_test(entry: &str, case: &str, env: &[(&str, &str)]) -> String {
    let dir = std::env::temp_dir().join(format!("ccl-ffi-logging-{}-{case}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("nccl.%h.%p.log");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", entry, "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .stdout(std::process::Stdio::null())
        .env_remove("NCCL_DEBUG")
        .env_remove("NCCL_DEBUG_SUBSYS")
        .env("NCCL_DEBUG_FILE", &pattern);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("child {case} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "child {case} failed");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    let text = match files.as_slice() {
        [] => String::new(),
        [one] => {
            let name = one.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.starts_with("nccl.") && name.ends_with(".log") && !name.contains('%'),
                "pattern not expanded: {name}"
            );
            std::fs::read_to_string(one).unwrap()
        }
        many => panic!("several log files: {many:?}"),
    };
    let _ = std::fs::remove_dir_all(&dir);
    text
}

/// `host:pid:tid [rank] NCCL LEVEL message`
fn assert_nccl_line(line: &str, rank: &str, level: &str, msg: &str) {
    let (prefix, rest) = line.split_once(' ').expect("prefix");
    let parts: Vec<&str> = prefix.split(':').collect();
    assert_eq!(parts.len(), 3, "{line}");
    assert!(!parts[0].is_empty(), "{line}");
    assert!(
        parts[1].parse::<u32>().is_ok() && parts[2].parse::<u64>().is_ok(),
        "{line}"
    );
    assert_eq!(rest, format!("[{rank}] NCCL {level} {msg}"), "{line}");
}

#[test]
fn info_level_default_subsystems() {
    let text = run_child("info", &[("NCCL_DEBUG", "INFO")]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_nccl_line(
        lines[0],
        "0",
        "WARN",
        "ncclGetVersion: invalid argument: version is NULL",
    );
    assert_nccl_line(lines[1], "0", "INFO", "NCCL version 2.30.7+ccl-d");
    assert_nccl_line(lines[2], "3", "INFO", "init line peers=2");
}

/// NCCL's per-call INFO line (subsystem COLL) is written with the probe on and with it off
/// (`CCLD_DISABLE=1`, where the call builds the operation's type set only for this line),
/// and not at WARN.
#[test]
fn per_call_info_line_with_the_probe_on_and_off() {
    for (case, disable) in [("call-probe-on", "0"), ("call-probe-off", "1")] {
        let text = run_child_test(
            "child_call_entry",
            case,
            &[
                ("NCCL_DEBUG", "INFO"),
                ("NCCL_DEBUG_SUBSYS", "COLL"),
                ("CCLD_DISABLE", disable),
            ],
        );
        let calls: Vec<&str> = text.lines().filter(|l| l.contains("opCount")).collect();
        assert_eq!(calls.len(), 1, "{case}: {text}");
        let line = calls[0];
        for part in [
            "[0] NCCL INFO AllReduce: opCount 0 sendbuff 0x",
            " count 4 datatype 7 op 0 root -1 comm 0x",
            " [nranks=1] nChannels 1",
        ] {
            assert!(line.contains(part), "{case}: {part:?} not in {line}");
        }
    }
    let text = run_child_test(
        "child_call_entry",
        "call-warn",
        &[("NCCL_DEBUG", "WARN"), ("CCLD_DISABLE", "1")],
    );
    assert!(!text.contains("opCount"), "{text}");
}

#[test]
fn version_level_prints_only_the_version() {
    let text = run_child("version", &[("NCCL_DEBUG", "VERSION")]);
    assert_eq!(text, "NCCL version 2.30.7+ccl-d\n");
}

#[test]
fn unset_prints_nothing() {
    assert_eq!(run_child("unset", &[]), "");
}

#[test]
fn trace_with_all_subsystems() {
    let text = run_child(
        "trace",
        &[("NCCL_DEBUG", "trace"), ("NCCL_DEBUG_SUBSYS", "ALL")],
    );
    assert!(text.contains("NCCL INFO coll line"), "{text}");
    assert!(text.contains("NCCL TRACE trace line"), "{text}");
    assert!(!text.contains("foreign line"), "{text}");
}

#[test]
fn negated_subsystems() {
    let text = run_child(
        "negated",
        &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "^INIT")],
    );
    assert!(text.contains("coll line"), "{text}");
    assert!(!text.contains("init line"), "{text}");
}

#[test]
fn malformed_values_warn_and_name_the_variable() {
    let text = run_child(
        "malformed",
        &[("NCCL_DEBUG", "LOUD"), ("NCCL_DEBUG_SUBSYS", "INIT,BOGUS")],
    );
    let first = text.lines().next().unwrap_or_default();
    assert!(first.contains("NCCL WARN NCCL_DEBUG=\"LOUD\""), "{text}");
    assert!(
        text.contains("NCCL_DEBUG_SUBSYS") && text.contains("BOGUS"),
        "{text}"
    );
    // Falls back to WARN: the failing call is still reported, INFO lines are not.
    assert!(text.contains("version is NULL"), "{text}");
    assert!(!text.contains("init line"), "{text}");
}
