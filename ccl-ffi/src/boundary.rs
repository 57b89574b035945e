//! The panic boundary and the thread-local last-error message behind every export.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use ccl_core::{CclError, Result};

/// `ncclResult_t` as the C ABI passes it.
pub(crate) type NcclResult = i32;

/// `ncclSuccess`.
pub(crate) const SUCCESS: NcclResult = 0;
/// `ncclInternalError`.
pub(crate) const INTERNAL_ERROR: NcclResult = 3;
/// `ncclInProgress`.
pub(crate) const IN_PROGRESS: NcclResult = 7;

thread_local! {
    /// Message of the most recent failing call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// Storage for strings handed out by `ncclGetLastError` that do not come from
    /// `LAST_ERROR` (a communicator's own message).
    static RETURNED: RefCell<CString> = RefCell::new(CString::default());
}

fn to_cstring(msg: &str) -> CString {
    // Interior NULs would truncate the C string: replace them.
    CString::new(msg.replace('\0', "?")).unwrap_or_default()
}

/// Records `msg` as this thread's last error.
pub(crate) fn set_last_error(msg: &str) {
    let c = to_cstring(msg);
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// This thread's last error message (empty when no call failed yet).
#[cfg(test)]
pub(crate) fn last_error() -> String {
    LAST_ERROR.with(|l| l.borrow().to_string_lossy().into_owned())
}

/// Pointer for `ncclGetLastError`: this thread's last error, or `fallback` (the
/// communicator's message) when this thread has none. Valid until the next failing call,
/// or the next `ncclGetLastError`, on this thread.
pub(crate) fn last_error_ptr(fallback: Option<String>) -> *const c_char {
    let own_empty = LAST_ERROR.with(|l| l.borrow().as_bytes().is_empty());
    match fallback {
        Some(msg) if own_empty => RETURNED.with(|r| {
            *r.borrow_mut() = to_cstring(&msg);
            r.borrow().as_ptr()
        }),
        // The CString lives in a thread-local that is only replaced by a later failing call
        // on this thread, so the pointer stays valid as NCCL documents.
        _ => LAST_ERROR.with(|l| l.borrow().as_ptr()),
    }
}

/// The message of a caught panic.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// The error returned by functions this library does not implement.
pub(crate) fn unsupported(name: &str) -> CclError {
    CclError::usage(format!("{name} is not supported by this library yet"))
}

fn record_error(name: &str, e: &CclError) -> NcclResult {
    let text = e.to_string();
    let msg = if text.contains(name) {
        text
    } else {
        format!("{name}: {text}")
    };
    tracing::warn!(target: "nccl::CALL", "{msg}");
    set_last_error(&msg);
    e.code() as NcclResult
}

/// Runs the body of an export: installs logging on first use, turns errors into
/// `ncclResult_t` codes with a last-error message, and a panic into `ncclInternalError`.
pub(crate) fn call(name: &'static str, f: impl FnOnce() -> Result<()>) -> NcclResult {
    ccl_core::debug::init();
    crate::sigpipe::once();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        // Not a failure: non-blocking work still running.
        Ok(Err(CclError::InProgress)) => IN_PROGRESS,
        Ok(Err(e)) => record_error(name, &e),
        Err(payload) => {
            let msg = format!(
                "{name}: internal error: the library panicked: {}",
                panic_message(payload.as_ref())
            );
            // Logging itself could be what panicked: do not let a second panic escape.
            let _ = catch_unwind(|| tracing::warn!(target: "nccl::CALL", "{msg}"));
            set_last_error(&msg);
            INTERNAL_ERROR
        }
    }
}

/// Like [`call`] for exports that return a value instead of `ncclResult_t`: on error or
/// panic the last error is set and `on_error` is returned.
pub(crate) fn call_value<T>(name: &'static str, on_error: T, f: impl FnOnce() -> Result<T>) -> T {
    let mut out = None;
    let code = call(name, || {
        out = Some(f()?);
        Ok(())
    });
    match out {
        Some(v) if code == SUCCESS => v,
        _ => on_error,
    }
}

/// Static C string of `ncclGetErrorString`.
pub(crate) fn error_string(code: NcclResult) -> &'static CStr {
    match code {
        0 => c"no error",
        1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        3 => c"internal error - please report this issue to the NCCL developers",
        4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        6 => c"remote process exited or there was a network error",
        7 => c"NCCL operation in progress",
        8 => c"timeout",
        _ => c"unknown result code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_set_code_and_message() {
        let code = call("ncclTestThing", || Err(CclError::arg("count is negative")));
        assert_eq!(code, 4);
        assert_eq!(
            last_error(),
            "ncclTestThing: invalid argument: count is negative"
        );
        // A success does not clear the last error.
        assert_eq!(call("ncclOther", || Ok(())), SUCCESS);
        assert!(last_error().contains("count is negative"));
        // In progress is not an error.
        assert_eq!(call("ncclX", || Err(CclError::InProgress)), IN_PROGRESS);
        assert!(last_error().contains("count is negative"));
    }

    #[test]
    fn panics_become_internal_errors() {
        let code = call("ncclBoom", || panic!("kaboom {}", 7));
        assert_eq!(code, INTERNAL_ERROR);
        let m = last_error();
        assert!(m.contains("ncclBoom") && m.contains("kaboom 7"), "{m}");
        let v = call_value("ncclBoomValue", -1, || -> Result<i32> { panic!("static") });
        assert_eq!(v, -1);
        assert!(last_error().contains("static"));
        assert_eq!(call_value("ncclFine", -1, || Ok(5)), 5);
    }

    #[test]
    fn unsupported_text() {
        assert_eq!(
            call("ncclCommShrink", || Err(unsupported("ncclCommShrink"))),
            5
        );
        let m = last_error();
        assert!(
            m.contains("ncclCommShrink is not supported by this library yet"),
            "{m}"
        );
        assert!(!m.starts_with("ncclCommShrink: "), "name not repeated: {m}");
    }

    #[test]
    fn last_error_pointer_and_fallback() {
        std::thread::spawn(|| {
            // Fresh thread: nothing failed yet, so the communicator's message is used.
            let p = last_error_ptr(Some("comm broke".into()));
            // SAFETY: the pointer is to a live thread-local CString of this thread.
            assert_eq!(unsafe { CStr::from_ptr(p) }.to_str().unwrap(), "comm broke");
            let p = last_error_ptr(None);
            // SAFETY: the pointer is to a live thread-local CString of this thread.
            assert_eq!(unsafe { CStr::from_ptr(p) }.to_bytes(), b"");
            set_last_error("mine\0with nul");
            let p = last_error_ptr(Some("comm broke".into()));
            // SAFETY: the pointer is to a live thread-local CString of this thread.
            let got = unsafe { CStr::from_ptr(p) };
            assert_eq!(got.to_str().unwrap(), "mine?with nul");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn error_strings_match_nccl() {
        let want = [
            "no error",
            "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
            "unhandled system error (run with NCCL_DEBUG=INFO for details)",
            "internal error - please report this issue to the NCCL developers",
            "invalid argument (run with NCCL_DEBUG=WARN for details)",
            "invalid usage (run with NCCL_DEBUG=WARN for details)",
            "remote process exited or there was a network error",
            "NCCL operation in progress",
            "timeout",
        ];
        for (i, w) in want.iter().enumerate() {
            assert_eq!(error_string(i as i32).to_str().unwrap(), *w);
        }
        for bad in [9, 10, -1, i32::MAX, i32::MIN] {
            assert_eq!(error_string(bad).to_str().unwrap(), "unknown result code");
        }
    }
}
