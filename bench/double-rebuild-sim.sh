#!/usr/bin/env bash
# A RAID-6 losing two members at once, on simulated disks
# (sim:FILE?bw=..&seek=..): two hot spares, members 1 and 3 failed one
# right after the other (GAP seconds apart), as two disks of one batch
# dying together. Reported: the time from the first failure until the
# array is whole again (`raidkit wait`), against one pass over a member
# at one disk's bandwidth (both rebuilt in one pass take about that; one
# after the other, twice that).
#
# With RAIDKIT_B set to another build's binary, both are measured in
# alternating rounds and the per-round ratio printed (B's time / this
# build's time). Medians over the rounds.
#
# usage: [RAIDKIT=..] [RAIDKIT_B=..] bench/double-rebuild-sim.sh [ROUNDS] [MEMBERS] [MEMBER_SIZE] [BW] [SEEK] [GAP]
#   GAP: seconds between the two failures (default 0)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
N=${2:-6}
SIZE=${3:-256M}
BW=${4:-100M}
SEEK=${5:-8ms}
GAP=${6:-0}
. bench/sim-lib.sh
sim_setup double

# One round with binary $1: prints the seconds from the first add to whole.
round() {
  local R=$1 files=() specs=() i t0 t1
  rm -f "$W"/*.img "$W/ctl"
  for i in $(seq 0 $((N - 1))); do files+=("$W/d$i.img"); done
  "$R" create --level 6 --size "$SIZE" --assume-clean --name sim \
    --spare "$W/s0.img" --spare "$W/s1.img" "${files[@]}" >/dev/null
  for f in "${files[@]}" "$W/s0.img" "$W/s1.img"; do specs+=("$(sim "$f")"); done
  "$R" serve --listen 127.0.0.1:0 --control "$W/ctl" --rebuild-min 0 "${specs[@]}" \
    >"$W/serve.out" 2>"$W/serve.err" &
  PID=$!
  for _ in $(seq 100); do [ -S "$W/ctl" ] && break; sleep 0.1; done
  t0=$(date +%s.%N)
  timeout 60 "$R" fail 1 --control "$W/ctl" >/dev/null
  sleep "$GAP"
  timeout 60 "$R" fail 3 --control "$W/ctl" >/dev/null
  timeout 600 "$R" wait --control "$W/ctl" >/dev/null
  t1=$(date +%s.%N)
  state=$("$R" status --json --control "$W/ctl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  kill "$PID"; wait "$PID" || true; PID=
  [ "$state" = optimal ] || { echo "array $state after the rebuild" >&2; exit 1; }
  python3 -c "print(round($t1 - $t0, 3))"
}

size_bytes=$(python3 -c "import sys; s='$SIZE'; m={'K':2**10,'M':2**20,'G':2**30}; print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))")
bw_bytes=$(python3 -c "import sys; s='$BW'; m={'K':1e3,'M':1e6,'G':1e9}; print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))")
a=() b=()
for r in $(seq "$ROUNDS"); do
  ta=$(round "$R"); a+=("$ta")
  line="round $r: this build ${ta}s"
  if [ -n "${RAIDKIT_B:-}" ]; then
    tb=$(round "$RAIDKIT_B"); b+=("$tb")
    line="$line, B ${tb}s, B/this $(python3 -c "print(round($tb/$ta, 2))")"
  fi
  echo "$line"
done
python3 - "$size_bytes" "$bw_bytes" "${a[*]}" "${b[*]:-}" <<'PY'
import statistics, sys
size, bw = int(sys.argv[1]), float(sys.argv[2])
a = [float(x) for x in sys.argv[3].split()]
b = [float(x) for x in sys.argv[4].split()] if sys.argv[4] else []
one = size / bw  # one pass over a member's whole file at one disk's speed
print(f"one pass at one disk's bandwidth: {one:.2f} s")
print(f"this build: median {statistics.median(a):.2f} s = {statistics.median(a)/one:.2f} x one pass")
if b:
    print(f"B: median {statistics.median(b):.2f} s = {statistics.median(b)/one:.2f} x one pass")
    print(f"B / this build, median of rounds: {statistics.median(x/y for x, y in zip(b, a)):.2f}")
PY
