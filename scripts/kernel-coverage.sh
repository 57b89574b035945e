#!/usr/bin/env bash
# Line coverage of the kernels' device part (kernels/src/ccl_kernel_body.h, the code
# ccl_kernels.cu compiles for the GPU) by the CPU runs: the kernel source compiled for the
# host with gcov (kernels/build.rs: CCLD_KERNEL_COVERAGE=1), driven by the kernels crate's
# unit tests and the device suites on the emulated device (ccl-core's device:: unit tests, device_emu, device_inject,
# device_emu_procs) and device_matrix --quick (auto, LL, 2 processes).
# Prints the covered / executable lines of ccl_kernel_body.h and the uncovered ones;
# the annotated file is left in target/kernel-coverage/ccl_kernel_body.h.gcov.
# Exits non-zero when a run fails or coverage is below ${CCLD_MIN_KERNEL_COVERAGE:-90} %.
# Usage: scripts/kernel-coverage.sh
# Note: switching CCLD_KERNEL_COVERAGE rebuilds the kernels crate and its dependents;
# CCLD_NO_NVCC=1 skips the nvcc build meanwhile (the emulated device does not need it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CCLD_KERNEL_COVERAGE=1 CCLD_NO_NVCC=1
export CCLD_BOOTSTRAP_IP=${CCLD_BOOTSTRAP_IP:-127.0.0.1}
min=${CCLD_MIN_KERNEL_COVERAGE:-90}
out=target/kernel-coverage
rm -rf "$out"
mkdir -p "$out"
cargo build -q -p ccl-core --tests --example device_matrix
find target/debug/build -path '*/kernels-*/out/*' -name '*.gcda' -delete
cargo nextest run -p kernels --no-fail-fast --lib
cargo nextest run -p ccl-core --no-fail-fast --lib \
  --test device_emu --test device_inject --test device_emu_procs \
  -E 'test(/^device::/) | binary(device_emu) | binary(device_inject) | binary(device_emu_procs)'
for args in "" "--proto LL" "--procs 2"; do
  # shellcheck disable=SC2086
  CCLD_DEVICE_EMULATION=1 timeout 600 cargo run -q -p ccl-core --example device_matrix -- --quick $args \
    >"$out/matrix.log" 2>&1 || { tail -20 "$out/matrix.log"; echo "kernel-coverage: device_matrix $args failed" >&2; exit 1; }
done
gcda=$(find target/debug/build -path '*/kernels-*/out/*' -name '*host_kernel.gcda' -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
[ -n "$gcda" ] || { echo "kernel-coverage: no .gcda written (was the gcov build linked?)" >&2; exit 1; }
# The objects were compiled from kernels/ with relative source paths: run gcov there.
(cd kernels && gcov -o "$(dirname "$root/$gcda")" "$root/$gcda" >/dev/null && mv ./*.gcov "$root/$out/")
f="$out/ccl_kernel_body.h.gcov"
[ -f "$f" ] || { echo "kernel-coverage: gcov wrote no ccl_kernel_body.h.gcov" >&2; exit 1; }
# gcov lines: "  count:  line:source"; count is a number, ##### (never run) or - (no code);
# each template line is listed once merged, then once per instantiation (counted once).
awk -F: -v min="$min" '
  { c = $1; gsub(/ /, "", c); n = $2; gsub(/ /, "", n) }
  c == "-" || n == 0 || n !~ /^[0-9]+$/ { next }
  # Templates: the merged count of a line comes first, per-instantiation copies follow.
  n in seen { next }
  { seen[n] = 1 }
  c ~ /^(#####|=====)$/ { miss++; list = list sprintf("  %d:%s\n", n, substr($0, index($0, $3))); next }
  c ~ /^[0-9]+\*?$/ { hit++ }
  END {
    tot = hit + miss
    pct = tot ? 100.0 * hit / tot : 0
    printf "kernel-coverage: ccl_kernel_body.h %d / %d executable lines = %.1f %%\n", hit, tot, pct
    if (miss) printf "never executed:\n%s", list
    exit (pct + 1e-9 < min) ? 1 : 0
  }' "$f"
