#!/usr/bin/env bash
# Builds NVIDIA's nccl-tests 2.19.6 (third_party, BSD-3-Clause: a client, built as users
# build it, none of its code copied) against OUR libnccl.so.2, and checks the link:
#   * headers: NVIDIA's nccl.h (and the nccl_device.h tree it includes for NCCL >= 2.28)
#     from the nvidia-nccl-cu13==2.30.7 wheel, fetched with pip into
#     .cache/nvidia-nccl-2.30.7/include/ on first use (docs/nccl-tests.md says why we do
#     not ship nccl_device.h ourselves);
#   * NCCL_HOME = <out>/nccl-home: include/ = those headers, lib/ = links to our library;
#   * CUDA_HOME / CUDA_LIB / NVCC = the pinned nvcc wheel (scripts/install-toolchains.sh),
#     CUDARTLIB=cudart_static (no libcudart.so needed at run time);
#   * every binary: `ldd -r` with lib/ first on the library path resolves libnccl.so.2 to
#     our file and reports no undefined symbol, and `nm -D` finds each nccl* symbol the
#     binary needs among our exports (exit 1 otherwise).
# No GPU needed; on a machine without one the binaries stop at their first CUDA call.
#
# Usage: scripts/gpu/build-nccl-tests.sh [--lib PATH] [--out DIR] [--bins "all_reduce ..."]
#   --lib   our libnccl.so.2 (default target/release/libnccl.so.2, else target/debug/...)
#   --out   build directory (default target/nccl-tests); binaries in <out>/bin/*_perf
#   --bins  which tests (default: all 11 of nccl-tests' Makefile)
# NVCC_GENCODE (environment) overrides the architectures; default sm_80 + sm_90 (A100,
# H100/H200) with compute_90 PTX for newer GPUs (far faster than nccl-tests' 6 targets).
# JOBS (environment): parallel make jobs (default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
# The sources: NCCL_TESTS_SRC, else shared/third_party/nccl-tests-2.19.6 in this checkout
# or a directory above it, else a clone of the v2.19.6 tag (commit a0b82b2) into .cache/.
find_src() {
  local d=$root
  [ -n "${NCCL_TESTS_SRC:-}" ] && { echo "$NCCL_TESTS_SRC"; return; }
  while [ "$d" != / ]; do
    [ -f "$d/shared/third_party/nccl-tests-2.19.6/src/common.cu" ] &&
      { echo "$d/shared/third_party/nccl-tests-2.19.6"; return; }
    d=$(dirname "$d")
  done
  d=$root/.cache/nccl-tests-2.19.6
  if [ ! -f "$d/src/common.cu" ]; then
    rm -rf "$d.tmp"
    git clone -q --depth 1 --branch v2.19.6 https://github.com/NVIDIA/nccl-tests "$d.tmp" >&2 &&
      [ "$(git -C "$d.tmp" rev-parse --short=7 HEAD)" = a0b82b2 ] && mv "$d.tmp" "$d"
  fi
  echo "$d"
}
src=$(find_src)
lib=""; out=target/nccl-tests
bins="all_reduce all_gather broadcast reduce_scatter reduce alltoall alltoallv scatter gather sendrecv hypercube"
while [ $# -gt 0 ]; do
  case "$1" in
    --lib) lib="$2"; shift ;;
    --out) out="$2"; shift ;;
    --bins) bins="$2"; shift ;;
    *) echo "usage: $0 [--lib PATH] [--out DIR] [--bins \"all_reduce ...\"]" >&2; exit 2 ;;
  esac
  shift
done
fail() { echo "build-nccl-tests: FAIL: $*" >&2; exit 1; }
[ -f "$src/src/common.cu" ] || fail "nccl-tests sources not found at $src (set NCCL_TESTS_SRC)"
if [ -z "$lib" ]; then
  for c in target/release/libnccl.so.2 target/debug/libnccl.so.2; do
    [ -e "$c" ] && { lib=$c; break; }
  done
fi
[ -n "$lib" ] && [ -e "$lib" ] || fail "our libnccl.so.2 not found (cargo build -p ccl-ffi, or --lib)"
lib=$(readlink -f "$lib")

# The project's Python (.cache/venv, see scripts/python-env.sh) where it exists.
py=python3
[ -x "$root/.cache/venv/bin/python3" ] && py=$root/.cache/venv/bin/python3
# The pinned nvcc wheel.
cu13=$("$py" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null) ||
  fail "no nvidia/cu13 wheel in $py's site-packages (run scripts/install-toolchains.sh --cuda-only)"
[ -x "$cu13/bin/nvcc" ] || fail "$cu13/bin/nvcc missing (run scripts/install-toolchains.sh --cuda-only)"
[ -f "$cu13/lib/libcudart_static.a" ] || fail "$cu13/lib/libcudart_static.a missing"

# NVIDIA's headers from the 2.30.7 wheel (the same wheel the ABI tests use).
hdr=$root/.cache/nvidia-nccl-2.30.7/include
if [ ! -f "$hdr/nccl_device.h" ] || [ ! -f "$hdr/nccl.h" ]; then
  tmp=$(mktemp -d)
  "$py" -m pip download --disable-pip-version-check --no-deps --quiet \
    "nvidia-nccl-cu13==2.30.7" -d "$tmp" || fail "pip download nvidia-nccl-cu13==2.30.7"
  mkdir -p "$hdr.tmp"
  "$py" - "$tmp"/*.whl "$hdr.tmp" <<'EOF'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if "/include/" not in name or name.endswith("/"):
            continue
        rel = name.split("/include/", 1)[1]
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(name) as s, open(path, "wb") as d:
            d.write(s.read())
EOF
  rm -rf "$hdr" && mv "$hdr.tmp" "$hdr" && rm -rf "$tmp"
fi
grep -q 'NCCL_VERSION_CODE 23007' "$hdr/nccl.h" || fail "$hdr/nccl.h is not NCCL 2.30.7"

mkdir -p "$out"
out=$(cd "$out" && pwd)
home=$out/nccl-home
rm -rf "$home" && mkdir -p "$home/lib"
ln -s "$hdr" "$home/include"
ln -s "$lib" "$home/lib/libnccl.so.2"
ln -s "$lib" "$home/lib/libnccl.so"

targets=()
for b in $bins; do targets+=("$out/bin/${b}_perf"); done
t0=$(date +%s)
make -C "$src/src" -j "${JOBS:-2}" "${targets[@]}" \
  NCCL_HOME="$home" CUDA_HOME="$cu13" CUDA_LIB="$cu13/lib" CUDA_INC="$cu13/include" \
  NVCC="$cu13/bin/nvcc" CUDARTLIB=cudart_static BUILDDIR="$out/bin" \
  NVCC_GENCODE="${NVCC_GENCODE:--gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=[sm_90,compute_90]}" \
  || fail "make"
echo "build-nccl-tests: built ${#targets[@]} binaries in $(( $(date +%s) - t0 )) s"

# Link checks.
ours=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
for t in "${targets[@]}"; do
  [ -x "$t" ] || fail "$t was not built"
  ld_out=$(LD_LIBRARY_PATH="$home/lib" ldd -r "$t" 2>&1) || fail "ldd -r $t: $ld_out"
  if grep -q 'undefined symbol' <<<"$ld_out"; then
    fail "$t has undefined symbols: $(grep 'undefined symbol' <<<"$ld_out" | head -5)"
  fi
  got=$(awk '$1 == "libnccl.so.2" {print $3}' <<<"$ld_out")
  [ -n "$got" ] && [ "$(readlink -f "$got")" = "$lib" ] ||
    fail "$t: libnccl.so.2 resolves to '${got:-nothing}', not our $lib"
  missing=$(nm -D --undefined-only "$t" | awk '{print $2}' | grep -E '^p?nccl' | sort -u |
            comm -23 - <(echo "$ours") || true)
  [ -z "$missing" ] || fail "$t needs symbols we do not export: $missing"
  echo "ok $(basename "$t"): libnccl.so.2 => $lib, $(nm -D --undefined-only "$t" | grep -cE ' p?nccl') nccl symbols, none undefined"
done
# Smoke run without a GPU: the binary must load our library, ask it for its version and
# stop at its first CUDA call with nccl-tests' own error (no crash, no missing symbol).
if ! nvidia-smi -L > /dev/null 2>&1; then
  first=${targets[0]}
  set +e
  smoke=$(LD_LIBRARY_PATH="$home/lib" timeout 60 "$first" -b 8 -e 8 -g 1 2>&1); rc=$?
  set -e
  grep -q 'nccl-library=23007' <<<"$smoke" || fail "$(basename "$first") did not report our library version: $smoke"
  grep -q 'CUDA failure' <<<"$smoke" && [ "$rc" != 0 ] && [ "$rc" -lt 124 ] ||
    fail "$(basename "$first") without a GPU: expected nccl-tests' CUDA failure, got rc $rc: $smoke"
  echo "ok $(basename "$first") without a GPU: loaded our library (nccl-library=23007), stopped at CUDA: $(grep -m1 'CUDA failure' <<<"$smoke" | sed 's/^[^:]*: //')"
fi
echo "build-nccl-tests: done ($out/bin)"
