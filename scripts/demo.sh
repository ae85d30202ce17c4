#!/usr/bin/env bash
# `make demo`: checks the machine, then shows an instance and a hardened sandbox at work.
set -euo pipefail
nshpc=${1:-build/ns-hpc}
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
say 'ns-hpc doctor --fix   # --fix builds the default Debian image when it is missing (a minute or two)'
"$nshpc" doctor --fix || { echo "doctor found a problem: fix it first (see the fix lines above)"; exit 1; }
if ! "$nshpc" instance describe demo >/dev/null 2>&1; then
  say 'ns-hpc instance create demo -d "made by make demo"'
  "$nshpc" instance create demo -d "made by make demo"
fi
say 'ns-hpc instance list'
"$nshpc" instance list
say "ns-hpc bwrap demo -- sh -c 'id; hostname; pwd; echo hello > hello.txt; ls -l; grep CapEff /proc/self/status'"
"$nshpc" bwrap demo -- sh -c 'id; hostname; pwd; echo hello > hello.txt; ls -l; grep CapEff /proc/self/status'
say "ns-hpc bwrap demo -- sh -c 'touch /etc/x'   # the host stays read-only"
"$nshpc" bwrap demo -- sh -c 'touch /etc/x' || echo "(exit code $? passed through)"
if "$nshpc" image list --json | jq -e '.[] | select(.current)' >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
  if ! "$nshpc" instance describe demo-root >/dev/null 2>&1; then
    say 'ns-hpc instance create demo-root --image -d "a Debian root of its own, made by make demo"'
    "$nshpc" instance create demo-root --image -d "a Debian root of its own, made by make demo"
  fi
  say "ns-hpc bwrap demo-root -- sh -c 'id; echo \"changed by the agent\" > /etc/motd; useradd -m ada 2>/dev/null; id ada'"
  "$nshpc" bwrap demo-root -- sh -c 'id; echo "changed by the agent" > /etc/motd; useradd -m ada 2>/dev/null; id ada'
  say 'ns-hpc instance restart demo-root && ns-hpc bwrap demo-root -- cat /etc/motd   # what it changed stays'
  "$nshpc" instance restart demo-root
  "$nshpc" bwrap demo-root -- cat /etc/motd
  "$nshpc" instance stop demo-root >/dev/null
fi
cat <<TXT

Next:
  $nshpc instance enter demo        # an interactive shell in the sandbox
  $nshpc instance describe demo     # where its workspace lives on the host
  COMPUTER_ID=agent-workstation $nshpc computer
                                    # one persistent computer over MCP, as mcp-virtual-computer serves it
  $nshpc --help                     # everything else
TXT
