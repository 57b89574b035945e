//! The socket transport over a veth link (issue 14, performance), side by side in one run.
//!
//! ```text
//! scripts/net-bench.sh      # as root: installs OpenMPI if missing, builds, runs this
//! target/release/net-bench [--mpi-bin PATH] [--rounds 3] [--min 65536] [--max 67108864]
//!     [--factor 4] [--iters 10] [--budget 67108864] [--md FILE]
//! ```
//! Each size runs as its own job, ours and OpenMPI's alike, with `max(--iters, --budget /
//! size)` timed operations after an eighth as many untimed ones (at least 3): a fixed
//! count would time a 64 KiB AllReduce for under a millisecond, where one scheduler pause
//! of the two shared cores moves the figure by 50-100% (`--budget 0`: `--iters` at every
//! size).
//! `--md FILE` writes the tables into FILE between the markers `<!-- net-bench: tables
//! begin -->` and `<!-- net-bench: tables end -->`, keeping the text around them (the whole
//! file is the tables when it has no markers).
//!
//! Four "hosts" (network namespaces joined by a bridge, `benches::netns`, one rank each).
//! Every round, in an order that alternates, measures:
//! - raw TCP throughput of the link host 0 -> host 1: one connection, this binary as
//!   source and sink (`--tcp-source`/`--tcp-sink`), 256 MiB;
//! - raw TCP around a ring of 2 and of 4 hosts (`--tcp-ring`): every host streams 256 MiB
//!   to the next while it receives from the previous, the traffic of a ring AllReduce
//!   without its arithmetic, on the same CPUs; the slowest link's GB/s;
//! - our AllReduce (`all_reduce_perf -c 1`, float sum) on 2 hosts x 1 rank and 4 x 1;
//! - with `--mpi-bin`, OpenMPI's `MPI_Allreduce` (`benches/c/mpi_allreduce.c`) with its TCP
//!   BTL (`--mca btl tcp,self`) on the same hosts, `mpirun` started in host 0 and reaching
//!   the others through an rsh agent that enters their namespaces.
//!
//! Busbw figures are medians over rounds. The ratios are paired: each round's ours over
//! the same round's peer figure, printed as the median of the rounds' ratios with its
//! lower and upper quartile (and, against OpenMPI, in how many rounds ours was at least
//! as fast), since between rounds both sides move by 10-30% on this machine. Ratios ours /
//! raw TCP (target >= 0.8 at >= 4 MiB, 2 hosts: busbw of a ring AllReduce equals each
//! link's payload rate), against the one-way figure and against the ring of the same
//! hosts, and ours / OpenMPI (target >= 1.0 at >= 64 KiB). Where the CPUs, not the link, set the pace
//! (veth on a small machine), one way moves half the bytes per CPU-second of a ring, whose
//! every host both sends and receives; the ring is then the like-for-like reference.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use benches::netns::Hosts;
use benches::peers::{
    allreduce_rows, core_round_trip_text, median, parse_mpi, quartiles, release_dir, Row,
};

const TCP_BYTES: u64 = 256 << 20;
const TCP_PORT: u16 = 24_117;

struct Opts {
    sweep: benches::cli::Sweep,
    /// Payload bytes timed per size at least ([`Opts::counts`]).
    budget: u64,
    mpi_bin: Option<PathBuf>,
    md: Option<PathBuf>,
}

const USAGE: &str = "usage: net-bench [--mpi-bin PATH] [--rounds 3] [--min 65536] \
                     [--max 67108864] [--factor 4] [--iters 10] [--budget 67108864] [--md FILE]";

/// Most timed operations per size, whatever `--budget` asks.
const MAX_ITERS: u64 = 100_000;

impl Opts {
    /// The sizes of the sweep, `min` times powers of `factor` up to `max`.
    fn sizes(&self) -> Vec<u64> {
        let s = &self.sweep;
        std::iter::successors(Some(s.min), |b| b.checked_mul(s.factor))
            .take_while(|b| *b <= s.max)
            .collect()
    }

    /// Timed and untimed operations at `bytes`: at least `--iters`, and enough to move
    /// `--budget` bytes (at most [`MAX_ITERS`]); an eighth as many untimed ones, at least 3.
    fn counts(&self, bytes: u64) -> (u64, u64) {
        let by_budget = self.budget.div_ceil(bytes.max(1));
        let iters = u64::from(self.sweep.iters).max(by_budget.min(MAX_ITERS));
        (iters, (iters / 8).max(3))
    }
}

fn usage(msg: &str) -> ! {
    benches::cli::fail("net-bench", USAGE, msg)
}

fn parse_opts(args: &[String]) -> Opts {
    let mut o = Opts {
        sweep: benches::cli::Sweep {
            rounds: 3,
            min: 64 << 10,
            max: 64 << 20,
            factor: 4,
            iters: 10,
        },
        budget: 64 << 20,
        mpi_bin: None,
        md: None,
    };
    let mut known = benches::cli::SWEEP_OPTIONS.to_vec();
    known.extend(["--md", "--budget"]);
    for (opt, v) in benches::cli::option_pairs("net-bench", USAGE, args, &known) {
        if o.sweep.take("net-bench", USAGE, &opt, &v) {
            continue;
        }
        match opt.as_str() {
            "--mpi-bin" => o.mpi_bin = Some(PathBuf::from(v)),
            "--md" => o.md = Some(PathBuf::from(v)),
            "--budget" => o.budget = benches::cli::number("net-bench", USAGE, &opt, &v),
            other => usage(&format!("unknown option {other}")),
        }
    }
    o.sweep.check("net-bench", USAGE);
    o
}

/// `--tcp-sink ADDR`: accepts one connection, reads to its end, answers one byte.
fn tcp_sink(addr: &str) -> Result<(), String> {
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    let total = sink_on(&l)?;
    println!("{total}");
    Ok(())
}

/// Accepts one connection on `l`, reads to its end, answers one byte; the bytes read.
fn sink_on(l: &TcpListener) -> Result<u64, String> {
    let (mut s, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
    let mut buf = vec![0u8; 4 << 20];
    let mut total = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    s.write_all(&[1]).map_err(|e| format!("ack: {e}"))?;
    Ok(total)
}

/// The BYTES of the internal helper modes (`--tcp-source`, `--tcp-ring`): [`TCP_BYTES`]
/// when absent, an error when not a number.
fn helper_bytes(arg: Option<&String>) -> Result<u64, String> {
    arg.map_or(Ok(TCP_BYTES), |b| {
        b.parse().map_err(|_| format!("BYTES: not a number: {b}"))
    })
}

/// `--tcp-source ADDR BYTES`: streams BYTES, waits for the sink's byte; prints GB/s.
fn tcp_source(addr: &str, bytes: u64) -> Result<(), String> {
    println!("{}", source_to(addr, bytes)?);
    Ok(())
}

/// `--tcp-ring LISTEN NEXT BYTES`: one host of a ring of raw streams, the traffic of a
/// ring AllReduce without its arithmetic: receives BYTES on LISTEN from the previous host
/// while it streams BYTES to the next; prints its sending GB/s.
fn tcp_ring(listen: &str, next: &str, bytes: u64) -> Result<(), String> {
    let l = TcpListener::bind(listen).map_err(|e| format!("bind {listen}: {e}"))?;
    let sink = std::thread::spawn(move || sink_on(&l));
    let sent = source_to(next, bytes);
    let got = sink
        .join()
        .map_err(|_| "ring sink thread panicked".to_string())??;
    let gbps = sent?;
    if got != bytes {
        return Err(format!("ring sink read {got} bytes of {bytes}"));
    }
    println!("{gbps}");
    Ok(())
}

/// Connects to `addr` (retrying for 10 s while the sink starts), streams `bytes`, waits for
/// the sink's byte; the GB/s from the first byte to that answer.
fn source_to(addr: &str, bytes: u64) -> Result<f64, String> {
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let t0 = Instant::now();
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(format!("connect {addr}: {e}")),
        }
    };
    let buf = vec![7u8; 4 << 20];
    let start = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        s.write_all(&buf[..n]).map_err(|e| format!("write: {e}"))?;
        left -= n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)
        .map_err(|e| format!("shutdown: {e}"))?;
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).map_err(|e| format!("ack: {e}"))?;
    Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e9)
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

/// Raw TCP GB/s host 0 -> host 1.
fn raw_tcp(hosts: &Hosts, me: &Path) -> Result<f64, String> {
    let addr = SocketAddr::new(hosts.addr(1).into(), TCP_PORT).to_string();
    let sink = hosts
        .command(1, me)
        .args(["--tcp-sink", &addr])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("tcp sink: {e}"))?;
    let src = output(
        hosts
            .command(0, me)
            .args(["--tcp-source", &addr, &TCP_BYTES.to_string()]),
    );
    let sink_out = sink
        .wait_with_output()
        .map_err(|e| format!("tcp sink: {e}"))?;
    let gbps = src?
        .trim()
        .parse::<f64>()
        .map_err(|e| format!("tcp source output: {e}"))?;
    let got: u64 = String::from_utf8_lossy(&sink_out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("tcp sink output: {e}"))?;
    if got != TCP_BYTES {
        return Err(format!("tcp sink read {got} bytes of {TCP_BYTES}"));
    }
    Ok(gbps)
}

/// Raw TCP around a ring of hosts 0..n (each streams to the next and receives from the
/// previous at once, `--tcp-ring`): GB/s per link, that of the slowest (a ring AllReduce
/// moves in lockstep, so its links go as fast as the slowest).
fn raw_ring(hosts: &Hosts, me: &Path, n: usize) -> Result<f64, String> {
    let addr = |h: usize| SocketAddr::new(hosts.addr(h).into(), TCP_PORT + 1).to_string();
    let outs = on_each_host(n, |h| {
        let mut c = hosts.command(h, me);
        c.args(["--tcp-ring", &addr(h), &addr((h + 1) % n)])
            .arg(TCP_BYTES.to_string());
        c
    })?;
    outs.iter()
        .enumerate()
        .map(|(h, t)| {
            t.trim()
                .parse::<f64>()
                .map_err(|e| format!("tcp ring host {h} output {t:?}: {e}"))
        })
        .try_fold(f64::INFINITY, |slowest, g| Ok(slowest.min(g?)))
}

/// Starts `command(h)` for hosts 0..n at once and waits for all; their standard outputs,
/// or the error of the last that failed (with its standard error).
fn on_each_host(n: usize, command: impl Fn(usize) -> Command) -> Result<Vec<String>, String> {
    let children: Vec<_> = (0..n)
        .map(|h| {
            command(h)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("start host {h}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut outs = Vec::with_capacity(n);
    let mut failed = None;
    for (h, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().map_err(|e| format!("host {h}: {e}"))?;
        if !out.status.success() {
            failed = Some(format!(
                "host {h}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        outs.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    match failed {
        Some(f) => Err(f),
        None => Ok(outs),
    }
}

/// Our AllReduce on `n` hosts x 1 rank: one job per size ([`Opts::counts`]).
fn ours(hosts: &Hosts, dir: &Path, n: usize, o: &Opts) -> Result<Vec<Row>, String> {
    let uid = dir.join(format!("net-bench-uid-{}", std::process::id()));
    let mut rows = Vec::new();
    for bytes in o.sizes() {
        let (iters, warmup) = o.counts(bytes);
        let (b, it, w) = (bytes.to_string(), iters.to_string(), warmup.to_string());
        let args = [
            "-b", &b, "-e", &b, "-c", "1", "-w", &w, "-n", &it, "-o", "sum",
        ];
        let _ = std::fs::remove_file(&uid);
        let outs = on_each_host(n, |h| {
            hosts.ranks_command(
                h,
                h..h + 1,
                n,
                &dir.join("all_reduce_perf"),
                &args,
                &uid,
                dir,
            )
        });
        let _ = std::fs::remove_file(&uid);
        rows.extend(allreduce_rows(&outs?.concat(), n)?);
    }
    Ok(rows)
}

/// OpenMPI's MPI_Allreduce with the TCP BTL on `n` hosts x 1 rank, one job per size as
/// [`ours`]; a failed start is retried once (Debian's Open MPI 4.1.4 daemons now and then
/// crash in hwloc while they start, before any rank runs).
fn mpi(hosts: &Hosts, agent: &Path, bin: &Path, n: usize, o: &Opts) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for bytes in o.sizes() {
        let counts = o.counts(bytes);
        let once = || mpi_once(hosts, agent, bin, n, bytes, counts);
        rows.extend(once().or_else(|e| {
            eprintln!(
                "net-bench: mpirun failed, once more: {}",
                e.lines().next().unwrap_or("")
            );
            once()
        })?);
    }
    Ok(rows)
}

/// One `mpirun` of `bin` at `bytes` with `(iters, warmup)` operations.
fn mpi_once(
    hosts: &Hosts,
    agent: &Path,
    bin: &Path,
    n: usize,
    bytes: u64,
    (iters, warmup): (u64, u64),
) -> Result<Vec<Row>, String> {
    let list: Vec<String> = (0..n).map(|h| format!("{}:1", hosts.addr(h))).collect();
    let subnet = format!("{}/24", hosts.addr(0));
    let out = output(
        hosts
            .command(0, Path::new("mpirun"))
            .args(["--allow-run-as-root", "-np", &n.to_string(), "-H"])
            .arg(list.join(","))
            .args(["--mca", "plm_rsh_agent"])
            .arg(agent)
            .args(["--mca", "btl", "tcp,self"])
            .args(["--mca", "rtc", "^hwloc"])
            .args(["--mca", "btl_tcp_if_include", &subnet])
            .args(["--mca", "oob_tcp_if_include", &subnet])
            // Daemons report straight to mpirun: with the default routed tree, a 4-host
            // launch failed now and then with "ORTE does not know how to route a message
            // to the specified daemon" (twice in a row on 2026-12-07).
            .args(["--mca", "routed", "direct"])
            .arg(bin)
            .args([bytes, bytes, 2, iters, warmup].map(|v| v.to_string())),
    )?;
    let rows = parse_mpi(&out);
    if rows.is_empty() {
        return Err(format!("no result lines from mpirun:\n{out}"));
    }
    Ok(rows)
}

/// The rsh agent `mpirun` uses to start its daemons: `agent HOST COMMAND...` runs the
/// command in the namespace of the host with that address.
fn write_agent(hosts: &Hosts, dir: &Path) -> Result<PathBuf, String> {
    let mut cases = String::new();
    for h in 0..hosts.len() {
        cases.push_str(&format!(
            "  {}) ns={} ;;\n",
            hosts.addr(h),
            hosts.namespace(h)
        ));
    }
    let text = format!(
        "#!/bin/sh\n# written by net-bench\nhost=$1; shift\ncase \"$host\" in\n{cases}  *) echo \"net-bench agent: unknown host $host\" >&2; exit 1 ;;\nesac\nexec ip netns exec \"$ns\" sh -c \"$*\"\n"
    );
    let path = dir.join(format!("net-bench-agent-{}", std::process::id()));
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = Command::new("chmod")
        .arg("+x")
        .arg(&path)
        .status()
        .map_err(|e| format!("chmod: {e}"))?;
    if !st.success() {
        return Err("chmod failed".into());
    }
    Ok(path)
}

/// Busbw at `bytes` in each round (`None` where a round has no such row).
fn busbw_by_round(rounds: &[Vec<Row>], bytes: u64) -> Vec<Option<f64>> {
    rounds
        .iter()
        .map(|rs| rs.iter().find(|x| x.bytes == bytes).map(|x| x.busbw))
        .collect()
}

/// Each round's `ours` over the same round's `peer` figure, for the rounds that have both.
fn paired(ours: &[Option<f64>], peer: impl Iterator<Item = Option<f64>>) -> Vec<f64> {
    ours.iter()
        .zip(peer)
        .filter_map(|(a, b)| Some((*a)? / b?))
        .collect()
}

/// `median [q1, q3]` of ratios, two decimals; `-` when there are none.
fn spread(v: &[f64]) -> String {
    match quartiles(v) {
        Some((q1, m, q3)) => format!("{m:.2} [{q1:.2}, {q3:.2}]"),
        None => "-".to_string(),
    }
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("--tcp-sink") => Some(tcp_sink(args.get(1).map_or("", String::as_str))),
        Some("--tcp-source") => Some(
            helper_bytes(args.get(2))
                .and_then(|b| tcp_source(args.get(1).map_or("", String::as_str), b)),
        ),
        Some("--tcp-ring") => Some(helper_bytes(args.get(3)).and_then(|b| {
            tcp_ring(
                args.get(1).map_or("", String::as_str),
                args.get(2).map_or("", String::as_str),
                b,
            )
        })),
        _ => None,
    };
    if let Some(r) = r {
        if let Err(e) = r {
            eprintln!("net-bench: {e}");
            std::process::exit(1);
        }
        return;
    }
    let o = parse_opts(&args);
    if let Err(e) = run(&o) {
        eprintln!("net-bench: {e}");
        std::process::exit(1);
    }
}

fn run(o: &Opts) -> Result<(), String> {
    let dir = release_dir();
    let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let hosts = Hosts::create(4, 9)?;
    let agent = match &o.mpi_bin {
        Some(_) => Some(write_agent(&hosts, &dir)?),
        None => None,
    };
    let rtt0 = core_round_trip_text();
    let mut tcp = Vec::new();
    let mut ring: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut ours_rounds: [Vec<Vec<Row>>; 2] = [Vec::new(), Vec::new()];
    let mut mpi_rounds: [Vec<Vec<Row>>; 2] = [Vec::new(), Vec::new()];
    for round in 0..o.sweep.rounds {
        eprintln!("net-bench: round {}/{}", round + 1, o.sweep.rounds);
        let mpi_first = round % 2 == 1;
        tcp.push(raw_tcp(&hosts, &me)?);
        for (k, n) in [2usize, 4].into_iter().enumerate() {
            ring[k].push(raw_ring(&hosts, &me, n)?);
            let run_mpi = |v: &mut [Vec<Vec<Row>>; 2]| -> Result<(), String> {
                if let (Some(bin), Some(agent)) = (&o.mpi_bin, &agent) {
                    v[k].push(mpi(&hosts, agent, bin, n, o)?);
                }
                Ok(())
            };
            if mpi_first {
                run_mpi(&mut mpi_rounds)?;
            }
            ours_rounds[k].push(ours(&hosts, &dir, n, o)?);
            if !mpi_first {
                run_mpi(&mut mpi_rounds)?;
            }
        }
    }
    if let Some(a) = agent {
        let _ = std::fs::remove_file(a);
    }
    let tcp_gbps = median(&tcp);
    let rounded = |v: &[f64]| {
        v.iter()
            .map(|x| (x * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    };
    let mut md = String::new();
    md.push_str(&format!(
        "A cache line's round trip between two cores of this machine: {rtt0} at the start, \
         {} at the end (`benches::peers::core_round_trip_ns`; on a VM it moves with where the \
         host runs the virtual CPUs, and the figures below with it).\n\n",
        core_round_trip_text()
    ));
    md.push_str(&format!(
        "Raw TCP host 0 -> host 1 (one connection, one way, {} MiB): **{tcp_gbps:.2} GB/s** \
         (median of {} rounds: {:?})\n\n",
        TCP_BYTES >> 20,
        o.sweep.rounds,
        rounded(&tcp)
    ));
    let ring_gbps = [median(&ring[0]), median(&ring[1])];
    for (k, n) in [2usize, 4].into_iter().enumerate() {
        md.push_str(&format!(
            "Raw TCP ring of {n} hosts (each streams {} MiB to the next while it receives \
             from the previous), slowest link: **{:.2} GB/s** (median of {} rounds: {:?})\n\n",
            TCP_BYTES >> 20,
            ring_gbps[k],
            o.sweep.rounds,
            rounded(&ring[k])
        ));
    }
    for (k, n) in [2usize, 4].into_iter().enumerate() {
        md.push_str(&format!(
            "{n} hosts x 1 rank, AllReduce float sum, busbw GB/s (median of {} rounds; \
             ratios: median of the rounds' paired ratios [lower, upper quartile])\n\n",
            o.sweep.rounds
        ));
        md.push_str(
            "| size | timed ops | ours | OpenMPI tcp | ours / OpenMPI | rounds ours >= OpenMPI \
             | ours / raw TCP one way | ours / raw TCP ring |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for bytes in o.sizes() {
            let ours = busbw_by_round(&ours_rounds[k], bytes);
            let mpi = busbw_by_round(&mpi_rounds[k], bytes);
            let vs_mpi = paired(&ours, mpi.iter().copied());
            let vs_tcp = paired(&ours, tcp.iter().copied().map(Some));
            let vs_ring = paired(&ours, ring[k].iter().copied().map(Some));
            let bw = |v: &[Option<f64>]| {
                let v: Vec<f64> = v.iter().flatten().copied().collect();
                if v.is_empty() {
                    "-".to_string()
                } else {
                    format!("{:.3}", median(&v))
                }
            };
            let wins = if vs_mpi.is_empty() {
                "-".to_string()
            } else {
                let w = vs_mpi.iter().filter(|r| **r >= 1.0).count();
                format!("{w}/{}", vs_mpi.len())
            };
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {wins} | {} | {} |\n",
                human(bytes),
                o.counts(bytes).0,
                bw(&ours),
                bw(&mpi),
                spread(&vs_mpi),
                spread(&vs_tcp),
                spread(&vs_ring),
            ));
        }
        md.push('\n');
    }
    md.push_str(
        "Targets: ours / raw TCP >= 0.8 at >= 4 MiB (2 hosts), ours / OpenMPI >= 1.0 at >= 64 KiB.\n",
    );
    print!("{md}");
    if let Some(p) = &o.md {
        let old = std::fs::read_to_string(p).unwrap_or_default();
        std::fs::write(p, splice_tables(&old, &md)).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

const TABLES_BEGIN: &str = "<!-- net-bench: tables begin -->\n";
const TABLES_END: &str = "<!-- net-bench: tables end -->\n";

/// The `--md` file with this run's tables: between the markers of `old` when it has both,
/// so that the hand-written text around them (how the run was made, how to read it) stays;
/// otherwise the tables alone, with the markers.
fn splice_tables(old: &str, tables: &str) -> String {
    let fresh = format!("{TABLES_BEGIN}{tables}{TABLES_END}");
    match (old.find(TABLES_BEGIN), old.find(TABLES_END)) {
        (Some(b), Some(e)) if b < e => {
            format!("{}{fresh}{}", &old[..b], &old[e + TABLES_END.len()..])
        }
        _ => fresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_replace_only_what_is_between_the_markers() {
        let old = format!("# Title\nintro\n{TABLES_BEGIN}| old |\n{TABLES_END}\nReading it: x\n");
        let got = splice_tables(&old, "| new |\n");
        assert_eq!(
            got,
            format!("# Title\nintro\n{TABLES_BEGIN}| new |\n{TABLES_END}\nReading it: x\n")
        );
        // No markers (or only one, or in the wrong order): the tables alone.
        let alone = format!("{TABLES_BEGIN}| new |\n{TABLES_END}");
        assert_eq!(splice_tables("# hand-written\n", "| new |\n"), alone);
        assert_eq!(
            splice_tables(&format!("a{TABLES_END}b{TABLES_BEGIN}c"), "| new |\n"),
            alone
        );
        assert_eq!(splice_tables("", "| new |\n"), alone);
    }

    #[test]
    fn ratios_pair_rounds_and_skip_those_missing_a_side() {
        let ours = [Some(2.0), None, Some(3.0), Some(1.0)];
        let peer = [Some(1.0), Some(1.0), None, Some(4.0)];
        assert_eq!(paired(&ours, peer.iter().copied()), [2.0, 0.25]);
        assert_eq!(paired(&ours, [1.0, 2.0].into_iter().map(Some)), [2.0]);
        assert_eq!(spread(&[]), "-");
        assert_eq!(spread(&[1.0, 2.0, 4.0]), "2.00 [1.00, 4.00]");
    }

    #[test]
    fn each_size_times_at_least_the_budget_and_the_iterations() {
        let args: Vec<String> = ["--min", "65536", "--max", "16777216", "--iters", "10"]
            .map(String::from)
            .to_vec();
        let o = parse_opts(&args);
        assert_eq!(o.sizes(), [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]);
        // 64 MiB by default: 1024 operations of 64 KiB, 16 of 4 MiB; never below --iters.
        assert_eq!(o.counts(64 << 10), (1024, 128));
        assert_eq!(o.counts(4 << 20), (16, 3));
        assert_eq!(o.counts(16 << 20), (10, 3));
        // A budget that does not divide: rounded up; a tiny size: capped.
        assert_eq!(o.counts(3 << 20), (22, 3));
        assert_eq!(o.counts(4), (MAX_ITERS, MAX_ITERS / 8));
        let off = Opts { budget: 0, ..o };
        assert_eq!(off.counts(64 << 10), (10, 3));
        // A factor that would overflow past max ends the sweep instead of wrapping.
        let big: Vec<String> = [
            "--min",
            "4611686018427387904",
            "--max",
            "18446744073709551615",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(parse_opts(&big).sizes(), [1 << 62]);
    }
}
