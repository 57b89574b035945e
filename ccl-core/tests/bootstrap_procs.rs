//! Bootstrap with ranks spread over separate processes. The parent tests re-run this test
//! binary with `--exact worker` and `CCL_BOOTSTRAP_TEST_WORKER` set; the `worker` test is
//! a no-op in a normal run (the variable is unset).

use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::bootstrap::{get_unique_id, unique_id_from_comm_id, Bootstrap, UniqueId};

const ROLE: &str = "CCL_BOOTSTRAP_TEST_WORKER";

fn hex(id: &UniqueId) -> String {
    id.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> UniqueId {
    let mut id = [0u8; 128];
    for (i, v) in id.iter_mut().enumerate() {
        *v = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    UniqueId(id)
}

/// Contribution of `rank`: names the rank and its pid so receivers can cross-check.
fn contribution(rank: usize) -> Vec<u8> {
    format!("rank={rank};pid={}", std::process::id()).into_bytes()
}

fn run_rank(id: UniqueId, n: usize, r: usize) {
    let b = Bootstrap::init(
        &id,
        n,
        r,
        Arc::new(AtomicBool::new(false)),
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("rank {r}: init failed: {e}"));
    let all = b.allgather(&contribution(r)).unwrap();
    for (i, got) in all.iter().enumerate() {
        let want = format!("rank={i};pid={}", b.peer_pid(i));
        assert_eq!(String::from_utf8_lossy(got), want, "rank {r}: block {i}");
    }
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    b.send(next, 11, format!("{r}->{next}").as_bytes()).unwrap();
    assert_eq!(b.recv(prev, 11).unwrap(), format!("{prev}->{r}").as_bytes());
    // A split across processes: even and odd ranks.
    let members: Vec<usize> = (0..n).filter(|m| m % 2 == r % 2).collect();
    let c = b.split(&members, 1).unwrap();
    let g = c.allgather(&(r as u32).to_le_bytes()).unwrap();
    let want: Vec<Vec<u8>> = members
        .iter()
        .map(|&m| (m as u32).to_le_bytes().to_vec())
        .collect();
    assert_eq!(g, want, "rank {r}: split allgather");
    c.barrier().unwrap();
    b.barrier().unwrap();
}

/// Worker role: runs ranks `first..first+count` of an `n`-rank job as threads.
#[test]
fn worker() {
    let Ok(spec) = std::env::var(ROLE) else {
        return;
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let id = unhex(parts[0]);
    let n: usize = parts[1].parse().unwrap();
    let first: usize = parts[2].parse().unwrap();
    let count: usize = parts[3].parse().unwrap();
    let hs: Vec<_> = (first..first + count)
        .map(|r| std::thread::spawn(move || run_rank(id, n, r)))
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

fn spawn_worker(id: &UniqueId, n: usize, first: usize, count: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "worker", "--nocapture", "--test-threads=1"])
        .env(ROLE, format!("{},{n},{first},{count}", hex(id)))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs `procs` processes of `per` ranks each and checks that all exit successfully within
/// `limit` (killing them otherwise).
fn run_job(id: UniqueId, procs: usize, per: usize, limit: Duration) {
    let n = procs * per;
    let mut kids: Vec<Child> = (0..procs)
        .map(|p| spawn_worker(&id, n, p * per, per))
        .collect();
    let t0 = Instant::now();
    let mut status = vec![None; procs];
    while status.iter().any(Option::is_none) {
        for (i, k) in kids.iter_mut().enumerate() {
            if status[i].is_none() {
                status[i] = k.try_wait().unwrap();
            }
        }
        if t0.elapsed() > limit {
            for k in kids.iter_mut() {
                let _ = k.kill();
                let _ = k.wait();
            }
            panic!("workers did not finish within {limit:?}: {status:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (i, (s, k)) in status.into_iter().zip(kids.iter_mut()).enumerate() {
        let s = s.unwrap();
        let mut err = String::new();
        if let Some(mut e) = k.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        assert!(s.success(), "worker process {i} failed: {s}\n{err}");
    }
}

#[test]
fn four_processes_of_two_ranks() {
    run_job(get_unique_id().unwrap(), 4, 2, Duration::from_secs(60));
}

#[test]
fn eight_processes_of_eight_ranks() {
    run_job(get_unique_id().unwrap(), 8, 8, Duration::from_secs(120));
}

#[test]
fn nccl_comm_id_mode_across_processes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let id = unique_id_from_comm_id(&format!("127.0.0.1:{port}")).unwrap();
    run_job(id, 3, 2, Duration::from_secs(60));
}
