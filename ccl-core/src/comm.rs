//! Communicators: init, split, finalize/destroy/abort, queries, user-buffer registration and
//! PreMulSum ops. This is the surface `ccl-ffi` calls.
//!
//! INTERFACE STUB: the runtime work replaces the bodies; signatures are the contract with
//! `ccl-ffi`.

use std::sync::Arc;

use crate::bootstrap::UniqueId;
use crate::error::{CclError, Result};
use crate::types::DataType;

/// Settings taken from `ncclConfig_t` (already validated and defaulted by `ccl-ffi`), with
/// `None` meaning "not set by the caller" (env or built-in default applies).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommConfig {
    /// Blocking init/ops (`config.blocking`, `NCCL_COMM_BLOCKING`); `None` = default (true).
    pub blocking: Option<bool>,
    /// Minimum channels (`minCTAs`).
    pub min_ctas: Option<u32>,
    /// Maximum channels (`maxCTAs`).
    pub max_ctas: Option<u32>,
    /// `commName`, for logs and the probe.
    pub comm_name: Option<String>,
    /// `splitShare`: share resources with the parent on split.
    pub split_share: Option<bool>,
}

/// The scalar of a PreMulSum op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScalarArg {
    /// `ncclScalarHostImmediate`: the value, copied at creation.
    HostImmediate(Vec<u8>),
    /// `ncclScalarDevice`: address of the value, read when each operation executes.
    Device(usize),
}

/// A communicator (one rank of it). Shared through `Arc`; `ccl-ffi` hands out the raw
/// `Arc` pointer as `ncclComm_t`.
#[derive(Debug)]
pub struct Comm {
    _private: (),
}

fn not_yet<T>(what: &str) -> Result<T> {
    Err(CclError::usage(format!("{what} is not implemented yet")))
}

impl Comm {
    /// `ncclCommInitRank(Config)`. With `cfg.blocking == Some(false)` it returns at once a
    /// communicator whose [`Comm::async_error`] is `Err(InProgress)` until init finishes.
    pub fn init_rank(nranks: i32, id: UniqueId, rank: i32, cfg: CommConfig) -> Result<Arc<Comm>> {
        let _ = (nranks, id, rank, cfg);
        not_yet("ncclCommInitRank")
    }

    /// `ncclCommInitAll`: `ndev` ranks as threads of this process, rank i on `devlist[i]`
    /// (or device i).
    pub fn init_all(ndev: i32, devlist: Option<Vec<i32>>) -> Result<Vec<Arc<Comm>>> {
        let _ = (ndev, devlist);
        not_yet("ncclCommInitAll")
    }

    /// `ncclCommSplit`; `Ok(None)` for `NCCL_SPLIT_NOCOLOR`.
    pub fn split(
        self: &Arc<Self>,
        color: i32,
        key: i32,
        cfg: CommConfig,
    ) -> Result<Option<Arc<Comm>>> {
        let _ = (color, key, cfg);
        not_yet("ncclCommSplit")
    }

    /// `ncclCommFinalize`: completes outstanding operations.
    pub fn finalize(&self) -> Result<()> {
        not_yet("ncclCommFinalize")
    }

    /// `ncclCommDestroy`: frees resources (the caller drops its `Arc` afterwards).
    pub fn destroy(&self) -> Result<()> {
        not_yet("ncclCommDestroy")
    }

    /// `ncclCommAbort`: callable from any thread; operations blocked in this communicator
    /// return an error within 1 s; resources are freed.
    pub fn abort(&self) -> Result<()> {
        not_yet("ncclCommAbort")
    }

    /// `ncclCommGetAsyncError`: `Ok(())`, `Err(InProgress)` while initialising, or the error
    /// that broke the communicator.
    pub fn async_error(&self) -> Result<()> {
        not_yet("ncclCommGetAsyncError")
    }

    /// `ncclCommCount`.
    pub fn nranks(&self) -> i32 {
        0
    }

    /// `ncclCommUserRank`.
    pub fn rank(&self) -> i32 {
        0
    }

    /// `ncclCommCuDevice` (host backend: the device index given at init, else 0).
    pub fn cuda_device(&self) -> i32 {
        0
    }

    /// The 64-bit communicator id used in Trace IDs.
    pub fn comm_id(&self) -> u64 {
        0
    }

    /// `ncclCommGetUniqueId`: the unique id this communicator was created from.
    pub fn unique_id(&self) -> Result<UniqueId> {
        not_yet("ncclCommGetUniqueId")
    }

    /// Message of the last error on this communicator, for `ncclGetLastError`.
    pub fn last_error(&self) -> Option<String> {
        None
    }

    /// `ncclCommRegister`: returns an opaque non-zero handle.
    pub fn register(&self, ptr: usize, size: usize) -> Result<usize> {
        let _ = (ptr, size);
        not_yet("ncclCommRegister")
    }

    /// `ncclCommDeregister`.
    pub fn deregister(&self, handle: usize) -> Result<()> {
        let _ = handle;
        not_yet("ncclCommDeregister")
    }

    /// `ncclRedOpCreatePreMulSum`: returns the new raw `ncclRedOp_t` (>= 5).
    pub fn create_premulsum(&self, scalar: ScalarArg, dtype: DataType) -> Result<i32> {
        let _ = (scalar, dtype);
        not_yet("ncclRedOpCreatePreMulSum")
    }

    /// `ncclRedOpDestroy`.
    pub fn destroy_redop(&self, op: i32) -> Result<()> {
        let _ = op;
        not_yet("ncclRedOpDestroy")
    }
}
