#!/usr/bin/env bash
# What a desktop costs to start and to keep: `ns-hpc instance desktop ID on` until the window
# manager lists the session's windows, timed cold (the instance's sandbox not running: the sandbox
# and the session start) and warm (the sandbox runs, the desktop switched off and on in place),
# and the memory of the session's processes once idle (Xvfb, the window manager, panel, desktop,
# buses, AT-SPI: the PSS of the sandbox's processes before and after). Runs on the host's root with [desktop] host_root (the host's Xfce packages), and on
# make test's desktop image 'test-desktop' when it is built (as root).
# Usage: desktop.sh [NS_HPC_BINARY] [ROUNDS]. No network.
set -euo pipefail

NSHPC="$(realpath "${1:-$(dirname "$0")/../build/ns-hpc}")"
ROUNDS="${2:-3}"
for program in Xvfb xfwm4 xfce4-panel; do
  if ! command -v "$program" >/dev/null; then
    echo "bench desktop: skipped: $program is not installed (make deps installs the desktop group)"
    exit 0
  fi
done
WORK="$(mktemp -d /tmp/nshpc-bench-desktop-XXXXXX)"
chmod 755 "$WORK"
CACHE=/var/cache/ns-hpc-test
cat >"$WORK/config.toml" <<T
[namespace]
instances_dir = "$WORK/instances"
images_dir = "$CACHE/images"
[desktop]
host_root = true
image = "test-desktop"
T
ns() { "$NSHPC" -c "$WORK/config.toml" "$@"; }
cleanup() {
  for id in desk-host desk-image; do ns instance delete "$id" -f >/dev/null 2>&1 || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# Memory of the instance's sandbox, in KiB: the proportional set size of its processes (shared
# pages split among the processes sharing them; resident size counts them in each).
pss_kib() {
  local total=0 pid
  for pid in $(ns instance ps "$1" --json | jq -r '.[].pid'); do
    total=$(( total + $(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0) ))
  done
  echo "$total"
}
# Switches the desktop on and waits until the window manager lists windows (the panel, the
# desktop): ready to be looked at. Prints the milliseconds it took.
on_until_ready() {
  local t
  t=$(date +%s%N)
  ns instance desktop "$1" on >/dev/null
  until ns bwrap "$1" -- sh -c 'xprop -root _NET_CLIENT_LIST 2>/dev/null | grep -q 0x'; do sleep 0.02; done
  ms "$t"
}

measure() {
  local id=$1 what=$2
  local cold=() warm=()
  for _ in $(seq "$ROUNDS"); do
    ns instance stop "$id" >/dev/null
    ns instance desktop "$id" off >/dev/null
    cold+=("$(on_until_ready "$id")")
    ns instance desktop "$id" off >/dev/null
    warm+=("$(on_until_ready "$id")")
  done
  ns instance desktop "$id" off >/dev/null
  local before after
  before=$(pss_kib "$id")
  ns instance desktop "$id" on >/dev/null
  sleep 5
  after=$(pss_kib "$id")
  printf '%-34s cold %s ms, warm %s ms (each of %s rounds); idle session %d MiB (PSS)\n' "$what" \
    "$(IFS=/; echo "${cold[*]}")" "$(IFS=/; echo "${warm[*]}")" "$ROUNDS" $(( (after - before) / 1024 ))
}

ns instance create desk-host --persistent --network off >/dev/null
measure desk-host "desktop on the host's root:"
if [[ $(id -u) -eq 0 && -e $CACHE/images/test-desktop/current ]]; then
  ns instance create desk-image --image test-desktop --network off >/dev/null
  measure desk-image "desktop on image test-desktop:"
else
  echo "desktop on image test-desktop: skipped (as root, after scripts/test-image.sh builds it)"
fi
