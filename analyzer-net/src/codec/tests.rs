//! The codec against prost's own encoding and decoding of `Batch` (the reference).

use super::*;
use bytes::BytesMut;
use ccld_wire::{
    Batch, ChannelStat, DescriptorMismatch, OpDescriptor, OpState, OpTypeSet, P2pPeerSeq, PeerLost,
    PeerWire, RankMembership, TraceId,
};

/// Small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// A record with a random subset of every kind of field set (strings, maps, repeated and
/// optional messages, negative ints, doubles).
fn random_record(g: &mut Rng) -> OpRecord {
    let nch = g.below(4) as usize;
    OpRecord {
        trace: (!g.chance(10)).then(|| TraceId {
            comm_id: g.next(),
            op_counter: g.below(1 << 40),
            extension: g.below(3) as u32,
        }),
        rank: g.below(4096) as u32,
        nranks: g.below(4097) as u32,
        host: if g.chance(3) {
            String::new()
        } else {
            format!("node{:05}", g.below(100_000))
        },
        pid: g.next() as u32,
        op: (!g.chance(10)).then(|| OpTypeSet {
            collective: g.below(10) as i32,
            algorithm: g.below(3) as i32,
            protocol: g.below(3) as i32,
            dtype: g.below(12) as u32,
            count: g.next() >> g.below(64),
            bytes: g.next() >> g.below(64),
            redop: g.below(6) as i32 - 1,
            root: g.below(8) as i32 - 1,
            peer: g.below(8) as i32 - 1,
            n_channels: nch as u32,
            tree_layer: (0..g.below(3)).map(|_| g.below(10) as u32).collect(),
        }),
        start_ns: g.next(),
        duration_ns: g.next() >> 20,
        channels: (0..nch)
            .map(|_| ChannelStat {
                send_count: g.below(1000),
                recv_count: g.below(1000),
                expected_send: g.below(1000),
                expected_recv: g.below(1000),
                send_rate: g.below(100) as f64 / 7.0,
                recv_rate: -(g.below(100) as f64),
                send_per_sec: 1e4,
                recv_per_sec: 0.0,
                wait_upstream_ns: g.chance(2).then(|| g.next()),
                wait_downstream_ns: g.chance(2).then_some(0),
                ring_prev: g.chance(3).then(|| g.below(64) as u32),
                ring_next: g.chance(3).then(|| g.below(64) as u32),
                ext: (0..g.below(3))
                    .map(|k| (format!("m{k}"), g.below(9) as f64))
                    .collect(),
            })
            .collect(),
        state: g.below(3) as i32,
        seq: g.next(),
        device: g.below(9) as i32 - 1,
        cpu_wait_ns: g.chance(2).then(|| g.next()),
        frozen_ns: g.chance(2).then(|| g.next()),
        duration_estimated: g.chance(2),
        elsewhere_ns: g.chance(2).then(|| g.below(1 << 30)),
        peer_wire: (0..g.below(3))
            .map(|k| PeerWire {
                from: k as u32,
                wire_ns: g.next(),
            })
            .collect(),
        gap_ns: g.chance(2).then(|| g.below(1 << 30)),
        stride: g.below(5) as u32,
        failure: g.below(7) as i32,
        peer_lost: g.chance(4).then(|| PeerLost {
            rank: 3,
            pid: 77,
            host: "h".into(),
            detail: "process exited".into(),
        }),
        mismatch: g.chance(4).then_some(DescriptorMismatch {
            peer_rank: 1,
            local: Some(OpDescriptor {
                seq: 5,
                collective: 1,
                dtype: 7,
                redop: -1,
                count: 10,
                root: 0,
            }),
            remote: None,
            channel: 2,
        }),
        seq_space: g.below(2) as i32,
        p2p: (0..g.below(3))
            .map(|k| P2pPeerSeq {
                peer: k as u32,
                send: k % 2 == 0,
                seq: g.next(),
                count: 4,
                dtype: 7,
            })
            .collect(),
    }
}

fn random_heartbeat(g: &mut Rng) -> Heartbeat {
    Heartbeat {
        host: format!("h{}", g.below(10)),
        pid: g.next() as u32,
        ranks: (0..g.below(3))
            .map(|k| RankMembership {
                comm_id: g.next(),
                rank: k as u32,
                nranks: 8,
                last_op_counter: g.chance(2).then(|| g.next()),
                last_p2p_counter: None,
                last_call_error: g
                    .chance(3)
                    .then(|| format!("invalid argument: {}", g.next())),
            })
            .collect(),
        records_dropped: g.below(5),
        time_ns: g.next(),
    }
}

fn random_batch(g: &mut Rng, max_records: u64) -> Batch {
    Batch {
        records: (0..g.below(max_records + 1))
            .map(|_| random_record(g))
            .collect(),
        heartbeats: (0..g.below(3)).map(|_| random_heartbeat(g)).collect(),
    }
}

#[test]
fn encode_batch_writes_prosts_bytes_from_borrowed_records() {
    let mut g = Rng(0x9e37_79b9_7f4a_7c15);
    let mut buf = BytesMut::new();
    for _ in 0..200 {
        let b = random_batch(&mut g, 12);
        let reference = b.encode_to_vec();
        encode_batch(&b.records, &b.heartbeats, &mut buf);
        assert_eq!(&buf[..], &reference[..]);
        assert_eq!(
            encoded_batch_len(&b.records, &b.heartbeats),
            reference.len()
        );
        // A subset (what one shard gets) encodes as the Batch of that subset.
        let odd: Vec<&OpRecord> = b.records.iter().skip(1).step_by(2).collect();
        buf.clear();
        encode_batch(odd.iter().copied(), [], &mut buf);
        let sub = Batch {
            records: odd.into_iter().cloned().collect(),
            heartbeats: vec![],
        };
        assert_eq!(&buf[..], &sub.encode_to_vec()[..]);
        buf.clear();
    }
}

#[test]
fn scratch_decodes_what_prost_decodes_while_reusing_records() {
    let mut g = Rng(42);
    let mut s = BatchScratch::new();
    // Alternate large rich batches with small and empty ones: a reused record must not
    // keep anything of what it held before.
    for k in 0..300 {
        let b = if k % 3 == 2 {
            Batch::default()
        } else {
            random_batch(&mut g, if k % 2 == 0 { 20 } else { 3 })
        };
        let bytes = b.encode_to_vec();
        s.decode(&bytes).unwrap();
        let reference = Batch::decode(bytes.as_slice()).unwrap();
        assert_eq!(s.records(), &reference.records[..], "batch {k}");
        assert_eq!(s.heartbeats(), &reference.heartbeats[..], "batch {k}");
        assert_eq!(s.records(), &b.records[..]);
    }
}

#[test]
fn scratch_skips_unknown_fields_and_accepts_interleaved_fields_as_prost_does() {
    let mut g = Rng(7);
    let a = random_batch(&mut g, 3);
    let c = random_batch(&mut g, 3);
    let mut bytes = Vec::new();
    // A varint field 9, a length-delimited field 12 and a fixed64 field 15 nobody knows.
    bytes.extend_from_slice(&[9 << 3, 0x96, 0x01]);
    bytes.extend_from_slice(&[(12 << 3) | 2, 3, b'a', b'b', b'c']);
    bytes.extend_from_slice(&[(15 << 3) | 1, 1, 2, 3, 4, 5, 6, 7, 8]);
    bytes.extend(a.encode_to_vec());
    bytes.extend(c.encode_to_vec());
    let reference = Batch::decode(bytes.as_slice()).unwrap();
    let mut s = BatchScratch::new();
    s.decode(&bytes).unwrap();
    assert_eq!(s.records(), &reference.records[..]);
    assert_eq!(s.heartbeats(), &reference.heartbeats[..]);
    assert_eq!(s.records().len(), a.records.len() + c.records.len());
}

#[test]
fn truncated_and_corrupted_messages_fail_exactly_when_prost_fails() {
    let mut g = Rng(0xdead_beef);
    let mut s = BatchScratch::new();
    let b = random_batch(&mut g, 6);
    let b = Batch {
        records: b.records,
        heartbeats: vec![random_heartbeat(&mut g)],
    };
    let bytes = b.encode_to_vec();
    // Every truncation.
    for n in 0..bytes.len() {
        let cut = &bytes[..n];
        let ours = s.decode(cut);
        let theirs = Batch::decode(cut);
        assert_eq!(ours.is_ok(), theirs.is_ok(), "cut at {n}");
        match (ours, theirs) {
            (Ok(()), Ok(t)) => {
                assert_eq!(s.records(), &t.records[..]);
                assert_eq!(s.heartbeats(), &t.heartbeats[..]);
            }
            (Err(e), Err(_)) => {
                // Nothing half-decoded is offered, and the error says where.
                assert!(s.records().is_empty() && s.heartbeats().is_empty());
                assert_eq!(e.len, n);
                assert!(e.offset < n, "{e}");
                assert!(e.to_string().starts_with("malformed Batch message at byte"));
            }
            _ => unreachable!(),
        }
    }
    // Random byte corruption, and pure junk.
    for k in 0..2000 {
        let mut m = bytes.clone();
        for _ in 0..1 + g.below(3) {
            let i = g.below(m.len() as u64) as usize;
            m[i] = g.next() as u8;
        }
        if k % 10 == 0 {
            m = (0..g.below(64)).map(|_| g.next() as u8).collect();
        }
        let ours = s.decode(&m);
        let theirs = Batch::decode(m.as_slice());
        assert_eq!(ours.is_ok(), theirs.is_ok(), "case {k}: {m:02x?}");
        if let Ok(t) = theirs {
            assert_eq!(s.records(), &t.records[..]);
            assert_eq!(s.heartbeats(), &t.heartbeats[..]);
        }
    }
    // The scratch still decodes a good message after all that.
    s.decode(&bytes).unwrap();
    assert_eq!(s.records(), &b.records[..]);
}

#[test]
fn decode_error_becomes_an_invalid_argument_status() {
    let mut s = BatchScratch::new();
    let e = s.decode(&[0x0a, 0x05, 0x08]).unwrap_err();
    assert_eq!(e.offset, 0);
    assert_eq!(e.what, "record 0");
    let st = Status::from(e);
    assert_eq!(st.code(), tonic::Code::InvalidArgument);
    assert!(st.message().contains("record 0"), "{}", st.message());
}

#[test]
fn scratch_trims_after_a_huge_batch() {
    let rec = OpRecord {
        host: "h".into(),
        state: OpState::Completed as i32,
        ..Default::default()
    };
    let n = SCRATCH_KEEP_RECORDS + 10;
    let b = Batch {
        records: vec![rec; n],
        heartbeats: vec![],
    };
    let mut s = BatchScratch::new();
    s.decode(&b.encode_to_vec()).unwrap();
    assert_eq!(s.records().len(), n);
    s.trim();
    assert!(s.records.len() <= SCRATCH_KEEP_RECORDS);
    let small = Batch {
        records: b.records[..3].to_vec(),
        heartbeats: vec![],
    };
    s.decode(&small.encode_to_vec()).unwrap();
    assert_eq!(s.records(), &small.records[..]);
}

/// Decodes `bytes` with the scratch and with prost (the reference): both succeed or both
/// fail; on success they hold the same records and heartbeats, on failure the scratch
/// holds nothing and its error says where.
fn agrees_with_prost(s: &mut BatchScratch, bytes: &[u8]) -> Result<(), String> {
    let ours = s.decode(bytes);
    match (ours, Batch::decode(bytes)) {
        (Ok(()), Ok(t)) if s.records() == &t.records[..] && s.heartbeats() == &t.heartbeats[..] => {
            Ok(())
        }
        (Err(e), Err(_))
            if s.records().is_empty()
                && s.heartbeats().is_empty()
                && e.len == bytes.len()
                && (bytes.is_empty() || e.offset < bytes.len()) =>
        {
            Ok(())
        }
        (o, t) => Err(format!(
            "scratch {o:?} vs prost {:?} on {bytes:02x?}",
            t.map(|_| ())
        )),
    }
}

// Property tests (proptest's default 256 cases each; the longer run of issue 13 is
// `PROPTEST_CASES=100000 cargo test -p analyzer --lib codec::tests::prop`).
proptest::proptest! {
    #[test]
    fn prop_arbitrary_bytes_decode_exactly_as_prost_or_fail_cleanly(
        bytes in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..300)
    ) {
        let mut s = BatchScratch::new();
        proptest::prop_assert_eq!(agrees_with_prost(&mut s, &bytes), Ok(()));
    }

    #[test]
    fn prop_edited_and_truncated_batches_decode_exactly_as_prost(
        seed in 1..u64::MAX,
        edits in proptest::collection::vec(
            (proptest::arbitrary::any::<usize>(), proptest::arbitrary::any::<u8>()), 0..4),
        cut in proptest::arbitrary::any::<usize>(),
    ) {
        let mut g = Rng(seed);
        let mut bytes = random_batch(&mut g, 4).encode_to_vec();
        for (at, v) in edits {
            if !bytes.is_empty() {
                let i = at % bytes.len();
                bytes[i] = v;
            }
        }
        bytes.truncate(cut % (bytes.len() + 1));
        let mut s = BatchScratch::new();
        proptest::prop_assert_eq!(agrees_with_prost(&mut s, &bytes), Ok(()));
        // The same scratch still decodes a good batch afterwards.
        let good = random_batch(&mut g, 2);
        s.decode(&good.encode_to_vec()).unwrap();
        proptest::prop_assert_eq!(s.records(), &good.records[..]);
    }
}
