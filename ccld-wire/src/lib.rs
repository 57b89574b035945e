//! The CCL-D wire format: the protobuf messages of `proto/ccld.proto` (package `ccld.v1`)
//! and their names. A leaf crate: the probe encodes records with it, the analyzer reads them,
//! and `analyzer-net` generates the gRPC service around them.
//!
//! The enum values of [`CollKind`], [`Algorithm`], [`Protocol`] and [`OpState`] are the
//! probe's `#[repr(u8)]` values; the conversions from the probe's types live in
//! `probe::wire` and its tests check every value.

#![warn(unreachable_pub)]

#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/ccld.v1.rs"));
}

pub use generated::*;

/// Key in [`ChannelStat::ext`]: nanoseconds the channel's inbound messages spent on the wire
/// in the operation (socket transport: from a message's first byte to its last, measured by
/// the receiving proxy; absent where nothing was measured).
pub const EXT_WIRE_NS: &str = "wire_ns";

/// Longest [`RankMembership::last_call_error`] in characters: the probe cuts what it sends
/// to it, the analyzer cuts what it keeps (another sender may not).
pub const MAX_CALL_ERROR_CHARS: usize = 512;

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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

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
            cpu_wait_ns: None,
            frozen_ns: None,
            duration_estimated: false,
            elsewhere_ns: None,
            peer_wire: Vec::new(),
            gap_ns: None,
            stride: 0,
            failure: 0,
            peer_lost: None,
            mismatch: None,
            seq_space: 0,
            p2p: Vec::new(),
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
