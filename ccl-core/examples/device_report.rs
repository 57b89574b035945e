//! What a GPU session measures beyond correctness (scripts/gpu/perf-ab.sh runs it): where
//! a device operation's time goes, what the descriptor check costs, and that inconsistent
//! calls fail on the GPU instead of moving shifted data.
//!
//! A. Raw stream work, N back-to-back items on one stream, then one synchronize; the time
//!    per item is the stream's throughput, which for serialized work is its latency:
//!    - `host fn`: an empty `cudaLaunchHostFunc` (the GPU hands over to a CUDA host
//!      thread and waits for it: what every operation's completion costs);
//!    - `copy 8 B`: `cudaMemcpyAsync` device to device;
//!    - `kernel`: the plan kernel with an empty plan (one block, nothing to do);
//!    - `kernel + host fn`: the two, alternating (one operation's stream work today);
//!    - `kernel + event record`: what a completion found by polling an event would cost.
//!
//! B. Whole operations through `ccl_core::enqueue`, one rank: AllReduce of 8 B float32 sum
//!    (a byte copy: no kernel) and of 8 B int32 Avg (the kernel); time per operation over
//!    N back-to-back ones, and the CPU time of the enqueue calls alone.
//!
//! C. Ranks as threads sharing the GPU (`--ranks`, default 2): AllReduce float32 sum at
//!    8 B, 1 MiB and 16 MiB with the descriptor check on and off (the benchmark-only hook
//!    `ccl_core::internal::desc::bench_only_set_check`), interleaved in rounds, order alternating;
//!    the median of the per-round ratios (issue 17's targets: busbw ratio >= 0.997 at
//!    >= 1 MiB, <= 3 % extra latency at 8 B).
//!
//! D. Inconsistent calls, 2 ranks as threads, Simple and LL: after two consistent
//!    AllReduces, rank 1 calls AllGather (or AllReduce of another count) where rank 0
//!    calls AllReduce. Pass: both streams go idle within 10 s and every rank reports an
//!    asynchronous error, `ncclInvalidUsage` on at least one (the detector), else
//!    `ncclRemoteError` (poisoned by it); the next call fails.
//!
//! On the CPU emulator (`CCLD_DEVICE_EMULATION=1`) it runs too, but its figures mean
//! nothing. Exit 0, or 2 when there is no device backend.
//!
//! Usage: device_report [--iters N (default 2000)] [--rounds R (default 7)] [--ranks N]
//!                      [--parts A,B,C,D (default all)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ccl_core::device::api::{DeviceApi, Stream};
use ccl_core::device::runtime::device_api;
use ccl_core::{CollArgs, Comm, CommConfig, DataType};
use ccl_optype::CollKind;
use kernels::ffi::ccl_dev_plan_t;

/// One item of part A's stream work.
type Item<'a> = dyn FnMut() -> Result<(), String> + 'a;
/// One part of the report.
type Part<'a> = dyn Fn() -> Result<(), String> + 'a;

const SUM: i32 = 0;
const AVG: i32 = 4;

fn usage(msg: &str) -> ! {
    eprintln!("device_report: {msg}");
    eprintln!("usage: device_report [--iters N] [--rounds R] [--ranks N] [--parts A,B,C,D]");
    std::process::exit(2);
}

struct Opts {
    iters: usize,
    rounds: usize,
    ranks: usize,
    parts: String,
}

fn parse_args() -> Opts {
    let mut o = Opts {
        iters: 2000,
        rounds: 7,
        ranks: 2,
        parts: "A,B,C,D".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> usize {
            match args.next().and_then(|v| v.parse::<usize>().ok()) {
                Some(v) if v >= 1 => v,
                _ => usage(&format!("{what} takes a number >= 1")),
            }
        };
        match a.as_str() {
            "--iters" => o.iters = num("--iters"),
            "--rounds" => o.rounds = num("--rounds"),
            "--ranks" => o.ranks = num("--ranks"),
            "--parts" => o.parts = args.next().unwrap_or_default().to_uppercase(),
            _ => usage(&format!("unknown argument {a:?}")),
        }
    }
    o
}

/// Microseconds per item of `iters` items enqueued by `one` on `s`, then a synchronize.
fn per_item(
    api: &dyn DeviceApi,
    s: Stream,
    iters: usize,
    one: &mut dyn FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    one()?;
    api.stream_synchronize(s).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    for _ in 0..iters {
        one()?;
    }
    api.stream_synchronize(s).map_err(|e| e.to_string())?;
    Ok(t0.elapsed().as_secs_f64() * 1e6 / iters as f64)
}

fn raw_costs(api: &Arc<dyn DeviceApi>, iters: usize) -> Result<(), String> {
    let s = api.stream_create().map_err(|e| e.to_string())?;
    let a = api.malloc(64).map_err(|e| e.to_string())?;
    let b = api.malloc(64).map_err(|e| e.to_string())?;
    let plan = ccl_dev_plan_t::idle();
    let host_fn = |api: &Arc<dyn DeviceApi>| {
        api.launch_host_fn(s, Box::new(|| {}))
            .map_err(|e| e.to_string())
    };
    // SAFETY: the empty plan points at nothing (no arrays, buffers, frame or check area),
    // so the kernel touches no memory.
    let kernel =
        |api: &Arc<dyn DeviceApi>| unsafe { api.launch_plan(&plan, s) }.map_err(|e| e.to_string());
    let ev = api.event_create().map_err(|e| e.to_string())?;
    let rows: [(&str, Box<Item<'_>>); 5] = [
        ("host fn", Box::new(|| host_fn(api))),
        (
            "copy 8 B",
            // SAFETY: a and b are device blocks of 64 bytes, alive until freed below,
            // after the stream synchronized.
            Box::new(|| unsafe { api.memcpy_async(b, a, 8, s) }.map_err(|e| e.to_string())),
        ),
        ("kernel", Box::new(|| kernel(api))),
        (
            "kernel + host fn",
            Box::new(|| kernel(api).and_then(|()| host_fn(api))),
        ),
        (
            "kernel + event record",
            Box::new(|| {
                kernel(api).and_then(|()| api.event_record(ev, s).map_err(|e| e.to_string()))
            }),
        ),
    ];
    println!("## A. raw stream work, {iters} back-to-back items on one stream");
    println!("| item | us per item |");
    println!("|---|---:|");
    for (name, mut f) in rows {
        let us = per_item(&**api, s, iters, &mut *f)?;
        println!("| {name} | {us:.2} |");
    }
    api.stream_synchronize(s).map_err(|e| e.to_string())?;
    let _ = api.event_destroy(ev);
    let _ = api.free(a);
    let _ = api.free(b);
    let _ = api.stream_destroy(s);
    Ok(())
}

/// A communicator of `n` ranks per thread of `n`, each with a stream and two device
/// buffers of `cap` bytes; runs `body(rank, comm, stream, send, recv, barrier)` on each.
fn with_ranks<T: Send + 'static>(
    api: &Arc<dyn DeviceApi>,
    device: i32,
    n: usize,
    cap: usize,
    body: impl Fn(usize, &Arc<Comm>, Stream, usize, usize, &Barrier) -> Result<T, String>
        + Send
        + Sync
        + 'static,
) -> Result<Vec<T>, String> {
    let id = ccl_core::bootstrap::get_unique_id().map_err(|e| e.to_string())?;
    let barrier = Arc::new(Barrier::new(n));
    let body = Arc::new(body);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let (api, barrier, body) = (Arc::clone(api), Arc::clone(&barrier), Arc::clone(&body));
            std::thread::spawn(move || -> Result<T, String> {
                api.set_device(device).map_err(|e| e.to_string())?;
                let c = Comm::init_rank(n as i32, id, r as i32, CommConfig::default())
                    .map_err(|e| format!("rank {r} init: {e}"))?;
                if !c.is_device() {
                    return Err("the communicator chose the host backend".into());
                }
                let s = api.stream_create().map_err(|e| e.to_string())?;
                let send = api.malloc(cap).map_err(|e| e.to_string())?;
                let recv = api.malloc(cap).map_err(|e| e.to_string())?;
                // SAFETY: both blocks have `cap` bytes (defined inputs for the sums).
                unsafe {
                    api.memset(send, 0, cap).map_err(|e| e.to_string())?;
                    api.memset(recv, 0, cap).map_err(|e| e.to_string())?;
                }
                let out = body(r, &c, s, send, recv, &barrier);
                let _ = api.stream_synchronize(s);
                let _ = c.destroy();
                let _ = api.free(send);
                let _ = api.free(recv);
                let _ = api.stream_destroy(s);
                out
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().map_err(|_| "a rank thread panicked".to_string())?)
        .collect()
}

fn args(
    kind: CollKind,
    send: usize,
    recv: usize,
    count: usize,
    dt: DataType,
    op: i32,
    s: Stream,
) -> CollArgs {
    CollArgs {
        kind,
        sendbuf: send,
        recvbuf: recv,
        count,
        dtype: dt as i32,
        op,
        root: -1,
        stream: s,
    }
}

/// (us per operation, CPU us per enqueue call) of `iters` back-to-back `a`.
fn time_ops(
    api: &dyn DeviceApi,
    c: &Arc<Comm>,
    a: CollArgs,
    iters: usize,
) -> Result<(f64, f64), String> {
    ccl_core::enqueue(c, a).map_err(|e| e.to_string())?;
    api.stream_synchronize(a.stream)
        .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    for _ in 0..iters {
        ccl_core::enqueue(c, a).map_err(|e| e.to_string())?;
    }
    let cpu = t0.elapsed();
    api.stream_synchronize(a.stream)
        .map_err(|e| e.to_string())?;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / iters as f64;
    Ok((per(t0.elapsed()), per(cpu)))
}

fn one_rank(api: &Arc<dyn DeviceApi>, device: i32, iters: usize) -> Result<(), String> {
    let api2 = Arc::clone(api);
    let rows = with_ranks(api, device, 1, 64, move |_, c, s, send, recv, _| {
        let copy = args(
            CollKind::AllReduce,
            send,
            recv,
            2,
            DataType::Float32,
            SUM,
            s,
        );
        let kern = args(CollKind::AllReduce, send, recv, 2, DataType::Int32, AVG, s);
        let mut v = Vec::new();
        for (name, a) in [
            ("AllReduce 8 B float32 sum (copy)", copy),
            ("AllReduce 8 B int32 avg (kernel)", kern),
        ] {
            v.push((name, time_ops(&*api2, c, a, iters)?));
            c.set_probing(false);
            v.push((name, time_ops(&*api2, c, a, iters)?));
            c.set_probing(true);
        }
        Ok(v)
    })?;
    println!();
    println!("## B. one rank, {iters} back-to-back operations");
    println!("| operation | probe | us per operation | CPU us per enqueue |");
    println!("|---|---|---:|---:|");
    for (i, (name, (op, cpu))) in rows[0].iter().enumerate() {
        let probe = if i % 2 == 0 { "on" } else { "paused" };
        println!("| {name} | {probe} | {op:.2} | {cpu:.2} |");
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn desc_check_cost(api: &Arc<dyn DeviceApi>, device: i32, o: &Opts) -> Result<(), String> {
    const SIZES: [usize; 3] = [8, 1 << 20, 16 << 20];
    let cap = SIZES[SIZES.len() - 1];
    let (n, rounds, iters) = (o.ranks, o.rounds, o.iters);
    let api2 = Arc::clone(api);
    // Per size, per round: (us per op with the check on, off).
    let per_rank = with_ranks(api, device, n, cap, move |r, c, s, send, recv, barrier| {
        let mut out = Vec::new();
        for &bytes in &SIZES {
            let it = if bytes >= 1 << 20 {
                (iters / 20).max(10)
            } else {
                iters / 2
            };
            let a = args(
                CollKind::AllReduce,
                send,
                recv,
                bytes / 4,
                DataType::Float32,
                SUM,
                s,
            );
            let mut v = Vec::new();
            for round in 0..rounds {
                let mut t = [0.0f64; 2];
                for k in 0..2 {
                    let on = (k == 0) == (round % 2 == 0);
                    barrier.wait();
                    if r == 0 {
                        ccl_core::internal::desc::bench_only_set_check(on);
                    }
                    barrier.wait();
                    let (us, _) = time_ops(&*api2, c, a, it)?;
                    t[usize::from(!on)] = us;
                }
                v.push((t[0], t[1]));
            }
            out.push((bytes, v));
        }
        barrier.wait();
        if r == 0 {
            ccl_core::internal::desc::bench_only_set_check(true);
        }
        Ok(out)
    })?;
    println!();
    println!(
        "## C. descriptor check on vs off, {n} ranks as threads on one GPU, AllReduce float32 sum, {rounds} rounds (rank 0's times)"
    );
    println!("| bytes | us on (median) | us off (median) | busbw ratio on/off (median) | extra latency on (median) |");
    println!("|---:|---:|---:|---:|---:|");
    for (bytes, v) in &per_rank[0] {
        let mut on: Vec<f64> = v.iter().map(|x| x.0).collect();
        let mut off: Vec<f64> = v.iter().map(|x| x.1).collect();
        let mut ratio: Vec<f64> = v.iter().map(|x| x.1 / x.0).collect();
        let mut extra: Vec<f64> = v.iter().map(|x| (x.0 / x.1 - 1.0) * 100.0).collect();
        println!(
            "| {bytes} | {:.2} | {:.2} | {:.4} | {:+.2} % |",
            median(&mut on),
            median(&mut off),
            median(&mut ratio),
            median(&mut extra)
        );
    }
    Ok(())
}

/// Part D: one inconsistent call after two consistent ones; `Ok(verdict line)` per case.
fn inconsistent_calls(api: &Arc<dyn DeviceApi>, device: i32) -> Result<(), String> {
    const COUNT: usize = 1 << 14;
    println!();
    println!("## D. inconsistent calls, 2 ranks as threads on one GPU");
    let mut failed = 0;
    for proto in ["Simple", "LL"] {
        // Read at init by every communicator created below.
        std::env::set_var("NCCL_PROTO", proto);
        for (what, bad_kind, bad_count) in [
            (
                "AllGather where the peer calls AllReduce",
                CollKind::AllGather,
                COUNT / 2,
            ),
            (
                "AllReduce of another count",
                CollKind::AllReduce,
                COUNT - 24,
            ),
        ] {
            let api2 = Arc::clone(api);
            let got = with_ranks(
                api,
                device,
                2,
                COUNT * 2 * 4,
                move |r, c, s, send, recv, barrier| {
                    let good = args(
                        CollKind::AllReduce,
                        send,
                        recv,
                        COUNT,
                        DataType::Float32,
                        SUM,
                        s,
                    );
                    for _ in 0..2 {
                        ccl_core::enqueue(c, good).map_err(|e| format!("consistent call: {e}"))?;
                    }
                    api2.stream_synchronize(s).map_err(|e| e.to_string())?;
                    if let Err(e) = c.async_error() {
                        return Err(format!("consistent calls failed: {e}"));
                    }
                    barrier.wait();
                    let call = if r == 1 {
                        CollArgs {
                            kind: bad_kind,
                            count: bad_count,
                            ..good
                        }
                    } else {
                        good
                    };
                    ccl_core::enqueue(c, call).map_err(|e| format!("the call itself: {e}"))?;
                    let t0 = Instant::now();
                    while !api2.stream_query(s).map_err(|e| e.to_string())? {
                        if t0.elapsed() > Duration::from_secs(10) {
                            let _ = c.abort();
                            return Ok(format!("rank {r}: HANG (still running after 10 s)"));
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let took = t0.elapsed();
                    // The completion function reports the verdict; it runs right after.
                    std::thread::sleep(Duration::from_millis(50));
                    let next = ccl_core::enqueue(c, good);
                    barrier.wait();
                    Ok(match c.async_error().err() {
                        None => format!("rank {r}: SILENT (no error after {took:?})"),
                        Some(e) => format!(
                            "rank {r}: {:?} after {:.1} ms, next call {}: {e}",
                            e.code(),
                            took.as_secs_f64() * 1e3,
                            match next {
                                Ok(()) => "succeeded".to_string(),
                                Err(n) => format!("failed ({:?})", n.code()),
                            }
                        ),
                    })
                },
            );
            let lines = match got {
                Ok(v) => v,
                Err(e) => vec![format!("ERROR {e}")],
            };
            let detectors = lines.iter().filter(|l| l.contains("InvalidUsage")).count();
            let ok = detectors >= 1
                && lines.iter().all(|l| {
                    (l.contains("InvalidUsage") || l.contains("RemoteError"))
                        && l.contains("next call failed")
                });
            failed += usize::from(!ok);
            println!(
                "{} {proto:<6} rank 1 calls {what}",
                if ok { "PASS" } else { "FAIL" }
            );
            for l in lines {
                println!("    {l}");
            }
        }
    }
    std::env::remove_var("NCCL_PROTO");
    if failed > 0 {
        return Err(format!("{failed} inconsistent-call case(s) failed"));
    }
    Ok(())
}

fn main() {
    ccl_core::device::queues::most_queues_for_this_program();
    let o = parse_args();
    let (api, device) = match device_api(None) {
        Ok(Ok(v)) => v,
        Ok(Err(why)) => {
            println!("# {why}\nSKIP: no device backend");
            std::process::exit(2);
        }
        Err(e) => usage(&e.to_string()),
    };
    println!(
        "# device runtime: {} on device {device}{}",
        api.name(),
        if api.is_emulated() {
            " (CPU emulator: figures mean nothing)"
        } else {
            ""
        }
    );
    let steps: [(&str, &str, &Part<'_>); 4] = [
        ("A", "raw", &|| raw_costs(&api, o.iters)),
        ("B", "one rank", &|| one_rank(&api, device, o.iters)),
        ("C", "descriptor check", &|| {
            desc_check_cost(&api, device, &o)
        }),
        ("D", "inconsistent calls", &|| {
            inconsistent_calls(&api, device)
        }),
    ];
    let mut failed = false;
    for (part, name, f) in steps {
        if !o.parts.split(',').any(|p| p.trim() == part) {
            continue;
        }
        if let Err(e) = f() {
            println!("FAIL {name}: {e}");
            failed = true;
        }
    }
    std::process::exit(i32::from(failed));
}
