//! Bad input gets a typed error naming the problem (never a panic or a hang), and leaves
//! the communicator usable.

use std::sync::Arc;

use ccl_core::{enqueue, CollArgs, Comm, CommConfig, DataType, ResultCode, ScalarArg};
use ccl_optype::CollKind;

fn ok_args(send: &[f32], recv: &mut [f32]) -> CollArgs {
    CollArgs {
        kind: CollKind::AllReduce,
        sendbuf: send.as_ptr() as usize,
        recvbuf: recv.as_mut_ptr() as usize,
        count: send.len(),
        dtype: DataType::Float32 as i32,
        op: 0,
        root: -1,
        stream: 0,
    }
}

fn expect_err(comm: &Arc<Comm>, a: CollArgs, code: ResultCode, needle: &str) {
    let e = enqueue(comm, a).expect_err(needle);
    assert_eq!(e.code(), code, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
    assert_eq!(comm.last_error().as_deref(), Some(msg.as_str()));
}

#[test]
fn invalid_arguments_are_rejected_with_named_errors() {
    let c = Comm::init_all(1, None).unwrap().remove(0);
    let send = vec![1f32; 16];
    let mut recv = vec![0f32; 16];
    let good = ok_args(&send, &mut recv);
    use ResultCode::InvalidArgument as IA;
    expect_err(&c, CollArgs { sendbuf: 0, ..good }, IA, "sendbuff is null");
    expect_err(&c, CollArgs { recvbuf: 0, ..good }, IA, "recvbuff is null");
    expect_err(
        &c,
        CollArgs {
            count: usize::MAX / 2,
            ..good
        },
        IA,
        "overflows",
    );
    expect_err(
        &c,
        CollArgs {
            kind: CollKind::AllGather,
            count: isize::MAX as usize / 4 + 1,
            ..good
        },
        IA,
        "overflows",
    );
    expect_err(
        &c,
        CollArgs { dtype: 12, ..good },
        IA,
        "invalid data type 12",
    );
    expect_err(
        &c,
        CollArgs { dtype: -1, ..good },
        IA,
        "invalid data type -1",
    );
    expect_err(&c, CollArgs { op: 5, ..good }, IA, "op 5");
    expect_err(
        &c,
        CollArgs { op: -3, ..good },
        IA,
        "invalid reduction op -3",
    );
    for kind in [
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::Gather,
        CollKind::Scatter,
    ] {
        expect_err(
            &c,
            CollArgs {
                kind,
                root: 1,
                ..good
            },
            IA,
            "invalid root 1",
        );
        expect_err(
            &c,
            CollArgs {
                kind,
                root: -1,
                ..good
            },
            IA,
            "invalid root -1",
        );
    }
    expect_err(
        &c,
        CollArgs {
            kind: CollKind::Send,
            root: 2,
            ..good
        },
        IA,
        "invalid peer 2",
    );
    expect_err(
        &c,
        CollArgs {
            kind: CollKind::Recv,
            root: -1,
            ..good
        },
        IA,
        "invalid peer -1",
    );
    // Null buffers are fine with count 0, and the op on a non-reducing collective is ignored.
    enqueue(
        &c,
        CollArgs {
            sendbuf: 0,
            recvbuf: 0,
            count: 0,
            ..good
        },
    )
    .unwrap();
    enqueue(
        &c,
        CollArgs {
            kind: CollKind::AllGather,
            op: 99,
            ..good
        },
    )
    .unwrap();
    // A send to self without the matching receive in the group is a usage error.
    let e = enqueue(
        &c,
        CollArgs {
            kind: CollKind::Send,
            root: 0,
            ..good
        },
    )
    .unwrap_err();
    assert_eq!(e.code(), ResultCode::InvalidUsage, "{e}");
    // Still usable.
    enqueue(&c, good).unwrap();
    assert_eq!(recv, send);
    c.destroy().unwrap();
    // After destroy.
    let e = enqueue(&c, good).unwrap_err();
    assert_eq!(e.code(), ResultCode::InvalidUsage);
    assert!(e.to_string().contains("destroyed"), "{e}");
    assert_eq!(c.destroy().unwrap_err().code(), ResultCode::InvalidUsage);
}

#[test]
fn premulsum_ops_are_validated_and_destroyed_ops_refused() {
    let c = Comm::init_all(1, None).unwrap().remove(0);
    let send = vec![3f32; 8];
    let mut recv = vec![0f32; 8];
    let good = ok_args(&send, &mut recv);
    let e = c
        .create_premulsum(ScalarArg::HostImmediate(vec![0; 2]), DataType::Float32)
        .unwrap_err();
    assert_eq!(e.code(), ResultCode::InvalidArgument);
    let e = c
        .create_premulsum(ScalarArg::Device(0), DataType::Float32)
        .unwrap_err();
    assert_eq!(e.code(), ResultCode::InvalidArgument);
    let op = c
        .create_premulsum(
            ScalarArg::HostImmediate(2f32.to_le_bytes().to_vec()),
            DataType::Float32,
        )
        .unwrap();
    assert!(op >= 5);
    enqueue(&c, CollArgs { op, ..good }).unwrap();
    assert_eq!(recv, vec![6f32; 8]);
    // Wrong dtype for the op.
    let ints = [1i32; 8];
    let mut out = [0i32; 8];
    let e = enqueue(
        &c,
        CollArgs {
            op,
            sendbuf: ints.as_ptr() as usize,
            recvbuf: out.as_mut_ptr() as usize,
            dtype: DataType::Int32 as i32,
            ..good
        },
    )
    .unwrap_err();
    assert_eq!(e.code(), ResultCode::InvalidArgument);
    c.destroy_redop(op).unwrap();
    expect_err(
        &c,
        CollArgs { op, ..good },
        ResultCode::InvalidArgument,
        "not a live PreMulSum op",
    );
    assert_eq!(
        c.destroy_redop(op).unwrap_err().code(),
        ResultCode::InvalidArgument
    );
    assert_eq!(
        c.destroy_redop(0).unwrap_err().code(),
        ResultCode::InvalidArgument
    );
    assert_eq!(
        c.destroy_redop(77).unwrap_err().code(),
        ResultCode::InvalidArgument
    );
    // Registration handles.
    let h = c.register(send.as_ptr() as usize, 32).unwrap();
    assert_ne!(h, 0);
    assert_eq!(
        c.register(0, 16).unwrap_err().code(),
        ResultCode::InvalidArgument
    );
    c.deregister(h).unwrap();
    assert_eq!(
        c.deregister(h).unwrap_err().code(),
        ResultCode::InvalidArgument
    );
    c.destroy().unwrap();
}

#[test]
fn bad_init_arguments_and_env_are_typed_errors() {
    let id = ccl_core::bootstrap::get_unique_id().unwrap();
    for (n, r) in [(0, 0), (-1, 0), (2, 2), (2, -1)] {
        let e = Comm::init_rank(n, id, r, CommConfig::default()).unwrap_err();
        assert_eq!(
            e.code(),
            ResultCode::InvalidArgument,
            "nranks {n} rank {r}: {e}"
        );
    }
    assert_eq!(
        Comm::init_all(0, None).unwrap_err().code(),
        ResultCode::InvalidArgument
    );
    assert_eq!(
        Comm::init_all(2, Some(vec![0])).unwrap_err().code(),
        ResultCode::InvalidArgument
    );
    // A junk id fails cleanly.
    let junk = ccl_core::UniqueId([0x5a; 128]);
    let e = Comm::init_rank(1, junk, 0, CommConfig::default()).unwrap_err();
    assert_ne!(e.code(), ResultCode::Success);
}

#[test]
fn ranks_with_different_channel_settings_fail_init_on_every_rank() {
    let id = ccl_core::bootstrap::get_unique_id().unwrap();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            std::thread::spawn(move || {
                let cfg = CommConfig {
                    max_ctas: Some(if r == 0 { 2 } else { 3 }),
                    ..CommConfig::default()
                };
                Comm::init_rank(2, id, r, cfg)
            })
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap().unwrap_err();
        assert_eq!(e.code(), ResultCode::InvalidUsage, "{e}");
        assert!(e.to_string().contains("NCCL_BUFFSIZE"), "{e}");
    }
}

#[test]
fn per_rank_counts_that_overflow_times_nranks_are_rejected() {
    let comms = Comm::init_all(2, None).unwrap();
    let send = vec![1f32; 4];
    let mut recv = vec![0f32; 8];
    let count = isize::MAX as usize / 4 / 2 + 1; // count * 4 fits, times 2 ranks does not
    for kind in [
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
    ] {
        let a = CollArgs {
            kind,
            count,
            ..ok_args(&send, &mut recv)
        };
        expect_err(
            &comms[0],
            a,
            ResultCode::InvalidArgument,
            "x 2 ranks overflows",
        );
    }
    for c in &comms {
        c.destroy().unwrap();
    }
}
