//! CUDA graph capture (issue 15, blocker 3). Every device operation enqueues one-shot host
//! callbacks (`cudaLaunchHostFunc` with a closure freed when it runs): a graph captured
//! from such a stream would call freed memory on its second replay. Until the callbacks
//! are persistent, an operation on a capturing stream is refused with `ncclInvalidUsage`
//! before anything is enqueued, and the message says what to do instead.
//!
//! Detection asks the CUDA driver (`cuStreamIsCapturing` of `libcuda.so.1`, loaded once
//! with `dlopen`): stream handles are the same objects for the runtime and the driver, and
//! the driver is present wherever a stream can exist. Without the driver (no GPU, the
//! emulator) nothing can be capturing.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use crate::error::{CclError, Result};

/// `CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus*)`.
type IsCapturingFn = unsafe extern "C" fn(stream: *mut c_void, status: *mut c_int) -> c_int;

/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` .. `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`
/// (900..=908, `..._CAPTURED_EVENT` and `..._STREAM_CAPTURE_IMPLICIT` among them): the
/// driver refused the query because of a capture in progress.
const CAPTURE_ERRORS: std::ops::RangeInclusive<c_int> = 900..=908;

/// What the driver said about a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureState {
    /// Not capturing (or no driver: nothing can be).
    Idle,
    /// `cudaStreamCaptureStatusActive` or `...Invalidated`, or a capture error.
    Capturing,
}

/// Interprets `cuStreamIsCapturing`'s result and status. Pure.
pub fn interpret(result: c_int, status: c_int) -> std::result::Result<CaptureState, String> {
    match result {
        0 if status == 0 => Ok(CaptureState::Idle),
        0 => Ok(CaptureState::Capturing),
        // CUDA_ERROR_NOT_INITIALIZED / _DEINITIALIZED: no context, so no capture either.
        3 | 4 => Ok(CaptureState::Idle),
        r if CAPTURE_ERRORS.contains(&r) => Ok(CaptureState::Capturing),
        r => Err(format!("cuStreamIsCapturing failed with CUresult {r}")),
    }
}

/// The refusal of an operation on a capturing stream (`ncclInvalidUsage`).
pub fn refusal(label: &str, stream: usize) -> CclError {
    CclError::usage(format!(
        "{label}: stream {stream:#x} is being captured into a CUDA graph; this library does \
         not support graph capture yet (its per-operation host callbacks are one-shot, a \
         replayed graph would call freed memory). Run the operation outside capture \
         (nccl-tests: drop -G / --cudagraph)"
    ))
}

fn driver_fn() -> Option<IsCapturingFn> {
    static F: OnceLock<Option<usize>> = OnceLock::new();
    let addr = *F.get_or_init(|| {
        // SAFETY: NUL-terminated name; dlopen has no other preconditions. The handle is
        // kept for the life of the process (never dlclosed), so the symbol stays valid.
        let h =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return None;
        }
        // SAFETY: valid handle, NUL-terminated name.
        let s = unsafe { libc::dlsym(h, c"cuStreamIsCapturing".as_ptr()) };
        (!s.is_null()).then_some(s as usize)
    });
    // SAFETY: the address is the driver's cuStreamIsCapturing, whose C signature is
    // `CUresult (CUstream, CUstreamCaptureStatus*)`, i.e. IsCapturingFn.
    addr.map(|a| unsafe { std::mem::transmute::<usize, IsCapturingFn>(a) })
}

/// Whether `stream` (a `cudaStream_t` as an address; 0 = legacy default stream) is being
/// captured, according to the CUDA driver. `Idle` without a driver.
pub fn query(stream: usize) -> Result<CaptureState> {
    let Some(f) = driver_fn() else {
        return Ok(CaptureState::Idle);
    };
    let mut status: c_int = 0;
    // SAFETY: `f` is cuStreamIsCapturing; `stream` is the caller's stream handle (the
    // operation is about to be enqueued on it, so it must be valid), `status` is writable.
    let r = unsafe { f(stream as *mut c_void, &mut status) };
    interpret(r, status).map_err(CclError::System)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_answers_are_interpreted() {
        assert_eq!(interpret(0, 0), Ok(CaptureState::Idle));
        assert_eq!(interpret(0, 1), Ok(CaptureState::Capturing), "active");
        assert_eq!(interpret(0, 2), Ok(CaptureState::Capturing), "invalidated");
        assert_eq!(interpret(906, 0), Ok(CaptureState::Capturing), "implicit");
        assert_eq!(
            interpret(3, 0),
            Ok(CaptureState::Idle),
            "driver not initialised"
        );
        assert_eq!(interpret(900, 0), Ok(CaptureState::Capturing));
        let e = interpret(400, 0).unwrap_err();
        assert!(e.contains("400"), "{e}");
        assert!(interpret(909, 0).is_err());
    }

    #[test]
    fn refusal_is_invalid_usage_and_says_why() {
        let e = refusal("AllReduce (count 4, float32)", 0x1234);
        assert_eq!(e.code() as i32, 5, "ncclInvalidUsage");
        let m = e.to_string();
        assert!(m.contains("AllReduce") && m.contains("0x1234"), "{m}");
        assert!(m.contains("CUDA graph"), "{m}");
    }

    #[test]
    fn without_a_gpu_driver_nothing_is_capturing() {
        // The CI machine has no libcuda.so.1; with one (a GPU machine) the legacy default
        // stream is not capturing in this test process either.
        assert_eq!(query(0).unwrap(), CaptureState::Idle);
    }
}
