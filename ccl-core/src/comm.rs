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
}

/// Looks a declared environment variable up (`Ok(None)` when unset or empty).
type EnvGet<'a> = &'a dyn Fn(&env::Param) -> Result<Option<String>>;

fn env_u64(get: EnvGet<'_>, p: &env::Param) -> Result<Option<u64>> {
    get(p)?.map(|v| env::parse_u64(p, &v)).transpose()
}

impl Tuning {
    /// Reads the process environment and the config (environment wins).
    fn from_env(cfg: &CommConfig) -> Result<Tuning> {
        Self::resolve(cfg, &env::var)
    }

    /// Pure resolution of the channel/buffer settings from `cfg` and the variables `get`
    /// returns: `NCCL_MIN_CTAS` (else `NCCL_MIN_NCHANNELS`, else `cfg.min_ctas`, else 1),
    /// `NCCL_MAX_CTAS` (else `NCCL_MAX_NCHANNELS`, else `cfg.max_ctas`, else 4), both
    /// clamped to 1..=32 with min <= max; `NCCL_BUFFSIZE` (512 B..=1 GiB, default 1 MiB);
    /// `CCLD_PEER_CHECK_MS` (>= 1, default 200).
    fn resolve(cfg: &CommConfig, get: EnvGet<'_>) -> Result<Tuning> {
        let pick = |ctas: &env::Param, nch: &env::Param, c: Option<u32>| -> Result<Option<u64>> {
            Ok(match env_u64(get, ctas)? {
                Some(v) => Some(v),
                None => env_u64(get, nch)?.or(c.map(u64::from)),
            })
        };
        let min = pick(
            &ccl_params::NCCL_MIN_CTAS,
            &ccl_params::NCCL_MIN_NCHANNELS,
            cfg.min_ctas,
        )?
        .unwrap_or(1);
        let max = pick(
            &ccl_params::NCCL_MAX_CTAS,
            &ccl_params::NCCL_MAX_NCHANNELS,
            cfg.max_ctas,
        )?
        .unwrap_or(DEFAULT_MAX_CHANNELS as u64);
        let max = (max.clamp(1, MAX_CHANNELS as u64)) as usize;
        let min = (min.clamp(1, MAX_CHANNELS as u64) as usize).min(max);
        // Bounds (512 B = 8 slots of one cache line, .. 1 GiB) checked by the declaration.
        let buffsize = env_u64(get, &ccl_params::NCCL_BUFFSIZE)?.unwrap_or(DEFAULT_BUFFSIZE as u64);
        let buffsize = buffsize as usize;
        let layout = FifoLayout::for_buffer(buffsize, FIFO_SLOTS)
            .map_err(|e| crate::error::with_context(e, "NCCL_BUFFSIZE"))?;
        // At least 1 (the declaration's bound).
        let peer_check_ms =
            env_u64(get, &ccl_params::CCLD_PEER_CHECK_MS)?.unwrap_or(DEFAULT_PEER_CHECK_MS);
        Ok(Tuning {
            min_channels: min,
            max_channels: max,
            buffsize,
            nslots: FIFO_SLOTS,
            slot_bytes: layout.slot_bytes,
            peer_check: Duration::from_millis(peer_check_ms),
        })
    }

    /// Channels of p2p links.
    pub(crate) fn p2p_channels(&self) -> usize {
        self.max_channels.min(P2P_MAX_CHANNELS)
    }

    fn layout(&self) -> FifoLayout {
        FifoLayout {
            nslots: self.nslots,
            slot_bytes: self.slot_bytes,
        }
    }
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
    fn new_unready(
        nranks: usize,
        rank: usize,
        device: i32,
        uid: UniqueId,
        cfg: CommConfig,
        device_hint: Option<i32>,
    ) -> Result<Comm> {
        let tuning = Tuning::from_env(&cfg)?;
        let probe_off = probe::disabled_from_env().map_err(CclError::InvalidArgument)?;
        // The backend is chosen first: a device communicator's frame lives in mapped memory.
        let dev_pre = crate::device::runtime::select(device_hint, tuning.max_channels, rank)?;
        let (frame, device) = match &dev_pre {
            Some(p) => (Arc::clone(&p.frame), p.device),
            None => (Arc::new(Frame::new(tuning.max_channels)), device),
        };
        frame.set_mode(!probe_off);
        let inject = crate::inject::Injection::from_env()?.map(Arc::new);
        Ok(Comm {
            nranks,
            rank,
            device,
            uid,
            cfg,
            tuning,
            abort_flag: Arc::new(AtomicBool::new(false)),
            life: Mutex::new(Life::Initializing),
            life_cv: Condvar::new(),
            rt: OnceLock::new(),
            init_thread: Mutex::new(None),
            last_error: Mutex::new(None),
            broken: Mutex::new(None),
            frame,
            op_log: Arc::new(OpLog::new()),
            probe_on: !probe_off,
            inject,
            op_counter: Arc::new(AtomicU64::new(0)),
            user_ops: Mutex::new(HashMap::new()),
            next_user_op: AtomicI32::new(FIRST_USER_OP),
            regs: Mutex::new(HashMap::new()),
            next_reg: AtomicUsize::new(1),
            split_seq: AtomicU64::new(0),
            dev_pre: Mutex::new(dev_pre),
            probe_source: OnceLock::new(),
        })
    }

    /// Second half of init, given a bootstrap: checks the host, connects the transport,
    /// starts the worker.
    fn attach(&self, boot: Bootstrap) -> Result<()> {
        let me_host = boot.peer_host_hash(self.rank);
        for r in 0..self.nranks {
            if boot.peer_host_hash(r) != me_host {
                return Err(CclError::usage(format!(
                    "the host backend needs all ranks on one host: rank {r} is on {}, rank {} on {}",
                    boot.peer_host(r),
                    self.rank,
                    boot.peer_host(self.rank)
                )));
            }
        }
        note_algo_proto_env()?;
        self.check_same_tuning(&boot)?;
        self.check_same_backend(&boot)?;
        let pre = self.dev_pre.lock().take();
        if let Some(pre) = pre {
            return self.attach_device(boot, pre);
        }
        let boot = Arc::new(boot);
        let transport = Transport::connect(
            &boot,
            self.tuning.max_channels,
            self.tuning.p2p_channels(),
            self.tuning.layout(),
        )?;
        let bell = Doorbell::new(Arc::clone(transport.bell_region()), 0)?;
        let poison = crate::transport::shm::SharedWord::new(
            Arc::clone(transport.bell_region()),
            crate::channel::POISON_OFFSET,
        )?;
        let comm_hash = boot.comm_hash();
        let source = self.register_probe(&boot, comm_hash, -1)?;
        let shared = Shared {
            rank: self.rank,
            nranks: self.nranks,
            comm_id: comm_hash,
            tuning: self.tuning,
            abort: Arc::clone(&self.abort_flag),
            frame: Arc::clone(&self.frame),
            op_log: Arc::clone(&self.op_log),
            probe_on: self.probe_on,
            op_counter: Arc::clone(&self.op_counter),
            inject: self.inject.clone(),
            source,
        };
        let worker = WorkerHandle::spawn(shared, Arc::clone(&boot), transport)?;
        let rt = Runtime {
            boot,
            comm_hash,
            bell: Some(bell),
            poison: Some(poison),
            worker: Mutex::new(Some(worker)),
            dev: None,
        };
        self.rt
            .set(rt)
            .map_err(|_| CclError::Internal("communicator initialised twice".into()))?;
        tracing::info!(target: "nccl::INIT", rank = self.rank,
            "comm {:#018x} rank {} nRanks {} cudaDev {} nChannels {}..{} buffSize {} name {:?} - Init COMPLETE",
            comm_hash, self.rank, self.nranks, self.device, self.tuning.min_channels,
            self.tuning.max_channels, self.tuning.buffsize,
            self.cfg.comm_name.as_deref().unwrap_or(""));
        Ok(())
    }

    /// Starts the process's diagnostic thread if probing is on, agrees on the analyzer hub
    /// with the other ranks (a collective step: every rank calls it) and registers this
    /// rank's frame and op log; `None` when probing is off.
    fn register_probe(
        &self,
        boot: &Bootstrap,
        comm_hash: u64,
        device: i32,
    ) -> Result<Option<Arc<probe::Source>>> {
        let probing = self.probe_on && probe::start().map_err(CclError::InvalidArgument)?;
        self.agree_on_hub(boot, probing)?;
        if !probing {
            return Ok(None);
        }
        let n = self.nranks as u32;
        let r = self.rank as u32;
        let source = probe::register(
            probe::Identity {
                comm_id: comm_hash,
                rank: r,
                nranks: n,
                device,
                ring_prev: (r + n - 1) % n,
                ring_next: (r + 1) % n,
            },
            Arc::clone(&self.frame),
            Arc::clone(&self.op_log),
        );
        let _ = self.probe_source.set(Arc::downgrade(&source));
        Ok(Some(source))
    }

    /// [`Comm::attach`] for the device backend: probe registration as on the host backend,
    /// then the device FIFOs instead of the shared-memory transport and worker.
    fn attach_device(&self, boot: Bootstrap, pre: DevicePre) -> Result<()> {
        let boot = Arc::new(boot);
        let comm_hash = boot.comm_hash();
        let device = pre.device;
        let source = self.register_probe(&boot, comm_hash, device)?;
        let dev = DeviceComm::attach(AttachArgs {
            pre,
            boot: Arc::clone(&boot),
            tuning: self.tuning,
            abort: Arc::clone(&self.abort_flag),
            op_log: Arc::clone(&self.op_log),
            probe_on: self.probe_on,
            op_counter: Arc::clone(&self.op_counter),
            inject: self.inject.clone(),
            source,
        })?;
        let rt = Runtime {
            boot,
            comm_hash,
            bell: None,
            poison: None,
            worker: Mutex::new(None),
            dev: Some(Arc::new(dev)),
        };
        self.rt
            .set(rt)
            .map_err(|_| CclError::Internal("communicator initialised twice".into()))?;
        tracing::info!(target: "nccl::INIT", rank = self.rank,
            "comm {:#018x} rank {} nRanks {} cudaDev {} nChannels {}..{} buffSize {} name {:?} backend device - Init COMPLETE",
            comm_hash, self.rank, self.nranks, self.device, self.tuning.min_channels,
            self.tuning.max_channels, self.tuning.buffsize,
            self.cfg.comm_name.as_deref().unwrap_or(""));
        Ok(())
    }

    /// A communicator spanning several processes agrees on the job's embedded analyzer hub
    /// (`probe::hub`): one allgather of what each rank wants and knows, and when nobody
    /// knows a hub yet, a second one in which the elected ranks (the lowest that wants a
    /// hub, normally 0, and the lowest wanting one in another process, the standby)
    /// announce the hubs they started. Both rounds are bounded by the
    /// bootstrap timeout and abort-aware; only a bootstrap failure (or a malformed
    /// `CCLD_*` variable) fails init, a hub that cannot start leaves the processes on their
    /// local engines. A communicator whose ranks all live in this process does nothing.
    fn agree_on_hub(&self, boot: &Bootstrap, probing: bool) -> Result<()> {
        use probe::hub::{self, Contribution, Plan};
        let me = (boot.peer_host_hash(self.rank), boot.peer_pid(self.rank));
        if (0..self.nranks).all(|r| (boot.peer_host_hash(r), boot.peer_pid(r)) == me) {
            return Ok(());
        }
        let wanted = probing && hub::wanted().map_err(CclError::InvalidArgument)?;
        let mine = if wanted {
            Contribution::Wanted(hub::known())
        } else {
            Contribution::NotWanted
        };
        let all: Vec<Contribution> = boot
            .allgather(&mine.encode())?
            .iter()
            .enumerate()
            .map(|(r, b)| {
                // Every rank decodes the same bytes, so every rank reads junk alike.
                Contribution::decode(b).unwrap_or_else(|e| {
                    tracing::debug!(target: "nccl::INIT", rank = self.rank,
                        "CCL-D hub agreement: rank {r} sent {e}; ignoring it");
                    Contribution::NotWanted
                })
            })
            .collect();
        let procs: Vec<(u64, u32)> = (0..self.nranks)
            .map(|r| (boot.peer_host_hash(r), boot.peer_pid(r)))
            .collect();
        match hub::plan(&all, &procs) {
            Plan::Nothing => {}
            Plan::Adopt(hubs) => {
                if wanted {
                    hub::adopt(hubs);
                }
            }
            Plan::Elect { starter, standby } => {
                // The primary's starter and the standby's each start a hub and announce it.
                let announce = if starter == self.rank || standby == Some(self.rank) {
                    let ip = boot.listen_addr().ip();
                    let ip = if ip.is_unspecified() {
                        boot.peer_addr(self.rank).map_or(ip, |a| a.ip())
                    } else {
                        ip
                    };
                    match hub::start(ip) {
                        Ok(a) => a.to_string().into_bytes(),
                        Err(e) => {
                            tracing::warn!(target: "nccl::INIT", rank = self.rank,
                                "CCL-D: {e}; the job's other hub (if any) analyses, else every process locally");
                            Vec::new()
                        }
                    }
                } else {
                    Vec::new()
                };
                let got = boot.allgather(&announce)?;
                let from_standby = standby.and_then(|s| got.get(s)).map(Vec::as_slice);
                match got
                    .get(starter)
                    .and_then(|b| hub::announced(b, from_standby))
                {
                    Some(hubs) if wanted => {
                        hub::adopt(hubs);
                    }
                    Some(_) => {}
                    None => {
                        tracing::debug!(target: "nccl::INIT", rank = self.rank,
                            "CCL-D: no analyzer hub started; local analysis only");
                    }
                }
            }
        }
        Ok(())
    }

    /// Every rank must use the same FIFO layout and channel bounds (schedules and segment
    /// layouts depend on them): compares them over the bootstrap.
    fn check_same_tuning(&self, boot: &Bootstrap) -> Result<()> {
        let t = &self.tuning;
        let mine: Vec<u8> = [t.buffsize, t.min_channels, t.max_channels]
            .iter()
            .flat_map(|v| (*v as u64).to_le_bytes())
            .collect();
        for (r, theirs) in boot.allgather(&mine)?.iter().enumerate() {
            if *theirs != mine {
                let vals: Vec<u64> = theirs
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect();
                return Err(CclError::usage(format!(
                    "rank {r} uses NCCL_BUFFSIZE/min/max channels {vals:?}, rank {} uses [{}, {}, {}]: set the same NCCL_BUFFSIZE, NCCL_MIN_CTAS/NCCL_MAX_CTAS and config on every rank",
                    self.rank, t.buffsize, t.min_channels, t.max_channels
                )));
            }
        }
        Ok(())
    }

    /// Every rank must have chosen the same backend (issue 15, blocker 2): one allgather.
    fn check_same_backend(&self, boot: &Bootstrap) -> Result<()> {
        use crate::device::agree::{check_agreement, BackendCode};
        let code = match &*self.dev_pre.lock() {
            None => BackendCode::Host,
            Some(p) if p.api.is_emulated() => BackendCode::Emulated,
            Some(_) => BackendCode::Cuda,
        };
        check_agreement(&boot.allgather(&[code as u8])?, self.rank)
    }

    fn set_life(&self, l: Life) {
        *self.life.lock() = l;
        self.life_cv.notify_all();
    }

    fn finish_init(self: &Arc<Self>, r: Result<()>) -> Result<()> {
        match r {
            Ok(()) => {
                {
                    let mut reg = registry().lock();
                    reg.retain(|w| w.strong_count() > 0);
                    reg.push(Arc::downgrade(self));
                }
                let mut g = self.life.lock();
                if matches!(*g, Life::Initializing) {
                    *g = Life::Ready;
                }
                self.life_cv.notify_all();
                Ok(())
            }
            Err(e) => {
                tracing::warn!(target: "nccl::INIT", rank = self.rank, "init failed: {e}");
                self.record_error(&e);
                self.set_life(Life::Failed(e.clone()));
                Err(e)
            }
        }
    }

    fn init_with(self: &Arc<Self>, blocking: bool) -> Result<()> {
        let run = |c: &Comm| -> Result<()> {
            let timeout = bootstrap::default_timeout()?;
            let boot =
                Bootstrap::init(&c.uid, c.nranks, c.rank, Arc::clone(&c.abort_flag), timeout)?;
            c.attach(boot)
        };
        if blocking {
            let r = run(self);
            self.finish_init(r)
        } else {
            let me = Arc::clone(self);
            let h = std::thread::Builder::new()
                .name(format!("ccl-init-r{}", self.rank))
                .spawn(move || {
                    let r = run(&me);
                    let _ = me.finish_init(r);
                })
                .map_err(|e| CclError::sys("spawning the init thread", e))?;
            *self.init_thread.lock() = Some(h);
            Ok(())
        }
    }

    /// `ncclCommInitRank(Config)`. With `cfg.blocking == Some(false)` it returns at once a
    /// communicator whose [`Comm::async_error`] is `Err(InProgress)` until init finishes.
    pub fn init_rank(nranks: i32, id: UniqueId, rank: i32, cfg: CommConfig) -> Result<Arc<Comm>> {
        Self::init_rank_dev(nranks, id, rank, cfg, 0, None)
    }

    /// `ncclCommInitRank(Config)` called inside a group (see [`crate::group::init_rank`]):
    /// the backend and device are chosen now, on the calling thread (NCCL programs call
    /// `cudaSetDevice` before each grouped init), and the rest of init (bootstrap, FIFOs)
    /// runs on an init thread, so one thread can create several ranks of one communicator.
    /// Returns the communicator and whether the caller asked for a blocking one (the
    /// outermost `ncclGroupEnd` then waits for it with [`Comm::wait_init_result`]).
    pub(crate) fn init_rank_in_group(
        nranks: i32,
        id: UniqueId,
        rank: i32,
        cfg: CommConfig,
    ) -> Result<(Arc<Comm>, bool)> {
        let blocking = blocking(&cfg)?;
        let comm = Self::init_rank_inner(nranks, id, rank, cfg, 0, None, false)?;
        Ok((comm, blocking))
    }

    /// Waits until init finished (successfully or not) and returns its outcome.
    pub(crate) fn wait_init_result(&self) -> Result<()> {
        self.wait_init();
        match &*self.life.lock() {
            Life::Failed(e) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    fn init_rank_dev(
        nranks: i32,
        id: UniqueId,
        rank: i32,
        cfg: CommConfig,
        device: i32,
        device_hint: Option<i32>,
    ) -> Result<Arc<Comm>> {
        let blocking = blocking(&cfg)?;
        Self::init_rank_inner(nranks, id, rank, cfg, device, device_hint, blocking)
    }

    fn init_rank_inner(
        nranks: i32,
        id: UniqueId,
        rank: i32,
        cfg: CommConfig,
        device: i32,
        device_hint: Option<i32>,
        blocking: bool,
    ) -> Result<Arc<Comm>> {
        if nranks < 1 {
            return Err(CclError::arg(format!("nranks {nranks} must be at least 1")));
        }
        if rank < 0 || rank >= nranks {
            return Err(CclError::arg(format!(
                "rank {rank} is out of range for nranks {nranks}"
            )));
        }
        let comm = Arc::new(Comm::new_unready(
            nranks as usize,
            rank as usize,
            device,
            id,
            cfg,
            device_hint,
        )?);
        comm.init_with(blocking)?;
        Ok(comm)
    }

    /// `ncclCommInitAll`: `ndev` ranks as threads of this process, rank i on `devlist[i]`
    /// (or device i).
    pub fn init_all(ndev: i32, devlist: Option<Vec<i32>>) -> Result<Vec<Arc<Comm>>> {
        if ndev < 1 {
            return Err(CclError::arg(format!("ndev {ndev} must be at least 1")));
        }
        if let Some(d) = &devlist {
            if d.len() < ndev as usize {
                return Err(CclError::arg(format!(
                    "devlist has {} entries for ndev {ndev}",
                    d.len()
                )));
            }
            if let Some(bad) = d.iter().take(ndev as usize).find(|v| **v < 0) {
                return Err(CclError::arg(format!("invalid device {bad} in devlist")));
            }
        }
        let id = bootstrap::get_unique_id()?;
        let handles: Vec<_> = (0..ndev)
            .map(|r| {
                let dev = devlist.as_ref().map_or(r, |d| d[r as usize]);
                std::thread::Builder::new()
                    .name(format!("ccl-initall-r{r}"))
                    .spawn(move || {
                        let cfg = CommConfig {
                            blocking: Some(true),
                            ..CommConfig::default()
                        };
                        Comm::init_rank_dev(ndev, id, r, cfg, dev, Some(dev))
                    })
                    .map_err(|e| CclError::sys("spawning an init thread", e))
            })
            .collect();
        let mut comms = Vec::with_capacity(ndev as usize);
        let mut first_err = None;
        for h in handles {
            let r = match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(CclError::Internal("init thread panicked".into()))),
                Err(e) => Err(e),
            };
            match r {
                Ok(c) => comms.push(c),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(comms),
            Some(e) => {
                for c in &comms {
                    let _ = c.abort();
                }
                Err(e)
            }
        }
    }

    /// `ncclCommSplit`; `Ok(None)` for `NCCL_SPLIT_NOCOLOR`.
    pub fn split(
        self: &Arc<Self>,
        color: i32,
        key: i32,
        cfg: CommConfig,
    ) -> Result<Option<Arc<Comm>>> {
        if color < SPLIT_NOCOLOR {
            return Err(CclError::arg(format!(
                "split color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR (-1)"
            )));
        }
        let rt = self.ready_runtime()?;
        let mut mine = Vec::with_capacity(8);
        mine.extend_from_slice(&color.to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = rt.boot.allgather(&mine)?;
        let seq = self.split_seq.fetch_add(1, Ordering::AcqRel);
        if color == SPLIT_NOCOLOR {
            return Ok(None);
        }
        let mut members: Vec<(i32, usize)> = Vec::new();
        for (r, b) in all.iter().enumerate() {
            let (c, k) = match b.as_slice() {
                [c0, c1, c2, c3, k0, k1, k2, k3] => (
                    i32::from_le_bytes([*c0, *c1, *c2, *c3]),
                    i32::from_le_bytes([*k0, *k1, *k2, *k3]),
                ),
                _ => {
                    return Err(CclError::Remote(format!(
                        "split: rank {r} sent {} bytes of (color, key)",
                        b.len()
                    )))
                }
            };
            if c == color {
                members.push((k, r));
            }
        }
        members.sort_unstable();
        let members: Vec<usize> = members.into_iter().map(|(_, r)| r).collect();
        let new_rank = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| CclError::Internal("split: this rank is not a member".into()))?;
        let lineage = mix64(mix64(seq) ^ u64::from(color as u32));
        let child_boot = rt.boot.split(&members, lineage)?;
        let cfg = cfg.or(&self.cfg);
        let child = Arc::new(Comm::new_unready(
            members.len(),
            new_rank,
            self.device,
            self.uid,
            cfg,
            Some(self.device),
        )?);
        let r = child.attach(child_boot);
        child.finish_init(r)?;
        tracing::info!(target: "nccl::INIT", rank = self.rank,
            "comm {:#018x} split color {color} key {key} -> rank {new_rank} of {}",
            rt.comm_hash, members.len());
        Ok(Some(child))
    }

    /// `ncclCommFinalize`: completes outstanding operations.
    pub fn finalize(&self) -> Result<()> {
        self.wait_init();
        self.async_error()?;
        let mut g = self.life.lock();
        match &*g {
            Life::Ready => {
                *g = Life::Finalized;
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
        // A peer that detected an inconsistent call poisoned this rank: the communicator is
        // unusable even if this rank's own operations completed.
        if let Some(e) = self
            .rt
            .get()
            .and_then(|rt| rt.poison.as_ref())
            .and_then(|w| crate::desc::poison_error(w, self.rank, None))
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

    fn fail<T>(&self, e: CclError) -> Result<T> {
        self.record_error(&e);
        Err(e)
    }

    pub(crate) fn mark_broken(&self, e: &CclError) {
        let mut b = self.broken.lock();
        if b.is_none() {
            *b = Some(e.clone());
        }
    }

    pub(crate) fn user_op(&self, op: i32) -> Option<UserOp> {
        self.user_ops.lock().get(&op).cloned()
    }

    pub(crate) fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// Ok when operations may be issued.
    pub(crate) fn usable(&self) -> Result<()> {
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
    pub(crate) fn run_inline(&self, items: Vec<crate::op::WorkItem>) -> Result<()> {
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
mod tests {
    use super::*;

    fn resolve(cfg: &CommConfig, vars: &[(&str, &str)]) -> Result<Tuning> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Tuning::resolve(cfg, &move |p: &env::Param| {
            Ok(vars
                .iter()
                .find(|(k, _)| *k == p.name)
                .map(|(_, v)| v.clone()))
        })
    }

    #[test]
    fn defaults() {
        let t = resolve(&CommConfig::default(), &[]).unwrap();
        assert_eq!((t.min_channels, t.max_channels), (1, DEFAULT_MAX_CHANNELS));
        assert_eq!(t.buffsize, DEFAULT_BUFFSIZE);
        assert_eq!(t.slot_bytes, DEFAULT_BUFFSIZE / FIFO_SLOTS);
        assert_eq!(t.peer_check, Duration::from_millis(DEFAULT_PEER_CHECK_MS));
    }

    #[test]
    fn channel_bounds_env_over_config_and_clamped() {
        let cfg = CommConfig {
            min_ctas: Some(2),
            max_ctas: Some(6),
            ..CommConfig::default()
        };
        let t = resolve(&cfg, &[]).unwrap();
        assert_eq!((t.min_channels, t.max_channels), (2, 6));
        let t = resolve(
            &cfg,
            &[("NCCL_MAX_NCHANNELS", "3"), ("NCCL_MIN_NCHANNELS", "3")],
        )
        .unwrap();
        assert_eq!((t.min_channels, t.max_channels), (3, 3));
        // The CTAS names win over the deprecated NCHANNELS names.
        let t = resolve(&cfg, &[("NCCL_MAX_CTAS", "8"), ("NCCL_MAX_NCHANNELS", "3")]).unwrap();
        assert_eq!(t.max_channels, 8);
        let t = resolve(&cfg, &[("NCCL_MAX_CTAS", "1000"), ("NCCL_MIN_CTAS", "0")]).unwrap();
        assert_eq!((t.min_channels, t.max_channels), (1, MAX_CHANNELS));
        // min above max is lowered to max.
        let t = resolve(&cfg, &[("NCCL_MIN_CTAS", "9"), ("NCCL_MAX_CTAS", "4")]).unwrap();
        assert_eq!((t.min_channels, t.max_channels), (4, 4));
    }

    #[test]
    fn malformed_or_out_of_range_values_name_the_variable() {
        for (k, v) in [
            ("NCCL_MIN_CTAS", "x"),
            ("NCCL_MAX_NCHANNELS", "-1"),
            ("NCCL_BUFFSIZE", "100"),
            ("NCCL_BUFFSIZE", "2G"),
            ("NCCL_BUFFSIZE", "1.5M"),
            ("CCLD_PEER_CHECK_MS", "0"),
            ("CCLD_PEER_CHECK_MS", "soon"),
        ] {
            let e = resolve(&CommConfig::default(), &[(k, v)]).unwrap_err();
            assert_eq!(e.code(), crate::types::ResultCode::InvalidArgument);
            assert!(e.to_string().contains(k), "{e}");
        }
        let t = resolve(&CommConfig::default(), &[("NCCL_BUFFSIZE", "64K")]).unwrap();
        assert_eq!(t.slot_bytes, 8192);
        let t = resolve(&CommConfig::default(), &[("NCCL_BUFFSIZE", "1000")]).unwrap();
        assert_eq!(t.slot_bytes, 64, "rounded down to whole cache lines");
    }

    #[test]
    fn split_lineage_differs_per_color_and_sequence() {
        let l = |seq: u64, color: i32| mix64(mix64(seq) ^ u64::from(color as u32));
        assert_ne!(l(0, 0), l(0, 1));
        assert_ne!(l(0, 0), l(1, 0));
        assert_eq!(l(3, 7), l(3, 7));
    }

    #[test]
    fn config_inherits_unset_fields_from_the_parent() {
        let parent = CommConfig {
            blocking: Some(false),
            max_ctas: Some(7),
            comm_name: Some("p".into()),
            ..CommConfig::default()
        };
        let child = CommConfig {
            max_ctas: Some(2),
            ..CommConfig::default()
        }
        .or(&parent);
        assert_eq!(child.blocking, Some(false));
        assert_eq!(child.max_ctas, Some(2));
        assert_eq!(child.comm_name.as_deref(), Some("p"));
    }
}
