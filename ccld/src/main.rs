//! `ccld`: the CCL-D analyzer command line (see `ccld --help`).

use std::process::ExitCode;

use ccld::cli::{run, Cli, Command};
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    let filter = cli.log.clone().unwrap_or_else(|| default.to_string());
    let env_filter = match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("ccld: --log {filter:?}: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(ccld::cli::CliError::Usage(m)) => {
            eprintln!("ccld: {m}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("ccld: {e}");
            ExitCode::FAILURE
        }
    }
}
