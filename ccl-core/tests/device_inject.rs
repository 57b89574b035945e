//! `CCLD_INJECT` faults and wait metrics on the device backend, through the communicator
//! API on the CPU emulation of the device (`CCLD_DEVICE_EMULATION=1`, no GPU needed): the
//! kernel's rules (carried in the plan, run by the emulator) must give the analyzer the
//! same evidence as the host executor:
//! - a throttled link (s2) shows as downstream wait on the sender's channels and upstream
//!   wait on its ring successor's, and `link=` selects which outbound peer is throttled;
//! - a stall (h3) leaves the stalled rank's counters at zero, every op hung until abort;
//! - a halved operation (h2) completes early on the faulty rank with half the steps and the
//!   rank issues nothing afterwards, while its peers hang until abort.
//!
//! Every test sets its environment at its start; nextest (CI) runs each test in its own
//! process. Every wait is bounded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::device::api::{DeviceApi, Stream};
use ccl_core::device::emu;
use ccl_core::{CollArgs, Comm, DataType};
use ccl_optype::CollKind;

const N: usize = 4;
/// Floats per rank: 64 Ki floats, several ring steps per channel with 64 KiB buffers.
const COUNT: usize = 1 << 16;

fn comms(inject: &str) -> Vec<Arc<Comm>> {
    comms_proto(inject, "Simple")
}

fn comms_proto(inject: &str, proto: &str) -> Vec<Arc<Comm>> {
    std::env::set_var("CCLD_DEVICE_EMULATION", "1");
    std::env::set_var("CCLD_BOOTSTRAP_IP", "127.0.0.1");
    std::env::set_var("NCCL_BUFFSIZE", "65536");
    std::env::set_var("NCCL_PROTO", proto);
    std::env::set_var("CCLD_INJECT", inject);
    let c = Comm::init_all(N as i32, None).expect("init_all");
    std::env::remove_var("CCLD_INJECT");
    assert!(c.iter().all(|c| c.is_device()), "emulation: device backend");
    c
}

/// Waits until `s` is idle, at most `limit`.
fn idle_within(s: Stream, limit: Duration) -> bool {
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

struct Bufs {
    send: Vec<Vec<f32>>,
    recv: Vec<Vec<f32>>,
    streams: Vec<Stream>,
}

fn bufs() -> Bufs {
    let d = emu::global();
    Bufs {
        send: (0..N).map(|r| vec![(r + 1) as f32; COUNT]).collect(),
        recv: (0..N).map(|_| vec![0.0f32; COUNT]).collect(),
        streams: (0..N).map(|_| d.stream_create().expect("stream")).collect(),
    }
}

fn all_reduce(c: &Arc<Comm>, b: &mut Bufs, r: usize) -> ccl_core::Result<()> {
    ccl_core::enqueue(
        c,
        CollArgs {
            kind: CollKind::AllReduce,
            sendbuf: b.send[r].as_ptr() as usize,
            recvbuf: b.recv[r].as_mut_ptr() as usize,
            count: COUNT,
            dtype: DataType::Float32 as i32,
            op: 0,
            root: -1,
            stream: b.streams[r],
        },
    )
}

/// (upstream, downstream) wait ns of op 0 (block 0), summed over channels.
fn waits(c: &Comm) -> (u64, u64) {
    let f = c.probe_frame();
    (0..f.channel_capacity())
        .map(|ch| f.waits(0, ch))
        .fold((0, 0), |(u, d), w| (u + w.upstream_ns, d + w.downstream_ns))
}

/// (sends, recvs) counted and expected of op 0, summed over channels.
fn counts(c: &Comm) -> ((u64, u64), (u64, u64)) {
    let f = c.probe_frame();
    let mut got = (0, 0);
    let mut exp = (0, 0);
    for ch in 0..f.channel_capacity() {
        let k = f.counts(0, ch);
        got.0 += k.send_count;
        got.1 += k.recv_count;
        let (s, r) = f.expected(0, ch);
        exp.0 += s;
        exp.1 += r;
    }
    (got, exp)
}

/// One AllReduce on every rank, completed; returns each rank's (upstream, downstream)
/// waits and checks the results.
fn one_op(cs: &[Arc<Comm>]) -> Vec<(u64, u64)> {
    let mut b = bufs();
    for (r, c) in cs.iter().enumerate() {
        all_reduce(c, &mut b, r).expect("enqueue");
    }
    for &s in &b.streams {
        assert!(idle_within(s, Duration::from_secs(20)), "op must complete");
    }
    let want = (1..=N).sum::<usize>() as f32;
    for (r, v) in b.recv.iter().enumerate() {
        assert!(v.iter().all(|&x| x == want), "rank {r}: wrong result");
    }
    for c in cs {
        let ((s, r), (es, er)) = counts(c);
        assert_eq!((s, r), (es, er), "rank {}: complete counts", c.rank());
    }
    let w = cs.iter().map(|c| waits(c)).collect();
    for c in cs {
        c.destroy().expect("destroy");
    }
    w
}

#[test]
fn a_throttled_link_shows_downstream_at_the_sender_and_upstream_at_the_receiver() {
    // Rank 1 sends to rank 2 (ring successor) with at least 3 ms between two sends of a
    // channel: each channel has several sends, so >= 3 ms per channel after the first.
    let w = one_op(&comms("s2:rank=1,gap=3ms"));
    eprintln!("waits (up, down) ns per rank: {w:?}");
    let ms = 1_000_000;
    assert!(w[1].1 >= 5 * ms, "sender's downstream wait: {w:?}");
    assert!(w[2].0 >= 5 * ms, "receiver's upstream wait: {w:?}");
    let max_other_down = [0, 2, 3].iter().map(|&r| w[r].1).max().unwrap_or(0);
    assert!(
        w[1].1 > 2 * max_other_down,
        "the throttled sender waits downstream the most: {w:?}"
    );
    assert!(
        w[2].0 > w[1].0,
        "the receiver waits upstream more than the sender: {w:?}"
    );
}

#[test]
fn ll_a_throttled_link_shows_the_same_waits() {
    let w = one_op(&comms_proto("s2:rank=1,gap=3ms", "LL"));
    let ms = 1_000_000;
    assert!(w[1].1 >= 5 * ms, "sender's downstream wait: {w:?}");
    assert!(w[2].0 >= 5 * ms, "receiver's upstream wait: {w:?}");
    let max_other_down = [0, 2, 3].iter().map(|&r| w[r].1).max().unwrap_or(0);
    assert!(w[1].1 > 2 * max_other_down, "{w:?}");
}

#[test]
fn the_link_key_throttles_only_sends_to_that_peer() {
    // link=3: rank 1's ring lanes send to rank 2 only, so nothing is throttled.
    let t0 = Instant::now();
    let w = one_op(&comms("s2:rank=1,gap=20ms,link=3"));
    let ms = 1_000_000;
    assert!(
        w[1].1 < 20 * ms,
        "no throttled sends, no 20 ms downstream waits: {w:?}"
    );
    // link=2 (the successor): throttled, at least one 20 ms gap per channel.
    let w = one_op(&comms("s2:rank=1,gap=20ms,link=2"));
    assert!(w[1].1 >= 20 * ms, "throttled link: {w:?}");
    assert!(t0.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_stalled_rank_leaves_counts_short_and_every_op_hung_until_abort() {
    let cs = comms("h3:rank=2");
    let mut b = bufs();
    for (r, c) in cs.iter().enumerate() {
        all_reduce(c, &mut b, r).expect("enqueue");
    }
    for (r, &s) in b.streams.iter().enumerate() {
        assert!(
            !idle_within(s, Duration::from_millis(300)),
            "rank {r}: must hang"
        );
    }
    let ((s2, r2), (e2, _)) = counts(&cs[2]);
    assert_eq!((s2, r2), (0, 0), "the stalled rank never progresses");
    assert!(e2 > 0, "it was expected to");
    for c in &cs {
        let ((s, r), (es, er)) = counts(c);
        assert!(s + r < es + er, "rank {}: counts short", c.rank());
    }
    for c in &cs {
        c.abort().expect("abort");
    }
    for (r, &s) in b.streams.iter().enumerate() {
        assert!(
            idle_within(s, Duration::from_secs(5)),
            "rank {r}: abort ends it"
        );
    }
    for c in &cs {
        let op = c.op_log().get(0).expect("op logged");
        assert_ne!(op.state, probe::OpState::Completed, "rank {}", c.rank());
    }
}

#[test]
fn a_stall_of_one_channel_stops_only_that_channel() {
    std::env::set_var("NCCL_MIN_CTAS", "2");
    let cs = comms("h3:rank=0,channel=1");
    let mut b = bufs();
    for (r, c) in cs.iter().enumerate() {
        all_reduce(c, &mut b, r).expect("enqueue");
    }
    assert!(!idle_within(b.streams[0], Duration::from_millis(300)));
    let f = cs[0].probe_frame();
    let ch1 = f.counts(0, 1);
    assert_eq!((ch1.send_count, ch1.recv_count), (0, 0), "channel 1 stalls");
    let (es1, _) = f.expected(0, 1);
    assert!(es1 > 0, "the op uses channel 1");
    let ch0 = f.counts(0, 0);
    assert_eq!(
        (ch0.send_count, ch0.recv_count),
        f.expected(0, 0),
        "channel 0 completes"
    );
    for c in &cs {
        c.abort().expect("abort");
    }
    for &s in &b.streams {
        assert!(idle_within(s, Duration::from_secs(5)));
    }
}

#[test]
fn a_halved_operation_completes_early_and_the_rank_issues_nothing_more() {
    let cs = comms("h2:rank=1,ops=0");
    let mut b = bufs();
    for (r, c) in cs.iter().enumerate() {
        all_reduce(c, &mut b, r).expect("enqueue");
    }
    assert!(
        idle_within(b.streams[1], Duration::from_secs(5)),
        "the halved op completes"
    );
    for r in [0, 2, 3] {
        assert!(
            !idle_within(b.streams[r], Duration::from_millis(200)),
            "rank {r} waits for the rest"
        );
    }
    let op = cs[1].op_log().get(0).expect("op logged");
    assert_eq!(op.state, probe::OpState::Completed);
    assert_eq!(op.info.count, (COUNT / 2) as u64, "half the count logged");
    // Half the steps of each lane (rounded up): about half of each channel's sends and
    // receives (a lane's steps move one or two messages each), never all of them.
    let f = cs[1].probe_frame();
    let mut any = false;
    for ch in 0..f.channel_capacity() {
        let (es, er) = f.expected(0, ch);
        if es + er == 0 {
            continue;
        }
        any = true;
        let k = f.counts(0, ch);
        let (got, all) = (k.send_count + k.recv_count, es + er);
        assert!(
            4 * got >= all && 4 * got <= 3 * all && got < all,
            "channel {ch}: {got} of {all} messages after halving"
        );
    }
    assert!(any);
    // The next operation of rank 1 is held back (not entered) until abort.
    let mut b2 = bufs();
    all_reduce(&cs[1], &mut b2, 1).expect("enqueue");
    assert!(!idle_within(b2.streams[1], Duration::from_millis(200)));
    for c in &cs {
        c.abort().expect("abort");
    }
    for &s in b.streams.iter().chain(&b2.streams) {
        assert!(idle_within(s, Duration::from_secs(5)));
    }
}
