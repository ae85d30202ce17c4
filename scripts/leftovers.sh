#!/usr/bin/env bash
# After the tests: the processes of ours they left running. Usage: leftovers.sh START
# START is when the run began, in clock ticks since boot (field 22 of /proc/PID/stat of the
# process that started it). A process of ours (ns-hpc and its helpers, bwrap and what runs in it,
# pasta, the test binaries and servers, the Slurm cluster's daemons) that started after START and
# still runs is this run's leftover: each is listed with its command line and killed, and the
# script fails. Ours from before the run (an older run, a server someone left running) are only
# listed. Zombies are not running; those of ours are counted (this machine's PID 1 reaps nothing).
set -uo pipefail
start=${1:?usage: leftovers.sh START_TICKS}
ours='^(ns-hpc|mcp-virtual-co|nshpc_.*|bwrap|pasta|pasta\.avx2|passt|slurmctld|slurmd|slurmdbd|munged|mariadbd|node|litmus|rclone)$'
# The run's own ancestors (make, this script's shell) are not leftovers.
declare -A mine=()
p=$$
while [[ $p -gt 1 ]]; do
  mine[$p]=1
  p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null | tail -n1) || break
  [[ -n $p ]] || break
done

# Prints "pid state start comm" for every process; comm may hold spaces, so read past ')'.
processes() {
  for stat in /proc/[0-9]*/stat; do
    line=$(cat "$stat" 2>/dev/null) || continue
    pid=${line%% *}
    comm=${line#*(}
    comm=${comm%)*}
    rest=${line##*) }
    read -r state _ppid _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ starttime _ <<<"$rest"
    printf '%s\t%s\t%s\t%s\n' "$pid" "$state" "$starttime" "$comm"
  done
}

scan() {
  new=() old=() zombies=0
  while IFS=$'\t' read -r pid state starttime comm; do
    [[ -n ${mine[$pid]:-} || $pid == "$BASHPID" ]] && continue
    [[ $comm =~ $ours ]] || continue
    if [[ $state == Z ]]; then
      [[ $starttime -ge $start ]] && zombies=$((zombies + 1))
      continue
    fi
    if [[ $starttime -ge $start ]]; then new+=("$pid"); else old+=("$pid"); fi
  done < <(processes)
}

describe() { printf '  %s %s\n' "$1" "$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | cut -c1-200)"; }

# What is winding down (a sandbox whose last command just ended) gets a few seconds.
for _ in $(seq 20); do
  scan
  [[ ${#new[@]} -eq 0 ]] && break
  sleep 0.5
done
if [[ ${#old[@]} -gt 0 ]]; then
  echo "leftovers: ${#old[@]} process(es) of ours from before this run still run (not this run's; left alone):"
  for pid in "${old[@]}"; do describe "$pid"; done
fi
[[ $zombies -gt 0 ]] && echo "leftovers: $zombies process(es) of this run exited and were never reaped (zombies)"
if [[ ${#new[@]} -gt 0 ]]; then
  echo "leftovers: FAILED: the tests left ${#new[@]} process(es) running (now killed):"
  for pid in "${new[@]}"; do describe "$pid"; done
  for pid in "${new[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  exit 1
fi
echo "leftovers: none: every process this run started has ended"
