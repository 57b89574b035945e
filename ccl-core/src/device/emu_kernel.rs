//! Which kernel the emulated device runs for a launched plan: by default the real kernel
//! source (`kernels/src/ccl_kernel_body.h`, the device part of `ccl_kernels.cu`) compiled
//! for the CPU ([`kernels::sim`]); with `CCLD_EMU_KERNEL=rust`, the Rust re-implementation
//! in [`super::emu`], kept as an independent second implementation of the same protocol
//! (the device suites can run against either and compare both with the host reference).

use kernels::ffi::{
    ccl_dev_conn_t, ccl_dev_lane_t, ccl_dev_local_t, ccl_dev_plan_t, ccl_dev_step_t,
};

use crate::error::{CclError, Result};

/// The kernel implementation the emulated device runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmuKernel {
    /// The kernel source compiled for the host (`kernels::sim`), the default.
    Source,
    /// The Rust re-implementation (`CCLD_EMU_KERNEL=rust`).
    Rust,
}

/// Parses a `CCLD_EMU_KERNEL` value (`None`: unset).
pub fn parse_emu_kernel(v: Option<&str>) -> Result<EmuKernel> {
    match v.map(str::trim) {
        None | Some("") | Some("source") => Ok(EmuKernel::Source),
        Some("rust") => Ok(EmuKernel::Rust),
        Some(o) => Err(CclError::usage(format!(
            "CCLD_EMU_KERNEL={o:?}: expected `source` (the kernel source compiled for the \
             CPU, default) or `rust` (the Rust re-implementation)"
        ))),
    }
}

/// The implementation selected by `CCLD_EMU_KERNEL` now (read at every launch, so that a
/// test process can switch it).
pub fn emu_kernel() -> Result<EmuKernel> {
    parse_emu_kernel(ccl_params::CCLD_EMU_KERNEL.raw().ok().flatten().as_deref())
}

/// A plan for the compiled kernel: the launch parameters with the arrays copied (the
/// caller may free its arrays once the launch returned, as with a CUDA launch whose arrays
/// the runtime keeps alive; the copies make the emulator independent of that).
pub struct SourceKernel {
    plan: ccl_dev_plan_t,
    _steps: Vec<ccl_dev_step_t>,
    _lanes: Vec<ccl_dev_lane_t>,
    _locals: Vec<ccl_dev_local_t>,
    _conns: Vec<ccl_dev_conn_t>,
}

// SAFETY: the plan's pointers address the owned arrays above (heap memory that does not
// move with the struct) and emulated device memory, which the launch contract keeps valid
// until the kernel finished; nothing in the struct is tied to the launching thread.
unsafe impl Send for SourceKernel {}

/// Copies `n` entries of an ABI array (`n == 0`: empty).
///
/// # Safety
/// `p` must point to `n` readable `T` when `n > 0`.
unsafe fn copy_array<T: Copy>(p: *const T, n: u32, what: &str) -> Result<Vec<T>> {
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

impl SourceKernel {
    /// Copies the plan's arrays (the plan was validated by the caller).
    ///
    /// # Safety
    /// The plan's arrays must be readable now.
    pub unsafe fn capture(p: &ccl_dev_plan_t) -> Result<SourceKernel> {
        // SAFETY: the caller guarantees the arrays are readable.
        let (steps, lanes, locals, conns) = unsafe {
            (
                copy_array(p.steps, p.n_steps, "steps")?,
                copy_array(p.lanes, p.n_lanes, "lanes")?,
                copy_array(p.locals, p.n_locals, "locals")?,
                copy_array(p.conns, p.n_conns, "conns")?,
            )
        };
        let mut plan = *p;
        plan.steps = steps.as_ptr();
        plan.lanes = lanes.as_ptr();
        plan.locals = locals.as_ptr();
        plan.conns = conns.as_ptr();
        Ok(SourceKernel {
            plan,
            _steps: steps,
            _lanes: lanes,
            _locals: locals,
            _conns: conns,
        })
    }

    /// Runs the kernel to completion on the calling (stream) thread. A launch that fails
    /// (the plan passed the emulator's stricter checks, so only thread creation can fail)
    /// is reported as a kernel fault of the stream.
    pub fn run(self) -> std::result::Result<(), String> {
        // SAFETY: the arrays are owned by self; buffers, slots, counters, frame and abort
        // flag are emulated device / mapped memory valid until the kernel finished (launch
        // contract of DeviceApi::launch_plan).
        unsafe { kernels::sim::launch_plan(&self.plan) }
            .map_err(|e| format!("emulated kernel launch failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emu_kernel_values_parse_and_bad_ones_name_the_choices() {
        assert_eq!(parse_emu_kernel(None).unwrap(), EmuKernel::Source);
        assert_eq!(parse_emu_kernel(Some("source")).unwrap(), EmuKernel::Source);
        assert_eq!(parse_emu_kernel(Some(" rust ")).unwrap(), EmuKernel::Rust);
        let e = parse_emu_kernel(Some("cuda")).unwrap_err().to_string();
        assert!(e.contains("CCLD_EMU_KERNEL") && e.contains("rust"), "{e}");
    }
}
