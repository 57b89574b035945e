//! Host runtime of the library: communicators, bootstrap, pure schedules, transports and
//! executors. `ccl-ffi` wraps this crate behind NVIDIA's C ABI; nothing here is `extern "C"`.
//!
//! The surface other crates use: communicators ([`Comm`], [`CommConfig`], [`init_rank`]),
//! operations ([`enqueue`], [`CollArgs`], [`group_start`]/[`group_end`], [`ScalarArg`],
//! [`Reducer`]), the types and errors, the unique id ([`bootstrap`]), logging ([`debug`]),
//! declared environment variables ([`env`]) and the device API the memory functions need
//! ([`device`]). Everything else is private; this workspace's own tests, examples and
//! benchmarks reach the internals they drive through [`internal`], which is not an API.

#![warn(unreachable_pub)]

pub mod bootstrap;
mod channel;
mod comm;
pub mod debug;
mod desc;
pub mod device;
pub mod env;
mod error;
mod executor;
mod group;
mod hostalgo;
mod inject;
mod label;
mod op;
mod proto;
pub mod reduce;
mod schedule;
mod transport;
mod tree;
pub mod types;

pub use bootstrap::UniqueId;
pub use comm::{Comm, CommConfig};
pub use error::{CclError, Result};
pub use group::{enqueue, fail_in_group, group_end, group_start, init_rank, CollArgs};
pub use op::ScalarArg;
pub use reduce::Reducer;
pub use types::{DataType, RedOpKind, ResultCode};

/// Internals for this workspace's tests, examples and benchmarks (the shared-memory
/// transport, schedules, the descriptor check's benchmark switch, ...). Not an API: nothing
/// here is stable, and nothing outside this repository should name it.
#[doc(hidden)]
pub mod internal {
    pub mod channel {
        pub use crate::channel::*;
    }
    pub mod desc {
        pub use crate::desc::*;
    }
    pub mod group {
        pub use crate::group::*;
    }
    pub mod proto {
        pub use crate::proto::*;
    }
    pub mod schedule {
        pub use crate::schedule::*;
    }
    pub mod transport {
        pub use crate::transport::*;
    }
}
