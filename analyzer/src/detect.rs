//! Detection formulas of CCL-D section 4.2.1, as pure functions and small state machines.
//!
//! * eq. (1) [`Baseline`]: T_base = T_base(init) while r <= m, then the mean of the per-round
//!   maximum durations of the first m rounds, m = min(`max_rounds`, rounds in `span`).
//! * eq. (2) [`WindowBest`]: per detection window, the round with the largest
//!   T_max - T_min; its T_max is the window's T_max.
//! * eq. (3) [`slowdown_ratio`]: R = (T_max - T_base) / T_base; slow if R > theta_slow.
//! * eq. (4) [`p_ratio`]: P = (T_max - T_min) / (T_max - T_base); [`classify_slow`].
//! * [`SlowStreak`]: the repetition counter (location only after repeated slow windows).
//! * [`is_barrier`]: AllReduce of fewer than 4 bytes is a barrier and is never diagnosed.

use crate::wire::{BaselineKind, CollKind};

/// R = (T_max - T_base) / T_base (eq. 3). A zero baseline gives +inf (or 0 if T_max is 0).
pub(crate) fn slowdown_ratio(t_max_ns: u64, t_base_ns: u64) -> f64 {
    if t_base_ns == 0 {
        return if t_max_ns == 0 { 0.0 } else { f64::INFINITY };
    }
    (t_max_ns as f64 - t_base_ns as f64) / t_base_ns as f64
}

/// P = (T_max - T_min) / (T_max - T_base) (eq. 4), clamped to [0, 1]; `None` when
/// T_max <= T_base (the round is not slower than the baseline, P is undefined).
pub(crate) fn p_ratio(t_max_ns: u64, t_min_ns: u64, t_base_ns: u64) -> Option<f64> {
    if t_max_ns <= t_base_ns {
        return None;
    }
    let num = t_max_ns.saturating_sub(t_min_ns) as f64;
    let den = (t_max_ns - t_base_ns) as f64;
    Some((num / den).clamp(0.0, 1.0))
}

/// The part of a round's entry skew the last-entering rank caused itself: its computation
/// gap (time between the end of its previous operation on the communicator and the start of
/// this one) minus the median gap of all ranks. `None` unless every rank's gap is known.
///
/// Why: eq. (4) reads T_max - T_min as "the others waited for a latecomer". In a loop where
/// every rank enters right after its previous collective, a slow ring link staggers the
/// completions of operation k - 1 and therefore the entries of operation k: T_max - T_min
/// grows although nobody computed longer. The gap separates the two: a computation-slow rank
/// has a long gap; a rank that entered late only because its previous operation ended late
/// has a normal one. `durations[i]` and `gaps[i]` belong to rank i; the latest entrant is the
/// rank with the shortest duration (the largest gap among ties).
pub(crate) fn computation_lateness(durations: &[u64], gaps: &[Option<u64>]) -> Option<u64> {
    if durations.len() != gaps.len() || gaps.len() < 2 {
        return None;
    }
    let known: Vec<u64> = gaps.iter().copied().collect::<Option<Vec<u64>>>()?;
    latest_above_median(durations, known)
}

/// The latest entrant's value (the rank with the shortest duration; the largest value among
/// ties) minus the lower median of all `values` (O(n) selection: with an even count the
/// smaller middle value, so that one late rank among two cannot raise the reference).
/// `None` for no ranks or mismatched lengths.
fn latest_above_median(durations: &[u64], mut values: Vec<u64>) -> Option<u64> {
    if durations.len() != values.len() {
        return None;
    }
    let t_min = durations.iter().copied().min()?;
    let latest = durations
        .iter()
        .zip(&values)
        .filter(|(d, _)| **d == t_min)
        .map(|(_, v)| *v)
        .max()?;
    let n = values.len();
    let median = *values.select_nth_unstable((n - 1) / 2).1;
    Some(latest.saturating_sub(median))
}

/// The part of a round's entry skew (T_max - T_min) that its latest entrant (the shortest
/// duration; the largest time elsewhere among ties) spent in operations of its other
/// communicators beyond the others: its `elsewhere[i]` minus the lower median of all,
/// at most the skew. 0 when nobody spent time elsewhere (or it is unknown).
///
/// Why: a rank of a data-parallel group and a tensor-parallel pair that waits for a slow
/// DP operation enters its next TP operation late, and its TP partner waits for it; its
/// computation gap (which the probe reports without the DP time) is normal, so the late
/// rule names nobody, but the partner's long wait would make the TP round *long*
/// (communication-slow) although nothing in TP is slow.
pub(crate) fn lateness_elsewhere(durations: &[u64], elsewhere: Vec<u64>) -> u64 {
    if durations.len() < 2 {
        return 0;
    }
    let (Some(&t_min), Some(&t_max)) = (durations.iter().min(), durations.iter().max()) else {
        return 0;
    };
    latest_above_median(durations, elsewhere).map_or(0, |l| l.min(t_max - t_min))
}

/// The window form of the adjusted P: the slowdown-weighted mean, over the rounds of a
/// detection window, of the latecomer's share of each round's slowdown,
/// sum(min(T_max - T_min, lateness, T_max - T_base)) / sum(T_max - T_base) over the rounds slower than
/// T_base whose lateness is known. One noisy round (a rank descheduled once) moves it
/// little, where eq. (2)'s widest round is precisely the noisiest one.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LatenessShare {
    num_ns: f64,
    den_ns: f64,
    rounds: u32,
}

impl LatenessShare {
    /// Adds one round.
    pub(crate) fn observe(
        &mut self,
        t_max_ns: u64,
        t_min_ns: u64,
        t_base_ns: u64,
        lateness_ns: Option<u64>,
    ) {
        let Some(l) = lateness_ns else { return };
        if t_max_ns <= t_base_ns {
            return;
        }
        let slowdown = t_max_ns - t_base_ns;
        // Each round's share is at most 1, as eq. (4) clamps P.
        self.num_ns += l.min(t_max_ns.saturating_sub(t_min_ns)).min(slowdown) as f64;
        self.den_ns += slowdown as f64;
        self.rounds += 1;
    }

    /// The share in [0, 1], `None` before any round counted.
    pub(crate) fn share(&self) -> Option<f64> {
        (self.rounds > 0 && self.den_ns > 0.0).then(|| (self.num_ns / self.den_ns).clamp(0.0, 1.0))
    }

    /// Rounds counted.
    #[cfg(test)]
    pub(crate) fn rounds(&self) -> u32 {
        self.rounds
    }
}

/// P of eq. (4) with the numerator limited to the latecomer's own computation lateness
/// ([`computation_lateness`]): (min(T_max - T_min, lateness)) / (T_max - T_base), clamped to
/// [0, 1]; `None` when T_max <= T_base. Without lateness (gaps unknown) this is eq. (4).
pub(crate) fn p_ratio_adjusted(
    t_max_ns: u64,
    t_min_ns: u64,
    t_base_ns: u64,
    lateness_ns: Option<u64>,
) -> Option<f64> {
    let skew = t_max_ns.saturating_sub(t_min_ns);
    let num = lateness_ns.map_or(skew, |l| l.min(skew));
    p_ratio(t_max_ns, t_max_ns.saturating_sub(num), t_base_ns)
}

/// Which slow class P points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlowKind {
    /// P > beta: a rank entered late (S1).
    Computation,
    /// P < alpha: every rank was slow in the communication itself (S2).
    Communication,
    /// alpha <= P <= beta: both (S3).
    Mixed,
}

/// Classifies P with the boundaries alpha < beta (paper: 0.4, 0.6).
pub(crate) fn classify_slow(p: f64, alpha: f64, beta: f64) -> SlowKind {
    if p > beta {
        SlowKind::Computation
    } else if p < alpha {
        SlowKind::Communication
    } else {
        SlowKind::Mixed
    }
}

/// True for a barrier: an AllReduce moving at most `barrier_max_bytes` bytes (PyTorch's
/// barrier is a 4-byte AllReduce).
pub(crate) fn is_barrier(collective: i32, bytes: u64, barrier_max_bytes: u64) -> bool {
    collective == CollKind::AllReduce as i32 && bytes <= barrier_max_bytes
}

/// The paper's SendRate/RecvRate: 1 / (sampling ticks in which the count changed); 0 when
/// the count never changed.
pub(crate) fn rate_from_ticks(ticks_with_change: u64) -> f64 {
    if ticks_with_change == 0 {
        0.0
    } else {
        1.0 / ticks_with_change as f64
    }
}

/// The baseline of eq. (1) for one kind of operation of one communicator.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Baseline {
    init_ns: u64,
    max_rounds: u32,
    span_ns: u64,
    first_ns: Option<u64>,
    sum_ns: u128,
    collected: u32,
    fixed: Option<(u64, u32)>,
    rounds: u64,
}

impl Baseline {
    /// A baseline that starts static at `init_ns` and averages at most `max_rounds` rounds
    /// finalized within `span_ns` of the first one.
    pub(crate) fn new(init_ns: u64, max_rounds: usize, span_ns: u64) -> Self {
        Baseline {
            init_ns,
            max_rounds: u32::try_from(max_rounds.max(1)).unwrap_or(u32::MAX),
            span_ns,
            first_ns: None,
            sum_ns: 0,
            collected: 0,
            fixed: None,
            rounds: 0,
        }
    }

    /// Feeds round r (its maximum duration across ranks), finalized at `now_ns`.
    pub(crate) fn observe(&mut self, t_max_ns: u64, now_ns: u64) {
        self.rounds += 1;
        if self.fixed.is_some() {
            return;
        }
        let first = *self.first_ns.get_or_insert(now_ns);
        if self.collected < self.max_rounds && now_ns.saturating_sub(first) <= self.span_ns {
            self.sum_ns += u128::from(t_max_ns);
            self.collected += 1;
        } else {
            // Round m + 1: m = rounds collected so far (>= 1, the first round always counts).
            let m = self.collected.max(1);
            let mean = u64::try_from(self.sum_ns / u128::from(m)).unwrap_or(u64::MAX);
            self.fixed = Some((mean, m));
        }
    }

    /// (T_base, kind, m): the static T_base(init) with m = 0 while r <= m, the dynamic mean after.
    pub(crate) fn current(&self) -> (u64, BaselineKind, u32) {
        match self.fixed {
            Some((t, m)) => (t, BaselineKind::Dynamic, m),
            None => (self.init_ns, BaselineKind::Static, 0),
        }
    }

    /// Rounds observed (r).
    #[cfg(test)]
    pub(crate) fn rounds(&self) -> u64 {
        self.rounds
    }
}

/// Eq. (2): keeps the round with the largest T_max - T_min seen in the current window.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct WindowBest<T> {
    best: Option<(u64, u64, T)>,
}

impl<T> WindowBest<T> {
    /// Empty window.
    pub(crate) fn new() -> Self {
        WindowBest { best: None }
    }

    /// True if a round with this T_max/T_min would replace the current best (strictly wider;
    /// the earlier round wins a tie).
    pub(crate) fn would_take(&self, t_max_ns: u64, t_min_ns: u64) -> bool {
        let range = t_max_ns.saturating_sub(t_min_ns);
        match &self.best {
            None => true,
            Some((m, n, _)) => range > m.saturating_sub(*n),
        }
    }

    /// Offers a round; returns the payload it displaced (or the offered one if rejected).
    pub(crate) fn offer(&mut self, t_max_ns: u64, t_min_ns: u64, payload: T) -> Option<T> {
        if self.would_take(t_max_ns, t_min_ns) {
            self.best
                .replace((t_max_ns, t_min_ns, payload))
                .map(|(_, _, p)| p)
        } else {
            Some(payload)
        }
    }

    /// The window's best round: (T_max, T_min, payload).
    pub(crate) fn get(&self) -> Option<&(u64, u64, T)> {
        self.best.as_ref()
    }

    /// Ends the window, returning its best round.
    pub(crate) fn take(&mut self) -> Option<(u64, u64, T)> {
        self.best.take()
    }
}

/// The repetition counter: consecutive slow windows; location fires once per episode when
/// the count reaches the threshold. A window with rounds that is not slow ends the episode;
/// a window without any round changes nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SlowStreak {
    count: u32,
    fired: bool,
}

impl SlowStreak {
    /// Feeds one closed window: `None` = no round in it, `Some(slow)` otherwise. Returns
    /// true exactly when location must run now.
    pub(crate) fn window(&mut self, slow: Option<bool>, threshold: u32) -> bool {
        match slow {
            None => false,
            Some(false) => {
                self.count = 0;
                self.fired = false;
                false
            }
            Some(true) => {
                self.count = self.count.saturating_add(1);
                if !self.fired && self.count >= threshold.max(1) {
                    self.fired = true;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Consecutive slow windows so far.
    pub(crate) fn count(&self) -> u32 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computation_lateness_of_the_latest_entrant() {
        // Rank 2 entered last (shortest duration) after a 25 ms longer gap.
        let d = [30, 31, 5, 30];
        let g = [Some(1), Some(2), Some(26), Some(1)];
        assert_eq!(computation_lateness(&d, &g), Some(25));
        // Entry skew inherited from the previous operation: equal gaps, no lateness.
        let g = [Some(1), Some(1), Some(1), Some(2)];
        assert_eq!(computation_lateness(&d, &g), Some(0));
        // A long gap at a rank that did not enter last does not count.
        let g = [Some(40), Some(1), Some(1), Some(1)];
        assert_eq!(computation_lateness(&d, &g), Some(0));
        // Ties for the shortest duration: the largest gap among them.
        assert_eq!(
            computation_lateness(&[5, 5, 9], &[Some(3), Some(10), Some(2)]),
            Some(7)
        );
        // Unknown gaps or mismatched lengths: no value.
        assert_eq!(
            computation_lateness(&d, &[Some(1), None, Some(1), Some(1)]),
            None
        );
        assert_eq!(computation_lateness(&d, &[Some(1)]), None);
        assert_eq!(computation_lateness(&[1], &[Some(1)]), None);
    }

    #[test]
    fn lateness_elsewhere_of_the_latest_entrant() {
        // Rank 2 entered last (shortest duration) after 30 ms in its other communicator,
        // the others after 5-6 ms (lower median 5): 25 ms of the 26 ms skew.
        let d = [30, 31, 5, 30];
        assert_eq!(lateness_elsewhere(&d, vec![5, 6, 30, 5]), 25);
        // Capped by the skew (26 ms).
        assert_eq!(lateness_elsewhere(&d, vec![0, 0, 90, 0]), 26);
        // Time elsewhere at another rank, or nobody's: nothing.
        assert_eq!(lateness_elsewhere(&d, vec![40, 1, 1, 1]), 0);
        assert_eq!(lateness_elsewhere(&d, vec![0, 0, 0, 0]), 0);
        // Two ranks: the lower median is the other one's.
        assert_eq!(lateness_elsewhere(&[700, 100], vec![50, 650]), 600);
        // Mismatched lengths or one rank: nothing.
        assert_eq!(lateness_elsewhere(&d, vec![1, 2]), 0);
        assert_eq!(lateness_elsewhere(&[5], vec![9]), 0);
    }

    #[test]
    fn lateness_share_weights_rounds_by_their_slowdown() {
        let mut w = LatenessShare::default();
        assert_eq!(w.share(), None);
        // Not slower than T_base, or lateness unknown: ignored.
        w.observe(10, 5, 10, Some(5));
        w.observe(40, 10, 10, None);
        assert_eq!((w.share(), w.rounds()), (None, 0));
        // Communication-slow rounds: no lateness.
        for _ in 0..9 {
            w.observe(40, 38, 10, Some(0));
        }
        // One noisy round whose widest spread is a descheduled rank.
        w.observe(50, 20, 10, Some(30));
        // 30 / (9 x 30 + 40) = 0.0968: still communication-slow.
        assert_eq!(w.rounds(), 10);
        assert!((w.share().unwrap() - 30.0 / 310.0).abs() < 1e-12);
        // Lateness is capped by the round's skew.
        let mut w = LatenessShare::default();
        w.observe(40, 30, 10, Some(25));
        assert_eq!(w.share(), Some(10.0 / 30.0));
        // ... and by the round's slowdown (P <= 1 per round).
        let mut w = LatenessShare::default();
        w.observe(40, 0, 10, Some(35));
        w.observe(40, 30, 10, Some(0));
        assert_eq!(w.share(), Some(30.0 / 60.0));
    }

    #[test]
    fn adjusted_p_limits_the_skew_to_the_lateness() {
        // T_max 40, T_min 10, T_base 10: eq. (4) gives 1.0.
        assert_eq!(p_ratio_adjusted(40, 10, 10, None), p_ratio(40, 10, 10));
        assert_eq!(p_ratio_adjusted(40, 10, 10, Some(30)), Some(1.0));
        assert_eq!(p_ratio_adjusted(40, 10, 10, Some(45)), Some(1.0));
        assert_eq!(p_ratio_adjusted(40, 10, 10, Some(15)), Some(0.5));
        assert_eq!(p_ratio_adjusted(40, 10, 10, Some(0)), Some(0.0));
        assert_eq!(p_ratio_adjusted(10, 5, 10, Some(5)), None);
    }

    #[test]
    fn slowdown_ratio_matches_hand_computation() {
        // T_max = 5 ms, T_base = 1 ms: R = (5 - 1) / 1 = 4.
        assert_eq!(slowdown_ratio(5_000_000, 1_000_000), 4.0);
        // T_max = 1.5 s, T_base = 2 s: R = -0.25.
        assert_eq!(slowdown_ratio(1_500_000_000, 2_000_000_000), -0.25);
        assert_eq!(slowdown_ratio(7, 0), f64::INFINITY);
        assert_eq!(slowdown_ratio(0, 0), 0.0);
    }

    #[test]
    fn p_ratio_matches_hand_computation() {
        // T_max 10, T_min 1, T_base 1: (10 - 1) / (10 - 1) = 1 (computation).
        assert_eq!(p_ratio(10, 1, 1), Some(1.0));
        // T_max 10, T_min 9, T_base 1: 1 / 9.
        assert!((p_ratio(10, 9, 1).unwrap() - 1.0 / 9.0).abs() < 1e-12);
        // T_max 11, T_min 6, T_base 1: 5 / 10 = 0.5 (mixed).
        assert_eq!(p_ratio(11, 6, 1), Some(0.5));
        // T_min below the baseline clamps to 1.
        assert_eq!(p_ratio(10, 0, 5), Some(1.0));
        assert_eq!(p_ratio(5, 1, 5), None);
        assert_eq!(p_ratio(4, 1, 5), None);
    }

    #[test]
    fn classify_uses_open_boundaries() {
        assert_eq!(classify_slow(0.61, 0.4, 0.6), SlowKind::Computation);
        assert_eq!(classify_slow(0.6, 0.4, 0.6), SlowKind::Mixed);
        assert_eq!(classify_slow(0.4, 0.4, 0.6), SlowKind::Mixed);
        assert_eq!(classify_slow(0.39, 0.4, 0.6), SlowKind::Communication);
    }

    #[test]
    fn barrier_is_allreduce_below_four_bytes_only() {
        assert!(is_barrier(CollKind::AllReduce as i32, 0, 4));
        assert!(is_barrier(CollKind::AllReduce as i32, 3, 4));
        assert!(is_barrier(CollKind::AllReduce as i32, 4, 4));
        assert!(!is_barrier(CollKind::AllReduce as i32, 5, 4));
        assert!(!is_barrier(CollKind::AllGather as i32, 1, 4));
    }

    #[test]
    fn rate_is_reciprocal_of_changing_ticks() {
        // Figure 6: 8 sends over 2 changing ticks = 1/2; over 7 ticks = 1/7.
        assert_eq!(rate_from_ticks(2), 0.5);
        assert!((rate_from_ticks(7) - 1.0 / 7.0).abs() < 1e-15);
        assert_eq!(rate_from_ticks(0), 0.0);
    }

    #[test]
    fn baseline_is_static_until_m_rounds_then_mean_of_first_m_maxima() {
        // m = max_rounds = 3: rounds 1..3 static; round 4 fixes mean(10, 20, 30) = 20.
        let mut b = Baseline::new(1000, 3, 1_000_000);
        for (i, t) in [10, 20, 30].into_iter().enumerate() {
            b.observe(t, i as u64);
            assert_eq!(b.current(), (1000, BaselineKind::Static, 0));
        }
        b.observe(500, 3);
        assert_eq!(b.current(), (20, BaselineKind::Dynamic, 3));
        b.observe(9999, 4);
        assert_eq!(
            b.current(),
            (20, BaselineKind::Dynamic, 3),
            "later rounds do not move it"
        );
        assert_eq!(b.rounds(), 5);
    }

    #[test]
    fn baseline_m_is_limited_by_the_time_span() {
        // Span 100 ns: rounds at t = 0, 50, 100 count (m = 3); the round at 101 fixes.
        let mut b = Baseline::new(7, 100, 100);
        b.observe(4, 0);
        b.observe(8, 50);
        b.observe(6, 100);
        assert_eq!(b.current().1, BaselineKind::Static);
        b.observe(1000, 101);
        assert_eq!(b.current(), (6, BaselineKind::Dynamic, 3));
    }

    #[test]
    fn window_best_keeps_the_widest_round() {
        let mut w = WindowBest::new();
        assert_eq!(w.offer(10, 8, 'a'), None);
        // range 5 > 2: replaces, returns the displaced payload.
        assert_eq!(w.offer(100, 95, 'b'), Some('a'));
        // range 50 wins although its T_max is smaller than a later round's.
        assert_eq!(w.offer(60, 10, 'c'), Some('b'));
        assert_eq!(w.offer(200, 190, 'd'), Some('d'));
        // tie: the earlier keeps it.
        assert_eq!(w.offer(70, 20, 'e'), Some('e'));
        assert_eq!(w.take(), Some((60, 10, 'c')));
        assert!(w.get().is_none());
    }

    #[test]
    fn streak_fires_once_per_episode_after_threshold() {
        let mut s = SlowStreak::default();
        assert!(!s.window(Some(true), 3));
        assert!(
            !s.window(None, 3),
            "an empty window neither counts nor resets"
        );
        assert!(!s.window(Some(true), 3));
        assert!(s.window(Some(true), 3));
        assert!(!s.window(Some(true), 3), "same episode");
        assert!(!s.window(Some(false), 3));
        assert_eq!(s.count(), 0);
        assert!(!s.window(Some(true), 1) || s.count() == 1);
        let mut t = SlowStreak::default();
        assert!(t.window(Some(true), 1));
        assert!(!t.window(Some(true), 1));
    }
}
