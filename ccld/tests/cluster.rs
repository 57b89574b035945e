//! Three shards on loopback: communicators spread by rendezvous hashing, cluster-wide
//! queries from every shard, one shard killed (failover of its communicators, queries name
//! it unreachable) and restarted on the same data directory (its history is back, nothing
//! lost, ids not reused).

#[path = "../../analyzer-net/tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::Duration;

use analyzer::engine::EngineConfig;
use analyzer::sim::{comm_id, H2Variant, Injection, Sim, SimAlgo, SimConfig, Truth};
use analyzer_net::client::{BlockingClient, Client, ClientConfig};
use analyzer_net::server::{ClockMode, ServerConfig, ShardProcess};
use analyzer_net::shard::ShardMap;
use ccld_wire::{
    AnomalyClass, Batch, Diagnosis, GetCommRequest, ListAnomaliesRequest, ListCommsRequest,
    ListIncidentsRequest, TimedBatch, WatchRequest,
};

const START: u64 = 100_000_000_000;
const EPOCH: u64 = 1_700_000_000_000_000_000;

fn shard_cfg(map: &ShardMap, id: usize, dir: &Path) -> ServerConfig {
    let mut c = ServerConfig::single(EngineConfig::default());
    c.shard_id = id;
    c.shards = Some(map.clone());
    let store = ccld::store::Store::open(Some(&dir.join(format!("shard{id}")))).expect("store");
    c.history = Some(std::sync::Arc::new(store));
    c.clock = ClockMode::Driven;
    c.peer.timeout = Duration::from_secs(5);
    c.peer.connect_timeout = Duration::from_millis(300);
    c
}

fn start(map: &ShardMap, id: usize, dir: &Path, l: TcpListener) -> ShardProcess {
    let a = l.local_addr().unwrap();
    ShardProcess::spawn(shard_cfg(map, id, dir), a, Some(l), 2).expect("shard starts")
}

fn rebind(a: SocketAddr) -> TcpListener {
    for _ in 0..100 {
        if let Ok(l) = TcpListener::bind(a) {
            return l;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("cannot rebind {a}");
}

/// A seed whose communicator 0 is owned by shard `want` (deterministic spread).
fn seed_owned_by(map: &ShardMap, want: usize, from: u64) -> u64 {
    (from..from + 10_000)
        .find(|&s| map.owner(comm_id(s, 0)) == want)
        .expect("some seed maps to every shard")
}

fn sim(seed: u64, class: AnomalyClass, rank: u32, epoch: u64) -> Sim {
    Sim::new(SimConfig {
        seed,
        comms: 2,
        nranks: 8,
        algo: SimAlgo::Ring,
        epoch_ns: epoch,
        duration_ns: START + 330_000_000_000,
        inject: Some(Injection {
            class,
            rank,
            start_ns: START,
            silent: false,
            h2: H2Variant::TypeMismatch,
        }),
        ..SimConfig::default()
    })
    .unwrap()
}

/// Merges simulators with the same epoch and batch interval batch by batch.
fn zip(mut sims: Vec<Sim>) -> Vec<TimedBatch> {
    let mut out = Vec::new();
    loop {
        let mut now = None;
        let mut b = Batch::default();
        for s in &mut sims {
            if let Some(tb) = s.next_batch() {
                now = Some(now.map_or(tb.now_ns, |n: u64| n.max(tb.now_ns)));
                let x = tb.batch.unwrap_or_default();
                b.records.extend(x.records);
                b.heartbeats.extend(x.heartbeats);
            }
        }
        match now {
            Some(n) => out.push(TimedBatch {
                now_ns: n,
                batch: Some(b),
            }),
            None => return out,
        }
    }
}

fn client(addrs: &[String]) -> BlockingClient {
    let mut c = ClientConfig::new(addrs.iter().cloned());
    c.rpc_timeout = Duration::from_secs(10);
    c.backoff_initial = Duration::from_millis(50);
    BlockingClient::new(c).unwrap()
}

fn ids(ds: &[Diagnosis]) -> BTreeSet<String> {
    ds.iter().map(|d| d.id.clone()).collect()
}

fn diagnosed(ds: &[Diagnosis], t: &Truth) -> bool {
    ds.iter().any(|d| {
        d.comm_id == t.comm_id
            && d.class == t.class as i32
            && d.roots.iter().any(|r| r.rank == t.rank)
    })
}

#[test]
fn three_shards_kill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ls: Vec<TcpListener> = (0..3).map(|_| common::bind()).collect();
    let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
    let names: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
    let map = ShardMap::new(&names).unwrap();
    let mut shards: Vec<Option<ShardProcess>> = ls
        .into_iter()
        .enumerate()
        .map(|(i, l)| Some(start(&map, i, dir.path(), l)))
        .collect();

    // A cluster-wide watch opened on shard 2 before anything happens.
    let (wtx, wrx) = std::sync::mpsc::channel::<Diagnosis>();
    let waddr = names[2].clone();
    let watcher = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut c = Client::new(ClientConfig::new([waddr])).unwrap();
            let mut st = c.watch(WatchRequest::default()).await.unwrap();
            while let Ok(Ok(Some(d))) =
                tokio::time::timeout(Duration::from_secs(20), st.message()).await
            {
                if wtx.send(d).is_err() {
                    break;
                }
            }
        });
    });
    std::thread::sleep(Duration::from_millis(300));

    // Phase 1: one anomalous communicator owned by each shard (plus a clean one each).
    let classes = [
        AnomalyClass::H1NotEntered,
        AnomalyClass::H3Hardware,
        AnomalyClass::S1ComputationSlow,
    ];
    let mut sims = Vec::new();
    let mut truths = Vec::new();
    let mut seed = 1;
    for (i, class) in classes.iter().enumerate() {
        seed = seed_owned_by(&map, i, seed + 1);
        let s = sim(seed, *class, 2 + i as u32, EPOCH);
        truths.push(s.truth().unwrap());
        sims.push(s);
    }
    let mut c = client(&names);
    let (mut accepted, mut failed_over) = (0, 0);
    for tb in zip(sims) {
        let o = c.ingest_at(tb.batch.unwrap(), Some(tb.now_ns)).unwrap();
        assert_eq!(o.rejected, 0, "{:?}", o.reasons);
        accepted += o.accepted;
        failed_over += o.failed_over;
    }
    assert!(accepted > 0);
    assert_eq!(failed_over, 0);

    // Every shard holds the records of its own communicators only, and every shard
    // answers for the whole cluster.
    let mut before = BTreeSet::new();
    for (i, name) in names.iter().enumerate() {
        let mut q = client(std::slice::from_ref(name));
        let local = q
            .list_anomalies(ListAnomaliesRequest {
                local_only: true,
                ..Default::default()
            })
            .unwrap();
        assert!(
            diagnosed(&local.diagnoses, &truths[i]),
            "shard {i} diagnosed its own communicator"
        );
        for d in &local.diagnoses {
            assert_eq!(map.owner(d.comm_id), i);
            assert_eq!(d.shard, names[i]);
        }
        let all = q.list_anomalies(ListAnomaliesRequest::default()).unwrap();
        assert!(all.unreachable_shards.is_empty());
        for t in &truths {
            assert!(diagnosed(&all.diagnoses, t), "shard {i} answers for {t:?}");
        }
        if i == 0 {
            before = ids(&all.diagnoses);
        } else {
            assert_eq!(ids(&all.diagnoses), before);
        }
        let comms = q.list_comms(ListCommsRequest::default()).unwrap();
        assert_eq!(comms.comms.len(), 6, "{:?}", comms.comms);
        for cs in &comms.comms {
            assert_eq!(map.name(map.owner(cs.comm_id)), Some(cs.shard.as_str()));
        }
        for t in &truths {
            let st = q
                .get_comm(GetCommRequest {
                    comm_id: t.comm_id,
                    local_only: false,
                })
                .unwrap();
            assert_eq!(st.shard, names[map.owner(t.comm_id)]);
        }
    }

    // The watcher on shard 2 saw the diagnoses of all three shards.
    let mut watched = BTreeSet::new();
    while watched != before {
        match wrx.recv_timeout(Duration::from_secs(10)) {
            Ok(d) => {
                watched.insert(d.id);
            }
            Err(_) => panic!("watch missed diagnoses: got {watched:?}, want {before:?}"),
        }
    }
    let shards_seen: BTreeSet<&str> = watched.iter().map(|id| &id[..2]).collect();
    assert_eq!(shards_seen.len(), 3, "{watched:?}");
    drop(wrx);

    // Shard 1's incidents (one per anomaly) before it dies.
    let local_incidents = |name: &String| {
        let mut q = client(std::slice::from_ref(name));
        let l = q
            .list_incidents(ListIncidentsRequest {
                local_only: true,
                ..Default::default()
            })
            .unwrap();
        l.incidents
            .into_iter()
            .map(|i| {
                (
                    i.id,
                    i.class,
                    i.roots.iter().map(|r| r.rank).collect::<Vec<_>>(),
                )
            })
            .collect::<Vec<_>>()
    };
    let incidents_1 = local_incidents(&names[1]);
    assert!(
        incidents_1
            .iter()
            .any(|(_, c, r)| *c == truths[1].class as i32 && r.contains(&truths[1].rank)),
        "shard 1 made the incident of its anomaly: {incidents_1:?}"
    );

    // Phase 2: kill shard 1 outright.
    shards[1].take().unwrap().kill();
    for i in [0usize, 2] {
        let mut q = client(std::slice::from_ref(&names[i]));
        let all = q.list_anomalies(ListAnomaliesRequest::default()).unwrap();
        assert_eq!(all.unreachable_shards, vec![names[1].clone()]);
        assert!(diagnosed(&all.diagnoses, &truths[0]));
        assert!(diagnosed(&all.diagnoses, &truths[2]));
        assert!(!diagnosed(&all.diagnoses, &truths[1]));
    }
    // A client whose first shard is the dead one still gets an answer.
    let mut q = client(&[names[1].clone(), names[0].clone()]);
    assert!(q.list_anomalies(ListAnomaliesRequest::default()).is_ok());

    // Phase 3: a new anomaly on a communicator owned by the dead shard fails over to the
    // next shard in its rendezvous order, which diagnoses it.
    let epoch2 = EPOCH + 1_000_000_000_000;
    let seed_b = seed_owned_by(&map, 1, seed + 1);
    let s = sim(seed_b, AnomalyClass::H1NotEntered, 5, epoch2);
    let t_fail = s.truth().unwrap();
    let backup = map.order(t_fail.comm_id)[1];
    let mut fo = 0;
    for tb in zip(vec![s]) {
        let o = c.ingest_at(tb.batch.unwrap(), Some(tb.now_ns)).unwrap();
        assert_eq!(o.rejected, 0, "{:?}", o.reasons);
        fo += o.failed_over;
        assert!(!o.per_shard.contains_key(&names[1]));
    }
    assert!(fo > 0);
    let mut q = client(std::slice::from_ref(&names[backup]));
    let local = q
        .list_anomalies(ListAnomaliesRequest {
            local_only: true,
            ..Default::default()
        })
        .unwrap();
    assert!(
        diagnosed(&local.diagnoses, &t_fail),
        "backup shard {backup} diagnosed it"
    );

    // Phase 4: restart shard 1 on the same data directory and port: its incidents are back
    // (persisted with its diagnoses), newest first as before.
    shards[1] = Some(start(&map, 1, dir.path(), rebind(addrs[1])));
    assert_eq!(
        local_incidents(&names[1]),
        incidents_1,
        "incidents survive a restart"
    );
    let mut expected = before.clone();
    expected.extend(
        local
            .diagnoses
            .iter()
            .filter(|d| d.comm_id == t_fail.comm_id)
            .map(|d| d.id.clone()),
    );
    for (i, name) in names.iter().enumerate() {
        let mut q = client(std::slice::from_ref(name));
        let all = q.list_anomalies(ListAnomaliesRequest::default()).unwrap();
        assert!(
            all.unreachable_shards.is_empty(),
            "{:?}",
            all.unreachable_shards
        );
        assert_eq!(
            ids(&all.diagnoses),
            expected,
            "shard {i}: no diagnosis lost"
        );
        for t in truths.iter().chain([&t_fail]) {
            assert!(diagnosed(&all.diagnoses, t));
        }
    }
    // The restarted shard continues its id sequence instead of reusing ids.
    let seed_c = seed_owned_by(&map, 1, seed_b + 1);
    let epoch3 = epoch2 + 1_000_000_000_000;
    let s = sim(seed_c, AnomalyClass::H3Hardware, 1, epoch3);
    let t3 = s.truth().unwrap();
    let mut c = client(&names);
    for tb in zip(vec![s]) {
        let o = c.ingest_at(tb.batch.unwrap(), Some(tb.now_ns)).unwrap();
        assert_eq!(o.failed_over, 0);
    }
    let mut q = client(std::slice::from_ref(&names[1]));
    let local = q
        .list_anomalies(ListAnomaliesRequest {
            local_only: true,
            ..Default::default()
        })
        .unwrap();
    assert!(diagnosed(&local.diagnoses, &t3));
    let local_ids = ids(&local.diagnoses);
    assert_eq!(local_ids.len(), local.diagnoses.len(), "ids unique");
    let old_on_1: BTreeSet<String> = before
        .iter()
        .filter(|id| id.starts_with("s1-"))
        .cloned()
        .collect();
    assert!(!old_on_1.is_empty());
    assert!(old_on_1.is_subset(&local_ids));

    for s in shards.into_iter().flatten() {
        s.stop();
    }
    watcher.join().unwrap();
}
