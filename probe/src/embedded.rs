//! The embedded analyzer (`CCLD_ANALYZER=embedded`, the default): no analyzer service to
//! run; the analysis happens inside the job's own processes.
//!
//! - **Ranks as threads** (`ncclCommInitAll`, one process driving all its devices, the
//!   `ccl-demo`): the analyzer engine runs in this process on the reporter thread, fed
//!   directly by the diagnostic thread, and ticks every 100 ms. It diagnoses a communicator
//!   only when every rank of it reports to this process; diagnoses of communicators with
//!   ranks elsewhere are suppressed (they would name the unseen ranks).
//! - **Ranks as processes** (one process per GPU/rank, e.g. `torchrun`): when a communicator
//!   spanning several processes finishes bootstrap, its ranks agree on the job's analyzer
//!   *hubs*: a primary inside the process of the communicator's rank 0 and a standby in
//!   another rank's process (see [`crate::hub`], [`crate::standby`]). From then on every
//!   process of the job, the hubs' own included (over loopback), forwards all its batches
//!   to both hubs like `CCLD_ANALYZER=host:port` would (spool and reconnect included, one
//!   thread per hub: `probe::hublink`); the local engine is no longer fed. A hub's process
//!   logs its hub's diagnoses and keeps them for [`Embedded::diagnoses`]; the other
//!   processes' [`Embedded::diagnoses`] stay empty (query the hubs with
//!   `ccld anomalies --server primary,standby`, logged at init).
//!
//! The process hosting the active analyzer (the local engine; the primary hub, or the
//! standby once it took over) prints each new incident once ([`crate::report`],
//! `CCLD_REPORT`).
//!
//! Diagnoses are logged as warnings (target `nccl::COLL`) and kept for [`Embedded::diagnoses`].

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use analyzer::{Engine, EngineConfig};
use analyzer_net::server::{DiagnosisFeed, IncidentFeed};
use ccld_wire as wire;

use crate::diag::{now_ns, Sink};
use crate::hub::{Gate, Hubs};
use crate::hublink::HubLinks;
use crate::report::Reporter;
use crate::reporter::SpoolSettings;
use crate::standby::Outbox;

/// The in-process analyzer.
pub struct Embedded {
    engine: Mutex<Engine>,
    ranks_seen: Mutex<HashMap<u64, (u32, HashSet<u32>)>>,
    diagnoses: Mutex<Vec<wire::Diagnosis>>,
    suppressed: Mutex<u64>,
}

static EMBEDDED: OnceLock<Arc<Embedded>> = OnceLock::new();

/// The embedded analyzer of this process, if `CCLD_ANALYZER=embedded` started one.
pub fn embedded() -> Option<Arc<Embedded>> {
    EMBEDDED.get().cloned()
}

impl Embedded {
    /// A new embedded analyzer.
    pub fn new(cfg: EngineConfig) -> Embedded {
        let mut engine = Engine::new(cfg);
        // Location cost measured also for windows closed by a record (ingest path).
        engine.set_cost_clock(now_ns);
        Embedded {
            engine: Mutex::new(engine),
            ranks_seen: Mutex::new(HashMap::new()),
            diagnoses: Mutex::new(Vec::new()),
            suppressed: Mutex::new(0),
        }
    }

    /// Installs `self` as the process's embedded analyzer (first caller wins).
    pub(crate) fn install(cfg: EngineConfig) -> Arc<Embedded> {
        Arc::clone(EMBEDDED.get_or_init(|| Arc::new(Embedded::new(cfg))))
    }

    /// Every diagnosis made so far, oldest first.
    pub fn diagnoses(&self) -> Vec<wire::Diagnosis> {
        self.diagnoses.lock().clone()
    }

    /// Diagnoses suppressed because the communicator has ranks in other processes.
    pub fn suppressed(&self) -> u64 {
        *self.suppressed.lock()
    }

    /// The engine's view of one communicator.
    pub fn comm_state(&self, comm_id: u64) -> Option<wire::CommState> {
        self.engine.lock().comm_state(comm_id, now_ns())
    }

    /// Feeds one batch at process time `now`.
    pub fn ingest(&self, b: &wire::Batch, now: u64) {
        {
            let mut seen = self.ranks_seen.lock();
            for r in &b.records {
                if let Some(t) = &r.trace {
                    let e = seen.entry(t.comm_id).or_insert((r.nranks, HashSet::new()));
                    e.1.insert(r.rank);
                }
            }
            for hb in &b.heartbeats {
                for m in &hb.ranks {
                    let e = seen.entry(m.comm_id).or_insert((m.nranks, HashSet::new()));
                    e.1.insert(m.rank);
                }
            }
        }
        let mut eng = self.engine.lock();
        for hb in &b.heartbeats {
            eng.heartbeat(hb, now);
        }
        for r in &b.records {
            if let Err(e) = eng.ingest(r, now) {
                tracing::debug!(target: "nccl::COLL", "embedded analyzer rejected a record: {e:?}");
            }
        }
    }

    /// The caller's ticks paused (its process stopped or starved): see
    /// `analyzer::Engine::note_pause`.
    pub fn note_pause(&self, now: u64) {
        self.engine.lock().note_pause(now);
    }

    /// Runs detection at `now`; returns (and keeps) the new diagnoses of communicators whose
    /// ranks all report to this process.
    pub fn tick(&self, now: u64) -> Vec<wire::Diagnosis> {
        let new = self.engine.lock().tick_with_clock(now, &mut now_ns);
        if new.is_empty() {
            return new;
        }
        let seen = self.ranks_seen.lock();
        let (keep, drop): (Vec<_>, Vec<_>) = new.into_iter().partition(|d| {
            seen.get(&d.comm_id)
                .is_some_and(|(n, set)| set.len() as u32 == *n)
        });
        drop_count(&self.suppressed, drop.len());
        for d in &keep {
            tracing::warn!(target: "nccl::COLL", "CCL-D diagnosis: {}", crate::describe(d));
        }
        self.diagnoses.lock().extend(keep.iter().cloned());
        keep
    }
}

impl Embedded {
    /// The incidents of the local engine new since the last call, of communicators whose
    /// ranks all report to this process (the others are counted in [`Self::suppressed`]
    /// through their diagnoses).
    pub fn take_incidents(&self) -> Vec<wire::Incident> {
        let new = self.engine.lock().take_incidents();
        if new.is_empty() {
            return new;
        }
        let seen = self.ranks_seen.lock();
        new.into_iter()
            .filter(|i| {
                seen.get(&i.comm_id)
                    .is_some_and(|(n, set)| set.len() as u32 == *n)
            })
            .collect()
    }

    /// Logs and keeps a diagnosis made by the job's hub running in this process.
    pub(crate) fn surface(&self, d: wire::Diagnosis) {
        tracing::warn!(target: "nccl::COLL", "CCL-D diagnosis: {}", crate::describe(&d));
        self.diagnoses.lock().push(d);
    }
}

fn drop_count(m: &Mutex<u64>, n: usize) {
    *m.lock() += n as u64;
}

/// Where the embedded sink sends batches.
enum Route {
    /// The local engine (no hub known).
    Local,
    /// The job's hubs (primary and standby).
    Hub(HubLinks),
    /// Hubs are known but no client could be built for them: local engine (said once).
    HubUnusable,
}

/// Where the sink learns the job's hubs and (in a hub's process) its diagnoses feed and
/// whether it reports.
pub(crate) struct HubSource {
    pub(crate) known: Box<dyn Fn() -> Option<Hubs> + Send>,
    pub(crate) take_feed: Box<dyn Fn() -> Option<DiagnosisFeed> + Send>,
    pub(crate) take_incidents: Box<dyn Fn() -> Option<IncidentFeed> + Send>,
    pub(crate) gate: Box<dyn Fn() -> Gate + Send>,
}

impl HubSource {
    /// This process's hub ([`crate::hub`]).
    fn process() -> HubSource {
        HubSource {
            known: Box::new(crate::hub::known),
            take_feed: Box::new(crate::hub::take_feed),
            take_incidents: Box::new(crate::hub::take_incident_feed),
            gate: Box::new(crate::hub::gate),
        }
    }
}

/// Incidents held by a standby hub before it takes over (the oldest go first).
const HELD_INCIDENTS: usize = 1024;
/// How often the embedded analyzer ticks where this process has no hub to report to.
const LOCAL_TICK: Duration = Duration::from_millis(100);

/// The sink of `CCLD_ANALYZER=embedded`: feeds the local engine (ticking it every 100 ms)
/// until this process learns the job's hubs, then forwards every batch to them. The
/// process hosting the active analyzer (the local engine, or the job's active hub) prints
/// each new incident through its [`Reporter`] (`CCLD_REPORT`).
pub(crate) struct EmbeddedSink {
    e: Arc<Embedded>,
    last_tick: Instant,
    spool: SpoolSettings,
    route: Route,
    hub: HubSource,
    feed: Option<DiagnosisFeed>,
    incidents: Option<IncidentFeed>,
    report: Reporter,
    outbox: Outbox<wire::Incident>,
}

impl EmbeddedSink {
    pub(crate) fn new(e: Arc<Embedded>, spool: SpoolSettings, report: Reporter) -> EmbeddedSink {
        Self::with_hub(e, spool, HubSource::process(), report)
    }

    pub(crate) fn with_hub(
        e: Arc<Embedded>,
        spool: SpoolSettings,
        hub: HubSource,
        report: Reporter,
    ) -> EmbeddedSink {
        EmbeddedSink {
            e,
            last_tick: Instant::now(),
            spool,
            route: Route::Local,
            hub,
            feed: None,
            incidents: None,
            report,
            outbox: Outbox::new(HELD_INCIDENTS),
        }
    }

    /// Switches to the hubs once they are known.
    fn follow_hub(&mut self) {
        if !matches!(self.route, Route::Local) {
            return;
        }
        let Some(hubs) = (self.hub.known)() else {
            return;
        };
        self.route = match HubLinks::start(hubs, &self.spool) {
            Ok(l) => {
                self.report.set_query(hubs.query_list());
                Route::Hub(l)
            }
            Err(e) => {
                tracing::warn!(target: "nccl::COLL",
                    "CCL-D: cannot report to the analyzer hub {} ({e}); analysing locally",
                    hubs.primary);
                Route::HubUnusable
            }
        };
    }

    /// Surfaces the diagnoses of this process's hub and reports the incidents its gate
    /// lets through.
    fn drain_hub(&mut self) {
        if self.feed.is_none() {
            self.feed = (self.hub.take_feed)();
        }
        if self.incidents.is_none() {
            self.incidents = (self.hub.take_incidents)();
        }
        if let Some(f) = &mut self.feed {
            while let Some(d) = f.try_next() {
                self.e.surface(d);
            }
        }
        let Some(f) = &mut self.incidents else {
            return;
        };
        let mut new = Vec::new();
        while let Some(i) = f.try_next() {
            new.push(i);
        }
        let gate = (self.hub.gate)();
        for inc in self.outbox.pass(gate, new, |i| i.detected_at_ns) {
            self.report.report(&inc);
            crate::linger::note_reported();
        }
    }
}

impl Sink for EmbeddedSink {
    fn deliver(&mut self, batch: wire::Batch) {
        self.follow_hub();
        match &mut self.route {
            Route::Hub(l) => {
                crate::linger::note_batch(&batch);
                l.send(batch);
            }
            Route::Local | Route::HubUnusable => self.e.ingest(&batch, now_ns()),
        }
    }

    fn settle(&mut self, timeout: Duration) {
        if let Route::Hub(l) = &self.route {
            l.settle(Instant::now() + timeout);
        }
    }

    fn idle(&mut self) {
        self.follow_hub();
        match &mut self.route {
            Route::Hub(_) => self.drain_hub(),
            Route::Local | Route::HubUnusable => {
                let gap = self.last_tick.elapsed();
                if gap >= LOCAL_TICK {
                    self.last_tick = Instant::now();
                    if analyzer::engine::is_pause(gap, LOCAL_TICK) {
                        // This process did not run for a while: see `Engine::note_pause`.
                        self.e.note_pause(now_ns());
                    }
                    self.e.tick(now_ns());
                    for inc in self.e.take_incidents() {
                        self.report.report(&inc);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::diag::engine_config;

    /// Rank `rank`'s record of op `op` in comm 0x4242 of 4 ranks (in flight for 2 s, or
    /// completed).
    pub(crate) fn rec(op: u64, rank: u32, inflight: bool) -> wire::OpRecord {
        wire::OpRecord {
            trace: Some(wire::TraceId {
                comm_id: 0x4242,
                op_counter: op,
                extension: 0,
            }),
            rank,
            nranks: 4,
            host: "h".into(),
            pid: 100 + rank,
            op: Some(wire::OpTypeSet {
                bytes: 1 << 20,
                count: 1 << 18,
                dtype: 7,
                root: -1,
                peer: -1,
                n_channels: 1,
                ..Default::default()
            }),
            start_ns: op * 10_000_000,
            duration_ns: if inflight { 2_000_000_000 } else { 1_000_000 },
            channels: vec![wire::ChannelStat {
                send_count: if inflight { 1 } else { 6 },
                recv_count: if inflight { 1 } else { 6 },
                send_rate: 1.0,
                recv_rate: 1.0,
                ..Default::default()
            }],
            state: if inflight {
                wire::OpState::InFlight
            } else {
                wire::OpState::Completed
            } as i32,
            seq: op * 4 + u64::from(rank),
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

    /// The embedded sink follows the hub once one is known: batches go to the hub (not to
    /// the local engine) and the hub's diagnoses come back as this process's own.
    #[test]
    fn batches_follow_the_hub_and_its_diagnoses_surface_here() {
        let engine = EngineConfig {
            hang_threshold: Duration::from_millis(300),
            ..EngineConfig::default()
        };
        let e = Arc::new(Embedded::new(engine.clone()));
        let spool = SpoolSettings {
            dir: std::env::temp_dir().join(format!("ccld-hub-test-{}", std::process::id())),
            max_bytes: 1 << 20,
        };
        // A hub of this test's own (the process-wide one is crate::hub's, tested there).
        let shard = analyzer_net::server::ShardProcess::spawn(
            analyzer_net::server::ServerConfig::single(engine),
            "127.0.0.1:0".parse().unwrap(),
            None,
            1,
        )
        .unwrap();
        let addr = shard.addr;
        let known = Arc::new(Mutex::new(None::<Hubs>));
        let feed = Arc::new(Mutex::new(Some(shard.subscribe())));
        let incs = Arc::new(Mutex::new(Some(shard.subscribe_incidents())));
        let (k, f, i) = (Arc::clone(&known), Arc::clone(&feed), Arc::clone(&incs));
        let hub = HubSource {
            known: Box::new(move || *k.lock()),
            take_feed: Box::new(move || f.lock().take()),
            take_incidents: Box::new(move || i.lock().take()),
            gate: Box::new(|| Gate::Primary),
        };
        let out = crate::report::tests_support::Buf::default();
        let rep = Reporter::to_writer(Box::new(out.clone()), false);
        let mut sink = EmbeddedSink::with_hub(Arc::clone(&e), spool.clone(), hub, rep);
        // No hub yet: the local engine is fed.
        let mut b = wire::Batch::default();
        b.records.push(rec(0, 0, false));
        sink.deliver(b);
        assert!(
            e.comm_state(0x4242).is_some(),
            "local engine fed before a hub is known"
        );
        *known.lock() = Some(Hubs {
            primary: addr,
            standby: None,
        });
        // Every rank completes ops 0..5; ranks 0..2 hang in op 5, rank 3 never enters it.
        let mut b = wire::Batch::default();
        for op in 0..5 {
            for r in 0..4 {
                b.records.push(rec(op, r, false));
            }
        }
        for r in 0..3 {
            b.records.push(rec(5, r, true));
        }
        sink.deliver(b);
        let t0 = Instant::now();
        while e.diagnoses().is_empty() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
            sink.idle();
        }
        let ds = e.diagnoses();
        assert_eq!(ds.len(), 1, "{ds:?}");
        let d = &ds[0];
        assert_eq!(d.comm_id, 0x4242);
        assert_eq!(
            d.class(),
            wire::AnomalyClass::H1NotEntered,
            "{}",
            crate::describe(d)
        );
        let roots: Vec<u32> = d.roots.iter().map(|r| r.rank).collect();
        assert_eq!(roots, vec![3], "{}", crate::describe(d));
        // It came from the hub (the shard names itself and numbers its diagnoses) ...
        assert_eq!(d.shard, addr.to_string());
        assert!(d.id.starts_with("s0-"), "{}", d.id);
        // ... and the local engine saw only the batch before the hub was known.
        let local = e.comm_state(0x4242).unwrap();
        assert!(
            local.ranks.iter().all(|r| r.last_op_counter == 0),
            "{local:?}"
        );
        assert_eq!(e.suppressed(), 0);
        assert!(feed.lock().is_none(), "the sink took the hub's feed");
        // The hub's process (primary) printed the incident once, with where to query.
        for _ in 0..5 {
            sink.idle();
        }
        let text = out.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("H1") && text.contains("rank 3 (pid 103"),
            "{text}"
        );
        assert!(
            text.contains(&format!("ccld anomalies --server {addr}")),
            "{text}"
        );
        shard.kill();
        let _ = std::fs::remove_dir_all(&spool.dir);
    }

    /// Ranks as threads: the local engine's incident is printed once by this process.
    #[test]
    fn the_local_engine_reports_each_incident_once() {
        let e = Arc::new(Embedded::new(EngineConfig {
            hang_threshold: Duration::from_millis(300),
            ..EngineConfig::default()
        }));
        let spool = SpoolSettings {
            dir: std::env::temp_dir().join(format!("ccld-local-test-{}", std::process::id())),
            max_bytes: 1 << 20,
        };
        let hub = HubSource {
            known: Box::new(|| None),
            take_feed: Box::new(|| None),
            take_incidents: Box::new(|| None),
            gate: Box::new(|| Gate::NoHub),
        };
        let out = crate::report::tests_support::Buf::default();
        let rep = Reporter::to_writer(Box::new(out.clone()), false);
        let mut sink = EmbeddedSink::with_hub(Arc::clone(&e), spool, hub, rep);
        let mut b = wire::Batch::default();
        for op in 0..5 {
            for r in 0..4 {
                b.records.push(rec(op, r, false));
            }
        }
        for r in [0, 1, 3] {
            b.records.push(rec(5, r, true));
        }
        sink.deliver(b);
        let t0 = Instant::now();
        while e.diagnoses().is_empty() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
            sink.idle();
        }
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(50));
            sink.idle();
        }
        let text = out.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("H1") && text.contains("rank 2 (pid 102"),
            "{text}"
        );
        assert!(!text.contains("--server"), "no analyzer to query: {text}");
    }

    #[test]
    fn engine_env_is_strict_and_applied() {
        let vals: HashMap<&str, &str> = [
            ("CCLD_HANG_TIMEOUT_S", "0.5"),
            ("CCLD_SLOW_WINDOW_S", "2"),
            ("CCLD_SLOW_THETA", "1.5"),
            ("CCLD_SLOW_REPEAT", "1"),
        ]
        .into_iter()
        .collect();
        let get = |n: &str| vals.get(n).map(|v| v.to_string());
        let c = engine_config(&get).unwrap();
        assert_eq!(c.hang_threshold, Duration::from_millis(500));
        assert_eq!(c.detect_window, Duration::from_secs(2));
        assert_eq!((c.theta_slow, c.repeat_threshold), (1.5, 1));
        assert!(
            c.self_calibration.is_some(),
            "self-calibration on by default"
        );
        let fixed = |n: &str| (n == "CCLD_SLOW_CALIBRATE").then(|| "0".to_string());
        assert!(engine_config(&fixed).unwrap().self_calibration.is_none());
        for (k, v) in [
            ("CCLD_SLOW_CALIBRATE", "2"),
            ("CCLD_HANG_TIMEOUT_S", "soon"),
            ("CCLD_SLOW_THETA", "-1"),
            ("CCLD_SLOW_REPEAT", "0"),
            ("CCLD_SLOW_WINDOW_S", "inf"),
        ] {
            let get = |n: &str| (n == k).then(|| v.to_string());
            let e = engine_config(&get).unwrap_err();
            assert!(e.contains(k), "{e}");
        }
    }
}
