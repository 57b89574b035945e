//! The worker of a communicator's executor: its thread, started with the executor state
//! ([`WorkerHandle::spawn`], which also sets the state's wait budgets and algorithm
//! selection), the queue that feeds it jobs, and the inline path that runs a job on the
//! caller's thread under the same mutex ([`run_inline`]); a panic in either becomes an
//! internal error that breaks the communicator ([`run_guarded`]).

use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use parking_lot::Mutex;

use super::byref::ByRef;
use super::probe_path::OpStart;
use super::tree_exec;
use super::wait::{spin_budget, yield_budget};
use super::{Job, Shared, Worker};
use crate::bootstrap::Bootstrap;
use crate::channel::Transport;
use crate::error::{CclError, Result};
use crate::hostalgo::Selection;
use crate::op::WorkItem;

/// Handle on a communicator's executor: the worker thread, and the executor state it
/// shares with callers that run a job inline (a batch that involves only this
/// communicator runs on the caller's thread: no thread hand-off on the latency path).
#[derive(Debug)]
pub(crate) struct WorkerHandle {
    tx: Option<mpsc::Sender<Job>>,
    join: Option<JoinHandle<()>>,
    state: Arc<Mutex<Worker>>,
}

/// Runs `items` on `w`; a panic (a bug) becomes an internal error and breaks the comm,
/// instead of leaving `group_end` waiting or unwinding into the caller.
fn run_guarded(w: &Mutex<Worker>, items: &[WorkItem]) -> Result<()> {
    let mut g = w.lock();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.run_job(items))).unwrap_or_else(
        |_| {
            let e = CclError::Internal("communicator executor panicked".into());
            g.broken = Some(e.clone());
            let w = &mut *g;
            w.byref.revoke(&w.t);
            Err(e)
        },
    )
}

impl WorkerHandle {
    /// Starts the worker, which owns `transport`.
    pub(crate) fn spawn(
        shared: Shared,
        boot: Arc<Bootstrap>,
        transport: Transport,
    ) -> Result<Self> {
        // The ranks that share this rank's CPUs are the communicator's ranks on this
        // machine (one kernel: "hosts" that are containers or network namespaces of one
        // machine count together); a rank with remote peers shares them with its socket
        // proxy thread as well.
        let (here, proxy) = (boot.ranks_on_this_machine(), transport.uses_sockets());
        let spin = spin_budget(here, proxy)?;
        tracing::info!(target: "nccl::INIT", rank = shared.rank,
            "host executor: a wait spins {} us ({here} of {} ranks on this machine{})",
            spin.as_micros(), shared.nranks, if proxy { ", with socket proxies" } else { "" });
        let yield_for = yield_budget()?;
        let tree_steps = crate::tree::steps(shared.rank, shared.nranks);
        let tree_msgs = tree_exec::step_messages(&tree_steps);
        let sel = Selection::parse(
            crate::env::var(crate::hostalgo::ENV_ALGO)?.as_deref(),
            crate::env::var(crate::proto::ENV_PROTO)?.as_deref(),
        )?;
        let (tx, rx) = mpsc::channel::<Job>();
        let name = format!("ccl-worker-r{}", shared.rank);
        let state = Arc::new(Mutex::new(Worker {
            shared,
            boot,
            t: transport,
            broken: None,
            scratch: Vec::new(),
            diverged: false,
            seqs: crate::desc::SeqState::default(),
            failure: None,
            spin,
            yield_for,
            sel,
            tree_steps,
            tree_msgs,
            scratch2: Vec::new(),
            last_reducer: None,
            tree_wire: None,
            tree_wire_start: Vec::new(),
            peer_wire: Vec::new(),
            pending: None,
            cur: OpStart::default(),
            probe_timed: true,
            byref: ByRef::from_env()?,
        }));
        let st = Arc::clone(&state);
        let join = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                while let Ok(mut job) = rx.recv() {
                    let items = std::mem::take(&mut job.items);
                    job.done.set(run_guarded(&st, &items));
                }
            })
            .map_err(|e| CclError::sys("spawning the communicator worker thread", e))?;
        Ok(WorkerHandle {
            tx: Some(tx),
            join: Some(join),
            state,
        })
    }

    /// Queues a job for the worker thread.
    pub(crate) fn submit(&self, job: Job) -> Result<()> {
        match &self.tx {
            Some(tx) => tx
                .send(job)
                .map_err(|_| CclError::Internal("communicator worker thread is gone".into())),
            None => Err(CclError::usage("communicator was destroyed")),
        }
    }

    /// The executor state, for running a job inline on the caller's thread.
    pub(crate) fn inline(&self) -> Arc<Mutex<Worker>> {
        Arc::clone(&self.state)
    }

    /// Stops the worker after its current job and waits for it.
    pub(crate) fn shutdown(&mut self) {
        self.tx = None;
        if let Some(j) = self.join.take() {
            if j.join().is_err() {
                tracing::error!(target: "nccl::INIT", "communicator worker thread panicked");
            }
        }
    }
}

/// Runs a job inline on the calling thread (see [`WorkerHandle`]).
pub(crate) fn run_inline(state: &Mutex<Worker>, items: &[WorkItem]) -> Result<()> {
    run_guarded(state, items)
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
