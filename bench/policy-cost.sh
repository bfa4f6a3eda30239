#!/usr/bin/env bash
# The cost of each consistency policy: sequential (full-stripe) and 4 KiB
# random write throughput through the array engine (raidkit bench engine,
# members on the RAM disk), for none, bitmap and journal, alternating in
# each round; medians over the rounds and ratios to none.
#
# usage: bench/policy-cost.sh [ROUNDS] [MEMBERS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
N=${2:-5}
SECS=${3:-2}
cargo build --release --quiet
R=$PWD/target/release/raidkit
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for round in $(seq "$ROUNDS"); do
  for policy in none bitmap journal; do
    "$R" bench engine --members "$N" --size 256M --seconds "$SECS" --runs 1 --policy "$policy" \
      | awk -v p="$policy" '$1 ~ /^raid[56]$/ { print p, $1, $2, $NF }' >>"$OUT"
  done
  echo "round $round done" >&2
done
python3 - "$OUT" <<'PY'
import statistics, sys, collections
rows = collections.defaultdict(lambda: ([], []))
for line in open(sys.argv[1]):
    p, level, seq, iops = line.split()
    rows[(p, level)][0].append(float(seq)); rows[(p, level)][1].append(float(iops))
print(f"{'level':6} {'policy':8} {'seq MB/s':>9} {'vs none':>8} {'4K IOPS':>9} {'vs none':>8}")
for level in ("raid5", "raid6"):
    base = rows[("none", level)]
    bs, bi = statistics.median(base[0]), statistics.median(base[1])
    for p in ("none", "bitmap", "journal"):
        s, i = statistics.median(rows[(p, level)][0]), statistics.median(rows[(p, level)][1])
        print(f"{level:6} {p:8} {s:9.0f} {s/bs:8.2f} {i:9.0f} {i/bi:8.2f}")
PY
