#!/usr/bin/env bash
# Side by side on a GPU machine, in one run: NVIDIA's nccl-tests (1 rank) on NVIDIA's NCCL,
# on an older build of ours (OLD_BUNDLE) and on this one (NEW_BUNDLE), interleaved; then
# this build's device_report (latency breakdown, descriptor check cost, inconsistent
# calls), a correctness pass of device_matrix (ranks as threads 1 and 2), and the
# CUDA_DEVICE_MAX_CONNECTIONS A/B of scripts/gpu/queues-ab.sh. Bundles: scripts/gpu/pack.sh.
# Writes into OUTDIR: results.md, logs.tgz. LEASE_BUDGET=SECONDS (default 420) bounds the
# whole run; each step is skipped when under its limit is left.
# Usage: scripts/gpu/perf-ab.sh NEW_BUNDLE OLD_BUNDLE OUTDIR
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 3 ] || { echo "usage: $0 NEW_BUNDLE OLD_BUNDLE OUTDIR" >&2; exit 2; }
out=$3
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
t0=$(date +%s)
left() { echo $(( ${LEASE_BUDGET:-420} - ($(date +%s) - t0) - 10 )); }
declare -A dir
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for who in new old; do
  b=$1; [ $who = old ] && b=$2
  mkdir -p "$tmp/$who"
  tar -C "$tmp/$who" -xJf "$b" || { echo "perf-ab: cannot unpack $b" >&2; exit 2; }
  dir[$who]=$tmp/$who/release
done
tests=$tmp/new/nccl-tests
nv=$(python3 -c 'import glob, site; print(next(iter(sorted(p for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/**/libnccl.so.2", recursive=True))), ""))' 2>/dev/null)
[ -n "$nv" ] && dir[nvidia]=$(dirname "$nv")
export CCLD_BOOTSTRAP_IP=127.0.0.1
r=$out/results.md
{
  echo "# perf-ab $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); NVIDIA NCCL: ${nv:-none}"
} > "$r"

# 1. nccl-tests, 1 rank, NVIDIA / old / new interleaved per binary.
for t in all_reduce broadcast all_gather; do
  for who in nvidia old new; do
    [ -n "${dir[$who]:-}" ] || continue
    [ "$(left)" -gt 30 ] || { echo "- ${t} on $who: skipped (budget)" >> "$r"; continue; }
    LD_LIBRARY_PATH=${dir[$who]} timeout -k 3 25 "$tests/${t}_perf" -b 8 -e 128M -f 8 -g 1 -c 1 -w 5 -n 20 \
      > "$out/logs/v_${t}_$who.txt" 2>&1
    echo "- ${t}_perf on $who: exit $?" >> "$r"
  done
  for who in nvidia old new; do  # a placeholder keeps awk's file numbering
    [ -s "$out/logs/v_${t}_$who.txt" ] || echo "# not run" > "$out/logs/v_${t}_$who.txt"
  done
  { echo; echo "| bytes | $t us NVIDIA | us old | us new | new/NVIDIA time | busbw NVIDIA | busbw old | busbw new | wrong new |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    # Out-of-place columns of nccl-tests: size count type redop root time algbw busbw #wrong.
    awk 'FNR==1{f++} $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 9 {
           t[f,$1]=$6; b[f,$1]=$8; w[f,$1]=$9; if (f==3) k[++n]=$1 }
         END { for (i=1;i<=n;i++) { s=k[i]; q=(t[1,s]+0>0)?sprintf("%.2f", t[3,s]/t[1,s]):"n/a";
               printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s, t[1,s], t[2,s], t[3,s], q, b[1,s], b[2,s], b[3,s], w[3,s] } }' \
      "$out/logs/v_${t}_nvidia.txt" "$out/logs/v_${t}_old.txt" "$out/logs/v_${t}_new.txt"; echo; } >> "$r"
done

# 2. device_report: this build (all parts), then the older build's parts A and B (the
#    latency breakdown) when it has the program.
if [ "$(left)" -gt 120 ]; then
  timeout -k 3 110 "${dir[new]}/examples/device_report" --iters 2000 --rounds 7 \
    > "$out/logs/report.txt" 2>&1
  echo "device_report: exit $?" >> "$r"
  { echo; cat "$out/logs/report.txt"; echo; } >> "$r"
else
  echo "device_report: skipped (budget)" >> "$r"
fi
if [ -x "${dir[old]}/examples/device_report" ] && [ "$(left)" -gt 90 ]; then
  timeout -k 3 40 "${dir[old]}/examples/device_report" --iters 2000 --parts A,B \
    > "$out/logs/report-old.txt" 2>&1
  { echo "device_report of the older build, parts A and B: exit $?"; echo
    cat "$out/logs/report-old.txt"; echo; } >> "$r"
fi

# 3. Correctness of this build, ranks as threads 1 and 2 (the one-rank copy path included).
if [ "$(left)" -gt 70 ]; then
  timeout -k 3 60 "${dir[new]}/examples/device_matrix" --ranks 1,2 --quick --no-bw \
    > "$out/logs/matrix.txt" 2>&1
  echo "device_matrix --ranks 1,2 --quick: exit $? ($(grep -m1 summary "$out/logs/matrix.txt"); FAIL lines: $(grep -c '^FAIL' "$out/logs/matrix.txt"))" >> "$r"
fi

# 4. The 8-ranks-as-threads hang: CUDA_DEVICE_MAX_CONNECTIONS 8 vs 32.
rounds=$(( ($(left) - 10) / 20 ))
[ "$rounds" -gt 6 ] && rounds=6
if [ "$rounds" -ge 2 ]; then
  scripts/gpu/queues-ab.sh "$1" "$out/logs/queues" "$rounds" 8 > /dev/null 2>&1
  { echo; echo "## CUDA_DEVICE_MAX_CONNECTIONS A/B ($rounds rounds)"; echo; sed 's/^/    /' "$out/logs/queues/ab.txt"; } >> "$r"
else
  echo "queues A/B: skipped (budget)" >> "$r"
fi
tar -C "$out" -czf "$out/logs.tgz" logs
rm -rf "$out/logs"
echo "perf-ab: done in $(( $(date +%s) - t0 )) s" | tee -a "$r"
