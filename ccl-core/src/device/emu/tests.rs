//! The emulated device against direct references: lowered plans of every rank launched on
//! their own emulated streams (FIFOs in emulated device memory, the frame in mapped
//! memory), results and frame counters checked; streams, abort, bad plans, IPC.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ccl_optype::CollKind;
use kernels::ffi::ccl_dev_conn_t;
use probe::Frame;

use super::reference::*;
use super::*;
use crate::device::lower::tests::{buf_lens, lowered_plan_es};
use crate::device::lower::{lower, red_params, ConnDir, ConnKey};
use crate::reduce::Reducer;
use crate::reduce::{element_to_f64, f64_to_element};
use crate::schedule::{self, CollDesc, LinkKind, BUF_RECV, BUF_SEND};
use crate::types::{DataType, RedOpKind};
use kernels::ffi::*;
use std::sync::atomic::{AtomicU32, AtomicU64};

const SLOTS: u32 = 4;

fn wait_idle(d: &EmuDevice, s: Stream, limit: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if d.stream_query(s).unwrap() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// FIFO memory of one connection: tail at 0, head at 64, slots from 128.
fn conn_mem(d: &EmuDevice, slot_bytes: usize) -> ccl_dev_conn_t {
    let descs = 128 + SLOTS as usize * slot_bytes;
    let base = d.malloc(descs + SLOTS as usize * 24).unwrap();
    // SAFETY: fresh allocation of that size.
    unsafe { d.memset(base, 0, 128).unwrap() };
    ccl_dev_conn_t {
        slots: (base + 128) as *mut _,
        tail: base as *mut u64,
        head: (base + 64) as *mut u64,
        slot_bytes: slot_bytes as u64,
        nslots: SLOTS,
        ll_sync: 0,
        descs: (base + descs) as *mut u64,
    }
}

pub(crate) fn empty_plan() -> ccl_dev_plan_t {
    ccl_dev_plan_t::idle()
}

fn input_i32(r: usize, i: usize) -> i32 {
    ((r * 131 + i * 7) % 97) as i32 - 40
}

/// Input element `i` of rank `r` for `dtype`: [`input_i32`] for the wide types; for the
/// narrow ones small non-negative integers, so that sums over 4 ranks stay exact (fp8
/// e5m2 holds the integers up to 8) and unsigned types never wrap.
fn input_of(dtype: DataType, r: usize, i: usize) -> i32 {
    match dtype {
        DataType::Int32 | DataType::Int64 | DataType::Float32 | DataType::Float64 => {
            input_i32(r, i)
        }
        DataType::Uint32 | DataType::Uint64 => input_i32(r, i) + 40,
        _ => ((r * 131 + i * 7) % 3) as i32,
    }
}

/// Runs one collective on `n` ranks through the emulator (int32 or float32 with
/// integer-valued inputs, so that any reduction order gives the same bits) and checks
/// results and frame counters.
fn run(coll: CollKind, dtype: DataType, op: RedOpKind, count: usize, n: usize, nch: usize) {
    run_proto(coll, dtype, op, count, n, nch, CCL_PROTO_SIMPLE);
}

/// [`run`] with protocol `proto`: LL plans are chunked to the LL payload of the 64-byte
/// slots (32 bytes: 4 lines per message).
fn run_proto(
    coll: CollKind,
    dtype: DataType,
    op: RedOpKind,
    count: usize,
    n: usize,
    nch: usize,
    proto: u32,
) {
    let d = EmuDevice::default();
    let conn_slot = 64usize;
    let slot = if proto == CCL_PROTO_LL {
        ll_chunk_bytes(conn_slot)
    } else {
        conn_slot
    };
    let root = (count + 1) % n;
    let reducing = matches!(
        coll,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    );
    let es = dtype.size();
    let scalar: Vec<u8> = {
        let mut b = vec![0u8; es];
        f64_to_element(dtype, if dtype.is_float() { 2.0 } else { 3.0 }, &mut b);
        b
    };
    let reducer = reducing.then(|| {
        let s = (op == RedOpKind::PreMulSum).then_some(&scalar[..]);
        Reducer::new(dtype, op, s, n).unwrap()
    });
    let (in_len, out_len) = buf_lens(coll, count, n);
    let enc = |v: i32| -> Vec<u8> {
        let mut b = vec![0u8; es];
        f64_to_element(dtype, f64::from(v), &mut b);
        b
    };
    let dec = |b: &[u8]| -> f64 { element_to_f64(dtype, b) };
    let input_i32 = |r: usize, i: usize| input_of(dtype, r, i);
    // FIFOs by (sender, receiver, link, channel).
    let mut fifos: HashMap<(usize, usize, LinkKind, usize), ccl_dev_conn_t> = HashMap::new();
    let mut ranks = Vec::new();
    for rank in 0..n {
        let (_, lowered) = lowered_plan_es(coll, count, n, rank, root, nch, slot, es);
        let conns: Vec<ccl_dev_conn_t> = lowered
            .conns
            .iter()
            .map(|k: &ConnKey| {
                let key = match k.dir {
                    ConnDir::Out => (rank, k.peer, k.link, k.channel),
                    ConnDir::In => (k.peer, rank, k.link, k.channel),
                };
                *fifos.entry(key).or_insert_with(|| conn_mem(&d, conn_slot))
            })
            .collect();
        let send = d.malloc(in_len * es).unwrap();
        let recv = d.malloc(out_len * es).unwrap();
        let bytes: Vec<u8> = (0..in_len).flat_map(|i| enc(input_i32(rank, i))).collect();
        // SAFETY: fresh allocations of these sizes.
        unsafe {
            d.memcpy(send, bytes.as_ptr() as usize, bytes.len())
                .unwrap();
            d.memset(recv, 0x55, out_len * es).unwrap();
        }
        let cap = 4usize;
        let m = d.host_alloc_mapped(Frame::total_bytes(cap)).unwrap();
        // SAFETY: mapped memory of total_bytes(cap), freed only by the leak below.
        let frame = unsafe { Frame::from_external(m.host as *mut u64, cap, Box::new(|| {})) };
        let counter = 8 + rank as u64;
        let block = frame.begin_op(7, counter, lowered.n_channels as usize);
        let mut p = empty_plan();
        p.n_channels = lowered.n_channels;
        p.n_lanes = lowered.lanes.len() as u32;
        p.n_locals = lowered.locals.len() as u32;
        p.n_steps = lowered.steps.len() as u32;
        p.n_conns = conns.len() as u32;
        p.unit = lowered.unit;
        if let Some(r) = &reducer {
            let rp = red_params(r, n).unwrap();
            p.reduce = 1;
            p.dtype = rp.dtype;
            p.op = rp.op;
            p.avg_divisor = rp.avg_divisor;
            p.scalar_bits = rp.scalar_bits;
        }
        p.steps = lowered.steps.as_ptr();
        p.lanes = lowered.lanes.as_ptr();
        p.locals = lowered.locals.as_ptr();
        p.conns = conns.as_ptr();
        p.bufs[BUF_SEND] = send as *mut _;
        p.bufs[BUF_RECV] = recv as *mut _;
        p.frame = m.dev as *mut u64;
        p.frame_capacity = cap as u32;
        p.frame_block = block as u32;
        p.proto = proto;
        let s = d.stream_create().unwrap();
        // SAFETY: arrays alive until the stream is idle (checked below), buffers/conns too.
        unsafe { d.launch_plan(&p, s).unwrap() };
        ranks.push((s, send, recv, frame, block, lowered, conns));
    }
    for (r, (s, ..)) in ranks.iter().enumerate() {
        assert!(
            wait_idle(&d, *s, Duration::from_secs(20)),
            "{coll:?} n {n} rank {r}: kernel did not finish"
        );
    }
    let all = |i: usize| -> f64 {
        let v: Vec<f64> = (0..n).map(|q| f64::from(input_i32(q, i))).collect();
        match op {
            RedOpKind::Sum => v.iter().sum(),
            RedOpKind::Prod => v.iter().product(),
            RedOpKind::Max => v.iter().cloned().fold(f64::MIN, f64::max),
            RedOpKind::Min => v.iter().cloned().fold(f64::MAX, f64::min),
            RedOpKind::Avg if !dtype.is_float() => (v.iter().sum::<f64>() / n as f64).trunc(),
            RedOpKind::Avg => v.iter().sum::<f64>() / n as f64,
            RedOpKind::PreMulSum => v.iter().map(|x| x * dec(&scalar)).sum(),
        }
    };
    for (r, (_, _, recv, frame, block, lowered, _)) in ranks.iter().enumerate() {
        let mut got = vec![0u8; out_len * es];
        // SAFETY: the allocation has out_len * es bytes; the kernel finished.
        unsafe {
            d.memcpy(got.as_mut_ptr() as usize, *recv, got.len())
                .unwrap()
        };
        let want: Option<Vec<f64>> = match coll {
            CollKind::AllReduce => Some((0..count).map(all).collect()),
            CollKind::Reduce => (r == root).then(|| (0..count).map(all).collect()),
            CollKind::ReduceScatter => Some((0..count).map(|i| all(r * count + i)).collect()),
            CollKind::Broadcast => {
                Some((0..count).map(|i| f64::from(input_i32(root, i))).collect())
            }
            CollKind::AllGather => Some(
                (0..n * count)
                    .map(|k| f64::from(input_i32(k / count, k % count)))
                    .collect(),
            ),
            CollKind::AlltoAll => Some(
                (0..n * count)
                    .map(|k| f64::from(input_i32(k / count, r * count + k % count)))
                    .collect(),
            ),
            _ => unreachable!(),
        };
        if let Some(w) = want {
            let g: Vec<f64> = got.chunks(es).map(dec).collect();
            assert_eq!(
                g, w,
                "{coll:?} {dtype:?} {op:?} n {n} rank {r} count {count} proto {proto}"
            );
        }
        let exp = lowered.counts_per_channel();
        for (ch, (s, rc)) in exp.iter().enumerate() {
            let c = frame.counts(*block, ch);
            assert_eq!(
                (c.send_count, c.recv_count),
                (*s, *rc),
                "rank {r} channel {ch}"
            );
        }
    }
}

#[test]
fn emulated_kernels_give_reference_results_and_counters() {
    let colls = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
    ];
    for coll in colls {
        for n in [1, 2, 3, 4] {
            for (count, nch) in [(1, 1), (37, 2), (300, 3)] {
                run(coll, DataType::Int32, RedOpKind::Sum, count, n, nch);
            }
        }
    }
    for op in [
        RedOpKind::Prod,
        RedOpKind::Max,
        RedOpKind::Min,
        RedOpKind::Avg,
        RedOpKind::PreMulSum,
    ] {
        for n in [1, 2, 4] {
            run(CollKind::AllReduce, DataType::Int32, op, 41, n, 2);
            run(CollKind::ReduceScatter, DataType::Float32, op, 13, n, 1);
            run(CollKind::Reduce, DataType::Float32, op, 29, n, 2);
        }
    }
}

#[test]
fn the_kernel_source_runs_by_default_and_the_rust_reimplementation_on_request() {
    // Both implementations get the same plans and are checked against the same reference.
    std::env::remove_var("CCLD_EMU_KERNEL");
    let (s0, r0) = kernel_impls_on_this_thread();
    run(
        CollKind::AllReduce,
        DataType::Float32,
        RedOpKind::Sum,
        300,
        3,
        2,
    );
    let (s1, r1) = kernel_impls_on_this_thread();
    assert!(
        s1 > s0 && r1 == r0,
        "default: the kernel source ({s0}, {r0}) -> ({s1}, {r1})"
    );
    std::env::set_var("CCLD_EMU_KERNEL", "rust");
    run(
        CollKind::AllReduce,
        DataType::Float32,
        RedOpKind::Sum,
        300,
        3,
        2,
    );
    let (s2, r2) = kernel_impls_on_this_thread();
    std::env::remove_var("CCLD_EMU_KERNEL");
    assert!(s2 == s1 && r2 > r1, "rust: ({s1}, {r1}) -> ({s2}, {r2})");
}

#[test]
fn every_dtype_reduces_through_the_kernel_with_both_protocols() {
    // The element loops of all 12 dtypes (ring steps and local steps), Simple and LL.
    for dt in DataType::ALL {
        for op in [RedOpKind::Sum, RedOpKind::Max] {
            run_proto(CollKind::AllReduce, dt, op, 37, 3, 2, CCL_PROTO_SIMPLE);
            run_proto(CollKind::AllReduce, dt, op, 37, 3, 2, CCL_PROTO_LL);
            // One rank: the local reduce step only.
            run_proto(
                CollKind::AllReduce,
                dt,
                RedOpKind::Avg,
                5,
                1,
                1,
                CCL_PROTO_SIMPLE,
            );
        }
    }
}

#[test]
fn streams_run_in_order_and_query_tells_pending_work() {
    let d = EmuDevice::default();
    let s = d.stream_create().unwrap();
    let gate = Arc::new(AtomicU32::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let g = Arc::clone(&gate);
    d.launch_host_fn(
        s,
        Box::new(move || {
            while g.load(Ordering::Acquire) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }),
    )
    .unwrap();
    for i in 0..3 {
        let l = Arc::clone(&log);
        d.launch_host_fn(s, Box::new(move || l.lock().push(i)))
            .unwrap();
    }
    assert!(!d.stream_query(s).unwrap());
    assert!(log.lock().is_empty());
    gate.store(1, Ordering::Release);
    d.stream_synchronize(s).unwrap();
    assert!(d.stream_query(s).unwrap());
    assert_eq!(*log.lock(), vec![0, 1, 2]);
    // Stream 0 is the current device's default stream.
    d.set_device(3).unwrap();
    let d3 = d.default_stream(3).unwrap();
    assert_ne!(d3, 0);
    assert_eq!(d.default_stream(3).unwrap(), d3);
    d.launch_host_fn(0, Box::new(|| {})).unwrap();
    d.stream_synchronize(d3).unwrap();
    assert!(d.stream_destroy(d3).is_err(), "default streams stay");
    d.stream_destroy(s).unwrap();
    assert!(d.stream_query(s).is_err(), "destroyed stream is unknown");
    assert!(d.launch_host_fn(0x7777, Box::new(|| {})).is_err());
}

#[test]
fn memory_is_tracked_and_ipc_is_refused_clearly() {
    let d = EmuDevice::default();
    let p = d.malloc(100).unwrap();
    assert_eq!(p % ALIGN, 0);
    let dev = d.current_device().unwrap();
    for q in [p, p + 99] {
        let i = d.pointer_info(q).unwrap();
        assert_eq!((i.kind, i.device, i.device_ptr), (PtrKind::Device, dev, q));
    }
    assert_eq!(
        d.pointer_info(p + 100).unwrap().kind,
        PtrKind::Host,
        "one past"
    );
    let host = [0u8; 16];
    let i = d.pointer_info(host.as_ptr() as usize).unwrap();
    assert_eq!((i.kind, i.device_ptr), (PtrKind::Host, 0));
    let m = d.host_alloc_mapped(64).unwrap();
    assert_eq!(m.host, m.dev);
    assert_eq!(
        d.pointer_info(m.host + 8).unwrap().kind,
        PtrKind::HostPinned
    );
    let reg = vec![0u8; 256];
    let a = d.host_register(reg.as_ptr() as usize, reg.len()).unwrap();
    let i = d.pointer_info(reg.as_ptr() as usize + 255).unwrap();
    assert_eq!((i.kind, i.device_ptr), (PtrKind::HostPinned, a + 255));
    d.host_unregister(reg.as_ptr() as usize).unwrap();
    assert_eq!(d.pointer_info(a).unwrap().kind, PtrKind::Host);
    // Peer access: from the current device to another one; not to itself.
    assert!(d.enable_peer_access(dev).is_err());
    d.enable_peer_access(dev + 1).unwrap();
    assert!(d.peer_access_enabled(dev, dev + 1));
    assert!(!d.peer_access_enabled(dev + 1, dev));
    assert!(
        d.free(m.host).is_err(),
        "mapped memory is freed with host_free"
    );
    assert!(d.host_free(p).is_err());
    d.host_free(m.host).unwrap();
    d.free(p).unwrap();
    assert!(d.free(p).is_err(), "double free is an error");
    assert_eq!(d.live_allocations(), 0);
    let e = d.ipc_get(p).unwrap_err();
    assert!(e.to_string().contains("IPC"), "{e}");
    assert!(d.ipc_open(&[0; 64]).is_err());
}

#[test]
fn malformed_plans_are_rejected_at_launch() {
    let d = EmuDevice::default();
    let s = d.stream_create().unwrap();
    let mut p = empty_plan();
    p.n_channels = 0;
    // SAFETY: the plan has no arrays.
    assert!(unsafe { d.launch_plan(&p, s) }.is_err());
    let mut p = empty_plan();
    // LL128: not implemented.
    p.proto = 2;
    // SAFETY: the plan has no arrays (rejected before any is read).
    let e = unsafe { d.launch_plan(&p, s) }.unwrap_err();
    assert!(e.to_string().contains("protocol"), "{e}");
    // An LL step larger than the LL payload of its slot (32 of 64 bytes).
    let conns = [conn_mem(&d, 64)];
    let big = [ccl_dev_step_t {
        kind: CCL_STEP_SEND,
        count: 9,
        ..Default::default()
    }];
    let lane = [ccl_dev_lane_t {
        channel: 0,
        first_step: 0,
        n_steps: 1,
        conn_in: -1,
        conn_out: 0,
        flags: 0,
    }];
    let buf = d.malloc(64).unwrap();
    let mut p = empty_plan();
    (p.n_steps, p.n_lanes, p.n_conns) = (1, 1, 1);
    (p.steps, p.lanes, p.conns) = (big.as_ptr(), lane.as_ptr(), conns.as_ptr());
    p.bufs[0] = buf as *mut _;
    p.proto = CCL_PROTO_LL;
    // SAFETY: arrays valid for the call.
    let e = unsafe { d.launch_plan(&p, s) }.unwrap_err();
    assert!(e.to_string().contains("fitting connection"), "{e}");
    // 8 elements (32 bytes) fit.
    let fits = [ccl_dev_step_t { count: 8, ..big[0] }];
    p.steps = fits.as_ptr();
    // SAFETY: steps (`fits`), lane, conns and buf are live until the synchronize below,
    // which waits for the kernel.
    unsafe { d.launch_plan(&p, s) }.unwrap();
    d.stream_synchronize(s).unwrap();
    let mut p = empty_plan();
    p.n_steps = 3; // steps == NULL
                   // SAFETY: NULL arrays are detected before any read.
    assert!(unsafe { d.launch_plan(&p, s) }.is_err());
    // A receiving lane without a connection.
    let steps = [ccl_dev_step_t {
        kind: CCL_STEP_RECV,
        count: 1,
        ..Default::default()
    }];
    let lanes = [ccl_dev_lane_t {
        channel: 0,
        first_step: 0,
        n_steps: 1,
        conn_in: -1,
        conn_out: -1,
        flags: 0,
    }];
    let mut p = empty_plan();
    p.n_steps = 1;
    p.n_lanes = 1;
    p.steps = steps.as_ptr();
    p.lanes = lanes.as_ptr();
    // SAFETY: arrays valid for the call.
    let e = unsafe { d.launch_plan(&p, s) }.unwrap_err();
    assert!(e.to_string().contains("connection"), "{e}");
    // Fault fields: a stall channel outside the plan, unknown lane flags.
    let mut p = empty_plan();
    p.stall_channel = 1; // the plan has 1 channel
                         // SAFETY: no arrays.
    let e = unsafe { d.launch_plan(&p, s) }.unwrap_err();
    assert!(e.to_string().contains("stall_channel"), "{e}");
    p.stall_channel = CCL_STALL_ALL;
    // SAFETY: no arrays.
    unsafe { d.launch_plan(&p, s) }.unwrap();
    let send = [ccl_dev_step_t {
        kind: CCL_STEP_SEND,
        count: 1,
        ..Default::default()
    }];
    let conn = [conn_mem(&d, 64)];
    let buf = d.malloc(64).unwrap();
    let odd = [ccl_dev_lane_t {
        conn_out: 0,
        flags: 2,
        ..lanes[0]
    }];
    let mut p = empty_plan();
    (p.n_steps, p.n_lanes, p.n_conns) = (1, 1, 1);
    (p.steps, p.lanes, p.conns) = (send.as_ptr(), odd.as_ptr(), conn.as_ptr());
    p.bufs[0] = buf as *mut _;
    // SAFETY: arrays valid for the call.
    let e = unsafe { d.launch_plan(&p, s) }.unwrap_err();
    assert!(e.to_string().contains("lane flags"), "{e}");
    // An empty plan runs.
    // SAFETY: no arrays.
    unsafe { d.launch_plan(&empty_plan(), s) }.unwrap();
    d.stream_synchronize(s).unwrap();
}

#[test]
fn a_kernel_waiting_for_a_peer_that_never_comes_ends_on_abort() {
    let d = EmuDevice::default();
    let plan = schedule::collective(&CollDesc {
        coll: CollKind::AllReduce,
        count: 100,
        elem_size: 4,
        nranks: 2,
        rank: 0,
        root: 0,
        n_channels: 1,
        slot_bytes: 64,
    })
    .unwrap();
    let lowered = lower(&plan, 2).unwrap();
    let conns: Vec<ccl_dev_conn_t> = lowered.conns.iter().map(|_| conn_mem(&d, 64)).collect();
    let buf = d.malloc(400).unwrap();
    let abort = d.host_alloc_mapped(64).unwrap();
    let mut p = empty_plan();
    p.n_lanes = lowered.lanes.len() as u32;
    p.n_steps = lowered.steps.len() as u32;
    p.n_conns = conns.len() as u32;
    p.reduce = 1;
    p.dtype = 7;
    p.steps = lowered.steps.as_ptr();
    p.lanes = lowered.lanes.as_ptr();
    p.conns = conns.as_ptr();
    p.bufs[0] = buf as *mut _;
    p.bufs[1] = buf as *mut _;
    p.abort_flag = abort.dev as *const u32;
    let s = d.stream_create().unwrap();
    // SAFETY: everything lives until the end of the test.
    unsafe { d.launch_plan(&p, s).unwrap() };
    assert!(
        !wait_idle(&d, s, Duration::from_millis(100)),
        "rank 1 never came"
    );
    // SAFETY: the flag is the first word of 64 bytes of mapped memory.
    unsafe { AtomicU32::from_ptr(abort.host as *mut u32) }.store(1, Ordering::Release);
    let t0 = Instant::now();
    assert!(
        wait_idle(&d, s, Duration::from_secs(2)),
        "abort did not end the kernel"
    );
    assert!(t0.elapsed() < Duration::from_secs(1));
}

#[test]
fn ll_kernels_give_reference_results_and_counters() {
    for coll in [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
    ] {
        for n in [1, 2, 3, 4] {
            // 1 element (a partial line), 37 (several messages, partial last line), 300.
            for (count, nch) in [(1, 1), (37, 2), (300, 3)] {
                run_proto(
                    coll,
                    DataType::Int32,
                    RedOpKind::Sum,
                    count,
                    n,
                    nch,
                    CCL_PROTO_LL,
                );
            }
        }
    }
    for op in [RedOpKind::Max, RedOpKind::Avg, RedOpKind::PreMulSum] {
        run_proto(
            CollKind::AllReduce,
            DataType::Float32,
            op,
            41,
            4,
            2,
            CCL_PROTO_LL,
        );
        run_proto(
            CollKind::AllReduce,
            DataType::Int32,
            op,
            41,
            2,
            1,
            CCL_PROTO_LL,
        );
    }
}

#[test]
fn ll_lines_pack_and_unpack() {
    let payload: Vec<u8> = (1..=13).collect();
    let lines = ll_lines(&payload, 7);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0][0], 0x0000_0007_0403_0201);
    assert_eq!(lines[0][1], 0x0000_0007_0807_0605);
    // Partial last line: 5 payload bytes, zero padding.
    assert_eq!(lines[1][0], 0x0000_0007_0C0B_0A09);
    assert_eq!(lines[1][1], 0x0000_0007_0000_000D);
    assert_eq!(ll_unlines(&lines, 7, 13).unwrap(), payload);
    assert!(ll_unlines(&lines, 8, 13).is_none(), "wrong flag");
    let mut torn = lines.clone();
    torn[1][1] &= 0xFFFF_FFFF; // second half not written yet (flag 0)
    assert!(ll_unlines(&torn, 7, 13).is_none());
    assert!(ll_unlines(&lines, 7, 17).is_none(), "more bytes than lines");
    assert_eq!(ll_flag(1), 1);
    assert_eq!(ll_flag((1 << 32) + 5), 5);
}

/// One LL lane of `steps` on channel 0 with connection 0 as conn_in or conn_out.
fn ll_plan(
    steps: &[ccl_dev_step_t],
    lane: &[ccl_dev_lane_t],
    conns: &[ccl_dev_conn_t],
    buf: usize,
) -> ccl_dev_plan_t {
    let mut p = empty_plan();
    (p.n_steps, p.n_lanes, p.n_conns) = (steps.len() as u32, lane.len() as u32, conns.len() as u32);
    (p.steps, p.lanes, p.conns) = (steps.as_ptr(), lane.as_ptr(), conns.as_ptr());
    p.unit = 1;
    p.bufs[0] = buf as *mut _;
    p.proto = CCL_PROTO_LL;
    p
}

fn lane_of(n_steps: u32, conn_in: i32, conn_out: i32) -> [ccl_dev_lane_t; 1] {
    [ccl_dev_lane_t {
        channel: 0,
        first_step: 0,
        n_steps,
        conn_in,
        conn_out,
        flags: 0,
    }]
}

/// Steps of `kind` moving `total` bytes of buffer 0 in `chunk`-byte messages.
fn byte_steps(kind: u32, total: usize, chunk: usize) -> Vec<ccl_dev_step_t> {
    (0..total.div_ceil(chunk))
        .map(|i| ccl_dev_step_t {
            kind,
            src_off: (i * chunk) as u64,
            dst_off: (i * chunk) as u64,
            count: chunk.min(total - i * chunk) as u64,
            ..Default::default()
        })
        .collect()
}

fn bytes_at(a: usize, n: usize) -> Vec<u8> {
    // SAFETY: callers pass live emulated allocations of at least n bytes, quiescent.
    unsafe { std::slice::from_raw_parts(a as *const u8, n) }.to_vec()
}

#[test]
fn an_ll_send_leaves_flag_lines_in_the_fifo() {
    let d = EmuDevice::default();
    let conn = [conn_mem(&d, 64)];
    // Zeroed slots, so that the bytes the send must not touch can be checked (new device
    // memory holds a pattern, as cudaMalloc's holds leftovers).
    // SAFETY: the slots are SLOTS * 64 bytes of the live allocation of conn_mem.
    unsafe {
        d.memset(conn[0].slots as usize, 0, SLOTS as usize * 64)
            .unwrap()
    };
    let chunk = ll_chunk_bytes(64);
    assert_eq!(chunk, 32);
    // 3 messages: 32 + 32 + 13 bytes (the last with a partial line).
    let total = 77;
    let steps = byte_steps(CCL_STEP_SEND, total, chunk);
    let lane = lane_of(steps.len() as u32, -1, 0);
    let buf = d.malloc(total).unwrap();
    let payload: Vec<u8> = (0..total).map(|i| (i * 7 + 3) as u8).collect();
    // SAFETY: fresh allocation of `total` bytes.
    unsafe { d.memcpy(buf, payload.as_ptr() as usize, total).unwrap() };
    let p = ll_plan(&steps, &lane, &conn, buf);
    let s = d.stream_create().unwrap();
    // SAFETY: arrays live until the stream is idle (synchronized below).
    unsafe { d.launch_plan(&p, s).unwrap() };
    d.stream_synchronize(s).unwrap();
    let c = conn[0];
    let slots = c.slots as usize;
    for (m, st) in steps.iter().enumerate() {
        let nb = st.count as usize;
        let raw = bytes_at(slots + m * 64, 64);
        let lines: Vec<[u64; 2]> = raw
            .chunks(16)
            .take(nb.div_ceil(8))
            .map(|l| {
                [
                    u64::from_le_bytes(l[..8].try_into().unwrap()),
                    u64::from_le_bytes(l[8..].try_into().unwrap()),
                ]
            })
            .collect();
        // Flag = 1-based message number, payload = the message's bytes.
        let got = ll_unlines(&lines, m as u32 + 1, nb).expect("flags of every line");
        assert_eq!(got, payload[m * chunk..m * chunk + nb], "message {m}");
        // The u32 layout: data0, flag0, data1, flag1.
        assert_eq!(&raw[4..8], &(m as u32 + 1).to_le_bytes());
        assert_eq!(&raw[12..16], &(m as u32 + 1).to_le_bytes());
        assert_eq!(&raw[..4], &payload[m * chunk..m * chunk + 4]);
    }
    // The partial line's padding is zero; nothing beyond the message's lines was written.
    let last = bytes_at(slots + 2 * 64, 64);
    assert_eq!(
        &last[16..24],
        &[
            payload[72],
            payload[73],
            payload[74],
            payload[75],
            3,
            0,
            0,
            0
        ][..]
    );
    assert_eq!(&last[24..28], &[payload[76], 0, 0, 0]);
    assert!(last[32..].iter().all(|b| *b == 0));
    // tail counts the messages (a later Simple operation starts from it).
    // SAFETY: tail is a live 8-byte counter.
    assert_eq!(unsafe { *c.tail }, 3);
}

/// Fills the slots of `c` with 32-bit words all equal to `v` (stale data of a Simple
/// message that looks like LL lines with flag `v`).
fn poison(c: &ccl_dev_conn_t, v: u32) {
    let words: Vec<u8> = (0..c.nslots as usize * c.slot_bytes as usize / 4)
        .flat_map(|_| v.to_le_bytes())
        .collect();
    // SAFETY: the slots hold nslots * slot_bytes bytes; no kernel runs on them now.
    unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), c.slots as *mut u8, words.len()) };
}

#[test]
fn stale_bytes_that_look_like_flags_are_scrubbed_before_the_sender_may_write() {
    let d = EmuDevice::default();
    let total = 64;
    let recv_steps = byte_steps(CCL_STEP_RECV, total, 32);
    let send_steps = byte_steps(CCL_STEP_SEND, total, 32);
    let s_recv = d.stream_create().unwrap();
    let s_send = d.stream_create().unwrap();
    let payload: Vec<u8> = (0..total).map(|i| i as u8 ^ 0x5A).collect();
    let src = d.malloc(total).unwrap();
    // SAFETY: fresh allocation of `total` bytes.
    unsafe { d.memcpy(src, payload.as_ptr() as usize, total).unwrap() };

    // Without a scrub (ll_sync = 0) the receiver takes stale words equal to the flag as a
    // message: the hazard the scrub exists for.
    let conn = [conn_mem(&d, 64)];
    poison(&conn[0], 1);
    let dst = d.malloc(total).unwrap();
    let lane1 = lane_of(1, 0, -1);
    let p = ll_plan(&recv_steps[..1], &lane1, &conn, dst);
    // SAFETY: arrays live until the stream is idle.
    unsafe { d.launch_plan(&p, s_recv).unwrap() };
    assert!(
        wait_idle(&d, s_recv, Duration::from_secs(5)),
        "took the stale message"
    );
    assert_eq!(bytes_at(dst, 4), 1u32.to_le_bytes(), "stale data received");

    // With a scrub: the receiver zeroes the lines and waits for the real message.
    let conn = [ccl_dev_conn_t {
        ll_sync: 3,
        ..conn_mem(&d, 64)
    }];
    poison(&conn[0], 1);
    let dst = d.malloc(total).unwrap();
    let lane = lane_of(recv_steps.len() as u32, 0, -1);
    let rp = ll_plan(&recv_steps, &lane, &conn, dst);
    // SAFETY: recv_steps, lane, conn and dst outlive the kernel (the waits below).
    unsafe { d.launch_plan(&rp, s_recv).unwrap() };
    assert!(
        !wait_idle(&d, s_recv, Duration::from_millis(100)),
        "the receiver must wait for the sender"
    );
    // SAFETY: head[1] is the scrub word of the live connection.
    assert_eq!(unsafe { *conn[0].head.add(1) }, 3, "scrub published");
    let send_lane = lane_of(send_steps.len() as u32, -1, 0);
    let sp = ll_plan(&send_steps, &send_lane, &conn, src);
    // SAFETY: send_steps, send_lane, conn and src outlive the kernel (the waits below).
    unsafe { d.launch_plan(&sp, s_send).unwrap() };
    assert!(wait_idle(&d, s_send, Duration::from_secs(5)));
    assert!(wait_idle(&d, s_recv, Duration::from_secs(5)));
    assert_eq!(bytes_at(dst, total), payload);
}

#[test]
fn a_sender_waits_for_the_receivers_scrub() {
    let d = EmuDevice::default();
    let conn = [ccl_dev_conn_t {
        ll_sync: 1,
        ..conn_mem(&d, 64)
    }];
    let steps = byte_steps(CCL_STEP_SEND, 8, 32);
    let src = d.malloc(8).unwrap();
    let s = d.stream_create().unwrap();
    let lane = lane_of(1, -1, 0);
    let p = ll_plan(&steps, &lane, &conn, src);
    // SAFETY: arrays live until the stream is idle.
    unsafe { d.launch_plan(&p, s).unwrap() };
    assert!(
        !wait_idle(&d, s, Duration::from_millis(100)),
        "sent before the scrub"
    );
    // SAFETY: head[1] of a live connection; the kernel reads it atomically.
    unsafe { AtomicU64::from_ptr(conn[0].head.add(1)) }.store(1, Ordering::Release);
    assert!(
        wait_idle(&d, s, Duration::from_secs(5)),
        "the scrub was acknowledged"
    );
}

#[test]
fn an_ll_receiver_in_the_middle_of_a_message_ends_on_abort() {
    let d = EmuDevice::default();
    let conn = [conn_mem(&d, 64)];
    // Line 0 of message 1 is there, line 1 never comes.
    let first = ll_lines(&[1, 2, 3, 4, 5, 6, 7, 8], 1);
    // SAFETY: the slot holds 64 bytes; no kernel runs yet.
    unsafe {
        *(conn[0].slots as *mut u64) = first[0][0];
        *(conn[0].slots as *mut u64).add(1) = first[0][1];
    }
    let steps = byte_steps(CCL_STEP_RECV, 16, 32);
    let dst = d.malloc(16).unwrap();
    let abort = d.host_alloc_mapped(64).unwrap();
    let lane = lane_of(1, 0, -1);
    let mut p = ll_plan(&steps, &lane, &conn, dst);
    p.abort_flag = abort.dev as *const u32;
    let s = d.stream_create().unwrap();
    // SAFETY: arrays live until the stream is idle.
    unsafe { d.launch_plan(&p, s).unwrap() };
    assert!(!wait_idle(&d, s, Duration::from_millis(100)));
    // SAFETY: the flag is the first word of 64 bytes of mapped memory.
    unsafe { AtomicU32::from_ptr(abort.host as *mut u32) }.store(1, Ordering::Release);
    assert!(
        wait_idle(&d, s, Duration::from_secs(2)),
        "abort did not end the wait"
    );
}
