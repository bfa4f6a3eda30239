#!/usr/bin/env bash
# Install what the tests need, then run them all.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
cargo test --workspace "$@"
# The parsers a hostile peer or disk reaches, fuzzed for a bounded time.
./scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
