//! Sequence spaces of a rank's operations (what `OpRecord.trace.op_counter`,
//! `OpRecord.seq_space`, `OpRecord.p2p` and the heartbeat's `last_op_counter` /
//! `last_p2p_counter` say).
//!
//! The runtime numbers every operation of a rank with one local counter (the frame block
//! and op-log slot index). That counter is not comparable across ranks once Send/Recv run
//! between a subset of ranks (pipeline stages), so records carry instead:
//! - a collective: the communicator's collective sequence number (the n-th collective has
//!   number n on every rank, whatever p2p happened in between), space COLLECTIVE;
//! - a p2p group: this rank's own count of p2p groups (local), space P2P, plus each
//!   Send/Recv with its pair's sequence number (the k-th Send a->b and the k-th Recv on b
//!   from a carry the same number).
//!
//! A group that mixes collectives and Send/Recv runs as several work items (each collective
//! is one, the group's Send/Recv calls are one p2p item), each numbered in its own space.
//!
//! [`SeqLog`] keeps this per local counter, in a ring of [`FRAME_BLOCKS`] slots like the op
//! log; the executor writes it before it starts the operation, the diagnostic thread reads
//! it when it builds a record.

use parking_lot::Mutex;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::FRAME_BLOCKS;

/// Which space an operation's number counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SeqSpace {
    /// The communicator's collective sequence.
    #[default]
    Collective,
    /// This rank's count of p2p groups.
    P2p,
}

/// One Send or Recv of a p2p group with its pair sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerSeq {
    /// Peer rank.
    pub peer: u32,
    /// Send (true) or Recv.
    pub send: bool,
    /// Sequence number of the pair's traffic in that direction.
    pub seq: u64,
    /// Element count.
    pub count: u64,
    /// `ncclDataType_t` value.
    pub dtype: u8,
}

/// The comparable identity of one operation.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct OpSeq {
    /// Space of `number`.
    pub space: SeqSpace,
    /// Collective sequence number, or this rank's p2p group count (see [`SeqSpace`]).
    pub number: u64,
    /// The Send/Recv calls of a p2p group (empty for a collective).
    pub p2p: Vec<PeerSeq>,
}

/// One slot of a [`SeqLog`]: a sequence lock over three words, and the p2p list behind a
/// mutex that only p2p groups take (a collective writes and reads no lock).
#[derive(Debug, Default)]
struct Slot {
    /// Even when stable; odd while the writer updates the slot.
    version: AtomicU64,
    /// Local counter + 1; 0 = empty.
    local: AtomicU64,
    /// `number` of the identity.
    number: AtomicU64,
    /// Bit 0: space is p2p; bit 1: `p2p` holds this identity's list (else it is empty).
    flags: AtomicU64,
    p2p: Mutex<Vec<PeerSeq>>,
}

const FLAG_P2P_SPACE: u64 = 1;
const FLAG_P2P_LIST: u64 = 2;

/// Ring of the [`OpSeq`] of a rank's last [`FRAME_BLOCKS`] operations, by local counter.
///
/// One writer (the executor, before each operation), any readers (the diagnostic thread,
/// the completing thread). Each slot is a sequence lock, as the op log's: the writer makes
/// its version odd, writes, makes it even; a reader retries when the version moved. The
/// collective path costs a few plain stores (no locked instruction): it runs on every
/// operation, where a mutex cost the probe about 20 ns.
#[derive(Debug)]
pub struct SeqLog {
    slots: [Slot; FRAME_BLOCKS],
    /// Collective number + 1 of the latest collective started (0: none).
    last_coll: AtomicU64,
    /// p2p groups started.
    p2p_groups: AtomicU64,
}

impl Default for SeqLog {
    fn default() -> Self {
        Self::new()
    }
}

/// Copies a p2p group's calls into its slot (out of line: collectives, the common case,
/// take no lock and no copy).
#[cold]
#[inline(never)]
fn set_list(slot: &Slot, list: &[PeerSeq]) {
    let mut v = slot.p2p.lock();
    v.clear();
    v.extend_from_slice(list);
}

impl SeqLog {
    /// An empty log.
    pub fn new() -> Self {
        SeqLog {
            slots: std::array::from_fn(|_| Slot::default()),
            last_coll: AtomicU64::new(0),
            p2p_groups: AtomicU64::new(0),
        }
    }

    #[inline]
    fn slot(&self, local: u64) -> &Slot {
        &self.slots[(local % FRAME_BLOCKS as u64) as usize]
    }

    /// Records the identity of local operation `local` (single writer, before the
    /// operation starts).
    #[inline]
    pub fn set(&self, local: u64, id: &OpSeq) {
        match id.space {
            SeqSpace::Collective => self.last_coll.store(id.number + 1, Ordering::Relaxed),
            SeqSpace::P2p => self.p2p_groups.store(id.number + 1, Ordering::Relaxed),
        }
        let slot = self.slot(local);
        let v = slot.version.load(Ordering::Relaxed);
        slot.version.store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let mut flags = 0;
        if id.space == SeqSpace::P2p {
            flags |= FLAG_P2P_SPACE;
        }
        if !id.p2p.is_empty() {
            flags |= FLAG_P2P_LIST;
            set_list(slot, &id.p2p);
        }
        slot.local.store(local + 1, Ordering::Relaxed);
        slot.number.store(id.number, Ordering::Relaxed);
        slot.flags.store(flags, Ordering::Relaxed);
        slot.version.store(v.wrapping_add(2), Ordering::Release);
    }

    /// A consistent read of the slot of `local`: (local + 1, number, flags, p2p list when
    /// `with_list` and the flags say it has one).
    fn read(&self, local: u64, with_list: bool) -> (u64, u64, u64, Vec<PeerSeq>) {
        let slot = self.slot(local);
        loop {
            let v1 = slot.version.load(Ordering::Acquire);
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let l = slot.local.load(Ordering::Relaxed);
            let number = slot.number.load(Ordering::Relaxed);
            let flags = slot.flags.load(Ordering::Relaxed);
            let list = if with_list && l == local + 1 && flags & FLAG_P2P_LIST != 0 {
                slot.p2p.lock().clone()
            } else {
                Vec::new()
            };
            fence(Ordering::Acquire);
            if slot.version.load(Ordering::Relaxed) == v1 {
                return (l, number, flags, list);
            }
        }
    }

    /// The identity of local operation `local`, if its slot still holds it.
    pub fn get(&self, local: u64) -> Option<OpSeq> {
        let (l, number, flags, p2p) = self.read(local, true);
        (l == local + 1).then_some(OpSeq {
            space: if flags & FLAG_P2P_SPACE != 0 {
                SeqSpace::P2p
            } else {
                SeqSpace::Collective
            },
            number,
            p2p,
        })
    }

    /// The selection key of local operation `local` for record thinning: its collective
    /// number (the same on every rank), or the local counter when unknown or p2p.
    pub fn thin_key(&self, local: u64) -> u64 {
        match self.read(local, false) {
            (l, number, flags, _) if l == local + 1 && flags & FLAG_P2P_SPACE == 0 => number,
            _ => local,
        }
    }

    /// Collective number of the latest collective started, `None` before the first.
    pub fn last_collective(&self) -> Option<u64> {
        self.last_coll.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Number of p2p groups started, `None` before the first.
    pub fn p2p_groups(&self) -> Option<u64> {
        Some(self.p2p_groups.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coll(n: u64) -> OpSeq {
        OpSeq {
            space: SeqSpace::Collective,
            number: n,
            p2p: Vec::new(),
        }
    }

    #[test]
    fn ring_keeps_the_last_blocks_and_counts_both_spaces() {
        let log = SeqLog::new();
        assert_eq!((log.last_collective(), log.p2p_groups()), (None, None));
        log.set(0, &coll(0));
        let p = OpSeq {
            space: SeqSpace::P2p,
            number: 0,
            p2p: vec![PeerSeq {
                peer: 1,
                send: true,
                seq: 0,
                count: 4,
                dtype: 7,
            }],
        };
        log.set(1, &p);
        log.set(2, &coll(1));
        assert_eq!(log.get(1), Some(p));
        assert_eq!(log.get(2), Some(coll(1)));
        assert_eq!(
            (log.last_collective(), log.p2p_groups()),
            (Some(1), Some(1))
        );
        assert_eq!((log.thin_key(2), log.thin_key(1)), (1, 1));
        // Overwritten slot: local 2 + FRAME_BLOCKS replaces local 2.
        let l = 2 + FRAME_BLOCKS as u64;
        log.set(l, &coll(9));
        assert_eq!(log.get(2), None);
        assert_eq!(log.get(l), Some(coll(9)));
        assert_eq!(log.thin_key(2), 2);
    }

    /// A reader that meets a write in progress (odd version) waits for it and returns the
    /// new identity whole, never the half-written slot; a write that completes between its
    /// two version reads makes it read again.
    #[test]
    fn a_reader_never_returns_a_half_written_slot() {
        let log = std::sync::Arc::new(SeqLog::new());
        log.set(3, &coll(30));
        // The writer's first half of `set(3 + FRAME_BLOCKS, ..)`: version odd, counter
        // written, number not yet.
        let slot = log.slot(3);
        let v = slot.version.load(Ordering::Relaxed);
        slot.version.store(v + 1, Ordering::Relaxed);
        let next = 3 + FRAME_BLOCKS as u64;
        slot.local.store(next + 1, Ordering::Relaxed);
        let reader = {
            let log = std::sync::Arc::clone(&log);
            std::thread::spawn(move || (log.get(next), log.get(3)))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !reader.is_finished(),
            "a reader returned a slot being written"
        );
        slot.number.store(99, Ordering::Relaxed);
        slot.version.store(v + 2, Ordering::Release);
        let (new, old) = reader.join().unwrap();
        assert_eq!(new, Some(coll(99)));
        assert_eq!(old, None, "the slot now holds a later operation");
    }
}
