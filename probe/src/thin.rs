//! Record thinning: how a fast communicator reports a sample of its operations.
//!
//! Every operation is traced (Trace ID, frame counters, op log, sampled by the diagnostic
//! thread while in flight), but a completion record for every operation of a communicator
//! that runs tens of thousands of operations a second costs more than the operations
//! themselves on a host-backend rank (building the record, moving it, ingesting it) and
//! floods an analyzer shard. The analyzer does not need them all: slow detection looks at
//! the widest round of a window of seconds to minutes, and a slowdown worth a diagnosis
//! persists over many rounds. So a communicator reports completions of a *sample* of its
//! rounds, about one per `CCLD_RECORD_US` per rank:
//!
//! - **The same rounds on every rank, without talking.** Round `c` is reported when
//!   `hash(comm_id, c)` is a multiple of the stride `S` (a power of two, [`selected`]):
//!   every rank computes the same answer, so the reported rounds are complete and the
//!   analyzer compares all ranks on them. The hash (not `c mod S`) keeps a training loop
//!   whose period shares a factor with `S` from always reporting the same step's
//!   operation. Strides nest: the rounds selected with `2S` are a subset of those selected
//!   with `S`, so two ranks that briefly disagree on `S` still share every round the
//!   larger stride selects.
//! - **The stride follows the operation rate, identically on every rank.** Every
//!   [`EPOCH_OPS`] operations (at counters that are multiples of it: the same operations on
//!   every rank) each rank measures how long the last epoch took, start to start, and
//!   picks the stride that gives about one report per target interval ([`next_stride`]).
//!   The ranks of a collective run the same operations at the same pace, so they measure
//!   nearly the same time; a hysteresis band (the stride is kept while the ideal stays
//!   within 1/1.25 .. 2.5 times it) keeps a rate near a boundary from making them choose
//!   differently, and a jittery rate from changing the stride every epoch. The chosen
//!   stride is thus between 1/2.5 and 1.25 times the ideal one.
//! - **Never thinned:** in-flight snapshots (hangs), failed operations, an operation that
//!   got an in-flight snapshot (its completion closes the snapshot), the first epoch of
//!   every communicator (the baseline), and every operation when the target is 0. The
//!   diagnostic thread also reports, after all, the thinned completions of a rank's last
//!   few operations when one of its operations has been in flight, or the rank idle, for an
//!   in-flight period (`diag::Sampler::backfill`): the rounds that lead into a hang.
//!
//! Records carry the stride in force and the rank's computation gap before the operation
//! (the time since the end of its previous operation), which the analyzer can no longer
//! derive from consecutive records.

/// Operations per epoch: the stride is reconsidered at every counter that is a multiple.
pub const EPOCH_OPS: u64 = 32;

/// Largest stride (one reported round in 1024).
pub const MAX_STRIDE: u32 = 1024;

/// Default target interval between a rank's reported completions of one communicator
/// (`CCLD_RECORD_US`): 5 ms, i.e. at least 12,000 reported rounds in a one-minute detection
/// window.
pub const DEFAULT_RECORD_NS: u64 = 5_000_000;

/// SplitMix64's finaliser: a bijective mix whose low bits depend on every input bit.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether round `op_counter` of communicator `comm_id` is reported under `stride` (a power
/// of two; 0 and 1 select every round). The same on every rank.
pub fn selected(comm_id: u64, op_counter: u64, stride: u32) -> bool {
    if stride <= 1 {
        return true;
    }
    let h = mix64(comm_id ^ op_counter.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    h & u64::from(stride - 1) == 0
}

/// The stride for the next epoch, given the current one, how long the last
/// [`EPOCH_OPS`] operations took (start to start, `epoch_ns`) and the target interval
/// between reports (`target_ns`, 0: report everything).
///
/// The ideal stride is the number of operations per target interval. The current stride
/// is kept while the ideal lies in `[stride / 1.25, 2.5 * stride)`; outside that band the
/// new stride is the largest power of two not above the ideal, within `1..=MAX_STRIDE`.
pub fn next_stride(stride: u32, epoch_ns: u64, target_ns: u64) -> u32 {
    if target_ns == 0 {
        return 1;
    }
    let stride = stride.clamp(1, MAX_STRIDE);
    let ideal = target_ns as f64 * EPOCH_OPS as f64 / epoch_ns.max(1) as f64;
    let cur = f64::from(stride);
    if ideal >= cur / 1.25 && ideal < 2.5 * cur {
        return stride;
    }
    let mut s = 1u32;
    while s < MAX_STRIDE && f64::from(s * 2) <= ideal {
        s *= 2;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_round_is_selected_without_thinning() {
        for c in 0..1000 {
            assert!(selected(7, c, 0) && selected(7, c, 1));
        }
    }

    #[test]
    fn selection_rate_is_one_in_stride_and_strides_nest() {
        for stride in [2u32, 4, 8, 16, 32, 64, 512] {
            let n = 512_000u64;
            let k = (0..n).filter(|&c| selected(0xfeed, c, stride)).count() as f64;
            let expect = n as f64 / f64::from(stride);
            assert!(
                (k - expect).abs() < 5.0 * expect.sqrt(),
                "stride {stride}: {k} of {n}"
            );
            // Whatever 2S selects, S selects too.
            for c in 0..n {
                if selected(0xfeed, c, stride * 2) {
                    assert!(selected(0xfeed, c, stride), "stride {stride}, round {c}");
                }
            }
        }
    }

    #[test]
    fn a_periodic_loop_is_not_aliased() {
        // A loop of 4 operations per step with stride 4: `c mod 4` would report only the
        // first operation of every step; the hash reports each position about equally.
        let mut per_pos = [0u32; 4];
        for c in 0..40_000u64 {
            if selected(99, c, 4) {
                per_pos[(c % 4) as usize] += 1;
            }
        }
        for n in per_pos {
            assert!((2000..3000).contains(&n), "{per_pos:?}");
        }
    }

    #[test]
    fn different_communicators_sample_different_rounds() {
        let a: Vec<u64> = (0..256).filter(|&c| selected(1, c, 8)).collect();
        let b: Vec<u64> = (0..256).filter(|&c| selected(2, c, 8)).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn stride_follows_the_rate_with_hysteresis() {
        let ms = 1_000_000u64;
        let target = 2 * ms;
        // 32 operations in 64 ms: one per 2 ms, one per target interval: stride 1.
        assert_eq!(next_stride(1, 64 * ms, target), 1);
        // One operation every 60 us: 33 per interval -> 32.
        assert_eq!(next_stride(1, 32 * 60_000, target), 32);
        // Very fast: capped.
        assert_eq!(next_stride(1, 32, target), MAX_STRIDE);
        // Ideal 2.45 (just under 2.5x): stride 1 stays; 2.55 switches to 2.
        let epoch_for = |ideal: f64| (target as f64 * EPOCH_OPS as f64 / ideal) as u64;
        assert_eq!(next_stride(1, epoch_for(2.45), target), 1);
        assert_eq!(next_stride(1, epoch_for(2.55), target), 2);
        // Stride 8 holds from ideal 6.5 to 19.9, then drops / rises.
        assert_eq!(next_stride(8, epoch_for(6.5), target), 8);
        assert_eq!(next_stride(8, epoch_for(19.9), target), 8);
        assert_eq!(next_stride(8, epoch_for(6.3), target), 4);
        assert_eq!(next_stride(8, epoch_for(20.5), target), 16);
        // Ops that suddenly take 75 ms: straight back to 1.
        assert_eq!(next_stride(MAX_STRIDE, 32 * 75 * ms, target), 1);
        // Target 0: every operation.
        assert_eq!(next_stride(16, 1, 0), 1);
    }

    #[test]
    fn ranks_measuring_slightly_different_epochs_agree_but_at_a_crossing() {
        // Two ranks of a lockstep ring measure an epoch within a fraction of an operation of
        // each other (entry skew, which varies from epoch to epoch). Sweeping the rate over a factor of 200 and back, they
        // choose the same stride except in the odd epoch where the rate crosses a band
        // edge that lies between their two measurements: each such streak is short.
        let target = DEFAULT_RECORD_NS;
        let (mut a, mut b) = (1u32, 1u32);
        let (mut disagree, mut streak, mut longest, mut changes) = (0, 0, 0, 0);
        let steps = 2000;
        for k in 0..steps {
            let t = (k as f64 / steps as f64 * std::f64::consts::TAU).cos();
            let op_ns = (20_000.0 * (200.0f64).powf((t + 1.0) / 2.0)) as u64;
            // Each epoch is measured start to start, so the skew difference telescopes:
            // it is noise of up to a third of an operation either way, not a bias.
            let noise = (mix64(k as u64) % 2001) as f64 / 1000.0 - 1.0;
            let ea = op_ns * EPOCH_OPS;
            let eb = (ea as f64 + noise * op_ns as f64 / 3.0) as u64;
            let na = next_stride(a, ea, target);
            if na != a {
                changes += 1;
            }
            a = na;
            b = next_stride(b, eb, target);
            if a == b {
                streak = 0;
            } else {
                disagree += 1;
                streak += 1;
                longest = longest.max(streak);
            }
        }
        assert!(
            changes >= 10,
            "the sweep crosses strides ({changes} changes)"
        );
        // A rate hovering at a band edge can keep them apart for a few epochs (each flips
        // on its own noise); while apart, the larger stride's rounds are still reported by
        // both (strides nest), so the analyzer only sees fewer complete rounds meanwhile.
        assert!(longest <= 12, "disagreement lasted {longest} epochs");
        assert!(
            disagree * 20 <= steps,
            "{disagree} of {steps} epochs disagree ({changes} stride changes)"
        );
    }
}
