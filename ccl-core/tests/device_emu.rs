//! The device backend through the communicator API, on the CPU emulation of the device
//! (`CCLD_DEVICE_EMULATION=1`; no GPU needed): every collective, Send/Recv groups and
//! AlltoAll x 1, 2, 4, 8 ranks x Float32 + Int32 (Sum, Max, Avg) against an independent
//! reference (exact inputs: see `common`), the probe frame after completion against the
//! schedule, asynchronous completion (the call returns before the work is done) and abort
//! of an operation whose peer never enqueues.
//!
//! Every test sets the same environment at its start (`std::env::set_var`): nextest runs
//! each test in its own process; under `cargo test` the threads of one process set the
//! same values, so they agree.

mod common;
mod device_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::device::api::{DeviceApi, Stream};
use ccl_core::device::emu;
use ccl_core::group::expected_counts;
use ccl_core::{group_end, group_start, CollArgs, Comm, DataType};
use common::*;
use device_support::{check_output, run_threads, DevCase};
use probe::CollKind;

fn setup() {
    std::env::set_var("CCLD_DEVICE_EMULATION", "1");
    std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    std::env::set_var("NCCL_BUFFSIZE", "65536");
}

fn comms(n: usize) -> Vec<Arc<Comm>> {
    setup();
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

fn matrix(n: usize) {
    let cs = comms(n);
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
    matrix(1);
}

#[test]
fn every_collective_on_2_ranks() {
    matrix(2);
}

#[test]
fn every_collective_on_4_ranks() {
    matrix(4);
}

#[test]
fn every_collective_on_8_ranks() {
    matrix(8);
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
        cs[0].op_log().get(0).map(|o| o.state),
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
    let cs = comms(2);
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
    round(&mut bufs, &mut outs);
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
