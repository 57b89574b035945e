//! `ncclComm_t` handles.
//!
//! A handle is the address of the communicator's `Arc` allocation (`Arc::as_ptr`). A
//! process-wide table owns one strong reference per live handle, so every call can check
//! that a handle is live: a destroyed, never-created or junk handle is an
//! `InvalidArgument` error instead of undefined behaviour. Destroy/abort remove the entry
//! and drop that reference.

use std::collections::HashMap;
use std::ffi::c_void;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, LazyLock};

use parking_lot::RwLock;

use ccl_core::{CclError, Comm, Result};

/// `ncclComm_t`.
pub type CommHandle = *mut c_void;

/// The table's keys are addresses of `Arc` allocations, chosen by the allocator, not by
/// a caller: no hash flooding to defend against, so every call looks its handle up with a
/// multiply instead of SipHash (about a tenth of the per-call CPU work of an 8-byte
/// AllReduce before, docs/performance.md).
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        // Fibonacci hashing, with the well-mixed high half rotated down: the table takes
        // bucket indices from the low bits, which the allocation's alignment leaves at zero.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(b);
        }
    }

    fn write_usize(&mut self, v: usize) {
        self.0 = v as u64;
    }
}

type LiveTable = HashMap<usize, Arc<Comm>, BuildHasherDefault<AddrHasher>>;

static LIVE: LazyLock<RwLock<LiveTable>> = LazyLock::new(|| RwLock::new(LiveTable::default()));

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_the_low_bits() {
        // 4096 allocations 64 bytes apart (aligned, as Arc allocations are): the low 12 bits
        // of their hashes, where the table takes its bucket index, must not collapse.
        let b = BuildHasherDefault::<AddrHasher>::default();
        let low: HashSet<u64> = (0..4096u64)
            .map(|i| b.hash_one(0x7f00_1234_0000usize + (i as usize) * 64) & 0xfff)
            .collect();
        assert!(
            low.len() > 2500,
            "only {} distinct bucket indices of 4096",
            low.len()
        );
    }

    #[test]
    fn a_handle_is_found_until_removed() {
        assert!(
            get(0x10 as CommHandle).is_err(),
            "a junk handle must not be live"
        );
        let err = get(std::ptr::null_mut()).unwrap_err();
        assert!(err.to_string().contains("NULL"), "{err}");
    }
}
