#!/usr/bin/env bash
# Set-up for `make test`, like `make deps`: the Debian image the image tests run on, built once
# with `ns-hpc image build` (which reaches the mirror the host's apt uses) and cached outside the
# clone, and a small local apt repository of real .deb files for installs inside instances, so
# that no sandbox in a test talks to anything but a server the test starts on loopback.
#   scripts/test-image.sh BUILD_DIR
# Each cache folder holds config.toml (images_dir, instances_dir), images/ and repo/.
#
# As root it also builds image 'test-desktop' (--desktop) in the same cache, and sets up the two
# normal users the suites run as again (scripts/test-as-user.sh),
# each with the same image 'test' built by that user in its own cache, $HOME/.cache/ns-hpc-test:
#   nshpc-sub   a range of 65536 ids in /etc/subuid and /etc/subgid: the image is built in a user
#               namespace of them (root's files are the user's, _apt's the range's start + 41)
#   nshpc-test  no range: the image is built with mmdebstrap --mode=fakechroot (every file is the
#               user's), when fakechroot and fakeroot are installed
# As a normal user: only that user's own cache; when its build is refused (no range and no
# fakechroot) it says why and exits 0 (the image tests then skip, saying why).
# A second run finds every image cached and builds nothing.
set -euo pipefail
build=${1:-build}
bin=$(realpath "$build/ns-hpc")
range_size=65536

# write_config CACHE: the cache folder's config file.
write_config() {
  local cache=$1
  cat >"$cache/config.toml.tmp" <<EOF
# Written by scripts/test-image.sh: the image cache of the integration tests.
[namespace]
images_dir = "$cache/images"
instances_dir = "$cache/instances"
EOF
  mv "$cache/config.toml.tmp" "$cache/config.toml"
}

# cached CACHE [RUNNER...]: whether image 'test' has a current version in CACHE (listed by
# RUNNER's user).
cached() {
  local cache=$1
  shift
  "$@" "$bin" -c "$cache/config.toml" image list --json | jq -e '.[] | select(.name == "test" and .current)' >/dev/null
}

if [[ $(id -u) -eq 0 ]]; then
  cache=/var/cache/ns-hpc-test
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/ns-hpc-test
fi
mkdir -p "$cache"
write_config "$cache"

if cached "$cache"; then
  echo "test-image: image 'test' is cached in $cache/images"
elif [[ $(id -u) -eq 0 ]]; then
  echo "test-image: building image 'test' in $cache/images (once; about a minute)"
  "$bin" -c "$cache/config.toml" image build test --include ca-certificates
elif ! "$bin" -c "$cache/config.toml" image build test --include ca-certificates; then
  echo "test-image: image 'test' not built as $(id -un) (the reason is above; the image tests will skip)"
fi

# As root, the desktop image of the one root-only desktop test (image build --desktop, about 1 GB).
if [[ $(id -u) -eq 0 ]]; then
  if "$bin" -c "$cache/config.toml" image list --json |
    jq -e '.[] | select(.name == "test-desktop" and .current and .desktop)' >/dev/null; then
    echo "test-image: image 'test-desktop' is cached in $cache/images"
  else
    echo "test-image: building image 'test-desktop' (--desktop) in $cache/images (once; a minute or two, about 1 GB)"
    started=$SECONDS
    "$bin" -c "$cache/config.toml" image build test-desktop --desktop
    echo "test-image: image 'test-desktop' built in $((SECONDS - started)) s"
  fi
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

[[ $(id -u) -eq 0 ]] || exit 0

# --- As root: the normal users of scripts/test-as-user.sh, each with its own cache. ---

# has_range FILE USER: whether USER has a range of at least 65536 ids in FILE.
has_range() {
  awk -F: -v u="$2" -v n="$range_size" '$1 == u && $3 >= n { found = 1 } END { exit !found }' "$1" 2>/dev/null
}

# free_range_start: the first id above every range of /etc/subuid and /etc/subgid (at least
# 100000, login.defs' SUB_UID_MIN), so the new range overlaps none.
free_range_start() {
  cat /etc/subuid /etc/subgid 2>/dev/null |
    awk -F: 'NF >= 3 && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ && $2 + $3 > top { top = $2 + $3 }
             END { print (top > 100000 ? top : 100000) }'
}

make_user() {
  local user=$1
  if ! id -u "$user" >/dev/null 2>&1; then
    useradd --system --create-home --home-dir "/var/lib/$user" --shell /usr/sbin/nologin "$user"
  fi
}

make_user nshpc-test
make_user nshpc-sub
if ! has_range /etc/subuid nshpc-sub || ! has_range /etc/subgid nshpc-sub; then
  start=$(free_range_start)
  args=()
  has_range /etc/subuid nshpc-sub || args+=(--add-subuids "$start-$((start + range_size - 1))")
  has_range /etc/subgid nshpc-sub || args+=(--add-subgids "$start-$((start + range_size - 1))")
  usermod "${args[@]}" nshpc-sub
  echo "test-image: gave nshpc-sub ${args[*]}"
fi

# The binary where the users can run it (the build folder may be in a home they cannot read).
dir=$(mktemp -d /tmp/nshpc-test-image-XXXXXX)
trap 'rm -rf "$dir"' EXIT
chmod 0755 "$dir"
cp "$bin" "$dir/ns-hpc"
bin=$dir/ns-hpc
cd /  # runuser keeps the folder, which the users may not be able to read

for user in nshpc-sub nshpc-test; do
  home=$(getent passwd "$user" | cut -d: -f6)
  as_user=(runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8)
  ucache=$home/.cache/ns-hpc-test
  "${as_user[@]}" mkdir -p "$ucache"
  "${as_user[@]}" bash -c "$(declare -f write_config); write_config '$ucache'"
  # root's repository, as the user's own (the tests add it to instances from this folder).
  if ! cmp -s "$repo/Packages" "$ucache/repo/Packages"; then
    rm -rf "$ucache/repo.tmp" "$ucache/repo"
    cp -r "$repo" "$ucache/repo.tmp"
    chown -R "$user:" "$ucache/repo.tmp"
    mv "$ucache/repo.tmp" "$ucache/repo"
  fi
  if cached "$ucache" "${as_user[@]}"; then
    echo "test-image: image 'test' of $user is cached in $ucache/images"
    continue
  fi
  if [[ $user == nshpc-test ]] && ! { command -v fakechroot && command -v fakeroot; } >/dev/null; then
    echo "test-image: image 'test' of $user not built: it has no subordinate range, and its build needs" \
         "fakechroot and fakeroot (make deps installs them); its image tests will skip"
    continue
  fi
  echo "test-image: building image 'test' as $user in $ucache/images (once; about a minute)"
  "${as_user[@]}" "$bin" -c "$ucache/config.toml" image build test --include ca-certificates
done
