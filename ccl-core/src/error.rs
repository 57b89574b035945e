//! Typed errors of the runtime, each mapping to one `ncclResult_t` code.

/// `ncclResult_t`.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResultCode {
    /// ncclSuccess
    Success = 0,
    /// ncclUnhandledCudaError
    UnhandledCudaError = 1,
    /// ncclSystemError
    SystemError = 2,
    /// ncclInternalError
    InternalError = 3,
    /// ncclInvalidArgument
    InvalidArgument = 4,
    /// ncclInvalidUsage
    InvalidUsage = 5,
    /// ncclRemoteError
    RemoteError = 6,
    /// ncclInProgress
    InProgress = 7,
    /// ncclTimeout
    Timeout = 8,
}

/// Result alias used across the runtime.
pub type Result<T> = std::result::Result<T, CclError>;

/// An error of the runtime. The `Display` text is what `ncclGetLastError` returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CclError {
    /// A bad argument (null pointer, count overflow, dtype/op/root/peer out of range, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A call that is not valid in the current state, or not supported yet.
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// An OS-level failure (socket, shared memory, thread).
    #[error("system error: {0}")]
    System(String),
    /// A peer failed: it exited, closed its connection or sent something malformed.
    #[error("remote error: {0}")]
    Remote(String),
    /// A bug or an unexpected state inside the library.
    #[error("internal error: {0}")]
    Internal(String),
    /// The communicator was aborted (`ncclCommAbort`) while the call was running.
    #[error("communicator aborted: {0}")]
    Aborted(String),
    /// A bounded wait expired.
    #[error("timeout: {0}")]
    Timeout(String),
    /// Non-blocking initialisation has not finished yet.
    #[error("operation in progress")]
    InProgress,
}

impl CclError {
    /// The `ncclResult_t` this error is reported as.
    pub fn code(&self) -> ResultCode {
        match self {
            CclError::InvalidArgument(_) => ResultCode::InvalidArgument,
            CclError::InvalidUsage(_) => ResultCode::InvalidUsage,
            CclError::System(_) => ResultCode::SystemError,
            CclError::Remote(_) => ResultCode::RemoteError,
            CclError::Internal(_) => ResultCode::InternalError,
            // NCCL reports operations interrupted by ncclCommAbort as remote/system errors;
            // we use RemoteError so callers treat it like a failed peer.
            CclError::Aborted(_) => ResultCode::RemoteError,
            CclError::Timeout(_) => ResultCode::Timeout,
            CclError::InProgress => ResultCode::InProgress,
        }
    }

    /// Shorthand for an `InvalidArgument` error.
    pub fn arg(msg: impl Into<String>) -> Self {
        CclError::InvalidArgument(msg.into())
    }

    /// Shorthand for an `InvalidUsage` error.
    pub fn usage(msg: impl Into<String>) -> Self {
        CclError::InvalidUsage(msg.into())
    }

    /// Shorthand for a `System` error that keeps the OS error text.
    pub fn sys(context: &str, err: impl std::fmt::Display) -> Self {
        CclError::System(format!("{context}: {err}"))
    }
}

/// Maps an error to the same kind with `ctx: ` prepended to its message.
pub(crate) fn with_context(e: CclError, ctx: &str) -> CclError {
    match e {
        CclError::InvalidArgument(m) => CclError::InvalidArgument(format!("{ctx}: {m}")),
        CclError::InvalidUsage(m) => CclError::InvalidUsage(format!("{ctx}: {m}")),
        CclError::System(m) => CclError::System(format!("{ctx}: {m}")),
        CclError::Remote(m) => CclError::Remote(format!("{ctx}: {m}")),
        CclError::Internal(m) => CclError::Internal(format!("{ctx}: {m}")),
        CclError::Aborted(m) => CclError::Aborted(format!("{ctx}: {m}")),
        CclError::Timeout(m) => CclError::Timeout(format!("{ctx}: {m}")),
        CclError::InProgress => CclError::InProgress,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_nccl_result_values() {
        assert_eq!(CclError::arg("x").code() as i32, 4);
        assert_eq!(CclError::usage("x").code() as i32, 5);
        assert_eq!(CclError::System("x".into()).code() as i32, 2);
        assert_eq!(CclError::Remote("x".into()).code() as i32, 6);
        assert_eq!(CclError::Internal("x".into()).code() as i32, 3);
        assert_eq!(CclError::Timeout("x".into()).code() as i32, 8);
        assert_eq!(CclError::InProgress.code() as i32, 7);
    }
}
