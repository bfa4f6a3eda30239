#!/usr/bin/env bash
# Cross-check of `raidkit bench` against fio and bonnie++ on the same
# targets, alternating in one run, ROUNDS rounds, medians:
#  1. a file in DIR (direct I/O): 1 MiB sequential write and read, 4 KiB
#     random read and write at queue depths 1 and 32 — fio (psync for the
#     sequential and qd1 jobs, io_uring at iodepth 32, as raidkit bench
#     keeps depths above 1 on files and devices) against
#     `raidkit bench FILE --whole`;
#  2. NBD exports: the same jobs with fio's nbd engine against
#     `raidkit bench nbd://...`, the server on CPU 0 and the client on
#     CPU 1, as if on two machines: a disk-bound export (qemu-nbd, O_DIRECT,
#     a file in DIR) and a RAM-disk one (raidkit serving one RAM-disk
#     member), where the clients' own cost per request shows;
#  2b. nbdkit's memory plugin (PARTS nbdkit), 2c. a loop device with
#     direct I/O over a file in DIR (PARTS loop): the same jobs;
#  3. bonnie++ on DIR against `raidkit bench DIR --tests char_write,rewrite,char_read`,
#     both on a file of BONNIE_MIB (default: twice RAM, bonnie++'s own
#     default, so that its figures are not the page cache's; raidkit drops
#     the cache before reading, bonnie++ relies on the file size).
#     MEM_MIB=N runs both in a memory cgroup limited to N MiB, which caps
#     their page cache: the file is then twice N, not twice the machine's
#     RAM, and a round takes minutes instead of an hour (raidkit bench
#     reads the cgroup's limit as its RAM; bonnie++ is told with -r).
# fio's random jobs run with --norandommap: raidkit bench draws each offset
# uniformly at random, with replacement, and so does fio then (its default
# map visits every block once per pass instead; against the disk-bound NBD
# export that alone made fio's 4 KiB qd32 random writes ~12% faster).
# Each raidkit run measures only the queue depth being compared (--qd), as
# each fio job does: measuring qd1 first, as a plain randwrite_4k run does,
# left 5 s of random writes behind that the disk-bound export was still
# absorbing during qd32 (raidkit 0.84-0.89 of fio there, against 0.94-0.96
# with --qd 32 alone).
# raidkit bench draws new random offsets on every run (a seed of its own,
# recorded in its JSON); fio's randrepeat=0 does the same, so that neither
# reads back exactly the blocks a cache still holds from the previous job.
# fio runs with --gtod_reduce=1 (FIO_OPTS), its option that cuts its own
# clock reads to a fraction: it then keeps no per-request latency figures,
# which raidkit bench does not keep either. Without it fio read the
# clock several times per request; on nbdkit's memory export that was 16% of
# its CPU time (perf), and the comparison there measured fio's timekeeping.
# Sequential and random figures should agree within 10%, as the median of
# the per-round ratios (side by side, as this machine's disk drifts); raidkit's
# per-character and rewrite figures should lie within bonnie++'s range.
#
# usage: [PARTS="file nbd nbdkit loop bonnie"] [FIO_OPTS=...] [BONNIE_MIB=N] [MEM_MIB=N] bench/bench-vs-fio.sh [DIR] [SIZE_MIB] [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/var/tmp/raidkit-vs-fio}
SIZE_MB=${2:-1024}
ROUNDS=${3:-3}
SECS=${4:-5}
PARTS=${PARTS:-file nbd bonnie}
FIO_OPTS=${FIO_OPTS---gtod_reduce=1}
RAM_MIB=${MEM_MIB:-$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)}
BONNIE_MIB=${BONNIE_MIB:-$((2 * RAM_MIB))}
./scripts/deps.sh >/dev/null
command -v bonnie++ >/dev/null || apt-get install -y -qq bonnie++ >/dev/null
cargo build --release --quiet
R=$PWD/target/release/raidkit
mkdir -p "$DIR"
W=$(mktemp -d /dev/shm/raidkit-vs-fio.XXXXXX)
PIDS=()
CG=
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$W" "$DIR/target.img" "$DIR/nbd-disk.img" "$DIR"/Bonnie.* "$DIR"/raidkit-bench-*
  [[ -n $CG ]] && rmdir "$CG" 2>/dev/null || true
}
trap cleanup EXIT

# A child of this shell's memory cgroup limited to MEM_MIB (v1 or v2).
if [[ -n ${MEM_MIB:-} ]]; then
  v1=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
  if [[ -n $v1 ]]; then
    CG=/sys/fs/cgroup/memory${v1%/}/raidkit-vs-fio-$$; LIMIT=memory.limit_in_bytes
  else
    CG=/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup); CG=${CG%/}/raidkit-vs-fio-$$; LIMIT=memory.max
  fi
  mkdir "$CG" && echo $((MEM_MIB << 20)) > "$CG/$LIMIT" ||
    { echo "cannot set up a memory cgroup at $CG" >&2; exit 1; }
fi
limited() { # command... : run it inside the memory cgroup, if any
  if [[ -n $CG ]]; then sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG" "$@"; else "$@"; fi
}
RES="$W/results.txt"
: > "$RES"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

fio_val() { # json-file side(read|write) metric(iops|bw) -> value and fio's CPU use in %
  python3 - "$@" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
j = job[sys.argv[2]]
v = f'{j["iops"]:.1f}' if sys.argv[3] == "iops" else f'{j["bw_bytes"] / 1e6:.1f}'
print(v, f'{job["usr_cpu"] + job["sys_cpu"]:.0f}')
PY
}

rk_val() { # json-file test [qd]
  python3 - "$@" <<'PY'
import json, sys
rs = json.load(open(sys.argv[1]))["results"]
qd = int(sys.argv[3]) if len(sys.argv) > 3 else None
r = [r for r in rs if r["test"] == sys.argv[2] and r.get("qd") == qd]
print(f'{r[0]["value"]:.1f}', f'{r[0].get("cpu", 0):.0f}')
PY
}

# job -> fio arguments, raidkit test, qd, fio side, metric
declare -A FIO RKT QD SIDE MET
FIO[seq_write]="--rw=write --bs=1M --ioengine=psync --end_fsync=1";  RKT[seq_write]=seq_write;    QD[seq_write]=;   SIDE[seq_write]=write; MET[seq_write]=bw
FIO[seq_read]="--rw=read --bs=1M --ioengine=psync";                 RKT[seq_read]=seq_read;      QD[seq_read]=;    SIDE[seq_read]=read;   MET[seq_read]=bw
FIO[randread_qd1]="--norandommap --randrepeat=0 --rw=randread --bs=4k --ioengine=psync --time_based --runtime=$SECS";  RKT[randread_qd1]=randread_4k;  QD[randread_qd1]=1;  SIDE[randread_qd1]=read;  MET[randread_qd1]=iops
FIO[randwrite_qd1]="--norandommap --randrepeat=0 --rw=randwrite --bs=4k --ioengine=psync --time_based --runtime=$SECS --end_fsync=1"; RKT[randwrite_qd1]=randwrite_4k; QD[randwrite_qd1]=1; SIDE[randwrite_qd1]=write; MET[randwrite_qd1]=iops
FIO[randread_qd32]="--norandommap --randrepeat=0 --rw=randread --bs=4k --ioengine=io_uring --iodepth=32 --time_based --runtime=$SECS";  RKT[randread_qd32]=randread_4k;  QD[randread_qd32]=32;  SIDE[randread_qd32]=read;  MET[randread_qd32]=iops
FIO[randwrite_qd32]="--norandommap --randrepeat=0 --rw=randwrite --bs=4k --ioengine=io_uring --iodepth=32 --time_based --runtime=$SECS --end_fsync=1"; RKT[randwrite_qd32]=randwrite_4k; QD[randwrite_qd32]=32; SIDE[randwrite_qd32]=write; MET[randwrite_qd32]=iops
JOBS=(seq_write seq_read randread_qd1 randwrite_qd1 randread_qd32 randwrite_qd32)

measure() { # where target fio-target-args... ; appends "where job tool value" lines
  local where=$1 target=$2; shift 2
  local pin=()
  [[ $where == nbd* ]] && pin=(taskset -c 1)
  local fargs=("$@")
  for r in $(seq "$ROUNDS"); do
    for job in "${JOBS[@]}"; do
      local fa=${FIO[$job]}
      if [[ $where == nbd* ]]; then
        # The nbd engine has one connection; the queue depth is its iodepth.
        fa=${fa//--ioengine=psync/}; fa=${fa//--ioengine=io_uring/}
        fa="$fa --iodepth=${QD[$job]:-1}"
      fi
      local order=(fio raidkit); (( r % 2 == 0 )) && order=(raidkit fio)
      for tool in "${order[@]}"; do
        if [[ $tool == fio ]]; then
          # shellcheck disable=SC2086
          "${pin[@]}" fio --name=x "${fargs[@]}" $fa $FIO_OPTS --size=${SIZE_MB}M --output-format=json --output="$W/f.json" >/dev/null
          read -r v cpu < <(fio_val "$W/f.json" "${SIDE[$job]}" "${MET[$job]}")
          echo "$where $job fio-cpu $cpu" >> "$RES"
        else
          "${pin[@]}" "$R" bench "$target" --destroy-data --whole --runs 1 --seconds "$SECS" \
            --size ${SIZE_MB}M --tests "${RKT[$job]}" ${QD[$job]:+--qd ${QD[$job]}} --json > "$W/r.json" 2>/dev/null
          read -r v cpu < <(rk_val "$W/r.json" "${RKT[$job]}" ${QD[$job]})
          echo "$where $job raidkit-cpu $cpu" >> "$RES"
        fi
        echo "$where $job $tool $v" | tee -a "$RES"
      done
    done
  done
}

# 1. A file on DIR's file system, filled first so reads read data.
if [[ " $PARTS " == *" file "* ]]; then
F=$DIR/target.img
fio --name=fill --filename="$F" --rw=write --bs=1M --size=${SIZE_MB}M --direct=1 --end_fsync=1 >/dev/null
measure file "$F" --filename="$F" --direct=1
rm -f "$F"
fi

# 2. NBD exports, the client on CPU 1 and the server on CPU 0 (two machines).
# nbd-disk: qemu-nbd serving a file in DIR with O_DIRECT (--cache=none), so
#   the export is bound by the disk, as a remote box's would be;
# nbd-ram: raidkit serving a linear array of one RAM-disk member, bound by
#   the NBD path itself, where the clients' own cost per request shows.
if [[ " $PARTS " == *" nbd "* ]]; then
ND=$DIR/nbd-disk.img
truncate -s ${SIZE_MB}M "$ND"
P=$(free_port)
taskset -c 0 qemu-nbd -f raw --cache=none --aio=native -b 127.0.0.1 -p $P -t -e 8 "$ND" & PIDS+=($!)
U="nbd://127.0.0.1:$P/"
for _ in $(seq 100); do nbdinfo --size "$U" >/dev/null 2>&1 && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri="$U" --rw=write --bs=1M --iodepth=8 --size=${SIZE_MB}M >/dev/null
measure nbd-disk "$U" --ioengine=nbd --uri="$U"
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true; rm -f "$ND"

"$R" create --level linear --size $((SIZE_MB + 4))M --name one "$W/one.img" >/dev/null
P=$(free_port)
taskset -c 0 "$R" serve --listen 127.0.0.1:$P --control "$W/ctl" "$W/one.img" >/dev/null 2>&1 & PIDS+=($!)
U="nbd://127.0.0.1:$P/"
for _ in $(seq 100); do nbdinfo --size "$U" >/dev/null 2>&1 && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri="$U" --rw=write --bs=1M --iodepth=8 --size=${SIZE_MB}M >/dev/null
measure nbd-ram "$U" --ioengine=nbd --uri="$U"
fi

# 2b. nbdkit's memory plugin: an export that costs almost nothing, where
#   the client is what is measured (filled first, so that no test pays
#   for the plugin's first touch of its pages).
if [[ " $PARTS " == *" nbdkit "* ]]; then
P=$(free_port)
taskset -c 0 nbdkit -f -p $P --exit-with-parent memory ${SIZE_MB}M & PIDS+=($!)
U="nbd://127.0.0.1:$P/"
for _ in $(seq 100); do nbdinfo --size "$U" >/dev/null 2>&1 && break; sleep 0.1; done
fio --name=fill --ioengine=nbd --uri="$U" --rw=write --bs=1M --iodepth=8 --size=${SIZE_MB}M >/dev/null
measure nbd-mem "$U" --ioengine=nbd --uri="$U"
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
fi

# 2c. A loop device with direct I/O over a file in DIR (the real-disk
#   reference): raidkit bench /dev/loopN against fio on the same device.
if [[ " $PARTS " == *" loop "* ]]; then
LF=$DIR/loop.img
truncate -s ${SIZE_MB}M "$LF"
LOOP=$(losetup --direct-io=on -f --show "$LF")
trap 'losetup -d "$LOOP" 2>/dev/null || true; rm -f "$LF"; cleanup' EXIT
fio --name=fill --filename="$LOOP" --rw=write --bs=1M --size=${SIZE_MB}M --direct=1 --end_fsync=1 >/dev/null
measure loop "$LOOP" --filename="$LOOP" --direct=1
losetup -d "$LOOP"; rm -f "$LF"
fi

# 3. bonnie++ against raidkit's bonnie tests on the same directory.
if [[ " $PARTS " == *" bonnie "* ]]; then
for r in $(seq "$ROUNDS"); do
  order=(bonnie raidkit); (( r % 2 == 0 )) && order=(raidkit bonnie)
  for tool in "${order[@]}"; do
    if [[ $tool == bonnie ]]; then
      # -q: the CSV line on stdout. Fields (1.98 format): 10 putc, 14 rewrite, 16 getc (K/s).
      line=$(limited bonnie++ -d "$DIR" -s ${BONNIE_MIB}M -r $RAM_MIB -n 0 -u root -q 2>/dev/null | tail -1)
      IFS=, read -ra c <<< "$line"
      for pair in "char_write 9" "rewrite 13" "char_read 15"; do
        set -- $pair
        # "+++++": bonnie++ timed less than 500 ms and reports nothing.
        if [[ ${c[$2]} =~ ^[0-9]+$ ]]; then
          python3 -c "print('bonnie $1 bonnie++ %.2f' % (${c[$2]} * 1024 / 1e6))" | tee -a "$RES"
        else
          echo "bonnie++ gave no $1 figure (${c[$2]}): use a larger SIZE_MIB" >&2
        fi
      done
    else
      limited "$R" bench "$DIR" --runs 1 --size ${BONNIE_MIB}M --tests char_write,rewrite,char_read --json > "$W/r.json" 2>/dev/null
      for t in char_write rewrite char_read; do
        echo "bonnie $t raidkit $(rk_val "$W/r.json" $t | cut -d' ' -f1)" | tee -a "$RES"
      done
    fi
  done
done
fi

echo
python3 - "$RES" <<'PY'
import statistics, sys
from collections import defaultdict
d = defaultdict(list)
# "paired": the median of each round's own raidkit/reference ratio (the two
# tools of one round run seconds apart, so a slow drift of the machine
# cancels out).
paired, pending = defaultdict(list), {}
for l in open(sys.argv[1]):
    where, job, tool, v = l.split()
    d[(where, job, tool)].append(float(v))
    if tool in ("fio", "bonnie++", "raidkit"):
        other = pending.pop((where, job), None)
        if other and other[0] != tool:
            ref, rk = (other[1], float(v)) if tool == "raidkit" else (float(v), other[1])
            paired[(where, job)].append(rk / ref)
        else:
            pending[(where, job)] = (tool, float(v))
keys = []
for (w, j, t) in d:
    if (w, j) not in keys:
        keys.append((w, j))
print("(fio CPU, raidkit bench CPU: each client's user+system time as % of one CPU, median)")
print("(ratio: the median over rounds of each round's raidkit/fio ratio, the two measured")
print(" side by side, which a drift of the machine between rounds cannot skew; the")
print(" disk-bound figures here have halved within one run)")
print(f"{'target':8} {'job':15} {'reference':>26} {'raidkit bench':>26} {'ratio':>6}  verdict")
bad = bad_ram = 0
for w, j in keys:
    ref = "bonnie++" if w == "bonnie" else "fio"
    a, b = d[(w, j, ref)], d[(w, j, "raidkit")]
    if not a or not b:
        print(f"{w:8} {j:15} missing figures"); bad += 1; continue
    ma, mb = statistics.median(a), statistics.median(b)
    pr = paired.get((w, j)) or [mb / ma]
    ratio = statistics.median(pr)
    if w == "bonnie":
        ok = min(a) <= mb <= max(a)
        off = "" if ok else f" ({(mb / (min(a) if mb < min(a) else max(a)) - 1) * 100:+.0f}% from its edge)"
        verdict = f"bonnie++ range {min(a):.1f}-{max(a):.1f}: " + ("within" if ok else "OUTSIDE") + off
    else:
        ok = abs(ratio - 1) <= 0.10
        verdict = "within 10%" if ok else "OUTSIDE 10%"
    bad += not ok
    bad_ram += (not ok) and w in ("nbd-ram", "nbd-mem")
    fmt = lambda m, xs: f"{m:10.1f} ({min(xs):.1f}-{max(xs):.1f})"
    cpu = d.get((w, j, "fio-cpu"))
    if cpu:
        verdict += f"; fio CPU {statistics.median(cpu):.0f}%"
        if statistics.median(cpu) >= 90:
            verdict += " (fio is CPU-bound: its figure is its own limit)"
    rcpu = d.get((w, j, "raidkit-cpu"))
    if rcpu:
        verdict += f"; raidkit bench CPU {statistics.median(rcpu):.0f}%"
    verdict += f"; ratio of medians {mb / ma:.2f}"
    print(f"{w:8} {j:15} {ref:>8} {fmt(ma, a):>17} {fmt(mb, b):>26} {ratio:6.2f}  {verdict}")
print(f"\n{bad} comparison(s) outside the bounds"
      + (f", {bad_ram} of them on the RAM-disk export, where the export costs almost nothing"
         " and each client's own cost per request is what is measured" if bad_ram else ""))
PY
