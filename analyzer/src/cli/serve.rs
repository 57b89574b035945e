//! `ccld serve`.
use clap::Args;
/// `ccld serve` arguments.
#[derive(Debug, Args)]
pub struct ServeArgs {}
/// Runs a shard.
pub fn run(_a: ServeArgs) -> Result<(), super::CliError> { Ok(()) }
