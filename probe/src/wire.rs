//! Conversions from the probe's types to the analyzer's wire types (`ccld_wire`).
//!
//! The dependency points from `probe` to `analyzer`: the reporter needs the wire types and
//! the analyzer's client library, and `analyzer` knows nothing of the probe. The enum values
//! are identical by construction (`#[repr(u8)]` here, the proto's numbers there); the tests
//! below check every one.

use ccld_wire as w;

use crate::{Algo, CollKind, OpState, OpTypeSet, Proto, TraceId};

/// Wire value of a collective kind.
pub fn coll(k: CollKind) -> w::CollKind {
    // An unknown value cannot occur: both enums list the same ten values (tested).
    w::CollKind::try_from(i32::from(k as u8)).unwrap_or(w::CollKind::AllReduce)
}

/// Wire value of an algorithm.
pub fn algo(a: Algo) -> w::Algorithm {
    w::Algorithm::try_from(i32::from(a as u8)).unwrap_or(w::Algorithm::Ring)
}

/// Wire value of a protocol.
pub fn proto(p: Proto) -> w::Protocol {
    w::Protocol::try_from(i32::from(p as u8)).unwrap_or(w::Protocol::Simple)
}

/// Wire value of an operation state.
pub fn op_state(s: OpState) -> w::OpState {
    w::OpState::try_from(i32::from(s as u8)).unwrap_or(w::OpState::InFlight)
}

/// Wire Trace ID.
pub fn trace(t: TraceId) -> w::TraceId {
    w::TraceId {
        comm_id: t.comm_id,
        op_counter: u64::from(t.op_counter),
        extension: t.extension,
    }
}

/// Wire op type set with this rank's per-channel tree layers (empty for rings).
pub fn type_set(o: &OpTypeSet, tree_layer: &[u32]) -> w::OpTypeSet {
    w::OpTypeSet {
        collective: coll(o.coll) as i32,
        algorithm: algo(o.algo) as i32,
        protocol: proto(o.proto) as i32,
        dtype: u32::from(o.dtype),
        count: o.count,
        bytes: o.bytes,
        redop: o.redop,
        root: o.root,
        peer: o.peer,
        n_channels: o.n_channels,
        tree_layer: tree_layer.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_values_match_the_wire() {
        for k in CollKind::ALL {
            assert_eq!(coll(k) as i32, i32::from(k as u8));
            assert_eq!(w::coll_name(k as i32), k.name());
        }
        for a in [Algo::Ring, Algo::Tree, Algo::P2p] {
            assert_eq!(algo(a) as i32, i32::from(a as u8));
            assert_eq!(w::algo_name(a as i32), a.name());
        }
        for p in [Proto::Simple, Proto::Ll, Proto::Ll128] {
            assert_eq!(proto(p) as i32, i32::from(p as u8));
        }
        for s in [OpState::InFlight, OpState::Completed, OpState::Failed] {
            assert_eq!(op_state(s) as i32, i32::from(s as u8));
        }
        assert_eq!(w::coll_name(10), "?");
        assert!(w::CollKind::try_from(10).is_err());
    }

    #[test]
    fn type_set_and_trace_convert_field_by_field() {
        let o = OpTypeSet {
            coll: CollKind::ReduceScatter,
            algo: Algo::Tree,
            proto: Proto::Ll128,
            dtype: 7,
            redop: 2,
            count: 1 << 33,
            bytes: 1 << 35,
            root: -1,
            peer: 3,
            n_channels: 4,
        };
        let t = type_set(&o, &[1, 2, 2, 3]);
        assert_eq!(t.collective(), w::CollKind::ReduceScatter);
        assert_eq!(t.algorithm(), w::Algorithm::Tree);
        assert_eq!(t.protocol(), w::Protocol::Ll128);
        assert_eq!(
            (t.dtype, t.redop, t.count, t.bytes),
            (7, 2, 1 << 33, 1 << 35)
        );
        assert_eq!((t.root, t.peer, t.n_channels), (-1, 3, 4));
        assert_eq!(t.tree_layer, vec![1, 2, 2, 3]);
        let tr = trace(TraceId {
            comm_id: 0xdead_beef_0000_0001,
            op_counter: u32::MAX,
            extension: 9,
        });
        assert_eq!(
            (tr.comm_id, tr.op_counter, tr.extension),
            (0xdead_beef_0000_0001, u64::from(u32::MAX), 9)
        );
    }
}
