#!/usr/bin/env bash
# Reshape speed on simulated disks: a RAID-5 (and a RAID-6) of N simulated
# disks (sim:FILE?bw=..&seek=..) grown by one more (`raidkit grow --add`)
# while idle; the reshape's rate per member (each member's data area
# rewritten in the new geometry, per second: what md's sync_speed shows)
# against one disk's bandwidth. Target: at least 0.5 (every member reads
# its old rows and writes its new ones, so 0.5-0.6 is what the disks
# allow). Then the same grow while a client reads and writes at queue
# depth 8 (fio, randrw 4k over NBD): the client's IOPS during the reshape
# beside the reshape's rate, and the client's IOPS with no reshape.
# Several runs, medians reported. With CHUNK=SIZE in the environment the
# change is `raidkit grow --chunk SIZE` instead (from create's default
# chunk, 512K; members and size unchanged, the same rate per member).
# LEVELS="6" measures only those levels; CLIENT=0 skips the runs with a
# client (only the idle rate).
#
# usage: [CHUNK=64K] [LEVELS="5 6"] [CLIENT=0] bench/reshape-sim.sh [RUNS] [MEMBERS] [MEMBER_SIZE] [BW] [SEEK]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
N=${2:-4}
SIZE=${3:-256M}
BW=${4:-100M}
SEEK=${5:-8ms}
. bench/sim-lib.sh
sim_setup reshape
CHUNK=${CHUNK:-}
LEVELS=${LEVELS:-5 6}
CLIENT=${CLIENT:-1}
# change: start the reshape (a member added, or the chunk changed).
change() {
  if [ -n "$CHUNK" ]; then
    "$R" grow --chunk "$CHUNK" --control "$W/ctl" >/dev/null
  else
    "$R" grow --add "$(sim "$W/new.img")" --control "$W/ctl" >/dev/null
  fi
}
bw_bytes=$(python3 -c "import sys; s='$BW'; m={'K':1e3,'M':1e6,'G':1e9}; print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))")

# start LEVEL: a fresh array of N simulated disks, served; sets URI.
start() {
  rm -f "$W"/*.img "$W/ctl"
  files=()
  for i in $(seq 0 $((N - 1))); do files+=("$W/d$i.img"); done
  "$R" create --level "$1" --size "$SIZE" --assume-clean --name sim "${files[@]}" >/dev/null
  specs=()
  for f in "${files[@]}"; do specs+=("$(sim "$f")"); done
  "$R" serve --listen 127.0.0.1:0 --control "$W/ctl" --rebuild-min 0 "${specs[@]}" >"$W/serve.out" 2>"$W/serve.err" &
  PID=$!
  for _ in $(seq 100); do grep -q "listening on" "$W/serve.out" 2>/dev/null && break; sleep 0.1; done
  URI=$(grep -o 'nbd://[^ ]*' "$W/serve.out" | head -1)
  truncate -s "$SIZE" "$W/new.img"
}

stop() { kill "$PID"; wait "$PID" || true; PID=; }

client() { # SECONDS: fio randrw 4k QD8 over NBD; prints IOPS
  timeout 300 fio --name=c --ioengine=nbd --uri="$URI" --rw=randrw --bs=4k --iodepth=8 \
    --size=64m --time_based --runtime="$1" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}

rate_of() { # status JSON on stdin: the reshape's rate per member, bytes/s
  python3 -c '
import json,sys
s=json.load(sys.stdin); r=s["last_recovery"]; n=len(s["members"])
k={"raid5":1,"raid6":2}[s["array"]["level"]]
# array bytes placed / data members = bytes of each member rewritten
print(r["bytes"]/(n-k)/r["seconds"])'
}

seconds_of() { # status JSON on stdin: how long the last reshape took
  python3 -c 'import json,sys; print(json.load(sys.stdin)["last_recovery"]["seconds"])'
}

for level in $LEVELS; do
  rates=(); busy=(); during=(); idle=(); moved=()
  for run in $(seq "$RUNS"); do
    start "$level"
    old_size=$("$R" status --json --control "$W/ctl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["array"]["size"])')
    change
    "$R" wait --control "$W/ctl" >/dev/null
    rate=$("$R" status --json --control "$W/ctl" | rate_of)
    secs=$("$R" status --json --control "$W/ctl" | seconds_of)
    stop
    # The array's data moved per second (its size before the change).
    moved+=("$(python3 -c "print($old_size/$secs)")")
    rates+=("$rate")
    if [ "$CLIENT" = 0 ]; then
      idle+=(0); during+=(0)
      echo "raid$level run $run: idle reshape $(python3 -c "print(round($rate/1e6,1))") MB/s per member"
      continue
    fi
    # With a client: its IOPS alone, then while the array grows.
    start "$level"
    idle+=("$(client 5)")
    change
    during+=("$(client 8)")
    "$R" wait --control "$W/ctl" >/dev/null
    busy+=("$("$R" status --json --control "$W/ctl" | rate_of)")
    stop
    echo "raid$level run $run: idle reshape $(python3 -c "print(round($rate/1e6,1))") MB/s per member; client ${idle[-1]} IOPS alone, ${during[-1]} IOPS during a reshape that then ran at $(python3 -c "print(round(${busy[-1]}/1e6,1))") MB/s per member"
  done
  python3 - "$bw_bytes" "${rates[*]}" "${idle[*]}" "${during[*]}" "${moved[*]}" <<'PY'
import statistics, sys
bw = float(sys.argv[1])
r, i, d, mv = ([float(x) for x in a.split()] for a in sys.argv[2:6])
m = statistics.median(r)
print(f"  idle reshape: median {m/1e6:.1f} MB/s per member (min {min(r)/1e6:.1f}, max {max(r)/1e6:.1f}) = {m/bw:.2f} x one disk's {bw/1e6:.0f} MB/s")
a = statistics.median(mv)
print(f"  the array's data moved: median {a/1e6:.1f} MB/s (min {min(mv)/1e6:.1f}, max {max(mv)/1e6:.1f}) = {a/bw:.2f} x one disk")
if max(i) > 0:
    print(f"  client: median {statistics.median(i):.0f} IOPS alone, {statistics.median(d):.0f} IOPS during the reshape")
PY
done
