#!/bin/sh
# Runs a job over "hosts" made of network namespaces on this machine (needs root and
# iproute2): HOSTS namespaces joined by a bridge in a namespace of its own (10.233.N.h+1/24,
# nothing attached to this machine's network), RANKS_PER_HOST ranks on each, every host
# with its own hostname (ccldhostH) and a private /dev/shm, so that ranks of different
# hosts can only talk over the socket transport. The ranks get the mpirun-style variables
# OMPI_COMM_WORLD_SIZE/_RANK/_LOCAL_RANK, their host's bootstrap address
# (CCLD_BOOTSTRAP_IP) and a rendezvous file for the unique id (NCCL_TESTS_UID_FILE), as
# nccl-tests and scripts that read those expect. Everything is removed at exit.
#
#   scripts/netns-job.sh 2 2 target/release/all_reduce_perf -b 8 -e 64M -f 4 -c 1
#
# LD_LIBRARY_PATH defaults to target/release (our libnccl.so.2). The exit status is the
# last failing rank's.
set -eu
if [ $# -lt 3 ]; then
    echo "usage: $0 HOSTS RANKS_PER_HOST COMMAND [ARGS...]" >&2
    exit 2
fi
hosts=$1 per=$2
shift 2
case "$hosts$per" in *[!0-9]*) echo "$0: HOSTS and RANKS_PER_HOST must be numbers" >&2; exit 2 ;; esac
if [ "$hosts" -lt 1 ] || [ "$hosts" -gt 200 ] || [ "$per" -lt 1 ]; then
    echo "$0: 1..200 hosts, at least 1 rank per host" >&2
    exit 2
fi
if [ "$(id -u)" != 0 ]; then
    echo "$0: needs root (network namespaces); without it, NCCL_HOSTID per process splits ranks into hosts over loopback" >&2
    exit 2
fi
cmd=$(command -v "$1") || { echo "$0: $1: not found" >&2; exit 2; }
shift
: "${LD_LIBRARY_PATH:=$(pwd)/target/release}"
export LD_LIBRARY_PATH
tag="cj$$"
net=$(( $$ % 250 ))
tmp=$(mktemp -d)
cleanup() {
    for h in $(seq 0 $((hosts - 1))); do ip netns del "${tag}h$h" 2>/dev/null || true; done
    ip netns del "${tag}b" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
ip netns add "${tag}b"
ip -n "${tag}b" link add br0 type bridge
ip -n "${tag}b" link set br0 up
for h in $(seq 0 $((hosts - 1))); do
    ns="${tag}h$h"
    ip netns add "$ns"
    ip -n "${tag}b" link add "${tag}w$h" type veth peer name "${tag}v$h"
    ip -n "${tag}b" link set "${tag}v$h" netns "$ns"
    ip -n "${tag}b" link set "${tag}w$h" master br0 up
    ip -n "$ns" addr add "10.233.$net.$((h + 1))/24" dev "${tag}v$h"
    ip -n "$ns" link set "${tag}v$h" up
    ip -n "$ns" link set lo up
done
total=$((hosts * per))
pids=""
for h in $(seq 0 $((hosts - 1))); do
    ip netns exec "${tag}h$h" unshare --mount --uts --propagation private sh -c '
        hostname "ccldhost$1" && mount -t tmpfs -o mode=1777 tmpfs /dev/shm || exit 1
        h=$1 per=$2 total=$3 uid=$4 ip=$5; shift 5
        rc=0; pids=""
        for i in $(seq 0 $((per - 1))); do
            OMPI_COMM_WORLD_SIZE=$total OMPI_COMM_WORLD_RANK=$((h * per + i)) \
            OMPI_COMM_WORLD_LOCAL_RANK=$i NCCL_TESTS_UID_FILE=$uid CCLD_BOOTSTRAP_IP=$ip \
                "$@" &
            pids="$pids $!"
        done
        for p in $pids; do wait "$p" || rc=$?; done
        exit $rc' sh "$h" "$per" "$total" "$tmp/uid" "10.233.$net.$((h + 1))" "$cmd" "$@" &
    pids="$pids $!"
done
rc=0
for p in $pids; do wait "$p" || rc=$?; done
exit $rc
