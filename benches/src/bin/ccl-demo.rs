//! `ccl-demo`: the CCL-D loop in one command.
//!
//! Starts N ranks (default 4) as threads of this process on the host backend with the
//! embedded analyzer, splits a data-parallel communicator (all ranks) and tensor-parallel
//! pairs with `ncclCommSplit`, runs a training-like loop (compute, DP AllReduce of the
//! gradients, TP AllReduce), injects one anomaly after a clean warm-up, shows a live
//! progress line (step, busbw) and prints the diagnosis in plain words.
//!
//! ```text
//! cargo run --release -p benches --bin ccl-demo -- [--ranks N] [--fault KIND] [--rank R]
//!     KIND: s1 (default: rank R computes slowly), s2 (rank R's sends are throttled),
//!           s3, h1 (rank R never enters), h2 (rank R issues a different count),
//!           h3 (a channel of rank R stalls), stop (SIGSTOP-like: rank R's thread stops
//!           calling), none (clean run)
//! ```
//! s1 and stop are faults of the application (a slow / stopped rank thread); the others use
//! `CCLD_INJECT`. Exit status 0 when the diagnosis names the injected rank (or, for
//! `none`, when nothing was diagnosed), 1 otherwise.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccl_core::{enqueue, CollArgs, Comm, CommConfig, DataType};
use ccld_wire::{self as wire, AnomalyClass};
use probe::CollKind;

struct Opts {
    ranks: usize,
    fault: String,
    rank: usize,
    timeout: Duration,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        ranks: 4,
        fault: "s1".into(),
        rank: usize::MAX,
        timeout: Duration::from_secs(45),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--ranks" => {
                o.ranks = val("--ranks")?
                    .parse()
                    .ok()
                    .filter(|n| (2..=16).contains(n))
                    .ok_or("--ranks must be 2..16")?
            }
            "--fault" => o.fault = val("--fault")?,
            "--rank" => o.rank = val("--rank")?.parse().map_err(|_| "--rank: not a number")?,
            "--timeout" => {
                o.timeout = Duration::from_secs(
                    val("--timeout")?.parse().map_err(|_| "--timeout: seconds")?,
                )
            }
            "-h" | "--help" => {
                return Err("usage: ccl-demo [--ranks N] [--fault none|s1|s2|s3|h1|h2|h3|stop] [--rank R] [--timeout S]".into())
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.rank == usize::MAX {
        o.rank = o.ranks / 2;
    }
    if o.rank >= o.ranks {
        return Err(format!(
            "--rank {} is not below --ranks {}",
            o.rank, o.ranks
        ));
    }
    if !["none", "s1", "s2", "s3", "h1", "h2", "h3", "stop"].contains(&o.fault.as_str()) {
        return Err(format!("unknown fault {:?}", o.fault));
    }
    Ok(o)
}

/// Step from which the anomaly is injected: after the analyzer learned the baseline and
/// after the long rule's learning period (3 clean 1 s windows; a step takes at least the
/// 2 ms of computation, so 2000 steps are at least 4 s). A communication slowdown that
/// starts inside the learning period becomes the communicator's norm for the long rule
/// (docs/diagnosis.md section 3a): with onset at step 400 `--fault s2` was diagnosed in 2
/// of 3 runs.
const ONSET_STEP: u64 = 2000;
const DP_FLOATS: usize = 64 << 10; // 256 KiB of gradients
const TP_FLOATS: usize = 64 << 10; // 256 KiB of activations
const COMPUTE: Duration = Duration::from_millis(2);

fn set_default(k: &str, v: &str) {
    if std::env::var_os(k).is_none() {
        std::env::set_var(k, v);
    }
}

fn allreduce(c: &Arc<Comm>, buf: &mut [f32]) -> Result<(), String> {
    let a = CollArgs {
        kind: CollKind::AllReduce,
        sendbuf: buf.as_ptr() as usize,
        recvbuf: buf.as_mut_ptr() as usize,
        count: buf.len(),
        dtype: DataType::Float32 as i32,
        op: 0,
        root: -1,
        stream: 0,
    };
    enqueue(c, a).map_err(|e| e.to_string())
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ccl-demo: {e}");
            std::process::exit(2);
        }
    };
    let n = o.ranks;
    // Short analyzer windows so that the demo finishes in seconds (the paper's are minutes).
    set_default("CCLD_ANALYZER", "embedded");
    set_default("CCLD_SLOW_WINDOW_S", "1");
    set_default("CCLD_BASELINE_S", "1");
    set_default("CCLD_T_BASE_INIT_MS", "1000");
    set_default("CCLD_HANG_TIMEOUT_S", "3");
    set_default("CCLD_INFLIGHT_MS", "250");
    set_default("CCLD_SILENT_S", "2");
    set_default("CCLD_SLOW_REPEAT", "3");
    let r = o.rank;
    let inject = match o.fault.as_str() {
        "s2" => Some(format!("s2:rank={r},nranks={n},ops={ONSET_STEP}..,gap=3ms")),
        "s3" => Some(format!(
            "s3:rank={r},nranks={n},ops={ONSET_STEP}..,delay=6ms,gap=3ms"
        )),
        "h1" => Some(format!("h1:rank={r},nranks={n},ops={ONSET_STEP}..")),
        "h2" => Some(format!("h2:rank={r},nranks={n},ops={ONSET_STEP}")),
        "h3" => Some(format!("h3:rank={r},nranks={n},ops={ONSET_STEP}")),
        _ => None,
    };
    if let Some(spec) = &inject {
        std::env::set_var("CCLD_INJECT", spec);
    }
    println!(
        "ccl-demo: {n} ranks (threads, host backend), embedded CCL-D analyzer; DP group = all ranks, TP groups = pairs"
    );
    println!(
        "ccl-demo: fault {:?} on rank {r} from step {ONSET_STEP}{}",
        o.fault,
        inject
            .as_deref()
            .map(|s| format!(" (CCLD_INJECT={s})"))
            .unwrap_or_default()
    );
    let world = match Comm::init_all(n as i32, None) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ccl-demo: init failed: {e}");
            std::process::exit(1);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let step = Arc::new(AtomicU64::new(0));
    let busbw = Arc::new(Mutex::new(0.0f64));
    // (comm_id, rank in comm) -> global rank; and every comm, for abort.
    let members: Arc<Mutex<HashMap<(u64, u32), usize>>> = Arc::default();
    let comms: Arc<Mutex<Vec<Arc<Comm>>>> = Arc::default();
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for (g, wc) in world.iter().enumerate() {
        let wc = Arc::clone(wc);
        let (stop, step, busbw) = (Arc::clone(&stop), Arc::clone(&step), Arc::clone(&busbw));
        let (members, comms) = (Arc::clone(&members), Arc::clone(&comms));
        let fault = o.fault.clone();
        handles.push(std::thread::spawn(move || -> Result<(), String> {
            let split = |color: i32| -> Result<Arc<Comm>, String> {
                wc.split(color, g as i32, CommConfig::default())
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| "split returned no communicator".to_string())
            };
            let dp = split(0)?;
            let tp = split(g as i32 / 2)?;
            {
                let mut m = members.lock().unwrap_or_else(|p| p.into_inner());
                m.insert((dp.comm_id(), dp.rank() as u32), g);
                m.insert((tp.comm_id(), tp.rank() as u32), g);
                let mut c = comms.lock().unwrap_or_else(|p| p.into_inner());
                c.push(Arc::clone(&dp));
                c.push(Arc::clone(&tp));
            }
            let mut grads = vec![1.0f32; DP_FLOATS];
            let mut act = vec![1.0f32; TP_FLOATS];
            let mut s: u64 = 0;
            while !stop.load(Ordering::Acquire) {
                // "Forward/backward": jittered compute, slower on the faulty rank under s1.
                let jitter = Duration::from_micros((s * 7919 + g as u64 * 104_729) % 400);
                let mut compute = COMPUTE + jitter;
                if s >= ONSET_STEP && g == r {
                    match fault.as_str() {
                        "s1" => compute += Duration::from_millis(15),
                        "stop" => {
                            while !stop.load(Ordering::Acquire) {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            break;
                        }
                        _ => {}
                    }
                }
                std::thread::sleep(compute);
                let t = Instant::now();
                allreduce(&dp, &mut grads)?;
                let secs = t.elapsed().as_secs_f64();
                allreduce(&tp, &mut act)?;
                if g == 0 {
                    let bytes = (DP_FLOATS * 4) as f64;
                    let bw = bytes / secs * 2.0 * (n as f64 - 1.0) / n as f64 / 1e9;
                    *busbw.lock().unwrap_or_else(|p| p.into_inner()) = bw;
                    step.store(s, Ordering::Release);
                }
                // Keep values bounded.
                grads.iter_mut().for_each(|x| *x = 1.0);
                act.iter_mut().for_each(|x| *x = 1.0);
                s += 1;
            }
            Ok(())
        }));
    }
    let emb = probe::embedded::embedded();
    let mut found: Vec<wire::Diagnosis> = Vec::new();
    let clean_steps = ONSET_STEP + 1000;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let s = step.load(Ordering::Acquire);
        let bw = *busbw.lock().unwrap_or_else(|p| p.into_inner());
        eprint!(
            "\rstep {s:5}  DP AllReduce 256 KiB busbw {bw:6.3} GB/s  t = {:4.1} s ",
            t0.elapsed().as_secs_f64()
        );
        if let Some(e) = &emb {
            found = e.diagnoses();
        }
        // Wait for the headline: a diagnosis of the data-parallel communicator.
        if o.fault != "none" && found.iter().any(|d| d.nranks as usize == n) {
            // Give the other communicator a moment to be diagnosed too.
            std::thread::sleep(Duration::from_millis(1500));
            if let Some(e) = &emb {
                found = e.diagnoses();
            }
            break;
        }
        if (o.fault == "none" && s >= clean_steps) || t0.elapsed() > o.timeout {
            break;
        }
    }
    eprintln!();
    stop.store(true, Ordering::Release);
    let hang = matches!(o.fault.as_str(), "h1" | "h2" | "h3" | "stop");
    if hang || !found.is_empty() {
        for c in comms.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = c.abort();
        }
    }
    for h in handles {
        let _ = h.join();
    }
    let members = members.lock().unwrap_or_else(|p| p.into_inner()).clone();
    // The data-parallel communicator (all ranks) first: its diagnosis is the headline.
    found.sort_by_key(|d| std::cmp::Reverse(d.nranks));
    let mut named_right = false;
    if found.is_empty() {
        println!(
            "ccl-demo: no anomaly diagnosed ({} s)",
            t0.elapsed().as_secs()
        );
    }
    for d in &found {
        let groups = if d.nranks as usize == n { "DP" } else { "TP" };
        let globals: Vec<String> = d
            .roots
            .iter()
            .map(|rc| match members.get(&(d.comm_id, rc.rank)) {
                Some(g) => {
                    if *g == r && d.nranks as usize == n {
                        named_right = true;
                    }
                    format!("global rank {g}")
                }
                None => "?".into(),
            })
            .collect();
        println!(
            "DIAGNOSIS [{} {}, {groups} communicator {:#018x}, detected after {:.1} s, location latency {:.1} ms]:\n  {}\n  root cause = {}",
            ccld_wire::class_code(d.class()),
            class_word(d.class()),
            d.comm_id,
            t0.elapsed().as_secs_f64(),
            d.location_latency_ns as f64 / 1e6,
            probe::describe(d),
            globals.join(", ")
        );
    }
    let ok = if o.fault == "none" {
        found.is_empty()
    } else {
        named_right
    };
    std::process::exit(if ok { 0 } else { 1 });
}

fn class_word(c: AnomalyClass) -> &'static str {
    match c {
        AnomalyClass::H1NotEntered => "not-entered hang",
        AnomalyClass::H2Inconsistent => "inconsistent hang",
        AnomalyClass::H3Hardware => "hardware-fault hang",
        AnomalyClass::S1ComputationSlow => "computation-slow",
        AnomalyClass::S2CommunicationSlow => "communication-slow",
        AnomalyClass::S3MixedSlow => "mixed slow",
        AnomalyClass::Unspecified => "anomaly",
    }
}
