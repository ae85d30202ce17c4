#!/usr/bin/env bash
# `make run`: checks the machine, then shows an instance and a hardened sandbox at work.
set -euo pipefail
nshpc=${1:-build/ns-hpc}
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
say 'ns-hpc doctor'
"$nshpc" doctor || { echo "doctor found a problem: fix it first (see the fix lines above)"; exit 1; }
if ! "$nshpc" instance describe demo >/dev/null 2>&1; then
  say 'ns-hpc instance create demo -d "made by make run"'
  "$nshpc" instance create demo -d "made by make run"
fi
say 'ns-hpc instance list'
"$nshpc" instance list
say "ns-hpc bwrap demo -- sh -c 'id; hostname; pwd; echo hello > hello.txt; ls -l; grep CapEff /proc/self/status'"
"$nshpc" bwrap demo -- sh -c 'id; hostname; pwd; echo hello > hello.txt; ls -l; grep CapEff /proc/self/status'
say "ns-hpc bwrap demo -- sh -c 'touch /etc/x'   # the host stays read-only"
"$nshpc" bwrap demo -- sh -c 'touch /etc/x' || echo "(exit code $? passed through)"
cat <<TXT

Next:
  $nshpc instance enter demo        # an interactive shell in the sandbox
  $nshpc instance describe demo     # where its workspace lives on the host
  $nshpc --help                     # everything else
TXT
