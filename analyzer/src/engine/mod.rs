//! The analyzer engine: per-communicator state, ingest, detection and location.
//!
//! Pure: no I/O and no clocks. Every call takes the analyzer's current time (`now_ns`,
//! nanoseconds on the analyzer's wall clock); the service owns the clock and the locking.
//! One `Engine` per shard (or per lock): it is `Send`, not internally synchronised.
//!
//! # State
//! Per communicator (grouped by the Trace ID's communicator id): per rank liveness (last
//! record or heartbeat), newest operation counter, last operation; a window of at most
//! `max_rounds_per_comm` rounds (operation counters), each with one compact entry per rank
//! (state, duration, counts, rates, waits, type set index). A round that every rank
//! completed is handed to slow detection and its buffer recycled; older rounds are evicted.
//! Rounds are held sparsely: a probe that thins its records (`OpRecord.stride`) reports the
//! same sample of rounds on every rank, so the rounds held skip the counters in between;
//! the computation gap then comes with the record (`OpRecord.gap_ns`).
//! Ingest is O(channels) per record and allocation-free in the steady state.
//!
//! # Hang (section 4.2.1)
//! A rank is in flight in a round from its analyzer-time start estimate, the minimum over
//! its snapshots of (receive time - reported duration): this is at most the first time the
//! analyzer saw it and keeps growing with `now` when the rank goes silent. The oldest round
//! in which some rank has been in flight longer than `hang_threshold` is hung, unless it is a
//! barrier (AllReduce below `barrier_max_bytes`, for every type set seen); location then runs
//! once for that round (one diagnosis per episode): [`crate::locate::locate_hang`]. A
//! point-to-point round involves only its reporters and their peers. For H3 the expected
//! SendCount/RecvCount of a rank are the probe's (schedule totals) or, when it sends none,
//! the rank's own counts in its latest completed operation with the same type set.
//!
//! # Slow (section 4.2.1)
//! Every fully completed, failure-free, non-barrier, non-p2p round with consistent type sets
//! feeds eq. (1)-(2) for its *operation kind* (collective, algorithm, size class of powers of
//! 4): the paper keeps one baseline per communicator; a communicator that mixes, say, 1 KiB
//! and 1 GiB operations would otherwise flag its large ones as slow. With a single kind (the
//! common case) this is exactly the paper's rule. Detection windows of `detect_window` are
//! aligned to the communicator's first appearance and closed by `tick` or by the first record
//! after their end; the kind with the largest R decides the window; `repeat_threshold`
//! consecutive slow windows run location once per episode ([`crate::detect::SlowStreak`]).
//! R uses the baseline in force when the widest round completed (static while r <= m).
//! A round's T_max leaves out the part of its entry skew that the latest entrant spent held
//! up in its other communicators (`OpRecord.elsewhere_ns`, [`detect::lateness_elsewhere`]):
//! that wait is the other communicator's slowness, not this one's.
//!
//! # Location latency
//! `Diagnosis::location_latency_ns` is the analyzer time from the moment the anomaly became
//! detectable (hang: onset + threshold; slow: end of the deciding window) to the diagnosis;
//! the CPU cost of the location step itself is `Evidence::location_cost_ns`, filled by
//! [`Engine::tick_with_clock`] with the caller's clock.
//!
//! # Rooms
//! This file holds the [`Engine`] itself: ingest, tick, queries. `config.rs` holds its
//! tunables, reject codes and statistics; `state.rs` the per-communicator state (rounds,
//! entries, ranks, operation kinds); `evidence.rs` hang and slow location with the
//! diagnosis' evidence and English text; `tests.rs` the unit tests.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::detect::{self, Baseline, SlowKind, SlowStreak};
use crate::locate::{self, ChanWait, HangFinding, HangState, HangView};
use crate::theta::{CommThreshold, ThetaConfig, WindowVerdict};
use crate::wire::{self, AnomalyClass, BaselineKind};

mod config;
mod evidence;
mod query;
mod state;
#[cfg(test)]
mod tests;

use config::*;
pub use config::{ConfigError, EngineConfig, EngineStats, Reject, WindowEval};
use evidence::*;
use state::*;

/// The analyzer core. See the module documentation.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    stats: EngineStats,
    comms: HashMap<u64, Comm>,
    pending: Vec<wire::Diagnosis>,
    incidents: crate::incident::Incidents,
    failures: crate::failure::Failures,
    window_log: Vec<WindowEval>,
    /// Clock (nanoseconds) measuring the location step's CPU cost where no clock is passed
    /// in: windows closed by a record in `ingest`, and `tick`.
    cost_clock: Option<fn() -> u64>,
    /// Hang checks wait until this time after [`Engine::note_pause`] (0: they do not).
    hang_blind_until_ns: u64,
}

/// Whether a gap of `gap` between two ticks meant to come every `every` means the ticking
/// process did not run (it was stopped, or starved of CPU): ten periods, and at least 1 s.
pub fn is_pause(gap: Duration, every: Duration) -> bool {
    gap >= every.saturating_mul(10).max(Duration::from_secs(1))
}

/// Per-record aggregates over the channels.
struct ChanSums {
    send: u64,
    recv: u64,
    exp_send: u64,
    exp_recv: u64,
    send_rate: f32,
    recv_rate: f32,
    wait_up: u64,
    wait_down: u64,
}

fn chan_sums(chs: &[wire::ChannelStat]) -> ChanSums {
    let mut s = ChanSums {
        send: 0,
        recv: 0,
        exp_send: 0,
        exp_recv: 0,
        send_rate: f32::INFINITY,
        recv_rate: f32::INFINITY,
        wait_up: 0,
        wait_down: 0,
    };
    for c in chs {
        s.send = s.send.saturating_add(c.send_count);
        s.recv = s.recv.saturating_add(c.recv_count);
        s.exp_send = s.exp_send.saturating_add(c.expected_send);
        s.exp_recv = s.exp_recv.saturating_add(c.expected_recv);
        s.send_rate = s.send_rate.min(c.send_rate as f32);
        s.recv_rate = s.recv_rate.min(c.recv_rate as f32);
        s.wait_up = s.wait_up.saturating_add(c.wait_upstream_ns.unwrap_or(0));
        s.wait_down = s
            .wait_down
            .saturating_add(c.wait_downstream_ns.unwrap_or(0));
    }
    if !s.send_rate.is_finite() {
        s.send_rate = 0.0;
    }
    if !s.recv_rate.is_finite() {
        s.recv_rate = 0.0;
    }
    s
}

/// FNV-1a over the tree layers: the comparison group of a rank (0 for ring).
fn layer_group(layers: &[u32]) -> u64 {
    if layers.is_empty() {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for l in layers {
        for b in l.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h | 1
}

fn check_enum<T: TryFrom<i32>>(v: i32, field: &'static str) -> Result<(), Reject> {
    T::try_from(v)
        .map(|_| ())
        .map_err(|_| Reject::UnknownEnum { field, value: v })
}

impl Engine {
    /// A new engine with `cfg`.
    pub fn new(cfg: EngineConfig) -> Engine {
        Engine {
            cfg,
            stats: EngineStats::default(),
            comms: HashMap::new(),
            pending: Vec::new(),
            incidents: crate::incident::Incidents::default(),
            failures: crate::failure::Failures::default(),
            window_log: Vec::new(),
            cost_clock: None,
            hang_blind_until_ns: 0,
        }
    }

    /// Measures every location step's CPU cost (`Evidence::location_cost_ns`) with `clock`,
    /// also where the caller passes none (windows closed by a record in [`Engine::ingest`],
    /// plain [`Engine::tick`]); [`Engine::tick_with_clock`]'s clock takes precedence.
    pub fn set_cost_clock(&mut self, clock: fn() -> u64) {
        self.cost_clock = Some(clock);
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Takes one record received at analyzer time `now_ns`. O(channels), no allocation in
    /// the steady state (round buffers are recycled).
    pub fn ingest(&mut self, rec: &wire::OpRecord, now_ns: u64) -> Result<(), Reject> {
        let r = self.ingest_inner(rec, now_ns);
        match r {
            Ok(()) => {
                self.stats.records += 1;
                if rec.state == wire::OpState::Failed as i32 && rec.failure != 0 {
                    self.failures.observe(rec, now_ns);
                }
            }
            Err(_) => self.stats.rejected += 1,
        }
        r
    }

    fn validate(&self, rec: &wire::OpRecord) -> Result<(u64, u64), Reject> {
        let trace = rec.trace.as_ref().ok_or(Reject::MissingTrace)?;
        let (comm_id, c) = (trace.comm_id, trace.op_counter);
        let op = rec.op.as_ref().ok_or(Reject::MissingOpTypeSet {
            comm_id,
            op_counter: c,
        })?;
        check_enum::<wire::CollKind>(op.collective, "collective")?;
        check_enum::<wire::Algorithm>(op.algorithm, "algorithm")?;
        check_enum::<wire::Protocol>(op.protocol, "protocol")?;
        check_enum::<wire::OpState>(rec.state, "state")?;
        if rec.nranks == 0 {
            return Err(Reject::ZeroRanks { comm_id });
        }
        if rec.nranks > self.cfg.max_ranks {
            return Err(Reject::TooManyRanks {
                comm_id,
                nranks: rec.nranks,
                max: self.cfg.max_ranks,
            });
        }
        if rec.rank >= rec.nranks {
            return Err(Reject::RankOutOfRange {
                comm_id,
                rank: rec.rank,
                nranks: rec.nranks,
            });
        }
        if rec.channels.len() > self.cfg.max_channels {
            return Err(Reject::TooManyChannels {
                got: rec.channels.len(),
                max: self.cfg.max_channels,
            });
        }
        if rec.duration_ns > dur_ns(self.cfg.max_duration)
            || rec.start_ns.checked_add(rec.duration_ns).is_none()
        {
            return Err(Reject::AbsurdDuration {
                comm_id,
                rank: rec.rank,
                op_counter: c,
                duration_ns: rec.duration_ns,
            });
        }
        for (i, ch) in rec.channels.iter().enumerate() {
            for (field, v) in [
                ("send_rate", ch.send_rate),
                ("recv_rate", ch.recv_rate),
                ("send_per_sec", ch.send_per_sec),
                ("recv_per_sec", ch.recv_per_sec),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(Reject::BadMetric {
                        comm_id,
                        rank: rec.rank,
                        channel: i,
                        field,
                    });
                }
            }
            for n in [ch.ring_prev, ch.ring_next].into_iter().flatten() {
                if n >= rec.nranks {
                    return Err(Reject::BadRingNeighbour {
                        comm_id,
                        rank: rec.rank,
                        neighbour: n,
                    });
                }
            }
        }
        Ok((comm_id, c))
    }

    fn ingest_inner(&mut self, rec: &wire::OpRecord, now_ns: u64) -> Result<(), Reject> {
        let (comm_id, c) = self.validate(rec)?;
        if rec.seq_space == wire::SeqSpace::P2p as i32 {
            return self.ingest_p2p_space(rec, comm_id, now_ns);
        }
        let Some(op) = rec.op.as_ref() else {
            return Err(Reject::MissingOpTypeSet {
                comm_id,
                op_counter: c,
            });
        };
        if !self.comms.contains_key(&comm_id) && self.comms.len() >= self.cfg.max_comms {
            return Err(Reject::TooManyComms {
                max: self.cfg.max_comms,
            });
        }
        let cfg = &self.cfg;
        let comm = self
            .comms
            .entry(comm_id)
            .or_insert_with(|| Comm::new(comm_id, rec.nranks, now_ns));
        if comm.nranks != rec.nranks {
            return Err(Reject::NranksMismatch {
                comm_id,
                got: rec.nranks,
                expected: comm.nranks,
            });
        }
        let rank = rec.rank;
        let ri = rank as usize;
        let skew = dur_ns(cfg.max_future_skew);
        {
            let info = &comm.ranks[ri];
            if let Some(newest) = info.newest_rec_op {
                if c.saturating_add(cfg.max_reorder) < newest {
                    return Err(Reject::CounterBackwards {
                        comm_id,
                        rank,
                        got: c,
                        newest,
                    });
                }
            }
            if let Some(prev_op) = info.last_start_op {
                if prev_op < c && rec.start_ns.saturating_add(skew) < info.last_op_start_ns {
                    return Err(Reject::ClockBackwards {
                        comm_id,
                        rank,
                        op_counter: c,
                        detail: "operation starts before an earlier operation of the rank",
                    });
                }
            }
        }
        let state = match rec.state {
            x if x == wire::OpState::Completed as i32 => ST_DONE,
            x if x == wire::OpState::Failed as i32 => ST_FAILED,
            _ => ST_INFLIGHT,
        };
        let nranks = comm.nranks;
        let max_rounds = cfg.max_rounds_per_comm;
        let Some(idx) = comm.round_index(c, max_rounds, &mut self.stats) else {
            // Round no longer held: liveness only.
            self.stats.stale_records += 1;
            Self::touch_rank(comm, rec, c, now_ns);
            return Ok(());
        };
        let mut entries = if comm.rounds[idx].entries.is_empty() && !comm.rounds[idx].finalized {
            Some(comm.take_entries())
        } else {
            None
        };
        let round = &mut comm.rounds[idx];
        if let Some(e) = entries.take() {
            round.entries = e;
            round.created_ns = now_ns;
        }
        if round.finalized {
            if state != ST_INFLIGHT {
                return Err(Reject::DuplicateCompleted {
                    comm_id,
                    rank,
                    op_counter: c,
                });
            }
            self.stats.stale_records += 1;
            Self::touch_rank(comm, rec, c, now_ns);
            return Ok(());
        }
        let e = round.entries[ri];
        if e.state == ST_DONE || e.state == ST_FAILED {
            if state != ST_INFLIGHT {
                return Err(Reject::DuplicateCompleted {
                    comm_id,
                    rank,
                    op_counter: c,
                });
            }
            // A late snapshot of an operation already completed: nothing to learn.
            self.stats.stale_records += 1;
            Self::touch_rank(comm, rec, c, now_ns);
            return Ok(());
        }
        let estimated = rec.duration_estimated && state == ST_DONE;
        // An estimated end may come out before the latest in-flight snapshot's clock
        // (the probe's estimate is up to a sampling period old): the snapshot's is the
        // better bound then.
        let duration_ns = if estimated {
            rec.duration_ns.max(e.duration_ns)
        } else {
            rec.duration_ns
        };
        if e.state == ST_INFLIGHT
            && !estimated
            && rec.duration_ns.saturating_add(skew) < e.duration_ns
        {
            return Err(Reject::ClockBackwards {
                comm_id,
                rank,
                op_counter: c,
                detail: "duration shorter than an earlier in-flight snapshot",
            });
        }
        // Type set.
        let tk = TypeKey::of(op);
        let type_idx = match round.types.iter().position(|t| *t == tk) {
            Some(i) => i as u16,
            None if round.types.len() <= MAX_ALT_TYPES => {
                round.types.push(tk);
                (round.types.len() - 1) as u16
            }
            None => MAX_ALT_TYPES as u16,
        };
        let sums = chan_sums(&rec.channels);
        let start_est = now_ns.saturating_sub(duration_ns).min(e.start_est_ns);
        let (gap_ns, elsewhere_ns) = if e.gap_ns != NO_GAP {
            (e.gap_ns, e.elsewhere_ns)
        } else if let Some(g) = rec.gap_ns {
            // Measured by the probe (thinned records are not consecutive; the time in the
            // rank's other communicators is left out of it).
            (g, rec.elsewhere_ns.unwrap_or(0))
        } else {
            let info = &comm.ranks[ri];
            match info.last_done_op {
                Some(p) if c > 0 && p == c - 1 && info.last_done_timed => {
                    (rec.start_ns.saturating_sub(info.last_done_end_ns), 0)
                }
                _ => (NO_GAP, 0),
            }
        };
        let ne = Entry {
            state,
            estimated,
            type_idx,
            send_rate: sums.send_rate,
            recv_rate: sums.recv_rate,
            start_est_ns: start_est,
            duration_ns,
            send: sums.send,
            recv: sums.recv,
            exp_send: sums.exp_send,
            exp_recv: sums.exp_recv,
            wait_up: sums.wait_up,
            wait_down: sums.wait_down,
            group: if op.algorithm == wire::Algorithm::Tree as i32 {
                layer_group(&op.tree_layer)
            } else {
                0
            },
            depth: op.tree_layer.iter().copied().max().unwrap_or(0),
            gap_ns,
            elsewhere_ns,
        };
        if e.state == ST_NONE {
            round.present += 1;
        }
        if e.state == ST_INFLIGHT {
            round.in_flight -= 1;
        }
        match state {
            ST_INFLIGHT => {
                round.in_flight += 1;
                round.earliest_ns = round.earliest_ns.min(start_est);
            }
            ST_DONE => round.done += 1,
            _ => round.failed += 1,
        }
        round.entries[ri] = ne;
        let mut all_done = round.done + round.failed == nranks;
        if !all_done
            && state != ST_INFLIGHT
            && round.p2p()
            && round.done + round.failed == round.present
        {
            // A point-to-point round is over when every participant (reporter or peer of a
            // reporter) completed.
            all_done = round.entries.iter().all(|x| {
                x.state == ST_NONE
                    || round
                        .types
                        .get(x.type_idx as usize)
                        .and_then(|t| usize::try_from(t.peer).ok())
                        .and_then(|p| round.entries.get(p))
                        .is_none_or(|pe| pe.state == ST_DONE || pe.state == ST_FAILED)
            });
        }
        comm.algo = op.algorithm;
        // Rank info.
        Self::touch_rank(comm, rec, c, now_ns);
        let info = &mut comm.ranks[ri];
        info.last_state = state;
        info.last_duration_ns = duration_ns;
        info.last_send = sums.send;
        info.last_recv = sums.recv;
        info.last_send_rate = sums.send_rate;
        info.last_recv_rate = sums.recv_rate;
        info.last_in_flight_start_est = if state == ST_INFLIGHT {
            start_est
        } else {
            u64::MAX
        };
        if info.last_start_op.is_none_or(|p| p <= c) {
            info.last_start_op = Some(c);
            info.last_op_start_ns = rec.start_ns;
        }
        if state == ST_DONE {
            if info.last_done_op.is_none_or(|p| p < c) {
                info.last_done_op = Some(c);
                info.last_done_end_ns = rec.start_ns.saturating_add(duration_ns);
                info.last_done_timed = !estimated;
            }
            info.done_ty = Some(tk);
            info.done_send = sums.send;
            info.done_recv = sums.recv;
        }
        if state == ST_DONE && !estimated {
            // The window's timing of this rank (CPU wait, frozen time, rates, per-channel
            // wait shares): timed completions only.
            let end = rec.start_ns.saturating_add(rec.duration_ns);
            if let Some(w) = rec.cpu_wait_ns {
                info.cpu_wait.observe(end, w);
            }
            if let Some(f) = rec.frozen_ns {
                info.frozen.observe(end, f);
            }
            info.win_ops += 1;
            info.win_send_rate += f64::from(sums.send_rate);
            info.win_recv_rate += f64::from(sums.recv_rate);
            if info.win_ch.len() < rec.channels.len() {
                info.win_ch.resize(rec.channels.len(), ChanAcc::default());
            }
            for (k, ch) in rec.channels.iter().enumerate() {
                let a = &mut info.win_ch[k];
                a.dur_ns = a.dur_ns.saturating_add(rec.duration_ns);
                if ch.wait_upstream_ns.is_some() || ch.wait_downstream_ns.is_some() {
                    a.has_wait = true;
                    a.up_ns = a.up_ns.saturating_add(ch.wait_upstream_ns.unwrap_or(0));
                    a.down_ns = a.down_ns.saturating_add(ch.wait_downstream_ns.unwrap_or(0));
                }
                if let Some(&w) = ch.ext.get(wire::EXT_WIRE_NS) {
                    if w.is_finite() && w >= 0.0 {
                        a.has_wire = true;
                        a.wire_ns = a.wire_ns.saturating_add(w as u64);
                    }
                }
                a.next = ch.ring_next.unwrap_or((rank + 1) % nranks);
            }
            if !rec.peer_wire.is_empty() {
                info.win_pw
                    .add(rec.duration_ns, &rec.peer_wire, rank, nranks);
            }
        }
        if all_done {
            self.finalize(comm_id, idx, now_ns);
        }
        match self.cost_clock {
            Some(mut f) => self.roll_windows(comm_id, now_ns, Some(&mut f)),
            None => self.roll_windows(comm_id, now_ns, None),
        }
        Ok(())
    }

    /// A record counted in the p2p sequence space (`SEQ_SPACE_P2P`): its counter is the
    /// rank's own p2p group count, not a collective round, so it never enters (or shifts)
    /// the collective rounds. It keeps the rank alive; failed ones are failure evidence.
    fn ingest_p2p_space(
        &mut self,
        rec: &wire::OpRecord,
        comm_id: u64,
        now_ns: u64,
    ) -> Result<(), Reject> {
        if !self.comms.contains_key(&comm_id) && self.comms.len() >= self.cfg.max_comms {
            return Err(Reject::TooManyComms {
                max: self.cfg.max_comms,
            });
        }
        let comm = self
            .comms
            .entry(comm_id)
            .or_insert_with(|| Comm::new(comm_id, rec.nranks, now_ns));
        if comm.nranks != rec.nranks {
            return Err(Reject::NranksMismatch {
                comm_id,
                got: rec.nranks,
                expected: comm.nranks,
            });
        }
        comm.last_seen_ns = comm.last_seen_ns.max(now_ns);
        let info = &mut comm.ranks[rec.rank as usize];
        if info.host != rec.host {
            info.host.clone_from(&rec.host);
        }
        info.pid = rec.pid;
        info.reported = true;
        info.last_seen_ns = info.last_seen_ns.max(now_ns);
        info.records += 1;
        comm.p2p.observe(rec);
        self.stats.p2p_space_records += 1;
        Ok(())
    }

    fn touch_rank(comm: &mut Comm, rec: &wire::OpRecord, c: u64, now_ns: u64) {
        comm.last_seen_ns = comm.last_seen_ns.max(now_ns);
        let info = &mut comm.ranks[rec.rank as usize];
        if info.host != rec.host {
            info.host.clone_from(&rec.host);
        }
        info.pid = rec.pid;
        info.reported = true;
        info.last_seen_ns = info.last_seen_ns.max(now_ns);
        info.records += 1;
        info.newest_op = Some(info.newest_op.map_or(c, |n| n.max(c)));
        info.newest_rec_op = Some(info.newest_rec_op.map_or(c, |n| n.max(c)));
    }

    /// Every rank completed (or failed) round `idx`: feed the slow detector.
    fn finalize(&mut self, comm_id: u64, idx: usize, now_ns: u64) {
        let cfg = &self.cfg;
        let Some(comm) = self.comms.get_mut(&comm_id) else {
            return;
        };
        let round = &mut comm.rounds[idx];
        round.finalized = true;
        let entries = std::mem::take(&mut round.entries);
        // A round is timed when every rank's duration was timed: a completion reported
        // with an estimated end (thinned, then backfilled) counts, but times nothing.
        let usable = round.failed == 0
            && !round.barrier(cfg.barrier_max_bytes)
            && !round.p2p()
            && round.types.len() == 1
            && entries.iter().all(|e| !e.estimated);
        let op_counter = round.op_counter;
        let ty = round.types.first().copied();
        comm.rounds_completed += 1;
        self.stats.rounds_completed += 1;
        let mut leftover = Some(entries);
        if let (true, Some(ty)) = (usable, ty) {
            let es = leftover.as_deref().unwrap_or(&[]);
            let t_max_raw = es.iter().map(|e| e.duration_ns).max().unwrap_or(0);
            let t_min = es.iter().map(|e| e.duration_ns).min().unwrap_or(0);
            // The others' wait for a latest entrant that another communicator held up is
            // not this communicator's slowness: that part of T_max goes (a TP partner
            // entering late from a slow DP operation; Holmes' cross-communicator rule for
            // slow rounds, issue 17 point 3).
            let held = round_elsewhere(es);
            let t_max = t_max_raw - held;
            let lateness = round_lateness(es);
            let ki = comm.kind_index(KindKey::of(&ty), cfg);
            let kind = &mut comm.kinds[ki];
            if let (Some(c), Some(last)) = (
                kind.calib.as_mut(),
                es.iter().position(|e| e.duration_ns == t_min),
            ) {
                // Does the last rank's own computation gap explain at least half of the
                // others' wait? (Unknown gaps: assumed so.)
                // A latest entrant held up elsewhere for half the skew or more is not.
                let explained = (held == 0 || 2 * held < t_max_raw - t_min)
                    && lateness.is_none_or(|l| 2 * l >= t_max - t_min);
                c.observe_explained(t_max, t_min, last, explained);
            }
            let (t_base_now, _, _) = kind.baseline.current();
            kind.longest_r = kind
                .longest_r
                .max(detect::slowdown_ratio(t_max, t_base_now));
            if t_max > t_base_now {
                kind.share.observe(t_max, t_min, t_base_now, lateness);
                if lateness.is_some_and(|l| l > 0) {
                    if let Some(j) = es.iter().position(|e| e.duration_ns == t_min) {
                        comm.ranks[j].win_last_in += 1;
                    }
                }
            }
            kind.baseline.observe(t_max, now_ns);
            if kind.best.would_take(t_max, t_min) {
                let (t_base_ns, baseline, m) = kind.baseline.current();
                let best = BestRound {
                    op_counter,
                    t_base_ns,
                    baseline,
                    m,
                    ty,
                    entries: leftover.take().unwrap_or_default(),
                };
                leftover = kind.best.offer(t_max, t_min, best).map(|b| b.entries);
            }
        }
        if let Some(v) = leftover {
            comm.recycle(v);
        }
        comm.pop_finalized();
    }

    /// Closes every detection window of `comm_id` that ended by `now_ns`. Diagnoses go to
    /// `self.pending`.
    fn roll_windows(&mut self, comm_id: u64, now_ns: u64, clock: Option<&mut dyn FnMut() -> u64>) {
        let window = dur_ns(self.cfg.detect_window).max(1);
        let Some(comm) = self.comms.get_mut(&comm_id) else {
            return;
        };
        if now_ns < comm.window_start_ns.saturating_add(window) {
            return;
        }
        let end = comm.window_start_ns.saturating_add(window);
        let cfg = &self.cfg;
        // Evaluate each op kind's widest round; the slowest kind decides.
        let mut worst: Option<(usize, f64, Option<JudgedRoot>)> = None;
        let mut longest: Option<(usize, f64)> = None;
        let mut any = false;
        for (i, k) in comm.kinds.iter_mut().enumerate() {
            let calibrated = k.calib.as_mut().map(|c| c.close_window(window));
            if let Some((t_max, t_min, b)) = k.best.get() {
                any = true;
                let r = detect::slowdown_ratio(*t_max, b.t_base_ns);
                let slow = window_is_slow(r, cfg.theta_slow, calibrated.as_ref());
                let judged = calibrated.as_ref().and_then(JudgedRoot::of);
                if cfg.record_windows {
                    self.window_log.push(WindowEval {
                        comm_id,
                        window_end_ns: end,
                        r,
                        t_base_ns: b.t_base_ns,
                        dynamic: b.baseline == BaselineKind::Dynamic,
                        t_max_ns: *t_max,
                        t_min_ns: *t_min,
                        calibrated,
                    });
                }
                if slow && worst.is_none_or(|(_, w, _)| r > w) {
                    worst = Some((i, r, judged));
                }
                if longest.is_none_or(|(_, l)| k.longest_r > l) {
                    longest = Some((i, k.longest_r));
                }
            }
        }
        // A rank whose process was frozen a good share of the window is the cause of any
        // slowdown the window shows (a round whose T_max alone has R > theta_slow), even
        // when the stops fell inside operations and left no entry skew for the verdicts.
        if let Some((li, lr)) = longest.filter(|&(_, r)| r > cfg.theta_slow) {
            if let Some(jr) = JudgedRoot::frozen_of(comm) {
                worst = Some((li, lr, Some(jr)));
            }
        }
        let verdict = if any { Some(worst.is_some()) } else { None };
        if verdict == Some(true) && comm.streak.count() == 0 {
            comm.slow_onset_ns = comm.window_start_ns;
        }
        let fire = comm.streak.window(verdict, cfg.repeat_threshold);
        if let (true, Some((ki, r, judged))) = (fire, worst) {
            let mut clock = clock;
            let start = clock.as_mut().map(|f| f());
            let mut d = locate_slow(cfg, comm, ki, r, judged, end, now_ns);
            if let (Some(s), Some(f)) = (start, clock.as_mut()) {
                if let Some(ev) = d.evidence.as_mut() {
                    ev.location_cost_ns = f().saturating_sub(s);
                }
            }
            comm.anomaly_ids.push(d.id.clone());
            if comm.anomaly_ids.len() > 64 {
                comm.anomaly_ids.remove(0);
            }
            d.detected_at_ns = now_ns;
            self.pending.push(d);
            self.stats.diagnoses += 1;
        }
        // Start the window containing now; reset accumulators and window bests.
        let skipped = (now_ns - comm.window_start_ns) / window;
        comm.window_start_ns = comm.window_start_ns.saturating_add(skipped * window);
        let mut freed = Vec::new();
        for k in &mut comm.kinds {
            k.share = detect::LatenessShare::default();
            k.longest_r = f64::NEG_INFINITY;
            if let Some((_, _, b)) = k.best.take() {
                freed.push(b.entries);
            }
        }
        for v in freed {
            comm.recycle(v);
        }
        for r in &mut comm.ranks {
            if r.win_ops > 0 {
                r.prev_ch.clone_from(&r.win_ch);
            }
            r.win_ops = 0;
            r.win_last_in = 0;
            r.cpu_wait.roll();
            r.frozen.roll();
            r.win_send_rate = 0.0;
            r.win_recv_rate = 0.0;
            let RankInfo {
                win_pw, prev_pw, ..
            } = r;
            win_pw.roll_into(prev_pw);
            for a in &mut r.win_ch {
                let next = a.next;
                *a = ChanAcc {
                    next,
                    ..ChanAcc::default()
                };
            }
        }
    }

    /// Takes one heartbeat received at `now_ns` (liveness and op counters of its ranks, and
    /// a rank's failed call while it carries one).
    /// Memberships naming an unknown communicator create it (so that a rank that never
    /// sent a record is known); invalid memberships are skipped.
    pub fn heartbeat(&mut self, hb: &wire::Heartbeat, now_ns: u64) {
        self.stats.heartbeats += 1;
        for m in &hb.ranks {
            if m.nranks == 0 || m.nranks > self.cfg.max_ranks || m.rank >= m.nranks {
                continue;
            }
            if !self.comms.contains_key(&m.comm_id) && self.comms.len() >= self.cfg.max_comms {
                continue;
            }
            let comm = self
                .comms
                .entry(m.comm_id)
                .or_insert_with(|| Comm::new(m.comm_id, m.nranks, now_ns));
            if comm.nranks != m.nranks {
                continue;
            }
            comm.last_seen_ns = comm.last_seen_ns.max(now_ns);
            let info = &mut comm.ranks[m.rank as usize];
            if info.host != hb.host {
                info.host.clone_from(&hb.host);
            }
            info.pid = hb.pid;
            info.reported = true;
            info.records_dropped = info.records_dropped.max(hb.records_dropped);
            info.last_seen_ns = info.last_seen_ns.max(now_ns);
            // The probe bounds it; a longer one (another sender) is cut, not refused.
            info.call_error = m.last_call_error.as_ref().map(|e| {
                e.chars()
                    .take(wire::MAX_CALL_ERROR_CHARS)
                    .collect::<String>()
            });
            if let Some(c) = m.last_op_counter {
                info.newest_op = Some(info.newest_op.map_or(c, |n| n.max(c)));
            }
        }
    }

    /// The caller's ticks stopped for a while ([`is_pause`]: its process was stopped or
    /// starved). What the engine holds is as old as the pause: an operation that every rank
    /// finished during it looks hung (some ranks' ends arrived, others' not yet), which
    /// would name a rank that only finished first. Hang checks wait one hang threshold from
    /// `now_ns`; the records that arrive meanwhile bring the state up to date, and a hang
    /// that lasts is named after the wait.
    pub fn note_pause(&mut self, now_ns: u64) {
        self.hang_blind_until_ns = now_ns.saturating_add(dur_ns(self.cfg.hang_threshold));
    }

    /// Runs detection and location at `now_ns`; returns the NEW diagnoses only (one per
    /// anomaly episode), ordered by communicator id.
    pub fn tick(&mut self, now_ns: u64) -> Vec<wire::Diagnosis> {
        match self.cost_clock {
            Some(mut f) => self.tick_inner(now_ns, Some(&mut f)),
            None => self.tick_inner(now_ns, None),
        }
    }

    /// Like [`Engine::tick`], with a clock used only to measure the cost of each location
    /// step (filled into `Evidence::location_cost_ns`); `clock` returns nanoseconds.
    pub fn tick_with_clock(
        &mut self,
        now_ns: u64,
        clock: &mut dyn FnMut() -> u64,
    ) -> Vec<wire::Diagnosis> {
        self.tick_inner(now_ns, Some(clock))
    }

    fn tick_inner(
        &mut self,
        now_ns: u64,
        mut clock: Option<&mut dyn FnMut() -> u64>,
    ) -> Vec<wire::Diagnosis> {
        let mut ids: Vec<u64> = self.comms.keys().copied().collect();
        ids.sort_unstable();
        let idle = dur_ns(self.cfg.comm_idle_evict);
        // Failed operations are direct evidence: diagnosed without the hang threshold.
        let comms = &self.comms;
        let failed = self.failures.due(now_ns, &|c, r| {
            let i = comms.get(&c)?.ranks.get(r as usize)?;
            i.reported.then(|| (i.pid, i.host.clone()))
        });
        for mut d in failed {
            if let Some(comm) = self.comms.get_mut(&d.comm_id) {
                comm.anomaly_ids.push(d.id.clone());
                if comm.anomaly_ids.len() > 64 {
                    comm.anomaly_ids.remove(0);
                }
            }
            d.detected_at_ns = now_ns;
            self.pending.push(d);
            self.stats.diagnoses += 1;
        }
        for id in ids {
            match clock.as_mut() {
                Some(f) => self.roll_windows(id, now_ns, Some(&mut **f)),
                None => self.roll_windows(id, now_ns, None),
            }
            let start = clock.as_mut().map(|f| f());
            let hang = if now_ns < self.hang_blind_until_ns {
                None
            } else {
                self.check_hang(id, now_ns)
            };
            // A failure episode of this communicator already names (or is about to name)
            // the cause: its hang is the same incident.
            let hang = hang.filter(|_| !self.failures.holds_back(id, now_ns));
            if let Some(mut d) = hang {
                if let (Some(s), Some(f)) = (start, clock.as_mut()) {
                    if let Some(ev) = d.evidence.as_mut() {
                        ev.location_cost_ns = f().saturating_sub(s);
                    }
                }
                self.pending.push(d);
                self.stats.diagnoses += 1;
            }
            if self
                .comms
                .get(&id)
                .is_some_and(|c| now_ns.saturating_sub(c.last_seen_ns) > idle)
            {
                self.comms.remove(&id);
                self.stats.comms_evicted += 1;
            }
        }
        let mut out = std::mem::take(&mut self.pending);
        out.sort_by_key(|d| d.comm_id);
        if !out.is_empty() {
            let view = self.proc_view();
            self.incidents.add(&out, &view, self.cfg.detect_window);
        }
        self.incidents.flush(now_ns);
        out
    }

    /// Every process's memberships and, per communicator, whether it is in flight in an
    /// operation (collective or Send/Recv) that some ranks have not entered (for
    /// [`crate::incident`]).
    fn proc_view(&self) -> crate::incident::ProcView {
        let mut v = crate::incident::ProcView::default();
        for comm in self.comms.values() {
            for (r, info) in comm.ranks.iter().enumerate() {
                if !info.reported || (info.pid == 0 && info.host.is_empty()) {
                    continue;
                }
                let p = (info.host.clone(), info.pid);
                v.ranks.insert((comm.id, r as u32), p.clone());
                let waiting = match (info.last_state, info.last_start_op) {
                    (ST_INFLIGHT, Some(c)) => waiting_for(comm, r, c),
                    _ => None,
                };
                v.procs.entry(p).or_default().push(crate::incident::Member {
                    comm_id: comm.id,
                    rank: r as u32,
                    nranks: comm.nranks,
                    waiting,
                    p2p_waiting: comm.p2p.waiting(r as u32),
                });
            }
        }
        v
    }

    /// Incidents made since the last call (each returned once): the first cause of the
    /// anomalies diagnosed by [`Engine::tick`], correlated across communicators
    /// ([`crate::incident`]). Call after `tick`.
    pub fn take_incidents(&mut self) -> Vec<wire::Incident> {
        self.incidents.take()
    }

    fn check_hang(&mut self, comm_id: u64, now_ns: u64) -> Option<wire::Diagnosis> {
        let cfg = &self.cfg;
        let thr = dur_ns(cfg.hang_threshold);
        let comm = self.comms.get_mut(&comm_id)?;
        let mut hung_idx = None;
        for (i, round) in comm.rounds.iter_mut().enumerate() {
            if round.finalized
                || round.earliest_ns == u64::MAX
                || now_ns.saturating_sub(round.earliest_ns) <= thr
            {
                continue;
            }
            // Candidate: recompute the exact earliest start among in-flight entries.
            let earliest = round
                .entries
                .iter()
                .filter(|e| e.state == ST_INFLIGHT)
                .map(|e| e.start_est_ns)
                .min()
                .unwrap_or(u64::MAX);
            round.earliest_ns = earliest;
            if earliest == u64::MAX || now_ns.saturating_sub(earliest) <= thr {
                continue;
            }
            // A barrier waits for the slowest rank's computation by design: it hangs only
            // when some rank has not reached it after twice the hang threshold.
            if round.barrier(cfg.barrier_max_bytes)
                && (round.present >= comm.nranks
                    || now_ns.saturating_sub(earliest) <= thr.saturating_mul(2))
            {
                continue;
            }
            hung_idx = Some(i);
            break;
        }
        let i = hung_idx?;
        let c = comm.rounds[i].op_counter;
        if comm.hang_round == Some(c) {
            return None;
        }
        comm.hang_round = Some(c);
        let mut d = locate_hang_round(cfg, comm, i, now_ns);
        d.detected_at_ns = now_ns;
        comm.anomaly_ids.push(d.id.clone());
        if comm.anomaly_ids.len() > 64 {
            comm.anomaly_ids.remove(0);
        }
        Some(d)
    }

    /// Counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Takes the log of closed windows (empty unless `record_windows`).
    pub fn take_window_log(&mut self) -> Vec<WindowEval> {
        std::mem::take(&mut self.window_log)
    }
}
