//! `libnccl.so.2`: every function of NVIDIA's `nccl.h` (2.30.7), plus the host functions
//! of its device API, exported as `ncclX` and `pncclX` over `ccl-core`, each behind a panic
//! boundary.
//!
//! - [`api`]: the exports (the only module whose `unsafe` touches caller memory, with
//!   [`mem`]).
//! - [`boundary`]: `catch_unwind`, error codes, the thread-local `ncclGetLastError` text.
//! - [`config`]: versioned reading of `ncclConfig_t` (pure).
//! - [`device`]: `ncclCommProperties_t` of the device API (pure).
//! - [`handles`]: `ncclComm_t` handles, checked on every call.
//! - [`mem`]: `ncclMemAlloc`/`ncclMemFree` (host memory on this backend).
//!
//! The C header is `ccl-ffi/include/nccl.h`.

#![warn(unreachable_pub)]

pub mod api;
mod boundary;
pub mod config;
pub mod device;
pub mod handles;
mod mem;
mod sigpipe;
