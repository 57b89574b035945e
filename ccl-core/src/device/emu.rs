//! A CPU emulation of the device ABI (`kernels/include/ccl_device.h`), in one process: a
//! testing aid (`CCLD_DEVICE_EMULATION=1`) that lets the device runtime above the raw
//! CUDA calls run in CI without a GPU. It is not a performance path.
//!
//! - "Device memory" is zeroed, 256-byte aligned host memory, tracked so that
//!   [`DeviceApi::pointer_info`] answers (with the allocating thread's current device);
//!   mapped and registered host memory is pinned host memory whose device address equals
//!   its host address. Peer access is recorded per (device, peer) pair.
//! - A stream is a worker thread executing its queued commands in order; query and
//!   synchronize are real. Stream 0 stands for a per-device default stream
//!   ([`DeviceApi::default_stream`]).
//! - `launch_plan` validates the plan and runs, on the stream, the kernel source itself
//!   compiled for the CPU ([`super::emu_kernel`], `kernels::sim`: one OS thread per CUDA
//!   thread). With `CCLD_EMU_KERNEL=rust` it runs instead the Rust re-implementation
//!   below, an independent second implementation of the same rules: the plan is
//!   validated and its arrays copied at launch; on the stream, local steps first, then one
//!   thread per channel running that channel's lanes round-robin (never blocking on one
//!   lane while another can progress); the FIFO protocol on the connections' `tail` /
//!   `head` counters (atomics in emulated device memory shared by the ranks of the
//!   process; message k in slot k mod nslots); after every step the channel's absolute
//!   SendCount / RecvCount are stored into the frame at `CCL_FRAME_SEND_OFFSET`; the abort
//!   flag is polled while idle. Wait time is accounted like the kernel (and the host
//!   executor's `WaitEpisode`): a channel's passes without a runnable lane, timed from the
//!   second one with the host's monotonic clock, charged when progress resumes to the
//!   blocked lanes' reasons (inbound missing = upstream; no free outbound slot or throttled
//!   = downstream), cumulative ns stored at `CCL_FRAME_WAIT_OFFSET`. Injected faults of the
//!   plan: throttled lanes (`CCL_LANE_THROTTLED`, `throttle_gap_ns` per channel) and
//!   stalls (`stall_channel` / `stall_after`: the lanes stop and the channel spins until
//!   abort). Element arithmetic is ccl-core's [`Reducer`], rebuilt from
//!   the plan's dtype / op / scalar / divisor, so results are bit-identical to the host
//!   backend's.
//! - IPC is not supported (a clear error; `supports_ipc` is false). `host_register` is an
//!   identity alias with tracked registrations, so ranks in other processes (each with its
//!   own emulated device) communicate through host-staged shared-memory FIFOs.
//! - `free` / `host_free` do not block, but CUDA's `cudaFree` / `cudaFreeHost` synchronize
//!   the whole device; the emulator counts, per calling thread, the frees made while any
//!   stream had queued or running work ([`busy_frees_on_this_thread`]): each would have
//!   waited for every kernel on a real device (a deadlock when the kernels wait for this
//!   thread's next launch). Tests assert the runtime makes none.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use kernels::ffi::{
    ccl_dev_conn_t, ccl_dev_lane_t, ccl_dev_local_t, ccl_dev_plan_t, ccl_dev_step_t,
    frame_send_offset, frame_wait_offset, CCL_LANE_THROTTLED, CCL_LOCAL_COPY, CCL_LOCAL_REDUCE,
    CCL_MAX_BUFS, CCL_MAX_CHANNELS, CCL_MAX_LANES_PER_CHANNEL, CCL_OP_MAX, CCL_OP_MIN,
    CCL_OP_PREMUL, CCL_OP_PROD, CCL_OP_SUM, CCL_PROTO_LL, CCL_PROTO_SIMPLE, CCL_STALL_ALL,
    CCL_STALL_NONE, CCL_STEP_RECV, CCL_STEP_RECV_COPY_SEND, CCL_STEP_RECV_REDUCE_COPY,
    CCL_STEP_RECV_REDUCE_COPY_SEND, CCL_STEP_RECV_REDUCE_SEND, CCL_STEP_SEND,
};

use super::api::{DeviceApi, HostFn, IpcHandle, Mapped, PtrInfo, PtrKind, Stream};
use super::emu_kernel::{emu_kernel, EmuKernel, SourceKernel};
use crate::error::{CclError, Result};
use crate::reduce::Reducer;
use crate::types::{DataType, RedOpKind};

/// Alignment of emulated allocations (cudaMalloc gives at least 256).
const ALIGN: usize = 256;

thread_local! {
    static CURRENT: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    static BUSY_FREES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static ALLOCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static LAUNCHES: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
    static IMPLS: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// Plans this thread launched per kernel implementation: (kernel source, Rust
/// re-implementation). Tests check which one ran.
pub fn kernel_impls_on_this_thread() -> (usize, usize) {
    IMPLS.with(|c| c.get())
}

/// Plans this thread launched: (Simple, LL). Tests check which protocol the runtime used.
pub fn launches_on_this_thread() -> (usize, usize) {
    LAUNCHES.with(|c| c.get())
}

/// Allocations (device and mapped) this thread made, for tests that check reuse.
pub fn allocations_on_this_thread() -> usize {
    ALLOCS.with(|c| c.get())
}

/// Frees this thread made while some stream had work queued or running (each one a whole
/// device synchronization on CUDA).
pub fn busy_frees_on_this_thread() -> usize {
    BUSY_FREES.with(|c| c.get())
}

#[derive(Debug, Clone, Copy)]
struct Alloc {
    len: usize,
    mapped: bool,
    /// The current device of the allocating thread.
    device: i32,
}

/// One emulated stream: a worker thread running queued commands in order.
struct EmuStream {
    q: Mutex<StreamQ>,
    cv: Condvar,
}

#[derive(Default)]
struct StreamQ {
    cmds: VecDeque<HostFn>,
    /// Commands queued and not finished (the one running included).
    pending: usize,
    stop: bool,
}

impl std::fmt::Debug for EmuStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EmuStream")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a thread panicked holding it; the queue state is plain.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EmuStream {
    fn start(id: usize) -> Result<Arc<EmuStream>> {
        let s = Arc::new(EmuStream {
            q: Mutex::new(StreamQ::default()),
            cv: Condvar::new(),
        });
        let me = Arc::clone(&s);
        std::thread::Builder::new()
            .name(format!("ccl-emu-stream-{id:#x}"))
            .spawn(move || me.run())
            .map_err(|e| CclError::sys("emulated device: spawning a stream thread", e))?;
        Ok(s)
    }

    fn run(&self) {
        loop {
            let cmd = {
                let mut g = lock(&self.q);
                loop {
                    if let Some(c) = g.cmds.pop_front() {
                        kernels::sim::hb_acquire(self.hb());
                        break c;
                    }
                    if g.stop {
                        return;
                    }
                    g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
                }
            };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(cmd)).is_err() {
                tracing::error!(target: "nccl::COLL", "emulated device: a stream command panicked");
            }
            let mut g = lock(&self.q);
            g.pending -= 1;
            kernels::sim::hb_release(self.hb());
            self.cv.notify_all();
        }
    }

    fn push(&self, cmd: HostFn) -> Result<()> {
        let mut g = lock(&self.q);
        if g.stop {
            return Err(CclError::usage("emulated device: stream was destroyed"));
        }
        g.cmds.push_back(cmd);
        g.pending += 1;
        kernels::sim::hb_release(self.hb());
        self.cv.notify_all();
        Ok(())
    }

    fn idle(&self) -> bool {
        let idle = lock(&self.q).pending == 0;
        if idle {
            kernels::sim::hb_acquire(self.hb());
        }
        idle
    }

    fn sync(&self) {
        let mut g = lock(&self.q);
        while g.pending > 0 {
            g = self.cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        kernels::sim::hb_acquire(self.hb());
    }

    /// The stream's synchronisation address for ThreadSanitizer (the queue's mutex
    /// orders commands and completion; TSan does not see Rust's futex-based locks).
    fn hb(&self) -> usize {
        &self.q as *const Mutex<StreamQ> as usize
    }

    fn stop(&self) {
        lock(&self.q).stop = true;
        self.cv.notify_all();
    }
}

/// The emulated device (all "devices" of the process share one instance, see [`global`]).
#[derive(Debug, Default)]
pub struct EmuDevice {
    allocs: Mutex<BTreeMap<usize, Alloc>>,
    streams: Mutex<HashMap<usize, Arc<EmuStream>>>,
    defaults: Mutex<HashMap<i32, usize>>,
    next_stream: AtomicUsize,
    /// Host ranges registered with `host_register`: start -> length.
    registered: Mutex<BTreeMap<usize, usize>>,
    /// (device, peer) pairs with peer access enabled.
    peer_access: Mutex<std::collections::HashSet<(i32, i32)>>,
}

/// The process's emulated device.
pub fn global() -> Arc<EmuDevice> {
    static G: OnceLock<Arc<EmuDevice>> = OnceLock::new();
    Arc::clone(G.get_or_init(|| Arc::new(EmuDevice::default())))
}

impl EmuDevice {
    fn alloc(&self, bytes: usize, mapped: bool) -> Result<usize> {
        let layout = std::alloc::Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|_| CclError::arg(format!("emulated device: allocation of {bytes} bytes")))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(CclError::System(format!(
                "emulated device: out of memory allocating {bytes} bytes"
            )));
        }
        ALLOCS.with(|c| c.set(c.get() + 1));
        lock(&self.allocs).insert(
            p as usize,
            Alloc {
                len: bytes.max(1),
                mapped,
                device: CURRENT.with(|c| c.get()),
            },
        );
        Ok(p as usize)
    }

    fn dealloc(&self, p: usize, mapped: bool, call: &str) -> Result<()> {
        if p == 0 {
            return Ok(());
        }
        if lock(&self.streams).values().any(|s| !s.idle()) {
            BUSY_FREES.with(|c| c.set(c.get() + 1));
        }
        let mut g = lock(&self.allocs);
        match g.get(&p) {
            Some(a) if a.mapped == mapped => {
                let a = *a;
                g.remove(&p);
                drop(g);
                let layout = std::alloc::Layout::from_size_align(a.len, ALIGN)
                    .map_err(|_| CclError::Internal("emulated device: bad layout".into()))?;
                // SAFETY: `p` was allocated by `alloc` with this layout and is removed from
                // the table, so it is freed once.
                unsafe { std::alloc::dealloc(p as *mut u8, layout) };
                Ok(())
            }
            _ => Err(CclError::arg(format!(
                "emulated device: {call}({p:#x}): not an allocation of this kind"
            ))),
        }
    }

    fn stream(&self, s: Stream) -> Result<Arc<EmuStream>> {
        let s = if s == 0 {
            self.default_stream(CURRENT.with(|c| c.get()))?
        } else {
            s
        };
        lock(&self.streams)
            .get(&s)
            .cloned()
            .ok_or_else(|| CclError::arg(format!("emulated device: unknown stream {s:#x}")))
    }

    /// Bytes allocated and not freed (device + mapped), for leak checks in tests.
    pub fn live_allocations(&self) -> usize {
        lock(&self.allocs).len()
    }

    /// Host ranges registered ([`DeviceApi::host_register`]) and not unregistered, for leak
    /// checks in tests.
    pub fn live_registrations(&self) -> usize {
        lock(&self.registered).len()
    }

    /// Whether kernels on `device` were allowed to reach `peer`'s memory
    /// ([`DeviceApi::enable_peer_access`]).
    pub fn peer_access_enabled(&self, device: i32, peer: i32) -> bool {
        lock(&self.peer_access).contains(&(device, peer))
    }
}

impl DeviceApi for EmuDevice {
    fn name(&self) -> &'static str {
        "emulated"
    }

    fn is_emulated(&self) -> bool {
        true
    }

    fn device_count(&self) -> Result<usize> {
        Ok(CCL_MAX_CHANNELS)
    }

    fn current_device(&self) -> Result<i32> {
        Ok(CURRENT.with(|c| c.get()))
    }

    fn set_device(&self, device: i32) -> Result<()> {
        if device < 0 {
            return Err(CclError::arg(format!("emulated device: device {device}")));
        }
        CURRENT.with(|c| c.set(device));
        Ok(())
    }

    fn pointer_info(&self, p: usize) -> Result<PtrInfo> {
        let alloc = {
            let g = lock(&self.allocs);
            g.range(..=p)
                .next_back()
                .filter(|(base, a)| p < *base + a.len)
                .map(|(_, a)| *a)
        };
        let registered = {
            let g = lock(&self.registered);
            g.range(..=p)
                .next_back()
                .is_some_and(|(base, len)| p < base + len)
        };
        // Device addresses are host addresses here.
        Ok(match alloc {
            Some(a) if !a.mapped => PtrInfo {
                kind: PtrKind::Device,
                device: a.device,
                device_ptr: p,
            },
            Some(_) => PtrInfo {
                kind: PtrKind::HostPinned,
                device: -1,
                device_ptr: p,
            },
            None if registered => PtrInfo {
                kind: PtrKind::HostPinned,
                device: -1,
                device_ptr: p,
            },
            None => PtrInfo {
                kind: PtrKind::Host,
                device: -1,
                device_ptr: 0,
            },
        })
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        if device < 0 || peer < 0 {
            return Err(CclError::arg(format!(
                "emulated device: can_access_peer({device}, {peer})"
            )));
        }
        Ok(true)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        let dev = CURRENT.with(|c| c.get());
        if peer < 0 || peer == dev {
            return Err(CclError::arg(format!(
                "emulated device: enable_peer_access({peer}) from device {dev}"
            )));
        }
        lock(&self.peer_access).insert((dev, peer));
        Ok(())
    }

    fn host_alloc_mapped(&self, bytes: usize) -> Result<Mapped> {
        let p = self.alloc(bytes, true)?;
        Ok(Mapped { host: p, dev: p })
    }

    fn host_free(&self, host: usize) -> Result<()> {
        self.dealloc(host, true, "host_free")
    }

    fn malloc(&self, bytes: usize) -> Result<usize> {
        self.alloc(bytes, false)
    }

    fn free(&self, p: usize) -> Result<()> {
        self.dealloc(p, false, "free")
    }

    unsafe fn memset(&self, p: usize, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { std::ptr::write_bytes(p as *mut u8, value, bytes) };
        Ok(())
    }

    unsafe fn memcpy(&self, dst: usize, src: usize, bytes: usize) -> Result<()> {
        if bytes > 0 && dst != src {
            // SAFETY: forwarded to the caller's contract; ptr::copy allows overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        }
        Ok(())
    }

    unsafe fn memcpy_async(&self, dst: usize, src: usize, bytes: usize, s: Stream) -> Result<()> {
        self.stream(s)?.push(Box::new(move || {
            if bytes > 0 && dst != src {
                // SAFETY: the caller keeps both ranges valid until the copy ran.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
            }
        }))
    }

    fn ipc_get(&self, _p: usize) -> Result<IpcHandle> {
        Err(ipc_unsupported())
    }

    fn ipc_open(&self, _h: &IpcHandle) -> Result<usize> {
        Err(ipc_unsupported())
    }

    fn ipc_close(&self, _p: usize) -> Result<()> {
        Err(ipc_unsupported())
    }

    fn supports_ipc(&self) -> bool {
        false
    }

    /// Identity alias (the emulated device addresses host memory directly); overlapping or
    /// empty ranges are refused like `cudaHostRegister` refuses them.
    fn host_register(&self, host: usize, bytes: usize) -> Result<usize> {
        if host == 0 || bytes == 0 {
            return Err(CclError::arg(format!(
                "emulated device: host_register({host:#x}, {bytes}): NULL or empty range"
            )));
        }
        let end = host.checked_add(bytes).ok_or_else(|| {
            CclError::arg(format!(
                "emulated device: host_register({host:#x}, {bytes}): range overflows"
            ))
        })?;
        let mut g = lock(&self.registered);
        let before = g.range(..end).next_back();
        if let Some((b, l)) = before.filter(|(b, l)| **b + **l > host) {
            return Err(CclError::arg(format!(
                "emulated device: host_register({host:#x}, {bytes}): overlaps the registered \
                 range {b:#x}+{l} (cudaErrorHostMemoryAlreadyRegistered)"
            )));
        }
        g.insert(host, bytes);
        Ok(host)
    }

    fn host_unregister(&self, host: usize) -> Result<()> {
        match lock(&self.registered).remove(&host) {
            Some(_) => Ok(()),
            None => Err(CclError::arg(format!(
                "emulated device: host_unregister({host:#x}): not registered \
                 (cudaErrorHostMemoryNotRegistered)"
            ))),
        }
    }

    fn default_stream(&self, device: i32) -> Result<Stream> {
        let mut d = lock(&self.defaults);
        if let Some(s) = d.get(&device) {
            return Ok(*s);
        }
        let s = self.stream_create()?;
        d.insert(device, s);
        Ok(s)
    }

    fn stream_create(&self) -> Result<Stream> {
        // Handles look like (non-null, aligned) pointers.
        let id = 0x1000 + 0x10 * self.next_stream.fetch_add(1, Ordering::Relaxed);
        let s = EmuStream::start(id)?;
        lock(&self.streams).insert(id, s);
        Ok(id)
    }

    fn stream_destroy(&self, s: Stream) -> Result<()> {
        if lock(&self.defaults).values().any(|d| *d == s) {
            return Err(CclError::arg(
                "emulated device: a default stream cannot be destroyed",
            ));
        }
        let st = lock(&self.streams)
            .remove(&s)
            .ok_or_else(|| CclError::arg(format!("emulated device: unknown stream {s:#x}")))?;
        // Like cudaStreamDestroy: returns at once; queued work still runs.
        st.stop();
        Ok(())
    }

    fn stream_query(&self, s: Stream) -> Result<bool> {
        Ok(self.stream(s)?.idle())
    }

    fn stream_synchronize(&self, s: Stream) -> Result<()> {
        self.stream(s)?.sync();
        Ok(())
    }

    fn launch_host_fn(&self, s: Stream, f: HostFn) -> Result<()> {
        self.stream(s)?.push(f)
    }

    unsafe fn launch_plan(&self, plan: &ccl_dev_plan_t, s: Stream) -> Result<()> {
        let which = emu_kernel()?;
        // SAFETY: forwarded to the caller's contract (arrays readable at launch). The Rust
        // capture validates the plan for both implementations (its checks are stricter
        // than the kernel's host-side ones: a malformed plan is an error, never a crash).
        let k = unsafe { Kernel::capture(plan) }?;
        let ll = k.ll;
        let cmd: HostFn = match which {
            EmuKernel::Rust => Box::new(move || k.run()),
            EmuKernel::Source => {
                drop(k);
                // SAFETY: as above.
                let sk = unsafe { SourceKernel::capture(plan) }?;
                Box::new(move || sk.run())
            }
        };
        self.stream(s)?.push(cmd)?;
        IMPLS.with(|c| {
            let (src, rust) = c.get();
            c.set(match which {
                EmuKernel::Source => (src + 1, rust),
                EmuKernel::Rust => (src, rust + 1),
            });
        });
        LAUNCHES.with(|c| {
            let (s, l) = c.get();
            c.set(if ll { (s, l + 1) } else { (s + 1, l) });
        });
        Ok(())
    }
}

fn ipc_unsupported() -> CclError {
    CclError::usage(
        "the emulated device (CCLD_DEVICE_EMULATION=1) does not support CUDA IPC \
         (the runtime reaches ranks of other processes through host-staged shared memory)",
    )
}

fn step_sends(kind: u32) -> bool {
    matches!(
        kind,
        CCL_STEP_SEND
            | CCL_STEP_RECV_REDUCE_SEND
            | CCL_STEP_RECV_REDUCE_COPY_SEND
            | CCL_STEP_RECV_COPY_SEND
    )
}

/// The reducer a plan's reduction fields describe (the inverse of `red_params`).
fn plan_reducer(p: &ccl_dev_plan_t) -> Result<Option<Reducer>> {
    if p.reduce == 0 {
        return Ok(None);
    }
    let bad = |m: String| Err(CclError::arg(format!("emulated kernel: {m}")));
    let dt = DataType::from_raw(p.dtype as i32)
        .map_err(|_| CclError::arg(format!("emulated kernel: dtype {}", p.dtype)))?;
    let r = match p.op {
        CCL_OP_PREMUL => {
            let mut s = [0u8; 8];
            if p.scalar_dev.is_null() {
                s = p.scalar_bits.to_le_bytes();
            } else {
                // SAFETY: the launch contract: scalar_dev holds one element of dtype.
                let v = unsafe { std::slice::from_raw_parts(p.scalar_dev.cast::<u8>(), dt.size()) };
                s[..dt.size()].copy_from_slice(v);
            }
            Reducer::new(dt, RedOpKind::PreMulSum, Some(&s[..dt.size()]), 1)?
        }
        CCL_OP_SUM if p.avg_divisor != 0 => {
            if dt.is_float() {
                return bad("avg_divisor on a float type".into());
            }
            Reducer::new(dt, RedOpKind::Avg, None, p.avg_divisor as usize)?
        }
        CCL_OP_SUM => Reducer::new(dt, RedOpKind::Sum, None, 1)?,
        CCL_OP_PROD => Reducer::new(dt, RedOpKind::Prod, None, 1)?,
        CCL_OP_MAX => Reducer::new(dt, RedOpKind::Max, None, 1)?,
        CCL_OP_MIN => Reducer::new(dt, RedOpKind::Min, None, 1)?,
        op => return bad(format!("op {op}")),
    };
    Ok(Some(r))
}

/// # Safety
/// `a .. a + n` must be readable and not written while the slice lives.
unsafe fn raw_bytes<'a>(a: usize, n: usize) -> &'a [u8] {
    // SAFETY: forwarded to the caller.
    unsafe { std::slice::from_raw_parts(a as *const u8, n) }
}

/// # Safety
/// `a .. a + n` must be writable and not accessed otherwise while the slice lives.
unsafe fn raw_bytes_mut<'a>(a: usize, n: usize) -> &'a mut [u8] {
    // SAFETY: forwarded to the caller.
    unsafe { std::slice::from_raw_parts_mut(a as *mut u8, n) }
}

/// A launched plan: validated, arrays copied, ready to run on a stream thread.
struct Kernel {
    n_channels: usize,
    unit: usize,
    red: Option<Reducer>,
    steps: Vec<ccl_dev_step_t>,
    lanes: Vec<ccl_dev_lane_t>,
    locals: Vec<ccl_dev_local_t>,
    conns: Vec<Conn>,
    bufs: [usize; CCL_MAX_BUFS],
    /// Frame (device address = host address here), its capacity and the op's block.
    frame: usize,
    frame_capacity: u64,
    frame_block: u64,
    abort: usize,
    /// LL protocol (`CCL_PROTO_LL`): flag lines instead of data + `tail`.
    ll: bool,
    /// Injected throttle: minimum gap between two sends of throttled lanes of a channel.
    throttle_gap: Option<Duration>,
    /// Injected stall: (channel or every channel, steps each stalled lane runs first).
    stall: Option<(Option<usize>, u32)>,
}

/// Why a lane could not run its next step (the kernel's wait accounting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blocked {
    No,
    /// Inbound message not there (or the lane is stalled): waiting upstream.
    Up,
    /// No free outbound slot, LL scrub not acknowledged, or throttled: waiting downstream.
    Down,
}

#[derive(Clone, Copy)]
struct Conn {
    slots: usize,
    tail: usize,
    head: usize,
    slot_bytes: usize,
    nslots: u64,
    /// LL scrub sequence number (`ccl_dev_conn_t.ll_sync`, 0 = none).
    ll_sync: u32,
}

/// Reads `n` elements of an ABI array.
///
/// # Safety
/// `p` must point to `n` readable `T` (or `n == 0`).
unsafe fn read_array<T: Copy>(p: *const T, n: u32, what: &str) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(CclError::arg(format!(
            "emulated kernel: {what} is NULL with {n} entries"
        )));
    }
    // SAFETY: forwarded to the caller.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) }.to_vec())
}

impl Kernel {
    /// Validates `p` (like `ccl_dev_launch_plan` does on the host) and copies its arrays.
    ///
    /// # Safety
    /// The plan's arrays must be readable now.
    unsafe fn capture(p: &ccl_dev_plan_t) -> Result<Kernel> {
        let bad = |m: String| Err(CclError::arg(format!("emulated kernel: {m}")));
        if p.proto != CCL_PROTO_SIMPLE && p.proto != CCL_PROTO_LL {
            return bad(format!(
                "protocol {} (Simple and LL are implemented)",
                p.proto
            ));
        }
        let ll = p.proto == CCL_PROTO_LL;
        if p.n_channels == 0 || p.n_channels as usize > CCL_MAX_CHANNELS {
            return bad(format!("{} channels", p.n_channels));
        }
        if p.unit == 0 || p.unit > 8 {
            return bad(format!("unit {}", p.unit));
        }
        // SAFETY: the caller guarantees the arrays are readable.
        let (steps, lanes, locals, conns) = unsafe {
            (
                read_array(p.steps, p.n_steps, "steps")?,
                read_array(p.lanes, p.n_lanes, "lanes")?,
                read_array(p.locals, p.n_locals, "locals")?,
                read_array::<ccl_dev_conn_t>(p.conns, p.n_conns, "conns")?,
            )
        };
        let conns: Vec<Conn> = conns
            .iter()
            .map(|c| Conn {
                slots: c.slots as usize,
                tail: c.tail as usize,
                head: c.head as usize,
                slot_bytes: c.slot_bytes as usize,
                nslots: u64::from(c.nslots),
                ll_sync: c.ll_sync,
            })
            .collect();
        for (i, c) in conns.iter().enumerate() {
            if c.slots == 0 || c.tail == 0 || c.head == 0 || c.nslots == 0 || c.slot_bytes == 0 {
                return bad(format!("connection {i} is incomplete"));
            }
            if c.tail % 8 != 0 || c.head % 8 != 0 {
                return bad(format!("connection {i}: unaligned counters"));
            }
            if ll && (c.slots % 16 != 0 || c.slot_bytes % 16 != 0 || c.slot_bytes < 16) {
                return bad(format!("connection {i}: LL slots must be 16-byte lines"));
            }
        }
        let unit = p.unit as usize;
        let buf_ok = |b: u32, bytes: usize| -> bool {
            (b as usize) < CCL_MAX_BUFS && (bytes == 0 || !p.bufs[b as usize].is_null())
        };
        let mut per_channel = [0usize; CCL_MAX_CHANNELS];
        for (li, l) in lanes.iter().enumerate() {
            if l.channel >= p.n_channels {
                return bad(format!("lane {li} on channel {}", l.channel));
            }
            per_channel[l.channel as usize] += 1;
            if per_channel[l.channel as usize] > CCL_MAX_LANES_PER_CHANNEL {
                return bad(format!(
                    "more than {CCL_MAX_LANES_PER_CHANNEL} lanes on a channel"
                ));
            }
            let end = u64::from(l.first_step) + u64::from(l.n_steps);
            if end > u64::from(p.n_steps) {
                return bad(format!("lane {li}: steps beyond the step array"));
            }
            let conn = |c: i32| -> Option<Option<&Conn>> {
                if c < 0 {
                    Some(None)
                } else {
                    conns.get(c as usize).map(Some)
                }
            };
            let (Some(cin), Some(cout)) = (conn(l.conn_in), conn(l.conn_out)) else {
                return bad(format!("lane {li}: connection index out of range"));
            };
            for s in &steps[l.first_step as usize..end as usize] {
                let nb = (s.count as usize).saturating_mul(unit);
                if s.count == 0 || s.kind > CCL_STEP_RECV_REDUCE_COPY {
                    return bad(format!("lane {li}: step kind {} count {}", s.kind, s.count));
                }
                let recvs = s.kind != CCL_STEP_SEND;
                let sends = step_sends(s.kind);
                let cap = |c: &Conn| {
                    if ll {
                        ll_chunk_bytes(c.slot_bytes)
                    } else {
                        c.slot_bytes
                    }
                };
                if recvs && cin.is_none_or(|c| nb > cap(c)) {
                    return bad(format!("lane {li}: receive without a fitting connection"));
                }
                if sends && cout.is_none_or(|c| nb > cap(c)) {
                    return bad(format!("lane {li}: send without a fitting connection"));
                }
                if !buf_ok(s.src_buf, nb) || !buf_ok(s.dst_buf, nb) {
                    return bad(format!("lane {li}: buffer index or NULL buffer"));
                }
            }
        }
        for l in &locals {
            let nb = (l.count as usize).saturating_mul(unit);
            if l.kind > CCL_LOCAL_REDUCE || !buf_ok(l.src_buf, nb) || !buf_ok(l.dst_buf, nb) {
                return bad("malformed local step".into());
            }
        }
        let red = plan_reducer(p)?;
        let needs_red = steps.iter().any(|s| {
            matches!(
                s.kind,
                CCL_STEP_RECV_REDUCE_SEND
                    | CCL_STEP_RECV_REDUCE_COPY_SEND
                    | CCL_STEP_RECV_REDUCE_COPY
            )
        }) || locals.iter().any(|l| l.kind == CCL_LOCAL_REDUCE);
        if needs_red && red.is_none() {
            return bad("reduction steps in a plan with reduce = 0".into());
        }
        if p.frame as usize % 8 != 0 || p.abort_flag as usize % 4 != 0 {
            return bad("unaligned frame or abort flag".into());
        }
        let stall = match p.stall_channel {
            CCL_STALL_NONE => None,
            CCL_STALL_ALL => Some((None, p.stall_after)),
            c if c < p.n_channels => Some((Some(c as usize), p.stall_after)),
            c => return bad(format!("stall_channel {c} of {} channels", p.n_channels)),
        };
        if lanes.iter().any(|l| l.flags & !CCL_LANE_THROTTLED != 0) {
            return bad("unknown lane flags".into());
        }
        let mut bufs = [0usize; CCL_MAX_BUFS];
        for (d, s) in bufs.iter_mut().zip(p.bufs.iter()) {
            *d = *s as usize;
        }
        Ok(Kernel {
            n_channels: p.n_channels as usize,
            unit,
            red,
            steps,
            lanes,
            locals,
            conns,
            bufs,
            frame: p.frame as usize,
            frame_capacity: u64::from(p.frame_capacity),
            frame_block: u64::from(p.frame_block),
            abort: p.abort_flag as usize,
            ll,
            throttle_gap: (p.throttle_gap_ns > 0).then(|| Duration::from_nanos(p.throttle_gap_ns)),
            stall,
        })
    }

    fn run(self) {
        if self.aborted() {
            // An aborted communicator's kernel touches nothing (its peers may have freed
            // the FIFOs it would read).
            return;
        }
        let mut scratch = Vec::new();
        for l in &self.locals {
            self.local(l, &mut scratch);
        }
        let me = &self;
        std::thread::scope(|sc| {
            for ch in 0..me.n_channels {
                let lanes: Vec<usize> = (0..me.lanes.len())
                    .filter(|&i| me.lanes[i].channel as usize == ch)
                    .collect();
                if lanes.is_empty() {
                    continue;
                }
                sc.spawn(move || me.channel(ch, &lanes));
            }
        });
    }

    fn aborted(&self) -> bool {
        if self.abort == 0 {
            return false;
        }
        // SAFETY: the abort flag is mapped memory valid until the kernel finished (launch
        // contract), 4-byte aligned (checked), only accessed atomically by the runtime.
        unsafe { AtomicU32::from_ptr(self.abort as *mut u32) }.load(Ordering::Acquire) != 0
    }

    fn counter(addr: usize) -> &'static AtomicU64 {
        // SAFETY: conn counters are 8-byte aligned (checked at capture) emulated device
        // memory that the runtime keeps alive while any kernel of the communicator runs,
        // and every agent accesses them atomically.
        unsafe { AtomicU64::from_ptr(addr as *mut u64) }
    }

    fn store_counts(&self, ch: usize, send: u64, recv: u64) {
        if self.frame == 0 || ch as u64 >= self.frame_capacity {
            return;
        }
        let off = frame_send_offset(self.frame_capacity, self.frame_block, ch as u64) as usize;
        // SAFETY: the frame is mapped memory of frame_bytes(capacity) bytes at least, alive
        // until the kernel finished, 8-aligned; the host reads these words atomically.
        let (s, r) = unsafe {
            (
                AtomicU64::from_ptr((self.frame + off) as *mut u64),
                AtomicU64::from_ptr((self.frame + off + 8) as *mut u64),
            )
        };
        s.store(send, Ordering::Release);
        r.store(recv, Ordering::Release);
    }

    /// Stores the channel's cumulative wait times (ns) into the frame's extension slots.
    fn store_waits(&self, ch: usize, up: u64, down: u64) {
        if self.frame == 0 || ch as u64 >= self.frame_capacity {
            return;
        }
        let off = frame_wait_offset(self.frame_capacity, self.frame_block, ch as u64) as usize;
        // SAFETY: the frame is mapped memory of CCL_FRAME_TOTAL_BYTES(capacity) bytes (the
        // ABI's contract for `frame`), alive until the kernel finished, 8-aligned; the host
        // reads these words atomically.
        let (u, d) = unsafe {
            (
                AtomicU64::from_ptr((self.frame + off) as *mut u64),
                AtomicU64::from_ptr((self.frame + off + 8) as *mut u64),
            )
        };
        u.store(up, Ordering::Release);
        d.store(down, Ordering::Release);
    }

    /// One channel ("thread block"): its lanes round-robin until all finished or abort.
    fn channel(&self, ch: usize, lane_ids: &[usize]) {
        struct Run {
            lane: usize,
            pos: u32,
            consumed: u64,
            posted: u64,
            /// LL: the receiver acknowledged the scrub of conn_out (or none was needed).
            synced: bool,
            /// Steps after which the lane stops (injected stall), if any.
            stall_at: Option<u32>,
            /// Why the lane's next step could not run in the last pass.
            wait: Blocked,
        }
        let stalled = self
            .stall
            .and_then(|(c, after)| c.is_none_or(|c| c == ch).then_some(after));
        let mut runs: Vec<Run> = lane_ids
            .iter()
            .map(|&i| {
                let l = &self.lanes[i];
                let start = |c: i32, head: bool| -> u64 {
                    if c < 0 {
                        return 0;
                    }
                    let k = self.conns[c as usize];
                    Self::counter(if head { k.head } else { k.tail }).load(Ordering::Acquire)
                };
                Run {
                    lane: i,
                    pos: 0,
                    consumed: start(l.conn_in, true),
                    posted: start(l.conn_out, false),
                    synced: !self.ll
                        || l.conn_out < 0
                        || self.conns[l.conn_out as usize].ll_sync == 0,
                    stall_at: stalled,
                    wait: Blocked::No,
                }
            })
            .collect();
        if self.ll {
            // Inbound FIFOs that may hold stale non-LL bytes: zero their LL lines, then
            // tell the sender (who waits for it before its first LL message).
            for r in &runs {
                let l = &self.lanes[r.lane];
                if l.conn_in >= 0 && self.conns[l.conn_in as usize].ll_sync != 0 {
                    ll_scrub(&self.conns[l.conn_in as usize]);
                }
            }
        }
        let (mut sends, mut recvs) = (0u64, 0u64);
        let mut idle = 0u32;
        let mut scratch = Vec::new();
        let (mut ll_in, mut ll_out) = (Vec::new(), Vec::new());
        // Wait accounting: cumulative ns per reason, the current episode's start (from
        // its second idle pass) and the reasons seen at its last idle pass.
        let (mut wait_up, mut wait_down) = (0u64, 0u64);
        let mut since: Option<Instant> = None;
        let (mut blocked_up, mut blocked_down) = (false, false);
        // Injected throttle: when the channel's next throttled send may start.
        let mut next_send: Option<Instant> = None;
        while !runs.is_empty() {
            let mut progressed = false;
            for r in runs.iter_mut() {
                let l = self.lanes[r.lane];
                r.wait = Blocked::No;
                while r.pos < l.n_steps {
                    if r.stall_at.is_some_and(|k| r.pos >= k) {
                        r.wait = Blocked::Up;
                        break;
                    }
                    let st = self.steps[(l.first_step + r.pos) as usize];
                    let rcv = st.kind != CCL_STEP_SEND;
                    let snd = step_sends(st.kind);
                    let cin = (l.conn_in >= 0).then(|| self.conns[l.conn_in as usize]);
                    let cout = (l.conn_out >= 0).then(|| self.conns[l.conn_out as usize]);
                    if let (true, Some(c)) = (rcv, cin) {
                        if self.ll {
                            // The first line of the slot carries this message's flags.
                            let slot = c.slots + ((r.consumed % c.nslots) as usize) * c.slot_bytes;
                            if !ll_line_ready(slot, ll_flag(r.consumed + 1)) {
                                r.wait = Blocked::Up;
                                break;
                            }
                        } else if Self::counter(c.tail).load(Ordering::Acquire) <= r.consumed {
                            r.wait = Blocked::Up;
                            break;
                        }
                    }
                    let throttled =
                        snd && l.flags & CCL_LANE_THROTTLED != 0 && self.throttle_gap.is_some();
                    if let (true, Some(c)) = (snd, cout) {
                        let head = Self::counter(c.head).load(Ordering::Acquire);
                        if r.posted - head >= c.nslots {
                            r.wait = Blocked::Down;
                            break;
                        }
                        if !r.synced {
                            if ll_sync_word(&c).load(Ordering::Acquire) != u64::from(c.ll_sync) {
                                r.wait = Blocked::Down;
                                break;
                            }
                            r.synced = true;
                        }
                        if throttled && next_send.is_some_and(|n| Instant::now() < n) {
                            r.wait = Blocked::Down;
                            break;
                        }
                    }
                    if let (true, Some(gap)) = (throttled, self.throttle_gap) {
                        // The gap starts now; the channel's next throttled send waits for it.
                        next_send = Some(Instant::now() + gap);
                    }
                    let nb = st.count as usize * self.unit;
                    let mut inb = cin
                        .filter(|_| rcv)
                        .map(|c| c.slots + ((r.consumed % c.nslots) as usize) * c.slot_bytes);
                    let mut out = cout
                        .filter(|_| snd)
                        .map(|c| c.slots + ((r.posted % c.nslots) as usize) * c.slot_bytes);
                    let ll_slot_out = out;
                    if self.ll {
                        if let Some(slot) = inb {
                            if !self.ll_recv(slot, nb, ll_flag(r.consumed + 1), &mut ll_in) {
                                return; // aborted
                            }
                            inb = Some(ll_in.as_ptr() as usize);
                        }
                        if out.is_some() {
                            ll_out.clear();
                            ll_out.resize(nb.div_ceil(8) * 8, 0);
                            out = Some(ll_out.as_mut_ptr() as usize);
                        }
                    }
                    self.step(&st, inb, out, &mut scratch);
                    if let (true, Some(slot)) = (self.ll, ll_slot_out) {
                        ll_pack(slot, &ll_out, ll_flag(r.posted + 1));
                    }
                    if let (true, Some(c)) = (rcv, cin) {
                        r.consumed += 1;
                        Self::counter(c.head).store(r.consumed, Ordering::Release);
                        recvs += 1;
                    }
                    if let (true, Some(c)) = (snd, cout) {
                        r.posted += 1;
                        Self::counter(c.tail).store(r.posted, Ordering::Release);
                        sends += 1;
                    }
                    self.store_counts(ch, sends, recvs);
                    r.pos += 1;
                    progressed = true;
                }
            }
            if progressed {
                // A wait episode ended: charge it to the reasons of its last idle pass.
                if let Some(t0) = since.take() {
                    let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    if blocked_up {
                        wait_up = wait_up.saturating_add(ns);
                    }
                    if blocked_down {
                        wait_down = wait_down.saturating_add(ns);
                    }
                    self.store_waits(ch, wait_up, wait_down);
                }
            }
            runs.retain(|r| r.pos < self.lanes[r.lane].n_steps);
            if progressed {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle == 2 {
                since = Some(Instant::now());
            }
            if idle >= 2 {
                blocked_up = runs.iter().any(|r| r.wait == Blocked::Up);
                blocked_down = runs.iter().any(|r| r.wait == Blocked::Down);
            }
            if idle % 64 == 0 && self.aborted() {
                return;
            }
            backoff(idle);
        }
    }

    /// LL receive of one message of `nb` payload bytes from the slot at `slot`: waits for
    /// every line's two flags to equal `flag`, unpacks the payload into `out` (padded to
    /// whole lines). False when the wait ended on abort.
    fn ll_recv(&self, slot: usize, nb: usize, flag: u32, out: &mut Vec<u8>) -> bool {
        let lines = nb.div_ceil(8);
        out.clear();
        out.reserve(lines * 8);
        for i in 0..lines {
            let mut idle = 0u32;
            let (lo, hi) = loop {
                let (lo, hi) = ll_load_line(slot + 16 * i);
                if (lo >> 32) as u32 == flag && (hi >> 32) as u32 == flag {
                    break (lo, hi);
                }
                idle = idle.saturating_add(1);
                if idle % 64 == 0 && self.aborted() {
                    return false;
                }
                backoff(idle);
            };
            out.extend_from_slice(&(lo as u32).to_le_bytes());
            out.extend_from_slice(&(hi as u32).to_le_bytes());
        }
        true
    }

    /// Executes one step (readiness checked by the caller). `inb` / `out`: the inbound and
    /// outbound slot addresses, when the step receives / sends.
    fn step(
        &self,
        st: &ccl_dev_step_t,
        inb: Option<usize>,
        out: Option<usize>,
        scratch: &mut Vec<u8>,
    ) {
        let nb = st.count as usize * self.unit;
        let src = self.bufs[st.src_buf as usize] + st.src_off as usize * self.unit;
        let dst = self.bufs[st.dst_buf as usize] + st.dst_off as usize * self.unit;
        // The plan addresses only ranges inside the operation's buffers (schedule bounds;
        // the runtime's enqueue contract) and FIFO slots of slot_bytes >= nb (checked at
        // capture); lanes write disjoint ranges; a slot is owned by this lane between the
        // readiness check and the counter store. Slices made here never overlap each other
        // while alive (slots vs user buffers; in-place reductions go through `scratch`).
        let rd = |a: usize| {
            // SAFETY: see above: `a .. a + nb` is readable for this step.
            unsafe { raw_bytes(a, nb) }
        };
        let wr = |a: usize| {
            // SAFETY: see above: `a .. a + nb` is writable and not otherwise borrowed.
            unsafe { raw_bytes_mut(a, nb) }
        };
        let red = self.red.as_ref();
        match (st.kind, inb, out) {
            (CCL_STEP_SEND, _, Some(o)) => match red {
                Some(r) => r.load(wr(o), rd(src)),
                None => wr(o).copy_from_slice(rd(src)),
            },
            (CCL_STEP_RECV, Some(i), _) => {
                // SAFETY: see above; slot and user buffer never overlap.
                unsafe { std::ptr::copy_nonoverlapping(i as *const u8, dst as *mut u8, nb) };
            }
            (CCL_STEP_RECV_COPY_SEND, Some(i), Some(o)) => {
                wr(o).copy_from_slice(rd(i));
                wr(dst).copy_from_slice(rd(i));
            }
            (CCL_STEP_RECV_REDUCE_SEND, Some(i), Some(o)) => {
                if let Some(r) = red {
                    r.combine(wr(o), rd(i), rd(src));
                }
            }
            (CCL_STEP_RECV_REDUCE_COPY_SEND, Some(i), Some(o)) => {
                if let Some(r) = red {
                    r.combine(wr(o), rd(i), rd(src));
                    if r.needs_finish() {
                        r.finish(wr(o));
                    }
                    wr(dst).copy_from_slice(rd(o));
                }
            }
            (CCL_STEP_RECV_REDUCE_COPY, Some(i), _) => {
                if let Some(r) = red {
                    scratch.resize(nb, 0);
                    r.combine(&mut scratch[..nb], rd(i), rd(src));
                    if r.needs_finish() {
                        r.finish(&mut scratch[..nb]);
                    }
                    wr(dst).copy_from_slice(&scratch[..nb]);
                }
            }
            // Unreachable after capture's checks (kinds, connections).
            _ => tracing::error!(target: "nccl::COLL", "emulated kernel: malformed step {st:?}"),
        }
    }

    fn local(&self, l: &ccl_dev_local_t, scratch: &mut Vec<u8>) {
        let nb = l.count as usize * self.unit;
        let src = self.bufs[l.src_buf as usize] + l.src_off as usize * self.unit;
        let dst = self.bufs[l.dst_buf as usize] + l.dst_off as usize * self.unit;
        if nb == 0 {
            return;
        }
        match (l.kind, self.red.as_ref()) {
            (CCL_LOCAL_COPY, _) => {
                if src != dst {
                    // SAFETY: ranges inside the operation's buffers (as for steps); memmove.
                    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, nb) };
                }
            }
            (_, Some(r)) => {
                scratch.resize(nb, 0);
                // SAFETY: as above; the source slice dies before the destination is written.
                r.load(&mut scratch[..nb], unsafe {
                    std::slice::from_raw_parts(src as *const u8, nb)
                });
                if r.needs_finish() {
                    r.finish(&mut scratch[..nb]);
                }
                // SAFETY: as above.
                unsafe { std::ptr::copy_nonoverlapping(scratch.as_ptr(), dst as *mut u8, nb) };
            }
            (_, None) => {}
        }
    }
}

/// Spin, then yield, then sleep: the emulator's idle wait (`idle` = attempts so far).
fn backoff(idle: u32) {
    if idle < 64 {
        std::hint::spin_loop();
    } else if idle < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Payload bytes of one LL message in a slot of `slot_bytes` (the kernel's rule; the
/// runtime plans LL operations with chunks of this size).
pub fn ll_chunk_bytes(slot_bytes: usize) -> usize {
    super::proto::ll_chunk_bytes(slot_bytes)
}

/// The flag of message `m` (1-based count of messages sent on the connection): its low
/// 32 bits. 0 never appears before 2^32 messages (FIFO memory starts zeroed or scrubbed).
pub fn ll_flag(m: u64) -> u32 {
    m as u32
}

/// Packs `payload` into LL lines `{data0, flag, data1, flag}` (little-endian u32 each),
/// 8 payload bytes per 16-byte line, the last line zero-padded. Pure (for tests and the
/// emulator's packing).
pub fn ll_lines(payload: &[u8], flag: u32) -> Vec<[u64; 2]> {
    payload
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            let d0 = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let d1 = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            [
                u64::from(d0) | (u64::from(flag) << 32),
                u64::from(d1) | (u64::from(flag) << 32),
            ]
        })
        .collect()
}

/// The payload of LL lines whose flags all equal `flag` (`None` if one differs), `nb`
/// bytes. Pure inverse of [`ll_lines`].
pub fn ll_unlines(lines: &[[u64; 2]], flag: u32, nb: usize) -> Option<Vec<u8>> {
    let mut v = Vec::with_capacity(lines.len() * 8);
    for [lo, hi] in lines {
        if (lo >> 32) as u32 != flag || (hi >> 32) as u32 != flag {
            return None;
        }
        v.extend_from_slice(&(*lo as u32).to_le_bytes());
        v.extend_from_slice(&(*hi as u32).to_le_bytes());
    }
    (v.len() >= nb).then(|| {
        v.truncate(nb);
        v
    })
}

fn ll_word(addr: usize) -> &'static AtomicU64 {
    // SAFETY: LL lines live in FIFO slots (16-byte aligned, checked at capture) of emulated
    // device memory the runtime keeps alive while any kernel of the communicator runs;
    // while a connection runs LL every agent accesses its lines with 8-byte atomics.
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }
}

/// Both 8-byte halves of the line at `addr` (Acquire: the data of a half is valid when
/// its flag matches, they are one atomic word).
fn ll_load_line(addr: usize) -> (u64, u64) {
    (
        ll_word(addr).load(Ordering::Acquire),
        ll_word(addr + 8).load(Ordering::Acquire),
    )
}

/// The readiness peek: the first line of the slot carries `flag` in both halves.
fn ll_line_ready(slot: usize, flag: u32) -> bool {
    let (lo, hi) = ll_load_line(slot);
    (lo >> 32) as u32 == flag && (hi >> 32) as u32 == flag
}

/// Stores `payload` as LL lines with `flag` into the slot at `slot` (Release per word).
fn ll_pack(slot: usize, payload: &[u8], flag: u32) {
    for (i, [lo, hi]) in ll_lines(payload, flag).into_iter().enumerate() {
        ll_word(slot + 16 * i).store(lo, Ordering::Release);
        ll_word(slot + 16 * i + 8).store(hi, Ordering::Release);
    }
}

/// The LL scrub word of a connection: the 8 bytes after `head` (receiver-written).
fn ll_sync_word(c: &Conn) -> &'static AtomicU64 {
    // SAFETY: the connection's header holds head and, right after it, the scrub word
    // (ABI: `ccl_dev_conn_t.ll_sync`), 8-aligned (head is, checked at capture), alive as
    // the counters are, accessed atomically by every agent.
    unsafe { AtomicU64::from_ptr((c.head + 8) as *mut u64) }
}

/// Zeroes the LL lines of every slot of `c` (the part an LL message can use), then
/// publishes the scrub (`ll_sync`) for the sender.
fn ll_scrub(c: &Conn) {
    let used = 2 * ll_chunk_bytes(c.slot_bytes);
    for k in 0..c.nslots as usize {
        let base = c.slots + k * c.slot_bytes;
        for off in (0..used).step_by(8) {
            ll_word(base + off).store(0, Ordering::Relaxed);
        }
    }
    ll_sync_word(c).store(u64::from(c.ll_sync), Ordering::Release);
}

#[cfg(test)]
mod tests;
