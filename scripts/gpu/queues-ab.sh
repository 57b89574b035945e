#!/usr/bin/env bash
# A/B on a GPU machine: 8 ranks as threads of one process (device_matrix --ranks 8 --quick),
# CUDA_DEVICE_MAX_CONNECTIONS=8 (CUDA's default) vs 32, interleaved, Simple and LL in turn;
# counts the runs that hang (killed after LIMIT s). See docs/gpu-results.md, "The hang".
# Usage: scripts/gpu/queues-ab.sh BUNDLE OUTDIR [ROUNDS (default 10)] [LIMIT (default 8)]
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 BUNDLE OUTDIR [ROUNDS] [LIMIT]" >&2; exit 2; }
bundle=$1; out=$2; rounds=${3:-10}; limit=${4:-8}
mkdir -p "$out"
b=$(mktemp -d)
trap 'rm -rf "$b"' EXIT
tar -C "$b" -xJf "$bundle" || { echo "queues-ab: cannot unpack $bundle" >&2; exit 2; }
m=$b/release/examples/device_matrix
export CCLD_BOOTSTRAP_IP=127.0.0.1
declare -A hangs=([8]=0 [32]=0)
for i in $(seq 1 "$rounds"); do
  proto=Simple; [ $((i % 2)) = 0 ] && proto=LL
  for q in 8 32; do
    f="$out/ab_q${q}_$i.txt"
    CUDA_DEVICE_MAX_CONNECTIONS=$q timeout -k 2 "$limit" "$m" --proto $proto --ranks 8 --quick --no-bw > "$f" 2>&1
    rc=$?
    [ $rc -ge 124 ] && hangs[$q]=$(( ${hangs[$q]} + 1 ))
    echo "round $i proto $proto CUDA_DEVICE_MAX_CONNECTIONS=$q exit $rc $(grep -m1 summary "$f")"
  done
done > "$out/ab.txt"
cat "$out/ab.txt"
echo "hangs: CUDA_DEVICE_MAX_CONNECTIONS=8: ${hangs[8]}/$rounds, =32: ${hangs[32]}/$rounds" | tee -a "$out/ab.txt"
