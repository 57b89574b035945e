#!/usr/bin/env bash
# Runs the device suites on the emulated device with the kernel source compiled for the
# CPU under ThreadSanitizer (kernels/build.rs: CCLD_KERNEL_TSAN=1 builds
# kernels/src/host_kernel.cpp with -fsanitize=thread and links libtsan). Only the C++
# kernel is instrumented: races between its threads (one OS thread per CUDA thread, blocks
# of all ranks of a process) are reported; Rust code is not instrumented.
# Rust code is not instrumented and synchronises through futexes TSan cannot see, so TSan
# also reports "races" inside Rust code through its libc interceptors (free/calloc,
# close/recv of sockets): those are noise (exitcode=0 keeps them from failing the tests).
# Exits non-zero on a failing test or any report whose stacks contain kernel code
# (ccl_plan_kernel and its helpers, the simulator's barrier).
# Usage: scripts/kernel-tsan.sh [nextest filter args...]
# Note: switching CCLD_KERNEL_TSAN rebuilds the kernels crate and its dependents.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCLD_KERNEL_TSAN=1 CCLD_NO_NVCC=1  # the emulated device needs no nvcc build
export CCLD_BOOTSTRAP_IP=${CCLD_BOOTSTRAP_IP:-127.0.0.1}
# second_deadlock_stack: better reports; history_size: longer access histories.
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=0 second_deadlock_stack=1 history_size=4 exitcode=0} suppressions=$PWD/scripts/kernel-tsan.supp"
log=${CCLD_TSAN_LOG:-target/kernel-tsan.log}
mkdir -p "$(dirname "$log")"
: >"$log"
# TSan needs a fixed memory layout; disable ASLR for the test processes when possible.
run=()
if setarch "$(uname -m)" -R true 2>/dev/null; then run=(setarch "$(uname -m)" -R); fi
status=0
"${run[@]}" cargo nextest run -p ccl-core --no-fail-fast \
  --test device_emu --test device_inject --test device_emu_procs "$@" 2>&1 | tee -a "$log" || status=$?
for proto in Simple LL; do
  CCLD_DEVICE_EMULATION=1 "${run[@]}" timeout 600 cargo run -q -p ccl-core --example device_matrix -- \
    --quick --proto "$proto" \
    2>&1 | tee -a "$log" || status=$?
done
reports=$(grep -c "WARNING: ThreadSanitizer" "$log" || true)
kernel=$(awk '/WARNING: ThreadSanitizer/ { w = 1; s = "" } w { s = s "\n" $0 }
  /SUMMARY: ThreadSanitizer/ { if (s ~ /ccl_plan_kernel|copy_block|reduce_block|ll_recv_block|ll_send_block|ll_scrub_block|ccl_sim::/) { n++; print s > "/dev/stderr" } w = 0 }
  END { print n + 0 }' "$log")
echo "kernel-tsan: $reports ThreadSanitizer report(s), $kernel in kernel code; log: $log"
[ "$kernel" = 0 ] && [ "$status" = 0 ]
