#!/usr/bin/env bash
# Make md arrays with Linux's own md driver and mdadm (inside one md-vm.sh
# VM boot) on fresh 64 MiB zero-filled image files, for raidkit's
# compatibility tests:
#
#   scripts/md-fixtures.sh OUTDIR
#
#   array   metadata  level            disks  chunk
#   r5-12   1.2       RAID-5 left-sym  3      64K
#   r6-12   1.2       RAID-6           4      64K
#   r1-10   1.0       RAID-1           2      -
#   r10-12  1.2       RAID-10 near=2   3      64K
#   r10f-12 1.2       RAID-10 far=2    3      64K
#   r10o-12 1.2       RAID-10 offset=2 4      64K
#   r0-11   1.1       RAID-0           2      64K
#   r5-090  0.90      RAID-5 left-sym  3      64K
#   r5ra-12 1.2       RAID-5 right-asym 3     64K
#   r5f-12  1.2       RAID-5 left-sym  3      64K  (member 2 failed by md, then the payload written)
#   r5b-12  1.2       RAID-5 left-sym  3      64K  internal bitmap, 1 MiB chunks
#   r1b-10  1.0       RAID-1           2      -    internal bitmap (before the superblock), 1 MiB chunks
#   r6p-12  1.2       RAID-6 left-sym-6 4     64K  made a RAID-5 of 3, then md's --grow --level=6 --layout=preserve
#
# Writes OUTDIR/<array>-<n>.img (n from 0), OUTDIR/payload.img (4 MiB,
# deterministic: AES-128-CTR keystream of a fixed all-zero key/IV), the first
# 4 MiB of every array is that payload, OUTDIR/<array>.examine.txt
# (mdadm --examine of member 0 after the stop), OUTDIR/md5.txt (payload and per-array read-
# back md5s, taken in the VM) and OUTDIR/vm.log (the whole VM output).
# Every array is stopped cleanly. Redundant arrays use --assume-clean so no
# resync runs under slow emulation; --bitmap=none (mdadm 4.2 adds no bitmap
# by default below 100 GiB anyway) except for the two arrays that have md's
# internal write-intent bitmap. UUIDs are fixed so reruns give the same
# superblocks apart from times and checksums.
set -eu

[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
out=$1
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
t0=$(date +%s)

# name  metadata  level  ndisks  extra mdadm options  uuid
arrays='
r5-12  1.2  5   3 --chunk=64:--layout=left-symmetric:--assume-clean:--bitmap=none  5a5a0001:00000000:00000000:00000012
r6-12  1.2  6   4 --chunk=64:--assume-clean:--bitmap=none                          5a5a0002:00000000:00000000:00000012
r1-10  1.0  1   2 --assume-clean:--bitmap=none                                     5a5a0003:00000000:00000000:00000010
r10-12 1.2  10  3 --chunk=64:--layout=n2:--assume-clean:--bitmap=none              5a5a0004:00000000:00000000:00000012
r10f-12 1.2 10  3 --chunk=64:--layout=f2:--assume-clean:--bitmap=none              5a5a000c:00000000:00000000:00000012
r10o-12 1.2 10  4 --chunk=64:--layout=o2:--assume-clean:--bitmap=none              5a5a000d:00000000:00000000:00000012
r0-11  1.1  0   2 --chunk=64                                                       5a5a0005:00000000:00000000:00000011
r5-090 0.90 5   3 --chunk=64:--layout=left-symmetric:--assume-clean:--bitmap=none  5a5a0006:00000000:00000000:00000090
r5ra-12 1.2 5   3 --chunk=64:--layout=right-asymmetric:--assume-clean:--bitmap=none 5a5a0007:00000000:00000000:00000012
r5f-12 1.2  5   3 --chunk=64:--layout=left-symmetric:--assume-clean:--bitmap=none:FAIL 5a5a0008:00000000:00000000:00000012
r5b-12 1.2  5   3 --chunk=64:--layout=left-symmetric:--assume-clean:--bitmap=internal:--bitmap-chunk=1024 5a5a0009:00000000:00000000:00000012
r1b-10 1.0  1   2 --assume-clean:--bitmap=internal:--bitmap-chunk=1024                     5a5a000a:00000000:00000000:00000010
r6p-12 1.2  6   4 --chunk=64:--layout=left-symmetric:--assume-clean:--bitmap=none:GROW6 5a5a000b:00000000:00000000:00000012
'
# GROW6: see r6p-12 above.
# FAIL: the last member is failed (mdadm --fail) before the payload is
# written, so the array is left degraded with that member stale.

# Deterministic payload: no seed file, no RNG library version to drift.
openssl enc -aes-128-ctr -nosalt -K 00000000000000000000000000000000 \
  -iv 00000000000000000000000000000000 </dev/zero 2>/dev/null \
  | head -c 4194304 > "$out/payload.img"

vmscript=$(mktemp /tmp/md-fixtures.XXXXXX.sh)
trap 'rm -f "$vmscript"' EXIT
letters=abcdefghijklmnopqrstuvwxyz
: > "$out/vm.log"

# One VM boot makes the arrays given on stdin (lines of $arrays); the VM
# takes at most 24 disks, the payload one of them, so the arrays are made
# in batches of at most 23 member disks.
batch() {
  local name meta level n opts uuid devs i img first last fail after mklevel mkn mkdevs
  disks=()
  idx=0
  md=0
  {
    echo 'set -eu'
    echo 'run() { echo "+ $*"; "$@"; }'
  } > "$vmscript"
  while read -r name meta level n opts uuid; do
    [ -n "$name" ] || continue
    devs=''
    for i in $(seq 0 $((n - 1))); do
      img=$out/$name-$i.img
      rm -f "$img"
      truncate -s 64M "$img"   # sparse zeros: same content, no 64 MiB of writes
      disks+=("$img")
      devs="$devs /dev/vd${letters:$idx:1}"
      idx=$((idx + 1))
    done
    first=${devs# }; first=${first%% *}
    last=${devs##* }
    fail=''
    after=''
    mklevel=$level
    mkn=$n
    mkdevs=$devs
    case "$opts" in
      *:FAIL) opts=${opts%:FAIL}; fail="run mdadm /dev/md$md --fail $last" ;;
      *:GROW6)
        # Made a RAID-5 of n-1, then md's own RAID-5 to RAID-6 conversion
        # with the last disk, keeping the layout (Q on the new disk).
        opts=${opts%:GROW6}; mklevel=5; mkn=$((n - 1)); mkdevs=${devs% *}
        after="run mdadm /dev/md$md --add $last
run mdadm --grow /dev/md$md --level=6 --raid-devices=$n --layout=preserve
sleep 1; mdadm --wait /dev/md$md || true" ;;
    esac
    cat >> "$vmscript" <<EOF
run mdadm --create /dev/md$md --run --metadata=$meta --level=$mklevel --raid-devices=$mkn ${opts//:/ } --uuid=$uuid$mkdevs
$fail
run dd if=/dev/PAYLOAD of=/dev/md$md bs=1M count=4 conv=fsync
$after
echo "MDFIX-MD5 $name \$(dd if=/dev/md$md bs=1M count=4 2>/dev/null | md5sum | cut -d' ' -f1)"
cat /proc/mdstat
run mdadm --stop /dev/md$md
# Examine after the stop: the superblock as it is left on the image.
echo "MDFIX-EXAMINE-BEGIN $name"
mdadm --examine $first
echo "MDFIX-EXAMINE-END $name"
EOF
    md=$((md + 1))
  done
  # The payload is the last disk; its letter is known only now.
  sed -i "s|/dev/PAYLOAD|/dev/vd${letters:$idx:1}|" "$vmscript"
  disks+=("$out/payload.img")

  set +e
  "$here/md-vm.sh" --timeout "${MDVM_TIMEOUT:-600}" "$vmscript" "${disks[@]}" >> "$out/vm.log"
  rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    cat "$out/vm.log" >&2
    echo "md-fixtures: VM script failed (status $rc)" >&2
    exit "$rc"
  fi
}

images=0
pending=''
count=0
while read -r name meta level n rest; do
  [ -n "$name" ] || continue
  if [ $((count + n)) -gt 23 ]; then
    batch <<< "$pending"
    pending=''
    count=0
  fi
  pending="$pending
$name $meta $level $n $rest"
  count=$((count + n))
  images=$((images + n))
done <<EOF
$arrays
EOF
batch <<< "$pending"

# Split the examine outputs and check every array read back the payload.
want=$(md5sum < "$out/payload.img" | cut -d' ' -f1)
echo "payload $want" > "$out/md5.txt"
bad=0
while read -r name _; do
  [ -n "$name" ] || continue
  sed -n "/^MDFIX-EXAMINE-BEGIN $name\$/,/^MDFIX-EXAMINE-END $name\$/p" "$out/vm.log" \
    | sed '1d;$d' > "$out/$name.examine.txt"
  got=$(sed -n "s/^MDFIX-MD5 $name //p" "$out/vm.log")
  echo "$name $got" >> "$out/md5.txt"
  if [ "$got" != "$want" ]; then
    echo "md-fixtures: $name read back $got, payload is $want" >&2
    bad=1
  fi
done <<EOF
$arrays
EOF
[ "$bad" = 0 ] || exit 1
echo "md-fixtures: $images images in $out, all arrays hold the payload; took $(( $(date +%s) - t0 ))s"
