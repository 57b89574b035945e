//! Issue 15 blockers 4, 6 and 8 on the CPU emulation of the device
//! (`CCLD_DEVICE_EMULATION=1`, no GPU needed):
//! - operations of one communicator issued on two streams run in issue order (the
//!   per-communicator event): a chain of AllReduces whose each input is the previous
//!   output, alternating streams, with the first stream held back, gives the exact values;
//! - init preloads the kernel on every communicator's device before any launch;
//! - one host function per operation (its completion), none before the kernel, and the
//!   probe still records every operation (blocker 10);
//! - a kernel fault reaches `ncclCommGetAsyncError` (`ncclInternalError`, with the fault's
//!   message) and the next call, and destroy after it is bounded;
//! - a rank process SIGKILLed while its peers loop AllReduce: the survivors' kernels end
//!   (their streams synchronize), and `ncclCommGetAsyncError` and the next call report
//!   `ncclRemoteError` naming the dead rank, within 2 x `CCLD_PEER_CHECK_MS` plus slack.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::bootstrap::get_unique_id;
use ccl_core::device::api::{DeviceApi, Stream};
use ccl_core::device::emu;
use ccl_core::device::runtime::device_api;
use ccl_core::types::ResultCode;
use ccl_core::{group_end, group_start, CollArgs, Comm, CommConfig, DataType, UniqueId};
use ccl_optype::CollKind;
use common::procs::{spawn_ranks, wait_all};
use common::{hex, settled_op, unhex, SUM};

const ENV_UID: &str = "CCLD_LIVE_UID";
const ENV_RANK: &str = "CCLD_LIVE_RANK";
const ENV_NRANKS: &str = "CCLD_LIVE_NRANKS";
const PEER_CHECK_MS: u64 = 100;

fn setup() {
    std::env::set_var("CCLD_DEVICE_EMULATION", "1");
    std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    std::env::set_var("NCCL_BUFFSIZE", "65536");
    std::env::set_var("CCLD_PEER_CHECK_MS", PEER_CHECK_MS.to_string());
}

fn comms(n: usize) -> Vec<Arc<Comm>> {
    setup();
    let c = Comm::init_all(n as i32, None).expect("init_all");
    assert!(
        c.iter().all(|c| c.is_device()),
        "emulation picks the device"
    );
    c
}

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

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn wait_idle(d: &dyn DeviceApi, s: Stream, limit: Duration) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        match d.stream_query(s) {
            Ok(true) => return true,
            Ok(false) => std::thread::sleep(Duration::from_millis(1)),
            Err(_) => return true,
        }
    }
    false
}

/// Blocker 4: AllReduce i reads buffer i and writes buffer i + 1, on stream A (even i) or
/// B (odd i); A is held back at first. Issue order must win over stream order: without the
/// event, B's operations would read buffers not written yet (or mix FIFO messages).
#[test]
fn operations_on_two_streams_run_in_issue_order() {
    let n = 2;
    let ops = 6;
    let count = 3000;
    let cs = comms(n);
    let d = emu::global();
    let gate = Arc::new(AtomicBool::new(false));
    // Per rank: buffers 0..=ops (buffer 0: rank + 1; others: a sentinel) and two streams.
    let mut bufs: Vec<Vec<Vec<u8>>> = (0..n)
        .map(|r| {
            (0..=ops)
                .map(|i| {
                    let v = if i == 0 { (r + 1) as f32 } else { -7.0 };
                    bytes(&vec![v; count])
                })
                .collect()
        })
        .collect();
    let streams: Vec<[Stream; 2]> = (0..n)
        .map(|_| [d.stream_create().unwrap(), d.stream_create().unwrap()])
        .collect();
    for s in &streams {
        let g = Arc::clone(&gate);
        d.launch_host_fn(
            s[0],
            Box::new(move || {
                let t0 = Instant::now();
                while !g.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }),
        )
        .unwrap();
    }
    for i in 0..ops {
        group_start().unwrap();
        for (r, c) in cs.iter().enumerate() {
            let src = bufs[r][i].as_ptr() as usize;
            let dst = bufs[r][i + 1].as_mut_ptr() as usize;
            ccl_core::enqueue(c, sum_f32(src, dst, count, streams[r][i % 2])).unwrap();
        }
        group_end().unwrap();
    }
    // Stream B has work queued behind A's held operation: none of it may have run.
    std::thread::sleep(Duration::from_millis(50));
    for b in &bufs {
        assert!(
            f32s(&b[2]).iter().all(|x| *x == -7.0),
            "an operation on stream B ran before the held operation on stream A"
        );
    }
    gate.store(true, Ordering::Release);
    for s in &streams {
        for st in s {
            d.stream_synchronize(*st).unwrap();
        }
    }
    // Buffer 1 = 1 + 2 = 3 on both ranks; each later AllReduce doubles it.
    for (r, b) in bufs.iter().enumerate() {
        for (i, buf) in b.iter().enumerate().skip(1) {
            let want = 3.0 * f32::powi(2.0, i as i32 - 1);
            let got = f32s(buf);
            assert!(
                got.iter().all(|x| *x == want),
                "rank {r} buffer {i}: want {want}, got {:?}",
                &got[..4]
            );
        }
    }
    for c in &cs {
        c.async_error().unwrap();
        c.destroy().unwrap();
    }
    assert_eq!(d.live_events(), 0, "the ordering events were destroyed");
}

/// Blocker 6: every communicator's device had its kernel loaded at init, and no kernel
/// was launched on a device before that.
#[test]
fn init_preloads_the_kernel_before_any_launch() {
    let d = emu::global();
    let cs = comms(2);
    assert!(d.preloads(0) >= 1 && d.preloads(1) >= 1);
    let count = 100;
    let send: Vec<Vec<u8>> = (0..2).map(|_| bytes(&vec![1.0; count])).collect();
    let mut recv: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; count * 4]).collect();
    let s: Vec<Stream> = (0..2).map(|_| d.stream_create().unwrap()).collect();
    group_start().unwrap();
    for r in 0..2 {
        let a = sum_f32(
            send[r].as_ptr() as usize,
            recv[r].as_mut_ptr() as usize,
            count,
            s[r],
        );
        ccl_core::enqueue(&cs[r], a).unwrap();
    }
    group_end().unwrap();
    for st in &s {
        d.stream_synchronize(*st).unwrap();
    }
    assert!(recv.iter().all(|b| f32s(b).iter().all(|x| *x == 2.0)));
    assert_eq!(d.launches_before_preload(), 0);
    for c in &cs {
        c.destroy().unwrap();
    }
}

/// Blocker 8: a kernel fault on rank 0 reaches its async error and its next call; the
/// peer's kernel, which waits for rank 0 forever, ends with abort.
#[test]
fn a_kernel_fault_reaches_async_error_and_the_next_call() {
    let cs = comms(2);
    let d = emu::global();
    let count = 4096;
    let send: Vec<Vec<u8>> = (0..2).map(|_| bytes(&vec![1.0; count])).collect();
    let mut recv: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; count * 4]).collect();
    let s: Vec<Stream> = (0..2).map(|_| d.stream_create().unwrap()).collect();
    let round = |recv: &mut Vec<Vec<u8>>| {
        group_start().unwrap();
        for r in 0..2 {
            let a = sum_f32(
                send[r].as_ptr() as usize,
                recv[r].as_mut_ptr() as usize,
                count,
                s[r],
            );
            ccl_core::enqueue(&cs[r], a).unwrap();
        }
        group_end()
    };
    round(&mut recv).unwrap();
    for st in &s {
        d.stream_synchronize(*st).unwrap();
    }
    cs[0].async_error().unwrap();
    d.fault_next_kernel(0, "an illegal memory access was encountered (injected)");
    let t0 = Instant::now();
    // The kernel may fault before the rest of rank 0's operation (its completion function,
    // the ordering event) is enqueued behind it: then this very call reports the fault, as
    // CUDA's sticky errors make NCCL's do, with the error the watch reports.
    if let Err(e) = round(&mut recv) {
        assert_eq!(e.code(), ResultCode::InternalError, "{e}");
        assert!(e.to_string().contains("illegal memory access"), "{e}");
    }
    let err = loop {
        match cs[0].async_error() {
            Err(e) => break e,
            Ok(()) if t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Ok(()) => panic!("no async error 10 s after the fault"),
        }
    };
    let took = t0.elapsed();
    eprintln!("async error {took:?} after the faulting enqueue: {err}");
    assert_eq!(err.code(), ResultCode::InternalError, "{err}");
    assert!(err.to_string().contains("illegal memory access"), "{err}");
    assert!(
        took < Duration::from_secs(3),
        "fault reported after {took:?} (period {PEER_CHECK_MS} ms)"
    );
    // The next call fails with the same error.
    let a = sum_f32(
        send[0].as_ptr() as usize,
        recv[0].as_mut_ptr() as usize,
        count,
        s[0],
    );
    let next = ccl_core::enqueue(&cs[0], a).unwrap_err();
    assert_eq!(next.code(), ResultCode::InternalError, "{next}");
    // Rank 1 waits for rank 0 forever: abort ends its kernel.
    assert!(!wait_idle(&*d, s[1], Duration::from_millis(100)));
    cs[1].abort().unwrap();
    assert!(
        wait_idle(&*d, s[1], Duration::from_secs(5)),
        "abort ends the kernel"
    );
    let t1 = Instant::now();
    cs[0].destroy().unwrap();
    assert!(t1.elapsed() < Duration::from_secs(5), "{:?}", t1.elapsed());
}

/// Blocker 8, the other order: a call that runs into a faulted kernel before the watch
/// saw the fault (here: the very next call, within a few ms of a 100 ms watch period)
/// reports the same `ncclInternalError` as the watch, not the stream's own error.
#[test]
fn a_call_behind_a_faulted_kernel_reports_the_kernel_fault() {
    let cs = comms(2);
    let d = emu::global();
    let count = 1024;
    let send = bytes(&vec![1.0; count]);
    let mut recv = vec![0u8; count * 4];
    let s = d.stream_create().unwrap();
    let args =
        |recv: &mut Vec<u8>| sum_f32(send.as_ptr() as usize, recv.as_mut_ptr() as usize, count, s);
    d.fault_next_kernel(0, "an illegal memory access was encountered (injected)");
    // Rank 0 alone: its kernel faults as it starts, before it would wait for rank 1 (and
    // may do so before this call enqueued the rest of the operation: then the call itself
    // reports the fault).
    if let Err(e) = ccl_core::enqueue(&cs[0], args(&mut recv)) {
        assert_eq!(e.code(), ResultCode::InternalError, "{e}");
    }
    let synced = d.stream_synchronize(s).unwrap_err();
    assert!(
        synced.to_string().contains("illegal memory access"),
        "{synced}"
    );
    let next = ccl_core::enqueue(&cs[0], args(&mut recv)).unwrap_err();
    assert_eq!(next.code(), ResultCode::InternalError, "{next}");
    assert!(
        next.to_string().contains("device fault (a kernel failed)"),
        "{next}"
    );
    assert!(next.to_string().contains("illegal memory access"), "{next}");
    let later = cs[0].async_error().unwrap_err();
    assert_eq!(later.code(), ResultCode::InternalError, "{later}");
    // Destroy knows the communicator failed: it does not wait for the faulted operation's
    // completion (which never comes) for the full drain limit.
    let t = Instant::now();
    cs[0].destroy().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    cs[1].destroy().unwrap();
}

/// A rank's main for the SIGKILL test: loops AllReduce until its communicator fails.
fn rank_main() {
    let env = |k: &str| std::env::var(k).expect(k);
    let rank: usize = env(ENV_RANK).parse().expect("rank");
    let nranks: usize = env(ENV_NRANKS).parse().expect("nranks");
    let mut id = [0u8; 128];
    id.copy_from_slice(&unhex(&env(ENV_UID)).expect("uid"));
    let (api, device) = match device_api(None) {
        Ok(Ok(v)) => v,
        other => panic!("no emulated device: {other:?}"),
    };
    api.set_device(device).expect("set_device");
    let comm = Comm::init_rank(
        nranks as i32,
        UniqueId(id),
        rank as i32,
        CommConfig::default(),
    )
    .expect("init");
    let count = 8192;
    let send = api.malloc(count * 4).expect("malloc");
    let recv = api.malloc(count * 4).expect("malloc");
    let s = api.stream_create().expect("stream");
    let t0 = Instant::now();
    let mut i = 0u64;
    let failed = loop {
        let a = sum_f32(send, recv, count, s);
        if let Err(e) = ccl_core::enqueue(&comm, a) {
            break Some(e);
        }
        // The kernel must end even when a peer died (the watch aborts it).
        api.stream_synchronize(s).expect("synchronize");
        if let Err(e) = comm.async_error() {
            break Some(e);
        }
        i += 1;
        if i == 20 {
            println!("@@RUNNING");
        }
        if t0.elapsed() > Duration::from_secs(40) {
            break None;
        }
    };
    match failed {
        Some(e) => {
            println!("@@ERR {:?} {e}", e.code());
            let again = ccl_core::enqueue(&comm, sum_f32(send, recv, count, s));
            println!(
                "@@NEXT {}",
                again.map_or_else(|e| format!("{:?}", e.code()), |()| "Ok".into())
            );
        }
        None => println!("@@NOERR"),
    }
    let _ = comm.destroy();
    println!("@@DONE");
}

/// Entry point of the rank processes (does nothing without their environment).
#[test]
#[ignore = "entry point of the rank processes spawned by the other tests"]
fn proc_rank_entry() {
    if std::env::var_os(ENV_RANK).is_some() {
        rank_main();
    }
}

#[test]
fn sigkill_of_a_device_rank_fails_the_survivors_within_the_bound() {
    let n = 3;
    let victim = n - 1;
    let id = get_unique_id().expect("unique id");
    let mut job = spawn_ranks(
        n,
        |r| {
            [
                ("CCLD_DEVICE_EMULATION", "1".to_string()),
                ("CCLD_BOOTSTRAP_IP", "127.0.0.1".to_string()),
                ("NCCL_BUFFSIZE", "65536".to_string()),
                ("CCLD_PEER_CHECK_MS", PEER_CHECK_MS.to_string()),
                (ENV_UID, hex(&id.0)),
                (ENV_RANK, r.to_string()),
                (ENV_NRANKS, n.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
        },
        &["NCCL_P2P_DISABLE"],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match job
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok((r, l)) if r == victim && l == "RUNNING" => break,
            Ok(_) => {}
            Err(_) => {
                for c in &mut job.children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                panic!("the victim never ran");
            }
        }
    }
    let victim_pid = job.children[victim].id();
    let kill_at = Instant::now();
    job.children[victim].kill().expect("SIGKILL");
    let mut errs: Vec<Option<(String, Duration)>> = vec![None; victim];
    let mut next: Vec<Option<String>> = vec![None; victim];
    while errs.iter().any(|e| e.is_none()) || next.iter().any(|e| e.is_none()) {
        let left = Duration::from_secs(30).saturating_sub(kill_at.elapsed());
        match job.lines.recv_timeout(left) {
            Ok((r, l)) if r < victim => {
                if let Some(e) = l.strip_prefix("ERR ") {
                    errs[r] = Some((e.to_string(), kill_at.elapsed()));
                } else if let Some(e) = l.strip_prefix("NEXT ") {
                    next[r] = Some(e.to_string());
                } else if l == "NOERR" {
                    errs[r] = Some(("no error".into(), kill_at.elapsed()));
                }
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let mut survivors: Vec<_> = job.children.drain(..victim).collect();
    let codes = wait_all(&mut survivors, Duration::from_secs(30));
    let _ = job.children[0].wait();
    assert!(codes.iter().all(|c| *c == Some(0)), "{codes:?} {errs:?}");
    for r in 0..victim {
        let (e, took) = errs[r].clone().unwrap_or_default();
        eprintln!("rank {r}: {e} ({took:?} after the kill)");
        assert!(
            e.starts_with("RemoteError") && e.contains(&format!("rank {victim} (pid {victim_pid}")),
            "rank {r}: {e:?}"
        );
        // Bound: 2 x CCLD_PEER_CHECK_MS after the death, plus one wake-up period, plus
        // slack for a loaded 2-core machine.
        assert!(
            took < Duration::from_secs(3),
            "rank {r}: failed after {took:?}"
        );
        assert_eq!(
            next[r].as_deref(),
            Some("RemoteError"),
            "rank {r}: next call"
        );
    }
}

/// Blocker 10, then `device::completion`: no host function runs on the stream at all (the
/// completions are found by polling events; the kernels wait at their start gate instead),
/// and the probe still records every operation's start and completion, with the counters
/// of the schedule.
#[test]
fn no_host_function_per_operation_and_the_probe_still_sees_every_operation() {
    let cs = comms(2);
    let d = emu::global();
    let count = 1000;
    let ops = 12;
    let send: Vec<Vec<u8>> = (0..2)
        .map(|r| bytes(&vec![r as f32 + 1.0; count]))
        .collect();
    let mut recv: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; count * 4]).collect();
    let s: Vec<Stream> = (0..2).map(|_| d.stream_create().unwrap()).collect();
    let (fns0, kernels0) = (
        emu::host_fns_on_this_thread(),
        emu::launches_on_this_thread(),
    );
    for _ in 0..ops {
        group_start().unwrap();
        for r in 0..2 {
            let a = sum_f32(
                send[r].as_ptr() as usize,
                recv[r].as_mut_ptr() as usize,
                count,
                s[r],
            );
            ccl_core::enqueue(&cs[r], a).unwrap();
        }
        group_end().unwrap();
    }
    for st in &s {
        d.stream_synchronize(*st).unwrap();
    }
    let kernels = {
        let (a, b) = emu::launches_on_this_thread();
        (a + b) - (kernels0.0 + kernels0.1)
    };
    let fns = emu::host_fns_on_this_thread() - fns0;
    assert_eq!(kernels, 2 * ops);
    assert_eq!(
        fns, 0,
        "host functions on the stream (2 per operation before blocker 10, then 1)"
    );
    assert!(recv.iter().all(|b| f32s(b).iter().all(|x| *x == 3.0)));
    for c in &cs {
        // The op log keeps the last FRAME_BLOCKS operations.
        for k in (ops - probe::FRAME_BLOCKS) as u64..ops as u64 {
            let o = settled_op(c, k).unwrap_or_else(|| panic!("op {k} not logged"));
            assert_eq!(o.state, probe::OpState::Completed, "op {k}: {o:?}");
        }
        c.destroy().unwrap();
    }
}

/// Blocker 9: by default the kernels read their plan arrays from device memory (a copy made
/// on the stream before the kernel); `CCLD_DEVICE_PLANS=mapped` reads the mapped host
/// arrays. Results are the same either way, across cached and one-off plan shapes.
#[test]
fn plan_arrays_are_read_from_device_memory_unless_mapped_is_asked() {
    let d = emu::global();
    for (mode, mapped) in [("device", false), ("mapped", true)] {
        std::env::set_var("CCLD_DEVICE_PLANS", mode);
        let cs = comms(2);
        let before = d.launches_with_mapped_plans();
        let s: Vec<Stream> = (0..2).map(|_| d.stream_create().unwrap()).collect();
        // Several shapes (counts), each twice: new arrays, then the cached ones.
        for count in [1usize, 999, 5000, 1, 999, 5000] {
            let send: Vec<Vec<u8>> = (0..2)
                .map(|r| bytes(&vec![r as f32 + 1.0; count]))
                .collect();
            let mut recv: Vec<Vec<u8>> = (0..2).map(|_| vec![0u8; count * 4]).collect();
            group_start().unwrap();
            for r in 0..2 {
                let a = sum_f32(
                    send[r].as_ptr() as usize,
                    recv[r].as_mut_ptr() as usize,
                    count,
                    s[r],
                );
                ccl_core::enqueue(&cs[r], a).unwrap();
            }
            group_end().unwrap();
            for st in &s {
                d.stream_synchronize(*st).unwrap();
            }
            assert!(
                recv.iter().all(|b| f32s(b).iter().all(|x| *x == 3.0)),
                "{mode}: count {count}"
            );
        }
        let launched_mapped = d.launches_with_mapped_plans() - before;
        if mapped {
            assert_eq!(launched_mapped, 12, "{mode}");
        } else {
            assert_eq!(launched_mapped, 0, "{mode}");
        }
        for c in &cs {
            c.async_error().unwrap();
            c.destroy().unwrap();
        }
    }
    std::env::remove_var("CCLD_DEVICE_PLANS");
}

/// The start gate (`ccl_dev_plan_t.start_gate`, what replaced the host function between two
/// kernels): a kernel with a frame waits, before it touches anything, until the gate word
/// reaches its value; an abort ends the wait; a kernel without a frame does not wait.
#[test]
fn a_kernel_waits_at_its_start_gate_until_the_host_opens_it() {
    use kernels::ffi::{ccl_dev_local_t, ccl_dev_plan_t, CCL_GATE_WORD, CCL_LOCAL_COPY};
    setup();
    let d = emu::global();
    let abort = d.host_alloc_mapped(64).unwrap();
    let frame = d.host_alloc_mapped(1 << 16).unwrap();
    let gate = |v: u32| {
        // SAFETY: the gate word lies in the live mapped abort memory (64 bytes).
        unsafe { std::ptr::write_volatile((abort.host as *mut u32).add(CCL_GATE_WORD), v) }
    };
    let (src, dst) = (d.malloc(256).unwrap(), d.malloc(256).unwrap());
    let local = d.malloc(64).unwrap();
    let l = ccl_dev_local_t {
        kind: CCL_LOCAL_COPY,
        src_buf: 0,
        dst_buf: 1,
        reserved: 0,
        src_off: 0,
        dst_off: 0,
        count: 64,
    };
    let read = |p: usize| {
        let mut v = vec![0u8; 256];
        // SAFETY: p is a live 256-byte emulated device block.
        unsafe { d.memcpy(v.as_mut_ptr() as usize, p, 256).unwrap() };
        v
    };
    // SAFETY: the blocks have the sizes written; the plan's arrays, buffers, frame and
    // abort memory live until the end of the test, after every stream went idle.
    unsafe {
        d.memcpy(src, [9u8; 256].as_ptr() as usize, 256).unwrap();
        d.memset(dst, 0, 256).unwrap();
        d.memcpy(
            local,
            (&l as *const ccl_dev_local_t) as usize,
            std::mem::size_of_val(&l),
        )
        .unwrap();
    }
    let mut bufs = [std::ptr::null_mut(); kernels::ffi::CCL_MAX_BUFS];
    bufs[0] = src as *mut _;
    bufs[1] = dst as *mut _;
    let plan = |start_gate: u32, with_frame: bool| ccl_dev_plan_t {
        n_locals: 1,
        locals: local as *const _,
        bufs,
        frame: if with_frame {
            frame.dev as *mut u64
        } else {
            std::ptr::null_mut()
        },
        frame_capacity: 1,
        abort_flag: abort.dev as *const u32,
        start_gate,
        ..ccl_dev_plan_t::idle()
    };
    let s = d.stream_create().unwrap();
    gate(4);
    // SAFETY: the plan's arrays, buffers, frame and abort memory live until the end of
    // the test, after every stream went idle.
    unsafe { d.launch_plan(&plan(5, true), s).unwrap() };
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        !d.stream_query(s).unwrap(),
        "the kernel ran past a closed gate"
    );
    assert_eq!(
        read(dst),
        vec![0u8; 256],
        "nothing was written before the gate opened"
    );
    gate(5);
    assert!(
        wait_idle(&*d, s, Duration::from_secs(10)),
        "the open gate did not let it run"
    );
    assert_eq!(read(dst), vec![9u8; 256]);
    // No frame: no wait, whatever the gate says.
    // SAFETY: dst is a live 256-byte block; the stream is idle.
    unsafe { d.memset(dst, 0, 256).unwrap() };
    // SAFETY: the plan's arrays, buffers, frame and abort memory live until the end of
    // the test, after every stream went idle.
    unsafe { d.launch_plan(&plan(100, false), s).unwrap() };
    assert!(
        wait_idle(&*d, s, Duration::from_secs(10)),
        "a kernel without frame waited"
    );
    assert_eq!(read(dst), vec![9u8; 256]);
    // A closed gate and an abort: the kernel ends without touching anything. Wrapping
    // comparison: u32::MAX is "before" 1.
    gate(u32::MAX);
    // SAFETY: dst is a live 256-byte block; the stream is idle.
    unsafe { d.memset(dst, 0, 256).unwrap() };
    // SAFETY: the plan's arrays, buffers, frame and abort memory live until the end of
    // the test, after every stream went idle.
    unsafe { d.launch_plan(&plan(1, true), s).unwrap() };
    std::thread::sleep(Duration::from_millis(50));
    assert!(!d.stream_query(s).unwrap(), "u32::MAX must not pass gate 1");
    // SAFETY: the abort flag is the first word of the live mapped abort memory.
    unsafe { std::ptr::write_volatile(abort.host as *mut u32, 1) };
    assert!(
        wait_idle(&*d, s, Duration::from_secs(10)),
        "abort did not end the wait"
    );
    assert_eq!(read(dst), vec![0u8; 256], "an aborted kernel wrote");
}
