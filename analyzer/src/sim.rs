//! Deterministic rank simulator: record streams for K communicators x N ranks, ring or
//! tree, several collectives, jitter, barriers, checkpoint-like pauses, clean or with ONE
//! injected anomaly (H1/H2/H3/S1/S2/S3) at a chosen rank of communicator 0. Simulated time,
//! no sleeping; the same seed gives the same stream.
//!
//! Physical model (per round):
//! * every rank enters at the round start plus a small jitter (S1: the root rank enters
//!   `late_ns` later; S3: (slow_factor - 1) x op_ns later, so that P is about 0.5); the communication starts when the last rank entered and takes
//!   `op_ns` x (1 +- jitter) (S2/S3: x `slow_factor`), ranks finish together (lockstep);
//! * a rank's duration is its end minus its entry, so a late rank has the shortest duration;
//! * ring wait metrics (`ext_metrics`): time before the last entrant arrives is spent waiting
//!   upstream, except by the late rank's upstream neighbour which fills the FIFO and waits for
//!   downstream slots; a throttled link (S2/S3: the root's outgoing link on every channel) makes
//!   its sender wait downstream and every other rank wait upstream for (1 - 1/slow_factor) of
//!   the communication time;
//! * SendRate/RecvRate: 1 / (1 ms ticks with a count change); in a ring every rank sees the same
//!   ticks (lockstep); in a tree the throttled rank's sends trickle over every tick while its
//!   layer peers send in bursts;
//! * hangs (H3 counts, H1 partial progress): a pipelined dataflow model (ring: send/recv per
//!   step with `slots` FIFO slots; tree: reduce up then broadcast down, chunked) run to its
//!   fixed point with the faulty rank frozen after half of its primitives (H3) or never
//!   started (H1);
//! * in-flight snapshots every `snapshot_ns` while a rank is in an operation; completed
//!   records at its end; heartbeats every `heartbeat_ns` per process (one process per rank
//!   and communicator); the analyzer receives everything in batches every `batch_ns`.

mod dataflow;
pub mod recording;

use dataflow::tree_children;
pub use dataflow::{ring_dataflow, tree_dataflow, tree_layer, Frozen};

use std::collections::VecDeque;

use crate::engine::Engine;
use crate::wire::{self, AnomalyClass};

/// Ring or tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimAlgo {
    /// Pipelined ring; every collective of the mix.
    Ring,
    /// Binary tree (heap layout, layer = depth); AllReduce only, as NCCL.
    Tree,
}

/// How an H2 anomaly shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum H2Variant {
    /// The rank issues another operation (different collective and size) at the round.
    TypeMismatch,
    /// The rank completes the round (it ran a matching-looking but different op) and moves
    /// on to the next one, while its peers hang.
    Completes,
}

/// The injected anomaly (communicator 0 only).
#[derive(Clone, Debug, PartialEq)]
pub struct Injection {
    /// Class to inject (not `Unspecified`).
    pub class: AnomalyClass,
    /// Root-cause rank.
    pub rank: u32,
    /// Simulated time at which it begins (the first round starting at or after it).
    pub start_ns: u64,
    /// H1/H3: the root's process also stops reporting (SIGSTOP / dead process).
    pub silent: bool,
    /// H2 flavour.
    pub h2: H2Variant,
}

/// Simulator configuration. `Default` gives a small clean ring run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// PRNG seed.
    pub seed: u64,
    /// Number of communicators K.
    pub comms: usize,
    /// Ranks per communicator N.
    pub nranks: u32,
    /// Algorithm.
    pub algo: SimAlgo,
    /// Channels per operation.
    pub channels: u32,
    /// Odd channels use the reversed ring (different ring orders per channel).
    pub varied_rings: bool,
    /// Emit the per-channel wait extension metrics.
    pub ext_metrics: bool,
    /// Emit the expected SendCount/RecvCount (the schedule's totals); false sends 0.
    pub expected_counts: bool,
    /// Collectives cycled through, one per round (ring only).
    pub colls: Vec<wire::CollKind>,
    /// Bytes per operation.
    pub bytes: u64,
    /// Base communication time of one operation.
    pub op_ns: u64,
    /// Round period (operation plus computation between operations).
    pub period_ns: u64,
    /// Relative jitter of the communication time (uniform +-).
    pub jitter: f64,
    /// Every `barrier_every`-th round is a barrier (AllReduce of 0 bytes); 0 = none.
    pub barrier_every: u32,
    /// In barrier rounds one rank arrives this much later (checkpoint written before it).
    pub barrier_late_ns: u64,
    /// Round index at which all ranks pause (checkpoint) for `pause_ns` before it, and rank 0
    /// enters that round `late_once_ns` late; `None` = no pause.
    pub pause_round: Option<u64>,
    /// Length of the pause.
    pub pause_ns: u64,
    /// One-off late entry of rank 0 at `pause_round` (a single slow round).
    pub late_once_ns: u64,
    /// Simulated time to run.
    pub duration_ns: u64,
    /// In-flight snapshot interval.
    pub snapshot_ns: u64,
    /// Heartbeat interval.
    pub heartbeat_ns: u64,
    /// Batch interval (analyzer receive granularity).
    pub batch_ns: u64,
    /// Analyzer clock at simulated time 0.
    pub epoch_ns: u64,
    /// S1/S3: how late the root enters.
    pub late_ns: u64,
    /// S2/S3: slowdown of the throttled link.
    pub slow_factor: f64,
    /// FIFO slots per connection in the dataflow model.
    pub slots: u32,
    /// The anomaly, if any.
    pub inject: Option<Injection>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            comms: 1,
            nranks: 8,
            algo: SimAlgo::Ring,
            channels: 2,
            varied_rings: false,
            ext_metrics: true,
            expected_counts: true,
            colls: vec![
                wire::CollKind::AllReduce,
                wire::CollKind::AllGather,
                wire::CollKind::ReduceScatter,
                wire::CollKind::Broadcast,
            ],
            bytes: 64 << 20,
            op_ns: 200_000_000,
            period_ns: 5_000_000_000,
            jitter: 0.05,
            barrier_every: 0,
            barrier_late_ns: 0,
            pause_round: None,
            pause_ns: 0,
            late_once_ns: 0,
            duration_ns: 400_000_000_000,
            snapshot_ns: 5_000_000_000,
            heartbeat_ns: 10_000_000_000,
            batch_ns: 1_000_000_000,
            epoch_ns: 1_700_000_000_000_000_000,
            late_ns: 2_000_000_000,
            slow_factor: 6.0,
            slots: 2,
            inject: None,
        }
    }
}

/// Bad simulator configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// A parameter is out of its range.
    #[error("invalid simulator parameter {field}: {why}")]
    Invalid {
        /// Parameter.
        field: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

/// splitmix64: small, deterministic PRNG.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n) (0 if n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// Communicator id of communicator `k` of a simulation with `seed`.
pub fn comm_id(seed: u64, k: usize) -> u64 {
    let mut r = Rng::new(seed.wrapping_mul(31).wrapping_add(k as u64 + 1));
    r.next_u64() | 1
}

/// Host name of rank `rank` of communicator `k` (8 ranks per host).
pub fn host_name(k: usize, rank: u32) -> String {
    format!("c{k}h{}", rank / 8)
}

/// Process id of rank `rank` of communicator `k`.
pub fn pid_of(k: usize, nranks: u32, rank: u32) -> u32 {
    10_000 + (k as u32).saturating_mul(nranks) + rank
}

// ---------------------------------------------------------------------------------------
// Generator
// ---------------------------------------------------------------------------------------

#[derive(Debug)]
struct CommGen {
    k: usize,
    id: u64,
    next_round: u64,
    next_start: u64,
    hung: bool,
    events: VecDeque<(u64, wire::OpRecord)>,
    clock_off: Vec<u64>,
    newest: Vec<Option<u64>>,
    silent_from: Option<(u32, u64)>,
    seq: Vec<u64>,
    next_hb: u64,
    rng: Rng,
}

/// The simulator; iterate it for [`wire::TimedBatch`]es in time order.
#[derive(Debug)]
pub struct Sim {
    cfg: SimConfig,
    comms: Vec<CommGen>,
    t: u64,
}

/// What a simulation injected (the ground truth for tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truth {
    /// Communicator with the anomaly.
    pub comm_id: u64,
    /// Class.
    pub class: AnomalyClass,
    /// Root-cause rank.
    pub rank: u32,
}

struct RankPlan {
    enter: u64,
    end: u64,
    ty: wire::OpTypeSet,
    /// Per-channel (send, recv, expected send, expected recv) at completion / freeze.
    counts: Vec<(u64, u64, u64, u64)>,
    up: u64,
    down: u64,
    send_ticks: u64,
    recv_ticks: u64,
    completes: bool,
    /// Snapshots stop at this time (silent process).
    stop_at: u64,
    op: u64,
}

impl Sim {
    /// Validates `cfg` and builds the simulator.
    pub fn new(cfg: SimConfig) -> Result<Sim, SimError> {
        let bad = |field, why| Err(SimError::Invalid { field, why });
        if cfg.comms == 0 {
            return bad("comms", "must be >= 1");
        }
        if cfg.nranks < 2 {
            return bad("nranks", "must be >= 2");
        }
        if cfg.channels == 0 || cfg.channels > 64 {
            return bad("channels", "must be 1..=64");
        }
        if cfg.colls.is_empty() {
            return bad("colls", "must not be empty");
        }
        if cfg.op_ns == 0 || cfg.period_ns < cfg.op_ns {
            return bad("period_ns", "must be >= op_ns > 0");
        }
        if cfg.snapshot_ns == 0 || cfg.heartbeat_ns == 0 || cfg.batch_ns == 0 {
            return bad("snapshot_ns/heartbeat_ns/batch_ns", "must be > 0");
        }
        if !(0.0..1.0).contains(&cfg.jitter) {
            return bad("jitter", "must be in [0, 1)");
        }
        if cfg.slow_factor < 1.0 {
            return bad("slow_factor", "must be >= 1");
        }
        if cfg.slots == 0 {
            return bad("slots", "must be >= 1");
        }
        if let Some(i) = &cfg.inject {
            if i.rank >= cfg.nranks {
                return bad("inject.rank", "must be < nranks");
            }
            if i.class == AnomalyClass::Unspecified {
                return bad("inject.class", "must be a class");
            }
        }
        let mut master = Rng::new(cfg.seed);
        let comms = (0..cfg.comms)
            .map(|k| {
                let mut rng = Rng::new(master.next_u64());
                CommGen {
                    k,
                    id: comm_id(cfg.seed, k),
                    next_round: 1,
                    next_start: rng.below(cfg.period_ns),
                    hung: false,
                    events: VecDeque::new(),
                    clock_off: (0..cfg.nranks).map(|_| rng.below(1 << 50)).collect(),
                    newest: vec![None; cfg.nranks as usize],
                    silent_from: None,
                    seq: vec![0; cfg.nranks as usize],
                    next_hb: rng.below(cfg.heartbeat_ns),
                    rng,
                }
            })
            .collect();
        Ok(Sim { cfg, comms, t: 0 })
    }

    /// The injected anomaly, if any.
    pub fn truth(&self) -> Option<Truth> {
        self.cfg.inject.as_ref().map(|i| Truth {
            comm_id: self.comms[0].id,
            class: i.class,
            rank: i.rank,
        })
    }

    /// Communicator ids, in order.
    pub fn comm_ids(&self) -> Vec<u64> {
        self.comms.iter().map(|c| c.id).collect()
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    fn type_set(cfg: &SimConfig, coll: wire::CollKind, bytes: u64, rank: u32) -> wire::OpTypeSet {
        let algo = match cfg.algo {
            SimAlgo::Ring => wire::Algorithm::Ring,
            SimAlgo::Tree => wire::Algorithm::Tree,
        };
        let reduces = matches!(
            coll,
            wire::CollKind::AllReduce | wire::CollKind::ReduceScatter
        );
        wire::OpTypeSet {
            collective: coll as i32,
            algorithm: algo as i32,
            protocol: wire::Protocol::Simple as i32,
            dtype: 7,
            count: bytes / 4,
            bytes,
            redop: if reduces { 0 } else { -1 },
            root: if coll == wire::CollKind::Broadcast {
                0
            } else {
                -1
            },
            peer: -1,
            n_channels: cfg.channels,
            tree_layer: match cfg.algo {
                SimAlgo::Ring => Vec::new(),
                SimAlgo::Tree => vec![tree_layer(rank); cfg.channels as usize],
            },
        }
    }

    /// Steps per channel a completed rank did (send, recv) for `coll`.
    fn complete_counts(cfg: &SimConfig, coll: wire::CollKind, rank: u32) -> (u64, u64) {
        let n = u64::from(cfg.nranks);
        match cfg.algo {
            SimAlgo::Tree => {
                let kids = tree_children(rank as usize, cfg.nranks as usize).count() as u64;
                let chunks = 8;
                let root = rank == 0;
                let send = chunks * (u64::from(!root) + kids);
                let recv = chunks * (kids + u64::from(!root));
                (send, recv)
            }
            SimAlgo::Ring => match coll {
                wire::CollKind::AllReduce => (2 * (n - 1), 2 * (n - 1)),
                wire::CollKind::Broadcast => {
                    // Chain from root 0: the last rank only receives, the root only sends.
                    let last = rank + 1 == cfg.nranks;
                    (u64::from(!last) * 4, u64::from(rank != 0) * 4)
                }
                _ => (n - 1, n - 1),
            },
        }
    }

    fn ring_next(cfg: &SimConfig, j: u32, ch: u32) -> u32 {
        if cfg.varied_rings && ch % 2 == 1 {
            (j + cfg.nranks - 1) % cfg.nranks
        } else {
            (j + 1) % cfg.nranks
        }
    }

    fn ring_prev(cfg: &SimConfig, j: u32, ch: u32) -> u32 {
        if cfg.varied_rings && ch % 2 == 1 {
            (j + 1) % cfg.nranks
        } else {
            (j + cfg.nranks - 1) % cfg.nranks
        }
    }

    /// Generates round `g.next_round` into `g.events`.
    fn gen_round(cfg: &SimConfig, g: &mut CommGen) {
        let n = cfg.nranks;
        let r = g.next_round;
        let mut t0 = g.next_start;
        if cfg.pause_round == Some(r) {
            t0 += cfg.pause_ns;
        }
        let inj = if g.k == 0 { cfg.inject.as_ref() } else { None };
        let active = inj.filter(|i| t0 >= i.start_ns);
        let class = active.map(|i| i.class);
        let root = active.map_or(u32::MAX, |i| i.rank);
        let is_hang = matches!(
            class,
            Some(
                AnomalyClass::H1NotEntered
                    | AnomalyClass::H2Inconsistent
                    | AnomalyClass::H3Hardware
            )
        );
        let late = matches!(
            class,
            Some(AnomalyClass::S1ComputationSlow | AnomalyClass::S3MixedSlow)
        );
        let throttled = matches!(
            class,
            Some(AnomalyClass::S2CommunicationSlow | AnomalyClass::S3MixedSlow)
        );
        let barrier = cfg.barrier_every > 0 && r.is_multiple_of(u64::from(cfg.barrier_every));
        let coll = if barrier || cfg.algo == SimAlgo::Tree {
            wire::CollKind::AllReduce
        } else {
            cfg.colls[(r as usize) % cfg.colls.len()]
        };
        let bytes = if barrier { 0 } else { cfg.bytes };
        let rng = &mut g.rng;
        let jit = 1.0 + cfg.jitter * (2.0 * rng.unit() - 1.0);
        let mut comm_ns = (cfg.op_ns as f64 * jit) as u64;
        if barrier {
            comm_ns = (cfg.op_ns / 20).max(1);
        }
        let factor = if throttled && !barrier {
            cfg.slow_factor
        } else {
            1.0
        };
        comm_ns = (comm_ns as f64 * factor) as u64;
        let mut enter: Vec<u64> = (0..n).map(|_| t0 + rng.below(cfg.op_ns / 50 + 1)).collect();
        if barrier && cfg.barrier_late_ns > 0 {
            enter[(r % u64::from(n)) as usize] += cfg.barrier_late_ns;
        }
        if cfg.pause_round == Some(r) {
            enter[0] += cfg.late_once_ns;
        }
        if late && !barrier {
            // S3 enters late by (slow_factor - 1) x op_ns, so that the computation and the
            // communication delay contribute equally (P about 0.5).
            enter[root as usize] += if class == Some(AnomalyClass::S3MixedSlow) {
                (cfg.op_ns as f64 * (cfg.slow_factor - 1.0)) as u64
            } else {
                cfg.late_ns
            };
        }
        let last = *enter.iter().max().unwrap_or(&t0);
        let late_rank = enter
            .iter()
            .enumerate()
            .max_by_key(|(_, e)| **e)
            .map_or(0, |(j, _)| j as u32);
        let end: Vec<u64> = (0..n)
            .map(|_| last + comm_ns + rng.below(cfg.op_ns / 200 + 1))
            .collect();
        let nch = cfg.channels;
        let ticks = (comm_ns / 1_000_000).max(1);
        let ty = |j: u32| Self::type_set(cfg, coll, bytes, j);
        let mut plans: Vec<RankPlan> = Vec::with_capacity(n as usize);
        // Hang counts from the dataflow model.
        let frozen = if is_hang {
            let limit: Vec<Option<u64>> = (0..n)
                .map(|j| {
                    if j != root {
                        None
                    } else if class == Some(AnomalyClass::H1NotEntered) {
                        Some(0)
                    } else if class == Some(AnomalyClass::H3Hardware) {
                        Some(match cfg.algo {
                            SimAlgo::Ring => 2 * (u64::from(n) - 1),
                            SimAlgo::Tree => {
                                let kids = tree_children(j as usize, n as usize).count() as u64;
                                4 * (kids + u64::from(j != 0))
                            }
                        })
                    } else {
                        Some(1)
                    }
                })
                .collect();
            Some(match cfg.algo {
                SimAlgo::Ring => ring_dataflow(
                    n as usize,
                    2 * (u64::from(n) - 1),
                    u64::from(cfg.slots),
                    &limit,
                ),
                SimAlgo::Tree => tree_dataflow(n as usize, 8, u64::from(cfg.slots), &limit),
            })
        } else {
            None
        };
        let far = u64::MAX / 4;
        for j in 0..n {
            let ju = j as usize;
            let mut t = ty(j);
            let mut completes = !is_hang;
            let mut op = r;
            let mut stop_at = far;
            let (cs, cr) = match &frozen {
                Some(f) => (f.counts[ju].0, f.counts[ju].1),
                None => Self::complete_counts(cfg, coll, j),
            };
            let (es, er) = match &frozen {
                Some(f) => f.expected[ju],
                None => Self::complete_counts(cfg, coll, j),
            };
            if j == root && is_hang {
                match class {
                    Some(AnomalyClass::H2Inconsistent)
                        if inj.is_some_and(|i| i.h2 == H2Variant::TypeMismatch) =>
                    {
                        t = Self::type_set(cfg, wire::CollKind::AllGather, bytes * 2, j);
                        if cfg.algo == SimAlgo::Tree {
                            t.count *= 2;
                        }
                    }
                    Some(AnomalyClass::H2Inconsistent) => completes = true,
                    _ => {}
                }
                if inj.is_some_and(|i| i.silent) {
                    // Stopped after its first two in-flight snapshots went out.
                    stop_at = enter[ju] + 2 * cfg.snapshot_ns + 1;
                }
            }
            // Wait metrics (ring).
            let wait_before = last - enter[ju];
            let mut up = 0;
            let mut down = 0;
            if cfg.algo == SimAlgo::Ring && cfg.ext_metrics {
                let noise = |rng: &mut Rng| (comm_ns as f64 * 0.03 * rng.unit()) as u64;
                up += noise(rng);
                down += noise(rng);
                if Self::ring_next(cfg, j, 0) == late_rank && j != late_rank {
                    down += wait_before;
                } else {
                    up += wait_before;
                }
                if throttled {
                    let extra = (comm_ns as f64 * (1.0 - 1.0 / cfg.slow_factor)) as u64;
                    if j == root {
                        down += extra;
                    } else {
                        up += extra;
                    }
                }
            }
            // Counts change on the same ticks on every rank of a ring (lockstep); in a tree
            // each rank's own step count bounds its changing ticks.
            let (mut send_ticks, mut recv_ticks) = match cfg.algo {
                SimAlgo::Ring => {
                    let t = ticks.min(2 * u64::from(n));
                    (t, t)
                }
                SimAlgo::Tree => (ticks.min(cs.max(1)), ticks.min(cr.max(1))),
            };
            if cfg.algo == SimAlgo::Tree && throttled {
                if j == root {
                    send_ticks = ticks;
                } else {
                    send_ticks = ((send_ticks as f64) / cfg.slow_factor).max(1.0) as u64;
                    recv_ticks = ((recv_ticks as f64) / cfg.slow_factor).max(1.0) as u64;
                }
            }
            let counts = (0..nch).map(|_| (cs, cr, es, er)).collect();
            let _ = &mut op;
            plans.push(RankPlan {
                enter: enter[ju],
                end: end[ju],
                ty: t,
                counts,
                up,
                down,
                send_ticks,
                recv_ticks,
                completes,
                stop_at,
                op,
            });
        }
        let sim_end = cfg.duration_ns;
        for (j, p) in plans.iter().enumerate() {
            let j = j as u32;
            if is_hang && j == root && class == Some(AnomalyClass::H1NotEntered) {
                continue;
            }
            let mut end_j = p.end;
            if !p.completes {
                end_j = far;
            } else if is_hang {
                end_j = p.enter + comm_ns; // the H2 root finishes its own op
            }
            // Snapshots.
            let mut t = p.enter + cfg.snapshot_ns;
            while t < end_j && t < sim_end && t < p.stop_at {
                let frac = if p.completes {
                    ((t.saturating_sub(last)) as f64 / comm_ns as f64).clamp(0.0, 1.0)
                } else {
                    ((t - p.enter) as f64 / comm_ns as f64).clamp(0.0, 1.0)
                };
                let rec = Self::record(
                    cfg,
                    g,
                    j,
                    p,
                    t,
                    t - p.enter,
                    frac,
                    wire::OpState::InFlight,
                    p.op,
                );
                g.events.push_back((t, rec));
                t += cfg.snapshot_ns;
            }
            if p.completes && end_j < sim_end {
                let at = end_j + (cfg.batch_ns / 10).min(50_000_000);
                let rec = Self::record(
                    cfg,
                    g,
                    j,
                    p,
                    at,
                    end_j - p.enter,
                    1.0,
                    wire::OpState::Completed,
                    p.op,
                );
                g.events.push_back((at, rec));
            }
            if is_hang && j == root && class == Some(AnomalyClass::H2Inconsistent) && p.completes {
                // Moves on to the next round and hangs there.
                let enter2 = end_j + (cfg.period_ns - cfg.op_ns);
                let p2 = RankPlan {
                    enter: enter2,
                    end: far,
                    ty: ty(j),
                    counts: p.counts.iter().map(|c| (0, 0, c.2, c.3)).collect(),
                    up: 0,
                    down: 0,
                    send_ticks: 1,
                    recv_ticks: 1,
                    completes: false,
                    stop_at: far,
                    op: r + 1,
                };
                let mut t = enter2 + cfg.snapshot_ns;
                while t < sim_end {
                    let rec = Self::record(
                        cfg,
                        g,
                        j,
                        &p2,
                        t,
                        t - enter2,
                        0.0,
                        wire::OpState::InFlight,
                        r + 1,
                    );
                    g.events.push_back((t, rec));
                    t += cfg.snapshot_ns;
                }
            }
        }
        if let (true, Some(i)) = (is_hang, active) {
            g.hung = true;
            if i.silent {
                let at = if i.class == AnomalyClass::H1NotEntered {
                    t0
                } else {
                    plans[i.rank as usize].stop_at
                };
                g.silent_from = Some((i.rank, at));
            }
        }
        let round_end = end.iter().copied().max().unwrap_or(last);
        g.next_start = round_end + (cfg.period_ns - cfg.op_ns);
        g.next_round += 1;
        g.events.make_contiguous().sort_by_key(|e| e.0);
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        cfg: &SimConfig,
        g: &mut CommGen,
        rank: u32,
        p: &RankPlan,
        _at: u64,
        duration: u64,
        frac: f64,
        state: wire::OpState,
        op: u64,
    ) -> wire::OpRecord {
        let ju = rank as usize;
        g.seq[ju] += 1;
        let scale = |x: u64| (x as f64 * frac).round() as u64;
        let secs = (duration as f64 / 1e9).max(1e-9);
        let channels = p
            .counts
            .iter()
            .enumerate()
            .map(|(c, &(s, r, es, er))| {
                let (s, r) = if state == wire::OpState::Completed || frac >= 1.0 {
                    (s, r)
                } else {
                    (scale(s), scale(r))
                };
                let ring = cfg.algo == SimAlgo::Ring;
                wire::ChannelStat {
                    send_count: s,
                    recv_count: r,
                    expected_send: if cfg.expected_counts { es } else { 0 },
                    expected_recv: if cfg.expected_counts { er } else { 0 },
                    send_rate: crate::detect::rate_from_ticks(p.send_ticks),
                    recv_rate: crate::detect::rate_from_ticks(p.recv_ticks),
                    send_per_sec: s as f64 / secs,
                    recv_per_sec: r as f64 / secs,
                    wait_upstream_ns: (ring && cfg.ext_metrics).then(|| scale_u(p.up, frac, state)),
                    wait_downstream_ns: (ring && cfg.ext_metrics)
                        .then(|| scale_u(p.down, frac, state)),
                    ring_prev: ring.then(|| Self::ring_prev(cfg, rank, c as u32)),
                    ring_next: ring.then(|| Self::ring_next(cfg, rank, c as u32)),
                    ext: Default::default(),
                }
            })
            .collect();
        wire::OpRecord {
            trace: Some(wire::TraceId {
                comm_id: g.id,
                op_counter: op,
                extension: 0,
            }),
            rank,
            nranks: cfg.nranks,
            host: host_name(g.k, rank),
            pid: pid_of(g.k, cfg.nranks, rank),
            op: Some(p.ty.clone()),
            start_ns: g.clock_off[ju] + p.enter,
            duration_ns: duration,
            channels,
            state: state as i32,
            seq: g.seq[ju],
            device: -1,
            cpu_wait_ns: None,
            frozen_ns: None,
            duration_estimated: false,
            elsewhere_ns: None,
            peer_wire: Vec::new(),
            gap_ns: None,
            stride: 0,
            failure: 0,
            peer_lost: None,
            mismatch: None,
            seq_space: 0,
            p2p: Vec::new(),
        }
    }

    /// The next batch (analyzer receive time = end of the batch interval), or `None` when
    /// the simulated duration is over.
    pub fn next_batch(&mut self) -> Option<wire::TimedBatch> {
        let cfg = &self.cfg;
        if self.t >= cfg.duration_ns {
            return None;
        }
        let t_end = (self.t + cfg.batch_ns).min(cfg.duration_ns);
        let mut batch = wire::Batch::default();
        for g in &mut self.comms {
            while !g.hung && g.next_start < t_end {
                Self::gen_round(cfg, g);
            }
            while g.events.front().is_some_and(|e| e.0 < t_end) {
                if let Some((_, rec)) = g.events.pop_front() {
                    if let Some(c) = rec.trace.as_ref().map(|t| t.op_counter) {
                        let n = &mut g.newest[rec.rank as usize];
                        *n = Some(n.map_or(c, |x| x.max(c)));
                    }
                    batch.records.push(rec);
                }
            }
            while g.next_hb < t_end {
                let at = g.next_hb;
                for j in 0..cfg.nranks {
                    if g.silent_from.is_some_and(|(r, from)| r == j && at >= from) {
                        continue;
                    }
                    batch.heartbeats.push(wire::Heartbeat {
                        host: host_name(g.k, j),
                        pid: pid_of(g.k, cfg.nranks, j),
                        ranks: vec![wire::RankMembership {
                            comm_id: g.id,
                            rank: j,
                            nranks: cfg.nranks,
                            last_op_counter: g.newest[j as usize],
                            last_p2p_counter: None,
                            last_call_error: None,
                        }],
                        records_dropped: 0,
                        time_ns: g.clock_off[j as usize] + at,
                    });
                }
                g.next_hb += cfg.heartbeat_ns;
            }
        }
        self.t = t_end;
        Some(wire::TimedBatch {
            now_ns: cfg.epoch_ns + t_end,
            batch: Some(batch),
        })
    }
}

fn scale_u(x: u64, frac: f64, state: wire::OpState) -> u64 {
    if state == wire::OpState::Completed {
        x
    } else {
        (x as f64 * frac.clamp(0.0, 1.0)) as u64
    }
}

impl Iterator for Sim {
    type Item = wire::TimedBatch;

    fn next(&mut self) -> Option<wire::TimedBatch> {
        self.next_batch()
    }
}

/// Outcome of [`drive`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DriveResult {
    /// Every diagnosis, in emission order.
    pub diagnoses: Vec<wire::Diagnosis>,
    /// Records accepted / rejected.
    pub accepted: u64,
    /// Records rejected.
    pub rejected: u64,
    /// First rejection messages (up to 10).
    pub reasons: Vec<String>,
    /// Batches fed.
    pub batches: u64,
}

/// Feeds timed batches into `engine` (records, then heartbeats, then a tick at the batch's
/// time) and collects the diagnoses.
pub fn drive(
    batches: impl IntoIterator<Item = wire::TimedBatch>,
    engine: &mut Engine,
) -> DriveResult {
    let mut out = DriveResult::default();
    for tb in batches {
        let now = tb.now_ns;
        if let Some(b) = tb.batch.as_ref() {
            for rec in &b.records {
                match engine.ingest(rec, now) {
                    Ok(()) => out.accepted += 1,
                    Err(e) => {
                        out.rejected += 1;
                        if out.reasons.len() < 10 {
                            out.reasons.push(e.to_string());
                        }
                    }
                }
            }
            for hb in &b.heartbeats {
                engine.heartbeat(hb, now);
            }
        }
        out.diagnoses.extend(engine.tick(now));
        out.batches += 1;
    }
    out
}

#[cfg(test)]
mod tests;
