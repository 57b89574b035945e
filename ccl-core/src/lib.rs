//! Host runtime of the library: communicators, bootstrap, pure schedules, transports and
//! executors. `ccl-ffi` wraps this crate behind NVIDIA's C ABI; nothing here is `extern "C"`.

pub mod error;
pub mod types;

pub use error::{CclError, Result};
pub use types::{DataType, RedOpKind, ResultCode};
