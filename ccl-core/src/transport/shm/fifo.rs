//! Single-producer / single-consumer FIFO of fixed-size slots in a shared-memory region.
//!
//! The head/tail protocol itself, and its loom models, are in `spsc.rs`; this file places
//! its words in a mapping, hands out the slots' bytes and turns what a corrupt peer wrote
//! into errors.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::layout::{FifoLayout, CACHE_LINE};
use super::region::{ClaimKind, ShmRegion};
use super::spsc::{self, Consumer, Corrupt, FifoWords, Producer};
use crate::error::{CclError, Result};

const _: () = assert!(FifoLayout::DESC_WORDS == spsc::DESC_WORDS);

/// Shared part of both ends: where the FIFO lives.
struct FifoRef {
    region: Arc<ShmRegion>,
    offset: usize,
    layout: FifoLayout,
    /// `layout.slot_stride()` and `layout.header_bytes()`, cached.
    stride: usize,
    header: usize,
    base: *mut u8,
    kind: ClaimKind,
}

// SAFETY: `base` points into the mapping owned by `region` (an `Arc`, kept alive by this
// struct); the mapping is usable from any thread, and all accesses through `base` follow the
// FIFO protocol (atomics for counters, exclusive slot ownership for data), so moving an end
// to another thread is sound. FifoRef is not Sync: ends are driven through `&mut self`.
unsafe impl Send for FifoRef {}

impl FifoRef {
    fn new(
        region: Arc<ShmRegion>,
        offset: usize,
        layout: FifoLayout,
        kind: ClaimKind,
    ) -> Result<Self> {
        layout.validate()?;
        let bytes = layout.bytes();
        let base = region.claim_ptr(offset, bytes, CACHE_LINE, kind)?;
        Ok(FifoRef {
            region,
            offset,
            layout,
            stride: layout.slot_stride(),
            header: layout.header_bytes(),
            base,
            kind,
        })
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: callers pass HEAD_OFFSET, TAIL_OFFSET or a slot-header word offset (< header),
        // all 8-aligned and inside the FIFO's claimed range, which lies inside the mapping
        // (checked by claim_ptr); base is 64-aligned. These words are only ever accessed
        // atomically; the mapping outlives `self`.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast::<u64>()) }
    }

    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        debug_assert!(slot < self.layout.nslots);
        // SAFETY: header + slot * stride + slot_bytes <= layout.bytes() (FifoLayout math,
        // unit-tested), which is inside the claimed range.
        unsafe { self.base.add(self.header + slot * self.stride) }
    }

    /// Reads (head, tail) and checks `tail <= head <= tail + nslots`. The end being attached
    /// reads its own counter (which nobody else moves) first, so a peer that keeps running
    /// meanwhile cannot make a consistent FIFO look corrupt.
    fn check_counters(&self) -> Result<(u64, u64)> {
        let (head, tail) = if matches!(self.kind, ClaimKind::FifoSend(_)) {
            let head = self.head().load(Ordering::Acquire);
            (head, self.tail().load(Ordering::Acquire))
        } else {
            let tail = self.tail().load(Ordering::Acquire);
            (self.head().load(Ordering::Acquire), tail)
        };
        if tail > head || head - tail > self.layout.nslots as u64 {
            return Err(CclError::Remote(format!(
                "FIFO at {}+{} is corrupt: head {head}, tail {tail}, {} slots",
                self.region.name(),
                self.offset,
                self.layout.nslots
            )));
        }
        Ok((head, tail))
    }
}

impl FifoWords for FifoRef {
    type W = AtomicU64;

    #[inline]
    fn head(&self) -> &AtomicU64 {
        self.word(FifoLayout::HEAD_OFFSET)
    }

    #[inline]
    fn tail(&self) -> &AtomicU64 {
        self.word(FifoLayout::TAIL_OFFSET)
    }

    #[inline]
    fn len_word(&self, slot: usize) -> &AtomicU64 {
        debug_assert!(slot < self.layout.nslots);
        self.word(self.layout.len_word_offset(slot))
    }

    #[inline]
    fn desc_word(&self, slot: usize, w: usize) -> &AtomicU64 {
        debug_assert!(slot < self.layout.nslots && w < FifoLayout::DESC_WORDS);
        self.word(self.layout.desc_word_offset(slot, w))
    }

    #[inline]
    fn nslots(&self) -> usize {
        self.layout.nslots
    }

    #[inline]
    fn slot_bytes(&self) -> usize {
        self.layout.slot_bytes
    }
}

impl FifoRef {
    /// The error for what a corrupt peer wrote.
    fn corrupt(&self, c: Corrupt) -> CclError {
        let at = format!("FIFO at {}+{} is corrupt", self.region.name(), self.offset);
        CclError::Remote(match c {
            Corrupt::Tail { head, tail } => format!("{at}: tail {tail}, head {head}"),
            Corrupt::Head { head, seen, tail } => {
                format!("{at}: head {head} after {seen}, tail {tail}")
            }
            Corrupt::Len { slot, len } => format!(
                "{at}: slot {slot} claims {len} bytes of {}",
                self.layout.slot_bytes
            ),
        })
    }
}

impl Drop for FifoRef {
    fn drop(&mut self) {
        self.region
            .release_claim(self.offset, self.layout.bytes(), self.kind);
    }
}

/// Single-producer end of a FIFO placed at `offset` in `region`.
///
/// At most one `FifoSender` per FIFO may exist across all processes (within one process this
/// is enforced). The FIFO bytes must start zeroed (a fresh region) or hold a FIFO of the same
/// layout, whose position is then resumed.
pub struct FifoSender {
    f: FifoRef,
    p: Producer,
}

impl std::fmt::Debug for FifoSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FifoSender")
            .field("region", &self.f.region.name())
            .field("offset", &self.f.offset)
            .field("layout", &self.f.layout)
            .field("head", &self.p.head)
            .field("tail_cache", &self.p.tail_cache)
            .finish()
    }
}

impl FifoSender {
    /// The producer end of the FIFO at `offset` (64-byte aligned, `layout.bytes()` in
    /// bounds). Errors on a bad layout/offset, a range already held by another producer or
    /// an overlapping structure in this process, or corrupt counters.
    pub fn new(region: Arc<ShmRegion>, offset: usize, layout: FifoLayout) -> Result<FifoSender> {
        let f = FifoRef::new(region, offset, layout, ClaimKind::FifoSend(layout))?;
        let (head, tail) = f.check_counters()?;
        Ok(FifoSender {
            f,
            p: Producer::new(head, tail),
        })
    }

    /// The layout this end was built with.
    pub fn layout(&self) -> FifoLayout {
        self.f.layout
    }

    /// The next free slot (`slot_bytes` long, its previous contents unspecified), or `None`
    /// while the FIFO is full. Calling it again before `commit` returns the same slot. A
    /// corrupt tail (a peer wrote nonsense) is logged and reads as full.
    pub fn try_reserve(&mut self) -> Option<&mut [u8]> {
        let slot = match self.p.reserve(&self.f) {
            Ok(s) => s?,
            Err(c) => {
                tracing::error!(target: "nccl::SHM", error = %self.f.corrupt(c),
                    "treating the FIFO as full");
                return None;
            }
        };
        let p = self.f.slot_ptr(slot);
        // SAFETY: the slot at `head % nslots` is free (head - tail < nslots, with tail loaded
        // Acquire), so the consumer no longer reads it and will not until we publish head+1;
        // this process holds the only producer claim on the FIFO, and the returned borrow of
        // `&mut self` ends before `commit` can publish it. The slot is slot_bytes long and
        // inside the mapping, which outlives the borrow.
        Some(unsafe { std::slice::from_raw_parts_mut(p, self.f.layout.slot_bytes) })
    }

    /// Publishes the reserved slot holding `len` bytes (Release).
    ///
    /// Misuse is a bug in the caller: without a reservation nothing is published, and `len`
    /// is clamped to `slot_bytes` (both panic in debug builds). Use [`FifoSender::try_commit`]
    /// for a typed error instead.
    pub fn commit(&mut self, len: usize) {
        if let Err(e) = self.try_commit(len) {
            tracing::error!(target: "nccl::SHM", error = %e, "FIFO commit misuse");
            debug_assert!(false, "{e}");
            if self.p.reserved {
                self.p.publish(&self.f, self.f.layout.slot_bytes);
            }
        }
    }

    /// Publishes the reserved slot holding `len` bytes together with an operation
    /// descriptor (`desc`, opaque to the FIFO), which the consumer reads with
    /// [`FifoReceiver::peeked_desc`]. Misuse is handled as in [`FifoSender::commit`].
    pub fn commit_with_desc(&mut self, len: usize, desc: [u64; FifoLayout::DESC_WORDS]) {
        self.p.write_desc(&self.f, desc);
        self.commit(len);
    }

    /// [`FifoSender::commit`] returning `InvalidUsage` when no slot is reserved or `len`
    /// exceeds `slot_bytes` (nothing is published then).
    pub fn try_commit(&mut self, len: usize) -> Result<()> {
        if !self.p.reserved {
            return Err(CclError::usage("FIFO commit without a reserved slot"));
        }
        if len > self.f.layout.slot_bytes {
            return Err(CclError::usage(format!(
                "FIFO commit of {len} bytes into a {}-byte slot",
                self.f.layout.slot_bytes
            )));
        }
        self.p.publish(&self.f, len);
        Ok(())
    }

    /// Slots committed but not yet released by the receiver (refreshes its position).
    pub fn in_flight(&self) -> usize {
        self.p.in_flight(&self.f) as usize
    }

    /// Total slots committed since the FIFO was created.
    pub fn committed(&self) -> u64 {
        self.p.head
    }
}

/// Single-consumer end of a FIFO placed at `offset` in `region`.
pub struct FifoReceiver {
    f: FifoRef,
    c: Consumer,
}

impl std::fmt::Debug for FifoReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FifoReceiver")
            .field("region", &self.f.region.name())
            .field("offset", &self.f.offset)
            .field("layout", &self.f.layout)
            .field("tail", &self.c.tail)
            .field("head_cache", &self.c.head_cache)
            .finish()
    }
}

impl FifoReceiver {
    /// The consumer end of the FIFO at `offset`; same checks as [`FifoSender::new`].
    pub fn new(region: Arc<ShmRegion>, offset: usize, layout: FifoLayout) -> Result<FifoReceiver> {
        let f = FifoRef::new(region, offset, layout, ClaimKind::FifoRecv(layout))?;
        let (head, tail) = f.check_counters()?;
        Ok(FifoReceiver {
            f,
            c: Consumer::new(head, tail),
        })
    }

    /// The layout this end was built with.
    pub fn layout(&self) -> FifoLayout {
        self.f.layout
    }

    /// The next committed slot's bytes, `Err(Remote)` if the producer's counters or length
    /// word are corrupt, `Ok(None)` while empty.
    pub fn try_peek_checked(&mut self) -> Result<Option<&[u8]>> {
        Ok(self
            .peek_slot()?
            .map(|(slot, len)| self.slot_slice(slot, len)))
    }

    /// [`FifoReceiver::try_peek_checked`] with the descriptor words committed with the slot
    /// (all zero when the producer used plain `commit` on a fresh FIFO).
    #[allow(clippy::type_complexity)]
    pub fn try_peek_with_desc(&mut self) -> Result<Option<(&[u8], [u64; FifoLayout::DESC_WORDS])>> {
        let Some((slot, len)) = self.peek_slot()? else {
            return Ok(None);
        };
        let d = self.peeked_desc();
        Ok(Some((self.slot_slice(slot, len), d)))
    }

    /// The committed message `ahead` places after the next one (0: the next one) and its
    /// descriptor, `Ok(None)` while fewer are committed, `Err(Remote)` when the producer's
    /// counters or length word are corrupt. For a consumer that forwards messages before it
    /// frees them: it frees them in order with [`FifoReceiver::release_oldest`] (the socket
    /// transport frees a slot once the remote receiver consumed its message, so that the
    /// sender sees the same back-pressure as over shared memory).
    #[allow(clippy::type_complexity)]
    pub fn try_peek_ahead(
        &mut self,
        ahead: usize,
    ) -> Result<Option<(&[u8], [u64; FifoLayout::DESC_WORDS])>> {
        let Some((slot, len)) = self
            .c
            .peek_ahead(&self.f, ahead as u64)
            .map_err(|c| self.f.corrupt(c))?
        else {
            return Ok(None);
        };
        let d = self.c.desc_of(&self.f, slot);
        Ok(Some((self.slot_slice(slot, len), d)))
    }

    /// Frees the oldest committed message (one a peek has seen); `false` when there is
    /// none.
    pub fn release_oldest(&mut self) -> bool {
        self.c.release_oldest(&self.f)
    }

    /// The committed slot's `len` bytes (after a successful `peek_slot`).
    fn slot_slice(&self, slot: usize, len: usize) -> &[u8] {
        let p = self.f.slot_ptr(slot);
        // SAFETY: `peek_slot` (or `peek_ahead`) found the slot's count below head (loaded
        // Acquire), so the producer has published this slot and will not write it again
        // until our tail passes it in `release`/`release_oldest`, which need `&mut self` and
        // so end this borrow first; len <= slot_bytes (checked by the peek) keeps the slice
        // inside the slot; this process holds the only consumer claim on the FIFO.
        unsafe { std::slice::from_raw_parts(p, len) }
    }

    /// `(slot, len)` of the next committed slot, `Ok(None)` while empty.
    fn peek_slot(&mut self) -> Result<Option<(usize, usize)>> {
        self.c.peek(&self.f).map_err(|c| self.f.corrupt(c))
    }

    /// The next committed slot's `len` bytes (Acquire), `None` if empty. A corrupt FIFO
    /// (only possible if a peer scribbled over it) is logged and reads as empty; use
    /// [`FifoReceiver::try_peek_checked`] to get the error.
    pub fn try_peek(&mut self) -> Option<&[u8]> {
        match self.try_peek_checked() {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(target: "nccl::SHM", error = %e, "corrupt FIFO");
                None
            }
        }
    }

    /// The descriptor words committed with the slot last returned by a peek (all zero when
    /// the producer used plain `commit` on a fresh FIFO). Call between a successful peek and
    /// `release`; without a peeked slot it returns zeros.
    pub fn peeked_desc(&self) -> [u64; FifoLayout::DESC_WORDS] {
        self.c.desc(&self.f)
    }

    /// Frees the peeked slot for the producer (Release). Without a successful peek since the
    /// last release this does nothing (and panics in debug builds).
    pub fn release(&mut self) {
        if !self.c.release(&self.f) {
            tracing::error!(target: "nccl::SHM", "FIFO release without a peeked slot");
            debug_assert!(false, "FIFO release without a peeked slot");
        }
    }

    /// Committed slots waiting to be consumed (refreshes the producer's position).
    pub fn pending(&self) -> usize {
        self.c.pending(&self.f) as usize
    }

    /// Total slots released since the FIFO was created.
    pub fn released(&self) -> u64 {
        self.c.tail
    }
}
