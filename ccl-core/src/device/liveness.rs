//! Liveness of a device communicator (issue 15, blocker 8): kernel faults and dead peers
//! reach `ncclCommGetAsyncError`, and a kernel that waits for a dead peer ends.
//!
//! On the device path a call returns once its work is enqueued, so nothing on the calling
//! thread sees a failure of the kernel. A watch thread per communicator does, every
//! `CCLD_PEER_CHECK_MS` (default 200 ms) while operations are in flight:
//! - it queries the communicator's ordering event ([`super::order`], recorded after every
//!   operation): an error there is a kernel fault (CUDA's sticky errors, e.g. an illegal
//!   address), reported at once as `ncclInternalError`;
//! - it checks that the processes of the peers on this host are alive (like the host
//!   executor's `check_peers`; a zombie counts as dead). A dead peer is confirmed when no
//!   operation of the communicator completed during one more period (an operation that no
//!   longer needed the peer finishes in that time), then reported as `ncclRemoteError`
//!   `"rank N (pid P, host H) exited"`: within 2 x `CCLD_PEER_CHECK_MS` plus one period of
//!   the thread's wake-up after the death;
//! - it reads the communicator's poison board ([`super::board`]): another rank's
//!   descriptor check failed, reported as `ncclRemoteError` naming that rank.
//!
//! Calls and completion functions that find a failure first (a kernel fault met by an
//! enqueue, a descriptor mismatch) record it the same way ([`Watch::kernel_faulted`],
//! [`WatchHandle::fail`]); the first failure stays.
//!
//! On a failure the watch stores the error (the communicator's async error; the next call
//! returns it), sets the kernels' abort flag so that kernels spinning on the dead peer end
//! (no hang; the operations' completion functions then run and record them as failed in
//! the probe with the cause), and logs a WARN line. The [`Judge`] is the pure part.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::api::{DeviceApi, Event};
use crate::error::{CclError, Result};
use crate::transport::shm::process_alive;

/// A peer process on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerProc {
    /// Rank in the communicator.
    pub rank: usize,
    /// Process id.
    pub pid: u32,
    /// Host name (for messages and the probe).
    pub host: String,
}

/// What the watch saw at one wake-up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Operations enqueued and not completed.
    pub inflight: usize,
    /// Operations completed so far (monotonic).
    pub completed: u64,
    /// A peer found dead (checked only while operations are in flight).
    pub dead: Option<PeerProc>,
    /// A device fault (the ordering event's query failed).
    pub fault: Option<String>,
    /// The rank that poisoned the communicator's board: its descriptor check failed
    /// (checked only while operations are in flight).
    pub poisoned_by: Option<usize>,
}

/// The watch's decision after an observation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing wrong (or nothing to check).
    Fine,
    /// A peer is dead; confirmed at the next observation unless operations complete.
    Suspect,
    /// The communicator failed: the error and the probe's failure record.
    Failed(CclError, probe::Failure),
}

/// The error of a kernel fault (`detail`: what the device said), the same whether the
/// watch saw it or an enqueue ran into it first.
pub(crate) fn kernel_fault(detail: &str) -> CclError {
    CclError::Internal(format!("device fault (a kernel failed): {detail}"))
}

/// The pure decision rules of the watch (see the module documentation).
#[derive(Debug, Default)]
pub struct Judge {
    /// Completed count when a dead peer was first seen.
    suspect: Option<u64>,
}

impl Judge {
    /// Decides after one observation.
    pub fn observe(&mut self, o: &Observation) -> Verdict {
        if let Some(f) = &o.fault {
            return Verdict::Failed(
                kernel_fault(f),
                probe::Failure::cause(probe::FailureCause::Internal),
            );
        }
        if let Some(by) = o.poisoned_by.filter(|_| o.inflight > 0) {
            return Verdict::Failed(
                super::check::poisoned_error(by, "this rank"),
                probe::Failure::cause(probe::FailureCause::PeerFailed),
            );
        }
        let Some(p) = o.dead.as_ref().filter(|_| o.inflight > 0) else {
            self.suspect = None;
            return Verdict::Fine;
        };
        match self.suspect {
            Some(c) if c == o.completed => Verdict::Failed(
                CclError::Remote(format!(
                    "rank {} (pid {}, host {}) exited",
                    p.rank, p.pid, p.host
                )),
                probe::Failure {
                    cause: probe::FailureCause::PeerLost,
                    peer_lost: Some(probe::PeerLost {
                        rank: u32::try_from(p.rank).unwrap_or(u32::MAX),
                        pid: p.pid,
                        host: p.host.clone(),
                        detail: "process exited".into(),
                    }),
                    mismatch: None,
                },
            ),
            _ => {
                self.suspect = Some(o.completed);
                Verdict::Suspect
            }
        }
    }
}

/// What the watch thread works with.
#[derive(Debug)]
pub(crate) struct WatchCfg {
    pub api: Arc<dyn DeviceApi>,
    pub device: i32,
    /// The communicator's ordering event.
    pub event: Event,
    /// Peers in other processes of this host.
    pub peers: Vec<PeerProc>,
    /// Host address of the kernels' abort flag (a `u32` in mapped memory that outlives
    /// the watch: [`Watch::stop`] runs before it is freed).
    pub kernel_abort: usize,
    /// The communicator's poison board (see [`super::board::Board`]), `None` with one rank.
    pub board: Option<Arc<super::board::Board>>,
    pub period: Duration,
    pub rank: usize,
    pub comm_id: u64,
}

#[derive(Debug, Default)]
struct Shared {
    failure: Mutex<Option<(CclError, probe::Failure)>>,
    /// [`WatchCfg::kernel_abort`].
    kernel_abort: usize,
    inflight: AtomicUsize,
    completed: AtomicU64,
    stop: Mutex<bool>,
    cv: Condvar,
}

/// The per-communicator watch: counts operations, holds the failure, runs the thread.
#[derive(Debug)]
pub(crate) struct Watch {
    sh: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What an operation's completion function holds of the watch.
#[derive(Clone, Debug)]
pub(crate) struct WatchHandle(Arc<Shared>);

impl WatchHandle {
    /// The operation completed (its kernel ended, successfully or not).
    pub(crate) fn end(&self) {
        let _ = self
            .0
            .inflight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        self.0.completed.fetch_add(1, Ordering::AcqRel);
    }

    /// The communicator's error, if it failed.
    pub(crate) fn error(&self) -> Option<CclError> {
        self.0.failure.lock().as_ref().map(|(e, _)| e.clone())
    }

    /// The failure record of the communicator, if it failed.
    pub(crate) fn failure(&self) -> Option<probe::Failure> {
        self.0.failure.lock().as_ref().map(|(_, f)| f.clone())
    }

    /// The communicator failed with `e` (a completion function saw it, e.g. the
    /// kernels' descriptor check): as if the watch had seen it. The first failure stays;
    /// returns whether this was it.
    pub(crate) fn fail(&self, e: CclError, f: probe::Failure) -> bool {
        fail(&self.0, e, f)
    }
}

impl Watch {
    /// Starts the watch thread.
    pub(crate) fn start(cfg: WatchCfg) -> Result<Watch> {
        let sh = Arc::new(Shared {
            kernel_abort: cfg.kernel_abort,
            ..Shared::default()
        });
        let me = Arc::clone(&sh);
        let h = std::thread::Builder::new()
            .name(format!("ccl-dev-watch-r{}", cfg.rank))
            .spawn(move || run(&me, &cfg))
            .map_err(|e| CclError::sys("spawning the device watch thread", e))?;
        Ok(Watch {
            sh,
            thread: Mutex::new(Some(h)),
        })
    }

    /// A call ran into a kernel fault before the watch saw it (the fault can precede the
    /// record of the ordering event the watch queries): the communicator fails with it as
    /// if the watch had seen it. The first failure stays.
    pub(crate) fn kernel_faulted(&self, detail: &str) -> CclError {
        let e = kernel_fault(detail);
        fail(
            &self.sh,
            e.clone(),
            probe::Failure::cause(probe::FailureCause::Internal),
        );
        self.error().unwrap_or(e)
    }

    /// An operation was enqueued.
    pub(crate) fn begin(&self) {
        self.sh.inflight.fetch_add(1, Ordering::AcqRel);
    }

    /// For the operation's completion function.
    pub(crate) fn handle(&self) -> WatchHandle {
        WatchHandle(Arc::clone(&self.sh))
    }

    /// The communicator's asynchronous error, if it failed.
    pub(crate) fn error(&self) -> Option<CclError> {
        self.sh.failure.lock().as_ref().map(|(e, _)| e.clone())
    }

    /// Stops and joins the thread (idempotent).
    pub(crate) fn stop(&self) {
        *self.sh.stop.lock() = true;
        self.sh.cv.notify_all();
        if let Some(h) = self.thread.lock().take() {
            if h.join().is_err() {
                tracing::error!(target: "nccl::INIT", "the device watch thread panicked");
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop();
    }
}

fn first_dead(peers: &[PeerProc]) -> Option<PeerProc> {
    peers.iter().find(|p| !process_alive(p.pid)).cloned()
}

fn run(sh: &Shared, cfg: &WatchCfg) {
    if let Err(e) = cfg.api.set_device(cfg.device) {
        tracing::warn!(target: "nccl::INIT", rank = cfg.rank, "device watch: {e}");
    }
    let mut judge = Judge::default();
    loop {
        {
            let mut g = sh.stop.lock();
            sh.cv.wait_while_for(&mut g, |stop| !*stop, cfg.period);
            if *g {
                return;
            }
        }
        let inflight = sh.inflight.load(Ordering::Acquire);
        if inflight == 0 {
            judge.observe(&Observation::default());
            continue;
        }
        let o = Observation {
            inflight,
            completed: sh.completed.load(Ordering::Acquire),
            dead: first_dead(&cfg.peers),
            fault: cfg.api.event_query(cfg.event).err().map(|e| e.to_string()),
            // Our own poison: this rank's failure is recorded already.
            poisoned_by: cfg
                .board
                .as_ref()
                .and_then(|b| b.poisoned_by())
                .filter(|by| *by != cfg.rank),
        };
        if let Verdict::Failed(e, f) = judge.observe(&o) {
            tracing::warn!(target: "nccl::NET", rank = cfg.rank,
                "comm {:#018x} rank {}: device operation failed: {e}; aborting its kernels",
                cfg.comm_id, cfg.rank);
            fail(sh, e, f);
            return;
        }
    }
}

/// Records the communicator's failure (unless one is recorded; returns whether this was the
/// first) and raises the abort flag of its kernels.
fn fail(sh: &Shared, e: CclError, f: probe::Failure) -> bool {
    let first = {
        let mut g = sh.failure.lock();
        let first = g.is_none();
        g.get_or_insert((e, f));
        first
    };
    // SAFETY: `kernel_abort` is the communicator's abort flag (first word of its abort
    // memory, mapped), freed by destroy only after `Watch::stop` joined the watch thread
    // (WatchCfg) and after every operation's completion function ended (which may call
    // this); the other callers, enqueues, are serialized with destroy, as NCCL requires.
    unsafe { AtomicU32::from_ptr(sh.kernel_abort as *mut u32) }.store(1, Ordering::Release);
    first
}

/// The peers of `rank` in other processes of this host: (rank, pid, host) from the
/// bootstrap's tables (pure).
pub fn local_peers(rank: usize, pids: &[u32], hosts: &[String]) -> Vec<PeerProc> {
    let me = pids.get(rank).copied();
    let my_host = hosts.get(rank);
    let mut seen: HashMap<u32, ()> = HashMap::new();
    pids.iter()
        .zip(hosts)
        .enumerate()
        .filter(|(r, (pid, host))| {
            *r != rank && Some(**pid) != me && Some(*host) == my_host && **pid != 0
        })
        .filter(|(_, (pid, _))| seen.insert(**pid, ()).is_none())
        .map(|(r, (pid, host))| PeerProc {
            rank: r,
            pid: *pid,
            host: host.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(rank: usize) -> PeerProc {
        PeerProc {
            rank,
            pid: 4242,
            host: "h".into(),
        }
    }

    #[test]
    fn a_fault_fails_at_once_as_internal() {
        let mut j = Judge::default();
        let o = Observation {
            inflight: 1,
            fault: Some("illegal address".into()),
            ..Default::default()
        };
        match j.observe(&o) {
            Verdict::Failed(CclError::Internal(m), f) => {
                assert!(m.contains("illegal address"), "{m}");
                assert_eq!(f.cause, probe::FailureCause::Internal);
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_poisoned_board_fails_operations_in_flight_only() {
        let mut j = Judge::default();
        let idle = Observation {
            poisoned_by: Some(3),
            ..Default::default()
        };
        assert_eq!(j.observe(&idle), Verdict::Fine);
        let busy = Observation {
            inflight: 2,
            ..idle.clone()
        };
        match j.observe(&busy) {
            Verdict::Failed(CclError::Remote(m), f) => {
                assert!(m.contains("rank 3 detected an inconsistent call"), "{m}");
                assert_eq!(f.cause, probe::FailureCause::PeerFailed);
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_dead_peer_is_confirmed_only_without_progress() {
        let mut j = Judge::default();
        let dead = |completed| Observation {
            inflight: 1,
            completed,
            dead: Some(peer(2)),
            ..Default::default()
        };
        assert_eq!(j.observe(&dead(5)), Verdict::Suspect);
        // An operation completed meanwhile: suspect again, not failed.
        assert_eq!(j.observe(&dead(6)), Verdict::Suspect);
        match j.observe(&dead(6)) {
            Verdict::Failed(CclError::Remote(m), f) => {
                assert_eq!(m, "rank 2 (pid 4242, host h) exited");
                assert_eq!(f.cause, probe::FailureCause::PeerLost);
                assert_eq!(f.peer_lost.map(|p| (p.rank, p.pid)), Some((2, 4242)));
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_dead_peer_while_idle_is_not_a_failure() {
        let mut j = Judge::default();
        let idle = Observation {
            inflight: 0,
            completed: 3,
            dead: Some(peer(1)),
            fault: None,
            poisoned_by: None,
        };
        assert_eq!(j.observe(&idle), Verdict::Fine);
        assert_eq!(j.observe(&idle), Verdict::Fine);
        // Suspicion is reset by an idle observation.
        let busy = Observation {
            inflight: 1,
            ..idle.clone()
        };
        assert_eq!(j.observe(&busy), Verdict::Suspect);
        assert_eq!(j.observe(&idle), Verdict::Fine);
        assert_eq!(j.observe(&busy), Verdict::Suspect);
    }

    #[test]
    fn local_peers_skip_this_process_other_hosts_and_duplicates() {
        let pids = [10, 10, 20, 20, 30];
        let hosts: Vec<String> = ["a", "a", "a", "a", "b"].map(String::from).to_vec();
        let p = local_peers(0, &pids, &hosts);
        assert_eq!(
            p,
            vec![PeerProc {
                rank: 2,
                pid: 20,
                host: "a".into()
            }]
        );
        assert!(local_peers(4, &pids, &hosts).is_empty());
    }

    #[test]
    fn liveness_of_this_process_and_of_a_reaped_child() {
        assert!(process_alive(std::process::id()));
        let mut c = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = c.id();
        c.wait().expect("wait");
        assert!(!process_alive(pid));
    }
}
