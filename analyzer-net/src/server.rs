//! The analyzer shard: a tonic gRPC server around the pure [`Engine`].
//!
//! * **Ingest** (`Ingest` client stream, `IngestOne`, decoded by [`crate::codec`] into
//!   reused records, see the `ingest` submodule): each record goes to
//!   [`Engine::ingest`] with the shard's wall clock; rejects are counted by reason. A shard
//!   accepts records for communicators it does not own (a client failing over from a
//!   down owner sends them here): the engine state of that communicator then lives on this
//!   shard until the owner is back and the client returns to it, after which the two
//!   shards each hold part of its history. Such records are counted in
//!   `ccld_records_not_owned_total`.
//! * **Tick**: a task calls [`Engine::tick`] every `tick_interval` with the wall clock.
//!   New diagnoses get a cluster-unique id (`s<shard>-<seq>`) and the shard name, are
//!   written to the shard's [`History`] (before anyone is told about them), broadcast to `Watch`
//!   subscribers and counted in the metrics.
//! * **Queries**: `ListAnomalies`, `ListComms`, `GetComm` and `Watch` answer for the whole
//!   cluster: the shard asks its peers with `local_only = true` (so the fan-out does not
//!   loop), merges, and names the peers it could not reach in `unreachable_shards`.
//! * **Security**: an optional bearer token (every RPC, refusals counted) and TLS.
//! * **Bad input**: messages over `max_message_bytes` are refused by the codec; the engine
//!   rejects inconsistent records; nothing here panics on input.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::Stream;
use tokio::sync::{broadcast, mpsc, oneshot};
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

mod feed;
mod ingest;
mod process;

pub use feed::{DiagnosisFeed, Feed, IncidentFeed};
pub use process::ShardProcess;

use crate::auth::{AuthInterceptor, TokenInterceptor};
use crate::codec::IngestFastPath;
use crate::grpc::analyzer_client::AnalyzerClient;
use crate::grpc::analyzer_server::{Analyzer, AnalyzerServer};
use crate::history::{
    History, HistoryError, MemoryHistory, Query, StoredDiagnosis, StoredIncident,
};
use crate::metrics::{self, Metrics};
use crate::shard::ShardMap;
use analyzer::engine::{Engine, EngineConfig};
use ccld_wire::{
    AnomalyClass, AnomalyList, Batch, CommList, CommState, CommSummary, Diagnosis, GetCommRequest,
    Incident, IncidentList, IngestReply, ListAnomaliesRequest, ListCommsRequest,
    ListIncidentsRequest, WatchRequest,
};

/// Default limit of `ListAnomalies` when the request says 0.
pub const DEFAULT_LIST_LIMIT: usize = 1000;
/// Default largest accepted gRPC message (a batch), bytes.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Reasons returned in an `IngestReply` at most.
pub const MAX_REPLY_REASONS: usize = 16;

/// Wall clock in ns since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Short, stable name of an anomaly class (`H1` .. `S3`), used as metric label and in
/// tables.
pub fn class_name(c: i32) -> &'static str {
    match AnomalyClass::try_from(c) {
        Ok(AnomalyClass::H1NotEntered) => "H1",
        Ok(AnomalyClass::H2Inconsistent) => "H2",
        Ok(AnomalyClass::H3Hardware) => "H3",
        Ok(AnomalyClass::S1ComputationSlow) => "S1",
        Ok(AnomalyClass::S2CommunicationSlow) => "S2",
        Ok(AnomalyClass::S3MixedSlow) => "S3",
        _ => "unspecified",
    }
}

/// Errors starting or running a shard.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding or configuring a socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The shard's history could not be read.
    #[error(transparent)]
    History(#[from] HistoryError),
    /// TLS configuration was refused by the transport.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// The transport failed while serving.
    #[error("gRPC server: {0}")]
    Transport(String),
    /// A peer address cannot be turned into an endpoint.
    #[error("peer shard {peer:?}: {reason}")]
    Peer {
        /// Peer name.
        peer: String,
        /// What is wrong.
        reason: String,
    },
    /// The configuration is inconsistent.
    #[error("configuration: {0}")]
    Config(String),
    /// Building the runtime failed.
    #[error("cannot start runtime: {0}")]
    Runtime(std::io::Error),
}

/// Metadata key carrying the sender's notion of "now" (ns) in [`ClockMode::Driven`].
pub const NOW_METADATA: &str = "ccld-now-ns";

/// Where a shard's notion of the current time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClockMode {
    /// The wall clock; a tick task runs every `tick_interval` (production).
    #[default]
    Wall,
    /// Time is driven by the ingest calls: each carries `ccld-now-ns` metadata, the shard's
    /// clock moves to it (never backwards) and the engine ticks after the batch. For
    /// replaying recordings and running simulations faster than real time
    /// (`ccld simulate --compressed`); never for live probes.
    Driven,
}

/// How a shard talks to its peers during fan-out.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// TLS for peer connections (normally the CA that signed every shard's certificate).
    pub tls: Option<ClientTlsConfig>,
    /// Token sent to peers (normally the shard's own token).
    pub token: Option<String>,
    /// Per-call deadline of a fan-out call.
    pub timeout: Duration,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
}

impl Default for PeerConfig {
    fn default() -> Self {
        Self {
            tls: None,
            token: None,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_millis(500),
        }
    }
}

/// Monotonic nanoseconds since the first call: the clock that times location steps.
fn cost_clock_ns() -> u64 {
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Configuration of one shard.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// This shard's index in `shards` (0 when running alone).
    pub shard_id: usize,
    /// The cluster's shard list (`None`: a single shard).
    pub shards: Option<ShardMap>,
    /// Where diagnoses and incidents are kept (`None`: a [`MemoryHistory`], lost when
    /// the process ends; `ccld serve --data-dir` passes its SQLite history).
    pub history: Option<Arc<dyn History>>,
    /// Required bearer token.
    pub token: Option<String>,
    /// TLS identity.
    pub tls: Option<ServerTlsConfig>,
    /// Peer connection settings for fan-out.
    pub peer: PeerConfig,
    /// Where to serve Prometheus metrics (`None`: not served).
    pub metrics_listen: Option<SocketAddr>,
    /// Detection parameters.
    pub engine: EngineConfig,
    /// Period of the engine tick.
    pub tick_interval: Duration,
    /// Largest accepted gRPC message.
    pub max_message_bytes: usize,
    /// Clock source.
    pub clock: ClockMode,
}

impl ServerConfig {
    /// A single in-memory shard with default detection parameters.
    pub fn single(engine: EngineConfig) -> Self {
        Self {
            shard_id: 0,
            shards: None,
            history: None,
            token: None,
            tls: None,
            peer: PeerConfig::default(),
            metrics_listen: None,
            engine,
            tick_interval: Duration::from_millis(200),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            clock: ClockMode::Wall,
        }
    }

    /// The name this shard reports in diagnoses and states.
    pub fn shard_name(&self, listen: SocketAddr) -> String {
        match &self.shards {
            Some(m) => m
                .name(self.shard_id)
                .map(str::to_string)
                .unwrap_or_else(|| listen.to_string()),
            None => listen.to_string(),
        }
    }
}

type PeerClient = AnalyzerClient<InterceptedService<Channel, TokenInterceptor>>;

struct Peer {
    name: String,
    client: PeerClient,
}

/// Shared state of one shard (what every RPC handler sees).
struct Shared {
    shard_id: usize,
    shard_name: String,
    shards: Option<ShardMap>,
    engine: Mutex<Engine>,
    store: Arc<dyn History>,
    next_seq: AtomicU64,
    metrics: Arc<Metrics>,
    tx: broadcast::Sender<Diagnosis>,
    itx: broadcast::Sender<Incident>,
    peers: Vec<Peer>,
    peer_timeout: Duration,
    auth: AuthInterceptor,
    clock: ClockMode,
    /// Driven clock value (ns); unused with the wall clock.
    driven_now: AtomicU64,
}

/// Time from "detectable" to "diagnosed" for a diagnosis: for hangs, the onset plus the
/// hang threshold; for slow anomalies, the end of the detection window that flagged it.
fn location_latency_ns(d: &Diagnosis) -> u64 {
    let ev = d.evidence.as_ref();
    let detectable = match AnomalyClass::try_from(d.class) {
        Ok(
            AnomalyClass::H1NotEntered | AnomalyClass::H2Inconsistent | AnomalyClass::H3Hardware,
        ) => {
            let th = ev.map(|e| e.hang_threshold_ns).unwrap_or(0);
            d.onset_ns.saturating_add(th)
        }
        _ => ev
            .map(|e| e.window_end_ns)
            .filter(|&w| w > 0)
            .unwrap_or(d.onset_ns),
    };
    d.detected_at_ns.saturating_sub(detectable)
}

impl Shared {
    fn now(&self) -> u64 {
        match self.clock {
            ClockMode::Wall => now_ns(),
            ClockMode::Driven => self.driven_now.load(Ordering::Relaxed),
        }
    }

    /// Driven clock: moves time to the request's `ccld-now-ns` (never backwards).
    fn drive_clock<T>(&self, req: &Request<T>) -> bool {
        if self.clock != ClockMode::Driven {
            return false;
        }
        let v = req
            .metadata()
            .get(NOW_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse::<u64>().ok());
        match v {
            Some(t) => {
                self.driven_now.fetch_max(t, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    fn engine(&self) -> std::sync::MutexGuard<'_, Engine> {
        // The engine is pure and does not panic on input; should it ever, keep serving
        // with its state as it is rather than failing every later call.
        self.engine.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tick loop did not run for a while: see [`Engine::note_pause`].
    fn note_pause(&self) {
        let now = self.now();
        tracing::info!(target: "ccld::tick",
            "the analyzer's ticks paused (its process stopped or starved): hang checks wait one hang threshold");
        self.engine().note_pause(now);
    }

    /// One engine tick: diagnose, persist, publish. Returns the new diagnoses.
    fn tick(&self) -> Vec<Diagnosis> {
        let now = self.now();
        let t0 = Instant::now();
        let (mut diags, incidents, ncomms, mem) = {
            let mut eng = self.engine();
            let mono = Instant::now();
            let mut clock = || u64::try_from(mono.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let d = eng.tick_with_clock(now, &mut clock);
            let inc = eng.take_incidents();
            (d, inc, eng.comm_ids().len(), eng.memory_bytes())
        };
        let cost = t0.elapsed();
        let m = &self.metrics;
        m.tick_duration.observe(cost);
        m.comms_tracked.store(ncomms as u64, Ordering::Relaxed);
        m.engine_memory_bytes.store(mem as u64, Ordering::Relaxed);
        if diags.is_empty() {
            self.publish_incidents(incidents, &diags);
            return diags;
        }
        let mut rows = Vec::with_capacity(diags.len());
        for d in &mut diags {
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            let id = StoredDiagnosis::make_id(self.shard_id, seq);
            d.id = format_diag_id(id);
            d.shard = self.shard_name.clone();
            if d.detected_at_ns == 0 {
                d.detected_at_ns = now;
            }
            rows.push(StoredDiagnosis {
                id,
                comm_id: d.comm_id,
                class: class_name(d.class).to_string(),
                detected_ns: d.detected_at_ns,
                payload: prost::Message::encode_to_vec(&*d),
            });
        }
        if let Err(e) = self.store.insert_all(&rows) {
            m.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(target: "ccld::store", "cannot persist {} diagnoses: {e}", rows.len());
        }
        for d in &diags {
            m.diagnoses.add(class_name(d.class), 1);
            m.location_latency.observe_ns(location_latency_ns(d));
            tracing::warn!(
                target: "ccld::diagnosis",
                comm_id = d.comm_id,
                class = class_name(d.class),
                "{}: {}",
                d.id,
                d.summary
            );
            // No subscriber is fine.
            let _ = self.tx.send(d.clone());
        }
        self.publish_incidents(incidents, &diags);
        diags
    }

    /// Gives the engine's new incidents the service's diagnosis ids, persists them with
    /// the diagnoses (a restarted shard still answers `ListIncidents`) and publishes them
    /// to the incident feeds.
    fn publish_incidents(&self, incidents: Vec<Incident>, diags: &[Diagnosis]) {
        if incidents.is_empty() {
            return;
        }
        let mut rows = Vec::with_capacity(incidents.len());
        for mut inc in incidents {
            analyzer::incident::adopt_ids(&mut inc, diags);
            tracing::warn!(target: "ccld::incident", comm_id = inc.comm_id, "{}", inc.summary);
            let mut comm_ids: Vec<u64> = std::iter::once(inc.comm_id)
                .chain(inc.evidence.iter().map(|d| d.comm_id))
                .collect();
            comm_ids.sort_unstable();
            comm_ids.dedup();
            rows.push(StoredIncident {
                id: inc.id.clone(),
                comm_ids,
                detected_ns: inc.detected_at_ns,
                payload: prost::Message::encode_to_vec(&inc),
            });
            // No subscriber is fine.
            let _ = self.itx.send(inc);
        }
        if let Err(e) = self.store.insert_incidents(&rows) {
            self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(target: "ccld::store", "cannot persist {} incidents: {e}", rows.len());
        }
    }

    /// This shard's incidents, newest first, at most `limit` (from the store).
    fn local_incidents(
        &self,
        comm_id: Option<u64>,
        since_ns: u64,
        limit: usize,
    ) -> Result<Vec<Incident>, Status> {
        let rows = self
            .store
            .list_incidents(comm_id, since_ns, limit)
            .map_err(|e| self.store_failed("incident", &e))?;
        Ok(self.decode_stored(
            "incident",
            rows.iter().map(|r| (r.id.as_str(), r.payload.as_slice())),
        ))
    }

    fn local_anomalies(&self, q: &Query) -> Result<Vec<Diagnosis>, Status> {
        let rows = self
            .store
            .list(q)
            .map_err(|e| self.store_failed("diagnosis", &e))?;
        let ids: Vec<String> = rows.iter().map(|r| r.id.to_string()).collect();
        Ok(self.decode_stored(
            "diagnosis",
            ids.iter()
                .zip(&rows)
                .map(|(id, r)| (id.as_str(), r.payload.as_slice())),
        ))
    }

    /// Counts a store failure and turns it into the RPC's error.
    fn store_failed(&self, what: &str, e: &HistoryError) -> Status {
        self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
        Status::internal(format!("{what} store: {e}"))
    }

    /// Decodes stored (id, payload) rows; an undecodable one is counted, logged and skipped.
    fn decode_stored<'a, T: prost::Message + Default>(
        &self,
        what: &str,
        rows: impl Iterator<Item = (&'a str, &'a [u8])>,
    ) -> Vec<T> {
        rows.filter_map(|(id, payload)| match T::decode(payload) {
            Ok(v) => Some(v),
            Err(e) => {
                self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(target: "ccld::store", "stored {what} {id} undecodable: {e}");
                None
            }
        })
        .collect()
    }

    fn local_comm(&self, comm_id: u64) -> Option<CommState> {
        let now = self.now();
        let mut st = self.engine().comm_state(comm_id, now)?;
        st.shard = self.shard_name.clone();
        // The service's ids (what ListAnomalies shows), oldest first.
        if let Ok(rows) = self.store.list(&Query {
            comm_id: Some(comm_id),
            since_ns: None,
            limit: Some(100),
        }) {
            st.anomaly_ids = rows.iter().rev().map(|r| format_diag_id(r.id)).collect();
        }
        Some(st)
    }

    fn local_comms(&self, limit: usize) -> Vec<CommSummary> {
        let counts = self.store.count_by_comm().unwrap_or_default();
        let mut v = self.engine().comm_summaries();
        v.sort_unstable_by_key(|c| c.comm_id);
        v.truncate(limit);
        for c in &mut v {
            c.shard = self.shard_name.clone();
            c.anomalies = counts.get(&c.comm_id).copied().unwrap_or(c.anomalies);
        }
        v
    }
}

/// Formats a stored id as `s<shard>-<seq>`.
pub fn format_diag_id(id: u64) -> String {
    format!(
        "s{}-{}",
        StoredDiagnosis::shard_of(id),
        id & 0xffff_ffff_ffff
    )
}

/// The gRPC service object.
#[derive(Clone)]
pub struct Service {
    sh: Arc<Shared>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("shard", &self.sh.shard_name)
            .finish()
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

async fn fan_out<T, F, Fut>(sh: &Shared, method: &'static str, call: F) -> (Vec<T>, Vec<String>)
where
    F: Fn(PeerClient) -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let futs = sh.peers.iter().map(|p| {
        let fut = call(p.client.clone());
        let name = p.name.clone();
        async move {
            let r = tokio::time::timeout(sh.peer_timeout, fut).await;
            (name, r)
        }
    });
    let results = futures_util::future::join_all(futs).await;
    let mut ok = Vec::new();
    let mut down = Vec::new();
    for (name, r) in results {
        match r {
            Ok(Ok(v)) => ok.push(v),
            Ok(Err(s)) if s.code() == tonic::Code::NotFound => {}
            Ok(Err(s)) => {
                tracing::debug!(target: "ccld::fanout", peer = %name, "{method}: {s}");
                sh.metrics.fanout_failures.add(&name, 1);
                down.push(name);
            }
            Err(_) => {
                tracing::debug!(target: "ccld::fanout", peer = %name, "{method}: timed out");
                sh.metrics.fanout_failures.add(&name, 1);
                down.push(name);
            }
        }
    }
    (ok, down)
}

#[tonic::async_trait]
impl Analyzer for Service {
    async fn ingest(
        &self,
        request: Request<Streaming<Batch>>,
    ) -> Result<Response<IngestReply>, Status> {
        self.ingest_decoded(request).await
    }

    async fn ingest_one(&self, request: Request<Batch>) -> Result<Response<IngestReply>, Status> {
        self.ingest_one_decoded(&request)
    }

    async fn list_anomalies(
        &self,
        request: Request<ListAnomaliesRequest>,
    ) -> Result<Response<AnomalyList>, Status> {
        self.sh.auth.check(&request)?;
        let req = request.into_inner();
        let limit = if req.limit == 0 {
            DEFAULT_LIST_LIMIT
        } else {
            req.limit as usize
        };
        let q = Query {
            comm_id: req.comm_id,
            since_ns: (req.since_ns > 0).then_some(req.since_ns),
            limit: Some(limit),
        };
        let mut all = self.sh.local_anomalies(&q)?;
        let mut unreachable = Vec::new();
        if !req.local_only {
            let mut sub = req;
            sub.local_only = true;
            let (lists, down) = fan_out(&self.sh, "ListAnomalies", |mut c| {
                let r = sub;
                async move { c.list_anomalies(r).await.map(Response::into_inner) }
            })
            .await;
            for l in lists {
                all.extend(l.diagnoses);
                unreachable.extend(l.unreachable_shards);
            }
            unreachable.extend(down);
        }
        newest_first_unique(&mut all, limit, |d| (&d.id, d.detected_at_ns));
        unreachable.sort();
        unreachable.dedup();
        Ok(Response::new(AnomalyList {
            diagnoses: all,
            unreachable_shards: unreachable,
        }))
    }

    async fn list_incidents(
        &self,
        request: Request<ListIncidentsRequest>,
    ) -> Result<Response<IncidentList>, Status> {
        self.sh.auth.check(&request)?;
        let req = request.into_inner();
        let limit = if req.limit == 0 {
            DEFAULT_LIST_LIMIT
        } else {
            req.limit as usize
        };
        let mut all = self.sh.local_incidents(req.comm_id, req.since_ns, limit)?;
        let mut unreachable = Vec::new();
        if !req.local_only {
            let mut sub = req;
            sub.local_only = true;
            let (lists, down) = fan_out(&self.sh, "ListIncidents", |mut c| {
                let r = sub;
                async move { c.list_incidents(r).await.map(Response::into_inner) }
            })
            .await;
            for l in lists {
                all.extend(l.incidents);
                unreachable.extend(l.unreachable_shards);
            }
            unreachable.extend(down);
        }
        newest_first_unique(&mut all, limit, |d| (&d.id, d.detected_at_ns));
        unreachable.sort();
        unreachable.dedup();
        Ok(Response::new(IncidentList {
            incidents: all,
            unreachable_shards: unreachable,
        }))
    }

    type WatchStream = BoxStream<Diagnosis>;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.sh.auth.check(&request)?;
        let req = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<Diagnosis, Status>>(256);
        // Subscribe before replaying so nothing falls between the two.
        let mut live = self.sh.tx.subscribe();
        let replay = if req.since_ns > 0 {
            self.sh.local_anomalies(&Query {
                comm_id: req.comm_id,
                since_ns: Some(req.since_ns),
                limit: None,
            })?
        } else {
            Vec::new()
        };
        let sh = self.sh.clone();
        let want = req.comm_id;
        let ltx = tx.clone();
        tokio::spawn(async move {
            sh.metrics.watch_subscribers.fetch_add(1, Ordering::Relaxed);
            let mut sent: HashSet<String> = HashSet::new();
            // Oldest first.
            for d in replay.into_iter().rev() {
                sent.insert(d.id.clone());
                if ltx.send(Ok(d)).await.is_err() {
                    sh.metrics.watch_subscribers.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
            }
            loop {
                tokio::select! {
                    _ = ltx.closed() => break,
                    r = live.recv() => match r {
                        Ok(d) => {
                            if want.is_some_and(|c| c != d.comm_id) || sent.contains(&d.id) {
                                continue;
                            }
                            if ltx.send(Ok(d)).await.is_err() {
                                break;
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(target: "ccld::watch", "a watcher fell behind; {n} diagnoses skipped (they are in ListAnomalies)");
                        }
                        Err(broadcast::error::RecvError::Closed) => break,
                    }
                }
            }
            sh.metrics.watch_subscribers.fetch_sub(1, Ordering::Relaxed);
        });
        if !req.local_only {
            for p in &self.sh.peers {
                let mut client = p.client.clone();
                let name = p.name.clone();
                let ptx = tx.clone();
                let mut sub = req;
                sub.local_only = true;
                let psh = self.sh.clone();
                tokio::spawn(async move {
                    let mut seen: HashSet<String> = HashSet::new();
                    let mut backoff = Duration::from_millis(200);
                    loop {
                        let attempt_start = psh.now();
                        let r = tokio::select! {
                            _ = ptx.closed() => return,
                            r = client.watch(sub) => r,
                        };
                        if let Ok(resp) = r {
                            backoff = Duration::from_millis(200);
                            let mut st = resp.into_inner();
                            loop {
                                let m = tokio::select! {
                                    _ = ptx.closed() => return,
                                    m = st.message() => m,
                                };
                                match m {
                                    Ok(Some(d)) => {
                                        if seen.insert(d.id.clone())
                                            && ptx.send(Ok(d)).await.is_err()
                                        {
                                            return;
                                        }
                                    }
                                    _ => break,
                                }
                            }
                        }
                        tracing::debug!(target: "ccld::watch", peer = %name, "peer watch stream ended; reconnecting");
                        // Replay what the peer diagnosed while we were not connected.
                        sub.since_ns = attempt_start.max(1);
                        tokio::select! {
                            _ = ptx.closed() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                });
            }
        }
        drop(tx);
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_comm(
        &self,
        request: Request<GetCommRequest>,
    ) -> Result<Response<CommState>, Status> {
        self.sh.auth.check(&request)?;
        let req = request.into_inner();
        let mut found: Vec<CommState> = self.sh.local_comm(req.comm_id).into_iter().collect();
        let mut unreachable = Vec::new();
        if !req.local_only {
            let sub = GetCommRequest {
                comm_id: req.comm_id,
                local_only: true,
            };
            let (states, down) = fan_out(&self.sh, "GetComm", |mut c| async move {
                c.get_comm(sub).await.map(Response::into_inner)
            })
            .await;
            found.extend(states);
            unreachable = down;
        }
        // With failover, more than one shard may hold part of a communicator: answer with
        // the one that heard from it last.
        match found.into_iter().max_by_key(|s| s.last_seen_ns) {
            Some(s) => Ok(Response::new(s)),
            None if unreachable.is_empty() => Err(Status::not_found(format!(
                "communicator {:#018x} is not tracked by any shard",
                req.comm_id
            ))),
            None => Err(Status::not_found(format!(
                "communicator {:#018x} is not tracked by any reachable shard (unreachable: {})",
                req.comm_id,
                unreachable.join(", ")
            ))),
        }
    }

    async fn list_comms(
        &self,
        request: Request<ListCommsRequest>,
    ) -> Result<Response<CommList>, Status> {
        self.sh.auth.check(&request)?;
        let req = request.into_inner();
        let limit = if req.limit == 0 {
            usize::MAX
        } else {
            req.limit as usize
        };
        let mut comms = self.sh.local_comms(limit);
        let mut unreachable = Vec::new();
        if !req.local_only {
            let sub = ListCommsRequest {
                local_only: true,
                limit: req.limit,
            };
            let (lists, down) = fan_out(&self.sh, "ListComms", |mut c| async move {
                c.list_comms(sub).await.map(Response::into_inner)
            })
            .await;
            for l in lists {
                comms.extend(l.comms);
            }
            unreachable = down;
        }
        comms.sort_by(|a, b| {
            a.comm_id
                .cmp(&b.comm_id)
                .then_with(|| a.shard.cmp(&b.shard))
        });
        comms.truncate(limit);
        unreachable.sort();
        Ok(Response::new(CommList {
            comms,
            unreachable_shards: unreachable,
        }))
    }
}

/// Builds a lazily-connecting client to `addr` (`host:port`, or a full `http(s)://` URI).
pub fn lazy_channel(
    addr: &str,
    tls: Option<&ClientTlsConfig>,
    connect_timeout: Duration,
) -> Result<Channel, String> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else if tls.is_some() {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    };
    let mut ep = Endpoint::from_shared(uri.clone())
        .map_err(|e| format!("invalid address {uri:?}: {e}"))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    if let Some(t) = tls {
        ep = ep
            .tls_config(t.clone())
            .map_err(|e| format!("TLS for {uri}: {e}"))?;
    }
    Ok(ep.connect_lazy())
}

/// A running shard.
#[derive(Debug)]
pub struct ServerHandle {
    /// gRPC address actually bound.
    pub addr: SocketAddr,
    /// Metrics address actually bound.
    pub metrics_addr: Option<SocketAddr>,
    /// The shard's metrics.
    pub metrics: Arc<Metrics>,
    /// The shard's name.
    pub shard_name: String,
    shutdown: Option<oneshot::Sender<()>>,
    join: tokio::task::JoinHandle<Result<(), ServeError>>,
    diagnoses: broadcast::Sender<Diagnosis>,
    incidents: broadcast::Sender<Incident>,
}

/// Merges shard answers: drops repeated ids (the first copy stays), orders newest first
/// (ties by id, so every shard answers alike) and keeps at most `limit`.
fn newest_first_unique<T>(all: &mut Vec<T>, limit: usize, key: impl Fn(&T) -> (&String, u64)) {
    let mut seen = HashSet::new();
    all.retain(|d| seen.insert(key(d).0.clone()));
    all.sort_by(|a, b| {
        let ((ia, ta), (ib, tb)) = (key(a), key(b));
        tb.cmp(&ta).then_with(|| ia.cmp(ib))
    });
    all.truncate(limit);
}

impl ServerHandle {
    /// A feed of the diagnoses this shard makes from now on.
    pub fn subscribe(&self) -> DiagnosisFeed {
        Feed::new(&self.diagnoses)
    }

    /// A feed of the incidents this shard makes from now on.
    pub fn subscribe_incidents(&self) -> IncidentFeed {
        Feed::new(&self.incidents)
    }

    /// Stops accepting, lets open calls finish for up to `grace`, then returns.
    pub async fn shutdown(mut self, grace: Duration) -> Result<(), ServeError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match tokio::time::timeout(grace, &mut self.join).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(ServeError::Transport(format!("server task failed: {e}"))),
            Err(_) => {
                self.join.abort();
                Ok(())
            }
        }
    }

    /// Waits until the server stops by itself (e.g. a fatal transport error).
    pub async fn wait(mut self) -> Result<(), ServeError> {
        match (&mut self.join).await {
            Ok(r) => r,
            Err(e) => Err(ServeError::Transport(format!("server task failed: {e}"))),
        }
    }
}

/// Starts a shard on the current tokio runtime. `listener`, when given, is used instead
/// of binding `listen` (tests pre-bind ephemeral ports to build the shard list).
pub async fn start(
    cfg: ServerConfig,
    listen: SocketAddr,
    listener: Option<std::net::TcpListener>,
) -> Result<ServerHandle, ServeError> {
    if let Some(m) = &cfg.shards {
        m.check_id(cfg.shard_id)
            .map_err(|e| ServeError::Config(e.to_string()))?;
    }
    let listener = match listener {
        Some(l) => {
            l.set_nonblocking(true).map_err(|source| ServeError::Bind {
                addr: listen.to_string(),
                source,
            })?;
            tokio::net::TcpListener::from_std(l).map_err(|source| ServeError::Bind {
                addr: listen.to_string(),
                source,
            })?
        }
        None => tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: listen.to_string(),
                source,
            })?,
    };
    let addr = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: listen.to_string(),
        source,
    })?;
    let shard_name = cfg.shard_name(addr);
    let metrics = Arc::new(Metrics::new(cfg.shard_id as u64));
    let store = cfg
        .history
        .clone()
        .unwrap_or_else(|| Arc::new(MemoryHistory::new()));
    let next_seq = store.next_seq(cfg.shard_id)?;
    let mut peers = Vec::new();
    if let Some(m) = &cfg.shards {
        let tok = TokenInterceptor::new(cfg.peer.token.as_deref())
            .map_err(|e| ServeError::Config(format!("peer token: {e}")))?;
        for (i, name) in m.names().iter().enumerate() {
            if i == cfg.shard_id {
                continue;
            }
            let ch = lazy_channel(name, cfg.peer.tls.as_ref(), cfg.peer.connect_timeout).map_err(
                |reason| ServeError::Peer {
                    peer: name.clone(),
                    reason,
                },
            )?;
            let client = AnalyzerClient::with_interceptor(ch, tok.clone())
                .max_decoding_message_size(cfg.max_message_bytes.max(64 << 20));
            peers.push(Peer {
                name: name.clone(),
                client,
            });
        }
    }
    let (tx, _) = broadcast::channel(1024);
    let diagnoses = tx.clone();
    let (itx, _) = broadcast::channel(1024);
    let incidents = itx.clone();
    let sh = Arc::new(Shared {
        shard_id: cfg.shard_id,
        shard_name: shard_name.clone(),
        shards: cfg.shards.clone(),
        engine: Mutex::new({
            let mut e = Engine::new(cfg.engine.clone());
            // Location cost measured also for windows closed by a record (ingest path).
            e.set_cost_clock(cost_clock_ns);
            e
        }),
        store,
        next_seq: AtomicU64::new(next_seq),
        metrics: metrics.clone(),
        tx,
        itx,
        peers,
        peer_timeout: cfg.peer.timeout,
        auth: AuthInterceptor::new(cfg.token.as_deref(), metrics.clone()),
        clock: cfg.clock,
        driven_now: AtomicU64::new(0),
    });

    let metrics_addr = match cfg.metrics_listen {
        Some(ma) => {
            let l = tokio::net::TcpListener::bind(ma)
                .await
                .map_err(|source| ServeError::Bind {
                    addr: ma.to_string(),
                    source,
                })?;
            Some(l.local_addr().map_err(|source| ServeError::Bind {
                addr: ma.to_string(),
                source,
            })?)
            .map(|a| (a, l))
        }
        None => None,
    };

    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (inner_stop_tx, _) = broadcast::channel::<()>(1);
    let mut builder = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(8 << 20));
    if let Some(t) = cfg.tls.clone() {
        builder = builder
            .tls_config(t)
            .map_err(|e| ServeError::Tls(e.to_string()))?;
    }
    let svc = AnalyzerServer::new(Service { sh: sh.clone() })
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(usize::MAX);
    // Ingest decodes its own way (no per-record allocation); same wire format.
    let svc = IngestFastPath::new(
        svc,
        Arc::new(Service { sh: sh.clone() }),
        cfg.max_message_bytes,
    );
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));

    // Tick task (wall clock only: a driven clock ticks after each ingest call).
    let tick_sh = sh.clone();
    let ticking = cfg.clock == ClockMode::Wall;
    let mut tick_stop = inner_stop_tx.subscribe();
    let tick_every = cfg.tick_interval.max(Duration::from_millis(1));
    tokio::spawn(async move {
        if !ticking {
            let _ = tick_stop.recv().await;
            return;
        }
        let mut iv = tokio::time::interval(tick_every);
        iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = Instant::now();
        loop {
            tokio::select! {
                _ = tick_stop.recv() => break,
                _ = iv.tick() => {
                    let s = tick_sh.clone();
                    // This process did not run for a while (stopped, starved): the engine's
                    // view is stale (`Engine::note_pause`).
                    let paused = analyzer::engine::is_pause(last.elapsed(), tick_every);
                    last = Instant::now();
                    // The tick may take milliseconds on big communicators: keep it off
                    // the async workers.
                    let tick = move || {
                        if paused {
                            s.note_pause();
                        }
                        s.tick();
                    };
                    if let Err(e) = tokio::task::spawn_blocking(tick).await {
                        tracing::error!(target: "ccld::tick", "engine tick failed: {e}");
                    }
                }
            }
        }
    });
    if let Some((_, l)) = &metrics_addr {
        let _ = l; // bound above; moved below
    }
    let metrics_bound = metrics_addr.as_ref().map(|(a, _)| *a);
    if let Some((_, l)) = metrics_addr {
        let m = metrics.clone();
        let mut st = inner_stop_tx.subscribe();
        tokio::spawn(metrics::serve_http(l, m, async move {
            let _ = st.recv().await;
        }));
    }
    let stop_all = inner_stop_tx.clone();
    let join = tokio::spawn(async move {
        let r = builder
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop_rx.await;
                let _ = stop_all.send(());
            })
            .await;
        let _ = inner_stop_tx.send(());
        r.map_err(|e| ServeError::Transport(e.to_string()))
    });
    tracing::info!(target: "ccld::serve", shard = %shard_name, "analyzer shard listening on {addr}");
    Ok(ServerHandle {
        addr,
        metrics_addr: metrics_bound,
        metrics,
        shard_name,
        shutdown: Some(stop_tx),
        join,
        diagnoses,
        incidents,
    })
}

#[cfg(test)]
mod tests;
