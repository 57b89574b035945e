//! The emulated device against direct references: lowered plans of every rank launched on
//! their own emulated streams (FIFOs in emulated device memory, the frame in mapped
//! memory), results and frame counters checked; streams, abort, bad plans, IPC.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kernels::ffi::{ccl_dev_conn_t, CCL_MAX_BUFS};
use probe::{CollKind, Frame};

use super::*;
use crate::device::lower::tests::{buf_lens, lowered_plan};
use crate::device::lower::{lower, red_params, ConnDir, ConnKey};
use crate::schedule::{self, CollDesc, LinkKind, BUF_RECV, BUF_SEND};

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
    let base = d.malloc(128 + SLOTS as usize * slot_bytes).unwrap();
    // SAFETY: fresh allocation of that size.
    unsafe { d.memset(base, 0, 128).unwrap() };
    ccl_dev_conn_t {
        slots: (base + 128) as *mut _,
        tail: base as *mut u64,
        head: (base + 64) as *mut u64,
        slot_bytes: slot_bytes as u64,
        nslots: SLOTS,
        ll_sync: 0,
    }
}

fn empty_plan() -> ccl_dev_plan_t {
    ccl_dev_plan_t {
        n_channels: 1,
        n_lanes: 0,
        n_locals: 0,
        n_steps: 0,
        n_conns: 0,
        unit: 4,
        dtype: 0,
        op: 0,
        reduce: 0,
        avg_divisor: 0,
        scalar_bits: 0,
        scalar_dev: std::ptr::null(),
        steps: std::ptr::null(),
        lanes: std::ptr::null(),
        locals: std::ptr::null(),
        conns: std::ptr::null(),
        bufs: [std::ptr::null_mut(); CCL_MAX_BUFS],
        frame: std::ptr::null_mut(),
        frame_capacity: 0,
        frame_block: 0,
        proto: 0,
        reserved: 0,
        abort_flag: std::ptr::null(),
    }
}

fn input_i32(r: usize, i: usize) -> i32 {
    ((r * 131 + i * 7) % 97) as i32 - 40
}

/// Runs one collective on `n` ranks through the emulator (int32 or float32 with
/// integer-valued inputs, so that any reduction order gives the same bits) and checks
/// results and frame counters.
fn run(coll: CollKind, dtype: DataType, op: RedOpKind, count: usize, n: usize, nch: usize) {
    let d = EmuDevice::default();
    let slot = 64usize;
    let root = (count + 1) % n;
    let reducing = matches!(
        coll,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    );
    let scalar: Vec<u8> = match dtype {
        DataType::Float32 => 2.0f32.to_le_bytes().to_vec(),
        _ => 3i32.to_le_bytes().to_vec(),
    };
    let reducer = reducing.then(|| {
        let s = (op == RedOpKind::PreMulSum).then_some(&scalar[..]);
        Reducer::new(dtype, op, s, n).unwrap()
    });
    let (in_len, out_len) = buf_lens(coll, count, n);
    let enc = |v: i32| -> [u8; 4] {
        match dtype {
            DataType::Float32 => (v as f32).to_le_bytes(),
            _ => v.to_le_bytes(),
        }
    };
    let dec = |b: &[u8]| -> f64 {
        let a: [u8; 4] = b.try_into().unwrap();
        match dtype {
            DataType::Float32 => f64::from(f32::from_le_bytes(a)),
            _ => f64::from(i32::from_le_bytes(a)),
        }
    };
    // FIFOs by (sender, receiver, link, channel).
    let mut fifos: HashMap<(usize, usize, LinkKind, usize), ccl_dev_conn_t> = HashMap::new();
    let mut ranks = Vec::new();
    for rank in 0..n {
        let (_, lowered) = lowered_plan(coll, count, n, rank, root, nch, slot);
        let conns: Vec<ccl_dev_conn_t> = lowered
            .conns
            .iter()
            .map(|k: &ConnKey| {
                let key = match k.dir {
                    ConnDir::Out => (rank, k.peer, k.link, k.channel),
                    ConnDir::In => (k.peer, rank, k.link, k.channel),
                };
                *fifos.entry(key).or_insert_with(|| conn_mem(&d, slot))
            })
            .collect();
        let send = d.malloc(in_len * 4).unwrap();
        let recv = d.malloc(out_len * 4).unwrap();
        let bytes: Vec<u8> = (0..in_len).flat_map(|i| enc(input_i32(rank, i))).collect();
        // SAFETY: fresh allocations of these sizes.
        unsafe {
            d.memcpy(send, bytes.as_ptr() as usize, bytes.len())
                .unwrap();
            d.memset(recv, 0x55, out_len * 4).unwrap();
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
            RedOpKind::Avg if dtype == DataType::Int32 => {
                (v.iter().sum::<f64>() / n as f64).trunc()
            }
            RedOpKind::Avg => v.iter().sum::<f64>() / n as f64,
            RedOpKind::PreMulSum => v.iter().map(|x| x * dec(&scalar)).sum(),
        }
    };
    for (r, (_, _, recv, frame, block, lowered, _)) in ranks.iter().enumerate() {
        let mut got = vec![0u8; out_len * 4];
        // SAFETY: the allocation has out_len * 4 bytes; the kernel finished.
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
            let g: Vec<f64> = got.chunks(4).map(dec).collect();
            assert_eq!(
                g, w,
                "{coll:?} {dtype:?} {op:?} n {n} rank {r} count {count}"
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
        d.launch_host_fn(s, Box::new(move || lock(&l).push(i)))
            .unwrap();
    }
    assert!(!d.stream_query(s).unwrap());
    assert!(lock(&log).is_empty());
    gate.store(1, Ordering::Release);
    d.stream_synchronize(s).unwrap();
    assert!(d.stream_query(s).unwrap());
    assert_eq!(*lock(&log), vec![0, 1, 2]);
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
    assert!(d.pointer_is_device(p).unwrap());
    assert!(d.pointer_is_device(p + 99).unwrap());
    let host = [0u8; 16];
    assert!(!d.pointer_is_device(host.as_ptr() as usize).unwrap());
    let m = d.host_alloc_mapped(64).unwrap();
    assert_eq!(m.host, m.dev);
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
    p.proto = 1;
    // SAFETY: as above.
    assert!(unsafe { d.launch_plan(&p, s) }.is_err());
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
        reserved: 0,
    }];
    let mut p = empty_plan();
    p.n_steps = 1;
    p.n_lanes = 1;
    p.steps = steps.as_ptr();
    p.lanes = lanes.as_ptr();
    // SAFETY: arrays valid for the call.
    let e = unsafe { d.launch_plan(&p, s) }.unwrap_err();
    assert!(e.to_string().contains("connection"), "{e}");
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
    let abort = d.host_alloc_mapped(4).unwrap();
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
    // SAFETY: the flag is 4-byte mapped memory.
    unsafe { AtomicU32::from_ptr(abort.host as *mut u32) }.store(1, Ordering::Release);
    let t0 = Instant::now();
    assert!(
        wait_idle(&d, s, Duration::from_secs(2)),
        "abort did not end the kernel"
    );
    assert!(t0.elapsed() < Duration::from_secs(1));
}
