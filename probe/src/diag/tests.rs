use super::*;
use crate::{Algo, CollKind, OpTypeSet, Proto};

fn info() -> OpTypeSet {
    OpTypeSet {
        coll: CollKind::AllReduce,
        algo: Algo::Ring,
        proto: Proto::Simple,
        dtype: 7,
        redop: 0,
        count: 1024,
        bytes: 4096,
        root: -1,
        peer: -1,
        n_channels: 2,
    }
}

fn src(rank: u32) -> Arc<Source> {
    register(
        Identity {
            comm_id: 0xabc,
            rank,
            nranks: 4,
            device: -1,
            ring_prev: (rank + 3) % 4,
            ring_next: (rank + 1) % 4,
        },
        Arc::new(Frame::new(2)),
        Arc::new(OpLog::new()),
        RankGroup::new(),
    )
}

#[test]
fn rates_are_reciprocal_change_ticks_and_completion_makes_a_record() {
    let s = src(1);
    let mut sm = Sampler::new(DiagConfig::default());
    let b = s.frame.begin_op(0xabc, 5, 2);
    s.op_log.start(5, &info(), 1_000);
    // Channel 0 changes in 4 ticks, channel 1 in 1 tick.
    for t in 0..4u64 {
        s.frame.add_send(b, 0, 2);
        if t == 0 {
            s.frame.add_recv(b, 1, 8);
        }
        assert!(sm.sample(std::slice::from_ref(&s), 2_000 + t).is_empty());
    }
    s.frame.add_wait_upstream(b, 0, 300);
    s.op_log
        .finish(5, EndTime::exact(1_000 + 2_000_000_000), true)
        .unwrap();
    let d = Done {
        source: s.id,
        counter: 5,
        snap: s.op_log.get(5).unwrap(),
        chans: DoneChans::Heap(Sampler::live_chans(&s, 5)),
        thinning: Thinning::default(),
        failure: None,
        id: None,
        peer_wire: vec![PeerWire {
            from: 2,
            wire_ns: 7_000,
        }],
    };
    let r = sm.complete(&s, &d, 0);
    assert_eq!(r.trace.unwrap().op_counter, 5);
    assert_eq!((r.rank, r.nranks, r.duration_ns), (1, 4, 2_000_000_000));
    assert_eq!(
        r.peer_wire,
        [wire::PeerWire {
            from: 2,
            wire_ns: 7_000
        }]
    );
    assert_eq!(r.state, wire::OpState::Completed as i32);
    let c0 = &r.channels[0];
    assert_eq!((c0.send_count, c0.send_rate, c0.recv_rate), (8, 0.25, 0.0));
    assert!((c0.send_per_sec - 4.0).abs() < 1e-9);
    assert_eq!(
        (c0.wait_upstream_ns, c0.ring_prev, c0.ring_next),
        (Some(300), Some(0), Some(2))
    );
    let c1 = &r.channels[1];
    assert_eq!((c1.recv_count, c1.recv_rate), (8, 1.0));
    assert_eq!(r.op.unwrap().bytes, 4096);
}

#[test]
fn records_carry_the_cpu_wait_of_the_thread_that_ran_the_operations() {
    if std::fs::metadata("/proc/self/schedstat").is_err() {
        eprintln!("skipped: no schedstat on this kernel");
        return;
    }
    let s = src(3);
    let mut sm = Sampler::new(DiagConfig::default());
    let op = |c: u64| {
        s.start_op(c, &coll(c), 1_000);
        let b = s.frame.begin_op(0xabc, c, 2);
        s.frame.add_send(b, 0, 1);
        s.op_log.start(c, &info(), 1_000);
        let fin = s.op_log.finish(c, EndTime::exact(2_000), true).unwrap();
        // This thread completes the operation: it is the one whose CPU wait counts.
        s.op_done(&fin);
        Done {
            source: s.id,
            counter: c,
            snap: s.op_log.get(c).unwrap(),
            chans: DoneChans::Heap(Sampler::live_chans(&s, c)),
            thinning: Thinning::default(),
            failure: None,
            id: None,
            peer_wire: Vec::new(),
        }
    };
    // Before any reading the metric is unknown.
    let d = op(1);
    assert_eq!(sm.complete(&s, &d, 0).cpu_wait_ns, None);
    assert_eq!(
        s.exec_tid.load(Ordering::Relaxed),
        crate::sched::current_tid()
    );
    sm.sample_cpu_wait(std::slice::from_ref(&s));
    let d = op(2);
    assert_eq!(sm.complete(&s, &d, 0).cpu_wait_ns, Some(0), "first reading");
    sm.sample_cpu_wait(std::slice::from_ref(&s));
    let d = op(3);
    assert!(sm.complete(&s, &d, 0).cpu_wait_ns.is_some());
}

#[test]
fn a_long_operation_gets_periodic_in_flight_snapshots_and_a_heartbeat() {
    let s = src(2);
    let cfg = DiagConfig {
        inflight: Duration::from_millis(10),
        ..DiagConfig::default()
    };
    let ms = 1_000_000;
    let mut sm = Sampler::new(cfg);
    s.frame.begin_op(0xabc, 0, 2);
    s.op_log.start(0, &info(), 0);
    let one = std::slice::from_ref(&s);
    assert!(sm.sample(one, 5 * ms).is_empty(), "too young");
    let r = sm.sample(one, 10 * ms);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].state, wire::OpState::InFlight as i32);
    assert_eq!(r[0].duration_ns, 10 * ms);
    assert!(sm.sample(one, 15 * ms).is_empty(), "not yet due again");
    assert_eq!(sm.sample(one, 20 * ms).len(), 1);
    let hb = sm.heartbeat(one, 21 * ms);
    assert_eq!(hb.ranks.len(), 1);
    assert_eq!(hb.ranks[0].last_op_counter, Some(0));
    assert_eq!((hb.ranks[0].rank, hb.ranks[0].nranks), (2, 4));
    // No op started yet on a fresh source: no counter in the heartbeat.
    let fresh = src(3);
    assert_eq!(sm.heartbeat(&[fresh], 0).ranks[0].last_op_counter, None);
}

#[test]
fn heartbeats_carry_a_failed_call_until_the_next_operation_starts() {
    let s = src(1);
    let sm = Sampler::new(DiagConfig::default());
    let one = std::slice::from_ref(&s);
    assert_eq!(sm.heartbeat(one, 0).ranks[0].last_call_error, None);
    s.note_call_failed("invalid argument: AllReduce: invalid data type 99");
    let hb = sm.heartbeat(one, 1);
    assert_eq!(
        hb.ranks[0].last_call_error.as_deref(),
        Some("invalid argument: AllReduce: invalid data type 99")
    );
    // Repeated in every heartbeat while the rank starts nothing.
    assert!(sm.heartbeat(one, 2).ranks[0].last_call_error.is_some());
    // The next operation starts: the error no longer explains where the rank is.
    let coll = |number| OpSeq {
        space: SeqSpace::Collective,
        number,
        p2p: Vec::new(),
    };
    s.start_op(0, &coll(0), 10);
    assert_eq!(sm.heartbeat(one, 3).ranks[0].last_call_error, None);
    // A later failure, after that operation: carried again, cut to its bound.
    s.note_call_failed(&"y".repeat(3 * wire::MAX_CALL_ERROR_CHARS));
    let e = sm.heartbeat(one, 4).ranks[0]
        .last_call_error
        .clone()
        .unwrap();
    assert_eq!(e, "y".repeat(wire::MAX_CALL_ERROR_CHARS));
    s.start_op(1, &coll(1), 20);
    assert_eq!(sm.heartbeat(one, 5).ranks[0].last_call_error, None);
}

#[test]
fn env_is_strict() {
    let get = |v: &'static str| move |n: &str| (n == "CCLD_SAMPLE_US").then(|| v.to_string());
    let set = DiagConfig::resolve(&get("250")).unwrap();
    assert_eq!(set.sample, Some(Duration::from_micros(250)));
    for bad in ["0", "x", "-1", "1e3"] {
        let e = DiagConfig::resolve(&get(bad)).unwrap_err();
        assert!(e.contains("CCLD_SAMPLE_US"), "{e}");
    }
    let unset = DiagConfig::resolve(&|_| None).unwrap();
    assert_eq!(unset, DiagConfig::default());
    // Unset: 10 ms while only host-backend communicators are registered, 1 ms with a
    // device communicator; a value set applies to both.
    let host = src(0);
    let dev = register(
        Identity {
            device: 0,
            ..host.identity().clone()
        },
        Arc::new(Frame::new(2)),
        Arc::new(OpLog::new()),
        RankGroup::new(),
    );
    assert_eq!(
        unset.sample_period(std::slice::from_ref(&host)),
        HOST_SAMPLE
    );
    assert_eq!(
        unset.sample_period(&[host.clone(), dev.clone()]),
        DEVICE_SAMPLE
    );
    assert_eq!(set.sample_period(&[host, dev]), Duration::from_micros(250));
}

#[test]
fn completions_of_fast_operations_keep_their_records() {
    // 3 x FRAME_BLOCKS operations finish before the diagnostic thread looks at any of
    // them (operations shorter than a tick): the op log and the frame have long been
    // reused, yet every completion must become a record with its own times and counts.
    let s = src(2);
    let mut sm = Sampler::new(DiagConfig::default());
    let n_ops = 3 * crate::FRAME_BLOCKS as u64;
    let msgs: Vec<Done> = (0..n_ops)
        .map(|k| {
            let b = s.frame.begin_op(0xabc, k, 2);
            s.op_log.start(k, &info(), 1_000 * k);
            s.frame.add_send(b, 0, k + 1);
            s.frame.add_recv(b, 1, 2 * k + 1);
            s.op_log
                .finish(k, EndTime::exact(1_000 * k + 10 * (k + 1)), true)
                .unwrap();
            s.done_message(&s.op_log.get(k).unwrap(), Thinning::default())
        })
        .collect();
    for (k, d) in (0..n_ops).zip(&msgs) {
        let r = sm.complete(&s, d, 10_000_000);
        assert_eq!(r.trace.unwrap().op_counter, k);
        assert_eq!((r.start_ns, r.duration_ns), (1_000 * k, 10 * (k + 1)));
        assert_eq!(r.channels[0].send_count, k + 1);
        assert_eq!(r.channels[1].recv_count, 2 * k + 1);
        assert_eq!(r.state, wire::OpState::Completed as i32);
    }
}

#[test]
fn thread_cpu_clock_counts_this_threads_work_only() {
    let t0 = thread_cpu_ns();
    assert!(t0 > 0, "CLOCK_THREAD_CPUTIME_ID unavailable");
    // Sleeping uses no CPU; spinning does (bounded in wall time for a loaded machine).
    std::thread::sleep(Duration::from_millis(30));
    let t1 = thread_cpu_ns();
    assert!(
        t1 - t0 < 10_000_000,
        "slept 30 ms, clock advanced {} ns",
        t1 - t0
    );
    let spin = Instant::now();
    let mut x = 0u64;
    while thread_cpu_ns() - t1 < 5_000_000 {
        x = std::hint::black_box(x.wrapping_add(1));
        assert!(
            spin.elapsed() < Duration::from_secs(10),
            "10 s of spinning did not advance the thread clock by 5 ms"
        );
    }
}

/// Collective number `n`.
fn coll(n: u64) -> OpSeq {
    OpSeq {
        space: SeqSpace::Collective,
        number: n,
        p2p: Vec::new(),
    }
}

/// Operation `c` (collective number `c`) on `s` from `start` to `end` (ns), as the
/// executor runs the probe: whether its end was timed, and what thinning decides for its
/// completion. `end` stands for the clock reading or the estimate alike.
fn run_op(s: &Source, c: u64, start: u64, end: u64, ok: bool) -> (bool, Option<Thinning>) {
    let timed = s.start_op(c, &coll(c), start);
    let b = s.frame.begin_op(0xabc, c, 2);
    s.frame.add_send(b, 0, 1);
    s.op_log.start(c, &info(), start);
    let end = if timed || !ok {
        EndTime::exact(end)
    } else {
        EndTime::estimate(end)
    };
    let fin = s.op_log.finish(c, end, ok).unwrap();
    (end.timed, s.thin_completion(&fin))
}

/// [`run_op`] of a successful operation: what thinning decides.
fn finish_op(s: &Source, c: u64, start: u64, end: u64) -> Option<Thinning> {
    run_op(s, c, start, end, true).1
}

/// A source of communicator `comm` in `group` reporting every completion.
fn member(comm: u64, rank: u32, group: &Arc<RankGroup>) -> Arc<Source> {
    register_with_target(
        Identity {
            comm_id: comm,
            rank,
            nranks: 2,
            device: -1,
            ring_prev: 1 - rank,
            ring_next: 1 - rank,
        },
        Arc::new(Frame::new(2)),
        Arc::new(OpLog::new()),
        Arc::clone(group),
        Duration::ZERO,
    )
}

#[test]
fn a_ranks_gap_leaves_out_its_time_in_its_other_communicators() {
    // One rank of a DP group and of a TP pair (one group: the TP communicator was split
    // from the DP one), its TP partner (another rank, its own group). Each iteration: 1 ms
    // of computation, a 0.5 ms DP AllReduce, then the TP AllReduce, in which the rank
    // waits 3 ms for its partner every other iteration. Its raw DP gap is 1 ms plus the TP
    // operation before it; what the rank computed is 1 ms in both communicators.
    let (mine, partner) = (RankGroup::new(), RankGroup::new());
    let dp = member(0xd0, 0, &mine);
    let tp = member(0x70, 0, &mine);
    let other_tp = member(0x70, 1, &partner);
    assert_eq!((mine.len(), partner.len()), (2, 1));
    let mut t = 1_000_000u64;
    for i in 0..40u64 {
        let tp_ms = if i % 2 == 1 { 3_000_000 } else { 200_000 };
        t += 1_000_000;
        let d = finish_op(&dp, i, t, t + 500_000).unwrap();
        t += 500_000;
        let k = finish_op(&tp, i, t, t + tp_ms).unwrap();
        // The partner's TP operation ends with this rank's: it is not this rank's time.
        let o = finish_op(&other_tp, i, t + tp_ms - 100_000, t + tp_ms).unwrap();
        t += tp_ms;
        if i == 0 {
            assert_eq!((d.gap, k.gap), (Gap::default(), Gap::default()));
            continue;
        }
        let prev_tp = if i % 2 == 0 { 3_000_000 } else { 200_000 };
        let gap = |g, e| Gap {
            gap_ns: Some(g),
            elsewhere_ns: Some(e),
        };
        assert_eq!(
            d.gap,
            gap(1_000_000, prev_tp),
            "DP op {i}: the TP wait is not computation"
        );
        assert_eq!(
            k.gap,
            gap(1_000_000, 500_000),
            "TP op {i}: the DP operation is not either"
        );
        assert_eq!(
            o.gap,
            gap(1_500_000 + tp_ms - 100_000, 0),
            "the partner's group holds only its own communicator"
        );
    }
    // A member that is gone adds nothing and is pruned at the next registration.
    drop(tp);
    let _again = member(0x71, 0, &mine);
    assert_eq!(mine.len(), 2);
}

#[test]
fn fast_ranks_report_the_same_thinned_rounds_with_their_gaps() {
    // Two ranks of one communicator run 2000 operations of 50 us, one every 60 us,
    // rank 1 entering 7 us later than rank 0 (default target: one report per 5 ms, so
    // 83 operations per report: stride 64).
    let (a, b) = (src(0), src(1));
    let mut reported = [Vec::new(), Vec::new()];
    let mut strides = [Vec::new(), Vec::new()];
    for c in 0..2000u64 {
        for (k, s) in [&a, &b].into_iter().enumerate() {
            let start = 1_000_000 + c * 60_000 + 7_000 * k as u64;
            if let Some(t) = finish_op(s, c, start, start + 50_000) {
                reported[k].push(c);
                strides[k].push(t.stride);
                if c > 0 {
                    assert_eq!(t.gap.gap_ns, Some(10_000), "op {c}: 60 - 50 us");
                } else {
                    assert_eq!(t.gap.gap_ns, None, "nothing before the first operation");
                }
            }
        }
    }
    assert_eq!(
        reported[0], reported[1],
        "both ranks report the same rounds"
    );
    // The first epoch is complete (the baseline), then about one round in 32.
    assert!(reported[0].starts_with(&(0..thin::EPOCH_OPS).collect::<Vec<_>>()));
    let later = reported[0].iter().filter(|&&c| c >= 64).count();
    assert!((10..80).contains(&later), "{later} of 1936 reported");
    assert_eq!(*strides[0].last().unwrap(), 64);
    for &c in reported[0].iter().filter(|&&c| c >= 64) {
        assert!(thin::selected(0xabc, c, 64), "round {c} not in the sample");
    }
    let (rep, skip) = a.thinning_counts();
    assert_eq!(rep + skip, 2000);
    assert_eq!(rep as usize, reported[0].len());
    // Target zero (CCLD_RECORD_US=0): every completion.
    let all = register_with_target(
        a.identity().clone(),
        Arc::new(Frame::new(2)),
        Arc::new(OpLog::new()),
        RankGroup::new(),
        Duration::ZERO,
    );
    for c in 0..2000u64 {
        let t = finish_op(&all, c, c * 60_000, c * 60_000 + 50_000).unwrap();
        assert_eq!(t.stride, 1);
    }
}

#[test]
fn slow_operations_and_snapshotted_ones_are_always_reported() {
    let s = src(2);
    // 32 fast operations raise the stride ...
    for c in 0..=32u64 {
        finish_op(&s, c, c * 10_000, c * 10_000 + 5_000);
    }
    let stride = s.thin.stride.load(Ordering::Relaxed);
    assert!(stride >= 64, "{stride}");
    // ... rounds outside the sample are left out (at least 8 in a row here) ...
    let c = (41..)
        .find(|&c| (c - 8..=c).all(|k| !thin::selected(0xabc, k, stride)))
        .unwrap();
    let mut skipped = Vec::new();
    for k in 33..c {
        if finish_op(&s, k, k * 10_000, k * 10_000 + 5_000).is_none() {
            skipped.push(k);
        }
    }
    assert!(
        skipped.ends_with(&(c - 8..c).collect::<Vec<_>>()),
        "{c} {stride} {skipped:?}"
    );
    // ... unless it got an in-flight snapshot: then its completion closes it.
    let cfg = DiagConfig {
        inflight: Duration::from_millis(10),
        ..DiagConfig::default()
    };
    let mut sm = Sampler::new(cfg);
    let start = c * 10_000;
    s.frame.begin_op(0xabc, c, 2);
    s.op_log.start(c, &info(), start);
    let snaps = sm.sample(std::slice::from_ref(&s), start + 20_000_000);
    assert!(sm.busy(), "an operation in flight for 20 ms");
    // The suspected hang brings the completions of the 7 operations before it that
    // thinning left out (the analyzer compares the ranks' last rounds), with their
    // counts and gaps, then the snapshot.
    assert_eq!(snaps.len(), 8);
    for (r, k) in snaps.iter().zip(c - 7..c) {
        assert_eq!(r.trace.unwrap().op_counter, k);
        assert_eq!(r.state, wire::OpState::Completed as i32);
        assert_eq!((r.start_ns, r.duration_ns), (k * 10_000, 5_000));
        // None of these rounds is in the sample, nor the one after each: their ends are
        // estimates, but for the one before an epoch boundary (the stride may change
        // there). A gap is measured only from a timed end (and the op log no longer holds
        // the operation before the first).
        let timed = |k: u64| (k + 1).is_multiple_of(thin::EPOCH_OPS);
        assert_eq!(r.duration_estimated, !timed(k), "op {k}");
        let gap = (k > c - 7 && timed(k - 1)).then_some(5_000);
        assert_eq!(r.gap_ns, gap, "op {k}");
        assert_eq!(r.channels[0].send_count, 1);
    }
    let snap = &snaps[7];
    assert_eq!(snap.state, wire::OpState::InFlight as i32);
    assert_eq!(snap.stride, stride);
    // Later snapshots of the same operation bring nothing again.
    let again = sm.sample(std::slice::from_ref(&s), start + 40_000_000);
    assert_eq!(again.len(), 1);
    // Its end is read from the clock although it is not in the sample.
    assert!(
        s.end_time(c, start, false, true).timed,
        "snapshotted round {c}"
    );
    let fin = s
        .op_log
        .finish(c, EndTime::exact(start + 2_000_000_000), true)
        .unwrap();
    assert!(s.thin_completion(&fin).is_some(), "snapshotted round {c}");
    // The next unselected round without a snapshot is left out; a failed one is not.
    // Neither d nor d + 1 is in the sample, so d's end is an estimate and the failed
    // round's computation gap is unknown; the failure itself is timed.
    let d = (c + 1..)
        .find(|&k| {
            (k..=k + 1).all(|j| !thin::selected(0xabc, j, stride) && j % thin::EPOCH_OPS != 0)
        })
        .unwrap();
    for k in c + 1..d {
        finish_op(
            &s,
            k,
            start + 2_001_000_000 + k,
            start + 2_001_000_000 + k + 1,
        );
    }
    let t0 = start + 2_010_000_000;
    assert_eq!(
        run_op(&s, d, t0, t0 + 1_000, true),
        (false, None),
        "round {d} left out"
    );
    let (timed, failed) = run_op(&s, d + 1, t0 + 2_000, t0 + 3_000, false);
    assert!(timed && s.end_time(d + 1, t0 + 2_000, false, false).timed);
    assert_eq!(failed.map(|t| t.gap.gap_ns), Some(None), "failed: reported");
}

#[test]
fn the_ends_timed_are_those_of_sampled_rounds_and_of_the_rounds_before_them() {
    // A fast rank (5 us operations every 10 us): after the first epoch, only the rounds
    // in the sample, the rounds before them and those before an epoch boundary are timed,
    // and every reported round after the first has the gap from a timed end.
    let s = src(0);
    let mut timed_ops = Vec::new();
    let mut reported = Vec::new();
    for c in 0..4_000u64 {
        let (timed, thinning) = run_op(&s, c, c * 10_000, c * 10_000 + 5_000, true);
        if timed {
            timed_ops.push(c);
        }
        if let Some(t) = thinning {
            reported.push(c);
            if c > 0 {
                assert_eq!(t.gap.gap_ns, Some(5_000), "op {c}");
            }
        }
    }
    let stride = s.thin.stride.load(Ordering::Relaxed);
    assert!(stride >= 256, "{stride}");
    for c in 64..4_000u64 {
        let want = thin::selected(0xabc, c, stride)
            || thin::selected(0xabc, c + 1, stride)
            || (c + 1) % thin::EPOCH_OPS == 0;
        assert_eq!(timed_ops.binary_search(&c).is_ok(), want, "op {c}");
    }
    let late = timed_ops.iter().filter(|&&c| c >= 64).count();
    assert!(late < 4_000 / 16, "{late} of the later rounds timed");
    assert!(reported.len() > thin::EPOCH_OPS as usize);
    // Untimed ends come from the diagnostic thread's latest tick (a global the thread of
    // another test may move meanwhile), never before the start.
    let untimed = (64..)
        .find(|c| timed_ops.binary_search(c).is_err())
        .unwrap();
    let late_start = u64::MAX / 2;
    assert_eq!(
        s.end_time(untimed, late_start, false, true),
        EndTime::estimate(late_start)
    );
    set_coarse_now(now_ns() + 1_000_000_000);
    let e = s.end_time(untimed, 1_000, false, true);
    set_coarse_now(0);
    assert!(!e.timed && e.ns > 1_000, "{e:?}");
    assert!(s.end_time(untimed, 1_000, true, true).timed);
}

#[test]
fn a_rank_idle_after_thinned_operations_reports_its_last_ones() {
    // Fast operations (stride well above 1), then the rank stops issuing (it does not
    // enter the next operation, or waits before it): after an in-flight period, the
    // thinned completions among its last 8 operations go out, once.
    let s = src(1);
    let mut left_out = Vec::new();
    for c in 0..200u64 {
        if finish_op(&s, c, c * 10_000, c * 10_000 + 5_000).is_none() {
            left_out.push(c);
        }
    }
    let last_end = 199 * 10_000 + 5_000;
    let cfg = DiagConfig {
        inflight: Duration::from_millis(10),
        ..DiagConfig::default()
    };
    let mut sm = Sampler::new(cfg);
    let one = std::slice::from_ref(&s);
    assert!(
        sm.sample(one, last_end + 5_000_000).is_empty(),
        "idle 5 ms: not yet"
    );
    let got: Vec<u64> = sm
        .sample(one, last_end + 10_000_000)
        .iter()
        .map(|r| r.trace.unwrap().op_counter)
        .collect();
    let want: Vec<u64> = left_out.into_iter().filter(|&c| c >= 192).collect();
    assert!(!want.is_empty());
    assert_eq!(got, want);
    assert!(!sm.busy());
    assert!(sm.sample(one, last_end + 30_000_000).is_empty(), "once");
}

#[test]
fn sampling_period_backs_off_while_nothing_runs_long() {
    let (base, max) = (Duration::from_millis(1), Duration::from_millis(50));
    let (mut p, mut q) = (base, 0);
    let mut seen = Vec::new();
    for _ in 0..40 {
        (p, q) = next_period(p, q, false, base, max);
        seen.push(p.as_millis());
    }
    // Doubles every QUIET_TICKS ticks: 1 (x3), 2 (x4), 4, ... up to 50.
    assert_eq!(&seen[..8], &[1, 1, 1, 2, 2, 2, 2, 4]);
    assert_eq!(*seen.last().unwrap(), 50);
    // One busy tick: straight back to the base period.
    assert_eq!(next_period(p, q, true, base, max), (base, 0));
    // A base period above the cap is kept.
    let long = Duration::from_millis(200);
    assert_eq!(next_period(long, 3, false, long, max).0, long);
}

#[test]
fn dropped_sources_unregister() {
    let s = src(0);
    let id = s.id;
    assert!(live_sources().iter().any(|x| x.id == id));
    drop(s);
    assert!(!live_sources().iter().any(|x| x.id == id));
}
