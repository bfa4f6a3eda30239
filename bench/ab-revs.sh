#!/usr/bin/env bash
# Two revisions of raidkit side by side: builds each (in a scratch git
# worktree, its own target directory) and runs `raidkit bench engine` with
# the two binaries alternating, round after round, so that both see the same
# machine. Prints each round's figures and the medians of each, and the
# ratio B/A of the medians.
#
# usage: bench/ab-revs.sh REV_A REV_B [ROUNDS] [-- ENGINE_ARGS...]
#   e.g. bench/ab-revs.sh HEAD~1 HEAD 5 -- --members 4 --size 128M --dir /var/tmp
# A revision given as the path of a raidkit binary is used as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,9p "$0" >&2; exit 2; }
A=$1 B=$2; shift 2
ROUNDS=5
if [ $# -gt 0 ] && [ "$1" != "--" ]; then ROUNDS=$1; shift; fi
[ "${1:-}" = "--" ] && shift
ENGINE_ARGS=("$@")
[ ${#ENGINE_ARGS[@]} -gt 0 ] || ENGINE_ARGS=(--members 4 --size 128M)
W=$(mktemp -d /var/tmp/raidkit-ab.XXXXXX)
cleanup() {
  for x in a b; do git worktree remove --force "$W/$x" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT
name() { if [ -x "$1" ] && [ -f "$1" ]; then echo "$1"; else echo "$1 ($(git rev-parse --short "$1"))"; fi; }
for x in a b; do
  rev=$A; [ $x = b ] && rev=$B
  mkdir -p "$W/$x/target/release"
  if [ -x "$rev" ] && [ -f "$rev" ]; then
    ln -s "$(realpath "$rev")" "$W/$x/target/release/raidkit"
    continue
  fi
  rmdir "$W/$x/target/release" "$W/$x/target" "$W/$x"
  git worktree add -q --detach "$W/$x" "$rev"
  (cd "$W/$x" && CARGO_TARGET_DIR="$W/$x/target" cargo build --release -q -p raidkit)
done
echo "A = $(name "$A"), B = $(name "$B"); bench engine ${ENGINE_ARGS[*]}"
for r in $(seq "$ROUNDS"); do
  for x in a b; do
    "$W/$x/target/release/raidkit" bench engine --runs 1 "${ENGINE_ARGS[@]}" \
      | awk -v who="$x" -v r="$r" '/^raid|^linear/ {print who, r, $1, $2, $NF}'
  done
done | tee "$W/rounds.txt"
python3 - "$W/rounds.txt" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
levels = sorted({r[2] for r in rows}, key=lambda l: [r[2] for r in rows].index(l))
print(f"{'level':8} {'A seq MB/s':>11} {'B seq MB/s':>11} {'B/A':>6} {'A 4K IOPS':>11} {'B 4K IOPS':>11} {'B/A':>6}")
for lv in levels:
    med = lambda who, col: statistics.median(float(r[col]) for r in rows if r[0] == who and r[2] == lv)
    sa, sb, ia, ib = med("a", 3), med("b", 3), med("a", 4), med("b", 4)
    print(f"{lv:8} {sa:11.0f} {sb:11.0f} {sb/sa:6.2f} {ia:11.0f} {ib:11.0f} {ib/ia:6.2f}")
PY
