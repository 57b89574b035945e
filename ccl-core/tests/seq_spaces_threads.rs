//! Sequence spaces in probe records with thread ranks: in a pipeline job where ranks 0->1
//! and 2->3 exchange Send/Recv between collectives (0->1 more often than 2->3), every
//! rank's records of the n-th collective carry op_counter n (SEQ_SPACE_COLLECTIVE), the
//! p2p groups carry SEQ_SPACE_P2P with the rank's own group count and each call's pair
//! sequence, and heartbeats carry both counters. Fed to an embedded analyzer (in this
//! process), the pipeline raises no diagnosis, while a rank that stops calling is named.

use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use ccl_core::device::api::DeviceApi;
use ccl_core::{enqueue, group_end, group_start, CollArgs, Comm, DataType};
use ccl_optype::CollKind;
use ccld_wire as wire;
use probe::embedded::Embedded;

static BATCHES: Mutex<Vec<wire::Batch>> = Mutex::new(Vec::new());
static EMB: OnceLock<Embedded> = OnceLock::new();

fn emb() -> &'static Embedded {
    EMB.get_or_init(|| {
        let cfg = analyzer::EngineConfig {
            hang_threshold: Duration::from_millis(600),
            ..Default::default()
        };
        Embedded::new(cfg)
    })
}

struct Capture;

impl probe::diag::Sink for Capture {
    fn deliver(&mut self, batch: wire::Batch) {
        emb().ingest(&batch, probe::now_ns());
        BATCHES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(batch);
    }
}

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Every completion reported (no thinning).
        std::env::set_var("CCLD_RECORD_US", "0");
        emb();
        probe::diag::start_with(probe::diag::DiagConfig::default(), || {
            Ok(Box::new(Capture) as Box<dyn probe::diag::Sink>)
        })
        .expect("diagnostic thread");
    });
}

const COUNT: usize = 256;

fn args(kind: CollKind, send: &[f32], recv: &mut [f32], peer: i32, stream: usize) -> CollArgs {
    CollArgs {
        kind,
        sendbuf: send.as_ptr() as usize,
        recvbuf: recv.as_mut_ptr() as usize,
        count: COUNT,
        dtype: DataType::Float32 as i32,
        op: 0,
        root: peer,
        stream,
    }
}

/// One rank of the pipeline: `iters` times an AllReduce, then p2p with its pair partner
/// (rank^1; even ranks send): pair 0-1 `reps01` groups, pair 2-3 one group. Returns
/// whether every call succeeded; the p2p data is checked.
fn pipeline_rank(c: &Arc<Comm>, iters: usize, reps01: usize) -> Result<(), String> {
    let r = c.rank() as usize;
    let send = vec![r as f32 + 1.0; COUNT];
    let mut recv = vec![0f32; COUNT];
    let peer = (r ^ 1) as i32;
    let reps = if r < 2 { reps01 } else { 1 };
    // On the (emulated) device a call returns before the work is done: wait for it.
    let dev = c.is_device().then(ccl_core::device::emu::global);
    let stream = match &dev {
        Some(d) => d.stream_create().map_err(|e| e.to_string())?,
        None => 0,
    };
    let done = || match &dev {
        Some(d) => d.stream_synchronize(stream).map_err(|e| e.to_string()),
        None => Ok(()),
    };
    for i in 0..iters {
        enqueue(c, args(CollKind::AllReduce, &send, &mut recv, -1, stream))
            .map_err(|e| format!("rank {r} AllReduce {i}: {e}"))?;
        done()?;
        if recv[0] != 10.0 {
            return Err(format!("rank {r} AllReduce {i}: got {}", recv[0]));
        }
        for _ in 0..reps {
            let kind = if r.is_multiple_of(2) {
                CollKind::Send
            } else {
                CollKind::Recv
            };
            enqueue(c, args(kind, &send, &mut recv, peer, stream))
                .map_err(|e| format!("rank {r} {kind:?} {i}: {e}"))?;
            done()?;
            if kind == CollKind::Recv && recv[0] != peer as f32 + 1.0 {
                return Err(format!("rank {r} Recv {i}: got {}", recv[0]));
            }
        }
    }
    Ok(())
}

fn run_pipeline(comms: &[Arc<Comm>], iters: usize, reps01: usize) {
    let hs: Vec<_> = comms
        .iter()
        .map(|c| {
            let c = Arc::clone(c);
            std::thread::spawn(move || pipeline_rank(&c, iters, reps01))
        })
        .collect();
    for h in hs {
        h.join().expect("rank thread").expect("pipeline");
    }
}

/// The completed records of `comm_id` once `want` of them arrived (3 s at most).
fn records_of(comm_id: u64, want: usize) -> Vec<wire::OpRecord> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let v: Vec<wire::OpRecord> = BATCHES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flat_map(|b| b.records.iter())
            .filter(|r| {
                r.trace.as_ref().is_some_and(|t| t.comm_id == comm_id)
                    && r.state == wire::OpState::Completed as i32
            })
            .cloned()
            .collect();
        if v.len() >= want || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn latest_membership(comm_id: u64, rank: u32) -> Option<wire::RankMembership> {
    BATCHES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .rev()
        .flat_map(|b| b.heartbeats.iter().rev())
        .flat_map(|h| h.ranks.iter())
        .find(|m| m.comm_id == comm_id && m.rank == rank)
        .cloned()
}

#[test]
fn pipeline_records_count_collectives_and_pairs_in_their_own_spaces() {
    pipeline_records(false);
}

/// The same on the device backend (emulated device).
#[test]
fn device_pipeline_records_count_collectives_and_pairs_in_their_own_spaces() {
    pipeline_records(true);
}

fn pipeline_records(device: bool) {
    setup();
    if device {
        std::env::set_var("CCLD_DEVICE_EMULATION", "1");
        std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    }
    let comms = Comm::init_all(4, None).expect("init");
    assert!(comms.iter().all(|c| c.is_device() == device));
    let id = comms[0].comm_id();
    let (iters, reps01) = (5usize, 2usize);
    run_pipeline(&comms, iters, reps01);
    // Per rank: iters collectives + iters*reps p2p groups.
    let want = 2 * iters * (1 + reps01) + 2 * iters * 2;
    let recs = records_of(id, want);
    assert_eq!(recs.len(), want, "records: {recs:#?}");
    for r in 0..4u32 {
        let mine: Vec<&wire::OpRecord> = recs.iter().filter(|x| x.rank == r).collect();
        let mut coll: Vec<u64> = mine
            .iter()
            .filter(|x| x.seq_space == wire::SeqSpace::Collective as i32)
            .map(|x| {
                assert!(x.p2p.is_empty());
                assert_eq!(
                    x.op.as_ref().unwrap().collective,
                    wire::CollKind::AllReduce as i32
                );
                x.trace.unwrap().op_counter
            })
            .collect();
        coll.sort_unstable();
        assert_eq!(coll, (0..iters as u64).collect::<Vec<_>>(), "rank {r}");
        let reps = if r < 2 { reps01 } else { 1 };
        let mut p2p: Vec<(u64, wire::P2pPeerSeq)> = mine
            .iter()
            .filter(|x| x.seq_space == wire::SeqSpace::P2p as i32)
            .map(|x| {
                assert_eq!(x.p2p.len(), 1, "{x:?}");
                (x.trace.unwrap().op_counter, x.p2p[0])
            })
            .collect();
        p2p.sort_by_key(|x| x.0);
        assert_eq!(p2p.len(), iters * reps, "rank {r}");
        for (k, (local, ps)) in p2p.iter().enumerate() {
            // One call per group: the group count and the pair sequence are both k.
            assert_eq!(*local, k as u64, "rank {r}");
            assert_eq!(ps.seq, k as u64, "rank {r}");
            assert_eq!(ps.peer, r ^ 1);
            assert_eq!(ps.send, r % 2 == 0);
            assert_eq!(
                (ps.count, ps.dtype),
                (COUNT as u64, DataType::Float32 as u32)
            );
        }
    }
    // Heartbeats: the latest collective number and the p2p group count.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let m: Vec<_> = (0..4).map(|r| latest_membership(id, r)).collect();
        let ok = m.iter().enumerate().all(|(r, m)| {
            let reps = if r < 2 { reps01 } else { 1 };
            m.as_ref().is_some_and(|m| {
                m.last_op_counter == Some(iters as u64 - 1)
                    && m.last_p2p_counter == Some((iters * reps) as u64)
            })
        });
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "heartbeats: {m:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn mixed_group_numbers_its_collective_and_its_p2p_apart() {
    setup();
    let comms = Comm::init_all(2, None).expect("init");
    let id = comms[0].comm_id();
    let hs: Vec<_> = comms
        .iter()
        .map(|c| {
            let c = Arc::clone(c);
            std::thread::spawn(move || {
                let r = c.rank();
                let send = vec![1f32; COUNT];
                let mut recv = vec![0f32; COUNT];
                let mut recv2 = vec![0f32; COUNT];
                let kind = if r == 0 {
                    CollKind::Send
                } else {
                    CollKind::Recv
                };
                group_start().unwrap();
                enqueue(&c, args(CollKind::AllReduce, &send, &mut recv, -1, 0)).unwrap();
                enqueue(&c, args(kind, &send, &mut recv2, 1 - r, 0)).unwrap();
                group_end().unwrap();
                enqueue(&c, args(CollKind::AllReduce, &send, &mut recv, -1, 0)).unwrap();
                assert_eq!(recv[0], 2.0);
            })
        })
        .collect();
    for h in hs {
        h.join().expect("rank");
    }
    let recs = records_of(id, 6);
    assert_eq!(recs.len(), 6, "{recs:#?}");
    for r in 0..2u32 {
        let mut v: Vec<(i32, u64, usize)> = recs
            .iter()
            .filter(|x| x.rank == r)
            .map(|x| (x.seq_space, x.trace.unwrap().op_counter, x.p2p.len()))
            .collect();
        v.sort_unstable();
        let (c, p) = (
            wire::SeqSpace::Collective as i32,
            wire::SeqSpace::P2p as i32,
        );
        assert_eq!(v, vec![(c, 0, 0), (c, 1, 0), (p, 0, 1)], "rank {r}");
    }
}

/// Ticks the embedded analyzer until it names a root in communicator `id` (its first such
/// diagnosis), or `None` after `within`.
fn first_root_diagnosis(id: u64, within: Duration) -> Option<wire::Diagnosis> {
    let deadline = Instant::now() + within;
    loop {
        emb().tick(probe::now_ns());
        let named = emb()
            .diagnoses()
            .into_iter()
            .find(|d| d.comm_id == id && !d.roots.is_empty());
        if named.is_some() || Instant::now() > deadline {
            return named;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn embedded_analyzer_quiet_on_the_pipeline_and_names_a_stopped_rank() {
    setup();
    let comms = Comm::init_all(4, None).expect("init");
    let id = comms[0].comm_id();
    // Long enough for the hang threshold to pass over the pipeline's own waits.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1500) {
        run_pipeline(&comms, 10, 3);
        emb().tick(probe::now_ns());
    }
    std::thread::sleep(Duration::from_millis(900));
    emb().tick(probe::now_ns());
    let mine = |v: Vec<wire::Diagnosis>| -> Vec<wire::Diagnosis> {
        v.into_iter().filter(|d| d.comm_id == id).collect()
    };
    assert_eq!(mine(emb().diagnoses()), vec![], "pipeline job diagnosed");
    // Rank 3 stops; the others enter the next AllReduce.
    let hs: Vec<_> = comms[..3]
        .iter()
        .map(|c| {
            let c = Arc::clone(c);
            std::thread::spawn(move || {
                let send = vec![1f32; COUNT];
                let mut recv = vec![0f32; COUNT];
                enqueue(&c, args(CollKind::AllReduce, &send, &mut recv, -1, 0))
            })
        })
        .collect();
    let named = first_root_diagnosis(id, Duration::from_secs(10));
    for c in &comms {
        let _ = c.abort();
    }
    for h in hs {
        let _ = h.join();
    }
    let d = named.expect("no diagnosis of the stopped rank");
    let roots: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
    assert_eq!(roots, vec![3], "{d:?}");
}

/// A rank whose group failed (a call of it refused: NCCL cancels the whole group) never
/// enters the AllReduce its peer waits in: the embedded analyzer names it, with the failed
/// call as the reason (the probe's heartbeats carry it until the rank starts another
/// operation).
#[test]
fn a_rank_whose_group_failed_is_named_with_the_failed_call() {
    setup();
    let comms = Comm::init_all(2, None).expect("init");
    let id = comms[0].comm_id();
    let send = vec![1f32; COUNT];
    let mut recv0 = vec![0f32; COUNT];
    group_start().unwrap();
    enqueue(
        &comms[0],
        args(CollKind::AllReduce, &send, &mut recv0, -1, 0),
    )
    .unwrap();
    let bad = CollArgs {
        dtype: 99,
        ..args(CollKind::AllReduce, &send, &mut recv0, -1, 0)
    };
    assert!(enqueue(&comms[0], bad).is_err());
    assert!(group_end().is_err(), "the group must fail");
    let c1 = Arc::clone(&comms[1]);
    let peer = std::thread::spawn(move || {
        let send = vec![1f32; COUNT];
        let mut recv = vec![0f32; COUNT];
        enqueue(&c1, args(CollKind::AllReduce, &send, &mut recv, -1, 0))
    });
    let named = first_root_diagnosis(id, Duration::from_secs(10));
    for c in &comms {
        let _ = c.abort();
    }
    assert!(
        peer.join().unwrap().is_err(),
        "the peer's AllReduce ended by the abort"
    );
    let d = named.expect("no diagnosis of the rank whose group failed");
    let roots: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
    assert_eq!(roots, vec![0], "{d:?}");
    let reason = &d.roots[0].reason;
    assert!(
        reason.contains("did not enter op #0")
            && reason.contains(
                "its last call failed: ncclGroupEnd cancelled its group after a call of it failed (invalid argument: AllReduce: invalid data type 99"
            ),
        "{reason}"
    );
}
