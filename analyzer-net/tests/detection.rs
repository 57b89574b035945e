//! Ingest + detection through gRPC, driven by the simulator: every diagnosis the shard
//! makes must equal what the in-process engine makes from the same stream (the reference
//! is `sim::drive` on a separate engine), and must name the injected class and rank.

mod common;

use std::time::Duration;

use analyzer::engine::{Engine, EngineConfig};
use analyzer::sim::{drive, H2Variant, Injection, Sim, SimAlgo, SimConfig, Truth};
use analyzer_net::client::{BlockingClient, Client, ClientConfig};
use analyzer_net::server::{now_ns, ClockMode};
use ccld_wire::{AnomalyClass, Diagnosis, GetCommRequest, ListAnomaliesRequest, WatchRequest};
use common::*;

const START: u64 = 200_000_000_000;

fn is_hang(c: AnomalyClass) -> bool {
    matches!(
        c,
        AnomalyClass::H1NotEntered | AnomalyClass::H2Inconsistent | AnomalyClass::H3Hardware
    )
}

fn sim_cfg(algo: SimAlgo, n: u32, class: AnomalyClass, rank: u32) -> SimConfig {
    SimConfig {
        nranks: n,
        algo,
        comms: 2,
        duration_ns: START + if is_hang(class) { 330 } else { 200 } * 1_000_000_000,
        inject: Some(Injection {
            class,
            rank,
            start_ns: START,
            silent: false,
            h2: H2Variant::TypeMismatch,
        }),
        seed: 11 + u64::from(rank),
        ..SimConfig::default()
    }
}

fn through_grpc(
    cfg: &SimConfig,
) -> (
    Vec<Diagnosis>,
    Truth,
    std::sync::Arc<analyzer_net::metrics::Metrics>,
) {
    let mut sc = single(EngineConfig::default());
    sc.clock = ClockMode::Driven;
    let s = spawn(sc);
    let mut cc = ClientConfig::new([s.addr.to_string()]);
    cc.rpc_timeout = Duration::from_secs(10);
    let mut c = BlockingClient::new(cc).unwrap();
    let sim = Sim::new(cfg.clone()).unwrap();
    let truth = sim.truth().unwrap();
    for tb in sim {
        let out = c
            .ingest_at(tb.batch.unwrap_or_default(), Some(tb.now_ns))
            .unwrap();
        assert_eq!(out.rejected, 0, "{:?}", out.reasons);
    }
    let mut l = c.list_anomalies(ListAnomaliesRequest::default()).unwrap();
    assert!(l.unreachable_shards.is_empty());
    l.diagnoses.reverse(); // oldest first, like the engine's emission order
                           // The communicator state is queryable too.
    let st = c
        .get_comm(GetCommRequest {
            comm_id: truth.comm_id,
            local_only: false,
        })
        .unwrap();
    assert_eq!(st.comm_id, truth.comm_id);
    assert_eq!(st.nranks, cfg.nranks);
    assert_eq!(st.ranks.len(), cfg.nranks as usize);
    let m = s.metrics.clone();
    s.stop();
    (l.diagnoses, truth, m)
}

fn reference(cfg: &SimConfig) -> Vec<Diagnosis> {
    let mut e = Engine::new(EngineConfig::default());
    drive(Sim::new(cfg.clone()).unwrap(), &mut e).diagnoses
}

fn check(algo: SimAlgo, n: u32, class: AnomalyClass, rank: u32) {
    let cfg = sim_cfg(algo, n, class, rank);
    let (got, truth, metrics) = through_grpc(&cfg);
    let want = reference(&cfg);
    assert!(
        !want.is_empty(),
        "reference engine found nothing for {class:?}"
    );
    assert_eq!(got.len(), want.len(), "{class:?}: {got:#?} vs {want:#?}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.class, w.class);
        assert_eq!(g.comm_id, w.comm_id);
        assert_eq!(g.trace, w.trace);
        let gr: Vec<u32> = g.roots.iter().map(|r| r.rank).collect();
        let wr: Vec<u32> = w.roots.iter().map(|r| r.rank).collect();
        assert_eq!(gr, wr);
        assert_eq!(g.detected_at_ns, w.detected_at_ns);
        assert!(g.id.starts_with("s0-"), "{}", g.id);
        assert!(!g.shard.is_empty());
    }
    let d = &got[0];
    assert_eq!(d.class, truth.class as i32, "{}", d.summary);
    assert_eq!(d.comm_id, truth.comm_id);
    assert!(
        d.roots.iter().any(|r| r.rank == truth.rank),
        "{}",
        d.summary
    );
    let code = ccld_wire::class_code(truth.class);
    assert_eq!(
        metrics.diagnoses.get(code),
        got.iter().filter(|g| g.class == truth.class as i32).count() as u64
    );
    assert_eq!(metrics.location_latency.count(), got.len() as u64);
}

#[test]
fn h1_not_entered_ring() {
    check(SimAlgo::Ring, 8, AnomalyClass::H1NotEntered, 3);
}

#[test]
fn h2_inconsistent_ring() {
    check(SimAlgo::Ring, 8, AnomalyClass::H2Inconsistent, 7);
}

#[test]
fn h3_hardware_tree() {
    check(SimAlgo::Tree, 16, AnomalyClass::H3Hardware, 5);
}

#[test]
fn s1_computation_slow_ring() {
    check(SimAlgo::Ring, 8, AnomalyClass::S1ComputationSlow, 0);
}

#[test]
fn s2_communication_slow_tree() {
    check(SimAlgo::Tree, 16, AnomalyClass::S2CommunicationSlow, 9);
}

#[test]
fn s3_mixed_slow_ring() {
    check(SimAlgo::Ring, 8, AnomalyClass::S3MixedSlow, 2);
}

/// Wall clock, real time: the tick task (not the ingest path) makes the diagnosis, and a
/// Watch subscriber receives it.
#[test]
fn real_time_hang_is_diagnosed_by_the_tick_and_watched() {
    let ecfg = EngineConfig {
        hang_threshold: Duration::from_millis(800),
        ..EngineConfig::default()
    };
    let s = spawn(single(ecfg));
    let addr = s.addr.to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut watcher = rt
        .block_on(async {
            let mut c = Client::new(ClientConfig::new([addr.clone()]))?;
            c.watch(WatchRequest::default()).await
        })
        .unwrap();

    let epoch = now_ns();
    let cfg = SimConfig {
        nranks: 6,
        comms: 1,
        op_ns: 20_000_000,
        period_ns: 100_000_000,
        snapshot_ns: 100_000_000,
        heartbeat_ns: 200_000_000,
        batch_ns: 100_000_000,
        late_ns: 0,
        duration_ns: 2_500_000_000,
        epoch_ns: epoch,
        inject: Some(Injection {
            class: AnomalyClass::H1NotEntered,
            rank: 4,
            start_ns: 400_000_000,
            silent: false,
            h2: H2Variant::TypeMismatch,
        }),
        ..SimConfig::default()
    };
    let sim = Sim::new(cfg).unwrap();
    let truth = sim.truth().unwrap();
    let mut c = BlockingClient::new(ClientConfig::new([addr])).unwrap();
    let t0 = std::time::Instant::now();
    for tb in sim {
        let due = Duration::from_nanos(tb.now_ns - epoch);
        if let Some(w) = due.checked_sub(t0.elapsed()) {
            std::thread::sleep(w);
        }
        let out = c.ingest(tb.batch.unwrap_or_default()).unwrap();
        assert_eq!(out.rejected, 0, "{:?}", out.reasons);
    }
    let d = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), watcher.message()).await })
        .expect("a diagnosis within 5 s")
        .expect("stream ok")
        .expect("one diagnosis");
    assert_eq!(d.class, AnomalyClass::H1NotEntered as i32, "{}", d.summary);
    assert_eq!(d.comm_id, truth.comm_id);
    assert_eq!(d.roots.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![4]);
    // Latency metric: from hang threshold crossing to diagnosis, a few ticks at most.
    assert_eq!(s.metrics.location_latency.count(), 1);
    assert!(s.metrics.location_latency.sum_ns() < 2_000_000_000);
    s.stop();
}
