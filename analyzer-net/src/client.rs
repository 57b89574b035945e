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

use bytes::Bytes;
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig};
use tonic::{Code, Status, Streaming};

use crate::auth::TokenInterceptor;
use crate::codec::{encode_batch, PreEncodedCodec, INGEST_ONE_PATH, INGEST_PATH};
use crate::grpc::analyzer_client::AnalyzerClient;
use crate::server::lazy_channel;
use crate::shard::{ShardError, ShardMap};
use ccld_wire::{
    AnomalyList, Batch, CommList, CommState, Diagnosis, GetCommRequest, Heartbeat, IncidentList,
    IngestReply, ListAnomaliesRequest, ListCommsRequest, ListIncidentsRequest, RankMembership,
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
/// Untyped gRPC client on the same channel, for the pre-encoded ingest calls.
type RawRpc = tonic::client::Grpc<InterceptedService<Channel, TokenInterceptor>>;

#[derive(Debug)]
struct Conn {
    name: String,
    rpc: Rpc,
    raw: RawRpc,
    down_until: Option<Instant>,
    backoff: Duration,
}

/// Async cluster client. Cheap to keep; connections are made lazily and reused.
#[derive(Debug)]
pub struct Client {
    map: ShardMap,
    conns: Vec<Conn>,
    cfg: ClientConfig,
    /// Encoding buffer (a `Vec`: prost writes small fields into it much faster than
    /// into a `BytesMut`); its capacity is carried from message to message.
    buf: Vec<u8>,
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
            per.entry(s).or_default().push(m.clone());
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
            let raw = tonic::client::Grpc::new(InterceptedService::new(ch.clone(), tok.clone()))
                .max_decoding_message_size(cfg.max_message_bytes)
                .max_encoding_message_size(cfg.max_message_bytes);
            let rpc = AnalyzerClient::with_interceptor(ch, tok.clone())
                .max_decoding_message_size(cfg.max_message_bytes)
                .max_encoding_message_size(cfg.max_message_bytes);
            conns.push(Conn {
                name: name.clone(),
                rpc,
                raw,
                down_until: None,
                backoff: cfg.backoff_initial,
            });
        }
        Ok(Self {
            map,
            conns,
            cfg,
            buf: Vec::new(),
        })
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
        self.ingest_ref_at(&batch, None).await
    }

    /// Like [`Client::ingest`], telling shards running a driven clock
    /// ([`crate::server::ClockMode::Driven`]) that the time is `now_ns`.
    pub async fn ingest_at(
        &mut self,
        batch: Batch,
        now_ns: Option<u64>,
    ) -> Result<IngestOutcome, ClientError> {
        self.ingest_ref_at(&batch, now_ns).await
    }

    /// Like [`Client::ingest_at`] with a borrowed batch: the records are encoded once,
    /// straight from `batch`, into the messages of each shard (no copy of the batch is
    /// made, also not to fail over: a shard's share is re-encoded from `batch` for the
    /// next shard).
    pub async fn ingest_ref_at(
        &mut self,
        batch: &Batch,
        now_ns: Option<u64>,
    ) -> Result<IngestOutcome, ClientError> {
        let mut out = IngestOutcome::default();
        // Records still to deliver, as indices into `batch.records`, in batch order.
        let mut pending: Vec<usize> = (0..batch.records.len()).collect();
        // Heartbeats still to deliver (split per shard once routed).
        let mut pending_hb: Vec<Heartbeat> = batch.heartbeats.clone();
        let mut last_err = String::from("none");
        // Each round either delivers everything or marks at least one shard down, so at
        // most `shards + 1` rounds run.
        for round in 0..=self.conns.len() {
            // A driven clock must reach every shard, with or without records.
            let tell_time = round == 0 && now_ns.is_some();
            if pending.is_empty() && pending_hb.is_empty() && !tell_time {
                return Ok(out);
            }
            let comm_of = |i: usize| {
                batch.records[i]
                    .trace
                    .as_ref()
                    .map(|t| t.comm_id)
                    .unwrap_or(0)
            };
            let now = Instant::now();
            let up: Vec<bool> = (0..self.conns.len()).map(|i| self.is_up(i, now)).collect();
            let map = &self.map;
            let route = |comm: u64| map.first_up(comm, |i| up[i]);
            let mut groups: BTreeMap<usize, Group> = BTreeMap::new();
            let mut unrouted: Vec<usize> = Vec::new();
            let mut unrouted_hb: Vec<Heartbeat> = Vec::new();
            // Consecutive records of one communicator route alike: hash once per run.
            let mut last: Option<(u64, Option<usize>)> = None;
            for &i in &pending {
                let comm = comm_of(i);
                let s = match last {
                    Some((c, s)) if c == comm => s,
                    _ => {
                        let s = route(comm);
                        last = Some((comm, s));
                        s
                    }
                };
                match s {
                    Some(s) => groups.entry(s).or_default().records.push(i),
                    None => unrouted.push(i),
                }
            }
            pending.clear();
            for h in pending_hb.drain(..) {
                let parts = split_heartbeat(map, &h, &route);
                if parts.is_empty() {
                    unrouted_hb.push(h);
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
                    unsent: unrouted.len() as u64,
                    last: last_err,
                });
            }
            // Encode every shard's share (records in chunks of `chunk_records`, heartbeats
            // with the first chunk) before sending anything.
            let chunk = self.cfg.chunk_records.max(1);
            let mut sends = Vec::with_capacity(groups.len());
            for (s, g) in groups {
                let mut moved = 0u64;
                let mut last_owner: Option<(u64, usize)> = None;
                for &i in &g.records {
                    let comm = comm_of(i);
                    let owner = match last_owner {
                        Some((c, o)) if c == comm => o,
                        _ => {
                            let o = self.map.owner(comm);
                            last_owner = Some((comm, o));
                            o
                        }
                    };
                    if owner != s {
                        moved += 1;
                    }
                }
                let msgs = encode_chunks(&mut self.buf, batch, &g, chunk);
                sends.push((s, g, moved, msgs));
            }
            // Send to all shards concurrently.
            let timeout = self.cfg.rpc_timeout;
            let futs: Vec<_> = sends
                .into_iter()
                .map(|(s, g, moved, msgs)| {
                    let fut = send_encoded(self.conns[s].raw.clone(), msgs, timeout, now_ns);
                    async move { (s, g, moved, fut.await) }
                })
                .collect();
            let results = futures_util::future::join_all(futs).await;
            for (s, g, moved, r) in results {
                match r {
                    Ok(rep) => {
                        self.mark_up(s);
                        out.accepted += rep.accepted;
                        out.rejected += rep.rejected;
                        out.reasons.extend(rep.reasons);
                        *out.per_shard.entry(self.conns[s].name.clone()).or_insert(0) +=
                            g.records.len() as u64;
                        out.failed_over += moved;
                    }
                    Err(st) if is_transport(&st) => {
                        last_err = format!("{}: {}", self.conns[s].name, st.message());
                        self.mark_down(s);
                        pending.extend(g.records);
                        pending_hb.extend(g.heartbeats);
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
            pending.extend(unrouted);
            pending_hb.extend(unrouted_hb);
            // Keep the batch's order for the next shard (per rank, records in sequence).
            pending.sort_unstable();
        }
        if pending.is_empty() && pending_hb.is_empty() {
            Ok(out)
        } else {
            Err(ClientError::AllDown {
                unsent: pending.len() as u64,
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

/// One shard's share of a batch: indices of its records, its heartbeats.
#[derive(Debug, Default)]
struct Group {
    records: Vec<usize>,
    heartbeats: Vec<Heartbeat>,
}

/// Encodes a shard's share as `Batch` messages of at most `chunk` records each (the
/// heartbeats in the first; one message, maybe empty, when there are no records).
fn encode_chunks(buf: &mut Vec<u8>, batch: &Batch, g: &Group, chunk: usize) -> Vec<Bytes> {
    // The message takes the buffer (no copy); the next one starts with as much room.
    let take = |buf: &mut Vec<u8>| {
        let cap = buf.capacity();
        Bytes::from(std::mem::replace(buf, Vec::with_capacity(cap)))
    };
    let mut msgs = Vec::with_capacity(g.records.len() / chunk + 1);
    let mut parts = g.records.chunks(chunk);
    let first = parts.next().unwrap_or(&[]);
    let recs = first.iter().map(|&i| &batch.records[i]);
    encode_batch(recs, &g.heartbeats, buf);
    msgs.push(take(buf));
    for part in parts {
        encode_batch(part.iter().map(|&i| &batch.records[i]), [], buf);
        msgs.push(take(buf));
    }
    msgs
}

/// Sends pre-encoded `Batch` messages to one shard: `IngestOne` for one message, the
/// `Ingest` stream for several; same methods and bytes as the generated client would send.
async fn send_encoded(
    mut rpc: RawRpc,
    msgs: Vec<Bytes>,
    timeout: Duration,
    now_ns: Option<u64>,
) -> Result<IngestReply, Status> {
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
        rpc.ready()
            .await
            .map_err(|e| Status::unavailable(format!("transport: {e}")))?;
        if msgs.len() == 1 {
            let one = msgs.into_iter().next().unwrap_or_default();
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(INGEST_ONE_PATH);
            rpc.unary(with_now(one, now_ns), path, PreEncodedCodec)
                .await
        } else {
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(INGEST_PATH);
            rpc.client_streaming(
                with_now(tokio_stream::iter(msgs), now_ns),
                path,
                PreEncodedCodec,
            )
            .await
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

    /// See [`Client::ingest_ref_at`] (the batch stays the caller's, e.g. to spool it).
    pub fn ingest_ref(&mut self, batch: &Batch) -> Result<IngestOutcome, ClientError> {
        self.rt.block_on(self.inner.ingest_ref_at(batch, None))
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
