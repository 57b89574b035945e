//! The README's main job (until the full `ccld demo` lands): N ranks run AllReduce over a
//! range of sizes on the host backend, verify every result, and print time, algbw and busbw
//! next to the memcpy bandwidth of this machine measured in the same run.
//!
//! ```text
//! cargo run --release -p ccl-core --example allreduce -- --ranks 8
//! cargo run --release -p ccl-core --example allreduce -- --ranks 4 --procs -b 1M -e 64M
//! ```
//! With `--procs` every rank is a separate process (the shared-memory transport between
//! processes); otherwise ranks are threads of this process (`ncclCommInitAll`).

use std::process::{Command, ExitCode};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use ccl_core::bootstrap::{get_unique_id, UniqueId, UNIQUE_ID_BYTES};
use ccl_core::{enqueue, CollArgs, Comm, CommConfig, DataType, Result};
use ccl_optype::CollKind;

const ENV_RANK: &str = "CCL_EXAMPLE_RANK";
const ENV_UID: &str = "CCL_EXAMPLE_UID";

#[derive(Clone, Debug)]
struct Opts {
    ranks: usize,
    procs: bool,
    min_bytes: usize,
    max_bytes: usize,
    iters: usize,
    warmup: usize,
}

/// A byte count with an optional K/M/G (1024-based) suffix.
fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|v| v.checked_mul(1 << shift))
        .ok_or_else(|| format!("size {s:?} is not a byte count (digits, optional K/M/G)"))
}

fn usage() -> String {
    "usage: allreduce [--ranks N] [--procs] [-b MINBYTES] [-e MAXBYTES] [-n ITERS] [-w WARMUP]\n\
     sizes take K/M/G suffixes; sizes double from -b to -e"
        .to_string()
}

fn parse_args() -> std::result::Result<Opts, String> {
    let mut o = Opts {
        ranks: 8,
        procs: false,
        min_bytes: 8,
        max_bytes: 64 << 20,
        iters: 10,
        warmup: 2,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--ranks" => {
                o.ranks = val("--ranks")?
                    .parse()
                    .map_err(|e| format!("--ranks: {e}"))?
            }
            "--procs" => o.procs = true,
            "-b" => o.min_bytes = parse_size(&val("-b")?)?,
            "-e" => o.max_bytes = parse_size(&val("-e")?)?,
            "-n" => o.iters = val("-n")?.parse().map_err(|e| format!("-n: {e}"))?,
            "-w" => o.warmup = val("-w")?.parse().map_err(|e| format!("-w: {e}"))?,
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    if o.ranks == 0 || o.ranks > 64 {
        return Err("--ranks must be 1..=64".into());
    }
    if o.min_bytes < 4 || o.min_bytes > o.max_bytes || o.iters == 0 {
        return Err("need 4 <= -b <= -e and -n >= 1".into());
    }
    Ok(o)
}

fn sizes(o: &Opts) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = o.min_bytes;
    while s <= o.max_bytes {
        v.push(s / 4 * 4);
        s *= 2;
    }
    v
}

fn allreduce(comm: &Arc<Comm>, send: &[f32], recv: &mut [f32]) -> Result<()> {
    enqueue(
        comm,
        CollArgs {
            kind: CollKind::AllReduce,
            sendbuf: send.as_ptr() as usize,
            recvbuf: recv.as_mut_ptr() as usize,
            count: send.len(),
            dtype: DataType::Float32 as i32,
            op: 0, // ncclSum
            root: -1,
            stream: 0,
        },
    )
}

/// GB/s of `copy_from_slice` for `bytes`, best of a few repetitions.
fn memcpy_gbps(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let reps = (256 << 20) / bytes.max(1) + 1;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..reps.min(1000) {
            dst.copy_from_slice(std::hint::black_box(&src));
        }
        best = best.min(t.elapsed().as_secs_f64() / reps.min(1000) as f64);
    }
    std::hint::black_box(&dst);
    bytes as f64 / best / 1e9
}

/// One rank's whole run; rank 0 returns the rows it measured. `sync` is a barrier between
/// ranks (a thread barrier, or a 1-element AllReduce across processes).
fn run_rank(
    comm: &Arc<Comm>,
    o: &Opts,
    sync: &dyn Fn() -> Result<()>,
) -> Result<Vec<(usize, f64, usize)>> {
    let rank = comm.rank() as usize;
    let n = comm.nranks() as usize;
    let mut rows = Vec::new();
    for bytes in sizes(o) {
        let count = bytes / 4;
        // Inputs are small integers, so the float sum is exact in any order.
        let send: Vec<f32> = (0..count).map(|i| ((i + rank) % 7) as f32).collect();
        let mut recv = vec![0f32; count];
        for _ in 0..o.warmup {
            allreduce(comm, &send, &mut recv)?;
        }
        sync()?;
        let t = Instant::now();
        for _ in 0..o.iters {
            allreduce(comm, &send, &mut recv)?;
        }
        let secs = t.elapsed().as_secs_f64() / o.iters as f64;
        let wrong = recv
            .iter()
            .enumerate()
            .filter(|(i, v)| **v != (0..n).map(|r| ((i + r) % 7) as f32).sum::<f32>())
            .count();
        rows.push((bytes, secs, wrong));
    }
    Ok(rows)
}

fn print_rows(n: usize, rows: &[(usize, f64, usize)]) -> bool {
    println!(
        "# {:>10}  {:>9}  {:>8}  {:>8}  {:>10}  {:>8}  {:>6}",
        "size(B)", "time(us)", "algbw", "busbw", "memcpy", "bus/mem", "#wrong"
    );
    println!(
        "# {:>10}  {:>9}  {:>8}  {:>8}  {:>10}  {:>8}  {:>6}",
        "", "", "(GB/s)", "(GB/s)", "(GB/s)", "", ""
    );
    let mut ok = true;
    for &(bytes, secs, wrong) in rows {
        let algbw = bytes as f64 / secs / 1e9;
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        let mem = memcpy_gbps(bytes);
        println!(
            "  {bytes:>10}  {:>9.1}  {algbw:>8.3}  {busbw:>8.3}  {mem:>10.3}  {:>8.3}  {wrong:>6}",
            secs * 1e6,
            busbw / mem
        );
        ok &= wrong == 0;
    }
    ok
}

fn threads_main(o: &Opts) -> Result<bool> {
    let comms = Comm::init_all(o.ranks as i32, None)?;
    let barrier = Arc::new(Barrier::new(o.ranks));
    let handles: Vec<_> = comms
        .iter()
        .cloned()
        .map(|comm| {
            let o = o.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let sync = || {
                    barrier.wait();
                    Ok(())
                };
                let rows = run_rank(&comm, &o, &sync);
                comm.destroy().and(rows)
            })
        })
        .collect();
    let mut first = None;
    for h in handles {
        let rows = h
            .join()
            .map_err(|_| ccl_core::CclError::Internal("rank thread panicked".into()))??;
        first.get_or_insert(rows);
    }
    Ok(print_rows(o.ranks, &first.unwrap_or_default()))
}

fn hex(id: &UniqueId) -> String {
    id.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<UniqueId> {
    let mut id = [0u8; UNIQUE_ID_BYTES];
    if s.len() != 2 * UNIQUE_ID_BYTES {
        return None;
    }
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(UniqueId(id))
}

fn proc_rank_main(o: &Opts, rank: usize, uid: &str) -> Result<bool> {
    let id = unhex(uid).ok_or_else(|| ccl_core::CclError::arg(format!("bad {ENV_UID}")))?;
    let comm = Comm::init_rank(o.ranks as i32, id, rank as i32, CommConfig::default())?;
    let sync = || {
        let one = [0f32];
        let mut out = [0f32];
        allreduce(&comm, &one, &mut out)
    };
    let rows = run_rank(&comm, o, &sync)?;
    comm.destroy()?;
    Ok(if rank == 0 {
        print_rows(o.ranks, &rows)
    } else {
        rows.iter().all(|r| r.2 == 0)
    })
}

fn procs_main(o: &Opts) -> std::result::Result<bool, String> {
    let id = get_unique_id().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    for r in 0..o.ranks {
        let child = Command::new(&exe)
            .args(std::env::args().skip(1))
            .env(ENV_RANK, r.to_string())
            .env(ENV_UID, hex(&id))
            .spawn()
            .map_err(|e| format!("spawning rank {r}: {e}"))?;
        children.push(child);
    }
    let mut ok = true;
    for (r, mut c) in children.into_iter().enumerate() {
        let st = c.wait().map_err(|e| format!("waiting for rank {r}: {e}"))?;
        if !st.success() {
            eprintln!("rank {r} failed: {st}");
            ok = false;
        }
    }
    Ok(ok)
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let mode = if o.procs { "processes" } else { "threads" };
    let result = match (std::env::var(ENV_RANK), std::env::var(ENV_UID)) {
        (Ok(rank), Ok(uid)) => match rank.parse() {
            Ok(rank) => proc_rank_main(&o, rank, &uid).map_err(|e| format!("rank {rank}: {e}")),
            Err(_) => Err(format!("bad {ENV_RANK}")),
        },
        _ => {
            println!(
                "# AllReduce float sum, {} ranks as {mode}, host backend, {} iters",
                o.ranks, o.iters
            );
            if o.procs {
                procs_main(&o)
            } else {
                threads_main(&o).map_err(|e| e.to_string())
            }
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("FAILED: wrong results");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
