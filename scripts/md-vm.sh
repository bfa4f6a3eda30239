#!/usr/bin/env bash
# Run a shell SCRIPT inside a throw-away qemu VM that has Linux's real md
# driver and mdadm, with DISK.img files attached as /dev/vda, /dev/vdb, ...
#
#   scripts/md-vm.sh [--timeout SECS] [--mem MIB] SCRIPT DISK.img...
#
# The host has no md module (and may lack KVM), so the VM boots Debian's
# installed kernel (/boot/vmlinuz-*) under qemu with a minimal initramfs:
# static busybox, mdadm plus the libraries ldd names, and the md modules with
# their dependencies. /init loads the modules, runs SCRIPT with sh (stdin
# /dev/null, so an mdadm prompt can never hang the run), prints
# "MDVM-EXIT=<status>", syncs and powers off. This script prints SCRIPT's
# console output and exits with SCRIPT's status; if the VM never printed the
# marker (timeout, panic) it says so and exits 124 (timeout) or 125.
#
# The base initramfs is cached in /var/tmp/raidkit-md-vm/<kernel version>/;
# SCRIPT goes into a second small cpio archive appended to it (the kernel
# unpacks concatenated archives), so the cache never depends on SCRIPT.
#
# Environment: MDVM_KERNEL=<version> picks a kernel (default: the newest in
# /boot that has /lib/modules/<version>); MDVM_LOG=<file> keeps the whole
# console log; MDVM_APPEND adds kernel command-line words; MDVM_ACCEL=kvm
# uses KVM instead of TCG software emulation.
# Packages: qemu-system-x86 linux-image-amd64 mdadm busybox-static kmod cpio
set -eu

timeout_s=300
mem=512
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout) timeout_s=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "md-vm: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 1 ]; then
  echo "usage: $0 [--timeout SECS] [--mem MIB] SCRIPT DISK.img..." >&2
  exit 2
fi
script=$1; shift
[ -r "$script" ] || { echo "md-vm: cannot read $script" >&2; exit 2; }
for d in "$@"; do
  [ -f "$d" ] || [ -b "$d" ] || { echo "md-vm: no such disk image $d" >&2; exit 2; }
done
[ $# -le 24 ] || { echo "md-vm: at most 24 disks" >&2; exit 2; }
for t in qemu-system-x86_64 cpio gzip modprobe; do
  command -v "$t" >/dev/null || { echo "md-vm: $t missing (run scripts/deps.sh)" >&2; exit 2; }
done

# --- pick the kernel --------------------------------------------------------
kver=${MDVM_KERNEL:-}
if [ -z "$kver" ]; then
  for k in $(ls /boot/vmlinuz-* 2>/dev/null | sed 's|^/boot/vmlinuz-||' | sort -V); do
    [ -d "/lib/modules/$k" ] && kver=$k
  done
fi
if [ -z "$kver" ] || [ ! -r "/boot/vmlinuz-$kver" ]; then
  echo "md-vm: no /boot/vmlinuz-* with modules; apt-get install linux-image-amd64" >&2
  exit 2
fi
kernel=/boot/vmlinuz-$kver

# --- build (or reuse) the base initramfs ----------------------------------
cache=/var/tmp/raidkit-md-vm/$kver
base=$cache/base-v1.cpio.gz   # bump v1 when the /init below changes
mdadm_bin=$(command -v mdadm || echo /sbin/mdadm)
busybox_bin=/bin/busybox
[ -x "$mdadm_bin" ] || { echo "md-vm: mdadm missing" >&2; exit 2; }
[ -x "$busybox_bin" ] || { echo "md-vm: /bin/busybox (busybox-static) missing" >&2; exit 2; }

stale=0
if [ ! -s "$base" ]; then stale=1
else
  for f in "$kernel" "$mdadm_bin" "$busybox_bin" "$0"; do
    [ "$f" -nt "$base" ] && stale=1
  done
fi

build_base() {
  local root mods m path params out
  mkdir -p "$cache"
  root=$(mktemp -d "$cache/root.XXXXXX")
  mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,run/mdadm,etc/mdadm,lib/modules,mnt}
  # Debian's busybox-static is a real static binary; refuse a dynamic one.
  if ldd "$busybox_bin" >/dev/null 2>&1; then
    echo "md-vm: $busybox_bin is dynamically linked; install busybox-static" >&2
    return 1
  fi
  cp "$busybox_bin" "$root/bin/busybox"
  for a in $("$busybox_bin" --list); do
    [ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"
  done
  cp "$mdadm_bin" "$root/sbin/mdadm"
  # Shared libraries exactly where ldd says (including the loader path).
  for lib in $(ldd "$mdadm_bin" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  # HOMEHOST <none>: the superblock name is not tied to the VM's hostname.
  # No MAILADDR/PROGRAM, and no mdmon: only external metadata needs it.
  printf 'DEVICE /dev/vd*\nHOMEHOST <none>\nCREATE owner=root group=root mode=0660 auto=yes\n' \
    > "$root/etc/mdadm/mdadm.conf"
  echo 'root:x:0:0:root:/:/bin/sh' > "$root/etc/passwd"
  echo 'root:x:0:' > "$root/etc/group"
  # Modules: virtio (disks) + md personalities, in the order modprobe would
  # load them (dependencies first); duplicates dropped, options dropped
  # (Debian's start_ro=1 comes from the host's modprobe.d, not wanted here).
  : > "$root/lib/modules/order"
  for m in virtio_pci virtio_blk md-mod linear raid0 raid1 raid10 raid456; do
    if ! out=$(modprobe -S "$kver" --show-depends "$m" 2>/dev/null); then
      echo "md-vm: note: module $m not found for $kver (skipped)" >&2
      continue
    fi
    printf '%s\n' "$out" | while read -r kind path params; do
      [ "$kind" = insmod ] || continue   # "builtin ..." lines need nothing
      name=$(basename "$path"); name=${name%.xz}; name=${name%.zst}; name=${name%.gz}
      grep -qx "$name" "$root/lib/modules/order" && continue
      # Decompress on the host: busybox insmod may not read .ko.xz/.ko.zst.
      case "$path" in
        *.xz) xz -dc "$path" > "$root/lib/modules/$name" ;;
        *.zst) zstd -qdc "$path" > "$root/lib/modules/$name" ;;
        *.gz) gzip -dc "$path" > "$root/lib/modules/$name" ;;
        *) cp "$path" "$root/lib/modules/$name" ;;
      esac
      echo "$name" >> "$root/lib/modules/order"
    done
  done
  if [ "$(id -u)" -eq 0 ]; then
    mknod -m 600 "$root/dev/console" c 5 1
    mknod -m 666 "$root/dev/null" c 1 3
  fi
  cat > "$root/init" <<'EOF'
#!/bin/sh
# PID 1 of the md-vm initramfs.
export PATH=/sbin:/bin HOME=/ MDADM_NO_SYSTEMCTL=1 MDADM_NO_UDEV=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mkdir -p /run/mdadm /tmp /dev/md
ndisks=0
for w in $(cat /proc/cmdline); do
  case "$w" in mdvm.ndisks=*) ndisks=${w#mdvm.ndisks=} ;; esac
done
for m in $(cat /lib/modules/order); do
  # crc32c-intel needs SSE4.2, absent on qemu's default CPU: harmless.
  insmod /lib/modules/$m 2>/dev/null || echo "md-vm: insmod $m failed (ignored)"
done
# virtio disks probe asynchronously: wait until all of them are there.
i=0
while [ "$(ls -d /sys/block/vd* 2>/dev/null | wc -l)" -lt "$ndisks" ] && [ $i -lt 100 ]; do
  sleep 0.1; i=$((i+1))
done
for b in /sys/block/vd*; do
  [ -e "$b" ] || continue
  [ -b /dev/${b##*/} ] || mknod /dev/${b##*/} b $(tr ':' ' ' < $b/dev)
done
export MDVM_NDISKS=$ndisks
echo "MDVM-BEGIN"
cd /
sh /mdvm-script </dev/null
rc=$?
sync
echo "MDVM-EXIT=$rc"
sync
poweroff -f
sleep 5
EOF
  chmod 755 "$root/init"
  ( cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 ) > "$base.tmp.$$"
  mv -f "$base.tmp.$$" "$base"   # atomic: concurrent runs never see half a file
  rm -rf "$root"
}

if [ "$stale" = 1 ]; then
  echo "md-vm: building initramfs for $kver in $cache" >&2
  build_base
fi

# --- per-run pieces ----------------------------------------------------------
work=$(mktemp -d /tmp/md-vm.XXXXXX)
qpid=
cleanup() {
  # timeout(1) normally reaps qemu; this covers signals sent to us.
  [ -n "$qpid" ] && kill "$qpid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir "$work/s"
cp "$script" "$work/s/mdvm-script"
( cd "$work/s" && echo mdvm-script | cpio -o -H newc --quiet | gzip -1 ) > "$work/script.cpio.gz"
cat "$base" "$work/script.cpio.gz" > "$work/initrd"

drives=()
for d in "$@"; do
  # Commas in file names must be doubled for qemu's option parser.
  drives+=(-drive "file=${d//,/,,},format=raw,if=virtio,cache=unsafe")
done
# TCG by default: on this kind of host /dev/kvm can exist yet not work
# (qemu aborts setting MSRs), so KVM is opt-in via MDVM_ACCEL=kvm.
accel=${MDVM_ACCEL:-tcg}
ncpu=$(nproc 2>/dev/null || echo 1); [ "$ncpu" -gt 2 ] && ncpu=2

log=$work/console.log
start=$(date +%s)
set +e
# Console goes to a file (not the terminal) so a tty is never put in raw mode
# and a run under CI behaves like one by hand; -no-reboot plus panic=1 turns a
# kernel panic into a qemu exit instead of a hang.
timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
  -machine pc,accel=$accel -cpu max -smp "$ncpu" -m "$mem" \
  -display none -monitor none -serial "file:$log" -no-reboot \
  -kernel "$kernel" -initrd "$work/initrd" \
  -append "console=ttyS0 quiet loglevel=3 panic=1 mdvm.ndisks=$# ${MDVM_APPEND:-}" \
  "${drives[@]}" </dev/null &
qpid=$!
wait "$qpid"
qrc=$?
qpid=
set -e
end=$(date +%s)

tr -d '\r' < "$log" > "$log.txt"
[ -n "${MDVM_LOG:-}" ] && cp "$log.txt" "$MDVM_LOG"
if ! grep -q '^MDVM-EXIT=[0-9]*$' "$log.txt"; then
  tail -n 40 "$log.txt" >&2
  if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
    echo "md-vm: TIMEOUT after ${timeout_s}s: the VM never printed MDVM-EXIT" >&2
    exit 124
  fi
  echo "md-vm: VM exited (qemu status $qrc) without printing MDVM-EXIT" >&2
  exit 125
fi
# SCRIPT's output is what lies between the two markers.
sed -n '/^MDVM-BEGIN$/,/^MDVM-EXIT=/p' "$log.txt" | sed '1d;$d'
rc=$(grep -m1 '^MDVM-EXIT=' "$log.txt" | sed 's/^MDVM-EXIT=//')
echo "md-vm: script exited $rc; VM run took $((end - start))s ($accel)" >&2
exit "$rc"
