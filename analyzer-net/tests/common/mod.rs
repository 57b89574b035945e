//! Helpers shared by the analyzer service tests: shards on loopback ephemeral ports,
//! hand-made records, a tiny HTTP GET, time-bounded waits.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use analyzer::engine::EngineConfig;
use analyzer_net::server::{ServerConfig, ShardProcess};
use ccld_wire::{Batch, ChannelStat, OpRecord, OpState, OpTypeSet, TraceId};

pub const LOOPBACK: &str = "127.0.0.1:0";

/// Binds an ephemeral loopback port (kept bound until the shard takes it).
pub fn bind() -> TcpListener {
    TcpListener::bind(LOOPBACK).expect("bind loopback")
}

/// Starts a shard with `cfg` on a fresh ephemeral port.
pub fn spawn(cfg: ServerConfig) -> ShardProcess {
    let l = bind();
    let a = l.local_addr().unwrap();
    ShardProcess::spawn(cfg, a, Some(l), 2).expect("start shard")
}

/// A single-shard config with a fast tick and metrics on an ephemeral port.
pub fn single(engine: EngineConfig) -> ServerConfig {
    let mut c = ServerConfig::single(engine);
    c.tick_interval = Duration::from_millis(50);
    c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    c
}

/// A completed record of `comm`/`op` for `rank` of `nranks`.
pub fn rec(comm: u64, op: u64, rank: u32, nranks: u32, dur_ns: u64) -> OpRecord {
    OpRecord {
        trace: Some(TraceId {
            comm_id: comm,
            op_counter: op,
            extension: 0,
        }),
        rank,
        nranks,
        host: "testhost".into(),
        pid: 1000 + rank,
        op: Some(OpTypeSet {
            collective: 0,
            algorithm: 0,
            protocol: 0,
            dtype: 7,
            count: 1 << 20,
            bytes: 4 << 20,
            redop: 0,
            root: -1,
            peer: -1,
            n_channels: 1,
            tree_layer: vec![],
        }),
        start_ns: op * 10_000_000,
        duration_ns: dur_ns,
        channels: vec![ChannelStat {
            send_count: 8,
            recv_count: 8,
            expected_send: 8,
            expected_recv: 8,
            send_rate: 1.0,
            recv_rate: 1.0,
            ..Default::default()
        }],
        state: OpState::Completed as i32,
        seq: op,
        device: -1,
        cpu_wait_ns: None,
        frozen_ns: None,
        duration_estimated: false,
        elsewhere_ns: None,
        peer_wire: Vec::new(),
        gap_ns: None,
        stride: 0,
        failure: 0,
        peer_lost: None,
        mismatch: None,
        seq_space: 0,
        p2p: Vec::new(),
    }
}

/// All ranks of `ops` rounds of one communicator.
pub fn rounds(comm: u64, nranks: u32, ops: std::ops::Range<u64>) -> Batch {
    let mut b = Batch::default();
    for op in ops {
        for r in 0..nranks {
            b.records.push(rec(comm, op, r, nranks, 1_000_000));
        }
    }
    b
}

/// `GET path` over plain HTTP/1.1; returns (status line, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// Value of one metric series in a Prometheus text body.
pub fn metric(body: &str, series: &str) -> Option<f64> {
    analyzer_net::metrics::parse_text(body)
        .into_iter()
        .find(|(k, _)| k == series)
        .map(|(_, v)| v)
}

/// Polls `f` every 20 ms until it returns Some or `limit` passes.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
