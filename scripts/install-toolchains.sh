#!/usr/bin/env bash
# Installs the pinned device toolchains the CI compiles the kernels with (no GPU needed):
#   * nvcc 13.0 (+ cudart, crt, cccl headers of the 13.0 line) from NVIDIA's PyPI wheels, into
#     the project's own venv .cache/venv (scripts/python-env.sh; never the system Python),
#     under site-packages/nvidia/cu13/{bin,lib,include}; kernels/build.rs finds it there;
#   * hipcc 5.2 (Debian 12 packages) for the ROCm build (scripts/build-rocm.sh).
# Usage: scripts/install-toolchains.sh [--cuda-only|--hip-only]
# Idempotent: reinstalling the same pinned versions is a no-op for pip and apt.
set -euo pipefail

NVCC_VERSION=13.0.88
CUDART_VERSION=13.0.88
CRT_VERSION=13.0.88
CCCL_VERSION=13.0.85
NVVM_VERSION=13.0.88
HIPCC_DEB=5.2.3-8
HIP_DEB=5.2.3-8
DEVLIBS_DEB=5.2.3-2

want_cuda=1
want_hip=1
case "${1:-}" in
  --cuda-only) want_hip=0 ;;
  --hip-only) want_cuda=0 ;;
  "") ;;
  *) echo "usage: $0 [--cuda-only|--hip-only]" >&2; exit 2 ;;
esac

if [ "$want_cuda" = 1 ]; then
  # shellcheck source=python-env.sh
  source "$(dirname "$0")/python-env.sh"
  "$CCLD_PYTHON" -m pip install --disable-pip-version-check --no-input \
    "nvidia-cuda-nvcc==${NVCC_VERSION}" \
    "nvidia-cuda-runtime==${CUDART_VERSION}" \
    "nvidia-cuda-crt==${CRT_VERSION}" \
    "nvidia-cuda-cccl==${CCCL_VERSION}" \
    "nvidia-nvvm==${NVVM_VERSION}"
  cu13=$("$CCLD_PYTHON" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
  echo "nvcc: ${cu13}/bin/nvcc"
  "${cu13}/bin/nvcc" --version | tail -2
fi

if [ "$want_hip" = 1 ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # Debian 12 (bookworm) ships ROCm 5.2.3; exact package versions pinned.
  $SUDO apt-get install -y -qq --no-install-recommends \
    "hipcc=${HIPCC_DEB}" "libamdhip64-dev=${HIP_DEB}" "rocm-device-libs=${DEVLIBS_DEB}"
  hipcc --version | head -3 || true
fi
