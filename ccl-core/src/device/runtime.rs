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
//! An operation: `executor::plan_for` -> `device::lower` -> arrays in mapped memory
//! (cached by plan shape) -> on the user's stream: a wait for the communicator's event when
//! the previous operation used another stream (`order`), the kernel (its probe start, `begin_op`, expected
//! counts, `op_log.start`, runs at enqueue or in the previous completion, `starts`; only a
//! `CCLD_INJECT` delay / not-entered adds a host function before it), a host function
//! (`op_log.finish`, `Source::op_done`, the next start), the event record. The call returns
//! after the enqueue; the `liveness` watch reports kernel faults and dead peers.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kernels::ffi::{
    ccl_dev_conn_t, ccl_dev_lane_t, ccl_dev_local_t, ccl_dev_plan_t, ccl_dev_step_t,
    CCL_CHECK_BYTES, CCL_DESC_WORDS, CCL_IPC_HANDLE_BYTES, CCL_MAX_BUFS,
};
use probe::{CollKind, Frame, OpLog};

use super::api::{CudaApi, DeviceApi, IpcHandle, Mapped, PtrInfo, PtrKind, Stream};
use super::board::Board;
use super::liveness::{local_peers, Watch, WatchCfg};
use super::lower::{apply_fault, halved, lower, red_params, ConnDir, ConnKey, LoweredPlan};
use super::order::Order;
use super::plans::PlanMem;
use super::proto::{self, OpShape, Proto, ProtoSet};
use super::starts::Starts;
use super::{choose_backend, Backend, DeviceProbe};
use crate::bootstrap::Bootstrap;
use crate::comm::ScalarArg;
use crate::error::{CclError, Result};
use crate::executor::{self, RedSpec, Tuning, WorkItem};
use crate::reduce::Reducer;
use crate::schedule::LinkKind;
use crate::transport::shm::{
    align_up, remove_stale_segments, segment_name_for_pid, validate_name, ShmRegion, CACHE_LINE,
};
use crate::types::{DataType, RedOpKind};

/// `CCLD_BACKEND`: which backend communicators use.
pub const ENV_BACKEND: &str = "CCLD_BACKEND";
/// `CCLD_DEVICE_EMULATION`: 1 = the CPU emulator stands in for the device (testing aid).
pub const ENV_EMULATION: &str = "CCLD_DEVICE_EMULATION";
/// `NCCL_P2P_DISABLE` (NVIDIA's meaning: no peer-to-peer access between GPUs): 1 = the
/// device backend never uses CUDA IPC; ranks of other processes are reached through
/// host-staged shared memory.
pub const ENV_P2P_DISABLE: &str = "NCCL_P2P_DISABLE";
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
/// Source of the zeroed FIFO counters.
static ZEROS: [u8; SLOTS_OFF] = [0; SLOTS_OFF];
/// Descriptor kinds on the wire.
const DESC_RAW: u8 = 0;
const DESC_IPC: u8 = 1;
const DESC_STAGED: u8 = 2;

/// How a receiver's inbound FIFOs from one peer are made reachable by the peer's kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerPath {
    /// The peer is in this process: raw device addresses.
    SameProcess,
    /// Another process: CUDA IPC handles of the receiver's device memory.
    Ipc,
    /// Another process: a shared-memory segment both processes map and pin for their
    /// device (`host_register`); each kernel uses its own device alias.
    HostStaged,
}

impl std::fmt::Display for PeerPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PeerPath::SameProcess => "raw device addresses (same process)",
            PeerPath::Ipc => "CUDA IPC",
            PeerPath::HostStaged => "host-staged shm",
        })
    }
}

/// The path for a peer (pure): same process -> raw addresses; another process -> CUDA IPC
/// when the API has it and `NCCL_P2P_DISABLE` is not set, else host staging.
pub fn choose_path(same_process: bool, ipc_available: bool, p2p_disabled: bool) -> PeerPath {
    if same_process {
        PeerPath::SameProcess
    } else if ipc_available && !p2p_disabled {
        PeerPath::Ipc
    } else {
        PeerPath::HostStaged
    }
}

/// The address a kernel on `device` uses for a user buffer at `p` described by `info`
/// (pure): device memory of that device, managed memory, or pinned host memory through its
/// device address (as NCCL, any device-accessible pointer). Anything else is the reason in
/// words: unregistered host memory, or device memory of another device (the kernel would
/// fault).
pub fn kernel_address(info: PtrInfo, p: usize, device: i32) -> std::result::Result<usize, String> {
    match info.kind {
        PtrKind::Device if info.device == device => Ok(if info.device_ptr != 0 {
            info.device_ptr
        } else {
            p
        }),
        PtrKind::Device => Err(format!(
            "is memory of CUDA device {}, but this communicator runs on device {device}",
            info.device
        )),
        PtrKind::Managed => Ok(p),
        PtrKind::HostPinned if info.device_ptr != 0 => Ok(info.device_ptr),
        PtrKind::HostPinned => Err(format!(
            "is pinned host memory not mapped for device {device} (register it with \
             cudaHostRegisterMapped or allocate it with cudaHostAllocMapped)"
        )),
        PtrKind::Host => Err(format!(
            "is host memory, but this communicator runs on CUDA device {device} (pass device \
             or pinned buffers, or use {ENV_BACKEND}=host)"
        )),
    }
}

/// Link code in staging segment names.
fn link_code(link: LinkKind) -> u64 {
    match link {
        LinkKind::Ring => 1,
        LinkKind::P2p => 2,
    }
}

/// Name of the staging segment holding `receiver`'s inbound FIFOs of `link` from `peer`,
/// created by process `pid` (pure).
fn staging_name(comm: u64, receiver: usize, peer: usize, link: LinkKind, pid: u32) -> String {
    segment_name_for_pid(
        STAGING_PREFIX,
        comm,
        &[receiver as u64, peer as u64, link_code(link)],
        pid,
    )
}

/// Removes staging segments of dead processes, once per process (before its first one).
pub(crate) fn sweep_stale_staging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match remove_stale_segments(STAGING_PREFIX) {
        Ok(0) => {}
        Ok(n) => tracing::info!(target: "nccl::SHM",
            "removed {n} stale host-staged FIFO segment(s) of dead processes"),
        Err(e) => tracing::debug!(target: "nccl::SHM", "sweeping stale staging segments: {e}"),
    });
}

/// A shared-memory segment of host-staged FIFOs, mapped in this process and registered
/// for the device. Dropping it unregisters, then unmaps (and, for the creator, unlinks the
/// name if the peer never did).
#[derive(Debug)]
struct Staged {
    api: Arc<dyn DeviceApi>,
    region: ShmRegion,
    /// Start of the mapping (the registered range) and its device alias.
    host: usize,
    dev: usize,
    /// Offset of the region's user area from `host`.
    user: usize,
}

impl Staged {
    /// Claims `region`'s user area for the device and registers the whole mapping.
    fn map(api: &Arc<dyn DeviceApi>, region: ShmRegion) -> Result<Staged> {
        let (host, len, user) = region.claim_for_device()?;
        let dev = api.host_register(host, len)?;
        Ok(Staged {
            api: Arc::clone(api),
            region,
            host,
            dev,
            user,
        })
    }

    /// Device address of user-area offset `off`.
    fn dev_addr(&self, off: usize) -> usize {
        self.dev + self.user + off
    }

    /// Host address of user-area offset `off`.
    fn host_addr(&self, off: usize) -> usize {
        self.host + self.user + off
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Err(e) = self.api.host_unregister(self.host) {
            tracing::warn!(target: "nccl::ALLOC", segment = %self.region.name(),
                "unregistering a host-staged FIFO segment: {e}");
        }
    }
}
/// Plan shapes whose arrays stay uploaded per communicator.
const PLAN_CACHE: usize = 64;
/// How long destroy waits for enqueued operations before leaking their memory.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// The same after a kernel fault or a dead peer (aborted kernels end within milliseconds).
const FAILED_DRAIN_LIMIT: Duration = Duration::from_secs(2);
/// How long a completion function waits for the probe's failure record to be delivered.
const FAILURE_FLUSH: Duration = Duration::from_millis(500);

/// `CCLD_BACKEND` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendEnv {
    /// Device when usable, host otherwise (default).
    Auto,
    /// Always the host backend.
    Host,
    /// The device backend; init fails without a usable device.
    Device,
}

/// Parses `CCLD_BACKEND` (unset = auto).
pub fn parse_backend(raw: Option<&str>) -> Result<BackendEnv> {
    match raw.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("auto") => Ok(BackendEnv::Auto),
        Some("host") => Ok(BackendEnv::Host),
        Some("device") => Ok(BackendEnv::Device),
        Some(v) => Err(CclError::arg(format!(
            "{ENV_BACKEND}={v:?} must be auto, host or device"
        ))),
    }
}

/// The backend decision, before any device call: pure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Host backend (reason for the INIT log).
    Host(String),
    /// Device backend on `device` through the emulator.
    Emulated(i32),
    /// Device backend on CUDA device `device`.
    Cuda(i32),
}

/// What the system shows of a GPU whatever CUDA says (see [`super::agree::gpu_evidence`]),
/// and whether `CUDA_VISIBLE_DEVICES` is set.
pub type GpuSeen = (Option<String>, bool);

/// Decides the backend from the variables and what the device probe found (`probe` is
/// only called when needed). `hint`: the device `ncclCommInitAll` assigned, if any. `gpu`
/// (called only when the probe found no usable device): when a GPU is present but CUDA
/// failed, init fails instead of falling back to the host backend
/// ([`super::agree::fallback`]).
pub fn decide(
    backend: BackendEnv,
    emulation: bool,
    hint: Option<i32>,
    probe: &dyn Fn() -> DeviceProbe,
    gpu: &dyn Fn() -> GpuSeen,
) -> Result<Decision> {
    if backend == BackendEnv::Host {
        return Ok(Decision::Host(format!("host backend ({ENV_BACKEND}=host)")));
    }
    if emulation {
        return Ok(Decision::Emulated(hint.unwrap_or(0)));
    }
    let p = probe();
    let cuda_failed = matches!(p, DeviceProbe::NoDevice(_));
    let p = match (p, hint) {
        (DeviceProbe::Present { count, .. }, Some(h)) => DeviceProbe::Present { count, current: h },
        (p, _) => p,
    };
    match choose_backend(&p) {
        (Backend::Device { device }, _) => Ok(Decision::Cuda(device)),
        (Backend::Host, why) if backend == BackendEnv::Device => Err(CclError::usage(format!(
            "{ENV_BACKEND}=device but no usable device: {why} (set {ENV_EMULATION}=1 to test \
             with the CPU emulation)"
        ))),
        (Backend::Host, why) if cuda_failed => {
            let (evidence, visible_set) = gpu();
            match super::agree::fallback(&why, evidence.as_deref(), visible_set) {
                super::agree::Fallback::Quiet => Ok(Decision::Host(why)),
                super::agree::Fallback::Loud(m) => {
                    warn_once(&m);
                    Ok(Decision::Host(m))
                }
                super::agree::Fallback::Refuse(m) => {
                    warn_once(&m);
                    Err(CclError::System(m))
                }
            }
        }
        (Backend::Host, why) => Ok(Decision::Host(why)),
    }
}

/// A WARN line once per process (the decision runs at every init and `ncclMemAlloc`).
fn warn_once(m: &str) {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| tracing::warn!(target: "nccl::INIT", "{m}"));
}

fn gpu_seen() -> GpuSeen {
    (
        super::agree::gpu_evidence(),
        std::env::var_os("CUDA_VISIBLE_DEVICES").is_some(),
    )
}

fn cuda_probe() -> DeviceProbe {
    let p = super::probe_device();
    match p {
        DeviceProbe::Present { count, .. } => match CudaApi.current_device() {
            Ok(current) => DeviceProbe::Present { count, current },
            Err(e) => DeviceProbe::NoDevice(e.to_string()),
        },
        other => other,
    }
}

/// What a communicator is created with on the device backend, before its bootstrap: the
/// API, the device, the frame in mapped memory and the abort flag.
#[derive(Debug)]
pub(crate) struct DevicePre {
    pub api: Arc<dyn DeviceApi>,
    pub device: i32,
    pub frame: Arc<Frame>,
    pub frame_dev: usize,
    pub abort: Mapped,
    /// `NCCL_PROTO`, parsed at init.
    pub proto: ProtoSet,
}

/// A device API and the device it is used on.
pub type ApiOnDevice = (Arc<dyn DeviceApi>, i32);

/// The device API and device a communicator created now on this thread would use
/// (`CCLD_BACKEND`, `CCLD_DEVICE_EMULATION`, the CUDA probe), or `Err(reason)` inside `Ok`
/// for the host backend. Programs that allocate buffers for device communicators (the GPU
/// suite's `device_matrix`) use it to get the same API the runtime uses.
pub fn device_api(hint: Option<i32>) -> Result<std::result::Result<ApiOnDevice, String>> {
    let backend = parse_backend(crate::env::var(ENV_BACKEND)?.as_deref())?;
    let emulation = crate::env::bool_or(ENV_EMULATION, false)?;
    Ok(
        match decide(backend, emulation, hint, &cuda_probe, &gpu_seen)? {
            Decision::Host(why) => Err(why),
            Decision::Emulated(d) => {
                let emu = super::emu::global();
                // Without a hint, the calling thread's current (emulated) device, as on CUDA.
                let d = match hint {
                    Some(_) => d,
                    None => emu.current_device()?,
                };
                Ok((emu, d))
            }
            Decision::Cuda(d) => Ok((Arc::new(CudaApi), d)),
        },
    )
}

/// Reads `CCLD_BACKEND` / `CCLD_DEVICE_EMULATION` and, for a device communicator, makes its
/// frame (capacity `channels`) and abort flag. `None`: host backend.
pub(crate) fn select(hint: Option<i32>, channels: usize, rank: usize) -> Result<Option<DevicePre>> {
    let (api, device) = match device_api(hint)? {
        Ok(v) => v,
        Err(why) => {
            tracing::info!(target: "nccl::INIT", rank = rank, "{why}");
            return Ok(None);
        }
    };
    let protos = proto::from_env()?;
    api.set_device(device)?;
    // Blocker 6: the kernel is loaded now, never lazily at a launch (see preload_kernel).
    api.preload_kernel()?;
    let bytes = Frame::total_bytes(channels);
    let m = api.host_alloc_mapped(bytes)?;
    // The abort flag, then the descriptor check's area.
    let abort = match api.host_alloc_mapped(CHECK_OFF + CCL_CHECK_BYTES) {
        Ok(a) => a,
        Err(e) => {
            let _ = api.host_free(m.host);
            return Err(e);
        }
    };
    let a2 = Arc::clone(&api);
    let host = m.host;
    let release = Box::new(move || {
        if let Err(e) = a2.host_free(host) {
            tracing::warn!(target: "nccl::ALLOC", "freeing a probe frame: {e}");
        }
    });
    // SAFETY: `m.host` is zeroed mapped memory of total_bytes(channels) bytes, page (or
    // 256-byte) aligned, freed only by `release`; only the frame and kernels (through the
    // device alias, plain aligned 8-byte stores) access it.
    let frame = unsafe { Frame::from_external(m.host as *mut u64, channels, release) };
    tracing::info!(target: "nccl::INIT", rank = rank,
        "device backend ({}) on device {device}, protocols {}", api.name(),
        ProtoSet { ll128: false, ..protos }.describe());
    Ok(Some(DevicePre {
        api,
        device,
        frame: Arc::new(frame),
        frame_dev: m.dev,
        abort,
        proto: protos,
    }))
}

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
        *lock(&self.n) += 1;
    }
    fn done(&self) {
        let mut g = lock(&self.n);
        *g = g.saturating_sub(1);
        self.cv.notify_all();
    }
    fn wait_zero(&self, limit: Duration) -> bool {
        let t0 = Instant::now();
        let mut g = lock(&self.n);
        while *g > 0 {
            let left = limit.saturating_sub(t0.elapsed());
            if left.is_zero() {
                return false;
            }
            g = self
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked holding it; the state is plain.
    m.lock().unwrap_or_else(|p| p.into_inner())
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
    /// Operation starts handed from the enqueue to the previous completion (blocker 10).
    starts: Arc<Starts>,
    /// Where kernels read plan arrays (`CCLD_DEVICE_PLANS`, blocker 9).
    plan_mem: PlanMem,
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

/// One rank's inbound FIFOs for a peer (channels 0..n), as the peer's kernel reaches them.
#[derive(Clone, Debug, PartialEq, Eq)]
enum FifoEnds {
    /// Raw device addresses (same process).
    Raw(Vec<usize>),
    /// CUDA IPC handles, one per FIFO allocation.
    Ipc(Vec<IpcHandle>),
    /// A staging segment and the FIFOs' offsets in its user area.
    Staged { name: String, offsets: Vec<usize> },
}

impl FifoEnds {
    fn len(&self) -> usize {
        match self {
            FifoEnds::Raw(v) => v.len(),
            FifoEnds::Ipc(v) => v.len(),
            FifoEnds::Staged { offsets, .. } => offsets.len(),
        }
    }
}

/// A FIFO descriptor: the receiver's pid and its ends.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FifoDesc {
    pid: u32,
    ends: FifoEnds,
}

/// Wire form: pid (u32 LE), kind (u8: 0 raw, 1 IPC, 2 staged), n (u32 LE), then kind 0:
/// n addresses (u64 LE); kind 1: n handles of 64 bytes; kind 2: name length (u16 LE), the
/// name (ASCII), n offsets (u64 LE).
fn encode_desc(d: &FifoDesc) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + d.ends.len() * CCL_IPC_HANDLE_BYTES + 256);
    v.extend_from_slice(&d.pid.to_le_bytes());
    let (kind, n) = match &d.ends {
        FifoEnds::Raw(a) => (DESC_RAW, a.len()),
        FifoEnds::Ipc(h) => (DESC_IPC, h.len()),
        FifoEnds::Staged { offsets, .. } => (DESC_STAGED, offsets.len()),
    };
    v.push(kind);
    v.extend_from_slice(&(n as u32).to_le_bytes());
    match &d.ends {
        FifoEnds::Raw(a) => a
            .iter()
            .for_each(|a| v.extend_from_slice(&(*a as u64).to_le_bytes())),
        FifoEnds::Ipc(h) => h.iter().for_each(|h| v.extend_from_slice(h)),
        FifoEnds::Staged { name, offsets } => {
            // Names are at most MAX_NAME_LEN (240) bytes: validate_name, checked by the
            // creator (ShmRegion::create) and by decode.
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(name.as_bytes());
            offsets
                .iter()
                .for_each(|o| v.extend_from_slice(&(*o as u64).to_le_bytes()));
        }
    }
    v
}

/// Parses a descriptor from `peer`; junk (unknown kind, truncated or trailing bytes, a bad
/// segment name, unaligned offsets) is a `Remote` error naming the problem.
fn decode_desc(b: &[u8], peer: usize) -> Result<FifoDesc> {
    let bad = |why: String| {
        CclError::Remote(format!(
            "rank {peer} sent a malformed device FIFO descriptor: {why}"
        ))
    };
    let mut pos = 0usize;
    let mut take = |n: usize, what: &str| -> Result<&[u8]> {
        let end = pos
            .checked_add(n)
            .filter(|e| *e <= b.len())
            .ok_or_else(|| bad(format!("truncated ({} bytes) in {what}", b.len())))?;
        let r = &b[pos..end];
        pos = end;
        Ok(r)
    };
    let u32_at = |x: &[u8]| u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
    let u64_at = |x: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(x);
        u64::from_le_bytes(a)
    };
    let pid = u32_at(take(4, "pid")?);
    let kind = take(1, "kind")?[0];
    let n = u32_at(take(4, "count")?) as usize;
    let ends = match kind {
        DESC_RAW => {
            let body = take(n.saturating_mul(8), "addresses")?;
            FifoEnds::Raw(body.chunks_exact(8).map(|c| u64_at(c) as usize).collect())
        }
        DESC_IPC => {
            let body = take(n.saturating_mul(CCL_IPC_HANDLE_BYTES), "IPC handles")?;
            FifoEnds::Ipc(
                body.chunks_exact(CCL_IPC_HANDLE_BYTES)
                    .map(|c| {
                        let mut h = [0u8; CCL_IPC_HANDLE_BYTES];
                        h.copy_from_slice(c);
                        h
                    })
                    .collect(),
            )
        }
        DESC_STAGED => {
            let l = take(2, "name length")?;
            let len = usize::from(u16::from_le_bytes([l[0], l[1]]));
            let raw = take(len, "segment name")?;
            let name = std::str::from_utf8(raw)
                .map_err(|_| bad("segment name is not UTF-8".into()))?
                .to_string();
            validate_name(&name).map_err(|e| bad(e.to_string()))?;
            if !name.starts_with(&format!("{STAGING_PREFIX}-")) {
                return Err(bad(format!(
                    "segment name {name:?} is not a staging segment ({STAGING_PREFIX}-...)"
                )));
            }
            let body = take(n.saturating_mul(8), "offsets")?;
            let offsets: Vec<usize> = body.chunks_exact(8).map(|c| u64_at(c) as usize).collect();
            if let Some(o) = offsets.iter().find(|o| *o % CACHE_LINE != 0) {
                return Err(bad(format!(
                    "FIFO offset {o} is not {CACHE_LINE}-byte aligned"
                )));
            }
            FifoEnds::Staged { name, offsets }
        }
        k => return Err(bad(format!("unknown kind {k}"))),
    };
    if pos != b.len() {
        return Err(bad(format!("{} trailing bytes", b.len() - pos)));
    }
    Ok(FifoDesc { pid, ends })
}

/// Waits for a bootstrap message without a deadline, ending on abort (like the host
/// transport's p2p handshake).
fn recv_patiently(boot: &Bootstrap, peer: usize, tag: u32, abort: &AtomicBool) -> Result<Vec<u8>> {
    loop {
        if abort.load(Ordering::Acquire) {
            return Err(CclError::Aborted(format!(
                "ncclCommAbort called while waiting for rank {peer} to connect"
            )));
        }
        match boot.recv_timeout(peer, tag, Duration::from_millis(100)) {
            Err(CclError::Timeout(_)) => {}
            other => return other,
        }
    }
}

impl DeviceComm {
    /// Second half of a device communicator's init: connects the ring FIFOs over the
    /// bootstrap (every rank calls it).
    pub(crate) fn attach(a: AttachArgs) -> Result<DeviceComm> {
        let boot = a.boot;
        let nranks = boot.nranks();
        let rank = boot.rank();
        let p2p_disabled = crate::env::bool_or(ENV_P2P_DISABLE, false)?;
        let plan_mem = super::plans::from_env()?;
        let (setup, order) = {
            let _dev = DeviceGuard::new(&*a.pre.api, a.pre.device)?;
            let setup = a.pre.api.stream_create()?;
            match Order::new(Arc::clone(&a.pre.api)) {
                Ok(o) => (setup, o),
                Err(e) => {
                    let _ = a.pre.api.stream_destroy(setup);
                    return Err(e);
                }
            }
        };
        let pids: Vec<u32> = (0..nranks).map(|r| boot.peer_pid(r)).collect();
        let hosts: Vec<String> = (0..nranks).map(|r| boot.peer_host(r).to_string()).collect();
        let board = match Board::setup(&boot, boot.comm_hash()) {
            Ok(b) => b.map(Arc::new),
            Err(e) => {
                let _ = order.destroy();
                let _ = a.pre.api.stream_destroy(setup);
                return Err(e);
            }
        };
        let watch = Watch::start(WatchCfg {
            api: Arc::clone(&a.pre.api),
            device: a.pre.device,
            event: order.event(),
            peers: local_peers(rank, &pids, &hosts),
            kernel_abort: a.pre.abort.host,
            board: board.clone(),
            period: a.tuning.peer_check,
            rank,
            comm_id: boot.comm_hash(),
        });
        let watch = match watch {
            Ok(w) => w,
            Err(e) => {
                let _ = order.destroy();
                let _ = a.pre.api.stream_destroy(setup);
                return Err(e);
            }
        };
        let dc = DeviceComm {
            api: a.pre.api,
            device: a.pre.device,
            rank,
            nranks,
            comm_id: boot.comm_hash(),
            tuning: a.tuning,
            p2p_disabled,
            pids,
            boot,
            frame: a.pre.frame,
            frame_dev: a.pre.frame_dev,
            abort_mem: a.pre.abort,
            abort: a.abort,
            op_log: a.op_log,
            probe_on: a.probe_on,
            op_counter: a.op_counter,
            inject: a.inject,
            diverged: AtomicBool::new(false),
            source: a.source,
            state: Mutex::new(State::default()),
            inflight: Arc::new(Inflight::default()),
            spare: Arc::new(Mutex::new(Vec::new())),
            setup,
            seqs: Mutex::new(crate::desc::SeqState::default()),
            board,
            proto: a.pre.proto,
            order,
            watch,
            starts: Arc::new(Starts::default()),
            plan_mem,
        };
        if nranks > 1 {
            let prev = (rank + nranks - 1) % nranks;
            let next = (rank + 1) % nranks;
            let n = dc.tuning.max_channels;
            let connected = dc
                .send_inbound(LinkKind::Ring, prev, n, TAG_RING)
                .and_then(|()| dc.recv_outbound(LinkKind::Ring, next, n, TAG_RING));
            if let Err(e) = connected {
                // Nothing is enqueued yet: release the FIFOs, mappings, flag and stream.
                dc.shutdown();
                return Err(e);
            }
        }
        tracing::info!(target: "nccl::INIT", rank = rank,
            "comm {:#018x}: device FIFOs of the ring connected ({} channels, {} x {} B)",
            dc.comm_id, dc.tuning.max_channels, dc.tuning.nslots, dc.tuning.slot_bytes);
        Ok(dc)
    }

    fn conn_bytes(&self) -> usize {
        descs_off(&self.tuning) + self.tuning.nslots * CCL_DESC_WORDS * 8
    }

    /// Makes our inbound FIFOs from `peer` (channels 0..n of `link`) by the path
    /// [`choose_path`] picks and sends their descriptor to `peer`.
    fn send_inbound(&self, link: LinkKind, peer: usize, n: usize, tag: u32) -> Result<()> {
        let _dev = DeviceGuard::new(&*self.api, self.device)?;
        let me = std::process::id();
        let path = choose_path(
            self.pids[peer] == me,
            self.api.supports_ipc(),
            self.p2p_disabled,
        );
        let ends = match path {
            PeerPath::HostStaged => self.staged_inbound(link, peer, n)?,
            PeerPath::SameProcess | PeerPath::Ipc => {
                let ends = self.device_inbound(link, peer, n, path)?;
                // The counters must be zero before the peer (or our kernel) can see them.
                self.api.stream_synchronize(self.setup)?;
                ends
            }
        };
        match link {
            LinkKind::Ring => tracing::info!(target: "nccl::INIT", rank = self.rank,
                "comm {:#018x}: ring FIFOs from rank {peer} ({n} channels) via {path}",
                self.comm_id),
            LinkKind::P2p => tracing::info!(target: "nccl::P2P", rank = self.rank,
                "comm {:#018x}: p2p FIFOs from rank {peer} ({n} channels) via {path}",
                self.comm_id),
        }
        self.boot
            .send(peer, tag, &encode_desc(&FifoDesc { pid: me, ends }))
    }

    /// Inbound FIFOs in device memory (raw addresses or IPC handles for the peer); the
    /// counters are zeroed on the setup stream (the caller synchronizes it).
    fn device_inbound(
        &self,
        link: LinkKind,
        peer: usize,
        n: usize,
        path: PeerPath,
    ) -> Result<FifoEnds> {
        let mut raw = Vec::with_capacity(n);
        let mut ipc = Vec::with_capacity(n);
        let mut st = lock(&self.state);
        for ch in 0..n {
            let base = self.api.malloc(self.conn_bytes())?;
            st.owned.push(base);
            // SAFETY: fresh allocation of conn_bytes() >= SLOTS_OFF bytes; ZEROS is static.
            unsafe {
                self.api
                    .memcpy_async(base, ZEROS.as_ptr() as usize, SLOTS_OFF, self.setup)?
            };
            st.conns.insert(
                ConnKey {
                    link,
                    peer,
                    channel: ch,
                    dir: ConnDir::In,
                },
                ConnMem { base },
            );
            if path == PeerPath::Ipc {
                ipc.push(self.api.ipc_get(base)?);
            } else {
                raw.push(base);
            }
        }
        Ok(if path == PeerPath::Ipc {
            FifoEnds::Ipc(ipc)
        } else {
            FifoEnds::Raw(raw)
        })
    }

    /// Bytes between consecutive FIFOs of a staging segment.
    fn staged_stride(&self) -> Result<usize> {
        align_up(self.conn_bytes(), CACHE_LINE)
            .ok_or_else(|| CclError::arg("NCCL_BUFFSIZE too large: FIFO size overflows"))
    }

    /// Inbound FIFOs in a new staging segment (created, zeroed, registered here).
    fn staged_inbound(&self, link: LinkKind, peer: usize, n: usize) -> Result<FifoEnds> {
        sweep_stale_staging();
        let stride = self.staged_stride()?;
        let bytes = stride
            .checked_mul(n)
            .ok_or_else(|| CclError::arg("NCCL_BUFFSIZE x channels overflows"))?
            .max(CACHE_LINE);
        let name = staging_name(self.comm_id, self.rank, peer, link, std::process::id());
        let seg = Staged::map(&self.api, ShmRegion::create(&name, bytes)?)?;
        let offsets: Vec<usize> = (0..n).map(|ch| ch * stride).collect();
        let mut st = lock(&self.state);
        for (ch, &off) in offsets.iter().enumerate() {
            // SAFETY: off + SLOTS_OFF <= off + stride <= bytes: inside the user area, which
            // `Staged::map` claimed for the device; no kernel or peer has its address yet.
            // (A new segment is zero already; zeroing the counters states the invariant.)
            unsafe { std::ptr::write_bytes(seg.host_addr(off) as *mut u8, 0, SLOTS_OFF) };
            st.conns.insert(
                ConnKey {
                    link,
                    peer,
                    channel: ch,
                    dir: ConnDir::In,
                },
                ConnMem {
                    base: seg.dev_addr(off),
                },
            );
        }
        st.staged.push(seg);
        Ok(FifoEnds::Staged { name, offsets })
    }

    /// Receives `peer`'s inbound FIFO descriptors (its FIFOs from us): our outbound ends.
    fn recv_outbound(&self, link: LinkKind, peer: usize, n: usize, tag: u32) -> Result<()> {
        let b = recv_patiently(&self.boot, peer, tag, &self.abort)?;
        let d = decode_desc(&b, peer)?;
        // IPC mappings are opened in the current device's context: this rank's.
        let _dev = DeviceGuard::new(&*self.api, self.device)?;
        if d.ends.len() != n {
            return Err(CclError::Remote(format!(
                "rank {peer} offered {} FIFO channels, expected {n} (different NCCL_MAX_CTAS?)",
                d.ends.len()
            )));
        }
        let bases: Vec<usize> = match d.ends {
            FifoEnds::Raw(addrs) => {
                if d.pid != std::process::id() {
                    return Err(CclError::Remote(format!(
                        "rank {peer} (pid {}) sent a raw device address to another process",
                        d.pid
                    )));
                }
                if let Some(&a) = addrs.first() {
                    self.reach_same_process_peer(peer, a)?;
                }
                addrs
            }
            FifoEnds::Ipc(handles) => {
                let mut v = Vec::with_capacity(n);
                for h in &handles {
                    let p = self.api.ipc_open(h)?;
                    lock(&self.state).opened.push(p);
                    v.push(p);
                }
                v
            }
            FifoEnds::Staged { name, offsets } => {
                self.staged_outbound(link, peer, d.pid, &name, &offsets)?
            }
        };
        let mut st = lock(&self.state);
        for (ch, base) in bases.into_iter().enumerate() {
            st.conns.insert(
                ConnKey {
                    link,
                    peer,
                    channel: ch,
                    dir: ConnDir::Out,
                },
                ConnMem { base },
            );
        }
        Ok(())
    }

    /// Lets our kernels write into the FIFO memory at `addr` of `peer`, a rank of this
    /// process: when it lives on another device, peer access from our device to that one
    /// is enabled (the caller made our device current), or refused clearly when the two
    /// devices cannot reach each other.
    fn reach_same_process_peer(&self, peer: usize, addr: usize) -> Result<()> {
        let info = self.api.pointer_info(addr)?;
        if info.kind != PtrKind::Device || info.device < 0 || info.device == self.device {
            return Ok(());
        }
        if !self.api.can_access_peer(self.device, info.device)? {
            return Err(CclError::usage(format!(
                "rank {peer}'s FIFOs are on device {}, which kernels on device {} cannot reach \
                 (no peer-to-peer access between them): run those ranks in separate processes \
                 with {ENV_P2P_DISABLE}=1",
                info.device, self.device
            )));
        }
        self.api.enable_peer_access(info.device)?;
        tracing::info!(target: "nccl::P2P", rank = self.rank,
            "comm {:#018x}: peer access device {} -> {} enabled (rank {peer})",
            self.comm_id, self.device, info.device);
        Ok(())
    }

    /// Maps and registers `peer`'s staging segment `name` (created by process `pid`),
    /// checks it, unlinks its name (we are its only other user) and returns our device
    /// addresses of its FIFOs.
    fn staged_outbound(
        &self,
        link: LinkKind,
        peer: usize,
        pid: u32,
        name: &str,
        offsets: &[usize],
    ) -> Result<Vec<usize>> {
        let want = staging_name(self.comm_id, peer, self.rank, link, pid);
        if name != want {
            return Err(CclError::Remote(format!(
                "rank {peer} named staging segment {name:?}, expected {want:?}"
            )));
        }
        // The receiver created the segment before it sent the descriptor.
        let region = ShmRegion::open(name)?;
        if region.creator_pid() != pid {
            return Err(CclError::Remote(format!(
                "staging segment {name} was created by pid {}, not by rank {peer} (pid {pid})",
                region.creator_pid()
            )));
        }
        let fifo = self.conn_bytes();
        if let Some(o) = offsets
            .iter()
            .find(|o| o.checked_add(fifo).is_none_or(|e| e > region.len()))
        {
            return Err(CclError::Remote(format!(
                "rank {peer}: FIFO at offset {o} ({fifo} bytes) lies outside staging segment \
                 {name} of {} bytes (different NCCL_BUFFSIZE?)",
                region.len()
            )));
        }
        let seg = Staged::map(&self.api, region)?;
        if let Err(e) = seg.region.unlink() {
            // The receiver's handle unlinks it at destroy.
            tracing::warn!(target: "nccl::SHM", rank = self.rank, "{e}");
        }
        let bases = offsets.iter().map(|&o| seg.dev_addr(o)).collect();
        lock(&self.state).staged.push(seg);
        Ok(bases)
    }

    /// Phase 1 of lazy p2p connections: sends our inbound FIFO descriptors to every peer
    /// of `peers` not connected yet. Every such peer must do the same for us at the same
    /// point of its program (its matching operation).
    pub(crate) fn p2p_begin(&self, peers: &[usize]) -> Result<()> {
        let mut new: Vec<usize> = {
            let st = lock(&self.state);
            peers
                .iter()
                .copied()
                .filter(|p| {
                    *p != self.rank && !st.p2p_peers.contains(p) && !st.p2p_pending.contains(p)
                })
                .collect()
        };
        new.sort_unstable();
        new.dedup();
        for &p in &new {
            self.send_inbound(LinkKind::P2p, p, self.tuning.p2p_channels(), TAG_P2P)?;
            lock(&self.state).p2p_pending.push(p);
        }
        Ok(())
    }

    /// Phase 2: receives the descriptors of the peers of [`Self::p2p_begin`].
    pub(crate) fn p2p_finish(&self) -> Result<()> {
        let pending = std::mem::take(&mut lock(&self.state).p2p_pending);
        for p in pending {
            self.recv_outbound(LinkKind::P2p, p, self.tuning.p2p_channels(), TAG_P2P)?;
            lock(&self.state).p2p_peers.insert(p);
            tracing::debug!(target: "nccl::P2P", rank = self.rank,
                "comm {:#018x}: device p2p FIFOs with rank {p} connected", self.comm_id);
        }
        Ok(())
    }

    /// The p2p peers `item` needs (AlltoAll/Gather/Scatter and Send/Recv groups).
    pub(crate) fn p2p_peers_of(&self, item: &WorkItem) -> Result<Vec<usize>> {
        let plan = executor::plan_for(item, self.rank, self.nranks, &self.tuning)?;
        Ok(plan
            .lanes
            .iter()
            .filter(|l| l.link == LinkKind::P2p && !l.steps.is_empty())
            .flat_map(|l| l.recv_from.into_iter().chain(l.send_to))
            .collect())
    }

    /// Sets the kernels' abort flag (`ncclCommAbort`).
    pub(crate) fn abort(&self) {
        // SAFETY: the abort flag is 64 bytes of mapped memory owned by this communicator
        // until `shutdown`, 4-byte aligned; every access is atomic.
        unsafe { AtomicU32::from_ptr(self.abort_mem.host as *mut u32) }.store(1, Ordering::Release);
    }

    /// A spare device block of at least `bytes` (the smallest that fits), else a new one.
    fn take_device(&self, bytes: usize) -> Result<(usize, usize)> {
        {
            let mut sp = lock(&self.spare);
            let best = sp
                .iter()
                .enumerate()
                .filter_map(|(i, f)| match f {
                    Freed::Device { bytes: b, .. } if *b >= bytes => Some((i, *b)),
                    _ => None,
                })
                .min_by_key(|(_, b)| *b);
            if let Some((i, _)) = best {
                if let Freed::Device { ptr, bytes } = sp.swap_remove(i) {
                    return Ok((ptr, bytes));
                }
            }
        }
        Ok((self.api.malloc(bytes)?, bytes))
    }

    /// A spare mapped block of at least `bytes` (the smallest that fits), else a new one.
    fn take_mapped(&self, bytes: usize) -> Result<(Mapped, usize)> {
        {
            let mut sp = lock(&self.spare);
            let best = sp
                .iter()
                .enumerate()
                .filter_map(|(i, f)| match f {
                    Freed::Mapped { bytes: b, .. } if *b >= bytes => Some((i, *b)),
                    _ => None,
                })
                .min_by_key(|(_, b)| *b);
            if let Some((i, _)) = best {
                if let Freed::Mapped { m, bytes } = sp.swap_remove(i) {
                    return Ok((m, bytes));
                }
            }
        }
        Ok((self.api.host_alloc_mapped(bytes)?, bytes))
    }

    /// Frees the spare blocks (destroy, after every operation completed).
    fn free_spares(&self) -> Vec<Result<()>> {
        let v = std::mem::take(&mut *lock(&self.spare));
        v.into_iter()
            .map(|f| match f {
                Freed::Device { ptr, .. } => self.api.free(ptr),
                Freed::Mapped { m, .. } => self.api.host_free(m.host),
            })
            .collect()
    }

    /// Checks that a user buffer is device memory (CUDA; the emulator takes any pointer).
    /// The address this communicator's kernels use for the user buffer `p` (see
    /// [`kernel_address`]); a buffer they cannot reach is `ncclInvalidArgument`. The
    /// emulator takes any pointer (its device addresses are host addresses).
    fn kernel_buffer(&self, what: &str, label: &str, p: usize) -> Result<usize> {
        if p == 0 || self.api.is_emulated() {
            return Ok(p);
        }
        let info = self.api.pointer_info(p)?;
        kernel_address(info, p, self.device)
            .map_err(|why| CclError::arg(format!("{label}: {what} {p:#x} {why}")))
    }

    fn reducer(&self, spec: &RedSpec, dtype: DataType) -> Result<(Reducer, usize)> {
        let n = self.nranks;
        Ok(match spec {
            RedSpec::Builtin(k) => (Reducer::new(dtype, *k, None, n)?, 0),
            RedSpec::PreMul(ScalarArg::HostImmediate(v)) => {
                (Reducer::new(dtype, RedOpKind::PreMulSum, Some(v), n)?, 0)
            }
            RedSpec::PreMul(ScalarArg::Device(addr)) => {
                // The kernel reads the scalar from device memory when it runs.
                let zero = [0u8; 8];
                (
                    Reducer::new(dtype, RedOpKind::PreMulSum, Some(&zero[..dtype.size()]), n)?,
                    *addr,
                )
            }
        })
    }

    fn upload(
        &self,
        st: &mut State,
        lp: &LoweredPlan,
        conns: &[ccl_dev_conn_t],
        proto: Proto,
        stream: Stream,
    ) -> Result<(u64, Uploaded, bool)> {
        // Connections that need an LL scrub make a one-off array (rare: the first LL
        // operation after Simple ones); the cache holds arrays without scrubs only.
        let cacheable = conns.iter().all(|c| c.ll_sync == 0);
        let mut h = DefaultHasher::new();
        (proto, lp.n_channels, lp.unit, &lp.conns).hash(&mut h);
        for s in &lp.steps {
            (s.kind, s.src_buf, s.dst_buf, s.src_off, s.dst_off, s.count).hash(&mut h);
        }
        for l in &lp.lanes {
            (
                l.channel,
                l.first_step,
                l.n_steps,
                l.conn_in,
                l.conn_out,
                l.flags,
            )
                .hash(&mut h);
        }
        for l in &lp.locals {
            (l.kind, l.src_buf, l.dst_buf, l.src_off, l.dst_off, l.count).hash(&mut h);
        }
        let key = h.finish();
        if let (true, Some(v)) = (cacheable, st.cache.get(&key)) {
            if let Some((_, u)) = v.iter().find(|(p, _)| p == lp) {
                return Ok((key, *u, true));
            }
        }
        let align = |x: usize| x.div_ceil(64) * 64;
        let steps = 0;
        let lanes = align(steps + lp.steps.len() * std::mem::size_of::<ccl_dev_step_t>());
        let locals = align(lanes + lp.lanes.len() * std::mem::size_of::<ccl_dev_lane_t>());
        let cn = align(locals + lp.locals.len() * std::mem::size_of::<ccl_dev_local_t>());
        let total = cn + std::mem::size_of_val(conns);
        let (m, bytes) = self.take_mapped(total.max(64))?;
        // SAFETY: `m.host` is fresh mapped memory of `total` bytes, at least 64-byte aligned
        // (cudaHostAlloc: page; emulator: 256), so every typed destination is aligned and
        // in bounds; the sources are live vectors of those lengths.
        unsafe {
            std::ptr::copy_nonoverlapping(
                lp.steps.as_ptr(),
                (m.host + steps) as *mut ccl_dev_step_t,
                lp.steps.len(),
            );
            std::ptr::copy_nonoverlapping(
                lp.lanes.as_ptr(),
                (m.host + lanes) as *mut ccl_dev_lane_t,
                lp.lanes.len(),
            );
            std::ptr::copy_nonoverlapping(
                lp.locals.as_ptr(),
                (m.host + locals) as *mut ccl_dev_local_t,
                lp.locals.len(),
            );
            std::ptr::copy_nonoverlapping(
                conns.as_ptr(),
                (m.host + cn) as *mut ccl_dev_conn_t,
                conns.len(),
            );
        }
        let (ddev, dbytes) = match self.plan_mem {
            PlanMem::Mapped => (0, 0),
            PlanMem::Device => {
                let copied = self.take_device(total.max(64)).and_then(|(d, b)| {
                    // SAFETY: `d` has at least `total` bytes; the mapped source lives until
                    // the operation completed (cached: until destroy; else handed back by
                    // the completion function), after this copy ran on `stream`.
                    match unsafe { self.api.memcpy_async(d, m.host, total, stream) } {
                        Ok(()) => Ok((d, b)),
                        Err(e) => {
                            lock(&self.spare).push(Freed::Device { ptr: d, bytes: b });
                            Err(e)
                        }
                    }
                });
                match copied {
                    Ok(v) => v,
                    Err(e) => {
                        lock(&self.spare).push(Freed::Mapped { m, bytes });
                        return Err(e);
                    }
                }
            }
        };
        let u = Uploaded {
            host: m.host,
            dev: m.dev,
            ddev,
            dbytes,
            steps,
            lanes,
            locals,
            conns: cn,
            bytes,
        };
        if cacheable && st.cached < PLAN_CACHE {
            st.cached += 1;
            st.cache.entry(key).or_default().push((lp.clone(), u));
            return Ok((key, u, true));
        }
        Ok((key, u, false))
    }

    /// The protocol `item` runs with on this communicator (`NCCL_PROTO`, the operation's
    /// size; the same on every rank).
    pub(crate) fn protocol_of(&self, item: &WorkItem) -> Proto {
        let shape = match item {
            WorkItem::Coll(c) => {
                let per_rank_in = matches!(
                    c.kind,
                    CollKind::ReduceScatter | CollKind::AlltoAll | CollKind::Scatter
                );
                let bytes = c.count.saturating_mul(c.dtype.size());
                OpShape::Coll {
                    bytes: if per_rank_in {
                        bytes.saturating_mul(self.nranks)
                    } else {
                        bytes
                    },
                }
            }
            WorkItem::P2p(_) => OpShape::P2pGroup,
        };
        self.proto.choose(shape)
    }

    /// The tuning an operation of protocol `p` is planned with: LL messages carry at most
    /// `ll_chunk_bytes(slot_bytes)` payload bytes (the FIFOs themselves are the same).
    pub(crate) fn plan_tuning(&self, p: Proto) -> Tuning {
        match p {
            Proto::Simple => self.tuning,
            Proto::Ll => Tuning {
                slot_bytes: proto::ll_chunk_bytes(self.tuning.slot_bytes),
                ..self.tuning
            },
        }
    }

    /// Enqueues one work item on `stream` (0 = default stream) and returns.
    pub(crate) fn enqueue(&self, item: &WorkItem, stream: Stream) -> Result<()> {
        if lock(&self.state).closed {
            return Err(CclError::usage("communicator was destroyed"));
        }
        // A kernel fault or a dead peer broke the communicator (blocker 8).
        if let Some(e) = self.watch.error() {
            return Err(e);
        }
        let _dev = DeviceGuard::new(&*self.api, self.device)?;
        let stream = if stream == 0 {
            self.api.default_stream(self.device)?
        } else {
            stream
        };
        // Graph capture would replay one-shot host callbacks: refused before anything is
        // enqueued (issue 15 blocker 3).
        if self.api.stream_capturing(stream)? {
            return Err(super::capture::refusal(&item.label(), stream));
        }
        // After the previous operation of this communicator, whatever its stream.
        self.order.join(stream)?;
        let mut frees: Vec<Freed> = Vec::new();
        let r = self.enqueue_inner(item, stream, &mut frees);
        if r.is_err() && !frees.is_empty() {
            // Nothing was enqueued that uses them (or the completion function owns them).
            lock(&self.spare).extend(frees);
        }
        let marked = self.order.mark(stream);
        match r.and(marked) {
            // An earlier kernel on this stream faulted (CUDA's errors of that kind are
            // sticky) before the watch saw it: the same error as the watch reports, so that
            // this call, `ncclCommGetAsyncError` and later calls agree.
            Err(e) => match self.api.stream_query(stream) {
                Err(fault) => Err(self.watch.kernel_faulted(&fault.to_string())),
                Ok(_) => Err(e),
            },
            Ok(()) => Ok(()),
        }
    }

    /// The error that broke the communicator on the device (a kernel fault, a dead
    /// peer), for `ncclCommGetAsyncError`.
    pub(crate) fn async_error(&self) -> Option<CclError> {
        self.watch.error()
    }

    fn enqueue_inner(&self, item: &WorkItem, stream: Stream, frees: &mut Vec<Freed>) -> Result<()> {
        let label = item.label();
        let proto = self.protocol_of(item);
        let plan = executor::plan_for(item, self.rank, self.nranks, &self.plan_tuning(proto))?;
        // CCLD_INJECT: the faults of the operation this call becomes (its counter is taken
        // below; calls on one communicator are serialized, as NCCL requires), applied with
        // the host executor's rules (see `inject`).
        let mut fault = match &self.inject {
            Some(inj) => inj.for_op(
                self.rank,
                self.nranks,
                self.op_counter.load(Ordering::Acquire),
            ),
            None => crate::inject::OpFault::default(),
        };
        if self.diverged.load(Ordering::Acquire) {
            fault.not_enter = true;
        }
        // h2: the rank runs the first half of every lane (its op type set says half the
        // count); the expected counts stay the schedule's.
        let run_plan = if fault.halve && !fault.not_enter {
            halved(&plan)
        } else {
            plan.clone()
        };
        let (mut bufs, red, dtype_bytes): (Vec<usize>, Option<(Reducer, usize)>, usize) = match item
        {
            WorkItem::Coll(c) => {
                let send = self.kernel_buffer("sendbuff", &label, c.sendbuf)?;
                let recv = self.kernel_buffer("recvbuff", &label, c.recvbuf)?;
                let red = match &c.red {
                    Some(spec) => Some(self.reducer(spec, c.dtype)?),
                    None => None,
                };
                (vec![send, recv], red, c.count * c.dtype.size())
            }
            WorkItem::P2p(calls) => (
                calls
                    .iter()
                    .map(|c| self.kernel_buffer("buff", &c.label, c.buf))
                    .collect::<Result<Vec<usize>>>()?,
                None,
                0,
            ),
        };
        if let WorkItem::Coll(c) = item {
            let total = dtype_bytes * self.nranks;
            if c.kind == CollKind::AlltoAll
                && total > 0
                && c.sendbuf < c.recvbuf + total
                && c.recvbuf < c.sendbuf + total
            {
                // In-place AlltoAll: stage the input (ordered on the stream).
                let (scratch, bytes) = self.take_device(total)?;
                frees.push(Freed::Device {
                    ptr: scratch,
                    bytes,
                });
                // SAFETY: scratch has `total` bytes; sendbuf is valid for `total` bytes
                // until the operation completed (enqueue contract); ordered on `stream`.
                unsafe { self.api.memcpy_async(scratch, bufs[0], total, stream)? };
                bufs[0] = scratch;
            }
        }
        if bufs.len() > CCL_MAX_BUFS {
            return Err(CclError::usage(format!(
                "the device backend runs at most {CCL_MAX_BUFS} buffers per operation"
            )));
        }
        let mut lp = lower(&run_plan, bufs.len())?;
        let faults = apply_fault(&mut lp, &fault);
        let mut st = lock(&self.state);
        let mut conns: Vec<ccl_dev_conn_t> = lp
            .conns
            .iter()
            .map(|k| {
                st.conns.get(k).map(|c| c.abi(&self.tuning)).ok_or_else(|| {
                    CclError::Internal(format!("{label}: device connection {k:?} is not set up"))
                })
            })
            .collect::<Result<_>>()?;
        // Every connection of the plan carries messages (lowering gives a lane a
        // connection only when it has steps that use it).
        for (c, k) in conns.iter_mut().zip(&lp.conns) {
            c.ll_sync = st.ll.entry(*k).or_default().use_for(proto);
        }
        let (_, up, cached) = self.upload(&mut st, &lp, &conns, proto, stream)?;
        drop(st);
        if !cached {
            frees.push(Freed::Mapped {
                m: Mapped {
                    host: up.host,
                    dev: up.dev,
                },
                bytes: up.bytes,
            });
            if up.ddev != 0 {
                frees.push(Freed::Device {
                    ptr: up.ddev,
                    bytes: up.dbytes,
                });
            }
        }
        // Where the kernel reads the arrays (blocker 9, `plans`).
        let base = if up.ddev != 0 { up.ddev } else { up.dev };
        let mut p = ccl_dev_plan_t {
            n_channels: lp.n_channels,
            n_lanes: lp.lanes.len() as u32,
            n_locals: lp.locals.len() as u32,
            n_steps: lp.steps.len() as u32,
            n_conns: conns.len() as u32,
            unit: lp.unit,
            dtype: 0,
            op: 0,
            reduce: 0,
            avg_divisor: 0,
            scalar_bits: 0,
            scalar_dev: std::ptr::null(),
            steps: (base + up.steps) as *const _,
            lanes: (base + up.lanes) as *const _,
            locals: (base + up.locals) as *const _,
            conns: (base + up.conns) as *const _,
            bufs: [std::ptr::null_mut(); CCL_MAX_BUFS],
            frame: std::ptr::null_mut(),
            frame_capacity: 0,
            frame_block: 0,
            proto: proto.abi(),
            reserved: 0,
            abort_flag: self.abort_mem.dev as *const u32,
            throttle_gap_ns: faults.throttle_gap_ns,
            stall_channel: faults.stall_channel,
            stall_after: faults.stall_after,
            check: std::ptr::null_mut(),
            rank: self.rank as u32,
            reserved2: 0,
            desc: [[0; CCL_DESC_WORDS]; CCL_MAX_BUFS],
        };
        for (d, b) in p.bufs.iter_mut().zip(&bufs) {
            *d = *b as *mut _;
        }
        if let Some((r, scalar_dev)) = &red {
            let rp = red_params(r, self.nranks)?;
            p.reduce = 1;
            p.dtype = rp.dtype;
            p.op = rp.op;
            p.avg_divisor = rp.avg_divisor;
            p.scalar_bits = rp.scalar_bits;
            if *scalar_dev != 0 {
                p.scalar_dev = *scalar_dev as *const _;
            }
        }
        // The descriptors of the kernels' check (by buffer index, as on the host backend)
        // and the operation's sequence-space identity for the probe.
        let (descs, seq_id) = lock(&self.seqs).descriptors(item);
        let checking = crate::desc::check_on();
        if checking {
            p.check = (self.abort_mem.dev + CHECK_OFF) as *mut u64;
            for (w, d) in p.desc.iter_mut().zip(&descs) {
                *w = *d;
            }
        }
        let counter = self.op_counter.fetch_add(1, Ordering::AcqRel);
        let block = (counter % probe::FRAME_BLOCKS as u64) as usize;
        // Probing can be paused at run time (`Comm::set_probing`): decided once per operation.
        let probing = self.probe_on && self.frame.is_measuring();
        if probing {
            p.frame = self.frame_dev as *mut u64;
            p.frame_capacity = self.frame.channel_capacity() as u32;
            p.frame_block = block as u32;
        }
        let mut info = executor::type_set(item, self.nranks, &plan);
        info.proto = match proto {
            Proto::Simple => probe::Proto::Simple,
            Proto::Ll => probe::Proto::Ll,
        };
        if fault.halve && !fault.not_enter {
            info.count /= 2;
            info.bytes /= 2;
            tracing::warn!(target: "nccl::COLL", rank = self.rank,
                "CCLD_INJECT: operation {counter} runs half its steps; no further operation is \
                 issued on this communicator");
            self.diverged.store(true, Ordering::Release);
        }
        if fault.throttle.is_some() || fault.stall.is_some() {
            tracing::warn!(target: "nccl::COLL", rank = self.rank,
                "CCLD_INJECT: operation {counter}: throttle {:?}, stall {:?}",
                fault.throttle, fault.stall);
        }
        let expected: Vec<(usize, u64, u64)> = plan
            .lanes
            .iter()
            .map(|l| {
                let (s, r) = l.step_counts();
                (l.channel, s, r)
            })
            .collect();
        executor::log_call(
            item,
            &info,
            self.rank,
            self.nranks,
            self.comm_id,
            counter,
            Some(stream),
        );
        // The operation's start in the probe (blocker 10: off the kernel's critical path,
        // see `starts`).
        let start = {
            let frame = Arc::clone(&self.frame);
            let op_log = Arc::clone(&self.op_log);
            let source = self.source.clone();
            let (comm_id, n_ch) = (self.comm_id, plan.n_channels);
            move || {
                if probing {
                    // As the operation starts (not at enqueue: the heartbeats' latest
                    // operation must not run ahead of it): its records and the heartbeats
                    // number it in its sequence space (collective / p2p).
                    if let Some(src) = &source {
                        src.set_seq(counter, seq_id);
                    }
                    let b = frame.begin_op(comm_id, counter, n_ch);
                    for (ch, s, r) in expected {
                        frame.add_expected(b, ch, s, r);
                    }
                    op_log.start(counter, &info, executor::now_ns());
                }
            }
        };
        self.inflight.add();
        self.watch.begin();
        if fault.not_enter || fault.delay.is_some() {
            // CCLD_INJECT: a host function before the kernel holds it back, and the
            // operation must not look started before it let go.
            let abort = Arc::clone(&self.abort);
            let rank = self.rank;
            let before = move || {
                if fault.not_enter {
                    tracing::warn!(target: "nccl::COLL", rank = rank,
                        "CCLD_INJECT: not entering operation {counter} (blocked until abort)");
                    while !abort.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                if let Some(d) = fault.delay {
                    std::thread::sleep(d);
                }
                start();
            };
            if let Err(e) = self.api.launch_host_fn(stream, Box::new(before)) {
                self.inflight.done();
                self.watch.handle().end();
                return Err(e);
            }
            if let Some(noop) = self.starts.submit(Box::new(|| {})) {
                noop();
            }
        } else if let Some(now) = self.starts.submit(Box::new(start)) {
            now();
        }
        let after = {
            let op_log = Arc::clone(&self.op_log);
            let source = self.source.clone();
            let inflight = Arc::clone(&self.inflight);
            let spare = Arc::clone(&self.spare);
            let frees = std::mem::take(frees);
            let abort = Arc::clone(&self.abort);
            let watch = self.watch.handle();
            let starts = Arc::clone(&self.starts);
            // The check area, and what names a record's peer (only while checking).
            let check = checking.then(|| CheckArea {
                host: self.abort_mem.host + CHECK_OFF,
                conns: lp.conns.clone(),
                rank: self.rank,
                comm_id: self.comm_id,
                board: self.board.clone(),
            });
            // No CUDA call in here (CUDA forbids them in host functions): only host state.
            move || {
                if let Some(c) = &check {
                    if let Some((e, f)) = c.failure() {
                        // Once: later completions of the failed communicator find the
                        // same record.
                        if watch.fail(e.clone(), f) {
                            tracing::warn!(target: "nccl::COLL", rank = c.rank, "{e}");
                        }
                    }
                }
                if probing {
                    let failure = watch.failure();
                    let ok = !abort.load(Ordering::Acquire) && failure.is_none();
                    let fin = op_log.finish(counter, executor::now_ns(), ok);
                    match (&source, fin, failure) {
                        (Some(s), Some(fin), None) => s.op_done(&fin),
                        (Some(s), Some(fin), Some(f)) => {
                            s.op_failed(&fin, f);
                            probe::diag::flush(FAILURE_FLUSH);
                        }
                        _ => {}
                    }
                }
                lock(&spare).extend(frees);
                // The next operation's start, if it is already enqueued (`starts`).
                if let Some(next) = starts.complete() {
                    next();
                }
                watch.end();
                inflight.done();
            }
        };
        // SAFETY: the arrays live in mapped memory handed back for reuse only by the
        // completion host function and freed at shutdown after all operations); the
        // FIFOs, frame and abort flag live until shutdown; user buffers are valid until
        // completion (the enqueue contract).
        let launched = unsafe { self.api.launch_plan(&p, stream) };
        // The completion function runs even when the launch failed (it releases memory and
        // the in-flight count).
        if let Err(e) = self.api.launch_host_fn(stream, Box::new(after)) {
            // It will never run (a faulted device): settle its counts here so that destroy
            // does not wait for it and no later start waits for its completion.
            let _ = self.starts.complete();
            self.watch.handle().end();
            self.inflight.done();
            return Err(e);
        }
        launched.map_err(|e| executor::with_context(e, &label))
    }

    /// Destroy: waits (bounded) for enqueued operations, then frees FIFOs, plan arrays and
    /// the abort flag. Later enqueues fail.
    pub(crate) fn shutdown(&self) {
        {
            let mut st = lock(&self.state);
            if st.closed {
                return;
            }
            st.closed = true;
        }
        // After a kernel fault the completion functions never run (CUDA skips host
        // functions once the context faulted): wait briefly only.
        // The watch may not have looked yet: the ordering event tells the same at once.
        let failed =
            self.watch.error().is_some() || self.api.event_query(self.order.event()).is_err();
        let limit = if failed {
            FAILED_DRAIN_LIMIT
        } else {
            DRAIN_LIMIT
        };
        let drained = self.inflight.wait_zero(limit);
        self.watch.stop();
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
        let mut st = lock(&self.state);
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
