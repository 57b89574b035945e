# Sourced by the project's scripts: a private Python under .cache/venv for the pinned PyPI
# wheels (nvcc 13.0, NVIDIA's nccl.h), so that nothing is installed into the system Python,
# which Debian 12 marks "externally managed" (PEP 668). Sets CCLD_PYTHON to the venv's
# python3. The build (kernels/build.rs), the tests and the other scripts use
# .cache/venv/bin/python3 themselves wherever it exists; PATH is left alone, so that
# cargo's build scripts do not rerun when a script is run.
#   source scripts/python-env.sh
_ccld_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CCLD_VENV="$_ccld_root/.cache/venv"
if [ ! -x "$CCLD_VENV/bin/python3" ] || ! "$CCLD_VENV/bin/python3" -m pip --version >/dev/null 2>&1; then
  rm -rf "$CCLD_VENV"
  if ! python3 -m venv "$CCLD_VENV" >/dev/null 2>&1; then
    # Debian ships venv/ensurepip separately.
    echo "python-env: python3 -m venv failed; installing python3-venv (Debian)" >&2
    _sudo=""
    if [ "$(id -u)" != 0 ]; then _sudo=sudo; fi
    DEBIAN_FRONTEND=noninteractive $_sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $_sudo apt-get install -y -qq --no-install-recommends python3-venv
    rm -rf "$CCLD_VENV"
    python3 -m venv "$CCLD_VENV"
  fi
fi
CCLD_PYTHON="$CCLD_VENV/bin/python3"
export CCLD_VENV CCLD_PYTHON
unset _ccld_root _sudo
