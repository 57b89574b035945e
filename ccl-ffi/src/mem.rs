//! `ncclMemAlloc` / `ncclMemFree` on the host backend: zeroed, page-aligned host memory,
//! tracked so that freeing an unknown pointer is an error instead of a crash.

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use ccl_core::{CclError, Result};

/// Alignment and size granularity (`NCCL_WIN_REQUIRED_ALIGNMENT`, the x86-64 page size).
pub const GRANULARITY: usize = 4096;

static ALLOCS: LazyLock<Mutex<HashMap<usize, Layout>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Allocates at least `size` bytes (rounded up to [`GRANULARITY`]), zeroed.
pub fn alloc(size: usize) -> Result<usize> {
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
    ALLOCS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p as usize, layout);
    Ok(p as usize)
}

/// Frees memory from [`alloc`]. Null is a no-op; any other unknown pointer is an error.
pub fn free(ptr: usize) -> Result<()> {
    if ptr == 0 {
        return Ok(());
    }
    let layout = ALLOCS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&ptr)
        .ok_or_else(|| {
            CclError::arg(format!(
                "pointer {ptr:#x} was not returned by ncclMemAlloc (or was already freed)"
            ))
        })?;
    // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly `layout` and has just been
    // removed from the table, so it is freed once.
    unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_cycle() {
        let p = alloc(10).unwrap();
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
        assert!(alloc(0).is_err());
        assert!(alloc(usize::MAX).is_err());
    }
}
