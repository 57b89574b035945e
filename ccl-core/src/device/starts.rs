//! Where an operation's start bookkeeping runs (issue 15, blocker 10).
//!
//! Before a kernel runs, the probe must see its operation start: the frame block is
//! claimed and zeroed, the expected counts are stored, the op log records the start
//! (`Frame::begin_op`, `OpLog::start`). That used to be a host function enqueued before
//! every kernel (`cudaLaunchHostFunc`): the GPU had to stop, hand over to a CUDA host
//! thread and wait for it before each kernel, a round trip on the critical path of every
//! operation (two host functions per operation in all).
//!
//! Now no host function precedes a kernel (unless a `CCLD_INJECT` fault must gate it). The
//! start of operation N runs
//! - on the calling thread at enqueue, when no operation of the communicator is in flight
//!   (nothing of the communicator runs on the device, so the frame and op log may move on;
//!   the start time is then the enqueue time: work the user queued before it on the
//!   stream counts as part of the operation);
//! - otherwise in the completion of operation N - 1 (`super::completion`: run on the
//!   communicator's completion thread once N - 1's event completed; the communicator's
//!   operations are serialized on the device, see [`super::order`]), right after N - 1's
//!   finish was recorded. Kernel N may already be running then: it waits at its start
//!   gate, which the start opens last (`ccl_dev_plan_t.start_gate`).
//!
//! No host function per operation remains (since 2026-11-27 the completion is found in
//! words the kernel stores). [`Starts`] is the hand-off: a count of operations in flight
//! and the queue of starts not run yet, behind one lock, so that a start is run exactly
//! once, by exactly one of the two places.

use parking_lot::Mutex;
use std::collections::VecDeque;

/// An operation's start bookkeeping (runs on a host thread, never calls the device).
pub type StartFn = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct Q {
    inflight: usize,
    queued: VecDeque<StartFn>,
}

/// The hand-off of start functions between the enqueueing thread and completions.
#[derive(Default)]
pub struct Starts {
    q: Mutex<Q>,
}

impl std::fmt::Debug for Starts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.q.lock();
        write!(
            f,
            "Starts(inflight {}, queued {})",
            g.inflight,
            g.queued.len()
        )
    }
}

impl Starts {
    /// An operation is about to be enqueued (its completion will call
    /// [`Self::complete`] exactly once). Returns its start when the caller must run it
    /// now (nothing in flight), `None` when a completion will run it.
    pub fn submit(&self, start: StartFn) -> Option<StartFn> {
        let mut g = self.q.lock();
        g.inflight += 1;
        if g.inflight == 1 {
            Some(start)
        } else {
            g.queued.push_back(start);
            None
        }
    }

    /// An operation completed: returns the start of the next one to run now, if one was
    /// enqueued meanwhile.
    pub fn complete(&self) -> Option<StartFn> {
        let mut g = self.q.lock();
        g.inflight = g.inflight.saturating_sub(1);
        g.queued.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use std::sync::Arc;

    use super::*;

    fn rec(log: &Arc<Mutex<Vec<usize>>>, i: usize) -> StartFn {
        let l = Arc::clone(log);
        Box::new(move || l.lock().push(i))
    }

    #[test]
    fn an_idle_communicator_starts_at_once_a_busy_one_at_the_previous_completion() {
        let s = Starts::default();
        let log = Arc::new(Mutex::new(Vec::new()));
        s.submit(rec(&log, 1)).expect("idle: run now")();
        assert!(s.submit(rec(&log, 2)).is_none());
        assert!(s.submit(rec(&log, 3)).is_none());
        assert_eq!(*log.lock(), [1]);
        s.complete().expect("op 2 starts when op 1 completes")();
        assert_eq!(*log.lock(), [1, 2]);
        s.complete().expect("op 3 starts when op 2 completes")();
        assert!(s.complete().is_none(), "op 3 completes: nothing queued");
        s.submit(rec(&log, 4)).expect("idle again")();
        assert!(s.complete().is_none());
        assert_eq!(*log.lock(), [1, 2, 3, 4]);
    }

    #[test]
    fn every_start_runs_exactly_once_under_concurrent_completions() {
        let s = Arc::new(Starts::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let completer = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for () in rx {
                    if let Some(f) = s.complete() {
                        f();
                    }
                }
            })
        };
        for i in 0..2000 {
            if let Some(f) = s.submit(rec(&log, i)) {
                f();
            }
            tx.send(()).unwrap();
        }
        drop(tx);
        completer.join().unwrap();
        let got = log.lock().clone();
        assert_eq!(got, (0..2000).collect::<Vec<_>>(), "in order, each once");
    }
}
