//! `ccld serve`: run one analyzer shard until Ctrl-C / SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{secs, CliError, DEFAULT_ADDR};
use crate::store::Store;
use analyzer::engine::EngineConfig;
use analyzer_net::auth;
use analyzer_net::server::{self, ClockMode, PeerConfig, ServerConfig, DEFAULT_MAX_MESSAGE_BYTES};
use analyzer_net::shard::ShardMap;

/// Detection and location parameters (CCL-D section 4.2).
#[derive(Debug, Clone, Args)]
pub struct DetectArgs {
    /// Hang threshold: a rank in flight longer than this is hung (paper: 300 s).
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub hang_timeout_s: f64,
    /// Slowdown ratio R = (T_max - T_base)/T_base above which a window is slow (paper: about
    /// 3; see `ccld calibrate`).
    #[arg(long, value_name = "THETA", default_value_t = 3.0)]
    pub slow_theta: f64,
    /// Slow detection window (paper: 60 s).
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub slow_window_s: f64,
    /// Consecutive slow windows required before location runs (filters transient jitter).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub slow_repeat: u32,
    /// Use the paper's fixed rule only (R of a window's widest round > --slow-theta), not
    /// the per-communicator self-calibrated one (docs/diagnosis.md, "Thresholds").
    #[arg(long)]
    pub slow_fixed_theta: bool,
    /// Initial baseline T_base(init) used for the first m rounds (slow-at-start).
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub t_base_init_s: f64,
    /// Upper bound of m, the rounds averaged into the dynamic baseline (paper: 100).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub baseline_rounds: usize,
    /// Only rounds within this span after the first count towards m (paper: 120 s).
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    pub baseline_span_s: f64,
    /// P below alpha: communication-slow (S2).
    #[arg(long, default_value_t = 0.4)]
    pub alpha: f64,
    /// P above beta: computation-slow (S1); between alpha and beta: mixed (S3).
    #[arg(long, default_value_t = 0.6)]
    pub beta: f64,
    /// A rank with no record or heartbeat for this long is reported silent.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    pub silent_after_s: f64,
    /// AllReduce calls moving at most this many bytes are barriers: never slow, and a hang
    /// only when a rank has not reached one after twice the hang threshold.
    #[arg(long, value_name = "BYTES", default_value_t = 4)]
    pub barrier_max_bytes: u64,
    /// Largest accepted communicator size.
    #[arg(long, value_name = "N", default_value_t = 65_536)]
    pub max_ranks: u32,
    /// Communicators tracked at most per shard.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub max_comms: usize,
    /// Rounds kept in memory per communicator.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_rounds_per_comm: usize,
    /// Tolerated backwards jump of a rank's clock (records further back are rejected).
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pub max_clock_skew_s: f64,
    /// Communicators silent this long are forgotten (their history stays in the store).
    #[arg(long, value_name = "SECONDS", default_value_t = 3600.0)]
    pub comm_idle_evict_s: f64,
}

impl DetectArgs {
    /// Validates and builds the engine configuration.
    pub fn engine_config(&self) -> Result<EngineConfig, CliError> {
        let mut c = EngineConfig {
            hang_threshold: secs("--hang-timeout-s", self.hang_timeout_s)?,
            detect_window: secs("--slow-window-s", self.slow_window_s)?,
            t_base_init: secs("--t-base-init-s", self.t_base_init_s)?,
            baseline_span: secs("--baseline-span-s", self.baseline_span_s)?,
            silent_after: secs("--silent-after-s", self.silent_after_s)?,
            max_future_skew: secs("--max-clock-skew-s", self.max_clock_skew_s)?,
            comm_idle_evict: secs("--comm-idle-evict-s", self.comm_idle_evict_s)?,
            ..EngineConfig::default()
        };
        if !(self.slow_theta.is_finite() && self.slow_theta > 0.0) {
            return Err(CliError::Usage(format!(
                "--slow-theta must be a positive number, got {}",
                self.slow_theta
            )));
        }
        if !(0.0 < self.alpha && self.alpha <= self.beta && self.beta < 1.0) {
            return Err(CliError::Usage(format!(
                "need 0 < --alpha <= --beta < 1, got alpha {} beta {}",
                self.alpha, self.beta
            )));
        }
        for (name, v) in [
            ("--baseline-rounds", self.baseline_rounds),
            ("--max-comms", self.max_comms),
            ("--max-rounds-per-comm", self.max_rounds_per_comm),
            ("--max-ranks", self.max_ranks as usize),
        ] {
            if v == 0 {
                return Err(CliError::Usage(format!("{name} must be at least 1")));
            }
        }
        c.theta_slow = self.slow_theta;
        c.repeat_threshold = self.slow_repeat;
        if self.slow_fixed_theta {
            c.self_calibration = None;
        }
        c.baseline_rounds_max = self.baseline_rounds;
        c.alpha = self.alpha;
        c.beta = self.beta;
        c.barrier_max_bytes = self.barrier_max_bytes;
        c.max_ranks = self.max_ranks;
        c.max_comms = self.max_comms;
        c.max_rounds_per_comm = self.max_rounds_per_comm;
        Ok(c)
    }
}

/// Clock source of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClockArg {
    /// Wall clock.
    Wall,
    /// Driven by ingest metadata.
    Driven,
}

/// `ccld serve` arguments.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// gRPC listen address.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_ADDR)]
    pub listen: SocketAddr,
    /// Cluster shard list, comma-separated `host:port` as clients address them (the same
    /// list, in any order, on every shard and client). Omitted: a single shard.
    #[arg(long, value_name = "A,B,C")]
    pub shards: Option<String>,
    /// This shard's index (0-based) in --shards. Default: the entry equal to --listen.
    #[arg(long, value_name = "I", requires = "shards")]
    pub shard_id: Option<usize>,
    /// Directory of the persistent diagnosis store (created if missing). Omitted: history
    /// is kept in memory only and lost on restart.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Require `authorization: Bearer <token>` on every RPC, token read from FILE. Also
    /// sent to peer shards.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve TLS with this PEM certificate chain (needs --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA to verify peer shards during fan-out (default with TLS: --tls-cert itself,
    /// which suits a self-signed certificate shared by all shards).
    #[arg(long, value_name = "FILE")]
    pub peer_ca_file: Option<PathBuf>,
    /// Name to verify in peer certificates (default: the host part of the peer address).
    #[arg(long, value_name = "NAME")]
    pub peer_tls_domain: Option<String>,
    /// Deadline of one fan-out call to a peer shard.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    pub peer_timeout_s: f64,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Period of the detection tick.
    #[arg(long, value_name = "MS", default_value_t = 200)]
    pub tick_ms: u64,
    /// Largest accepted gRPC message (one ingest batch), bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,
    /// Clock: `wall` (production) or `driven` (time taken from the `ccld-now-ns` metadata
    /// of ingest calls, for `ccld simulate --compressed` and replays).
    #[arg(long, value_enum, default_value_t = ClockArg::Wall)]
    pub clock: ClockArg,
    /// Async worker threads.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub workers: usize,
    /// Detection parameters.
    #[command(flatten)]
    pub detect: DetectArgs,
}

impl ServeArgs {
    /// Builds the server configuration (reads token and certificate files, opens the
    /// SQLite history under --data-dir).
    pub fn server_config(&self) -> Result<ServerConfig, CliError> {
        let engine = self.detect.engine_config()?;
        let mut cfg = ServerConfig::single(engine);
        if let Some(list) = &self.shards {
            let map =
                ShardMap::parse(list).map_err(|e| CliError::Usage(format!("--shards: {e}")))?;
            let id = match self.shard_id {
                Some(i) => i,
                None => map
                    .names()
                    .iter()
                    .position(|n| *n == self.listen.to_string())
                    .ok_or_else(|| {
                        CliError::Usage(format!(
                            "--listen {} is not in --shards; give --shard-id",
                            self.listen
                        ))
                    })?,
            };
            map.check_id(id)
                .map_err(|e| CliError::Usage(format!("--shard-id: {e}")))?;
            cfg.shard_id = id;
            cfg.shards = Some(map);
        }
        if let Some(dir) = &self.data_dir {
            let store = Store::open(Some(dir)).map_err(server::ServeError::from)?;
            cfg.history = Some(Arc::new(store));
        }
        if let Some(f) = &self.token_file {
            cfg.token = Some(auth::load_token(f)?);
        }
        let mut peer = PeerConfig {
            token: cfg.token.clone(),
            timeout: secs("--peer-timeout-s", self.peer_timeout_s)?,
            ..PeerConfig::default()
        };
        if let (Some(c), Some(k)) = (&self.tls_cert, &self.tls_key) {
            cfg.tls = Some(auth::server_tls(c, k)?);
            let ca = self.peer_ca_file.as_ref().unwrap_or(c);
            peer.tls = Some(auth::client_tls(ca, self.peer_tls_domain.as_deref())?);
        } else if let Some(ca) = &self.peer_ca_file {
            peer.tls = Some(auth::client_tls(ca, self.peer_tls_domain.as_deref())?);
        }
        cfg.peer = peer;
        cfg.metrics_listen = self.metrics_listen;
        if self.tick_ms == 0 {
            return Err(CliError::Usage("--tick-ms must be at least 1".into()));
        }
        cfg.tick_interval = Duration::from_millis(self.tick_ms);
        if self.max_message_bytes < 1024 {
            return Err(CliError::Usage(
                "--max-message-bytes must be at least 1024".into(),
            ));
        }
        cfg.max_message_bytes = self.max_message_bytes;
        cfg.clock = match self.clock {
            ClockArg::Wall => ClockMode::Wall,
            ClockArg::Driven => ClockMode::Driven,
        };
        Ok(cfg)
    }
}

/// Runs a shard in the foreground until Ctrl-C or SIGTERM.
pub fn run(a: ServeArgs) -> Result<(), CliError> {
    let cfg = a.server_config()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.workers.max(1))
        .enable_all()
        .thread_name("ccld")
        .build()
        .map_err(|source| CliError::Io {
            what: "starting the async runtime".into(),
            source,
        })?;
    rt.block_on(async move {
        let h = server::start(cfg, a.listen, None).await?;
        // The address line is for people and scripts (an ephemeral port is resolved here).
        eprintln!(
            "ccld: shard {} listening on {}{}",
            h.shard_name,
            h.addr,
            h.metrics_addr
                .map(|m| format!(", metrics on http://{m}/metrics"))
                .unwrap_or_default()
        );
        let term = async {
            #[cfg(unix)]
            {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            }
            #[cfg(not(unix))]
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
        eprintln!("ccld: shutting down");
        h.shutdown(Duration::from_secs(2)).await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<ServeArgs, String> {
        #[derive(Parser)]
        struct W {
            #[command(flatten)]
            a: ServeArgs,
        }
        W::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map(|w| w.a)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn detection_parameters_map_to_engine_config() {
        let a = parse(&[
            "--hang-timeout-s",
            "2.5",
            "--slow-theta",
            "4",
            "--slow-window-s",
            "1",
            "--alpha",
            "0.3",
            "--beta",
            "0.7",
        ])
        .unwrap();
        let c = a.server_config().unwrap();
        assert_eq!(c.engine.hang_threshold, Duration::from_millis(2500));
        assert_eq!(c.engine.theta_slow, 4.0);
        assert!(c.engine.self_calibration.is_some());
        let fixed = parse(&["--slow-fixed-theta"]).unwrap();
        assert!(fixed
            .server_config()
            .unwrap()
            .engine
            .self_calibration
            .is_none());
        assert_eq!(c.engine.detect_window, Duration::from_secs(1));
        assert_eq!(c.engine.alpha, 0.3);
        assert_eq!(c.engine.beta, 0.7);
        assert!(c.shards.is_none());
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = parse(&["--hang-timeout-s", "0"])
            .unwrap()
            .server_config()
            .unwrap_err();
        assert!(e.to_string().contains("--hang-timeout-s"), "{e}");
        let e = parse(&["--alpha", "0.8", "--beta", "0.5"])
            .unwrap()
            .server_config()
            .unwrap_err();
        assert!(e.to_string().contains("--alpha"), "{e}");
        assert!(parse(&["--shard-id", "1"]).is_err());
        assert!(parse(&["--tls-cert", "x"]).is_err());
    }

    #[test]
    fn shard_id_defaults_to_listen_address() {
        let a = parse(&[
            "--listen",
            "127.0.0.1:7001",
            "--shards",
            "127.0.0.1:7000,127.0.0.1:7001",
        ])
        .unwrap();
        assert_eq!(a.server_config().unwrap().shard_id, 1);
        let a = parse(&["--listen", "127.0.0.1:7009", "--shards", "127.0.0.1:7000"]).unwrap();
        assert!(a.server_config().is_err());
        let a = parse(&[
            "--listen",
            "127.0.0.1:7009",
            "--shards",
            "a:1,b:2",
            "--shard-id",
            "2",
        ])
        .unwrap();
        assert!(a.server_config().is_err());
    }
}
