//! The `ccld` command line: `serve`, `anomalies`, `watch`, `comm`, `comms`, `simulate`,
//! `calibrate`.

pub mod format;
pub mod serve;
pub mod simulate;
pub mod table;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use analyzer_net::auth::{self, AuthError};
use analyzer_net::client::{Client, ClientConfig, ClientError};
use ccld_wire::{
    GetCommRequest, ListAnomaliesRequest, ListCommsRequest, ListIncidentsRequest, WatchRequest,
};

/// Default gRPC address of a shard.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7070";

/// CCL-D analyzer: ingest probe records, detect slow/hang anomalies in collective
/// communication, name the root-cause ranks.
#[derive(Debug, Parser)]
#[command(name = "ccld", version, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Log filter for the analyzer's own logs on stderr (tracing syntax, e.g. `info`,
    /// `ccld::fanout=debug`). Default: `warn` for client commands, `info` for `serve`.
    #[arg(long, global = true, value_name = "FILTER")]
    pub log: Option<String>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one analyzer shard (gRPC ingest + query API, engine tick, metrics).
    Serve(serve::ServeArgs),
    /// List diagnosed anomalies of the whole cluster, newest first.
    Anomalies(AnomaliesArgs),
    /// Stream new diagnoses as they are made (Ctrl-C to stop).
    Watch(WatchArgs),
    /// Show the per-rank state of one communicator.
    Comm(CommArgs),
    /// List the communicators the cluster tracks.
    Comms(CommsArgs),
    /// Drive a server with simulated ranks (and optionally an injected anomaly).
    Simulate(simulate::SimulateArgs),
    /// Estimate theta_slow from recorded slowdown ratios / recordings.
    Calibrate(simulate::CalibrateArgs),
}

/// Connection options shared by the client commands.
#[derive(Debug, Clone, Args)]
pub struct ConnArgs {
    /// Analyzer shard address(es), `host:port`, comma-separated. Any shard answers for the
    /// whole cluster; the others are tried when the first is down.
    #[arg(long, value_name = "ADDR[,ADDR...]", default_value = DEFAULT_ADDR)]
    pub server: String,
    /// File holding the bearer token the servers require.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM CA certificate to verify the servers' TLS certificates (enables TLS).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Server name to verify in the certificate (default: the host part of the address).
    #[arg(long, value_name = "NAME", requires = "ca_file")]
    pub tls_domain: Option<String>,
    /// Deadline of one call, seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub timeout_s: f64,
}

impl ConnArgs {
    /// Builds the client configuration.
    pub fn client_config(&self) -> Result<ClientConfig, CliError> {
        let shards: Vec<String> = self
            .server
            .split(',')
            .map(|s| s.trim().to_string())
            .collect();
        let mut cfg = ClientConfig::new(shards);
        if let Some(f) = &self.token_file {
            cfg.token = Some(auth::load_token(f)?);
        }
        if let Some(ca) = &self.ca_file {
            cfg.tls = Some(auth::client_tls(ca, self.tls_domain.as_deref())?);
        }
        cfg.rpc_timeout = secs("--timeout-s", self.timeout_s)?;
        Ok(cfg)
    }

    /// Builds an async client.
    pub fn client(&self) -> Result<Client, CliError> {
        Ok(Client::new(self.client_config()?)?)
    }
}

/// Parses a positive number of seconds.
pub fn secs(name: &str, v: f64) -> Result<Duration, CliError> {
    if !v.is_finite() || v <= 0.0 || v > 1e9 {
        return Err(CliError::Usage(format!(
            "{name} must be a positive number of seconds, got {v}"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

/// `ccld anomalies`.
#[derive(Debug, Args)]
pub struct AnomaliesArgs {
    /// Connection.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Print the incidents as JSON lines (one object per line, see docs/diagnosis.md)
    /// instead of a table; with `--diagnoses`, the per-communicator diagnoses as one
    /// JSON object.
    #[arg(long)]
    pub json: bool,
    /// Only the per-communicator diagnoses (the evidence), not the incidents.
    #[arg(long)]
    pub diagnoses: bool,
    /// Only this communicator (decimal or 0x hex).
    #[arg(long, value_name = "ID", value_parser = parse_u64)]
    pub comm: Option<u64>,
    /// At most this many (0 = server default, 1000).
    #[arg(long, default_value_t = 0)]
    pub limit: u32,
    /// Only the shard asked (no cluster fan-out).
    #[arg(long)]
    pub local_only: bool,
}

/// `ccld watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Connection.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Only this communicator (decimal or 0x hex).
    #[arg(long, value_name = "ID", value_parser = parse_u64)]
    pub comm: Option<u64>,
    /// First replay diagnoses made in the last SECONDS.
    #[arg(long, value_name = "SECONDS")]
    pub replay_s: Option<f64>,
    /// Stop after this many diagnoses.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Only the shard asked (no cluster fan-out).
    #[arg(long)]
    pub local_only: bool,
}

/// `ccld comm`.
#[derive(Debug, Args)]
pub struct CommArgs {
    /// Communicator id (decimal or 0x hex).
    #[arg(value_name = "ID", value_parser = parse_u64)]
    pub id: u64,
    /// Connection.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `ccld comms`.
#[derive(Debug, Args)]
pub struct CommsArgs {
    /// Connection.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// At most this many (0 = all).
    #[arg(long, default_value_t = 0)]
    pub limit: u32,
}

/// Parses decimal or `0x` hexadecimal u64.
pub fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let r = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(&h.replace('_', ""), 16)
    } else {
        t.replace('_', "").parse()
    };
    r.map_err(|e| format!("{s:?} is not a decimal or 0x-hex 64-bit number: {e}"))
}

/// CLI errors.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// Credentials.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// Client call.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Server.
    #[error(transparent)]
    Serve(#[from] analyzer_net::server::ServeError),
    /// I/O.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Something else, with a message.
    #[error("{0}")]
    Other(String),
}

fn print(s: &str) -> Result<(), CliError> {
    let mut o = std::io::stdout().lock();
    match o.write_all(s.as_bytes()).and_then(|_| o.flush()) {
        Ok(()) => Ok(()),
        // A closed pipe (`ccld watch | head`) ends the command quietly.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(source) => Err(CliError::Io {
            what: "writing to stdout".into(),
            source,
        }),
    }
}

fn json_line(v: &serde_json::Value, pretty: bool) -> String {
    let mut s = if pretty {
        serde_json::to_string_pretty(v)
    } else {
        serde_json::to_string(v)
    }
    .unwrap_or_else(|e| format!("{{\"error\":\"json: {e}\"}}"));
    s.push('\n');
    s
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| CliError::Io {
            what: "starting the async runtime".into(),
            source,
        })
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Calibrate(a) => simulate::run_calibrate(a),
        Command::Anomalies(a) => runtime()?.block_on(anomalies(a)),
        Command::Watch(a) => runtime()?.block_on(watch(a)),
        Command::Comm(a) => runtime()?.block_on(comm(a)),
        Command::Comms(a) => runtime()?.block_on(comms(a)),
    }
}

async fn anomalies(a: AnomaliesArgs) -> Result<(), CliError> {
    let mut c = a.conn.client()?;
    let l = c
        .list_anomalies(ListAnomaliesRequest {
            local_only: a.local_only,
            since_ns: 0,
            limit: a.limit,
            comm_id: a.comm,
        })
        .await?;
    if a.diagnoses {
        return if a.json {
            print(&json_line(&format::anomalies_json(&l), true))
        } else {
            print(&format::anomalies_table(&l))
        };
    }
    let inc = c
        .list_incidents(ListIncidentsRequest {
            local_only: a.local_only,
            since_ns: 0,
            limit: a.limit,
            comm_id: a.comm,
        })
        .await?;
    if a.json {
        let mut out = String::new();
        for i in &inc.incidents {
            out.push_str(&analyzer::report::incident_json(i));
            out.push('\n');
        }
        print(&out)
    } else {
        let mut out = format::incidents_text(&inc);
        out.push_str("\nPer-communicator evidence:\n");
        out.push_str(&format::anomalies_table(&l));
        print(&out)
    }
}

async fn watch(a: WatchArgs) -> Result<(), CliError> {
    let mut c = a.conn.client()?;
    let since_ns = match a.replay_s {
        Some(s) => analyzer_net::server::now_ns()
            .saturating_sub(secs("--replay-s", s)?.as_nanos() as u64)
            .max(1),
        None => 0,
    };
    let mut st = c
        .watch(WatchRequest {
            comm_id: a.comm,
            since_ns,
            local_only: a.local_only,
        })
        .await?;
    let mut n = 0u64;
    loop {
        let m = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            m = st.message() => m,
        };
        match m {
            Ok(Some(d)) => {
                if a.json {
                    print(&json_line(&format::diagnosis_json(&d), false))?;
                } else {
                    print(&format::diagnosis_block(&d))?;
                }
                n += 1;
                if a.count.is_some_and(|c| n >= c) {
                    return Ok(());
                }
            }
            Ok(None) => return Err(CliError::Other("the server closed the watch stream".into())),
            Err(s) => {
                return Err(CliError::Other(format!(
                    "watch stream failed: {:?}: {}",
                    s.code(),
                    s.message()
                )))
            }
        }
    }
}

async fn comm(a: CommArgs) -> Result<(), CliError> {
    let mut c = a.conn.client()?;
    let st = c
        .get_comm(GetCommRequest {
            comm_id: a.id,
            local_only: false,
        })
        .await?;
    if a.json {
        print(&json_line(&format::comm_json(&st), true))
    } else {
        print(&format::comm_table(&st))
    }
}

async fn comms(a: CommsArgs) -> Result<(), CliError> {
    let mut c = a.conn.client()?;
    let l = c
        .list_comms(ListCommsRequest {
            local_only: false,
            limit: a.limit,
        })
        .await?;
    if a.json {
        print(&json_line(&format::comms_json(&l), true))
    } else {
        print(&format::comms_table(&l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_ids() {
        assert_eq!(parse_u64("42"), Ok(42));
        assert_eq!(parse_u64("0xff"), Ok(255));
        assert_eq!(parse_u64("0xFFFF_FFFF_FFFF_FFFF"), Ok(u64::MAX));
        assert!(parse_u64("0x1_0000_0000_0000_0000").is_err());
        assert!(parse_u64("abc").is_err());
    }

    #[test]
    fn seconds_are_validated() {
        assert!(secs("--x", 0.5).is_ok());
        assert!(secs("--x", 0.0).is_err());
        assert!(secs("--x", -1.0).is_err());
        assert!(secs("--x", f64::NAN).is_err());
    }
}
