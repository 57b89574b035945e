//! Rank processes for the multi-process tests: the test binary re-executes itself running
//! only its ignored `proc_rank_entry` test, one child per rank, with the environment the
//! caller gives; children print markers `@@...` on stdout, collected per rank.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Running rank processes and their markers (rank, text after "@@").
pub struct Job {
    pub children: Vec<Child>,
    pub lines: mpsc::Receiver<(usize, String)>,
}

/// Starts `n` children of this test binary running `proc_rank_entry`, rank `r` with the
/// environment `env(r)` and without the variables `remove`.
pub fn spawn_ranks(n: usize, env: impl Fn(usize) -> Vec<(String, String)>, remove: &[&str]) -> Job {
    let exe = std::env::current_exe().expect("current_exe");
    let (tx, lines) = mpsc::channel();
    let children = (0..n)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "--exact",
                "proc_rank_entry",
                "--ignored",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
            for k in remove {
                cmd.env_remove(k);
            }
            for (k, v) in env(r) {
                cmd.env(k, v);
            }
            let mut child = cmd.spawn().expect("spawn rank");
            let out = child.stdout.take().expect("stdout");
            let tx = tx.clone();
            std::thread::spawn(move || {
                // Markers are "@@..." (the test harness may print text before them).
                for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    if let Some((_, m)) = line.split_once("@@") {
                        let _ = tx.send((r, m.to_string()));
                    }
                }
            });
            child
        })
        .collect();
    Job { children, lines }
}

/// Waits for every child, killing all of them if `limit` passes. Returns exit codes.
pub fn wait_all(children: &mut [Child], limit: Duration) -> Vec<Option<i32>> {
    let deadline = Instant::now() + limit;
    let mut codes = vec![None; children.len()];
    let mut done = vec![false; children.len()];
    while done.iter().any(|d| !d) {
        for (i, c) in children.iter_mut().enumerate() {
            if !done[i] {
                if let Ok(Some(st)) = c.try_wait() {
                    codes[i] = st.code();
                    done[i] = true;
                }
            }
        }
        if Instant::now() > deadline {
            for c in children.iter_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("rank processes did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    codes
}
