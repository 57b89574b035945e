//! The shared test engine behind every `*_perf` binary: ranks as threads (-t/-g) and
//! processes (launcher variables), communicator setup, the timing loop, verification,
//! cross-rank reductions (in-process, or through NCCL itself across processes), output
//! and exit codes.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::args::{self, Args, Choice, Parsed};
use crate::colls::{Coll, Counts};
use crate::cuda::{Cuda, CudaError};
use crate::dtype::{DataType, RedOp, ALL_OPS, ALL_TYPES};
use crate::launch;
use crate::mem::{Backend, Buffer};
use crate::nccl::{Call, CallKind, Comm, Nccl, NcclError, UniqueId, NCCL_HEADERS_VERSION};
use crate::report::{self, Half, IterStats, JsonReport};
use crate::sync::{Busy, Reduce, ThreadSync};
use crate::verify::GenParams;

/// nccl-tests' exit codes.
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// Internal error.
    pub const INTERNAL: i32 = 1;
    /// CUDA error.
    pub const CUDA: i32 = 2;
    /// NCCL error.
    pub const NCCL: i32 = 3;
    /// Timeout (-T).
    pub const TIMEOUT: i32 = 4;
    /// Not implemented / invalid number of GPUs.
    pub const NOT_IMPLEMENTED: i32 = 5;
    /// Invalid usage.
    pub const USAGE: i32 = 6;
    /// Wrong data, or bus bandwidth below NCCL_TESTS_MIN_BW.
    pub const FAILED: i32 = 7;
}

/// Test-only hook: the global rank named here finishes communicator init and then never
/// enters its first collective (to exercise -T).
pub const HANG_RANK_VAR: &str = "CCLD_TESTS_HANG_RANK";

fn hostname() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string());
    let h = h.trim();
    h.split('.').next().unwrap_or(h).to_string()
}

/// "YYYY-mm-dd HH:MM:SS" (UTC) for `secs` since the epoch.
pub fn format_time(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // Civil-from-days (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn now_string() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_time(secs)
}

/// Set by the -T watchdog before it aborts the communicators: operations failing because
/// of that abort must not turn the timeout (exit 4) into an NCCL error (exit 3).
static TIMED_OUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Prints `msg` to stdout, flushes and ends the process with `code` (used for failures
/// in any thread: the other threads may be blocked inside the library). After a timeout
/// the calling thread waits instead: the watchdog ends the process with exit 4.
fn die(code: i32, msg: &str) -> ! {
    if code != exit::TIMEOUT && TIMED_OUT.load(std::sync::atomic::Ordering::SeqCst) {
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{msg}");
    let _ = out.flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code)
}

struct Ctx {
    nccl: Arc<Nccl>,
    cuda: Option<Arc<Cuda>>,
    backend: Backend,
    args: Args,
    coll: Coll,
    host: String,
    lib_version: i32,
    /// Processes in this communicator (this colour) and this process's index among them.
    comm_procs: usize,
    comm_proc: usize,
    nthreads: usize,
    ngpus: usize,
    nranks: usize,
    is_main_proc: bool,
    tsync: ThreadSync,
    busy: Busy,
    comms: Mutex<Vec<Comm>>,
    hang_rank: Option<usize>,
    out: Mutex<Option<JsonReport>>,
    device_lines: Vec<String>,
    /// CCLD_TESTS_DEBUG_WRONG: print up to this many wrong elements per rank and check.
    debug_wrong: u64,
}

macro_rules! nccl_try {
    ($ctx:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(err) => nccl_fail(&$ctx, &err, file!(), line!()),
        }
    };
}
macro_rules! cuda_try {
    ($ctx:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(err) => cuda_fail(&$ctx, &err, file!(), line!()),
        }
    };
}

// After the macros: the thread module uses them (textual scope).
mod thread;

use thread::thread_main;

fn nccl_fail(ctx: &Ctx, e: &NcclError, file: &str, line: u32) -> ! {
    let msg = format!(
        "{}: Test NCCL failure {}:{} '{} / {}' ({})",
        ctx.host,
        file,
        line,
        ctx.nccl.error_string(e.code),
        ctx.nccl.last_error(),
        e.call
    );
    die(exit::NCCL, &msg)
}

fn cuda_fail(ctx: &Ctx, e: &CudaError, file: &str, line: u32) -> ! {
    die(
        exit::CUDA,
        &format!(
            "{}: Test CUDA failure {}:{} '{}' ({})",
            ctx.host, file, line, e.message, e.call
        ),
    )
}

/// One rank driven by a thread.
struct Rank {
    rank: usize,
    comm: Comm,
    stream: usize,
    send: Buffer,
    recv: Buffer,
    small: Buffer,
    reg: Vec<usize>,
}

/// Runs the program `coll` with command line `argv` (argv[0] included); returns the exit
/// status.
pub fn run_main(coll: Coll, argv: Vec<String>) -> i32 {
    let prog = coll.program();
    let a = match args::parse(&argv[1.min(argv.len())..]) {
        Parsed::Run(a) => *a,
        Parsed::Usage { note } => {
            if let Some(n) = note {
                println!("{prog}: {n}");
            }
            print!("{}", args::usage(prog));
            return exit::OK;
        }
        Parsed::Fail { code, message } => {
            eprintln!("{message}");
            return code;
        }
    };
    if a.cudagraph > 0 {
        eprintln!(
            "CUDA graph launches (-G {}) are not implemented by this nccl-tests",
            a.cudagraph
        );
        return exit::NOT_IMPLEMENTED;
    }
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let min_bw = match get("NCCL_TESTS_MIN_BW") {
        None => None,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(x) if x >= 0.0 => Some(x),
            _ => {
                eprintln!("NCCL_TESTS_MIN_BW={v:?} is not a non-negative number");
                return exit::USAGE;
            }
        },
    };
    let pinfo = match launch::proc_info(&get) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return exit::USAGE;
        }
    };
    let split = get("NCCL_TESTS_SPLIT");
    let mask = get("NCCL_TESTS_SPLIT_MASK");
    let colors: Result<Vec<usize>, _> = (0..pinfo.nprocs)
        .map(|p| launch::split_color(p, split.as_deref(), mask.as_deref()))
        .collect();
    let colors = match colors {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return exit::USAGE;
        }
    };
    let color = colors[pinfo.proc];
    let comm_procs = colors.iter().filter(|&&c| c == color).count();
    let comm_proc = colors[..pinfo.proc].iter().filter(|&&c| c == color).count();
    let gpu0 = match get("NCCL_TESTS_DEVICE") {
        None => None,
        Some(v) => match v.trim().parse::<i32>() {
            Ok(x) if x >= 0 => Some(x),
            _ => {
                eprintln!("NCCL_TESTS_DEVICE={v:?} is not a device index");
                return exit::USAGE;
            }
        },
    };
    let hang_rank = match get(HANG_RANK_VAR) {
        None => None,
        Some(v) => match v.trim().parse::<usize>() {
            Ok(x) => Some(x),
            Err(_) => {
                eprintln!("{HANG_RANK_VAR}={v:?} is not a rank");
                return exit::USAGE;
            }
        },
    };

    let debug_wrong = match get("CCLD_TESTS_DEBUG_WRONG") {
        None => 0,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(x) => x,
            Err(_) => {
                eprintln!("CCLD_TESTS_DEBUG_WRONG={v:?} is not a count");
                return exit::USAGE;
            }
        },
    };

    let nccl = match Nccl::load() {
        Ok(n) => Arc::new(n),
        Err(e) => {
            eprintln!("{}: {}", hostname(), e.0);
            return exit::NCCL;
        }
    };
    let host = hostname();
    let lib_version = match nccl.version() {
        Ok(v) => v,
        Err(e) => {
            eprintln!(
                "{host}: ncclGetVersion failed: {}",
                nccl.error_string(e.code)
            );
            return exit::NCCL;
        }
    };
    if let Some(sym) = coll.needs_symbol() {
        if !nccl.has(sym) {
            eprintln!("{host}: the loaded libnccl.so.2 (version {lib_version}) has no {sym}");
            return exit::NOT_IMPLEMENTED;
        }
    }

    let nthreads = a.nthreads as usize;
    let ngpus = a.ngpus as usize;
    let local = nthreads * ngpus;
    let (cuda, backend) = match Cuda::try_load() {
        Some((c, ndev)) => {
            let base = gpu0.unwrap_or((pinfo.local_rank * local) as i32);
            if base as usize + local > ndev as usize {
                eprintln!(
                    "Invalid number of GPUs: {} requested but only {} were found.",
                    base as usize + local,
                    ndev
                );
                eprintln!("Please check the number of processes and GPUs per process.");
                return exit::NOT_IMPLEMENTED;
            }
            let c = Arc::new(c);
            (Some(c.clone()), Backend::Device(c))
        }
        None => (None, Backend::Host),
    };
    let is_main_proc = pinfo.proc == 0;

    // JSON output file (first process only).
    let mut json = None;
    if is_main_proc {
        if let Some(path) = &a.output_file {
            let mut try_path = path.clone();
            let mut k = 0;
            loop {
                match std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&try_path)
                {
                    Ok(_) => {
                        println!("# Writing JSON output to {try_path}");
                        let env: Vec<String> =
                            std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
                        json = Some((
                            try_path.clone(),
                            JsonReport::new(&now_string(), &argv, &env, lib_version),
                        ));
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        try_path = format!("{path}.{k}");
                        k += 1;
                    }
                    Err(_) => {
                        println!("# skipping json output; {try_path} not accessible");
                        break;
                    }
                }
            }
        }
        print!(
            "{}",
            report::header(&a, prog, lib_version, NCCL_HEADERS_VERSION)
        );
    }

    // The unique id of this colour's communicator.
    let nranks = comm_procs * local;
    let id = {
        let fail = |msg: String| -> i32 {
            eprintln!("{host}: {msg}");
            exit::USAGE
        };
        if comm_procs == 1 {
            match nccl.unique_id() {
                Ok(id) => id,
                Err(e) => return report_nccl_early(&nccl, &host, &e),
            }
        } else if get("NCCL_COMM_ID").is_some() {
            if colors.iter().any(|&c| c != colors[0]) {
                return fail("NCCL_TESTS_SPLIT with several colours needs a rendezvous file, not NCCL_COMM_ID".into());
            }
            match nccl.unique_id() {
                Ok(id) => id,
                Err(e) => return report_nccl_early(&nccl, &host, &e),
            }
        } else if let Some(base) = launch::uid_file(&get) {
            let path = launch::color_path(&base, color);
            if comm_proc == 0 {
                let id = match nccl.unique_id() {
                    Ok(id) => id,
                    Err(e) => return report_nccl_early(&nccl, &host, &e),
                };
                if let Err(e) = launch::publish_id(&path, &id.internal) {
                    eprintln!(
                        "{host}: cannot write the unique id to {}: {e}",
                        path.display()
                    );
                    return exit::INTERNAL;
                }
                id
            } else {
                let wait = if a.timeout > 0 {
                    Duration::from_secs(a.timeout as u64)
                } else {
                    Duration::from_secs(120)
                };
                match launch::wait_id(&path, wait) {
                    Ok(b) => UniqueId { internal: b },
                    Err(e) => {
                        eprintln!("{host}: {e}");
                        return exit::TIMEOUT;
                    }
                }
            }
        } else {
            return fail(format!(
                "{} processes ({}) but no way to share the unique id: set NCCL_COMM_ID=host:port or NCCL_TESTS_UID_FILE=<shared path>",
                pinfo.nprocs, pinfo.source
            ));
        }
    };

    // Device lines of this process's ranks.
    let pid = std::process::id();
    let base_dev = gpu0.unwrap_or((pinfo.local_rank * local) as i32);
    let device_lines: Vec<String> = (0..local)
        .map(|i| {
            let dev = base_dev + i as i32;
            let (pci, info) = match &cuda {
                Some(c) => (c.pci_id(dev), "CUDA device".to_string()),
                None => (
                    "0000:00:00".to_string(),
                    "host memory (no CUDA device)".to_string(),
                ),
            };
            report::device_line(
                comm_proc * local + i,
                color as i32,
                pid,
                &host,
                dev,
                &pci,
                &info,
            )
        })
        .collect();

    let ctx = Arc::new(Ctx {
        nccl: nccl.clone(),
        cuda,
        backend,
        args: a.clone(),
        coll,
        host: host.clone(),
        lib_version,
        comm_procs,
        comm_proc,
        nthreads,
        ngpus,
        nranks,
        is_main_proc,
        tsync: ThreadSync::new(nthreads),
        busy: Busy::new(nthreads + 1),
        comms: Mutex::new(Vec::new()),
        hang_rank,
        out: Mutex::new(json.as_ref().map(|(_, j)| j.clone())),
        device_lines,
        debug_wrong,
    });
    if a.timeout > 0 {
        spawn_watchdog(ctx.clone(), Duration::from_secs(a.timeout as u64));
    }

    // Communicators: all from the main thread in one group (default), or each thread its
    // own (-p 1).
    let mut pre: Vec<Option<Vec<Comm>>> = vec![None; nthreads];
    if a.parallel_init == 0 {
        let all = init_comms(
            &ctx,
            &id,
            (0..local).map(|i| comm_proc * local + i).collect(),
            base_dev,
            nthreads,
        );
        for (t, slot) in pre.iter_mut().enumerate() {
            *slot = Some(all[t * ngpus..(t + 1) * ngpus].to_vec());
        }
    }
    let mut handles = Vec::new();
    for (t, comms) in pre.into_iter().enumerate() {
        let ctx = ctx.clone();
        handles.push(std::thread::spawn(move || {
            thread_main(&ctx, t, comms, id, base_dev)
        }));
    }
    let mut outcome = None;
    for h in handles {
        match h.join() {
            Ok(o) => {
                if outcome.is_none() {
                    outcome = Some(o);
                }
            }
            Err(_) => die(exit::INTERNAL, &format!("{host}: a test thread panicked")),
        }
    }
    let Some((oob, avg_bw)) = outcome else {
        return exit::INTERNAL;
    };
    if is_main_proc {
        print!("{}", report::footer(oob, avg_bw, min_bw, prog));
        println!();
        if let Some((path, _)) = &json {
            let doc = ctx.out.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(doc) = doc {
                let errors: Vec<String> = {
                    let e = nccl.last_error();
                    if e.is_empty() {
                        vec![]
                    } else {
                        vec![e]
                    }
                };
                let v = doc.finish(oob, avg_bw, min_bw, &errors, &now_string());
                let text = serde_json::to_string(&v).unwrap_or_default();
                if let Err(e) = std::fs::write(path, text) {
                    eprintln!("{host}: cannot write {path}: {e}");
                }
            }
        }
    }
    let _ = std::io::stdout().flush();
    let bw_failed = min_bw.is_some_and(|m| avg_bw < m * 0.9);
    if oob > 0 || bw_failed {
        exit::FAILED
    } else {
        exit::OK
    }
}

fn report_nccl_early(nccl: &Nccl, host: &str, e: &NcclError) -> i32 {
    println!(
        "{host}: Test NCCL failure '{} / {}' ({})",
        nccl.error_string(e.code),
        nccl.last_error(),
        e.call
    );
    exit::NCCL
}

fn spawn_watchdog(ctx: Arc<Ctx>, limit: Duration) {
    let mut watch = crate::sync::BusyWatch::new();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(50));
        if watch.longest(&ctx.busy) > limit {
            TIMED_OUT.store(true, std::sync::atomic::Ordering::SeqCst);
            let comms: Vec<Comm> = ctx.comms.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let nccl = ctx.nccl.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for c in comms {
                    let _ = nccl.comm_abort(c);
                }
                let _ = tx.send(());
            });
            // Abort must not keep us from exiting.
            let _ = rx.recv_timeout(Duration::from_secs(5));
            die(
                exit::TIMEOUT,
                &format!(
                    "{}: Test timeout ({}s) {}:{}",
                    ctx.host,
                    limit.as_secs(),
                    file!(),
                    line!()
                ),
            );
        }
    });
}

/// Creates the communicators of `ranks`. Several ranks are initialised concurrently, one
/// helper thread per rank (each selecting its device first), rather than inside one
/// group: that works with NVIDIA's library and with libraries whose ncclCommInitRank
/// blocks even inside a group.
fn init_comms(
    ctx: &Ctx,
    id: &UniqueId,
    ranks: Vec<usize>,
    base_dev: i32,
    busy_slot: usize,
) -> Vec<Comm> {
    let _g = ctx.busy.enter(busy_slot);
    let init_one = |r: usize| -> Comm {
        if let Some(c) = &ctx.cuda {
            let local = r - ctx.comm_proc * ctx.nthreads * ctx.ngpus;
            cuda_try!(ctx, c.set_device(base_dev + local as i32));
        }
        nccl_try!(
            ctx,
            ctx.nccl.comm_init_rank(ctx.nranks as i32, *id, r as i32)
        )
    };
    let comms: Vec<Comm> = if ranks.len() == 1 {
        vec![init_one(ranks[0])]
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .iter()
                .map(|&r| s.spawn(move || init_one(r)))
                .collect();
            hs.into_iter()
                .map(|h| match h.join() {
                    Ok(c) => c,
                    Err(_) => die(
                        exit::INTERNAL,
                        &format!("{}: communicator init panicked", ctx.host),
                    ),
                })
                .collect()
        })
    };
    ctx.comms
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(comms.iter().copied());
    comms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_format() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00");
        assert_eq!(format_time(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(format_time(1_700_000_000), "2023-11-14 22:13:20");
    }
}
