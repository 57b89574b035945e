//! The probe's configuration from the environment: the diagnostic thread's
//! ([`DiagConfig`]: `CCLD_SAMPLE_US`, ...) and the embedded analyzer's engine settings
//! ([`engine_config`]: `CCLD_HANG_TIMEOUT_S`, ...).

use super::*;
use analyzer::EngineConfig;

/// Default sampling period of a process whose communicators all run on the host backend:
/// there communication is CPU work on every core, and each wake-up of the diagnostic
/// thread is taken from a rank (27 us of CPU on the 2-core development VM: 2.7 % of a
/// core at 1 kHz, 0.3 % at 100 Hz).
pub const HOST_SAMPLE: Duration = Duration::from_millis(10);

/// Default sampling period of a process with a device communicator (the paper's 1 ms:
/// the host CPU is mostly idle while the GPU works).
pub const DEVICE_SAMPLE: Duration = Duration::from_millis(1);

/// Settings of the diagnostic thread (from the environment).
#[derive(Clone, Debug, PartialEq)]
pub struct DiagConfig {
    /// Sampling period (`CCLD_SAMPLE_US`); `None`: [`HOST_SAMPLE`] or [`DEVICE_SAMPLE`]
    /// by the communicators registered ([`DiagConfig::sample_period`]).
    pub sample: Option<Duration>,
    /// In-flight snapshot period (`CCLD_INFLIGHT_MS`).
    pub inflight: Duration,
    /// Heartbeat period (`CCLD_HEARTBEAT_MS`).
    pub heartbeat: Duration,
    /// Longest time records wait before a batch is sent; also the longest sampling period
    /// while no operation in flight is older than `sample` (see [`next_period`]).
    pub flush: Duration,
    /// Target interval between a rank's reported completions of one communicator
    /// (`CCLD_RECORD_US`, read again at every registration; zero: every completion, see
    /// [`thin`]).
    pub record: Duration,
}

impl Default for DiagConfig {
    fn default() -> Self {
        DiagConfig {
            sample: None,
            inflight: Duration::from_millis(1000),
            heartbeat: Duration::from_millis(1000),
            flush: Duration::from_millis(50),
            record: Duration::from_nanos(thin::DEFAULT_RECORD_NS),
        }
    }
}

/// Looks an environment variable up; `None` when unset or empty.
pub type EnvGet<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The declared integer variable `p` from `get` (`None`: unset); the error names it.
pub(crate) fn env_u64(get: EnvGet<'_>, p: &ccl_params::Param) -> Result<Option<u64>, String> {
    p.int_in(get).map_err(|e| e.0)
}

/// The declared real-valued variable `p` from `get` (`None`: unset).
pub(crate) fn env_f64(get: EnvGet<'_>, p: &ccl_params::Param) -> Result<Option<f64>, String> {
    p.real_in(get).map_err(|e| e.0)
}

/// The declared flag `p` from `get` (`None`: unset).
pub(crate) fn env_flag(get: EnvGet<'_>, p: &ccl_params::Param) -> Result<Option<bool>, String> {
    p.flag_in(get).map_err(|e| e.0)
}

/// The process environment as an [`EnvGet`].
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

impl DiagConfig {
    /// The sampling period while `sources` are registered: `CCLD_SAMPLE_US` when set,
    /// else [`DEVICE_SAMPLE`] if one of them is a device communicator, else
    /// [`HOST_SAMPLE`].
    pub fn sample_period(&self, sources: &[Arc<Source>]) -> Duration {
        self.sample.unwrap_or_else(|| {
            if sources.iter().any(|s| s.ident.device >= 0) {
                DEVICE_SAMPLE
            } else {
                HOST_SAMPLE
            }
        })
    }

    /// Pure resolution from `get` (strict: a malformed value is an error naming it).
    pub fn resolve(get: EnvGet<'_>) -> Result<DiagConfig, String> {
        let d = DiagConfig::default();
        Ok(DiagConfig {
            sample: env_u64(get, &ccl_params::CCLD_SAMPLE_US)?
                .map(Duration::from_micros)
                .or(d.sample),
            inflight: env_u64(get, &ccl_params::CCLD_INFLIGHT_MS)?
                .map_or(d.inflight, Duration::from_millis),
            heartbeat: env_u64(get, &ccl_params::CCLD_HEARTBEAT_MS)?
                .map_or(d.heartbeat, Duration::from_millis),
            flush: d.flush,
            record: env_u64(get, &ccl_params::CCLD_RECORD_US)?
                .map_or(d.record, Duration::from_micros),
        })
    }
}

/// Engine settings from the environment (strict).
///
/// `CCLD_HANG_TIMEOUT_S` (default 300), `CCLD_SLOW_WINDOW_S` (60), `CCLD_SLOW_THETA` (3),
/// `CCLD_SLOW_REPEAT` (2), `CCLD_SLOW_CALIBRATE` (1; 0 = the paper's fixed rule only),
/// `CCLD_T_BASE_INIT_MS` (10000), `CCLD_BASELINE_S` (120), `CCLD_SILENT_S` (60). Seconds may
/// be fractional.
pub fn engine_config(get: EnvGet<'_>) -> Result<EngineConfig, String> {
    let mut c = EngineConfig::default();
    let secs = |v: f64| Duration::from_secs_f64(v);
    if let Some(v) = env_f64(get, &ccl_params::CCLD_HANG_TIMEOUT_S)? {
        c.hang_threshold = secs(v);
    }
    if let Some(v) = env_f64(get, &ccl_params::CCLD_SLOW_WINDOW_S)? {
        c.detect_window = secs(v);
    }
    if let Some(v) = env_f64(get, &ccl_params::CCLD_SLOW_THETA)? {
        c.theta_slow = v;
    }
    if let Some(v) = env_u64(get, &ccl_params::CCLD_SLOW_REPEAT)? {
        c.repeat_threshold = v as u32;
    }
    if env_flag(get, &ccl_params::CCLD_SLOW_CALIBRATE)? == Some(false) {
        c.self_calibration = None;
    }
    if let Some(v) = env_u64(get, &ccl_params::CCLD_T_BASE_INIT_MS)? {
        c.t_base_init = Duration::from_millis(v);
    }
    if let Some(v) = env_f64(get, &ccl_params::CCLD_BASELINE_S)? {
        c.baseline_span = secs(v);
    }
    if let Some(v) = env_f64(get, &ccl_params::CCLD_SILENT_S)? {
        c.silent_after = secs(v);
    }
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}
