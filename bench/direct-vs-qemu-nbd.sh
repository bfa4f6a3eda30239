#!/usr/bin/env bash
# What an NBD server can get out of direct-I/O loop devices on this machine,
# against what fio gets from them without one. 4 KiB random reads, 32
# requests in flight in every case, on loop devices with direct I/O over
# files on the machine's disk (DIR, default /var/tmp):
#   one device:   raw   fio libaio on the device, QD32
#                 qemu  qemu-nbd --cache=none --aio=io_uring (O_DIRECT, one
#                       thread, io_uring: a mature server's own best case),
#                       fio's nbd engine at QD32
#                 raidkit  a linear array of the device, --checksums off,
#                       served --io direct, fio's nbd engine at QD32
#   four devices: raw   fio libaio, 8 in flight on each
#                 qemu  one qemu-nbd per device, one fio nbd job on each at QD8
#                 raidkit RAID-0 (chunk 64K) of the four, checksums off and
#                       on, one connection at QD32 and four at QD8
# Each round runs every case once, in this order; medians (min-max) of the
# rounds and ratios to qemu-nbd at the end. With PERF=1 the one-device
# cases also report CPU time and context switches per request, system wide
# (perf stat -a over the fio run). With RAIDKIT_B=path, the one-device case
# is run with that other build too (one_raidkit-B), side by side.
# usage: [RAIDKIT=path] [RAIDKIT_B=path] [DIR=/var/tmp] [PERF=1] bench/direct-vs-qemu-nbd.sh [ROUNDS] [SECONDS] [SIZE]
# Needs root (losetup), fio, qemu-nbd, nbdinfo.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-5}
SIZE=${3:-1G}
BASE=${DIR:-/var/tmp}
[ "$(id -u)" -eq 0 ] || { echo "direct-vs-qemu-nbd.sh: loop devices need root" >&2; exit 1; }
./scripts/deps.sh
if [ -z "${RAIDKIT:-}" ]; then
  cargo build --release --quiet
  RAIDKIT=${CARGO_TARGET_DIR:-$PWD/target}/release/raidkit
fi
R=$RAIDKIT
W=$(mktemp -d "$BASE/raidkit-vs-qemu-nbd.XXXXXX")
LOOPS=()
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for d in "${LOOPS[@]}"; do timeout 30 losetup -d "$d" || true; done
  rm -rf "$W"
}
trap cleanup EXIT

bytes=$(numfmt --from=iec "$SIZE")
avail=$(( $(df --output=avail -B1 "$W" | tail -1) ))
[ "$avail" -gt $(( 4 * bytes + (1 << 30) )) ] || { echo "direct-vs-qemu-nbd.sh: $W lacks room for 4 x $SIZE" >&2; exit 1; }
for i in 0 1 2 3; do
  truncate -s "$SIZE" "$W/d$i.img"
  LOOPS+=("$(timeout 30 losetup --direct-io=on -f --show "$W/d$i.img")")
done
fill=()
for d in "${LOOPS[@]}"; do fill+=("--name=$(basename "$d")" "--filename=$d"); done
timeout 600 fio --ioengine=libaio --direct=1 --rw=write --bs=1M --iodepth=8 --size="$SIZE" "${fill[@]}" >/dev/null

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do nbdinfo --size "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "server at $1 did not come up" >&2; exit 1; }
stop() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; PIDS=(); }

FIO_COMMON=(--rw=randread --bs=4k --norandommap --randrepeat=0 --time_based "--runtime=$SECS"
            --ramp_time=1 --gtod_reduce=1 --group_reporting --output-format=json)
# fio's JSON on stdin -> the group's read IOPS.
iops() {
  python3 -c '
import json, sys
out = sys.stdin.read()
# (fio'"'"'s nbd engine says "connected" on stdout before the JSON.)
j = json.loads(out[out.find("{"):])["jobs"][0]
if j["error"]:
    sys.exit("fio error %d" % j["error"])
print("%.0f" % j["read"]["iops"])'
}
# fio under a timeout, perf stat around it with PERF=1: prints IOPS, and
# CPU µs and context switches per request.
measure() { # name fio-args...
  local name=$1 out
  shift
  if [ "${PERF:-0}" = 1 ]; then
    out=$(perf stat -a -x, -e task-clock,context-switches -o "$W/perf" -- \
          timeout 120 fio "${FIO_COMMON[@]}" "$@" | iops)
    awk -F, -v n="$name" -v i="$out" -v s="$SECS" '/task-clock/{t=$1} /context-switches/{c=$1}
      END{printf "%s %s cpu_us_per_io %.1f switches_per_io %.2f\n", n, i, t*1000/(i*(s+1)), c/(i*(s+1))}' "$W/perf"
  else
    out=$(timeout 120 fio "${FIO_COMMON[@]}" "$@" | iops)
    echo "$name $out"
  fi
}
qemu() { # device port
  qemu-nbd -f raw --cache=none --aio=io_uring -b 127.0.0.1 -p "$2" -t -e 8 "$1" >/dev/null 2>&1 &
  PIDS+=($!)
  wait_port "nbd://127.0.0.1:$2"
}
raidkit() { # level checksums devices... -> URI set to its export
  local level=$1 cs=$2 port
  shift 2
  port=$(free_port)
  "${BIN:-$R}" create --level "$level" --chunk 64K --force --assume-clean --checksums "$cs" "$@" >/dev/null
  "${BIN:-$R}" serve --io direct --listen "127.0.0.1:$port" --control "$W/ctl" "$@" >/dev/null 2>&1 &
  PIDS+=($!)
  URI=nbd://127.0.0.1:$port
  wait_port "$URI"
}

LOG=$W/log
: >"$LOG"
echo "devices: ${LOOPS[*]} over $W ($SIZE each), raidkit $R, $ROUNDS rounds of ${SECS}s" >&2
for r in $(seq "$ROUNDS"); do
  d=${LOOPS[0]}
  measure one_raw --ioengine=libaio --direct=1 --iodepth=32 --name=d --filename="$d" | tee -a "$LOG"
  p=$(free_port); qemu "$d" "$p"
  measure one_qemu-nbd --ioengine=nbd --iodepth=32 --name=q --uri="nbd://127.0.0.1:$p" | tee -a "$LOG"
  stop
  raidkit linear off "$d"
  measure one_raidkit --ioengine=nbd --iodepth=32 --name=k --uri="$URI" | tee -a "$LOG"
  stop
  if [ -n "${RAIDKIT_B:-}" ]; then
    BIN=$RAIDKIT_B raidkit linear off "$d"
    measure one_raidkit-B --ioengine=nbd --iodepth=32 --name=k --uri="$URI" | tee -a "$LOG"
    stop
  fi

  a=(); for x in "${LOOPS[@]}"; do a+=("--name=$(basename "$x")" "--filename=$x"); done
  measure four_raw --ioengine=libaio --direct=1 --iodepth=8 "${a[@]}" | tee -a "$LOG"
  a=(); for x in "${LOOPS[@]}"; do p=$(free_port); qemu "$x" "$p"; a+=("--name=$(basename "$x")" "--uri=nbd://127.0.0.1:$p"); done
  measure four_qemu-nbd --ioengine=nbd --iodepth=8 "${a[@]}" | tee -a "$LOG"
  stop
  for cs in off on; do
    raidkit 0 "$cs" "${LOOPS[@]}"
    measure "four_raidkit_csum-${cs}_1x32" --ioengine=nbd --iodepth=32 --name=k --uri="$URI" | tee -a "$LOG"
    measure "four_raidkit_csum-${cs}_4x8" --ioengine=nbd --iodepth=8 --numjobs=4 --name=k --uri="$URI" | tee -a "$LOG"
    stop
  done
done

echo
echo "4 KiB random read IOPS, medians (min-max) of $ROUNDS rounds; ratio to qemu-nbd on the same devices"
python3 - "$LOG" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split()
    runs.setdefault(f[0], []).append(float(f[1]))
med = {k: statistics.median(v) for k, v in runs.items()}
for k, v in runs.items():
    q = med.get(k.split("_")[0] + "_qemu-nbd")
    ratio = f"  {med[k] / q:.2f} of qemu-nbd" if q and "raw" not in k and "qemu" not in k else ""
    print(f"{k:28} {med[k]:8.0f} ({min(v):.0f}-{max(v):.0f}){ratio}")
PY
