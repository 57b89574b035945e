//! `ccld simulate` / `ccld calibrate`.
use clap::Args;
/// args
#[derive(Debug, Args)]
pub struct SimulateArgs {}
/// args
#[derive(Debug, Args)]
pub struct CalibrateArgs {}
/// run
pub fn run(_a: SimulateArgs) -> Result<(), super::CliError> { Ok(()) }
/// run
pub fn run_calibrate(_a: CalibrateArgs) -> Result<(), super::CliError> { Ok(()) }
