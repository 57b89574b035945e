//! Runs one [`Case`]: the C client as N processes (one process group), the fault, and the
//! analyzer's incidents as a user reads them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::setup::{run_bounded, Env};
use super::{parse_incidents, verdict, Analyzer, Case, Fault, Incident, Outcome};

/// Seconds of clean training before a fault (the analyzer learns its baseline).
pub const WARM_S: f64 = 3.0;
/// Length of a clean run, seconds of training.
pub const CLEAN_S: f64 = 8.0;
/// Longest wait for a diagnosis after the fault.
pub const OBSERVE: Duration = Duration::from_secs(15);
/// After the first incident, how long later incidents are still collected (an incident
/// blaming a victim after the right one fails the case).
pub const SETTLE: Duration = Duration::from_secs(2);

/// The shortened detection windows (hang 1.5 s, slow window 0.5 s x 3; default theta) as
/// the probe's / embedded analyzer's environment.
pub const WINDOW_ENV: [(&str, &str); 8] = [
    ("CCLD_SLOW_WINDOW_S", "0.5"),
    ("CCLD_BASELINE_S", "0.5"),
    ("CCLD_T_BASE_INIT_MS", "1000"),
    ("CCLD_HANG_TIMEOUT_S", "1.5"),
    ("CCLD_INFLIGHT_MS", "200"),
    ("CCLD_SILENT_S", "1"),
    ("CCLD_SLOW_REPEAT", "3"),
    ("CCLD_HEARTBEAT_MS", "200"),
];

/// The same windows as `ccld serve` flags.
pub const SERVE_FLAGS: [&str; 12] = [
    "--hang-timeout-s",
    "1.5",
    "--slow-window-s",
    "0.5",
    "--slow-repeat",
    "3",
    "--t-base-init-s",
    "1",
    "--baseline-span-s",
    "0.5",
    "--silent-after-s",
    "1",
];

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) with a pid of a process this harness started (or its group, negated);
    // no memory is passed.
    unsafe { libc::kill(pid, sig) == 0 }
}

/// What the client printed on stdout.
#[derive(Debug, Default)]
struct Seen {
    pids: BTreeMap<usize, u32>,
    fault_unix_ns: Option<u64>,
    all_ok: bool,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

/// The client's process group; dropped = every rank continued and killed.
struct Job {
    child: Child,
    seen: Arc<Mutex<Seen>>,
    stderr: PathBuf,
}

impl Job {
    fn start(
        env: &Env,
        case: &Case,
        extra: &[(&str, String)],
        seconds: f64,
    ) -> Result<Job, String> {
        let stderr = env
            .work
            .join(format!("client-{}-{}.err", std::process::id(), unix_ns()));
        let err = std::fs::File::create(&stderr).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&env.client);
        cmd.args(["--ranks", &case.ranks.to_string()])
            .args(["--seconds", &seconds.to_string()])
            .args(["--fault-after", &WARM_S.to_string()]);
        if case.one_comm {
            cmd.args(["--no-tp", "--no-pipeline"]);
        }
        let r = case.root.to_string();
        match case.fault {
            Fault::Slow { factor } => {
                cmd.args(["--slow-rank", &r, "--slow-factor", &factor.to_string()]);
            }
            Fault::Inconsistent => {
                cmd.args(["--inconsistent-rank", &r]);
            }
            Fault::Skip => {
                cmd.args(["--skip-rank", &r]);
            }
            Fault::BadCall => {
                cmd.args(["--bad-call-rank", &r]);
            }
            _ => {}
        }
        cmd.env("LD_LIBRARY_PATH", &env.lib_dir)
            .env_remove("CCLD_INJECT")
            .env_remove("CCLD_ANALYZER")
            .env_remove("CCLD_REPORT")
            .env_remove("NCCL_COMM_ID")
            .env_remove("NCCL_DEBUG")
            .envs(WINDOW_ENV.iter().map(|(k, v)| (*k, *v)))
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err);
        let mut child = cmd.spawn().map_err(|e| format!("start the client: {e}"))?;
        let out = child.stdout.take().ok_or("no client stdout")?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s = Arc::clone(&seen);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
                if line.starts_with("READY ") {
                    if let (Some(r), Some(p)) = (field(&line, "rank"), field(&line, "pid")) {
                        if let (Ok(r), Ok(p)) = (r.parse(), p.parse()) {
                            s.pids.insert(r, p);
                        }
                    }
                } else if line.starts_with("FAULT ") {
                    s.fault_unix_ns = field(&line, "unix_ns").and_then(|v| v.parse().ok());
                } else if line.starts_with("ALL OK") {
                    s.all_ok = true;
                }
            }
        });
        Ok(Job {
            child,
            seen,
            stderr,
        })
    }

    fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Every rank process has ended (rank 0's is the client itself; the others may outlive
    /// it). A zombie counts as ended.
    fn all_gone(&mut self) -> bool {
        if self.exited().is_none() {
            return false;
        }
        self.seen(|s| s.pids.values().copied().collect::<Vec<_>>())
            .into_iter()
            .all(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
                    // "pid (comm) S ...": the state follows the last ')'.
                    st.rsplit_once(')')
                        .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
                })
            })
    }

    /// Copies the client's stderr next to it (`.kept`) before the drop removes it.
    fn keep_stderr(&self, case: &Case) {
        let kept = self.stderr.with_extension("kept");
        if std::fs::copy(&self.stderr, &kept).is_ok() {
            eprintln!("{}: kept {}", case.name(), kept.display());
        }
    }

    fn stderr_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(8)..].join("\n")
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let g = -(self.child.id() as i32);
        signal(g, libc::SIGCONT);
        signal(g, libc::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

/// A `ccld serve` shard on 127.0.0.1 with the shortened windows; killed on drop.
struct Shard {
    child: Child,
    addr: SocketAddr,
}

impl Shard {
    fn start(env: &Env) -> Result<Shard, String> {
        // A free port (the tiny race with another process taking it shows as a start error).
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("free port: {e}"))?;
        let child = Command::new(&env.ccld)
            .args(["serve", "--listen", &addr.to_string()])
            .args(SERVE_FLAGS)
            .env_remove("CCLD_ANALYZER")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start ccld serve: {e}"))?;
        let mut s = Shard { child, addr };
        let t0 = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if s.child.try_wait().ok().flatten().is_some() {
                return Err("ccld serve exited at start".into());
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(format!("ccld serve does not listen on {addr}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(s)
    }

    /// What `ccld anomalies --json` prints for this shard: its incidents, or with
    /// `diagnoses` its per-communicator diagnoses (the evidence).
    fn anomalies_json(&self, env: &Env, diagnoses: bool) -> Result<String, String> {
        let mut cmd = Command::new(&env.ccld);
        cmd.args(["anomalies", "--json", "--server", &self.addr.to_string()])
            .env_remove("CCLD_ANALYZER");
        if diagnoses {
            cmd.arg("--diagnoses");
        }
        let (ok, out) = run_bounded(&mut cmd, Duration::from_secs(10));
        if ok {
            Ok(out)
        } else {
            Err(format!("ccld anomalies --json: {}", out.trim()))
        }
    }

    fn incidents(&self, env: &Env) -> Result<Vec<Incident>, String> {
        parse_incidents(&self.anomalies_json(env, false)?)
    }
}

impl Drop for Shard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where incidents come from.
enum Source {
    File(PathBuf),
    Serve(Shard),
}

impl Source {
    fn read(&self, env: &Env) -> Result<Vec<Incident>, String> {
        match self {
            Source::File(p) => match std::fs::read_to_string(p) {
                Ok(s) => {
                    // A line still being written is not an error yet: parse complete lines.
                    let done = s.rfind('\n').map_or("", |i| &s[..=i]);
                    parse_incidents(done)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(format!("{}: {e}", p.display())),
            },
            Source::Serve(s) => s.incidents(env),
        }
    }
}

/// SIGSTOP/SIGCONT of `pid` until `stop` is set; leaves it running.
fn duty_cycle(
    pid: i32,
    stop_ms: u64,
    run_ms: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            signal(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(stop_ms));
            signal(pid, libc::SIGCONT);
            std::thread::sleep(Duration::from_millis(run_ms));
        }
        signal(pid, libc::SIGCONT);
    })
}

/// Runs one case; never panics on a failed run (the outcome says what went wrong).
pub fn run_case(env: &Env, case: &Case) -> Outcome {
    let mut notes = Vec::new();
    let mut tail = String::new();
    let (verdict_, delay, timeline) = match run_inner(env, case, &mut notes, &mut tail) {
        Ok((seen, delay, origin_ns)) => (
            verdict(&case.expected(), &seen),
            delay,
            super::timeline(&seen, origin_ns),
        ),
        Err(e) => {
            notes.push(e);
            (
                super::Verdict {
                    pass: false,
                    got: "run failed".into(),
                },
                None,
                Vec::new(),
            )
        }
    };
    if (!verdict_.pass || !notes.is_empty()) && !tail.is_empty() {
        notes.push(format!("client stderr (last lines):\n{tail}"));
    }
    Outcome {
        case: *case,
        verdict: verdict_,
        delay,
        notes,
        timeline,
    }
}

fn run_inner(
    env: &Env,
    case: &Case,
    notes: &mut Vec<String>,
    tail: &mut String,
) -> Result<(Vec<Incident>, Option<Duration>, u64), String> {
    if case.fault != Fault::None && case.root >= case.ranks {
        return Err(format!(
            "root {} is not below {} ranks",
            case.root, case.ranks
        ));
    }
    let report = env
        .work
        .join(format!("report-{}-{}.jsonl", std::process::id(), unix_ns()));
    let _ = std::fs::remove_file(&report);
    let (source, extra) = match case.analyzer {
        Analyzer::Embedded => (
            Source::File(report.clone()),
            vec![("CCLD_REPORT", report.display().to_string())],
        ),
        Analyzer::Serve => {
            let s = Shard::start(env)?;
            let a = s.addr.to_string();
            (Source::Serve(s), vec![("CCLD_ANALYZER", a)])
        }
    };
    let clean = case.fault == Fault::None;
    // A faulty run is ended by the harness; the client's own end is far away.
    let seconds = if clean { CLEAN_S } else { WARM_S + 60.0 };
    let mut job = Job::start(env, case, &extra, seconds)?;
    let r = observe(env, case, &mut job, &source, notes);
    *tail = job.stderr_tail();
    if std::env::var_os("CCLD_REAL_FAULTS_KEEP").is_some() {
        // For a post-mortem: the incidents as written (a shard's: as `ccld anomalies
        // --json` lists them, with their evidence), and the client's stderr.
        if let Source::Serve(s) = &source {
            if let Ok(json) = s.anomalies_json(env, false) {
                let _ = std::fs::write(&report, json);
            }
            if let Ok(json) = s.anomalies_json(env, true) {
                let evidence = report.with_extension("diagnoses.json");
                let _ = std::fs::write(&evidence, json);
                eprintln!("{}: kept {}", case.name(), evidence.display());
            }
        }
        eprintln!("{}: kept {}", case.name(), report.display());
        job.keep_stderr(case);
    }
    drop(job);
    drop(source);
    if std::env::var_os("CCLD_REAL_FAULTS_KEEP").is_none() {
        let _ = std::fs::remove_file(&report);
    }
    r
}

fn observe(
    env: &Env,
    case: &Case,
    job: &mut Job,
    source: &Source,
    notes: &mut Vec<String>,
) -> Result<(Vec<Incident>, Option<Duration>, u64), String> {
    let started_ns = unix_ns();
    let t0 = Instant::now();
    while job.seen(|s| s.pids.len()) < case.ranks {
        if let Some(st) = job.exited() {
            return Err(format!("client ended before every rank was ready: {st}"));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("not every rank ready after 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if case.fault == Fault::None {
        // The whole run, then what the analyzer says after it.
        let limit = Duration::from_secs_f64(CLEAN_S + 60.0);
        let status = loop {
            if let Some(st) = job.exited() {
                break st;
            }
            if t0.elapsed() > limit {
                return Err("the clean run did not end".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if !status.success() || !job.seen(|s| s.all_ok) {
            notes.push(format!("clean client run failed: {status}"));
        }
        std::thread::sleep(SETTLE);
        return Ok((source.read(env)?, None, started_ns));
    }

    let pid = job.seen(|s| s.pids.get(&case.root).copied()).unwrap_or(0) as i32;
    let stop_duty = Arc::new(AtomicBool::new(false));
    let mut duty = None;
    let fault_at = if case.fault.by_client() {
        // The client applies it WARM_S into its loop and says when.
        let t = Instant::now();
        loop {
            if let Some(ns) = job.seen(|s| s.fault_unix_ns) {
                break ns;
            }
            if t.elapsed() > Duration::from_secs_f64(WARM_S + 30.0) || job.exited().is_some() {
                return Err("the client never applied its fault".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    } else {
        std::thread::sleep(Duration::from_secs_f64(WARM_S));
        if job.exited().is_some() {
            return Err("the client ended before the fault".into());
        }
        let at = unix_ns();
        match case.fault {
            Fault::Stop => {
                signal(pid, libc::SIGSTOP);
            }
            Fault::Kill => {
                signal(pid, libc::SIGKILL);
            }
            Fault::DutyCycle { stop_ms, run_ms } => {
                duty = Some(duty_cycle(pid, stop_ms, run_ms, Arc::clone(&stop_duty)));
            }
            _ => {}
        }
        at
    };
    let fault_instant = Instant::now();
    let want = case.expected();
    // When the harness first saw any incident, and the right one (with its time stamp).
    let mut first_seen: Option<Instant> = None;
    let mut right_seen: Option<(Instant, u64)> = None;
    let mut exited_at: Option<Instant> = None;
    let last = loop {
        std::thread::sleep(Duration::from_millis(250));
        let last = source.read(env);
        let now = Instant::now();
        if let Ok(seen) = &last {
            if first_seen.is_none() && !seen.is_empty() {
                first_seen = Some(now);
            }
            if right_seen.is_none() {
                right_seen = seen
                    .iter()
                    .find(|i| want.matches(i))
                    .map(|i| (now, i.detected_at_ns));
            }
        }
        if exited_at.is_none() && job.all_gone() {
            exited_at = Some(now);
        }
        let settled = first_seen.is_some_and(|t| now - t >= SETTLE);
        // Under the embedded analyzer nothing can come once every process is gone.
        let gone =
            case.analyzer == Analyzer::Embedded && exited_at.is_some_and(|t| now - t >= SETTLE);
        if settled || gone || now - fault_instant >= OBSERVE {
            break last;
        }
    };
    stop_duty.store(true, Ordering::Relaxed);
    if let Some(d) = duty {
        let _ = d.join();
    }
    let seen = last?;
    // Fault to the right diagnosis: the analyzer's own time stamp when it is plausible
    // (same host clock), else when the harness saw it.
    let delay = right_seen.map(|(seen_at, detected_ns)| {
        if detected_ns >= fault_at && detected_ns - fault_at < 600_000_000_000 {
            Duration::from_nanos(detected_ns - fault_at)
        } else {
            seen_at - fault_instant
        }
    });
    Ok((seen, delay, fault_at))
}
