//! `libnccl.so.2`: every function of NVIDIA's `nccl.h` (2.30.7) exported as `ncclX` and
//! `pncclX` over `ccl-core`, each behind a panic boundary.
