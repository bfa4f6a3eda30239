#!/usr/bin/env bash
# raidkit's parity kernels beside ISA-L (shared/anchors/parity_isal.c), in
# one run, alternating, at k data chunks with 4 KiB chunks (in cache) and
# 1 MiB chunks (from DRAM). Prints medians over ROUNDS and the ratios.
#
# usage: bench/parity-vs-isal.sh [ROUNDS=5] [K=8] [SECONDS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
K=${2:-8}
SECS=${3:-1}
ANCHOR=../shared/anchors/parity_isal.c
[ -f "$ANCHOR" ] || { echo "missing $ANCHOR" >&2; exit 1; }
if ! dpkg-query -W -f='${Status}' libisal-dev 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libisal-dev >/dev/null
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
gcc -O2 -o "$W/parity_isal" "$ANCHOR" -lisal
cargo build --release --quiet
R=target/release/raidkit
for r in $(seq "$ROUNDS"); do
  for c in 4096 1048576; do
    if [ $((r % 2)) -eq 1 ]; then
      "$W/parity_isal" "$K" "$c" "$SECS" | sed 's/^/isal /' >> "$W/out"
      "$R" bench parity --k "$K" --chunk "$c" --seconds "$SECS" 2>/dev/null | sed 's/^/raidkit /' >> "$W/out"
    else
      "$R" bench parity --k "$K" --chunk "$c" --seconds "$SECS" 2>/dev/null | sed 's/^/raidkit /' >> "$W/out"
      "$W/parity_isal" "$K" "$c" "$SECS" | sed 's/^/isal /' >> "$W/out"
    fi
  done
done
python3 - "$W/out" <<'PY'
import sys, statistics
from collections import defaultdict
d = defaultdict(list)
for line in open(sys.argv[1]):
    who, name, k, chunk, gbps = line.split()
    d[(who, name, int(chunk))].append(float(gbps))
med = {key: statistics.median(v) for key, v in d.items()}
for chunk in (4096, 1048576):
    print(f"\nchunk {chunk} bytes (GB/s of data, one core, median of {len(d[('isal','memcpy',chunk)])} runs)")
    print(f"{'kernel':<14}{'ISA-L':>9}{'raidkit':>9}{'ratio':>8}{'raidkit/memcpy':>16}")
    mc = med[("isal", "memcpy", chunk)]
    for name in ("memcpy", "xor_gen", "pq_gen", "rs_recover_2", "pq_rmw"):
        i = med.get(("isal", name, chunk))
        r = med.get(("raidkit", name, chunk))
        row = f"{name:<14}" + (f"{i:>9.2f}" if i else f"{'-':>9}") + (f"{r:>9.2f}" if r else f"{'-':>9}")
        row += f"{r / i:>8.2f}" if (i and r) else f"{'':>8}"
        row += f"{r / mc:>16.2f}" if r else ""
        print(row)
PY
