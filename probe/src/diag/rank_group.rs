//! [`RankGroup`]: the communicators one rank of the job works in, and the time it spends in
//! their operations.
//!
//! A rank's computation gap before an operation on communicator A (the time from the end of
//! its previous operation on A to the start of this one) is the analyzer's evidence that the
//! rank itself was late: a computation-slow rank has a long gap, a rank that entered late
//! because its previous operation ended late has a normal one. A rank that also works in
//! communicator B (a tensor-parallel pair beside the data-parallel group) spends part of
//! that gap in B's operations, and when a slow peer holds it up in B, the gap grows although
//! the rank computed nothing more: it is that peer's victim (issue 17 point 3). So the probe
//! reports the gap less the time the rank's operations on its other communicators took
//! meanwhile.
//!
//! Each registered source adds the duration of every completed operation to its own counter
//! (one writer, a plain load and store on the collective path); the group sums its
//! members' counters, behind a lock, only where a gap is measured (a timed end, or the start
//! of an operation whose record will be reported). An operation whose end was estimated
//! (record thinning, [`crate::optype::EndTime::estimate`]) adds its estimated duration,
//! which is never longer than the real one: the correction errs towards the raw gap.
//!
//! Who belongs together: the communicators split from one another (`ncclCommSplit` passes
//! the parent's group to the child), and the communicators made by `ncclCommInitRank` in
//! which the process holds a single rank, per device ([`RankGroup::of_process_device`]):
//! one process per rank (per GPU), as MPI, Slurm and torchrun jobs run, where PyTorch makes
//! each process group with a call of its own. A communicator with several ranks in the
//! process (ranks as threads, `ncclCommInitAll`, the device emulation's ranks sharing a GPU)
//! starts a group of its own: tying such ranks by device made each one's gaps lose the
//! other ranks' operations (2 of the 7 emulated-device cases failed, a slow rank unnamed).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

/// The communicators of one rank (see the module docs).
#[derive(Debug, Default)]
pub struct RankGroup {
    /// Each member's cumulative time in its operations (ns). A destroyed communicator's
    /// counter stays until the next registration prunes it; it no longer changes, so it
    /// adds nothing to any difference.
    members: Mutex<Vec<Arc<BusyCounter>>>,
}

/// One member's cumulative time in its operations (ns), alone in its cache line: the
/// members' completing threads (one per communicator on the host backend) write their
/// counters at every operation, and counters side by side would move one line between
/// their cores each time.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(super) struct BusyCounter(pub(super) AtomicU64);

impl RankGroup {
    /// A new, empty group.
    pub fn new() -> Arc<RankGroup> {
        Arc::new(RankGroup::default())
    }

    /// The process's group of `device` (created on first use, alive while a member is):
    /// for communicators made by `ncclCommInitRank` in which this process holds a single
    /// rank, one process per rank as MPI, Slurm and PyTorch jobs run (see the module docs).
    pub fn of_process_device(device: i32) -> Arc<RankGroup> {
        static BY_DEVICE: OnceLock<Mutex<HashMap<i32, Weak<RankGroup>>>> = OnceLock::new();
        let mut map = BY_DEVICE.get_or_init(|| Mutex::new(HashMap::new())).lock();
        if let Some(g) = map.get(&device).and_then(Weak::upgrade) {
            return g;
        }
        map.retain(|_, g| g.strong_count() > 0);
        let g = RankGroup::new();
        map.insert(device, Arc::downgrade(&g));
        g
    }

    /// A new member's counter.
    pub(super) fn join(&self) -> Arc<BusyCounter> {
        let c = Arc::new(BusyCounter::default());
        let mut m = self.members.lock();
        m.retain(|x| Arc::strong_count(x) > 1);
        m.push(Arc::clone(&c));
        c
    }

    /// Time the members have spent in operations so far (ns): only differences of two
    /// readings mean anything.
    pub(super) fn busy_ns(&self) -> u64 {
        self.members
            .lock()
            .iter()
            .fold(0u64, |s, c| s.wrapping_add(c.0.load(Ordering::Relaxed)))
    }

    /// Members registered and not pruned yet (tests).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.members.lock().len()
    }
}
