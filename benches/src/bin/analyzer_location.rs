//! Location latency vs communicator size N (ranks per communicator).
//!
//! For each N and anomaly class the rank simulator produces a stream (one communicator,
//! ring, one channel) that an engine ingests batch by batch, ticking after each batch as
//! the service does. Printed per (class, N):
//! * `tick`: wall time of the tick that produced the diagnosis (detection + location of
//!   the whole tick: what delays the diagnosis after the data is in);
//! * `locate`: the location step alone (`Evidence.location_cost_ns`, measured by the
//!   engine around the decision tree);
//! * `idle tick`: median tick cost of the other ticks (steady-state detection overhead);
//! * `batch`: ingest of the decisive batch plus its tick (some location work happens
//!   while records are ingested).
//!
//! and least-squares lines tick = a + b N and batch = a + b N per class. Target
//! (docs/performance.md): linear in N, <= 5 ms at 4,096 ranks.
//!
//! Usage: analyzer_location [--max-n N] [--reps R]

use std::time::Instant;

use analyzer::sim::{H2Variant, Injection, Sim, SimAlgo, SimConfig};
use analyzer::{Engine, EngineConfig};
use benches::analyzer_util::{linear_fit, median};
use ccld_wire::{class_code, AnomalyClass};

struct Sample {
    /// Ingest of the decisive batch plus the tick.
    batch_ns: f64,
    tick_ns: f64,
    locate_ns: f64,
    idle_tick_ns: f64,
    ok: bool,
}

fn cfg(n: u32, class: AnomalyClass, seed: u64) -> SimConfig {
    let hang = matches!(
        class,
        AnomalyClass::H1NotEntered | AnomalyClass::H2Inconsistent | AnomalyClass::H3Hardware
    );
    let start: u64 = if hang {
        20_000_000_000
    } else {
        130_000_000_000
    };
    SimConfig {
        seed,
        comms: 1,
        nranks: n,
        algo: SimAlgo::Ring,
        channels: 1,
        duration_ns: start + if hang { 306 } else { 200 } * 1_000_000_000,
        snapshot_ns: 60_000_000_000,
        heartbeat_ns: 60_000_000_000,
        inject: Some(Injection {
            class,
            rank: n / 3,
            start_ns: start,
            silent: false,
            h2: H2Variant::TypeMismatch,
        }),
        ..SimConfig::default()
    }
}

fn measure(n: u32, class: AnomalyClass, seed: u64) -> Sample {
    let sim = Sim::new(cfg(n, class, seed)).expect("valid simulator config");
    let truth = sim.truth().expect("injected");
    let mut e = Engine::new(EngineConfig::default());
    let mono = Instant::now();
    let mut clock = || mono.elapsed().as_nanos() as u64;
    let mut idle = Vec::new();
    let mut found: Option<(f64, f64, f64, bool)> = None;
    for tb in sim {
        let now = tb.now_ns;
        let tb0 = Instant::now();
        if let Some(b) = tb.batch.as_ref() {
            for r in &b.records {
                let _ = e.ingest(r, now);
            }
            for h in &b.heartbeats {
                e.heartbeat(h, now);
            }
        }
        let t0 = Instant::now();
        let ds = e.tick_with_clock(now, &mut clock);
        let dt = t0.elapsed().as_nanos() as f64;
        let dbatch = tb0.elapsed().as_nanos() as f64;
        if ds.is_empty() {
            idle.push(dt);
        } else if found.is_none() {
            let d = &ds[0];
            let ok = d.class == truth.class as i32 && d.roots.iter().any(|r| r.rank == truth.rank);
            let loc = d
                .evidence
                .as_ref()
                .map(|ev| ev.location_cost_ns)
                .unwrap_or(0) as f64;
            found = Some((dbatch, dt, loc, ok));
        }
    }
    let (batch_ns, tick_ns, locate_ns, ok) = found.unwrap_or((f64::NAN, f64::NAN, f64::NAN, false));
    Sample {
        batch_ns,
        tick_ns,
        locate_ns,
        idle_tick_ns: median(&idle),
        ok,
    }
}

fn main() {
    let mut max_n: u32 = 65_536;
    let mut reps_small: usize = 3;
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--max-n" if i + 1 < args.len() => {
                max_n = args[i + 1].parse().unwrap_or_else(|_| {
                    eprintln!("--max-n needs a number");
                    std::process::exit(2)
                });
                i += 1;
            }
            "--reps" if i + 1 < args.len() => {
                reps_small = args[i + 1].parse().unwrap_or_else(|_| {
                    eprintln!("--reps needs a number");
                    std::process::exit(2)
                });
                i += 1;
            }
            other => {
                eprintln!("usage: analyzer_location [--max-n N] [--reps R] (got {other:?})");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let ns: Vec<u32> = [16u32, 64, 256, 1024, 4096, 16_384, 65_536]
        .into_iter()
        .filter(|&n| n <= max_n)
        .collect();
    let classes = [
        AnomalyClass::H1NotEntered,
        AnomalyClass::H3Hardware,
        AnomalyClass::S1ComputationSlow,
        AnomalyClass::S2CommunicationSlow,
    ];
    println!("# analyzer location latency vs ranks per communicator (ring, 1 channel)");
    println!(
        "{:<5} {:>7} {:>12} {:>12} {:>12} {:>12} {:>8}",
        "class", "N", "batch_ms", "tick_ms", "locate_ms", "idle_tick_ms", "correct"
    );
    let t_all = Instant::now();
    for class in classes {
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        let mut yb = Vec::new();
        for &n in &ns {
            let reps = if n <= 4096 { reps_small.max(1) } else { 1 };
            let samples: Vec<Sample> = (0..reps).map(|r| measure(n, class, 7 + r as u64)).collect();
            let batch = median(&samples.iter().map(|s| s.batch_ns).collect::<Vec<_>>());
            let tick = median(&samples.iter().map(|s| s.tick_ns).collect::<Vec<_>>());
            let loc = median(&samples.iter().map(|s| s.locate_ns).collect::<Vec<_>>());
            let idle = median(&samples.iter().map(|s| s.idle_tick_ns).collect::<Vec<_>>());
            let ok = samples.iter().all(|s| s.ok);
            println!(
                "{:<5} {:>7} {:>12.4} {:>12.4} {:>12.4} {:>12.4} {:>8}",
                class_code(class),
                n,
                batch / 1e6,
                tick / 1e6,
                loc / 1e6,
                idle / 1e6,
                if ok { "yes" } else { "NO" }
            );
            if tick.is_finite() {
                xs.push(f64::from(n));
                ys.push(tick / 1e6);
                yb.push(batch / 1e6);
            }
        }
        for (what, y) in [("tick_ms", &ys), ("batch_ms", &yb)] {
            let (a, b, r2) = linear_fit(&xs, y);
            println!(
                "fit {} {what} = {:.4} + {:.3e} * N  (r^2 = {:.4}); at N=4096: {:.3} ms (target <= 5 ms)",
                class_code(class),
                a,
                b,
                r2,
                a + b * 4096.0
            );
        }
    }
    println!("# total bench time {:.1} s", t_all.elapsed().as_secs_f64());
}
