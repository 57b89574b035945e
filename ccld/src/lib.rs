//! `ccld`, the CCL-D analyzer's command line ([`cli`]), and the persistent SQLite history
//! of a served shard ([`store`]). The pure engine is the `analyzer` crate, the gRPC
//! service `analyzer-net`.

#![warn(unreachable_pub)]

pub mod cli;
pub mod store;
