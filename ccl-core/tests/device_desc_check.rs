//! The descriptor check on the device backend (the emulated device runs the kernel source
//! compiled for the CPU; no GPU needed): a rank whose call differs from its peers' (another
//! collective, another count, on the Simple and the LL protocol) makes every rank of the
//! communicator fail instead of moving shifted data. The ranks whose kernel receives a
//! mismatched message report `ncclInvalidUsage` naming both ranks and both calls; the
//! others, poisoned by them, `ncclRemoteError` naming the rank that failed first. The error
//! is asynchronous, as every device failure: `ncclCommGetAsyncError` reports it and the
//! next call fails. Consistent calls still succeed with the right result.
//!
//! Every test sets its environment at its start: nextest runs each test in its own process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::device::api::{DeviceApi, Stream};
use ccl_core::device::emu;
use ccl_core::{CollArgs, Comm, DataType, ResultCode};
use ccl_optype::CollKind;

fn comms(n: usize, proto: &str) -> Vec<Arc<Comm>> {
    std::env::set_var("CCLD_DEVICE_EMULATION", "1");
    std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    std::env::set_var("NCCL_BUFFSIZE", "65536");
    std::env::set_var("NCCL_PROTO", proto);
    let c = Comm::init_all(n as i32, None).expect("init_all");
    assert!(
        c.iter().all(|c| c.is_device()),
        "emulation picks the device"
    );
    c
}

#[derive(Clone, Copy, Debug)]
struct Call {
    kind: CollKind,
    count: usize,
}

fn ar(count: usize) -> Call {
    Call {
        kind: CollKind::AllReduce,
        count,
    }
}

fn ag(count: usize) -> Call {
    Call {
        kind: CollKind::AllGather,
        count,
    }
}

const ELEMS: usize = 1 << 14;

struct Rank {
    send: Vec<f32>,
    recv: Vec<f32>,
    stream: Stream,
}

/// Enqueues each rank's calls (device calls return at once), then waits until every
/// rank's stream is idle (10 s at most: the check must never hang) and returns each
/// rank's asynchronous error.
fn run(cs: &[Arc<Comm>], calls: &[Vec<Call>], ranks: &mut [Rank]) -> Vec<ccl_core::Result<()>> {
    let d = emu::global();
    for (r, seq) in calls.iter().enumerate() {
        for c in seq {
            let x = &mut ranks[r];
            ccl_core::enqueue(
                &cs[r],
                CollArgs {
                    kind: c.kind,
                    sendbuf: x.send.as_ptr() as usize,
                    recvbuf: x.recv.as_mut_ptr() as usize,
                    count: c.count,
                    dtype: DataType::Float32 as i32,
                    op: 0,
                    root: -1,
                    stream: x.stream,
                },
            )
            .expect("enqueue returns before the kernel ran");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for x in ranks.iter() {
        while !matches!(d.stream_query(x.stream), Ok(true)) {
            if Instant::now() > deadline {
                for c in cs {
                    let _ = c.abort();
                }
                panic!("a rank's kernel still runs 10 s after the calls");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    // The completion function reports the check's verdict to the communicator; give the
    // stream threads a moment to have run it.
    std::thread::sleep(Duration::from_millis(50));
    cs.iter().map(|c| c.async_error()).collect()
}

fn ranks(n: usize) -> Vec<Rank> {
    let d = emu::global();
    (0..n)
        .map(|r| Rank {
            send: (0..ELEMS).map(|i| (r * 3 + i % 5) as f32).collect(),
            recv: vec![0.0; ELEMS * n],
            stream: d.stream_create().unwrap(),
        })
        .collect()
}

/// `culprit` calls `bad` where the others call `good`, after two consistent AllReduces.
fn mismatch(n: usize, proto: &str, culprit: usize, good: Call, bad: Call) {
    let cs = comms(n, proto);
    let mut rk = ranks(n);
    // Consistent first: everyone succeeds with the exact sum.
    let ok = run(&cs, &vec![vec![ar(ELEMS), ar(ELEMS)]; n], &mut rk);
    assert!(ok.iter().all(|r| r.is_ok()), "{ok:?}");
    for (r, x) in rk.iter().enumerate() {
        for i in (0..ELEMS).step_by(997) {
            let want: f32 = (0..n).map(|q| (q * 3 + i % 5) as f32).sum();
            assert_eq!(x.recv[i], want, "rank {r} element {i}");
        }
    }
    let calls: Vec<Vec<Call>> = (0..n)
        .map(|r| vec![if r == culprit { bad } else { good }])
        .collect();
    let res = run(&cs, &calls, &mut rk);
    let mut detectors = Vec::new();
    for (r, e) in res.iter().enumerate() {
        let e = match e {
            Err(e) => e,
            Ok(()) => panic!("rank {r}: the inconsistent call passed silently ({calls:?})"),
        };
        let t = e.to_string();
        match e.code() {
            ResultCode::InvalidUsage => {
                assert!(t.contains("inconsistent call"), "rank {r}: {t}");
                assert!(t.contains(&format!("rank {r} called")), "rank {r}: {t}");
                let bad_text = format!("{} seq 2 count {}", bad.kind.name(), bad.count);
                let good_text = format!("{} seq 2 count {}", good.kind.name(), good.count);
                assert!(
                    t.contains(&bad_text) && t.contains(&good_text),
                    "rank {r}: {t}"
                );
                detectors.push(r);
            }
            ResultCode::RemoteError => {
                assert!(t.contains("detected an inconsistent call"), "rank {r}: {t}")
            }
            other => panic!("rank {r}: {other:?} {t}"),
        }
    }
    eprintln!("detectors {detectors:?}; {res:?}");
    assert!(!detectors.is_empty(), "{res:?}");
    // The culprit's successor receives the culprit's message: it always detects.
    assert!(detectors.contains(&((culprit + 1) % n)), "{detectors:?}");
    // The next call fails at once on every rank.
    for (r, c) in cs.iter().enumerate() {
        let x = &mut rk[r];
        let e = ccl_core::enqueue(
            c,
            CollArgs {
                kind: CollKind::AllReduce,
                sendbuf: x.send.as_ptr() as usize,
                recvbuf: x.recv.as_mut_ptr() as usize,
                count: 8,
                dtype: DataType::Float32 as i32,
                op: 0,
                root: -1,
                stream: x.stream,
            },
        )
        .unwrap_err();
        assert!(
            matches!(e.code(), ResultCode::InvalidUsage | ResultCode::RemoteError),
            "rank {r}: {e}"
        );
    }
    for c in &cs {
        let t = Instant::now();
        c.destroy().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
}

#[test]
fn another_collective_fails_every_rank_simple() {
    mismatch(3, "Simple", 1, ar(ELEMS), ag(ELEMS / 3));
}

#[test]
fn another_collective_fails_every_rank_ll() {
    mismatch(3, "LL", 1, ar(64), ag(21));
}

#[test]
fn another_count_fails_every_rank() {
    mismatch(4, "Simple", 2, ar(ELEMS), ar(ELEMS / 2));
}

#[test]
fn another_count_fails_every_rank_ll_at_rank_0() {
    mismatch(4, "LL", 0, ar(256), ar(255));
}

/// A zero-count call where the peers move data: the zero-count operation still exchanges
/// one descriptor-only message around the ring, so it is caught like any other count.
#[test]
fn a_zero_count_call_among_real_ones_fails_every_rank() {
    mismatch(3, "Simple", 1, ar(ELEMS), ar(0));
}

#[test]
fn a_zero_count_call_among_real_ones_fails_every_rank_ll() {
    mismatch(4, "LL", 3, ar(64), ar(0));
}

/// Many consistent operations of both protocols and changing sizes (zero-count ones too):
/// the check never fires.
#[test]
fn consistent_calls_never_trip_the_check() {
    let n = 3;
    let cs = comms(n, "LL,Simple");
    let mut rk = ranks(n);
    let seq: Vec<Call> = (0..40)
        .map(|i| match i % 5 {
            0 => ar(ELEMS),
            1 => ar(7),
            2 => ag(ELEMS / n),
            3 => ar(0),
            _ => ar(300 + i),
        })
        .collect();
    let res = run(&cs, &vec![seq; n], &mut rk);
    assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
    for c in &cs {
        c.destroy().unwrap();
    }
}

/// A Send of 100 elements met by a Recv of 50: the receiver's kernel detects it. The
/// sender's kernel completes (the FIFO took its message) and is on no connection of the
/// failing kernel; its next call, an AllReduce that would wait for the receiver forever,
/// fails through the communicator's poison board within a watch period or two.
#[test]
fn a_send_whose_receiver_rejected_it_fails_the_senders_next_call() {
    rejected_send(100);
}

/// The same with a Send of count 0: it still carries its descriptor (a descriptor-only
/// message on the pair's link), so the Recv of 50 does not wait for data that never comes.
#[test]
fn a_zero_count_send_met_by_a_real_recv_fails_both_ranks() {
    rejected_send(0);
}

/// Rank 0 sends `send_count` elements to rank 1, which receives 50.
fn rejected_send(send_count: usize) {
    std::env::set_var("CCLD_PEER_CHECK_MS", "100");
    let cs = comms(2, "Simple");
    let d = emu::global();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            let c = Arc::clone(&cs[r]);
            std::thread::spawn(move || {
                let d = emu::global();
                let s = d.stream_create().unwrap();
                let send = vec![1f32; 256];
                let mut recv = vec![0f32; 256];
                let recvbuf = recv.as_mut_ptr() as usize;
                let call = |kind, count, peer| CollArgs {
                    kind,
                    sendbuf: send.as_ptr() as usize,
                    recvbuf,
                    count,
                    dtype: DataType::Float32 as i32,
                    op: 0,
                    root: peer,
                    stream: s,
                };
                let first = if r == 0 {
                    call(CollKind::Send, send_count, 1)
                } else {
                    call(CollKind::Recv, 50, 0)
                };
                ccl_core::enqueue(&c, first).expect("the p2p call is enqueued");
                let _ = d.stream_synchronize(s);
                let t0 = Instant::now();
                // The receiver's next call fails at once (its communicator failed); the
                // sender's is enqueued and fails asynchronously.
                let next = ccl_core::enqueue(&c, call(CollKind::AllReduce, 64, -1));
                let err = loop {
                    if let Err(e) = c.async_error() {
                        break e;
                    }
                    if t0.elapsed() > Duration::from_secs(5) {
                        let _ = c.abort();
                        panic!("rank {r}: no error 5 s after the inconsistent Send/Recv");
                    }
                    std::thread::sleep(Duration::from_millis(5));
                };
                let _ = d.stream_synchronize(s);
                drop(recv);
                (next.is_ok(), err, t0.elapsed())
            })
        })
        .collect();
    let out: Vec<_> = hs.into_iter().map(|h| h.join().expect("rank")).collect();
    eprintln!("{out:?}");
    let (_, e1, _) = &out[1];
    assert_eq!(e1.code(), ResultCode::InvalidUsage, "{e1}");
    assert!(
        e1.to_string().contains(&format!(
            "rank 1 called Send/Recv pair seq 0 count 50 datatype 7 but rank 0 called \
                 Send/Recv pair seq 0 count {send_count}"
        )),
        "{e1}"
    );
    let (enqueued, e0, took) = &out[0];
    assert!(
        enqueued,
        "the sender's AllReduce was enqueued (its communicator was fine)"
    );
    assert_eq!(e0.code(), ResultCode::RemoteError, "{e0}");
    assert!(
        e0.to_string()
            .contains("rank 1 detected an inconsistent call"),
        "{e0}"
    );
    assert!(*took < Duration::from_secs(2), "{took:?}");
    let _ = d;
    for c in &cs {
        c.destroy().unwrap();
    }
}

/// Kernel level (the plan kernel on the emulated device, one receiving lane): a poison that
/// arrives after the lane's first message, when descriptors are no longer compared, is still
/// seen (through the tail's poison bit): the kernel stops with the poison in its check
/// record instead of consuming it as data and waiting for a message that never comes.
#[test]
fn a_poison_after_the_first_message_stops_the_receiving_kernel() {
    use kernels::ffi::{
        ccl_check_record_offset, ccl_dev_conn_t, ccl_dev_lane_t, ccl_dev_plan_t, ccl_dev_step_t,
        CCL_CHECK_BYTES, CCL_DESC_POISON_MARK, CCL_DESC_WORDS, CCL_MAX_BUFS, CCL_STEP_RECV,
    };
    std::env::set_var("CCLD_DEVICE_EMULATION", "1");
    let d = emu::global();
    const SLOT: usize = 256;
    const NSLOTS: usize = 4;
    const STEPS: usize = 3;
    let dev = |bytes: usize| {
        let p = d.malloc(bytes).unwrap();
        // SAFETY: p has `bytes` bytes.
        unsafe { d.memset(p, 0, bytes).unwrap() };
        p
    };
    let put = |dst: usize, src: &[u8]| {
        // SAFETY: each destination block below has at least the source's length.
        unsafe { d.memcpy(dst, src.as_ptr() as usize, src.len()).unwrap() }
    };
    let words = |w: &[u64]| -> Vec<u8> { w.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (slots, ctr, descs, out) = (
        dev(SLOT * NSLOTS),
        dev(24),
        dev(NSLOTS * 24),
        dev(STEPS * SLOT),
    );
    let check = d.host_alloc_mapped(CCL_CHECK_BYTES).unwrap();
    let abort = d.host_alloc_mapped(64).unwrap();
    let want: [u64; CCL_DESC_WORDS] = [0x11, 0x22, 0x33];
    // Message 0: data and the operation's descriptor; message 1: a poison from rank 5.
    put(slots, &[7u8; SLOT]);
    put(descs, &words(&want));
    put(
        descs + 24,
        &words(&[!0, (CCL_DESC_POISON_MARK << 56) | 5, 0]),
    );
    put(ctr, &words(&[2 | (1u64 << 63)]));
    let steps: Vec<ccl_dev_step_t> = (0..STEPS)
        .map(|i| ccl_dev_step_t {
            kind: CCL_STEP_RECV,
            src_buf: 0,
            dst_buf: 0,
            reserved: 0,
            src_off: 0,
            dst_off: (i * SLOT / 4) as u64,
            count: (SLOT / 4) as u64,
        })
        .collect();
    let lane = ccl_dev_lane_t {
        channel: 0,
        first_step: 0,
        n_steps: STEPS as u32,
        conn_in: 0,
        conn_out: -1,
        flags: 0,
    };
    let conn = ccl_dev_conn_t {
        slots: slots as *mut _,
        tail: ctr as *mut u64,
        head: (ctr + 8) as *mut u64,
        slot_bytes: SLOT as u64,
        nslots: NSLOTS as u32,
        ll_sync: 0,
        descs: descs as *mut u64,
    };
    let arrays = dev(4096);
    let bytes_of = |p: *const u8, n: usize| {
        // SAFETY: p points to n readable bytes (a live vector or struct below).
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    };
    let ssz = std::mem::size_of::<ccl_dev_step_t>() * STEPS;
    put(arrays, &bytes_of(steps.as_ptr().cast(), ssz));
    put(
        arrays + 1024,
        &bytes_of(
            (&lane as *const ccl_dev_lane_t).cast(),
            std::mem::size_of_val(&lane),
        ),
    );
    put(
        arrays + 2048,
        &bytes_of(
            (&conn as *const ccl_dev_conn_t).cast(),
            std::mem::size_of_val(&conn),
        ),
    );
    let mut desc = [[0u64; CCL_DESC_WORDS]; CCL_MAX_BUFS];
    desc[0] = want;
    let mut bufs = [std::ptr::null_mut(); CCL_MAX_BUFS];
    bufs[0] = out as *mut _;
    let plan = ccl_dev_plan_t {
        n_lanes: 1,
        n_steps: STEPS as u32,
        n_conns: 1,
        steps: arrays as *const _,
        lanes: (arrays + 1024) as *const _,
        conns: (arrays + 2048) as *const _,
        bufs,
        abort_flag: abort.dev as *const u32,
        check: check.dev as *mut u64,
        rank: 1,
        desc,
        ..ccl_dev_plan_t::idle()
    };
    let s = d.stream_create().unwrap();
    // SAFETY: every array, buffer, FIFO and area above lives until the end of the test,
    // after the stream went idle.
    unsafe { d.launch_plan(&plan, s).unwrap() };
    let t0 = Instant::now();
    while !d.stream_query(s).unwrap() {
        if t0.elapsed() > Duration::from_secs(5) {
            // SAFETY: the abort flag is a live mapped word.
            unsafe { std::ptr::write_volatile(abort.host as *mut u32, 1) };
            while !d.stream_query(s).unwrap() {
                std::thread::sleep(Duration::from_millis(2));
            }
            panic!("the kernel consumed the poison as data and waited for a third message");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let rd = |addr: usize| {
        // SAFETY: addr is a word of the live mapped check area or emulated FIFO counters.
        unsafe { std::ptr::read_volatile(addr as *const u64) }
    };
    assert_eq!(rd(check.host), 1, "stop word");
    let rec = check.host + ccl_check_record_offset(0);
    assert_eq!(rd(rec), 1, "channel 0's record");
    let got1 = rd(rec + 8 * 3);
    assert_eq!(got1 >> 56, CCL_DESC_POISON_MARK, "got {got1:#x}");
    assert_eq!(got1 & 0xff_ffff, 5, "the poisoning rank");
    let mut first = vec![0u8; SLOT];
    // SAFETY: `out` has STEPS * SLOT bytes; the kernel finished.
    unsafe { d.memcpy(first.as_mut_ptr() as usize, out, SLOT).unwrap() };
    assert_eq!(first, vec![7u8; SLOT], "message 0 was received");
    assert_eq!(rd(ctr + 8), 1, "head: the poison was not consumed");
}
