#!/usr/bin/env bash
# Runs the GPU suite on a device machine from a bundle made by scripts/gpu/pack.sh, within a
# short lease: each part has a hard limit, the programs inside it a cap (GPU_SUITE_CAP), and
# the parts run in order of importance so that a hang costs one part, not the lease.
# Then NVIDIA's nccl-tests side by side on NVIDIA's NCCL (the nvidia-nccl-cu13 wheel, found
# through python3) and on ours.
# Writes into OUTDIR: results.md (all parts), logs.tgz (raw output), run.log.
# LEASE_BUDGET=SECONDS (default 500): the whole run's deadline; a part that would outlast it
# is shortened, or skipped when under 20 s are left, and the results are still written.
# Usage: scripts/gpu/lease-run.sh BUNDLE OUTDIR [PARTS]   (PARTS default a,n,f,b,e,v,d,c)
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 BUNDLE OUTDIR [PARTS]" >&2; exit 2; }
bundle=$1; out=$2; parts=${3:-a,n,f,b,e,v,d,c}
[ -f "$bundle" ] || { echo "lease-run: no bundle at $bundle" >&2; exit 2; }
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
b=$(mktemp -d)
trap 'rm -rf "$b"' EXIT
tar -C "$b" -xJf "$bundle" || { echo "lease-run: cannot unpack $bundle" >&2; exit 2; }
exec > >(tee -a "$out/run.log") 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
remaining() { echo $(( ${LEASE_BUDGET:-500} - ($(date +%s) - t0) - 15 )); }
nvidia-smi > "$out/logs/nvidia-smi.txt" 2>&1
stamp "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
# part -> "outer limit in s, cap per program in s"
declare -A limit=([a]="100 90" [n]="110 25" [f]="100 90" [b]="130 45" [e]="110 100"
                  [v]="90 25" [d]="70 30" [c]="70 30")
fail=0
for p in ${parts//,/ }; do
  [ -n "${limit[$p]:-}" ] || { stamp "unknown part $p"; continue; }
  set -- ${limit[$p]}
  left=$(remaining)
  if [ "$left" -lt 20 ]; then stamp "part $p skipped: $left s left"; fail=1; continue; fi
  [ "$1" -gt "$left" ] && set -- "$left" "$2"
  stamp "part $p (limit $1 s, cap $2 s)"
  if [ "$p" = v ]; then
    # NVIDIA's nccl-tests, NVIDIA's NCCL vs ours, one rank (NCCL takes one rank per GPU).
    nv=$(python3 -c 'import glob, site; print(next(iter(sorted(p for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/**/libnccl.so.2", recursive=True))), ""))' 2>/dev/null)
    f="$out/logs/part-v.md"
    { echo; echo "## (v) NVIDIA nccl-tests, 1 rank: NVIDIA's NCCL ($nv) vs ours"; echo; } > "$f"
    for t in all_reduce all_gather reduce_scatter broadcast sendrecv; do
      for who in nvidia ours; do
        [ "$(remaining)" -gt "$2" ] || { echo "- $t on $who: skipped (lease deadline)" >> "$f"; continue; }
        dir=$b/release
        if [ $who = nvidia ]; then [ -n "$nv" ] || continue; dir=$(dirname "$nv"); fi
        LD_LIBRARY_PATH=$dir timeout -k 3 "$2" "$b/nccl-tests/${t}_perf" -b 8 -e 256M -f 4 -g 1 -c 1 -w 3 -n 10 \
          > "$out/logs/v_${t}_$who.txt" 2>&1
        echo "- ${t}_perf on $who: exit $? ($(grep -m1 -o 'nccl-library=[0-9]*\|NCCL version [0-9.]*' "$out/logs/v_${t}_$who.txt" | head -1))" >> "$f"
      done
      { echo; echo "| bytes | $t time NVIDIA (us) | time ours (us) | ours/NVIDIA | algbw NVIDIA (GB/s) | algbw ours (GB/s) | wrong (ours) |";
        echo "|---:|---:|---:|---:|---:|---:|---:|"
        awk 'FNR==1{f++} $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 9 { if (f==1) { tn[$1]=$6; bn[$1]=$7 } else { to[$1]=$6; bo[$1]=$7; w[$1]=$9; k[++n]=$1 } }
             END { for (i=1;i<=n;i++) { s=k[i]; r=(tn[s]+0>0)?sprintf("%.2f", to[s]/tn[s]):"n/a"; printf "| %s | %s | %s | %s | %s | %s | %s |\n", s, tn[s], to[s], r, bn[s], bo[s], w[s] } }' \
          "$out/logs/v_${t}_nvidia.txt" "$out/logs/v_${t}_ours.txt"; echo; } >> "$f"
    done
    # (nccl-tests cannot put two ranks on one GPU: -t 2 -g 1 asks for 2 GPUs and exits;
    # several ranks per GPU are parts a-d.)
    continue
  fi
  GPU_SUITE_CAP=$2 GPU_SUITE_LOG="$out/logs/$p" timeout -k 5 "$1" \
    scripts/gpu-suite.sh --only "$p" --quick --out "$out/logs/part-$p.md" \
    --bin-dir "$b/release" --nccl-tests "$b/nccl-tests"
  rc=$?
  stamp "part $p: exit $rc"
  [ $rc = 0 ] || fail=1
done
for p in ${parts//,/ }; do cat "$out/logs/part-$p.md" 2>/dev/null; done > "$out/results.md"
tar -C "$out" -czf "$out/logs.tgz" logs
stamp "done (fail=$fail)"
exit $fail
