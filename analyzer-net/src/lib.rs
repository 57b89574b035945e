//! The CCL-D analyzer service: the I/O around the pure `analyzer` engine.
//!
//! [`server`] is one gRPC shard (ingest, tick, queries, watch), [`client`] routes records
//! and queries over a sharded cluster with failover, [`codec`] decodes ingest batches into
//! reused records, [`shard`] is the rendezvous hashing, [`history`] a shard's diagnosis
//! history (in memory here; `ccld` adds SQLite), [`metrics`] the Prometheus endpoint and
//! [`auth`] the bearer token and TLS. [`grpc`] holds the generated tonic stubs of the
//! `Analyzer` service, whose messages are the `ccld-wire` types.
//!
//! The probe inside `libnccl.so.2` links this crate for its reporter and the embedded hub;
//! it must stay free of database engines and command-line parsers.

#![warn(unreachable_pub)]

/// Generated tonic client and server of the `ccld.v1.Analyzer` service.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod grpc {
    include!(concat!(env!("OUT_DIR"), "/ccld.v1.rs"));
}

pub mod auth;
pub mod client;
pub mod codec;
pub mod history;
pub mod metrics;
pub mod server;
pub mod shard;
