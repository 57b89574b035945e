#!/usr/bin/env bash
# Builds our libnccl.so.2 and the nccl-tests binaries (release) and prints the
# all_reduce_perf tables for 2 and 4 local processes started by ccl-run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ccl-ffi -p nccl-tests-compat
T=target/release
if [ ! -e "$T/libnccl.so.2" ] && [ -e "$T/libnccl.so" ]; then
  mkdir -p "$T/nccl-tests-lib" && cp "$T/libnccl.so" "$T/nccl-tests-lib/libnccl.so.2"
  export LD_LIBRARY_PATH="$PWD/$T/nccl-tests-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  export LD_LIBRARY_PATH="$PWD/$T${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export CCLD_TESTS_NO_CUDA=1
for n in 2 4; do
  echo "### ccl-run -n $n all_reduce_perf -b 8 -e 128M -f 2"
  "$T/ccl-run" -n "$n" "$T/all_reduce_perf" -b 8 -e 128M -f 2 "$@"
done
