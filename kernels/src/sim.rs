//! The device part of `ccl_kernels.cu` (`src/ccl_kernel_body.h`) compiled for the host CPU
//! (`src/host_kernel.cpp`, `include/ccl_sim.h`): the real kernel source, run with one OS
//! thread per CUDA thread. Always built; the emulated device (`CCLD_DEVICE_EMULATION=1`)
//! launches its plans here.

use std::ffi::CStr;

use crate::{ffi, DevError};

/// Threads per block of this build (`CCL_THREADS`, set by `CCLD_SIM_THREADS` at build time).
pub fn threads() -> u32 {
    // SAFETY: no preconditions.
    unsafe { ffi::ccl_sim_threads() }
}

/// True when the host build is instrumented with ThreadSanitizer (`CCLD_KERNEL_TSAN=1`).
pub fn tsan() -> bool {
    // SAFETY: no preconditions.
    unsafe { ffi::ccl_sim_tsan() != 0 }
}

/// ThreadSanitizer: the calling thread releases the sync object at `addr` (call before
/// the store or unlock that publishes to another thread). A no-op unless [`tsan`].
pub fn hb_release(addr: usize) {
    // SAFETY: an annotation only; TSan never dereferences the address.
    unsafe { ffi::ccl_sim_hb_release(addr as *const std::ffi::c_void) }
}

/// ThreadSanitizer: the calling thread acquires the sync object at `addr` (call after the
/// load or lock that observed another thread's release). A no-op unless [`tsan`].
pub fn hb_acquire(addr: usize) {
    // SAFETY: an annotation only; TSan never dereferences the address.
    unsafe { ffi::ccl_sim_hb_acquire(addr as *const std::ffi::c_void) }
}

fn result(code: i32) -> Result<(), DevError> {
    // SAFETY: ccl_sim_last_error never returns NULL; it points to a NUL-terminated
    // thread-local buffer that lives as long as the thread.
    let msg = unsafe { CStr::from_ptr(ffi::ccl_sim_last_error()) };
    crate::check(code, msg)
}

/// Runs `plan`'s kernel on the CPU and returns when every block finished.
///
/// # Safety
/// Every pointer of the plan must be valid as for `ccl_dev_launch_plan` (arrays readable,
/// buffers, slots, counters, frame and abort flag readable and writable as the plan uses
/// them) until this call returns; memory other agents (other ranks, the host) access
/// concurrently must be the counters, LL lines and frame words the protocol defines.
pub unsafe fn launch_plan(plan: &ffi::ccl_dev_plan_t) -> Result<(), DevError> {
    // SAFETY: every pointer of `plan` is valid as `ccl_sim_launch_plan` needs until it
    // returns (this function's `# Safety`, the same requirement).
    result(unsafe { ffi::ccl_sim_launch_plan(plan) })
}

/// One element through the host build's element code (`ccl_dev_host_elem`): `finish?(in
/// OP pre(local))` or `finish?(pre(local))`, values as little-endian bits.
#[allow(clippy::too_many_arguments)]
pub fn host_elem(
    dtype: u32,
    op: u32,
    avg_divisor: u32,
    scalar_bits: u64,
    inc: Option<u64>,
    local: u64,
    finish: bool,
) -> Result<u64, DevError> {
    let mut out = 0u64;
    // SAFETY: `out` is a valid out-pointer; no other preconditions.
    let code = unsafe {
        ffi::ccl_sim_host_elem(
            dtype,
            op,
            avg_divisor,
            scalar_bits,
            i32::from(inc.is_some()),
            inc.unwrap_or(0),
            local,
            i32::from(finish),
            &mut out,
        )
    };
    result(code)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::*;

    fn plan() -> ccl_dev_plan_t {
        // SAFETY: every field of the plan is an integer or a raw pointer; all-zero is a
        // valid value of each (NULL pointers, counts 0).
        let mut p: ccl_dev_plan_t = unsafe { std::mem::zeroed() };
        p.n_channels = 1;
        p.unit = 4;
        p.stall_channel = CCL_STALL_NONE;
        p
    }

    fn refusal(p: &ccl_dev_plan_t) -> String {
        // SAFETY: every refused plan is rejected by the host-side checks before any
        // pointer is used; the accepted empty plan has no arrays to read.
        match unsafe { launch_plan(p) } {
            Err(DevError::Invalid(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_host_launcher_refuses_malformed_plans_naming_the_field() {
        type Edit = fn(&mut ccl_dev_plan_t);
        let cases: [(&str, Edit); 8] = [
            ("n_channels", |p| p.n_channels = 0),
            ("n_channels", |p| p.n_channels = 33),
            ("unit out of", |p| p.unit = 9),
            ("bad dtype or op", |p| {
                p.reduce = 1;
                p.dtype = 12;
            }),
            ("element size", |p| {
                p.reduce = 1;
                p.dtype = 8;
            }),
            ("missing arrays", |p| p.n_lanes = 1),
            ("protocol", |p| p.proto = 2),
            ("stall_channel", |p| p.stall_channel = 1),
        ];
        for (want, f) in cases {
            let mut p = plan();
            f(&mut p);
            let m = refusal(&p);
            assert!(m.contains(want), "{want}: {m}");
        }
        // SAFETY: a plan without lanes, locals or frame touches no memory.
        assert_eq!(unsafe { launch_plan(&plan()) }, Ok(()));
        // SAFETY: a NULL plan is refused before use.
        let code = unsafe { ffi::ccl_sim_launch_plan(std::ptr::null()) };
        assert_eq!(
            result(code),
            Err(DevError::Invalid(
                "ccl_dev_launch_plan: plan is NULL".into()
            ))
        );
    }

    #[test]
    fn the_build_reports_its_threads_per_block() {
        // build.rs passes CCLD_SIM_THREADS (default 2) as CCL_THREADS.
        let want = std::env::var("CCLD_SIM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2u32);
        assert_eq!(threads(), want);
        assert_eq!(
            tsan(),
            std::env::var("CCLD_KERNEL_TSAN").is_ok_and(|v| v == "1")
        );
    }
}
