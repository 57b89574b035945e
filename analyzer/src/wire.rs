//! Generated protobuf / gRPC code for `proto/ccld.proto` (package `ccld.v1`) and
//! conversions from the probe's types.

#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/ccld.v1.rs"));
}

pub use generated::*;
