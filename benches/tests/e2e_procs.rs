//! End to end with ranks as PROCESSES.
//!
//! - **Embedded hub** (`embedded_hub_names_*`, no `CCLD_ANALYZER`: the default embedded
//!   analyzer): the ranks agree at init on one analyzer hub in rank 0's process; every
//!   process forwards its records there; rank 0's process writes the diagnoses it surfaces
//!   to a file the test reads. An anomaly injected with `CCLD_INJECT` (classes as in
//!   `e2e_threads`) must be named. One case per class by default (4 and 8 ranks, roots 0, 1,
//!   2, n-1, all three collectives among them); `CCLD_E2E_FULL=1` runs the full product
//!   6 classes x {4, 8} ranks x roots {0, 1, n-1} x {AllReduce, AllGather, ReduceScatter}
//!   (minutes: `CCLD_E2E_FULL=1 cargo test -p benches --test e2e_procs -- --test-threads=1`;
//!   `CCLD_E2E_ONLY='S2 n=4 root=3 ReduceScatter'` keeps the cases whose name contains it).
//!   The hub also runs when rank 0 is the victim of H1/H2/H3 (its other threads go on);
//!   only SIGKILL/SIGSTOP of rank 0's process loses it (use `ccld serve` for that).
//! - **Signals** (reporting to an analyzer shard over gRPC, `CCLD_ANALYZER=127.0.0.1:port`),
//!   faults the library does not cause itself: SIGSTOP of one rank, SIGKILL of one rank
//!   (peer-death check disabled so that the others hang), and one rank starved of CPU by
//!   busy spinners on its core (named by its run-queue delay, `probe::sched`).
//!
//! The test binary re-executes itself: the ignored test `proc_rank_entry` is a rank.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use analyzer::EngineConfig;
use analyzer_net::client::{BlockingClient, ClientConfig};
use analyzer_net::server::{class_name, ServerConfig, ShardProcess};
use benches::e2e_harness::{barrier, full_cases, op, roots_ok, spec, WINDOW_ENV};
use ccl_core::bootstrap::get_unique_id;
use ccl_core::{Comm, CommConfig, UniqueId};
use ccld_wire::{self as wire, AnomalyClass};
use probe::CollKind;

const ENV_UID: &str = "CCLD_E2E_UID";
const ENV_RANK: &str = "CCLD_E2E_RANK";
const ENV_NRANKS: &str = "CCLD_E2E_NRANKS";
/// Collective the ranks run: `allreduce` (default), `allgather`, `reducescatter`.
const ENV_COLL: &str = "CCLD_E2E_COLL";
/// File where rank 0's process writes the diagnoses it surfaces, one per line:
/// `CLASS ROOTS DESCRIPTION` (roots comma-separated, `-` when none).
const ENV_DIAG_FILE: &str = "CCLD_E2E_DIAG_FILE";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

fn coll_name(k: CollKind) -> &'static str {
    match k {
        CollKind::AllGather => "allgather",
        CollKind::ReduceScatter => "reducescatter",
        _ => "allreduce",
    }
}

fn coll_from_name(s: &str) -> CollKind {
    match s {
        "allgather" => CollKind::AllGather,
        "reducescatter" => CollKind::ReduceScatter,
        _ => CollKind::AllReduce,
    }
}

fn diag_line(d: &wire::Diagnosis) -> String {
    let roots: Vec<String> = d.roots.iter().map(|r| r.rank.to_string()).collect();
    let roots = if roots.is_empty() {
        "-".to_string()
    } else {
        roots.join(",")
    };
    format!("{} {roots} {}\n", class_name(d.class), probe::describe(d))
}

/// Rank 0's reporter: every 100 ms, writes a line `# hub ADDR here` (or `elsewhere`) once
/// the process knows the job's hub, then the diagnoses the embedded analyzer surfaced, to
/// `path` (whole file, atomically), for at most 40 s.
fn report_diagnoses(path: PathBuf) {
    std::thread::spawn(move || {
        let tmp = path.with_extension("tmp");
        let t0 = Instant::now();
        let mut written = None;
        while t0.elapsed() < Duration::from_secs(40) {
            std::thread::sleep(Duration::from_millis(100));
            let Some(e) = probe::embedded::embedded() else {
                continue;
            };
            let hub = probe::hub::known();
            let ds = e.diagnoses();
            if written == Some((hub, ds.len())) {
                continue;
            }
            let mut text = hub.map_or(String::new(), |a| {
                let at = if probe::hub::runs_here() {
                    "here"
                } else {
                    "elsewhere"
                };
                format!("# hub {a} {at}\n")
            });
            text.extend(ds.iter().map(diag_line));
            let ok = std::fs::File::create(&tmp)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .and_then(|()| std::fs::rename(&tmp, &path));
            if ok.is_ok() {
                written = Some((hub, ds.len()));
            }
        }
    });
}

#[test]
#[ignore = "rank process entry point, started by the tests below"]
fn proc_rank_entry() {
    let Ok(uid) = std::env::var(ENV_UID) else {
        return;
    };
    let mut id = [0u8; 128];
    id.copy_from_slice(&unhex(&uid));
    let rank: usize = std::env::var(ENV_RANK).unwrap().parse().unwrap();
    let n: usize = std::env::var(ENV_NRANKS).unwrap().parse().unwrap();
    let kind = coll_from_name(&std::env::var(ENV_COLL).unwrap_or_default());
    let comm =
        Comm::init_rank(n as i32, UniqueId(id), rank as i32, CommConfig::default()).expect("init");
    if rank == 0 {
        if let Ok(p) = std::env::var(ENV_DIAG_FILE) {
            report_diagnoses(PathBuf::from(p));
        }
    }
    // The shape of e2e_harness::run_case: compute with jitter, a barrier every 50 ops.
    let floats = 16 << 10;
    let send = vec![1.0f32; floats];
    let mut recv = vec![0.0f32; floats * if kind == CollKind::AllGather { n } else { 1 }];
    let t0 = Instant::now();
    let mut i = 0u64;
    // Bounded: a rank never outlives the test (30 s).
    while t0.elapsed() < Duration::from_secs(30) {
        let jitter = (i * 7919 + rank as u64 * 104_729) % 300;
        std::thread::sleep(Duration::from_micros(1000 + jitter));
        if i % 50 == 49 && !barrier(&comm) {
            break;
        }
        if !op(&comm, kind, &send, &mut recv, n) {
            break;
        }
        i += 1;
    }
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

struct Job {
    children: Vec<Child>,
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(c.id().to_string())
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `n` rank processes with the extra environment `env` (`CCLD_ANALYZER` and
/// `CCLD_INJECT` are removed unless `env` sets them).
fn start_job(n: usize, env: &[(&str, String)], pin: Option<(usize, &str)>) -> Job {
    let uid = get_unique_id().expect("unique id");
    let exe = std::env::current_exe().expect("exe");
    let children = (0..n)
        .map(|r| {
            // With a pinned victim, the other ranks keep to the other CPUs.
            let mut cmd = match pin {
                Some((v, cpu)) => {
                    let mut c = Command::new("taskset");
                    let others = format!("1-{}", cpus().saturating_sub(1).max(1));
                    c.args(["-c", if v == r { cpu } else { others.as_str() }])
                        .arg(&exe);
                    c
                }
                None => Command::new(&exe),
            };
            cmd.args(["--exact", "proc_rank_entry", "--ignored", "--nocapture"])
                .env_remove("CCLD_ANALYZER")
                .env_remove("CCLD_INJECT")
                .env(ENV_UID, hex(&uid.0))
                .env(ENV_RANK, r.to_string())
                .env(ENV_NRANKS, n.to_string())
                .env("CCLD_INFLIGHT_MS", "200")
                .env("CCLD_HEARTBEAT_MS", "200")
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            cmd.spawn().expect("spawn rank")
        })
        .collect();
    Job { children }
}

/// Signal tests: ranks report to the shard at `analyzer`; survivors of a killed rank hang
/// instead of failing fast.
fn signal_job(n: usize, analyzer: &str, pin: Option<(usize, &str)>) -> Job {
    start_job(
        n,
        &[
            ("CCLD_ANALYZER", analyzer.to_string()),
            ("CCLD_PEER_CHECK_MS", "600000".to_string()),
        ],
        pin,
    )
}

fn shard() -> ShardProcess {
    let engine = EngineConfig {
        hang_threshold: Duration::from_millis(1500),
        silent_after: Duration::from_millis(1000),
        detect_window: Duration::from_millis(500),
        baseline_span: Duration::from_millis(500),
        t_base_init: Duration::from_secs(1),
        theta_slow: 10.0,
        repeat_threshold: 3,
        ..EngineConfig::default()
    };
    ShardProcess::spawn(
        ServerConfig::single(engine),
        "127.0.0.1:0".parse().expect("addr"),
        None,
        1,
    )
    .expect("analyzer shard")
}

fn wait_diagnosis(addr: &str, timeout: Duration) -> Option<wire::Diagnosis> {
    let mut c = BlockingClient::new(ClientConfig::new([addr.to_string()])).ok()?;
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(l) = c.list_anomalies(wire::ListAnomaliesRequest::default()) {
            if let Some(d) = l.diagnoses.into_iter().next() {
                return Some(d);
            }
        }
    }
    None
}

fn signal_case(sig: &str, n: usize, victim: usize) {
    let sh = shard();
    let addr = sh.addr.to_string();
    let mut job = signal_job(n, &addr, None);
    std::thread::sleep(Duration::from_millis(1500));
    let pid = job.children[victim].id();
    assert!(Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success());
    let d = wait_diagnosis(&addr, Duration::from_secs(15));
    if sig == "-KILL" {
        let _ = job.children[victim].wait();
    }
    drop(job);
    sh.kill();
    let d = d.unwrap_or_else(|| panic!("{sig} of rank {victim}: no diagnosis"));
    let roots: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
    eprintln!(
        "{sig} rank {victim}/{n}: {:?} {}",
        d.class(),
        probe::describe(&d)
    );
    // Stopped before its round or inside it, a silent process is H1 (docs/diagnosis.md §2).
    assert_eq!(
        d.class(),
        AnomalyClass::H1NotEntered,
        "{}",
        probe::describe(&d)
    );
    assert_eq!(roots, vec![victim as u32], "{}", probe::describe(&d));
    assert!(d.roots[0].silent, "the stopped/killed rank is silent");
}

#[test]
fn sigstop_of_one_rank_is_named() {
    signal_case("-STOP", 4, 2);
}

#[test]
fn sigkill_of_one_rank_is_named() {
    signal_case("-KILL", 4, 1);
}

#[test]
fn cpu_starved_rank_is_named() {
    // Rank 3 runs on CPU 0; after 2.5 s four busy spinners join it there (taskset; no
    // cgroups needed): it enters every AllReduce a little late and, descheduled inside
    // the operations, holds the ring back. Its wait metrics look like everybody else's
    // (it waits while descheduled); its run-queue delay (probe::sched) gives it away.
    let victim = 3;
    if cpus() < 2 || Command::new("taskset").arg("-V").output().is_err() {
        eprintln!("skipped: needs taskset and 2 CPUs");
        return;
    }
    let sh = shard();
    let addr = sh.addr.to_string();
    let job = signal_job(4, &addr, Some((victim, "0")));
    // Starve it after the analyzer learned the baseline.
    std::thread::sleep(Duration::from_millis(2500));
    let mut spinners = Job {
        children: (0..4)
            .map(|_| {
                Command::new("taskset")
                    .args([
                        "-c",
                        "0",
                        "sh",
                        "-c",
                        "i=0; while [ $i -lt 100000000 ]; do i=$((i+1)); done",
                    ])
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("spinner")
            })
            .collect(),
    };
    let d = wait_diagnosis(&addr, Duration::from_secs(20));
    drop(job);
    for c in &mut spinners.children {
        let _ = c.kill();
    }
    drop(spinners);
    sh.kill();
    let d = d.expect("CPU-starved rank: no diagnosis");
    eprintln!(
        "starved rank {victim}: {:?} {} roots {:?}",
        d.class(),
        probe::describe(&d),
        d.roots
            .iter()
            .map(|r| format!("{}: {}", r.rank, r.reason))
            .collect::<Vec<_>>()
    );
    let roots: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
    // On the host backend communication is CPU work too: a starved rank is late into the
    // collective AND slow inside it (its peers wait for it mid-operation), so the class may
    // be any slow one; the rank must be named, alone.
    assert!(
        matches!(
            d.class(),
            AnomalyClass::S1ComputationSlow
                | AnomalyClass::S2CommunicationSlow
                | AnomalyClass::S3MixedSlow
        ),
        "{}",
        probe::describe(&d)
    );
    assert_eq!(roots, vec![victim as u32], "{}", probe::describe(&d));
    // When the diagnosis is communication-slow, the scheduler's evidence says why.
    if d.class() == AnomalyClass::S2CommunicationSlow {
        assert!(
            d.roots[0].reason.contains("waited for a CPU"),
            "{}",
            d.roots[0].reason
        );
    }
}

// ----- embedded hub -----

/// One diagnosis as rank 0's process wrote it.
#[derive(Debug)]
struct Seen {
    class: String,
    roots: Vec<u32>,
    text: String,
}

/// What rank 0's process wrote: its hub line (`ADDR here|elsewhere`) and the diagnoses.
fn read_report(path: &Path) -> (Option<String>, Vec<Seen>) {
    let Ok(s) = std::fs::read_to_string(path) else {
        return (None, Vec::new());
    };
    let hub = s
        .lines()
        .find_map(|l| l.strip_prefix("# hub "))
        .map(str::to_string);
    let seen = s
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let class = it.next()?.to_string();
            let roots = it.next()?;
            let roots = if roots == "-" {
                Vec::new()
            } else {
                roots.split(',').filter_map(|r| r.parse().ok()).collect()
            };
            Some(Seen {
                class,
                roots,
                text: it.next().unwrap_or("").to_string(),
            })
        })
        .collect();
    (hub, seen)
}

/// Runs `n` rank processes with the default (embedded) analyzer, `class` injected at rank
/// `root` from the harness's onset on (nothing for `Unspecified`), collective `kind`; returns
/// rank 0's hub line and the diagnoses its process surfaced within `wait` (returning at the
/// first one unless `class` is `Unspecified`).
fn hub_case(
    class: AnomalyClass,
    n: usize,
    root: usize,
    kind: CollKind,
    wait: Duration,
) -> (Option<String>, Vec<Seen>) {
    let path = std::env::temp_dir().join(format!(
        "ccld-hub-{}-{}-{n}-{root}-{}.txt",
        std::process::id(),
        class_name(class as i32),
        coll_name(kind)
    ));
    let _ = std::fs::remove_file(&path);
    let mut env: Vec<(&str, String)> = WINDOW_ENV
        .iter()
        .map(|(k, v)| (*k, (*v).to_string()))
        .collect();
    if class != AnomalyClass::Unspecified {
        env.push(("CCLD_INJECT", spec(class, root, n, kind)));
    }
    env.push((ENV_COLL, coll_name(kind).to_string()));
    env.push((ENV_DIAG_FILE, path.display().to_string()));
    let job = start_job(n, &env, None);
    let t0 = Instant::now();
    let mut got = (None, Vec::new());
    while t0.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(100));
        got = read_report(&path);
        if !got.1.is_empty() && class != AnomalyClass::Unspecified {
            break;
        }
    }
    drop(job);
    let _ = std::fs::remove_file(&path);
    got
}

/// The verdict rules of `e2e_threads`: exactly the injected class; hangs and S1 roots ==
/// [root]; S2 and S3 the injected rank first (the slow link's sender, then its successor).
fn hub_check(class: AnomalyClass, n: usize, root: usize, kind: CollKind) -> Result<(), String> {
    let t = Instant::now();
    let (hub, seen) = hub_case(class, n, root, kind, Duration::from_secs(20));
    let name = class_name(class as i32);
    if !hub.as_deref().is_some_and(|h| h.ends_with(" here")) {
        return Err(format!(
            "{name} n={n} root={root} {kind:?}: the hub does not run in rank 0's process ({hub:?})"
        ));
    }
    let d = seen.first().ok_or_else(|| {
        format!("{name} n={n} root={root} {kind:?}: no diagnosis in rank 0's process")
    })?;
    let ok_class = d.class == name;
    let ok_root = roots_ok(class, root, &d.roots);
    let line = format!(
        "hub {name} n={n} root={root} {kind:?}: got {} roots {:?} in {:.1} s: {}",
        d.class,
        d.roots,
        t.elapsed().as_secs_f64(),
        d.text
    );
    eprintln!("{line}");
    if ok_class && ok_root {
        Ok(())
    } else {
        Err(line)
    }
}

/// The default case of each class (together: 4 and 8 ranks, roots 0, 1, 2 and n-1, every
/// collective), or with `CCLD_E2E_FULL=1` the full
/// {4, 8} x {0, 1, n-1} x collectives product.
fn hub_cases(class: AnomalyClass) -> Vec<(usize, usize, CollKind)> {
    if let Some(all) = full_cases() {
        return all;
    }
    vec![match class {
        AnomalyClass::H1NotEntered => (4, 3, CollKind::AllReduce),
        AnomalyClass::H2Inconsistent => (8, 0, CollKind::AllGather),
        AnomalyClass::H3Hardware => (4, 1, CollKind::ReduceScatter),
        AnomalyClass::S1ComputationSlow => (4, 2, CollKind::AllReduce),
        AnomalyClass::S2CommunicationSlow => (4, 3, CollKind::ReduceScatter),
        _ => (4, 0, CollKind::AllGather),
    }]
}

fn hub_class(class: AnomalyClass) {
    // `CCLD_E2E_ONLY=<text>`: only the cases whose name (`S2 n=4 root=3 ReduceScatter`)
    // contains <text> (re-running one case of the full matrix).
    let only = std::env::var("CCLD_E2E_ONLY").unwrap_or_default();
    let errs: Vec<String> = hub_cases(class)
        .into_iter()
        .filter(|(n, root, k)| {
            format!("{} n={n} root={root} {k:?}", class_name(class as i32)).contains(&only)
        })
        .filter_map(|(n, root, k)| hub_check(class, n, root, k).err())
        .collect();
    assert!(errs.is_empty(), "{errs:#?}");
}

#[test]
fn embedded_hub_names_h1_not_entered() {
    hub_class(AnomalyClass::H1NotEntered);
}

#[test]
fn embedded_hub_names_h2_inconsistent() {
    hub_class(AnomalyClass::H2Inconsistent);
}

#[test]
fn embedded_hub_names_h3_hardware() {
    hub_class(AnomalyClass::H3Hardware);
}

#[test]
fn embedded_hub_names_s1_computation_slow() {
    hub_class(AnomalyClass::S1ComputationSlow);
}

#[test]
fn embedded_hub_names_s2_communication_slow() {
    hub_class(AnomalyClass::S2CommunicationSlow);
}

#[test]
fn embedded_hub_names_s3_mixed_slow() {
    hub_class(AnomalyClass::S3MixedSlow);
}

#[test]
fn embedded_hub_clean_run_raises_nothing() {
    // About 2000 collectives with jitter and barriers, no fault: the hub (running in rank
    // 0's process) must say nothing.
    let (hub, seen) = hub_case(
        AnomalyClass::Unspecified,
        4,
        0,
        CollKind::AllReduce,
        Duration::from_secs(5),
    );
    assert!(
        hub.as_deref().is_some_and(|h| h.ends_with(" here")),
        "rank 0's process runs the hub: {hub:?}"
    );
    assert!(seen.is_empty(), "{seen:#?}");
}
