#!/usr/bin/env bash
# raidkit on a real disk: four loop devices with direct I/O over files on
# the machine's disk (/var/tmp, not the RAM disk), first measured raw with
# fio (libaio, direct) on all four at once, the physical limit; then raidkit
# RAID-0, RAID-5 and RAID-6 of the same four devices served over NBD with
# `--io direct`, RAID-5/6 with each consistency policy (none, bitmap,
# journal; RAID-0 has no redundancy to keep consistent and runs with the
# default), measured with fio's nbd engine. Jobs: 1 MiB sequential write
# and read, 4 KiB random read and write at QD32 (raw: QD32 on each device;
# raidkit: QD32 on one connection), and a single reader of 1 MiB at QD1 on
# RAID-0. Configurations alternate within each round in a rotating order,
# so that a drift of the disk does not fall on one of them; medians (with
# min-max) over the rounds, and the ratios issue 23 names.
#
# Each array is created anew on the devices at its turn (--force
# --assume-clean: its data is whatever the previous one left, which is
# real, written data: the devices are filled once before the first round,
# so no read is of a hole the file system answers without the disk).
#
# A config is rLEVEL-POLICY, with -plain at the end for an array made
# with --checksums off (the others have checksums, create's default):
# CONFIGS="r5-journal r5-journal-plain" measures what checksums cost.
# A config ending in -B is served by the binary RAIDKIT_B instead (two
# builds side by side in one run: CONFIGS="r5-none r5-none-B").
# A config ending in @SIZE is created with --data-offset SIZE: the metadata
# area, whose journal is what is left after the bitmap and checksums. Loop
# devices of a few GiB get 1/128 of their size by default (8 MiB at 1G); a
# disk of 16 GiB or more gets 128 MiB, so "r5-journal@128M" measures the
# journal as a real disk has it (CONFIGS="r5-none@128M r5-journal@128M").
# LOOP=0 uses the files themselves as members (no loop devices, I/O as
# `--io auto` picks it: on DIR=/dev/shm, the RAM disk, the CPU cost alone;
# no raw config there, fio's direct I/O needs a real file system).
#
# IOSTAT=1 prints, after each raidkit measurement, what one client request
# cost the four devices (reads, writes, KiB written, flushes).
# CPUSTAT=1 prints what one client request cost the machine, from
# /proc/stat over the same span: CPU time (all processes, the kernel's
# loop workers included), context switches, and the share of time busy
# and waiting for I/O.
# usage: [RAIDKIT=path/to/raidkit] [CHUNK=64K] [DIR=/var/tmp] [LOOP=1] [IOSTAT=1] [CPUSTAT=1] [JOBS="..."] [CONFIGS="..."]
#        bench/real-disk.sh [ROUNDS] [SECONDS] [SIZE]
#   ROUNDS   rounds (default 3), SECONDS per job (default 10),
#   SIZE     per device (default 1G; the files are DIR/raidkit-real-disk.*)
# Needs root (losetup), fio, nbdinfo; prints one line per measurement, then
# the table and ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-10}
SIZE=${3:-1G}
CHUNK=${CHUNK:-64K}
BASE=${DIR:-/var/tmp}
LOOP=${LOOP:-1}
IO=direct
[ "$LOOP" = 1 ] || IO=auto
[ "$LOOP" = 0 ] || [ "$(id -u)" -eq 0 ] || { echo "real-disk.sh: loop devices need root" >&2; exit 1; }
./scripts/deps.sh
if [ -z "${RAIDKIT:-}" ]; then
  cargo build --release --quiet
  RAIDKIT=${CARGO_TARGET_DIR:-$PWD/target}/release/raidkit
fi
R=$RAIDKIT
W=$(mktemp -d "$BASE/raidkit-real-disk.XXXXXX")
LOOPS=()
SERVER=""
cleanup() {
  # The server first (it holds the devices), then the devices, then files.
  [ -n "$SERVER" ] && { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }
  if [ "$LOOP" = 1 ]; then
    for d in "${LOOPS[@]}"; do timeout 30 losetup -d "$d" || true; done
  fi
  rm -rf "$W"
}
trap cleanup EXIT

bytes=$(numfmt --from=iec "$SIZE")
avail=$(( $(df --output=avail -B1 "$W" | tail -1) ))
[ "$avail" -gt $(( 4 * bytes + (1 << 30) )) ] || { echo "real-disk.sh: $W lacks room for 4 x $SIZE" >&2; exit 1; }

for i in 0 1 2 3; do
  truncate -s "$SIZE" "$W/d$i.img"
  if [ "$LOOP" = 0 ]; then
    LOOPS+=("$W/d$i.img")
    continue
  fi
  LOOPS+=("$(timeout 30 losetup --direct-io=on -f --show "$W/d$i.img")")
  dio=/sys/block/$(basename "${LOOPS[$i]}")/loop/dio
  [ "$(cat "$dio")" = 1 ] || { echo "real-disk.sh: ${LOOPS[$i]}: direct I/O not on" >&2; exit 1; }
done
echo "devices: ${LOOPS[*]} over $W ($SIZE each), raidkit $R, chunk $CHUNK, $ROUNDS rounds of ${SECS}s jobs" >&2
# Fill the devices once: real blocks behind every byte read later.
fill=()
for i in 0 1 2 3; do fill+=("--name=d$i" "--filename=${LOOPS[$i]}"); done
direct=1
[ "$LOOP" = 1 ] || direct=0
fio --ioengine=libaio --direct=$direct --rw=write --bs=1M --iodepth=8 --size="$SIZE" "${fill[@]}" >/dev/null

job_args() { # job -> fio arguments
  case $1 in
    seqwrite_1m)      echo "--rw=write --bs=1M --iodepth=32" ;;
    seqread_1m)       echo "--rw=read --bs=1M --iodepth=32" ;;
    randread_4k)      echo "--rw=randread --bs=4k --iodepth=32 --norandommap --randrepeat=0" ;;
    randwrite_4k)     echo "--rw=randwrite --bs=4k --iodepth=32 --norandommap --randrepeat=0" ;;
    seqread_1m_qd1)   echo "--rw=read --bs=1M --iodepth=1" ;;
    # One dd-style writer (oflag=direct): a request at a time, the flush
    # at the end counted (it waits for what serve wrote behind).
    seqwrite_1m_qd1)  echo "--rw=write --bs=1M --iodepth=1 --end_fsync=1" ;;
    # The devices with 8 requests in flight each: 32 in all, as many as
    # raidkit's one client connection at QD32 has (raw runs only).
    randread_4k_qd8)  echo "--rw=randread --bs=4k --iodepth=8 --norandommap --randrepeat=0" ;;
    # Two sequential writers at once, each in its own half of the array
    # (the seeds' two dd writers on md RAID-5: 17 % lost to the second).
    seqwrite_1m_x2)   echo "--rw=write --bs=1M --iodepth=32 --numjobs=2 --size=50% --offset_increment=50% --group_reporting" ;;
  esac
}

# fio's JSON -> the figure: MB/s for 1 MiB jobs, IOPS for 4 KiB ones (the
# group's sum: all four devices at once for the raw runs).
figure() { # json job
  python3 - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = "write" if "write" in sys.argv[2] else "read"
if j["error"]:
    sys.exit(f"fio error {j['error']}")
v = j[side]["iops"] if "4k" in sys.argv[2] else j[side]["bw_bytes"] / 1e6
print(f"{v:.0f}")
PY
}

raw() { # job -> value: fio on the four devices at once
  local devs=()
  for i in 0 1 2 3; do devs+=("--name=d$i" "--filename=${LOOPS[$i]}"); done
  # shellcheck disable=SC2046
  fio --ioengine=libaio --direct=1 $(job_args "$1") --time_based --runtime="$SECS" \
      --ramp_time=1 --group_reporting --output-format=json --output="$W/out.json" "${devs[@]}" >/dev/null
  figure "$W/out.json" "$1"
}

devstat() { # -> the four loop devices' /sys/block/*/stat lines
  [ "$LOOP" = 1 ] || return 0
  for d in "${LOOPS[@]}"; do cat "/sys/block/$(basename "$d")/stat"; done
}

cpustat() { # -> the machine's CPU times and context switches, and when
  grep -E '^(cpu|ctxt) ' /proc/stat
  date +%s.%N
}

# CPUSTAT=1: what each client request cost the machine.
cpu_per_op() { # json job config
  python3 - "$1" "$2" "$W/cpu0" "$W/cpu1" "$3" <<'PY'
import json, os, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = "write" if "write" in sys.argv[2] else "read"
rate = j[side]["iops"] or 1  # fio's mean rate: requests in the span = rate x span
def load(f):
    lines = open(f).read().split("\n")
    cpu = [int(x) for x in lines[0].split()[1:]]
    return cpu, int(lines[1].split()[1]), float(lines[2])
(c0, x0, t0), (c1, x1, t1) = load(sys.argv[3]), load(sys.argv[4])
d = [b - a for a, b in zip(c0, c1)]
total = sum(d) or 1
busy = total - d[3] - d[4]  # idle and iowait
ops = rate * (t1 - t0)
hz = os.sysconf("SC_CLK_TCK")  # /proc/stat's unit
print(f"  cpustat {sys.argv[5]} {sys.argv[2]}: per request {busy / hz / ops * 1e6:.0f} us CPU, "
      f"{(x1 - x0) / ops:.1f} context switches; busy {100 * busy / total:.0f} %, "
      f"waiting for I/O {100 * d[4] / total:.0f} %")
PY
}

nbd() { # uri job -> value
  local snap=""
  local io=0 cpu=${CPUSTAT:-0}
  [ "${IOSTAT:-0}" = 1 ] && [ "$LOOP" = 1 ] && io=1
  if [ "$io" = 1 ] || [ "$cpu" = 1 ]; then
    # The counters once fio's ramp is over, and at its end.
    (sleep 1; devstat > "$W/stat0"; cpustat > "$W/cpu0") & snap=$!
  fi
  # shellcheck disable=SC2046
  fio --name=b --ioengine=nbd --uri="$1" $(job_args "$2") --time_based --runtime="$SECS" \
      --ramp_time=1 --output-format=json --output="$W/out.json" >/dev/null
  if [ -n "$snap" ]; then
    wait "$snap"
    devstat > "$W/stat1"
    cpustat > "$W/cpu1"
    [ "$io" = 1 ] && per_op "$W/out.json" "$2" "${c:-}" >&2
    [ "$cpu" = 1 ] && cpu_per_op "$W/out.json" "$2" "${c:-}" >&2
  fi
  figure "$W/out.json" "$2"
}

# IOSTAT=1: what each client request cost the devices (all four summed),
# from their /sys/block counters over fio's measured time: reads, writes,
# KiB written and cache flushes per request (the journal's records and
# checkpoints show here).
per_op() { # json job config
  python3 - "$1" "$2" "$W/stat0" "$W/stat1" "$3" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
side = "write" if "write" in sys.argv[2] else "read"
ops = j[side]["total_ios"] or 1
a = [list(map(int, l.split())) for l in open(sys.argv[3])]
b = [list(map(int, l.split())) for l in open(sys.argv[4])]
d = lambda i: sum(y[i] - x[i] for x, y in zip(a, b))
print(f"  iostat {sys.argv[5]} {sys.argv[2]}: per request {d(0)/ops:.2f} reads, {d(4)/ops:.2f} writes, "
      f"{d(6)/2/ops:.1f} KiB written, {d(15)/ops:.2f} flushes")
PY
}

serve() { # level policy checksums(on|off) [binary] [data offset] -> starts $SERVER, its address in $URI
  local level=$1 policy=$2 csum=$3 R=${4:-$R} pol=()
  [ "$policy" = default ] || pol=(--consistency-policy "$policy")
  [ -z "${5:-}" ] || pol+=(--data-offset "$5")
  "$R" create --io "$IO" --force --assume-clean --level "$level" --chunk "$CHUNK" \
      --checksums "$csum" --name "r$level" "${pol[@]}" "${LOOPS[@]}" >/dev/null
  : > "$W/serve.out"
  "$R" serve --io "$IO" --listen 127.0.0.1:0 --control "$W/ctl" "${LOOPS[@]}" \
      >"$W/serve.out" 2>"$W/serve.err" &
  SERVER=$!
  local uri=""
  for _ in $(seq 300); do
    uri=$(grep -o 'nbd://[^ ]*' "$W/serve.out" | head -1 || true)
    [ -n "$uri" ] && break
    kill -0 "$SERVER" 2>/dev/null || { cat "$W/serve.err" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$uri" ] || { echo "server did not start" >&2; cat "$W/serve.err" >&2; exit 1; }
  URI=$uri
  if [ "$csum" = on ]; then
    # --assume-clean left every block without a checksum (each would get
    # one as first read, sparing the reads measured their verification):
    # a scrub gives every block its checksum (and the parity the data).
    "$R" scrub --wait --control "$W/ctl" >/dev/null
  fi
}

unserve() {
  kill -TERM "$SERVER"
  wait "$SERVER" || { echo "server exited with $?" >&2; cat "$W/serve.err" >&2; exit 1; }
  SERVER=""
}

# JOBS="..." and CONFIGS="..." in the environment pick a subset.
read -r -a JOBS <<< "${JOBS:-seqwrite_1m seqread_1m randread_4k randwrite_4k}"
read -r -a CONFIGS <<< "${CONFIGS:-raw r0-default r5-none r5-bitmap r5-journal r6-none r6-bitmap r6-journal}"
RES="$W/results.txt"
: > "$RES"
for r in $(seq "$ROUNDS"); do
  k=$(( (r - 1) % ${#CONFIGS[@]} ))
  ORDER=("${CONFIGS[@]:$k}" "${CONFIGS[@]:0:$k}")
  for c in "${ORDER[@]}"; do
    if [ "$c" = raw ]; then
      for job in "${JOBS[@]}"; do
        echo "round $r $job $c $(raw "$job")" | tee -a "$RES"
      done
      continue
    fi
    dof=""; cfg=$c
    if [[ $cfg == *@* ]]; then dof=${cfg#*@}; cfg=${cfg%@*}; fi
    level=${cfg%%-*}; level=${level#r}; policy=${cfg#*-}; csum=on; bin=$R
    if [[ $policy == *-B ]]; then
      policy=${policy%-B}; bin=${RAIDKIT_B:?a -B config needs RAIDKIT_B}
    fi
    if [[ $policy == *-plain ]]; then policy=${policy%-plain}; csum=off; fi
    serve "$level" "$policy" "$csum" "$bin" "$dof"
    jobs=()
    for j in "${JOBS[@]}"; do [[ $j == *_qd8 ]] || jobs+=("$j"); done
    [ "$level" = 0 ] && jobs+=(seqread_1m_qd1)
    [ "$level" = 5 ] && [[ " ${JOBS[*]} " == *" seqwrite_1m "* ]] && jobs+=(seqwrite_1m_x2)
    for job in "${jobs[@]}"; do
      echo "round $r $job $c $(nbd "$URI" "$job")" | tee -a "$RES"
    done
    unserve
  done
done

python3 - "$RES" <<'PY'
import sys, statistics
from collections import defaultdict
d = defaultdict(list)
for line in open(sys.argv[1]):
    _, r, job, cfg, v = line.split()
    d[(job, cfg)].append(float(v))
med = {k: statistics.median(v) for k, v in d.items()}
jobs = ["seqwrite_1m", "seqread_1m", "randread_4k", "randwrite_4k", "seqread_1m_qd1", "seqwrite_1m_qd1", "seqwrite_1m_x2", "randread_4k_qd8"]
cfgs = ["raw", "r0-default", "r5-none", "r5-bitmap", "r5-journal", "r6-none", "r6-bitmap", "r6-journal"]
cfgs += sorted({c for (_, c) in d} - set(cfgs))
def cell(job, cfg):
    v = d.get((job, cfg))
    return f"{med[(job, cfg)]:.0f} ({min(v):.0f}-{max(v):.0f})" if v else "-"
print()
print("medians (min-max); MB/s for 1 MiB jobs, IOPS for 4 KiB jobs; raw = all four devices at once")
print(f"{'config':<12}" + "".join(f"{j:>22}" for j in jobs))
for c in cfgs:
    print(f"{c:<12}" + "".join(f"{cell(j, c):>22}" for j in jobs))
def ratio(a, b):
    return f"{med[a] / med[b]:.2f}" if a in med and b in med and med[b] else "-"
print()
print("ratios of medians (issue 23's targets in brackets)")
print(f"  RAID-0 1 MiB seq read / raw aggregate:              {ratio(('seqread_1m', 'r0-default'), ('seqread_1m', 'raw'))}  [>= 0.9]")
print(f"  RAID-0 4 KiB rand read / raw aggregate:             {ratio(('randread_4k', 'r0-default'), ('randread_4k', 'raw'))}  [>= 0.9]")
print(f"  RAID-0 4 KiB rand read / raw at the same 32 in flight: {ratio(('randread_4k', 'r0-default'), ('randread_4k_qd8', 'raw'))}  [>= 0.9]")
print(f"  RAID-0 1 MiB seq read, one reader QD1 / raw agg.:   {ratio(('seqread_1m_qd1', 'r0-default'), ('seqread_1m', 'raw'))}  [>= 0.9]")
offsets = [""] + sorted({c[c.index("@"):] for (_, c) in d if "@" in c})
for lv in ("r5", "r6"):
    for p in ("bitmap", "journal"):
        for o in offsets:
            tag = " (the default)" if p == "journal" else ""
            if o:
                tag += f" {o}"
            print(f"  {lv} {p}{tag} / none, 1 MiB seq write:  {ratio(('seqwrite_1m', f'{lv}-{p}{o}'), ('seqwrite_1m', f'{lv}-none{o}'))}  [>= 0.9]")
            print(f"  {lv} {p}{tag} / none, 4 KiB rand write: {ratio(('randwrite_4k', f'{lv}-{p}{o}'), ('randwrite_4k', f'{lv}-none{o}'))}  [>= 0.7]")
for (job, c) in sorted(med):
    if c.endswith("-plain") and (job, c[:-6]) in med:
        print(f"  {c[:-6]} with checksums / without, {job}: {ratio((job, c[:-6]), (job, c))}  [reads >= 0.95, writes >= 0.9]")
for p in ("none", "bitmap", "journal"):
    if ("seqwrite_1m_x2", f"r5-{p}") in med:
        print(f"  r5 {p}: two sequential writers' aggregate / one writer: {ratio(('seqwrite_1m_x2', f'r5-{p}'), ('seqwrite_1m', f'r5-{p}'))}  [>= 0.95]")
if ("randwrite_4k", "raw") in med:
    bound = med[("randwrite_4k", "raw")] / 4
    print(f"  read-modify-write bound (raw 4 KiB rand write IOPS / 4): {bound:.0f}")
    for p in ("none", "bitmap", "journal"):
        k = ("randwrite_4k", f"r5-{p}")
        if k in med:
            print(f"  r5 {p} 4 KiB rand write / bound:  {med[k] / bound:.2f}  [>= 0.8]")
PY
