#!/usr/bin/env bash
# How ns-hpc watches many Slurm jobs: a counting fake scheduler (sbatch prints increasing ids,
# squeue/sacct count their calls and report every asked job as RUNNING) stands in for Slurm;
# N jobs are submitted with the CLI, then one `ns-hpc run` tracks them all. Prints scheduler
# invocations per poll interval and the server's CPU time per interval at 10, 100 and 1000 jobs.
# Usage: slurm_polls.sh [NS_HPC_BINARY]. Needs no cluster; loopback-free.
set -euo pipefail

NSHPC="$(realpath "${1:-$(dirname "$0")/../build/ns-hpc}")"
WORK="$(mktemp -d /tmp/nshpc-bench-slurm-XXXXXX)"
chmod 755 "$WORK"
SERVER=""
cleanup() {
  [[ -n "$SERVER" ]] && kill "$SERVER" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/bin"
cat >"$WORK/bin/sbatch" <<'S'
#!/bin/sh
cat >/dev/null
n=$(( $(cat "$(dirname "$0")/next" 2>/dev/null || echo 1000) + 1 ))
echo "$n" >"$(dirname "$0")/next"
echo "$n"
S
cat >"$WORK/bin/squeue" <<'S'
#!/bin/sh
echo x >>"$(dirname "$0")/squeue.calls"
ids=""
while [ $# -gt 0 ]; do [ "$1" = "-j" ] && ids="$2"; shift; done
echo "$ids" | tr ',' '\n' | while read -r id; do [ -n "$id" ] && echo "$id|RUNNING|None|0|"; done
S
cat >"$WORK/bin/sacct" <<'S'
#!/bin/sh
echo x >>"$(dirname "$0")/sacct.calls"
S
chmod +x "$WORK/bin/"*

INTERVAL=1
cat >"$WORK/config.toml" <<C
[namespace]
instances_dir = "$WORK/instances"
default_image = ""
[jobs]
max_running = 5000
max_running_per_instance = 5000
[jobs.slurm]
poll_interval = $INTERVAL
sbatch_command = ["$WORK/bin/sbatch", "--cpus-per-task={cpus}"]
squeue_command = ["$WORK/bin/squeue"]
sacct_command = ["$WORK/bin/sacct"]
C

ns() { HOME="$WORK" XDG_CONFIG_HOME="$WORK/xdg" "$NSHPC" --config "$WORK/config.toml" "$@"; }
calls() { { cat "$WORK/bin/squeue.calls" "$WORK/bin/sacct.calls" 2>/dev/null || true; } | wc -l; }
# CPU time of every thread of the process, in nanoseconds.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d", s}'; }

echo
echo "ns-hpc bench: Slurm status polling (fake counting scheduler, poll_interval = ${INTERVAL} s)"
echo
printf '  %-14s %28s %26s\n' "tracked jobs" "scheduler calls per poll" "server CPU ms per poll"
ns instance create bench >/dev/null
submitted=0
for target in 10 100 1000; do
  while [[ $submitted -lt $target ]]; do
    ns instance run bench --slurm -t 0 -- true >/dev/null || { echo "slurm_polls.sh: submitting failed" >&2; ns instance run bench --slurm -t 0 -- true; exit 1; }
    submitted=$((submitted + 1))
  done
  # One server watches them all; stdin stays open (a FIFO) so it keeps serving, and closing it
  # ends the server cleanly.
  rm -f "$WORK/stdin"
  mkfifo "$WORK/stdin"
  HOME="$WORK" XDG_CONFIG_HOME="$WORK/xdg" "$NSHPC" --config "$WORK/config.toml" run <"$WORK/stdin" >/dev/null 2>&1 &
  SERVER=$!
  exec 4>"$WORK/stdin"
  sleep 2  # recovery and the first polls
  c0=$(calls); t0=$(cpu_ns "$SERVER")
  sleep 10
  c1=$(calls); t1=$(cpu_ns "$SERVER")
  polls=$(( 10 / INTERVAL ))
  printf '  %-14s %28s %26s\n' "$target" "$(awk -v c=$((c1 - c0)) -v p=$polls 'BEGIN{printf "%.2f", c/p}')" \
    "$(awk -v t=$((t1 - t0)) -v p=$polls 'BEGIN{printf "%.2f", t/p/1e6}')"
  exec 4>&-
  wait "$SERVER" || true
  SERVER=""
done
echo
echo "  target: 1 scheduler call per poll whatever the count (squeue once for all tracked jobs)"
