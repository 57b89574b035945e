#!/usr/bin/env bash
# Runs every test of the workspace (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
# Tests talk over loopback only.
export CCLD_BOOTSTRAP_IP=127.0.0.1
cargo build --release --workspace
cargo nextest run --workspace --no-fail-fast
