//! An asymmetric store-load barrier: a free side for the collective path, a costly side for
//! the diagnostic thread.
//!
//! The completion of an operation and the diagnostic thread's in-flight snapshot of it meet
//! in a Dekker handshake (`Source::op_done`, `Sampler::sample`): each side stores its own
//! word, then loads the other's, and at least one of them must see the other's store. On
//! x86 (and every other target) a load may pass an earlier store unless a full fence sits
//! between them, and that fence (`mfence`) cost the completion path several nanoseconds on
//! every operation, for a snapshot that happens at most once per in-flight period of a
//! long operation.
//!
//! So the costs are moved to the rare side, as Linux's `membarrier(2)` allows: the
//! collective path ([`light`]) keeps only a compiler barrier, and the diagnostic thread
//! ([`heavy`]) asks the kernel to run a full memory barrier on every CPU that runs a thread
//! of this process (`MEMBARRIER_CMD_PRIVATE_EXPEDITED`). Either a light side's store comes
//! before the heavy side's barrier (and its load after it sees it), or its load comes after
//! that barrier (and sees the heavy side's store): the man page's example of turning
//! compiler barriers into memory barriers.
//!
//! The expedited command needs a registration per process ([`enable`], done by the
//! diagnostic thread when it starts). Until it succeeds, or where the kernel lacks the
//! system call (or a seccomp filter refuses it), both sides run ordinary `SeqCst` fences:
//! the light side reads whether the heavy side is armed before it chooses, and the flag
//! only ever goes from off to on before any heavy barrier relies on it (and back to off,
//! for later operations, if a barrier call ever fails).

use std::sync::atomic::{compiler_fence, fence, AtomicBool, Ordering};

/// True once `membarrier` is registered for this process and the heavy side uses it.
static ARMED: AtomicBool = AtomicBool::new(false);

const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

fn membarrier(cmd: libc::c_int) -> bool {
    // SAFETY: membarrier takes two integer arguments and touches no memory of ours; an
    // unknown command or an unsupported kernel returns -1 (ENOSYS, EINVAL, EPERM).
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
}

/// Registers this process for expedited barriers; from then on [`light`] is a compiler
/// barrier only. Returns whether it is armed (false: both sides keep full fences).
pub(crate) fn enable() -> bool {
    if !ARMED.load(Ordering::Relaxed) && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) {
        ARMED.store(true, Ordering::SeqCst);
    }
    ARMED.load(Ordering::Relaxed)
}

/// The collective path's side, between its store and its load.
#[inline]
pub(crate) fn light() {
    if ARMED.load(Ordering::Relaxed) {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The diagnostic thread's side, between its store and its load.
pub(crate) fn heavy() {
    fence(Ordering::SeqCst);
    if ARMED.load(Ordering::Relaxed) && !membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
        // Cannot happen after a successful registration; should it, later operations go
        // back to full fences (this one handshake may then miss its pair).
        ARMED.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    /// Runs `rounds` of the store-buffering litmus test, side 0 calling `a` and side 1
    /// `b` between its store and its load, and returns the rounds in which both loads
    /// missed the other side's store. The two sides start each round together: a side
    /// begins round r once the other finished round r - 1.
    fn both_missed(rounds: u64, a: fn(), b: fn()) -> Vec<u64> {
        let words = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let done = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let side = |me: usize, barrier: fn()| {
            let (words, done) = (Arc::clone(&words), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut missed = Vec::new();
                for r in 1..=rounds {
                    let mut polls = 0u32;
                    while done[1 - me].load(Ordering::Acquire) < r - 1 {
                        polls += 1;
                        if polls.is_multiple_of(64) {
                            std::thread::yield_now();
                        }
                        std::hint::spin_loop();
                    }
                    words[me].store(r, Ordering::Relaxed);
                    barrier();
                    if words[1 - me].load(Ordering::Relaxed) < r {
                        missed.push(r);
                    }
                    done[me].store(r, Ordering::Release);
                }
                missed
            })
        };
        let (ta, tb) = (side(0, a), side(1, b));
        let (ma, mb) = (ta.join().unwrap(), tb.join().unwrap());
        ma.into_iter()
            .filter(|r| mb.binary_search(r).is_ok())
            .collect()
    }

    #[test]
    fn a_light_and_a_heavy_side_never_both_miss_the_other_store() {
        enable();
        let both = both_missed(20_000, light, heavy);
        assert!(
            both.is_empty(),
            "rounds where both sides missed the other: {both:?}"
        );
    }

    /// The test above can fail: with compiler barriers on both sides, this machine's
    /// store buffers let both loads miss (checked where it is seen; a CPU that never
    /// reorders a load before an earlier store would not show it).
    #[test]
    #[ignore = "shows the reordering the barrier prevents; hardware-dependent"]
    fn two_compiler_barriers_let_both_sides_miss() {
        let compiler = || compiler_fence(Ordering::SeqCst);
        assert!(!both_missed(200_000, compiler, compiler).is_empty());
    }
}
