//! Communicators: init, split, finalize/destroy/abort, queries, user-buffer registration and
//! PreMulSum ops. This is the surface `ccl-ffi` calls.
//!
//! A communicator is one rank's handle: its bootstrap (control network), its transport
//! (shared-memory FIFOs, owned by its worker thread), its probe frame and op log, and a
//! table of PreMulSum ops. Operations go through [`crate::group`].
//!
//! Environment read at init (see `Tuning`):
//! - `NCCL_COMM_BLOCKING` (default 1): 0 makes init non-blocking (like `config.blocking=0`).
//! - `NCCL_MIN_CTAS` / `NCCL_MAX_CTAS`, or their deprecated names `NCCL_MIN_NCHANNELS` /
//!   `NCCL_MAX_NCHANNELS`: channel bounds (default 1 and 4 on the host backend, at most 32);
//!   the environment overrides `config.minCTAs/maxCTAs`.
//! - `NCCL_BUFFSIZE` (default 1 MiB on the host backend, NCCL's is 4 MiB): bytes of FIFO per
//!   channel and link, split into 8 slots.
//! - `CCLD_PEER_CHECK_MS` (default 200): how often a waiting operation checks that the
//!   peers' processes are alive.
//! - `CCLD_DISABLE` (default 0): 1 turns probe updates off.
//! - `CCLD_INJECT` (default unset): faults to inject, see [`crate::inject`].
//! - `CCLD_BACKEND` (default `auto`): `auto` | `host` | `device`, see
//!   [`crate::device::runtime`]; `device` without a usable device fails init.
//! - `CCLD_DEVICE_EMULATION` (default 0): 1 runs device communicators on the CPU emulation
//!   of the device (a testing aid; `auto` then picks the device backend).
//! - `CCLD_ANALYZER` (default `embedded`): with `embedded`, a communicator whose ranks span
//!   several processes agrees at init on one analyzer hub in the process of its rank 0
//!   (see `probe::hub`).

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use probe::{Frame, OpLog};

use crate::bootstrap::{self, Bootstrap, UniqueId};
use crate::channel::Transport;
use crate::device::runtime::{AttachArgs, DeviceComm, DevicePre};
use crate::env;
use crate::error::{CclError, Result};
use crate::executor::{self, Job, Shared, WorkerHandle};
use crate::op::ScalarArg;
use crate::schedule::Tuning;
use crate::schedule::MAX_CHANNELS;
use crate::transport::shm::{Doorbell, FifoLayout};
use crate::types::DataType;

mod init;
mod tuning;

/// Settings taken from `ncclConfig_t` (already validated and defaulted by `ccl-ffi`), with
/// `None` meaning "not set by the caller" (env or built-in default applies).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommConfig {
    /// Blocking init/ops (`config.blocking`, `NCCL_COMM_BLOCKING`); `None` = default (true).
    pub blocking: Option<bool>,
    /// Minimum channels (`minCTAs`).
    pub min_ctas: Option<u32>,
    /// Maximum channels (`maxCTAs`).
    pub max_ctas: Option<u32>,
    /// `commName`, for logs and the probe.
    pub comm_name: Option<String>,
    /// `splitShare`: share resources with the parent on split.
    pub split_share: Option<bool>,
}

impl CommConfig {
    /// Field-wise: ours where set, else `parent`'s.
    fn or(&self, parent: &CommConfig) -> CommConfig {
        CommConfig {
            blocking: self.blocking.or(parent.blocking),
            min_ctas: self.min_ctas.or(parent.min_ctas),
            max_ctas: self.max_ctas.or(parent.max_ctas),
            comm_name: self.comm_name.clone().or_else(|| parent.comm_name.clone()),
            split_share: self.split_share.or(parent.split_share),
        }
    }
}

/// First raw value of user-created reduction ops (`ncclNumOps`).
pub(crate) const FIRST_USER_OP: i32 = 5;
/// Most PreMulSum ops alive at once on one communicator.
pub(crate) const MAX_USER_OPS: usize = 1 << 16;
/// `NCCL_SPLIT_NOCOLOR`.
pub(crate) const SPLIT_NOCOLOR: i32 = -1;
/// Host-backend default of `NCCL_BUFFSIZE` (NCCL's device default is 4 MiB).
pub(crate) const DEFAULT_BUFFSIZE: usize = 1 << 20;
/// Host-backend default channel maximum.
pub(crate) const DEFAULT_MAX_CHANNELS: usize = 4;
/// Most channels of a p2p link (Send/Recv, AlltoAll, Gather, Scatter): every pair of
/// ranks that talks gets its own link, so these stay few (NCCL uses 1-2 per peer too).
pub(crate) const P2P_MAX_CHANNELS: usize = 2;
/// Slots per FIFO (`NCCL_STEPS`).
pub(crate) const FIFO_SLOTS: usize = 8;
// NCCL_BUFFSIZE's declared minimum is one 64-byte line per slot.
const _: () = match ccl_params::NCCL_BUFFSIZE.kind {
    ccl_params::Kind::Int { min, .. } => assert!(min == (FIFO_SLOTS * 64) as u64),
    _ => panic!("NCCL_BUFFSIZE is declared as an integer"),
};
/// Default of `CCLD_PEER_CHECK_MS`.
pub(crate) const DEFAULT_PEER_CHECK_MS: u64 = 200;

/// A PreMulSum op of a communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UserOp {
    pub scalar: ScalarArg,
    pub dtype: DataType,
}

#[derive(Clone, Debug)]
enum Life {
    Initializing,
    Ready,
    Failed(CclError),
    Finalized,
    Destroyed,
    Aborted,
}

/// What exists once init succeeded.
#[derive(Debug)]
pub(crate) struct Runtime {
    pub boot: Arc<Bootstrap>,
    pub comm_hash: u64,
    /// A handle on this rank's doorbell, to wake the worker (abort); host backend only.
    bell: Option<Doorbell>,
    /// This rank's poison word (a peer detected an inconsistent call); host backend only.
    poison: Option<crate::transport::shm::SharedWord>,
    worker: Mutex<Option<WorkerHandle>>,
    /// Device backend state (`None` on the host backend).
    dev: Option<Arc<DeviceComm>>,
    /// Host backend: some pair of ranks talks over the socket transport (the same on every
    /// rank).
    over_sockets: bool,
}

/// Longest wait for the probe's records at `ncclCommAbort` / `ncclCommDestroy`.
const TEARDOWN_FLUSH: std::time::Duration = std::time::Duration::from_millis(500);

/// A communicator (one rank of it). Shared through `Arc`; `ccl-ffi` hands out the raw
/// `Arc` pointer as `ncclComm_t`.
#[derive(Debug)]
pub struct Comm {
    nranks: usize,
    rank: usize,
    device: i32,
    uid: UniqueId,
    cfg: CommConfig,
    tuning: Tuning,
    abort_flag: Arc<AtomicBool>,
    life: Mutex<Life>,
    life_cv: Condvar,
    /// `life` is `Ready` and `broken` is `None`: [`Comm::usable`] without taking either
    /// lock. Set only under both locks when init completes; cleared under the lock of
    /// whichever of the two changes.
    usable_now: AtomicBool,
    rt: OnceLock<Runtime>,
    init_thread: Mutex<Option<JoinHandle<()>>>,
    last_error: Mutex<Option<String>>,
    broken: Mutex<Option<CclError>>,
    frame: Arc<Frame>,
    op_log: Arc<OpLog>,
    probe_on: bool,
    inject: Option<Arc<crate::inject::Injection>>,
    op_counter: Arc<AtomicU64>,
    user_ops: Mutex<HashMap<i32, UserOp>>,
    next_user_op: AtomicI32,
    regs: Mutex<HashMap<usize, (usize, usize)>>,
    next_reg: AtomicUsize,
    split_seq: AtomicU64,
    /// Device backend, chosen at creation, until `attach` takes it.
    dev_pre: Mutex<Option<DevicePre>>,
    /// This rank's registration with the diagnostic thread (probing on). Weak: the
    /// runtime's reference is the one that keeps it registered until destroy.
    probe_source: OnceLock<std::sync::Weak<probe::Source>>,
    /// This rank's communicators (`probe::diag::RankGroup`): those split from it share
    /// it, so that the time the rank spends in one comes out of its computation gaps in
    /// the others. A split child's is its parent's from the start; an initialised
    /// communicator's is chosen once its bootstrap knows where the ranks run
    /// ([`Comm::init_rank_group`]).
    rank_group: OnceLock<Arc<probe::diag::RankGroup>>,
}

/// `NCCL_ALGO`/`NCCL_PROTO` on the host backend (`crate::hostalgo`): both parsed strictly
/// (junk fails init on either backend; device communicators use `NCCL_PROTO` too,
/// `proto`), and a warning (once per process) when they ask for something the host
/// backend does not run.
fn note_algo_proto_env() -> Result<()> {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let algo = env::var(crate::hostalgo::ENV_ALGO)?;
    let proto = env::var(crate::proto::ENV_PROTO)?;
    crate::hostalgo::parse_algo(algo.as_deref())?;
    let set = crate::proto::parse(proto.as_deref())?;
    ONCE.call_once(|| {
        if let Some(w) = crate::hostalgo::describe_fallback(algo.as_deref()) {
            tracing::warn!(target: "nccl::ENV", "{w}");
        }
        if let (Some(p), false) = (proto, set.simple) {
            tracing::warn!(target: "nccl::ENV",
                "NCCL_PROTO={p}: host communicators run Ring with Simple only (LL with Tree); \
                 device communicators follow NCCL_PROTO");
        }
    });
    Ok(())
}

fn registry() -> &'static Mutex<Vec<std::sync::Weak<Comm>>> {
    static REG: OnceLock<Mutex<Vec<std::sync::Weak<Comm>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(Vec::new()))
}

/// splitmix64 finaliser (split lineage from the split sequence number and the color).
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn blocking(cfg: &CommConfig) -> Result<bool> {
    // config.blocking wins over NCCL_COMM_BLOCKING.
    match cfg.blocking {
        Some(b) => Ok(b),
        None => env::bool_or(&ccl_params::NCCL_COMM_BLOCKING, true),
    }
}

impl Comm {
    /// Moves to `l` and wakes every waiter on the life state.
    fn set_life(&self, l: Life) {
        let mut g = self.life.lock();
        *g = l;
        self.usable_now.store(false, Ordering::Release);
        drop(g);
        self.life_cv.notify_all();
    }

    /// `ncclCommFinalize`: completes outstanding operations.
    pub fn finalize(&self) -> Result<()> {
        self.wait_init();
        self.async_error()?;
        let mut g = self.life.lock();
        match &*g {
            Life::Ready => {
                *g = Life::Finalized;
                self.usable_now.store(false, Ordering::Release);
                Ok(())
            }
            Life::Finalized => Err(CclError::usage("communicator already finalized")),
            _ => Err(CclError::usage("communicator is not initialised")),
        }
    }

    fn wait_init(&self) {
        let mut g = self.life.lock();
        while matches!(*g, Life::Initializing) {
            self.life_cv.wait(&mut g);
        }
    }

    fn stop_worker(&self) {
        if let Some(rt) = self.rt.get() {
            let w = rt.worker.lock().take();
            if let Some(mut w) = w {
                w.shutdown();
            }
            if let Some(d) = &rt.dev {
                d.shutdown();
            }
        }
    }

    fn join_init_thread(&self) {
        let h = self.init_thread.lock().take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() && h.join().is_err() {
                tracing::error!(target: "nccl::INIT", rank = self.rank, "init thread panicked");
            }
        }
    }

    /// `ncclCommDestroy`: frees resources (the caller drops its `Arc` afterwards).
    pub fn destroy(&self) -> Result<()> {
        self.wait_init();
        {
            let g = self.life.lock();
            if matches!(*g, Life::Destroyed) {
                return Err(CclError::usage("communicator already destroyed"));
            }
        }
        self.join_init_thread();
        self.stop_worker();
        self.set_life(Life::Destroyed);
        // The probe's last records of this communicator reach the analyzer (bounded).
        probe::diag::flush(TEARDOWN_FLUSH);
        tracing::info!(target: "nccl::INIT", rank = self.rank,
            "comm {:#018x} rank {} nRanks {} - Destroy COMPLETE", self.comm_id(), self.rank, self.nranks);
        Ok(())
    }

    /// `ncclCommAbort`: callable from any thread; operations blocked in this communicator
    /// return an error within 1 s; resources are freed.
    pub fn abort(&self) -> Result<()> {
        self.abort_flag.store(true, Ordering::Release);
        if let Some(rt) = self.rt.get() {
            if let Some(b) = &rt.bell {
                b.ring();
            }
            if let Some(d) = &rt.dev {
                d.abort();
            }
        }
        // A non-blocking init sees the flag in its bootstrap waits and fails quickly.
        self.join_init_thread();
        self.stop_worker();
        self.set_life(Life::Aborted);
        probe::diag::flush(TEARDOWN_FLUSH);
        tracing::info!(target: "nccl::INIT", rank = self.rank,
            "comm {:#018x} rank {} - Abort COMPLETE", self.comm_id(), self.rank);
        Ok(())
    }

    /// `ncclCommGetAsyncError`: `Ok(())`, `Err(InProgress)` while initialising, or the error
    /// that broke the communicator.
    pub fn async_error(&self) -> Result<()> {
        if let Some(e) = self.broken.lock().clone() {
            return Err(e);
        }
        // Device path: a kernel fault or a dead peer seen by the device watch.
        if let Some(e) = self.device_comm().and_then(|d| d.async_error()) {
            self.mark_broken(&e);
            return Err(e);
        }
        // A peer that detected an inconsistent call or a lost peer poisoned this rank: the
        // communicator is unusable even if this rank's own operations completed.
        if let Some(e) = self
            .rt
            .get()
            .and_then(|rt| rt.poison.as_ref())
            .and_then(|w| crate::desc::poison_async_error(w, self.rank))
        {
            self.mark_broken(&e);
            return Err(e);
        }
        match &*self.life.lock() {
            Life::Initializing => Err(CclError::InProgress),
            Life::Failed(e) => Err(e.clone()),
            Life::Aborted => Err(CclError::Aborted("communicator was aborted".into())),
            _ => Ok(()),
        }
    }

    /// `ncclCommCount`.
    pub fn nranks(&self) -> i32 {
        self.nranks as i32
    }

    /// `ncclCommUserRank`.
    pub fn rank(&self) -> i32 {
        self.rank as i32
    }

    /// `ncclCommCuDevice` (host backend: the device index given at init, else 0).
    pub fn cuda_device(&self) -> i32 {
        self.device
    }

    /// Whether some pair of ranks talks over the socket transport (false until init
    /// completed, and on the device backend).
    pub(crate) fn over_sockets(&self) -> bool {
        self.rt.get().is_some_and(|rt| rt.over_sockets)
    }

    /// The 64-bit communicator id used in Trace IDs (0 until init completed).
    pub fn comm_id(&self) -> u64 {
        self.rt.get().map_or(0, |rt| rt.comm_hash)
    }

    /// `ncclCommGetUniqueId`: the unique id this communicator was created from (a split
    /// communicator reports its root ancestor's id).
    pub fn unique_id(&self) -> Result<UniqueId> {
        Ok(self.uid)
    }

    /// Message of the last error on this communicator, for `ncclGetLastError`.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// `ncclCommRegister`: returns an opaque non-zero handle.
    pub fn register(&self, ptr: usize, size: usize) -> Result<usize> {
        self.usable()?;
        if ptr == 0 && size > 0 {
            return self.fail(CclError::arg("ncclCommRegister: null buffer"));
        }
        if ptr.checked_add(size).is_none() {
            return self.fail(CclError::arg("ncclCommRegister: buffer range overflows"));
        }
        let h = self.next_reg.fetch_add(1, Ordering::AcqRel);
        self.regs.lock().insert(h, (ptr, size));
        Ok(h)
    }

    /// `ncclCommDeregister`.
    pub fn deregister(&self, handle: usize) -> Result<()> {
        self.usable()?;
        if self.regs.lock().remove(&handle).is_none() {
            return self.fail(CclError::arg(format!(
                "ncclCommDeregister: unknown handle {handle:#x}"
            )));
        }
        Ok(())
    }

    /// `ncclRedOpCreatePreMulSum`: returns the new raw `ncclRedOp_t` (>= 5).
    pub fn create_premulsum(&self, scalar: ScalarArg, dtype: DataType) -> Result<i32> {
        match &scalar {
            ScalarArg::HostImmediate(v) if v.len() != dtype.size() => {
                return self.fail(CclError::arg(format!(
                    "PreMulSum scalar has {} bytes, {} needs {}",
                    v.len(),
                    dtype.name(),
                    dtype.size()
                )))
            }
            ScalarArg::Device(0) => {
                return self.fail(CclError::arg("PreMulSum scalar pointer is null"))
            }
            _ => {}
        }
        let mut t = self.user_ops.lock();
        if t.len() >= MAX_USER_OPS {
            drop(t);
            return self.fail(CclError::usage(format!(
                "too many PreMulSum ops alive (max {MAX_USER_OPS})"
            )));
        }
        // Find a free value (values of destroyed ops are reused only after wrapping).
        let mut op = self.next_user_op.fetch_add(1, Ordering::AcqRel);
        while op < FIRST_USER_OP || t.contains_key(&op) {
            op = self.next_user_op.fetch_add(1, Ordering::AcqRel);
            if op < FIRST_USER_OP {
                self.next_user_op.store(FIRST_USER_OP, Ordering::Release);
            }
        }
        t.insert(op, UserOp { scalar, dtype });
        Ok(op)
    }

    /// `ncclRedOpDestroy`.
    pub fn destroy_redop(&self, op: i32) -> Result<()> {
        if (0..FIRST_USER_OP).contains(&op) {
            return self.fail(CclError::arg(format!(
                "ncclRedOpDestroy: op {op} is a built-in operator"
            )));
        }
        if self.user_ops.lock().remove(&op).is_none() {
            return self.fail(CclError::arg(format!(
                "ncclRedOpDestroy: op {op} was not created on this communicator (or already destroyed)"
            )));
        }
        Ok(())
    }

    // ----- crate-internal -----

    pub(crate) fn record_error(&self, e: &CclError) {
        *self.last_error.lock() = Some(e.to_string());
    }

    /// A call of this rank that failed before it became an operation (`why`: its error, or
    /// that a failed call cancelled its group): the probe's heartbeats carry it until the
    /// rank starts its next operation, so that a hang in which this rank never entered
    /// names the failed call as the reason.
    pub(crate) fn note_call_failed(&self, why: &str) {
        if let Some(src) = self.probe_source.get().and_then(std::sync::Weak::upgrade) {
            src.note_call_failed(why);
        }
    }

    fn fail<T>(&self, e: CclError) -> Result<T> {
        self.record_error(&e);
        Err(e)
    }

    pub(crate) fn mark_broken(&self, e: &CclError) {
        let mut b = self.broken.lock();
        if b.is_none() {
            *b = Some(e.clone());
            self.usable_now.store(false, Ordering::Release);
        }
    }

    pub(crate) fn user_op(&self, op: i32) -> Option<UserOp> {
        self.user_ops.lock().get(&op).cloned()
    }

    pub(crate) fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// Ok when operations may be issued.
    #[inline]
    pub(crate) fn usable(&self) -> Result<()> {
        if self.usable_now.load(Ordering::Acquire) {
            return Ok(());
        }
        self.usable_slow()
    }

    /// [`Comm::usable`] when the ready flag is not set: the communicator's life and
    /// broken state, under their locks (out of line: every call of a ready communicator
    /// takes the flag's branch).
    #[cold]
    #[inline(never)]
    fn usable_slow(&self) -> Result<()> {
        let broken = self.broken.lock().clone();
        match &*self.life.lock() {
            Life::Ready => broken.map_or(Ok(()), Err),
            Life::Initializing => Err(CclError::usage(
                "communicator initialization is still in progress (poll ncclCommGetAsyncError)",
            )),
            Life::Failed(e) => Err(CclError::usage(format!(
                "communicator initialization failed: {e}"
            ))),
            Life::Finalized => Err(CclError::usage("communicator was finalized")),
            Life::Destroyed => Err(CclError::usage("communicator was destroyed")),
            Life::Aborted => Err(CclError::usage("communicator was aborted")),
        }
    }

    fn ready_runtime(&self) -> Result<&Runtime> {
        self.usable()?;
        self.rt
            .get()
            .ok_or_else(|| CclError::Internal("ready communicator without runtime".into()))
    }

    /// Runs a job on the calling thread (a batch involving only this communicator).
    pub(crate) fn run_inline(&self, items: &[crate::op::WorkItem]) -> Result<()> {
        let rt = self.ready_runtime()?;
        let state = match &*rt.worker.lock() {
            Some(w) => w.inline(),
            None => return Err(CclError::usage("communicator was destroyed")),
        };
        executor::run_inline(&state, items)
    }

    /// The device backend state, when this communicator runs on a device.
    pub(crate) fn device_comm(&self) -> Option<&Arc<DeviceComm>> {
        self.rt.get().and_then(|rt| rt.dev.as_ref())
    }

    /// Whether this communicator runs on the device backend (a CUDA device or, with
    /// `CCLD_DEVICE_EMULATION=1`, the CPU emulation of one).
    pub fn is_device(&self) -> bool {
        self.device_comm().is_some()
    }

    /// Submits a job to this communicator's worker.
    pub(crate) fn submit(&self, job: Job) -> Result<()> {
        let rt = self.ready_runtime()?;
        match &*rt.worker.lock() {
            Some(w) => w.submit(job),
            None => Err(CclError::usage("communicator was destroyed")),
        }
    }

    // ----- probe access (tests, diagnostic thread) -----

    /// Every communicator of this process that completed init and is still referenced
    /// (for the diagnostic thread, which samples all frames of the process).
    pub fn live() -> Vec<Arc<Comm>> {
        let mut reg = registry().lock();
        reg.retain(|w| w.strong_count() > 0);
        reg.iter().filter_map(std::sync::Weak::upgrade).collect()
    }

    /// `config.commName`, if the caller gave one.
    pub fn name(&self) -> Option<&str> {
        self.cfg.comm_name.as_deref()
    }

    /// This rank's probing frame (capacity = the communicator's maximum channel count).
    pub fn probe_frame(&self) -> &Arc<Frame> {
        &self.frame
    }

    /// This rank's log of the last operations.
    pub fn op_log(&self) -> &Arc<OpLog> {
        &self.op_log
    }

    /// Operations started on this communicator so far (the next operation's counter).
    pub fn ops_started(&self) -> u64 {
        self.op_counter.load(Ordering::Acquire)
    }

    /// Whether probe updates are on (`CCLD_DISABLE` unset or 0).
    pub fn probe_enabled(&self) -> bool {
        self.probe_on
    }

    /// Pauses (`false`) or resumes (`true`) this rank's probing at run time: the probing
    /// frame's mode flag (CCL-D section 5.1), read once at the start of every operation.
    /// While paused the collective path skips every probe update, exactly as with
    /// `CCLD_DISABLE=1`, and the diagnostic thread skips the frame; the rank stays
    /// registered. Call it on every rank of the communicator (the analyzer compares ranks
    /// round by round). No effect on a communicator initialised with probing off. The
    /// probe-overhead benchmark uses it to compare probes on and off on one communicator.
    pub fn set_probing(&self, on: bool) {
        if self.probe_on {
            self.frame.set_mode(on);
        }
    }

    /// Completions of this rank reported to the analyzer so far and left out by record
    /// thinning (`probe::thin`); `None` while no diagnostic thread samples this rank.
    pub fn probe_record_counts(&self) -> Option<(u64, u64)> {
        let source = self.probe_source.get()?.upgrade()?;
        Some(source.thinning_counts())
    }

    /// Bytes of one FIFO slot (`NCCL_BUFFSIZE / 8`, rounded down to 64).
    pub fn slot_bytes(&self) -> usize {
        self.tuning.slot_bytes
    }

    /// Channel bounds (min, max) in effect.
    pub fn channel_bounds(&self) -> (usize, usize) {
        (self.tuning.min_channels, self.tuning.max_channels)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Stop the worker if the user never destroyed the communicator. The init thread (if
        // any) holds an Arc, so it has finished by the time we get here.
        self.stop_worker();
    }
}

#[cfg(test)]
mod tests;
