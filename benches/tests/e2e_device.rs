//! End to end with device communicators on the CPU emulation of the device
//! (`CCLD_DEVICE_EMULATION=1`): ranks as threads, each with its own device communicator,
//! stream and device buffers, the embedded analyzer, shortened windows (as e2e_threads);
//! an anomaly of each class injected through `CCLD_INJECT` at a non-zero root of 4 ranks
//! is diagnosed with the right class and root rank. The faults run in the emulated kernel
//! (throttle, stall), in the runtime's host functions (delay, not entered) or in the plan
//! (halved), and the wait metrics the S2 rule needs come from the emulated kernel.
//!
//! The GPU suite runs the same cases on a real GPU (`device_diagnosis` example, part f).

use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::e2e_harness::{roots_ok, run_case_device, run_case_device_wrong_count, WrongCount};
use ccl_core::device::api::DeviceApi;
use ccld_wire::{self as wire, AnomalyClass};
use probe::CollKind;

fn env() {
    std::env::set_var("CCLD_DEVICE_EMULATION", "1");
    std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    // 16 KiB slots and Simple: one message per ring step and channel for the harness's
    // 64 KiB AllReduce on 4 ranks, as on the host backend (the S3 case's entry delay is
    // sized for that); small FIFOs keep the emulated device memory small.
    std::env::set_var("NCCL_BUFFSIZE", "131072");
    std::env::set_var("NCCL_PROTO", "Simple");
}

/// How long a case waits for its first diagnosis (it returns at that diagnosis). The
/// emulated kernels are slow: quiet, the S2 case is named after 5-8 s; under CI's load
/// (other tests and builds on the same two cores) it once took more than 15 s, and on
/// 2026-12-04 it raised nothing within 30 s in both tries of one CI run, on a machine
/// otherwise idle (passing in 5-8 s alone and in its binary's sequence right after).
const WAIT: Duration = Duration::from_secs(60);

fn check(class: AnomalyClass, root: usize) {
    env();
    let api: Arc<dyn DeviceApi> = ccl_core::device::emu::global();
    let t = Instant::now();
    let n = 4;
    let ds = run_case_device(&api, 0, class, n, root, CollKind::AllReduce, WAIT)
        .expect("device ranks set up");
    let (got, roots, line) = first(&ds, &format!("{class:?} n={n} root={root}"), t);
    assert!(got == class && roots_ok(class, root, &roots), "{line}");
}

/// The first diagnosis of a case: its class, its root ranks and a line for the log
/// (printed) and the assertion.
fn first(ds: &[wire::Diagnosis], case: &str, t: Instant) -> (AnomalyClass, Vec<u32>, String) {
    let d = ds.first().unwrap_or_else(|| panic!("{case}: no diagnosis"));
    let roots: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
    let line = format!(
        "{case}: got {:?} roots {roots:?} in {:.1} s: {}",
        d.class(),
        t.elapsed().as_secs_f64(),
        probe::describe(d)
    );
    eprintln!("{line}");
    (d.class(), roots, line)
}

#[test]
fn h1_not_entered() {
    check(AnomalyClass::H1NotEntered, 1);
}

#[test]
fn h2_inconsistent() {
    check(AnomalyClass::H2Inconsistent, 2);
}

#[test]
fn h3_hardware() {
    check(AnomalyClass::H3Hardware, 3);
}

#[test]
fn s1_computation_slow() {
    check(AnomalyClass::S1ComputationSlow, 1);
}

#[test]
fn s2_communication_slow() {
    check(AnomalyClass::S2CommunicationSlow, 2);
}

#[test]
fn s3_mixed_slow() {
    check(AnomalyClass::S3MixedSlow, 3);
}

/// A real inconsistent call, no injection: rank 2 passes half the count once. The kernels'
/// descriptor check fails the operation (rank 2 and its ring successor see the mismatch,
/// the others are poisoned) and the analyzer names rank 2 H2 from the probe's failure
/// records.
#[test]
fn h2_a_real_wrong_count_is_named() {
    env();
    let api: Arc<dyn DeviceApi> = ccl_core::device::emu::global();
    let t = Instant::now();
    let wrong = WrongCount { rank: 2, at: 300 };
    let ds = run_case_device_wrong_count(&api, 0, 4, CollKind::AllReduce, WAIT, wrong)
        .expect("device ranks set up");
    let (got, roots, line) = first(&ds, &format!("{wrong:?}"), t);
    assert!(
        got == AnomalyClass::H2Inconsistent && roots == [2],
        "{line}"
    );
}
