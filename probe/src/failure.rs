//! Why an operation failed, as the runtime tells the probe ([`crate::Source::op_failed`]),
//! and its wire form (`OpRecord.failure`, `peer_lost`, `mismatch`).

use ccld_wire as w;

use crate::CollKind;

/// Cause of a failed operation (values of the wire's `FailureCause`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureCause {
    /// Not classified.
    Unspecified = 0,
    /// A peer's process exited or its connection broke.
    PeerLost = 1,
    /// `ncclCommAbort` (or a destroy) ended the operation.
    Aborted = 2,
    /// This rank's descriptor check found a peer's call inconsistent with its own.
    Inconsistent = 3,
    /// A peer failed the operation and told this rank so.
    PeerFailed = 4,
    /// Other invalid usage detected at run time.
    InvalidUsage = 5,
    /// A bug or unexpected state inside the library.
    Internal = 6,
}

/// One rank's operation descriptor (see the wire's `OpDescriptor`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpDescriptor {
    /// Collective sequence number, or the pair's p2p sequence number.
    pub seq: u64,
    /// Collective kind (`Send` for a point-to-point transfer).
    pub coll: CollKind,
    /// `ncclDataType_t` value.
    pub dtype: u32,
    /// `ncclRedOp_t` value, -1 when none.
    pub redop: i32,
    /// Elements.
    pub count: u64,
    /// Root rank, -1 when none.
    pub root: i32,
}

/// A failed descriptor check (see the wire's `DescriptorMismatch`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorMismatch {
    /// The peer whose message disagreed.
    pub peer_rank: u32,
    /// What this rank called.
    pub local: OpDescriptor,
    /// What arrived from the peer (`None`: a message without a descriptor).
    pub remote: Option<OpDescriptor>,
    /// Channel of the link.
    pub channel: u32,
}

/// A lost peer (see the wire's `PeerLost`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLost {
    /// Rank of the peer in the communicator.
    pub rank: u32,
    /// Its process id.
    pub pid: u32,
    /// Its host.
    pub host: String,
    /// What was observed, e.g. "process exited".
    pub detail: String,
}

/// Everything the probe reports about a failed operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The cause.
    pub cause: FailureCause,
    /// `cause == PeerLost`: the peer.
    pub peer_lost: Option<PeerLost>,
    /// `cause == Inconsistent`: the check that failed.
    pub mismatch: Option<DescriptorMismatch>,
}

impl Failure {
    /// A failure with a cause and nothing else.
    pub fn cause(cause: FailureCause) -> Failure {
        Failure {
            cause,
            peer_lost: None,
            mismatch: None,
        }
    }
}

/// Wire form of a descriptor.
pub(crate) fn descriptor(d: &OpDescriptor) -> w::OpDescriptor {
    w::OpDescriptor {
        seq: d.seq,
        collective: crate::wire::coll(d.coll) as i32,
        dtype: d.dtype,
        redop: d.redop,
        count: d.count,
        root: d.root,
    }
}

/// Fills the failure fields of a record.
pub(crate) fn fill(rec: &mut w::OpRecord, f: &Failure) {
    rec.failure = i32::from(f.cause as u8);
    rec.peer_lost = f.peer_lost.as_ref().map(|p| w::PeerLost {
        rank: p.rank,
        pid: p.pid,
        host: p.host.clone(),
        detail: p.detail.clone(),
    });
    rec.mismatch = f.mismatch.as_ref().map(|m| w::DescriptorMismatch {
        peer_rank: m.peer_rank,
        local: Some(descriptor(&m.local)),
        remote: m.remote.as_ref().map(descriptor),
        channel: m.channel,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_match_the_wire_enum() {
        for (c, wc) in [
            (FailureCause::Unspecified, w::FailureCause::Unspecified),
            (FailureCause::PeerLost, w::FailureCause::PeerLost),
            (FailureCause::Aborted, w::FailureCause::Aborted),
            (FailureCause::Inconsistent, w::FailureCause::Inconsistent),
            (FailureCause::PeerFailed, w::FailureCause::PeerFailed),
            (FailureCause::InvalidUsage, w::FailureCause::InvalidUsage),
            (FailureCause::Internal, w::FailureCause::Internal),
        ] {
            assert_eq!(i32::from(c as u8), wc as i32);
        }
    }

    #[test]
    fn fill_converts_field_by_field() {
        let local = OpDescriptor {
            seq: 5,
            coll: CollKind::AllReduce,
            dtype: 7,
            redop: 0,
            count: 1024,
            root: -1,
        };
        let remote = OpDescriptor {
            coll: CollKind::AllGather,
            redop: -1,
            count: 256,
            ..local
        };
        let f = Failure {
            cause: FailureCause::Inconsistent,
            peer_lost: Some(PeerLost {
                rank: 2,
                pid: 4711,
                host: "h".into(),
                detail: "process exited".into(),
            }),
            mismatch: Some(DescriptorMismatch {
                peer_rank: 2,
                local,
                remote: Some(remote),
                channel: 1,
            }),
        };
        let mut rec = w::OpRecord::default();
        fill(&mut rec, &f);
        assert_eq!(rec.failure(), w::FailureCause::Inconsistent);
        let m = rec.mismatch.unwrap();
        assert_eq!((m.peer_rank, m.channel), (2, 1));
        let l = m.local.unwrap();
        let r = m.remote.unwrap();
        assert_eq!(
            (l.seq, l.collective, l.dtype, l.redop, l.count, l.root),
            (5, w::CollKind::AllReduce as i32, 7, 0, 1024, -1)
        );
        assert_eq!(
            (r.collective, r.redop, r.count),
            (w::CollKind::AllGather as i32, -1, 256)
        );
        let p = rec.peer_lost.unwrap();
        assert_eq!(
            (p.rank, p.pid, p.host.as_str(), p.detail.as_str()),
            (2, 4711, "h", "process exited")
        );
    }
}
