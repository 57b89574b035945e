//! Low-latency ("LL") single-producer / single-consumer FIFO: every 8-byte word of a
//! message carries 4 payload bytes and a 4-byte flag, so the consumer polls the message
//! itself and needs no separate `head` counter (one cache line moves for a small message
//! instead of three: head, slot header, data). NCCL's LL protocol works the same way.
//!
//! Layout at the FIFO's offset (64-byte aligned):
//! - `0`: `consumed`, the consumer's count of released messages (its own cache line),
//! - `64`: `nslots` slots of [`LlLayout::slot_stride`] bytes. Message `k` (0-based, counted
//!   by both ends) goes to slot `k % nslots` and is written as words
//!   `(flag << 32) | data` with `flag = (k + 1) as u32`: word 0 holds the payload length,
//!   words 1..=6 the three descriptor words (low half first), then the payload, 4 bytes per
//!   word (little-endian, the last word zero-padded).
//!
//! A word is valid when its flag is the message's: stale words of slot `k % nslots` carry
//! the flag of message `k - j * nslots` (or 0 in a fresh segment), never `k + 1` (flags
//! repeat only after 2^32 messages). Each word is stored and loaded as one atomic `u64`,
//! so its data and flag are seen together; no other ordering is needed to read a message.
//! The producer reuses a slot only after the consumer released it (`consumed`, Release on
//! the consumer's side, Acquire here), as in the Simple FIFO.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::layout::{FifoLayout, CACHE_LINE};
use super::region::{ClaimKind, ShmRegion};
use crate::error::{CclError, Result};

/// Words before the payload: the length word and two per descriptor word.
const HEAD_WORDS: usize = 1 + 2 * FifoLayout::DESC_WORDS;

/// Shape of an LL FIFO: `nslots` slots, each holding a message of up to `cap` payload bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LlLayout {
    /// Slots (1..=64).
    pub nslots: usize,
    /// Largest payload of one message in bytes (4..=1 MiB, a multiple of 4).
    pub cap: usize,
}

impl LlLayout {
    /// Words of one slot (header words plus `cap / 4` payload words).
    pub fn slot_words(&self) -> usize {
        HEAD_WORDS + self.cap / 4
    }

    /// Bytes between slots (a whole number of cache lines).
    pub fn slot_stride(&self) -> usize {
        (self.slot_words() * 8).div_ceil(CACHE_LINE) * CACHE_LINE
    }

    /// Bytes of the whole FIFO (counter line plus slots).
    pub fn bytes(&self) -> usize {
        CACHE_LINE + self.nslots * self.slot_stride()
    }

    /// Checks the shape.
    pub fn validate(&self) -> Result<()> {
        if self.nslots == 0 || self.nslots > 64 {
            return Err(CclError::arg(format!(
                "LL FIFO slot count {} is outside 1..=64",
                self.nslots
            )));
        }
        if self.cap < 4 || self.cap > (1 << 20) || !self.cap.is_multiple_of(4) {
            return Err(CclError::arg(format!(
                "LL FIFO message capacity {} is not a multiple of 4 in 4..=1 MiB",
                self.cap
            )));
        }
        Ok(())
    }
}

/// Where an LL FIFO lives (shared by both ends).
struct LlRef {
    region: Arc<ShmRegion>,
    offset: usize,
    layout: LlLayout,
    base: *mut u8,
    kind: ClaimKind,
}

// SAFETY: `base` points into the mapping owned by `region` (an `Arc` kept alive by this
// struct); the mapping is usable from any thread and every access through `base` is atomic
// (the FIFO's words), so moving an end to another thread is sound. Not Sync: ends are
// driven through `&mut self`.
unsafe impl Send for LlRef {}

impl LlRef {
    fn new(
        region: Arc<ShmRegion>,
        offset: usize,
        layout: LlLayout,
        kind: ClaimKind,
    ) -> Result<Self> {
        layout.validate()?;
        let base = region.claim_ptr(offset, layout.bytes(), CACHE_LINE, kind)?;
        Ok(LlRef {
            region,
            offset,
            layout,
            base,
            kind,
        })
    }

    fn consumed(&self) -> &AtomicU64 {
        // SAFETY: offset 0 of the claimed range (64-aligned, inside the mapping, which
        // outlives `self`); the word is only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.cast::<u64>()) }
    }

    /// The words of the slot of message `k` (computed once per message: a division).
    fn slot(&self, k: u64) -> &[AtomicU64] {
        // Remainder < nslots <= 64 fits usize.
        let slot = (k % self.layout.nslots as u64) as usize;
        let off = CACHE_LINE + slot * self.layout.slot_stride();
        // SAFETY: off + slot_words * 8 <= CACHE_LINE + nslots * stride = layout.bytes()
        // (slot_words * 8 <= stride), inside the claimed range; 8-aligned (base is
        // 64-aligned, stride a multiple of 64); the words are only ever accessed atomically,
        // and AtomicU64 has the layout of u64. The mapping outlives the borrow of `self`.
        unsafe {
            std::slice::from_raw_parts(
                self.base.add(off).cast::<AtomicU64>(),
                self.layout.slot_words(),
            )
        }
    }
}

impl Drop for LlRef {
    fn drop(&mut self) {
        self.region
            .release_claim(self.offset, self.layout.bytes(), self.kind);
    }
}

fn flag_of(k: u64) -> u64 {
    // The low 32 bits of k + 1 (truncation intended), in the high half of the word.
    u64::from((k.wrapping_add(1)) as u32) << 32
}

/// Producer end of an LL FIFO.
pub struct LlSender {
    f: LlRef,
    /// Messages committed.
    sent: u64,
    /// Last `consumed` seen.
    consumed_cache: u64,
    /// The reserved message is written here, then encoded by `commit_with_desc`.
    staging: Vec<u8>,
    reserved: bool,
}

impl std::fmt::Debug for LlSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlSender")
            .field("region", &self.f.region.name())
            .field("offset", &self.f.offset)
            .field("layout", &self.f.layout)
            .field("sent", &self.sent)
            .finish()
    }
}

impl LlSender {
    /// The producer end of the LL FIFO at `offset` of a fresh (zeroed) region.
    pub fn new(region: Arc<ShmRegion>, offset: usize, layout: LlLayout) -> Result<LlSender> {
        let f = LlRef::new(region, offset, layout, ClaimKind::LlSend(layout))?;
        let consumed = f.consumed().load(Ordering::Acquire);
        Ok(LlSender {
            f,
            sent: consumed,
            consumed_cache: consumed,
            staging: vec![0; layout.cap],
            reserved: false,
        })
    }

    /// The largest message.
    pub fn cap(&self) -> usize {
        self.f.layout.cap
    }

    /// A buffer of `cap` bytes for the next message, `None` while every slot is in use.
    /// Calling it again before a commit returns the same buffer.
    pub fn try_reserve(&mut self) -> Option<&mut [u8]> {
        if !self.reserved {
            let n = self.f.layout.nslots as u64;
            if self.sent - self.consumed_cache >= n {
                // Acquire: the consumer's reads of the slot we reuse happened before.
                let c = self.f.consumed().load(Ordering::Acquire);
                if c > self.sent || c < self.consumed_cache {
                    tracing::error!(target: "nccl::SHM", region = self.f.region.name(),
                        offset = self.f.offset, sent = self.sent, consumed = c,
                        "LL FIFO counter is corrupt; treating the FIFO as full");
                    return None;
                }
                self.consumed_cache = c;
                if self.sent - c >= n {
                    return None;
                }
            }
            self.reserved = true;
        }
        Some(&mut self.staging[..])
    }

    /// Publishes the reserved message: its first `len` bytes and descriptor `desc`.
    /// `InvalidUsage` without a reservation or with `len > cap` (nothing is published).
    pub fn commit_with_desc(
        &mut self,
        len: usize,
        desc: [u64; FifoLayout::DESC_WORDS],
    ) -> Result<()> {
        if !self.reserved {
            return Err(CclError::usage("LL FIFO commit without a reserved slot"));
        }
        if len > self.f.layout.cap {
            return Err(CclError::usage(format!(
                "LL FIFO commit of {len} bytes, at most {} allowed",
                self.f.layout.cap
            )));
        }
        let k = self.sent;
        let flag = flag_of(k);
        let words = self.f.slot(k);
        // Payload first, header last: a consumer that sees the header usually finds the
        // payload there already (any order is correct, every word is checked).
        let data = &self.staging[..len];
        let payload = &words[HEAD_WORDS..];
        let mut full = data.chunks_exact(4);
        for (w, c) in payload.iter().zip(&mut full) {
            let v = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            w.store(flag | u64::from(v), Ordering::Relaxed);
        }
        let tail = full.remainder();
        if !tail.is_empty() {
            let mut b = [0u8; 4];
            b[..tail.len()].copy_from_slice(tail);
            payload[len / 4].store(flag | u64::from(u32::from_le_bytes(b)), Ordering::Relaxed);
        }
        for (i, d) in desc.iter().enumerate() {
            // Halves of the descriptor word (truncations intended).
            let (lo, hi) = (*d as u32, (*d >> 32) as u32);
            words[1 + 2 * i].store(flag | u64::from(lo), Ordering::Relaxed);
            words[2 + 2 * i].store(flag | u64::from(hi), Ordering::Relaxed);
        }
        // len <= cap <= 1 MiB fits u32.
        words[0].store(flag | len as u64, Ordering::Release);
        self.sent += 1;
        self.reserved = false;
        Ok(())
    }
}

/// Consumer end of an LL FIFO.
pub struct LlReceiver {
    f: LlRef,
    /// Messages released.
    consumed: u64,
    /// Decoded payload of the message being read.
    staging: Vec<u8>,
    /// Length of the message being read (its header word seen), and the words decoded.
    len: Option<usize>,
    ready: usize,
    desc: [u64; FifoLayout::DESC_WORDS],
    complete: bool,
}

impl std::fmt::Debug for LlReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlReceiver")
            .field("region", &self.f.region.name())
            .field("offset", &self.f.offset)
            .field("layout", &self.f.layout)
            .field("consumed", &self.consumed)
            .finish()
    }
}

impl LlReceiver {
    /// The consumer end of the LL FIFO at `offset` of a fresh (zeroed) region.
    pub fn new(region: Arc<ShmRegion>, offset: usize, layout: LlLayout) -> Result<LlReceiver> {
        let f = LlRef::new(region, offset, layout, ClaimKind::LlRecv(layout))?;
        let consumed = f.consumed().load(Ordering::Acquire);
        Ok(LlReceiver {
            f,
            consumed,
            staging: vec![0; layout.cap],
            len: None,
            ready: 0,
            desc: [0; FifoLayout::DESC_WORDS],
            complete: false,
        })
    }

    /// The next message's payload and descriptor once all its words arrived, `Ok(None)`
    /// before; `Err(Remote)` when its length word is corrupt. Words that arrived are
    /// decoded once, so polling a message being written costs little.
    #[allow(clippy::type_complexity)]
    pub fn try_peek_with_desc(&mut self) -> Result<Option<(&[u8], [u64; FifoLayout::DESC_WORDS])>> {
        let k = self.consumed;
        let flag = flag_of(k);
        let slot = self.f.slot(k);
        let len = match self.len {
            Some(l) => l,
            None => {
                // Acquire: pairs with the producer's Release store of this word, so the
                // words it wrote before are usually seen with it (each is checked anyway).
                let w = slot[0].load(Ordering::Acquire);
                if w & !0xFFFF_FFFF != flag {
                    return Ok(None);
                }
                let l = (w & 0xFFFF_FFFF) as usize;
                if l > self.f.layout.cap {
                    return Err(CclError::Remote(format!(
                        "LL FIFO at {}+{} is corrupt: message {k} claims {l} bytes of {}",
                        self.f.region.name(),
                        self.f.offset,
                        self.f.layout.cap
                    )));
                }
                self.len = Some(l);
                self.ready = 1;
                l
            }
        };
        if !self.complete {
            let words = HEAD_WORDS + len.div_ceil(4);
            while self.ready < words {
                let w = slot[self.ready].load(Ordering::Relaxed);
                if w & !0xFFFF_FFFF != flag {
                    return Ok(None);
                }
                let v = (w & 0xFFFF_FFFF) as u32;
                if self.ready < HEAD_WORDS {
                    let i = (self.ready - 1) / 2;
                    let shift = if (self.ready - 1).is_multiple_of(2) {
                        0
                    } else {
                        32
                    };
                    self.desc[i] =
                        (self.desc[i] & !(0xFFFF_FFFF << shift)) | (u64::from(v) << shift);
                } else {
                    let at = (self.ready - HEAD_WORDS) * 4;
                    if at + 4 <= len {
                        self.staging[at..at + 4].copy_from_slice(&v.to_le_bytes());
                    } else {
                        self.staging[at..len].copy_from_slice(&v.to_le_bytes()[..len - at]);
                    }
                }
                self.ready += 1;
            }
            self.complete = true;
        }
        Ok(Some((&self.staging[..len], self.desc)))
    }

    /// Frees the message returned by the last successful peek (Release). Without one this
    /// does nothing.
    pub fn release(&mut self) {
        if !self.complete {
            tracing::error!(target: "nccl::SHM", "LL FIFO release without a peeked message");
            debug_assert!(false, "LL FIFO release without a peeked message");
            return;
        }
        self.complete = false;
        self.len = None;
        self.ready = 0;
        self.desc = [0; FifoLayout::DESC_WORDS];
        self.consumed += 1;
        // Release: our reads of the slot happen before the producer reuses it.
        self.f.consumed().store(self.consumed, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(layout: LlLayout) -> (LlSender, LlReceiver) {
        let region = Arc::new(ShmRegion::anonymous(layout.bytes()).unwrap());
        let tx = LlSender::new(Arc::clone(&region), 0, layout).unwrap();
        let rx = LlReceiver::new(region, 0, layout).unwrap();
        (tx, rx)
    }

    #[test]
    fn messages_of_every_length_arrive_in_order_across_slot_reuse() {
        let layout = LlLayout { nslots: 3, cap: 64 };
        let (mut tx, mut rx) = pair(layout);
        assert!(
            rx.try_peek_with_desc().unwrap().is_none(),
            "fresh FIFO is empty"
        );
        let mut k = 0u64;
        // Lengths 0..=cap (not multiples of 4 included), twice, so every slot is reused
        // with shorter and longer messages than it held before.
        for round in 0..2u64 {
            for len in 0..=layout.cap {
                let data: Vec<u8> = (0..len)
                    .map(|i| (i as u64 * 31 + k * 7 + round) as u8)
                    .collect();
                let desc = [k, !k, k.wrapping_mul(0x9e37_79b9)];
                tx.try_reserve().expect("room")[..len].copy_from_slice(&data);
                tx.commit_with_desc(len, desc).unwrap();
                let (got, d) = rx.try_peek_with_desc().unwrap().expect("message");
                assert_eq!(got, &data[..], "message {k} of {len} bytes");
                assert_eq!(d, desc);
                rx.release();
                k += 1;
            }
        }
    }

    #[test]
    fn a_full_fifo_refuses_until_released_and_misuse_is_an_error() {
        let layout = LlLayout { nslots: 2, cap: 8 };
        let (mut tx, mut rx) = pair(layout);
        for i in 0..2u8 {
            tx.try_reserve().expect("room")[0] = i;
            tx.commit_with_desc(1, [0; 3]).unwrap();
        }
        assert!(tx.try_reserve().is_none(), "both slots in use");
        assert!(
            tx.commit_with_desc(1, [0; 3]).is_err(),
            "commit without a reservation"
        );
        assert_eq!(rx.try_peek_with_desc().unwrap().unwrap().0, &[0u8][..]);
        rx.release();
        let buf = tx.try_reserve().expect("a slot was released");
        buf[0] = 9;
        assert!(tx.commit_with_desc(9, [0; 3]).is_err(), "longer than cap");
        tx.commit_with_desc(1, [0; 3]).unwrap();
        assert_eq!(rx.try_peek_with_desc().unwrap().unwrap().0, &[1u8][..]);
        rx.release();
        assert_eq!(rx.try_peek_with_desc().unwrap().unwrap().0, &[9u8][..]);
    }

    #[test]
    fn a_stale_or_partly_written_message_is_not_read_and_a_bad_length_is_an_error() {
        let layout = LlLayout { nslots: 1, cap: 16 };
        let (mut tx, mut rx) = pair(layout);
        tx.try_reserve().unwrap()[..8].copy_from_slice(b"abcdefgh");
        tx.commit_with_desc(8, [1, 2, 3]).unwrap();
        // Message 1 goes to the same slot: until its words carry flag 2, the consumer
        // (already past message 0) must not read the old words as message 1.
        assert!(rx.try_peek_with_desc().unwrap().is_some());
        rx.release();
        assert!(
            rx.try_peek_with_desc().unwrap().is_none(),
            "stale words ignored"
        );
        // A header with the right flag but a payload word still from message 0.
        let slot = tx.f.slot(1);
        slot[0].store(flag_of(1) | 8, Ordering::Release);
        assert!(
            rx.try_peek_with_desc().unwrap().is_none(),
            "payload not there yet"
        );
        // A length beyond the capacity is a corrupt FIFO.
        let (tx2, mut rx2) = pair(layout);
        tx2.f.slot(0)[0].store(flag_of(0) | 17, Ordering::Release);
        assert!(matches!(rx2.try_peek_with_desc(), Err(CclError::Remote(_))));
    }
}
