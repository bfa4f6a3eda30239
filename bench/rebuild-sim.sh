#!/usr/bin/env bash
# Rebuild speed on simulated disks: a RAID-5 (and a RAID-6) of N simulated
# disks (sim:FILE?bw=..&seek=..), one member failed and a new simulated disk
# added; the idle rebuild's rate is reported against one disk's bandwidth
# (the target is at least 90%: the new disk is written at its full speed
# while the others are read in parallel). Several runs, medians reported.
#
# usage: [REBUILD_MAX=RATE] bench/rebuild-sim.sh [RUNS] [MEMBERS] [MEMBER_SIZE] [BW] [SEEK]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
N=${2:-5}
SIZE=${3:-256M}
BW=${4:-100M}
SEEK=${5:-8ms}
# The idle rebuild limit (raidkit speed --rebuild-max); 0: none.
REBUILD_MAX=${REBUILD_MAX:-0}
. bench/sim-lib.sh
sim_setup rebuild
bw_bytes=$(python3 -c "import sys; s='$BW'; m={'K':1e3,'M':1e6,'G':1e9}; print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))")

for level in 5 6; do
  rates=()
  for run in $(seq "$RUNS"); do
    rm -f "$W"/*.img
    files=()
    for i in $(seq 0 $((N - 1))); do files+=("$W/d$i.img"); done
    "$R" create --level "$level" --size "$SIZE" --assume-clean --name sim "${files[@]}" >/dev/null
    specs=()
    for f in "${files[@]}"; do specs+=("$(sim "$f")"); done
    "$R" serve --listen 127.0.0.1:0 --control "$W/ctl" --rebuild-min 0 --rebuild-max "$REBUILD_MAX" "${specs[@]}" >"$W/serve.out" 2>"$W/serve.err" &
    PID=$!
    for _ in $(seq 100); do [ -S "$W/ctl" ] && break; sleep 0.1; done
    "$R" fail 1 --control "$W/ctl" >/dev/null
    "$R" remove 1 --control "$W/ctl" >/dev/null
    truncate -s "$SIZE" "$W/new.img"
    "$R" add "$(sim "$W/new.img")" --control "$W/ctl" >/dev/null
    "$R" wait --control "$W/ctl" >/dev/null
    json=$("$R" status --json --control "$W/ctl")
    kill "$PID"; wait "$PID" || true; PID=
    rate=$(echo "$json" | python3 -c 'import json,sys; r=json.load(sys.stdin)["last_recovery"]; print(r["bytes"]/r["seconds"])')
    echo "raid$level run $run: rebuilt $(echo "$json" | python3 -c 'import json,sys; r=json.load(sys.stdin)["last_recovery"]; print(r["bytes"], "bytes in", round(r["seconds"],2), "s")') = $(python3 -c "print(round($rate/1e6,1))") MB/s"
    rates+=("$rate")
    rm -f "$W/new.img"
  done
  python3 - "$bw_bytes" "${rates[@]}" <<'PY'
import statistics, sys
bw = float(sys.argv[1]); r = sorted(float(x) for x in sys.argv[2:])
print(f"  median {statistics.median(r)/1e6:.1f} MB/s (min {r[0]/1e6:.1f}, max {r[-1]/1e6:.1f}) = {statistics.median(r)/bw:.2f} x one disk's {bw/1e6:.0f} MB/s")
PY
done
