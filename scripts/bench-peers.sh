#!/usr/bin/env bash
# Ours vs OpenMPI vs memcpy, side by side in one run (issue 18): installs OpenMPI from
# Debian if missing (the version apt has), builds our library, the nccl-tests binaries,
# the bench driver and the MPI peer (benches/c/mpi_allreduce.c), then runs
# target/release/bench-peers, which builds our side of the minimal C loop
# (benches/c/nccl_allreduce.c, against NVIDIA's nccl.h, fetched with pip on first use),
# prints the busbw table for 2 and 4 ranks and writes docs/perf-peers.md and
# docs/perf-peers.svg.
#
#   scripts/bench-peers.sh [bench-peers options, e.g. --rounds 5 --ranks 2,4]
#
# Takes a few minutes; run it on an otherwise idle machine for figures worth comparing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    echo "bench-peers: installing OpenMPI (openmpi-bin, libopenmpi-dev) from apt" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y openmpi-bin libopenmpi-dev
fi

cargo build --release -p ccl-ffi -p nccl-tests-compat -p benches \
    --bin all_reduce_perf --bin ccl-run --bin bench-peers --lib
mkdir -p target/release
mpicc -O2 -Wall -o target/release/mpi_allreduce benches/c/mpi_allreduce.c

echo "bench-peers: $(mpirun --allow-run-as-root --version 2>/dev/null | head -1)" >&2
exec target/release/bench-peers --mpi-bin target/release/mpi_allreduce \
    --svg docs/perf-peers.svg --md docs/perf-peers.md "$@"
