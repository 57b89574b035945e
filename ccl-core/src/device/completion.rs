//! Completion of device operations without a host function on the stream.
//!
//! An operation's completion work (the probe's finish record, memory hand-back, the next
//! operation's probe start, the in-flight counts; `runtime/enqueue.rs`) used to run in a
//! `cudaLaunchHostFunc` enqueued after the kernel. On an H200 that hand-over cost 21-24 us
//! per operation on the stream (docs/gpu-results.md, run 2: a kernel alone 4.7 us, a kernel
//! and a host function 28.8 us, a kernel and an event record 5.3 us), three times NVIDIA's
//! whole small-message latency.
//!
//! Now the operation records a pooled event on its stream and queues its completion
//! behind it ([`Completions::push`]); a thread per communicator polls the queue's front
//! event and runs the completions in order as their events complete. Callers that need
//! the completions up to date (`ncclCommGetAsyncError`, the next enqueue) run what is due
//! on their own thread first ([`Completions::poll`]); one lock serializes the runs, so each
//! completion runs exactly once and in enqueue order.
//!
//! What the host function also gave, the next kernel waiting until its probe start ran
//! (that start clears the frame block the kernel writes), is now the kernel's start gate
//! (`ccl_dev_plan_t.start_gate`): the start stores the gate word after it prepared the
//! block, and the kernel waits for it. The GPU no longer stops between two kernels; a
//! kernel whose start is late waits on a word of mapped memory instead.
//!
//! The thread spins (yielding the CPU) while completions are queued and sleeps on a
//! condition variable when none are; after a millisecond without a completion it polls
//! every 50 us (a long kernel, a hang), so that a waiting kernel costs no CPU core.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::api::{DeviceApi, Event, Stream};
use crate::error::{CclError, Result};

/// An operation's completion work: runs once, on a host thread, with `Some(detail)` when
/// the device reported an error for the operation's event (a kernel fault) instead of its
/// completion. It must not call the device (it may run on a thread that holds no device).
pub(crate) type DoneFn = Box<dyn FnOnce(Option<String>) + Send + 'static>;

/// How long the thread spins after the last completion before it polls every
/// [`SLOW_POLL`].
const SPIN_FOR: Duration = Duration::from_millis(1);
/// The polling period after [`SPIN_FOR`] without a completion.
const SLOW_POLL: Duration = Duration::from_micros(50);

struct Queue {
    pending: VecDeque<(Event, DoneFn)>,
    /// Events of completed operations, for reuse (creating one per operation costs a
    /// driver call).
    spare: Vec<Event>,
    stop: bool,
}

struct Shared {
    api: Arc<dyn DeviceApi>,
    device: i32,
    q: Mutex<Queue>,
    cv: Condvar,
    /// Held while completions are taken off the queue and run (one runner at a time).
    run: Mutex<()>,
    /// The device call of a completion failed (a faulted device): later events are not
    /// queried any more, their completions run with the same detail.
    faulted: Mutex<Option<String>>,
    thread_set_device: AtomicBool,
}

/// The completion queue of one communicator and its polling thread.
pub(crate) struct Completions {
    sh: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Completions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Completions({} pending)", self.sh.q.lock().pending.len())
    }
}

impl Completions {
    /// The queue of a communicator on `device`, with its thread (`name` names it).
    pub(crate) fn start(api: Arc<dyn DeviceApi>, device: i32, name: String) -> Result<Self> {
        let sh = Arc::new(Shared {
            api,
            device,
            q: Mutex::new(Queue {
                pending: VecDeque::new(),
                spare: Vec::new(),
                stop: false,
            }),
            cv: Condvar::new(),
            run: Mutex::new(()),
            faulted: Mutex::new(None),
            thread_set_device: AtomicBool::new(false),
        });
        let me = Arc::clone(&sh);
        let h = std::thread::Builder::new()
            .name(name)
            .spawn(move || poll_loop(&me))
            .map_err(|e| CclError::sys("spawning the device completion thread", e))?;
        Ok(Completions {
            sh,
            thread: Mutex::new(Some(h)),
        })
    }

    /// Queues `done` behind the work enqueued so far on `s` (an event recorded on `s`).
    /// On an error nothing was queued and `done` was not run: the caller settles what it
    /// would have done.
    pub(crate) fn push(&self, s: Stream, done: DoneFn) -> Result<()> {
        let sh = &self.sh;
        let spare = sh.q.lock().spare.pop();
        let ev = match spare {
            Some(e) => e,
            None => sh.api.event_create()?,
        };
        if let Err(e) = sh.api.event_record(ev, s) {
            sh.q.lock().spare.push(ev);
            return Err(e);
        }
        sh.q.lock().pending.push_back((ev, done));
        sh.cv.notify_one();
        Ok(())
    }

    /// Runs, on the calling thread, the completions whose events completed (in order).
    /// Returns how many ran (0 also when another thread is running them now).
    pub(crate) fn poll(&self) -> usize {
        run_due(&self.sh, false)
    }

    /// Completions queued and not run yet.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.sh.q.lock().pending.len()
    }

    /// Stops the thread, runs what is due, runs the completions still queued with an
    /// error detail (a destroy that gave up waiting: none is lost) and destroys the
    /// events. Idempotent.
    pub(crate) fn stop(&self) {
        self.sh.q.lock().stop = true;
        self.sh.cv.notify_all();
        if let Some(h) = self.thread.lock().take() {
            if h.join().is_err() {
                tracing::error!(target: "nccl::INIT", "the device completion thread panicked");
            }
        }
        // Whatever is still queued (a destroy that gave up waiting) runs now, so that no
        // completion is lost; its events are then destroyed.
        run_due(&self.sh, true);
        let (left, spare) = {
            let mut q = self.sh.q.lock();
            (std::mem::take(&mut q.pending), std::mem::take(&mut q.spare))
        };
        for (ev, done) in left {
            done(Some(
                "the communicator was destroyed before the operation completed".into(),
            ));
            let _ = self.sh.api.event_destroy(ev);
        }
        for ev in spare {
            let _ = self.sh.api.event_destroy(ev);
        }
    }
}

impl Drop for Completions {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the due completions in order; with `blocking` waits for another runner, else
/// returns 0 when one is running.
fn run_due(sh: &Shared, blocking: bool) -> usize {
    let _run = if blocking {
        sh.run.lock()
    } else {
        match sh.run.try_lock() {
            Some(g) => g,
            None => return 0,
        }
    };
    let mut ran = 0;
    loop {
        let Some(ev) = sh.q.lock().pending.front().map(|(e, _)| *e) else {
            break;
        };
        let fault = sh.faulted.lock().clone();
        let outcome = match fault {
            Some(f) => Some(f),
            None => match sh.api.event_query(ev) {
                Ok(true) => None,
                Ok(false) => break,
                Err(e) => {
                    let d = e.to_string();
                    *sh.faulted.lock() = Some(d.clone());
                    Some(d)
                }
            },
        };
        let Some((ev, done)) = sh.q.lock().pending.pop_front() else {
            break;
        };
        done(outcome.clone());
        ran += 1;
        if outcome.is_none() {
            sh.q.lock().spare.push(ev);
        } else {
            let _ = sh.api.event_destroy(ev);
        }
    }
    ran
}

fn poll_loop(sh: &Shared) {
    let mut last = Instant::now();
    loop {
        {
            let mut q = sh.q.lock();
            while q.pending.is_empty() && !q.stop {
                sh.cv.wait(&mut q);
                last = Instant::now();
            }
            if q.stop {
                return;
            }
        }
        // Event queries need no current device on CUDA, but a thread that never had one
        // would make the runtime create device 0's context: set the communicator's once.
        if !sh.thread_set_device.swap(true, Ordering::AcqRel) {
            let _ = sh.api.set_device(sh.device);
        }
        if run_due(sh, false) > 0 {
            last = Instant::now();
        } else if last.elapsed() < SPIN_FOR {
            std::thread::yield_now();
        } else {
            std::thread::sleep(SLOW_POLL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::emu;
    use std::sync::atomic::AtomicUsize;

    /// Completions run once each, in enqueue order, after the work before them on the
    /// stream, whether the thread or a caller's `poll` runs them; `stop` runs what is left.
    #[test]
    fn completions_run_once_in_order_after_the_stream_work() {
        std::env::set_var("CCLD_DEVICE_EMULATION", "1");
        let d: Arc<dyn DeviceApi> = emu::global();
        let c = Completions::start(Arc::clone(&d), 0, "test-completions".into()).unwrap();
        let s = d.stream_create().unwrap();
        let gate = Arc::new(AtomicBool::new(false));
        let g = Arc::clone(&gate);
        // Work that holds the stream until the gate opens.
        d.launch_host_fn(
            s,
            Box::new(move || {
                while !g.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }),
        )
        .unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let runs = Arc::new(AtomicUsize::new(0));
        for i in 0..50 {
            let (o, r) = (Arc::clone(&order), Arc::clone(&runs));
            c.push(
                s,
                Box::new(move |fault| {
                    assert!(fault.is_none(), "{fault:?}");
                    o.lock().push(i);
                    r.fetch_add(1, Ordering::AcqRel);
                }),
            )
            .unwrap();
        }
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(c.poll(), 0, "nothing is due while the stream is held");
        assert_eq!(runs.load(Ordering::Acquire), 0);
        gate.store(true, Ordering::Release);
        let t0 = Instant::now();
        while runs.load(Ordering::Acquire) < 50 {
            c.poll();
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "completions did not run"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(*order.lock(), (0..50).collect::<Vec<_>>());
        assert_eq!(c.pending(), 0);
        // The events went back to the pool for reuse.
        assert_eq!(c.sh.q.lock().spare.len(), 50);
        c.stop();
        assert_eq!(runs.load(Ordering::Acquire), 50);
    }
}
