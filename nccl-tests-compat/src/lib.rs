//! The nccl-tests `*_perf` suite and the `ccl-run` local launcher, talking to any
//! `libnccl.so.2` through the public C API only; filled by the nccl-tests-compat issue.
