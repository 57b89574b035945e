//! The CCL-D analyzer: wire format, ingest, slow/hang detection, root-cause location,
//! sharding, query API and the `ccld` command line.

pub mod auth;
pub mod metrics;
pub mod shard;
pub mod store;
pub mod cli;
pub mod client;
pub mod server;
