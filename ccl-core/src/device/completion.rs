//! Completion of device operations without a host function on the stream, and without a
//! CUDA call on the host's side of it.
//!
//! An operation's completion work (the probe's finish record, memory hand-back, the next
//! operation's probe start, the in-flight counts; `runtime/enqueue.rs`) used to run in a
//! `cudaLaunchHostFunc` enqueued after the kernel. On an H200 that hand-over cost 21-24 us
//! per operation on the stream (docs/gpu-results.md, run 2: a kernel alone 4.2-4.7 us, a
//! kernel and a host function 28.8-29.6 us), three times NVIDIA's whole small-message
//! latency.
//!
//! Now every block of the operation's kernel stores the operation's value into its
//! completion word when it ends (`ccl_dev_plan_t.done`, mapped host memory); an operation
//! that runs as copies launches an empty plan after them that does the same. The
//! communicator's completion thread watches the front operation's words with plain loads
//! and runs the completions in order ([`Completions::push`] queues one). Callers that need
//! the completions up to date (`ncclCommGetAsyncError`, the next enqueue) run what is due
//! on their own thread first ([`Completions::poll`]); one lock serializes the runs, so each
//! completion runs exactly once and in enqueue order.
//!
//! What the host function also gave, the next kernel waiting until its probe start ran
//! (that start clears the frame block the kernel writes), is the kernel's start gate
//! (`ccl_dev_plan_t.start_gate`): the start stores the gate word after it prepared the
//! block, and the kernel waits for it. A GPU that waits for a host thread must never wait
//! for one that waits for the driver: a first version polled CUDA events here, and on the
//! H200 a `cudaFreeHost` in another thread (which waits for the device to go idle) held the
//! driver lock the event query needed while the kernel waited at its gate, for good. Hence
//! words, not events: nothing between a kernel's end and the next kernel's gate calls CUDA.
//!
//! After a kernel fault no word is ever stored: once the communicator has failed (the
//! liveness watch saw the fault) and the front operation stays incomplete for
//! [`FAILED_GRACE`], its completion runs with the failure's text, and so on for the rest.
//!
//! The thread spins (yielding the CPU) while completions are queued and sleeps on a
//! condition variable when none are; after a millisecond without a completion it polls
//! every 50 us (a long kernel, a hang), so that a waiting kernel costs no CPU core.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{CclError, Result};

/// An operation's completion work: runs once, on a host thread, with `Some(detail)` when
/// it runs because the communicator failed instead of the operation completing (a kernel
/// fault). It must not call the device.
pub(crate) type DoneFn = Box<dyn FnOnce(Option<String>) + Send + 'static>;

/// The communicator's failure, if it failed (the liveness watch's error, as text).
pub(crate) type FailedFn = Box<dyn Fn() -> Option<String> + Send + Sync + 'static>;

/// How long the thread spins after the last completion before it polls every
/// [`SLOW_POLL`].
const SPIN_FOR: Duration = Duration::from_millis(1);
/// The polling period after [`SPIN_FOR`] without a completion.
const SLOW_POLL: Duration = Duration::from_micros(50);
/// How long the front operation may stay incomplete once the communicator failed before
/// its completion runs with the failure (aborted kernels end within microseconds and store
/// their words; faulted ones never do).
pub(crate) const FAILED_GRACE: Duration = Duration::from_millis(200);

/// Where an operation's completion shows: `n` consecutive 32-bit words from host address
/// `words` (mapped memory the kernel's blocks store into) all at or past `value` (32-bit,
/// wrapping). `n == 0`: complete at once (an operation whose launch failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Signal {
    pub words: usize,
    pub n: u32,
    pub value: u32,
}

impl Signal {
    /// Every word has reached the value.
    fn reached(&self) -> bool {
        (0..self.n as usize).all(|i| {
            // SAFETY: the queue's contract (`Completions::push`): `n` aligned words of
            // mapped memory that live until the completion ran.
            let w = unsafe { AtomicU32::from_ptr((self.words as *mut u32).add(i)) }
                .load(Ordering::Acquire);
            reached(w, self.value)
        })
    }
}

/// `word` is at or past `value` (32-bit values that wrap: within 2^31 of each other).
pub(crate) fn reached(word: u32, value: u32) -> bool {
    word.wrapping_sub(value) as i32 >= 0
}

struct Queue {
    pending: VecDeque<(Signal, DoneFn)>,
    stop: bool,
}

struct Shared {
    q: Mutex<Queue>,
    cv: Condvar,
    /// Held while completions are taken off the queue and run (one runner at a time).
    run: Mutex<()>,
    failed: FailedFn,
}

/// The completion queue of one communicator and its thread.
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
    /// The queue of a communicator, with its thread (`name` names it); `failed` says
    /// whether the communicator failed.
    pub(crate) fn start(name: String, failed: FailedFn) -> Result<Self> {
        let sh = Arc::new(Shared {
            q: Mutex::new(Queue {
                pending: VecDeque::new(),
                stop: false,
            }),
            cv: Condvar::new(),
            run: Mutex::new(()),
            failed,
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

    /// Queues `done`, to run once `sig` is reached and every completion queued before it
    /// ran. The words of `sig` must stay valid until then.
    pub(crate) fn push(&self, sig: Signal, done: DoneFn) {
        self.sh.q.lock().pending.push_back((sig, done));
        self.sh.cv.notify_one();
    }

    /// Runs, on the calling thread, the completions that are due (in order). Returns how
    /// many ran (0 also when another thread is running them now).
    pub(crate) fn poll(&self) -> usize {
        run_due(&self.sh, None)
    }

    /// Completions queued and not run yet.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.sh.q.lock().pending.len()
    }

    /// Stops the thread, runs what is due, then the completions still queued with an
    /// error detail (a destroy that gave up waiting: none is lost). Idempotent.
    pub(crate) fn stop(&self) {
        self.sh.q.lock().stop = true;
        self.sh.cv.notify_all();
        if let Some(h) = self.thread.lock().take() {
            if h.join().is_err() {
                tracing::error!(target: "nccl::INIT", "the device completion thread panicked");
            }
        }
        let _run = self.sh.run.lock();
        let left = std::mem::take(&mut self.sh.q.lock().pending);
        for (sig, done) in left {
            done((!sig.reached()).then(|| {
                "the communicator was destroyed before the operation completed".to_string()
            }));
        }
    }
}

impl Drop for Completions {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the due completions in order; returns 0 when another runner is at it. With
/// `failed_for` (the thread: since when the communicator is known to have failed), the
/// front completion also runs when it stayed incomplete past [`FAILED_GRACE`].
fn run_due(sh: &Shared, failed_for: Option<(Instant, &str)>) -> usize {
    let Some(_run) = sh.run.try_lock() else {
        return 0;
    };
    let mut ran = 0;
    loop {
        let Some(sig) = sh.q.lock().pending.front().map(|(s, _)| *s) else {
            break;
        };
        let outcome = if sig.reached() {
            None
        } else {
            match failed_for {
                Some((since, why)) if since.elapsed() >= FAILED_GRACE => Some(why.to_string()),
                _ => break,
            }
        };
        let Some((_, done)) = sh.q.lock().pending.pop_front() else {
            break;
        };
        done(outcome);
        ran += 1;
    }
    ran
}

fn poll_loop(sh: &Shared) {
    let mut last = Instant::now();
    let mut failed_since: Option<(Instant, String)> = None;
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
        if failed_since.is_none() {
            failed_since = (sh.failed)().map(|why| (Instant::now(), why));
        }
        let failed = failed_since.as_ref().map(|(t, w)| (*t, w.as_str()));
        if run_due(sh, failed) > 0 {
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
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    fn words(n: usize) -> Arc<Vec<AtomicU32>> {
        Arc::new((0..n).map(|_| AtomicU32::new(0)).collect())
    }

    fn sig(w: &Arc<Vec<AtomicU32>>, n: u32, value: u32) -> Signal {
        Signal {
            words: w.as_ptr() as usize,
            n,
            value,
        }
    }

    fn wait_for(what: &str, f: impl Fn() -> bool) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    #[test]
    fn wrapping_comparison_of_completion_values() {
        assert!(reached(5, 5) && reached(6, 5) && !reached(4, 5));
        assert!(reached(0, u32::MAX), "0 comes after u32::MAX");
        assert!(!reached(u32::MAX, 1), "u32::MAX comes before 1");
    }

    /// Completions run once each, in enqueue order, when every word of their signal is
    /// reached, whether the thread or a caller's `poll` runs them; `stop` runs what is
    /// left with a detail.
    #[test]
    fn completions_run_once_in_order_when_their_words_are_reached() {
        let c = Completions::start("test-done".into(), Box::new(|| None)).unwrap();
        let w = words(4);
        let order = Arc::new(Mutex::new(Vec::new()));
        let runs = Arc::new(AtomicUsize::new(0));
        for i in 0..50u32 {
            let (o, r) = (Arc::clone(&order), Arc::clone(&runs));
            c.push(
                sig(&w, 1 + i % 4, i + 1),
                Box::new(move |fault| {
                    assert!(fault.is_none(), "{fault:?}");
                    o.lock().push(i);
                    r.fetch_add(1, Ordering::AcqRel);
                }),
            );
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(c.poll(), 0, "no word reached yet");
        // Operation 10's words (all 4 channels of ops 0..=10 written up to 11): 11 ran.
        for x in w.iter() {
            x.store(11, Ordering::Release);
        }
        wait_for("the first 11", || runs.load(Ordering::Acquire) == 11);
        // Word 0 alone moves on: the 12th operation waits for its 4 words.
        w[0].store(14, Ordering::Release);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            runs.load(Ordering::Acquire),
            11,
            "the 12th has 3 words at 11 < 12"
        );
        for x in w.iter() {
            x.store(50, Ordering::Release);
        }
        wait_for("all 50", || runs.load(Ordering::Acquire) == 50);
        assert_eq!(*order.lock(), (0..50).collect::<Vec<_>>());
        assert_eq!(c.pending(), 0);
        let late = Arc::new(AtomicBool::new(false));
        let l = Arc::clone(&late);
        c.push(
            sig(&w, 1, 99),
            Box::new(move |fault| {
                assert!(fault.unwrap().contains("destroyed"));
                l.store(true, Ordering::Release);
            }),
        );
        c.stop();
        assert!(late.load(Ordering::Acquire), "stop ran the incomplete one");
    }

    /// Once the communicator failed, an operation whose words never come (a faulted
    /// kernel) completes with the failure after the grace period; one that completes
    /// normally meanwhile still reports no fault.
    #[test]
    fn a_failed_communicator_completes_what_never_ends_after_the_grace() {
        let failed = Arc::new(Mutex::new(None::<String>));
        let f = Arc::clone(&failed);
        let c = Completions::start("test-done-fail".into(), Box::new(move || f.lock().clone()))
            .unwrap();
        let w = words(1);
        let got = Arc::new(Mutex::new(Vec::new()));
        for v in [1u32, 2] {
            let g = Arc::clone(&got);
            c.push(
                sig(&w, 1, v),
                Box::new(move |fault| g.lock().push((v, fault))),
            );
        }
        w[0].store(1, Ordering::Release);
        wait_for("op 1", || got.lock().len() == 1);
        *failed.lock() = Some("device fault".into());
        let t0 = Instant::now();
        wait_for("op 2 after the grace", || got.lock().len() == 2);
        assert!(t0.elapsed() >= FAILED_GRACE - Duration::from_millis(20));
        assert_eq!(
            *got.lock(),
            vec![(1, None), (2, Some("device fault".to_string()))]
        );
    }
}
