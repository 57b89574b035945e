//! The self-calibrated slow rule (docs/diagnosis.md §3a) as the engine applies it, against
//! the paper's fixed rule on the same stream: a noisy communicator whose widest round
//! exceeds theta in every window stays quiet, and a steady latecomer whose R stays under
//! theta against the baseline is named.

mod common;

use std::time::Duration;

use analyzer::{Engine, EngineConfig};
use ccld_wire::{AnomalyClass, Diagnosis};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;
const T0: u64 = 1_000 * S;
const COMM: u64 = 0xca1;
/// One round every 80 ms (longer than any operation here, as in a training loop); 1 s
/// windows hold 12-13 rounds.
const PERIOD: u64 = 80 * MS;
/// The latecomer from round LATE_FROM on.
const LATE_FROM: u64 = 600;
const LATE_RANK: usize = 2;

/// Arrival offsets (ms) of the 4 ranks in round `c`: a rotating latecomer 2-6 ms late,
/// about once per window (from round 120) a 60 ms descheduling spike of a rotating rank, and
/// from LATE_FROM rank 2 always 30-32 ms late.
fn arrivals(c: u64) -> [u64; 4] {
    let mut a = [0u64; 4];
    if c >= LATE_FROM {
        a[LATE_RANK] = 30 + c % 3;
        return a;
    }
    let w = 2 + (c * 7) % 5;
    a[(c % 4) as usize] = if c >= 120 && c % 13 == 7 { 60 } else { w };
    a
}

/// Feeds rounds 1..=`last` (the operation takes 10 ms after the last arrival) and ticks
/// after each; returns the diagnoses with the round at which each came.
fn run(cfg: EngineConfig, last: u64) -> Vec<(u64, Diagnosis)> {
    run_with(cfg, last, arrivals)
}

/// [`run`] with other arrival offsets.
fn run_with(cfg: EngineConfig, last: u64, arrivals: fn(u64) -> [u64; 4]) -> Vec<(u64, Diagnosis)> {
    let mut e = Engine::new(cfg);
    let mut out = Vec::new();
    for c in 1..=last {
        let base = c * PERIOD;
        let a = arrivals(c);
        let done = base + a.iter().max().unwrap() * MS + 10 * MS;
        for (r, &ar) in a.iter().enumerate() {
            let start = base + ar * MS;
            let mut x = common::rec(COMM, c, r as u32, 4, done - start);
            x.start_ns = start;
            e.ingest(&x, T0 + done).unwrap();
        }
        out.extend(e.tick(T0 + done).into_iter().map(|d| (c, d)));
    }
    out
}

fn cfg() -> EngineConfig {
    EngineConfig {
        detect_window: Duration::from_secs(1),
        repeat_threshold: 2,
        theta_slow: 3.0,
        t_base_init: Duration::from_millis(100),
        baseline_rounds_max: 20,
        baseline_span: Duration::from_secs(1),
        hang_threshold: Duration::from_secs(300),
        silent_after: Duration::from_secs(300),
        ..EngineConfig::default()
    }
}

#[test]
fn noisy_widest_rounds_stay_quiet_and_a_steady_latecomer_is_named() {
    // The paper's rule alone: every spike window has R = (70 - ~14) / ~14 = 4 > 3, so the
    // clean part raises slow diagnoses; the latecomer's rounds (T_max about 40 ms, R about
    // 1.9) never pass theta.
    let fixed = run(
        EngineConfig {
            self_calibration: None,
            ..cfg()
        },
        LATE_FROM + 200,
    );
    assert!(
        fixed.iter().any(|(c, _)| *c < LATE_FROM),
        "the fixed rule raises on the noisy clean part: {fixed:?}"
    );
    assert!(
        !fixed
            .iter()
            .any(|(c, d)| *c >= LATE_FROM && d.roots.iter().any(|r| r.rank == LATE_RANK as u32)),
        "the fixed rule misses the latecomer: {fixed:?}"
    );

    // Self-calibrated: quiet on the clean part, the latecomer named S1 within 5 windows.
    let calibrated = run(cfg(), LATE_FROM + 200);
    let early: Vec<_> = calibrated.iter().filter(|(c, _)| *c < LATE_FROM).collect();
    assert!(early.is_empty(), "clean part raised {early:?}");
    let (at, d) = calibrated
        .first()
        .unwrap_or_else(|| panic!("the latecomer was not named"));
    assert!(
        *at < LATE_FROM + 90,
        "named after {} rounds",
        at - LATE_FROM
    );
    assert_eq!(d.class(), AnomalyClass::S1ComputationSlow, "{d:?}");
    let roots: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
    assert_eq!(roots, [LATE_RANK as u32], "{d:?}");
}

/// [`arrivals`], and from LATE_FROM on once per 13 rounds rank 0 is descheduled 60 ms: the
/// window's widest round is then rank 0's, while rank 2 entered last in all the others.
fn arrivals_with_a_spike(c: u64) -> [u64; 4] {
    let mut a = arrivals(c);
    if c >= LATE_FROM && c % 13 == 5 {
        a[0] = 60;
    }
    a
}

#[test]
fn the_windows_steady_latecomer_is_named_not_the_widest_rounds() {
    let d = run_with(cfg(), LATE_FROM + 200, arrivals_with_a_spike);
    let early: Vec<_> = d.iter().filter(|(c, _)| *c < LATE_FROM).collect();
    assert!(early.is_empty(), "clean part raised {early:?}");
    let (_, first) = d.first().expect("the latecomer was not named");
    let roots: Vec<u32> = first.roots.iter().map(|r| r.rank).collect();
    assert_eq!(roots, [LATE_RANK as u32], "{first:?}");
    assert!(
        first.roots[0].reason.contains("entered last in"),
        "{}",
        first.roots[0].reason
    );
    // Every later diagnosis agrees.
    for (c, x) in &d {
        let r: Vec<u32> = x.roots.iter().map(|r| r.rank).collect();
        assert_eq!(r, [LATE_RANK as u32], "round {c}: {x:?}");
    }
}
