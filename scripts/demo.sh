#!/usr/bin/env bash
# raidkit's main job on a built-in default: a file-backed RAID-5 of four
# members under ./raidkit-demo, checked offline (written, read back whole and
# degraded), then served over NBD on 127.0.0.1:10809 until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "demo: cargo (Rust) is needed: https://rustup.rs" >&2; exit 1; }
./scripts/deps.sh
cargo build --release --quiet
R=target/release/raidkit
D=raidkit-demo
mkdir -p "$D"
M=("$D/disk0.img" "$D/disk1.img" "$D/disk2.img" "$D/disk3.img")
if ! "$R" detail "${M[@]}" >/dev/null 2>&1; then
  rm -f "${M[@]}"
  "$R" create --level 5 --chunk 512K --size 64M --name demo "${M[@]}"
fi
head -c 8M /dev/urandom > "$D/sample.bin"
"$R" write "${M[@]}" --offset 1M --in "$D/sample.bin"
"$R" read "${M[@]}" --offset 1M --length 8M --out "$D/readback.bin"
cmp "$D/sample.bin" "$D/readback.bin" && echo "demo: 8 MiB written and read back identical"
"$R" read "${M[0]}" "${M[1]}" "${M[3]}" --offset 1M --length 8M --out "$D/readback.bin" 2>/dev/null
cmp "$D/sample.bin" "$D/readback.bin" && echo "demo: read back identical with disk2 missing (degraded RAID-5)"
rm -f "$D/readback.bin"
"$R" detail "${M[@]}"
echo
echo "demo: serving the array; in another terminal: $R status   (Ctrl-C here stops it cleanly)"
exec "$R" serve --listen 127.0.0.1:10809 --export demo "${M[@]}"
