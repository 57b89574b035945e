//! Device kernels (CUDA C++ built by nvcc; the same sources build with hipcc through
//! `include/ccl_portability.h`) and the small C ABI the host runtime calls
//! (`include/ccl_device.h`).
//!
//! This crate holds hand-written Rust mirrors of that header ([`ffi`]); the tests check
//! them against the header: struct layouts against the C compiler's `sizeof`/`offsetof`
//! (a C object built from the same header), function signatures against the header text.
//! The functions are only linked when nvcc was found at build time ([`cuda_built`]);
//! without it the crate still builds and the safe wrappers report [`DevError::NotBuilt`].
//!
//! Status: the kernels and the ABI compile (CI builds them for sm_80/sm_90/sm_100/sm_120
//! and, through `scripts/build-rocm.sh`, for AMD gfx90a); they have NOT been executed on a
//! GPU yet. The same kernel source, compiled for the CPU ([`sim`]), is what the emulated
//! device runs in the tests (see docs/device-backend.md).

#![warn(unreachable_pub)]

pub mod ffi;
pub mod sim;

use std::ffi::CStr;

/// True when this build contains the CUDA kernels (nvcc was found by build.rs).
pub fn cuda_built() -> bool {
    cfg!(ccl_cuda)
}

/// Failure of a device call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DevError {
    /// The library was built without device kernels (no nvcc at build time).
    NotBuilt,
    /// No driver or no device (`cudaGetDeviceCount` failed or returned 0).
    NoDevice(String),
    /// A CUDA/HIP runtime call failed.
    Runtime(String),
    /// An argument of the ABI was invalid.
    Invalid(String),
    /// Any other result code.
    Other(i32, String),
}

impl std::fmt::Display for DevError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DevError::NotBuilt => write!(f, "built without device kernels (no nvcc at build time)"),
            DevError::NoDevice(m) => write!(f, "no CUDA device: {m}"),
            DevError::Runtime(m) => write!(f, "CUDA runtime error: {m}"),
            DevError::Invalid(m) => write!(f, "invalid device call: {m}"),
            DevError::Other(c, m) => write!(f, "device call failed ({c}): {m}"),
        }
    }
}

impl std::error::Error for DevError {}

/// Maps a `ccl_dev_result_t` returned by an [`ffi`] function on this thread to a `Result`
/// (with the message of the failing call). Without the kernels every call reports
/// [`DevError::NotBuilt`].
pub fn check_code(code: i32) -> Result<(), DevError> {
    if !cuda_built() {
        return Err(DevError::NotBuilt);
    }
    // SAFETY: ccl_dev_last_error never returns NULL; it points to a NUL-terminated
    // thread-local buffer that lives as long as the thread.
    let msg = unsafe { CStr::from_ptr(ffi::ccl_dev_last_error()) };
    check(code, msg)
}

/// Maps a `ccl_dev_result_t` to a `Result`, taking the message of the failing call.
fn check(code: i32, last_error: &CStr) -> Result<(), DevError> {
    let msg = || last_error.to_string_lossy().into_owned();
    match code {
        ffi::CCL_DEV_OK => Ok(()),
        ffi::CCL_DEV_NO_DEVICE => Err(DevError::NoDevice(msg())),
        ffi::CCL_DEV_RUNTIME_ERROR => Err(DevError::Runtime(msg())),
        ffi::CCL_DEV_INVALID => Err(DevError::Invalid(msg())),
        c => Err(DevError::Other(c, msg())),
    }
}

/// Number of CUDA devices visible to this process. `Err(NoDevice)` when there is no driver
/// or no device (never aborts), `Err(NotBuilt)` without the kernels.
pub fn device_count() -> Result<usize, DevError> {
    #[cfg(ccl_cuda)]
    {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer for the duration of the call; the function
        // only writes an int32 there.
        let code = unsafe { ffi::ccl_dev_device_count(&mut n) };
        // SAFETY: ccl_dev_last_error never returns NULL; it points to a NUL-terminated
        // thread-local buffer that lives as long as the thread.
        let msg = unsafe { CStr::from_ptr(ffi::ccl_dev_last_error()) };
        check(code, msg)?;
        Ok(usize::try_from(n).unwrap_or(0))
    }
    #[cfg(not(ccl_cuda))]
    {
        Err(DevError::NotBuilt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_gets_the_cuda_build_it_expects() {
        // CI sets CCLD_EXPECT_CUDA=1 after installing nvcc (scripts/gpu/ci-device-build.sh):
        // a build that silently fell back to host-only must fail there. Unset: no claim.
        if std::env::var(ccl_params::CCLD_EXPECT_CUDA.name).is_ok_and(|v| v == "1") {
            assert!(
                cuda_built(),
                "CCLD_EXPECT_CUDA=1 but the kernels were built without nvcc"
            );
        }
    }

    #[test]
    fn result_codes_map_to_typed_errors() {
        let m = c"boom";
        assert_eq!(check(ffi::CCL_DEV_OK, m), Ok(()));
        assert_eq!(
            check(ffi::CCL_DEV_NO_DEVICE, m),
            Err(DevError::NoDevice("boom".into()))
        );
        assert_eq!(
            check(ffi::CCL_DEV_RUNTIME_ERROR, m),
            Err(DevError::Runtime("boom".into()))
        );
        assert_eq!(
            check(ffi::CCL_DEV_INVALID, m),
            Err(DevError::Invalid("boom".into()))
        );
        assert_eq!(check(42, m), Err(DevError::Other(42, "boom".into())));
    }

    #[test]
    fn device_count_reports_no_device_or_not_built_without_a_gpu() {
        // This machine (and CI) has no GPU: the call must fail gracefully, never abort.
        // On a GPU machine it returns the device count.
        match device_count() {
            Ok(n) => assert!(n > 0),
            Err(DevError::NotBuilt) => assert!(!cuda_built()),
            Err(DevError::NoDevice(m)) => {
                assert!(cuda_built());
                assert!(!m.is_empty());
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
}
