//! Point-to-point waits of one communicator, for the incident correlation (pure).
//!
//! Send/Recv records (`SEQ_SPACE_P2P`) carry each Send or Recv of a group with its pair's
//! sequence number: the k-th Send a -> b and the k-th Recv on b from a carry the same
//! number. From them this module knows, per rank, the group it is in flight in and the
//! highest pair sequence it has entered in each direction, and so which peers of an
//! in-flight group have not entered the matching operation: the rank waits for them.
//!
//! A pipeline stage waiting in a Recv from a stopped stage is then followed to that stage
//! instead of being named next to it (it never enters the next collective either).
//! A peer that entered the matching operation is not waited for, even if it has not
//! completed it: the two are in the exchange together, and naming either would guess.

use std::collections::HashMap;

use crate::wire::{self, OpRecord, OpState};

/// One Send or Recv of an in-flight group: (peer, send, pair sequence).
type Item = (u32, bool, u64);

#[derive(Clone, Debug, Default)]
struct RankP2p {
    /// The group in flight: (this rank's local group counter, its Send/Recv items).
    inflight: Option<(u64, Vec<Item>)>,
    /// Highest pair sequence entered per (peer, send).
    entered: HashMap<(u32, bool), u64>,
}

/// Point-to-point state of every rank of one communicator.
#[derive(Clone, Debug, Default)]
pub(crate) struct P2pWaits {
    ranks: HashMap<u32, RankP2p>,
}

impl P2pWaits {
    /// Takes one `SEQ_SPACE_P2P` record of rank `rec.rank` (validated by the engine).
    pub(crate) fn observe(&mut self, rec: &OpRecord) {
        let Some(local) = rec.trace.as_ref().map(|t| t.op_counter) else {
            return;
        };
        let items = rec
            .p2p
            .iter()
            .filter(|p| p.peer < rec.nranks && p.peer != rec.rank)
            .map(|p| (p.peer, p.send, p.seq));
        let r = self.ranks.entry(rec.rank).or_default();
        for (peer, send, seq) in items.clone() {
            let e = r.entered.entry((peer, send)).or_insert(seq);
            *e = (*e).max(seq);
        }
        if r.inflight.as_ref().is_some_and(|(c, _)| local < *c) {
            return; // an older record: the newer group's state stands
        }
        // Only an in-flight group is kept (the common completed record allocates nothing).
        r.inflight = (rec.state == OpState::InFlight as i32).then(|| (local, items.collect()));
    }

    /// Rank `rank` is in flight in a Send/Recv group: (the pair sequence of its first
    /// unmatched item, Send or Recv, the peers that have not entered the matching
    /// operation). `None` when it is not in flight or every peer entered.
    pub(crate) fn waiting(&self, rank: u32) -> Option<(u64, i32, Vec<u32>)> {
        let (_, items) = self.ranks.get(&rank)?.inflight.as_ref()?;
        let mut first = None;
        let mut peers: Vec<u32> = Vec::new();
        for &(peer, send, seq) in items {
            let matched = self
                .ranks
                .get(&peer)
                .and_then(|q| q.entered.get(&(rank, !send)))
                .is_some_and(|&m| m >= seq);
            if matched {
                continue;
            }
            first.get_or_insert((seq, send));
            if !peers.contains(&peer) {
                peers.push(peer);
            }
        }
        let (seq, send) = first?;
        let coll = if send {
            wire::CollKind::Send
        } else {
            wire::CollKind::Recv
        };
        Some((seq, coll as i32, peers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{P2pPeerSeq, TraceId};

    fn rec(rank: u32, local: u64, state: OpState, items: &[(u32, bool, u64)]) -> OpRecord {
        OpRecord {
            trace: Some(TraceId {
                comm_id: 1,
                op_counter: local,
                extension: 0,
            }),
            rank,
            nranks: 8,
            state: state as i32,
            seq_space: wire::SeqSpace::P2p as i32,
            p2p: items
                .iter()
                .map(|&(peer, send, seq)| P2pPeerSeq {
                    peer,
                    send,
                    seq,
                    count: 4,
                    dtype: 2,
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Pipeline over 8 ranks: r sends to r + 2, receives from r - 2; `k` rounds done.
    fn pipeline(w: &mut P2pWaits, k: u64) {
        for s in 0..k {
            for r in 0..8u32 {
                let mut items = Vec::new();
                if r + 2 < 8 {
                    items.push((r + 2, true, s));
                }
                if r >= 2 {
                    items.push((r - 2, false, s));
                }
                w.observe(&rec(r, s, OpState::InFlight, &items));
                w.observe(&rec(r, s, OpState::Completed, &items));
            }
        }
    }

    #[test]
    fn a_receiver_waits_for_a_stage_that_never_entered_its_send() {
        let mut w = P2pWaits::default();
        pipeline(&mut w, 3);
        // Rank 6 enters round 3 (receive from 4); rank 4 is stopped before it.
        w.observe(&rec(6, 3, OpState::InFlight, &[(4, false, 3)]));
        assert_eq!(
            w.waiting(6),
            Some((3, wire::CollKind::Recv as i32, vec![4]))
        );
        // Nobody else is in flight.
        for r in [0, 1, 2, 3, 4, 5, 7] {
            assert_eq!(w.waiting(r), None, "rank {r}");
        }
        // Rank 4 enters its group: rank 6 no longer waits for a missing peer.
        w.observe(&rec(
            4,
            3,
            OpState::InFlight,
            &[(6, true, 3), (2, false, 3)],
        ));
        assert_eq!(w.waiting(6), None);
        // Rank 4 waits for rank 2's send, which rank 2 has not entered.
        assert_eq!(
            w.waiting(4),
            Some((3, wire::CollKind::Recv as i32, vec![2]))
        );
        // Completion ends the wait; an older record does not bring it back.
        w.observe(&rec(6, 3, OpState::Completed, &[(4, false, 3)]));
        w.observe(&rec(6, 2, OpState::InFlight, &[(4, false, 2)]));
        assert_eq!(w.waiting(6), None);
    }

    #[test]
    fn a_sender_waits_for_a_receiver_that_never_entered() {
        let mut w = P2pWaits::default();
        pipeline(&mut w, 2);
        w.observe(&rec(1, 2, OpState::InFlight, &[(3, true, 2)]));
        assert_eq!(
            w.waiting(1),
            Some((2, wire::CollKind::Send as i32, vec![3]))
        );
        // Out-of-range peers and self-sends are ignored, not trusted.
        let mut bad = P2pWaits::default();
        bad.observe(&rec(
            1,
            0,
            OpState::InFlight,
            &[(9, true, 0), (1, false, 0)],
        ));
        assert_eq!(bad.waiting(1), None);
    }
}
