//! Client of an analyzer cluster: routes records to the shard that owns their
//! communicator, fails over to the next shard in rendezvous order when the owner is down,
//! and queries any live shard for cluster-wide answers.
//!
//! [`Client`] is async (tokio); [`BlockingClient`] wraps it with a private current-thread
//! runtime for plain threads (the probe's reporter).
//!
//! Failover: a shard whose call fails at the transport level (`Unavailable`, deadline,
//! connection refused/reset) is marked down for a back-off period (doubling from
//! `backoff_initial` to `backoff_max`); its communicators' records go to the next shard
//! in their failover order meanwhile, which accepts them (the engine state of those
//! communicators then lives there). After the back-off the owner is tried again. Errors
//! that another shard would answer the same way (`Unauthenticated`, `InvalidArgument`,
//! `ResourceExhausted`, ...) are returned, not failed over.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic::{Code, Status, Streaming};

use crate::auth::TokenInterceptor;
use crate::server::lazy_channel;
use crate::shard::{ShardError, ShardMap};
use crate::wire::analyzer_client::AnalyzerClient;
use crate::wire::{
    AnomalyList, Batch, CommList, CommState, Diagnosis, GetCommRequest, Heartbeat, IncidentList,
    ListAnomaliesRequest, ListCommsRequest, ListIncidentsRequest, OpRecord, RankMembership,
    WatchRequest,
};

/// Records per gRPC message when streaming a large batch.
pub const DEFAULT_CHUNK_RECORDS: usize = 4096;

/// Client errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The shard list is invalid.
    #[error("shard list: {0}")]
    Shards(#[from] ShardError),
    /// A shard address is invalid or TLS could not be configured.
    #[error("shard {shard:?}: {reason}")]
    Address {
        /// Shard.
        shard: String,
        /// What is wrong.
        reason: String,
    },
    /// The token is invalid.
    #[error("token: {0}")]
    Token(&'static str),
    /// A shard refused the call for a reason failover does not fix.
    #[error("shard {shard} refused the call: {code:?}: {message}")]
    Refused {
        /// Shard.
        shard: String,
        /// gRPC code.
        code: Code,
        /// Server message.
        message: String,
    },
    /// Every shard is down (or in back-off).
    #[error("no analyzer shard reachable ({unsent} records not delivered); last error: {last}")]
    AllDown {
        /// Records that could not be delivered.
        unsent: u64,
        /// Last transport error seen.
        last: String,
    },
    /// The blocking wrapper could not build its runtime.
    #[error("cannot start client runtime: {0}")]
    Runtime(std::io::Error),
}

impl ClientError {
    /// The gRPC code when a shard answered with an error status.
    pub fn code(&self) -> Option<Code> {
        match self {
            ClientError::Refused { code, .. } => Some(*code),
            ClientError::AllDown { .. } => Some(Code::Unavailable),
            _ => None,
        }
    }
}

/// Client configuration.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Shard list (`host:port` or URIs), same spelling as the servers' `--shards`.
    pub shards: Vec<String>,
    /// Bearer token.
    pub token: Option<String>,
    /// TLS (CA and optional domain).
    pub tls: Option<ClientTlsConfig>,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Deadline of one call.
    pub rpc_timeout: Duration,
    /// First back-off after a shard failed.
    pub backoff_initial: Duration,
    /// Longest back-off.
    pub backoff_max: Duration,
    /// Records per message when streaming.
    pub chunk_records: usize,
    /// Largest message accepted from a server.
    pub max_message_bytes: usize,
}

impl ClientConfig {
    /// Defaults for the given shard list.
    pub fn new<S: Into<String>>(shards: impl IntoIterator<Item = S>) -> Self {
        Self {
            shards: shards.into_iter().map(Into::into).collect(),
            token: None,
            tls: None,
            connect_timeout: Duration::from_millis(500),
            rpc_timeout: Duration::from_secs(10),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            chunk_records: DEFAULT_CHUNK_RECORDS,
            max_message_bytes: 64 << 20,
        }
    }
}

/// Result of an ingest call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestOutcome {
    /// Records the engine accepted.
    pub accepted: u64,
    /// Records the engine rejected.
    pub rejected: u64,
    /// First reject reasons (capped per shard by the server).
    pub reasons: Vec<String>,
    /// Records sent to a shard other than the communicator's owner.
    pub failed_over: u64,
    /// Records delivered per shard name.
    pub per_shard: BTreeMap<String, u64>,
}

type Rpc = AnalyzerClient<InterceptedService<Channel, TokenInterceptor>>;

#[derive(Debug)]
struct Conn {
    name: String,
    rpc: Rpc,
    down_until: Option<Instant>,
    backoff: Duration,
}

/// Async cluster client. Cheap to keep; connections are made lazily and reused.
#[derive(Debug)]
pub struct Client {
    map: ShardMap,
    conns: Vec<Conn>,
    cfg: ClientConfig,
}

/// Transport-level failure: another shard may succeed.
fn is_transport(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    ) || s.message().contains("transport")
}

/// Splits a heartbeat into one per shard holding only that shard's memberships.
fn split_heartbeat(
    map: &ShardMap,
    h: &Heartbeat,
    route: &dyn Fn(u64) -> Option<usize>,
) -> Vec<(usize, Heartbeat)> {
    let mut per: BTreeMap<usize, Vec<RankMembership>> = BTreeMap::new();
    for m in &h.ranks {
        if let Some(s) = route(m.comm_id) {
            per.entry(s).or_default().push(*m);
        }
    }
    if per.is_empty() {
        // Membership-less heartbeat (an idle process): the first live shard of the list.
        let _ = map;
        return route(0).map(|s| vec![(s, h.clone())]).unwrap_or_default();
    }
    per.into_iter()
        .map(|(s, ranks)| (s, Heartbeat { ranks, ..h.clone() }))
        .collect()
}

impl Client {
    /// Builds a client; nothing is connected until the first call.
    pub fn new(cfg: ClientConfig) -> Result<Self, ClientError> {
        let map = ShardMap::new(&cfg.shards)?;
        let tok = TokenInterceptor::new(cfg.token.as_deref()).map_err(ClientError::Token)?;
        let mut conns = Vec::with_capacity(map.len());
        for name in map.names() {
            let ch =
                lazy_channel(name, cfg.tls.as_ref(), cfg.connect_timeout).map_err(|reason| {
                    ClientError::Address {
                        shard: name.clone(),
                        reason,
                    }
                })?;
            let rpc = AnalyzerClient::with_interceptor(ch, tok.clone())
                .max_decoding_message_size(cfg.max_message_bytes)
                .max_encoding_message_size(cfg.max_message_bytes);
            conns.push(Conn {
                name: name.clone(),
                rpc,
                down_until: None,
                backoff: cfg.backoff_initial,
            });
        }
        Ok(Self { map, conns, cfg })
    }

    /// The shard map.
    pub fn shards(&self) -> &ShardMap {
        &self.map
    }

    fn is_up(&self, i: usize, now: Instant) -> bool {
        self.conns[i].down_until.is_none_or(|t| now >= t)
    }

    fn mark_down(&mut self, i: usize) {
        let c = &mut self.conns[i];
        c.down_until = Some(Instant::now() + c.backoff);
        tracing::warn!(target: "ccld::client", shard = %c.name, "analyzer shard unreachable; retrying in {:?}", c.backoff);
        c.backoff = (c.backoff * 2).min(self.cfg.backoff_max);
    }

    fn mark_up(&mut self, i: usize) {
        let c = &mut self.conns[i];
        c.down_until = None;
        c.backoff = self.cfg.backoff_initial;
    }

    /// Shards marked down right now.
    pub fn down_shards(&self) -> Vec<String> {
        let now = Instant::now();
        (0..self.conns.len())
            .filter(|&i| !self.is_up(i, now))
            .map(|i| self.conns[i].name.clone())
            .collect()
    }

    /// Sends a batch: each record to the first live shard in its communicator's failover
    /// order, heartbeats split the same way. Returns the engine's accept/reject counts.
    pub async fn ingest(&mut self, batch: Batch) -> Result<IngestOutcome, ClientError> {
        self.ingest_at(batch, None).await
    }

    /// Like [`Client::ingest`], telling shards running a driven clock
    /// ([`crate::server::ClockMode::Driven`]) that the time is `now_ns`.
    pub async fn ingest_at(
        &mut self,
        batch: Batch,
        now_ns: Option<u64>,
    ) -> Result<IngestOutcome, ClientError> {
        let mut out = IngestOutcome::default();
        let mut pending = batch;
        let mut last_err = String::from("none");
        // Each round either delivers everything or marks at least one shard down, so at
        // most `shards + 1` rounds run.
        for round in 0..=self.conns.len() {
            // A driven clock must reach every shard, with or without records.
            let tell_time = round == 0 && now_ns.is_some();
            if pending.records.is_empty() && pending.heartbeats.is_empty() && !tell_time {
                return Ok(out);
            }
            let now = Instant::now();
            let up: Vec<bool> = (0..self.conns.len()).map(|i| self.is_up(i, now)).collect();
            let map = &self.map;
            let route = |comm: u64| map.first_up(comm, |i| up[i]);
            let mut groups: BTreeMap<usize, Batch> = BTreeMap::new();
            let mut unrouted = Batch::default();
            for r in pending.records.drain(..) {
                let comm = r.trace.as_ref().map(|t| t.comm_id).unwrap_or(0);
                match route(comm) {
                    Some(s) => groups.entry(s).or_default().records.push(r),
                    None => unrouted.records.push(r),
                }
            }
            for h in pending.heartbeats.drain(..) {
                let parts = split_heartbeat(map, &h, &route);
                if parts.is_empty() {
                    unrouted.heartbeats.push(h);
                }
                for (s, hp) in parts {
                    groups.entry(s).or_default().heartbeats.push(hp);
                }
            }
            if tell_time {
                for (i, &u) in up.iter().enumerate() {
                    if u {
                        groups.entry(i).or_default();
                    }
                }
            }
            if groups.is_empty() {
                return Err(ClientError::AllDown {
                    unsent: unrouted.records.len() as u64,
                    last: last_err,
                });
            }
            let owners: Vec<(usize, u64)> = groups
                .iter()
                .map(|(s, b)| {
                    let moved = b
                        .records
                        .iter()
                        .filter(|r| {
                            self.map
                                .owner(r.trace.as_ref().map(|t| t.comm_id).unwrap_or(0))
                                != *s
                        })
                        .count() as u64;
                    (*s, moved)
                })
                .collect();
            // Send to all shards concurrently.
            let chunk = self.cfg.chunk_records;
            let timeout = self.cfg.rpc_timeout;
            let futs: Vec<_> = groups
                .into_iter()
                .map(|(s, b)| {
                    let keep = b.clone();
                    let fut = send_batch(self.conns[s].rpc.clone(), b, chunk, timeout, now_ns);
                    async move { (s, keep, fut.await) }
                })
                .collect();
            let results = futures_util::future::join_all(futs).await;
            for (s, keep, r) in results {
                match r {
                    Ok(rep) => {
                        self.mark_up(s);
                        out.accepted += rep.accepted;
                        out.rejected += rep.rejected;
                        out.reasons.extend(rep.reasons);
                        *out.per_shard.entry(self.conns[s].name.clone()).or_insert(0) +=
                            keep.records.len() as u64;
                        if let Some((_, moved)) = owners.iter().find(|(o, _)| *o == s) {
                            out.failed_over += moved;
                        }
                    }
                    Err(st) if is_transport(&st) => {
                        last_err = format!("{}: {}", self.conns[s].name, st.message());
                        self.mark_down(s);
                        pending.records.extend(keep.records);
                        pending.heartbeats.extend(keep.heartbeats);
                    }
                    Err(st) => {
                        return Err(ClientError::Refused {
                            shard: self.conns[s].name.clone(),
                            code: st.code(),
                            message: st.message().to_string(),
                        })
                    }
                }
            }
            if !unrouted.records.is_empty() || !unrouted.heartbeats.is_empty() {
                pending.records.extend(unrouted.records);
                pending.heartbeats.extend(unrouted.heartbeats);
            }
        }
        if pending.records.is_empty() && pending.heartbeats.is_empty() {
            Ok(out)
        } else {
            Err(ClientError::AllDown {
                unsent: pending.records.len() as u64,
                last: last_err,
            })
        }
    }

    /// Runs `call` on live shards in list order until one answers (any shard answers for
    /// the whole cluster).
    async fn any<T, F, Fut>(&mut self, call: F) -> Result<T, ClientError>
    where
        F: Fn(Rpc) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut last = String::from("no shard tried");
        let now = Instant::now();
        let mut order: Vec<usize> = (0..self.conns.len())
            .filter(|&i| self.is_up(i, now))
            .collect();
        // Shards in back-off last, but still tried: a query is worth a retry.
        order.extend((0..self.conns.len()).filter(|&i| !self.is_up(i, now)));
        for i in order {
            let r =
                tokio::time::timeout(self.cfg.rpc_timeout, call(self.conns[i].rpc.clone())).await;
            match r {
                Ok(Ok(v)) => {
                    self.mark_up(i);
                    return Ok(v);
                }
                Ok(Err(st)) if is_transport(&st) => {
                    last = format!("{}: {}", self.conns[i].name, st.message());
                    self.mark_down(i);
                }
                Ok(Err(st)) => {
                    return Err(ClientError::Refused {
                        shard: self.conns[i].name.clone(),
                        code: st.code(),
                        message: st.message().to_string(),
                    })
                }
                Err(_) => {
                    last = format!("{}: timed out", self.conns[i].name);
                    self.mark_down(i);
                }
            }
        }
        Err(ClientError::AllDown { unsent: 0, last })
    }

    /// Cluster-wide anomaly list.
    pub async fn list_anomalies(
        &mut self,
        req: ListAnomaliesRequest,
    ) -> Result<AnomalyList, ClientError> {
        self.any(|mut c| {
            let r = req;
            async move { c.list_anomalies(r).await.map(tonic::Response::into_inner) }
        })
        .await
    }

    /// Cluster-wide incident list, newest first.
    pub async fn list_incidents(
        &mut self,
        req: ListIncidentsRequest,
    ) -> Result<IncidentList, ClientError> {
        self.any(|mut c| {
            let r = req;
            async move { c.list_incidents(r).await.map(tonic::Response::into_inner) }
        })
        .await
    }

    /// Cluster-wide communicator list.
    pub async fn list_comms(&mut self, req: ListCommsRequest) -> Result<CommList, ClientError> {
        self.any(|mut c| async move { c.list_comms(req).await.map(tonic::Response::into_inner) })
            .await
    }

    /// State of one communicator (from whichever shard holds it).
    pub async fn get_comm(&mut self, req: GetCommRequest) -> Result<CommState, ClientError> {
        self.any(|mut c| async move { c.get_comm(req).await.map(tonic::Response::into_inner) })
            .await
    }

    /// Opens a stream of new diagnoses (cluster-wide unless `local_only`).
    pub async fn watch(&mut self, req: WatchRequest) -> Result<Streaming<Diagnosis>, ClientError> {
        self.any(|mut c| {
            let r = req;
            async move { c.watch(r).await.map(tonic::Response::into_inner) }
        })
        .await
    }
}

async fn send_batch(
    mut rpc: Rpc,
    batch: Batch,
    chunk: usize,
    timeout: Duration,
    now_ns: Option<u64>,
) -> Result<crate::wire::IngestReply, Status> {
    let chunk = chunk.max(1);
    fn with_now<T>(msg: T, now_ns: Option<u64>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = now_ns {
            // A decimal number is always a valid ASCII metadata value.
            if let Ok(v) = t.to_string().parse() {
                r.metadata_mut().insert(crate::server::NOW_METADATA, v);
            }
        }
        r
    }
    let fut = async move {
        if batch.records.len() <= chunk {
            rpc.ingest_one(with_now(batch, now_ns)).await
        } else {
            let Batch {
                records,
                heartbeats,
            } = batch;
            let mut msgs = Vec::with_capacity(records.len() / chunk + 1);
            let mut it = records.into_iter();
            let mut hb = Some(heartbeats);
            loop {
                let recs: Vec<OpRecord> = it.by_ref().take(chunk).collect();
                if recs.is_empty() {
                    break;
                }
                msgs.push(Batch {
                    records: recs,
                    heartbeats: hb.take().unwrap_or_default(),
                });
            }
            rpc.ingest(with_now(tokio_stream::iter(msgs), now_ns)).await
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded("ingest timed out")),
    }
}

/// Blocking wrapper of [`Client`] for plain threads; owns a current-thread runtime.
/// Must not be used from inside a tokio runtime.
#[derive(Debug)]
pub struct BlockingClient {
    rt: tokio::runtime::Runtime,
    inner: Client,
}

impl BlockingClient {
    /// Builds the client and its runtime.
    pub fn new(cfg: ClientConfig) -> Result<Self, ClientError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ClientError::Runtime)?;
        // Channels must be created inside the runtime (they spawn their workers there).
        let inner = rt.block_on(async { Client::new(cfg) })?;
        Ok(Self { rt, inner })
    }

    /// See [`Client::ingest`].
    pub fn ingest(&mut self, batch: Batch) -> Result<IngestOutcome, ClientError> {
        self.rt.block_on(self.inner.ingest(batch))
    }

    /// See [`Client::ingest_at`].
    pub fn ingest_at(
        &mut self,
        batch: Batch,
        now_ns: Option<u64>,
    ) -> Result<IngestOutcome, ClientError> {
        self.rt.block_on(self.inner.ingest_at(batch, now_ns))
    }

    /// See [`Client::list_anomalies`].
    pub fn list_anomalies(
        &mut self,
        req: ListAnomaliesRequest,
    ) -> Result<AnomalyList, ClientError> {
        self.rt.block_on(self.inner.list_anomalies(req))
    }

    /// See [`Client::list_incidents`].
    pub fn list_incidents(
        &mut self,
        req: ListIncidentsRequest,
    ) -> Result<IncidentList, ClientError> {
        self.rt.block_on(self.inner.list_incidents(req))
    }

    /// See [`Client::list_comms`].
    pub fn list_comms(&mut self, req: ListCommsRequest) -> Result<CommList, ClientError> {
        self.rt.block_on(self.inner.list_comms(req))
    }

    /// See [`Client::get_comm`].
    pub fn get_comm(&mut self, req: GetCommRequest) -> Result<CommState, ClientError> {
        self.rt.block_on(self.inner.get_comm(req))
    }

    /// Shards in back-off now.
    pub fn down_shards(&self) -> Vec<String> {
        self.inner.down_shards()
    }
}
