//! Per-communicator state: rounds of per-rank entries, ranks, operation kinds, baselines.

use super::*;

pub(super) const ST_NONE: u8 = 0;
pub(super) const ST_INFLIGHT: u8 = 1;
pub(super) const ST_DONE: u8 = 2;
pub(super) const ST_FAILED: u8 = 3;
pub(super) const NO_TYPE: u16 = u16::MAX;
pub(super) const MAX_ALT_TYPES: usize = 15;

/// The comparable part of an op type set (tree layers excluded: they differ per rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct TypeKey {
    pub(super) coll: i32,
    pub(super) algo: i32,
    pub(super) proto: i32,
    pub(super) dtype: u32,
    pub(super) count: u64,
    pub(super) bytes: u64,
    pub(super) redop: i32,
    pub(super) root: i32,
    pub(super) peer: i32,
    pub(super) n_channels: u32,
}

impl TypeKey {
    pub(super) fn of(o: &wire::OpTypeSet) -> Self {
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

    pub(super) fn to_wire(self) -> wire::OpTypeSet {
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
    pub(super) fn p2p(&self) -> bool {
        self.coll == wire::CollKind::Send as i32 || self.coll == wire::CollKind::Recv as i32
    }
}

/// Operation kind with its own baseline: collective, algorithm, size class (power of 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct KindKey {
    pub(super) coll: i32,
    pub(super) algo: i32,
    pub(super) size_class: u8,
}

impl KindKey {
    pub(super) fn of(t: &TypeKey) -> Self {
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
pub(super) struct Entry {
    pub(super) state: u8,
    /// The duration is the probe's estimate (`OpRecord.duration_estimated`): the round's
    /// completion counts, its timing does not.
    pub(super) estimated: bool,
    pub(super) type_idx: u16,
    pub(super) send_rate: f32,
    pub(super) recv_rate: f32,
    pub(super) start_est_ns: u64,
    pub(super) duration_ns: u64,
    pub(super) send: u64,
    pub(super) recv: u64,
    pub(super) exp_send: u64,
    pub(super) exp_recv: u64,
    pub(super) wait_up: u64,
    pub(super) wait_down: u64,
    pub(super) group: u64,
    pub(super) depth: u32,
    /// Time between the end of the rank's previous operation on the communicator and the
    /// start of this one (its computation gap); `NO_GAP` when unknown.
    pub(super) gap_ns: u64,
    /// Time of that interval the rank spent in operations of its other communicators
    /// (`OpRecord.elsewhere_ns`; 0 when unknown).
    pub(super) elsewhere_ns: u64,
}

/// `Entry::gap_ns` when the rank's previous operation is unknown.
pub(super) const NO_GAP: u64 = u64::MAX;

/// The latest entrant's computation lateness in a round ([`detect::computation_lateness`]).
pub(super) fn round_lateness(es: &[Entry]) -> Option<u64> {
    let durations: Vec<u64> = es.iter().map(|e| e.duration_ns).collect();
    let gaps: Vec<Option<u64>> = es
        .iter()
        .map(|e| (e.gap_ns != NO_GAP).then_some(e.gap_ns))
        .collect();
    detect::computation_lateness(&durations, &gaps)
}

/// The part of a round's entry skew its latest entrant spent held up in its other
/// communicators ([`detect::lateness_elsewhere`]); 0 without allocating when nobody
/// spent time elsewhere (a rank with one communicator).
pub(super) fn round_elsewhere(es: &[Entry]) -> u64 {
    if es.iter().all(|e| e.elsewhere_ns == 0) {
        return 0;
    }
    let durations: Vec<u64> = es.iter().map(|e| e.duration_ns).collect();
    detect::lateness_elsewhere(&durations, es.iter().map(|e| e.elsewhere_ns).collect())
}

impl Default for Entry {
    fn default() -> Self {
        Entry {
            state: ST_NONE,
            estimated: false,
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
            elsewhere_ns: 0,
        }
    }
}

#[derive(Debug)]
pub(super) struct Round {
    pub(super) op_counter: u64,
    pub(super) entries: Vec<Entry>,
    pub(super) created_ns: u64,
    pub(super) present: u32,
    pub(super) done: u32,
    pub(super) failed: u32,
    pub(super) in_flight: u32,
    pub(super) types: Vec<TypeKey>,
    /// Cached lower bound of the start estimate of any in-flight entry (u64::MAX: none).
    pub(super) earliest_ns: u64,
    pub(super) finalized: bool,
}

impl Round {
    pub(super) fn new(op_counter: u64) -> Self {
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

    pub(super) fn barrier(&self, max_bytes: u64) -> bool {
        !self.types.is_empty()
            && self
                .types
                .iter()
                .all(|t| detect::is_barrier(t.coll, t.bytes, max_bytes))
    }

    pub(super) fn p2p(&self) -> bool {
        self.types.first().is_some_and(TypeKey::p2p)
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ChanAcc {
    pub(super) up_ns: u64,
    pub(super) down_ns: u64,
    pub(super) dur_ns: u64,
    pub(super) next: u32,
    pub(super) has_wait: bool,
    /// Time the channel's inbound messages spent on the wire (socket transport).
    pub(super) wire_ns: u64,
    pub(super) has_wire: bool,
}

/// Inbound wire time by sending peer over a window (`OpRecord.peer_wire`).
#[derive(Clone, Debug, Default)]
pub(super) struct PeerWireAcc {
    /// Summed durations of the timed completions that carried `peer_wire`.
    pub(super) dur_ns: u64,
    /// (sending rank, wire ns) summed over those completions.
    pub(super) from: Vec<(u32, u64)>,
}

impl PeerWireAcc {
    /// Adds one completion of `dur_ns` with its `peer_wire`, of rank `rank` of `nranks`.
    /// Entries naming no other rank of the communicator (junk from a client) are skipped,
    /// so the list stays within `nranks - 1` entries.
    pub(super) fn add(&mut self, dur_ns: u64, peers: &[wire::PeerWire], rank: u32, nranks: u32) {
        self.dur_ns = self.dur_ns.saturating_add(dur_ns);
        for p in peers.iter().filter(|p| p.from < nranks && p.from != rank) {
            match self.from.iter_mut().find(|x| x.0 == p.from) {
                Some(x) => x.1 = x.1.saturating_add(p.wire_ns),
                None => self.from.push((p.from, p.wire_ns)),
            }
        }
    }

    /// Each sending peer's share of the time on the wire.
    pub(super) fn shares(&self) -> impl Iterator<Item = (u32, f64)> + '_ {
        let d = self.dur_ns as f64;
        self.from
            .iter()
            .filter(move |_| d > 0.0)
            // A message of the next operation may start arriving before this one ends:
            // the share can pass 1 by a little.
            .map(move |&(f, w)| (f, (w as f64 / d).min(1.0)))
    }

    fn clear(&mut self) {
        self.dur_ns = 0;
        self.from.clear();
    }

    /// Closes a window: a window with evidence becomes `prev`, and this one starts empty.
    pub(super) fn roll_into(&mut self, prev: &mut PeerWireAcc) {
        if self.dur_ns > 0 {
            std::mem::swap(self, prev);
        }
        self.clear();
    }
}

#[derive(Debug)]
pub(super) struct RankInfo {
    pub(super) host: String,
    pub(super) pid: u32,
    pub(super) reported: bool,
    pub(super) newest_op: Option<u64>,
    /// Newest operation counter seen in this rank's records (heartbeats excluded).
    pub(super) newest_rec_op: Option<u64>,
    pub(super) last_seen_ns: u64,
    pub(super) last_state: u8,
    pub(super) last_op_start_ns: u64,
    pub(super) last_start_op: Option<u64>,
    pub(super) last_duration_ns: u64,
    pub(super) last_send: u64,
    pub(super) last_recv: u64,
    pub(super) last_send_rate: f32,
    pub(super) last_recv_rate: f32,
    pub(super) last_in_flight_start_est: u64,
    /// Newest completed operation of the rank and its end on the rank's clock (start +
    /// duration): the reference of the next operation's computation gap.
    pub(super) last_done_op: Option<u64>,
    pub(super) last_done_end_ns: u64,
    /// That end was timed (not `OpRecord.duration_estimated`): a gap can be measured from it.
    pub(super) last_done_timed: bool,
    /// Type set and counts of the rank's latest completed operation: the expected counts of
    /// a hung operation of the same type set when the probe does not report them.
    pub(super) done_ty: Option<TypeKey>,
    pub(super) done_send: u64,
    pub(super) done_recv: u64,
    pub(super) records: u64,
    /// Records the rank's process reported dropped (heartbeat, cumulative).
    pub(super) records_dropped: u64,
    /// The error of the rank's latest call that failed before it became an operation, as
    /// its latest heartbeat carried it (`RankMembership.last_call_error`: only while the
    /// rank started no operation since).
    pub(super) call_error: Option<String>,
    pub(super) win_ops: u32,
    /// Rounds of the window that this rank entered last, with a positive lateness.
    pub(super) win_last_in: u32,
    pub(super) win_send_rate: f64,
    pub(super) win_recv_rate: f64,
    pub(super) win_ch: Vec<ChanAcc>,
    /// `win_ch` of the latest closed window in which the rank completed an operation: the
    /// channel evidence of a rank whose records of a round arrived in the window before the
    /// round was complete (a peer's records came late, e.g. over a rate-limited link).
    pub(super) prev_ch: Vec<ChanAcc>,
    /// The window's inbound wire time by sending peer (`OpRecord.peer_wire`, Tree over
    /// sockets), and that of the latest closed window with some (as `prev_ch`).
    pub(super) win_pw: PeerWireAcc,
    pub(super) prev_pw: PeerWireAcc,
    /// The rank's threads' CPU wait (`OpRecord.cpu_wait_ns`).
    pub(super) cpu_wait: WindowShare,
    /// The time its process was frozen (`OpRecord.frozen_ns`).
    pub(super) frozen: WindowShare,
}

/// Shortest span over which a rank's share of the window ([`WindowShare`]) is computed.
pub(super) const SHARE_MIN_SPAN_NS: u64 = 100_000_000;

/// A cumulative time a rank's records carry (CPU wait, frozen time), read at the ends of
/// its completed operations: (end on the rank's clock, total) of the last one before the
/// window and of the newest one. Its growth over that span is the share of the window.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct WindowShare {
    pub(super) from: Option<(u64, u64)>,
    pub(super) to: Option<(u64, u64)>,
}

impl RankInfo {
    /// The channel accumulations that speak for the rank in the window being judged: this
    /// window's when it completed an operation in it, else those of its latest window with
    /// one.
    pub(super) fn window_channels(&self) -> &[ChanAcc] {
        if self.win_ops > 0 {
            &self.win_ch
        } else {
            &self.prev_ch
        }
    }

    /// The window's inbound wire time by sending peer, or, in a window without any, the
    /// latest closed window's (as [`RankInfo::window_channels`]).
    pub(super) fn window_peer_wire(&self) -> &PeerWireAcc {
        if self.win_pw.dur_ns > 0 {
            &self.win_pw
        } else {
            &self.prev_pw
        }
    }
}

impl WindowShare {
    pub(super) fn observe(&mut self, end_ns: u64, total: u64) {
        self.to = Some((end_ns, total));
        self.from.get_or_insert((end_ns, total));
    }

    /// A new window starts at the newest reading.
    pub(super) fn roll(&mut self) {
        self.from = self.to;
    }

    /// The share, `None` when unknown or the span is shorter than [`SHARE_MIN_SPAN_NS`].
    pub(super) fn share(&self) -> Option<f64> {
        let ((t0, w0), (t1, w1)) = (self.from?, self.to?);
        let span = t1.checked_sub(t0)?;
        (span >= SHARE_MIN_SPAN_NS).then(|| (w1.saturating_sub(w0) as f64 / span as f64).min(1.0))
    }
}

impl RankInfo {
    pub(super) fn new() -> Self {
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
            last_done_timed: false,
            done_ty: None,
            done_send: 0,
            done_recv: 0,
            records: 0,
            records_dropped: 0,
            call_error: None,
            win_ops: 0,
            win_last_in: 0,
            win_send_rate: 0.0,
            win_recv_rate: 0.0,
            win_ch: Vec::new(),
            prev_ch: Vec::new(),
            win_pw: PeerWireAcc::default(),
            prev_pw: PeerWireAcc::default(),
            cpu_wait: WindowShare::default(),
            frozen: WindowShare::default(),
        }
    }

    /// Share of the window this rank's threads waited for a CPU (runnable, not running);
    /// `None` when unknown or the span is short.
    pub(super) fn win_cpu_wait(&self) -> Option<f64> {
        self.cpu_wait.share()
    }

    /// Share of the window this rank's process was frozen; `None` when unknown or the span
    /// is short.
    pub(super) fn win_frozen(&self) -> Option<f64> {
        self.frozen.share()
    }

    pub(super) fn silent(&self, now_ns: u64, silent_after_ns: u64) -> bool {
        !self.reported || now_ns.saturating_sub(self.last_seen_ns) > silent_after_ns
    }
}

/// The widest round of a window for one op kind (eq. 2), with its per-rank detail.
#[derive(Debug)]
pub(super) struct BestRound {
    pub(super) op_counter: u64,
    pub(super) t_base_ns: u64,
    pub(super) baseline: BaselineKind,
    pub(super) m: u32,
    pub(super) ty: TypeKey,
    pub(super) entries: Vec<Entry>,
}

#[derive(Debug)]
pub(super) struct OpKind {
    pub(super) key: KindKey,
    pub(super) baseline: Baseline,
    pub(super) best: detect::WindowBest<BestRound>,
    /// The window's adjusted P over all its rounds (reset with `best`).
    pub(super) share: detect::LatenessShare,
    /// The largest R of the window's rounds by their T_max alone (eq. 2 against the T_base
    /// of the moment; reset with `best`): a round every rank spent long in, with no entry
    /// skew, is not the widest round but shows a slowdown all the same.
    pub(super) longest_r: f64,
    /// The self-calibrated threshold (None when disabled or for 1-rank communicators).
    pub(super) calib: Option<CommThreshold>,
}

#[derive(Debug)]
pub(super) struct Comm {
    pub(super) id: u64,
    pub(super) nranks: u32,
    pub(super) ranks: Vec<RankInfo>,
    /// Rounds held, sorted by counter (not necessarily consecutive).
    pub(super) rounds: VecDeque<Round>,
    /// Lowest counter still accepted: every round below it was finalized or evicted.
    pub(super) base: u64,
    pub(super) spare: Vec<Vec<Entry>>,
    pub(super) kinds: Vec<OpKind>,
    pub(super) created_ns: u64,
    pub(super) last_seen_ns: u64,
    pub(super) window_start_ns: u64,
    pub(super) streak: SlowStreak,
    pub(super) slow_onset_ns: u64,
    pub(super) hang_round: Option<u64>,
    pub(super) rounds_completed: u64,
    pub(super) anomaly_ids: Vec<String>,
    pub(super) algo: i32,
    /// Send/Recv groups in flight and the pair sequences entered (incident correlation).
    pub(super) p2p: crate::p2pwait::P2pWaits,
}

impl Comm {
    pub(super) fn new(id: u64, nranks: u32, now_ns: u64) -> Self {
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

    pub(super) fn take_entries(&mut self) -> Vec<Entry> {
        let n = self.nranks as usize;
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.resize(n, Entry::default());
        v
    }

    pub(super) fn recycle(&mut self, mut v: Vec<Entry>) {
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
    pub(super) fn round_index(
        &mut self,
        c: u64,
        max_rounds: usize,
        stats: &mut EngineStats,
    ) -> Option<usize> {
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

    pub(super) fn evict(&mut self, r: Round, stats: &mut EngineStats) {
        if !r.finalized && r.present > 0 {
            stats.rounds_evicted_incomplete += 1;
        }
        self.recycle(r.entries);
    }

    pub(super) fn pop_finalized(&mut self) {
        while self.rounds.front().is_some_and(|r| r.finalized) {
            if let Some(r) = self.rounds.pop_front() {
                self.base = r.op_counter + 1;
                self.recycle(r.entries);
            }
        }
    }

    pub(super) fn kind_index(&mut self, key: KindKey, cfg: &EngineConfig) -> usize {
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

    pub(super) fn heap_bytes(&self) -> usize {
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
                    + (r.win_ch.capacity() + r.prev_ch.capacity()) * std::mem::size_of::<ChanAcc>()
                    + (r.win_pw.from.capacity() + r.prev_pw.from.capacity())
                        * std::mem::size_of::<(u32, u64)>()
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
pub(super) fn self_calibration(cfg: &EngineConfig, nranks: u32) -> Option<CommThreshold> {
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
pub(super) struct JudgedRoot {
    pub(super) rank: u32,
    pub(super) by: JudgedBy,
}

/// What found a [`JudgedRoot`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum JudgedBy {
    /// The window's medians (dominant or significant latecomer): it entered last in
    /// `last_in` of the window's `rounds` rounds.
    Median { last_in: usize, rounds: usize },
    /// The blame rule (its extreme rounds), likewise counted; `share`: the others' waiting
    /// in those rounds as a share of the window's wall time.
    Blame {
        last_in: usize,
        rounds: usize,
        share: f64,
    },
    /// Its process's frozen time: its share of the window and the ranks' median share.
    Frozen { share: f64, median: f64 },
}

impl JudgedRoot {
    pub(super) fn of(v: &WindowVerdict) -> Option<JudgedRoot> {
        let rank = u32::try_from(v.root?).ok()?;
        let (last_in, rounds) = (v.root_last_in, v.rounds);
        v.late.then_some(JudgedRoot {
            rank,
            by: if v.blamed {
                JudgedBy::Blame {
                    last_in,
                    rounds,
                    share: v.blamed_window_share,
                }
            } else {
                JudgedBy::Median { last_in, rounds }
            },
        })
    }

    /// The most frozen rank of `comm`'s window (see [`locate::frozen`]), if one stands out.
    pub(super) fn frozen_of(comm: &Comm) -> Option<JudgedRoot> {
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

    pub(super) fn frozen(&self) -> bool {
        matches!(self.by, JudgedBy::Frozen { .. })
    }

    pub(super) fn reason(&self) -> String {
        match self.by {
            JudgedBy::Frozen { share, median } => format!(
                "its process was frozen {:.0}% of the window (neither running nor waiting for a CPU; median of the ranks {:.0}%): stopped (SIGSTOP, a debugger, a cgroup freezer) or swapping, while its peers waited for it",
                share * 100.0,
                median * 100.0
            ),
            JudgedBy::Blame {
                last_in,
                rounds,
                share,
            } => format!(
                "entered last in {last_in} of the window's {rounds} rounds, and in enough of its longest waits to hold at least half of the others' waiting, {:.0}% of the window's time (self-calibrated blame rule: an intermittently stopped or throttled rank)",
                share * 100.0
            ),
            JudgedBy::Median { last_in, rounds } => format!(
                "entered last in {last_in} of the window's {rounds} rounds while the others' waiting stood above this communicator's own recent spread (self-calibrated threshold)"
            ),
        }
    }
}

/// Whether a closed window is slow: by the self-calibrated judgement once the kind's
/// history can judge it (late or long), else by the paper's R > theta_slow.
pub(super) fn window_is_slow(r: f64, theta_slow: f64, calibrated: Option<&WindowVerdict>) -> bool {
    match calibrated {
        Some(v) if v.judged() => v.late || v.long,
        _ => r > theta_slow,
    }
}
