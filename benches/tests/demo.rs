//! `ccl-demo` as a user runs it (README's first command): 4 ranks as threads, a DP
//! communicator over all of them and TP pairs split from it, an anomaly on rank 2 after
//! the warm-up. Every diagnosis must name the faulty rank only: in particular the TP pair
//! {0, 1}, whose rank 0 leaves each slow DP AllReduce last and so enters TP late, is not
//! diagnosed (its time in DP is not its computation, nor is its partner's wait a slow TP
//! link; docs/diagnosis.md section 3a).

use std::process::Command;

/// Runs the demo with `args`; returns its exit status and the global ranks of every
/// diagnosis' "root cause = ..." line.
fn demo(args: &[&str]) -> (bool, Vec<Vec<u32>>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ccl-demo"))
        .args(args)
        .output()
        .expect("ccl-demo runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let roots = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("root cause = "))
        .map(|l| {
            l.split(", ")
                .filter_map(|g| g.strip_prefix("global rank ")?.parse().ok())
                .collect()
        })
        .collect();
    (out.status.success(), roots, text)
}

#[test]
fn a_throttled_dp_link_is_named_and_the_tp_pair_it_delays_is_not() {
    let (ok, roots, text) = demo(&["--fault", "s2", "--rank", "2"]);
    assert!(ok, "the demo did not name rank 2:\n{text}");
    assert!(!roots.is_empty(), "{text}");
    // The link 2 -> 3 is named by both its ends; nobody else may be.
    for r in &roots {
        assert!(
            r.contains(&2) && r.iter().all(|g| [2, 3].contains(g)),
            "a diagnosis names {r:?}:\n{text}"
        );
    }
}

#[test]
fn a_slow_computation_is_named_in_every_communicator_of_its_rank_only() {
    let (ok, roots, text) = demo(&["--fault", "s1", "--rank", "2"]);
    assert!(ok, "the demo did not name rank 2:\n{text}");
    for r in &roots {
        assert_eq!(r, &[2], "a diagnosis names {r:?}:\n{text}");
    }
}
