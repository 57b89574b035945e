#!/usr/bin/env bash
# GPU suite: run on any machine with an NVIDIA GPU (driver only; no CUDA toolkit needed:
# the kernels are compiled in and cudart is linked statically). Builds nothing. Writes
# docs/gpu-results/<date>.md (date, GPU, driver, figures, pass/fail per part).
#
# Artifacts it needs, built on the dev machine (where nvcc is: scripts/install-toolchains.sh)
# and copied along with the repository (the whole target/release directory is simplest):
#   cargo build --release -p ccl-ffi -p nccl-tests-compat
#       -> target/release/libnccl.so.2, target/release/all_reduce_perf, target/release/ccl-run
#   cargo build --release -p ccl-core --example device_selftest --example device_matrix
#       -> target/release/examples/device_selftest, target/release/examples/device_matrix
#   (CCLD_BUILD_SELFTEST=1 scripts/gpu/ci-device-build.sh builds the two examples too.)
#   cargo build --release -p benches --example device_diagnosis
#       -> target/release/examples/device_diagnosis (part f)
# all_reduce_perf (d) dlopens libcudart.so.13/.12/.11.0 for its cudaMalloc buffers: the
# suite looks in LD_LIBRARY_PATH, the --bin-dir, /usr/local/cuda/lib64 and python's
# site-packages/nvidia/*/lib (the nvidia-cuda-runtime wheel, also pulled in by torch); on a
# machine without any, copy site-packages/nvidia/cu13/lib/libcudart.so.13 from the dev
# machine into the --bin-dir. The driver must support CUDA 13.0 (the kernels' cudart_static):
# R580 or newer; with an older driver every part reports "no device".
# Part (e) needs python3 with torch built for CUDA (pip install torch); without it that part
# is recorded as not run.
#
# NVIDIA's nccl-tests (part n): scripts/gpu/build-nccl-tests.sh --lib target/release/libnccl.so.2
#       -> target/nccl-tests/bin/*_perf (built with the pinned nvcc, cudart static; copy
#          that directory along, or point --nccl-tests at it)
#
# Parts (each PASS / FAIL / not run in the results file; exit status 1 if any FAILed):
#   (n) part one: NVIDIA's nccl-tests 2.19.6, each of the 11 binaries on our libnccl.so.2
#       (ldd recorded), -g 1 and -g <all GPUs> when there are >= 2 (one thread creating
#       every rank in one group: the deferred grouped init), data checked (-c 1); then
#       all_reduce_perf -G 1 (CUDA graph capture), which must be refused cleanly
#       (ncclInvalidUsage, no hang, no crash) until graph capture is supported;
#   (a) device_selftest: kernel-level, every collective on 1/2/4/8 ranks sharing the GPU,
#       results + probe counters, AllReduce busbw vs the device copy bandwidth;
#   (b) device_matrix: the device RUNTIME's correctness matrix (ranks as threads, 1/2/4/8,
#       own communicator + stream each, device buffers, probe counters vs the schedule) and
#       AllReduce busbw per size for 2/4/8 ranks, once per protocol: --proto Simple (as
#       --quick says), --proto LL --quick and --proto auto --quick (LL for small operations,
#       Simple for large ones, switching on the same connections); at most 10 min in all;
#   (c) device_matrix --procs 2: two processes on device 0 (CUDA IPC), then again with
#       NCCL_P2P_DISABLE=1 (host-staged FIFOs in pinned shared memory);
#   (d) all_reduce_perf against our libnccl.so.2 with probes on vs CCLD_DISABLE=1: per-size
#       time ratio and busbw, next to the device copy bandwidth of (a); configurations:
#       1 rank, 2 processes sharing GPU 0, and all GPUs of one process when there are >= 2;
#   (p) all_reduce_perf 8 B..4 MiB with the plan arrays in device memory (default) vs
#       CCLD_DEVICE_PLANS=mapped (read over PCIe): per-size time ratio (issue 15 blocker 9),
#       1 rank and 2 processes sharing GPU 0;
#   (e) PyTorch DDP, 2 processes sharing cuda:0, LD_PRELOAD of our libnccl.so.2, parameters
#       vs a single-process run (scripts/gpu/ddp_check.py);
#   (f) diagnosis end to end on the GPU (device_diagnosis): 4 ranks as threads sharing GPU 0,
#       each with a device communicator, the embedded analyzer, one CCLD_INJECT anomaly per
#       class S1/S2/S3/H1/H2/H3 at a non-zero root (faults in the kernel / runtime, wait
#       times from the kernel's global timer); class and rank RIGHT / WRONG per case.
# --kernels-only runs (a) only. --only n,a,b,... runs the named parts (to split a run over
# several commands: give each its own --out). --quick: smaller matrices and sizes.
#
# Environment: GPU_SUITE_CAP=SECONDS caps every program's time limit (a short lease);
# GPU_SUITE_LOG=DIR keeps the raw output there. scripts/gpu/lease-run.sh sets both.
# Usage: scripts/gpu-suite.sh [--kernels-only] [--only PARTS] [--quick] [--out FILE]
#                             [--bin-dir DIR] [--nccl-tests DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
parts="n,a,b,c,d,p,e,f"; quick=(); out=""; bin=target/release; nt=target/nccl-tests/bin
usage() {
  echo "usage: $0 [--kernels-only] [--only n,a,b,c,d,p,e,f] [--quick] [--out FILE] [--bin-dir DIR] [--nccl-tests DIR]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --kernels-only) parts="a" ;;
    --only) [ $# -ge 2 ] || usage; parts="$2"; shift ;;
    --quick) quick=(--quick) ;;
    --out) [ $# -ge 2 ] || usage; out="$2"; shift ;;
    --bin-dir) [ $# -ge 2 ] || usage; bin="$2"; shift ;;
    --nccl-tests) [ $# -ge 2 ] || usage; nt="$2"; shift ;;
    *) usage ;;
  esac
  shift
done
case ",$parts," in *[!abcdefnp,]*) usage ;; esac
want() { case ",$parts," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

day=$(date -u +%Y-%m-%d)
out=${out:-docs/gpu-results/$day.md}
mkdir -p "$(dirname "$out")"
# GPU_SUITE_CAP=SECONDS caps every program's time limit below (for a short device lease);
# GPU_SUITE_LOG=DIR keeps the programs' raw output there instead of a temporary folder.
cap=${GPU_SUITE_CAP:-0}
case "$cap" in ''|*[!0-9]*) echo "GPU_SUITE_CAP must be a number of seconds, got '$cap'" >&2; exit 2 ;; esac
tmo() {
  local t=$1; shift
  if [ "$cap" -gt 0 ] && [ "$cap" -lt "$t" ]; then t=$cap; fi
  timeout -k 5 "$t" "$@"
}
log=${GPU_SUITE_LOG:-$(mktemp -d)}
mkdir -p "$log"
fail=0
export CCLD_BOOTSTRAP_IP=${CCLD_BOOTSTRAP_IP:-127.0.0.1}
unset CCLD_DEVICE_EMULATION

[ -d "$bin" ] && bin=$(cd "$bin" && pwd)
[ -d "$nt" ] && nt=$(cd "$nt" && pwd)
selftest=$bin/examples/device_selftest
matrix=$bin/examples/device_matrix
diagnosis=$bin/examples/device_diagnosis
lib=$bin/libnccl.so.2
arp=$bin/all_reduce_perf
ccl_run=$bin/ccl-run

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
ngpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
{
  echo "# GPU suite results, $day"
  echo
  echo "- date (UTC): $(date -u '+%Y-%m-%d %H:%M')"
  echo "- GPU: ${gpu:-none found} (x${ngpu})"
  echo "- driver: ${driver:-unknown}"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "- parts: $parts${quick[*]:+ (quick)}"
  echo
} > "$out"

section() { { echo; echo "## $1"; echo; } >> "$out"; }
pass_fail() { if [ "$1" = 0 ]; then echo "**PASS**"; else echo "**FAIL** (exit $1)"; fi; }
# need FILE...: records the missing ones and returns 1.
need() {
  local f missing=0
  for f in "$@"; do
    if [ ! -e "$f" ]; then
      echo "Not run: missing \`$f\` (build it on the dev machine: see the header of scripts/gpu-suite.sh)." >> "$out"
      missing=1
    fi
  done
  [ $missing = 0 ] || fail=1
  return $missing
}
# A program's summary lines (everything but the per-case PASS lines) in a code block.
summary_block() {
  { echo; echo '```'; grep -v '^PASS' "$1" | head -200; echo '```'; } >> "$out"
  echo "$(grep -c '^PASS' "$1") cases passed." >> "$out"
}

# (n) NVIDIA's nccl-tests on our library.
if want n; then
  section "(n) NVIDIA nccl-tests 2.19.6 on our libnccl.so.2"
  if need "$lib" "$nt/all_reduce_perf"; then
    maxb=64M; [ ${#quick[@]} -gt 0 ] && maxb=1M
    echo "\`ldd all_reduce_perf\`: $(LD_LIBRARY_PATH="$bin" ldd "$nt/all_reduce_perf" | grep -m1 libnccl | tr -s ' \t' ' ')" >> "$out"
    echo >> "$out"
    echo "| binary | -g | result | library | avg busbw (GB/s) | out of bounds |" >> "$out"
    echo "|---|---:|---|---|---:|---|" >> "$out"
    gs=(1); [ "${ngpu:-0}" -ge 2 ] && gs+=("$ngpu")
    for t in "$nt"/*_perf; do
      name=$(basename "$t")
      for g in "${gs[@]}"; do
        f="$log/nt_${name}_g$g.txt"
        LD_LIBRARY_PATH="$bin" tmo 300 "$t" -b 8 -e "$maxb" -f 4 -g "$g" -c 1 -w 2 -n 5 > "$f" 2>&1; rc=$?
        [ $rc = 0 ] || fail=1
        echo "| $name | $g | $(pass_fail $rc) | $(grep -m1 -o 'nccl-library=[0-9]*' "$f" || echo '?') | $(grep -m1 'Avg bus bandwidth' "$f" | awk '{print $NF}') | $(grep -m1 'Out of bounds' "$f" | sed 's/.*: *//') |" >> "$out"
        cat "$f" >> "$log/nccl-tests.txt"
      done
    done
    # CUDA graph capture: refused with ncclInvalidUsage until supported (no hang, no crash).
    f="$log/nt_graph.txt"
    LD_LIBRARY_PATH="$bin" tmo 120 "$nt/all_reduce_perf" -b 1M -e 1M -g 1 -G 1 > "$f" 2>&1; rc=$?
    cat "$f" >> "$log/nccl-tests.txt"
    if [ $rc != 0 ] && [ $rc -lt 124 ] && grep -qi 'invalid usage' "$f"; then
      { echo; echo "all_reduce_perf -G 1 (graph capture): **PASS** (refused with invalid usage, exit $rc)"; } >> "$out"
    else
      { echo; echo "all_reduce_perf -G 1 (graph capture): **FAIL** (exit $rc; expected a clean ncclInvalidUsage refusal)"; } >> "$out"
      fail=1
    fi
  fi
fi

# (a) Kernel-level self-test.
if want a; then
  section "(a) Kernel self-test: 1, 2, 4, 8 ranks on one device (device_selftest)"
  if need "$selftest"; then
    tmo 900 "$selftest" "${quick[@]}" > "$log/selftest.txt" 2>&1; rc=$?
    pass_fail $rc >> "$out"; [ $rc = 0 ] || fail=1
    summary_block "$log/selftest.txt"
  fi
fi

# (b) Runtime correctness matrix, ranks as threads, and its busbw figures.
if want b; then
  section "(b) Device runtime matrix: 1, 2, 4, 8 ranks as threads (device_matrix)"
  if need "$matrix"; then
    # Simple as asked (full or --quick), LL and auto always --quick: 10 minutes in all.
    for run in "simple 300 --proto Simple ${quick[*]}" "ll 150 --proto LL --quick" \
               "auto 150 --proto auto --quick"; do
      set -- $run; name=$1; limit=$2; shift 2
      echo "### device_matrix $*" >> "$out"
      tmo "$limit" "$matrix" "$@" > "$log/matrix-$name.txt" 2>&1; rc=$?
      pass_fail $rc >> "$out"; [ $rc = 0 ] || fail=1
      summary_block "$log/matrix-$name.txt"
    done
    cat "$log"/matrix-simple.txt "$log"/matrix-ll.txt "$log"/matrix-auto.txt > "$log/matrix.txt"
  fi
fi

# (c) Two processes on device 0 (CUDA IPC).
if want c; then
  section "(c) Device runtime matrix: 2 processes on device 0, CUDA IPC (device_matrix --procs 2)"
  if need "$matrix"; then
    tmo 600 "$matrix" "${quick[@]}" --procs 2 --no-bw > "$log/procs.txt" 2>&1; rc=$?
    pass_fail $rc >> "$out"; [ $rc = 0 ] || fail=1
    if grep -q '^SKIP' "$log/procs.txt"; then
      echo "(SKIP on a real GPU is a failure of the suite: IPC must work here.)" >> "$out"; fail=1
    fi
    summary_block "$log/procs.txt"
    section "(c') The same with NCCL_P2P_DISABLE=1: host-staged FIFOs in pinned shared memory"
    NCCL_P2P_DISABLE=1 tmo 600 "$matrix" "${quick[@]}" --procs 2 --no-bw > "$log/procs-staged.txt" 2>&1; rc=$?
    pass_fail $rc >> "$out"; [ $rc = 0 ] || fail=1
    summary_block "$log/procs-staged.txt"
  fi
fi

# (d) all_reduce_perf, probes on vs off.
# ratio_table ON OFF [LABEL_ON LABEL_OFF]: rows of two nccl-tests tables joined on the
# size: out-of-place time (column 6) and busbw (column 8), and the time ratio on/off.
ratio_table() {
  awk -v lon="${3:-probes on}" -v loff="${4:-probes off}" '
    FILENAME != prev { f++; prev = FILENAME }
    $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 9 {
      if (f == 1) { ton[$1] = $6; bon[$1] = $8; order[++n] = $1 }
      else { toff[$1] = $6; boff[$1] = $8 }
    }
    END {
      printf "| bytes | time %s (us) | time %s (us) | ratio | busbw %s (GB/s) | busbw %s (GB/s) |\n", lon, loff, lon, loff
      print "|---:|---:|---:|---:|---:|---:|"
      for (i = 1; i <= n; i++) {
        k = order[i]
        if (!(k in toff)) continue
        r = (toff[k] + 0 > 0) ? sprintf("%.3f", ton[k] / toff[k]) : "n/a"
        printf "| %s | %s | %s | %s | %s | %s |\n", k, ton[k], toff[k], r, bon[k], boff[k]
      }
    }' "$1" "$2"
}
find_cudart() {
  local d py
  py=$(python3 -c 'import glob, site; print(" ".join(sorted({p for s in site.getsitepackages() + [site.getusersitepackages()] for p in glob.glob(s + "/nvidia/*/lib")})))' 2>/dev/null)
  # Word splitting of the directory lists is intended (no spaces in these paths).
  # shellcheck disable=SC2086
  for d in ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }} "$bin" /usr/local/cuda/lib64 $py; do
    if compgen -G "$d/libcudart.so.1[0-9]*" > /dev/null; then echo "$d"; return 0; fi
  done
  return 1
}
if want d; then
  section "(d) all_reduce_perf through libnccl.so.2: probes on vs off (CCLD_DISABLE=1)"
  cudart_dir=$(find_cudart) || {
    echo "Not run: no libcudart.so.1x found for all_reduce_perf's device buffers (see the header of scripts/gpu-suite.sh)." >> "$out"
    fail=1
  }
  if [ -n "${cudart_dir:-}" ] && need "$lib" "$arp" "$ccl_run"; then
    echo "libcudart for all_reduce_perf from \`$cudart_dir\`." >> "$out"; echo >> "$out"
    maxb=256M; [ ${#quick[@]} -gt 0 ] && maxb=16M
    arp_args=(-b 8 -e "$maxb" -f 4 -w 5 -n 20 -c 1)
    configs=("1rank" "2procs-gpu0")
    [ "${ngpu:-0}" -ge 2 ] && configs+=("${ngpu}gpus")
    for cfg in "${configs[@]}"; do
      echo "### $cfg" >> "$out"; echo >> "$out"
      for probes in on off; do
        f="$log/arp_${cfg}_$probes.txt"
        disable=(); [ $probes = off ] && disable=(CCLD_DISABLE=1)
        case "$cfg" in
          1rank) tmo 300 env "${disable[@]}" LD_LIBRARY_PATH="$bin:$cudart_dir" \
                   "$arp" "${arp_args[@]}" -g 1 > "$f" 2>&1 ;;
          2procs-gpu0) tmo 300 env "${disable[@]}" LD_LIBRARY_PATH="$bin:$cudart_dir" NCCL_TESTS_DEVICE=0 \
                   "$ccl_run" -n 2 "$arp" "${arp_args[@]}" -g 1 > "$f" 2>&1 ;;
          *) tmo 300 env "${disable[@]}" LD_LIBRARY_PATH="$bin:$cudart_dir" \
                   "$arp" "${arp_args[@]}" -g "$ngpu" > "$f" 2>&1 ;;
        esac
        rc=$?
        echo "- probes $probes: $(pass_fail $rc) ($(grep -m1 -o 'nccl-library=[0-9]*' "$f" || echo 'no header'); $(grep -m1 'Avg bus bandwidth' "$f" | tr -s ' ' || echo 'no average'))" >> "$out"
        [ $rc = 0 ] || { fail=1; { echo '```'; tail -15 "$f"; echo '```'; } >> "$out"; }
      done
      { echo; echo '```'; grep -E '^# +Rank' "$log/arp_${cfg}_on.txt" | head -8; echo '```'; echo; } >> "$out"
      ratio_table "$log/arp_${cfg}_on.txt" "$log/arp_${cfg}_off.txt" >> "$out"
      echo >> "$out"
    done
    if [ -s "$log/selftest.txt" ]; then
      echo "Device-to-device copy bandwidth of the same run (device_selftest): $(grep -m1 '^BW copy' "$log/selftest.txt" || echo 'not measured')" >> "$out"
    else
      echo "Device copy bandwidth: part (a) did not run in this invocation." >> "$out"
    fi
  fi
fi

# (p) issue 15 blocker 9: plan arrays read from device memory (default) vs mapped host
# memory over PCIe (CCLD_DEVICE_PLANS=mapped); small sizes, where per-step latency shows.
if want p; then
  section "(p) plan arrays in device memory vs mapped host memory (CCLD_DEVICE_PLANS)"
  cudart_dir=${cudart_dir:-$(find_cudart)} || cudart_dir=""
  if [ -z "$cudart_dir" ]; then
    echo "Not run: no libcudart.so.1x found for all_reduce_perf's device buffers." >> "$out"
    fail=1
  elif need "$lib" "$arp" "$ccl_run"; then
    for cfg in 1rank 2procs-gpu0; do
      echo "### $cfg" >> "$out"; echo >> "$out"
      for plans in device mapped; do
        f="$log/plans_${cfg}_$plans.txt"
        case "$cfg" in
          1rank) tmo 300 env CCLD_DEVICE_PLANS=$plans LD_LIBRARY_PATH="$bin:$cudart_dir" \
                   "$arp" -b 8 -e 4M -f 2 -w 20 -n 200 -c 1 -g 1 > "$f" 2>&1 ;;
          *) tmo 300 env CCLD_DEVICE_PLANS=$plans LD_LIBRARY_PATH="$bin:$cudart_dir" NCCL_TESTS_DEVICE=0 \
                   "$ccl_run" -n 2 "$arp" -b 8 -e 4M -f 2 -w 20 -n 200 -c 1 -g 1 > "$f" 2>&1 ;;
        esac
        rc=$?
        echo "- plans in $plans memory: $(pass_fail $rc)" >> "$out"
        [ $rc = 0 ] || { fail=1; { echo '```'; tail -15 "$f"; echo '```'; } >> "$out"; }
      done
      echo >> "$out"
      ratio_table "$log/plans_${cfg}_device.txt" "$log/plans_${cfg}_mapped.txt" "device plans" "mapped plans" >> "$out"
      echo >> "$out"
    done
  fi
fi

# (e) PyTorch DDP.
if want e; then
  section "(e) PyTorch DDP: 2 processes sharing cuda:0, parameters vs a single process"
  if ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "Not run: no python3 with a CUDA build of torch on this machine." >> "$out"
  elif need "$lib"; then
    LD_PRELOAD=$lib tmo 900 python3 scripts/gpu/ddp_check.py "$log/ddp.json" > "$log/ddp.txt" 2>&1
    rc=$?; pass_fail $rc >> "$out"; [ $rc = 0 ] || fail=1
    { echo '```'; tail -20 "$log/ddp.txt"; echo '```'; } >> "$out"
  fi
fi

# (f) Diagnosis end to end on the GPU.
if want f; then
  section "(f) Diagnosis end to end: 4 ranks sharing GPU 0, one anomaly per class (device_diagnosis)"
  if need "$diagnosis"; then
    tmo 300 "$diagnosis" --ranks 4 > "$log/diagnosis.txt" 2>&1; rc=$?
    pass_fail $rc >> "$out"; [ $rc = 0 ] || fail=1
    {
      echo
      echo "| verdict | injected | ranks | root | diagnosed | roots |"
      echo "|---|---|---:|---:|---|---|"
      awk '$1 == "RIGHT" || $1 == "WRONG" {
        v = $1; c = ""; n = ""; r = ""; g = ""; roots = ""
        for (i = 2; i <= NF; i++) {
          if ($i ~ /^class=/) c = substr($i, 7)
          else if ($i ~ /^n=/) n = substr($i, 3)
          else if ($i ~ /^root=/) r = substr($i, 6)
          else if ($i ~ /^got=/) g = substr($i, 5)
          else if ($i ~ /^roots=/) { roots = substr($i, 7); while (roots !~ /]$/ && i < NF) { i++; roots = roots " " $i } }
        }
        printf "| %s | %s | %s | %s | %s | %s |\n", v, c, n, r, g, roots
      }' "$log/diagnosis.txt"
      echo
      echo '```'; grep -v '^RIGHT' "$log/diagnosis.txt" | tail -30; echo '```'
    } >> "$out"
  fi
fi

for f in nccl-tests selftest matrix procs procs-staged diagnosis; do
  [ -s "$log/$f.txt" ] || continue
  section "Full log: $f"
  { echo '<details><summary>'"$f"'.txt</summary>'; echo; echo '```'; cat "$log/$f.txt"; echo '```'; echo '</details>'; } >> "$out"
done
echo "gpu-suite: wrote $out ($( [ $fail = 0 ] && echo PASS || echo FAIL ))"
exit $fail
