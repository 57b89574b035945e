//! `ccld simulate` (drive a cluster with the rank simulator) and `ccld calibrate`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::json;

use super::{format, json_line, print, runtime, CliError, ConnArgs};
use analyzer::sim::{H2Variant, Injection, Sim, SimAlgo, SimConfig};
use ccld_wire::{AnomalyClass, ListAnomaliesRequest, TimedBatch};

/// Topology of the simulated communicators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Topology {
    /// Pipelined ring (every collective of the mix).
    Ring,
    /// Binary tree (AllReduce).
    Tree,
}

/// Anomaly to inject into communicator 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AnomalyArg {
    /// Clean run.
    None,
    /// Hang, root rank never enters the operation.
    #[value(name = "H1", alias = "h1")]
    H1,
    /// Hang, root rank issues a different operation.
    #[value(name = "H2", alias = "h2")]
    H2,
    /// Hang, root rank stalls mid-operation (hardware fault).
    #[value(name = "H3", alias = "h3")]
    H3,
    /// Slow, root rank enters late (computation).
    #[value(name = "S1", alias = "s1")]
    S1,
    /// Slow, root rank's outgoing link is throttled (communication).
    #[value(name = "S2", alias = "s2")]
    S2,
    /// Slow, both.
    #[value(name = "S3", alias = "s3")]
    S3,
}

impl AnomalyArg {
    fn class(self) -> Option<AnomalyClass> {
        Some(match self {
            AnomalyArg::None => return None,
            AnomalyArg::H1 => AnomalyClass::H1NotEntered,
            AnomalyArg::H2 => AnomalyClass::H2Inconsistent,
            AnomalyArg::H3 => AnomalyClass::H3Hardware,
            AnomalyArg::S1 => AnomalyClass::S1ComputationSlow,
            AnomalyArg::S2 => AnomalyClass::S2CommunicationSlow,
            AnomalyArg::S3 => AnomalyClass::S3MixedSlow,
        })
    }
}

/// `ccld simulate` arguments.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Connection (all shards of the cluster, so that records are routed to their owners).
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Communicators K.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub comms: usize,
    /// Ranks per communicator N.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub ranks: u32,
    /// Communication topology.
    #[arg(long, value_enum, default_value_t = Topology::Ring)]
    pub topology: Topology,
    /// Anomaly injected into communicator 0.
    #[arg(long, value_enum, default_value_t = AnomalyArg::None)]
    pub anomaly: AnomalyArg,
    /// Root-cause rank of the injected anomaly.
    #[arg(long, value_name = "R", default_value_t = 0)]
    pub root_rank: u32,
    /// H1/H3: the root's process also stops reporting (SIGSTOP / dead), before the round
    /// (H1) or inside it after a part of its data (H3); either is diagnosed H1.
    #[arg(long)]
    pub silent: bool,
    /// H2: the root completes a different operation and moves on (instead of hanging on
    /// another one).
    #[arg(long)]
    pub h2_completes: bool,
    /// Simulated time at which the anomaly begins, seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 200.0)]
    pub inject_at_s: f64,
    /// Simulated time to run, seconds (default: inject time + 330 s for hangs, + 200 s
    /// otherwise, matching the paper's 5 min hang threshold and 1 min windows).
    #[arg(long, value_name = "SECONDS")]
    pub duration_s: Option<f64>,
    /// PRNG seed (same seed, same stream).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Channels per operation.
    #[arg(long, value_name = "C", default_value_t = 2)]
    pub channels: u32,
    /// Base communication time of one operation, ms.
    #[arg(long, value_name = "MS", default_value_t = 200.0)]
    pub op_ms: f64,
    /// Round period (operation + computation), ms.
    #[arg(long, value_name = "MS", default_value_t = 5000.0)]
    pub period_ms: f64,
    /// In-flight snapshot interval, ms.
    #[arg(long, value_name = "MS", default_value_t = 5000.0)]
    pub snapshot_ms: f64,
    /// Heartbeat interval, ms.
    #[arg(long, value_name = "MS", default_value_t = 10000.0)]
    pub heartbeat_ms: f64,
    /// Batch interval (how often the simulated reporters send), ms.
    #[arg(long, value_name = "MS", default_value_t = 1000.0)]
    pub batch_ms: f64,
    /// Send as fast as possible with simulated time in `ccld-now-ns` metadata. The servers
    /// must run `ccld serve --clock driven`. Without this flag the stream is sent in real
    /// time against the servers' wall clock (choose short --op-ms/--period-ms and server
    /// thresholds for a quick demo).
    #[arg(long)]
    pub compressed: bool,
    /// Also write the stream to this recording file (input for `ccld calibrate`).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// After the stream, wait up to this long (wall seconds) for the injected anomaly to be
    /// diagnosed; exit status 3 if it is not (or is diagnosed with another class/rank).
    #[arg(long, value_name = "SECONDS")]
    pub expect_within_s: Option<f64>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

fn ms(name: &str, v: f64) -> Result<u64, CliError> {
    if !v.is_finite() || v <= 0.0 || v > 1e12 {
        return Err(CliError::Usage(format!(
            "{name} must be a positive number of milliseconds, got {v}"
        )));
    }
    Ok((v * 1e6) as u64)
}

impl SimulateArgs {
    /// The simulator configuration (epoch = `epoch_ns`).
    pub fn sim_config(&self, epoch_ns: u64) -> Result<SimConfig, CliError> {
        let start = (super::secs("--inject-at-s", self.inject_at_s.max(1e-9))?).as_nanos() as u64;
        let class = self.anomaly.class();
        let is_hang = matches!(
            class,
            Some(
                AnomalyClass::H1NotEntered
                    | AnomalyClass::H2Inconsistent
                    | AnomalyClass::H3Hardware
            )
        );
        let duration_ns = match self.duration_s {
            Some(d) => super::secs("--duration-s", d)?.as_nanos() as u64,
            None if is_hang => start + 330_000_000_000,
            None => start + 200_000_000_000,
        };
        if self.root_rank >= self.ranks {
            return Err(CliError::Usage(format!(
                "--root-rank {} must be below --ranks {}",
                self.root_rank, self.ranks
            )));
        }
        Ok(SimConfig {
            seed: self.seed,
            comms: self.comms,
            nranks: self.ranks,
            algo: match self.topology {
                Topology::Ring => SimAlgo::Ring,
                Topology::Tree => SimAlgo::Tree,
            },
            channels: self.channels,
            op_ns: ms("--op-ms", self.op_ms)?,
            period_ns: ms("--period-ms", self.period_ms)?,
            snapshot_ns: ms("--snapshot-ms", self.snapshot_ms)?,
            heartbeat_ns: ms("--heartbeat-ms", self.heartbeat_ms)?,
            batch_ns: ms("--batch-ms", self.batch_ms)?,
            duration_ns,
            epoch_ns,
            inject: class.map(|class| Injection {
                class,
                rank: self.root_rank,
                start_ns: start,
                silent: self.silent,
                h2: if self.h2_completes {
                    H2Variant::Completes
                } else {
                    H2Variant::TypeMismatch
                },
            }),
            ..SimConfig::default()
        })
    }
}

/// Runs `ccld simulate`.
pub fn run(a: SimulateArgs) -> Result<(), CliError> {
    let epoch = analyzer_net::server::now_ns();
    let cfg = a.sim_config(epoch)?;
    let sim = Sim::new(cfg).map_err(|e| CliError::Usage(e.to_string()))?;
    let truth = sim.truth();
    let comm_ids = sim.comm_ids();
    let mut recorded: Vec<TimedBatch> = Vec::new();
    let rt = runtime()?;
    let compressed = a.compressed;
    let (accepted, rejected, failed_over, batches, reasons, diag) = rt.block_on(async {
        let mut client = a.conn.client()?;
        let t0 = Instant::now();
        let (mut acc, mut rej, mut fo, mut nb) = (0u64, 0u64, 0u64, 0u64);
        let mut reasons: Vec<String> = Vec::new();
        for tb in sim {
            if !compressed {
                let due = Duration::from_nanos(tb.now_ns.saturating_sub(epoch));
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            if a.record.is_some() {
                recorded.push(tb.clone());
            }
            let batch = tb.batch.unwrap_or_default();
            let out = client
                .ingest_at(batch, compressed.then_some(tb.now_ns))
                .await?;
            acc += out.accepted;
            rej += out.rejected;
            fo += out.failed_over;
            nb += 1;
            for r in out.reasons {
                if reasons.len() < 10 {
                    reasons.push(r);
                }
            }
        }
        // Wait for the diagnosis of the injected anomaly.
        let mut found = None;
        if let (Some(t), Some(w)) = (&truth, a.expect_within_s) {
            let limit = super::secs("--expect-within-s", w)?;
            let t1 = Instant::now();
            loop {
                let l = client
                    .list_anomalies(ListAnomaliesRequest {
                        comm_id: Some(t.comm_id),
                        ..Default::default()
                    })
                    .await?;
                if let Some(d) = l.diagnoses.into_iter().last() {
                    found = Some(d);
                    break;
                }
                if t1.elapsed() > limit {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok::<_, CliError>((acc, rej, fo, nb, reasons, found))
    })?;
    if let Some(path) = &a.record {
        let f = std::fs::File::create(path).map_err(|source| CliError::Io {
            what: format!("creating {}", path.display()),
            source,
        })?;
        analyzer::sim::recording::write_recording(&mut std::io::BufWriter::new(f), recorded)
            .map_err(|e| CliError::Other(format!("writing {}: {e}", path.display())))?;
    }
    let matches = match (&truth, &diag) {
        (Some(t), Some(d)) => d.class == t.class as i32 && d.roots.iter().any(|r| r.rank == t.rank),
        _ => false,
    };
    if a.json {
        let v = json!({
            "batches": batches,
            "accepted": accepted,
            "rejected": rejected,
            "failed_over": failed_over,
            "reject_reasons": reasons,
            "comm_ids": comm_ids,
            "injected": truth.as_ref().map(|t| json!({
                "comm_id": t.comm_id,
                "class": ccld_wire::class_code(t.class),
                "rank": t.rank,
            })),
            "diagnosis": diag.as_ref().map(format::diagnosis_json),
            "matches": matches,
        });
        print(&json_line(&v, true))?;
    } else {
        let mut s = format!(
            "sent {batches} batches: {accepted} records accepted, {rejected} rejected, {failed_over} failed over\n"
        );
        for r in &reasons {
            s.push_str(&format!("  reject: {r}\n"));
        }
        if let Some(t) = &truth {
            s.push_str(&format!(
                "injected {} at rank {} of comm {:#018x}\n",
                ccld_wire::class_code(t.class),
                t.rank,
                t.comm_id
            ));
        }
        match &diag {
            Some(d) => {
                s.push_str("diagnosed:\n");
                s.push_str(&format::diagnosis_block(d));
            }
            None if a.expect_within_s.is_some() => s.push_str("not diagnosed in time\n"),
            None => {}
        }
        print(&s)?;
    }
    if a.expect_within_s.is_some() && truth.is_some() && !matches {
        return Err(CliError::Other(
            "the injected anomaly was not diagnosed with the injected class and rank".into(),
        ));
    }
    Ok(())
}

/// `ccld calibrate` arguments.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Recording files of clean runs (`ccld simulate --record`). Each file is replayed on
    /// its own engine (they are independent runs); the theta printed last is the largest
    /// per-file theta.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// Quantile q of the clean windows' slowdown ratios R.
    #[arg(long, default_value_t = 0.999)]
    pub quantile: f64,
    /// Safety factor: theta = max(floor, safety x Q_q(R)).
    #[arg(long, default_value_t = 1.5)]
    pub safety: f64,
    /// Smallest theta ever proposed.
    #[arg(long, default_value_t = 1.0)]
    pub floor: f64,
    /// Histogram bins.
    #[arg(long, default_value_t = 20)]
    pub bins: usize,
    /// Detection window used during replay (the window the servers run with).
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub slow_window_s: f64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `ccld calibrate`.
pub fn run_calibrate(a: CalibrateArgs) -> Result<(), CliError> {
    let mut cfg =
        analyzer::calibrate::config_with_window(super::secs("--slow-window-s", a.slow_window_s)?);
    cfg.quantile = a.quantile;
    cfg.safety = a.safety;
    cfg.floor = a.floor;
    cfg.bins = a.bins;
    let mut results = Vec::new();
    for f in &a.files {
        let file = std::fs::File::open(f).map_err(|source| CliError::Io {
            what: format!("opening {}", f.display()),
            source,
        })?;
        let c = analyzer::calibrate::calibrate_recording(std::io::BufReader::new(file), &cfg)
            .map_err(|e| CliError::Other(format!("{}: {e}", f.display())))?;
        results.push((f.display().to_string(), c));
    }
    let theta = results
        .iter()
        .map(|(_, c)| c.theta)
        .fold(f64::NEG_INFINITY, f64::max);
    if a.json {
        let v = json!({
            "theta_slow": theta,
            "files": results.iter().map(|(f, c)| json!({
                "file": f,
                "theta_slow": c.theta,
                "windows": c.windows,
                "excluded": c.excluded,
                "min_r": c.min,
                "max_r": c.max,
                "quantiles": c.quantiles.iter().map(|(q, v)| json!({"q": q, "r": v})).collect::<Vec<_>>(),
                "histogram": c.histogram.iter().map(|(lo, hi, n)| json!({"lo": lo, "hi": hi, "count": n})).collect::<Vec<_>>(),
                "statistic": c.statistic,
            })).collect::<Vec<_>>(),
        });
        print(&json_line(&v, true))
    } else {
        let mut s = String::new();
        for (f, c) in &results {
            s.push_str(&format!("== {f}\n{c}"));
        }
        if results.len() > 1 {
            s.push_str(&format!(
                "theta_slow = {theta:.3} (largest over {} files)\n",
                results.len()
            ));
        }
        s.push_str(&format!(
            "use: ccld serve --slow-theta {theta:.3} --slow-window-s {}\n",
            a.slow_window_s
        ));
        print(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<SimulateArgs, String> {
        #[derive(Parser)]
        struct W {
            #[command(flatten)]
            a: SimulateArgs,
        }
        W::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map(|w| w.a)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn builds_sim_config() {
        let a = parse(&[
            "--ranks",
            "16",
            "--topology",
            "tree",
            "--anomaly",
            "S2",
            "--root-rank",
            "5",
            "--inject-at-s",
            "10",
            "--comms",
            "3",
        ])
        .unwrap();
        let c = a.sim_config(7).unwrap();
        assert_eq!(c.nranks, 16);
        assert_eq!(c.algo, SimAlgo::Tree);
        assert_eq!(c.comms, 3);
        assert_eq!(c.epoch_ns, 7);
        let i = c.inject.unwrap();
        assert_eq!(i.class, AnomalyClass::S2CommunicationSlow);
        assert_eq!(i.rank, 5);
        assert_eq!(i.start_ns, 10_000_000_000);
        assert_eq!(c.duration_ns, 210_000_000_000);
        let h = parse(&["--anomaly", "h1"]).unwrap().sim_config(0).unwrap();
        assert_eq!(h.duration_ns, 530_000_000_000);
        assert!(parse(&["--anomaly", "none"])
            .unwrap()
            .sim_config(0)
            .unwrap()
            .inject
            .is_none());
    }

    #[test]
    fn rejects_bad_values() {
        assert!(parse(&["--ranks", "4", "--root-rank", "4"])
            .unwrap()
            .sim_config(0)
            .is_err());
        assert!(parse(&["--op-ms", "0"]).unwrap().sim_config(0).is_err());
        assert!(parse(&["--anomaly", "H9"]).is_err());
    }
}
