#!/usr/bin/env bash
# An array whose members are on other hosts, bound by their links: six
# storage hosts (network namespaces, each `raidkit export` of a file on
# the RAM disk, so that the link and not the disk is the bound), each
# joined to the head by a veth pair rate-limited in both directions with a
# token bucket (tc tbf) of RATE; the head serves a RAID-6 of the six
# nbd:// members on loopback, and fio (nbd engine) measures through it:
#   - 1 MiB sequential write: each stripe of 4 data chunks puts 6 chunks on
#     the links, so the bound is 4 x the link rate;
#   - 1 MiB sequential read: every member holds data, so 6 x the link rate;
#   - 4 KiB random read at QD32 of one remote member, as an array member
#     (`raidkit bench` through raidkit's own NBD client) and read directly
#     by fio (nbd engine) over the same link: what the client costs.
# Medians (with min-max) of ROUNDS rounds, and the ratios.
#
# usage: [RAIDKIT=path/to/raidkit] [CHUNK=256K] [POLICY=journal]
#        bench/hosts.sh [ROUNDS] [RATE_MBIT] [SIZE]
#   ROUNDS (default 3), RATE_MBIT per link (default 400), SIZE written
#   and read per round (default 512M). Needs root (namespaces, tc), fio.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
RATE=${2:-400}
SIZE=${3:-512M}
# 256K chunks: a 1 MiB write is one full stripe of four data chunks.
CHUNK=${CHUNK:-256K}
POLICY=${POLICY:-journal}
[ "$(id -u)" -eq 0 ] || { echo "hosts.sh: network namespaces need root" >&2; exit 1; }
./scripts/deps.sh
if [ -z "${RAIDKIT:-}" ]; then
  cargo build --release --quiet
  RAIDKIT=${CARGO_TARGET_DIR:-$PWD/target}/release/raidkit
fi
R=$RAIDKIT
P=rkb$$
NET=$((150 + $$ % 50))
W=$(mktemp -d /dev/shm/raidkit-hosts.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  for i in 0 1 2 3 4 5; do
    timeout 10 ip link del "${P}v$i" 2>/dev/null || true
    timeout 10 ip netns del "${P}n$i" 2>/dev/null || true
  done
  rm -rf "$W"
}
trap cleanup EXIT
MEMBERS=()
for i in 0 1 2 3 4 5; do
  ns=${P}n$i; here=${P}v$i; there=${P}p$i
  ip netns add "$ns"
  ip link add "$here" type veth peer name "$there"
  ip link set "$there" netns "$ns"
  ip addr add "10.$NET.$i.1/24" dev "$here"; ip link set "$here" up
  ip -n "$ns" addr add "10.$NET.$i.2/24" dev "$there"
  ip -n "$ns" link set "$there" up; ip -n "$ns" link set lo up
  # The link's rate, both ways (to the host: writes; from it: reads).
  tc qdisc add dev "$here" root tbf rate "${RATE}mbit" burst 256k latency 200ms
  ip netns exec "$ns" tc qdisc add dev "$there" root tbf rate "${RATE}mbit" burst 256k latency 200ms
  truncate -s 1200M "$W/d$i.img"
  ip netns exec "$ns" "$R" export --listen "10.$NET.$i.2:10809" --name "d$i" "$W/d$i.img" >/dev/null 2>&1 &
  PIDS+=($!)
  MEMBERS+=("nbd://10.$NET.$i.2:10809/d$i")
done
for m in "${MEMBERS[@]}"; do
  for _ in $(seq 100); do timeout 5 nbdinfo --size "$m" >/dev/null 2>&1 && break; sleep 0.1; done
done
"$R" create --level 6 --chunk "$CHUNK" --consistency-policy "$POLICY" --size 1100M --assume-clean \
  --force "${MEMBERS[@]}" >/dev/null
"$R" serve --listen 127.0.0.1:0 --control "$W/c.ctl" "${MEMBERS[@]}" >"$W/serve.out" 2>"$W/serve.log" &
PIDS+=($!)
for _ in $(seq 100); do grep -q "listening on nbd://" "$W/serve.out" 2>/dev/null && break; sleep 0.1; done
URI=$(grep "listening on" "$W/serve.out" | grep -o "nbd://[^ ]*" | head -1)

mbs() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); j=d['jobs'][0]; print(round((j['write']['bw_bytes']+j['read']['bw_bytes'])/1e6,1))" "$1"; }
iops() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); j=d['jobs'][0]; print(round(j['read']['iops']))" "$1"; }
declare -A RES
for r in $(seq "$ROUNDS"); do
  timeout 600 fio --output-format=json --output="$W/w.json" --name=w --ioengine=nbd --uri="$URI" \
    --rw=write --bs=1M --iodepth=16 --size="$SIZE" >/dev/null
  timeout 600 fio --output-format=json --output="$W/r.json" --name=r --ioengine=nbd --uri="$URI" \
    --rw=read --bs=1M --iodepth=16 --size="$SIZE" >/dev/null
  # One member over its link: directly, and through raidkit's client.
  timeout 120 fio --output-format=json --output="$W/d.json" --name=d --ioengine=nbd \
    --uri="${MEMBERS[0]}" --rw=randread --bs=4k --iodepth=32 --time_based --runtime=10 \
    --size=1G >/dev/null
  c=$(timeout 300 "$R" bench --json --tests randread_4k --qd 32 --runs 1 --seconds 10 --size 1G \
    "${MEMBERS[0]}" 2>/dev/null | python3 -c "
import json, statistics, sys
d = json.load(sys.stdin)
v = [t['value'] for t in d['results'] if t['test'] == 'randread_4k' and t.get('qd') == 32]
print(round(statistics.median(v)) if v else 0)" || echo 0)
  RES[write]+="$(mbs "$W/w.json") "; RES[read]+="$(mbs "$W/r.json") "
  RES[direct]+="$(iops "$W/d.json") "; RES[client]+="$c "
  echo "round $r: write $(mbs "$W/w.json") MB/s, read $(mbs "$W/r.json") MB/s, one member 4K QD32: fio direct $(iops "$W/d.json") IOPS, raidkit client $c IOPS"
done
med() { python3 -c "import statistics,sys; v=[float(x) for x in sys.argv[1:]]; print(f'{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})')" $1; }
link=$(python3 -c "print(round($RATE*1e6/8/1e6,1))")
echo
echo "link rate ${RATE} Mbit/s = $link MB/s per host, six hosts, RAID-6, chunk $CHUNK, policy $POLICY"
echo "1M sequential write: $(med "${RES[write]}") MB/s; bound 4 x link = $(python3 -c "print(round(4*$link,1))") MB/s; ratio $(python3 -c "import statistics; print(round(statistics.median([float(x) for x in '${RES[write]}'.split()])/(4*$link),2))")"
echo "1M sequential read:  $(med "${RES[read]}") MB/s; bound 6 x link = $(python3 -c "print(round(6*$link,1))") MB/s; ratio $(python3 -c "import statistics; print(round(statistics.median([float(x) for x in '${RES[read]}'.split()])/(6*$link),2))")"
echo "4K random read QD32, one remote member: raidkit client $(med "${RES[client]}") IOPS vs fio direct $(med "${RES[direct]}") IOPS; ratio $(python3 -c "import statistics; a=statistics.median([float(x) for x in '${RES[client]}'.split()]); b=statistics.median([float(x) for x in '${RES[direct]}'.split()]); print(round(a/b,2) if b else 'n/a')")"
