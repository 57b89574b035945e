//! In-process barrier + reduction across the test's threads (nccl-tests' Barrier and
//! Allreduce without MPI), and the -T watchdog.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How values are combined across threads/ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// Thread 0's (rank 0's) value.
    Rank0,
    /// Mean.
    Avg,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum.
    Sum,
}

impl Reduce {
    /// From `-a` (0 rank0, 1 avg, 2 min, 3 max).
    pub fn from_average(a: i64) -> Reduce {
        match a {
            0 => Reduce::Rank0,
            2 => Reduce::Min,
            3 => Reduce::Max,
            _ => Reduce::Avg,
        }
    }

    /// Combines `vals` (index = contributor, 0 first).
    pub fn combine(self, vals: &[f64]) -> f64 {
        match self {
            Reduce::Rank0 => vals.first().copied().unwrap_or(0.0),
            Reduce::Avg => vals.iter().sum::<f64>() / vals.len().max(1) as f64,
            Reduce::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
            Reduce::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Reduce::Sum => vals.iter().sum(),
        }
    }
}

struct State {
    generation: u64,
    arrived: usize,
    vals: Vec<f64>,
    result: f64,
}

/// Barrier + all-reduce for a fixed number of threads; reusable.
pub struct ThreadSync {
    n: usize,
    state: Mutex<State>,
    cv: Condvar,
}

impl ThreadSync {
    /// For `n` threads.
    pub fn new(n: usize) -> ThreadSync {
        ThreadSync {
            n: n.max(1),
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                vals: vec![0.0; n.max(1)],
                result: 0.0,
            }),
            cv: Condvar::new(),
        }
    }

    /// Thread `t` contributes `v`; every thread gets the combined value.
    pub fn reduce(&self, t: usize, v: f64, how: Reduce) -> f64 {
        // A poisoned lock means another test thread panicked; the process is going down
        // anyway, so keep going with the inner state.
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let gen = st.generation;
        st.vals[t.min(self.n - 1)] = v;
        st.arrived += 1;
        if st.arrived == self.n {
            st.result = how.combine(&st.vals);
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return st.result;
        }
        while st.generation == gen {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.result
    }

    /// Barrier.
    pub fn barrier(&self, t: usize) {
        self.reduce(t, 0.0, Reduce::Sum);
    }
}

/// Per-thread busy marks for the -T watchdog, without a clock read on the hot path: each
/// slot counts its thread's entries into the library (odd while inside, even outside); only
/// the owning thread writes its slot. The watchdog ([`BusyWatch`]) times how long a slot
/// stays at the same odd value.
pub struct Busy {
    slots: Vec<AtomicU64>,
}

impl Busy {
    /// For `n` threads.
    pub fn new(n: usize) -> Busy {
        Busy {
            slots: (0..n.max(1)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Marks thread `t` busy until the guard drops (a nested guard keeps the outer mark).
    pub fn enter(&self, t: usize) -> BusyGuard<'_> {
        let slot = &self.slots[t.min(self.slots.len() - 1)];
        let prev = slot.load(Ordering::Relaxed);
        let outer = prev.is_multiple_of(2);
        if outer {
            slot.store(prev + 1, Ordering::Relaxed);
        }
        BusyGuard { slot, outer }
    }
}

/// The watchdog's view of [`Busy`]: when it first saw each slot's current busy period.
pub struct BusyWatch {
    seen: Vec<(u64, Instant)>,
}

impl BusyWatch {
    /// A watch with nothing seen yet.
    pub fn new() -> BusyWatch {
        BusyWatch { seen: Vec::new() }
    }

    /// The longest busy period still running, timed from the first sample that saw it (so
    /// up to one sampling interval short).
    pub fn longest(&mut self, busy: &Busy) -> Duration {
        let now = Instant::now();
        self.seen.resize(busy.slots.len(), (0, now));
        let mut longest = Duration::ZERO;
        for (slot, seen) in busy.slots.iter().zip(&mut self.seen) {
            let v = slot.load(Ordering::Relaxed);
            if v % 2 == 1 && seen.0 == v {
                longest = longest.max(now.saturating_duration_since(seen.1));
            } else {
                *seen = (v, now);
            }
        }
        longest
    }
}

impl Default for BusyWatch {
    fn default() -> Self {
        BusyWatch::new()
    }
}

/// Ends the busy mark on drop.
pub struct BusyGuard<'a> {
    slot: &'a AtomicU64,
    outer: bool,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        if self.outer {
            let v = self.slot.load(Ordering::Relaxed);
            self.slot.store(v + 1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn reduce_modes_across_threads() {
        let s = Arc::new(ThreadSync::new(4));
        for how in [
            Reduce::Rank0,
            Reduce::Avg,
            Reduce::Min,
            Reduce::Max,
            Reduce::Sum,
        ] {
            let hs: Vec<_> = (0..4)
                .map(|t| {
                    let s = s.clone();
                    std::thread::spawn(move || {
                        (0..50)
                            .map(|k| s.reduce(t, (t * 10 + k) as f64, how))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let res: Vec<Vec<f64>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            for k in 0..50 {
                let vals: Vec<f64> = (0..4).map(|t| (t * 10 + k) as f64).collect();
                for r in &res {
                    assert_eq!(r[k], how.combine(&vals), "{how:?} round {k}");
                }
            }
        }
        assert_eq!(Reduce::Avg.combine(&[1.0, 2.0, 6.0]), 3.0);
        assert_eq!(Reduce::from_average(0), Reduce::Rank0);
        assert_eq!(Reduce::from_average(3), Reduce::Max);
    }

    #[test]
    fn busy_tracking() {
        let b = Busy::new(2);
        let mut w = BusyWatch::new();
        assert_eq!(w.longest(&b), Duration::ZERO);
        {
            let _g = b.enter(1);
            let _inner = b.enter(1);
            assert_eq!(w.longest(&b), Duration::ZERO, "first seen now");
            std::thread::sleep(Duration::from_millis(30));
            assert!(w.longest(&b) >= Duration::from_millis(25));
        }
        assert_eq!(w.longest(&b), Duration::ZERO, "left the library");
        // Left and re-entered between two samples: a new period, not one long one.
        let g = b.enter(1);
        assert_eq!(w.longest(&b), Duration::ZERO);
        std::thread::sleep(Duration::from_millis(30));
        drop(g);
        let _g = b.enter(1);
        assert_eq!(w.longest(&b), Duration::ZERO, "a new period");
    }
}
