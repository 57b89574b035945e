//! The embedded analyzer of a multi-process job (the "hub", `CCLD_ANALYZER=embedded`).
//!
//! A communicator whose ranks live in several processes (one process per GPU/rank, the
//! usual `torchrun` job) cannot be diagnosed by any single process's local engine. When
//! such a communicator finishes bootstrap, its ranks agree on the analyzer of the job:
//!
//! 1. Every rank contributes [`Contribution`] (does it want a hub at all: probing on and
//!    `CCLD_ANALYZER=embedded`; and the hubs its process already knows, if any) through a
//!    bootstrap allgather.
//! 2. [`plan`] (pure) decides: if some rank knows the job's hubs, everybody adopts the
//!    lowest such rank's ([`Plan::Adopt`]); otherwise the lowest rank that wants a hub
//!    (normally rank 0) starts the *primary* hub and the lowest wanting rank of ANOTHER
//!    process starts the *standby* ([`Plan::Elect`]); both announce their `ip:port` in a
//!    second allgather; nobody wanting a hub means nothing to do ([`Plan::Nothing`]).
//! 3. A starter runs an analyzer shard ([`analyzer_net::server`], in-memory store, one worker
//!    thread) bound to its bootstrap listen IP, port 0 ([`start`]).
//!
//! A process keeps the first hubs it learns ([`adopt`]): sub-communicators of the world
//! communicator reuse them. Once they are known, the process's embedded sink forwards every
//! batch to both hubs (see `probe::hublink`); the hubs' own processes forward to
//! themselves over loopback, so there is one code path. Both engines see the same records
//! and reach the same diagnoses; only the *active* hub reports them ([`crate::report`]):
//! the primary, until the standby sees it stop answering (SIGKILL, SIGSTOP, crash) and
//! takes over ([`crate::standby`] has the rules). The death of the primary's process is
//! then itself diagnosed by the standby from the survivors' records.
//!
//! Limits: a job of one process wanting a hub has no standby; if both hub processes fail,
//! the others spool their batches (bounded by `CCLD_SPOOL_MAX_MB`) and nothing is
//! diagnosed. A primary that resumes after the standby took over reports again (both
//! report). A hub that cannot be started (bind failure) leaves the job on the other hub, or
//! on the local engines when neither starts.

use parking_lot::Mutex;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use analyzer::EngineConfig;
use analyzer_net::client::{BlockingClient, ClientConfig};
use analyzer_net::server::{DiagnosisFeed, IncidentFeed, ServerConfig, ShardProcess};
use ccld_wire as wire;

pub use crate::standby::Gate;
pub use crate::standby::Hubs;
use crate::standby::{self, Decision, Watch};

/// What one rank brings to the agreement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contribution {
    /// This rank's process does not use an embedded analyzer (probing off, or
    /// `CCLD_ANALYZER` names shards or `off`).
    NotWanted,
    /// It does; with the hubs its process already knows, if any.
    Wanted(Option<Hubs>),
}

impl Contribution {
    /// Wire form: `[0]` not wanted, `[1]` wanted without known hubs, `[1] primary[,standby]`
    /// wanted with them.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Contribution::NotWanted => vec![0],
            Contribution::Wanted(None) => vec![1],
            Contribution::Wanted(Some(h)) => {
                let mut v = vec![1];
                v.extend_from_slice(h.encode().as_bytes());
                v
            }
        }
    }

    /// Inverse of [`Self::encode`]; junk is an error naming what is wrong.
    pub fn decode(b: &[u8]) -> Result<Contribution, String> {
        match b.split_first() {
            Some((0, [])) => Ok(Contribution::NotWanted),
            Some((1, [])) => Ok(Contribution::Wanted(None)),
            Some((1, rest)) => {
                let s = std::str::from_utf8(rest)
                    .map_err(|_| "hub address is not UTF-8".to_string())?;
                Hubs::decode(s).map(|h| Contribution::Wanted(Some(h)))
            }
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
/// contributions and the ranks' process identities only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// No rank wants a hub: no second round.
    Nothing,
    /// Use these hubs (the lowest knowing rank's).
    Adopt(Hubs),
    /// Rank `starter` starts the primary hub, rank `standby` (another process) the standby;
    /// both announce theirs in a second allgather.
    Elect {
        /// The lowest rank that wants a hub.
        starter: usize,
        /// The lowest rank that wants one in another process than `starter`'s.
        standby: Option<usize>,
    },
}

/// Decides from every rank's contribution and process identity `(host hash, pid)` (index =
/// rank). Pure.
pub fn plan(all: &[Contribution], procs: &[(u64, u32)]) -> Plan {
    let known = all.iter().find_map(|c| match c {
        Contribution::Wanted(Some(h)) => Some(*h),
        _ => None,
    });
    if let Some(h) = known {
        return Plan::Adopt(h);
    }
    match all.iter().position(|c| *c == Contribution::Wanted(None)) {
        Some(starter) => {
            let wants: Vec<bool> = all.iter().map(|c| *c != Contribution::NotWanted).collect();
            Plan::Elect {
                starter,
                standby: standby::standby_rank(&wants, procs, starter),
            }
        }
        None => Plan::Nothing,
    }
}

/// Reads the second round: the starter's and the standby's announcements (an empty or
/// unreadable one means that hub did not start). A standby alone becomes the primary.
pub fn announced(from_starter: &[u8], from_standby: Option<&[u8]>) -> Option<Hubs> {
    let read = |b: &[u8]| (!b.is_empty()).then(|| parse_addr(b).ok()).flatten();
    let p = read(from_starter);
    let s = from_standby.and_then(read).filter(|s| Some(*s) != p);
    match (p, s) {
        (Some(primary), standby) => Some(Hubs { primary, standby }),
        (None, Some(primary)) => Some(Hubs {
            primary,
            standby: None,
        }),
        (None, None) => None,
    }
}

/// Which of the job's hubs runs in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The primary: reports from the start.
    Primary,
    /// The standby: reports once it took over.
    Standby,
}

struct Local {
    shard: ShardProcess,
    feed: Option<DiagnosisFeed>,
    incidents: Option<IncidentFeed>,
    role: Option<Role>,
    watch: Option<Arc<Mutex<Watch>>>,
}

static HUB: OnceLock<Hubs> = OnceLock::new();
static LOCAL: Mutex<Option<Local>> = Mutex::new(None);

fn lock_local() -> parking_lot::MutexGuard<'static, Option<Local>> {
    // Poisoning only means a panic elsewhere; the plain state is still usable.
    LOCAL.lock()
}

/// The hubs this process reports to, once it learnt them.
pub fn known() -> Option<Hubs> {
    HUB.get().copied()
}

/// Learns `hubs` as this process's unless it already knows some (the first ones win);
/// returns the hubs in effect. When this process runs one of them it takes its role (the
/// standby starts watching the primary). Logs the job's analyzer addresses once.
pub fn adopt(hubs: Hubs) -> Hubs {
    let mut first = false;
    let cur = *HUB.get_or_init(|| {
        first = true;
        hubs
    });
    if first {
        tracing::info!(target: "nccl::INIT",
            "CCL-D analyzer for this job at {} (query: ccld anomalies --server {})",
            cur.primary, cur.query_list());
        take_role(cur);
    } else if cur != hubs {
        tracing::debug!(target: "nccl::INIT",
            "CCL-D: keeping analyzer hubs {}, communicator agreed on {}",
            cur.query_list(), hubs.query_list());
    }
    cur
}

fn take_role(hubs: Hubs) {
    let mut g = lock_local();
    let Some(l) = g.as_mut() else {
        return;
    };
    if l.role.is_some() {
        return;
    }
    if l.shard.addr == hubs.primary {
        l.role = Some(Role::Primary);
    } else if Some(l.shard.addr) == hubs.standby {
        l.role = Some(Role::Standby);
        let w = Arc::new(Mutex::new(Watch::new(
            analyzer_net::server::now_ns(),
            standby::TAKEOVER_AFTER,
        )));
        l.watch = Some(Arc::clone(&w));
        let primary = hubs.primary;
        let spawned = std::thread::Builder::new()
            .name("ccld-standby".into())
            .spawn(move || watch_primary(primary, w));
        if let Err(e) = spawned {
            tracing::warn!(target: "nccl::INIT",
                "CCL-D: cannot start the standby's watch of the hub {primary}: {e}");
        }
    }
}

/// One probe of a hub: does it answer a local `ListComms` within [`standby::PROBE_TIMEOUT`]?
pub fn probe_hub(c: &mut BlockingClient) -> bool {
    c.list_comms(wire::ListCommsRequest {
        local_only: true,
        limit: 1,
    })
    .is_ok()
}

/// A client for probing `addr` (short deadlines, no back-off worth the name).
pub fn prober(addr: SocketAddr) -> Result<BlockingClient, String> {
    let mut cfg = ClientConfig::new([addr.to_string()]);
    cfg.connect_timeout = standby::PROBE_TIMEOUT;
    cfg.rpc_timeout = standby::PROBE_TIMEOUT;
    cfg.backoff_initial = Duration::from_millis(1);
    cfg.backoff_max = Duration::from_millis(1);
    BlockingClient::new(cfg).map_err(|e| e.to_string())
}

/// The standby's watch loop: probes `primary` every [`standby::PROBE_EVERY`] and feeds
/// `w` until it takes over.
pub fn watch_primary(primary: SocketAddr, w: Arc<Mutex<Watch>>) {
    let mut c = match prober(primary) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(target: "nccl::INIT",
                "CCL-D: the standby cannot watch the hub {primary}: {e}");
            return;
        }
    };
    loop {
        let t = std::time::Instant::now();
        let ok = probe_hub(&mut c);
        let d = w.lock().observe(ok, analyzer_net::server::now_ns());
        match d {
            Decision::Wait => {}
            Decision::TakeOver | Decision::Active => {
                tracing::warn!(target: "nccl::COLL",
                    "CCL-D: the analyzer hub {primary} stopped answering; the standby in this process (pid {}) reports from now on",
                    std::process::id());
                return;
            }
        }
        std::thread::sleep(standby::PROBE_EVERY.saturating_sub(t.elapsed()));
    }
}

/// Whether this process's hub reports now.
pub fn gate() -> Gate {
    let g = lock_local();
    match g.as_ref().map(|l| (l.role, l.watch.as_ref())) {
        Some((Some(Role::Primary), _)) => Gate::Primary,
        Some((Some(Role::Standby), Some(w))) => {
            let w = w.lock();
            Gate::Standby {
                active: w.active(),
                last_ok_ns: w.last_ok_ns(),
            }
        }
        _ => Gate::NoHub,
    }
}

/// Whether this process would use a hub: probing on (`CCLD_DISABLE`) and
/// `CCLD_ANALYZER=embedded` (the default). A malformed variable is an error naming it.
pub fn wanted() -> Result<bool, String> {
    if crate::disabled_from_env()? {
        return Ok(false);
    }
    Ok(
        crate::parse_analyzer(crate::diag::process_env(ccl_params::CCLD_ANALYZER.name).as_deref())?
            == crate::AnalyzerTarget::Embedded,
    )
}

/// Starts this process's hub (an analyzer shard bound to `ip`, port 0) unless one already
/// runs here; returns its address. Engine settings come from the environment
/// ([`crate::diag::engine_config`]). Does not [`adopt`] it: the caller announces first.
pub fn start(ip: IpAddr) -> Result<SocketAddr, String> {
    let engine = crate::diag::engine_config(&crate::diag::process_env)?;
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
    crate::linger::register_at_exit();
    let feed = Some(shard.subscribe());
    let incidents = Some(shard.subscribe_incidents());
    *g = Some(Local {
        shard,
        feed,
        incidents,
        role: None,
        watch: None,
    });
    Ok(addr)
}

/// The diagnoses feed of the hub running in this process (taken once, by the embedded sink).
pub(crate) fn take_feed() -> Option<DiagnosisFeed> {
    lock_local().as_mut().and_then(|l| l.feed.take())
}

/// The incidents feed of the hub running in this process (taken once, by the embedded
/// sink).
pub(crate) fn take_incident_feed() -> Option<IncidentFeed> {
    lock_local().as_mut().and_then(|l| l.incidents.take())
}

/// True when this process runs a hub (primary or standby).
pub fn runs_here() -> bool {
    lock_local().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn one(p: &str) -> Hubs {
        Hubs {
            primary: a(p),
            standby: None,
        }
    }

    /// Every rank in a process of its own.
    fn own(n: usize) -> Vec<(u64, u32)> {
        (0..n).map(|r| (7, 100 + r as u32)).collect()
    }

    use Contribution::{NotWanted as N, Wanted as W};

    #[test]
    fn nobody_knows_a_hub_the_lowest_wanting_rank_starts_one_the_next_process_a_standby() {
        let e = |starter, standby| Plan::Elect { starter, standby };
        assert_eq!(plan(&[W(None), W(None), W(None)], &own(3)), e(0, Some(1)));
        assert_eq!(plan(&[N, W(None), W(None)], &own(3)), e(1, Some(2)));
        assert_eq!(plan(&[N, N, W(None)], &own(3)), e(2, None));
        assert_eq!(plan(&[W(None)], &own(1)), e(0, None));
        // Ranks 0 and 1 are threads of one process: the standby goes to rank 2's.
        let procs = [(7, 1), (7, 1), (7, 2)];
        assert_eq!(plan(&[W(None), W(None), W(None)], &procs), e(0, Some(2)));
        assert_eq!(plan(&[W(None), W(None), N], &procs), e(0, None));
    }

    #[test]
    fn known_hubs_win_the_lowest_knowing_rank_first() {
        let h1 = Hubs {
            primary: a("10.0.0.1:5000"),
            standby: Some(a("10.0.0.3:5001")),
        };
        let h2 = one("10.0.0.2:6000");
        let p = own(3);
        assert_eq!(plan(&[W(None), W(Some(h1)), W(None)], &p), Plan::Adopt(h1));
        assert_eq!(
            plan(&[W(None), W(Some(h2)), W(Some(h1))], &p),
            Plan::Adopt(h2)
        );
        assert_eq!(plan(&[W(Some(h1)), W(Some(h2))], &p), Plan::Adopt(h1));
        assert_eq!(plan(&[N, N, W(Some(h2))], &p), Plan::Adopt(h2));
    }

    #[test]
    fn nobody_wants_a_hub() {
        assert_eq!(plan(&[N, N, N], &own(3)), Plan::Nothing);
        assert_eq!(plan(&[], &[]), Plan::Nothing);
    }

    #[test]
    fn every_rank_decides_alike() {
        // The plan depends only on the allgathered list, never on who computes it: check
        // all 3^3 combinations of three ranks (one process each) against an independent
        // statement of the rule.
        let h = [one("127.0.0.1:1"), one("127.0.0.1:2"), one("127.0.0.1:3")];
        for code in 0..27 {
            let all: Vec<Contribution> = (0..3)
                .map(|r| match (code / 3usize.pow(r as u32)) % 3 {
                    0 => N,
                    1 => W(None),
                    _ => W(Some(h[r])),
                })
                .collect();
            let first_known = (0..3).find(|&r| all[r] == W(Some(h[r])));
            let wanting: Vec<usize> = (0..3).filter(|&r| all[r] != N).collect();
            let want = match (first_known, wanting.first()) {
                (Some(r), _) => Plan::Adopt(h[r]),
                (None, Some(&r)) => Plan::Elect {
                    starter: r,
                    standby: wanting.get(1).copied(),
                },
                (None, None) => Plan::Nothing,
            };
            assert_eq!(plan(&all, &own(3)), want, "{all:?}");
        }
    }

    #[test]
    fn contributions_round_trip_and_junk_is_refused() {
        for c in [
            N,
            W(None),
            W(Some(one("192.168.1.7:40000"))),
            W(Some(one("[::1]:9"))),
            W(Some(Hubs {
                primary: a("192.168.1.7:40000"),
                standby: Some(a("192.168.1.8:40001")),
            })),
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
        assert_eq!(gate(), Gate::NoHub);
        // Once one runs, starting again returns the same hub.
        let ok = start_with("127.0.0.1".parse().unwrap(), EngineConfig::default()).unwrap();
        assert!(runs_here());
        let again = start_with("127.0.0.1".parse().unwrap(), EngineConfig::default()).unwrap();
        assert_eq!(ok, again);
        assert!(take_feed().is_some());
        assert!(take_feed().is_none(), "the feed is handed out once");
        assert!(take_incident_feed().is_some());
        assert!(
            take_incident_feed().is_none(),
            "the feed is handed out once"
        );
        // No role before the job's hubs are adopted.
        assert_eq!(gate(), Gate::NoHub);
    }

    #[test]
    fn the_first_hubs_learnt_are_kept() {
        // (Another test of this process may have adopted some before: whichever came first
        // stays.)
        let first = adopt(one("127.0.0.1:4000"));
        assert_eq!(known(), Some(first));
        assert_eq!(adopt(one("127.0.0.1:5000")), first);
        assert_eq!(known(), Some(first));
    }

    #[test]
    fn announcements() {
        let (p, s) = (a("127.0.0.1:77"), a("127.0.0.1:78"));
        assert_eq!(announced(b"", None), None);
        assert_eq!(announced(b"", Some(b"")), None);
        assert_eq!(announced(b"127.0.0.1:77", None), Some(one("127.0.0.1:77")));
        assert_eq!(
            announced(b"127.0.0.1:77", Some(b"127.0.0.1:78")),
            Some(Hubs {
                primary: p,
                standby: Some(s)
            })
        );
        // A primary that did not start: the standby is the job's only hub.
        assert_eq!(
            announced(b"", Some(b"127.0.0.1:78")),
            Some(one("127.0.0.1:78"))
        );
        assert_eq!(
            announced(b"127.0.0.1:77", Some(b"junk")),
            Some(one("127.0.0.1:77"))
        );
        assert_eq!(announced(b"nonsense", None), None);
    }

    /// The standby's watch over a real hub: it waits while the hub answers and takes over
    /// within [`standby::TAKEOVER_AFTER`] + one probe once the hub is killed.
    #[test]
    fn the_standby_takes_over_when_the_primary_is_killed() {
        let shard = ShardProcess::spawn(
            ServerConfig::single(EngineConfig::default()),
            a("127.0.0.1:0"),
            None,
            1,
        )
        .unwrap();
        let mut c = prober(shard.addr).unwrap();
        assert!(probe_hub(&mut c), "a live hub answers");
        let w = Arc::new(Mutex::new(Watch::new(
            analyzer_net::server::now_ns(),
            standby::TAKEOVER_AFTER,
        )));
        let (addr, w2) = (shard.addr, Arc::clone(&w));
        let t = std::thread::spawn(move || watch_primary(addr, w2));
        std::thread::sleep(Duration::from_millis(1500));
        assert!(!w.lock().active(), "no take-over while the primary answers");
        let killed = std::time::Instant::now();
        shard.kill();
        t.join().unwrap();
        let took = killed.elapsed();
        assert!(w.lock().active());
        assert!(
            took >= standby::TAKEOVER_AFTER && took < Duration::from_secs(3),
            "took over after {took:?}"
        );
        assert!(!probe_hub(&mut c), "a killed hub does not answer");
    }
}
