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
//!
//! # Location latency
//! `Diagnosis::location_latency_ns` is the analyzer time from the moment the anomaly became
//! detectable (hang: onset + threshold; slow: end of the deciding window) to the diagnosis;
//! the CPU cost of the location step itself is `Evidence::location_cost_ns`, filled by
//! [`Engine::tick_with_clock`] with the caller's clock.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::detect::{self, Baseline, SlowKind, SlowStreak};
use crate::locate::{self, ChanWait, HangFinding, HangState, HangView};
use crate::theta::{CommThreshold, ThetaConfig, WindowVerdict};
use crate::wire::{self, AnomalyClass, BaselineKind};

/// Tunables of detection and location (CCL-D section 4.2; design.md section 5).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// A rank in flight longer than this is hung (paper: 5 min).
    pub hang_threshold: Duration,
    /// An AllReduce moving at most this many bytes is a barrier (PyTorch's is 4 bytes): no
    /// slow detection; a hang only when some rank has not reached it after twice
    /// `hang_threshold`.
    pub barrier_max_bytes: u64,
    /// Static baseline T_base(init), used while r <= m (slow-at-start).
    pub t_base_init: Duration,
    /// Upper bound of m, the rounds averaged into the dynamic baseline (paper: 100).
    pub baseline_rounds_max: usize,
    /// Rounds finalized within this span after the first one count towards m (paper: 2 min).
    pub baseline_span: Duration,
    /// Slow detection window (paper: 1 min).
    pub detect_window: Duration,
    /// Slowdown ratio R above which a window is slow (paper: about 3, calibrated).
    pub theta_slow: f64,
    /// Consecutive slow windows required before location runs (transient jitter filter).
    pub repeat_threshold: u32,
    /// P below alpha: communication-slow (S2).
    pub alpha: f64,
    /// P above beta: computation-slow (S1).
    pub beta: f64,
    /// A rank with no record or heartbeat for this long is silent (stopped or dead).
    pub silent_after: Duration,
    /// Rounds held per communicator; older rounds are evicted.
    pub max_rounds_per_comm: usize,
    /// Largest accepted communicator size.
    pub max_ranks: u32,
    /// Tolerated backwards jump of a rank's clock between its consecutive operations, and of
    /// a completed record's duration against an earlier in-flight snapshot of the same op.
    pub max_future_skew: Duration,
    /// Largest accepted duration of one operation.
    pub max_duration: Duration,
    /// Largest accepted number of channels in one record.
    pub max_channels: usize,
    /// Communicators tracked at most (new ones are rejected beyond this).
    pub max_comms: usize,
    /// A record may be this many rounds older than the newest round its rank reported in a
    /// record (heartbeats, which run ahead of a backlog of records, do not count).
    pub max_reorder: u64,
    /// Communicators without any record or heartbeat for this long are dropped.
    pub comm_idle_evict: Duration,
    /// Distinct operation kinds (collective, algorithm, size class) with their own baseline
    /// per communicator; further kinds share one catch-all baseline.
    pub max_op_kinds: usize,
    /// Ranks listed individually in a diagnosis (roots, lagging, silent), at most.
    pub evidence_cap: usize,
    /// Keep a log of every closed detection window (for calibration), see
    /// [`Engine::take_window_log`].
    pub record_windows: bool,
    /// Self-calibrated slow rule per communicator and op kind ([`crate::theta`]): once a
    /// kind has enough clean rounds, a window is slow only when it is late or long against
    /// the kind's own history (its `long_ratio` is set from `theta_slow`). `None`: the
    /// paper's fixed rule (R of the widest round > `theta_slow`) alone.
    pub self_calibration: Option<ThetaConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            hang_threshold: Duration::from_secs(300),
            barrier_max_bytes: 4,
            t_base_init: Duration::from_secs(10),
            baseline_rounds_max: 100,
            baseline_span: Duration::from_secs(120),
            detect_window: Duration::from_secs(60),
            theta_slow: 3.0,
            repeat_threshold: 2,
            alpha: 0.4,
            beta: 0.6,
            silent_after: Duration::from_secs(60),
            max_rounds_per_comm: 64,
            max_ranks: 65_536,
            max_future_skew: Duration::from_secs(5),
            max_duration: Duration::from_secs(7 * 24 * 3600),
            max_channels: 64,
            max_comms: 100_000,
            max_reorder: 64,
            comm_idle_evict: Duration::from_secs(3600),
            max_op_kinds: 16,
            evidence_cap: 64,
            record_windows: false,
            self_calibration: Some(ThetaConfig::default()),
        }
    }
}

/// An [`EngineConfig`] value out of range (see [`EngineConfig::validate`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid analyzer setting {field}: {why}")]
pub struct ConfigError {
    /// Field name.
    pub field: &'static str,
    /// What is wrong.
    pub why: &'static str,
}

impl EngineConfig {
    /// Checks every value; the service calls it after mapping its settings (e.g.
    /// `CCLD_HANG_TIMEOUT_S`, `CCLD_SLOW_WINDOW_S`, `CCLD_SLOW_THETA`) onto the config.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, why| Err(ConfigError { field, why });
        if self.hang_threshold.is_zero() {
            return bad("hang_threshold", "must be > 0");
        }
        if self.detect_window.is_zero() {
            return bad("detect_window", "must be > 0");
        }
        if self.t_base_init.is_zero() {
            return bad("t_base_init", "must be > 0");
        }
        if self.baseline_rounds_max == 0 {
            return bad("baseline_rounds_max", "must be >= 1");
        }
        if self.theta_slow.is_nan() || self.theta_slow <= 0.0 {
            return bad(
                "theta_slow",
                "must be > 0 (or +inf to disable slow detection)",
            );
        }
        if self.repeat_threshold == 0 {
            return bad("repeat_threshold", "must be >= 1");
        }
        if !(0.0..=1.0).contains(&self.alpha) || !(0.0..=1.0).contains(&self.beta) {
            return bad("alpha/beta", "must be within [0, 1]");
        }
        if self.alpha > self.beta {
            return bad("alpha/beta", "alpha must not exceed beta");
        }
        if self.silent_after.is_zero() {
            return bad("silent_after", "must be > 0");
        }
        if self.max_rounds_per_comm == 0 || self.max_ranks == 0 || self.max_comms == 0 {
            return bad("max_rounds_per_comm/max_ranks/max_comms", "must be >= 1");
        }
        if self.max_channels == 0 || self.max_op_kinds == 0 || self.evidence_cap == 0 {
            return bad("max_channels/max_op_kinds/evidence_cap", "must be >= 1");
        }
        if let Some(t) = &self.self_calibration {
            if t.validate().is_err() {
                return bad(
                    "self_calibration",
                    "history, min_history, k, rel_floor and root_share out of range",
                );
            }
        }
        Ok(())
    }
}

/// Why a record was refused. `Display` gives the message the service returns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// The record has no Trace ID.
    #[error("record without trace id")]
    MissingTrace,
    /// The record has no operation type set.
    #[error("record for comm {comm_id:#x} op {op_counter} without operation type set")]
    MissingOpTypeSet {
        /// Communicator.
        comm_id: u64,
        /// Round.
        op_counter: u64,
    },
    /// nranks is zero.
    #[error("comm {comm_id:#x}: nranks is 0")]
    ZeroRanks {
        /// Communicator.
        comm_id: u64,
    },
    /// nranks above the configured maximum.
    #[error("comm {comm_id:#x}: nranks {nranks} exceeds the limit {max}")]
    TooManyRanks {
        /// Communicator.
        comm_id: u64,
        /// Claimed size.
        nranks: u32,
        /// Limit.
        max: u32,
    },
    /// rank >= nranks.
    #[error("comm {comm_id:#x}: rank {rank} out of range for nranks {nranks}")]
    RankOutOfRange {
        /// Communicator.
        comm_id: u64,
        /// Rank claimed.
        rank: u32,
        /// Size claimed.
        nranks: u32,
    },
    /// The communicator is known with another size.
    #[error("comm {comm_id:#x}: nranks {got} differs from the known size {expected}")]
    NranksMismatch {
        /// Communicator.
        comm_id: u64,
        /// Size in this record.
        got: u32,
        /// Size known.
        expected: u32,
    },
    /// The rank already reported a much newer round.
    #[error(
        "comm {comm_id:#x} rank {rank}: op counter {got} is behind the rank's newest {newest}"
    )]
    CounterBackwards {
        /// Communicator.
        comm_id: u64,
        /// Rank.
        rank: u32,
        /// Counter of this record.
        got: u64,
        /// Newest counter reported by the rank.
        newest: u64,
    },
    /// A second completed record for the same rank and round.
    #[error("comm {comm_id:#x} rank {rank}: duplicate completed record for op {op_counter}")]
    DuplicateCompleted {
        /// Communicator.
        comm_id: u64,
        /// Rank.
        rank: u32,
        /// Round.
        op_counter: u64,
    },
    /// Duration beyond `max_duration`, or start + duration overflowing.
    #[error("comm {comm_id:#x} rank {rank} op {op_counter}: absurd duration {duration_ns} ns")]
    AbsurdDuration {
        /// Communicator.
        comm_id: u64,
        /// Rank.
        rank: u32,
        /// Round.
        op_counter: u64,
        /// Duration claimed.
        duration_ns: u64,
    },
    /// The rank's clock ran backwards (start of a later op before an earlier one, or a
    /// completed duration shorter than an earlier in-flight snapshot) beyond the tolerance.
    #[error("comm {comm_id:#x} rank {rank} op {op_counter}: inconsistent timestamps ({detail})")]
    ClockBackwards {
        /// Communicator.
        comm_id: u64,
        /// Rank.
        rank: u32,
        /// Round.
        op_counter: u64,
        /// What went backwards.
        detail: &'static str,
    },
    /// An enum field holds a value the wire format does not define.
    #[error("unknown {field} value {value}")]
    UnknownEnum {
        /// Field name.
        field: &'static str,
        /// Raw value.
        value: i32,
    },
    /// More channels than `max_channels`.
    #[error("{got} channels exceed the limit {max}")]
    TooManyChannels {
        /// Channels in the record.
        got: usize,
        /// Limit.
        max: usize,
    },
    /// A ring neighbour outside the communicator.
    #[error("comm {comm_id:#x} rank {rank}: ring neighbour {neighbour} out of range")]
    BadRingNeighbour {
        /// Communicator.
        comm_id: u64,
        /// Rank.
        rank: u32,
        /// Neighbour claimed.
        neighbour: u32,
    },
    /// A metric is negative, NaN or infinite.
    #[error("comm {comm_id:#x} rank {rank}: bad {field} value in channel {channel}")]
    BadMetric {
        /// Communicator.
        comm_id: u64,
        /// Rank.
        rank: u32,
        /// Channel index.
        channel: usize,
        /// Field name.
        field: &'static str,
    },
    /// The analyzer already tracks `max_comms` communicators.
    #[error("too many communicators (limit {max})")]
    TooManyComms {
        /// Limit.
        max: usize,
    },
}

impl Reject {
    /// A short stable label for the reason (metrics label), e.g. `"rank_out_of_range"`.
    pub fn code(&self) -> &'static str {
        match self {
            Reject::MissingTrace => "missing_trace",
            Reject::MissingOpTypeSet { .. } => "missing_op_type_set",
            Reject::ZeroRanks { .. } => "zero_ranks",
            Reject::TooManyRanks { .. } => "too_many_ranks",
            Reject::RankOutOfRange { .. } => "rank_out_of_range",
            Reject::NranksMismatch { .. } => "nranks_mismatch",
            Reject::CounterBackwards { .. } => "counter_backwards",
            Reject::DuplicateCompleted { .. } => "duplicate_completed",
            Reject::AbsurdDuration { .. } => "absurd_duration",
            Reject::ClockBackwards { .. } => "clock_backwards",
            Reject::UnknownEnum { .. } => "unknown_enum",
            Reject::TooManyChannels { .. } => "too_many_channels",
            Reject::BadRingNeighbour { .. } => "bad_ring_neighbour",
            Reject::BadMetric { .. } => "bad_metric",
            Reject::TooManyComms { .. } => "too_many_comms",
        }
    }
}

/// One closed detection window (for calibration), see [`EngineConfig::record_windows`].
#[derive(Clone, Debug, PartialEq)]
pub struct WindowEval {
    /// Communicator.
    pub comm_id: u64,
    /// Window end, analyzer time.
    pub window_end_ns: u64,
    /// Slowdown ratio R of the window's widest round.
    pub r: f64,
    /// Baseline used.
    pub t_base_ns: u64,
    /// True when the baseline was the dynamic one.
    pub dynamic: bool,
    /// T_max and T_min of the widest round.
    pub t_max_ns: u64,
    /// T_min of the widest round.
    pub t_min_ns: u64,
    /// The self-calibrated judgement of the window, when enabled.
    pub calibrated: Option<WindowVerdict>,
}

/// Counters of the engine (for metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Records accepted.
    pub records: u64,
    /// Records refused.
    pub rejected: u64,
    /// Records for rounds no longer held (accepted, only liveness updated).
    pub stale_records: u64,
    /// Heartbeats processed.
    pub heartbeats: u64,
    /// Rounds evicted before every rank completed them.
    pub rounds_evicted_incomplete: u64,
    /// Rounds completed by every rank.
    pub rounds_completed: u64,
    /// Diagnoses emitted.
    pub diagnoses: u64,
    /// Communicators dropped for idleness.
    pub comms_evicted: u64,
    /// Records of the p2p sequence space (liveness only, never a collective round).
    pub p2p_space_records: u64,
}

fn dur_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

const ST_NONE: u8 = 0;
const ST_INFLIGHT: u8 = 1;
const ST_DONE: u8 = 2;
const ST_FAILED: u8 = 3;
const NO_TYPE: u16 = u16::MAX;
const MAX_ALT_TYPES: usize = 15;

/// The comparable part of an op type set (tree layers excluded: they differ per rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct TypeKey {
    coll: i32,
    algo: i32,
    proto: i32,
    dtype: u32,
    count: u64,
    bytes: u64,
    redop: i32,
    root: i32,
    peer: i32,
    n_channels: u32,
}

impl TypeKey {
    fn of(o: &wire::OpTypeSet) -> Self {
        TypeKey {
            coll: o.collective,
            algo: o.algorithm,
            proto: o.protocol,
            dtype: o.dtype,
            count: o.count,
            bytes: o.bytes,
            redop: o.redop,
            root: o.root,
            peer: o.peer,
            n_channels: o.n_channels,
        }
    }

    fn to_wire(self) -> wire::OpTypeSet {
        wire::OpTypeSet {
            collective: self.coll,
            algorithm: self.algo,
            protocol: self.proto,
            dtype: self.dtype,
            count: self.count,
            bytes: self.bytes,
            redop: self.redop,
            root: self.root,
            peer: self.peer,
            n_channels: self.n_channels,
            tree_layer: Vec::new(),
        }
    }

    /// Send/Recv only. AlltoAll, Gather and Scatter run on the p2p engine (algorithm P2p)
    /// but are collectives: every rank takes part, so a rank that never enters is missing
    /// and their rounds feed slow detection like the ring collectives.
    fn p2p(&self) -> bool {
        self.coll == wire::CollKind::Send as i32 || self.coll == wire::CollKind::Recv as i32
    }
}

/// Operation kind with its own baseline: collective, algorithm, size class (power of 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KindKey {
    coll: i32,
    algo: i32,
    size_class: u8,
}

impl KindKey {
    fn of(t: &TypeKey) -> Self {
        let bits = 64 - t.bytes.leading_zeros();
        KindKey {
            coll: t.coll,
            algo: t.algo,
            size_class: (bits / 2) as u8,
        }
    }
}

/// One rank's record of one round, compacted.
#[derive(Clone, Copy, Debug)]
struct Entry {
    state: u8,
    type_idx: u16,
    send_rate: f32,
    recv_rate: f32,
    start_est_ns: u64,
    duration_ns: u64,
    send: u64,
    recv: u64,
    exp_send: u64,
    exp_recv: u64,
    wait_up: u64,
    wait_down: u64,
    group: u64,
    depth: u32,
    /// Time between the end of the rank's previous operation on the communicator and the
    /// start of this one (its computation gap); `NO_GAP` when unknown.
    gap_ns: u64,
}

/// `Entry::gap_ns` when the rank's previous operation is unknown.
const NO_GAP: u64 = u64::MAX;

/// The latest entrant's computation lateness in a round ([`detect::computation_lateness`]).
fn round_lateness(es: &[Entry]) -> Option<u64> {
    let durations: Vec<u64> = es.iter().map(|e| e.duration_ns).collect();
    let gaps: Vec<Option<u64>> = es
        .iter()
        .map(|e| (e.gap_ns != NO_GAP).then_some(e.gap_ns))
        .collect();
    detect::computation_lateness(&durations, &gaps)
}

impl Default for Entry {
    fn default() -> Self {
        Entry {
            state: ST_NONE,
            type_idx: NO_TYPE,
            send_rate: 0.0,
            recv_rate: 0.0,
            start_est_ns: u64::MAX,
            duration_ns: 0,
            send: 0,
            recv: 0,
            exp_send: 0,
            exp_recv: 0,
            wait_up: 0,
            wait_down: 0,
            group: 0,
            depth: 0,
            gap_ns: NO_GAP,
        }
    }
}

#[derive(Debug)]
struct Round {
    op_counter: u64,
    entries: Vec<Entry>,
    created_ns: u64,
    present: u32,
    done: u32,
    failed: u32,
    in_flight: u32,
    types: Vec<TypeKey>,
    /// Cached lower bound of the start estimate of any in-flight entry (u64::MAX: none).
    earliest_ns: u64,
    finalized: bool,
}

impl Round {
    fn new(op_counter: u64) -> Self {
        Round {
            op_counter,
            entries: Vec::new(),
            created_ns: 0,
            present: 0,
            done: 0,
            failed: 0,
            in_flight: 0,
            types: Vec::new(),
            earliest_ns: u64::MAX,
            finalized: false,
        }
    }

    fn barrier(&self, max_bytes: u64) -> bool {
        !self.types.is_empty()
            && self
                .types
                .iter()
                .all(|t| detect::is_barrier(t.coll, t.bytes, max_bytes))
    }

    fn p2p(&self) -> bool {
        self.types.first().is_some_and(TypeKey::p2p)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct ChanAcc {
    up_ns: u64,
    down_ns: u64,
    dur_ns: u64,
    next: u32,
    has_wait: bool,
}

#[derive(Debug)]
struct RankInfo {
    host: String,
    pid: u32,
    reported: bool,
    newest_op: Option<u64>,
    /// Newest operation counter seen in this rank's records (heartbeats excluded).
    newest_rec_op: Option<u64>,
    last_seen_ns: u64,
    last_state: u8,
    last_op_start_ns: u64,
    last_start_op: Option<u64>,
    last_duration_ns: u64,
    last_send: u64,
    last_recv: u64,
    last_send_rate: f32,
    last_recv_rate: f32,
    last_in_flight_start_est: u64,
    /// Newest completed operation of the rank and its end on the rank's clock (start +
    /// duration): the reference of the next operation's computation gap.
    last_done_op: Option<u64>,
    last_done_end_ns: u64,
    /// Type set and counts of the rank's latest completed operation: the expected counts of
    /// a hung operation of the same type set when the probe does not report them.
    done_ty: Option<TypeKey>,
    done_send: u64,
    done_recv: u64,
    records: u64,
    /// Records the rank's process reported dropped (heartbeat, cumulative).
    records_dropped: u64,
    win_ops: u32,
    /// Rounds of the window that this rank entered last, with a positive lateness.
    win_last_in: u32,
    win_send_rate: f64,
    win_recv_rate: f64,
    win_ch: Vec<ChanAcc>,
    /// The rank's threads' CPU wait (`OpRecord.cpu_wait_ns`).
    cpu_wait: WindowShare,
    /// The time its process was frozen (`OpRecord.frozen_ns`).
    frozen: WindowShare,
}

/// Shortest span over which a rank's share of the window ([`WindowShare`]) is computed.
const SHARE_MIN_SPAN_NS: u64 = 100_000_000;

/// A cumulative time a rank's records carry (CPU wait, frozen time), read at the ends of
/// its completed operations: (end on the rank's clock, total) of the last one before the
/// window and of the newest one. Its growth over that span is the share of the window.
#[derive(Clone, Copy, Debug, Default)]
struct WindowShare {
    from: Option<(u64, u64)>,
    to: Option<(u64, u64)>,
}

impl WindowShare {
    fn observe(&mut self, end_ns: u64, total: u64) {
        self.to = Some((end_ns, total));
        self.from.get_or_insert((end_ns, total));
    }

    /// A new window starts at the newest reading.
    fn roll(&mut self) {
        self.from = self.to;
    }

    /// The share, `None` when unknown or the span is shorter than [`SHARE_MIN_SPAN_NS`].
    fn share(&self) -> Option<f64> {
        let ((t0, w0), (t1, w1)) = (self.from?, self.to?);
        let span = t1.checked_sub(t0)?;
        (span >= SHARE_MIN_SPAN_NS).then(|| (w1.saturating_sub(w0) as f64 / span as f64).min(1.0))
    }
}

impl RankInfo {
    fn new() -> Self {
        RankInfo {
            host: String::new(),
            pid: 0,
            reported: false,
            newest_op: None,
            newest_rec_op: None,
            last_seen_ns: 0,
            last_state: ST_NONE,
            last_op_start_ns: 0,
            last_start_op: None,
            last_duration_ns: 0,
            last_send: 0,
            last_recv: 0,
            last_send_rate: 0.0,
            last_recv_rate: 0.0,
            last_in_flight_start_est: u64::MAX,
            last_done_op: None,
            last_done_end_ns: 0,
            done_ty: None,
            done_send: 0,
            done_recv: 0,
            records: 0,
            records_dropped: 0,
            win_ops: 0,
            win_last_in: 0,
            win_send_rate: 0.0,
            win_recv_rate: 0.0,
            win_ch: Vec::new(),
            cpu_wait: WindowShare::default(),
            frozen: WindowShare::default(),
        }
    }

    /// Share of the window this rank's threads waited for a CPU (runnable, not running);
    /// `None` when unknown or the span is short.
    fn win_cpu_wait(&self) -> Option<f64> {
        self.cpu_wait.share()
    }

    /// Share of the window this rank's process was frozen; `None` when unknown or the span
    /// is short.
    fn win_frozen(&self) -> Option<f64> {
        self.frozen.share()
    }

    fn silent(&self, now_ns: u64, silent_after_ns: u64) -> bool {
        !self.reported || now_ns.saturating_sub(self.last_seen_ns) > silent_after_ns
    }
}

/// The widest round of a window for one op kind (eq. 2), with its per-rank detail.
#[derive(Debug)]
struct BestRound {
    op_counter: u64,
    t_base_ns: u64,
    baseline: BaselineKind,
    m: u32,
    ty: TypeKey,
    entries: Vec<Entry>,
}

#[derive(Debug)]
struct OpKind {
    key: KindKey,
    baseline: Baseline,
    best: detect::WindowBest<BestRound>,
    /// The window's adjusted P over all its rounds (reset with `best`).
    share: detect::LatenessShare,
    /// The largest R of the window's rounds by their T_max alone (eq. 2 against the T_base
    /// of the moment; reset with `best`): a round every rank spent long in, with no entry
    /// skew, is not the widest round but shows a slowdown all the same.
    longest_r: f64,
    /// The self-calibrated threshold (None when disabled or for 1-rank communicators).
    calib: Option<CommThreshold>,
}

#[derive(Debug)]
struct Comm {
    id: u64,
    nranks: u32,
    ranks: Vec<RankInfo>,
    /// Rounds held, sorted by counter (not necessarily consecutive).
    rounds: VecDeque<Round>,
    /// Lowest counter still accepted: every round below it was finalized or evicted.
    base: u64,
    spare: Vec<Vec<Entry>>,
    kinds: Vec<OpKind>,
    created_ns: u64,
    last_seen_ns: u64,
    window_start_ns: u64,
    streak: SlowStreak,
    slow_onset_ns: u64,
    hang_round: Option<u64>,
    rounds_completed: u64,
    anomaly_ids: Vec<String>,
    algo: i32,
    /// Send/Recv groups in flight and the pair sequences entered (incident correlation).
    p2p: crate::p2pwait::P2pWaits,
}

impl Comm {
    fn new(id: u64, nranks: u32, now_ns: u64) -> Self {
        Comm {
            id,
            nranks,
            ranks: (0..nranks).map(|_| RankInfo::new()).collect(),
            rounds: VecDeque::new(),
            base: 0,
            spare: Vec::new(),
            kinds: Vec::new(),
            created_ns: now_ns,
            last_seen_ns: now_ns,
            window_start_ns: now_ns,
            streak: SlowStreak::default(),
            slow_onset_ns: 0,
            hang_round: None,
            rounds_completed: 0,
            anomaly_ids: Vec::new(),
            algo: 0,
            p2p: crate::p2pwait::P2pWaits::default(),
        }
    }

    fn take_entries(&mut self) -> Vec<Entry> {
        let n = self.nranks as usize;
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.resize(n, Entry::default());
        v
    }

    fn recycle(&mut self, mut v: Vec<Entry>) {
        if v.capacity() > 0 && self.spare.len() < 4 {
            v.clear();
            self.spare.push(v);
        }
    }

    /// The index of round `c` in `rounds` (created if new), or `None` when the round is
    /// no longer held (finalized and dropped, or older than every held round while the
    /// store is full). Rounds are held sparsely, sorted by counter: thinned reporters
    /// (`OpRecord.stride`) report only some rounds, so the counters held need not be
    /// consecutive. Beyond `max_rounds` held rounds the oldest is evicted.
    fn round_index(&mut self, c: u64, max_rounds: usize, stats: &mut EngineStats) -> Option<usize> {
        if c < self.base {
            return None;
        }
        let mut idx = if self.rounds.back().is_none_or(|b| b.op_counter < c) {
            self.rounds.push_back(Round::new(c));
            self.rounds.len() - 1
        } else {
            match self.rounds.binary_search_by_key(&c, |r| r.op_counter) {
                Ok(i) => i,
                Err(i) => {
                    self.rounds.insert(i, Round::new(c));
                    i
                }
            }
        };
        while self.rounds.len() > max_rounds.max(1) {
            if let Some(r) = self.rounds.pop_front() {
                self.base = r.op_counter + 1;
                self.evict(r, stats);
            }
            if idx == 0 {
                // The new round was the oldest: dropped at once.
                return None;
            }
            idx -= 1;
        }
        Some(idx)
    }

    fn evict(&mut self, r: Round, stats: &mut EngineStats) {
        if !r.finalized && r.present > 0 {
            stats.rounds_evicted_incomplete += 1;
        }
        self.recycle(r.entries);
    }

    fn pop_finalized(&mut self) {
        while self.rounds.front().is_some_and(|r| r.finalized) {
            if let Some(r) = self.rounds.pop_front() {
                self.base = r.op_counter + 1;
                self.recycle(r.entries);
            }
        }
    }

    fn kind_index(&mut self, key: KindKey, cfg: &EngineConfig) -> usize {
        if let Some(i) = self.kinds.iter().position(|k| k.key == key) {
            return i;
        }
        if self.kinds.len() >= cfg.max_op_kinds.max(1) {
            // Catch-all: the last kind absorbs further ones.
            return self.kinds.len() - 1;
        }
        self.kinds.push(OpKind {
            key,
            baseline: Baseline::new(
                dur_ns(cfg.t_base_init),
                cfg.baseline_rounds_max,
                dur_ns(cfg.baseline_span),
            ),
            best: detect::WindowBest::new(),
            share: detect::LatenessShare::default(),
            longest_r: f64::NEG_INFINITY,
            calib: self_calibration(cfg, self.nranks),
        });
        self.kinds.len() - 1
    }

    fn heap_bytes(&self) -> usize {
        let e = std::mem::size_of::<Entry>();
        let rounds: usize = self
            .rounds
            .iter()
            .map(|r| r.entries.capacity() * e + r.types.capacity() * 64)
            .sum::<usize>()
            + self.rounds.capacity() * std::mem::size_of::<Round>();
        let ranks: usize = self
            .ranks
            .iter()
            .map(|r| {
                std::mem::size_of::<RankInfo>()
                    + r.host.capacity()
                    + r.win_ch.capacity() * std::mem::size_of::<ChanAcc>()
            })
            .sum();
        let spare: usize = self.spare.iter().map(|v| v.capacity() * e).sum();
        let kinds: usize = self
            .kinds
            .iter()
            .map(|k| {
                std::mem::size_of::<OpKind>()
                    + k.best.get().map_or(0, |b| b.2.entries.capacity() * e)
                    + k.calib.as_ref().map_or(0, CommThreshold::heap_bytes)
            })
            .sum();
        let ids: usize = self.anomaly_ids.iter().map(|s| s.capacity() + 24).sum();
        rounds + ranks + spare + kinds + ids + std::mem::size_of::<Comm>()
    }
}

/// The self-calibrated threshold of a new op kind, or `None` (disabled, slow detection
/// off, or a 1-rank communicator).
fn self_calibration(cfg: &EngineConfig, nranks: u32) -> Option<CommThreshold> {
    let t = cfg.self_calibration.as_ref()?;
    if !cfg.theta_slow.is_finite() {
        return None;
    }
    let t = ThetaConfig {
        long_ratio: cfg.theta_slow,
        ..t.clone()
    };
    CommThreshold::new(t, nranks as usize).ok()
}

/// The rank a self-calibrated window verdict is late with: location names it rather than
/// the widest round's latecomer. The widest round of a window can belong to a victim (a
/// rank whose Send was held up by the late rank, or whose other communicator waited for
/// it), while the verdict counted the whole window's rounds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct JudgedRoot {
    rank: u32,
    by: JudgedBy,
}

/// What found a [`JudgedRoot`].
#[derive(Clone, Copy, Debug, PartialEq)]
enum JudgedBy {
    /// The window's medians (dominant or significant latecomer): it entered last in
    /// `last_in` of the window's `rounds` rounds.
    Median { last_in: usize, rounds: usize },
    /// The blame rule (its extreme rounds), likewise counted.
    Blame { last_in: usize, rounds: usize },
    /// Its process's frozen time: its share of the window and the ranks' median share.
    Frozen { share: f64, median: f64 },
}

impl JudgedRoot {
    fn of(v: &WindowVerdict) -> Option<JudgedRoot> {
        let rank = u32::try_from(v.root?).ok()?;
        let (last_in, rounds) = (v.root_last_in, v.rounds);
        v.late.then_some(JudgedRoot {
            rank,
            by: if v.blamed {
                JudgedBy::Blame { last_in, rounds }
            } else {
                JudgedBy::Median { last_in, rounds }
            },
        })
    }

    /// The most frozen rank of `comm`'s window (see [`locate::frozen`]), if one stands out.
    fn frozen_of(comm: &Comm) -> Option<JudgedRoot> {
        let shares: Vec<Option<f64>> = comm.ranks.iter().map(RankInfo::win_frozen).collect();
        let rank = *locate::frozen(&shares).first()?;
        let mut known: Vec<f64> = shares.iter().flatten().copied().collect();
        Some(JudgedRoot {
            rank,
            by: JudgedBy::Frozen {
                share: shares[rank as usize].unwrap_or(0.0),
                median: locate::median(&mut known),
            },
        })
    }

    fn frozen(&self) -> bool {
        matches!(self.by, JudgedBy::Frozen { .. })
    }

    fn reason(&self) -> String {
        match self.by {
            JudgedBy::Frozen { share, median } => format!(
                "its process was frozen {:.0}% of the window (neither running nor waiting for a CPU; median of the ranks {:.0}%): stopped (SIGSTOP, a debugger, a cgroup freezer) or swapping, while its peers waited for it",
                share * 100.0,
                median * 100.0
            ),
            JudgedBy::Blame { last_in, rounds } => format!(
                "entered last in {last_in} of the window's {rounds} rounds, and in enough of its longest waits to hold at least half of the others' waiting (self-calibrated blame rule: an intermittently stopped or throttled rank)"
            ),
            JudgedBy::Median { last_in, rounds } => format!(
                "entered last in {last_in} of the window's {rounds} rounds while the others' waiting stood above this communicator's own recent spread (self-calibrated threshold)"
            ),
        }
    }
}

/// Whether a closed window is slow: by the self-calibrated judgement once the kind's
/// history can judge it (late or long), else by the paper's R > theta_slow.
fn window_is_slow(r: f64, theta_slow: f64, calibrated: Option<&WindowVerdict>) -> bool {
    match calibrated {
        Some(v) if v.judged() => v.late || v.long,
        _ => r > theta_slow,
    }
}

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
        if e.state == ST_INFLIGHT && rec.duration_ns.saturating_add(skew) < e.duration_ns {
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
        let start_est = now_ns.saturating_sub(rec.duration_ns).min(e.start_est_ns);
        let gap_ns = if e.gap_ns != NO_GAP {
            e.gap_ns
        } else if let Some(g) = rec.gap_ns {
            // Measured by the probe (thinned records are not consecutive).
            g
        } else {
            let info = &comm.ranks[ri];
            match info.last_done_op {
                Some(p) if c > 0 && p == c - 1 => {
                    rec.start_ns.saturating_sub(info.last_done_end_ns)
                }
                _ => NO_GAP,
            }
        };
        let ne = Entry {
            state,
            type_idx,
            send_rate: sums.send_rate,
            recv_rate: sums.recv_rate,
            start_est_ns: start_est,
            duration_ns: rec.duration_ns,
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
        info.last_duration_ns = rec.duration_ns;
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
                info.last_done_end_ns = rec.start_ns.saturating_add(rec.duration_ns);
            }
            info.done_ty = Some(tk);
            info.done_send = sums.send;
            info.done_recv = sums.recv;
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
                a.next = ch.ring_next.unwrap_or((rank + 1) % nranks);
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
        let usable = round.failed == 0
            && !round.barrier(cfg.barrier_max_bytes)
            && !round.p2p()
            && round.types.len() == 1;
        let op_counter = round.op_counter;
        let ty = round.types.first().copied();
        comm.rounds_completed += 1;
        self.stats.rounds_completed += 1;
        let mut leftover = Some(entries);
        if let (true, Some(ty)) = (usable, ty) {
            let es = leftover.as_deref().unwrap_or(&[]);
            let t_max = es.iter().map(|e| e.duration_ns).max().unwrap_or(0);
            let t_min = es.iter().map(|e| e.duration_ns).min().unwrap_or(0);
            let ki = comm.kind_index(KindKey::of(&ty), cfg);
            let kind = &mut comm.kinds[ki];
            if let (Some(c), Some(last)) = (
                kind.calib.as_mut(),
                es.iter().position(|e| e.duration_ns == t_min),
            ) {
                // Does the last rank's own computation gap explain at least half of the
                // others' wait? (Unknown gaps: assumed so.)
                let explained = round_lateness(es).is_none_or(|l| 2 * l >= t_max - t_min);
                c.observe_explained(t_max, t_min, last, explained);
            }
            let (t_base_now, _, _) = kind.baseline.current();
            kind.longest_r = kind
                .longest_r
                .max(detect::slowdown_ratio(t_max, t_base_now));
            if t_max > t_base_now {
                let lateness = round_lateness(es);
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
            let calibrated = k.calib.as_mut().map(CommThreshold::close_window);
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
            r.win_ops = 0;
            r.win_last_in = 0;
            r.cpu_wait.roll();
            r.frozen.roll();
            r.win_send_rate = 0.0;
            r.win_recv_rate = 0.0;
            for a in &mut r.win_ch {
                let next = a.next;
                *a = ChanAcc {
                    next,
                    ..ChanAcc::default()
                };
            }
        }
    }

    /// Takes one heartbeat received at `now_ns` (liveness and op counters of its ranks).
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

    /// Per-rank state of one communicator.
    pub fn comm_state(&self, comm_id: u64, now_ns: u64) -> Option<wire::CommState> {
        let comm = self.comms.get(&comm_id)?;
        let silent_after = dur_ns(self.cfg.silent_after);
        let ranks = comm
            .ranks
            .iter()
            .enumerate()
            .map(|(r, i)| wire::RankState {
                rank: r as u32,
                host: i.host.clone(),
                pid: i.pid,
                last_op_counter: i.newest_op.unwrap_or(0),
                state: state_wire(i.last_state) as i32,
                in_flight_ns: if i.last_state == ST_INFLIGHT
                    && i.last_in_flight_start_est != u64::MAX
                {
                    now_ns.saturating_sub(i.last_in_flight_start_est)
                } else {
                    0
                },
                last_seen_ns: i.last_seen_ns,
                last_duration_ns: i.last_duration_ns,
                send_count: i.last_send,
                recv_count: i.last_recv,
                send_rate: f64::from(i.last_send_rate),
                recv_rate: f64::from(i.last_recv_rate),
                silent: i.silent(now_ns, silent_after),
                reported: i.reported,
                records: i.records,
                records_dropped: i.records_dropped,
            })
            .collect();
        let mut procs = std::collections::HashMap::new();
        for i in &comm.ranks {
            let d = procs.entry((i.host.as_str(), i.pid)).or_insert(0u64);
            *d = (*d).max(i.records_dropped);
        }
        let records_dropped = procs.values().sum();
        let (t_base_ns, baseline) = comm
            .kinds
            .first()
            .map(|k| {
                let (t, b, _) = k.baseline.current();
                (t, b)
            })
            .unwrap_or((0, BaselineKind::None));
        Some(wire::CommState {
            comm_id,
            nranks: comm.nranks,
            ranks,
            tracked_rounds: comm.rounds.len() as u32,
            rounds_completed: comm.rounds_completed,
            t_base_ns,
            baseline: baseline as i32,
            first_seen_ns: comm.created_ns,
            last_seen_ns: comm.last_seen_ns,
            anomaly_ids: comm.anomaly_ids.clone(),
            shard: String::new(),
            records_dropped,
        })
    }

    /// Communicators tracked, ascending.
    pub fn comm_ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.comms.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// One summary line per communicator, ascending by id.
    pub fn comm_summaries(&self) -> Vec<wire::CommSummary> {
        self.comm_ids()
            .into_iter()
            .filter_map(|id| self.comms.get(&id))
            .map(|c| wire::CommSummary {
                comm_id: c.id,
                nranks: c.nranks,
                tracked_rounds: c.rounds.len() as u32,
                rounds_completed: c.rounds_completed,
                last_seen_ns: c.last_seen_ns,
                shard: String::new(),
                anomalies: c.anomaly_ids.len() as u32,
            })
            .collect()
    }

    /// Estimated heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.comms
            .values()
            .map(|c| c.heap_bytes() + 32)
            .sum::<usize>()
            + self.window_log.capacity() * std::mem::size_of::<WindowEval>()
            + std::mem::size_of::<Engine>()
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

fn state_wire(s: u8) -> wire::OpState {
    match s {
        ST_DONE => wire::OpState::Completed,
        ST_FAILED => wire::OpState::Failed,
        _ => wire::OpState::InFlight,
    }
}

// ---------------------------------------------------------------------------------------
// Diagnosis assembly
// ---------------------------------------------------------------------------------------

/// Rank `r` of `comm` is in flight in round `c`: (c, collective, ranks that have not
/// entered it; for a point-to-point round only its peer), `None` when all entered.
fn waiting_for(comm: &Comm, r: usize, c: u64) -> Option<(u64, i32, Vec<u32>)> {
    let round = comm
        .rounds
        .iter()
        .find(|x| x.op_counter == c && !x.finalized);
    let (coll, missing): (i32, Vec<u32>) = match round {
        Some(rd) if !rd.entries.is_empty() => {
            let ty = rd
                .entries
                .get(r)
                .and_then(|e| rd.types.get(e.type_idx as usize));
            let coll = ty.map_or(0, |t| t.coll);
            let missing = match ty.filter(|t| t.p2p()) {
                Some(t) => usize::try_from(t.peer)
                    .ok()
                    .filter(|&p| rd.entries.get(p).is_some_and(|e| e.state == ST_NONE))
                    .map(|p| vec![p as u32])
                    .unwrap_or_default(),
                None => (0..comm.nranks)
                    .filter(|&j| rd.entries[j as usize].state == ST_NONE)
                    .collect(),
            };
            (coll, missing)
        }
        _ => (
            0,
            (0..comm.nranks)
                .filter(|&j| comm.ranks[j as usize].newest_op.is_none_or(|n| n < c))
                .collect(),
        ),
    };
    (!missing.is_empty()).then_some((c, coll, missing))
}

fn who(comm: &Comm, rank: u32) -> String {
    match comm.ranks.get(rank as usize) {
        Some(i) if i.reported => format!("rank {rank} (pid {}, host {})", i.pid, i.host),
        _ => format!("rank {rank} (never reported)"),
    }
}

fn ranks_phrase(comm: &Comm, ranks: &[u32]) -> String {
    match ranks {
        [] => "no rank".to_string(),
        [r] => who(comm, *r),
        _ => {
            let shown: Vec<String> = ranks.iter().take(5).map(u32::to_string).collect();
            let more = ranks.len().saturating_sub(5);
            if more > 0 {
                format!("ranks {} (+{more} more)", shown.join(", "))
            } else {
                format!("ranks {}", shown.join(", "))
            }
        }
    }
}

fn secs(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e9)
}

fn summary_of(vals: impl Iterator<Item = (u32, f64)>) -> Option<wire::Summary> {
    let mut s = wire::Summary {
        min: f64::INFINITY,
        max: f64::NEG_INFINITY,
        ..Default::default()
    };
    let mut sum = 0.0;
    for (r, v) in vals {
        if v < s.min {
            s.min = v;
            s.min_rank = r;
        }
        if v > s.max {
            s.max = v;
            s.max_rank = r;
        }
        sum += v;
        s.n += 1;
    }
    if s.n == 0 {
        return None;
    }
    s.mean = sum / f64::from(s.n);
    Some(s)
}

fn root_cause(
    comm: &Comm,
    rank: u32,
    class: AnomalyClass,
    reason: String,
    silent: bool,
) -> wire::RootCause {
    let info = comm.ranks.get(rank as usize);
    wire::RootCause {
        rank,
        host: info.map(|i| i.host.clone()).unwrap_or_default(),
        pid: info.map_or(0, |i| i.pid),
        reason,
        class: class as i32,
        silent,
        link_peer: None,
        channel: None,
        exited: false,
        observed_by: Vec::new(),
    }
}

fn rank_evidence(
    comm: &Comm,
    rank: u32,
    e: Option<&Entry>,
    now_ns: u64,
    silent_after: u64,
) -> wire::RankEvidence {
    let info = &comm.ranks[rank as usize];
    let mut ev = wire::RankEvidence {
        rank,
        host: info.host.clone(),
        pid: info.pid,
        last_op_counter: info.newest_op.unwrap_or(0),
        silent: info.silent(now_ns, silent_after),
        last_seen_ns: info.last_seen_ns,
        ..Default::default()
    };
    if let Some(e) = e.filter(|e| e.state != ST_NONE) {
        ev.entered = true;
        ev.state = state_wire(e.state) as i32;
        ev.duration_ns = if e.state == ST_INFLIGHT {
            now_ns.saturating_sub(e.start_est_ns)
        } else {
            e.duration_ns
        };
        ev.send_count = e.send;
        ev.recv_count = e.recv;
        ev.send_rate = f64::from(e.send_rate);
        ev.recv_rate = f64::from(e.recv_rate);
        ev.wait_upstream_ns = e.wait_up;
        ev.wait_downstream_ns = e.wait_down;
        if e.group != 0 {
            ev.tree_layer = Some(e.depth);
        }
    }
    ev
}

fn diag_id(comm_id: u64, op_counter: u64, class: AnomalyClass) -> String {
    format!("{comm_id:016x}-{op_counter}-{}", wire::class_code(class))
}

fn locate_hang_round(cfg: &EngineConfig, comm: &Comm, idx: usize, now_ns: u64) -> wire::Diagnosis {
    let round = &comm.rounds[idx];
    let c = round.op_counter;
    let n = comm.nranks as usize;
    let silent_after = dur_ns(cfg.silent_after);
    let thr = dur_ns(cfg.hang_threshold);
    let p2p = round.p2p();
    let none = Entry::default();
    let entry = |j: usize| round.entries.get(j).unwrap_or(&none);
    // Point-to-point rounds involve only the ranks that reported and their peers.
    let mut involved = vec![!p2p; n];
    if p2p {
        for (j, e) in round.entries.iter().enumerate() {
            if e.state != ST_NONE {
                involved[j] = true;
                if let Some(peer) = round
                    .types
                    .get(e.type_idx as usize)
                    .and_then(|t| usize::try_from(t.peer).ok())
                    .filter(|&p| p < n)
                {
                    involved[peer] = true;
                }
            }
        }
    }
    let views: Vec<HangView> = (0..n)
        .map(|j| {
            let e = entry(j);
            let info = &comm.ranks[j];
            // Expected counts: reported by the probe, else the rank's own counts in its
            // latest completed operation with the same type set.
            let exp = if e.exp_send + e.exp_recv > 0 {
                (e.exp_send, e.exp_recv)
            } else if e.state != ST_NONE
                && info.done_ty.is_some()
                && info.done_ty == round.types.get(e.type_idx as usize).copied()
            {
                (info.done_send, info.done_recv)
            } else {
                (0, 0)
            };
            let state = match e.state {
                _ if !involved[j] => HangState::NotInvolved,
                ST_INFLIGHT => HangState::InFlight,
                ST_DONE => HangState::Completed,
                ST_FAILED => HangState::Failed,
                _ => match info.newest_op {
                    Some(x) if x > c => HangState::PassedBeyond,
                    Some(x) if x == c => HangState::EnteredNoRecord,
                    _ => HangState::NotEntered,
                },
            };
            HangView {
                state,
                silent: info.silent(now_ns, silent_after),
                type_group: if e.state != ST_NONE && !p2p {
                    u32::from(e.type_idx)
                } else {
                    u32::MAX
                },
                send: e.send,
                recv: e.recv,
                exp_send: exp.0,
                exp_recv: exp.1,
                group: e.group,
                depth: e.depth,
            }
        })
        .collect();
    let finding = locate::locate_hang(&views);
    let class = finding.class();
    let roots_all = finding.ranks();
    let cap = cfg.evidence_cap.max(1);
    // Majority type set (the reference for names).
    let mut type_counts = vec![0u32; round.types.len().max(1)];
    for v in &views {
        if let Some(x) = type_counts.get_mut(v.type_group as usize) {
            *x += 1;
        }
    }
    let major = type_counts
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i);
    let major_ty = round.types.get(major).copied();
    let coll = major_ty.map_or(0, |t| t.coll);
    let coll_name = wire::coll_name(coll);
    let earliest = round
        .entries
        .iter()
        .filter(|e| e.state == ST_INFLIGHT)
        .map(|e| e.start_est_ns)
        .min()
        .unwrap_or(now_ns);
    let max_in_flight = now_ns.saturating_sub(earliest);
    let hung = views
        .iter()
        .filter(|v| matches!(v.state, HangState::InFlight | HangState::EnteredNoRecord))
        .count();
    let entered = views
        .iter()
        .filter(|v| !matches!(v.state, HangState::NotEntered | HangState::NotInvolved))
        .count();
    let silent: Vec<u32> = views
        .iter()
        .enumerate()
        .filter(|(_, v)| v.silent && v.state != HangState::NotInvolved)
        .map(|(j, _)| j as u32)
        .collect();
    // Roots with reasons.
    let mut roots = Vec::new();
    for &r in roots_all.iter().take(cap) {
        let info = &comm.ranks[r as usize];
        let v = views[r as usize];
        let e = entry(r as usize);
        let quiet = now_ns.saturating_sub(info.last_seen_ns);
        let newest = info
            .newest_op
            .map_or_else(|| "none".to_string(), |x| format!("#{x}"));
        let reason = match &finding {
            HangFinding::NotEntered(_) if !info.reported => format!(
                "did not enter op #{c}: never reported (no record or heartbeat): process likely not started, stopped or dead"
            ),
            HangFinding::NotEntered(_) if v.silent => format!(
                "did not enter op #{c} (newest op {newest}); no record or heartbeat for {} s: process likely stopped or dead",
                secs(quiet)
            ),
            HangFinding::NotEntered(_) => format!(
                "did not enter op #{c} (newest op {newest}); still reporting ({} s ago): stuck before the collective",
                secs(quiet)
            ),
            HangFinding::InconsistentTypes(_) => {
                let t = round.types.get(e.type_idx as usize).copied();
                match (t, major_ty) {
                    (Some(t), Some(m)) => format!(
                        "issued {} ({} B, count {}, dtype {}, {}) as op #{c} where the majority issued {} ({} B, count {}, dtype {}, {})",
                        wire::coll_name(t.coll), t.bytes, t.count, t.dtype, wire::algo_name(t.algo),
                        wire::coll_name(m.coll), m.bytes, m.count, m.dtype, wire::algo_name(m.algo)
                    ),
                    _ => format!("issued a different operation as op #{c}"),
                }
            }
            HangFinding::NotHung(_) => match v.state {
                HangState::Failed => format!("op #{c} failed on this rank while its peers hang"),
                HangState::PassedBeyond => format!(
                    "already moved past op #{c} (newest op {newest}) while its peers hang in it"
                ),
                _ => format!("completed op #{c} while its peers hang in it"),
            },
            HangFinding::Silent(_) => format!(
                "stopped reporting during op #{c} (no record or heartbeat for {} s): process likely stopped or dead",
                secs(quiet)
            ),
            HangFinding::FewestCounts(_) => {
                let exp = if e.exp_send + e.exp_recv > 0 {
                    format!(" of expected {}/{}", e.exp_send, e.exp_recv)
                } else {
                    String::new()
                };
                format!(
                    "least progress in op #{c}: SendCount/RecvCount {}/{}{exp} while every rank hangs",
                    e.send, e.recv
                )
            }
        };
        roots.push(root_cause(comm, r, class, reason, v.silent));
    }
    let present = || {
        round
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.state != ST_NONE)
            .map(|(j, e)| (j as u32, e))
    };
    let mut type_sets = Vec::new();
    if round.types.len() > 1 {
        let mut order: Vec<usize> = (0..round.types.len()).collect();
        order.sort_by(|a, b| type_counts[*b].cmp(&type_counts[*a]).then(a.cmp(b)));
        for t in order {
            let ranks: Vec<u32> = views
                .iter()
                .enumerate()
                .filter(|(_, v)| v.type_group as usize == t)
                .map(|(j, _)| j as u32)
                .take(cap)
                .collect();
            type_sets.push(wire::TypeSetGroup {
                op: Some(round.types[t].to_wire()),
                rank_count: type_counts[t],
                ranks,
            });
        }
    }
    let lagging_all: Vec<u32> = views
        .iter()
        .enumerate()
        .filter(|(_, v)| v.state == HangState::NotEntered)
        .map(|(j, _)| j as u32)
        .collect();
    let evidence = wire::Evidence {
        hang_threshold_ns: thr,
        max_in_flight_ns: max_in_flight,
        entered_ranks: entered as u32,
        hung_ranks: hung as u32,
        nranks: comm.nranks,
        duration_ns: summary_of(present().map(|(j, e)| {
            let d = if e.state == ST_INFLIGHT {
                now_ns.saturating_sub(e.start_est_ns)
            } else {
                e.duration_ns
            };
            (j, d as f64)
        })),
        send_count: summary_of(present().map(|(j, e)| (j, e.send as f64))),
        recv_count: summary_of(present().map(|(j, e)| (j, e.recv as f64))),
        send_rate: summary_of(present().map(|(j, e)| (j, f64::from(e.send_rate)))),
        recv_rate: summary_of(present().map(|(j, e)| (j, f64::from(e.recv_rate)))),
        lagging: lagging_all
            .iter()
            .take(cap)
            .map(|&j| rank_evidence(comm, j, None, now_ns, silent_after))
            .collect(),
        lagging_total: lagging_all.len() as u32,
        silent_ranks: silent.iter().take(cap).copied().collect(),
        silent_total: silent.len() as u32,
        type_sets,
        ranks: roots_all
            .iter()
            .take(cap)
            .map(|&j| rank_evidence(comm, j, round.entries.get(j as usize), now_ns, silent_after))
            .collect(),
        algorithm: major_ty.map_or(0, |t| t.algo),
        ..Default::default()
    };
    let phrase = ranks_phrase(comm, roots_all);
    let summary = match &finding {
        HangFinding::NotEntered(_) => format!(
            "{phrase} did not enter {coll_name} #{c}: not-entered hang ({hung} of {n} ranks in flight for {} s)",
            secs(max_in_flight)
        ),
        HangFinding::InconsistentTypes(_) => format!(
            "{phrase} issued a different operation than the other ranks at {coll_name} #{c}: inconsistent hang ({hung} of {n} ranks in flight for {} s)",
            secs(max_in_flight)
        ),
        HangFinding::NotHung(_) => format!(
            "{phrase} left {coll_name} #{c} while {hung} of {n} ranks hang in it: inconsistent hang ({} s)",
            secs(max_in_flight)
        ),
        HangFinding::Silent(_) => format!(
            "{phrase} stopped reporting during {coll_name} #{c} while all {n} ranks hang: hardware fault or stopped process ({} s)",
            secs(max_in_flight)
        ),
        HangFinding::FewestCounts(_) => format!(
            "{phrase} made the least progress in {coll_name} #{c} while all {n} ranks hang: hardware fault ({} s)",
            secs(max_in_flight)
        ),
    };
    let onset = earliest;
    wire::Diagnosis {
        id: diag_id(comm.id, c, class),
        class: class as i32,
        roots,
        comm_id: comm.id,
        trace: Some(wire::TraceId {
            comm_id: comm.id,
            op_counter: c,
            extension: 0,
        }),
        collective: coll,
        evidence: Some(evidence),
        detected_at_ns: now_ns,
        location_latency_ns: now_ns.saturating_sub(onset.saturating_add(thr)),
        summary,
        onset_ns: onset,
        nranks: comm.nranks,
        shard: String::new(),
    }
}

fn locate_slow(
    cfg: &EngineConfig,
    comm: &Comm,
    ki: usize,
    r: f64,
    judged: Option<JudgedRoot>,
    window_end: u64,
    now_ns: u64,
) -> wire::Diagnosis {
    let silent_after = dur_ns(cfg.silent_after);
    let cap = cfg.evidence_cap.max(1);
    let kind = &comm.kinds[ki];
    let empty: Vec<Entry> = Vec::new();
    let (t_max, t_min, best) = match kind.best.get() {
        Some((a, b, c)) => (*a, *b, Some(c)),
        None => (0, 0, None),
    };
    let entries = best.map_or(&empty, |b| &b.entries);
    let t_base = best.map_or(0, |b| b.t_base_ns);
    let op_counter = best.map_or(0, |b| b.op_counter);
    let ty = best.map(|b| b.ty);
    let coll = ty.map_or(0, |t| t.coll);
    let coll_name = wire::coll_name(coll);
    let algo = ty.map_or(comm.algo, |t| t.algo);
    let p_paper = detect::p_ratio(t_max, t_min, t_base).unwrap_or(0.0);
    let lateness = round_lateness(entries);
    // The class is decided with the window's slowdown-weighted lateness share when the
    // gaps are known (detect::LatenessShare), else with eq. (4) on the widest round.
    let p = kind
        .share
        .share()
        .or_else(|| detect::p_ratio_adjusted(t_max, t_min, t_base, lateness))
        .unwrap_or(0.0);
    let frozen_root = judged.filter(JudgedRoot::frozen);
    // A frozen process is slow itself, whatever the operations' timing says of its links.
    let kind_s = if frozen_root.is_some() {
        SlowKind::Computation
    } else {
        detect::classify_slow(p, cfg.alpha, cfg.beta)
    };
    let class = match kind_s {
        SlowKind::Computation => AnomalyClass::S1ComputationSlow,
        SlowKind::Communication => AnomalyClass::S2CommunicationSlow,
        SlowKind::Mixed => AnomalyClass::S3MixedSlow,
    };
    // S1 candidates.
    let durations: Vec<Option<u64>> = entries.iter().map(|e| Some(e.duration_ns)).collect();
    let mut s1 = locate::min_duration(&durations);
    // S2 candidates: wait metrics on ring channels, else rates.
    let mut links = Vec::new();
    let mut s2: Vec<u32> = Vec::new();
    let mut lockstep = false;
    let mut by_links = false;
    let mut by_least_wait = false;
    let mut by_latecomer = false;
    let cpu_wait: Vec<Option<f64>> = comm.ranks.iter().map(RankInfo::win_cpu_wait).collect();
    let starved = locate::cpu_starved(&cpu_wait);
    let by_starved = kind_s != SlowKind::Computation && !starved.is_empty();
    if by_starved {
        s2 = starved;
    } else if kind_s != SlowKind::Computation {
        if algo == wire::Algorithm::Ring as i32 {
            let nch = comm.ranks.iter().map(|r| r.win_ch.len()).max().unwrap_or(0);
            let mut chans: Vec<Vec<Option<ChanWait>>> = Vec::with_capacity(nch);
            for ch in 0..nch {
                chans.push(
                    comm.ranks
                        .iter()
                        .map(|ri| {
                            ri.win_ch
                                .get(ch)
                                .filter(|a| a.has_wait && a.dur_ns > 0)
                                .map(|a| ChanWait {
                                    up: a.up_ns as f64 / a.dur_ns as f64,
                                    down: a.down_ns as f64 / a.dur_ns as f64,
                                    next: a.next,
                                })
                        })
                        .collect(),
                );
            }
            let (roots, found) = locate::slow_links(&chans);
            if !roots.is_empty() {
                s2 = roots;
                links = found;
                by_links = true;
            } else {
                let r = locate::least_waiting(&chans);
                if !r.is_empty() {
                    s2 = r;
                    by_least_wait = true;
                }
            }
        }
        if !by_links && !by_least_wait && algo == wire::Algorithm::Ring as i32 {
            let r = locate::usual_latecomer(
                &comm
                    .ranks
                    .iter()
                    .map(|ri| ri.win_last_in)
                    .collect::<Vec<_>>(),
            );
            if !r.is_empty() {
                s2 = r;
                by_latecomer = true;
            }
        }
        if !by_links && !by_least_wait && !by_latecomer {
            let rates: Vec<(f64, f64, u64)> = comm
                .ranks
                .iter()
                .enumerate()
                .map(|(j, ri)| {
                    let g = entries.get(j).map_or(0, |e| e.group);
                    if ri.win_ops > 0 {
                        let n = f64::from(ri.win_ops);
                        (ri.win_send_rate / n, ri.win_recv_rate / n, g)
                    } else {
                        let e = entries.get(j);
                        (
                            e.map_or(0.0, |e| f64::from(e.send_rate)),
                            e.map_or(0.0, |e| f64::from(e.recv_rate)),
                            g,
                        )
                    }
                })
                .collect();
            let (roots, ls) = locate::lowest_rate(&rates);
            s2 = roots;
            lockstep = ls;
        }
    }
    // The scheduler's evidence says why the judged rank held the others back, when it was
    // starved of CPU: keep it in the reason. (Read before the candidates are replaced.)
    let judged_starved = by_starved && judged.is_some_and(|jr| s2.contains(&jr.rank));
    // The self-calibrated verdict counted every round of the window; the widest round alone
    // can belong to a victim. Its rank replaces both candidate sets.
    if let Some(jr) = judged {
        s1 = vec![jr.rank];
        if kind_s != SlowKind::Computation {
            s2 = vec![jr.rank];
            links.clear();
            (by_links, by_least_wait, by_latecomer, lockstep) = (false, false, false, false);
        }
    }
    let by_starved = by_starved && judged.is_none();
    let starved_reason = |j: u32| {
        let mut known: Vec<f64> = cpu_wait.iter().flatten().copied().collect();
        let med = locate::median(&mut known);
        format!(
            "waited for a CPU {:.0}% of the window (runnable but not running; median of the ranks {:.0}%): CPU starvation (a competing process or thread on its cores), its peers waited for it inside the operations",
            cpu_wait[j as usize].unwrap_or(0.0) * 100.0,
            med * 100.0
        )
    };
    let fmt_pr = if (p - p_paper).abs() >= 0.005 {
        format!(
            "P = {p:.2} [the latecomers' own share of the window's slowdown; eq. 4 on the widest round: {p_paper:.2}], R = {r:.1}"
        )
    } else {
        format!("P = {p:.2}, R = {r:.1}")
    };
    let mut roots: Vec<wire::RootCause> = Vec::new();
    let add = |rank: u32, cls: AnomalyClass, reason: String, roots: &mut Vec<wire::RootCause>| {
        if let Some(x) = roots.iter_mut().find(|x| x.rank == rank) {
            x.class = AnomalyClass::S3MixedSlow as i32;
            x.reason = format!("{}; {}", x.reason, reason);
        } else if roots.len() < cap {
            let silent = comm.ranks[rank as usize].silent(now_ns, silent_after);
            roots.push(root_cause(comm, rank, cls, reason, silent));
        }
    };
    if let Some(jr) = judged {
        let inside = if judged_starved {
            starved_reason(jr.rank)
        } else {
            "the others also waited for it inside the operations".to_string()
        };
        let (cls, reason) = match kind_s {
            SlowKind::Computation => (AnomalyClass::S1ComputationSlow, jr.reason()),
            SlowKind::Communication if judged_starved => (
                AnomalyClass::S2CommunicationSlow,
                format!("{inside}; {}", jr.reason()),
            ),
            SlowKind::Communication => (AnomalyClass::S2CommunicationSlow, jr.reason()),
            SlowKind::Mixed => (
                AnomalyClass::S3MixedSlow,
                format!("{}; {inside}", jr.reason()),
            ),
        };
        add(jr.rank, cls, reason, &mut roots);
    } else if kind_s != SlowKind::Communication {
        for &j in &s1 {
            let d = entries.get(j as usize).map_or(0, |e| e.duration_ns);
            add(
                j,
                AnomalyClass::S1ComputationSlow,
                format!(
                    "shortest duration in {coll_name} #{op_counter} ({} ms vs T_max {} ms): entered last, the others waited for it",
                    d / 1_000_000,
                    t_max / 1_000_000
                ),
                &mut roots,
            );
        }
    }
    if kind_s != SlowKind::Computation && judged.is_none() {
        for &j in &s2 {
            let reason = if by_starved {
                starved_reason(j)
            } else if by_links {
                let mine: Vec<&locate::SlowLink> =
                    links.iter().filter(|l| l.from == j || l.to == j).collect();
                let desc: Vec<String> = mine
                    .iter()
                    .take(4)
                    .map(|l| {
                        format!(
                            "ch {}: {} -> {} (sender waits downstream {:.0}%, receiver waits upstream {:.0}%)",
                            l.channel,
                            l.from,
                            l.to,
                            l.sender_down * 100.0,
                            l.receiver_up * 100.0
                        )
                    })
                    .collect();
                format!("end of the slow link(s) {}", desc.join("; "))
            } else if by_latecomer {
                "entered last in most of the window's rounds while every rank communicated slowly: the others waited for it inside the operations too (CPU starvation, descheduling)".to_string()
            } else if by_least_wait {
                "waited least for its peers while they waited for it: slow itself (CPU starvation, descheduling, a slow copy), no single slow link".to_string()
            } else if lockstep {
                "lowest SendRate/RecvRate, but all ranks advance in lockstep: weak evidence (no wait metrics)".to_string()
            } else {
                "lowest SendRate/RecvRate among its peers".to_string()
            };
            add(j, AnomalyClass::S2CommunicationSlow, reason, &mut roots);
            if by_links {
                if let (Some(l), Some(x)) = (
                    links.iter().find(|l| l.from == j || l.to == j),
                    roots.iter_mut().find(|x| x.rank == j),
                ) {
                    x.link_peer = Some(if l.from == j { l.to } else { l.from });
                    x.channel = Some(l.channel);
                }
            }
        }
    }
    let s1_phrase = ranks_phrase(comm, &s1);
    let s2_phrase = if judged_starved {
        format!(
            "{} is starved of CPU and holds the others back",
            ranks_phrase(comm, &s2)
        )
    } else if judged.is_some() {
        format!("{} holds the others back", ranks_phrase(comm, &s2))
    } else if by_starved {
        format!(
            "{} is starved of CPU and holds the ring back",
            ranks_phrase(comm, &s2)
        )
    } else if by_links {
        match s2.as_slice() {
            [a, b] if links.iter().all(|l| (l.from, l.to) == (*a, *b)) => {
                format!("the link {} -> {} is slow", who(comm, *a), who(comm, *b))
            }
            _ => format!("{} has a slow transport", ranks_phrase(comm, &s2)),
        }
    } else if by_latecomer {
        format!(
            "{} holds the ring back (entered last in most rounds)",
            ranks_phrase(comm, &s2)
        )
    } else if by_least_wait {
        format!(
            "{} holds the ring back (the others wait for it)",
            ranks_phrase(comm, &s2)
        )
    } else if s2.is_empty() {
        "no rank stands out (equal send/recv rates, no wait metrics)".to_string()
    } else {
        format!(
            "{} has the lowest send rate{}",
            ranks_phrase(comm, &s2),
            if lockstep {
                " (lockstep: weak evidence)"
            } else {
                ""
            }
        )
    };
    let baseline = best.map_or(BaselineKind::None, |b| b.baseline);
    let phase = if baseline == BaselineKind::Static {
        " [slow-at-start]"
    } else {
        ""
    };
    let summary = match kind_s {
        SlowKind::Computation if frozen_root.is_some() => {
            format!("{s1_phrase} was frozen (its process stopped) and the others waited for it in {coll_name} #{op_counter}: computation-slow ({fmt_pr}){phase}")
        }
        SlowKind::Computation => {
            format!("{s1_phrase} enters {coll_name} #{op_counter} late: computation-slow ({fmt_pr}){phase}")
        }
        SlowKind::Communication => {
            format!("{s2_phrase} in {coll_name} #{op_counter}: communication-slow ({fmt_pr}){phase}")
        }
        SlowKind::Mixed => format!(
            "{s1_phrase} enters {coll_name} #{op_counter} late and {s2_phrase}: mixed-slow ({fmt_pr}){phase}"
        ),
    };
    let root_ranks: Vec<u32> = roots.iter().map(|x| x.rank).collect();
    let window = dur_ns(cfg.detect_window);
    let win_rates = |j: usize, send: bool| -> f64 {
        let ri = &comm.ranks[j];
        if ri.win_ops == 0 {
            return 0.0;
        }
        (if send {
            ri.win_send_rate
        } else {
            ri.win_recv_rate
        }) / f64::from(ri.win_ops)
    };
    let evidence = wire::Evidence {
        r,
        p,
        p_paper,
        computation_lateness_ns: lateness,
        round_durations_ns: entries
            .iter()
            .map(|e| if e.state == ST_NONE { 0 } else { e.duration_ns })
            .collect(),
        t_max_ns: t_max,
        t_min_ns: t_min,
        t_base_ns: t_base,
        baseline: baseline as i32,
        baseline_rounds: best.map_or(0, |b| b.m),
        slow_windows: comm.streak.count(),
        window_start_ns: window_end.saturating_sub(window),
        window_end_ns: window_end,
        theta_slow: cfg.theta_slow,
        nranks: comm.nranks,
        duration_ns: summary_of(
            entries
                .iter()
                .enumerate()
                .map(|(j, e)| (j as u32, e.duration_ns as f64)),
        ),
        send_count: summary_of(
            entries
                .iter()
                .enumerate()
                .map(|(j, e)| (j as u32, e.send as f64)),
        ),
        recv_count: summary_of(
            entries
                .iter()
                .enumerate()
                .map(|(j, e)| (j as u32, e.recv as f64)),
        ),
        send_rate: summary_of((0..comm.ranks.len()).map(|j| (j as u32, win_rates(j, true)))),
        recv_rate: summary_of((0..comm.ranks.len()).map(|j| (j as u32, win_rates(j, false)))),
        silent_ranks: Vec::new(),
        ranks: root_ranks
            .iter()
            .map(|&j| rank_evidence(comm, j, entries.get(j as usize), now_ns, silent_after))
            .collect(),
        links: links
            .iter()
            .take(cap)
            .map(|l| wire::LinkEvidence {
                channel: l.channel,
                from_rank: l.from,
                to_rank: l.to,
                sender_wait_downstream: l.sender_down,
                receiver_wait_upstream: l.receiver_up,
            })
            .collect(),
        lockstep,
        algorithm: algo,
        tree_layer: root_ranks
            .first()
            .and_then(|&j| entries.get(j as usize))
            .filter(|e| e.group != 0)
            .map(|e| e.depth),
        ..Default::default()
    };
    wire::Diagnosis {
        id: diag_id(comm.id, op_counter, class),
        class: class as i32,
        roots,
        comm_id: comm.id,
        trace: Some(wire::TraceId {
            comm_id: comm.id,
            op_counter,
            extension: 0,
        }),
        collective: coll,
        evidence: Some(evidence),
        detected_at_ns: now_ns,
        location_latency_ns: now_ns.saturating_sub(window_end),
        summary,
        onset_ns: comm.slow_onset_ns,
        nranks: comm.nranks,
        shard: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ChannelStat, CollKind, OpRecord, OpState, OpTypeSet, TraceId};

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    const T0: u64 = 1_000 * S;

    fn op(coll: CollKind, bytes: u64) -> OpTypeSet {
        OpTypeSet {
            collective: coll as i32,
            bytes,
            count: bytes / 4,
            redop: -1,
            root: -1,
            peer: -1,
            n_channels: 1,
            ..Default::default()
        }
    }

    fn rec(comm: u64, c: u64, rank: u32, n: u32, state: OpState, dur: u64) -> OpRecord {
        OpRecord {
            trace: Some(TraceId {
                comm_id: comm,
                op_counter: c,
                extension: 0,
            }),
            rank,
            nranks: n,
            host: format!("h{rank}"),
            pid: 100 + rank,
            op: Some(op(CollKind::AllReduce, 1 << 20)),
            start_ns: c * 10 * S,
            duration_ns: dur,
            channels: vec![ChannelStat {
                send_count: 10,
                recv_count: 10,
                expected_send: 10,
                expected_recv: 10,
                ..Default::default()
            }],
            state: state as i32,
            seq: c,
            device: -1,
            cpu_wait_ns: None,
            frozen_ns: None,
            gap_ns: None,
            stride: 0,
            failure: 0,
            peer_lost: None,
            mismatch: None,
            seq_space: 0,
            p2p: Vec::new(),
        }
    }

    fn cfg() -> EngineConfig {
        EngineConfig {
            hang_threshold: Duration::from_secs(300),
            silent_after: Duration::from_secs(60),
            ..EngineConfig::default()
        }
    }

    #[test]
    fn bad_records_are_rejected_with_typed_reasons() {
        let mut e = Engine::new(EngineConfig {
            max_ranks: 100,
            max_channels: 2,
            max_comms: 2,
            ..cfg()
        });
        let ok = rec(1, 5, 0, 4, OpState::InFlight, S);
        let mut r = ok.clone();
        r.trace = None;
        assert_eq!(e.ingest(&r, T0), Err(Reject::MissingTrace));
        let mut r = ok.clone();
        r.op = None;
        assert!(matches!(
            e.ingest(&r, T0),
            Err(Reject::MissingOpTypeSet { .. })
        ));
        let mut r = ok.clone();
        r.nranks = 0;
        assert_eq!(e.ingest(&r, T0), Err(Reject::ZeroRanks { comm_id: 1 }));
        let mut r = ok.clone();
        r.nranks = 101;
        assert!(matches!(
            e.ingest(&r, T0),
            Err(Reject::TooManyRanks {
                nranks: 101,
                max: 100,
                ..
            })
        ));
        let mut r = ok.clone();
        r.rank = 4;
        let err = e.ingest(&r, T0).unwrap_err();
        assert_eq!(
            err,
            Reject::RankOutOfRange {
                comm_id: 1,
                rank: 4,
                nranks: 4
            }
        );
        assert_eq!(
            err.to_string(),
            "comm 0x1: rank 4 out of range for nranks 4"
        );
        let mut r = ok.clone();
        r.op.as_mut().unwrap().collective = 42;
        assert_eq!(
            e.ingest(&r, T0),
            Err(Reject::UnknownEnum {
                field: "collective",
                value: 42
            })
        );
        let mut r = ok.clone();
        r.state = 7;
        assert_eq!(
            e.ingest(&r, T0),
            Err(Reject::UnknownEnum {
                field: "state",
                value: 7
            })
        );
        let mut r = ok.clone();
        r.channels = vec![ChannelStat::default(); 3];
        assert_eq!(
            e.ingest(&r, T0),
            Err(Reject::TooManyChannels { got: 3, max: 2 })
        );
        let mut r = ok.clone();
        r.channels[0].ring_next = Some(9);
        assert!(matches!(
            e.ingest(&r, T0),
            Err(Reject::BadRingNeighbour { neighbour: 9, .. })
        ));
        let mut r = ok.clone();
        r.duration_ns = 30 * 24 * 3600 * S;
        assert!(matches!(
            e.ingest(&r, T0),
            Err(Reject::AbsurdDuration { .. })
        ));
        let mut r = ok.clone();
        r.start_ns = u64::MAX - 5;
        assert!(matches!(
            e.ingest(&r, T0),
            Err(Reject::AbsurdDuration { .. })
        ));
        // Now valid records, then inconsistencies against what is known.
        assert_eq!(e.ingest(&ok, T0), Ok(()));
        let mut r = ok.clone();
        r.nranks = 8;
        assert_eq!(
            e.ingest(&r, T0),
            Err(Reject::NranksMismatch {
                comm_id: 1,
                got: 8,
                expected: 4
            })
        );
        let mut r = ok.clone();
        r.duration_ns = 0; // earlier snapshot said 1 s, skew tolerance 5 s: still fine
        assert_eq!(e.ingest(&r, T0), Ok(()));
        let mut r = ok.clone();
        r.duration_ns = 20 * S;
        assert_eq!(e.ingest(&r, T0), Ok(()));
        let mut r = ok.clone();
        r.duration_ns = S; // 19 s shorter than the snapshot before
        assert!(matches!(
            e.ingest(&r, T0),
            Err(Reject::ClockBackwards { .. })
        ));
        let mut done = ok.clone();
        done.state = OpState::Completed as i32;
        done.duration_ns = 21 * S;
        assert_eq!(e.ingest(&done, T0), Ok(()));
        assert!(matches!(
            e.ingest(&done, T0),
            Err(Reject::DuplicateCompleted { op_counter: 5, .. })
        ));
        // A late in-flight snapshot of a completed op is accepted and ignored.
        assert_eq!(e.ingest(&ok, T0), Ok(()));
        // A heartbeat far ahead does not make older records "backwards".
        e.heartbeat(
            &wire::Heartbeat {
                host: "h0".into(),
                pid: 100,
                ranks: vec![wire::RankMembership {
                    comm_id: 1,
                    rank: 0,
                    nranks: 4,
                    last_op_counter: Some(500),
                    last_p2p_counter: None,
                }],
                records_dropped: 0,
                time_ns: 0,
            },
            T0,
        );
        // Rank 0 reaches op 80: op 15 is more than max_reorder (64) behind.
        let mut r = rec(1, 80, 0, 4, OpState::InFlight, S);
        r.start_ns = 300 * S;
        assert_eq!(e.ingest(&r, T0), Ok(()));
        let r = rec(1, 15, 0, 4, OpState::InFlight, S);
        assert_eq!(
            e.ingest(&r, T0),
            Err(Reject::CounterBackwards {
                comm_id: 1,
                rank: 0,
                got: 15,
                newest: 80
            })
        );
        // Op 81 starting 100 s before op 80 on the same rank's clock.
        let mut r = rec(1, 81, 0, 4, OpState::InFlight, S);
        r.start_ns = 200 * S;
        assert!(matches!(
            e.ingest(&r, T0),
            Err(Reject::ClockBackwards { .. })
        ));
        // Communicator limit.
        assert_eq!(e.ingest(&rec(2, 0, 0, 4, OpState::InFlight, 0), T0), Ok(()));
        assert_eq!(
            e.ingest(&rec(3, 0, 0, 4, OpState::InFlight, 0), T0),
            Err(Reject::TooManyComms { max: 2 })
        );
        assert!(e.stats().rejected >= 15);
        assert!(e.tick(T0 + S).is_empty());
    }

    fn feed_hang(e: &mut Engine, n: u32, skip: Option<u32>, coll_bytes: (CollKind, u64)) -> u64 {
        // Round 7 completed by all; round 8 entered by all but `skip`, in flight.
        for r in 0..n {
            e.ingest(&rec(9, 7, r, n, OpState::Completed, 100 * MS), T0)
                .unwrap();
        }
        let mut t = T0;
        while t <= T0 + 400 * S {
            for r in 0..n {
                if Some(r) == skip {
                    continue;
                }
                let mut x = rec(9, 8, r, n, OpState::InFlight, t - T0);
                x.op = Some(op(coll_bytes.0, coll_bytes.1));
                x.channels[0].send_count = 3 + u64::from(r != 2);
                e.ingest(&x, t).unwrap();
            }
            if let Some(s) = skip {
                e.heartbeat(
                    &wire::Heartbeat {
                        host: format!("h{s}"),
                        pid: 100 + s,
                        ranks: vec![wire::RankMembership {
                            comm_id: 9,
                            rank: s,
                            nranks: n,
                            last_op_counter: Some(7),
                            last_p2p_counter: None,
                        }],
                        records_dropped: 0,
                        time_ns: 0,
                    },
                    t,
                );
            }
            t += 10 * S;
        }
        t
    }

    #[test]
    fn engine_can_move_between_threads() {
        fn send<T: Send + 'static>() {}
        send::<Engine>();
        send::<wire::Diagnosis>();
    }

    #[test]
    fn config_validation_names_the_bad_field() {
        assert_eq!(EngineConfig::default().validate(), Ok(()));
        let c = EngineConfig {
            alpha: 0.7,
            beta: 0.6,
            ..EngineConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "alpha/beta");
        let c = EngineConfig {
            theta_slow: f64::NAN,
            ..EngineConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "theta_slow");
        let c = EngineConfig {
            theta_slow: f64::INFINITY,
            ..EngineConfig::default()
        };
        assert_eq!(c.validate(), Ok(()));
        let c = EngineConfig {
            hang_threshold: Duration::ZERO,
            ..EngineConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "invalid analyzer setting hang_threshold: must be > 0"
        );
    }

    #[test]
    fn non_finite_or_negative_metrics_are_rejected() {
        let mut e = Engine::new(cfg());
        let mut r = rec(1, 1, 0, 2, OpState::Completed, MS);
        r.channels[0].send_rate = f64::NAN;
        assert!(matches!(
            e.ingest(&r, T0),
            Err(Reject::BadMetric {
                field: "send_rate",
                channel: 0,
                ..
            })
        ));
        r.channels[0].send_rate = 0.5;
        r.channels[0].recv_per_sec = -1.0;
        assert!(matches!(
            e.ingest(&r, T0),
            Err(Reject::BadMetric {
                field: "recv_per_sec",
                ..
            })
        ));
    }

    #[test]
    fn after_a_pause_of_the_ticking_process_hang_checks_wait_one_threshold() {
        // Rank 3 finished op 8, ranks 0-2 are still in flight in the engine's view (their
        // ends have not arrived): past the threshold that is a hang naming rank 3.
        let start = |e: &mut Engine| {
            for r in 0..3 {
                e.ingest(&rec(9, 8, r, 4, OpState::InFlight, 0), T0)
                    .unwrap();
            }
            e.ingest(&rec(9, 8, 3, 4, OpState::Completed, S), T0 + S)
                .unwrap();
        };
        let t = T0 + 310 * S;
        let mut e = Engine::new(cfg());
        start(&mut e);
        assert_eq!(e.tick(t).len(), 1, "the engine's stale view is a hang");
        // The same after a pause: nothing while the ends arrive, nothing after.
        let mut e = Engine::new(cfg());
        start(&mut e);
        e.note_pause(t);
        assert!(e.tick(t).is_empty());
        for r in 0..3 {
            e.ingest(&rec(9, 8, r, 4, OpState::Completed, 311 * S), t + S)
                .unwrap();
        }
        assert!(e.tick(t + 2 * S).is_empty());
        assert!(e.tick(t + 301 * S).is_empty());
        // A hang that lasts is named once the wait is over.
        let mut e = Engine::new(cfg());
        start(&mut e);
        e.note_pause(t);
        assert!(e.tick(t + 299 * S).is_empty());
        assert_eq!(e.tick(t + 301 * S).len(), 1);
    }

    #[test]
    fn a_pause_is_ten_tick_periods_and_at_least_a_second() {
        let ms = Duration::from_millis;
        assert!(!is_pause(ms(500), ms(50)));
        assert!(is_pause(ms(1000), ms(50)));
        assert!(!is_pause(ms(1500), ms(200)));
        assert!(is_pause(ms(2000), ms(200)));
    }

    #[test]
    fn hang_fires_once_just_after_the_threshold() {
        let mut e = Engine::new(cfg());
        let mut got = Vec::new();
        for r in 0..4 {
            e.ingest(&rec(9, 8, r, 4, OpState::InFlight, 0), T0)
                .unwrap();
        }
        // Snapshots every 10 s; rank 2 has the fewest sends.
        for step in 1..=40u64 {
            let t = T0 + step * 10 * S;
            for r in 0..4 {
                let mut x = rec(9, 8, r, 4, OpState::InFlight, step * 10 * S);
                x.channels[0].send_count = if r == 2 { 3 } else { 4 };
                e.ingest(&x, t).unwrap();
            }
            let d = e.tick(t);
            if step * 10 <= 300 {
                assert!(d.is_empty(), "no hang at {} s", step * 10);
            }
            got.extend(d);
        }
        assert_eq!(got.len(), 1, "one diagnosis per episode");
        let d = &got[0];
        assert_eq!(d.class(), AnomalyClass::H3Hardware);
        assert_eq!(d.roots.iter().map(|r| r.rank).collect::<Vec<_>>(), vec![2]);
        assert_eq!(d.detected_at_ns, T0 + 310 * S);
        assert_eq!(d.onset_ns, T0);
        assert_eq!(d.location_latency_ns, 10 * S);
        let ev = d.evidence.as_ref().unwrap();
        assert_eq!((ev.entered_ranks, ev.hung_ranks, ev.nranks), (4, 4, 4));
        assert_eq!(ev.max_in_flight_ns, 310 * S);
        assert_eq!(
            ev.send_count.as_ref().map(|s| (s.min, s.min_rank)),
            Some((3.0, 2))
        );
        assert!(
            d.summary
                .starts_with("rank 2 (pid 102, host h2) made the least progress in AllReduce #8"),
            "{}",
            d.summary
        );
    }

    #[test]
    fn a_rank_that_went_silent_still_counts_by_analyzer_time() {
        // One snapshot at T0 (duration 0), then nothing from anybody; the estimate grows with
        // the analyzer's clock.
        let mut e = Engine::new(cfg());
        for r in 0..3 {
            e.ingest(&rec(9, 1, r, 3, OpState::InFlight, 0), T0)
                .unwrap();
        }
        assert!(e.tick(T0 + 300 * S).is_empty());
        let d = e.tick(T0 + 300 * S + 1);
        assert_eq!(d.len(), 1);
        // Everyone silent: no discrimination by silence, fewest counts all tie.
        assert_eq!(d[0].roots.len(), 3);
        assert_eq!(d[0].evidence.as_ref().unwrap().silent_total, 3);
    }

    #[test]
    fn h1_alive_rank_behind_the_round_is_the_root() {
        let mut e = Engine::new(cfg());
        let t = feed_hang(&mut e, 4, Some(1), (CollKind::AllReduce, 1 << 20));
        let d = e.tick(t);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].class(), AnomalyClass::H1NotEntered);
        assert_eq!(d[0].roots[0].rank, 1);
        assert!(!d[0].roots[0].silent);
        assert!(
            d[0].roots[0].reason.contains("newest op #7"),
            "{}",
            d[0].roots[0].reason
        );
        let ev = d[0].evidence.as_ref().unwrap();
        assert_eq!(
            (ev.lagging_total, ev.entered_ranks, ev.hung_ranks),
            (1, 3, 3)
        );
        assert_eq!(ev.lagging[0].last_op_counter, 7);
    }

    #[test]
    fn entered_barriers_never_hang_but_five_byte_allreduce_does() {
        let mut e = Engine::new(cfg());
        let t = feed_hang(&mut e, 4, None, (CollKind::AllReduce, 4));
        assert!(e.tick(t).is_empty(), "AllReduce of 4 bytes is a barrier");
        let mut e = Engine::new(cfg());
        let t = feed_hang(&mut e, 4, None, (CollKind::AllReduce, 5));
        assert_eq!(e.tick(t).len(), 1);
    }

    #[test]
    fn p2p_round_involves_only_the_peers() {
        let mut e = Engine::new(cfg());
        let mut x = rec(5, 3, 1, 8, OpState::InFlight, 0);
        x.op = Some(OpTypeSet {
            peer: 6,
            algorithm: wire::Algorithm::P2p as i32,
            ..op(CollKind::Send, 1 << 20)
        });
        e.ingest(&x, T0).unwrap();
        x.duration_ns = 301 * S;
        e.ingest(&x, T0 + 301 * S).unwrap();
        let d = e.tick(T0 + 301 * S);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].class(), AnomalyClass::H1NotEntered);
        assert_eq!(
            d[0].roots.iter().map(|r| r.rank).collect::<Vec<_>>(),
            vec![6]
        );
        // A completed send/recv pair finalizes the round.
        let mut e = Engine::new(cfg());
        for (r, peer, coll) in [(1, 6, CollKind::Send), (6, 1, CollKind::Recv)] {
            let mut y = rec(5, 3, r, 8, OpState::Completed, MS);
            y.op = Some(OpTypeSet {
                peer,
                algorithm: wire::Algorithm::P2p as i32,
                ..op(coll, 1 << 20)
            });
            e.ingest(&y, T0).unwrap();
        }
        assert_eq!(e.comm_state(5, T0).unwrap().rounds_completed, 1);
        assert_eq!(e.comm_state(5, T0).unwrap().tracked_rounds, 0);
    }

    /// Completes round `c` of comm 4 (4 ranks) at `t` with the given durations. As in a ring,
    /// every rank ends at the same moment (c x 10 s + 5 s on the ranks' clocks): a shorter
    /// duration means a later start, i.e. a longer computation gap before the round.
    fn round(e: &mut Engine, c: u64, t: u64, durs: [u64; 4]) {
        for (r, d) in durs.into_iter().enumerate() {
            let mut x = rec(4, c, r as u32, 4, OpState::Completed, d);
            x.start_ns = c * 10 * S + 5 * S - d;
            e.ingest(&x, t).unwrap();
        }
    }

    fn slow_cfg() -> EngineConfig {
        EngineConfig {
            baseline_rounds_max: 3,
            repeat_threshold: 1,
            theta_slow: 3.0,
            detect_window: Duration::from_secs(60),
            record_windows: true,
            ..cfg()
        }
    }

    #[test]
    fn slow_detection_matches_hand_computed_r_and_p() {
        let mut e = Engine::new(slow_cfg());
        // Window 1 (T0 .. T0+60 s): rounds 1..3, T_max 100, 120, 140 ms: baseline collecting.
        round(&mut e, 1, T0 + S, [100 * MS, 90 * MS, 95 * MS, 99 * MS]);
        round(&mut e, 2, T0 + 2 * S, [120 * MS, 90 * MS, 95 * MS, 99 * MS]);
        round(&mut e, 3, T0 + 3 * S, [140 * MS, 90 * MS, 95 * MS, 99 * MS]);
        // Round 4 fixes T_base = (100 + 120 + 140) / 3 = 120 ms, m = 3.
        round(&mut e, 4, T0 + 4 * S, [110 * MS; 4]);
        assert!(
            e.tick(T0 + 61 * S).is_empty(),
            "static T_base 10 s: nothing is slow"
        );
        // Window 2: a round with rank 3 entering late: T_max 500, T_min 100.
        // R = (500 - 120) / 120 = 3.1667 > 3; P = (500 - 100) / (500 - 120) > 1 -> 1.
        round(
            &mut e,
            5,
            T0 + 70 * S,
            [500 * MS, 500 * MS, 500 * MS, 100 * MS],
        );
        // A round with a larger T_max but a smaller range does not replace it (eq. 2).
        round(
            &mut e,
            6,
            T0 + 71 * S,
            [600 * MS, 590 * MS, 595 * MS, 599 * MS],
        );
        // The comm was first seen at T0 + 1 s: windows end at T0 + 61 s, 121 s, 181 s.
        let d = e.tick(T0 + 122 * S);
        assert_eq!(d.len(), 1);
        let ev = d[0].evidence.as_ref().unwrap();
        // Eq. (4) on the widest round (5) says computation-slow (P = 1); over the window,
        // round 6 is 480 ms slower than T_base with only 9 ms of lateness (rank 1's gap
        // above the lower median), so the weighted share is (380 + 9) / (380 + 480): mixed.
        assert_eq!(d[0].class(), AnomalyClass::S3MixedSlow, "{}", d[0].summary);
        assert_eq!(d[0].roots[0].rank, 3);
        assert_eq!(ev.p_paper, 1.0);
        assert!((ev.p - 389.0 / 860.0).abs() < 1e-12, "P = {}", ev.p);
        assert_eq!(
            (ev.t_max_ns, ev.t_min_ns, ev.t_base_ns),
            (500 * MS, 100 * MS, 120 * MS)
        );
        assert!((ev.r - 380.0 / 120.0).abs() < 1e-12, "R = {}", ev.r);
        assert_eq!(ev.baseline(), BaselineKind::Dynamic);
        assert_eq!(ev.baseline_rounds, 3);
        assert_eq!(d[0].trace.as_ref().unwrap().op_counter, 5);
        assert_eq!(
            d[0].location_latency_ns, S,
            "window ended at T0 + 121 s, tick at 122 s"
        );
        assert_eq!(ev.window_end_ns, T0 + 121 * S);
        assert!(
            d[0].summary.contains("(P = 0.45 [") && d[0].summary.contains("1.00], R = 3.2)"),
            "{}",
            d[0].summary
        );
        let log = e.take_window_log();
        assert_eq!(log.len(), 2);
        assert!(!log[0].dynamic && log[1].dynamic);
        // Same episode: another slow window gives nothing new.
        round(
            &mut e,
            7,
            T0 + 130 * S,
            [500 * MS, 500 * MS, 500 * MS, 100 * MS],
        );
        assert!(e.tick(T0 + 181 * S).is_empty());
    }

    #[test]
    fn thinned_rounds_with_probe_gaps_read_like_consecutive_ones() {
        // The scenario of `entry_skew_inherited_from_the_previous_operation_is_not_computation`
        // as a thinning probe reports it: only every 16th round, each record carrying the
        // rank's computation gap (1 ms) since the unreported operation before it.
        let run = |with_gap: bool| {
            let mut e = Engine::new(slow_cfg());
            let mut k = 0u64;
            let mut run = |e: &mut Engine, t: u64, starts: [u64; 4], ends: [u64; 4]| {
                k += 1;
                for r in 0..4 {
                    let mut x = rec(4, 16 * k, r as u32, 4, OpState::Completed, 0);
                    x.start_ns = starts[r];
                    x.duration_ns = ends[r] - starts[r];
                    x.stride = 16;
                    x.gap_ns = with_gap.then_some(MS);
                    e.ingest(&x, t).unwrap();
                }
            };
            for i in 1..=4 {
                let s0 = 10 * S + i * 101 * MS;
                run(&mut e, T0 + i * S, [s0; 4], [s0 + 100 * MS; 4]);
            }
            // A slow link staggered the ends of the (unreported) operation before: the
            // reported one starts staggered, 1 ms after each rank's previous end.
            let base = 20 * S;
            let starts = [0, 1, 2, 3].map(|i| base + i * 250 * MS);
            run(&mut e, T0 + 70 * S, starts, [starts[3] + S; 4]);
            let d = e.tick(T0 + 122 * S);
            assert_eq!(d.len(), 1);
            let stats = e.stats().clone();
            assert_eq!(stats.rounds_evicted_incomplete, 0);
            assert_eq!(e.comm_state(4, T0 + 122 * S).unwrap().tracked_rounds, 0);
            d[0].clone()
        };
        let d = run(true);
        let ev = d.evidence.as_ref().unwrap();
        assert_eq!(ev.computation_lateness_ns, Some(0));
        assert_eq!(
            d.class(),
            AnomalyClass::S2CommunicationSlow,
            "{}",
            d.summary
        );
        assert_eq!(d.trace.as_ref().unwrap().op_counter, 80);
        // Without the gaps the rounds are not consecutive: eq. 4 decides (computation).
        let d = run(false);
        let ev = d.evidence.as_ref().unwrap();
        assert_eq!(ev.computation_lateness_ns, None);
        assert_ne!(
            d.class(),
            AnomalyClass::S2CommunicationSlow,
            "{}",
            d.summary
        );
    }

    #[test]
    fn ranks_on_different_strides_complete_the_common_rounds() {
        // Ranks 0..2 report every 8th round, rank 3 (briefly on a larger stride) every
        // 16th: the rounds all four report complete; the others stay partial and are
        // evicted once more than `max_rounds_per_comm` rounds are held: no hang, nothing
        // unbounded, and later complete rounds are not held back.
        let mut e = Engine::new(EngineConfig {
            max_rounds_per_comm: 8,
            ..slow_cfg()
        });
        for k in 1..=40u64 {
            let c = 8 * k;
            for r in 0..4u32 {
                if r == 3 && c % 16 != 0 {
                    continue;
                }
                let mut x = rec(4, c, r, 4, OpState::Completed, 100 * MS);
                x.stride = if r == 3 { 16 } else { 8 };
                e.ingest(&x, T0 + k * MS).unwrap();
            }
        }
        let st = e.comm_state(4, T0 + S).unwrap();
        assert_eq!(st.rounds_completed, 20, "rounds 16, 32, .., 320");
        assert!(st.tracked_rounds <= 8, "{}", st.tracked_rounds);
        assert!(e.stats().rounds_evicted_incomplete >= 12);
        let hangs = [
            AnomalyClass::H1NotEntered,
            AnomalyClass::H2Inconsistent,
            AnomalyClass::H3Hardware,
        ];
        assert!(e
            .tick(T0 + 400 * S)
            .iter()
            .all(|d| !hangs.contains(&d.class())));
        // A second completion of a round already finalized does not reopen it.
        let late = rec(4, 320, 3, 4, OpState::Completed, 100 * MS);
        assert!(matches!(
            e.ingest(&late, T0 + 2 * S),
            Err(Reject::DuplicateCompleted {
                op_counter: 320,
                ..
            })
        ));
        assert_eq!(e.comm_state(4, T0 + 2 * S).unwrap().rounds_completed, 20);
    }

    #[test]
    fn entry_skew_inherited_from_the_previous_operation_is_not_computation() {
        // Ranks enter every round 1 ms after their previous round ended (constant gap). The
        // baseline rounds end together. Round 5 (a slow ring link) ends staggered by 250 ms
        // per rank, so round 6 starts staggered although nobody computed longer; round 6 is
        // slow for everyone and ends together.
        let mut e = Engine::new(slow_cfg());
        let mut end = [10 * S; 4];
        let mut c = 0;
        let mut run = |e: &mut Engine, t: u64, ends: [u64; 4]| {
            c += 1;
            for r in 0..4 {
                let mut x = rec(4, c, r as u32, 4, OpState::Completed, 0);
                x.start_ns = end[r] + MS;
                x.duration_ns = ends[r] - x.start_ns;
                e.ingest(&x, t).unwrap();
            }
            end = ends;
        };
        for k in 1..=4 {
            let e_k = 10 * S + k * 101 * MS;
            run(&mut e, T0 + k * S, [e_k; 4]);
        }
        // T_base = 100 ms. Round 5 in a new window: durations 100 .. 850 ms, ends staggered.
        let base = 10 * S + 404 * MS;
        let staggered = [0, 1, 2, 3].map(|i| base + 101 * MS + i * 250 * MS);
        run(&mut e, T0 + 70 * S, staggered);
        // Round 6: everybody ends 1 s after the last start.
        run(&mut e, T0 + 71 * S, [staggered[3] + S; 4]);
        let d = e.tick(T0 + 122 * S);
        assert_eq!(d.len(), 1);
        let ev = d[0].evidence.as_ref().unwrap();
        // Eq. (4) sees T_max - T_min = 750 ms of entry skew and calls it computation...
        assert!(ev.p_paper > 0.6, "{}", ev.p_paper);
        // ...the gaps show it was inherited.
        assert_eq!(ev.computation_lateness_ns, Some(0));
        assert_eq!(ev.p, 0.0);
        assert_eq!(
            d[0].class(),
            AnomalyClass::S2CommunicationSlow,
            "{}",
            d[0].summary
        );
        assert!(d[0].summary.contains("eq. 4"), "{}", d[0].summary);
    }

    #[test]
    fn a_rank_starved_of_cpu_is_named_by_its_run_queue_delay() {
        // Communication-slow round (everyone 800 ms, no latecomer); rank 2's threads were
        // runnable but off the CPU for 6 s of the 10 s between its last two records.
        let mut e = Engine::new(slow_cfg());
        let round_cpu = |e: &mut Engine, c: u64, t: u64, d: u64, waits: [u64; 4]| {
            for (r, w) in waits.into_iter().enumerate() {
                let mut x = rec(4, c, r as u32, 4, OpState::Completed, d);
                x.start_ns = c * 10 * S + 5 * S - d;
                x.cpu_wait_ns = Some(w);
                e.ingest(&x, t).unwrap();
            }
        };
        for c in 1..=4 {
            round_cpu(&mut e, c, T0 + c * S, 100 * MS, [c * MS; 4]);
        }
        round_cpu(
            &mut e,
            5,
            T0 + 70 * S,
            800 * MS,
            [5 * MS, 5 * MS, 4 * MS + 6 * S, 5 * MS],
        );
        let d = e.tick(T0 + 121 * S);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].class(), AnomalyClass::S2CommunicationSlow);
        assert_eq!(d[0].roots.len(), 1, "{}", d[0].summary);
        assert_eq!(d[0].roots[0].rank, 2);
        assert!(
            d[0].roots[0].reason.contains("waited for a CPU 60%"),
            "{}",
            d[0].roots[0].reason
        );
        assert!(d[0].summary.contains("starved of CPU"), "{}", d[0].summary);
        // The same share spread over every rank (an oversubscribed machine) names nobody by
        // CPU wait.
        let mut e = Engine::new(slow_cfg());
        for c in 1..=4 {
            round_cpu(&mut e, c, T0 + c * S, 100 * MS, [c * MS; 4]);
        }
        round_cpu(&mut e, 5, T0 + 70 * S, 800 * MS, [4 * MS + 6 * S; 4]);
        let d = e.tick(T0 + 121 * S);
        assert_eq!(d.len(), 1);
        assert!(!d[0].summary.contains("starved of CPU"), "{}", d[0].summary);
    }

    /// A 4-rank job whose rank 2 is stopped (SIGSTOP/SIGCONT) for 60 ms inside every 8th
    /// operation from round 1500 on: every rank's duration grows in those rounds, nobody
    /// enters late. `frozen(r)` is the frozen time rank r's record of a stopped round adds
    /// (`None`: records without the field). Returns the diagnoses.
    fn stopped_inside_operations(frozen: impl Fn(u32) -> Option<u64>) -> Vec<wire::Diagnosis> {
        let mut e = Engine::new(EngineConfig {
            detect_window: Duration::from_secs(1),
            repeat_threshold: 3,
            ..cfg()
        });
        let (mut t, mut totals, mut out) = (T0, [0u64; 4], Vec::new());
        for c in 1..=2100u64 {
            let stopped = c > 1500 && c % 8 == 0;
            for r in 0..4u32 {
                let jitter = ((c * 7 + u64::from(r) * 3) % 5) * 50_000;
                let dur = MS + jitter + if stopped { 60 * MS } else { 0 };
                let mut x = rec(9, c, r, 4, OpState::Completed, dur);
                x.start_ns = t + MS;
                if stopped {
                    totals[r as usize] += frozen(r).unwrap_or(0);
                }
                x.frozen_ns = frozen(r).map(|_| totals[r as usize]);
                e.ingest(&x, t + MS + dur).unwrap();
            }
            t += MS + MS + if stopped { 60 * MS } else { 0 };
            out.extend(e.tick(t));
        }
        out
    }

    #[test]
    fn a_process_stopped_inside_operations_is_named_by_its_frozen_time() {
        let d = stopped_inside_operations(|r| Some(if r == 2 { 60 * MS } else { 0 }));
        assert!(!d.is_empty(), "no diagnosis");
        for x in &d {
            assert_eq!(x.roots.len(), 1, "{}", x.summary);
            assert_eq!(x.roots[0].rank, 2, "{}", x.summary);
            assert!(
                x.roots[0].reason.contains("frozen"),
                "{}",
                x.roots[0].reason
            );
            assert!(x.summary.contains("was frozen"), "{}", x.summary);
            assert_eq!(x.class(), AnomalyClass::S1ComputationSlow, "{}", x.summary);
        }
        // Without the frozen time the window verdicts see no late or long window: the stops
        // fall inside operations, one round in eight.
        assert!(stopped_inside_operations(|_| None).is_empty());
        // Every rank a thread of the stopped process: nobody stands out.
        assert!(stopped_inside_operations(|_| Some(60 * MS))
            .iter()
            .all(|x| !x.roots.iter().any(|r| r.reason.contains("frozen"))));
    }

    #[test]
    fn r_equal_to_theta_is_not_slow_and_p_picks_the_class() {
        let mut e = Engine::new(slow_cfg());
        for c in 1..=4 {
            round(&mut e, c, T0 + c * S, [100 * MS; 4]);
        }
        // T_base = 100 ms. T_max 400: R = 3.0, not > 3.
        round(
            &mut e,
            5,
            T0 + 70 * S,
            [400 * MS, 400 * MS, 400 * MS, 390 * MS],
        );
        assert!(e.tick(T0 + 121 * S).is_empty());
        // Communication-slow: everyone 800 ms, spread 20: R = 7, P = 20 / 700 < 0.4.
        round(
            &mut e,
            6,
            T0 + 130 * S,
            [800 * MS, 790 * MS, 780 * MS, 795 * MS],
        );
        let d = e.tick(T0 + 181 * S);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].class(), AnomalyClass::S2CommunicationSlow);
        let ev = d[0].evidence.as_ref().unwrap();
        assert!((ev.p_paper - 20.0 / 700.0).abs() < 1e-12);
        // Adjusted: rank 2 entered last with a gap 15 ms above the (lower) median gap.
        assert_eq!(ev.computation_lateness_ns, Some(15 * MS));
        assert!((ev.p - 15.0 / 700.0).abs() < 1e-12, "{}", ev.p);
        // Mixed: T_max 800, T_min 450 (entered 350 ms late): P = 350 / 700 = 0.5.
        let mut e = Engine::new(slow_cfg());
        for c in 1..=4 {
            round(&mut e, c, T0 + c * S, [100 * MS; 4]);
        }
        round(
            &mut e,
            5,
            T0 + 70 * S,
            [800 * MS, 450 * MS, 800 * MS, 800 * MS],
        );
        let d = e.tick(T0 + 121 * S);
        assert_eq!(d[0].class(), AnomalyClass::S3MixedSlow);
        assert_eq!(d[0].evidence.as_ref().unwrap().p, 0.5);
        // S1 candidate: rank 1; S2 candidates: none (no rank reports different rates).
        assert_eq!(d[0].roots.len(), 1);
        assert_eq!(
            (d[0].roots[0].rank, d[0].roots[0].class()),
            (1, AnomalyClass::S1ComputationSlow)
        );
    }

    #[test]
    fn operation_kinds_keep_separate_baselines() {
        // Small (1 ms) and large (500 ms) AllReduces alternate; one baseline for both would
        // be about 250 ms and flag every large one (R = 1 at theta 0.5 here).
        let mut e = Engine::new(EngineConfig {
            theta_slow: 0.5,
            ..slow_cfg()
        });
        let mut t = T0;
        for c in 1..=200u64 {
            let (bytes, d) = if c % 2 == 0 {
                (1 << 30, 500 * MS)
            } else {
                (1 << 10, MS)
            };
            for r in 0..4 {
                let mut x = rec(4, c, r, 4, OpState::Completed, d + u64::from(r) * MS / 10);
                x.op = Some(op(CollKind::AllReduce, bytes));
                e.ingest(&x, t).unwrap();
            }
            t += 2 * S;
            assert!(e.tick(t).is_empty(), "round {c}");
        }
        let log = e.take_window_log();
        assert!(log.iter().filter(|w| w.dynamic).count() >= 10);
        assert!(log.iter().all(|w| w.r < 0.5), "{log:?}");
    }

    #[test]
    fn random_junk_never_panics_and_stays_bounded() {
        let mut rng = crate::sim::Rng::new(42);
        let mut e = Engine::new(EngineConfig {
            max_comms: 8,
            max_rounds_per_comm: 8,
            hang_threshold: Duration::from_secs(5),
            detect_window: Duration::from_secs(3),
            silent_after: Duration::from_secs(2),
            ..EngineConfig::default()
        });
        let mut now = T0;
        let mut accepted = 0;
        for i in 0..20_000u64 {
            // Mostly consistent sizes per communicator (so that records get deep into the
            // engine), sometimes not.
            let comm = 1 + rng.below(12);
            let n = if rng.below(10) == 0 {
                1 + rng.below(6) as u32
            } else {
                1 + (comm % 6) as u32
            };
            let mut x = rec(
                comm,
                rng.below(40),
                rng.below(n.into()) as u32,
                n,
                match rng.below(3) {
                    0 => OpState::InFlight,
                    1 => OpState::Completed,
                    _ => OpState::Failed,
                },
                rng.below(20 * S),
            );
            let o = x.op.as_mut().unwrap();
            o.collective = if rng.below(20) == 0 {
                10
            } else {
                rng.below(10) as i32
            };
            o.algorithm = if rng.below(20) == 0 {
                3
            } else {
                rng.below(3) as i32
            };
            o.bytes = rng.below(8);
            o.peer = rng.below(9) as i32 - 1;
            o.tree_layer = (0..rng.below(3)).map(|_| rng.below(4) as u32).collect();
            x.start_ns = rng.below(1 << 40);
            x.channels = (0..rng.below(4))
                .map(|_| ChannelStat {
                    send_count: rng.below(100),
                    recv_count: rng.below(100),
                    expected_send: rng.below(3) * 50,
                    send_rate: rng.unit(),
                    wait_upstream_ns: (rng.below(2) == 0).then(|| rng.below(S)),
                    ring_next: (rng.below(2) == 0).then(|| rng.below(u64::from(n) + 1) as u32),
                    ..Default::default()
                })
                .collect();
            if e.ingest(&x, now).is_ok() {
                accepted += 1;
            }
            if i % 7 == 0 {
                e.heartbeat(
                    &wire::Heartbeat {
                        host: "j".into(),
                        pid: 1,
                        ranks: vec![wire::RankMembership {
                            comm_id: 1 + rng.below(12),
                            rank: rng.below(8) as u32,
                            nranks: 1 + rng.below(6) as u32,
                            last_op_counter: (rng.below(2) == 0).then(|| rng.below(50)),
                            last_p2p_counter: None,
                        }],
                        records_dropped: 0,
                        time_ns: 0,
                    },
                    now,
                );
            }
            if i % 50 == 0 {
                now += rng.below(2 * S);
                for d in e.tick(now) {
                    assert!(!d.summary.is_empty());
                }
                for id in e.comm_ids() {
                    assert!(e.comm_state(id, now).is_some());
                }
            }
        }
        // Deep paths were reached: rounds completed, hangs located, rounds evicted.
        let st = e.stats();
        assert!(accepted > 500, "{accepted}");
        assert!(
            st.rounds_completed > 0 && st.diagnoses > 0 && st.stale_records > 0,
            "{st:?}"
        );
        assert!(e.comm_ids().len() <= 8);
        assert!(e.memory_bytes() < 8 << 20, "{}", e.memory_bytes());
    }

    #[test]
    fn memory_is_bounded_when_rounds_never_complete() {
        let mut e = Engine::new(EngineConfig {
            max_rounds_per_comm: 16,
            ..cfg()
        });
        let n = 64;
        let mut mem = Vec::new();
        for c in 0..3000u64 {
            // Rank 0's completion records are lost: no round ever completes.
            for r in 1..n {
                e.ingest(&rec(8, c, r, n, OpState::Completed, MS), T0 + c * MS)
                    .unwrap();
            }
            if c == 1000 || c == 2999 {
                mem.push(e.memory_bytes());
            }
        }
        let st = e.comm_state(8, T0 + 3 * S).unwrap();
        assert_eq!(st.tracked_rounds, 16);
        assert!(mem[1] <= mem[0] + 4096, "memory grew: {mem:?}");
        assert!(e.stats().rounds_evicted_incomplete >= 2984);
        assert!(e.tick(T0 + 4 * S).is_empty());
    }

    #[test]
    fn comm_state_reports_every_rank_and_idle_comms_are_dropped() {
        let mut e = Engine::new(EngineConfig {
            comm_idle_evict: Duration::from_secs(100),
            ..cfg()
        });
        e.ingest(&rec(3, 1, 0, 3, OpState::Completed, 7 * MS), T0)
            .unwrap();
        e.ingest(&rec(3, 2, 0, 3, OpState::InFlight, 2 * S), T0 + 5 * S)
            .unwrap();
        let st = e.comm_state(3, T0 + 65 * S + 1).unwrap();
        assert_eq!(st.nranks, 3);
        assert_eq!(st.ranks.len(), 3);
        let r0 = &st.ranks[0];
        assert_eq!(
            (r0.last_op_counter, r0.state(), r0.records),
            (2, OpState::InFlight, 2)
        );
        assert_eq!(r0.in_flight_ns, 62 * S + 1);
        assert_eq!((r0.host.as_str(), r0.pid), ("h0", 100));
        assert!(r0.silent, "65 s without a report > silent_after 60 s");
        assert!(!st.ranks[1].reported && st.ranks[1].silent);
        assert_eq!(e.comm_ids(), vec![3]);
        assert_eq!(e.comm_summaries()[0].nranks, 3);
        assert!(e.comm_state(4, T0).is_none());
        e.tick(T0 + 106 * S);
        assert!(e.comm_ids().is_empty());
        assert_eq!(e.stats().comms_evicted, 1);
    }

    #[test]
    fn a_stored_cost_clock_measures_windows_closed_by_ingest() {
        // Slow windows close on the first record after their end (no tick): with a stored
        // clock the location step is still timed.
        fn fake_clock() -> u64 {
            use std::sync::atomic::{AtomicU64, Ordering};
            static T: AtomicU64 = AtomicU64::new(0);
            T.fetch_add(400, Ordering::Relaxed) + 400
        }
        let mut e = Engine::new(slow_cfg());
        e.set_cost_clock(fake_clock);
        round(&mut e, 1, T0 + S, [100 * MS, 90 * MS, 95 * MS, 99 * MS]);
        round(&mut e, 2, T0 + 2 * S, [120 * MS, 90 * MS, 95 * MS, 99 * MS]);
        round(&mut e, 3, T0 + 3 * S, [140 * MS, 90 * MS, 95 * MS, 99 * MS]);
        round(&mut e, 4, T0 + 4 * S, [110 * MS; 4]);
        assert!(e.tick(T0 + 61 * S).is_empty());
        let late = [500 * MS, 500 * MS, 500 * MS, 100 * MS];
        round(&mut e, 5, T0 + 70 * S, late);
        // Window 2 ends at T0 + 121 s: this round's records close it (no tick).
        round(&mut e, 6, T0 + 130 * S, [110 * MS; 4]);
        // Before window 3 ends: the tick only hands out what ingest found.
        let d = e.tick(T0 + 131 * S);
        assert_eq!(d.len(), 1);
        let cost = d[0].evidence.as_ref().unwrap().location_cost_ns;
        assert!(cost >= 400 && cost % 400 == 0, "location cost {cost}");
    }

    #[test]
    fn tick_with_clock_measures_location_cost() {
        let mut e = Engine::new(cfg());
        let t = feed_hang(&mut e, 4, None, (CollKind::AllReduce, 1 << 20));
        let mut fake = 1000u64;
        let mut clock = || {
            fake += 250;
            fake
        };
        let d = e.tick_with_clock(t, &mut clock);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].evidence.as_ref().unwrap().location_cost_ns, 250);
    }

    #[test]
    fn heartbeats_create_ranks_and_bad_memberships_are_skipped() {
        let mut e = Engine::new(cfg());
        let hb = wire::Heartbeat {
            host: "hx".into(),
            pid: 7,
            ranks: vec![
                wire::RankMembership {
                    comm_id: 1,
                    rank: 2,
                    nranks: 4,
                    last_op_counter: Some(9),
                    last_p2p_counter: None,
                },
                wire::RankMembership {
                    comm_id: 1,
                    rank: 5,
                    nranks: 4,
                    last_op_counter: None,
                    last_p2p_counter: None,
                },
                wire::RankMembership {
                    comm_id: 2,
                    rank: 0,
                    nranks: 0,
                    last_op_counter: None,
                    last_p2p_counter: None,
                },
            ],
            records_dropped: 0,
            time_ns: 0,
        };
        e.heartbeat(&hb, T0);
        assert_eq!(e.comm_ids(), vec![1]);
        let st = e.comm_state(1, T0).unwrap();
        assert!(st.ranks[2].reported);
        assert_eq!(st.ranks[2].last_op_counter, 9);
        assert_eq!(st.ranks[2].host, "hx");
    }
}
