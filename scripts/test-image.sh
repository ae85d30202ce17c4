#!/usr/bin/env bash
# Set-up for `make test`, like `make deps`: the Debian image the image tests run on, built once
# with `ns-hpc image build` (which reaches the mirror the host's apt uses) and cached outside the
# clone, and a small local apt repository of real .deb files for installs inside instances, so
# that no sandbox in a test talks to anything but a server the test starts on loopback.
#   scripts/test-image.sh BUILD_DIR
# Prints the cache folder's config file on success. As a normal user without a subordinate uid
# range the image cannot be built: it says so and exits 0 (the image tests then skip, saying why).
set -euo pipefail
build=${1:-build}
bin=$build/ns-hpc
if [[ $(id -u) -eq 0 ]]; then
  cache=/var/cache/ns-hpc-test
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/ns-hpc-test
fi
mkdir -p "$cache"
cfg=$cache/config.toml
cat >"$cfg.tmp" <<EOF
# Written by scripts/test-image.sh: the image cache of the integration tests.
[namespace]
images_dir = "$cache/images"
instances_dir = "$cache/instances"
EOF
mv "$cfg.tmp" "$cfg"

if "$bin" -c "$cfg" image list --json | jq -e '.[] | select(.name == "test" and .current)' >/dev/null; then
  echo "test-image: image 'test' is cached in $cache/images"
elif [[ $(id -u) -ne 0 ]] && ! grep -q "^$(id -un):" /etc/subuid 2>/dev/null; then
  echo "test-image: not built: $(id -un) has no range in /etc/subuid (the image tests will skip)"
else
  echo "test-image: building image 'test' in $cache/images (once; about a minute)"
  "$bin" -c "$cfg" image build test --include ca-certificates
fi

# The packages an instance installs in the tests, and their index (dpkg-scanpackages, dpkg-dev).
repo=$cache/repo
if [[ ! -s $repo/Packages ]]; then
  rm -rf "$repo.tmp" && mkdir -p "$repo.tmp" && chmod 0777 "$repo.tmp"  # apt downloads as _apt
  (cd "$repo.tmp" && apt-get download -q hello jq libjq1 libonig5 >/dev/null)
  chmod 0755 "$repo.tmp"
  (cd "$repo.tmp" && dpkg-scanpackages --multiversion . /dev/null 2>/dev/null >Packages)
  rm -rf "$repo" && mv "$repo.tmp" "$repo"
fi
echo "test-image: local apt repository of $(grep -c '^Package:' "$repo/Packages") packages in $repo"
