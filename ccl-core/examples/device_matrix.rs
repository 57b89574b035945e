//! Correctness matrix of the device runtime (GPU suite, `scripts/gpu-suite.sh`; CI runs
//! `--quick` on the CPU emulator, `CCLD_DEVICE_EMULATION=1`).
//!
//! Every collective (AllReduce, Reduce, ReduceScatter with Sum/Max/Avg; AllGather,
//! Broadcast, AlltoAll; a Send/Recv ring) x Float32/Int32 x several counts (0, counts that
//! are not multiples of the rank count, ~4 MiB) on 1, 2, 4 and 8 ranks as threads of this
//! process, each rank with its own communicator (`Comm::init_rank`), stream and buffers
//! allocated through the runtime's `DeviceApi` (the same code on CUDA and the emulator);
//! results copied back and compared with a host reference bit for bit, probe counters
//! compared with `group::expected_counts`. Then AllReduce bus bandwidth per size for 2, 4
//! and 8 ranks (meaningless on the emulator; the output says so).
//!
//! `--procs N`: N processes (this program re-executes itself as the ranks, the unique id
//! in the environment), one rank each, all on device 0: exercises the transport between
//! processes, CUDA IPC on a GPU, host-staged shared memory with `NCCL_P2P_DISABLE=1` or on
//! the emulator (each process has its own emulated device; the FIFOs are shared memory).
//! After the children exited, no staging segment of theirs may remain in `/dev/shm`.
//!
//! Output: one `PASS`/`FAIL` line per case, `BW` lines, `# summary`. Exit status: 0 all
//! passed, 1 a failure, 2 bad usage or no device backend.
//!
//! `--proto LL|Simple|auto`: sets `NCCL_PROTO` for every communicator (children of
//! `--procs` inherit it); `auto` unsets it (LL for small operations, Simple for large
//! ones); without the flag the environment's `NCCL_PROTO` is used as it is.
//!
//! Usage: device_matrix [--quick] [--procs N] [--ranks 1,2,4,8] [--no-bw]
//!        [--proto LL|Simple|auto]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/device_support/mod.rs"]
mod device_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::device::api::DeviceApi;
use ccl_core::device::runtime::device_api;
use ccl_core::{Comm, CommConfig, UniqueId};
use common::{hex, unhex};
use device_support::{matrix_cases, run_cases, run_threads, CaseErr, DevCase, DevRank};

/// Environment of a child rank (`--procs`).
const ENV_RANK: &str = "CCLD_MATRIX_RANK";
const ENV_NRANKS: &str = "CCLD_MATRIX_NRANKS";
const ENV_UID: &str = "CCLD_MATRIX_UID";
/// Exit status of a child whose communicator could not be created.
const CHILD_INIT_FAILED: i32 = 3;

/// How long one case may take before the rank aborts its communicator.
const CASE_LIMIT: Duration = Duration::from_secs(60);
/// How long the parent waits for the children of `--procs`.
const PROCS_LIMIT: Duration = Duration::from_secs(540);

struct Opts {
    quick: bool,
    procs: usize,
    ranks: Vec<usize>,
    bw: bool,
    /// `--proto`: `Some(None)` = auto (unset), `Some(Some(p))` = NCCL_PROTO=p.
    proto: Option<Option<&'static str>>,
    /// `--counts`: the element counts of the cases (default: by `--quick`).
    counts: Option<Vec<usize>>,
}

fn usage(msg: &str) -> ! {
    eprintln!("device_matrix: {msg}");
    eprintln!(
        "usage: device_matrix [--quick] [--procs N] [--ranks 1,2,4,8] [--no-bw] \
         [--proto LL|Simple|auto] [--counts 0,7,999]"
    );
    std::process::exit(2);
}

fn parse_args() -> Opts {
    let mut o = Opts {
        quick: false,
        procs: 0,
        ranks: vec![1, 2, 4, 8],
        bw: true,
        proto: None,
        counts: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--no-bw" => o.bw = false,
            "--procs" => {
                o.procs = match args.next().and_then(|v| v.parse().ok()) {
                    Some(n) if n >= 2 => n,
                    _ => usage("--procs takes a number of processes >= 2"),
                }
            }
            "--proto" => {
                let v = args.next().unwrap_or_default();
                o.proto = Some(match v.to_ascii_lowercase().as_str() {
                    "ll" => Some("LL"),
                    "simple" => Some("Simple"),
                    "auto" => None,
                    _ => usage(&format!("--proto {v:?}: LL, Simple or auto")),
                });
            }
            "--ranks" => {
                let v = args.next().unwrap_or_default();
                let r: Option<Vec<usize>> = v
                    .split(',')
                    .map(|x| x.trim().parse().ok().filter(|n| *n >= 1))
                    .collect();
                o.ranks = match r {
                    Some(r) if !r.is_empty() => r,
                    _ => usage(&format!(
                        "--ranks {v:?}: a comma-separated list of counts >= 1"
                    )),
                }
            }
            "--counts" => {
                let v = args.next().unwrap_or_default();
                let c: Option<Vec<usize>> = v.split(',').map(|x| x.trim().parse().ok()).collect();
                o.counts = match c {
                    Some(c) if !c.is_empty() => Some(c),
                    _ => usage(&format!(
                        "--counts {v:?}: a comma-separated list of element counts"
                    )),
                }
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    if o.counts.is_some() && o.procs > 0 {
        usage("--counts applies to ranks as threads, not to --procs");
    }
    o
}

/// The cases, in the order every rank runs them.
fn cases(quick: bool) -> Vec<DevCase> {
    if quick {
        matrix_cases(&[0, 7, 999])
    } else {
        // 0, not multiples of 2/4/8, and 1 Mi elements (4 MiB of float32/int32).
        matrix_cases(&[0, 1, 7, 999, 65_537, 1 << 20])
    }
}

fn pick_api() -> (Arc<dyn DeviceApi>, i32) {
    match device_api(None) {
        Ok(Ok(v)) => v,
        Ok(Err(why)) => {
            println!("# {why}");
            println!(
                "SKIP: no device backend (set CCLD_DEVICE_EMULATION=1 to use the CPU emulator)"
            );
            std::process::exit(2);
        }
        Err(e) => usage(&e.to_string()),
    }
}

fn main() {
    // 8 ranks as threads need 16 hardware queues (see ccl_core::device::queues).
    ccl_core::device::queues::most_queues_for_this_program();
    if std::env::var_os(ENV_RANK).is_some() {
        child_main();
    }
    let o = parse_args();
    // Before any communicator or thread exists.
    match o.proto {
        Some(Some(p)) => std::env::set_var("NCCL_PROTO", p),
        Some(None) => std::env::remove_var("NCCL_PROTO"),
        None => {}
    }
    println!(
        "# protocol: NCCL_PROTO={}",
        std::env::var("NCCL_PROTO")
            .unwrap_or_else(|_| "(unset: auto, LL up to 64 KiB per rank)".into())
    );
    let (api, device) = pick_api();
    let emulated = api.is_emulated();
    println!(
        "# device runtime: {} on device {device}{}",
        api.name(),
        if emulated {
            " (CPU emulator: correctness only, timings mean nothing)"
        } else {
            ""
        }
    );
    let cases = match &o.counts {
        Some(c) => matrix_cases(c),
        None => cases(o.quick),
    };
    let (mut passed, mut failed) = (0usize, 0usize);
    if o.procs > 0 {
        procs_main(&o, &cases, &mut passed, &mut failed);
    } else {
        threads_main(&o, &api, device, &cases, &mut passed, &mut failed);
    }
    println!("# summary: {passed} passed, {failed} failed");
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

fn threads_main(
    o: &Opts,
    api: &Arc<dyn DeviceApi>,
    device: i32,
    cases: &[DevCase],
    passed: &mut usize,
    failed: &mut usize,
) {
    let emulated = api.is_emulated();
    let (bw_counts, iters): (Vec<usize>, usize) = if !o.bw {
        (Vec::new(), 0)
    } else if o.quick || emulated {
        (vec![1 << 14], 3)
    } else {
        // 1 MiB, 16 MiB, 64 MiB, 256 MiB of float32.
        (vec![1 << 18, 1 << 22, 1 << 24, 1 << 26], 20)
    };
    let mut bw_lines = Vec::new();
    for &n in &o.ranks {
        let t0 = Instant::now();
        let bw_here: &[usize] = if n >= 2 { &bw_counts } else { &[] };
        let rep = match run_threads(
            Arc::clone(api),
            device,
            n,
            cases,
            bw_here,
            iters,
            CASE_LIMIT,
        ) {
            Ok(r) => r,
            Err(e) => {
                println!("FAIL ranks {n}: {e}");
                *failed += 1;
                continue;
            }
        };
        for (c, r) in cases.iter().zip(&rep.cases) {
            match r {
                Ok(()) => {
                    *passed += 1;
                    println!("PASS threads ranks {n} {}", c.name());
                }
                Err(e) => {
                    *failed += 1;
                    println!("FAIL threads ranks {n} {}: {e}", c.name());
                }
            }
        }
        println!(
            "# ranks {n}: {} cases in {:.2} s",
            cases.len(),
            t0.elapsed().as_secs_f64()
        );
        for (count, t) in rep.bw {
            let bytes = count * 4;
            match t {
                Ok(t) => {
                    let per = t.as_secs_f64() / iters as f64;
                    let algbw = bytes as f64 / per / 1e9;
                    let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
                    bw_lines.push(format!(
                        "BW allreduce ranks {n} bytes {bytes} time_us {:.1} algbw {algbw:.2} busbw {busbw:.2} GB/s{}",
                        per * 1e6,
                        if emulated { " (emulated: meaningless)" } else { "" }
                    ));
                }
                Err(e) => {
                    *failed += 1;
                    bw_lines.push(format!("FAIL BW allreduce ranks {n} bytes {bytes}: {e}"));
                }
            }
        }
    }
    if !bw_lines.is_empty() {
        println!(
            "# AllReduce float32 sum, {iters} back-to-back operations per size, time per operation; busbw = algbw x 2(n-1)/n{}",
            if emulated {
                " -- EMULATED DEVICE: these figures are meaningless"
            } else {
                ""
            }
        );
        for l in bw_lines {
            println!("{l}");
        }
    }
}

/// Parent of `--procs N`: starts N children (this program, rank in the environment) and
/// merges their per-case results.
fn procs_main(o: &Opts, cases: &[DevCase], passed: &mut usize, failed: &mut usize) {
    let n = o.procs;
    let id = match ccl_core::bootstrap::get_unique_id() {
        Ok(id) => id,
        Err(e) => {
            println!("FAIL procs {n}: unique id: {e}");
            *failed += 1;
            return;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            println!("FAIL procs {n}: own executable: {e}");
            *failed += 1;
            return;
        }
    };
    let mut children = Vec::new();
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        if o.quick {
            cmd.arg("--quick");
        }
        cmd.env(ENV_RANK, r.to_string())
            .env(ENV_NRANKS, n.to_string())
            .env(ENV_UID, hex(&id.0))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                println!("FAIL procs {n}: starting rank {r}: {e}");
                *failed += 1;
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return;
            }
        }
    }
    // Readers: one thread per child collects its lines.
    let (tx, rx) = std::sync::mpsc::channel::<(usize, Option<String>)>();
    for (r, c) in children.iter_mut().enumerate() {
        if let Some(out) = c.stdout.take() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    let _ = tx.send((r, Some(l)));
                }
                let _ = tx.send((r, None));
            });
        }
    }
    drop(tx);
    let t0 = Instant::now();
    let mut results: Vec<Vec<Option<Result<(), String>>>> = vec![vec![None; cases.len()]; n];
    let mut init_err: Vec<Option<String>> = vec![None; n];
    let mut open = n;
    let mut timed_out = false;
    while open > 0 {
        let left = PROCS_LIMIT.saturating_sub(t0.elapsed());
        match rx.recv_timeout(left) {
            Ok((_, None)) => open -= 1,
            Ok((r, Some(l))) => {
                if let Some(rest) = l.strip_prefix("INITERR ") {
                    init_err[r] = Some(rest.to_string());
                } else if let Some(rest) = l.strip_prefix("CASE ") {
                    let mut it = rest.splitn(3, ' ');
                    let idx: Option<usize> = it.next().and_then(|x| x.parse().ok());
                    let status = it.next().unwrap_or("");
                    let msg = it.next().unwrap_or("").to_string();
                    if let Some(i) = idx.filter(|i| *i < cases.len()) {
                        results[r][i] = Some(if status == "OK" { Ok(()) } else { Err(msg) });
                    }
                }
            }
            Err(_) => {
                timed_out = true;
                break;
            }
        }
    }
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let mut statuses = Vec::new();
    for mut c in children {
        if timed_out {
            let _ = c.kill();
        }
        statuses.push(c.wait().ok().and_then(|s| s.code()));
    }
    if timed_out {
        println!("FAIL procs {n}: children did not finish within {PROCS_LIMIT:?} (killed)");
        *failed += 1;
    }
    let left = staging_left(&pids);
    if !left.is_empty() {
        println!("FAIL procs {n}: staging segments of the ranks left in /dev/shm: {left:?}");
        *failed += 1;
    }
    if let Some(e) = init_err.iter().flatten().next() {
        println!("FAIL procs {n}: communicator init: {e}");
        *failed += 1;
        return;
    }
    for (i, c) in cases.iter().enumerate() {
        let mut err = None;
        for (r, res) in results.iter().enumerate() {
            match &res[i] {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    err.get_or_insert(format!("rank {r}: {e}"));
                }
                None => {
                    err.get_or_insert(format!("rank {r}: no result"));
                }
            }
        }
        match err {
            None => {
                *passed += 1;
                println!("PASS procs {n} {}", c.name());
            }
            Some(e) => {
                *failed += 1;
                println!("FAIL procs {n} {}: {e}", c.name());
            }
        }
    }
    for (r, s) in statuses.iter().enumerate() {
        if *s != Some(0) && !timed_out {
            println!("FAIL procs {n}: rank {r} exited with {s:?}");
            *failed += 1;
        }
    }
}

/// Host-staged FIFO segments in `/dev/shm` created by one of `pids`.
fn staging_left(pids: &[u32]) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(ccl_core::internal::transport::shm::SHM_DIR) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|name| {
            ccl_core::internal::transport::shm::stale_candidate_pid(
                ccl_core::device::runtime::STAGING_PREFIX,
                name,
            )
            .is_some_and(|p| pids.contains(&p))
        })
        .collect()
}

/// A child rank of `--procs`: prints `INITERR <msg>` or one `CASE <i> OK|FAIL <msg>` line
/// per case.
fn child_main() -> ! {
    let quick = std::env::args().any(|a| a == "--quick");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let rank: usize = env(ENV_RANK).parse().unwrap_or(usize::MAX);
    let nranks: usize = env(ENV_NRANKS).parse().unwrap_or(0);
    let uid = unhex(&env(ENV_UID)).filter(|u| u.len() == 128);
    let (Some(uid), true) = (uid, rank < nranks) else {
        println!("INITERR bad {ENV_RANK}/{ENV_NRANKS}/{ENV_UID}");
        std::process::exit(CHILD_INIT_FAILED);
    };
    let mut id = [0u8; 128];
    id.copy_from_slice(&uid);
    let (api, device) = match device_api(None) {
        Ok(Ok(v)) => v,
        Ok(Err(why)) => {
            println!("INITERR host backend chosen: {why}");
            std::process::exit(CHILD_INIT_FAILED);
        }
        Err(e) => {
            println!("INITERR {e}");
            std::process::exit(CHILD_INIT_FAILED);
        }
    };
    let cases = cases(quick);
    let cap = cases.iter().map(|c| c.max_bytes(nranks)).max().unwrap_or(0);
    let comm = api
        .set_device(device)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            Comm::init_rank(
                nranks as i32,
                UniqueId(id),
                rank as i32,
                CommConfig::default(),
            )
            .map_err(|e| e.to_string())
        });
    let comm = match comm {
        Ok(c) if c.is_device() => c,
        Ok(c) => {
            let _ = c.destroy();
            println!("INITERR the communicator chose the host backend");
            std::process::exit(CHILD_INIT_FAILED);
        }
        Err(e) => {
            println!("INITERR {e}");
            std::process::exit(CHILD_INIT_FAILED);
        }
    };
    let mut dr = match DevRank::new(Arc::clone(&api), Arc::clone(&comm), cap, CASE_LIMIT) {
        Ok(d) => d,
        Err(e) => {
            println!("INITERR buffers: {e}");
            let _ = comm.abort();
            std::process::exit(CHILD_INIT_FAILED);
        }
    };
    let broken = AtomicBool::new(false);
    for (i, r) in run_cases(&mut dr, &cases, &broken).into_iter().enumerate() {
        match r {
            Ok(()) => println!("CASE {i} OK"),
            Err(CaseErr::Wrong(e)) | Err(CaseErr::Broken(e)) => {
                println!("CASE {i} FAIL {}", e.replace('\n', " "))
            }
        }
    }
    drop(dr);
    let code = match comm.destroy() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("rank {rank}: destroy: {e}");
            1
        }
    };
    std::process::exit(code);
}
