//! Environment-driven behaviour, in its own binary because it sets process environment
//! variables (one test function, so nothing runs concurrently with the changes):
//! `NCCL_MIN_NCHANNELS`/`NCCL_MAX_NCHANNELS` reach the schedule and the probe,
//! `CCLD_DISABLE=1` (and `Comm::set_probing(false)` at run time) turns probe updates off
//! without changing results, and `CCLD_RECORD_US` thins the records of fast communicators.

use std::sync::Arc;

use ccl_core::{enqueue, group_end, group_start, CollArgs, Comm, DataType};
use ccl_optype::CollKind;

fn allreduce_all(comms: &[Arc<Comm>], count: usize) -> Vec<Vec<f32>> {
    let sends: Vec<Vec<f32>> = (0..comms.len())
        .map(|r| vec![r as f32 + 1.0; count])
        .collect();
    let mut recvs = vec![vec![0f32; count]; comms.len()];
    group_start().unwrap();
    for (r, c) in comms.iter().enumerate() {
        let a = CollArgs {
            kind: CollKind::AllReduce,
            sendbuf: sends[r].as_ptr() as usize,
            recvbuf: recvs[r].as_mut_ptr() as usize,
            count,
            dtype: DataType::Float32 as i32,
            op: 0,
            root: -1,
            stream: 0,
        };
        enqueue(c, a).unwrap();
    }
    group_end().unwrap();
    recvs
}

#[test]
fn channel_env_and_probe_disable() {
    // 1. Channel bounds from the (deprecated) NCHANNELS names: 5 channels even for 10 floats.
    std::env::set_var("NCCL_MIN_NCHANNELS", "5");
    std::env::set_var("NCCL_MAX_NCHANNELS", "5");
    let comms = Comm::init_all(3, None).unwrap();
    assert_eq!(comms[0].channel_bounds(), (5, 5));
    assert_eq!(comms[0].probe_frame().channel_capacity(), 5);
    let out = allreduce_all(&comms, 1000);
    assert!(out.iter().all(|v| v.iter().all(|x| *x == 6.0)));
    let h = comms[1].probe_frame().header();
    assert_eq!((h.op_counter, h.n_channels, h.mode), (0, 5, true));
    let snap = comms[1].op_log().get(0).unwrap();
    assert_eq!(snap.info.n_channels, 5);
    assert_eq!(snap.info.coll, CollKind::AllReduce);
    assert_eq!(snap.info.bytes, 4000);
    for c in &comms {
        c.destroy().unwrap();
    }
    std::env::remove_var("NCCL_MIN_NCHANNELS");
    std::env::remove_var("NCCL_MAX_NCHANNELS");

    // 2. CCLD_DISABLE=1: same results, frame not measuring and untouched, log empty.
    std::env::set_var("CCLD_DISABLE", "1");
    let comms = Comm::init_all(2, None).unwrap();
    assert!(!comms[0].probe_enabled());
    let out = allreduce_all(&comms, 100_000);
    assert!(out.iter().all(|v| v.iter().all(|x| *x == 3.0)));
    for c in &comms {
        let f = c.probe_frame();
        assert!(!f.is_measuring());
        assert_eq!(f.header().op_counter, 0);
        assert_eq!(f.header().n_channels, 0);
        for ch in 0..f.channel_capacity() {
            assert_eq!(f.counts(0, ch).send_count, 0);
        }
        assert!(c.op_log().get(0).is_none());
        assert_eq!(c.ops_started(), 1, "the operation counter still advances");
        c.destroy().unwrap();
    }

    // 3. A malformed value is an error naming the variable.
    std::env::set_var("CCLD_DISABLE", "yes");
    let e = Comm::init_all(1, None).unwrap_err();
    assert!(e.to_string().contains("CCLD_DISABLE"), "{e}");
    std::env::remove_var("CCLD_DISABLE");
    // CCLD_REPORT: stderr, off or FILE.jsonl; a typo fails init naming it.
    std::env::set_var("CCLD_REPORT", "stdout");
    let e = Comm::init_all(1, None).unwrap_err();
    assert!(e.to_string().contains("CCLD_REPORT"), "{e}");
    std::env::remove_var("CCLD_REPORT");

    // 4. Probing paused at run time: the operation is not traced (frame and log as with
    //    CCLD_DISABLE=1, nothing reported), results unchanged; resumed, tracing goes on.
    let comms = Comm::init_all(2, None).unwrap();
    allreduce_all(&comms, 10);
    let counts = |cs: &[Arc<Comm>]| cs[0].probe_record_counts().unwrap();
    assert_eq!(counts(&comms), (1, 0));
    for c in &comms {
        c.set_probing(false);
    }
    let out = allreduce_all(&comms, 1000);
    assert!(out.iter().all(|v| v.iter().all(|x| *x == 3.0)));
    for c in &comms {
        assert!(!c.probe_frame().is_measuring());
        assert_eq!(c.probe_frame().header().op_counter, 0, "op 1 not traced");
        assert!(c.op_log().get(1).is_none());
        c.set_probing(true);
    }
    assert_eq!(counts(&comms), (1, 0));
    allreduce_all(&comms, 10);
    assert_eq!(comms[1].probe_frame().header().op_counter, 2);
    assert_eq!(counts(&comms), (2, 0));
    for c in &comms {
        c.destroy().unwrap();
    }

    // 5. CCLD_RECORD_US: thinning of fast communicators' records. With 0 every completion
    //    is reported; with a target of 1 s (a stride of 64 or more for anything faster
    //    than 80 operations a second), the first epoch of 32 operations and then a few. A
    //    malformed value fails init naming the variable.
    for (value, all) in [("0", true), ("1000000", false)] {
        std::env::set_var("CCLD_RECORD_US", value);
        let comms = Comm::init_all(2, None).unwrap();
        std::env::remove_var("CCLD_RECORD_US");
        for _ in 0..2000 {
            allreduce_all(&comms, 1);
        }
        let (reported, skipped) = counts(&comms);
        assert_eq!(reported + skipped, 2000);
        if all {
            assert_eq!(skipped, 0);
        } else {
            assert!((32..100).contains(&reported), "{reported} of 2000 reported");
        }
        for c in &comms {
            c.destroy().unwrap();
        }
    }
    std::env::set_var("CCLD_RECORD_US", "fast");
    let e = Comm::init_all(1, None).unwrap_err();
    assert!(e.to_string().contains("CCLD_RECORD_US"), "{e}");
    std::env::remove_var("CCLD_RECORD_US");
}
