//! `ncclMemAlloc` / `ncclMemFree`. Where a communicator created now on the calling thread
//! would use the device backend (CUDA, or the CPU emulator with `CCLD_DEVICE_EMULATION=1`),
//! the memory is device memory of the calling thread's current device, as NCCL returns
//! (NVIDIA's nccl-tests allocate every buffer this way and hand it to kernels). Otherwise it
//! is zeroed, page-aligned host memory for the host backend. Every allocation is tracked,
//! so that freeing an unknown pointer is an error instead of a crash, and each is freed by
//! the API that made it.

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;

use ccl_core::device::api::DeviceApi;
use ccl_core::device::runtime::device_api;
use ccl_core::{CclError, Result};

/// Alignment and size granularity (`NCCL_WIN_REQUIRED_ALIGNMENT`, the x86-64 page size).
pub(crate) const GRANULARITY: usize = 4096;

/// Where an allocation lives.
#[derive(Debug)]
enum Alloc {
    /// Host memory of [`alloc_host`].
    Host(Layout),
    /// Device memory of `api` (freed by it, whatever the current device is then).
    Device(Arc<dyn DeviceApi>),
}

static ALLOCS: LazyLock<Mutex<HashMap<usize, Alloc>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// What [`alloc`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Allocation {
    /// The address (device address for device memory).
    pub ptr: usize,
    /// The device of device memory; `None` for host memory.
    pub device: Option<i32>,
}

/// `ncclMemAlloc`: device memory on the calling thread's current device when the device
/// backend is in use (see the module doc), host memory otherwise; at least `size` bytes
/// (rounded up to [`GRANULARITY`]).
pub(crate) fn alloc(size: usize) -> Result<Allocation> {
    let rounded = round(size)?;
    match device_api(None)? {
        Ok((api, _)) => {
            // The calling thread's current device (NCCL programs cudaSetDevice first).
            let device = api.current_device()?;
            let p = api.malloc(rounded).map_err(|e| {
                CclError::System(format!(
                    "ncclMemAlloc: cannot allocate {rounded} bytes on {} device {device}: {e}",
                    api.name()
                ))
            })?;
            tracing::debug!(target: "nccl::ALLOC",
                "ncclMemAlloc {rounded} bytes of {} device {device} memory at {p:#x}", api.name());
            ALLOCS.lock().insert(p, Alloc::Device(api));
            Ok(Allocation {
                ptr: p,
                device: Some(device),
            })
        }
        Err(_host) => Ok(Allocation {
            ptr: alloc_host(size)?,
            device: None,
        }),
    }
}

fn round(size: usize) -> Result<usize> {
    if size == 0 {
        return Err(CclError::arg("size is 0"));
    }
    size.checked_next_multiple_of(GRANULARITY)
        .filter(|r| *r <= isize::MAX as usize)
        .ok_or_else(|| CclError::arg(format!("size {size} is too large")))
}

/// Allocates at least `size` bytes of host memory (rounded up to [`GRANULARITY`]), zeroed.
pub(crate) fn alloc_host(size: usize) -> Result<usize> {
    if size == 0 {
        return Err(CclError::arg("size is 0"));
    }
    let rounded = size
        .checked_next_multiple_of(GRANULARITY)
        .ok_or_else(|| CclError::arg(format!("size {size} is too large")))?;
    let layout = Layout::from_size_align(rounded, GRANULARITY)
        .map_err(|e| CclError::arg(format!("size {size}: {e}")))?;
    // SAFETY: `layout` has a non-zero size (size > 0 was checked above).
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(CclError::System(format!(
            "cannot allocate {rounded} bytes of host memory"
        )));
    }
    ALLOCS.lock().insert(p as usize, Alloc::Host(layout));
    Ok(p as usize)
}

/// Frees memory from [`alloc`] / [`alloc_host`]. Null is a no-op; any other unknown
/// pointer is an error.
pub(crate) fn free(ptr: usize) -> Result<()> {
    if ptr == 0 {
        return Ok(());
    }
    let a = ALLOCS.lock().remove(&ptr).ok_or_else(|| {
        CclError::arg(format!(
            "pointer {ptr:#x} was not returned by ncclMemAlloc (or was already freed)"
        ))
    })?;
    match a {
        Alloc::Host(layout) => {
            // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly `layout` and has
            // just been removed from the table, so it is freed once.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            Ok(())
        }
        Alloc::Device(api) => api.free(ptr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_cycle() {
        let p = alloc_host(10).unwrap();
        assert_eq!(p % GRANULARITY, 0);
        // SAFETY: p points to at least GRANULARITY zeroed bytes owned by this test.
        let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, GRANULARITY) };
        assert!(s.iter().all(|b| *b == 0));
        s[GRANULARITY - 1] = 7;
        free(p).unwrap();
        let e = free(p).unwrap_err();
        assert_eq!(e.code() as i32, 4);
        assert!(free(0x1234).is_err());
        free(0).unwrap();
        assert!(alloc_host(0).is_err());
        assert!(alloc_host(usize::MAX).is_err());
        assert!(alloc(0).is_err());
        assert!(alloc(usize::MAX).is_err());
    }
}
