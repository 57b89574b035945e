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
    // SAFETY: forwarded to the caller's contract.
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
