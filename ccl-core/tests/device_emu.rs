//! The device backend through the communicator API, on the CPU emulation of the device
//! (`CCLD_DEVICE_EMULATION=1`; no GPU needed): every collective, Send/Recv groups and
//! AlltoAll x 1, 2, 4, 8 ranks x Float32 + Int32 (Sum, Max, Avg) against an independent
//! reference (exact inputs: see `common`), the probe frame after completion against the
//! schedule, asynchronous completion (the call returns before the work is done) and abort
//! of an operation whose peer never enqueues.
//!
//! The same matrix runs with `NCCL_PROTO` unset (auto: small operations LL, large ones
//! Simple), `NCCL_PROTO=LL` and `NCCL_PROTO=Simple`; a mixed test checks the automatic
//! choice and protocol switches on one communicator.
//!
//! Every test sets its environment at its start (`std::env::set_var`): nextest (CI) runs
//! each test in its own process. Under `cargo test` the threads of one process share it:
//! tests that set another `NCCL_PROTO` may then run with a neighbour's value (results
//! and probe counters stay correct: a communicator plans with its own protocol set), and
//! the protocol assertions of `small_operations_use_ll_and_large_ones_simple` need
//! `--test-threads=1`.

mod common;
mod device_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::device::api::{DeviceApi, Stream};
use ccl_core::device::emu;
use ccl_core::internal::group::expected_counts;
use ccl_core::{group_end, group_start, CollArgs, Comm, DataType};
use ccl_optype::CollKind;
use common::*;
use device_support::{check_output, run_threads, DevCase};

fn setup() {
    setup_proto(None);
}

/// The emulator's environment with `NCCL_PROTO` = `proto` (`None`: unset, auto choice).
fn setup_proto(proto: Option<&str>) {
    std::env::set_var("CCLD_DEVICE_EMULATION", "1");
    std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    std::env::set_var("NCCL_BUFFSIZE", "65536");
    match proto {
        Some(p) => std::env::set_var("NCCL_PROTO", p),
        None => std::env::remove_var("NCCL_PROTO"),
    }
}

fn comms(n: usize) -> Vec<Arc<Comm>> {
    comms_proto(n, None)
}

fn comms_proto(n: usize, proto: Option<&str>) -> Vec<Arc<Comm>> {
    setup_proto(proto);
    let c = Comm::init_all(n as i32, None).expect("init_all");
    assert!(
        c.iter().all(|c| c.is_device()),
        "emulation must pick the device backend"
    );
    c
}

/// Waits until `s` is idle, at most `limit`.
fn wait(s: Stream, limit: Duration) -> bool {
    let d = emu::global();
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if d.stream_query(s).expect("query") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

struct Rank {
    send: Vec<u8>,
    recv: Vec<u8>,
    stream: Stream,
}

/// Runs `coll` on all ranks of `cs` from this thread (one group), waits for the streams,
/// checks results and probe counters.
/// A Float32 Sum AllReduce of `count` elements on `stream`.
fn sum_f32(sendbuf: usize, recvbuf: usize, count: usize, stream: Stream) -> CollArgs {
    CollArgs {
        kind: CollKind::AllReduce,
        sendbuf,
        recvbuf,
        count,
        dtype: DataType::Float32 as i32,
        op: SUM,
        root: -1,
        stream,
    }
}

/// Blocks `s` (a host function) until `gate` opens, at most 20 s.
fn hold_stream(d: &dyn DeviceApi, s: Stream, gate: &Arc<AtomicBool>) {
    let g = Arc::clone(gate);
    d.launch_host_fn(
        s,
        Box::new(move || {
            let t0 = Instant::now();
            while !g.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }),
    )
    .unwrap();
}

fn run(cs: &[Arc<Comm>], coll: CollKind, dt: DataType, red: Red, op: i32, count: usize) {
    let n = cs.len();
    let es = dt.size();
    let root = (count + 1) % n;
    let (sn, rn) = sizes(coll, count, n);
    let d = emu::global();
    let mut ranks: Vec<Rank> = (0..n)
        .map(|r| {
            let mut send = vec![0u8; (sn * es).max(1)];
            fill(dt, red, r, 0, &mut send[..sn * es]);
            Rank {
                send,
                recv: vec![0xA5; (rn * es).max(1)],
                stream: d.stream_create().expect("stream"),
            }
        })
        .collect();
    let args: Vec<CollArgs> = ranks
        .iter_mut()
        .map(|b| CollArgs {
            kind: coll,
            sendbuf: b.send.as_ptr() as usize,
            recvbuf: b.recv.as_mut_ptr() as usize,
            count,
            dtype: dt as i32,
            op,
            root: if matches!(coll, CollKind::Broadcast | CollKind::Reduce) {
                root as i32
            } else {
                -1
            },
            stream: b.stream,
        })
        .collect();
    let before: Vec<u64> = cs.iter().map(|c| c.ops_started()).collect();
    group_start().unwrap();
    for (c, a) in cs.iter().zip(&args) {
        ccl_core::enqueue(c, *a).expect("enqueue");
    }
    group_end().expect("group_end");
    let ctx = format!("{coll:?} {dt:?} {red:?} n {n} count {count}");
    for (r, b) in ranks.iter().enumerate() {
        assert!(
            wait(b.stream, Duration::from_secs(30)),
            "{ctx}: rank {r} did not finish"
        );
    }
    for (r, b) in ranks.iter().enumerate() {
        // Exact inputs, power-of-two rank counts: bit-exact (Avg included).
        check_output(coll, dt, red, n, r, root, count, &b.recv[..rn * es])
            .unwrap_or_else(|e| panic!("{ctx}: rank {r}: {e}"));
        let exp = expected_counts(&cs[r], &[args[r]]).expect("expected counts");
        check_probe(&cs[r], before[r], &exp).unwrap_or_else(|e| panic!("{ctx}: rank {r}: {e}"));
    }
    for b in ranks {
        d.stream_destroy(b.stream).unwrap();
    }
}

fn matrix(n: usize, proto: Option<&str>) {
    let cs = comms_proto(n, proto);
    let launches = emu::launches_on_this_thread();
    for dt in [DataType::Float32, DataType::Int32] {
        for (red, op) in [(Red::Sum, SUM), (Red::Max, MAX), (Red::Avg, AVG)] {
            for coll in [
                CollKind::AllReduce,
                CollKind::Reduce,
                CollKind::ReduceScatter,
            ] {
                for count in [1, 1000, 9000] {
                    run(&cs, coll, dt, red, op, count);
                }
            }
        }
        for coll in [CollKind::Broadcast, CollKind::AllGather, CollKind::AlltoAll] {
            for count in [1, 1000, 9000] {
                run(&cs, coll, dt, Red::Sum, SUM, count);
            }
        }
    }
    sendrecv_ring(&cs, 5000);
    // The kernels ran with the protocol NCCL_PROTO asks for.
    let (simple, ll) = emu::launches_on_this_thread();
    let (simple, ll) = (simple - launches.0, ll - launches.1);
    match proto {
        Some("LL") => assert_eq!(simple, 0, "NCCL_PROTO=LL launched Simple plans"),
        Some("Simple") => assert_eq!(ll, 0, "NCCL_PROTO=Simple launched LL plans"),
        _ => assert!(
            simple > 0 && ll > 0,
            "auto: both protocols ({simple}, {ll})"
        ),
    }
    for c in &cs {
        c.destroy().unwrap();
    }
}

/// Every rank sends to the next and receives from the previous, in one group.
fn sendrecv_ring(cs: &[Arc<Comm>], count: usize) {
    let n = cs.len();
    let d = emu::global();
    let dt = DataType::Float32;
    let mut ranks: Vec<Rank> = (0..n)
        .map(|r| {
            let mut send = vec![0u8; count * 4];
            fill(dt, Red::Sum, r, 0, &mut send);
            Rank {
                send,
                recv: vec![0xA5; count * 4],
                stream: d.stream_create().unwrap(),
            }
        })
        .collect();
    group_start().unwrap();
    for (r, c) in cs.iter().enumerate() {
        let b = &mut ranks[r];
        let mk = |kind, buf: usize, peer: usize| CollArgs {
            kind,
            sendbuf: buf,
            recvbuf: buf,
            count,
            dtype: dt as i32,
            op: 0,
            root: peer as i32,
            stream: b.stream,
        };
        let send = mk(CollKind::Send, b.send.as_ptr() as usize, (r + 1) % n);
        let recv = mk(
            CollKind::Recv,
            b.recv.as_mut_ptr() as usize,
            (r + n - 1) % n,
        );
        ccl_core::enqueue(c, recv).unwrap();
        ccl_core::enqueue(c, send).unwrap();
    }
    group_end().unwrap();
    for (r, b) in ranks.iter().enumerate() {
        assert!(
            wait(b.stream, Duration::from_secs(30)),
            "send/recv rank {r}"
        );
        check_output(CollKind::Recv, dt, Red::Sum, n, r, 0, count, &b.recv)
            .unwrap_or_else(|e| panic!("send/recv n {n} rank {r}: {e}"));
    }
}

#[test]
fn every_collective_on_1_rank() {
    matrix(1, None);
}

#[test]
fn every_collective_on_2_ranks() {
    matrix(2, None);
}

#[test]
fn every_collective_on_4_ranks() {
    matrix(4, None);
}

#[test]
fn every_collective_on_8_ranks() {
    matrix(8, None);
}

#[test]
fn every_collective_on_1_rank_ll() {
    matrix(1, Some("LL"));
}

#[test]
fn every_collective_on_2_ranks_ll() {
    matrix(2, Some("LL"));
}

#[test]
fn every_collective_on_4_ranks_ll() {
    matrix(4, Some("LL"));
}

#[test]
fn every_collective_on_8_ranks_ll() {
    matrix(8, Some("LL"));
}

#[test]
fn every_collective_on_2_ranks_simple() {
    matrix(2, Some("Simple"));
}

#[test]
fn every_collective_on_8_ranks_simple() {
    matrix(8, Some("Simple"));
}

/// Auto choice on one communicator: small operations LL, large ones Simple, switching
/// back and forth on the same ring and p2p connections (each switch back to LL scrubs
/// the slots that held Simple data); every result, every probe counter, and the protocol
/// of each launch.
#[test]
fn small_operations_use_ll_and_large_ones_simple() {
    use ccl_core::internal::proto::{Proto, LL_THRESHOLD_BYTES};
    let n = 4;
    let cs = comms_proto(n, Some("ll,SIMPLE"));
    let small = 1000; // 4000 bytes per rank
    let large = LL_THRESHOLD_BYTES / 4 + 1; // one element over the threshold
    let d = emu::global();
    let s = d.stream_create().unwrap();
    // Validation only (nothing runs): any non-null addresses.
    let dummy = [0u8; 16];
    let probe_args = |coll, count| CollArgs {
        kind: coll,
        sendbuf: dummy.as_ptr() as usize,
        recvbuf: dummy.as_ptr() as usize,
        count,
        dtype: DataType::Int32 as i32,
        op: SUM,
        root: if coll == CollKind::Broadcast { 1 } else { -1 },
        stream: s,
    };
    let cases = [
        (CollKind::AllReduce, small, Proto::Ll),
        (CollKind::AllReduce, large, Proto::Simple),
        (CollKind::AllReduce, small, Proto::Ll),
        (CollKind::Broadcast, large, Proto::Simple),
        (CollKind::ReduceScatter, small, Proto::Ll),
        // AlltoAll: per-rank bytes = count * 4 * n.
        (CollKind::AlltoAll, 100, Proto::Ll),
        (
            CollKind::AlltoAll,
            LL_THRESHOLD_BYTES / 4 / n + 1,
            Proto::Simple,
        ),
        (CollKind::AlltoAll, 100, Proto::Ll),
        (CollKind::AllGather, 7, Proto::Ll),
    ];
    for (coll, count, want) in cases {
        let got =
            ccl_core::internal::group::protocol_of(&cs[0], &[probe_args(coll, count)]).unwrap();
        assert_eq!(got, Some(want), "{coll:?} {count}");
        let before = emu::launches_on_this_thread();
        run(&cs, coll, DataType::Int32, Red::Sum, SUM, count);
        let after = emu::launches_on_this_thread();
        let launched = match want {
            Proto::Ll => after.1 - before.1,
            Proto::Simple => after.0 - before.0,
        };
        assert_eq!(
            launched, n,
            "{coll:?} {count}: every rank launched {want:?}"
        );
        // The probe's operation type set says which protocol ran.
        let c = cs[1].probe_frame().header().op_counter;
        let logged = cs[1].op_log().get(c).expect("newest op").info.proto;
        let want_probe = match want {
            Proto::Ll => ccl_optype::Proto::Ll,
            Proto::Simple => ccl_optype::Proto::Simple,
        };
        assert_eq!(logged, want_probe, "{coll:?} {count}");
    }
    // Send/Recv groups: Simple when allowed (both ends must agree whatever their groups).
    let p2p = CollArgs {
        kind: CollKind::Send,
        root: 1,
        ..probe_args(CollKind::AllReduce, 10)
    };
    assert_eq!(
        ccl_core::internal::group::protocol_of(&cs[0], &[p2p]).unwrap(),
        Some(Proto::Simple)
    );
    sendrecv_ring(&cs, 300);
    // ...and the p2p connections go back to LL (scrubbed) for a small AlltoAll.
    run(&cs, CollKind::AlltoAll, DataType::Int32, Red::Sum, SUM, 50);
    d.stream_destroy(s).unwrap();
    for c in &cs {
        c.destroy().unwrap();
    }
}

#[test]
fn a_bad_nccl_proto_fails_init_naming_it() {
    for bad in ["LL,Fast", "LL128", "^LL,Simple", "^"] {
        setup_proto(Some(bad));
        let e = Comm::init_all(2, None).expect_err(bad);
        assert!(e.to_string().contains("NCCL_PROTO"), "{bad}: {e}");
    }
    // The host backend accepts any valid value (it runs Simple only).
    setup_proto(Some("LL"));
    std::env::set_var("CCLD_BACKEND", "host");
    let cs = Comm::init_all(2, None).expect("host backend with NCCL_PROTO=LL");
    assert!(cs.iter().all(|c| !c.is_device()));
    for c in &cs {
        c.destroy().unwrap();
    }
}

#[test]
fn ranks_on_different_devices_of_one_process_enable_peer_access() {
    // init_all puts rank r on (emulated) device r; a sender writes into its successor's
    // FIFOs, so each device must have been given access to the next one's memory.
    let cs = comms(4);
    let d = emu::global();
    for r in 0..4 {
        assert!(
            d.peer_access_enabled(r, (r + 1) % 4),
            "device {r} -> {}",
            (r + 1) % 4
        );
    }
    assert!(
        !d.peer_access_enabled(1, 0),
        "only the direction data flows"
    );
    sendrecv_ring(&cs, 999);
}

#[test]
fn the_call_returns_before_the_work_is_done() {
    let cs = comms(2);
    let d = emu::global();
    let gate = Arc::new(AtomicBool::new(false));
    let count = 4096;
    let mut bufs: Vec<(Vec<u8>, Vec<u8>, Stream)> = (0..2)
        .map(|r| {
            let mut s = vec![0u8; count * 4];
            fill(DataType::Float32, Red::Sum, r, 0, &mut s);
            (s, vec![0xA5u8; count * 4], d.stream_create().unwrap())
        })
        .collect();
    // Block both streams until the gate opens.
    for (_, _, s) in &bufs {
        hold_stream(&*d, *s, &gate);
    }
    group_start().unwrap();
    for (c, (s, r, st)) in cs.iter().zip(bufs.iter_mut()) {
        let a = sum_f32(s.as_ptr() as usize, r.as_mut_ptr() as usize, count, *st);
        ccl_core::enqueue(c, a).unwrap();
    }
    group_end().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    for (_, r, s) in &bufs {
        assert!(!d.stream_query(*s).unwrap(), "work must still be pending");
        assert!(
            r.iter().all(|b| *b == 0xA5),
            "no result before the stream ran"
        );
    }
    assert!(
        cs[0]
            .op_log()
            .get(0)
            .is_none_or(|o| o.state != probe::OpState::Completed),
        "the op must not be complete yet"
    );
    gate.store(true, Ordering::Release);
    for (_, _, s) in &bufs {
        d.stream_synchronize(*s).unwrap();
    }
    for (_, r, _) in &bufs {
        for k in 0..count {
            assert_eq!(
                dec(DataType::Float32, &r[k * 4..k * 4 + 4]),
                reduce_ref(DataType::Float32, Red::Sum, 2, k).0
            );
        }
    }
    assert_eq!(
        settled_op(&cs[0], 0).map(|o| o.state),
        Some(probe::OpState::Completed)
    );
    for c in &cs {
        c.destroy().unwrap();
    }
}

#[test]
fn abort_ends_an_operation_whose_peer_never_enqueues() {
    let cs = comms(2);
    let d = emu::global();
    let s = d.stream_create().unwrap();
    let count = 1 << 16;
    let send = vec![1u8; count * 4];
    let mut recv = vec![0u8; count * 4];
    let a = sum_f32(send.as_ptr() as usize, recv.as_mut_ptr() as usize, count, s);
    // Rank 1 never calls: rank 0's kernel waits for it.
    ccl_core::enqueue(&cs[0], a).unwrap();
    assert!(!wait(s, Duration::from_millis(200)), "must be stuck");
    let t0 = Instant::now();
    cs[0].abort().unwrap();
    assert!(wait(s, Duration::from_secs(5)), "abort must end the kernel");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let op = cs[0].op_log().get(0).expect("op logged");
    assert_ne!(
        op.state,
        probe::OpState::Completed,
        "an aborted op is not completed: {op:?}"
    );
    cs[1].destroy().unwrap();
    drop(send);
    drop(recv);
}

/// The GPU suite's driver (`device_support::run_threads`, used by `device_matrix`): ranks
/// as threads, each with its own communicator, stream and buffers allocated through the
/// runtime's `DeviceApi`, results copied back and checked, probe counters checked.
#[test]
fn ranks_as_threads_with_device_buffers() {
    setup();
    let (api, dev) = ccl_core::device::runtime::device_api(None)
        .expect("variables")
        .expect("emulation selects the device");
    assert!(api.is_emulated());
    let f = DataType::Float32;
    let i = DataType::Int32;
    let case = |coll, dt, red, op, count| DevCase {
        coll,
        dt,
        red,
        op,
        count,
    };
    let cases = [
        case(CollKind::AllReduce, f, Red::Sum, SUM, 0),
        case(CollKind::AllReduce, f, Red::Avg, AVG, 999),
        case(CollKind::Reduce, i, Red::Max, MAX, 7),
        case(CollKind::ReduceScatter, i, Red::Avg, AVG, 999),
        case(CollKind::AllGather, f, Red::Sum, SUM, 7),
        case(CollKind::Broadcast, i, Red::Sum, SUM, 999),
        case(CollKind::AlltoAll, f, Red::Sum, SUM, 7),
        case(CollKind::Send, i, Red::Sum, SUM, 999),
    ];
    for n in [1, 2, 4] {
        let rep = run_threads(
            Arc::clone(&api),
            dev,
            n,
            &cases,
            &[4096],
            2,
            Duration::from_secs(20),
        )
        .expect("threads");
        for (c, r) in cases.iter().zip(&rep.cases) {
            assert!(r.is_ok(), "{} ranks {n}: {r:?}", c.name());
        }
        assert!(rep.bw[0].1.is_ok(), "{:?}", rep.bw);
    }
}

#[test]
fn check_output_names_a_wrong_element() {
    let dt = DataType::Int32;
    let (n, count) = (4, 10);
    let mut out = vec![0u8; count * 4];
    for k in 0..count {
        enc(dt, reduce_ref(dt, Red::Sum, n, k).0, &mut out[k * 4..]);
    }
    assert_eq!(
        check_output(CollKind::AllReduce, dt, Red::Sum, n, 0, 0, count, &out),
        Ok(())
    );
    out[6 * 4] ^= 1;
    let e = check_output(CollKind::AllReduce, dt, Red::Sum, n, 0, 0, count, &out).unwrap_err();
    assert!(e.starts_with("element 6:"), "{e}");
    // Reduce: only the root's output is specified.
    assert_eq!(
        check_output(CollKind::Reduce, dt, Red::Sum, n, 1, 0, count, &out),
        Ok(())
    );
    assert!(check_output(CollKind::Reduce, dt, Red::Sum, n, 0, 0, count, &out).is_err());
}

/// Our calls leave the caller's current device as it was (NCCL does too): one thread
/// drives ranks on emulated devices 0 and 1 while its own current device is 5.
#[test]
fn calls_leave_the_current_device_as_it_was() {
    let cs = comms(2);
    let d = emu::global();
    d.set_device(5).unwrap();
    run(
        &cs,
        CollKind::AllReduce,
        DataType::Float32,
        Red::Sum,
        SUM,
        100,
    );
    assert_eq!(d.current_device().unwrap(), 5, "after a collective");
    // AlltoAll connects p2p FIFOs lazily (descriptors sent and IPC-or-raw opened).
    run(&cs, CollKind::AlltoAll, DataType::Int32, Red::Sum, SUM, 100);
    assert_eq!(d.current_device().unwrap(), 5, "after p2p connection setup");
    for c in &cs {
        c.destroy().unwrap();
    }
    assert_eq!(d.current_device().unwrap(), 5, "after destroy");
}

/// Memory handed back by completed operations (in-place AlltoAll scratch, plan arrays
/// beyond the per-communicator cache) is reused, never freed at enqueue: on CUDA a free
/// synchronizes the device, and with several ranks on one device the thread would wait for
/// kernels that wait for its own next launch. The emulator counts frees made while streams
/// are busy; here every later operation is enqueued while both streams are held.
#[test]
fn no_device_free_while_work_is_queued() {
    // Simple only: the first LL operation on fresh connections uploads one-off arrays (it
    // carries scrub requests), and whether a later cached shape takes that block from the
    // spares before the second round depends on timing, which would make the allocation
    // count below vary.
    let cs = comms_proto(2, Some("Simple"));
    let d = emu::global();
    let streams: Vec<Stream> = (0..2).map(|_| d.stream_create().unwrap()).collect();
    let count = 257;
    // One in-place AlltoAll per rank buffer; then 70 AllReduces of distinct shapes (more
    // than the 64 cached plan shapes), so scratch and uncached plan arrays are handed back.
    let mut bufs: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; 2 * count * 4]).collect();
    let mut outs: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; 80 * 4]).collect();
    let round = |bufs: &mut Vec<Vec<u8>>, outs: &mut Vec<Vec<u8>>| {
        for (r, b) in bufs.iter_mut().enumerate() {
            fill(DataType::Int32, Red::Sum, r, 0, b);
        }
        group_start().unwrap();
        for (r, c) in cs.iter().enumerate() {
            let p = bufs[r].as_mut_ptr() as usize;
            let a = CollArgs {
                kind: CollKind::AlltoAll,
                sendbuf: p,
                recvbuf: p,
                count,
                dtype: DataType::Int32 as i32,
                op: SUM,
                root: -1,
                stream: streams[r],
            };
            ccl_core::enqueue(c, a).unwrap();
        }
        group_end().unwrap();
        for k in 1..=70usize {
            group_start().unwrap();
            for (r, c) in cs.iter().enumerate() {
                let o = outs[r].as_mut_ptr() as usize;
                let a = CollArgs {
                    kind: CollKind::AllReduce,
                    sendbuf: o,
                    recvbuf: o,
                    count: k,
                    dtype: DataType::Int32 as i32,
                    op: SUM,
                    root: -1,
                    stream: streams[r],
                };
                ccl_core::enqueue(c, a).unwrap();
            }
            group_end().unwrap();
        }
    };
    // The first round behind a gate too: every block it needs is live at once, as in the
    // second. Run freely, its operations would complete while later ones are enqueued and
    // hand their blocks to them, leaving fewer blocks than the gated second round needs
    // (which then allocated 2 more in about 1 run in 8).
    let first = Arc::new(AtomicBool::new(false));
    for s in &streams {
        hold_stream(&*d, *s, &first);
    }
    round(&mut bufs, &mut outs);
    first.store(true, Ordering::Release);
    for s in &streams {
        assert!(wait(*s, Duration::from_secs(30)));
    }
    // Hold both streams, enqueue a second round behind the gate.
    let gate = Arc::new(AtomicBool::new(false));
    for s in &streams {
        hold_stream(&*d, *s, &gate);
    }
    let (before, allocs) = (
        emu::busy_frees_on_this_thread(),
        emu::allocations_on_this_thread(),
    );
    round(&mut bufs, &mut outs);
    let busy = emu::busy_frees_on_this_thread() - before;
    let allocs = emu::allocations_on_this_thread() - allocs;
    gate.store(true, Ordering::Release);
    for s in &streams {
        assert!(wait(*s, Duration::from_secs(30)));
    }
    assert_eq!(busy, 0, "frees while the streams were busy");
    assert_eq!(
        allocs, 0,
        "the second round must reuse the handed-back memory"
    );
    // The AlltoAll of the second round is right (element k of rank r: rank k / count's
    // input index r * count + k % count).
    for (r, b) in bufs.iter().enumerate() {
        check_output(
            CollKind::AlltoAll,
            DataType::Int32,
            Red::Sum,
            2,
            r,
            0,
            count,
            b,
        )
        .unwrap_or_else(|e| panic!("rank {r}: {e}"));
    }
    for c in &cs {
        c.destroy().unwrap();
    }
    for s in streams {
        d.stream_destroy(s).unwrap();
    }
}

/// One rank: an operation that only moves bytes (from 64 KiB) runs as copies on the stream,
/// then an empty plan whose only work is its completion word (as NVIDIA's NCCL copies); one
/// whose reduction changes the values (integer Avg) launches the kernel with its local
/// step. Results are checked either way, and the probe logs every operation as completed.
#[test]
fn one_rank_copies_run_as_copies() {
    let cs = comms(1);
    let c = &cs[0];
    let d = emu::global();
    let s = d.stream_create().expect("stream");
    // 128 KiB: copies (from 64 KiB on; smaller ones run the kernel's local step).
    let count = 1 << 15;
    let input: Vec<f32> = (0..count).map(|i| i as f32 * 0.5 - 7.0).collect();
    let send: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut recv = vec![0u8; count * 4];
    let mut inplace = send.clone();
    let ints: Vec<u8> = (0..count as i32)
        .flat_map(|x| (x * 3).to_le_bytes())
        .collect();
    let mut int_out = vec![0u8; count * 4];
    let launches = || {
        let (a, b) = emu::launches_on_this_thread();
        a + b
    };
    let k0 = launches();
    ccl_core::enqueue(
        c,
        sum_f32(send.as_ptr() as usize, recv.as_mut_ptr() as usize, count, s),
    )
    .unwrap();
    let p = inplace.as_mut_ptr() as usize;
    ccl_core::enqueue(c, sum_f32(p, p, count, s)).unwrap();
    let bcast = CollArgs {
        kind: CollKind::Broadcast,
        root: 0,
        ..sum_f32(send.as_ptr() as usize, recv.as_mut_ptr() as usize, count, s)
    };
    ccl_core::enqueue(c, bcast).unwrap();
    assert!(wait(s, Duration::from_secs(20)), "copies did not finish");
    assert_eq!(launches(), k0 + 3, "one completion marker per operation");
    assert_eq!(recv, send);
    assert_eq!(inplace, send);
    let avg = CollArgs {
        kind: CollKind::AllReduce,
        sendbuf: ints.as_ptr() as usize,
        recvbuf: int_out.as_mut_ptr() as usize,
        count,
        dtype: DataType::Int32 as i32,
        op: AVG,
        root: -1,
        stream: s,
    };
    ccl_core::enqueue(c, avg).unwrap();
    assert!(wait(s, Duration::from_secs(20)), "kernel did not finish");
    assert_eq!(launches(), k0 + 4, "integer Avg runs the kernel");
    assert_eq!(int_out, ints, "Avg over one rank");
    // Every operation is logged as completed.
    for k in 0..4 {
        assert_eq!(
            settled_op(c, k).map(|o| o.state),
            Some(probe::OpState::Completed),
            "op {k}"
        );
    }
    c.destroy().unwrap();
}
