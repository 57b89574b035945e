//! The engine's configuration, its reject codes and its statistics.

use super::*;

/// Tunables of detection and location (CCL-D section 4.2).
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

pub(super) fn dur_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
