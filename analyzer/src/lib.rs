//! The CCL-D analyzer: slow/hang detection and root-cause location, pure.
//!
//! No I/O, no clocks, no threads: [`engine::Engine`] takes records and the current time
//! and returns diagnoses; [`detect`] holds the detection formulas (CCL-D section 4.2.1),
//! [`locate`] the decision tree (Figure 7), [`p2pwait`] the Send/Recv waits of a rank,
//! [`failure`] the diagnoses of failed operations, [`incident`] the one root per incident
//! across communicators, [`report`] its plain and JSON lines, [`sim`] a deterministic rank
//! simulator, [`calibrate`] the statistical choice of `theta_slow` and [`theta`] the
//! per-communicator robust threshold and windowed baseline.
//!
//! The crates around it (see `docs/architecture.md`): `ccld-wire` (the record format,
//! re-exported here as [`wire`]), `analyzer-net` (the gRPC shard, its client, sharding,
//! metrics, auth) and `ccld` (the command line and the SQLite history).

#![warn(unreachable_pub)]

pub use ccld_wire as wire;

pub mod calibrate;
mod detect;
pub mod engine;
mod failure;
pub mod incident;
mod locate;
mod p2pwait;
pub mod report;
pub mod sim;
mod theta;

pub use engine::{Engine, EngineConfig, Reject};
