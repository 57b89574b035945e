#!/usr/bin/env bash
# CI step (no GPU needed): compiles every device build, runs the device-side tests that
# need no GPU, and builds the GPU suite's artifact. Exits non-zero if anything fails.
#   1. installs the pinned toolchains (nvcc 13.0 wheel, hipcc 5.2) unless --no-install;
#   2. kernels with nvcc + their tests (C layout vs Rust vs probe frame, header
#      signatures, "no device" handled); CCLD_EXPECT_CUDA=1 makes a build that fell back
#      to host-only fail (the `cuda` feature would do the same but changes the crate's
#      fingerprint, so the workspace build would compile the kernels a second time);
#   3. the ROCm build target/rocm/librccl.so.1 (hipcc, gfx90a), then ccl-core's device
#      tests (lowering, emulator, CUDA and HIP element arithmetic vs Reducer), unless
#      --lib-tests-later says that the caller runs ccl-core's unit tests itself afterwards
#      (scripts/test-all.sh: its workspace run includes them; compiling them here too cost
#      CI about 3 minutes for nothing new);
#   4. the device runtime's correctness matrix (examples/device_matrix --quick: every
#      collective x Float32/Int32 x Sum/Max/Avg x 1/2/4/8 ranks as threads, device
#      buffers, probe counters) on the CPU emulator (CCLD_DEVICE_EMULATION=1), debug build,
#      a few seconds, with NCCL_PROTO unset (auto) and again with --proto LL; then
#      --procs 2 (two processes, each with its own emulated device, FIFOs in host-staged
#      shared memory) must pass and leave nothing in /dev/shm;
#   5. the host-only variant of the kernels crate (CCLD_NO_NVCC=1) builds; then the line
#      coverage of the kernel source by the CPU runs (scripts/kernel-coverage.sh, >= 90 %);
#   6. NVIDIA's nccl-tests 2.19.6, all 11 binaries, built with the pinned nvcc against
#      NVIDIA's nccl.h 2.30.7 and linked against our debug libnccl.so.2; every binary must
#      resolve libnccl.so.2 to ours with no undefined symbol, and one run without a GPU
#      must load our library and stop at CUDA (scripts/gpu/build-nccl-tests.sh; measured
#      2026-11-26 on the 2-core dev machine, shared: ~2.6 CPU-minutes from scratch, a
#      no-op make plus the checks in ~1 s when the objects in target/nccl-tests are kept);
#   7. with CCLD_BUILD_SELFTEST=1, the GPU suite's programs in release
#      (target/release/examples/device_selftest, device_matrix; not needed by CI).
set -euo pipefail
cd "$(dirname "$0")/../.."
install=1
lib_tests=1
for arg in "$@"; do
  case "$arg" in
    --no-install) install=0 ;;
    --lib-tests-later) lib_tests=0 ;;
    *) echo "ci-device-build: unknown argument '$arg' (known: --no-install, --lib-tests-later)" >&2; exit 2 ;;
  esac
done
if [ "$install" = 1 ]; then
  scripts/install-toolchains.sh
fi
t0=$(date +%s)
CCLD_EXPECT_CUDA=1 cargo test -p kernels
# ROCm before ccl-core's device tests: they also check the HIP build's element arithmetic.
scripts/gpu/build-rocm.sh
if [ "$lib_tests" = 1 ]; then
  cargo test -p ccl-core --lib device::
fi
# The runtime's matrix on the emulator (same dev profile as the tests above).
export CCLD_BOOTSTRAP_IP=${CCLD_BOOTSTRAP_IP:-127.0.0.1}
CCLD_DEVICE_EMULATION=1 timeout 300 cargo run -q -p ccl-core --example device_matrix -- --quick
# Once more with every operation on the LL protocol.
CCLD_DEVICE_EMULATION=1 timeout 300 cargo run -q -p ccl-core --example device_matrix -- --quick --proto LL
# Two processes through host staging (the emulator has no IPC); exits 1 on any failure.
CCLD_DEVICE_EMULATION=1 timeout 120 cargo run -q -p ccl-core --example device_matrix -- --quick --procs 2
# Host-only variant: the kernels crate must build without nvcc (its tests would pull the
# whole probe/analyzer tree into a second target dir for nothing new).
CCLD_NO_NVCC=1 CARGO_TARGET_DIR=target/host-only cargo build -p kernels
# Line coverage of the kernels' device part by the CPU runs (the kernel source compiled for
# the host with gcov; fails under 90 %). Rebuilds the kernels crate in that configuration.
scripts/kernel-coverage.sh | tail -25
# NVIDIA's nccl-tests as a client of our library (no GPU needed to build and link).
cargo build -p ccl-ffi
scripts/gpu/build-nccl-tests.sh --lib target/debug/libnccl.so.2
if [ "${CCLD_BUILD_SELFTEST:-0}" = 1 ]; then
  cargo build --release -p ccl-core --example device_selftest --example device_matrix
fi
echo "ci-device-build: done in $(( $(date +%s) - t0 )) s"
