//! Backend selection: `CCLD_BACKEND`, the device probe, and the device API a communicator
//! runs on.

use super::*;

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

/// What the system shows of a GPU whatever CUDA says (see [`crate::device::agree::gpu_evidence`]),
/// and whether `CUDA_VISIBLE_DEVICES` is set.
pub type GpuSeen = (Option<String>, bool);

/// Decides the backend from the variables and what the device probe found (`probe` is
/// only called when needed). `hint`: the device `ncclCommInitAll` assigned, if any. `gpu`
/// (called only when the probe found no usable device): when a GPU is present but CUDA
/// failed, init fails instead of falling back to the host backend
/// ([`crate::device::agree::fallback`]).
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
            match crate::device::agree::fallback(&why, evidence.as_deref(), visible_set) {
                crate::device::agree::Fallback::Quiet => Ok(Decision::Host(why)),
                crate::device::agree::Fallback::Loud(m) => {
                    warn_once(&m);
                    Ok(Decision::Host(m))
                }
                crate::device::agree::Fallback::Refuse(m) => {
                    warn_once(&m);
                    Err(CclError::System(m))
                }
            }
        }
        (Backend::Host, why) => Ok(Decision::Host(why)),
    }
}

/// A WARN line once per process (the decision runs at every init and `ncclMemAlloc`).
pub(super) fn warn_once(m: &str) {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| tracing::warn!(target: "nccl::INIT", "{m}"));
}

pub(super) fn gpu_seen() -> GpuSeen {
    (
        crate::device::agree::gpu_evidence(),
        std::env::var_os("CUDA_VISIBLE_DEVICES").is_some(),
    )
}

pub(super) fn cuda_probe() -> DeviceProbe {
    let p = crate::device::probe_device();
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
                let emu = crate::device::emu::global();
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
    let key = (api.is_emulated(), device, bytes);
    let m = match parked_frames().take(key) {
        Some(m) => m,
        None => api.host_alloc_mapped(bytes)?,
    };
    // The abort flag and start gate, the descriptor check's area, the completion words.
    let abort = match api.host_alloc_mapped(ABORT_MEM_BYTES) {
        Ok(a) => a,
        Err(e) => {
            parked_frames().put(key, m);
            return Err(e);
        }
    };
    // Released when the frame's last reference drops, on whatever thread that is: parked
    // for the next communicator, not freed (see `ParkedFrames`).
    let release = Box::new(move || parked_frames().put(key, m));
    // SAFETY: `m.host` is zeroed mapped memory of total_bytes(channels) bytes (fresh, or
    // parked and zeroed by `take`), page (or 256-byte) aligned, never freed while the frame
    // lives; only the frame and kernels (through the device alias, plain aligned 8-byte
    // stores) access it.
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

/// (emulated, device, bytes) of a probe frame's mapped block.
type FrameKey = (bool, i32, usize);

/// Mapped blocks of the probe frames of destroyed communicators, kept for the next
/// communicators of the process instead of being freed.
///
/// A frame is released when its last reference drops, on whatever thread that is (the
/// probe's diagnostic thread, usually, after the communicator's last records). There,
/// `cudaFreeHost` waited for the whole device to go idle while holding the driver's lock:
/// on an H200 it waited for another communicator's kernel that waited for a peer rank
/// whose next launch waited for that lock (ranks as threads of one process; a hang in 2 of
/// 5 runs of `device_report`). Parked blocks are reused by equal frames and freed only when
/// the process exits; what stays allocated is bounded by the most frames alive at once.
#[derive(Default)]
pub(crate) struct ParkedFrames {
    blocks: Mutex<Vec<(FrameKey, Mapped)>>,
}

impl ParkedFrames {
    /// A parked block for `key`, zeroed (as a new frame needs it), if there is one.
    pub(crate) fn take(&self, key: FrameKey) -> Option<Mapped> {
        let m = {
            let mut b = self.blocks.lock();
            let i = b.iter().position(|(k, _)| *k == key)?;
            b.swap_remove(i).1
        };
        // SAFETY: a parked block is `key.2` bytes of mapped memory that nothing uses any
        // more (its frame was released, its communicator's kernels ended before).
        unsafe { std::ptr::write_bytes(m.host as *mut u8, 0, key.2) };
        Some(m)
    }

    /// Parks a block no frame uses any more.
    pub(crate) fn put(&self, key: FrameKey, m: Mapped) {
        self.blocks.lock().push((key, m));
    }

    /// Blocks parked now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.blocks.lock().len()
    }
}

/// The process's parked frame blocks.
pub(crate) fn parked_frames() -> &'static ParkedFrames {
    static PARKED: std::sync::OnceLock<ParkedFrames> = std::sync::OnceLock::new();
    PARKED.get_or_init(ParkedFrames::default)
}
