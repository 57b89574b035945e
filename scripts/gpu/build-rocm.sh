#!/usr/bin/env bash
# Builds target/rocm/librccl.so.1: the same kernel sources as the CUDA build
# (kernels/src/ccl_kernels.cu through kernels/include/ccl_portability.h), compiled by hipcc
# for AMD gfx90a (MI200) and gfx942 (MI300) when this hipcc knows it, plus the thin
# hipStream_t shim (kernels/src/rccl_shim.cpp, header kernels/include/rccl_device.h).
# Then checks the result: soname, exported ABI, and that a C program written against
# rccl_device.h links against it. Nothing runs it (no AMD GPU in CI).
#
# What librccl.so.1 is today: the device half of the library (kernels + device ABI) for
# ROCm. The NCCL C API (ncclAllReduce...) lives in the Rust crates, which do not link the
# HIP objects yet; see docs/device-backend.md.
#
# Needs hipcc 5.2 (scripts/install-toolchains.sh --hip-only). Usage: scripts/gpu/build-rocm.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v hipcc >/dev/null || { echo "build-rocm: hipcc not found (scripts/install-toolchains.sh --hip-only)" >&2; exit 1; }
export HIP_PLATFORM=amd
out=target/rocm
mkdir -p "$out/obj"

# gfx942 needs ROCm >= 5.7 (LLVM 17); Debian 12's hipcc 5.2 (LLVM 15) lacks it and gets
# gfx90a only. Probe each target with a one-kernel translation unit.
archs=()
printf '#include <hip/hip_runtime.h>\n__global__ void k(int *x) { *x = 1; }\n' > "$out/obj/probe.hip"
for a in gfx90a gfx942; do
  if hipcc --offload-arch="$a" -c "$out/obj/probe.hip" -o "$out/obj/probe.o" 2>/dev/null; then
    archs+=("--offload-arch=$a")
  else
    echo "build-rocm: warning: this hipcc cannot target $a; skipped" >&2
  fi
done
[ "${#archs[@]}" -gt 0 ] || { echo "build-rocm: hipcc supports none of gfx90a, gfx942" >&2; exit 1; }

flags=(-O3 -fPIC -std=c++17 -Ikernels/include "${archs[@]}")
hipcc "${flags[@]}" -x hip -c kernels/src/ccl_kernels.cu -o "$out/obj/ccl_kernels.o"
hipcc "${flags[@]}" -c kernels/src/rccl_shim.cpp -o "$out/obj/rccl_shim.o"
hipcc -shared -fPIC "${archs[@]}" -o "$out/librccl.so.1" -Wl,-soname,librccl.so.1 \
  "$out/obj/ccl_kernels.o" "$out/obj/rccl_shim.o" -lamdhip64
ln -sf librccl.so.1 "$out/librccl.so"

# Checks.
soname=$(readelf -d "$out/librccl.so.1" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = librccl.so.1 ] || { echo "build-rocm: soname is '$soname'" >&2; exit 1; }
syms=$(nm -D --defined-only "$out/librccl.so.1" | awk '{print $3}')
for f in $(sed -n 's/^[a-z_0-9 *]*[ *]\(ccl_dev_[a-z_0-9]*\)(.*/\1/p; s/^[a-z_0-9 *]*[ *]\(rccl_dev_[a-z_0-9]*\)(.*/\1/p' \
    kernels/include/ccl_device.h kernels/include/rccl_device.h); do
  grep -qx "$f" <<<"$syms" || { echo "build-rocm: $f is not exported" >&2; exit 1; }
done
cat > "$out/obj/link_check.c" <<'C'
#include "rccl_device.h"
int main(void) {
  int32_t n = 0;
  /* Only linked, never run here: there is no AMD GPU. */
  return ccl_dev_device_count(&n) == CCL_DEV_OK && rccl_dev_launch_plan(0, (hipStream_t)0) == 0 ? 0 : 1;
}
C
gcc -D__HIP_PLATFORM_AMD__ -Ikernels/include -I/usr/include "$out/obj/link_check.c" \
  -L"$out" -lrccl -o "$out/obj/link_check"
echo "build-rocm: $out/librccl.so.1 (${archs[*]}), $(wc -w <<<"$syms") exported symbols, link check ok"
