//! Ingest wire compatibility: the generated prost client against the shard (whose ingest
//! decodes with `analyzer_net::codec`), the library client (pre-encoded batches) against a
//! plain generated prost server, and malformed frames refused with a clear status.

mod common;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use analyzer::engine::EngineConfig;
use analyzer_net::client::{BlockingClient, ClientConfig};
use analyzer_net::codec::{PreEncodedCodec, INGEST_ONE_PATH, INGEST_PATH};
use analyzer_net::grpc::analyzer_client::AnalyzerClient;
use analyzer_net::grpc::analyzer_server::{Analyzer, AnalyzerServer};
use ccld_wire::{
    AnomalyList, Batch, CommList, CommState, Diagnosis, GetCommRequest, Heartbeat, IncidentList,
    IngestReply, ListAnomaliesRequest, ListCommsRequest, ListIncidentsRequest, RankMembership,
    WatchRequest,
};
use common::*;
use prost::Message;
use tonic::{Code, Request, Response, Status, Streaming};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn channel(addr: std::net::SocketAddr) -> tonic::transport::Channel {
    analyzer_net::server::lazy_channel(&addr.to_string(), None, Duration::from_secs(2)).unwrap()
}

fn records_of(rt: &tokio::runtime::Runtime, addr: std::net::SocketAddr, comm: u64) -> Vec<u64> {
    rt.block_on(async {
        let mut c = AnalyzerClient::new(channel(addr));
        let st = c
            .get_comm(GetCommRequest {
                comm_id: comm,
                local_only: true,
            })
            .await
            .unwrap()
            .into_inner();
        st.ranks.iter().map(|r| r.records).collect()
    })
}

#[test]
fn prost_client_batches_are_ingested_by_the_shard() {
    let s = spawn(single(EngineConfig::default()));
    let rt = runtime();
    let (one, streamed) = rt.block_on(async {
        let mut c = AnalyzerClient::new(channel(s.addr));
        let one = c
            .ingest_one(rounds(0xa1, 4, 0..3))
            .await
            .unwrap()
            .into_inner();
        let msgs = vec![
            rounds(0xb2, 2, 0..2),
            rounds(0xb2, 2, 2..5),
            Batch::default(),
        ];
        let streamed = c
            .ingest(tokio_stream::iter(msgs))
            .await
            .unwrap()
            .into_inner();
        (one, streamed)
    });
    assert_eq!((one.accepted, one.rejected), (12, 0));
    assert_eq!((streamed.accepted, streamed.rejected), (10, 0));
    assert_eq!(records_of(&rt, s.addr, 0xa1), vec![3; 4]);
    assert_eq!(records_of(&rt, s.addr, 0xb2), vec![5; 2]);
    // The library client (pre-encoded) lands in the same engine state.
    let mut c = BlockingClient::new(ClientConfig::new([s.addr.to_string()])).unwrap();
    let out = c.ingest(rounds(0xc3, 4, 0..3)).unwrap();
    assert_eq!((out.accepted, out.rejected), (12, 0));
    assert_eq!(records_of(&rt, s.addr, 0xc3), vec![3; 4]);
    s.stop();
}

#[test]
fn malformed_frames_are_refused_with_a_clear_status_and_the_shard_carries_on() {
    let s = spawn(single(EngineConfig::default()));
    let rt = runtime();
    let good = rounds(0xd4, 2, 0..2).encode_to_vec();
    let mut truncated = rounds(0xd5, 2, 0..2).encode_to_vec();
    truncated.truncate(truncated.len() - 3);
    let (one, stream) = rt.block_on(async {
        let mut g = tonic::client::Grpc::new(channel(s.addr));
        g.ready().await.unwrap();
        let one = g
            .unary(
                Request::new(bytes::Bytes::from(truncated.clone())),
                tonic::codegen::http::uri::PathAndQuery::from_static(INGEST_ONE_PATH),
                PreEncodedCodec,
            )
            .await;
        g.ready().await.unwrap();
        // A good message then junk on the stream.
        let msgs = vec![
            bytes::Bytes::from(good.clone()),
            bytes::Bytes::from_static(&[0xff, 0xff, 0xff]),
        ];
        let stream = g
            .client_streaming(
                Request::new(tokio_stream::iter(msgs)),
                tonic::codegen::http::uri::PathAndQuery::from_static(INGEST_PATH),
                PreEncodedCodec,
            )
            .await;
        (one, stream)
    });
    let e = one.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(e.message().contains("malformed Batch message"), "{e}");
    let e = stream.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    assert!(
        e.message().contains("malformed Batch message at byte 0"),
        "{e}"
    );
    // Nothing of the truncated unary message was taken; the stream's good first message was.
    assert_eq!(records_of(&rt, s.addr, 0xd4), vec![2; 2]);
    let (_, body) = http_get(s.metrics_addr.unwrap(), "/metrics");
    assert_eq!(
        metric(&body, "ccld_bad_requests_total{method=\"IngestOne\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        metric(&body, "ccld_bad_requests_total{method=\"Ingest\"}"),
        Some(1.0),
        "{body}"
    );
    assert_eq!(metric(&body, "ccld_records_ingested_total"), Some(4.0));
    let mut c = BlockingClient::new(ClientConfig::new([s.addr.to_string()])).unwrap();
    assert_eq!(c.ingest(rounds(0xd6, 2, 0..1)).unwrap().accepted, 2);
    s.stop();
}

/// A plain generated prost server that keeps every batch it receives.
#[derive(Default, Clone)]
struct Recorder {
    got: Arc<Mutex<Vec<(&'static str, Batch)>>>,
}

impl Recorder {
    fn keep(&self, how: &'static str, b: Batch) -> u64 {
        let n = b.records.len() as u64;
        self.got.lock().unwrap().push((how, b));
        n
    }
}

type DiagStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Diagnosis, Status>> + Send>>;

#[tonic::async_trait]
impl Analyzer for Recorder {
    async fn ingest(
        &self,
        request: Request<Streaming<Batch>>,
    ) -> Result<Response<IngestReply>, Status> {
        let mut s = request.into_inner();
        let mut accepted = 0;
        while let Some(b) = s.message().await? {
            accepted += self.keep("stream", b);
        }
        Ok(Response::new(IngestReply {
            accepted,
            ..Default::default()
        }))
    }
    async fn ingest_one(&self, request: Request<Batch>) -> Result<Response<IngestReply>, Status> {
        let accepted = self.keep("one", request.into_inner());
        Ok(Response::new(IngestReply {
            accepted,
            ..Default::default()
        }))
    }
    async fn list_anomalies(
        &self,
        _: Request<ListAnomaliesRequest>,
    ) -> Result<Response<AnomalyList>, Status> {
        Err(Status::unimplemented("recorder"))
    }
    type WatchStream = DiagStream;
    async fn watch(&self, _: Request<WatchRequest>) -> Result<Response<DiagStream>, Status> {
        Err(Status::unimplemented("recorder"))
    }
    async fn get_comm(&self, _: Request<GetCommRequest>) -> Result<Response<CommState>, Status> {
        Err(Status::unimplemented("recorder"))
    }
    async fn list_comms(&self, _: Request<ListCommsRequest>) -> Result<Response<CommList>, Status> {
        Err(Status::unimplemented("recorder"))
    }
    async fn list_incidents(
        &self,
        _: Request<ListIncidentsRequest>,
    ) -> Result<Response<IncidentList>, Status> {
        Err(Status::unimplemented("recorder"))
    }
}

/// A recorder served on a loopback port by a plain generated server; dropping the
/// returned guard stops it.
struct RecorderServer {
    addr: std::net::SocketAddr,
    rec: Recorder,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl RecorderServer {
    fn start() -> Self {
        let rec = Recorder::default();
        let l = bind();
        let addr = l.local_addr().unwrap();
        l.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let svc = AnalyzerServer::new(rec.clone());
        let join = rt.spawn(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(l),
                    async move {
                        let _ = stop_rx.await;
                    },
                )
                .await
        });
        Self {
            addr,
            rec,
            rt,
            stop: Some(stop_tx),
            join: Some(join),
        }
    }

    fn got(&self) -> Vec<(&'static str, Batch)> {
        self.rec.got.lock().unwrap().clone()
    }
}

impl Drop for RecorderServer {
    fn drop(&mut self) {
        if let (Some(stop), Some(join)) = (self.stop.take(), self.join.take()) {
            let _ = stop.send(());
            let _ = self
                .rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(5), join).await });
        }
    }
}

#[test]
fn library_client_batches_decode_with_prost_on_a_plain_server() {
    let srv = RecorderServer::start();
    let mut cfg = ClientConfig::new([srv.addr.to_string()]);
    cfg.chunk_records = 5;
    let mut c = BlockingClient::new(cfg).unwrap();
    // Small batch with a heartbeat: one IngestOne message.
    let mut small = rounds(0xe1, 4, 0..1);
    small.heartbeats.push(Heartbeat {
        host: "h".into(),
        pid: 9,
        ranks: vec![RankMembership {
            comm_id: 0xe1,
            rank: 0,
            nranks: 4,
            last_op_counter: Some(0),
            last_p2p_counter: None,
            last_call_error: None,
        }],
        records_dropped: 2,
        time_ns: 5,
    });
    assert_eq!(c.ingest_ref(&small).unwrap().accepted, 4);
    // 12 records in chunks of 5: a stream of 3 messages.
    let big = rounds(0xe2, 4, 0..3);
    assert_eq!(c.ingest(big.clone()).unwrap().accepted, 12);
    // Close the client's connection, or the graceful stop waits for it.
    drop(c);
    let got = srv.got();
    drop(srv);
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0], ("one", small));
    assert!(got[1..].iter().all(|(how, _)| *how == "stream"));
    let sizes: Vec<usize> = got[1..].iter().map(|(_, b)| b.records.len()).collect();
    assert_eq!(sizes, vec![5, 5, 2]);
    let all: Vec<_> = got[1..]
        .iter()
        .flat_map(|(_, b)| b.records.clone())
        .collect();
    assert_eq!(all, big.records);
}

#[test]
fn records_of_a_dead_shard_fail_over_whole_and_in_order() {
    let srv = RecorderServer::start();
    let dead = {
        let l = bind();
        l.local_addr().unwrap().to_string()
    };
    let names = vec![srv.addr.to_string(), dead.clone()];
    let map = analyzer_net::shard::ShardMap::new(&names).unwrap();
    // Communicators owned by each shard, interleaved in one batch.
    let live: Vec<u64> = (1..).filter(|&c| map.owner(c) == 0).take(2).collect();
    let gone: Vec<u64> = (1..).filter(|&c| map.owner(c) == 1).take(2).collect();
    let mut b = Batch::default();
    for op in 0..3 {
        for &comm in [live[0], gone[0], live[1], gone[1]].iter() {
            b.records.extend(rounds(comm, 2, op..op + 1).records);
        }
    }
    let mut cfg = ClientConfig::new(names.clone());
    cfg.rpc_timeout = Duration::from_secs(5);
    let mut c = BlockingClient::new(cfg).unwrap();
    let out = c.ingest_ref(&b).unwrap();
    assert_eq!(out.accepted, 24);
    assert_eq!(out.failed_over, 12, "{out:?}");
    assert_eq!(out.per_shard.get(&names[0]), Some(&24));
    assert_eq!(c.down_shards(), vec![dead]);
    drop(c);
    let got = srv.got();
    drop(srv);
    // First the live shard's own share, then the dead shard's share, each in batch order.
    let recv: Vec<_> = got.iter().flat_map(|(_, b)| b.records.clone()).collect();
    let owned_by = |s: usize| -> Vec<_> {
        b.records
            .iter()
            .filter(|r| map.owner(r.trace.unwrap().comm_id) == s)
            .cloned()
            .collect()
    };
    let mut expected = owned_by(0);
    expected.extend(owned_by(1));
    assert_eq!(recv, expected);
}
