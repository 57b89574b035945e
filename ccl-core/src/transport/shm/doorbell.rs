//! Futex doorbells and the spin-yield-park back-off built on them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::bell;
use super::region::{ClaimKind, ShmRegion};
use crate::error::Result;
use crate::transport::wake::EventFd;

/// A `u32` futex word at `offset` in a region: any process/thread can ring it; its owner
/// sleeps on it.
///
/// Occupies [`Doorbell::BYTES`] bytes: the sequence word (the futex) and a count of sleepers,
/// so that `ring` makes a `FUTEX_WAKE` syscall only when someone may be asleep. Place each
/// doorbell on its own cache line (e.g. with `Carve`).
pub struct Doorbell {
    region: Arc<ShmRegion>,
    offset: usize,
    seq: *const AtomicU32,
    sleepers: *const AtomicU32,
    /// Signalled with every wake: the owner may sleep in `poll(2)` instead of on the futex
    /// (the socket transport's proxy, [`Doorbell::with_event`]).
    event: Option<Arc<EventFd>>,
}

// SAFETY: the pointers address two atomic words inside the mapping owned by `region` (kept
// alive by the Arc); atomics may be used from any thread, so sharing and sending is sound.
unsafe impl Send for Doorbell {}
// SAFETY: see Send; every access through the pointers is atomic.
unsafe impl Sync for Doorbell {}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell")
            .field("region", &self.region.name())
            .field("offset", &self.offset)
            .field("value", &self.value())
            .finish()
    }
}

impl Doorbell {
    /// Bytes a doorbell uses (sequence word + sleeper count).
    pub const BYTES: usize = 8;

    /// The doorbell at `offset` (8-byte aligned, in bounds). Many handles (in any process)
    /// may refer to the same doorbell.
    pub fn new(region: Arc<ShmRegion>, offset: usize) -> Result<Doorbell> {
        let p = region.claim_ptr(offset, Self::BYTES, 8, ClaimKind::Atomic { width: 4 })?;
        Ok(Doorbell {
            seq: p.cast::<AtomicU32>(),
            // SAFETY: p..p+8 is inside the mapping (claim_ptr), so p+4 is in bounds.
            sleepers: unsafe { p.add(4) }.cast::<AtomicU32>(),
            region,
            offset,
            event: None,
        })
    }

    /// A handle that also signals `event` whenever it wakes the owner: for an owner that
    /// sleeps in `poll(2)` on `event` after [`Doorbell::announce`] (in-process only).
    pub fn with_event(
        region: Arc<ShmRegion>,
        offset: usize,
        event: Arc<EventFd>,
    ) -> Result<Doorbell> {
        let mut d = Doorbell::new(region, offset)?;
        d.event = Some(event);
        Ok(d)
    }

    fn seq(&self) -> &AtomicU32 {
        // SAFETY: `seq` is 8-aligned, inside the mapping that `self.region` keeps alive, and
        // only accessed atomically (claimed as Atomic, so no FIFO slice overlaps it here).
        unsafe { &*self.seq }
    }

    fn sleepers(&self) -> &AtomicU32 {
        // SAFETY: as for `seq`, 4 bytes further (4-aligned).
        unsafe { &*self.sleepers }
    }

    /// Bumps the word and wakes sleepers; no syscall unless a sleeper announced itself.
    pub fn ring(&self) {
        bell::ring(self)
    }

    /// Wakes the owner only if it announced that it may sleep ([`Doorbell::announce`]):
    /// no write to the doorbell's line otherwise, so a producer that commits while its
    /// consumer is still spinning moves no extra cache line. The caller must have published
    /// the state the owner waits for before calling (see `bell::ring_if_waiting`).
    pub fn ring_if_waiting(&self) {
        bell::ring_if_waiting(self)
    }

    /// Announces that the owner may sleep, returning the value to pass to
    /// [`Doorbell::wait_announced`]. Between the two calls the owner must re-check the state
    /// it waits for (producers using [`Doorbell::ring_if_waiting`] ring only after an
    /// announcement); it must call [`Doorbell::unannounce`] exactly once afterwards.
    pub fn announce(&self) -> u32 {
        bell::announce(self)
    }

    /// Sleeps while the value is `seen` (from [`Doorbell::announce`]), at most `timeout`.
    pub fn wait_announced(&self, seen: u32, timeout: Duration) {
        bell::wait_announced(self, seen, timeout)
    }

    /// Withdraws an announcement.
    pub fn unannounce(&self) {
        bell::unannounce(self)
    }

    /// The current sequence value (Acquire: whatever the ringer wrote before ringing is
    /// visible once a changed value is seen).
    pub fn value(&self) -> u32 {
        bell::value(self)
    }

    /// Sleeps while `value() == seen`, at most `timeout` (shared futex, usable across
    /// processes). May return early (spurious wake, signal); callers re-check their state.
    pub fn wait(&self, seen: u32, timeout: Duration) {
        bell::wait(self, seen, timeout)
    }
}

impl bell::BellWords for Doorbell {
    type W = AtomicU32;

    #[inline]
    fn seq(&self) -> &AtomicU32 {
        Doorbell::seq(self)
    }

    #[inline]
    fn sleepers(&self) -> &AtomicU32 {
        Doorbell::sleepers(self)
    }

    #[inline]
    fn fence(order: Ordering) {
        std::sync::atomic::fence(order)
    }

    fn futex_wait(&self, seen: u32, timeout: Duration) {
        futex_wait(Doorbell::seq(self), seen, timeout)
    }

    fn futex_wake(&self) {
        futex_wake(Doorbell::seq(self));
        if let Some(e) = &self.event {
            e.signal();
        }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        self.region
            .release_claim(self.offset, Self::BYTES, ClaimKind::Atomic { width: 4 });
    }
}

#[cfg(target_os = "linux")]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        // subsec_nanos < 1e9 fits every c_long.
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 that stays mapped for the call; the timespec
    // lives on our stack for the duration of the syscall. FUTEX_WAIT (without
    // FUTEX_PRIVATE_FLAG) keys on the physical page, so it works across processes. Errors
    // (EAGAIN: value changed, ETIMEDOUT, EINTR) all mean "return and re-check".
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(target_os = "linux")]
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32 that stays mapped for the call; FUTEX_WAKE only
    // reads the address to find the wait queue.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Without futexes: nap briefly (bounded by `timeout`) and let the caller re-check.
#[cfg(not(target_os = "linux"))]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while word.load(Ordering::Acquire) == expected && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(50).min(timeout));
    }
}

#[cfg(not(target_os = "linux"))]
fn futex_wake(_word: &AtomicU32) {}

/// Spin briefly, then yield, then park on a doorbell in short timed sleeps, so that many
/// ranks sharing few cores (8 on 2) still make progress. Call [`Backoff::reset`] whenever the
/// caller made progress.
#[derive(Clone, Debug)]
pub struct Backoff {
    step: u32,
    /// Spin phase of [`Backoff::pause`] by time: spin this long before yielding.
    spin: std::time::Duration,
    /// End of the current timed spin phase (set by the first clock read after a reset).
    spin_until: Option<std::time::Instant>,
    /// Pauses of the current timed spin phase (the clock is read every
    /// [`Backoff::CLOCK_EVERY`]).
    polls: u32,
    /// Yield phase by time (see [`Backoff::with_yield`]): yield this long before parking.
    yield_for: std::time::Duration,
    /// End of the current timed yield phase (set by its first pause).
    yield_until: Option<std::time::Instant>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    /// Steps spent spinning (`2^step` spin hints each, 127 in total).
    pub const SPIN_STEPS: u32 = 7;
    /// Steps spent in `yield_now` after spinning.
    pub const YIELD_STEPS: u32 = 8;
    /// First park duration; doubles per step up to [`Backoff::MAX_PARK`].
    pub const MIN_PARK: Duration = Duration::from_micros(100);
    /// Longest single park: bounds the reaction time to a state change nobody rang for.
    pub const MAX_PARK: Duration = Duration::from_millis(5);
    /// Spin hints per pause of the timed spin phase. A spin hint (`pause`) takes about
    /// 25 ns on the AMD EPYC development machine (140 cycles on Skylake-X), so this is the
    /// granularity at which a spinning waiter sees a message: 32 hints made it 0.8 us, more
    /// than the rest of an 8-byte AllReduce.
    pub const SPIN_HINTS: u32 = 2;
    /// The timed spin phase reads the clock once per this many pauses (a clock read costs
    /// about as much as a poll: 20-40 ns).
    pub const CLOCK_EVERY: u32 = 16;

    /// A fresh back-off (starts spinning).
    pub fn new() -> Self {
        Backoff {
            step: 0,
            spin: Duration::ZERO,
            spin_until: None,
            polls: 0,
            yield_for: Duration::ZERO,
            yield_until: None,
        }
    }

    /// A back-off whose [`Backoff::pause`] spins for `spin` (wall-clock time) before the
    /// yield phase, instead of [`Backoff::SPIN_STEPS`] short steps: for a waiter with a
    /// core of its own, where the awaited peer is running and answers within
    /// microseconds, and giving the core away costs a scheduler round trip.
    pub fn with_spin(spin: Duration) -> Self {
        Backoff {
            spin,
            ..Self::new()
        }
    }

    /// A back-off that does not spin but yields the core for `yield_for` (wall-clock time)
    /// before it parks: for a waiter whose peers need its core (more ranks than cores, or a
    /// peer on its CPU). Each pause offers the core to a runnable peer and polls again as
    /// soon as the scheduler comes back, with no futex wake-up (an inter-processor
    /// interrupt, costly in a VM) on either side, as MPI libraries poll when
    /// oversubscribed. `Duration::ZERO`: [`Backoff::new`] (a few spins and yields).
    pub fn with_yield(yield_for: Duration) -> Self {
        let mut b = Backoff {
            yield_for,
            ..Self::new()
        };
        b.reset();
        b
    }

    /// Back to the first phase (spinning, or the timed yield phase); call after progress.
    pub fn reset(&mut self) {
        self.step = if self.yield_for.is_zero() {
            0
        } else {
            Self::SPIN_STEPS
        };
        self.spin_until = None;
        self.yield_until = None;
        self.polls = 0;
    }

    /// Whether the caller is in the timed spin phase (see [`Backoff::with_spin`]): a waiter
    /// may then skip its own clock reads between polls, which come every few tens of ns.
    pub fn is_timed_spin(&self) -> bool {
        !self.spin.is_zero() && self.step == 0
    }

    /// Whether the next `snooze` will sleep on the doorbell.
    pub fn is_parking(&self) -> bool {
        self.step >= Self::SPIN_STEPS + Self::YIELD_STEPS
    }

    /// How long the next park lasts (pure; exposed for tests).
    pub fn park_duration(&self) -> Duration {
        let k = self
            .step
            .saturating_sub(Self::SPIN_STEPS + Self::YIELD_STEPS)
            .min(16);
        Self::MIN_PARK.saturating_mul(1 << k).min(Self::MAX_PARK)
    }

    /// The spin or yield phase of [`Backoff::snooze`] for callers that park themselves
    /// (announce, re-check, [`Doorbell::wait_announced`]) once [`Backoff::is_parking`]:
    /// spins or yields as `snooze` would, then counts the step (also when parking).
    pub fn pause(&mut self) {
        if !self.spin.is_zero() && self.step == 0 {
            // Timed spin phase: stay at step 0 until the budget is spent.
            for _ in 0..Self::SPIN_HINTS {
                std::hint::spin_loop();
            }
            // The budget starts at the first clock read, after CLOCK_EVERY pauses: a wait
            // that ends sooner (most, on a quiet machine) reads no clock at all.
            self.polls = self.polls.wrapping_add(1);
            if !self.polls.is_multiple_of(Self::CLOCK_EVERY) {
                return;
            }
            let now = std::time::Instant::now();
            let until = *self.spin_until.get_or_insert(now + self.spin);
            if now >= until {
                self.step = Self::SPIN_STEPS;
            }
            return;
        }
        if !self.yield_for.is_zero() && self.step == Self::SPIN_STEPS {
            // Timed yield phase: stay here until the budget is spent, then park.
            std::thread::yield_now();
            let now = std::time::Instant::now();
            let until = *self.yield_until.get_or_insert(now + self.yield_for);
            if now >= until {
                self.step = Self::SPIN_STEPS + Self::YIELD_STEPS;
            }
            return;
        }
        if self.step < Self::SPIN_STEPS {
            for _ in 0..(1u32 << self.step) {
                std::hint::spin_loop();
            }
        } else if self.step < Self::SPIN_STEPS + Self::YIELD_STEPS {
            std::thread::yield_now();
        }
        self.step = self.step.saturating_add(1);
    }

    /// Waits a little: spins, then yields, then sleeps on `bell` while its value is `seen`
    /// (read `seen` BEFORE polling, so a ring between the poll and this call is not lost).
    pub fn snooze(&mut self, bell: &Doorbell, seen: u32) {
        if bell.value() != seen {
            // Rung since the caller polled: go poll again without sleeping. Past the spin
            // phase, still offer the core to others, so that a caller passing a stale `seen`
            // (or a bell rung for other FIFOs) does not monopolise an oversubscribed core.
            if self.step >= Self::SPIN_STEPS {
                std::thread::yield_now();
            }
            return;
        }
        if self.is_parking() {
            bell.wait(seen, self.park_duration());
            self.step = self.step.saturating_add(1);
        } else {
            self.pause();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bell() -> Doorbell {
        Doorbell::new(Arc::new(ShmRegion::anonymous(64).unwrap()), 0).unwrap()
    }

    #[test]
    fn ring_if_waiting_wakes_only_announced_owners() {
        let b = bell();
        let v0 = b.value();
        b.ring_if_waiting();
        assert_eq!(b.value(), v0, "nobody announced: no write");
        let seen = b.announce();
        assert_eq!(seen, v0);
        b.ring_if_waiting();
        assert_ne!(b.value(), seen, "announced owner is rung");
        // The value moved, so the owner does not sleep (a 10 s timeout would hang here).
        let t = std::time::Instant::now();
        b.wait_announced(seen, Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
        b.unannounce();
        let v1 = b.value();
        b.ring_if_waiting();
        assert_eq!(b.value(), v1, "announcement withdrawn");
    }

    #[test]
    fn an_announced_owner_asleep_is_woken_by_a_producer() {
        let b = Arc::new(bell());
        let b2 = Arc::clone(&b);
        let seen = b.announce();
        let producer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            b2.ring_if_waiting();
        });
        let t = std::time::Instant::now();
        b.wait_announced(seen, Duration::from_secs(20));
        b.unannounce();
        producer.join().unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "woken, not timed out"
        );
        assert_ne!(b.value(), seen);
    }

    #[test]
    fn timed_spin_ends_in_the_yield_phase() {
        let mut b = Backoff::with_spin(Duration::from_micros(200));
        let t = std::time::Instant::now();
        while b.step == 0 {
            b.pause();
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "spin phase never ends"
            );
        }
        assert!(t.elapsed() >= Duration::from_micros(200));
        assert!(!b.is_parking());
        b.reset();
        assert_eq!(b.step, 0);
    }

    #[test]
    fn a_timed_yield_phase_never_spins_and_parks_after_its_budget() {
        let mut b = Backoff::with_yield(Duration::from_millis(2));
        assert!(!b.is_timed_spin(), "a yielding waiter does not spin");
        let t = std::time::Instant::now();
        let mut pauses = 0;
        while !b.is_parking() {
            b.pause();
            pauses += 1;
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "yield phase never ends"
            );
        }
        assert!(t.elapsed() >= Duration::from_millis(2), "parked early");
        assert!(pauses > 1, "one yield spent the whole budget?");
        assert_eq!(b.park_duration(), Backoff::MIN_PARK, "parks start short");
        // After progress it yields again (no spin phase), with a fresh budget.
        b.reset();
        assert_eq!(b.step, Backoff::SPIN_STEPS);
        assert!(!b.is_parking());
        b.pause();
        assert!(!b.is_parking());
        // No budget: the default back-off.
        let z = Backoff::with_yield(Duration::ZERO);
        assert_eq!((z.step, z.is_parking()), (0, false));
    }
}
