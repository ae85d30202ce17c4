#!/usr/bin/env bash
# Runs the unit and integration suites again as an unprivileged user: the HPC case, where bwrap
# runs without root. The test binaries are copied to a folder that user can read.
# Then the image tests once more as nshpc-sub, the user with a range in /etc/subuid and
# /etc/subgid that scripts/test-image.sh (make test's set-up) makes and builds image 'test' for.
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
# as_user USER COMMAND...: COMMAND as USER, with only the environment a login would give.
as_user() {
  local who=$1
  shift
  runuser -u "$who" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$(getent passwd "$who" | cut -d: -f6)" \
    LANG=C.UTF-8 NSHPC_BINARY="$dir/ns-hpc" NSHPC_PROBE="$dir/nshpc_probe" "$@"
}
echo "test-as-user: unit and integration suites as '$user' (uid $(id -u "$user"))"
# Every pass runs, whichever failed before; the script fails when any did.
failed=()
as_user "$user" ./nshpc_unit --gtest_brief=1 || failed+=("unit as $user")
# Its whole output is kept: a pass that fails (or is killed) shows the tests it ran last.
if ! as_user "$user" ./nshpc_integration >"$dir/integration.log" 2>&1; then
  failed+=("integration as $user")
  echo "test-as-user: the integration suite as $user failed; its failures and the last tests it ran:"
  grep -E '^\[  FAILED|Failure$' "$dir/integration.log" | head -40
  grep -E '^\[ RUN|^\[       OK' "$dir/integration.log" | tail -8
  tail -5 "$dir/integration.log"
fi

sub=nshpc-sub
if ! id -u "$sub" >/dev/null 2>&1; then
  echo "test-as-user: no user '$sub': scripts/test-image.sh (run as root by make test) makes it; its image tests did not run"
  failed+=("no $sub")
else
  echo "test-as-user: image and desktop tests as '$sub' (uid $(id -u "$sub"); /etc/subuid: $(grep "^$sub:" /etc/subuid | head -1))"
  as_user "$sub" ./nshpc_integration --gtest_brief=1 \
    --gtest_filter='ImageInstance*:SnapshotsOnImage*:Images*:Desktop.*:DesktopSession.*' ||
    failed+=("image and desktop tests as $sub")
fi
if ((${#failed[@]})); then
  echo "test-as-user: failed: ${failed[*]}"
  exit 1
fi
