//! The embedded analyzer (`CCLD_ANALYZER=embedded`, the default): the analyzer engine runs
//! inside this process on the reporter thread, fed directly by the diagnostic thread.
//!
//! It sees the ranks of this process only, so it diagnoses a communicator only when every
//! rank of it lives in this process (ranks as threads: `ncclCommInitAll`, one process per
//! node driving all its devices, the `ccl-demo`); diagnoses of communicators with ranks in
//! other processes are suppressed (they would name the unseen ranks). Multi-process jobs
//! point `CCLD_ANALYZER` at an analyzer service (`ccld serve`) instead.
//!
//! Diagnoses are logged as warnings (target `nccl::COLL`) and kept for [`Embedded::diagnoses`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use analyzer::wire;
use analyzer::{Engine, EngineConfig};

use crate::diag::{env_f64, env_u64, now_ns, EnvGet, Sink};

/// Engine settings from the environment (strict).
///
/// `CCLD_HANG_TIMEOUT_S` (default 300), `CCLD_SLOW_WINDOW_S` (60), `CCLD_SLOW_THETA` (3),
/// `CCLD_SLOW_REPEAT` (2), `CCLD_T_BASE_INIT_MS` (10000), `CCLD_BASELINE_S` (120),
/// `CCLD_SILENT_S` (60). Seconds may be fractional.
pub fn engine_config(get: EnvGet<'_>) -> Result<EngineConfig, String> {
    let mut c = EngineConfig::default();
    let secs = |v: f64| Duration::from_secs_f64(v);
    if let Some(v) = env_f64(get, "CCLD_HANG_TIMEOUT_S", 0.01, 1e6)? {
        c.hang_threshold = secs(v);
    }
    if let Some(v) = env_f64(get, "CCLD_SLOW_WINDOW_S", 0.01, 1e6)? {
        c.detect_window = secs(v);
    }
    if let Some(v) = env_f64(get, "CCLD_SLOW_THETA", 0.01, 1e6)? {
        c.theta_slow = v;
    }
    if let Some(v) = env_u64(get, "CCLD_SLOW_REPEAT", 1, 1000)? {
        c.repeat_threshold = v as u32;
    }
    if let Some(v) = env_u64(get, "CCLD_T_BASE_INIT_MS", 1, 86_400_000)? {
        c.t_base_init = Duration::from_millis(v);
    }
    if let Some(v) = env_f64(get, "CCLD_BASELINE_S", 0.01, 1e6)? {
        c.baseline_span = secs(v);
    }
    if let Some(v) = env_f64(get, "CCLD_SILENT_S", 0.01, 1e6)? {
        c.silent_after = secs(v);
    }
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

/// The in-process analyzer.
pub struct Embedded {
    engine: Mutex<Engine>,
    ranks_seen: Mutex<HashMap<u64, (u32, HashSet<u32>)>>,
    diagnoses: Mutex<Vec<wire::Diagnosis>>,
    suppressed: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Poisoning only means a panic elsewhere; the data is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

static EMBEDDED: OnceLock<Arc<Embedded>> = OnceLock::new();

/// The embedded analyzer of this process, if `CCLD_ANALYZER=embedded` started one.
pub fn embedded() -> Option<Arc<Embedded>> {
    EMBEDDED.get().cloned()
}

impl Embedded {
    /// A new embedded analyzer.
    pub fn new(cfg: EngineConfig) -> Embedded {
        Embedded {
            engine: Mutex::new(Engine::new(cfg)),
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
        lock(&self.diagnoses).clone()
    }

    /// Diagnoses suppressed because the communicator has ranks in other processes.
    pub fn suppressed(&self) -> u64 {
        *lock(&self.suppressed)
    }

    /// The engine's view of one communicator.
    pub fn comm_state(&self, comm_id: u64) -> Option<wire::CommState> {
        lock(&self.engine).comm_state(comm_id, now_ns())
    }

    /// Feeds one batch at process time `now`.
    pub fn ingest(&self, b: &wire::Batch, now: u64) {
        {
            let mut seen = lock(&self.ranks_seen);
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
        let mut eng = lock(&self.engine);
        for hb in &b.heartbeats {
            eng.heartbeat(hb, now);
        }
        for r in &b.records {
            if let Err(e) = eng.ingest(r, now) {
                tracing::debug!(target: "nccl::COLL", "embedded analyzer rejected a record: {e:?}");
            }
        }
    }

    /// Runs detection at `now`; returns (and keeps) the new diagnoses of communicators whose
    /// ranks all report to this process.
    pub fn tick(&self, now: u64) -> Vec<wire::Diagnosis> {
        let new = lock(&self.engine).tick_with_clock(now, &mut now_ns);
        if new.is_empty() {
            return new;
        }
        let seen = lock(&self.ranks_seen);
        let (keep, drop): (Vec<_>, Vec<_>) = new.into_iter().partition(|d| {
            seen.get(&d.comm_id)
                .is_some_and(|(n, set)| set.len() as u32 == *n)
        });
        drop_count(&self.suppressed, drop.len());
        for d in &keep {
            tracing::warn!(target: "nccl::COLL", "CCL-D diagnosis: {}", crate::describe(d));
        }
        lock(&self.diagnoses).extend(keep.iter().cloned());
        keep
    }
}

fn drop_count(m: &Mutex<u64>, n: usize) {
    *lock(m) += n as u64;
}

/// The sink feeding the embedded analyzer; ticks it every 100 ms.
pub(crate) struct EmbeddedSink {
    pub(crate) e: Arc<Embedded>,
    pub(crate) last_tick: Instant,
}

impl Sink for EmbeddedSink {
    fn deliver(&mut self, batch: wire::Batch) {
        self.e.ingest(&batch, now_ns());
    }

    fn idle(&mut self) {
        if self.last_tick.elapsed() >= Duration::from_millis(100) {
            self.last_tick = Instant::now();
            self.e.tick(now_ns());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for (k, v) in [
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
