//! `ccl-run -n N [--tag-output] [--grace S] [--comm-id] [--bind-to core|none] [--] CMD ARGS...`:
//! starts N local
//! processes with the torchrun-style variables RANK, WORLD_SIZE, LOCAL_RANK,
//! LOCAL_WORLD_SIZE and a rendezvous for the NCCL unique id (a fresh
//! NCCL_TESTS_UID_FILE in a private temp directory, or with --comm-id
//! NCCL_COMM_ID=127.0.0.1:<free port>; an NCCL_COMM_ID already in the environment is
//! passed through). SIGINT/SIGTERM are forwarded to the children; with --tag-output each
//! output line is prefixed with "[rank] ". The exit status is the first failing rank's
//! (128+signal for a rank killed by a signal); once one rank fails the others get `grace`
//! seconds to finish before they are killed. Like `mpirun` (which binds ranks to cores
//! when there are at most two), ranks are bound to one CPU each (rank `r` to the `r`-th CPU
//! `ccl-run` may use) when there are no more ranks than those CPUs (`--bind-to core`, the
//! default then); `--bind-to none` leaves placement to the scheduler.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Parsed `ccl-run` options.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOpts {
    /// Number of processes.
    pub n: usize,
    /// Prefix output lines with "[rank] ".
    pub tag: bool,
    /// Seconds the other ranks get after the first failure.
    pub grace: Duration,
    /// Use NCCL_COMM_ID=127.0.0.1:<port> instead of a rendezvous file.
    pub comm_id: bool,
    /// `--bind-to`: `Some(true)` core, `Some(false)` none, `None` the default (core when
    /// the ranks fit the CPUs).
    pub bind: Option<bool>,
    /// Command and arguments.
    pub cmd: Vec<String>,
}

/// Usage text.
pub const USAGE: &str =
    "usage: ccl-run -n N [--tag-output] [--grace SECONDS] [--comm-id] [--] CMD [ARGS...]\n";

/// Parses `argv[1..]`.
pub fn parse_args<S: AsRef<str>>(argv: &[S]) -> Result<RunOpts, String> {
    let mut o = RunOpts {
        n: 0,
        tag: false,
        grace: Duration::from_secs(3),
        comm_id: false,
        bind: None,
        cmd: Vec::new(),
    };
    let mut i = 0;
    let mut n_set = false;
    while i < argv.len() {
        let a = argv[i].as_ref();
        let value = |i: usize| {
            argv.get(i + 1)
                .map(|s| s.as_ref().to_string())
                .ok_or_else(|| format!("{a} needs a value"))
        };
        match a {
            "-n" | "-np" | "--np" | "--nproc" => {
                let v = value(i)?;
                o.n = v.parse().map_err(|_| format!("bad process count {v:?}"))?;
                n_set = true;
                i += 2;
            }
            "--tag-output" => {
                o.tag = true;
                i += 1;
            }
            "--comm-id" => {
                o.comm_id = true;
                i += 1;
            }
            "--bind-to" => {
                let v = value(i)?;
                o.bind = Some(match v.as_str() {
                    "core" => true,
                    "none" => false,
                    _ => return Err(format!("bad --bind-to {v:?} (core or none)")),
                });
                i += 2;
            }
            "--grace" => {
                let v = value(i)?;
                let s: f64 = v.parse().map_err(|_| format!("bad grace period {v:?}"))?;
                if !(0.0..=3600.0).contains(&s) {
                    return Err(format!("bad grace period {v:?}"));
                }
                o.grace = Duration::from_secs_f64(s);
                i += 2;
            }
            "-h" | "--help" => return Err(String::new()),
            "--" => {
                o.cmd = argv[i + 1..]
                    .iter()
                    .map(|s| s.as_ref().to_string())
                    .collect();
                break;
            }
            _ if a.starts_with('-') && o.cmd.is_empty() => {
                return Err(format!("unknown option {a:?}"))
            }
            _ => {
                o.cmd = argv[i..].iter().map(|s| s.as_ref().to_string()).collect();
                break;
            }
        }
    }
    if !n_set || o.n == 0 {
        return Err("-n N (N >= 1) is required".into());
    }
    if o.cmd.is_empty() {
        return Err("no command given".into());
    }
    Ok(o)
}

/// The CPUs the calling thread may run on, in order (empty when unknown).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it (size passed);
    // CPU_ISSET reads inside it for indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The status a shell would report for a child.
pub fn status_code(s: &ExitStatus) -> i32 {
    match (s.code(), s.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    }
}

static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    PENDING_SIGNAL.store(sig, Ordering::SeqCst);
}

fn install_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid starting point; we set a handler that only
        // stores into an atomic, which is async-signal-safe; the pointers passed are valid.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

fn signal_group(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a negative pid targets the process group the child leads (we
    // started it with process_group(0)); no memory is involved.
    unsafe {
        libc::kill(-(pid as libc::pid_t), sig);
    }
}

fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn pump<R: Read + Send + 'static>(
    src: R,
    rank: usize,
    to_stderr: bool,
    lock: Arc<Mutex<()>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
                    let mut out: Box<dyn Write> = if to_stderr {
                        Box::new(std::io::stderr())
                    } else {
                        Box::new(std::io::stdout())
                    };
                    let _ = out.write_all(format!("[{rank}] ").as_bytes());
                    let _ = out.write_all(&line);
                    let _ = out.flush();
                }
            }
        }
    })
}

/// Runs the job; returns ccl-run's exit status.
pub fn run(o: &RunOpts) -> i32 {
    install_handlers();
    let mut tmpdir: Option<PathBuf> = None;
    let mut extra: Vec<(String, String)> = Vec::new();
    if std::env::var_os("NCCL_COMM_ID").is_none() {
        if o.comm_id {
            match free_port() {
                Ok(p) => extra.push(("NCCL_COMM_ID".into(), format!("127.0.0.1:{p}"))),
                Err(e) => {
                    eprintln!("ccl-run: cannot find a free port: {e}");
                    return 1;
                }
            }
        } else {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let dir = std::env::temp_dir().join(format!("ccl-run-{}-{nanos}", std::process::id()));
            if let Err(e) = std::fs::create_dir(&dir) {
                eprintln!("ccl-run: cannot create {}: {e}", dir.display());
                return 1;
            }
            extra.push((
                "NCCL_TESTS_UID_FILE".into(),
                dir.join("uid").to_string_lossy().into_owned(),
            ));
            tmpdir = Some(dir);
        }
    }
    let lock = Arc::new(Mutex::new(()));
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pumps = Vec::new();
    let mut pids = Vec::new();
    let cpus = allowed_cpus();
    let bind = o.bind.unwrap_or(o.n <= cpus.len()) && !cpus.is_empty();
    for rank in 0..o.n {
        let mut c = Command::new(&o.cmd[0]);
        if bind {
            let cpu = cpus[rank % cpus.len()];
            // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it (cpu is
            // below CPU_SETSIZE: it came from CPU_ISSET over that range).
            let set = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                set
            };
            // SAFETY: the closure runs in the child between fork and exec and only makes
            // the sched_setaffinity system call (async-signal-safe) on a set it owns.
            unsafe {
                c.pre_exec(move || {
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                    Ok(())
                });
            }
        }
        c.args(&o.cmd[1..])
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", o.n.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", o.n.to_string())
            .envs(extra.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        if o.tag {
            c.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        match c.spawn() {
            Ok(mut ch) => {
                if let Some(out) = ch.stdout.take() {
                    pumps.push(pump(out, rank, false, lock.clone()));
                }
                if let Some(err) = ch.stderr.take() {
                    pumps.push(pump(err, rank, true, lock.clone()));
                }
                pids.push(ch.id());
                children.push(Some(ch));
            }
            Err(e) => {
                eprintln!("ccl-run: cannot start {:?}: {e}", o.cmd[0]);
                for pid in &pids {
                    signal_group(*pid, libc::SIGKILL);
                }
                for ch in children.iter_mut().flatten() {
                    let _ = ch.wait();
                }
                if let Some(d) = &tmpdir {
                    let _ = std::fs::remove_dir_all(d);
                }
                return 127;
            }
        }
    }
    let mut first_fail: Option<i32> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        let sig = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            for (k, ch) in children.iter().enumerate() {
                if ch.is_some() {
                    signal_group(pids[k], sig);
                }
            }
        }
        for slot in children.iter_mut() {
            if let Some(ch) = slot {
                if let Ok(Some(st)) = ch.try_wait() {
                    let code = status_code(&st);
                    if code != 0 && first_fail.is_none() {
                        first_fail = Some(code);
                        kill_at = Some(Instant::now() + o.grace);
                    }
                    *slot = None;
                }
            }
        }
        if children.iter().all(|c| c.is_none()) {
            break;
        }
        if let Some(t) = kill_at {
            if !killed && Instant::now() >= t {
                for (k, ch) in children.iter().enumerate() {
                    if ch.is_some() {
                        signal_group(pids[k], libc::SIGKILL);
                    }
                }
                killed = true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in pumps {
        let _ = p.join();
    }
    if let Some(d) = &tmpdir {
        let _ = std::fs::remove_dir_all(d);
    }
    first_fail.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        let o = parse_args(&["-n", "4", "--tag-output", "all_reduce_perf", "-b", "8"]).unwrap();
        assert_eq!(o.n, 4);
        assert!(o.tag);
        assert_eq!(o.cmd, vec!["all_reduce_perf", "-b", "8"]);
        let o = parse_args(&["--grace", "0.5", "-n", "2", "--", "-weird"]).unwrap();
        assert_eq!(o.bind, None);
        let b = parse_args(&["--bind-to", "none", "-n", "2", "x"]).unwrap();
        assert_eq!(b.bind, Some(false));
        assert!(parse_args(&["--bind-to", "socket", "-n", "2", "x"]).is_err());
        assert_eq!(o.grace, Duration::from_millis(500));
        assert_eq!(o.cmd, vec!["-weird"]);
        assert!(parse_args(&["all_reduce_perf"]).is_err());
        assert!(parse_args(&["-n", "0", "x"]).is_err());
        assert!(parse_args(&["-n", "x", "x"]).is_err());
        assert!(parse_args(&["-n", "2"]).is_err());
        assert!(parse_args(&["-n", "2", "--bogus", "x"]).is_err());
    }

    #[test]
    fn first_failure_wins_and_others_are_killed() {
        let o = RunOpts {
            n: 3,
            tag: false,
            grace: Duration::from_millis(200),
            comm_id: false,
            bind: None,
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "if [ $RANK = 1 ]; then exit 5; fi; sleep 30".into(),
            ],
        };
        let t = Instant::now();
        assert_eq!(run(&o), 5);
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}
