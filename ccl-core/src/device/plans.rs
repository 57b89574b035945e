//! Where the kernel reads its plan arrays (issue 15, blocker 9).
//!
//! The runtime writes an operation's arrays (steps, lanes, locals, connections) into
//! mapped host memory (cached per plan shape). Read from there, every step of the kernel
//! fetches its descriptors over PCIe. With `CCLD_DEVICE_PLANS=device` (the default) each
//! new block of arrays is also copied into device memory of the communicator
//! (`cudaMemcpyAsync` on the operation's stream, before its kernel; ordered after the
//! previous operation by the communicator's event, `super::order`) and the kernel reads
//! that copy: once per plan shape for cached arrays, per operation for one-off arrays
//! (LL scrubs, shapes beyond the cache). `CCLD_DEVICE_PLANS=mapped` keeps the old
//! behaviour, so that the GPU suite can measure the difference
//! (`scripts/gpu-suite.sh`, part p). Not measured yet: no GPU has run this code.

use crate::error::{CclError, Result};

/// `CCLD_DEVICE_PLANS`: `device` (default) or `mapped`.
pub const ENV_DEVICE_PLANS: &ccl_params::Param = &ccl_params::CCLD_DEVICE_PLANS;

/// Where the kernel reads its plan arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanMem {
    /// A copy in device memory (default).
    Device,
    /// The mapped host memory the runtime wrote (over PCIe on a GPU).
    Mapped,
}

/// Parses `CCLD_DEVICE_PLANS` (unset or empty = device).
pub fn parse_plan_mem(raw: Option<&str>) -> Result<PlanMem> {
    match raw.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("device") => Ok(PlanMem::Device),
        Some("mapped") => Ok(PlanMem::Mapped),
        Some(v) => Err(CclError::arg(format!(
            "{ENV_DEVICE_PLANS}={v:?} must be device (plan arrays copied to device memory, \
             default) or mapped (read from mapped host memory)"
        ))),
    }
}

/// The setting of this process.
pub fn from_env() -> Result<PlanMem> {
    parse_plan_mem(crate::env::var(ENV_DEVICE_PLANS)?.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_and_a_bad_one_names_the_variable() {
        assert_eq!(parse_plan_mem(None).unwrap(), PlanMem::Device);
        assert_eq!(parse_plan_mem(Some("")).unwrap(), PlanMem::Device);
        assert_eq!(parse_plan_mem(Some(" Device ")).unwrap(), PlanMem::Device);
        assert_eq!(parse_plan_mem(Some("mapped")).unwrap(), PlanMem::Mapped);
        let e = parse_plan_mem(Some("gpu")).unwrap_err().to_string();
        assert!(
            e.contains(ENV_DEVICE_PLANS.name) && e.contains("mapped"),
            "{e}"
        );
    }
}
