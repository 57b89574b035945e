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
//!   (`emu/reference.rs`), an independent second implementation of the same rules: the plan is
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

use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use kernels::ffi::{ccl_dev_plan_t, CCL_MAX_CHANNELS};

use super::api::{DeviceApi, Event, HostFn, IpcHandle, Mapped, PtrInfo, PtrKind, Stream};
use super::emu_kernel::{emu_kernel, EmuKernel, SourceKernel};
use crate::error::{CclError, Result};

/// Alignment of emulated allocations (cudaMalloc gives at least 256).
const ALIGN: usize = 256;

thread_local! {
    static CURRENT: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    static BUSY_FREES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static ALLOCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static LAUNCHES: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
    static IMPLS: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
    static HOST_FNS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Host functions this thread enqueued (`launch_host_fn`): each one is a GPU-to-host round
/// trip on CUDA; tests count them per operation (issue 15 blocker 10).
pub fn host_fns_on_this_thread() -> usize {
    HOST_FNS.with(|c| c.get())
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

/// What a new emulated allocation holds (see `EmuDevice::alloc`).
const UNINIT_BYTE: u8 = 0xA5;

#[derive(Debug, Clone, Copy)]
struct Alloc {
    len: usize,
    mapped: bool,
    /// The current device of the allocating thread.
    device: i32,
}

/// A command of an emulated stream.
enum Cmd {
    /// Host work: copies, host functions.
    Run(HostFn),
    /// A kernel; `Err(message)` is a fault, sticky for the stream (as a CUDA kernel fault
    /// is for the context): later commands are dropped, queries and synchronizations
    /// report it.
    Kernel(Box<dyn FnOnce() -> std::result::Result<(), String> + Send>),
    /// Completes record `gen` of an event.
    Record(Arc<EmuEvent>, u64),
    /// Holds the stream until record `gen` of an event completed (`cudaStreamWaitEvent`).
    Wait(Arc<EmuEvent>, u64),
}

/// One emulated stream: a worker thread running queued commands in order.
struct EmuStream {
    id: usize,
    q: Mutex<StreamQ>,
    cv: Condvar,
}

#[derive(Default)]
struct StreamQ {
    cmds: VecDeque<Cmd>,
    /// Commands queued and not finished (the one running included).
    pending: usize,
    stop: bool,
    /// The fault of a kernel (or of an event this stream waited for), sticky.
    fault: Option<String>,
}

impl std::fmt::Debug for EmuStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EmuStream")
    }
}

fn faulted(what: &str, id: usize, m: &str) -> CclError {
    CclError::System(format!(
        "emulated device: {what} on stream {id:#x}: an earlier kernel faulted: {m}"
    ))
}

impl EmuStream {
    fn start(id: usize) -> Result<Arc<EmuStream>> {
        let s = Arc::new(EmuStream {
            id,
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
            let (cmd, fault) = {
                let mut g = self.q.lock();
                loop {
                    if let Some(c) = g.cmds.pop_front() {
                        kernels::sim::hb_acquire(self.hb());
                        break (c, g.fault.clone());
                    }
                    if g.stop {
                        return;
                    }
                    self.cv.wait(&mut g);
                }
            };
            let new_fault = match (cmd, fault) {
                // After a fault nothing runs; events recorded behind it report the fault.
                (Cmd::Record(ev, gen), Some(f)) => {
                    ev.fail(gen, &f);
                    None
                }
                (_, Some(_)) => None,
                (Cmd::Run(f), None) => {
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                        tracing::error!(target: "nccl::COLL",
                            "emulated device: a stream command panicked");
                    }
                    None
                }
                (Cmd::Kernel(k), None) => {
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(k)) {
                        Ok(Ok(())) => None,
                        Ok(Err(m)) => Some(m),
                        Err(_) => Some("the emulated kernel panicked".to_string()),
                    }
                }
                (Cmd::Record(ev, gen), None) => {
                    ev.complete(gen);
                    None
                }
                (Cmd::Wait(ev, gen), None) => ev.wait(gen).err(),
            };
            let mut g = self.q.lock();
            if let Some(m) = new_fault {
                tracing::warn!(target: "nccl::COLL",
                    "emulated device: stream {:#x} faulted: {m}", self.id);
                g.fault.get_or_insert(m);
            }
            g.pending -= 1;
            kernels::sim::hb_release(self.hb());
            self.cv.notify_all();
        }
    }

    fn push(&self, cmd: Cmd) -> Result<()> {
        let mut g = self.q.lock();
        if g.stop {
            return Err(CclError::usage("emulated device: stream was destroyed"));
        }
        if let Some(m) = &g.fault {
            return Err(faulted("enqueue", self.id, m));
        }
        g.cmds.push_back(cmd);
        g.pending += 1;
        kernels::sim::hb_release(self.hb());
        self.cv.notify_all();
        Ok(())
    }

    fn push_fn(&self, f: HostFn) -> Result<()> {
        self.push(Cmd::Run(f))
    }

    /// Whether the stream's work is done (an error after a fault).
    fn query(&self) -> Result<bool> {
        let g = self.q.lock();
        if let Some(m) = &g.fault {
            return Err(faulted("query", self.id, m));
        }
        let idle = g.pending == 0;
        drop(g);
        if idle {
            kernels::sim::hb_acquire(self.hb());
        }
        Ok(idle)
    }

    fn idle(&self) -> bool {
        self.query().unwrap_or(true)
    }

    fn sync(&self) -> Result<()> {
        let mut g = self.q.lock();
        while g.pending > 0 {
            self.cv.wait(&mut g);
        }
        if let Some(m) = &g.fault {
            return Err(faulted("synchronize", self.id, m));
        }
        drop(g);
        kernels::sim::hb_acquire(self.hb());
        Ok(())
    }

    /// The stream's synchronisation address for ThreadSanitizer (the queue's mutex
    /// orders commands and completion; TSan does not see Rust's futex-based locks).
    fn hb(&self) -> usize {
        &self.q as *const Mutex<StreamQ> as usize
    }

    fn stop(&self) {
        self.q.lock().stop = true;
        self.cv.notify_all();
    }
}

/// An emulated event: a completion marker. Records are numbered; a stream that waits for
/// the event waits for the number of its last record at the time of the wait.
#[derive(Debug, Default)]
struct EmuEvent {
    st: Mutex<EventState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct EventState {
    /// Records enqueued so far.
    recorded: u64,
    /// Highest record completed.
    done: u64,
    /// The fault of the stream a record was behind.
    fault: Option<String>,
}

impl EmuEvent {
    fn next_record(&self) -> u64 {
        let mut g = self.st.lock();
        g.recorded += 1;
        g.recorded
    }

    fn last_record(&self) -> u64 {
        self.st.lock().recorded
    }

    fn complete(&self, gen: u64) {
        let mut g = self.st.lock();
        g.done = g.done.max(gen);
        kernels::sim::hb_release(self as *const EmuEvent as usize);
        self.cv.notify_all();
    }

    fn fail(&self, _gen: u64, m: &str) {
        self.st.lock().fault.get_or_insert_with(|| m.to_string());
        self.cv.notify_all();
    }

    /// Blocks until record `gen` completed; the fault when the stream behind it faulted.
    fn wait(&self, gen: u64) -> std::result::Result<(), String> {
        let mut g = self.st.lock();
        loop {
            if let Some(m) = &g.fault {
                return Err(format!("waited for an event behind a fault: {m}"));
            }
            if g.done >= gen {
                drop(g);
                kernels::sim::hb_acquire(self as *const EmuEvent as usize);
                return Ok(());
            }
            self.cv.wait(&mut g);
        }
    }

    fn query(&self) -> Result<bool> {
        let g = self.st.lock();
        if let Some(m) = &g.fault {
            return Err(CclError::System(format!(
                "emulated device: event query: a kernel before the event faulted: {m}"
            )));
        }
        Ok(g.done >= g.recorded)
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
    events: Mutex<HashMap<usize, Arc<EmuEvent>>>,
    next_event: AtomicUsize,
    /// Devices whose kernel was preloaded ([`DeviceApi::preload_kernel`]), with counts.
    preloaded: Mutex<HashMap<i32, usize>>,
    /// Kernels launched on a device never preloaded.
    unloaded_launches: AtomicUsize,
    /// Injected kernel faults: the next kernel launched on the device faults.
    faults: Mutex<HashMap<i32, String>>,
    /// Kernels launched with their plan arrays in mapped host memory.
    mapped_plan_launches: AtomicUsize,
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
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(CclError::System(format!(
                "emulated device: out of memory allocating {bytes} bytes"
            )));
        }
        // Mapped host memory is zeroed (the DeviceApi contract; the CUDA wrapper clears it).
        // cudaMalloc does not clear memory: on a GPU a new block often holds what an earlier
        // one left (FIFO slots, LL lines). Code that relies on zeroed device memory must
        // fail here as it would there, so new device blocks are filled with a pattern.
        let fill = if mapped { 0 } else { UNINIT_BYTE };
        // SAFETY: p is a fresh allocation of layout.size() bytes.
        unsafe { std::ptr::write_bytes(p, fill, layout.size()) };
        ALLOCS.with(|c| c.set(c.get() + 1));
        self.allocs.lock().insert(
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
        if self.streams.lock().values().any(|s| !s.idle()) {
            BUSY_FREES.with(|c| c.set(c.get() + 1));
        }
        let mut g = self.allocs.lock();
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
        self.streams
            .lock()
            .get(&s)
            .cloned()
            .ok_or_else(|| CclError::arg(format!("emulated device: unknown stream {s:#x}")))
    }

    /// Bytes allocated and not freed (device + mapped), for leak checks in tests.
    pub fn live_allocations(&self) -> usize {
        self.allocs.lock().len()
    }

    /// Host ranges registered ([`DeviceApi::host_register`]) and not unregistered, for leak
    /// checks in tests.
    pub fn live_registrations(&self) -> usize {
        self.registered.lock().len()
    }

    /// How many times the plan kernel was preloaded on `device` (communicator inits).
    pub fn preloads(&self, device: i32) -> usize {
        self.preloaded.lock().get(&device).copied().unwrap_or(0)
    }

    /// Kernels launched on a device whose kernel was never preloaded (on CUDA with lazy
    /// module loading, each such launch would load the module then; issue 15 blocker 6).
    pub fn launches_before_preload(&self) -> usize {
        self.unloaded_launches.load(Ordering::Acquire)
    }

    /// Testing aid: the next kernel launched on `device` faults with `message` (like an
    /// illegal memory access: the stream stops, queries report the fault).
    pub fn fault_next_kernel(&self, device: i32, message: &str) {
        self.faults.lock().insert(device, message.to_string());
    }

    /// Kernels launched whose plan arrays were in mapped host memory (on a GPU: read over
    /// PCIe at every step; issue 15 blocker 9).
    pub fn launches_with_mapped_plans(&self) -> usize {
        self.mapped_plan_launches.load(Ordering::Acquire)
    }

    /// Whether `p` lies in an allocation of this device of the kind (mapped or device).
    fn in_alloc(&self, p: usize, mapped: bool) -> bool {
        self.allocs
            .lock()
            .range(..=p)
            .next_back()
            .is_some_and(|(base, a)| p < base + a.len && a.mapped == mapped)
    }

    /// Events created and not destroyed, for leak checks in tests.
    pub fn live_events(&self) -> usize {
        self.events.lock().len()
    }

    fn event(&self, e: Event) -> Result<Arc<EmuEvent>> {
        self.events
            .lock()
            .get(&e)
            .cloned()
            .ok_or_else(|| CclError::arg(format!("emulated device: unknown event {e:#x}")))
    }

    /// Whether kernels on `device` were allowed to reach `peer`'s memory
    /// ([`DeviceApi::enable_peer_access`]).
    pub fn peer_access_enabled(&self, device: i32, peer: i32) -> bool {
        self.peer_access.lock().contains(&(device, peer))
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
            let g = self.allocs.lock();
            g.range(..=p)
                .next_back()
                .filter(|(base, a)| p < *base + a.len)
                .map(|(_, a)| *a)
        };
        let registered = {
            let g = self.registered.lock();
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
        self.peer_access.lock().insert((dev, peer));
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
        // SAFETY: the trait's contract: `p .. p + bytes` is memory of this (emulated) device,
        // i.e. a live host allocation that nobody else accesses during the call.
        unsafe { std::ptr::write_bytes(p as *mut u8, value, bytes) };
        Ok(())
    }

    unsafe fn memcpy(&self, dst: usize, src: usize, bytes: usize) -> Result<()> {
        if bytes > 0 && dst != src {
            // SAFETY: the trait's contract: both ranges are valid for `bytes` bytes (host
            // memory on the emulated device); ptr::copy allows them to overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        }
        Ok(())
    }

    unsafe fn memcpy_async(&self, dst: usize, src: usize, bytes: usize, s: Stream) -> Result<()> {
        self.stream(s)?.push_fn(Box::new(move || {
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
        let mut g = self.registered.lock();
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
        match self.registered.lock().remove(&host) {
            Some(_) => Ok(()),
            None => Err(CclError::arg(format!(
                "emulated device: host_unregister({host:#x}): not registered \
                 (cudaErrorHostMemoryNotRegistered)"
            ))),
        }
    }

    fn default_stream(&self, device: i32) -> Result<Stream> {
        let mut d = self.defaults.lock();
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
        self.streams.lock().insert(id, s);
        Ok(id)
    }

    fn stream_destroy(&self, s: Stream) -> Result<()> {
        if self.defaults.lock().values().any(|d| *d == s) {
            return Err(CclError::arg(
                "emulated device: a default stream cannot be destroyed",
            ));
        }
        let st = self
            .streams
            .lock()
            .remove(&s)
            .ok_or_else(|| CclError::arg(format!("emulated device: unknown stream {s:#x}")))?;
        // Like cudaStreamDestroy: returns at once; queued work still runs.
        st.stop();
        Ok(())
    }

    fn stream_query(&self, s: Stream) -> Result<bool> {
        self.stream(s)?.query()
    }

    fn stream_synchronize(&self, s: Stream) -> Result<()> {
        self.stream(s)?.sync()
    }

    fn launch_host_fn(&self, s: Stream, f: HostFn) -> Result<()> {
        self.stream(s)?.push_fn(f)?;
        HOST_FNS.with(|c| c.set(c.get() + 1));
        Ok(())
    }

    fn event_create(&self) -> Result<Event> {
        let id = 0x10_0000 + 0x10 * self.next_event.fetch_add(1, Ordering::Relaxed);
        self.events.lock().insert(id, Arc::new(EmuEvent::default()));
        Ok(id)
    }

    fn event_destroy(&self, e: Event) -> Result<()> {
        // Like cudaEventDestroy: pending records still complete (the commands hold it).
        self.events
            .lock()
            .remove(&e)
            .map(|_| ())
            .ok_or_else(|| CclError::arg(format!("emulated device: unknown event {e:#x}")))
    }

    fn event_record(&self, e: Event, s: Stream) -> Result<()> {
        let ev = self.event(e)?;
        let st = self.stream(s)?;
        let gen = ev.next_record();
        st.push(Cmd::Record(ev, gen))
    }

    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<()> {
        let ev = self.event(e)?;
        let gen = ev.last_record();
        if gen == 0 {
            // Never recorded: nothing to wait for (as on CUDA).
            return Ok(());
        }
        self.stream(s)?.push(Cmd::Wait(ev, gen))
    }

    fn event_query(&self, e: Event) -> Result<bool> {
        self.event(e)?.query()
    }

    fn preload_kernel(&self) -> Result<()> {
        *self
            .preloaded
            .lock()
            .entry(CURRENT.with(|c| c.get()))
            .or_default() += 1;
        Ok(())
    }

    unsafe fn launch_plan(&self, plan: &ccl_dev_plan_t, s: Stream) -> Result<()> {
        let which = emu_kernel()?;
        let device = CURRENT.with(|c| c.get());
        if !self.preloaded.lock().contains_key(&device) {
            self.unloaded_launches.fetch_add(1, Ordering::AcqRel);
        }
        let ll = plan.proto == kernels::ffi::CCL_PROTO_LL;
        type KernelFn = Box<dyn FnOnce() -> std::result::Result<(), String> + Send>;
        let fault = self.faults.lock().remove(&device);
        if self.in_alloc(plan.steps as usize, true) || self.in_alloc(plan.conns as usize, true) {
            self.mapped_plan_launches.fetch_add(1, Ordering::AcqRel);
        }
        let arrays = [
            plan.steps as usize,
            plan.lanes as usize,
            plan.locals as usize,
            plan.conns as usize,
        ];
        if arrays.iter().any(|a| self.in_alloc(*a, false)) {
            // Arrays in device memory may be written by a copy queued before the kernel on
            // this stream (blocker 9): read and validate them when the kernel runs, as a
            // GPU does; a malformed plan is then a kernel fault.
            let p = DeferredPlan(*plan);
            let cmd: KernelFn = Box::new(move || {
                let p = p;
                if let Some(m) = fault {
                    return Err(m);
                }
                // SAFETY: the launch contract keeps the arrays valid until the kernel ran;
                // the copies that fill them ran before this command on the stream.
                let k = unsafe { Kernel::capture(&p.0) }.map_err(|e| e.to_string())?;
                match which {
                    EmuKernel::Rust => {
                        k.run();
                        Ok(())
                    }
                    EmuKernel::Source => {
                        drop(k);
                        // SAFETY: as for `Kernel::capture` just above: the arrays are valid
                        // and filled when this command runs.
                        let sk =
                            unsafe { SourceKernel::capture(&p.0) }.map_err(|e| e.to_string())?;
                        sk.run()
                    }
                }
            });
            self.stream(s)?.push(Cmd::Kernel(cmd))?;
            count_launch(which, ll);
            return Ok(());
        }
        // SAFETY: the launch contract (`DeviceApi::launch_plan`): every array of `plan` is
        // valid now, and these arrays are host memory already written. The Rust
        // capture validates the plan for both implementations (its checks are stricter
        // than the kernel's host-side ones: a malformed plan is an error, never a crash).
        let k = unsafe { Kernel::capture(plan) }?;
        let cmd: KernelFn = match (fault, which) {
            (Some(m), _) => Box::new(move || {
                drop(k);
                Err(m)
            }),
            (None, EmuKernel::Rust) => Box::new(move || {
                k.run();
                Ok(())
            }),
            (None, EmuKernel::Source) => {
                drop(k);
                // SAFETY: the same launch contract: the arrays are readable now.
                let sk = unsafe { SourceKernel::capture(plan) }?;
                Box::new(move || sk.run())
            }
        };
        self.stream(s)?.push(Cmd::Kernel(cmd))?;
        count_launch(which, ll);
        Ok(())
    }
}

/// Counts a launch in this thread's statistics.
fn count_launch(which: EmuKernel, ll: bool) {
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
}

/// A launched plan whose arrays are read when the kernel runs.
struct DeferredPlan(ccl_dev_plan_t);

// SAFETY: the plan's pointers address emulated device / mapped memory that the launch
// contract keeps valid until the kernel ran; nothing in it is tied to the launching thread.
unsafe impl Send for DeferredPlan {}

fn ipc_unsupported() -> CclError {
    CclError::usage(
        "the emulated device (CCLD_DEVICE_EMULATION=1) does not support CUDA IPC \
         (the runtime reaches ranks of other processes through host-staged shared memory)",
    )
}

mod reference;
use reference::Kernel;
pub use reference::{ll_chunk_bytes, ll_flag, ll_lines, ll_unlines};

#[cfg(test)]
pub(crate) mod tests;
