#!/usr/bin/env bash
# Runs the integration suite again as an unprivileged user: the HPC case, where bwrap runs
# without root. The test binaries are copied to a folder that user can read.
set -euo pipefail
build=${1:-build}
if [[ $(id -u) -ne 0 ]]; then
  echo "test-as-user: already unprivileged ($(id -un)); the suite above was the non-root run"
  exit 0
fi
user=nshpc-test
home=/var/lib/$user
if ! id -u "$user" >/dev/null 2>&1; then
  useradd --system --create-home --home-dir "$home" --shell /usr/sbin/nologin "$user"
fi
dir=$(mktemp -d /tmp/nshpc-as-user-XXXXXX)
trap 'rm -rf "$dir"' EXIT
chmod 0755 "$dir"
cp "$build/ns-hpc" "$build/tests/nshpc_probe" "$build/tests/nshpc_integration" "$dir/"
echo "test-as-user: integration suite as '$user' (uid $(id -u "$user"))"
cd "$dir"
runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8 \
  NSHPC_BINARY="$dir/ns-hpc" NSHPC_PROBE="$dir/nshpc_probe" \
  ./nshpc_integration --gtest_brief=1
