#!/usr/bin/env bash
# Runs the unit and integration suites again as an unprivileged user: the HPC case, where bwrap
# runs without root. The test binaries are copied to a folder that user can read.
set -euo pipefail
build=${1:-build}
if [[ $(id -u) -ne 0 ]]; then
  echo "test-as-user: skipped: already unprivileged ($(id -un)), so the integration tests ran as a normal user"
  exit 77
fi
user=nshpc-test
home=/var/lib/$user
if ! id -u "$user" >/dev/null 2>&1; then
  useradd --system --create-home --home-dir "$home" --shell /usr/sbin/nologin "$user"
fi
dir=$(mktemp -d /tmp/nshpc-as-user-XXXXXX)
trap 'rm -rf "$dir"' EXIT
chmod 0755 "$dir"
cp "$build/ns-hpc" "$build/tests/nshpc_probe" "$build/tests/nshpc_integration" \
   "$build/tests/nshpc_unit" "$dir/"
cd "$dir"
as_user() {
  runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8 \
    NSHPC_BINARY="$dir/ns-hpc" NSHPC_PROBE="$dir/nshpc_probe" "$@"
}
echo "test-as-user: unit and integration suites as '$user' (uid $(id -u "$user"))"
as_user ./nshpc_unit --gtest_brief=1
as_user ./nshpc_integration --gtest_brief=1
