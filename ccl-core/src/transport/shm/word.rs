//! A shared `u64` word in a region that several handles (in any process) may use, e.g. the
//! poison word next to each rank's doorbell.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::region::{ClaimKind, ShmRegion};
use crate::error::Result;

/// A `u64` at `offset` in a region, accessed only atomically; keeps the region mapped.
pub struct SharedWord {
    region: Arc<ShmRegion>,
    offset: usize,
    word: *const AtomicU64,
}

// SAFETY: `word` addresses an atomic word inside the mapping owned by `region` (kept alive
// by the Arc); atomics may be used from any thread.
unsafe impl Send for SharedWord {}
// SAFETY: see Send; every access through the pointer is atomic.
unsafe impl Sync for SharedWord {}

impl std::fmt::Debug for SharedWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWord")
            .field("region", &self.region.name())
            .field("offset", &self.offset)
            .finish()
    }
}

impl SharedWord {
    /// The word at `offset` (8-aligned, in bounds); many handles may share it.
    pub fn new(region: Arc<ShmRegion>, offset: usize) -> Result<SharedWord> {
        let p = region.claim_ptr(offset, 8, 8, ClaimKind::Atomic { width: 8 })?;
        Ok(SharedWord {
            word: p.cast::<AtomicU64>(),
            region,
            offset,
        })
    }

    /// The atomic word.
    pub fn get(&self) -> &AtomicU64 {
        // SAFETY: 8-aligned, inside the mapping that `self.region` keeps alive, claimed as an
        // 8-byte atomic (so no FIFO slice overlaps it in this process) and only accessed
        // atomically.
        unsafe { &*self.word }
    }
}

impl Drop for SharedWord {
    fn drop(&mut self) {
        self.region
            .release_claim(self.offset, 8, ClaimKind::Atomic { width: 8 });
    }
}
