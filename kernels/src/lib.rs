//! Device kernels (CUDA C++ built by nvcc, HIP through a portability header) and the small C
//! launcher ABI the host runtime calls; filled by the device-backend issue.
