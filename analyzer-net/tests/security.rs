//! Token refusal, TLS round trip, bad input and the metrics endpoint of one shard.

mod common;

use std::io::Write;
use std::time::Duration;

use analyzer::engine::EngineConfig;
use analyzer_net::client::{BlockingClient, ClientConfig, ClientError};
use ccld_wire::{Batch, ListAnomaliesRequest};
use common::*;
use tonic::Code;

fn client(addr: std::net::SocketAddr, token: Option<&str>) -> BlockingClient {
    let mut c = ClientConfig::new([addr.to_string()]);
    c.token = token.map(str::to_string);
    c.rpc_timeout = Duration::from_secs(5);
    BlockingClient::new(c).unwrap()
}

#[test]
fn token_is_required_and_refusals_are_counted() {
    let mut cfg = single(EngineConfig::default());
    cfg.token = Some("s3cret-token".into());
    let s = spawn(cfg);
    let batch = rounds(0x51, 4, 0..3);

    let mut none = client(s.addr, None);
    let e = none.ingest(batch.clone()).unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    let e = none
        .list_anomalies(ListAnomaliesRequest::default())
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");

    let mut wrong = client(s.addr, Some("s3cret-tokem"));
    let e = wrong.ingest(batch.clone()).unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");

    let mut right = client(s.addr, Some("s3cret-token"));
    let out = right.ingest(batch).unwrap();
    assert_eq!(out.accepted, 12);
    assert!(right
        .list_anomalies(ListAnomaliesRequest::default())
        .is_ok());

    assert_eq!(
        s.metrics
            .auth_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    let (st, body) = http_get(s.metrics_addr.unwrap(), "/metrics");
    assert!(st.contains("200"), "{st}");
    assert_eq!(metric(&body, "ccld_auth_failures_total"), Some(3.0));
    assert_eq!(metric(&body, "ccld_records_ingested_total"), Some(12.0));
    s.stop();
}

#[test]
fn tls_round_trip_with_self_signed_certificate() {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();

    let mut cfg = single(EngineConfig::default());
    cfg.tls = Some(analyzer_net::auth::server_tls(&cert, &key).unwrap());
    cfg.token = Some("tok".into());
    let s = spawn(cfg);

    let mut cc = ClientConfig::new([s.addr.to_string()]);
    cc.tls = Some(analyzer_net::auth::client_tls(&cert, Some("localhost")).unwrap());
    cc.token = Some("tok".into());
    cc.rpc_timeout = Duration::from_secs(5);
    let mut c = BlockingClient::new(cc).unwrap();
    let out = c.ingest(rounds(0x77, 2, 0..2)).unwrap();
    assert_eq!(out.accepted, 4);
    assert!(c.list_anomalies(ListAnomaliesRequest::default()).is_ok());

    // A plaintext client cannot talk to the TLS port.
    let mut plain = client(s.addr, Some("tok"));
    assert!(plain
        .list_anomalies(ListAnomaliesRequest::default())
        .is_err());

    // A client trusting another CA refuses the server.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let other_ca = dir.path().join("other.pem");
    std::fs::write(&other_ca, other.cert.pem()).unwrap();
    let mut cc = ClientConfig::new([s.addr.to_string()]);
    cc.tls = Some(analyzer_net::auth::client_tls(&other_ca, Some("localhost")).unwrap());
    cc.token = Some("tok".into());
    cc.rpc_timeout = Duration::from_secs(5);
    let mut bad = BlockingClient::new(cc).unwrap();
    assert!(bad.list_anomalies(ListAnomaliesRequest::default()).is_err());
    s.stop();
}

#[test]
fn bad_records_are_rejected_and_counted() {
    let s = spawn(single(EngineConfig::default()));
    let mut c = client(s.addr, None);
    let good = rounds(0xabc, 4, 0..12);
    let mut b = good.clone();
    // rank >= nranks
    b.records.push(rec(0xabc, 12, 4, 4, 1_000));
    b.records.push(rec(0xabc, 12, 99, 4, 1_000));
    // nranks disagreeing with the communicator's
    b.records.push(rec(0xabc, 12, 1, 5, 1_000));
    // a second, different completed record for the same rank and a round still open
    b.records.push(rec(0xabc, 12, 2, 4, 1_000_000));
    b.records.push(rec(0xabc, 12, 2, 4, 2_000_000));
    // a record of a round every rank completed already: stale, accepted for liveness only
    // (it does not reopen the round)
    b.records.push(rec(0xabc, 11, 2, 4, 2_000_000));
    // op counter far behind the rank's newest (beyond the reorder tolerance)
    let mut r = rec(0xabc, 100, 3, 4, 1_000_000);
    r.start_ns = 2_000 * 10_000_000;
    b.records.push(r);
    b.records.push(rec(0xabc, 1, 3, 4, 1_000_000));
    // absurd duration (years)
    b.records.push(rec(0xabc, 12, 0, 4, u64::MAX / 2));
    // no trace id / no op type set / unknown enum value
    let mut r = rec(0xabc, 12, 1, 4, 1_000);
    r.trace = None;
    b.records.push(r);
    let mut r = rec(0xabc, 12, 1, 4, 1_000);
    r.op = None;
    b.records.push(r);
    let mut r = rec(0xabc, 12, 1, 4, 1_000);
    r.state = 77;
    b.records.push(r);
    let out = c.ingest(b).unwrap();
    assert_eq!(out.accepted, 51, "{out:?}");
    assert_eq!(out.rejected, 9, "{out:?}");
    assert_eq!(out.reasons.len(), 9);

    let (_, body) = http_get(s.metrics_addr.unwrap(), "/metrics");
    let series = analyzer_net::metrics::parse_text(&body);
    let rejected: f64 = series
        .iter()
        .filter(|(k, _)| k.starts_with("ccld_records_rejected_total{"))
        .map(|(_, v)| *v)
        .sum();
    assert_eq!(rejected, 9.0, "{body}");
    for reason in [
        "rank_out_of_range",
        "nranks_mismatch",
        "duplicate_completed",
        "counter_backwards",
        "absurd_duration",
        "missing_trace",
        "missing_op_type_set",
        "unknown_enum",
    ] {
        let k = format!("ccld_records_rejected_total{{reason=\"{reason}\"}}");
        assert!(metric(&body, &k).is_some_and(|v| v >= 1.0), "{k} in {body}");
    }
    assert_eq!(metric(&body, "ccld_records_ingested_total"), Some(51.0));
    s.stop();
}

#[test]
fn oversized_and_junk_input_is_refused_without_harm() {
    let mut cfg = single(EngineConfig::default());
    cfg.max_message_bytes = 64 * 1024;
    let s = spawn(cfg);

    // Oversized message: refused by the codec with a status, not a crash.
    let mut cc = ClientConfig::new([s.addr.to_string()]);
    cc.chunk_records = 1_000_000;
    cc.rpc_timeout = Duration::from_secs(5);
    let mut c = BlockingClient::new(cc).unwrap();
    let big = rounds(0x1, 8, 0..500); // 4000 records, well over 64 KiB
    match c.ingest(big) {
        Err(ClientError::Refused { code, .. }) => {
            assert!(
                matches!(
                    code,
                    Code::OutOfRange | Code::ResourceExhausted | Code::Internal
                ),
                "{code:?}"
            )
        }
        other => panic!("expected a refusal, got {other:?}"),
    }

    // Junk bytes on the gRPC port.
    for junk in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0u8; 64][..],
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff",
    ] {
        let mut t = std::net::TcpStream::connect(s.addr).unwrap();
        let _ = t.write_all(junk);
        drop(t);
    }
    // Empty batch is fine.
    let mut ok = client(s.addr, None);
    assert_eq!(ok.ingest(Batch::default()).unwrap().accepted, 0);
    // And the server still works.
    assert_eq!(ok.ingest(rounds(0x2, 2, 0..1)).unwrap().accepted, 2);
    s.stop();
}

#[test]
fn metrics_endpoint_content() {
    let s = spawn(single(EngineConfig::default()));
    let mut c = client(s.addr, None);
    c.ingest(rounds(0x10, 4, 0..5)).unwrap();
    let ma = s.metrics_addr.unwrap();
    let body = wait_for(Duration::from_secs(5), || {
        let (_, b) = http_get(ma, "/metrics");
        (metric(&b, "ccld_communicators_tracked") == Some(1.0)).then_some(b)
    })
    .expect("communicator gauge updated by the tick");
    for fam in [
        "# TYPE ccld_records_ingested_total counter",
        "# TYPE ccld_records_rejected_total counter",
        "# TYPE ccld_diagnoses_total counter",
        "# TYPE ccld_location_latency_seconds histogram",
        "# TYPE ccld_tick_duration_seconds histogram",
        "# TYPE ccld_communicators_tracked gauge",
        "# TYPE ccld_engine_memory_bytes gauge",
        "# TYPE ccld_process_resident_memory_bytes gauge",
    ] {
        assert!(body.contains(fam), "missing {fam}");
    }
    assert_eq!(metric(&body, "ccld_records_ingested_total"), Some(20.0));
    assert!(metric(&body, "ccld_process_resident_memory_bytes").unwrap() > 1e6);
    assert!(metric(&body, "ccld_engine_memory_bytes").unwrap() > 0.0);
    assert!(metric(&body, "ccld_tick_duration_seconds_count").unwrap() >= 1.0);
    let (st, _) = http_get(ma, "/nope");
    assert!(st.contains("404"), "{st}");
    s.stop();
}

#[test]
fn tls_and_token_between_shards_during_fan_out() {
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let ls: Vec<_> = (0..2).map(|_| bind()).collect();
    let names: Vec<String> = ls
        .iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect();
    let map = analyzer_net::shard::ShardMap::new(&names).unwrap();
    let shards: Vec<_> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let mut c = single(EngineConfig::default());
            c.shards = Some(map.clone());
            c.shard_id = i;
            c.token = Some("tok".into());
            c.tls = Some(analyzer_net::auth::server_tls(&cert, &key).unwrap());
            c.peer.token = Some("tok".into());
            c.peer.tls = Some(analyzer_net::auth::client_tls(&cert, Some("localhost")).unwrap());
            let a = l.local_addr().unwrap();
            analyzer_net::server::ShardProcess::spawn(c, a, Some(l), 1).unwrap()
        })
        .collect();
    let mut cc = ClientConfig::new(names.clone());
    cc.tls = Some(analyzer_net::auth::client_tls(&cert, Some("localhost")).unwrap());
    cc.token = Some("tok".into());
    let mut c = BlockingClient::new(cc).unwrap();
    // Communicators on both shards.
    let mut b = Batch::default();
    for comm in 1..=20u64 {
        b.records.extend(rounds(comm, 2, 0..1).records);
    }
    let out = c.ingest(b).unwrap();
    assert_eq!(out.accepted, 40);
    assert_eq!(out.per_shard.len(), 2, "{out:?}");
    // Ask one shard only: it must reach the other over TLS with the token.
    let mut one = ClientConfig::new([names[0].clone()]);
    one.tls = Some(analyzer_net::auth::client_tls(&cert, Some("localhost")).unwrap());
    one.token = Some("tok".into());
    let mut one = BlockingClient::new(one).unwrap();
    let comms = wait_for(Duration::from_secs(5), || {
        let l = one
            .list_comms(ccld_wire::ListCommsRequest::default())
            .ok()?;
        (l.comms.len() == 20).then_some(l)
    })
    .expect("all 20 communicators listed through the fan-out");
    assert!(comms.unreachable_shards.is_empty());
    // No peer call was refused.
    for s in &shards {
        assert_eq!(
            s.metrics
                .auth_failures
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
    for s in shards {
        s.stop();
    }
}
