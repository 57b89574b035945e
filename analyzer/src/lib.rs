//! The CCL-D analyzer: wire format, ingest, slow/hang detection, root-cause location,
//! sharding, query API and the `ccld` command line.
//!
//! The core is pure (no I/O, no clocks): [`engine::Engine`] takes records and the current
//! time and returns diagnoses; [`detect`] holds the detection formulas (CCL-D section 4.2.1),
//! [`locate`] the decision tree (Figure 7), [`sim`] a deterministic rank simulator and
//! [`calibrate`] the statistical choice of `theta_slow`.

pub mod calibrate;
pub mod detect;
pub mod engine;
pub mod locate;
pub mod sim;
pub mod wire;

pub use engine::{Engine, EngineConfig, Reject};
