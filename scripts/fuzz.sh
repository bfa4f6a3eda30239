#!/usr/bin/env bash
# Fuzz the parsers a hostile peer or disk reaches, each for a bounded time,
# on the stable toolchain: libFuzzer (libfuzzer-sys) with the coverage
# instrumentation cargo-fuzz would ask for, given as stable codegen options
# (and --target, so that build scripts are not instrumented). The corpora in
# fuzz/corpus/ seed each run; what a run finds stays in its own directory.
# A crash fails the run and leaves its input in fuzz/artifacts/.
#   scripts/fuzz.sh [SECONDS per target, default 20] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-20}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(nbd_options nbd_requests nbd_handshake nbd_client superblock)
triple=$(rustc -vV | sed -n 's/^host: //p')
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/../target/fuzz}
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions" \
  cargo build -q --release --target "$triple" $(printf -- '--bin %s ' "${targets[@]}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p artifacts
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" "corpus/$t"
  echo "fuzz: $t for ${secs}s"
  timeout $((secs + 60)) "$CARGO_TARGET_DIR/$triple/release/$t" \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="artifacts/$t-" "$work/$t" "corpus/$t" 2>"$work/$t.log" || {
      tail -40 "$work/$t.log" >&2
      echo "fuzz: $t FAILED (input in fuzz/artifacts/)" >&2
      exit 1
    }
  grep -E "stat::number_of_executed_units|stat::new_units_added" "$work/$t.log" | tr '\n' ' '
  echo
done
