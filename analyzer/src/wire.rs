//! Generated protobuf / gRPC code for `proto/ccld.proto` (package `ccld.v1`), plus names
//! and conversions from the probe crate's types (feature `probe`, on by default).
//!
//! The enum values of [`CollKind`], [`Algorithm`], [`Protocol`] and [`OpState`] are the
//! probe's `#[repr(u8)]` values; `tests::enum_values_match_the_probe` checks every one.

#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/ccld.v1.rs"));
}

pub use generated::*;

/// NCCL's name of a collective value (`"AllReduce"`), `"?"` for an unknown value.
pub fn coll_name(v: i32) -> &'static str {
    match CollKind::try_from(v) {
        Ok(CollKind::AllReduce) => "AllReduce",
        Ok(CollKind::Broadcast) => "Broadcast",
        Ok(CollKind::Reduce) => "Reduce",
        Ok(CollKind::AllGather) => "AllGather",
        Ok(CollKind::ReduceScatter) => "ReduceScatter",
        Ok(CollKind::AlltoAll) => "AlltoAll",
        Ok(CollKind::Gather) => "Gather",
        Ok(CollKind::Scatter) => "Scatter",
        Ok(CollKind::Send) => "Send",
        Ok(CollKind::Recv) => "Recv",
        Err(_) => "?",
    }
}

/// Name of an algorithm value (`"Ring"`).
pub fn algo_name(v: i32) -> &'static str {
    match Algorithm::try_from(v) {
        Ok(Algorithm::Ring) => "Ring",
        Ok(Algorithm::Tree) => "Tree",
        Ok(Algorithm::P2p) => "P2P",
        Err(_) => "?",
    }
}

/// Short name of an anomaly class (`"H1"` .. `"S3"`).
pub fn class_code(c: AnomalyClass) -> &'static str {
    match c {
        AnomalyClass::Unspecified => "--",
        AnomalyClass::H1NotEntered => "H1",
        AnomalyClass::H2Inconsistent => "H2",
        AnomalyClass::H3Hardware => "H3",
        AnomalyClass::S1ComputationSlow => "S1",
        AnomalyClass::S2CommunicationSlow => "S2",
        AnomalyClass::S3MixedSlow => "S3",
    }
}

#[cfg(feature = "probe")]
mod from_probe {
    use super::*;

    impl From<probe::CollKind> for CollKind {
        fn from(k: probe::CollKind) -> Self {
            // The values are identical by construction (checked by a test); an unknown value
            // cannot occur because `probe::CollKind` is a closed enum.
            CollKind::try_from(i32::from(k as u8)).unwrap_or(CollKind::AllReduce)
        }
    }

    impl From<probe::Algo> for Algorithm {
        fn from(a: probe::Algo) -> Self {
            Algorithm::try_from(i32::from(a as u8)).unwrap_or(Algorithm::Ring)
        }
    }

    impl From<probe::Proto> for Protocol {
        fn from(p: probe::Proto) -> Self {
            Protocol::try_from(i32::from(p as u8)).unwrap_or(Protocol::Simple)
        }
    }

    impl From<probe::OpState> for OpState {
        fn from(s: probe::OpState) -> Self {
            OpState::try_from(i32::from(s as u8)).unwrap_or(OpState::InFlight)
        }
    }

    impl From<probe::TraceId> for TraceId {
        fn from(t: probe::TraceId) -> Self {
            TraceId {
                comm_id: t.comm_id,
                op_counter: u64::from(t.op_counter),
                extension: t.extension,
            }
        }
    }

    impl From<&probe::OpTypeSet> for OpTypeSet {
        fn from(o: &probe::OpTypeSet) -> Self {
            OpTypeSet {
                collective: CollKind::from(o.coll) as i32,
                algorithm: Algorithm::from(o.algo) as i32,
                protocol: Protocol::from(o.proto) as i32,
                dtype: u32::from(o.dtype),
                count: o.count,
                bytes: o.bytes,
                redop: o.redop,
                root: o.root,
                peer: o.peer,
                n_channels: o.n_channels,
                tree_layer: Vec::new(),
            }
        }
    }

    impl OpTypeSet {
        /// The probe's type set with the per-channel tree layers of this rank.
        pub fn from_probe(o: &probe::OpTypeSet, tree_layer: &[u32]) -> Self {
            let mut t = OpTypeSet::from(o);
            t.tree_layer = tree_layer.to_vec();
            t
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn enum_values_match_the_probe() {
        for k in probe::CollKind::ALL {
            assert_eq!(CollKind::from(k) as i32, i32::from(k as u8));
            assert_eq!(coll_name(k as i32), k.name());
        }
        for a in [probe::Algo::Ring, probe::Algo::Tree, probe::Algo::P2p] {
            assert_eq!(Algorithm::from(a) as i32, i32::from(a as u8));
            assert_eq!(algo_name(a as i32), a.name());
        }
        for p in [probe::Proto::Simple, probe::Proto::Ll, probe::Proto::Ll128] {
            assert_eq!(Protocol::from(p) as i32, i32::from(p as u8));
        }
        for s in [
            probe::OpState::InFlight,
            probe::OpState::Completed,
            probe::OpState::Failed,
        ] {
            assert_eq!(OpState::from(s) as i32, i32::from(s as u8));
        }
        assert_eq!(coll_name(10), "?");
        assert!(CollKind::try_from(10).is_err());
    }

    #[test]
    fn probe_type_set_and_trace_convert_field_by_field() {
        let o = probe::OpTypeSet {
            coll: probe::CollKind::ReduceScatter,
            algo: probe::Algo::Tree,
            proto: probe::Proto::Ll128,
            dtype: 7,
            redop: 2,
            count: 1 << 33,
            bytes: 1 << 35,
            root: -1,
            peer: 3,
            n_channels: 4,
        };
        let w = OpTypeSet::from_probe(&o, &[1, 2, 2, 3]);
        assert_eq!(w.collective(), CollKind::ReduceScatter);
        assert_eq!(w.algorithm(), Algorithm::Tree);
        assert_eq!(w.protocol(), Protocol::Ll128);
        assert_eq!(
            (w.dtype, w.redop, w.count, w.bytes),
            (7, 2, 1 << 33, 1 << 35)
        );
        assert_eq!((w.root, w.peer, w.n_channels), (-1, 3, 4));
        assert_eq!(w.tree_layer, vec![1, 2, 2, 3]);
        let t = TraceId::from(probe::TraceId {
            comm_id: 0xdead_beef_0000_0001,
            op_counter: u32::MAX,
            extension: 9,
        });
        assert_eq!(
            (t.comm_id, t.op_counter, t.extension),
            (0xdead_beef_0000_0001, u64::from(u32::MAX), 9)
        );
    }

    #[test]
    fn record_round_trips_through_protobuf_bytes_and_junk_is_an_error() {
        let rec = OpRecord {
            trace: Some(TraceId {
                comm_id: 5,
                op_counter: 77,
                extension: 0,
            }),
            rank: 3,
            nranks: 8,
            host: "h0".into(),
            pid: 4711,
            op: Some(OpTypeSet {
                redop: -1,
                root: -1,
                peer: -1,
                n_channels: 2,
                ..Default::default()
            }),
            start_ns: 123,
            duration_ns: 456,
            channels: vec![ChannelStat {
                send_count: 10,
                wait_upstream_ns: Some(5),
                ..Default::default()
            }],
            state: OpState::Completed as i32,
            seq: 9,
            device: -1,
        };
        let bytes = Batch {
            records: vec![rec.clone()],
            heartbeats: vec![],
        }
        .encode_to_vec();
        let back = Batch::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.records, vec![rec]);
        assert!(Batch::decode(&[0xff, 0xff, 0xff][..]).is_err());
        assert!(Batch::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
