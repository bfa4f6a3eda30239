#!/usr/bin/env bash
# Install the Debian packages raidkit's tests and demo use (NBD clients,
# fio, FUSE, ext4 tools, strace for the flush test, curl, Chromium and the
# Prometheus client library for the status page and metrics tests), and the C compiler and headers that build the
# member crate's small C shim (csrc/guard.c) and link OpenSSL (TLS with
# pre-shared keys; gnutls-bin's psktool makes key files), and what scripts/md-vm.sh needs to
# run Linux md + mdadm in a qemu VM (kernel, qemu, mdadm, static busybox, kmod,
# cpio; openssl makes md-fixtures.sh's payload). Does nothing when they are all
# present.
set -euo pipefail
pkgs=(gcc g++ libc6-dev pkg-config libssl-dev gnutls-bin libnbd-bin python3-libnbd qemu-utils fio nbdkit e2fsprogs fuse3 util-linux procps strace curl chromium python3-prometheus-client qemu-system-x86 linux-image-amd64 mdadm busybox-static kmod cpio openssl iproute2)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
