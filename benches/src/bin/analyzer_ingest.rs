//! Ingest rate of analyzer shards.
//!
//! A. Server-side cost on one core, no network: protobuf decode of 4,096-record batches
//!    (prost's `Batch::decode`, and the shard's `codec::BatchScratch` that reuses records),
//!    `Engine::ingest`, and the client's encoding (`codec::encode_batch`); CPU-seconds per
//!    record of each step.
//! B. One shard on loopback gRPC, C concurrent client streams each sending rounds of B
//!    records (completed records of 64-rank communicators) through `IngestOne`, with three
//!    clients:
//!    - `raw`: records kept and updated in place each round, encoded once per round with
//!      `codec::encode_batch` and sent as pre-encoded bytes (`codec::PreEncodedCodec`);
//!    - `lib`: the same records through `analyzer_net::client::Client::ingest_ref_at` (routing,
//!      failover bookkeeping, encoding: what the probe's reporter runs);
//!    - `prost`: records generated afresh each round and sent through the generated prost
//!      client (the client path before the codec).
//!
//! C. 2 and 3 shards on loopback (`raw` client), records routed to their owner.
//!
//! With `--pin` (default where 2 CPUs are allowed) the shard threads run on one CPU and
//! the client threads on another (`sched_setaffinity`, as `taskset` would), so the figures
//! say what one shard core absorbs from a client on the other core. Every rate is given
//! per second of wall clock and per CPU-second of the shard threads (and of the client
//! threads): the wall figure depends on how busy the machine is, the CPU figure much less.
//!
//! Target (the project's performance goals, docs/performance.md): >= 1,000,000 records/s per shard, batched.
//!
//! Usage: analyzer_ingest [--seconds S] [--clients C] [--batch B] [--workers W]
//!                        [--client-threads T] [--pin 0|1] [--modes raw,lib,prost]
//!                        [--max-shards N]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use analyzer::engine::EngineConfig;
use analyzer::Engine;
use analyzer_net::client::{Client, ClientConfig};
use analyzer_net::codec::{encode_batch, BatchScratch, PreEncodedCodec, INGEST_ONE_PATH};
use analyzer_net::grpc::analyzer_client::AnalyzerClient;
use analyzer_net::server::{ServerConfig, ShardProcess};
use analyzer_net::shard::ShardMap;
use benches::analyzer_util::{cpu_seconds, cpu_seconds_of_threads, RecordGen};
use benches::peers::{allowed_cpus, pin_thread};
use ccld_wire::{Batch, OpRecord};
use prost::Message;

const RANKS: u32 = 64;
const CLIENT_THREADS: &str = "ingest-client";
const SHARD_THREADS: &str = "ccld-shard";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Raw,
    Lib,
    Prost,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Raw => "raw",
            Mode::Lib => "lib",
            Mode::Prost => "prost",
        }
    }
}

struct Opts {
    seconds: f64,
    clients: usize,
    batch: usize,
    workers: usize,
    client_threads: usize,
    pin: Option<(usize, usize)>,
    modes: Vec<Mode>,
    max_shards: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: analyzer_ingest [--seconds S] [--clients C] [--batch B>=64] [--workers W] \
         [--client-threads T] [--pin 0|1] [--modes raw,lib,prost] [--max-shards 1..3]"
    );
    std::process::exit(2);
}

/// Pins every thread of this process whose name starts with `prefix` to `cpu`; returns
/// how many.
fn pin_threads(prefix: &str, cpu: usize) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut n = 0;
    for e in dir.flatten() {
        let name = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let tid = e.file_name().to_string_lossy().parse::<libc::pid_t>().ok();
        if let (true, Some(tid)) = (name.starts_with(prefix), tid) {
            if pin_thread(tid, cpu) {
                n += 1;
            }
        }
    }
    n
}

fn parse() -> Opts {
    let cpus = allowed_cpus();
    let mut o = Opts {
        seconds: 4.0,
        clients: 4,
        batch: 4096,
        workers: 1,
        client_threads: 1,
        pin: (cpus.len() >= 2).then(|| (cpus[0], cpus[1])),
        modes: vec![Mode::Raw, Mode::Lib, Mode::Prost],
        max_shards: 3,
    };
    let a: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < a.len() {
        let s = a.get(i + 1).map(String::as_str).unwrap_or("");
        let v = s.parse::<f64>().ok();
        match (a[i].as_str(), v) {
            ("--seconds", Some(v)) if v > 0.0 => o.seconds = v,
            ("--clients", Some(v)) if v >= 1.0 => o.clients = v as usize,
            ("--batch", Some(v)) if v >= 64.0 => o.batch = v as usize,
            ("--workers", Some(v)) if v >= 1.0 => o.workers = v as usize,
            ("--client-threads", Some(v)) if v >= 1.0 => o.client_threads = v as usize,
            ("--max-shards", Some(v)) if (1.0..=3.0).contains(&v) => o.max_shards = v as usize,
            ("--pin", _) if s == "0" => o.pin = None,
            ("--pin", _) if s == "1" => {
                if o.pin.is_none() {
                    eprintln!("--pin 1 needs 2 allowed CPUs, have {cpus:?}");
                    std::process::exit(2);
                }
            }
            ("--modes", _) => {
                o.modes = s
                    .split(',')
                    .map(|m| match m {
                        "raw" => Mode::Raw,
                        "lib" => Mode::Lib,
                        "prost" => Mode::Prost,
                        _ => usage(),
                    })
                    .collect();
            }
            _ => usage(),
        }
        i += 2;
    }
    o
}

/// CPU-seconds of the calling thread spent in `f`, and its wall time.
fn timed(f: impl FnOnce()) -> (f64, f64) {
    let c0 = cpu_seconds("thread-self").unwrap_or(0.0);
    let t0 = Instant::now();
    f();
    let dt = t0.elapsed().as_secs_f64();
    let c1 = cpu_seconds("thread-self").unwrap_or(0.0);
    // /proc counts in 10 ms ticks: use the wall time when the tick count is too coarse.
    let cpu = if c1 - c0 >= 0.2 { c1 - c0 } else { dt };
    (cpu, dt)
}

fn part_a(batch: usize) {
    let comms = (batch / RANKS as usize).max(1);
    let mut g = RecordGen::new(1, comms, RANKS, 2);
    let rounds = 250;
    let rounds_recs: Vec<Vec<OpRecord>> = (0..rounds).map(|_| g.round()).collect();
    let n: usize = rounds_recs.iter().map(Vec::len).sum();
    // Encoding into one reused buffer (as the client does, no page faults timed).
    let mut buf = Vec::new();
    let (enc_cpu, _) = timed(|| {
        for r in &rounds_recs {
            buf.clear();
            encode_batch(r, [], &mut buf);
            std::hint::black_box(&buf);
        }
    });
    let encoded: Vec<Vec<u8>> = rounds_recs
        .iter()
        .map(|r| {
            let mut b = Vec::new();
            encode_batch(r, [], &mut b);
            b
        })
        .collect();
    drop(rounds_recs);
    let bytes: usize = encoded.iter().map(Vec::len).sum();
    let (prost_cpu, _) = timed(|| {
        for buf in &encoded {
            let b = Batch::decode(buf.as_slice()).expect("own encoding decodes");
            std::hint::black_box(&b);
        }
    });
    let mut s = BatchScratch::new();
    let (scratch_cpu, _) = timed(|| {
        for buf in &encoded {
            s.decode(buf).expect("own encoding decodes");
            std::hint::black_box(s.records());
        }
    });
    let now = 1_700_000_000_000_000_000u64;
    let mut e = Engine::new(EngineConfig::default());
    let mut rej = 0u64;
    let (full_cpu, full_wall) = timed(|| {
        for buf in &encoded {
            s.decode(buf).expect("own encoding decodes");
            for r in s.records() {
                if e.ingest(r, now).is_err() {
                    rej += 1;
                }
            }
        }
    });
    let mut e = Engine::new(EngineConfig::default());
    let (old_cpu, _) = timed(|| {
        for buf in &encoded {
            let b = Batch::decode(buf.as_slice()).expect("own encoding decodes");
            for r in &b.records {
                let _ = e.ingest(r, now);
            }
        }
    });
    let ns = |cpu: f64| cpu * 1e9 / n as f64;
    println!(
        "A  one thread, {n} records of {:.0} B: ns per record: encode {:.0}, prost decode {:.0}, scratch decode {:.0}, engine ingest {:.0} (scratch decode + ingest {:.0} = {:.0} records per CPU-second, {:.0}/s wall; prost decode + ingest {:.0} = {:.0} per CPU-second; {rej} rejected)",
        bytes as f64 / n as f64,
        ns(enc_cpu),
        ns(prost_cpu),
        ns(scratch_cpu),
        ns(full_cpu - scratch_cpu),
        ns(full_cpu),
        n as f64 / full_cpu,
        n as f64 / full_wall,
        ns(old_cpu),
        n as f64 / old_cpu,
    );
}

/// Rates of one measurement.
struct Rates {
    wall: f64,
    rejected: u64,
    per_shard_cpu: f64,
    per_client_cpu: f64,
    shard_cpu_share: f64,
}

/// What one client stream needs.
struct Stream {
    mode: Mode,
    /// Stream number (salts its communicator ids).
    c: usize,
    names: Vec<String>,
    map: ShardMap,
    comms: usize,
    accepted: Arc<AtomicU64>,
    rejected: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

/// One client stream: sends rounds until `stop`.
async fn client_loop(st: Stream) {
    let Stream {
        mode,
        c,
        names,
        map,
        comms,
        accepted,
        rejected,
        stop,
    } = st;
    let mut g = RecordGen::new(1000 + c as u64, comms, RANKS, 2);
    let owners: Vec<usize> = g.comm_ids().iter().map(|&id| map.owner(id)).collect();
    let count = |rep: ccld_wire::IngestReply| {
        accepted.fetch_add(rep.accepted, Ordering::Relaxed);
        if rep.rejected > 0 && rejected.fetch_add(rep.rejected, Ordering::Relaxed) == 0 {
            eprintln!("first reject: {:?}", rep.reasons.first());
        }
    };
    let channels: Vec<_> = names
        .iter()
        .map(|n| {
            analyzer_net::server::lazy_channel(n, None, Duration::from_secs(2))
                .expect("valid address")
        })
        .collect();
    match mode {
        Mode::Prost => {
            let rpcs: Vec<_> = channels
                .into_iter()
                .map(|ch| {
                    AnalyzerClient::new(ch)
                        .max_encoding_message_size(64 << 20)
                        .max_decoding_message_size(64 << 20)
                })
                .collect();
            while !stop.load(Ordering::Relaxed) {
                let recs = g.round();
                let mut per: Vec<Batch> = (0..names.len()).map(|_| Batch::default()).collect();
                for (i, r) in recs.into_iter().enumerate() {
                    per[owners[i / RANKS as usize]].records.push(r);
                }
                let futs = per
                    .into_iter()
                    .enumerate()
                    .filter(|(_, b)| !b.records.is_empty())
                    .map(|(s, b)| {
                        let mut rpc = rpcs[s].clone();
                        async move { rpc.ingest_one(b).await }
                    });
                for r in futures_util::future::join_all(futs).await {
                    match r {
                        Ok(rep) => count(rep.into_inner()),
                        Err(s) => return eprintln!("ingest failed: {s}"),
                    }
                }
            }
        }
        Mode::Raw => {
            let rpcs: Vec<_> = channels
                .into_iter()
                .map(|ch| tonic::client::Grpc::new(ch).max_decoding_message_size(64 << 20))
                .collect();
            // Each shard's records, kept from round to round and updated in place.
            let mut per: Vec<Vec<OpRecord>> = vec![Vec::new(); names.len()];
            for (i, r) in g.round().into_iter().enumerate() {
                per[owners[i / RANKS as usize]].push(r);
            }
            let mut cap = 0;
            let mut op = 1u64;
            while !stop.load(Ordering::Relaxed) {
                let mut msgs = Vec::new();
                for (s, recs) in per.iter_mut().enumerate() {
                    if recs.is_empty() {
                        continue;
                    }
                    advance(recs, op);
                    let mut buf = Vec::with_capacity(cap);
                    encode_batch(recs.iter(), [], &mut buf);
                    cap = cap.max(buf.len());
                    msgs.push((s, bytes::Bytes::from(buf)));
                }
                op += 1;
                let futs = msgs.into_iter().map(|(s, m)| {
                    let mut rpc = rpcs[s].clone();
                    async move {
                        rpc.ready()
                            .await
                            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                        let path =
                            tonic::codegen::http::uri::PathAndQuery::from_static(INGEST_ONE_PATH);
                        rpc.unary(tonic::Request::new(m), path, PreEncodedCodec)
                            .await
                    }
                });
                for r in futures_util::future::join_all(futs).await {
                    match r {
                        Ok(rep) => count(rep.into_inner()),
                        Err(s) => return eprintln!("ingest failed: {s}"),
                    }
                }
            }
        }
        Mode::Lib => {
            let mut cfg = ClientConfig::new(names.clone());
            cfg.max_message_bytes = 64 << 20;
            let mut client = Client::new(cfg).expect("client");
            let mut batch = Batch {
                records: g.round(),
                heartbeats: vec![],
            };
            let mut op = 1u64;
            while !stop.load(Ordering::Relaxed) {
                advance(&mut batch.records, op);
                op += 1;
                match client.ingest_ref_at(&batch, None).await {
                    Ok(out) => count(ccld_wire::IngestReply {
                        accepted: out.accepted,
                        rejected: out.rejected,
                        reasons: out.reasons,
                    }),
                    Err(e) => return eprintln!("ingest failed: {e}"),
                }
            }
        }
    }
}

/// Moves kept records to round `op` (the fields `RecordGen::round` derives from it).
fn advance(recs: &mut [OpRecord], op: u64) {
    for r in recs {
        if let Some(t) = r.trace.as_mut() {
            t.op_counter = op;
        }
        r.start_ns = op * 5_000_000;
        r.seq = op;
    }
}

/// Runs `o.clients` streams of `mode` against `shards` for `o.seconds`.
fn drive(rt: &tokio::runtime::Runtime, shards: &[SocketAddr], o: &Opts, mode: Mode) -> Rates {
    let names: Vec<String> = shards.iter().map(|a| a.to_string()).collect();
    let map = ShardMap::new(&names).expect("distinct shard addresses");
    let accepted = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let comms = (o.batch / RANKS as usize).max(1);
    let warmup = Duration::from_millis(500);
    let window = Duration::from_secs_f64(o.seconds);
    let (n, dt, all_cpu, shard_cpu) = rt.block_on(async {
        let tasks: Vec<_> = (0..o.clients)
            .map(|c| {
                tokio::spawn(client_loop(Stream {
                    mode,
                    c,
                    names: names.clone(),
                    map: map.clone(),
                    comms,
                    accepted: accepted.clone(),
                    rejected: rejected.clone(),
                    stop: stop.clone(),
                }))
            })
            .collect();
        tokio::time::sleep(warmup).await;
        if let Some((_, shard_cpu)) = o.pin {
            // Threads the shard runtimes started since (blocking pool for the tick).
            pin_threads(SHARD_THREADS, shard_cpu);
        }
        let a0 = accepted.load(Ordering::Relaxed);
        let c0 = cpu_seconds("self");
        let s0 = cpu_seconds_of_threads(SHARD_THREADS);
        let t0 = Instant::now();
        tokio::time::sleep(window).await;
        let a1 = accepted.load(Ordering::Relaxed);
        let dt = t0.elapsed().as_secs_f64();
        let c1 = cpu_seconds("self");
        let s1 = cpu_seconds_of_threads(SHARD_THREADS);
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        let d = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => f64::NAN,
        };
        (a1 - a0, dt, d(c0, c1), d(s0, s1))
    });
    let n = n as f64;
    Rates {
        wall: n / dt,
        rejected: rejected.load(Ordering::Relaxed),
        per_shard_cpu: n / shard_cpu,
        per_client_cpu: n / (all_cpu - shard_cpu),
        shard_cpu_share: shard_cpu / dt,
    }
}

fn shards(n: usize, o: &Opts) -> Vec<ShardProcess> {
    let ls: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback"))
        .collect();
    let names: Vec<String> = ls
        .iter()
        .map(|l| l.local_addr().expect("bound").to_string())
        .collect();
    let map = ShardMap::new(&names).expect("distinct");
    let out: Vec<ShardProcess> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let mut c = ServerConfig::single(EngineConfig::default());
            if n > 1 {
                c.shards = Some(map.clone());
                c.shard_id = i;
            }
            let a = l.local_addr().expect("bound");
            ShardProcess::spawn(c, a, Some(l), o.workers).expect("shard starts")
        })
        .collect();
    if let Some((_, cpu)) = o.pin {
        pin_threads(SHARD_THREADS, cpu);
    }
    out
}

fn main() {
    let o = parse();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "# analyzer ingest rate; CPUs allowed {:?}; {}; batches of {} records ({} comms x {RANKS} ranks), {} client streams on {} client thread(s), {} shard worker(s), {} s windows; load average {}",
        allowed_cpus(),
        match o.pin {
            Some((c, s)) => format!("client pinned to CPU {c}, shards to CPU {s}"),
            None => "not pinned".into(),
        },
        o.batch,
        (o.batch / RANKS as usize).max(1),
        o.clients,
        o.client_threads,
        o.workers,
        o.seconds,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    if let Some((c, _)) = o.pin {
        pin_thread(0, c);
    }
    part_a(o.batch);
    let client_cpu = o.pin.map(|(c, _)| c);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(o.client_threads)
        .thread_name(CLIENT_THREADS)
        .on_thread_start(move || {
            if let Some(c) = client_cpu {
                pin_thread(0, c);
            }
        })
        .enable_all()
        .build()
        .expect("client runtime");
    for n in 1..=o.max_shards {
        let modes: &[Mode] = if n == 1 { &o.modes } else { &[Mode::Raw] };
        for &mode in modes {
            let s = shards(n, &o);
            let addrs: Vec<SocketAddr> = s.iter().map(|p| p.addr).collect();
            let r = drive(&rt, &addrs, &o, mode);
            println!(
                "{}  {n} shard(s), {:5} client: {:.0} records/s wall per shard ({:.0} in total, {} rejected); {:.0} records per CPU-second of the shard threads ({:.2} CPUs busy), {:.0} per CPU-second of the client threads",
                if n == 1 { "B" } else { "C" },
                mode.name(),
                r.wall / n as f64,
                r.wall,
                r.rejected,
                r.per_shard_cpu,
                r.shard_cpu_share,
                r.per_client_cpu,
            );
            for p in s {
                p.stop();
            }
        }
    }
}
