//! The socket transport over a veth link (issue 14, performance), side by side in one run.
//!
//! ```text
//! scripts/net-bench.sh      # as root: installs OpenMPI if missing, builds, runs this
//! target/release/net-bench [--mpi-bin PATH] [--rounds 3] [--min 65536] [--max 67108864]
//!     [--factor 4] [--iters 10] [--md FILE]
//! ```
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
//! Figures are medians over rounds. Prints busbw per size and the ratios ours / raw TCP
//! (target >= 0.8 at >= 4 MiB, 2 hosts: busbw of a ring AllReduce equals each link's
//! payload rate), against the one-way figure and against the ring of the same hosts, and
//! ours / OpenMPI (target >= 1.0 at >= 64 KiB). Where the CPUs, not the link, set the pace
//! (veth on a small machine), one way moves half the bytes per CPU-second of a ring, whose
//! every host both sends and receives; the ring is then the like-for-like reference.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use benches::netns::Hosts;
use benches::peers::{allreduce_rows, median, parse_mpi, release_dir, Row};

const TCP_BYTES: u64 = 256 << 20;
const TCP_PORT: u16 = 24_117;

struct Opts {
    sweep: benches::cli::Sweep,
    mpi_bin: Option<PathBuf>,
    md: Option<PathBuf>,
}

const USAGE: &str = "usage: net-bench [--mpi-bin PATH] [--rounds 3] [--min 65536] \
                     [--max 67108864] [--factor 4] [--iters 10] [--md FILE]";

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
        mpi_bin: None,
        md: None,
    };
    let mut known = benches::cli::SWEEP_OPTIONS.to_vec();
    known.push("--md");
    for (opt, v) in benches::cli::option_pairs("net-bench", USAGE, args, &known) {
        if o.sweep.take("net-bench", USAGE, &opt, &v) {
            continue;
        }
        match opt.as_str() {
            "--mpi-bin" => o.mpi_bin = Some(PathBuf::from(v)),
            "--md" => o.md = Some(PathBuf::from(v)),
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

/// Our AllReduce on `n` hosts x 1 rank.
fn ours(hosts: &Hosts, dir: &Path, n: usize, o: &Opts) -> Result<Vec<Row>, String> {
    let uid = dir.join(format!("net-bench-uid-{}", std::process::id()));
    let _ = std::fs::remove_file(&uid);
    let (min, max, f, it) = (
        o.sweep.min.to_string(),
        o.sweep.max.to_string(),
        o.sweep.factor.to_string(),
        o.sweep.iters.to_string(),
    );
    let args = [
        "-b", &min, "-e", &max, "-f", &f, "-c", "1", "-w", "3", "-n", &it, "-o", "sum",
    ];
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
    let text = outs?.concat();
    allreduce_rows(&text, n)
}

/// OpenMPI's MPI_Allreduce with the TCP BTL on `n` hosts x 1 rank; a failed start is
/// retried once (Debian's Open MPI 4.1.4 daemons now and then crash in hwloc while they
/// start, before any rank runs).
fn mpi(hosts: &Hosts, agent: &Path, bin: &Path, n: usize, o: &Opts) -> Result<Vec<Row>, String> {
    mpi_once(hosts, agent, bin, n, o).or_else(|e| {
        eprintln!(
            "net-bench: mpirun failed, once more: {}",
            e.lines().next().unwrap_or("")
        );
        mpi_once(hosts, agent, bin, n, o)
    })
}

fn mpi_once(
    hosts: &Hosts,
    agent: &Path,
    bin: &Path,
    n: usize,
    o: &Opts,
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
            .arg(bin)
            .args([
                o.sweep.min.to_string(),
                o.sweep.max.to_string(),
                o.sweep.factor.to_string(),
                o.sweep.iters.to_string(),
                "3".into(),
            ]),
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

/// Median busbw per size over rounds.
fn medians(rounds: &[Vec<Row>]) -> Vec<(u64, f64)> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|r| {
            let v: Vec<f64> = rounds
                .iter()
                .filter_map(|rs| rs.iter().find(|x| x.bytes == r.bytes).map(|x| x.busbw))
                .collect();
            (r.bytes, median(&v))
        })
        .collect()
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
        Some("--tcp-source") => Some(tcp_source(
            args.get(1).map_or("", String::as_str),
            args.get(2)
                .and_then(|b| b.parse().ok())
                .unwrap_or(TCP_BYTES),
        )),
        Some("--tcp-ring") => Some(tcp_ring(
            args.get(1).map_or("", String::as_str),
            args.get(2).map_or("", String::as_str),
            args.get(3)
                .and_then(|b| b.parse().ok())
                .unwrap_or(TCP_BYTES),
        )),
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
        let ours_m = medians(&ours_rounds[k]);
        let mpi_m = medians(&mpi_rounds[k]);
        md.push_str(&format!(
            "{n} hosts x 1 rank, AllReduce float sum, busbw GB/s (median of {} rounds)\n\n",
            o.sweep.rounds
        ));
        md.push_str(
            "| size | ours | OpenMPI tcp | ours / OpenMPI | ours / raw TCP one way | ours / raw TCP ring |\n\
             |---|---:|---:|---:|---:|---:|\n",
        );
        for (bytes, bw) in &ours_m {
            let m = mpi_m.iter().find(|x| x.0 == *bytes).map(|x| x.1);
            let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
            md.push_str(&format!(
                "| {} | {bw:.3} | {} | {} | {:.2} | {:.2} |\n",
                human(*bytes),
                fmt(m),
                fmt(m.map(|m| bw / m)),
                bw / tcp_gbps,
                bw / ring_gbps[k]
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
}
