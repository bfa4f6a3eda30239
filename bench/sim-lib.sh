# Shared by the bench scripts on simulated disks (sourced, not run):
# `sim_setup NAME` builds raidkit (unless RAIDKIT names a binary), sets R
# to it, makes a work directory W on the RAM disk, and removes it and
# stops the server whose PID is in PID on exit; `sim FILE` names FILE as a
# simulated disk of bandwidth BW and seek time SEEK.
sim_setup() {
  if [ -z "${RAIDKIT:-}" ]; then
    cargo build --release --quiet
    RAIDKIT=$PWD/target/release/raidkit
  fi
  R=$RAIDKIT
  W=$(mktemp -d "/dev/shm/raidkit-$1.XXXXXX")
  PID=
  trap sim_cleanup EXIT
}
sim_cleanup() {
  [ -n "$PID" ] && kill "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$W"
}
sim() { echo "sim:$1?bw=$BW&seek=$SEEK"; }
