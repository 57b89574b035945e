//! Client behaviour without a cluster: every shard down, bad configuration; the in-process
//! diagnosis feed of a shard.

mod common;

use std::time::{Duration, Instant};

use analyzer_net::client::{BlockingClient, ClientConfig, ClientError};
use ccld_wire::ListAnomaliesRequest;
use common::*;

/// Two loopback ports with nothing listening (bound, then released).
fn dead_addrs() -> Vec<String> {
    let ls: Vec<_> = (0..2).map(|_| bind()).collect();
    ls.iter()
        .map(|l| l.local_addr().unwrap().to_string())
        .collect()
}

#[test]
fn all_shards_down_is_a_typed_error_with_the_unsent_count() {
    let mut cfg = ClientConfig::new(dead_addrs());
    cfg.rpc_timeout = Duration::from_secs(2);
    let mut c = BlockingClient::new(cfg).unwrap();
    let t0 = Instant::now();
    match c.ingest(rounds(0x5, 4, 0..3)) {
        Err(ClientError::AllDown { unsent, last }) => {
            assert_eq!(unsent, 12);
            assert!(!last.is_empty());
        }
        other => panic!("expected AllDown, got {other:?}"),
    }
    assert_eq!(c.down_shards().len(), 2);
    // In back-off, the next call fails fast without touching the network.
    match c.ingest(rounds(0x5, 4, 3..4)) {
        Err(ClientError::AllDown { unsent, .. }) => assert_eq!(unsent, 4),
        other => panic!("expected AllDown, got {other:?}"),
    }
    let e = c
        .list_anomalies(ListAnomaliesRequest::default())
        .unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::Unavailable));
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn bad_configuration_is_refused() {
    assert!(matches!(
        BlockingClient::new(ClientConfig::new(Vec::<String>::new())),
        Err(ClientError::Shards(_))
    ));
    assert!(matches!(
        BlockingClient::new(ClientConfig::new(["a:1", "a:1"])),
        Err(ClientError::Shards(_))
    ));
    assert!(matches!(
        BlockingClient::new(ClientConfig::new(["bad address with spaces"])),
        Err(ClientError::Address { .. })
    ));
    let mut cfg = ClientConfig::new(["127.0.0.1:1"]);
    cfg.token = Some("has space".into());
    assert!(matches!(
        BlockingClient::new(cfg),
        Err(ClientError::Token(_))
    ));
}

#[test]
fn a_shard_coming_back_is_used_again_after_its_back_off() {
    let l = bind();
    let addr = l.local_addr().unwrap();
    drop(l);
    let mut cfg = ClientConfig::new([addr.to_string()]);
    cfg.backoff_initial = Duration::from_millis(100);
    cfg.rpc_timeout = Duration::from_secs(2);
    let mut c = BlockingClient::new(cfg).unwrap();
    assert!(c.ingest(rounds(0x9, 2, 0..1)).is_err());
    let s = analyzer_net::server::ShardProcess::spawn(
        single(analyzer::EngineConfig::default()),
        addr,
        Some(std::net::TcpListener::bind(addr).unwrap()),
        1,
    )
    .unwrap();
    let ok = wait_for(Duration::from_secs(5), || {
        c.ingest(rounds(0x9, 2, 0..1)).ok()
    });
    assert_eq!(ok.expect("reconnected").accepted, 2);
    assert!(c.down_shards().is_empty());
    s.stop();
}

/// `ShardProcess::subscribe` hands an in-process reader the diagnoses the shard makes,
/// the same ones (same ids) `ListAnomalies` returns.
#[test]
fn subscribed_feed_sees_the_shards_diagnoses() {
    use ccld_wire::{AnomalyClass, OpState};
    let sh = spawn(single(analyzer::EngineConfig {
        hang_threshold: Duration::from_millis(300),
        ..analyzer::EngineConfig::default()
    }));
    let mut feed = sh.subscribe();
    assert!(feed.try_next().is_none(), "nothing diagnosed yet");
    // Ops 0..5 complete on all 4 ranks; ranks 0..2 have been in op 5 for 2 s, rank 3 never
    // entered it.
    let mut b = rounds(0x77, 4, 0..5);
    for r in 0..3 {
        let mut x = rec(0x77, 5, r, 4, 2_000_000_000);
        x.state = OpState::InFlight as i32;
        b.records.push(x);
    }
    let mut c = BlockingClient::new(ClientConfig::new([sh.addr.to_string()])).unwrap();
    c.ingest(b).unwrap();
    let d = wait_for(Duration::from_secs(10), || feed.try_next()).expect("a diagnosis");
    assert_eq!(d.class(), AnomalyClass::H1NotEntered);
    assert_eq!(d.roots.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![3]);
    let listed = c
        .list_anomalies(ListAnomaliesRequest::default())
        .unwrap()
        .diagnoses;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, d.id);
    assert_eq!(feed.lagged(), 0);
    assert!(feed.try_next().is_none(), "one diagnosis per episode");
    sh.kill();
}
