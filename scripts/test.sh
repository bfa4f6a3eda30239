#!/usr/bin/env bash
# Install what the tests need, then run them all.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cargo test --workspace "$@"
