//! Host runtime of the library: communicators, bootstrap, pure schedules, transports and
//! executors. `ccl-ffi` wraps this crate behind NVIDIA's C ABI; nothing here is `extern "C"`.

#![warn(unreachable_pub)]

pub mod bootstrap;
pub mod channel;
mod comm;
pub mod debug;
pub mod desc;
pub mod device;
pub mod env;
mod error;
mod executor;
pub mod group;
mod hostalgo;
mod inject;
mod label;
mod op;
pub mod proto;
pub mod reduce;
pub mod schedule;
pub mod transport;
mod tree;
pub mod types;

pub use bootstrap::UniqueId;
pub use comm::{Comm, CommConfig};
pub use error::{CclError, Result};
pub use group::{enqueue, group_end, group_start, CollArgs};
pub use op::ScalarArg;
pub use reduce::Reducer;
pub use types::{DataType, RedOpKind, ResultCode};
