//! Prometheus metrics of one analyzer shard and a minimal HTTP endpoint serving them.
//!
//! The registry is a fixed set of counters, gauges and histograms (lock-free atomics, plus
//! small maps for labelled counters whose label values are open-ended such as a reject
//! reason). [`Metrics::render`] writes the Prometheus text exposition format (0.0.4).
//! [`serve_http`] answers `GET /metrics` on a TCP listener; anything else gets 404/405.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Upper bounds (seconds) of the latency histogram buckets: 10 us .. 10 s.
pub const LATENCY_BUCKETS_S: [f64; 16] = [
    0.000_01, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 1.0, 2.5, 10.0,
];

/// A fixed-bucket histogram of durations.
#[derive(Debug)]
pub struct Histogram {
    bounds_ns: Vec<u64>,
    bounds_s: Vec<f64>,
    buckets: Vec<AtomicU64>,
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// A histogram with the given upper bounds in seconds (ascending).
    pub fn new(bounds_s: &[f64]) -> Self {
        Self {
            bounds_ns: bounds_s.iter().map(|b| (b * 1e9).round() as u64).collect(),
            bounds_s: bounds_s.to_vec(),
            buckets: bounds_s.iter().map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation of `ns` nanoseconds.
    pub fn observe_ns(&self, ns: u64) {
        if let Some(i) = self.bounds_ns.iter().position(|&b| ns <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a [`Duration`].
    pub fn observe(&self, d: Duration) {
        self.observe_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Sum of observations in ns.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cum = 0u64;
        for (b, c) in self.bounds_s.iter().zip(&self.buckets) {
            cum += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_ns() as f64 / 1e9);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// A counter family with one open-ended label.
#[derive(Debug, Default)]
pub struct LabelledCounter {
    values: Mutex<BTreeMap<String, u64>>,
}

impl LabelledCounter {
    /// Adds `n` to the counter with label value `label`.
    pub fn add(&self, label: &str, n: u64) {
        if n == 0 {
            return;
        }
        // A poisoned map only means another thread panicked mid-update of a counter:
        // keep counting with the data as it is.
        let mut m = self.values.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(label.to_string()).or_insert(0) += n;
    }

    /// Current value for `label` (0 when never incremented).
    pub fn get(&self, label: &str) -> u64 {
        let m = self.values.lock().unwrap_or_else(|p| p.into_inner());
        m.get(label).copied().unwrap_or(0)
    }

    /// Sum over all labels.
    pub fn total(&self) -> u64 {
        let m = self.values.lock().unwrap_or_else(|p| p.into_inner());
        m.values().sum()
    }

    fn render(&self, out: &mut String, name: &str, label: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        let m = self.values.lock().unwrap_or_else(|p| p.into_inner());
        for (k, v) in m.iter() {
            let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {v}", escape_label(k));
        }
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// All metrics of one shard.
#[derive(Debug)]
pub struct Metrics {
    /// Shard index (exported as a constant gauge).
    pub shard_id: u64,
    /// Records accepted by the engine.
    pub records_ingested: AtomicU64,
    /// Records rejected, by reason.
    pub records_rejected: LabelledCounter,
    /// Heartbeats accepted.
    pub heartbeats: AtomicU64,
    /// Ingest batches received.
    pub batches: AtomicU64,
    /// Records accepted here although another shard owns their communicator (failover).
    pub records_not_owned: AtomicU64,
    /// Diagnoses produced, by class.
    pub diagnoses: LabelledCounter,
    /// RPCs refused for a missing or wrong token.
    pub auth_failures: AtomicU64,
    /// RPCs refused for malformed arguments, by method.
    pub bad_requests: LabelledCounter,
    /// Fan-out calls to peer shards that failed, by peer.
    pub fanout_failures: LabelledCounter,
    /// Store write/read failures.
    pub store_errors: AtomicU64,
    /// Time from an anomaly becoming detectable to its diagnosis.
    pub location_latency: Histogram,
    /// Wall time of one engine tick (detection + location over all communicators).
    pub tick_duration: Histogram,
    /// Communicators tracked by the engine (gauge).
    pub comms_tracked: AtomicU64,
    /// Engine memory estimate in bytes (gauge).
    pub engine_memory_bytes: AtomicU64,
    /// Current Watch subscribers (gauge).
    pub watch_subscribers: AtomicU64,
}

impl Metrics {
    /// A zeroed registry for shard `shard_id`.
    pub fn new(shard_id: u64) -> Self {
        Self {
            shard_id,
            records_ingested: AtomicU64::new(0),
            records_rejected: LabelledCounter::default(),
            heartbeats: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            records_not_owned: AtomicU64::new(0),
            diagnoses: LabelledCounter::default(),
            auth_failures: AtomicU64::new(0),
            bad_requests: LabelledCounter::default(),
            fanout_failures: LabelledCounter::default(),
            store_errors: AtomicU64::new(0),
            location_latency: Histogram::new(&LATENCY_BUCKETS_S),
            tick_duration: Histogram::new(&LATENCY_BUCKETS_S),
            comms_tracked: AtomicU64::new(0),
            engine_memory_bytes: AtomicU64::new(0),
            watch_subscribers: AtomicU64::new(0),
        }
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(4096);
        let c = |o: &mut String, name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}");
            let _ = writeln!(o, "# TYPE {name} {kind}");
            let _ = writeln!(o, "{name} {v}");
        };
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        c(
            &mut o,
            "ccld_shard_id",
            "Index of this shard in the shard list.",
            "gauge",
            self.shard_id,
        );
        c(
            &mut o,
            "ccld_records_ingested_total",
            "Per-rank operation records accepted by the engine.",
            "counter",
            ld(&self.records_ingested),
        );
        self.records_rejected.render(
            &mut o,
            "ccld_records_rejected_total",
            "reason",
            "Records rejected, by reason.",
        );
        c(
            &mut o,
            "ccld_heartbeats_total",
            "Probe heartbeats accepted.",
            "counter",
            ld(&self.heartbeats),
        );
        c(
            &mut o,
            "ccld_ingest_batches_total",
            "Ingest batches received.",
            "counter",
            ld(&self.batches),
        );
        c(
            &mut o,
            "ccld_records_not_owned_total",
            "Records accepted for communicators owned by another shard (client failover).",
            "counter",
            ld(&self.records_not_owned),
        );
        self.diagnoses.render(
            &mut o,
            "ccld_diagnoses_total",
            "class",
            "Diagnoses produced by this shard, by anomaly class.",
        );
        c(
            &mut o,
            "ccld_auth_failures_total",
            "RPCs refused for a missing or wrong bearer token.",
            "counter",
            ld(&self.auth_failures),
        );
        self.bad_requests.render(
            &mut o,
            "ccld_bad_requests_total",
            "method",
            "RPCs refused for invalid arguments, by method.",
        );
        self.fanout_failures.render(
            &mut o,
            "ccld_fanout_failures_total",
            "peer",
            "Cluster fan-out calls to a peer shard that failed, by peer.",
        );
        c(
            &mut o,
            "ccld_store_errors_total",
            "Diagnosis store failures.",
            "counter",
            ld(&self.store_errors),
        );
        self.location_latency.render(
            &mut o,
            "ccld_location_latency_seconds",
            "Time from an anomaly becoming detectable to its diagnosis.",
        );
        self.tick_duration.render(
            &mut o,
            "ccld_tick_duration_seconds",
            "Wall time of one engine tick (detection and location).",
        );
        c(
            &mut o,
            "ccld_communicators_tracked",
            "Communicators with live state in the engine.",
            "gauge",
            ld(&self.comms_tracked),
        );
        c(
            &mut o,
            "ccld_engine_memory_bytes",
            "Engine memory estimate.",
            "gauge",
            ld(&self.engine_memory_bytes),
        );
        c(
            &mut o,
            "ccld_process_resident_memory_bytes",
            "Resident set size of the process.",
            "gauge",
            process_rss_bytes().unwrap_or(0),
        );
        c(
            &mut o,
            "ccld_watch_subscribers",
            "Open Watch streams.",
            "gauge",
            ld(&self.watch_subscribers),
        );
        o
    }
}

/// Resident set size of this process from `/proc/self/status` (Linux), in bytes.
pub fn process_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Parses a Prometheus text exposition into `(series, value)` pairs (comments skipped);
/// used by tests and the CLI.
pub fn parse_text(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

const MAX_REQUEST_HEAD: usize = 8192;

async fn handle_conn(mut s: tokio::net::TcpStream, m: Arc<Metrics>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            break;
        }
        if buf.len() > MAX_REQUEST_HEAD {
            s.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await?;
            return Ok(());
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let first = head.lines().next().unwrap_or("");
    let mut parts = first.split_whitespace();
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("");
    let (status, ctype, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4", m.render()),
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_string(),
        ),
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(resp.as_bytes()).await?;
    s.shutdown().await
}

/// Serves `GET /metrics` (and `GET /healthz`) on `listener` until `shutdown` resolves.
/// Each connection answers one request and closes; a client that sends nothing for 5 s is
/// dropped.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            acc = listener.accept() => match acc {
                Ok((s, _)) => {
                    let m = metrics.clone();
                    tokio::spawn(async move {
                        let r = tokio::time::timeout(Duration::from_secs(5), handle_conn(s, m)).await;
                        if let Ok(Err(e)) = r {
                            tracing::debug!(target: "ccld::metrics", "metrics connection: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(target: "ccld::metrics", "metrics accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.001, 0.01]);
        h.observe_ns(500_000); // 0.5 ms -> first bucket
        h.observe_ns(1_000_000); // exactly 1 ms -> first bucket (le)
        h.observe_ns(5_000_000); // second
        h.observe_ns(50_000_000); // +Inf only
        let mut s = String::new();
        h.render(&mut s, "x", "help");
        let p = parse_text(&s);
        let get = |k: &str| p.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert_eq!(get("x_bucket{le=\"0.001\"}"), Some(2.0));
        assert_eq!(get("x_bucket{le=\"0.01\"}"), Some(3.0));
        assert_eq!(get("x_bucket{le=\"+Inf\"}"), Some(4.0));
        assert_eq!(get("x_count"), Some(4.0));
        assert_eq!(get("x_sum"), Some(0.0565));
    }

    #[test]
    fn labelled_counters_render_and_escape() {
        let m = Metrics::new(3);
        m.records_rejected.add("rank_out_of_range", 2);
        m.records_rejected.add("rank_out_of_range", 1);
        m.records_rejected.add("we\"ird", 1);
        m.records_rejected.add("zero", 0);
        m.records_ingested.fetch_add(10, Ordering::Relaxed);
        let t = m.render();
        let p = parse_text(&t);
        let get = |k: &str| p.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        assert_eq!(
            get("ccld_records_rejected_total{reason=\"rank_out_of_range\"}"),
            Some(3.0)
        );
        assert_eq!(
            get("ccld_records_rejected_total{reason=\"we\\\"ird\"}"),
            Some(1.0)
        );
        assert_eq!(get("ccld_records_rejected_total{reason=\"zero\"}"), None);
        assert_eq!(get("ccld_records_ingested_total"), Some(10.0));
        assert_eq!(get("ccld_shard_id"), Some(3.0));
        assert_eq!(m.records_rejected.total(), 4);
        // Every sample line has a TYPE line for its family.
        for (k, _) in &p {
            let fam = k.split('{').next().unwrap();
            let base = fam
                .trim_end_matches("_bucket")
                .trim_end_matches("_sum")
                .trim_end_matches("_count");
            assert!(
                t.contains(&format!("# TYPE {base} ")) || t.contains(&format!("# TYPE {fam} ")),
                "{k}"
            );
        }
    }

    #[test]
    fn rss_is_readable_on_linux() {
        let r = process_rss_bytes().unwrap();
        assert!(r > 0);
    }

    #[tokio::test]
    async fn http_endpoint_serves_metrics_404_and_405() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let m = Arc::new(Metrics::new(0));
        m.auth_failures.fetch_add(7, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let h = tokio::spawn(serve_http(l, m, async {
            let _ = rx.await;
        }));
        async fn get(addr: std::net::SocketAddr, req: &str) -> String {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        }
        let r = tokio::time::timeout(Duration::from_secs(5), async {
            let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
            let nf = get(addr, "GET /nope HTTP/1.1\r\n\r\n").await;
            let na = get(addr, "POST /metrics HTTP/1.1\r\n\r\n").await;
            (ok, nf, na)
        })
        .await
        .unwrap();
        assert!(r.0.starts_with("HTTP/1.1 200 OK"), "{}", r.0);
        assert!(r.0.contains("\nccld_auth_failures_total 7\n"));
        assert!(r.1.starts_with("HTTP/1.1 404"));
        assert!(r.2.starts_with("HTTP/1.1 405"));
        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .unwrap()
            .unwrap();
    }
}
