#!/usr/bin/env bash
# Builds libnccl.so.2 and runs the C-ABI tests of ccl-ffi: our exports against NVIDIA's
# libnccl.so.2 2.30.7, our nccl.h against NVIDIA's (layout, values, prototypes), and C
# programs built against NVIDIA's nccl.h running on our library.
#
# NVIDIA's wheel is fetched with pip into .cache/nvidia-nccl-2.30.7/ (gitignored) on first
# use. With CI=true a missing prerequisite (network, pip, gcc) is a failure, not a skip.
#
#   scripts/abi-test.sh            # debug build
#   scripts/abi-test.sh --release  # release build
set -euo pipefail
cd "$(dirname "$0")/.."
profile=()
if [[ "${1:-}" == "--release" ]]; then
  profile=(--release)
  shift
fi
cargo build "${profile[@]}" -p ccl-ffi
dir=target/debug
[[ ${#profile[@]} -gt 0 ]] && dir=target/release
ls -l "$dir/libnccl.so" "$dir/libnccl.so.2"
if command -v cargo-nextest >/dev/null 2>&1; then
  cargo nextest run "${profile[@]}" -p ccl-ffi --test abi --test api --test logging "$@"
else
  cargo test "${profile[@]}" -p ccl-ffi --test abi --test api --test logging "$@"
fi
