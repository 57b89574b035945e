//! Ingest rate of analyzer shards.
//!
//! A. Server-side capacity of one core: protobuf decode of 4,096-record batches plus
//!    `Engine::ingest`, single thread, no network (what one shard core can absorb).
//! B. One shard on loopback gRPC: C concurrent client streams, each sending batches of
//!    B records (generated on the fly, completed records of 64-rank communicators) through
//!    `IngestOne`; records/s the shard accepted. Client and server share this machine's
//!    cores, so this is a lower bound of the shard's rate.
//! C. 2 and 3 shards on loopback, records routed to their owner by rendezvous hashing.
//!
//! Target (design.md section 8): >= 1,000,000 records/s per shard, batched.
//!
//! Wall-clock rates depend on how busy the machine is; the per-CPU-second figures (from
//! /proc) do much less.
//!
//! Usage: analyzer_ingest [--seconds S] [--clients C] [--batch B] [--workers W]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use analyzer::engine::EngineConfig;
use analyzer::server::{ServerConfig, ShardProcess};
use analyzer::shard::ShardMap;
use analyzer::wire::analyzer_client::AnalyzerClient;
use analyzer::wire::Batch;
use analyzer::Engine;
use benches::analyzer_util::{cpu_seconds, cpu_seconds_of_threads, RecordGen};
use prost::Message;

const RANKS: u32 = 64;

struct Opts {
    seconds: f64,
    clients: usize,
    batch: usize,
    workers: usize,
}

fn parse() -> Opts {
    let mut o = Opts {
        seconds: 4.0,
        clients: 4,
        batch: 4096,
        workers: 2,
    };
    let a: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < a.len() {
        let v = a.get(i + 1).and_then(|s| s.parse::<f64>().ok());
        match (a[i].as_str(), v) {
            ("--seconds", Some(v)) if v > 0.0 => o.seconds = v,
            ("--clients", Some(v)) if v >= 1.0 => o.clients = v as usize,
            ("--batch", Some(v)) if v >= 64.0 => o.batch = v as usize,
            ("--workers", Some(v)) if v >= 1.0 => o.workers = v as usize,
            _ => {
                eprintln!(
                    "usage: analyzer_ingest [--seconds S] [--clients C] [--batch B>=64] [--workers W]"
                );
                std::process::exit(2);
            }
        }
        i += 2;
    }
    o
}

fn part_a(batch: usize) {
    let comms = (batch / RANKS as usize).max(1);
    let mut g = RecordGen::new(1, comms, RANKS, 2);
    let rounds = 250;
    let encoded: Vec<Vec<u8>> = (0..rounds)
        .map(|_| {
            Batch {
                records: g.round(),
                heartbeats: vec![],
            }
            .encode_to_vec()
        })
        .collect();
    let bytes: usize = encoded.iter().map(Vec::len).sum();
    let mut e = Engine::new(EngineConfig::default());
    let now = 1_700_000_000_000_000_000u64;
    let c0 = cpu_seconds("thread-self");
    let t0 = Instant::now();
    let mut n = 0u64;
    let mut rej = 0u64;
    for buf in &encoded {
        let b = Batch::decode(buf.as_slice()).expect("own encoding decodes");
        for r in &b.records {
            match e.ingest(r, now) {
                Ok(()) => n += 1,
                Err(_) => rej += 1,
            }
        }
    }
    let dt = t0.elapsed().as_secs_f64();
    let cpu = match (c0, cpu_seconds("thread-self")) {
        (Some(a), Some(b)) if b > a => format!(
            "; {:.2} CPU s = {:.0} records per CPU-second",
            b - a,
            n as f64 / (b - a)
        ),
        _ => String::new(),
    };
    println!(
        "A  decode+ingest, 1 thread: {n} records in {dt:.3} s wall = {:.0} records/s{cpu} ({:.0} B/record on the wire, {rej} rejected)",
        n as f64 / dt,
        bytes as f64 / (n + rej).max(1) as f64
    );
}

/// Runs `clients` senders against `shards` for `secs`; returns accepted records/s.
fn drive(rt: &tokio::runtime::Runtime, shards: &[SocketAddr], o: &Opts) -> (f64, u64, f64, f64) {
    let names: Vec<String> = shards.iter().map(|a| a.to_string()).collect();
    let map = ShardMap::new(&names).expect("distinct shard addresses");
    let accepted = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cpu = AtomicU64::new(0);
    let shard_cpu = AtomicU64::new(0);
    let comms = (o.batch / RANKS as usize).max(1);
    let warmup = Duration::from_millis(500);
    let window = Duration::from_secs_f64(o.seconds);
    let (t_meas, a0) = rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..o.clients {
            let accepted = accepted.clone();
            let rejected = rejected.clone();
            let stop = stop.clone();
            let map = map.clone();
            let names = names.clone();
            tasks.push(tokio::spawn(async move {
                let mut rpcs = Vec::new();
                for n in &names {
                    let ch = analyzer::server::lazy_channel(n, None, Duration::from_secs(2))
                        .expect("valid address");
                    rpcs.push(
                        AnalyzerClient::new(ch)
                            .max_encoding_message_size(64 << 20)
                            .max_decoding_message_size(64 << 20),
                    );
                }
                let mut g = RecordGen::new(1000 + c as u64, comms, RANKS, 2);
                let owners: Vec<usize> = g.comm_ids().iter().map(|&id| map.owner(id)).collect();
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
                            Ok(rep) => {
                                let rep = rep.into_inner();
                                accepted.fetch_add(rep.accepted, Ordering::Relaxed);
                                if rep.rejected > 0
                                    && rejected.fetch_add(rep.rejected, Ordering::Relaxed) == 0
                                {
                                    eprintln!("first reject: {:?}", rep.reasons.first());
                                }
                            }
                            Err(s) => {
                                eprintln!("ingest failed: {s}");
                                return;
                            }
                        }
                    }
                }
            }));
        }
        tokio::time::sleep(warmup).await;
        let a0 = accepted.load(Ordering::Relaxed);
        let c0 = cpu_seconds("self");
        let s0 = cpu_seconds_of_threads("ccld-shard");
        let t0 = Instant::now();
        tokio::time::sleep(window).await;
        let a1 = accepted.load(Ordering::Relaxed);
        let dt = t0.elapsed();
        if let (Some(c0), Some(c1)) = (c0, cpu_seconds("self")) {
            cpu.store(((c1 - c0) * 1000.0) as u64, Ordering::Relaxed);
        }
        if let (Some(s0), Some(s1)) = (s0, cpu_seconds_of_threads("ccld-shard")) {
            shard_cpu.store(((s1 - s0) * 1000.0) as u64, Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        (dt, a1 - a0)
    });
    let cpu_s = cpu.load(Ordering::Relaxed) as f64 / 1000.0;
    let shard_s = shard_cpu.load(Ordering::Relaxed) as f64 / 1000.0;
    (
        a0 as f64 / t_meas.as_secs_f64(),
        rejected.load(Ordering::Relaxed),
        if cpu_s > 0.0 {
            a0 as f64 / cpu_s
        } else {
            f64::NAN
        },
        if shard_s > 0.0 {
            a0 as f64 / shard_s
        } else {
            f64::NAN
        },
    )
}

fn shards(n: usize, workers: usize) -> Vec<ShardProcess> {
    let ls: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback"))
        .collect();
    let names: Vec<String> = ls
        .iter()
        .map(|l| l.local_addr().expect("bound").to_string())
        .collect();
    let map = ShardMap::new(&names).expect("distinct");
    ls.into_iter()
        .enumerate()
        .map(|(i, l)| {
            let mut c = ServerConfig::single(EngineConfig::default());
            if n > 1 {
                c.shards = Some(map.clone());
                c.shard_id = i;
            }
            let a = l.local_addr().expect("bound");
            ShardProcess::spawn(c, a, Some(l), workers).expect("shard starts")
        })
        .collect()
}

fn main() {
    let o = parse();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!(
        "# analyzer ingest rate; {cores} CPU cores visible; batches of {} records ({} comms x {RANKS} ranks), {} client streams, {} s windows",
        o.batch,
        (o.batch / RANKS as usize).max(1),
        o.clients,
        o.seconds
    );
    part_a(o.batch);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime");
    for n in 1..=3usize {
        let s = shards(n, o.workers);
        let addrs: Vec<SocketAddr> = s.iter().map(|p| p.addr).collect();
        let (rate, rej, per_cpu, per_shard_cpu) = drive(&rt, &addrs, &o);
        println!(
            "{}  {n} shard(s) on loopback gRPC: {rate:.0} records/s in total, {:.0} per shard ({rej} rejected); {per_cpu:.0} records per CPU-second of clients + shards together, {per_shard_cpu:.0} per CPU-second of the shard threads alone",
            if n == 1 { "B" } else { "C" },
            rate / n as f64
        );
        for p in s {
            p.stop();
        }
    }
}
