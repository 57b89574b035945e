//! `ncclComm_t` handles.
//!
//! A handle is the address of the communicator's `Arc` allocation (`Arc::as_ptr`). A
//! process-wide table owns one strong reference per live handle, so every call can check
//! that a handle is live: a destroyed, never-created or junk handle is an
//! `InvalidArgument` error instead of undefined behaviour. Destroy/abort remove the entry
//! and drop that reference.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, LazyLock};

use parking_lot::RwLock;

use ccl_core::{CclError, Comm, Result};

/// `ncclComm_t`.
pub type CommHandle = *mut c_void;

static LIVE: LazyLock<RwLock<HashMap<usize, Arc<Comm>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

/// Makes a handle for `comm` (idempotent for the same communicator).
pub fn register(comm: Arc<Comm>) -> CommHandle {
    let key = Arc::as_ptr(&comm) as usize;
    LIVE.write().insert(key, comm);
    key as CommHandle
}

/// The communicator behind a live handle.
pub fn get(h: CommHandle) -> Result<Arc<Comm>> {
    if h.is_null() {
        return Err(CclError::arg("comm is NULL"));
    }
    LIVE.read()
        .get(&(h as usize))
        .cloned()
        .ok_or_else(|| not_live(h))
}

/// Removes a handle; returns the communicator so the caller can finish with it.
pub fn remove(h: CommHandle) -> Result<Arc<Comm>> {
    if h.is_null() {
        return Err(CclError::arg("comm is NULL"));
    }
    LIVE.write()
        .remove(&(h as usize))
        .ok_or_else(|| not_live(h))
}

fn not_live(h: CommHandle) -> CclError {
    CclError::arg(format!(
        "comm {h:p} is not a live communicator (already destroyed, or not from this library)"
    ))
}

/// Number of live handles (for tests and diagnostics).
pub fn live_count() -> usize {
    LIVE.read().len()
}
