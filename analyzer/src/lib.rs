//! The CCL-D analyzer: wire format, ingest, slow/hang detection, root-cause location,
//! sharding, query API and the `ccld` command line.
//!
//! The core is pure (no I/O, no clocks): [`engine::Engine`] takes records and the current
//! time and returns diagnoses; [`detect`] holds the detection formulas (CCL-D section 4.2.1),
//! [`locate`] the decision tree (Figure 7), [`p2pwait`] the Send/Recv waits of a rank, [`sim`] a deterministic rank simulator and
//! [`calibrate`] the statistical choice of `theta_slow`, [`theta`] the per-communicator
//! robust threshold and windowed baseline.
//!
//! The service around it: [`server`] (one gRPC shard), [`client`] (routing, failover,
//! queries), [`shard`] (rendezvous hashing), [`store`] (SQLite history), [`metrics`]
//! (Prometheus), [`auth`] (token, TLS) and [`cli`] (`ccld`).

pub mod calibrate;
pub mod detect;
pub mod engine;
pub mod failure;
pub mod incident;
pub mod locate;
pub mod p2pwait;
pub mod report;
pub mod sim;
pub mod theta;
pub mod wire;

pub mod auth;
pub mod cli;
pub mod client;
pub mod codec;
pub mod metrics;
pub mod server;
pub mod shard;
pub mod store;

pub use engine::{Engine, EngineConfig, Reject};
