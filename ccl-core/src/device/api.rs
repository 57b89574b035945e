//! The device operations the runtime needs, behind one trait with two implementations:
//! [`CudaApi`] (thin wrappers over the kernels' C ABI, `kernels::ffi`) and
//! [`super::emu::EmuDevice`] (the same semantics on the host CPU, for tests without a GPU).
//!
//! Addresses are `usize` (device addresses for device memory, host addresses for host
//! memory); streams are opaque `usize` handles, where 0 means "the default stream" (CUDA's
//! legacy default stream; the emulator's per-device default stream, see
//! [`DeviceApi::default_stream`]).

use std::ffi::c_void;

use kernels::ffi::{self, ccl_dev_plan_t, ccl_ipc_handle_t, CCL_IPC_HANDLE_BYTES};

use crate::error::{CclError, Result};

/// An opaque stream handle (`cudaStream_t` as an address); 0 = the default stream.
pub type Stream = usize;

/// An opaque event handle (`cudaEvent_t` as an address, created without timing).
pub type Event = usize;

/// A host function enqueued on a stream (`cudaLaunchHostFunc`). It must not call device
/// functions (CUDA forbids it in host callbacks).
pub type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// Pinned host memory mapped into the device's address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// Host address.
    pub host: usize,
    /// Device address of the same bytes.
    pub dev: usize,
}

/// Kinds of memory a pointer can be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtrKind {
    /// Unregistered host memory: kernels cannot reach it.
    Host,
    /// Device memory.
    Device,
    /// Managed (unified) memory.
    Managed,
    /// Pinned host memory (`cudaHostAlloc`, `cudaHostRegister`): kernels reach it through
    /// its device address.
    HostPinned,
}

/// What the runtime knows of a pointer (`cudaPointerGetAttributes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtrInfo {
    pub kind: PtrKind,
    /// The device of device / managed memory, -1 otherwise.
    pub device: i32,
    /// The address kernels use for the bytes at the pointer (0: none).
    pub device_ptr: usize,
}

/// An IPC handle of a device allocation (`cudaIpcMemHandle_t`, 64 bytes).
pub type IpcHandle = [u8; CCL_IPC_HANDLE_BYTES];

/// The device runtime operations (mirroring `kernels/include/ccl_device.h`).
pub trait DeviceApi: Send + Sync + std::fmt::Debug {
    /// Short name for logs ("cuda", "emulated").
    fn name(&self) -> &'static str;
    /// Whether this is the CPU emulator (`CCLD_DEVICE_EMULATION=1`).
    fn is_emulated(&self) -> bool;
    /// Devices visible.
    fn device_count(&self) -> Result<usize>;
    /// The calling thread's current device.
    fn current_device(&self) -> Result<i32>;
    /// Sets the calling thread's current device.
    fn set_device(&self, device: i32) -> Result<()>;
    /// What kind of memory `p` is, whose device it is and the address kernels use for it.
    fn pointer_info(&self, p: usize) -> Result<PtrInfo>;
    /// Whether kernels on `device` can reach memory of `peer`.
    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool>;
    /// Lets kernels on the current device reach memory of `peer` (already enabled: fine).
    fn enable_peer_access(&self, peer: i32) -> Result<()>;
    /// Zeroed pinned host memory mapped for the device.
    fn host_alloc_mapped(&self, bytes: usize) -> Result<Mapped>;
    /// Frees memory from [`DeviceApi::host_alloc_mapped`] (by its host address).
    fn host_free(&self, host: usize) -> Result<()>;
    /// Device memory (not zeroed).
    fn malloc(&self, bytes: usize) -> Result<usize>;
    /// Frees device memory.
    fn free(&self, p: usize) -> Result<()>;
    /// Fills device memory.
    ///
    /// # Safety
    /// `p .. p + bytes` must be device memory of this API.
    unsafe fn memset(&self, p: usize, value: u8, bytes: usize) -> Result<()>;
    /// Synchronous copy (any direction).
    ///
    /// # Safety
    /// Both ranges must be valid for `bytes` bytes.
    unsafe fn memcpy(&self, dst: usize, src: usize, bytes: usize) -> Result<()>;
    /// Copy ordered on `s`.
    ///
    /// # Safety
    /// Both ranges must stay valid for `bytes` bytes until the copy ran on `s`.
    unsafe fn memcpy_async(&self, dst: usize, src: usize, bytes: usize, s: Stream) -> Result<()>;
    /// IPC handle of a device allocation.
    fn ipc_get(&self, p: usize) -> Result<IpcHandle>;
    /// Opens a peer process's allocation.
    fn ipc_open(&self, h: &IpcHandle) -> Result<usize>;
    /// Closes an opened allocation.
    fn ipc_close(&self, p: usize) -> Result<()>;
    /// Whether ranks in other processes can map this API's device memory ([`Self::ipc_get`]
    /// / [`Self::ipc_open`] work): true on CUDA (and HIP), false on the emulator. Without it
    /// the runtime reaches ranks of other processes through host-staged shared memory.
    fn supports_ipc(&self) -> bool;
    /// Pins `bytes` of existing host memory at `host` (for instance a shared-memory
    /// mapping) and maps it for the device (`cudaHostRegister(Mapped | Portable)` +
    /// `cudaHostGetDevicePointer`); returns the device address of `host`. The range must
    /// stay mapped until [`Self::host_unregister`].
    fn host_register(&self, host: usize, bytes: usize) -> Result<usize>;
    /// Undoes [`Self::host_register`] (by the host address it was given).
    fn host_unregister(&self, host: usize) -> Result<()>;
    /// The handle that stream 0 stands for on `device` (CUDA: 0 itself, the legacy
    /// default stream; the emulator: that device's default stream).
    fn default_stream(&self, device: i32) -> Result<Stream>;
    /// A new stream.
    fn stream_create(&self) -> Result<Stream>;
    /// Destroys a stream (after its pending work).
    fn stream_destroy(&self, s: Stream) -> Result<()>;
    /// `true` when all work on `s` is done.
    fn stream_query(&self, s: Stream) -> Result<bool>;
    /// Waits for all work on `s`.
    fn stream_synchronize(&self, s: Stream) -> Result<()>;
    /// Runs `f` on a runtime thread after prior work on `s` (and before later work).
    fn launch_host_fn(&self, s: Stream, f: HostFn) -> Result<()>;
    /// A new event without timing (`cudaEventCreateWithFlags(cudaEventDisableTiming)`).
    fn event_create(&self) -> Result<Event>;
    /// Destroys an event (pending records still complete).
    fn event_destroy(&self, e: Event) -> Result<()>;
    /// Records `e` on `s`: it completes when the work enqueued on `s` so far is done.
    fn event_record(&self, e: Event, s: Stream) -> Result<()>;
    /// Work enqueued on `s` from now on waits until `e`'s last record completed
    /// (`cudaStreamWaitEvent`; an event never recorded is complete).
    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<()>;
    /// `Ok(true)` when the work before `e`'s last record is done, `Ok(false)` while it is
    /// pending, an error when it failed (a kernel fault: sticky, as on CUDA).
    fn event_query(&self, e: Event) -> Result<bool>;
    /// Loads the plan kernel on the current device now (`cudaFuncGetAttributes`), so that
    /// lazy module loading cannot happen at a launch while other kernels spin (issue 15
    /// blocker 6). Called at communicator init.
    fn preload_kernel(&self) -> Result<()>;
    /// Whether `s` is being captured into a CUDA graph (see [`super::capture`]). Default:
    /// never (the emulator has no graphs).
    fn stream_capturing(&self, _s: Stream) -> Result<bool> {
        Ok(false)
    }
    /// Launches one rank's plan kernel on `s`.
    ///
    /// # Safety
    /// Every pointer in `plan` (arrays, conns' slots and counters, buffers, frame, abort
    /// flag, scalar) must be valid as the ABI describes until the kernel finished.
    unsafe fn launch_plan(&self, plan: &ccl_dev_plan_t, s: Stream) -> Result<()>;
}

/// The CUDA (or HIP) runtime through `kernels::ffi`. Nothing of it has run on a GPU yet.
#[derive(Debug, Default)]
pub struct CudaApi;

/// Maps an ABI result code to a `CclError` naming the call (and the runtime's message).
fn check(call: &str, code: i32) -> Result<()> {
    kernels::check_code(code).map_err(|e| match e {
        kernels::DevError::NotBuilt => CclError::usage(format!(
            "{call}: this library was built without device kernels"
        )),
        kernels::DevError::NoDevice(m) => CclError::usage(format!("{call}: no CUDA device: {m}")),
        kernels::DevError::Invalid(m) => CclError::Internal(format!("{call}: invalid: {m}")),
        other => CclError::System(format!("{call} failed: {other}")),
    })
}

/// The host-function trampoline: `user` is a `Box<HostFn>` from [`CudaApi::launch_host_fn`].
unsafe extern "C" fn host_fn_trampoline(user: *mut c_void) {
    if user.is_null() {
        return;
    }
    // SAFETY: `user` came from Box::into_raw(Box<HostFn>) in launch_host_fn and the runtime
    // calls each callback exactly once.
    let f = unsafe { Box::from_raw(user.cast::<HostFn>()) };
    // A panic must not unwind into the C runtime.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!(target: "nccl::COLL", "a device host callback panicked");
    }
}

impl DeviceApi for CudaApi {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn is_emulated(&self) -> bool {
        false
    }

    fn stream_capturing(&self, s: Stream) -> Result<bool> {
        Ok(super::capture::query(s)? == super::capture::CaptureState::Capturing)
    }

    fn device_count(&self) -> Result<usize> {
        kernels::device_count().map_err(|e| CclError::usage(format!("cudaGetDeviceCount: {e}")))
    }

    fn current_device(&self) -> Result<i32> {
        let mut d = -1i32;
        // SAFETY: valid out-pointer.
        check("cudaGetDevice", unsafe { ffi::ccl_dev_get_device(&mut d) })?;
        Ok(d)
    }

    fn set_device(&self, device: i32) -> Result<()> {
        // SAFETY: plain value argument.
        check("cudaSetDevice", unsafe { ffi::ccl_dev_set_device(device) })
    }

    fn pointer_info(&self, p: usize) -> Result<PtrInfo> {
        let mut info = ffi::ccl_dev_ptr_info_t {
            kind: ffi::CCL_PTR_HOST,
            device: -1,
            device_ptr: std::ptr::null_mut(),
        };
        // SAFETY: the function only inspects the address value; valid out-pointer.
        check("cudaPointerGetAttributes", unsafe {
            ffi::ccl_dev_pointer_info(p as *const c_void, &mut info)
        })?;
        Ok(PtrInfo {
            kind: match info.kind {
                ffi::CCL_PTR_DEVICE => PtrKind::Device,
                ffi::CCL_PTR_MANAGED => PtrKind::Managed,
                ffi::CCL_PTR_HOST_PINNED => PtrKind::HostPinned,
                _ => PtrKind::Host,
            },
            device: info.device,
            device_ptr: info.device_ptr as usize,
        })
    }

    fn can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        let mut can = 0i32;
        // SAFETY: plain values and a valid out-pointer.
        check("cudaDeviceCanAccessPeer", unsafe {
            ffi::ccl_dev_can_access_peer(device, peer, &mut can)
        })?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        // SAFETY: plain value argument.
        check("cudaDeviceEnablePeerAccess", unsafe {
            ffi::ccl_dev_enable_peer_access(peer)
        })
    }

    fn host_alloc_mapped(&self, bytes: usize) -> Result<Mapped> {
        let mut host = std::ptr::null_mut();
        let mut dev = std::ptr::null_mut();
        // SAFETY: valid out-pointers.
        check("cudaHostAlloc", unsafe {
            ffi::ccl_dev_host_alloc_mapped(bytes, &mut host, &mut dev)
        })?;
        Ok(Mapped {
            host: host as usize,
            dev: dev as usize,
        })
    }

    fn host_free(&self, host: usize) -> Result<()> {
        // SAFETY: the caller passes an address from host_alloc_mapped (runtime invariant).
        check("cudaFreeHost", unsafe {
            ffi::ccl_dev_host_free(host as *mut c_void)
        })
    }

    fn malloc(&self, bytes: usize) -> Result<usize> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cudaMalloc", unsafe { ffi::ccl_dev_malloc(bytes, &mut p) })?;
        Ok(p as usize)
    }

    fn free(&self, p: usize) -> Result<()> {
        // SAFETY: the caller passes an address from malloc (runtime invariant).
        check("cudaFree", unsafe { ffi::ccl_dev_free(p as *mut c_void) })
    }

    unsafe fn memset(&self, p: usize, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: the trait's contract: `p .. p + bytes` is device memory of this API, which
        // is what cudaMemset writes.
        check("cudaMemset", unsafe {
            ffi::ccl_dev_memset(p as *mut c_void, i32::from(value), bytes)
        })
    }

    unsafe fn memcpy(&self, dst: usize, src: usize, bytes: usize) -> Result<()> {
        // SAFETY: the trait's contract: both ranges are valid for `bytes` bytes, all that
        // cudaMemcpy reads and writes.
        check("cudaMemcpy", unsafe {
            ffi::ccl_dev_memcpy(dst as *mut c_void, src as *const c_void, bytes)
        })
    }

    unsafe fn memcpy_async(&self, dst: usize, src: usize, bytes: usize, s: Stream) -> Result<()> {
        // SAFETY: the trait's contract: both ranges stay valid for `bytes` bytes until the
        // copy ran on `s`, which is as long as cudaMemcpyAsync touches them.
        check("cudaMemcpyAsync", unsafe {
            ffi::ccl_dev_memcpy_async(
                dst as *mut c_void,
                src as *const c_void,
                bytes,
                s as ffi::ccl_stream_t,
            )
        })
    }

    fn ipc_get(&self, p: usize) -> Result<IpcHandle> {
        let mut h = ccl_ipc_handle_t {
            bytes: [0; CCL_IPC_HANDLE_BYTES],
        };
        // SAFETY: valid out-pointer; the runtime only passes its own device allocations.
        check("cudaIpcGetMemHandle", unsafe {
            ffi::ccl_dev_ipc_get_mem_handle(p as *mut c_void, &mut h)
        })?;
        Ok(h.bytes)
    }

    fn ipc_open(&self, h: &IpcHandle) -> Result<usize> {
        let handle = ccl_ipc_handle_t { bytes: *h };
        let mut p = std::ptr::null_mut();
        // SAFETY: valid in/out pointers; a junk handle is reported by the runtime.
        check("cudaIpcOpenMemHandle", unsafe {
            ffi::ccl_dev_ipc_open_mem_handle(&handle, &mut p)
        })?;
        Ok(p as usize)
    }

    fn ipc_close(&self, p: usize) -> Result<()> {
        // SAFETY: the runtime only closes addresses it opened.
        check("cudaIpcCloseMemHandle", unsafe {
            ffi::ccl_dev_ipc_close_mem_handle(p as *mut c_void)
        })
    }

    fn supports_ipc(&self) -> bool {
        true
    }

    fn host_register(&self, host: usize, bytes: usize) -> Result<usize> {
        let mut dev = std::ptr::null_mut();
        // SAFETY: valid out-pointer; CUDA only records the range (the caller keeps it
        // mapped until host_unregister); a bad range is reported as an error.
        check("cudaHostRegister", unsafe {
            ffi::ccl_dev_host_register(host as *mut c_void, bytes, &mut dev)
        })?;
        Ok(dev as usize)
    }

    fn host_unregister(&self, host: usize) -> Result<()> {
        // SAFETY: the runtime only unregisters addresses it registered.
        check("cudaHostUnregister", unsafe {
            ffi::ccl_dev_host_unregister(host as *mut c_void)
        })
    }

    fn default_stream(&self, _device: i32) -> Result<Stream> {
        Ok(0)
    }

    fn stream_create(&self) -> Result<Stream> {
        let mut s = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cudaStreamCreate", unsafe {
            ffi::ccl_dev_stream_create(&mut s)
        })?;
        Ok(s as usize)
    }

    fn stream_destroy(&self, s: Stream) -> Result<()> {
        // SAFETY: the caller passes a stream it created.
        check("cudaStreamDestroy", unsafe {
            ffi::ccl_dev_stream_destroy(s as ffi::ccl_stream_t)
        })
    }

    fn stream_query(&self, s: Stream) -> Result<bool> {
        // SAFETY: a stream handle (0 = default).
        let code = unsafe { ffi::ccl_dev_stream_query(s as ffi::ccl_stream_t) };
        if code == ffi::CCL_DEV_NOT_READY {
            return Ok(false);
        }
        check("cudaStreamQuery", code).map(|()| true)
    }

    fn stream_synchronize(&self, s: Stream) -> Result<()> {
        // SAFETY: a stream handle (0 = default).
        check("cudaStreamSynchronize", unsafe {
            ffi::ccl_dev_stream_synchronize(s as ffi::ccl_stream_t)
        })
    }

    fn launch_host_fn(&self, s: Stream, f: HostFn) -> Result<()> {
        let user = Box::into_raw(Box::new(f));
        // SAFETY: the trampoline takes ownership of `user` exactly once when it runs.
        let code = unsafe {
            ffi::ccl_dev_launch_host_fn(
                s as ffi::ccl_stream_t,
                Some(host_fn_trampoline),
                user.cast::<c_void>(),
            )
        };
        if let Err(e) = check("cudaLaunchHostFunc", code) {
            // SAFETY: the launch failed, so the callback will never run: reclaim the box.
            drop(unsafe { Box::from_raw(user) });
            return Err(e);
        }
        Ok(())
    }

    fn event_create(&self) -> Result<Event> {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("cudaEventCreateWithFlags", unsafe {
            ffi::ccl_dev_event_create_untimed(&mut e)
        })?;
        Ok(e as usize)
    }

    fn event_destroy(&self, e: Event) -> Result<()> {
        // SAFETY: the runtime only destroys events it created.
        check("cudaEventDestroy", unsafe {
            ffi::ccl_dev_event_destroy(e as ffi::ccl_event_t)
        })
    }

    fn event_record(&self, e: Event, s: Stream) -> Result<()> {
        // SAFETY: an event of ours and a stream handle (0 = default).
        check("cudaEventRecord", unsafe {
            ffi::ccl_dev_event_record(e as ffi::ccl_event_t, s as ffi::ccl_stream_t)
        })
    }

    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<()> {
        // SAFETY: a stream handle (0 = default) and an event of ours.
        check("cudaStreamWaitEvent", unsafe {
            ffi::ccl_dev_stream_wait_event(s as ffi::ccl_stream_t, e as ffi::ccl_event_t)
        })
    }

    fn event_query(&self, e: Event) -> Result<bool> {
        // SAFETY: an event of ours.
        let code = unsafe { ffi::ccl_dev_event_query(e as ffi::ccl_event_t) };
        if code == ffi::CCL_DEV_NOT_READY {
            return Ok(false);
        }
        check("cudaEventQuery", code).map(|()| true)
    }

    fn preload_kernel(&self) -> Result<()> {
        let mut regs = 0i32;
        // SAFETY: valid out-pointer.
        check("cudaFuncGetAttributes(ccl_plan_kernel)", unsafe {
            ffi::ccl_dev_preload(&mut regs)
        })?;
        tracing::debug!(target: "nccl::INIT", "plan kernel loaded ({regs} registers per thread)");
        Ok(())
    }

    unsafe fn launch_plan(&self, plan: &ccl_dev_plan_t, s: Stream) -> Result<()> {
        // SAFETY: the trait's contract: every pointer in `plan` stays valid as the ABI
        // describes until the kernel finished; `plan` itself is copied into the launch
        // parameters, so the reference need not outlive this call.
        check("ccl_dev_launch_plan", unsafe {
            ffi::ccl_dev_launch_plan(plan, s as ffi::ccl_stream_t)
        })
    }
}
