#!/usr/bin/env bash
# Runs every test of the workspace (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace
cargo nextest run --workspace --no-fail-fast
