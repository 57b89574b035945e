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
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Ring of the [`OpSeq`] of a rank's last [`FRAME_BLOCKS`] operations, by local counter.
#[derive(Debug)]
pub struct SeqLog {
    /// `(local counter + 1, identity)`; 0 = empty.
    slots: [Mutex<(u64, OpSeq)>; FRAME_BLOCKS],
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

impl SeqLog {
    /// An empty log.
    pub fn new() -> Self {
        SeqLog {
            slots: std::array::from_fn(|_| Mutex::new((0, OpSeq::default()))),
            last_coll: AtomicU64::new(0),
            p2p_groups: AtomicU64::new(0),
        }
    }

    /// Records the identity of local operation `local` (single writer, before the
    /// operation starts).
    pub fn set(&self, local: u64, id: OpSeq) {
        match id.space {
            SeqSpace::Collective => self.last_coll.store(id.number + 1, Ordering::Relaxed),
            SeqSpace::P2p => self.p2p_groups.store(id.number + 1, Ordering::Relaxed),
        }
        let slot = &self.slots[(local % FRAME_BLOCKS as u64) as usize];
        *slot.lock() = (local + 1, id);
    }

    /// The identity of local operation `local`, if its slot still holds it.
    pub fn get(&self, local: u64) -> Option<OpSeq> {
        let slot = (self.slots[(local % FRAME_BLOCKS as u64) as usize]).lock();
        (slot.0 == local + 1).then(|| slot.1.clone())
    }

    /// The selection key of local operation `local` for record thinning: its collective
    /// number (the same on every rank), or the local counter when unknown or p2p.
    pub fn thin_key(&self, local: u64) -> u64 {
        let slot = (self.slots[(local % FRAME_BLOCKS as u64) as usize]).lock();
        match &*slot {
            (
                l,
                OpSeq {
                    space: SeqSpace::Collective,
                    number,
                    ..
                },
            ) if *l == local + 1 => *number,
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
        log.set(0, coll(0));
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
        log.set(1, p.clone());
        log.set(2, coll(1));
        assert_eq!(log.get(1), Some(p));
        assert_eq!(log.get(2), Some(coll(1)));
        assert_eq!(
            (log.last_collective(), log.p2p_groups()),
            (Some(1), Some(1))
        );
        assert_eq!((log.thin_key(2), log.thin_key(1)), (1, 1));
        // Overwritten slot: local 2 + FRAME_BLOCKS replaces local 2.
        let l = 2 + FRAME_BLOCKS as u64;
        log.set(l, coll(9));
        assert_eq!(log.get(2), None);
        assert_eq!(log.get(l), Some(coll(9)));
        assert_eq!(log.thin_key(2), 2);
    }
}
