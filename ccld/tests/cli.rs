//! `ccld` command-line smoke tests: help texts, a served shard driven by `ccld simulate`,
//! queried by `anomalies`/`comm`/`comms` (table and JSON), and clear errors.

#[path = "../../analyzer-net/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn ccld() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ccld"))
}

/// Runs to completion with a deadline; returns (status code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let mut child = ccld()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ccld");
    let t0 = Instant::now();
    loop {
        if let Some(_st) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("ccld {args:?} did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(extra: &[&str]) -> Server {
    let mut child = ccld()
        .args(["serve", "--listen", "127.0.0.1:0", "--tick-ms", "50"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ccld serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !line.starts_with("ccld: shard ") {
                continue;
            }
            if let Some(rest) = line.split(" listening on ").nth(1) {
                let addr = rest.split(',').next().unwrap_or("").trim().to_string();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("ccld serve prints its address");
    Server { child, addr }
}

#[test]
fn help_documents_every_command_and_option() {
    let (code, out, _) = run(&["--help"]);
    assert_eq!(code, 0);
    for c in [
        "serve",
        "anomalies",
        "watch",
        "comm",
        "comms",
        "simulate",
        "calibrate",
    ] {
        assert!(out.contains(c), "--help lists {c}");
    }
    let (code, out, _) = run(&["serve", "--help"]);
    assert_eq!(code, 0);
    for o in [
        "--listen",
        "--shards",
        "--shard-id",
        "--data-dir",
        "--token-file",
        "--tls-cert",
        "--tls-key",
        "--metrics-listen",
        "--hang-timeout-s",
        "--slow-theta",
        "--slow-window-s",
        "--clock",
    ] {
        assert!(out.contains(o), "serve --help documents {o}");
    }
    let (code, out, _) = run(&["simulate", "--help"]);
    assert_eq!(code, 0);
    for o in [
        "--comms",
        "--ranks",
        "--topology",
        "--anomaly",
        "--root-rank",
        "--seed",
        "--compressed",
    ] {
        assert!(out.contains(o), "simulate --help documents {o}");
    }
    for sub in ["anomalies", "watch", "comm", "comms"] {
        let (code, out, _) = run(&[sub, "--help"]);
        assert_eq!(code, 0);
        for o in ["--server", "--token-file", "--ca-file", "--json"] {
            assert!(out.contains(o), "{sub} --help documents {o}");
        }
    }
}

#[test]
fn bad_arguments_and_missing_server_give_clear_errors() {
    let (code, _, err) = run(&["serve", "--hang-timeout-s=-3"]);
    assert_ne!(code, 0);
    assert!(err.contains("hang-timeout-s"), "{err}");
    let (code, _, err) = run(&["comm", "not-a-number"]);
    assert_eq!(code, 2);
    assert!(err.contains("not-a-number"), "{err}");
    // Nothing listens on port 1.
    let (code, _, err) = run(&["anomalies", "--server", "127.0.0.1:1", "--timeout-s", "2"]);
    assert_eq!(code, 1);
    assert!(err.contains("no analyzer shard reachable"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let (code, _, err) = run(&["anomalies", "--token-file", "/nonexistent/token"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/token"), "{err}");
}

#[test]
fn simulate_then_query_as_table_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let srv = serve(&["--clock", "driven", "--data-dir", data.to_str().unwrap()]);
    let (code, out, err) = run(&[
        "simulate",
        "--server",
        &srv.addr,
        "--compressed",
        "--ranks",
        "8",
        "--anomaly",
        "H1",
        "--root-rank",
        "3",
        "--expect-within-s",
        "10",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["matches"], true, "{out}");
    assert_eq!(v["rejected"], 0);
    let comm = v["injected"]["comm_id"].as_u64().unwrap();

    // Incidents as JSON lines.
    let (code, out, err) = run(&["anomalies", "--server", &srv.addr, "--json"]);
    assert_eq!(code, 0, "{err}");
    let incs: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(incs.len(), 1, "{out}");
    assert_eq!(incs[0]["class"], "H1");
    assert_eq!(incs[0]["comm_id"], format!("{comm:#018x}"));
    assert_eq!(incs[0]["roots"][0]["rank"], 3);
    assert_eq!(incs[0]["exited"], false);

    let (code, out, err) = run(&["anomalies", "--server", &srv.addr, "--json", "--diagnoses"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let list = v["anomalies"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{out}");
    assert_eq!(list[0]["class"], "H1");
    assert_eq!(list[0]["comm_id"].as_u64(), Some(comm));
    assert_eq!(list[0]["roots"][0]["rank"], 3);

    let (code, out, _) = run(&["anomalies", "--server", &srv.addr]);
    assert_eq!(code, 0);
    // Incidents first, the per-communicator evidence beneath.
    let inc_at = out.find("Incidents").unwrap();
    let ev_at = out.find("Per-communicator evidence").unwrap();
    assert!(inc_at < ev_at, "{out}");
    assert!(out[inc_at..ev_at].contains("root rank 3"), "{out}");
    let mut lines = out.lines().skip_while(|l| !l.starts_with("ID"));
    let header = lines.next().unwrap();
    assert!(header.starts_with("ID") && header.contains("CLASS") && header.contains("ROOT RANKS"));
    let row = lines.next().unwrap();
    assert!(
        row.contains("H1") && row.contains(&format!("{comm:#018x}")),
        "{out}"
    );
    // Columns line up: CLASS starts at the same offset in the header and the row.
    let col = header.find("CLASS").unwrap();
    assert_eq!(&row[col..col + 2], "H1", "{out}");

    let id = format!("{comm:#x}");
    let (code, out, err) = run(&["comm", &id, "--server", &srv.addr]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("RANK") && out.contains("STATE"), "{out}");
    let table: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("RANK")).collect();
    assert_eq!(table.len(), 9, "{out}");
    assert!(out.contains("anomalies: s0-0"), "{out}");
    let (code, out, _) = run(&["comm", &id, "--server", &srv.addr, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ranks"].as_array().unwrap().len(), 8);
    let (code, out, _) = run(&["comms", "--server", &srv.addr, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["comms"].as_array().unwrap().len(), 1);
    let (code, _, err) = run(&["comm", "0x1234", "--server", &srv.addr]);
    assert_eq!(code, 1);
    assert!(err.contains("not tracked"), "{err}");

    // Restarted on the same data directory, the shard still answers for its history.
    drop(srv);
    let srv = serve(&["--clock", "driven", "--data-dir", data.to_str().unwrap()]);
    let (code, out, _) = run(&["anomalies", "--server", &srv.addr, "--json", "--diagnoses"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["anomalies"].as_array().unwrap().len(), 1, "{out}");
}

#[test]
fn watch_streams_json_lines() {
    let srv = serve(&["--clock", "driven"]);
    let mut w = ccld()
        .args(["watch", "--server", &srv.addr, "--json", "--count", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Give the watcher a moment to subscribe.
    std::thread::sleep(Duration::from_millis(500));
    let (code, out, err) = run(&[
        "simulate",
        "--server",
        &srv.addr,
        "--compressed",
        "--anomaly",
        "S1",
        "--root-rank",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let t0 = Instant::now();
    while w.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "watch did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = w.wait_with_output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(v["class"], "S1");
}

#[test]
fn record_a_clean_run_and_calibrate_theta() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("clean.rec");
    let srv = serve(&["--clock", "driven"]);
    let (code, out, err) = run(&[
        "simulate",
        "--server",
        &srv.addr,
        "--compressed",
        "--duration-s",
        "900",
        "--record",
        rec.to_str().unwrap(),
        "--seed",
        "3",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = run(&["calibrate", rec.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let f = &v["files"][0];
    assert!(f["windows"].as_u64().unwrap() >= 10, "{out}");
    let max_r = f["max_r"].as_f64().unwrap();
    let theta = v["theta_slow"].as_f64().unwrap();
    // Above every clean window by the safety factor, never below the floor.
    assert!(theta >= 1.0 && theta >= 1.5 * max_r * 0.99, "{out}");
    let (code, out, _) = run(&["calibrate", rec.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(
        out.contains("theta_slow =") && out.contains("--slow-theta"),
        "{out}"
    );
    let junk = dir.path().join("junk.rec");
    std::fs::write(&junk, b"not a recording").unwrap();
    let (code, _, err) = run(&["calibrate", junk.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("junk.rec"), "{err}");
}
