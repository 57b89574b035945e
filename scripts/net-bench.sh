#!/usr/bin/env bash
# The socket transport over veth links, side by side in one run (issue 14): raw TCP of the
# link, our AllReduce on 2 and 4 namespaced hosts, OpenMPI's MPI_Allreduce with its TCP BTL
# on the same hosts. Installs OpenMPI from Debian if missing (the version apt has), builds
# our library, all_reduce_perf, the driver and the MPI peer, then runs target/release/
# net-bench as root, which prints the tables with the ratios and writes docs/perf-net.md.
#
#   scripts/net-bench.sh [net-bench options, e.g. --rounds 3 --max 67108864]
#
# Needs root (network namespaces). Takes several minutes; run it on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
    echo "net-bench: needs root (network namespaces)" >&2
    exit 2
fi
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    echo "net-bench: installing OpenMPI (openmpi-bin, libopenmpi-dev) from apt" >&2
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev
fi
cargo build --release -p ccl-ffi -p nccl-tests-compat -p benches \
    --bin all_reduce_perf --bin net-bench --lib
mkdir -p target/release
mpicc -O2 -Wall -o target/release/mpi_allreduce benches/c/mpi_allreduce.c
echo "net-bench: $(mpirun --allow-run-as-root --version 2>/dev/null | head -1)" >&2
exec target/release/net-bench --mpi-bin target/release/mpi_allreduce --md docs/perf-net.md "$@"
