//! Operations and groups: argument validation, `ncclGroupStart`/`ncclGroupEnd` semantics
//! (nesting, several communicators, p2p in any order), submission to executors.
//!
//! INTERFACE STUB: the runtime work replaces the bodies; signatures are the contract with
//! `ccl-ffi`.

use std::sync::Arc;

use probe::CollKind;

use crate::comm::Comm;
use crate::error::{CclError, Result};

/// One collective or p2p call as the C API received it (raw values, unvalidated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollArgs {
    /// Which operation (`ncclBcast` is `Broadcast` with `sendbuf == recvbuf`).
    pub kind: CollKind,
    /// Send buffer address (host pointer on the host backend).
    pub sendbuf: usize,
    /// Receive buffer address.
    pub recvbuf: usize,
    /// Element count as passed (per-rank count for AllGather/ReduceScatter/AlltoAll/...).
    pub count: usize,
    /// Raw `ncclDataType_t`.
    pub dtype: i32,
    /// Raw `ncclRedOp_t` (ignored by non-reducing operations).
    pub op: i32,
    /// Root rank for rooted collectives, peer for Send/Recv, -1 otherwise.
    pub root: i32,
    /// `cudaStream_t` as an address (ignored by the host backend).
    pub stream: usize,
}

/// Validates `args` and runs it: outside a group it returns when the result is in the
/// receive buffer; inside a group it is queued until the outermost `ncclGroupEnd`.
///
/// # Safety contract
/// The caller guarantees the buffers are valid for the sizes implied by the arguments
/// until the operation completes (as NCCL requires).
pub fn enqueue(comm: &Arc<Comm>, args: CollArgs) -> Result<()> {
    let _ = (comm, args);
    Err(CclError::usage("collectives are not implemented yet"))
}

/// `ncclGroupStart`.
pub fn group_start() -> Result<()> {
    Err(CclError::usage("ncclGroupStart is not implemented yet"))
}

/// `ncclGroupEnd`: launches and completes everything queued since the outermost start.
pub fn group_end() -> Result<()> {
    Err(CclError::usage("ncclGroupEnd is not implemented yet"))
}
