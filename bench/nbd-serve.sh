#!/usr/bin/env bash
# NBD serving performance: raidkit (a linear array of one RAM-disk member)
# against nbdkit's file plugin and qemu-nbd serving a plain RAM-disk file of
# the same size, with the same fio jobs (ioengine=nbd) alternating in one
# run; then a RAID-5 of four RAM-disk members against the one-member figure.
# A second, identical raidkit export runs in the same rotation as a control:
# its ratio to the first shows how far apart two identical servers measure
# on this machine, the noise any other ratio has to be read against.
#
# With HTTP=1, the control export serves metrics over HTTP (serve --http)
# and is scraped every second: its ratio is the cost of metrics.
#
# With RAIDKIT_B=PATH, the control export is served by that other raidkit
# binary (another revision, built elsewhere): its ratio to the first is then
# that revision against this one, measured in the same rotation.
#
# QDS="1 8 32" runs every job at each of those queue depths (default: 32
# alone); a job is then named with its depth (seqread_1m_qd1). The seeds'
# own tests are a single dd-style stream at depth 1.
#
# usage: [QDS="1 8 32"] bench/nbd-serve.sh [ROUNDS] [SECONDS_PER_JOB]
# Prints one line per measurement and a table of medians (with min-max).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
SECS=${2:-5}
./scripts/deps.sh
cargo build --release --quiet
R=$PWD/target/release/raidkit
W=$(mktemp -d /dev/shm/raidkit-bench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do nbdinfo --size "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "server at $1 did not come up" >&2; exit 1; }

# raidkit: linear array of one 1 GiB member (and the control, another).
"$R" create --level linear --size 1G --name one "$W/one.img" >/dev/null
"$R" create --level linear --size 1G --name again "$W/again.img" >/dev/null
SIZE=$("$R" detail --json "$W/one.img" | python3 -c 'import json,sys; print(json.load(sys.stdin)["size"])')
# RAID-5 of four members, each as big as the single one.
"$R" create --level 5 --size 1G --name r5 "$W"/r5-{0,1,2,3}.img >/dev/null
# The plain file for nbdkit and qemu-nbd.
truncate -s "$SIZE" "$W/plain.img"
# Give every file its RAM in turns, 1 MiB at a time (fallocate: contents
# unchanged). On this machine (a VM whose balloon takes freed pages back),
# RAM allocated in one stretch can copy about 9% slower than the rest, and
# which file gets it depends on what was freed before. Measured with three
# 512 MiB tmpfs files filled one after the other: copying through one of
# them cost 227 us/MiB against 208 and 206 (another time 216 against 205 and
# 204); allocated 1 MiB in turn, 201, 199 and 204. Filled one after the
# other, a server lost 5-7% of its throughput to the others by this alone.
python3 - "$W"/one.img "$W"/again.img "$W"/plain.img "$W"/r5-{0,1,2,3}.img <<'PY'
import os, sys
fds = [os.open(p, os.O_RDWR) for p in sys.argv[1:]]
sizes = [os.fstat(fd).st_size for fd in fds]
step = 1 << 20
for off in range(0, max(sizes), step):
    for fd, size in zip(fds, sizes):
        if off < size:
            os.posix_fallocate(fd, off, min(step, size - off))
PY

P1=$(free_port); "$R" serve --listen 127.0.0.1:$P1 --control "$W/c1" "$W/one.img" >/dev/null 2>&1 & PIDS+=($!)
P2=$(free_port); "$R" serve --listen 127.0.0.1:$P2 --control "$W/c2" "$W"/r5-{0,1,2,3}.img >/dev/null 2>&1 & PIDS+=($!)
P3=$(free_port); nbdkit -f -i 127.0.0.1 -p $P3 file file="$W/plain.img" & PIDS+=($!)
# HTTP=1: the control export serves metrics (--http) and is scraped every
# second meanwhile, so its ratio to the first is the cost of metrics.
B_HTTP=()
if [ "${HTTP:-0}" = 1 ]; then PH=$(free_port); B_HTTP=(--http=127.0.0.1:$PH); fi
P5=$(free_port); "${RAIDKIT_B:-$R}" serve --listen 127.0.0.1:$P5 --control "$W/c5" "${B_HTTP[@]}" "$W/again.img" >/dev/null 2>&1 & PIDS+=($!)
if [ "${HTTP:-0}" = 1 ]; then
  ( while sleep 1; do curl -sf -o /dev/null "http://127.0.0.1:$PH/metrics" || true; done ) & PIDS+=($!)
fi
P4=$(free_port); qemu-nbd -f raw -b 127.0.0.1 -p $P4 -t -e 8 "$W/plain.img" & PIDS+=($!)
declare -A URI=(
  [raidkit]="nbd://127.0.0.1:$P1/"
  [raidkit-raid5x4]="nbd://127.0.0.1:$P2/"
  [raidkit-control]="nbd://127.0.0.1:$P5/"
  [nbdkit-file]="nbd://127.0.0.1:$P3/"
  [qemu-nbd]="nbd://127.0.0.1:$P4/"
)
for s in "${!URI[@]}"; do wait_port "${URI[$s]}"; done
# Fill the exports once so reads do not hit holes.
for s in raidkit raidkit-raid5x4 raidkit-control nbdkit-file; do
  fio --name=fill --ioengine=nbd --uri="${URI[$s]}" --rw=write --bs=1M --iodepth=8 --size=512M >/dev/null
done
fio --name=fill --ioengine=nbd --uri="${URI[qemu-nbd]}" --rw=write --bs=1M --iodepth=8 --size=512M >/dev/null

run() { # server job -> value (IOPS or MB/s)
  local uri=$1 job=$2 rw bs metric qd=32
  [[ $job == *_qd* ]] && qd=${job##*_qd}
  case ${job%_qd*} in
    randread_4k)  rw=randread;  bs=4k; metric=iops ;;
    randwrite_4k) rw=randwrite; bs=4k; metric=iops ;;
    seqread_1m)   rw=read;      bs=1M; metric=bw ;;
    seqwrite_1m)  rw=write;     bs=1M; metric=bw ;;
  esac
  fio --name=b --ioengine=nbd --uri="$uri" --rw=$rw --bs=$bs --iodepth="$qd" --size=512M \
      --time_based --runtime="$SECS" --ramp_time=1 --output-format=json --output="$W/out.json" >/dev/null
  python3 - "$W/out.json" "$rw" "$metric" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = "read" if "read" in sys.argv[2] else "write"
v = j[side]["iops"] if sys.argv[3] == "iops" else j[side]["bw_bytes"] / 1e6
print(f"{v:.0f}")
PY
}

QDS=${QDS:-32}
JOBS=()
for qd in $QDS; do
  if [ "$QDS" = 32 ]; then
    # The names of runs before QDS: depth 32 said only for 4 KiB jobs.
    JOBS+=(randread_4k_qd32 randwrite_4k_qd32 seqread_1m seqwrite_1m)
  else
    JOBS+=("randread_4k_qd$qd" "randwrite_4k_qd$qd" "seqread_1m_qd$qd" "seqwrite_1m_qd$qd")
  fi
done
export JOB_LIST="${JOBS[*]}"
SERVERS=(raidkit nbdkit-file qemu-nbd raidkit-raid5x4 raidkit-control)
RES="$W/results.txt"
: > "$RES"
for r in $(seq "$ROUNDS"); do
  # Rotate the order each round so that no server always runs first (or
  # always right after the RAID-5 one).
  ORDER=("${SERVERS[@]:$(( (r - 1) % ${#SERVERS[@]} ))}" "${SERVERS[@]:0:$(( (r - 1) % ${#SERVERS[@]} ))}")
  for job in "${JOBS[@]}"; do
    for s in "${ORDER[@]}"; do
      [ "$s" = raidkit-raid5x4 ] && [[ $job != seq* ]] && continue
      v=$(run "${URI[$s]}" "$job")
      echo "round $r $job $s $v" | tee -a "$RES"
    done
  done
done

python3 - "$RES" <<'PY'
import os, sys, statistics
from collections import defaultdict
d = defaultdict(list)
by_round = defaultdict(dict)
for line in open(sys.argv[1]):
    _, r, job, srv, v = line.split()
    d[(job, srv)].append(float(v))
    by_round[(job, r)][srv] = float(v)
jobs = os.environ["JOB_LIST"].split()
srvs = ["raidkit", "nbdkit-file", "qemu-nbd", "raidkit-raid5x4"]
med = {k: statistics.median(v) for k, v in d.items()}
print()
print(f"{'job (IOPS or MB/s)':<20}" + "".join(f"{s:>22}" for s in srvs) + f"{'raidkit/best':>14}{'paired':>8}")
for j in jobs:
    row = f"{j:<20}"
    for s in srvs:
        if (j, s) in d:
            v = d[(j, s)]
            row += f"{med[(j, s)]:>10.0f} ({min(v):.0f}-{max(v):.0f})".rjust(22)
        else:
            row += f"{'-':>22}"
    best = max(med[(j, "nbdkit-file")], med[(j, "qemu-nbd")])
    row += f"{med[(j, 'raidkit')] / best:>14.2f}"
    # The median of each round's own ratio: the servers of one round ran
    # seconds apart, so a slow drift of the machine cancels out.
    paired = [x["raidkit"] / max(x["nbdkit-file"], x["qemu-nbd"])
              for (jj, _), x in by_round.items() if jj == j]
    row += f"{statistics.median(paired):>8.2f}"
    print(row)
print()
for sw in [j for j in jobs if j.startswith("seqwrite_1m")]:
    r5 = med[(sw, "raidkit-raid5x4")] / med[(sw, "raidkit")]
    r5p = statistics.median(x["raidkit-raid5x4"] / x["raidkit"]
                            for (jj, _), x in by_round.items() if jj == sw)
    print(f"RAID-5 of 4 members, {sw} / one member: {r5:.2f} (paired by round: {r5p:.2f})")
print("raidkit/best: ratio of the medians; paired: median of the rounds' own ratios")
what = f", served by {os.environ['RAIDKIT_B']}" if os.environ.get("RAIDKIT_B") else ", identical"
if os.environ.get("HTTP") == "1":
    what += ", with --http, /metrics scraped every second"
print("\ncontrol (a second raidkit export" + what + ") / raidkit, paired by round: median (min-max)")
for j in jobs:
    c = [x["raidkit-control"] / x["raidkit"] for (jj, _), x in by_round.items() if jj == j]
    print(f"  {j:<20}{statistics.median(c):>6.2f} ({min(c):.2f}-{max(c):.2f})")
PY
