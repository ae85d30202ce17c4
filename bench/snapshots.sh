#!/usr/bin/env bash
# What factory reset, snapshot and restore cost with a 1 GiB root layer: an image instance writes
# 1 GiB with dd, then `instance reset`, `instance snapshot` and `instance snapshot-restore` are
# timed (their own took_ms: the whole call, the sandbox's stop included, and for reset and restore
# swap_ms, the trees' change of place alone), and the wall time of each CLI command, which also
# removes the old trees before it exits. Reset is a rename, whatever the size; snapshot and
# restore copy (reflinks where the filesystem has them, which is printed).
# Usage: snapshots.sh [NS_HPC_BINARY]. Needs root and make test's image 'test' (else it skips,
# saying why); no network.
set -euo pipefail

NSHPC="$(realpath "${1:-$(dirname "$0")/../build/ns-hpc}")"
CACHE=/var/cache/ns-hpc-test
if [[ $(id -u) -ne 0 ]]; then
  echo "bench snapshots: skipped: image instances need root here"
  exit 0
fi
if [[ ! -e $CACHE/images/test/current ]]; then
  echo "bench snapshots: skipped: no image 'test' in $CACHE/images (scripts/test-image.sh, run by make test, builds it)"
  exit 0
fi
WORK="$(mktemp -d /tmp/nshpc-bench-snap-XXXXXX)"
chmod 755 "$WORK"
cat >"$WORK/config.toml" <<T
[namespace]
instances_dir = "$WORK/instances"
images_dir = "$CACHE/images"
T
ns() { "$NSHPC" -c "$WORK/config.toml" "$@"; }
cleanup() {
  ns instance delete snap-bench -f >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
fill() { ns bwrap snap-bench -- /bin/sh -c 'dd if=/dev/urandom of=/var/big bs=1M count=1024 status=none && sync'; }

ns instance create snap-bench --image test >/dev/null
reflink=no
head -c 4096 /dev/zero >"$WORK/a"
if cp --reflink=always "$WORK/a" "$WORK/b" 2>/dev/null; then reflink=yes; fi
echo "bench snapshots: $(df -T "$WORK" | awk 'NR==2 {print $2}') under $WORK, reflink copies: $reflink"

fill
t=$(date +%s%N); out=$(ns instance reset snap-bench -f --json); wall=$(ms "$t")
echo "factory reset, 1 GiB layer:  took $(jq -r .took_ms <<<"$out") ms (swap $(jq -r .swap_ms <<<"$out") ms); command with the background removal: $wall ms"

fill
t=$(date +%s%N); out=$(ns instance snapshot snap-bench big --json); wall=$(ms "$t")
echo "snapshot, 1 GiB layer:       took $(jq -r .took_ms <<<"$out") ms, $(jq -r '.snapshot.bytes / 1048576 | floor' <<<"$out") MiB; command: $wall ms"

ns instance reset snap-bench -f >/dev/null
t=$(date +%s%N); out=$(ns instance snapshot-restore snap-bench big -f --json); wall=$(ms "$t")
echo "restore, 1 GiB layer:        took $(jq -r .took_ms <<<"$out") ms (swap $(jq -r .swap_ms <<<"$out") ms); command: $wall ms"
size=$(ns bwrap snap-bench -- /bin/sh -c 'stat -c %s /var/big')
[[ $size -eq 1073741824 ]] || { echo "bench snapshots: restored /var/big has $size bytes, not 1 GiB" >&2; exit 1; }
