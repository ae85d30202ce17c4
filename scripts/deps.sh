#!/usr/bin/env bash
# Installs the missing Debian packages given as arguments (when root), or prints the exact
# apt-get line and fails (when not root). With --optional first, a normal user is shown the line
# and nothing fails: those packages serve features that say what they lack when they are used.
set -euo pipefail
optional=false
if [[ ${1:-} == --optional ]]; then
  optional=true
  shift
fi
missing=()
for pkg in "$@"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ $(id -u) -ne 0 ]]; then
  if $optional; then
    echo "ns-hpc: optional packages missing (ns-hpc doctor says what each feature lacks). To have them all, ask an administrator to run:" >&2
    echo "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
    exit 0
  fi
  echo "ns-hpc: missing Debian packages. Ask an administrator to run:" >&2
  echo "  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "ns-hpc: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
