//! Per-communicator device state and the enqueue path of the device backend.
//!
//! Created at init when the backend is Device ([`select`]): the [`DeviceApi`] in use
//! ([`super::api::CudaApi`] or, with `CCLD_DEVICE_EMULATION=1`, the CPU emulator), the
//! probing frame and the abort flag in mapped host memory ([`DevicePre`], made before the
//! bootstrap because the communicator's frame must be that one), and once the bootstrap is
//! up ([`DeviceComm::attach`]) the FIFO connections: receiver-owned memory (tail counter,
//! head counter, slots) in device memory; ring connections at init, p2p connections
//! lazily in two phases ([`DeviceComm::p2p_begin`] / [`DeviceComm::p2p_finish`]) so that
//! one thread can drive a group over several communicators. How a receiver makes its FIFOs
//! reachable is chosen per peer ([`choose_path`]): peers in this process get raw device
//! addresses; peers in other processes get CUDA IPC handles, or, when IPC is unavailable
//! (the emulator) or `NCCL_P2P_DISABLE=1`, the FIFOs live in a shared-memory segment that
//! both processes map and pin for their device ("host staging").
//!
//! Host-staged segments: `/dev/shm/ccldev-<comm hash>-<receiver>-<peer>-<link>-<pid>`
//! (prefix [`STAGING_PREFIX`]), created and zeroed by the receiver, registered with
//! `host_register` by both sides (each kernel uses its own device alias). The sender, the
//! segment's only other user, unlinks the name right after it mapped it; the receiver's
//! handle unlinks it at destroy if the peer never came. A job killed between the two leaves
//! the file behind: every process sweeps segments of this prefix whose creator pid is dead
//! before it creates its first one. Teardown (destroy, or a failed init) unregisters and
//! unmaps; the pages live until the last process unmapped them, so the order in which the
//! two processes destroy does not matter.
//!
//! An operation: `crate::op::plan_for` -> `device::lower` -> arrays in mapped memory
//! (cached by plan shape) -> on the user's stream: a wait for the communicator's event when
//! the previous operation used another stream (`order`), the kernel (it waits at its start
//! gate until its probe start, `begin_op`, expected counts, `op_log.start`, ran at enqueue
//! or in the previous completion, `starts`; only a `CCLD_INJECT` delay / not-entered adds a
//! host function before it); its blocks' completion words run `op_log.finish`,
//! `Source::op_done` and the next start (`completion`); then the ordering event. A one-rank
//! operation that only moves bytes runs as copies instead of the kernel. The call returns
//! after the enqueue; the `liveness` watch reports kernel faults and dead peers.
//!
//! Rooms: this file holds the communicator's state, its memory handles, `abort` and
//! `shutdown`; `runtime/select.rs` the backend choice; `runtime/connect.rs` the peer paths,
//! the FIFO descriptor codec and `attach`; `runtime/enqueue.rs` the memory pool, plan upload
//! and `enqueue`.

use parking_lot::{Condvar, Mutex};
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_optype::CollKind;
use kernels::ffi::{
    ccl_dev_conn_t, ccl_dev_lane_t, ccl_dev_local_t, ccl_dev_plan_t, ccl_dev_step_t,
    CCL_CHECK_BYTES, CCL_DESC_WORDS, CCL_IPC_HANDLE_BYTES, CCL_MAX_BUFS, CCL_MAX_CHANNELS,
};
use probe::{Frame, OpLog};

use super::api::{CudaApi, DeviceApi, IpcHandle, Mapped, PtrInfo, PtrKind, Stream};
use super::board::Board;
use super::completion::{Completions, Signal};
use super::liveness::{local_peers, Watch, WatchCfg};
use super::lower::{
    apply_fault, byte_copies, halved, lower, red_params, ByteCopy, ConnDir, ConnKey, FaultFields,
    LoweredPlan, RedParams,
};
use super::order::Order;
use super::plans::PlanMem;
use super::starts::Starts;
use super::{choose_backend, Backend, DeviceProbe};
use crate::bootstrap::Bootstrap;
use crate::error::{CclError, Result};
use crate::op::ScalarArg;
use crate::op::{RedSpec, WorkItem};
use crate::proto::{self, OpShape, Proto, ProtoSet};
use crate::reduce::Reducer;
use crate::schedule::LinkKind;
use crate::schedule::Tuning;
use crate::transport::shm::{
    align_up, remove_stale_segments, segment_name_for_pid, validate_name, ShmRegion, CACHE_LINE,
};
use crate::types::{DataType, RedOpKind};

mod connect;
mod enqueue;
mod select;

pub(crate) use connect::sweep_stale_staging;
use connect::*;
pub use connect::{choose_path, kernel_address, PeerPath};
pub use select::{decide, device_api, parse_backend, ApiOnDevice, BackendEnv, Decision, GpuSeen};
pub(crate) use select::{select, DevicePre};

/// `CCLD_BACKEND`: which backend communicators use.
pub const ENV_BACKEND: &ccl_params::Param = &ccl_params::CCLD_BACKEND;
/// `CCLD_DEVICE_EMULATION`: 1 = the CPU emulator stands in for the device (testing aid).
pub const ENV_EMULATION: &ccl_params::Param = &ccl_params::CCLD_DEVICE_EMULATION;
/// `NCCL_P2P_DISABLE` (NVIDIA's meaning: no peer-to-peer access between GPUs): 1 = the
/// device backend never uses CUDA IPC; ranks of other processes are reached through
/// host-staged shared memory.
pub const ENV_P2P_DISABLE: &ccl_params::Param = &ccl_params::NCCL_P2P_DISABLE;
/// Prefix of host-staged FIFO segments in `/dev/shm` (distinct from the host transport's
/// `ccld-`, so neither sweeps the other's files).
pub const STAGING_PREFIX: &str = "ccldev";

/// Bootstrap tags of the device FIFO exchanges.
const TAG_RING: u32 = 0x6465_7601;
const TAG_P2P: u32 = 0x6465_7602;
/// Connection memory layout: tail at 0, head at 64, slots from 128.
const HEAD_OFF: usize = 64;
const SLOTS_OFF: usize = 128;
/// Offset of the descriptor words (`CCL_DESC_WORDS` per slot) in a connection: after the
/// slots, on their own cache line.
fn descs_off(t: &Tuning) -> usize {
    (SLOTS_OFF + t.nslots * t.slot_bytes).next_multiple_of(CACHE_LINE)
}
/// Offset of the check area ([`kernels::ffi::CCL_CHECK_BYTES`]) in the abort memory (the
/// abort flag's cache line comes first).
const CHECK_OFF: usize = 64;
/// Offset of the start gate's word in the abort memory (`CCL_GATE_WORD`, ccl_device.h).
const GATE_OFF: usize = 4 * kernels::ffi::CCL_GATE_WORD;
/// Offset of the kernels' completion words (`ccl_dev_plan_t.done`, one 32-bit word per
/// channel) in the abort memory, after the check area.
const DONE_OFF: usize = CHECK_OFF + CCL_CHECK_BYTES;
/// Bytes of the abort memory: the abort flag's cache line (flag, start gate), the check
/// area, the completion words.
const ABORT_MEM_BYTES: usize = DONE_OFF + 4 * CCL_MAX_CHANNELS;
/// Source of the zeroed FIFO counters.
static ZEROS: [u8; SLOTS_OFF] = [0; SLOTS_OFF];
/// Plan shapes whose arrays stay uploaded per communicator.
const PLAN_CACHE: usize = 64;
/// How long destroy waits for enqueued operations before leaking their memory.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// The same after a kernel fault or a dead peer (aborted kernels end within milliseconds).
const FAILED_DRAIN_LIMIT: Duration = Duration::from_secs(2);
/// How long a completion function waits for the probe's failure record to be delivered.
const FAILURE_FLUSH: Duration = Duration::from_millis(500);

/// One FIFO end: device addresses of its counters and slots.
#[derive(Clone, Copy, Debug)]
struct ConnMem {
    base: usize,
}

impl ConnMem {
    fn abi(&self, t: &Tuning) -> ccl_dev_conn_t {
        ccl_dev_conn_t {
            slots: (self.base + SLOTS_OFF) as *mut _,
            tail: self.base as *mut u64,
            head: (self.base + HEAD_OFF) as *mut u64,
            slot_bytes: t.slot_bytes as u64,
            nslots: t.nslots as u32,
            ll_sync: 0,
            descs: (self.base + descs_off(t)) as *mut u64,
        }
    }
}

/// Where a completion function finds the kernels' descriptor check (see [`super::check`]).
struct CheckArea {
    /// Host address of the check area (`CCL_CHECK_BYTES` in the abort memory).
    host: usize,
    /// The operation's connections, by index.
    conns: Vec<ConnKey>,
    rank: usize,
    comm_id: u64,
    /// Where a mismatch poisons the other ranks.
    board: Option<Arc<Board>>,
}

impl CheckArea {
    /// The error and failure of a record left by the operation's kernel, if any. The
    /// first record stays in the area: the communicator's later kernels stop at once
    /// (its stop word) and their completions find the same record again, and the watch
    /// keeps the first failure.
    fn failure(&self) -> Option<(CclError, probe::Failure)> {
        let mut words = [0u64; CCL_CHECK_BYTES / 8];
        for (i, w) in words.iter_mut().enumerate() {
            // SAFETY: the area is CCL_CHECK_BYTES of the communicator's mapped abort
            // memory, 8-byte aligned, freed only after every completion function ran;
            // kernels store to it with 8-byte stores (atomic loads see whole words).
            *w = unsafe { AtomicU64::from_ptr((self.host + 8 * i) as *mut u64) }
                .load(Ordering::Acquire);
        }
        let r = super::check::first_record(&words)?;
        if super::check::poisoned_by(&r.got).is_none() {
            if let Some(b) = &self.board {
                b.poison(self.rank);
            }
        }
        Some(super::check::failure_of(
            &r,
            &self.conns,
            self.rank,
            self.comm_id,
        ))
    }
}

/// Plan arrays in mapped memory, and their copy in device memory (`plans`).
#[derive(Clone, Copy, Debug)]
struct Uploaded {
    host: usize,
    dev: usize,
    /// The device copy (0: the kernel reads the mapped arrays) and its block size.
    ddev: usize,
    dbytes: usize,
    steps: usize,
    lanes: usize,
    locals: usize,
    conns: usize,
    /// Size of the mapped block (for reuse).
    bytes: usize,
}

/// Memory an operation hands back when it completed: kept for reuse by later operations
/// of the communicator and freed only at destroy. Freeing at enqueue time would be wrong on
/// CUDA: `cudaFree` / `cudaFreeHost` synchronize the whole device, so a thread driving one
/// rank would wait for the kernels of the other ranks on the device, which in turn wait for
/// the kernel this thread has not launched yet (a deadlock with several ranks per device).
#[derive(Debug)]
enum Freed {
    /// Device memory (in-place AlltoAll scratch).
    Device { ptr: usize, bytes: usize },
    /// Mapped host memory (plan arrays beyond the cache).
    Mapped { m: Mapped, bytes: usize },
}

/// Makes `device` current on the calling thread for the guard's lifetime and restores the
/// previous device afterwards: like NCCL, our calls leave the caller's current device as
/// it was (a thread that drives ranks on several devices, or allocates after a collective,
/// relies on it).
struct DeviceGuard<'a> {
    api: &'a dyn DeviceApi,
    prev: Option<i32>,
}

impl<'a> DeviceGuard<'a> {
    fn new(api: &'a dyn DeviceApi, device: i32) -> Result<DeviceGuard<'a>> {
        let cur = api.current_device()?;
        if cur == device {
            return Ok(DeviceGuard { api, prev: None });
        }
        api.set_device(device)?;
        Ok(DeviceGuard {
            api,
            prev: Some(cur),
        })
    }
}

impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.prev {
            if let Err(e) = self.api.set_device(p) {
                tracing::warn!(target: "nccl::COLL", "restoring the current device {p}: {e}");
            }
        }
    }
}

/// Operations enqueued and not completed.
#[derive(Debug, Default)]
struct Inflight {
    n: Mutex<usize>,
    cv: Condvar,
}

impl Inflight {
    fn add(&self) {
        *self.n.lock() += 1;
    }
    fn done(&self) {
        let mut g = self.n.lock();
        *g = g.saturating_sub(1);
        self.cv.notify_all();
    }
    fn wait_zero(&self, limit: Duration) -> bool {
        let t0 = Instant::now();
        let mut g = self.n.lock();
        while *g > 0 {
            let left = limit.saturating_sub(t0.elapsed());
            if left.is_zero() {
                return false;
            }
            self.cv.wait_for(&mut g, left);
        }
        true
    }
}

#[derive(Debug, Default)]
struct State {
    conns: HashMap<ConnKey, ConnMem>,
    p2p_peers: HashSet<usize>,
    /// Peers whose p2p descriptors were sent and are still to be received.
    p2p_pending: Vec<usize>,
    /// Our connection allocations (inbound FIFOs) and IPC-opened peer allocations.
    owned: Vec<usize>,
    opened: Vec<usize>,
    /// Host-staged segments (ours and peers'), registered for the device.
    staged: Vec<Staged>,
    cache: HashMap<u64, Vec<(LoweredPlan, Uploaded)>>,
    cached: usize,
    closed: bool,
    /// LL state of every connection end used so far (see [`LlConn`]).
    ll: HashMap<ConnKey, LlConn>,
}

/// Whether a connection's slots may hold bytes other than its own LL lines, and how many
/// LL scrubs it had (`ccl_dev_conn_t.ll_sync`). Both ends track the same sequence: the
/// messages of every operation on a connection are all LL or all Simple on both ends
/// (the protocol choice is the same on every rank, [`ProtoSet::choose`]).
#[derive(Clone, Copy, Debug, Default)]
struct LlConn {
    /// No Simple message since the last scrub (false when created: device memory is not
    /// zeroed by `cudaMalloc`).
    clean: bool,
    /// Scrubs so far (the last `ll_sync` value).
    scrubs: u32,
}

impl LlConn {
    /// Records an operation of protocol `p` on the connection; returns its `ll_sync`.
    fn use_for(&mut self, p: Proto) -> u32 {
        match p {
            Proto::Simple => {
                self.clean = false;
                0
            }
            Proto::Ll if self.clean => 0,
            Proto::Ll => {
                self.clean = true;
                // Never 0 (= no scrub); the kernels compare for equality, so wrapping is fine.
                self.scrubs = self.scrubs.wrapping_add(1).max(1);
                self.scrubs
            }
        }
    }
}

/// Per-communicator runtime state of the device backend.
#[derive(Debug)]
pub(crate) struct DeviceComm {
    api: Arc<dyn DeviceApi>,
    device: i32,
    rank: usize,
    nranks: usize,
    comm_id: u64,
    tuning: Tuning,
    /// `NCCL_P2P_DISABLE=1`: no CUDA IPC (host staging between processes).
    p2p_disabled: bool,
    boot: Arc<Bootstrap>,
    frame: Arc<Frame>,
    frame_dev: usize,
    abort_mem: Mapped,
    abort: Arc<AtomicBool>,
    op_log: Arc<OpLog>,
    probe_on: bool,
    op_counter: Arc<AtomicU64>,
    inject: Option<Arc<crate::inject::Injection>>,
    /// An injected h2 fault made this rank issue a different operation: like the host
    /// executor, it issues no more (later calls are held back until abort).
    diverged: AtomicBool,
    source: Option<Arc<probe::Source>>,
    pids: Vec<u32>,
    state: Mutex<State>,
    inflight: Arc<Inflight>,
    /// Blocks handed back by completed operations, for reuse (see [`Freed`]).
    spare: Arc<Mutex<Vec<Freed>>>,
    /// A stream of our own for setting up FIFOs (zeroing counters). Not `cudaMemset`: it
    /// runs on the legacy default stream, asynchronously for device memory, and kernels on
    /// non-blocking streams are not ordered after it.
    setup: Stream,
    /// Collective and per-pair p2p sequence numbers: the descriptors of the kernels'
    /// check and the probe's sequence spaces (as on the host backend).
    seqs: Mutex<crate::desc::SeqState>,
    /// The poison board (see [`Board`]); `None` with one rank.
    board: Option<Arc<Board>>,
    /// Protocols `NCCL_PROTO` allows (parsed at init).
    proto: ProtoSet,
    /// Orders the operations across streams (blocker 4).
    order: Order,
    /// Kernel faults and dead peers (blocker 8).
    watch: Watch,
    /// Completions of enqueued operations, run when their completion words are reached
    /// (`completion`).
    completions: Completions,
    /// Operation starts handed from the enqueue to the previous completion (blocker 10).
    starts: Arc<Starts>,
    /// Where kernels read plan arrays (`CCLD_DEVICE_PLANS`, blocker 9).
    plan_mem: PlanMem,
    /// This communicator in the count of communicators per device (see `queues`).
    _seat: Option<crate::device::queues::Seat>,
}

/// What `attach` needs of the communicator.
pub(crate) struct AttachArgs {
    pub pre: DevicePre,
    pub boot: Arc<Bootstrap>,
    pub tuning: Tuning,
    pub abort: Arc<AtomicBool>,
    pub op_log: Arc<OpLog>,
    pub probe_on: bool,
    pub op_counter: Arc<AtomicU64>,
    pub inject: Option<Arc<crate::inject::Injection>>,
    pub source: Option<Arc<probe::Source>>,
}

impl DeviceComm {
    /// Sets the kernels' abort flag (`ncclCommAbort`).
    pub(crate) fn abort(&self) {
        // SAFETY: the abort flag is 64 bytes of mapped memory owned by this communicator
        // until `shutdown`, 4-byte aligned; every access is atomic.
        unsafe { AtomicU32::from_ptr(self.abort_mem.host as *mut u32) }.store(1, Ordering::Release);
    }

    /// Destroy: waits (bounded) for enqueued operations, then frees FIFOs, plan arrays and
    /// the abort flag. Later enqueues fail.
    pub(crate) fn shutdown(&self) {
        {
            let mut st = self.state.lock();
            if st.closed {
                return;
            }
            st.closed = true;
        }
        // After a kernel fault or a dead peer the kernels end within milliseconds (their
        // completions run with the fault): wait briefly only. The watch may not have
        // looked yet: the ordering event tells the same at once.
        let failed =
            self.watch.error().is_some() || self.api.event_query(self.order.event()).is_err();
        let limit = if failed {
            FAILED_DRAIN_LIMIT
        } else {
            DRAIN_LIMIT
        };
        let drained = self.inflight.wait_zero(limit);
        self.watch.stop();
        if drained {
            // Nothing is queued: stops the thread (undrained, the queue lives on with the
            // leaked memory its completions read, until the communicator is dropped).
            self.completions.stop();
        }
        if !drained {
            tracing::warn!(target: "nccl::INIT", rank = self.rank,
                "comm {:#018x}: operations still enqueued after {limit:?}; leaking their device memory",
                self.comm_id);
            return;
        }
        let _dev = DeviceGuard::new(&*self.api, self.device)
            .map_err(|e| tracing::warn!(target: "nccl::INIT", rank = self.rank, "{e}"))
            .ok();
        let mut errs = self.free_spares();
        let mut st = self.state.lock();
        for p in st.opened.drain(..) {
            errs.push(self.api.ipc_close(p));
        }
        // What peers map (our inbound FIFOs, staging segments) is freed once they are done
        // with it (issue 15 blocker 7, `release`); not after an abort (peers may be hung).
        let owned: Vec<usize> = st.owned.drain(..).collect();
        let staged: Vec<Staged> = st.staged.drain(..).collect();
        let aborted = self.abort.load(Ordering::Acquire) || failed;
        let peers = if aborted {
            Vec::new()
        } else {
            super::release::connected_peers(st.conns.keys().map(|k| k.peer), self.rank)
        };
        for (_, v) in st.cache.drain() {
            for (_, u) in v {
                errs.push(self.api.host_free(u.host));
                if u.ddev != 0 {
                    errs.push(self.api.free(u.ddev));
                }
            }
        }
        st.conns.clear();
        errs.push(self.api.host_free(self.abort_mem.host));
        errs.push(self.api.stream_destroy(self.setup));
        errs.push(self.order.destroy());
        drop(st);
        for e in errs.into_iter().filter_map(|r| r.err()) {
            tracing::warn!(target: "nccl::ALLOC", rank = self.rank, "{e}");
        }
        super::release::notify(&self.boot, &peers);
        let (api, device, rank) = (Arc::clone(&self.api), self.device, self.rank);
        let free = Box::new(move || {
            let _dev = DeviceGuard::new(&*api, device).ok();
            for p in owned {
                if let Err(e) = api.free(p) {
                    tracing::warn!(target: "nccl::ALLOC", rank = rank, "{e}");
                }
            }
            // Unregister + unmap (Staged::drop); the peer's mapping keeps the pages alive.
            drop(staged);
        });
        super::release::defer(
            Arc::clone(&self.boot),
            peers,
            self.boot.timeout(),
            format!("comm {:#018x}", self.comm_id),
            free,
        );
    }
}

#[cfg(test)]
mod tests;
