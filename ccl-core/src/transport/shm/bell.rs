//! The doorbell's protocol, apart from where its two words live and how a thread sleeps.
//!
//! A doorbell is a sequence word (the futex) and a count of sleepers. The one property that
//! matters is **no lost wake-up**: an owner that goes to sleep waiting for some state is
//! woken by whoever publishes that state. Two pairs of calls give it:
//! - `ring` / `wait`: the ringer bumps the word, then wakes if it sees a sleeper; the owner
//!   counts itself a sleeper, then sleeps only while the word is still the value it saw;
//! - `ring_if_waiting` / `announce` + `wait_announced`: the ringer (after publishing)
//!   bumps and wakes only if a sleeper announced itself; the owner announces, re-checks its
//!   state, and sleeps only while the word is unchanged. Either the ringer sees the
//!   announcement or the owner's re-check sees the published state (SeqCst on both sides).
//!
//! [`Doorbell`](super::Doorbell) runs these functions on a mapping's words with real
//! futexes; `loom_tests` runs them on loom's atomics with a modelled futex.
//!
//! Each side's "publish, then look at the other side" is separated by a SeqCst fence. With
//! SeqCst accesses alone the argument holds in C++'s model for `ring`/`wait`, but not for an
//! owner whose re-check is an Acquire load; and loom, which weakens SeqCst accesses to
//! AcqRel but models SeqCst fences, found both without the fences. The fences sit on the
//! owner's way to sleep and on `ring` (abort and poison paths); the hot `ring_if_waiting`
//! had its fence already.

use std::sync::atomic::Ordering;
use std::time::Duration;

/// An atomic `u32` of the protocol.
pub(crate) trait Word32 {
    fn load(&self, order: Ordering) -> u32;
    fn fetch_add(&self, v: u32, order: Ordering) -> u32;
    fn fetch_sub(&self, v: u32, order: Ordering) -> u32;
}

impl Word32 for std::sync::atomic::AtomicU32 {
    #[inline]
    fn load(&self, order: Ordering) -> u32 {
        std::sync::atomic::AtomicU32::load(self, order)
    }
    #[inline]
    fn fetch_add(&self, v: u32, order: Ordering) -> u32 {
        std::sync::atomic::AtomicU32::fetch_add(self, v, order)
    }
    #[inline]
    fn fetch_sub(&self, v: u32, order: Ordering) -> u32 {
        std::sync::atomic::AtomicU32::fetch_sub(self, v, order)
    }
}

/// A doorbell's words and its way to sleep on the sequence word.
pub(crate) trait BellWords {
    type W: Word32;
    fn seq(&self) -> &Self::W;
    fn sleepers(&self) -> &Self::W;
    fn fence(order: Ordering);
    /// Sleeps while the sequence word equals `seen` (compared atomically with going to
    /// sleep, as FUTEX_WAIT does), at most `timeout`.
    fn futex_wait(&self, seen: u32, timeout: Duration);
    /// Wakes every sleeper of the sequence word.
    fn futex_wake(&self);
}

/// Bumps the word and wakes sleepers; no wake unless a sleeper counted itself.
pub(crate) fn ring<B: BellWords>(b: &B) {
    // SeqCst on both sides (bump here then read the sleeper count; count in `wait` then
    // compare the word in the kernel) means either we see the sleeper or the sleeper's
    // FUTEX_WAIT sees the new value and does not sleep.
    b.seq().fetch_add(1, Ordering::SeqCst);
    B::fence(Ordering::SeqCst);
    if b.sleepers().load(Ordering::SeqCst) != 0 {
        b.futex_wake();
    }
}

/// Bumps and wakes only if an owner announced that it may sleep. The caller published the
/// state the owner waits for before calling; the SeqCst fence orders that publication before
/// the read of the sleeper count.
pub(crate) fn ring_if_waiting<B: BellWords>(b: &B) {
    B::fence(Ordering::SeqCst);
    if b.sleepers().load(Ordering::SeqCst) != 0 {
        b.seq().fetch_add(1, Ordering::SeqCst);
        b.futex_wake();
    }
}

/// Announces that the owner may sleep; returns the value for [`wait_announced`].
pub(crate) fn announce<B: BellWords>(b: &B) -> u32 {
    b.sleepers().fetch_add(1, Ordering::SeqCst);
    // The owner's re-check of its state after this call may be a plain Acquire load, which
    // the SeqCst increment alone does not order (an Acquire load may pass a store-release
    // on ARMv8 with RCpc). With this fence and the ringer's, one side sees the other.
    B::fence(Ordering::SeqCst);
    b.seq().load(Ordering::SeqCst)
}

/// Sleeps while the word is `seen` (from [`announce`]), at most `timeout`.
pub(crate) fn wait_announced<B: BellWords>(b: &B, seen: u32, timeout: Duration) {
    if !timeout.is_zero() && b.seq().load(Ordering::SeqCst) == seen {
        b.futex_wait(seen, timeout);
    }
    // Pair with the ringer's release (fetch_add SeqCst) for the caller's later reads.
    B::fence(Ordering::Acquire);
}

/// Withdraws an announcement.
pub(crate) fn unannounce<B: BellWords>(b: &B) {
    b.sleepers().fetch_sub(1, Ordering::SeqCst);
}

/// The current sequence value (Acquire).
pub(crate) fn value<B: BellWords>(b: &B) -> u32 {
    b.seq().load(Ordering::Acquire)
}

/// Sleeps while the word is `seen`, at most `timeout`; counts itself a sleeper meanwhile.
pub(crate) fn wait<B: BellWords>(b: &B, seen: u32, timeout: Duration) {
    if timeout.is_zero() {
        return;
    }
    b.sleepers().fetch_add(1, Ordering::SeqCst);
    B::fence(Ordering::SeqCst);
    if b.seq().load(Ordering::SeqCst) == seen {
        b.futex_wait(seen, timeout);
    }
    b.sleepers().fetch_sub(1, Ordering::SeqCst);
    // Pair with the ringer's release (fetch_add SeqCst) for the caller's later reads.
    B::fence(Ordering::Acquire);
}

/// Loom models of the no-lost-wake-up property. The futex is modelled: `futex_wait`
/// compares the word (SeqCst, as the kernel does under its lock) and, when equal, stays
/// asleep (sleeper count still raised) until a `futex_wake` or until the producer has
/// finished without waking it: the latter is a lost wake-up, a thread asleep (until its
/// timeout) while the state it waits for is published.
#[cfg(test)]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::{AtomicBool, AtomicU32};
    use loom::sync::Arc;

    impl Word32 for AtomicU32 {
        fn load(&self, order: Ordering) -> u32 {
            AtomicU32::load(self, order)
        }
        fn fetch_add(&self, v: u32, order: Ordering) -> u32 {
            AtomicU32::fetch_add(self, v, order)
        }
        fn fetch_sub(&self, v: u32, order: Ordering) -> u32 {
            AtomicU32::fetch_sub(self, v, order)
        }
    }

    struct ModelBell {
        seq: AtomicU32,
        sleepers: AtomicU32,
        /// Someone called FUTEX_WAKE.
        woken: AtomicBool,
        /// The producer has published and rung, and is gone.
        producer_done: AtomicBool,
        /// The owner slept through the producer's whole life.
        lost: AtomicBool,
    }

    impl BellWords for ModelBell {
        type W = AtomicU32;
        fn seq(&self) -> &AtomicU32 {
            &self.seq
        }
        fn sleepers(&self) -> &AtomicU32 {
            &self.sleepers
        }
        fn fence(order: Ordering) {
            loom::sync::atomic::fence(order)
        }
        fn futex_wait(&self, seen: u32, _timeout: Duration) {
            if self.seq.load(Ordering::SeqCst) != seen {
                return;
            }
            loop {
                if self.woken.load(Ordering::SeqCst) {
                    return;
                }
                if self.producer_done.load(Ordering::SeqCst) {
                    // Acquired the producer's end: a wake it made is visible now.
                    if !self.woken.load(Ordering::SeqCst) {
                        self.lost.store(true, Ordering::SeqCst);
                    }
                    return;
                }
                loom::thread::yield_now();
            }
        }
        fn futex_wake(&self) {
            self.woken.store(true, Ordering::SeqCst);
        }
    }

    fn bell() -> Arc<ModelBell> {
        Arc::new(ModelBell {
            seq: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            woken: AtomicBool::new(false),
            producer_done: AtomicBool::new(false),
            lost: AtomicBool::new(false),
        })
    }

    const FOREVER: Duration = Duration::from_secs(3600);

    /// Runs `owner` against a producer that publishes `ready` then calls `ringer`: the owner
    /// is never left asleep, and it sees `ready` once it returns.
    fn no_lost_wake_up(ringer: fn(&ModelBell), owner: fn(&ModelBell, &AtomicBool)) {
        loom::model(move || {
            let b = bell();
            let ready = Arc::new(AtomicBool::new(false));
            let (bp, rp) = (Arc::clone(&b), Arc::clone(&ready));
            let producer = loom::thread::spawn(move || {
                rp.store(true, Ordering::Release);
                ringer(&bp);
                bp.producer_done.store(true, Ordering::SeqCst);
            });
            owner(&b, &ready);
            assert!(
                !b.lost.load(Ordering::SeqCst),
                "lost wake-up: the owner slept and nobody woke it"
            );
            producer.join().unwrap();
            assert_eq!(b.sleepers.load(Ordering::SeqCst), 0);
        });
    }

    #[test]
    fn ring_if_waiting_never_loses_an_announced_owner() {
        no_lost_wake_up(ring_if_waiting::<ModelBell>, |b, ready| {
            let seen = announce(b);
            if !ready.load(Ordering::Acquire) {
                wait_announced(b, seen, FOREVER);
            }
            unannounce(b);
        });
    }

    #[test]
    fn ring_never_loses_a_waiting_owner() {
        no_lost_wake_up(ring::<ModelBell>, |b, ready| {
            let seen = value(b);
            if !ready.load(Ordering::Acquire) {
                wait(b, seen, FOREVER);
            }
        });
    }
}
