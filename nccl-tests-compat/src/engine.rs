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
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(50));
        if ctx.busy.longest() > limit {
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

struct Thread<'a> {
    ctx: &'a Ctx,
    t: usize,
    ranks: Vec<Rank>,
    counts: Counts,
    dtype: DataType,
    bw_sum: f64,
    bw_count: usize,
    errors: u64,
    rep: u64,
}

fn thread_main(
    ctx: &Ctx,
    t: usize,
    comms: Option<Vec<Comm>>,
    id: UniqueId,
    base_dev: i32,
) -> (u64, f64) {
    let local = ctx.nthreads * ctx.ngpus;
    let first = ctx.comm_proc * local + t * ctx.ngpus;
    let comms = match comms {
        Some(c) => c,
        None => init_comms(ctx, &id, (first..first + ctx.ngpus).collect(), base_dev, t),
    };
    let a = &ctx.args;
    let buf_len = a.max_bytes as usize + (a.unalign.max(0) as usize) * 8 + 64;
    let mut ranks = Vec::new();
    for (i, comm) in comms.into_iter().enumerate() {
        let dev = base_dev + (t * ctx.ngpus + i) as i32;
        let stream = match &ctx.cuda {
            Some(c) => {
                cuda_try!(ctx, c.set_device(dev));
                if a.stream_null != 0 {
                    0
                } else {
                    cuda_try!(ctx, c.stream_create())
                }
            }
            None => 0,
        };
        let send = cuda_try!(ctx, Buffer::new(&ctx.backend, buf_len));
        let recv = cuda_try!(ctx, Buffer::new(&ctx.backend, buf_len));
        let small = cuda_try!(ctx, Buffer::new(&ctx.backend, 256 * ctx.nranks.max(1)));
        let mut reg = Vec::new();
        if a.local_register != 0 {
            reg.push(nccl_try!(
                ctx,
                ctx.nccl.register(comm, send.addr(), send.len())
            ));
            reg.push(nccl_try!(
                ctx,
                ctx.nccl.register(comm, recv.addr(), recv.len())
            ));
        }
        ranks.push(Rank {
            rank: first + i,
            comm,
            stream,
            send,
            recv,
            small,
            reg,
        });
    }
    let mut th = Thread {
        ctx,
        t,
        ranks,
        counts: Counts {
            send: 0,
            recv: 0,
            param: 0,
            send_inplace: 0,
            recv_inplace: 0,
        },
        dtype: DataType::Float,
        bw_sum: 0.0,
        bw_count: 0,
        errors: 0,
        rep: 0,
    };
    th.device_report();
    th.run_all();

    // Totals for the footer: out-of-bounds checks summed over ranks, mean busbw.
    let oob = th.reduce(th.errors as f64, Reduce::Sum) as u64;
    let avg_bw = if th.bw_count > 0 {
        th.bw_sum / th.bw_count as f64
    } else {
        0.0
    };
    for r in &th.ranks {
        for h in &r.reg {
            nccl_try!(ctx, ctx.nccl.deregister(r.comm, *h));
        }
    }
    {
        let _g = ctx.busy.enter(t);
        for r in th.ranks.drain(..) {
            if let (Some(c), true) = (&ctx.cuda, r.stream != 0) {
                let _ = c.stream_destroy(r.stream);
            }
            nccl_try!(ctx, ctx.nccl.comm_destroy(r.comm));
        }
    }
    (oob, avg_bw)
}

impl Thread<'_> {
    fn is_main(&self) -> bool {
        self.ctx.is_main_proc && self.t == 0
    }

    fn print(&self, s: &str) {
        if self.is_main() {
            print!("{s}");
            let _ = std::io::stdout().flush();
        }
    }

    /// Barrier + reduction over every rank of the communicator: in-process threads, or an
    /// NCCL AllReduce of one double when several processes take part.
    fn reduce(&mut self, v: f64, how: Reduce) -> f64 {
        let ctx = self.ctx;
        let _g = ctx.busy.enter(self.t);
        if ctx.comm_procs == 1 {
            return ctx.tsync.reduce(self.t, v, how);
        }
        let (op, contrib) = match how {
            Reduce::Rank0 => (0, if self.ranks[0].rank == 0 { v } else { 0.0 }),
            Reduce::Avg | Reduce::Sum => (0, v),
            Reduce::Min => (3, v),
            Reduce::Max => (2, v),
        };
        let grouped = self.ranks.len() > 1;
        if grouped {
            nccl_try!(ctx, ctx.nccl.group_start());
        }
        for r in &mut self.ranks {
            let b = if how == Reduce::Rank0 && r.rank != 0 {
                0.0
            } else {
                contrib
            };
            cuda_try!(ctx, r.small.write(0, &b.to_le_bytes()));
            let call = Call {
                kind: CallKind::AllReduce,
                send: r.small.addr(),
                recv: r.small.addr(),
                count: 1,
                dtype: DataType::Double.nccl(),
                op,
                root: -1,
            };
            nccl_try!(ctx, ctx.nccl.run(&call, r.comm, r.stream));
        }
        if grouped {
            nccl_try!(ctx, ctx.nccl.group_end());
        }
        self.complete();
        let bytes = cuda_try!(ctx, self.ranks[0].small.read(0, 8));
        let mut arr = [0u8; 8];
        arr.copy_from_slice(&bytes);
        let x = f64::from_le_bytes(arr);
        if how == Reduce::Avg {
            x / ctx.nranks as f64
        } else {
            x
        }
    }

    fn barrier(&mut self) {
        self.reduce(0.0, Reduce::Sum);
    }

    fn complete(&self) {
        let ctx = self.ctx;
        if let Some(c) = &ctx.cuda {
            let _g = ctx.busy.enter(self.t);
            for r in &self.ranks {
                cuda_try!(ctx, c.stream_sync(r.stream));
            }
        }
    }

    fn device_report(&mut self) {
        let ctx = self.ctx;
        let lines: Vec<String> = if ctx.comm_procs == 1 {
            ctx.device_lines.clone()
        } else {
            // AllGather fixed 256-byte lines over all ranks.
            let _g = ctx.busy.enter(self.t);
            let grouped = self.ranks.len() > 1;
            if grouped {
                nccl_try!(ctx, ctx.nccl.group_start());
            }
            let local0 = ctx.comm_proc * ctx.nthreads * ctx.ngpus;
            for r in &mut self.ranks {
                let line = &ctx.device_lines[r.rank - local0];
                let mut fixed = [0u8; 256];
                let n = line.len().min(255);
                fixed[..n].copy_from_slice(&line.as_bytes()[..n]);
                cuda_try!(ctx, r.small.write(r.rank * 256, &fixed));
                let call = Call {
                    kind: CallKind::AllGather,
                    send: r.small.addr() + r.rank * 256,
                    recv: r.small.addr(),
                    count: 256,
                    dtype: DataType::Uint8.nccl(),
                    op: 0,
                    root: -1,
                };
                nccl_try!(ctx, ctx.nccl.run(&call, r.comm, r.stream));
            }
            if grouped {
                nccl_try!(ctx, ctx.nccl.group_end());
            }
            self.complete();
            let all = cuda_try!(ctx, self.ranks[0].small.read(0, 256 * ctx.nranks));
            all.chunks(256)
                .map(|c| {
                    let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
                    String::from_utf8_lossy(&c[..end]).into_owned()
                })
                .collect()
        };
        if self.is_main() {
            let mut s = String::from("# Using devices\n");
            for l in &lines {
                s += l;
            }
            if ctx.args.memory != 0 {
                let b = ctx.args.max_bytes;
                s += &report::memory_line(&[("Send", b), ("Recv", b)]);
            }
            self.print(&s);
            if let Some(j) = ctx.out.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                j.set_config(&ctx.args, &lines);
            }
        }
    }

    fn run_all(&mut self) {
        let ctx = self.ctx;
        let a = &ctx.args;
        let v = ctx.lib_version;
        let types: Vec<DataType> = match a.dtype {
            Choice::One(t) => vec![t],
            Choice::All => ALL_TYPES
                .iter()
                .copied()
                .filter(|t| match t {
                    DataType::Bfloat16 => v >= 21000,
                    DataType::F8e4m3 | DataType::F8e5m2 => v >= 22400,
                    _ => true,
                })
                .collect(),
        };
        let ops: Vec<Option<RedOp>> = if ctx.coll.reduces() {
            match a.op {
                Choice::One(o) => vec![Some(o)],
                Choice::All => ALL_OPS
                    .iter()
                    .copied()
                    .filter(|o| match o {
                        RedOp::Avg => v >= 21000,
                        RedOp::MulSum => v >= 21100 && ctx.nccl.has("ncclRedOpCreatePreMulSum"),
                        _ => true,
                    })
                    .map(Some)
                    .collect(),
            }
        } else {
            vec![None]
        };
        let roots: Vec<i64> = if ctx.coll.rooted() {
            match a.root {
                Choice::One(r) => vec![r],
                Choice::All => (0..ctx.nranks as i64).collect(),
            }
        } else {
            vec![-1]
        };
        self.print(&report::table_header(a));
        if ctx.coll == Coll::HyperCube && !ctx.nranks.is_power_of_two() {
            self.print(&format!(
                "nRanks {} is not a power of 2, skipping\n",
                ctx.nranks
            ));
            return;
        }
        for &t in &types {
            for &op in &ops {
                for &root in &roots {
                    self.time_test(t, op, root);
                }
            }
        }
    }

    fn setup(&mut self, bytes: u64) {
        let elt = self.dtype.size();
        self.counts = self
            .ctx
            .coll
            .counts(bytes as usize / elt, self.ctx.nranks, elt);
    }

    fn time_test(&mut self, dtype: DataType, op: Option<RedOp>, root: i64) {
        let ctx = self.ctx;
        let a = &ctx.args;
        self.dtype = dtype;
        if let Some(h) = ctx.hang_rank {
            if self.ranks.iter().any(|r| r.rank == h) {
                // Test hook: never join the first collective.
                let _g = ctx.busy.enter(self.t);
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        self.barrier();
        for bytes in [a.max_bytes, a.min_bytes] {
            self.setup(bytes);
            for iter in 0..a.warmup_iters {
                self.start_coll(op, root, false, iter as usize);
            }
            self.complete();
        }
        let sizes = args::sizes(a);
        let mut cycle = 0i64;
        loop {
            for &size in &sizes {
                self.setup(size);
                let elt = dtype.size() as u64;
                let shown = (self.counts.send.max(self.counts.recv) as u64) * elt;
                let op_name = op.map(|o| o.name()).unwrap_or("none");
                let mut line = report::row_prefix(
                    shown,
                    self.counts.param as u64,
                    dtype.name(),
                    op_name,
                    root,
                );
                self.print(&line);
                let (oop, oop_it) = self.bench(op, root, false);
                let mut part = report::row_half(&oop);
                if let Some(s) = &oop_it {
                    part += &report::row_iter_stats(s);
                }
                self.print(&part);
                line += &part;
                let (ip, ip_it) = self.bench(op, root, true);
                let mut part = report::row_half(&ip);
                if let Some(s) = &ip_it {
                    part += &report::row_iter_stats(s);
                }
                if a.report_timestamps != 0 {
                    part += &format!("{:>21}", now_string());
                }
                part.push('\n');
                self.print(&part);
                if self.is_main() {
                    if let Some(j) = ctx.out.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                        let its = oop_it.zip(ip_it);
                        j.add_result(
                            shown,
                            self.counts.param as u64,
                            dtype.name(),
                            op_name,
                            root,
                            a.report_cputime != 0,
                            &oop,
                            &ip,
                            its,
                        );
                    }
                }
            }
            cycle += 1;
            if a.run_cycles != 0 && cycle >= a.run_cycles {
                break;
            }
        }
    }

    /// Launches one operation on every rank of this thread (iteration `iter` picks the
    /// buffer offset).
    fn start_coll(&mut self, op: Option<RedOp>, root: i64, in_place: bool, iter: usize) {
        let ctx = self.ctx;
        let _g = ctx.busy.enter(self.t);
        let a = &ctx.args;
        let elt = self.dtype.size();
        let c = self.counts;
        let total = c.send.max(c.recv) * elt;
        let steps = (a.max_bytes as usize)
            .checked_div(total)
            .unwrap_or(1)
            .max(1);
        let shift = total * (iter % steps) + a.unalign.max(0) as usize * elt;
        let n = ctx.nranks;
        let mut phases: Vec<Vec<Vec<Call>>> = Vec::new();
        let mut created_ops: Vec<(Comm, i32)> = Vec::new();
        for r in &mut self.ranks {
            let recv = r.recv.addr() + shift;
            let send = r.send.addr() + shift;
            let (s, d) = if in_place {
                (
                    recv + c.send_inplace * elt * r.rank,
                    recv + c.recv_inplace * elt * r.rank,
                )
            } else {
                (send, recv)
            };
            let raw_op = match op {
                Some(RedOp::MulSum) => {
                    let p = GenParams {
                        dtype: self.dtype,
                        op,
                        nranks: n,
                        seed: 0,
                    };
                    let mut scalar = [0u8; 8];
                    self.dtype.encode_int(p.scalar(r.rank), &mut scalar);
                    let o = nccl_try!(
                        ctx,
                        ctx.nccl
                            .create_premulsum(&mut scalar, self.dtype.nccl(), r.comm)
                    );
                    created_ops.push((r.comm, o));
                    o
                }
                Some(o) => o.nccl(),
                None => 0,
            };
            if let Some((src, dst, len)) = ctx.coll.local_copy(s, d, c.param, elt, r.rank) {
                // Hypercube first puts the rank's own block in place (a host-side copy).
                let rb = r.recv.addr();
                if in_place {
                    cuda_try!(ctx, r.recv.copy_within(src - rb, dst - rb, len));
                } else {
                    let data = cuda_try!(ctx, r.send.read(src - r.send.addr(), len));
                    cuda_try!(ctx, r.recv.write(dst - rb, &data));
                }
            }
            phases.push(
                ctx.coll
                    .calls(s, d, c.param, self.dtype, raw_op, root as i32, r.rank, n),
            );
        }
        let nph = phases.first().map(|p| p.len()).unwrap_or(0);
        #[allow(clippy::needless_range_loop)]
        for k in 0..nph {
            let grouped = self.ranks.len() > 1 || phases[0][k].len() > 1;
            if grouped {
                nccl_try!(ctx, ctx.nccl.group_start());
            }
            for (i, r) in self.ranks.iter().enumerate() {
                for call in &phases[i][k] {
                    nccl_try!(ctx, ctx.nccl.run(call, r.comm, r.stream));
                }
            }
            if grouped {
                nccl_try!(ctx, ctx.nccl.group_end());
            }
        }
        for (comm, o) in created_ops {
            nccl_try!(ctx, ctx.nccl.destroy_redop(o, comm));
        }
        drop(_g);
        if a.blocking != 0 && a.blocking != 3 {
            self.complete();
            if a.blocking == 1 {
                self.barrier();
            }
        }
    }

    /// Writes fresh inputs for a check (or the timed runs).
    fn init_data(&mut self, op: Option<RedOp>, seed: u64, in_place: bool) {
        let ctx = self.ctx;
        let elt = self.dtype.size();
        let c = self.counts;
        let p = GenParams {
            dtype: self.dtype,
            op,
            nranks: ctx.nranks,
            seed,
        };
        let shift = ctx.args.unalign.max(0) as usize * elt;
        for r in &mut self.ranks {
            let mut data = vec![0u8; c.send * elt];
            p.fill(r.rank, 0, &mut data);
            if in_place {
                cuda_try!(
                    ctx,
                    r.recv.write(shift + c.send_inplace * elt * r.rank, &data)
                );
            } else {
                cuda_try!(ctx, r.send.write(shift, &data));
            }
        }
    }

    fn check_data(&mut self, op: Option<RedOp>, root: i64, seed: u64, in_place: bool) -> u64 {
        let ctx = self.ctx;
        let elt = self.dtype.size();
        let c = self.counts;
        let p = GenParams {
            dtype: self.dtype,
            op,
            nranks: ctx.nranks,
            seed,
        };
        let shift = ctx.args.unalign.max(0) as usize * elt;
        let mut wrong = 0u64;
        for r in &self.ranks {
            let off = shift
                + if in_place {
                    c.recv_inplace * elt * r.rank
                } else {
                    0
                };
            let got = cuda_try!(ctx, r.recv.read(off, c.recv * elt));
            let mut w = 0u64;
            for j in 0..c.recv {
                if let Some(e) = ctx.coll.expected(&p, &c, r.rank, root.max(0) as usize, j) {
                    let g = &got[j * elt..(j + 1) * elt];
                    if !p.matches(e, g) {
                        if w < ctx.debug_wrong {
                            eprintln!(
                                "{}: rank {} {} {} element {j}: expected {e:?}, got {} (inputs {:?})",
                                ctx.host,
                                r.rank,
                                self.dtype.name(),
                                op.map(|o| o.name()).unwrap_or("none"),
                                self.dtype.decode(g),
                                (0..ctx.nranks).map(|q| p.input(q, j)).collect::<Vec<_>>()
                            );
                        }
                        w += 1;
                    }
                }
            }
            if w > 0 {
                self.errors += 1;
            }
            wrong += w;
        }
        wrong
    }

    fn bench(&mut self, op: Option<RedOp>, root: i64, in_place: bool) -> (Half, Option<IterStats>) {
        let ctx = self.ctx;
        let a = &ctx.args;
        if a.check > 0 {
            self.init_data(op, 99, in_place);
        }
        self.start_coll(op, root, in_place, 0);
        self.complete();
        self.barrier();

        let per_iter = a.per_iter_timing != 0;
        let mut iter_times = Vec::new();
        let t0 = Instant::now();
        for iter in 0..a.iters as usize {
            let ti = Instant::now();
            let agg = a.agg_iters as usize;
            if agg > 1 {
                let _g = ctx.busy.enter(self.t);
                nccl_try!(ctx, ctx.nccl.group_start());
            }
            for k in 0..agg {
                self.start_coll(op, root, in_place, iter * agg + k);
            }
            if agg > 1 {
                let _g = ctx.busy.enter(self.t);
                nccl_try!(ctx, ctx.nccl.group_end());
            }
            if per_iter || a.blocking == 3 {
                self.complete();
                if per_iter {
                    iter_times.push(ti.elapsed().as_secs_f64() * 1e6 / agg as f64);
                }
                if a.blocking == 3 {
                    self.barrier();
                }
            }
        }
        let launches = (a.iters * a.agg_iters) as f64;
        let cpu = t0.elapsed().as_secs_f64() / launches;
        self.complete();
        let mut delta = t0.elapsed().as_secs_f64() / launches;
        let how = Reduce::from_average(a.average);
        delta = self.reduce(delta, how);
        let cpu = self.reduce(cpu, how);
        let elt = self.dtype.size();
        let (alg, bus) = ctx
            .coll
            .bandwidth(self.counts.param, elt, delta, ctx.nranks);
        let stats = if per_iter {
            let skip = (a.per_iter_skip.max(0) as usize).min(iter_times.len().saturating_sub(1));
            IterStats::of(&iter_times[skip..]).map(|s| {
                // i_* columns: the maximum over ranks of each statistic.
                let mut s = s;
                s.min = self.reduce(s.min, Reduce::Max);
                s.max = self.reduce(s.max, Reduce::Max);
                s.p99 = self.reduce(s.p99, Reduce::Max);
                s.avg = self.reduce(s.avg, Reduce::Max);
                s.stdev = self.reduce(s.stdev, Reduce::Max);
                s
            })
        } else {
            None
        };
        self.barrier();

        let mut wrong = 0u64;
        for _ in 0..a.check {
            self.rep += 1;
            let seed = self.rep;
            self.init_data(op, seed, in_place);
            self.start_coll(op, root, in_place, 0);
            self.complete();
            let local = self.check_data(op, root, seed, in_place);
            wrong = self.reduce(local as f64, Reduce::Sum) as u64;
            if wrong > 0 {
                break;
            }
        }
        let time_us = if a.report_cputime != 0 { cpu } else { delta } * 1e6;
        self.bw_sum += bus;
        self.bw_count += 1;
        let h = Half {
            time_us,
            algbw: alg,
            busbw: bus,
            wrong: (a.check > 0).then_some(wrong),
        };
        (h, stats)
    }
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
