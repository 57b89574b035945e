//! The nccl-tests `*_perf` suite and the `ccl-run` local launcher, talking to any
//! `libnccl.so.2` through the public C API only (loaded at run time with `dlopen`, so
//! `LD_LIBRARY_PATH` picks the implementation).
//!
//! Layout: pure logic in [`args`], [`cfmt`], [`dtype`], [`verify`], [`colls`],
//! [`report`], [`launch`], [`sync`]; I/O in [`engine`] (the test driver), [`nccl`]
//! (dlopen'd NCCL), [`cuda`] (optional cudart), [`mem`] (buffers) and [`ccl_run`].

#![warn(unreachable_pub)]

pub mod args;
pub mod ccl_run;
pub mod cfmt;
pub mod colls;
pub mod cuda;
pub mod dtype;
pub mod engine;
pub mod launch;
pub mod mem;
pub mod nccl;
pub mod report;
pub mod sync;
pub mod verify;

/// Entry point of every `*_perf` binary.
pub fn perf_main(coll: colls::Coll) -> ! {
    let argv: Vec<String> = std::env::args().collect();
    let code = engine::run_main(coll, argv);
    std::process::exit(code)
}
