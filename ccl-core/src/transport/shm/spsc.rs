//! The FIFO's head/tail protocol, apart from where its words live.
//!
//! [`Producer`] and [`Consumer`] hold each end's private position and drive the shared
//! words through [`FifoWords`]: in the library, words of a shared-memory mapping (`fifo.rs`);
//! in the unit tests, loom's model-checked atomics (`loom_tests`), so that the orderings
//! below are the ones loom checks. The protocol (all counters monotonically increasing; slot
//! `i` is `count % nslots`):
//! - producer: a slot is free when `head - tail < nslots` (`tail` loaded Acquire, so the
//!   consumer's reads of that slot happened before it is overwritten); it writes the data,
//!   the slot's length and descriptor words (Relaxed), then stores `head + 1` with Release;
//! - consumer: a slot is committed when `tail < head` (`head` loaded Acquire, so the data,
//!   length and descriptor are visible); it reads them, then stores `tail + 1` with Release.
//!
//! Each side caches the other's counter and loads the shared one only when its cache says
//! full / empty.

use std::sync::atomic::Ordering;

/// Words of the descriptor stored with each slot.
pub(crate) const DESC_WORDS: usize = 3;

/// An atomic `u64` of the protocol.
pub(crate) trait Word {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, v: u64, order: Ordering);
}

impl Word for std::sync::atomic::AtomicU64 {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        std::sync::atomic::AtomicU64::load(self, order)
    }
    #[inline]
    fn store(&self, v: u64, order: Ordering) {
        std::sync::atomic::AtomicU64::store(self, v, order)
    }
}

/// The shared words of one FIFO.
pub(crate) trait FifoWords {
    type W: Word;
    fn head(&self) -> &Self::W;
    fn tail(&self) -> &Self::W;
    fn len_word(&self, slot: usize) -> &Self::W;
    fn desc_word(&self, slot: usize, w: usize) -> &Self::W;
    fn nslots(&self) -> usize;
    fn slot_bytes(&self) -> usize;

    /// The slot of counter value `count`.
    #[inline]
    fn slot_of(&self, count: u64) -> usize {
        // The remainder is < nslots, which fits usize.
        (count % self.nslots() as u64) as usize
    }
}

/// What a peer wrote that the protocol cannot have produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Corrupt {
    /// The consumer's tail went backwards or past our head.
    Tail { head: u64, tail: u64 },
    /// The producer's head went backwards or more than `nslots` past our tail.
    Head { head: u64, seen: u64, tail: u64 },
    /// A slot's length word exceeds the slot.
    Len { slot: usize, len: u64 },
}

/// The producer's position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Producer {
    /// Slots committed (our copy of `head`).
    pub(crate) head: u64,
    /// Last `tail` seen.
    pub(crate) tail_cache: u64,
    pub(crate) reserved: bool,
}

impl Producer {
    pub(crate) fn new(head: u64, tail: u64) -> Self {
        Producer {
            head,
            tail_cache: tail,
            reserved: false,
        }
    }

    /// Whether a slot is free now (loads the consumer's tail when the cache says full). A
    /// corrupt tail reads as full.
    pub(crate) fn has_room<F: FifoWords>(&mut self, f: &F) -> Result<bool, Corrupt> {
        let n = f.nslots() as u64;
        if self.head - self.tail_cache < n {
            return Ok(true);
        }
        // Acquire: the consumer's reads of the slot we are about to reuse happened before.
        let tail = f.tail().load(Ordering::Acquire);
        if tail > self.head || tail < self.tail_cache {
            return Err(Corrupt::Tail {
                head: self.head,
                tail,
            });
        }
        self.tail_cache = tail;
        Ok(self.head - tail < n)
    }

    /// Reserves the next slot: its index, or `None` while the FIFO is full. Reserving again
    /// before [`Producer::publish`] returns the same slot.
    pub(crate) fn reserve<F: FifoWords>(&mut self, f: &F) -> Result<Option<usize>, Corrupt> {
        if !self.reserved && !self.has_room(f)? {
            return Ok(None);
        }
        self.reserved = true;
        Ok(Some(f.slot_of(self.head)))
    }

    /// Stores the descriptor of the reserved slot (published by [`Producer::publish`]).
    pub(crate) fn write_desc<F: FifoWords>(&self, f: &F, desc: [u64; DESC_WORDS]) {
        if self.reserved {
            let slot = f.slot_of(self.head);
            for (w, v) in desc.iter().enumerate() {
                // Relaxed: published by the Release store of head.
                f.desc_word(slot, w).store(*v, Ordering::Relaxed);
            }
        }
    }

    /// Publishes the reserved slot holding `len` bytes (the caller checked both).
    pub(crate) fn publish<F: FifoWords>(&mut self, f: &F, len: usize) {
        debug_assert!(self.reserved && len <= f.slot_bytes());
        let slot = f.slot_of(self.head);
        f.len_word(slot).store(len as u64, Ordering::Relaxed);
        self.head += 1;
        self.reserved = false;
        // Release: the slot data, length and descriptor are visible to whoever Acquires
        // this head.
        f.head().store(self.head, Ordering::Release);
    }

    /// Slots committed and not yet released by the consumer.
    pub(crate) fn in_flight<F: FifoWords>(&self, f: &F) -> u64 {
        let tail = f.tail().load(Ordering::Acquire);
        // A corrupt tail (beyond head) counts as nothing in flight; never underflows.
        self.head.saturating_sub(tail.max(self.tail_cache))
    }
}

/// The consumer's position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Consumer {
    /// Slots released (our copy of `tail`).
    pub(crate) tail: u64,
    /// Last `head` seen.
    pub(crate) head_cache: u64,
    pub(crate) peeked: bool,
}

impl Consumer {
    pub(crate) fn new(head: u64, tail: u64) -> Self {
        Consumer {
            tail,
            head_cache: head,
            peeked: false,
        }
    }

    /// `(slot, len)` of the next committed slot, `None` while empty.
    pub(crate) fn peek<F: FifoWords>(&mut self, f: &F) -> Result<Option<(usize, usize)>, Corrupt> {
        let next = self.peek_ahead(f, 0)?;
        if next.is_some() {
            self.peeked = true;
        }
        Ok(next)
    }

    /// The descriptor of the peeked slot (zeros without one).
    pub(crate) fn desc<F: FifoWords>(&self, f: &F) -> [u64; DESC_WORDS] {
        if self.peeked {
            self.desc_of(f, f.slot_of(self.tail))
        } else {
            [0; DESC_WORDS]
        }
    }

    /// `(slot, len)` of the committed slot `ahead` places after the next one (0: the next
    /// one), `None` while fewer are committed. Changes nothing that `release` frees: a
    /// consumer that forwards messages before it frees them (the socket transport's
    /// proxy) frees them in order with [`Consumer::release_oldest`].
    pub(crate) fn peek_ahead<F: FifoWords>(
        &mut self,
        f: &F,
        ahead: u64,
    ) -> Result<Option<(usize, usize)>, Corrupt> {
        let want = self.tail.saturating_add(ahead);
        if want >= self.head_cache {
            // Acquire: the slot data and length the producer wrote before this head are
            // visible.
            let head = f.head().load(Ordering::Acquire);
            if head < self.head_cache || head - self.tail > f.nslots() as u64 {
                return Err(Corrupt::Head {
                    head,
                    seen: self.head_cache,
                    tail: self.tail,
                });
            }
            self.head_cache = head;
            if want >= head {
                return Ok(None);
            }
        }
        let slot = f.slot_of(want);
        let len = f.len_word(slot).load(Ordering::Relaxed);
        match usize::try_from(len) {
            Ok(l) if l <= f.slot_bytes() => Ok(Some((slot, l))),
            _ => Err(Corrupt::Len { slot, len }),
        }
    }

    /// The descriptor of `slot` (one returned by [`Consumer::peek_ahead`]).
    pub(crate) fn desc_of<F: FifoWords>(&self, f: &F, slot: usize) -> [u64; DESC_WORDS] {
        let mut d = [0u64; DESC_WORDS];
        for (w, v) in d.iter_mut().enumerate() {
            // Relaxed: ordered by the Acquire load of head that made the slot visible.
            *v = f.desc_word(slot, w).load(Ordering::Relaxed);
        }
        d
    }

    /// Frees the oldest committed slot; `false` (nothing done) when none is known to be
    /// committed (seen by a peek).
    pub(crate) fn release_oldest<F: FifoWords>(&mut self, f: &F) -> bool {
        if self.tail >= self.head_cache {
            return false;
        }
        self.peeked = false;
        self.tail += 1;
        // Release: our reads of the slot happen before the producer reuses it.
        f.tail().store(self.tail, Ordering::Release);
        true
    }

    /// Frees the peeked slot for the producer; `false` (nothing done) without a peek.
    pub(crate) fn release<F: FifoWords>(&mut self, f: &F) -> bool {
        if !self.peeked {
            return false;
        }
        self.peeked = false;
        self.tail += 1;
        // Release: our reads of the slot happen before the producer reuses it.
        f.tail().store(self.tail, Ordering::Release);
        true
    }

    /// Committed slots waiting to be consumed.
    pub(crate) fn pending<F: FifoWords>(&self, f: &F) -> u64 {
        f.head().load(Ordering::Acquire).saturating_sub(self.tail)
    }
}

/// Loom models of the protocol: every interleaving and every reordering the memory model
/// allows, for a FIFO of 2 slots carrying 3 messages. The slots' data and length live in
/// loom cells, so that a slot read while the producer may still write it (a missing
/// Release/Acquire pair, or a wrong full/empty test) fails the model.
#[cfg(test)]
mod loom_tests {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicU64;
    use loom::sync::Arc;

    impl Word for AtomicU64 {
        fn load(&self, order: Ordering) -> u64 {
            AtomicU64::load(self, order)
        }
        fn store(&self, v: u64, order: Ordering) {
            AtomicU64::store(self, v, order)
        }
    }

    const SLOTS: usize = 2;

    struct ModelFifo {
        head: AtomicU64,
        tail: AtomicU64,
        len: [AtomicU64; SLOTS],
        desc: [[AtomicU64; DESC_WORDS]; SLOTS],
        data: [UnsafeCell<u64>; SLOTS],
    }

    impl ModelFifo {
        fn new() -> Self {
            ModelFifo {
                head: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                len: std::array::from_fn(|_| AtomicU64::new(0)),
                desc: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
                data: std::array::from_fn(|_| UnsafeCell::new(0)),
            }
        }
    }

    impl FifoWords for ModelFifo {
        type W = AtomicU64;
        fn head(&self) -> &AtomicU64 {
            &self.head
        }
        fn tail(&self) -> &AtomicU64 {
            &self.tail
        }
        fn len_word(&self, slot: usize) -> &AtomicU64 {
            &self.len[slot]
        }
        fn desc_word(&self, slot: usize, w: usize) -> &AtomicU64 {
            &self.desc[slot][w]
        }
        fn nslots(&self) -> usize {
            SLOTS
        }
        fn slot_bytes(&self) -> usize {
            8
        }
    }

    /// Message `i`: its data word, length and descriptor are all derived from `i`.
    fn message(i: u64) -> (u64, usize, [u64; DESC_WORDS]) {
        (100 + i, (i % 8) as usize + 1, [i, i + 1, i + 2])
    }

    const MESSAGES: u64 = 3;

    #[test]
    fn messages_arrive_whole_and_in_order_and_no_slot_is_shared() {
        loom::model(|| {
            let f = Arc::new(ModelFifo::new());
            let fp = Arc::clone(&f);
            let producer = loom::thread::spawn(move || {
                let mut p = Producer::new(0, 0);
                for i in 0..MESSAGES {
                    let slot = loop {
                        match p.reserve(&*fp).expect("the model never corrupts") {
                            Some(s) => break s,
                            None => loom::thread::yield_now(),
                        }
                    };
                    let (data, len, desc) = message(i);
                    fp.data[slot].with_mut(|d| {
                        // SAFETY: `d` points into the loom cell, which lives as long as `fp`;
                        // loom fails the model if another thread accesses the cell now.
                        unsafe { *d = data }
                    });
                    p.write_desc(&*fp, desc);
                    p.publish(&*fp, len);
                }
            });
            let mut c = Consumer::new(0, 0);
            for i in 0..MESSAGES {
                let (slot, len) = loop {
                    match c.peek(&*f).expect("the model never corrupts") {
                        Some(x) => break x,
                        None => loom::thread::yield_now(),
                    }
                };
                let data = f.data[slot].with(|d| {
                    // SAFETY: as for the producer's write.
                    unsafe { *d }
                });
                assert_eq!((data, len, c.desc(&*f)), message(i));
                assert!(c.release(&*f));
            }
            producer.join().unwrap();
            assert_eq!(c.pending(&*f), 0);
        });
    }

    #[test]
    fn a_full_fifo_is_never_overwritten() {
        // The producer tries to commit one more message than there are slots, while the
        // consumer has not released anything: it must see the FIFO full.
        loom::model(|| {
            let f = Arc::new(ModelFifo::new());
            let fp = Arc::clone(&f);
            let producer = loom::thread::spawn(move || {
                let mut p = Producer::new(0, 0);
                let mut sent = 0u64;
                for i in 0..=SLOTS as u64 {
                    if let Some(slot) = p.reserve(&*fp).unwrap() {
                        fp.data[slot].with_mut(|d| {
                            // SAFETY: as in the model above; loom checks exclusive access.
                            unsafe { *d = 100 + i }
                        });
                        p.publish(&*fp, 8);
                        sent += 1;
                    }
                }
                sent
            });
            let mut c = Consumer::new(0, 0);
            let got = c.peek(&*f).unwrap().map(|(slot, _)| {
                f.data[slot].with(|d| {
                    // SAFETY: as in the model above; loom checks exclusive access.
                    unsafe { *d }
                })
            });
            let sent = producer.join().unwrap();
            // Nothing released: exactly SLOTS messages fit, and the first one is intact.
            assert_eq!(sent as usize, SLOTS);
            if let Some(v) = got {
                assert_eq!(v, 100);
            }
        });
    }
}
