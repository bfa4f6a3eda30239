#!/usr/bin/env bash
# Scrub rate on idle simulated disks: RAID-5 and RAID-6 of four members on
# the RAM disk, each behind `sim:` (a spinning disk's bandwidth and seek
# time), served idle and scrubbed with `raidkit scrub --wait --json`. The
# rate per member (bytes each member had read, over the scrub's seconds)
# is set against the simulated bandwidth of one member: a scrub that keeps
# every disk streaming reaches it. Levels alternate within each round;
# medians (with min-max) over the rounds.
#
# usage: bench/scrub-sim.sh [ROUNDS] [SIZE] [BW] [SEEK]
#   defaults: 3 rounds, 512M members, bw=150M, seek=8ms
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SIZE=${2:-512M}
BW=${3:-150M}
SEEK=${4:-8ms}
cargo build --release --quiet
R=$PWD/target/release/raidkit
W=$(mktemp -d /dev/shm/raidkit-scrub-sim.XXXXXX)
SERVER=""
cleanup() {
  [ -n "$SERVER" ] && { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }
  rm -rf "$W"
}
trap cleanup EXIT
RES=$W/results.txt
: > "$RES"
for r in $(seq "$ROUNDS"); do
  for level in 5 6; do
    rm -f "$W"/d*.img
    ms=(); sims=()
    for i in 0 1 2 3; do
      truncate -s "$SIZE" "$W/d$i.img"
      ms+=("$W/d$i.img"); sims+=("sim:$W/d$i.img?bw=$BW&seek=$SEEK")
    done
    "$R" create --level "$level" --chunk 64K --name s "${ms[@]}" >/dev/null
    "$R" serve --listen 127.0.0.1:0 --control "$W/ctl" "${sims[@]}" >/dev/null 2>"$W/serve.err" &
    SERVER=$!
    for _ in $(seq 300); do [ -S "$W/ctl" ] && break; sleep 0.1; done
    out=$("$R" scrub --wait --json --control "$W/ctl")
    kill -TERM "$SERVER"; wait "$SERVER"; SERVER=""
    python3 - "$out" "$BW" "$r" "$level" <<'PY' | tee -a "$RES"
import json, sys
v = json.loads(sys.argv[1])
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
bw = sys.argv[2]
bw = float(bw[:-1]) * units[bw[-1]] if bw[-1] in units else float(bw)
rate = v["bytes"] / v["seconds"]
assert v["result"] == "done", v
print(f"round {sys.argv[3]} raid{sys.argv[4]} {v['bytes']} {v['seconds']:.2f} {rate / 1e6:.1f} {rate / bw:.3f}")
PY
  done
done
python3 - "$RES" <<'PY'
import sys, statistics
from collections import defaultdict
d = defaultdict(list)
for line in open(sys.argv[1]):
    _, r, level, b, s, rate, ratio = line.split()
    d[level].append((float(rate), float(ratio)))
print()
print("level   per-member MB/s (min-max)    / one member's bandwidth [>= 0.9]")
for level, v in sorted(d.items()):
    rates = [x[0] for x in v]; ratios = [x[1] for x in v]
    print(f"{level:7} {statistics.median(rates):7.1f} ({min(rates):.1f}-{max(rates):.1f})      {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
PY
