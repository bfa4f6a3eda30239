#!/usr/bin/env bash
# What a throttled rebuild costs a client: a RAID-6 of six members served
# over NBD, fio (ioengine=nbd) doing 4 KiB random reads at queue depth 1,
# first with the array idle, then while one member is rebuilt at RATE (the
# rebuild's busy and idle limits both), round after round (each round
# rebuilds the next member onto a new file). Prints each round's IOPS and
# p99 latency, the medians, the ratio rebuilding/idle, and the rebuild rate
# reached. The array is checked offline at the end.
#
# usage: bench/rebuild-impact.sh [RATE] [ROUNDS] [DIR] [MEMBER_SIZE]
#   e.g. bench/rebuild-impact.sh 2M 3 /dev/shm 128M
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-2M} ROUNDS=${2:-3} DIR=${3:-/dev/shm} SIZE=${4:-128M}
SECS=${SECS:-8}
B=$PWD/target/release/raidkit
[ -x "$B" ] || cargo build --release -q
for t in fio python3; do command -v $t >/dev/null || { echo "needs $t" >&2; exit 2; }; done
W=$(mktemp -d "$DIR/raidkit-rebuild-impact.XXXXXX")
PID=
cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null && sleep 0.5
  rm -rf "$W"
}
trap cleanup EXIT
cd "$W"
"$B" create --level 6 --size "$SIZE" --chunk 64K d0 d1 d2 d3 d4 d5 >/dev/null 2>&1
"$B" serve --daemon --listen 127.0.0.1:0 --control "$W/ctl" \
  --rebuild-min "$RATE" --rebuild-max "$RATE" d0 d1 d2 d3 d4 d5 >log 2>&1
PID=$(sed -n 's/.*in the background (PID \([0-9]*\)).*/\1/p' log)
URI=$(grep -o "nbd://[^ ']*" log | head -1)
cat >rr.fio <<EOF
[rr]
ioengine=nbd
uri=$URI
rw=randread
bs=4k
iodepth=1
time_based=1
runtime=$SECS
EOF
# "IOPS P99_US" of one fio run (its JSON follows fio's NBD notice).
fio_run() {
  timeout $((SECS + 30)) fio --output-format=json rr.fio 2>/dev/null | sed -n '/^{/,$p' |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]["read"]; print(round(j["iops"]), round(j["clat_ns"]["percentile"]["99.000000"]/1000))'
}
members=(d0 d1 d2 d3 d4 d5)
idle=() busy=() rates=()
for ((r = 0; r < ROUNDS; r++)); do
  read -r iops p99 < <(fio_run)
  idle+=("$iops")
  role=$((r % 6)) new="n$r"
  truncate -s "$SIZE" "$new"
  "$B" fail --control ctl "$W/${members[$role]}" >/dev/null
  "$B" remove --control ctl "$W/${members[$role]}" >/dev/null
  rm -f "${members[$role]}"
  "$B" add --control ctl "$W/$new" >/dev/null
  members[$role]=$new
  read -r biops bp99 < <(fio_run)
  busy+=("$biops")
  rate=$("$B" status --control ctl --json | python3 -c 'import json,sys; r=json.load(sys.stdin).get("recovery"); print(round(r["rate"]/2**20,2) if r else "ended")')
  rates+=("$rate")
  echo "round $((r + 1)): idle $iops IOPS (p99 ${p99} us), rebuilding at $RATE: $biops IOPS (p99 ${bp99} us), rebuild at ${rate} MiB/s"
  "$B" speed --control ctl --rebuild-min 0 --rebuild-max 0 >/dev/null
  timeout 600 "$B" wait --control ctl >/dev/null 2>&1
  "$B" speed --control ctl --rebuild-min "$RATE" --rebuild-max "$RATE" >/dev/null
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
mi=$(med "${idle[@]}") mb=$(med "${busy[@]}")
echo "median: idle $mi IOPS, rebuilding $mb IOPS, ratio $(awk -v a="$mb" -v b="$mi" 'BEGIN {printf "%.2f", a/b}')"
"$B" stop --control ctl >/dev/null
PID=
timeout 120 "$B" check "${members[@]}"
