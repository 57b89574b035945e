//! Client behaviour without a cluster: every shard down, bad configuration.

mod common;

use std::time::{Duration, Instant};

use analyzer::client::{BlockingClient, ClientConfig, ClientError};
use analyzer::wire::ListAnomaliesRequest;
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
    let s = analyzer::server::ShardProcess::spawn(
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
