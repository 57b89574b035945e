//! Simulator-driven end-to-end checks of detection and location: every anomaly class x
//! {ring, tree} x root rank {first, middle, last} x N in {4, 64, 1024}, clean streams, and
//! variants (silent processes, H2 flavours, ring orders, missing wait metrics, several
//! communicators, slow-at-start).

use analyzer::sim::{drive, DriveResult, H2Variant, Injection, Sim, SimAlgo, SimConfig};
use analyzer::wire::{class_code, AnomalyClass, BaselineKind, Diagnosis};
use analyzer::{Engine, EngineConfig};

const START: u64 = 200_000_000_000;

fn sim_cfg(algo: SimAlgo, n: u32, inject: Option<Injection>) -> SimConfig {
    SimConfig {
        nranks: n,
        algo,
        // Hangs need the 300 s threshold after the start; slow needs two full windows.
        duration_ns: if inject.as_ref().is_some_and(|i| is_hang(i.class)) {
            START + 330_000_000_000
        } else {
            START + 200_000_000_000
        },
        // Large communicators: one channel keeps the record volume (and the test) small.
        channels: if n > 64 { 1 } else { 2 },
        inject,
        seed: u64::from(n) * 7 + 3,
        ..SimConfig::default()
    }
}

fn is_hang(c: AnomalyClass) -> bool {
    matches!(
        c,
        AnomalyClass::H1NotEntered | AnomalyClass::H2Inconsistent | AnomalyClass::H3Hardware
    )
}

fn inj(class: AnomalyClass, rank: u32) -> Injection {
    Injection {
        class,
        rank,
        start_ns: START,
        silent: false,
        h2: H2Variant::TypeMismatch,
    }
}

fn run(cfg: SimConfig, ecfg: EngineConfig) -> (DriveResult, Option<analyzer::sim::Truth>) {
    let sim = Sim::new(cfg).expect("valid sim config");
    let truth = sim.truth();
    let mut e = Engine::new(ecfg);
    let res = drive(sim, &mut e);
    assert_eq!(
        res.rejected, 0,
        "simulated records are valid: {:?}",
        res.reasons
    );
    (res, truth)
}

fn roots(d: &Diagnosis) -> Vec<u32> {
    d.roots.iter().map(|r| r.rank).collect()
}

fn describe(ds: &[Diagnosis]) -> String {
    ds.iter()
        .map(|d| format!("[{} {:?} {}]", class_code(d.class()), roots(d), d.summary))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The one diagnosis of the run; it must be on the injected communicator.
fn single(res: &DriveResult, truth: &analyzer::sim::Truth) -> Diagnosis {
    assert_eq!(
        res.diagnoses.len(),
        1,
        "exactly one diagnosis expected: {}",
        describe(&res.diagnoses)
    );
    let d = res.diagnoses[0].clone();
    assert_eq!(d.comm_id, truth.comm_id);
    d
}

fn expected_roots(class: AnomalyClass, algo: SimAlgo, n: u32, k: u32) -> Vec<u32> {
    match (class, algo) {
        // Identity ring order on every channel: the slow link k -> k+1 cannot tell its two
        // ends apart; both are named, sender first. (S3 adds the late rank k, the same.)
        (AnomalyClass::S2CommunicationSlow | AnomalyClass::S3MixedSlow, SimAlgo::Ring) => {
            vec![k, (k + 1) % n]
        }
        _ => vec![k],
    }
}

fn check_matrix(n: u32) {
    let classes = [
        AnomalyClass::H1NotEntered,
        AnomalyClass::H2Inconsistent,
        AnomalyClass::H3Hardware,
        AnomalyClass::S1ComputationSlow,
        AnomalyClass::S2CommunicationSlow,
        AnomalyClass::S3MixedSlow,
    ];
    let mut failures = Vec::new();
    for algo in [SimAlgo::Ring, SimAlgo::Tree] {
        for class in classes {
            for k in [0, n / 2, n - 1] {
                let (res, truth) = run(
                    sim_cfg(algo, n, Some(inj(class, k))),
                    EngineConfig::default(),
                );
                let truth = truth.expect("injected");
                if res.diagnoses.len() != 1 {
                    failures.push(format!(
                        "{algo:?} {} k={k}: {}",
                        class_code(class),
                        describe(&res.diagnoses)
                    ));
                    continue;
                }
                let d = single(&res, &truth);
                let want = expected_roots(class, algo, n, k);
                if algo == SimAlgo::Tree && !is_hang(class) {
                    let layer = d.evidence.as_ref().and_then(|e| e.tree_layer);
                    if layer != Some(analyzer::sim::tree_layer(k)) {
                        failures.push(format!(
                            "{} k={k}: evidence tree layer {layer:?}",
                            class_code(class)
                        ));
                    }
                }
                if d.class() != class || roots(&d) != want {
                    failures.push(format!(
                        "{algo:?} {} k={k}: got {} {:?}, want {:?}: {}",
                        class_code(class),
                        class_code(d.class()),
                        roots(&d),
                        want,
                        d.summary
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "N = {n}:\n{}", failures.join("\n"));
}

#[test]
fn every_class_ring_and_tree_n4() {
    check_matrix(4);
}

#[test]
fn every_class_ring_and_tree_n64() {
    check_matrix(64);
}

#[test]
fn every_class_ring_and_tree_n1024() {
    check_matrix(1024);
}

fn clean_cfg(algo: SimAlgo, n: u32, seed: u64) -> SimConfig {
    SimConfig {
        seed,
        comms: 3,
        nranks: n,
        algo,
        jitter: 0.15,
        barrier_every: 7,
        // A rank writes a checkpoint before a barrier: the others wait 100 s in it.
        barrier_late_ns: 100_000_000_000,
        pause_round: Some(30),
        // Everyone pauses 200 s (checkpoint), then rank 0 enters one AllReduce 40 s late.
        pause_ns: 200_000_000_000,
        late_once_ns: 40_000_000_000,
        duration_ns: 900_000_000_000,
        ..SimConfig::default()
    }
}

#[test]
fn clean_streams_with_jitter_barriers_and_pauses_raise_nothing() {
    for algo in [SimAlgo::Ring, SimAlgo::Tree] {
        for (n, seed) in [(4, 11), (64, 12)] {
            let (res, _) = run(clean_cfg(algo, n, seed), EngineConfig::default());
            assert!(
                res.diagnoses.is_empty(),
                "{algo:?} N={n}: {}",
                describe(&res.diagnoses)
            );
            assert!(res.accepted > 1000);
        }
    }
}

#[test]
fn a_single_slow_round_is_noticed_but_not_diagnosed_without_repetition() {
    // The same clean stream with repeat_threshold 1 must flag the one-off late round: proof
    // that the clean test above is quiet because of the repetition counter, not blindness.
    let ecfg = EngineConfig {
        repeat_threshold: 1,
        ..EngineConfig::default()
    };
    let (res, _) = run(clean_cfg(SimAlgo::Ring, 4, 11), ecfg);
    assert!(
        res.diagnoses
            .iter()
            .any(|d| d.class() == AnomalyClass::S1ComputationSlow && roots(d) == vec![0]),
        "{}",
        describe(&res.diagnoses)
    );
}

#[test]
fn silent_processes_are_roots_and_flagged() {
    // A process that stops before the round (the H1 injection) or inside it after a part of
    // its data (the H3 injection's counts, then silence) is one fault: H1 either way.
    for algo in [SimAlgo::Ring, SimAlgo::Tree] {
        for class in [AnomalyClass::H1NotEntered, AnomalyClass::H3Hardware] {
            let k = 5;
            let mut i = inj(class, k);
            i.silent = true;
            let (res, truth) = run(sim_cfg(algo, 16, Some(i)), EngineConfig::default());
            let d = single(&res, &truth.expect("injected"));
            assert_eq!(
                (d.class(), roots(&d)),
                (AnomalyClass::H1NotEntered, vec![k]),
                "{class:?} injection: {}",
                d.summary
            );
            assert!(d.roots[0].silent, "{}", d.summary);
            let ev = d.evidence.as_ref().expect("evidence");
            assert_eq!(ev.silent_ranks, vec![k]);
            assert!(
                d.roots[0].reason.contains("stopped or dead"),
                "{}",
                d.roots[0].reason
            );
        }
    }
}

#[test]
fn h2_rank_that_completes_and_moves_on_is_the_root() {
    for algo in [SimAlgo::Ring, SimAlgo::Tree] {
        let mut i = inj(AnomalyClass::H2Inconsistent, 3);
        i.h2 = H2Variant::Completes;
        let (res, truth) = run(sim_cfg(algo, 8, Some(i)), EngineConfig::default());
        let d = single(&res, &truth.expect("injected"));
        assert_eq!(
            (d.class(), roots(&d)),
            (AnomalyClass::H2Inconsistent, vec![3]),
            "{}",
            d.summary
        );
        assert!(
            d.roots[0].reason.contains("completed"),
            "{}",
            d.roots[0].reason
        );
    }
}

#[test]
fn h2_type_mismatch_evidence_lists_both_type_sets() {
    let (res, truth) = run(
        sim_cfg(SimAlgo::Ring, 8, Some(inj(AnomalyClass::H2Inconsistent, 6))),
        EngineConfig::default(),
    );
    let d = single(&res, &truth.expect("injected"));
    let ev = d.evidence.expect("evidence");
    assert_eq!(ev.type_sets.len(), 2);
    assert_eq!(ev.type_sets[0].rank_count, 7);
    assert_eq!(ev.type_sets[1].rank_count, 1);
    assert_eq!(ev.type_sets[1].ranks, vec![6]);
    assert_eq!(ev.entered_ranks, 8);
}

#[test]
fn varied_ring_orders_isolate_the_slow_rank() {
    for class in [AnomalyClass::S2CommunicationSlow, AnomalyClass::S3MixedSlow] {
        for k in [0, 9, 15] {
            let mut cfg = sim_cfg(SimAlgo::Ring, 16, Some(inj(class, k)));
            cfg.varied_rings = true;
            cfg.channels = 4;
            let (res, truth) = run(cfg, EngineConfig::default());
            let d = single(&res, &truth.expect("injected"));
            assert_eq!((d.class(), roots(&d)), (class, vec![k]), "{}", d.summary);
            assert!(!d.evidence.expect("evidence").links.is_empty());
        }
    }
}

#[test]
fn lockstep_ring_without_wait_metrics_names_nobody() {
    let mut cfg = sim_cfg(
        SimAlgo::Ring,
        8,
        Some(inj(AnomalyClass::S2CommunicationSlow, 2)),
    );
    cfg.ext_metrics = false;
    let (res, truth) = run(cfg, EngineConfig::default());
    let d = single(&res, &truth.expect("injected"));
    assert_eq!(d.class(), AnomalyClass::S2CommunicationSlow);
    let ev = d.evidence.expect("evidence");
    assert!(ev.lockstep, "a lockstep ring must be reported as such");
    // Every rank of a lockstep ring has the same rates: the rate rule names nobody rather
    // than an arbitrary rank.
    assert!(d.roots.is_empty(), "{:?}", d.roots);
    assert!(d.summary.contains("no rank stands out"), "{}", d.summary);
}

#[test]
fn only_the_injected_communicator_is_diagnosed_among_several() {
    let mut cfg = sim_cfg(SimAlgo::Ring, 8, Some(inj(AnomalyClass::H3Hardware, 4)));
    cfg.comms = 4;
    let (res, truth) = run(cfg, EngineConfig::default());
    let d = single(&res, &truth.expect("injected"));
    assert_eq!((d.class(), roots(&d)), (AnomalyClass::H3Hardware, vec![4]));
}

#[test]
fn slow_at_start_uses_the_static_baseline() {
    let mut cfg = sim_cfg(
        SimAlgo::Ring,
        8,
        Some(inj(AnomalyClass::S1ComputationSlow, 1)),
    );
    cfg.inject.as_mut().expect("set").start_ns = 0;
    cfg.duration_ns = 150_000_000_000;
    let ecfg = EngineConfig {
        t_base_init: std::time::Duration::from_millis(200),
        ..EngineConfig::default()
    };
    let (res, truth) = run(cfg, ecfg);
    let d = single(&res, &truth.expect("injected"));
    assert_eq!(
        (d.class(), roots(&d)),
        (AnomalyClass::S1ComputationSlow, vec![1])
    );
    let ev = d.evidence.expect("evidence");
    assert_eq!(ev.baseline(), BaselineKind::Static);
    assert_eq!(ev.t_base_ns, 200_000_000);
    assert!(d.summary.contains("slow-at-start"), "{}", d.summary);
}

#[test]
fn diagnosis_fields_are_filled() {
    let (res, truth) = run(
        sim_cfg(
            SimAlgo::Ring,
            8,
            Some(inj(AnomalyClass::S1ComputationSlow, 3)),
        ),
        EngineConfig::default(),
    );
    let d = single(&res, &truth.expect("injected"));
    assert!(d.id.contains("-S1"));
    assert_eq!(d.nranks, 8);
    assert!(d.trace.is_some());
    assert!(d.detected_at_ns >= d.onset_ns && d.onset_ns > 0);
    assert_eq!(d.roots[0].pid, analyzer::sim::pid_of(0, 8, 3));
    assert_eq!(d.roots[0].host, analyzer::sim::host_name(0, 3));
    let ev = d.evidence.as_ref().expect("evidence");
    assert!(ev.r > 3.0 && ev.p > 0.6, "R {} P {}", ev.r, ev.p);
    assert_eq!(ev.baseline(), BaselineKind::Dynamic);
    assert!(ev.baseline_rounds > 0 && ev.baseline_rounds <= 100);
    assert!(ev.slow_windows >= 2);
    assert!(ev.t_max_ns > ev.t_min_ns && ev.t_min_ns > 0);
    assert_eq!(ev.duration_ns.as_ref().map(|s| s.min_rank), Some(3));
    assert_eq!(ev.ranks.len(), 1);
    assert!(
        d.summary
            .starts_with("rank 3 (pid 10003, host c0h0) enters"),
        "{}",
        d.summary
    );
}

#[test]
fn h3_without_expected_counts_learns_them_from_completed_rounds() {
    // The probe may not know its schedule's totals: the engine then uses each rank's counts
    // in its previous completed operation of the same type set (trees: AllReduce only).
    let mut failures = Vec::new();
    for n in [4, 7, 64] {
        for k in 0..n {
            let mut cfg = sim_cfg(SimAlgo::Tree, n, Some(inj(AnomalyClass::H3Hardware, k)));
            cfg.expected_counts = false;
            cfg.channels = 1;
            let (res, truth) = run(cfg, EngineConfig::default());
            let d = single(&res, &truth.expect("injected"));
            if (d.class(), roots(&d)) != (AnomalyClass::H3Hardware, vec![k]) {
                failures.push(format!("n={n} k={k}: {}", describe(&res.diagnoses)));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
