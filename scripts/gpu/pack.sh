#!/usr/bin/env bash
# Packs what the GPU suite runs into one compressed bundle for a device machine that has a
# driver but no cargo (scripts/gpu/lease-run.sh unpacks and runs it). Builds nothing: build
# first, on this x86-64 machine, with the pinned nvcc on PATH (scripts/install-toolchains.sh):
#   CCLD_EXPECT_CUDA=1 cargo build --release -p ccl-ffi -p nccl-tests-compat
#   CCLD_EXPECT_CUDA=1 cargo build --release -p ccl-core --example device_selftest --example device_matrix --example device_report
#   CCLD_EXPECT_CUDA=1 cargo build --release -p benches --example device_diagnosis
#   scripts/gpu/build-nccl-tests.sh --lib target/release/libnccl.so.2
# Debug info is stripped (a device call carries at most 64 MiB).
# Usage: scripts/gpu/pack.sh [BUNDLE]   (default .gpu/bundle.tar.xz; .gpu/ is git-ignored)
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=${1:-.gpu/bundle.tar.xz}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/release/examples" "$stage/nccl-tests" "$(dirname "$bundle")"
put() { # put SRC DEST: a stripped copy
  [ -e "$1" ] || { echo "pack: missing $1 (see the build commands in $0)" >&2; exit 1; }
  strip --strip-debug -o "$2" "$1"
}
put target/release/libnccl.so "$stage/release/libnccl.so.2"
put target/release/all_reduce_perf "$stage/release/all_reduce_perf"
put target/release/ccl-run "$stage/release/ccl-run"
for e in device_selftest device_matrix device_diagnosis device_report; do
  put "target/release/examples/$e" "$stage/release/examples/$e"
done
for t in target/nccl-tests/bin/*_perf; do put "$t" "$stage/nccl-tests/$(basename "$t")"; done
tar -C "$stage" -cJf "$bundle" release nccl-tests
echo "pack: $bundle $(du -h "$bundle" | cut -f1) ($(git rev-parse --short HEAD))"
