//! Statistical calibration of `theta_slow` from recorded clean runs.
//!
//! The paper determines theta_slow statistically (about 3 in production). Here:
//!
//! 1. replay the clean recording (file format: [`crate::sim::recording`]) through an
//!    [`Engine`] that never diagnoses slowness (theta = +inf) and logs every closed detection
//!    window ([`EngineConfig::record_windows`]);
//! 2. keep the windows judged against the *dynamic* baseline (the static T_base(init) is an
//!    administrator's guess, not a property of the run) with a finite R;
//! 3. **theta = max(floor, safety x Q_q(R))**, Q_q the empirical q-quantile (linear
//!    interpolation between order statistics; default q = 0.999, safety = 1.5, floor = 1.0).
//!    With fewer than 1 / (1 - q) windows Q_q is close to the largest R seen, so the
//!    threshold sits above every clean window by the safety factor.
//!
//! [`Calibration`] prints the quantiles and a text histogram of R.

use std::fmt;
use std::io::Read;
use std::time::Duration;

use crate::engine::{Engine, EngineConfig};
use crate::sim::recording::{read_recording, RecordingError};
use crate::wire::TimedBatch;

/// Parameters of the calibration.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationConfig {
    /// Quantile of R used (0 < q <= 1).
    pub quantile: f64,
    /// Factor applied to the quantile (>= 1).
    pub safety: f64,
    /// Smallest theta returned.
    pub floor: f64,
    /// Histogram bins.
    pub bins: usize,
    /// Detection parameters of the replay (window, baseline); theta and window logging
    /// are set by the calibration itself.
    pub engine: EngineConfig,
}

impl Default for CalibrationConfig {
    fn default() -> Self {
        CalibrationConfig {
            quantile: 0.999,
            safety: 1.5,
            floor: 1.0,
            bins: 20,
            engine: EngineConfig::default(),
        }
    }
}

/// Why no threshold could be computed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// The recording could not be read.
    #[error(transparent)]
    Recording(#[from] RecordingError),
    /// No detection window with a dynamic baseline and a finite R: the run is too short
    /// (it needs more than the baseline span plus one detection window) or has no rounds.
    #[error(
        "no detection window with a dynamic baseline in the input ({windows} windows in total)"
    )]
    NoWindows {
        /// Windows seen (any baseline).
        windows: usize,
    },
    /// A parameter is out of range.
    #[error("invalid calibration parameter {field}: {why}")]
    Invalid {
        /// Parameter.
        field: &'static str,
        /// What is wrong.
        why: &'static str,
    },
}

/// Result: theta and the distribution it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// The threshold to configure (`CCLD_SLOW_THETA`).
    pub theta: f64,
    /// Windows used.
    pub windows: usize,
    /// Windows left out (static baseline or non-finite R).
    pub excluded: usize,
    /// (q, Q_q(R)) for q = 0.5, 0.9, 0.99, 0.999 and the configured q.
    pub quantiles: Vec<(f64, f64)>,
    /// Smallest and largest R.
    pub min: f64,
    /// Largest R.
    pub max: f64,
    /// Histogram: (lower edge, upper edge, count).
    pub histogram: Vec<(f64, f64, usize)>,
    /// The statistic, in words.
    pub statistic: String,
}

/// Empirical quantile with linear interpolation between order statistics (R's type 7):
/// `sorted` ascending, non-empty; q in [0, 1].
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let h = (sorted.len() - 1) as f64 * q.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// Theta from per-window slowdown ratios (pure). Non-finite values are excluded.
pub fn theta_from_r(rs: &[f64], cfg: &CalibrationConfig) -> Result<Calibration, CalibrateError> {
    if !(cfg.quantile > 0.0 && cfg.quantile <= 1.0) {
        return Err(CalibrateError::Invalid {
            field: "quantile",
            why: "must be in (0, 1]",
        });
    }
    if !(cfg.safety >= 1.0 && cfg.safety.is_finite()) {
        return Err(CalibrateError::Invalid {
            field: "safety",
            why: "must be a finite number >= 1",
        });
    }
    if !cfg.floor.is_finite() || cfg.bins == 0 {
        return Err(CalibrateError::Invalid {
            field: "floor/bins",
            why: "floor must be finite and bins >= 1",
        });
    }
    let mut v: Vec<f64> = rs.iter().copied().filter(|x| x.is_finite()).collect();
    let excluded = rs.len() - v.len();
    if v.is_empty() {
        return Err(CalibrateError::NoWindows { windows: rs.len() });
    }
    v.sort_unstable_by(f64::total_cmp);
    let (min, max) = (v[0], v[v.len() - 1]);
    let mut qs: Vec<f64> = vec![0.5, 0.9, 0.99, 0.999];
    if !qs.contains(&cfg.quantile) {
        qs.push(cfg.quantile);
    }
    let quantiles: Vec<(f64, f64)> = qs.iter().map(|&q| (q, quantile(&v, q))).collect();
    let qv = quantile(&v, cfg.quantile);
    let theta = (cfg.safety * qv).max(cfg.floor);
    let lo = min.min(0.0);
    let width = ((max - lo) / cfg.bins as f64).max(f64::MIN_POSITIVE);
    let mut histogram: Vec<(f64, f64, usize)> = (0..cfg.bins)
        .map(|i| (lo + i as f64 * width, lo + (i + 1) as f64 * width, 0))
        .collect();
    for x in &v {
        let i = (((x - lo) / width) as usize).min(cfg.bins - 1);
        histogram[i].2 += 1;
    }
    Ok(Calibration {
        theta,
        windows: v.len(),
        excluded,
        quantiles,
        min,
        max,
        histogram,
        statistic: format!(
            "theta = max({}, {} x Q_{}(R)) over {} clean windows (dynamic baseline)",
            cfg.floor,
            cfg.safety,
            cfg.quantile,
            v.len()
        ),
    })
}

/// Replays timed batches (clean run) and calibrates theta from the windows' R values.
pub fn calibrate_batches(
    batches: impl IntoIterator<Item = Result<TimedBatch, RecordingError>>,
    cfg: &CalibrationConfig,
) -> Result<Calibration, CalibrateError> {
    let mut ecfg = cfg.engine.clone();
    ecfg.theta_slow = f64::INFINITY;
    ecfg.record_windows = true;
    // A clean run must not be cut short by hang handling; keep the configured threshold.
    let window = ecfg.detect_window;
    let mut engine = Engine::new(ecfg);
    let mut rs = Vec::new();
    let mut total = 0usize;
    let mut last_now = 0;
    let collect = |engine: &mut Engine, rs: &mut Vec<f64>, total: &mut usize| {
        for w in engine.take_window_log() {
            *total += 1;
            if w.dynamic {
                rs.push(w.r);
            }
        }
    };
    for b in batches {
        let b = b?;
        last_now = b.now_ns;
        if let Some(batch) = b.batch.as_ref() {
            for rec in &batch.records {
                // Invalid records are the analyzer's normal business: skipped, as live.
                let _ = engine.ingest(rec, b.now_ns);
            }
            for hb in &batch.heartbeats {
                engine.heartbeat(hb, b.now_ns);
            }
        }
        engine.tick(b.now_ns);
        collect(&mut engine, &mut rs, &mut total);
    }
    // Close the last window.
    engine.tick(last_now.saturating_add(u64::try_from(window.as_nanos()).unwrap_or(u64::MAX)));
    collect(&mut engine, &mut rs, &mut total);
    if rs.is_empty() {
        return Err(CalibrateError::NoWindows { windows: total });
    }
    let mut c = theta_from_r(&rs, cfg)?;
    c.excluded += total - rs.len();
    Ok(c)
}

/// Calibrates from a recording file (see [`crate::sim::recording`]).
pub fn calibrate_recording<R: Read>(
    r: R,
    cfg: &CalibrationConfig,
) -> Result<Calibration, CalibrateError> {
    calibrate_batches(read_recording(r)?, cfg)
}

impl fmt::Display for Calibration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "theta_slow = {:.3}", self.theta)?;
        writeln!(f, "statistic: {}", self.statistic)?;
        writeln!(
            f,
            "windows: {} used, {} excluded (static baseline or infinite R); R in [{:.4}, {:.4}]",
            self.windows, self.excluded, self.min, self.max
        )?;
        for (q, v) in &self.quantiles {
            writeln!(f, "  Q_{q:<6} = {v:.4}")?;
        }
        let peak = self.histogram.iter().map(|h| h.2).max().unwrap_or(1).max(1);
        for (lo, hi, n) in &self.histogram {
            let bar = "#".repeat((n * 40).div_ceil(peak));
            writeln!(f, "  [{lo:>8.4}, {hi:>8.4}) {n:>6} {bar}")?;
        }
        Ok(())
    }
}

/// Convenience: a default configuration with a given detection window.
pub fn config_with_window(window: Duration) -> CalibrationConfig {
    let mut c = CalibrationConfig::default();
    c.engine.detect_window = window;
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::recording::write_recording;
    use crate::sim::{drive, Injection, Sim, SimConfig};
    use crate::wire::AnomalyClass;

    #[test]
    fn quantile_interpolates_between_order_statistics() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        // h = 4 x 0.9 = 3.6: 4 + 0.6 x (5 - 4) = 4.6.
        assert!((quantile(&v, 0.9) - 4.6).abs() < 1e-12);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn theta_is_safety_times_quantile_with_a_floor() {
        let rs: Vec<f64> = (0..=100).map(|i| f64::from(i) / 10.0).collect(); // 0.0 ..= 10.0
        let cfg = CalibrationConfig {
            quantile: 0.9,
            safety: 1.5,
            floor: 1.0,
            bins: 10,
            ..Default::default()
        };
        let c = theta_from_r(&rs, &cfg).unwrap();
        // Q_0.9 = 9.0; theta = 13.5.
        assert!((c.theta - 13.5).abs() < 1e-12, "{}", c.theta);
        assert_eq!(c.windows, 101);
        assert_eq!(c.histogram.iter().map(|h| h.2).sum::<usize>(), 101);
        assert_eq!(c.histogram.len(), 10);
        assert_eq!((c.min, c.max), (0.0, 10.0));
        let small = theta_from_r(&[0.1, 0.2, f64::INFINITY], &cfg).unwrap();
        assert_eq!(small.theta, 1.0, "floor");
        assert_eq!(small.excluded, 1);
        assert!(matches!(
            theta_from_r(&[f64::NAN], &cfg),
            Err(CalibrateError::NoWindows { windows: 1 })
        ));
        let bad = CalibrationConfig {
            quantile: 0.0,
            ..cfg.clone()
        };
        assert!(matches!(
            theta_from_r(&rs, &bad),
            Err(CalibrateError::Invalid {
                field: "quantile",
                ..
            })
        ));
        let bad = CalibrationConfig { safety: 0.5, ..cfg };
        assert!(matches!(
            theta_from_r(&rs, &bad),
            Err(CalibrateError::Invalid {
                field: "safety",
                ..
            })
        ));
        let text = c.to_string();
        assert!(text.starts_with("theta_slow = 13.500"), "{text}");
        assert!(text.contains("Q_0.9"));
    }

    fn sim_cfg(jitter: f64) -> SimConfig {
        SimConfig {
            nranks: 8,
            jitter,
            duration_ns: 900_000_000_000,
            ..SimConfig::default()
        }
    }

    #[test]
    fn calibrating_a_clean_sim_recording_gives_a_theta_that_is_quiet_on_it_and_still_detects() {
        // Clean run with strong jitter (+-60 % of the communication time).
        let clean = sim_cfg(0.6);
        let mut file = Vec::new();
        write_recording(&mut file, Sim::new(clean.clone()).unwrap()).unwrap();
        let cfg = CalibrationConfig {
            floor: 0.0,
            ..Default::default()
        };
        let c = calibrate_recording(file.as_slice(), &cfg).unwrap();
        assert!(c.windows >= 10, "{c}");
        assert!(c.theta > c.max, "{c}");
        assert!(c.max > 0.0, "jitter produces positive R: {c}");
        // Quiet on the data it was calibrated on, with every window counted as evidence.
        let ecfg = EngineConfig {
            theta_slow: c.theta,
            repeat_threshold: 1,
            ..EngineConfig::default()
        };
        let res = drive(
            Sim::new(clean.clone()).unwrap(),
            &mut Engine::new(ecfg.clone()),
        );
        assert!(
            res.diagnoses.is_empty(),
            "{:?}",
            res.diagnoses.first().map(|d| &d.summary)
        );
        // And a real slowdown still stands out.
        let mut slow = clean;
        slow.inject = Some(Injection {
            class: AnomalyClass::S1ComputationSlow,
            rank: 2,
            start_ns: 300_000_000_000,
            silent: false,
            h2: crate::sim::H2Variant::TypeMismatch,
        });
        slow.late_ns = 4_000_000_000;
        let res = drive(Sim::new(slow).unwrap(), &mut Engine::new(ecfg));
        assert_eq!(res.diagnoses.len(), 1);
        assert_eq!(res.diagnoses[0].roots[0].rank, 2);
    }

    #[test]
    fn unusable_inputs_are_typed_errors() {
        // Too short for a dynamic baseline.
        let short = SimConfig {
            duration_ns: 100_000_000_000,
            ..sim_cfg(0.1)
        };
        let mut file = Vec::new();
        write_recording(&mut file, Sim::new(short).unwrap()).unwrap();
        assert!(matches!(
            calibrate_recording(file.as_slice(), &CalibrationConfig::default()),
            Err(CalibrateError::NoWindows { .. })
        ));
        assert!(matches!(
            calibrate_recording(&b"garbage!"[..], &CalibrationConfig::default()),
            Err(CalibrateError::Recording(RecordingError::BadMagic))
        ));
        let mut cut = Vec::new();
        write_recording(&mut cut, Sim::new(sim_cfg(0.1)).unwrap()).unwrap();
        cut.truncate(cut.len() / 2);
        assert!(matches!(
            calibrate_recording(cut.as_slice(), &CalibrationConfig::default()),
            Err(CalibrateError::Recording(RecordingError::Truncated { .. }))
        ));
    }
}
