//! Ours vs OpenMPI vs memcpy (issue 18 part 3b), side by side in one run.
//!
//! ```text
//! scripts/bench-peers.sh            # installs OpenMPI if missing, builds, runs this
//! target/release/bench-peers --mpi-bin PATH [--ranks 2,4] [--rounds 5] [--min 8] [--max 33554432]
//!     [--factor 4] [--iters 20] [--svg docs/perf-peers.svg] [--md docs/perf-peers.md]
//! ```
//!
//! Every round runs, for each rank count, one sweep of each of three programs, in an order
//! that rotates per round: our `all_reduce_perf -c 1` (ranks as processes under `ccl-run`,
//! float sum), the same minimal timing loop over `ncclAllReduce` on our library
//! (`benches/c/nccl_allreduce.c`, built here against NVIDIA's `nccl.h`) and over
//! `MPI_Allreduce` (the OpenMPI peer, `benches/c/mpi_allreduce.c`, `mpirun`). The two loops
//! time both libraries alike; the nccl-tests harness adds its own per-call work. memcpy
//! bandwidth at each size is measured in this process between rounds. Figures are medians
//! over rounds. Prints the busbw table (and the ratios to OpenMPI), writes it as Markdown
//! (`--md`) and draws busbw vs size (`--svg`).

use std::path::PathBuf;

use benches::peers::{median, memcpy_gbps, release_dir, run_c_loop, run_mpi, run_ours, Row};
use plotters::prelude::*;

struct Opts {
    ranks: Vec<usize>,
    sweep: benches::cli::Sweep,
    mpi_bin: PathBuf,
    mpirun: String,
    svg: Option<PathBuf>,
    md: Option<PathBuf>,
}

const USAGE: &str = "usage: bench-peers --mpi-bin PATH [--mpirun mpirun] [--ranks 2,4] \
                     [--rounds 5] [--min 8] [--max 33554432] [--factor 4] [--iters 20] \
                     [--svg FILE] [--md FILE]";

fn usage(msg: &str) -> ! {
    benches::cli::fail("bench-peers", USAGE, msg)
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        ranks: vec![2, 4],
        sweep: benches::cli::Sweep {
            rounds: 5,
            min: 8,
            max: 32 << 20,
            factor: 4,
            iters: 20,
        },
        mpi_bin: PathBuf::new(),
        mpirun: "mpirun".into(),
        svg: None,
        md: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut known = benches::cli::SWEEP_OPTIONS.to_vec();
    known.extend(["--ranks", "--mpirun", "--svg", "--md"]);
    for (opt, v) in benches::cli::option_pairs("bench-peers", USAGE, &args, &known) {
        if o.sweep.take("bench-peers", USAGE, &opt, &v) {
            continue;
        }
        let num = |v: &str| benches::cli::number("bench-peers", USAGE, &opt, v);
        match opt.as_str() {
            "--ranks" => o.ranks = v.split(',').map(|r| num(r) as usize).collect(),
            "--mpi-bin" => o.mpi_bin = v.into(),
            "--mpirun" => o.mpirun = v,
            "--svg" => o.svg = Some(v.into()),
            "--md" => o.md = Some(v.into()),
            other => usage(&format!("unknown option {other}")),
        }
    }
    if o.mpi_bin.as_os_str().is_empty() {
        usage("--mpi-bin is required");
    }
    o.sweep.check("bench-peers", USAGE);
    if o.ranks.is_empty() || o.ranks.contains(&0) {
        usage("--ranks: every rank count must be >= 1");
    }
    o
}

/// Per rank count: sizes, and per size the busbw samples of ours (nccl-tests harness, and
/// the C loop) and of OpenMPI.
struct Series {
    ranks: usize,
    sizes: Vec<u64>,
    ours: Vec<Vec<f64>>,
    ours_loop: Vec<Vec<f64>>,
    mpi: Vec<Vec<f64>>,
}

fn push(samples: &mut [Vec<f64>], sizes: &[u64], rows: &[Row], what: &str) {
    for (i, s) in sizes.iter().enumerate() {
        match rows.iter().find(|r| r.bytes == *s) {
            Some(r) => samples[i].push(r.busbw),
            None => {
                eprintln!("bench-peers: {what} gave no result at {s} bytes");
                std::process::exit(1)
            }
        }
    }
}

fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn fmt_bw(x: f64) -> String {
    if x < 0.1 {
        format!("{x:.3}")
    } else {
        format!("{x:.2}")
    }
}

/// The 1-minute load average (`/proc/loadavg`), to print next to the figures: on a shared
/// machine it says how much the other work competed with the benchmark.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The machine's state next to the figures: its load average and cross-core round trip
/// ([`benches::peers::core_round_trip_ns`]), which on a VM moves small-message times of
/// both libraries alike.
fn machine_state() -> (String, String) {
    (loadavg(), benches::peers::core_round_trip_text())
}

fn table(
    series: &[Series],
    memcpy: &[f64],
    o: &Opts,
    state: (&(String, String), &(String, String)),
) -> String {
    let sizes = &series[0].sizes;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let ((load0, rtt0), (load1, rtt1)) = state;
    let mut t = format!(
        "Machine: {cores} cores; 1-minute load average {load0} at the start, {load1} at the \
         end; a cache line's round trip between two cores {rtt0} at the start, {rtt1} at the \
         end.\n\n"
    );
    t += &format!(
        "AllReduce float sum, busbw GB/s, median of {} interleaved rounds ({} timed iterations \
         each); ours: `all_reduce_perf -c 1` under `ccl-run` (ranks as processes); ours, C \
         loop: `ncclAllReduce` in the same minimal loop as the MPI peer \
         (`benches/c/nccl_allreduce.c`, ranks as processes, bound to CPUs as `ccl-run` binds them); OpenMPI: \
         `MPI_Allreduce` (`benches/c/mpi_allreduce.c`, `mpirun --mca btl self,vader`).\n\n",
        o.sweep.rounds, o.sweep.iters
    );
    t += "| busbw GB/s |";
    for s in sizes {
        t += &format!(" {} |", human(*s));
    }
    t += "\n|---|";
    t += &"---|".repeat(sizes.len());
    t += "\n";
    for se in series {
        let medians = |s: &[Vec<f64>]| s.iter().map(|v| median(v)).collect::<Vec<f64>>();
        let (ours, ours_loop, mpi) = (medians(&se.ours), medians(&se.ours_loop), medians(&se.mpi));
        let line = |name: &str, v: &[String]| {
            format!("| {} ranks, {name} | {} |\n", se.ranks, v.join(" | "))
        };
        let bw = |v: &[f64]| v.iter().map(|x| fmt_bw(*x)).collect::<Vec<_>>();
        let ratio = |a: &[f64]| {
            a.iter()
                .zip(&mpi)
                .map(|(a, b)| format!("{:.2}x", a / b))
                .collect::<Vec<_>>()
        };
        t += &line("ours", &bw(&ours));
        t += &line("ours, C loop", &bw(&ours_loop));
        t += &line("OpenMPI", &bw(&mpi));
        t += &line("ours / OpenMPI", &ratio(&ours));
        t += &line("ours, C loop / OpenMPI", &ratio(&ours_loop));
    }
    t += &format!(
        "| memcpy GB/s | {} |\n",
        memcpy
            .iter()
            .map(|x| fmt_bw(*x))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    t
}

fn plot(
    path: &PathBuf,
    series: &[Series],
    memcpy: &[f64],
) -> Result<(), Box<dyn std::error::Error>> {
    let sizes = &series[0].sizes;
    let xmin = sizes[0] as f64;
    let xmax = *sizes.last().unwrap_or(&8) as f64;
    let mut ymax = memcpy.iter().cloned().fold(1.0, f64::max);
    for se in series {
        for v in se.ours.iter().chain(&se.ours_loop).chain(&se.mpi) {
            ymax = ymax.max(median(v));
        }
    }
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "AllReduce float sum: busbw vs size (host, ranks as processes)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((xmin..xmax).log_scale(), (1e-3..ymax * 1.5).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("busbw (GB/s)")
        .x_label_formatter(&|x| human(x.round() as u64))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()?;
    let colours = [BLUE, GREEN, RED, CYAN, MAGENTA, RGBColor(230, 140, 0)];
    let mut c = 0;
    for se in series {
        for (name, data, dashed) in [
            ("ours", &se.ours, false),
            ("ours, C loop", &se.ours_loop, false),
            ("OpenMPI", &se.mpi, true),
        ] {
            let col = colours[c % colours.len()];
            c += 1;
            let pts: Vec<(f64, f64)> = sizes
                .iter()
                .zip(data.iter())
                .map(|(s, v)| (*s as f64, median(v).max(1e-3)))
                .collect();
            let label = format!("{} ranks, {name}", se.ranks);
            let style = col.stroke_width(if dashed { 1 } else { 2 });
            chart
                .draw_series(LineSeries::new(pts.clone(), style))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2))
                });
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, col.filled())))?;
        }
    }
    let pts: Vec<(f64, f64)> = sizes
        .iter()
        .zip(memcpy)
        .map(|(s, v)| (*s as f64, v.max(1e-3)))
        .collect();
    chart
        .draw_series(LineSeries::new(pts, BLACK.stroke_width(1)))?
        .label("memcpy")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() {
    let o = parse_opts();
    let dir = release_dir();
    let mut sizes = Vec::new();
    let mut s = o.sweep.min;
    while s <= o.sweep.max {
        sizes.push(s / 4 * 4);
        s *= o.sweep.factor;
    }
    let mut series: Vec<Series> = o
        .ranks
        .iter()
        .map(|&r| Series {
            ranks: r,
            sizes: sizes.clone(),
            ours: vec![Vec::new(); sizes.len()],
            ours_loop: vec![Vec::new(); sizes.len()],
            mpi: vec![Vec::new(); sizes.len()],
        })
        .collect();
    // Our side of the minimal loop, against NVIDIA's header (fetched on first use).
    let c_loop = benches::real_faults::setup::compile_nccl_client(
        &dir,
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("c/nccl_allreduce.c"),
        &dir.join("bench-peers-work"),
    )
    .unwrap_or_else(|e| usage(&e));
    let mut memcpy = vec![Vec::new(); sizes.len()];
    let range = (o.sweep.min, o.sweep.max, o.sweep.factor);
    let state0 = machine_state();
    for round in 0..o.sweep.rounds {
        eprintln!("bench-peers: round {}/{}", round + 1, o.sweep.rounds);
        for se in &mut series {
            for k in 0..3 {
                match (k + round) % 3 {
                    0 => {
                        let rows = run_ours(&dir, se.ranks, range, "float", o.sweep.iters)
                            .unwrap_or_else(|e| usage(&e));
                        push(&mut se.ours, &sizes, &rows, "ours");
                    }
                    1 => {
                        let rows = run_c_loop(&c_loop, &dir, se.ranks, range, o.sweep.iters)
                            .unwrap_or_else(|e| usage(&e));
                        push(&mut se.ours_loop, &sizes, &rows, "ours, C loop");
                    }
                    _ => {
                        let rows = run_mpi(&o.mpirun, &o.mpi_bin, se.ranks, range, o.sweep.iters)
                            .unwrap_or_else(|e| usage(&e));
                        push(&mut se.mpi, &sizes, &rows, "OpenMPI");
                    }
                }
            }
        }
        for (i, s) in sizes.iter().enumerate() {
            memcpy[i].push(memcpy_gbps(*s as usize, 3));
        }
    }
    let mc: Vec<f64> = memcpy.iter().map(|v| median(v)).collect();
    let t = table(&series, &mc, &o, (&state0, &machine_state()));
    println!("{t}");
    if let Some(p) = &o.md {
        if let Err(e) = std::fs::write(p, &t) {
            usage(&format!("writing {}: {e}", p.display()));
        }
    }
    if let Some(p) = &o.svg {
        if let Err(e) = plot(p, &series, &mc) {
            usage(&format!("plotting {}: {e}", p.display()));
        }
        eprintln!("bench-peers: wrote {}", p.display());
    }
}
