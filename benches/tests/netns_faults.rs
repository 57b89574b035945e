//! Real link faults across "hosts" (`benches::netns`), applied from outside, no
//! `CCLD_INJECT`: hosts with one rank each (four; two in one case) run `all_reduce_perf`
//! in a loop (8 MiB rings; 16 and 64 KiB Trees in the rate-limit cases) under the
//! default embedded analyzer (the windows shortened as in the real-faults matrix,
//! incidents read from `CCLD_REPORT=FILE.jsonl` as a user would), then one host's link or
//! process is hit:
//! - its process is SIGKILLed: H1 naming that rank, exited;
//! - its link is rate-limited (`tc qdisc ... tbf`): communication-slow naming that rank
//!   (by the time its messages spend on the wire, measured by the receiving proxies);
//! - its link is taken down (`ip link set ... down`): a hang naming that rank (H1 or H3,
//!   by whether the rank was inside an operation), and the other ranks fail with an NCCL
//!   error within the link timeout.
//!
//! Each at two positions. Needs root: skips elsewhere, fails in CI.
//! `CCLD_KEEP_REPORT=1` keeps the incident file (its path is printed).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use benches::netns::Hosts;
use benches::real_faults::run::WINDOW_ENV;
use benches::real_faults::setup::{cargo_build, profile_dir};
use benches::real_faults::{parse_incidents, Incident};

/// What the job runs, and how a rate-limit case limits it.
#[derive(Clone, Copy, Debug)]
struct Load {
    /// Hosts of one rank each.
    hosts: usize,
    /// `all_reduce_perf -b/-e`.
    size: &'static str,
    /// The `tbf` rate of a rate-limited link.
    rate: &'static str,
    /// `CCLD_SLOW_THETA` for the rate-limit case (the shared windows' 25 where `None`).
    theta: Option<&'static str>,
}

/// 8 MiB AllReduces (rings, 60 .. 80 ms each here). The shared windows' theta (25) is
/// sized for operations of 0.2 .. 0.5 ms, where one descheduling of a few ms is a large R;
/// for these the same descheduling is R < 0.3 and the paper's theta (about 3) applies; 100
/// Mbit/s makes them about 1 s (R about 12, measured).
const RING_8M: Load = Load {
    hosts: 4,
    size: "8M",
    rate: "100mbit",
    theta: Some("3"),
};

/// 16 KiB AllReduces, which the automatic choice runs as Tree over sockets (up to 32 KiB
/// at more than 2 ranks, `hostalgo::tree_limit`): recursive doubling, every rank exchanging
/// with a partner per step, no ring; 0.1 .. 0.3 ms each here. 10 Mbit/s makes the 32 KiB
/// each rank sends per operation take 26 ms or more (R about 100), clear of the shared
/// theta.
const TREE_16K: Load = Load {
    hosts: 4,
    size: "16K",
    rate: "10mbit",
    theta: None,
};

#[derive(Clone, Copy, Debug)]
enum LinkFault {
    Kill,
    RateLimit,
    Down,
}

/// The job's launchers (one process group each); killed on drop.
struct Job {
    children: Vec<Child>,
    pids: Arc<Mutex<Vec<Option<u32>>>>,
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.children {
            // SAFETY: kill(2) of the process group this test started; no memory passed.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

fn start(
    hosts: &Hosts,
    bin: &std::path::Path,
    report: &std::path::Path,
    env: &[(&str, &str)],
    size: &str,
) -> Job {
    let uid = bin.join(format!("netns-faults-uid-{}", std::process::id()));
    let _ = std::fs::remove_file(&uid);
    let ranks = hosts.len();
    let pids = Arc::new(Mutex::new(vec![None; ranks]));
    let args = [
        "-b",
        size,
        "-e",
        size,
        "-n",
        "100000000",
        "-w",
        "2",
        "-c",
        "0",
    ];
    let children = (0..ranks)
        .map(|h| {
            let mut c = hosts.ranks_command(
                h,
                h..h + 1,
                ranks,
                &bin.join("all_reduce_perf"),
                &args,
                &uid,
                bin,
            );
            c.envs(WINDOW_ENV.iter().map(|(k, v)| (*k, *v)))
                .envs(env.iter().map(|(k, v)| (*k, *v)))
                .env("CCLD_REPORT", report)
                .env_remove("CCLD_ANALYZER")
                .env_remove("CCLD_INJECT")
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            let mut child = c.spawn().expect("start a host");
            let out = child.stdout.take().expect("stdout");
            let pids = Arc::clone(&pids);
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let mut w = line.split_whitespace();
                    if let (Some("@@PID"), Some(r), Some(p)) = (w.next(), w.next(), w.next()) {
                        if let (Ok(r), Ok(p)) = (r.parse::<usize>(), p.parse::<u32>()) {
                            pids.lock().unwrap()[r] = Some(p);
                        }
                    }
                }
            });
            child
        })
        .collect();
    Job { children, pids }
}

/// Every host but `victim` ends with nccl-tests' NCCL-error status (3) within the socket
/// transport's link timeout (5 s) plus a peer check and margin: a silent link is found.
fn survivors_fail(job: &mut Job, victim: usize, fault_at: Instant) {
    let limit = Duration::from_secs(12);
    for (h, c) in job.children.iter_mut().enumerate() {
        if h == victim {
            continue;
        }
        let status = loop {
            if let Some(s) = c.try_wait().expect("wait") {
                break s;
            }
            assert!(
                fault_at.elapsed() < limit,
                "host {h} still runs {limit:?} after its peer's link went down"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(status.code(), Some(3), "host {h}: {status}");
        eprintln!(
            "host {h} failed with {status} {:?} after the link went down",
            fault_at.elapsed()
        );
    }
}

fn incidents(report: &std::path::Path) -> Vec<Incident> {
    let text = std::fs::read_to_string(report).unwrap_or_default();
    let done = text.rfind('\n').map_or("", |i| &text[..=i]);
    parse_incidents(done).unwrap_or_default()
}

/// Runs the job, applies `fault` to host `victim` after a warm-up, and returns what the
/// analyzer reported within 15 s (and 2 s more after the first incident), with the delay.
fn run(
    fault: LinkFault,
    victim: usize,
    set: u8,
    load: Load,
) -> Option<(Vec<Incident>, Option<Duration>)> {
    let hosts = Hosts::for_test(load.hosts, set)?;
    let bin = profile_dir().expect("profile dir");
    cargo_build(&bin, &["-p", "ccl-ffi", "--lib"]).expect("build libnccl.so.2");
    cargo_build(
        &bin,
        &["-p", "nccl-tests-compat", "--bin", "all_reduce_perf"],
    )
    .expect("build all_reduce_perf");
    let report = bin.join(format!("netns-faults-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let env: Vec<(&str, &str)> = match (fault, load.theta) {
        (LinkFault::RateLimit, Some(theta)) => vec![("CCLD_SLOW_THETA", theta)],
        _ => Vec::new(),
    };
    let mut job = start(&hosts, &bin, &report, &env, load.size);
    let t0 = Instant::now();
    while job.pids.lock().unwrap().iter().any(Option::is_none) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "ranks did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Training runs; the analyzer learns its baseline.
    std::thread::sleep(Duration::from_secs(5));
    let before = incidents(&report);
    assert!(before.is_empty(), "incidents before the fault: {before:?}");
    let link = hosts.link(victim);
    let fault_at = Instant::now();
    match fault {
        LinkFault::Kill => {
            let pid = job.pids.lock().unwrap()[victim].expect("victim pid");
            // SAFETY: kill(2) of a rank process this test started; no memory passed.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        LinkFault::RateLimit => {
            let ns = hosts.namespace(victim);
            let out = std::process::Command::new("tc")
                .args(["-n", &ns, "qdisc", "add", "dev", &link, "root", "tbf"])
                .args(["rate", load.rate, "burst", "64kb", "latency", "50ms"])
                .output()
                .expect("run tc");
            assert!(
                out.status.success(),
                "tc: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        LinkFault::Down => hosts
            .ip(victim, &["link", "set", &link, "down"])
            .expect("take the link down"),
    }
    let mut first = None;
    let deadline = fault_at + Duration::from_secs(15);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        seen = incidents(&report);
        if !seen.is_empty() && first.is_none() {
            first = Some(fault_at.elapsed());
        }
        if first.is_some_and(|d| fault_at.elapsed() > d + Duration::from_secs(2)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if matches!(fault, LinkFault::Down) {
        survivors_fail(&mut job, victim, fault_at);
    }
    drop(job);
    if std::env::var_os("CCLD_KEEP_REPORT").is_some() {
        eprintln!("report kept: {}", report.display());
    } else {
        let _ = std::fs::remove_file(&report);
    }
    Some((seen, first))
}

/// [`check_load`] with the 8 MiB ring operations of most cases.
fn check(fault: LinkFault, victim: usize, set: u8, classes: &[&str], exited: bool) {
    check_load(fault, victim, set, RING_8M, classes, exited)
}

/// Runs the job under `load`, applies `fault` to host `victim`, and asserts that the first
/// incident is one of `classes` naming only `victim` (and that no incident names another
/// rank).
fn check_load(
    fault: LinkFault,
    victim: usize,
    set: u8,
    load: Load,
    classes: &[&str],
    exited: bool,
) {
    let Some((seen, delay)) = run(fault, victim, set, load) else {
        return;
    };
    eprintln!("{fault:?} of host {victim} ({load:?}): after {delay:?}:");
    for i in &seen {
        eprintln!("  {} {}", i.describe(), i.summary);
    }
    let first = seen
        .first()
        .unwrap_or_else(|| panic!("{fault:?} of host {victim}: no diagnosis within 15 s"));
    assert!(
        classes.contains(&first.class.as_str()) && first.roots == [victim as u32],
        "{fault:?} of host {victim}: first incident {} ({}), expected {classes:?} [{victim}]",
        first.describe(),
        first.summary
    );
    assert_eq!(first.exited, exited, "{}", first.summary);
    for i in &seen {
        assert!(
            i.roots.iter().all(|r| *r == victim as u32),
            "an incident names a rank other than {victim}: {} ({})",
            i.describe(),
            i.summary
        );
    }
}

#[test]
fn killing_a_remote_rank_is_named_as_its_process_death() {
    check(LinkFault::Kill, 1, 3, &["H1"], true);
    check(LinkFault::Kill, 2, 4, &["H1"], true);
}

/// The ring runs in lockstep here: every rank of every channel waits 0.9 .. 1.0 of the
/// window for upstream data and never for downstream slots (no data piles up in front of
/// the slow link), so the wait metrics cannot tell; the time the messages of the link from
/// the victim spend on the wire does (`locate::slow_wires`).
#[test]
fn a_rate_limited_link_is_named_communication_slow() {
    check(LinkFault::RateLimit, 1, 5, &["S2"], false);
    check(LinkFault::RateLimit, 3, 6, &["S2"], false);
}

/// 64 KiB AllReduces on 2 hosts, which the automatic choice runs as Tree over sockets
/// (up to 128 KiB at 2 ranks): one exchange per operation; 10 Mbit/s makes the 64 KiB each
/// rank sends take 50 ms or more.
const TREE_64K_2: Load = Load {
    hosts: 2,
    size: "64K",
    rate: "10mbit",
    theta: None,
};

/// The same under small AllReduces, which run as Tree ([`TREE_16K`]).
#[test]
fn a_rate_limited_link_under_tree_operations_is_named_communication_slow() {
    check_load(LinkFault::RateLimit, 1, 9, TREE_16K, &["S2"], false);
    check_load(LinkFault::RateLimit, 2, 9, TREE_16K, &["S2"], false);
}

/// Two hosts, the first case users meet: the same under [`TREE_64K_2`], either host.
#[test]
fn a_rate_limited_link_between_two_hosts_is_named_communication_slow() {
    check_load(LinkFault::RateLimit, 0, 9, TREE_64K_2, &["S2"], false);
    check_load(LinkFault::RateLimit, 1, 9, TREE_64K_2, &["S2"], false);
}

/// A hang at the rank behind the link: H1 (not entered) when the link went down between
/// two of its operations, H3 (communication stuck) when it was inside one; both were seen.
/// Inside one, the ranks whose last data had passed before complete it: the rank behind
/// the link is then the one starved of data its completed upstream sent (once named H2 on
/// the completers, before `locate::starved_receivers`).
#[test]
fn a_link_taken_down_is_named_as_a_hang_at_its_rank() {
    check(LinkFault::Down, 2, 7, &["H1", "H3"], false);
    check(LinkFault::Down, 3, 8, &["H1", "H3"], false);
}
