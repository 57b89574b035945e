//! The embedded analyzer of a multi-process job (the "hub", `CCLD_ANALYZER=embedded`).
//!
//! A communicator whose ranks live in several processes (one process per GPU/rank, the
//! usual `torchrun` job) cannot be diagnosed by any single process's local engine. When
//! such a communicator finishes bootstrap, its ranks agree on ONE analyzer for the job:
//!
//! 1. Every rank contributes [`Contribution`] (does it want a hub at all: probing on and
//!    `CCLD_ANALYZER=embedded`; and the hub address its process already knows, if any)
//!    through a bootstrap allgather.
//! 2. [`plan`] (pure) decides: if some rank knows a hub, everybody adopts the lowest such
//!    rank's address ([`Plan::Adopt`]); otherwise the lowest rank that wants a hub
//!    (normally rank 0) starts one ([`Plan::Elect`]) and announces its `ip:port` in a second
//!    allgather; nobody wanting a hub means nothing to do ([`Plan::Nothing`]).
//! 3. The starter runs an analyzer shard ([`analyzer::server`], in-memory store, one worker
//!    thread) bound to its bootstrap listen IP, port 0 ([`start`]).
//!
//! A process keeps the first hub it learns ([`adopt`]): sub-communicators of the world
//! communicator reuse it. Once a hub is known, the process's embedded sink forwards every
//! batch to it through [`crate::reporter::RemoteSink`] (spool and reconnect included); the
//! hub's own process forwards to itself over loopback, so there is one code path. The hub
//! process surfaces the hub's diagnoses like local ones (see [`crate::embedded`]).
//!
//! Limits: the hub lives and dies with its process: SIGKILL or SIGSTOP of that process
//! (rank 0's, normally) loses the analyzer, the others spool their batches (bounded by
//! `CCLD_SPOOL_MAX_MB`) and nothing is diagnosed; use `ccld serve` for that. A hub that
//! cannot be started (bind failure) leaves every process on its local engine.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, OnceLock};

use analyzer::server::{DiagnosisFeed, ServerConfig, ShardProcess};
use analyzer::EngineConfig;

/// What one rank brings to the agreement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contribution {
    /// This rank's process does not use an embedded analyzer (probing off, or
    /// `CCLD_ANALYZER` names shards or `off`).
    NotWanted,
    /// It does; with the hub address its process already knows, if any.
    Wanted(Option<SocketAddr>),
}

impl Contribution {
    /// Wire form: `[0]` not wanted, `[1]` wanted without a known hub, `[1] ip:port` wanted
    /// with one.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Contribution::NotWanted => vec![0],
            Contribution::Wanted(None) => vec![1],
            Contribution::Wanted(Some(a)) => {
                let mut v = vec![1];
                v.extend_from_slice(a.to_string().as_bytes());
                v
            }
        }
    }

    /// Inverse of [`Self::encode`]; junk is an error naming what is wrong.
    pub fn decode(b: &[u8]) -> Result<Contribution, String> {
        match b.split_first() {
            Some((0, [])) => Ok(Contribution::NotWanted),
            Some((1, [])) => Ok(Contribution::Wanted(None)),
            Some((1, rest)) => parse_addr(rest).map(|a| Contribution::Wanted(Some(a))),
            Some((0, _)) => Err("hub contribution 'not wanted' carries extra bytes".into()),
            Some((t, _)) => Err(format!("unknown hub contribution tag {t}")),
            None => Err("empty hub contribution".into()),
        }
    }
}

/// Parses an announced `ip:port`.
pub fn parse_addr(b: &[u8]) -> Result<SocketAddr, String> {
    let s = std::str::from_utf8(b).map_err(|_| "hub address is not UTF-8".to_string())?;
    s.parse::<SocketAddr>()
        .map_err(|_| format!("hub address {s:?} is not ip:port"))
}

/// The outcome of the agreement, identical on every rank (it depends on the allgathered
/// contributions only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No rank wants a hub: no second round.
    Nothing,
    /// Use this hub (the lowest rank's known address).
    Adopt(SocketAddr),
    /// Rank `starter` starts a hub and announces it in a second allgather.
    Elect {
        /// The lowest rank that wants a hub.
        starter: usize,
    },
}

/// Decides from every rank's contribution (index = rank). Pure.
pub fn plan(all: &[Contribution]) -> Plan {
    let known = all.iter().find_map(|c| match c {
        Contribution::Wanted(Some(a)) => Some(*a),
        _ => None,
    });
    if let Some(a) = known {
        return Plan::Adopt(a);
    }
    match all.iter().position(|c| *c == Contribution::Wanted(None)) {
        Some(starter) => Plan::Elect { starter },
        None => Plan::Nothing,
    }
}

/// Reads the starter's announcement of the second round: `Some(addr)`, or `None` when it
/// announced nothing (its hub could not start) or something unreadable.
pub fn announced(from_starter: &[u8]) -> Option<SocketAddr> {
    if from_starter.is_empty() {
        return None;
    }
    parse_addr(from_starter).ok()
}

struct Local {
    shard: ShardProcess,
    feed: Option<DiagnosisFeed>,
}

static HUB: OnceLock<SocketAddr> = OnceLock::new();
static LOCAL: Mutex<Option<Local>> = Mutex::new(None);

fn lock_local() -> std::sync::MutexGuard<'static, Option<Local>> {
    // Poisoning only means a panic elsewhere; the plain state is still usable.
    LOCAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The hub this process reports to, once it learnt one.
pub fn known() -> Option<SocketAddr> {
    HUB.get().copied()
}

/// Learns `addr` as this process's hub unless it already knows one (the first one wins);
/// returns the hub in effect. Logs the job's analyzer address once.
pub fn adopt(addr: SocketAddr) -> SocketAddr {
    let mut first = false;
    let cur = *HUB.get_or_init(|| {
        first = true;
        addr
    });
    if first {
        tracing::info!(target: "nccl::INIT",
            "CCL-D analyzer for this job at {cur} (query: ccld anomalies --server {cur})");
    } else if cur != addr {
        tracing::debug!(target: "nccl::INIT",
            "CCL-D: keeping analyzer hub {cur}, communicator agreed on {addr}");
    }
    cur
}

/// Whether this process would use a hub: probing on (`CCLD_DISABLE`) and
/// `CCLD_ANALYZER=embedded` (the default). A malformed variable is an error naming it.
pub fn wanted() -> Result<bool, String> {
    if crate::disabled_from_env()? {
        return Ok(false);
    }
    Ok(
        crate::parse_analyzer(crate::diag::process_env("CCLD_ANALYZER").as_deref())?
            == crate::AnalyzerTarget::Embedded,
    )
}

/// Starts this process's hub (an analyzer shard bound to `ip`, port 0) unless one already
/// runs here; returns its address. Engine settings come from the environment
/// ([`crate::embedded::engine_config`]). Does not [`adopt`] it: the caller announces first.
pub fn start(ip: IpAddr) -> Result<SocketAddr, String> {
    let engine = crate::embedded::engine_config(&crate::diag::process_env)?;
    start_with(ip, engine)
}

/// [`start`] with explicit engine settings.
pub(crate) fn start_with(ip: IpAddr, engine: EngineConfig) -> Result<SocketAddr, String> {
    let mut g = lock_local();
    if let Some(l) = g.as_ref() {
        return Ok(l.shard.addr);
    }
    let cfg = ServerConfig::single(engine);
    let shard = ShardProcess::spawn(cfg, SocketAddr::new(ip, 0), None, 1)
        .map_err(|e| format!("starting the CCL-D analyzer hub on {ip}: {e}"))?;
    let addr = shard.addr;
    let feed = Some(shard.subscribe());
    *g = Some(Local { shard, feed });
    Ok(addr)
}

/// The diagnoses feed of the hub running in this process (taken once, by the embedded sink).
pub(crate) fn take_feed() -> Option<DiagnosisFeed> {
    lock_local().as_mut().and_then(|l| l.feed.take())
}

/// True when this process runs the hub.
pub fn runs_here() -> bool {
    lock_local().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    use Contribution::{NotWanted as N, Wanted as W};

    #[test]
    fn nobody_knows_a_hub_the_lowest_wanting_rank_starts_one() {
        assert_eq!(
            plan(&[W(None), W(None), W(None)]),
            Plan::Elect { starter: 0 }
        );
        assert_eq!(plan(&[N, W(None), W(None)]), Plan::Elect { starter: 1 });
        assert_eq!(plan(&[N, N, W(None)]), Plan::Elect { starter: 2 });
        assert_eq!(plan(&[W(None)]), Plan::Elect { starter: 0 });
    }

    #[test]
    fn a_known_hub_wins_the_lowest_knowing_rank_first() {
        let h1 = a("10.0.0.1:5000");
        let h2 = a("10.0.0.2:6000");
        assert_eq!(plan(&[W(None), W(Some(h1)), W(None)]), Plan::Adopt(h1));
        assert_eq!(plan(&[W(None), W(Some(h2)), W(Some(h1))]), Plan::Adopt(h2));
        assert_eq!(plan(&[W(Some(h1)), W(Some(h2))]), Plan::Adopt(h1));
        assert_eq!(plan(&[N, N, W(Some(h2))]), Plan::Adopt(h2));
    }

    #[test]
    fn nobody_wants_a_hub() {
        assert_eq!(plan(&[N, N, N]), Plan::Nothing);
        assert_eq!(plan(&[]), Plan::Nothing);
    }

    #[test]
    fn every_rank_decides_alike() {
        // The plan depends only on the allgathered list, never on who computes it: check
        // all 3^3 combinations of three ranks against an independent statement of the rule.
        let h = [a("127.0.0.1:1"), a("127.0.0.1:2"), a("127.0.0.1:3")];
        for code in 0..27 {
            let all: Vec<Contribution> = (0..3)
                .map(|r| match (code / 3usize.pow(r as u32)) % 3 {
                    0 => N,
                    1 => W(None),
                    _ => W(Some(h[r])),
                })
                .collect();
            let first_known = (0..3).find(|&r| all[r] == W(Some(h[r])));
            let first_wanting = (0..3).find(|&r| all[r] != N);
            let want = match (first_known, first_wanting) {
                (Some(r), _) => Plan::Adopt(h[r]),
                (None, Some(r)) => Plan::Elect { starter: r },
                (None, None) => Plan::Nothing,
            };
            assert_eq!(plan(&all), want, "{all:?}");
        }
    }

    #[test]
    fn contributions_round_trip_and_junk_is_refused() {
        for c in [
            N,
            W(None),
            W(Some(a("192.168.1.7:40000"))),
            W(Some(a("[::1]:9"))),
        ] {
            assert_eq!(Contribution::decode(&c.encode()), Ok(c));
        }
        assert!(Contribution::decode(&[]).is_err());
        assert!(Contribution::decode(&[2]).unwrap_err().contains("tag 2"));
        assert!(Contribution::decode(&[0, 1]).is_err());
        assert!(Contribution::decode(b"\x01host:1")
            .unwrap_err()
            .contains("ip:port"));
        assert!(Contribution::decode(&[1, 0xff, 0xfe]).is_err());
    }

    #[test]
    fn a_hub_that_cannot_bind_is_an_error_not_a_panic() {
        // 192.0.2.1 (TEST-NET-1) is no address of this machine: bind fails.
        let e = start_with("192.0.2.1".parse().unwrap(), EngineConfig::default()).unwrap_err();
        assert!(e.contains("analyzer hub on 192.0.2.1"), "{e}");
        assert!(!runs_here());
        assert!(take_feed().is_none());
        // Once one runs, starting again returns the same hub.
        let ok = start_with("127.0.0.1".parse().unwrap(), EngineConfig::default()).unwrap();
        assert!(runs_here());
        let again = start_with("127.0.0.1".parse().unwrap(), EngineConfig::default()).unwrap();
        assert_eq!(ok, again);
        assert!(take_feed().is_some());
        assert!(take_feed().is_none(), "the feed is handed out once");
    }

    #[test]
    fn the_first_hub_learnt_is_kept() {
        // (Another test of this process may have adopted one before: whichever came first
        // stays.)
        let first = adopt(a("127.0.0.1:4000"));
        assert_eq!(known(), Some(first));
        assert_eq!(adopt(a("127.0.0.1:5000")), first);
        assert_eq!(known(), Some(first));
    }

    #[test]
    fn announcements() {
        assert_eq!(announced(b""), None);
        assert_eq!(announced(b"127.0.0.1:77"), Some(a("127.0.0.1:77")));
        assert_eq!(announced(b"nonsense"), None);
    }
}
