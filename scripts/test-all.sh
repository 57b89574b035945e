#!/usr/bin/env bash
# Runs every test of the workspace (the README's test command). Installs what the tests
# need first: the pinned device toolchains (nvcc 13.0 from PyPI, hipcc 5.2 from Debian) so
# that both device builds compile; the ABI test downloads NVIDIA's nccl.h itself (PyPI
# wheel nvidia-nccl-cu13==2.30.7, cached under .cache/, never committed).
set -euo pipefail
cd "$(dirname "$0")/.."

# Tests talk over loopback only.
export CCLD_BOOTSTRAP_IP=127.0.0.1
# The thread correctness matrix runs its ~4 MiB counts over the whole cross product too.
export CCL_TEST_FULL_MATRIX=1

scripts/install-toolchains.sh
# cargo-nextest, pinned, into .cache/cargo when this machine has none (a stock Debian 12).
NEXTEST_VERSION=0.9.143
if ! cargo nextest --version >/dev/null 2>&1; then
  if [ ! -x .cache/cargo/bin/cargo-nextest ]; then
    echo "test-all: no cargo-nextest; installing ${NEXTEST_VERSION} into .cache/cargo (a few minutes, once)"
    cargo install --locked --root .cache/cargo --version "${NEXTEST_VERSION}" cargo-nextest
  fi
  export PATH="$PWD/.cache/cargo/bin:$PATH"
fi
# Device builds (CUDA kernels, ROCm librccl.so.1) and their GPU-free tests; ccl-core's
# device unit tests run in the workspace run below (after the ROCm build they check).
scripts/gpu/ci-device-build.sh --no-install --lib-tests-later
# Everything else. The dev profile optimises dependencies (Cargo.toml), which is enough
# for the multi-rank tests and saves a second full build in release mode.
cargo build --workspace
cargo nextest run --workspace --no-fail-fast
