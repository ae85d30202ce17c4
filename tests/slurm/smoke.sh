#!/usr/bin/env bash
# Smoke test of the cluster that tests/slurm/cluster.sh starts (run `cluster.sh up` first):
# trivial jobs as root and as nshpc-slurm end COMPLETED 0:0 in sacct, `exit 42` ends FAILED 42:0,
# and a job asking more CPUs than the node has stays PENDING (its reason is printed).
# Root only (exit 77 otherwise). Exit 0 when every check passed.
set -euo pipefail
export LC_ALL=C SLURM_CONF=/etc/slurm/slurm.conf
readonly user=nshpc-slurm
if (( EUID != 0 )); then echo "smoke.sh: needs root; skipping" >&2; exit 77; fi

dir=$(mktemp -d /tmp/nshpc-slurm-smoke.XXXXXX)
chmod 1777 "$dir"
trap 'rm -rf "$dir"' EXIT
cd "$dir"
failures=0
now() { local t=$EPOCHREALTIME; echo "${t/./}"; }
check() { # NAME GOT WANT
  if [[ $2 == "$3" ]]; then echo "ok    $1: $2"; else echo "FAIL  $1: got '$2', want '$3'"; failures=$((failures + 1)); fi
}

# final ID: poll sacct until the job is in a terminal state; prints "STATE|EXIT".
final() {
  local id=$1 deadline=$(( $(now) + 60000000 )) line
  while :; do
    line=$(sacct -n -X -P -j "$id" -o State,ExitCode 2>/dev/null | head -n 1)
    case ${line%%|*} in
      COMPLETED|FAILED|CANCELLED*|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL|BOOT_FAIL|DEADLINE|PREEMPTED)
        echo "$line"; return 0 ;;
    esac
    (( $(now) < deadline )) || { echo "TIMEOUT-WAITING|${line}"; return 0; }
    sleep 0.05
  done
}

run_job() { # NAME AS_USER WANT SBATCH_ARGS...
  local name=$1 as=$2 want=$3 t0 id got; shift 3
  t0=$(now)
  if [[ $as == root ]]; then id=$(sbatch --parsable "$@"); else id=$(runuser -u "$as" -- sbatch --parsable "$@"); fi
  got=$(final "$id")
  check "$name (job $id, $(( ($(now) - t0) / 1000 )) ms)" "$got" "$want"
  job_id=$id
}

run_job "root echo hi" root "COMPLETED|0:0" --wrap 'echo hi'; id=$job_id
check "root output" "$(cat "slurm-$id.out" 2>/dev/null)" "hi"
check "root sacct line" "$(sacct -n -X -P -j "$id" -o JobID,State,ExitCode)" "$id|COMPLETED|0:0"
run_job "$user echo hi" "$user" "COMPLETED|0:0" --wrap 'echo hi'; id=$job_id
check "$user output" "$(cat "slurm-$id.out" 2>/dev/null)" "hi"
check "$user owns output" "$(stat -c %U "slurm-$id.out" 2>/dev/null)" "$user"
check "$user sacct user" "$(sacct -n -X -P -j "$id" -o User,Account)" "$user|tests"
run_job "root exit 42" root "FAILED|42:0" --wrap 'exit 42'
run_job "$user exit 42" "$user" "FAILED|42:0" --wrap 'exit 42'

# More CPUs than the node has: it must not run. Print what Slurm does with it.
if out=$(sbatch --parsable -c 64 --wrap true 2>&1); then
  id=$out
  sleep 2
  echo "info  -c 64 (job $id): squeue: $(squeue -h -j "$id" -o '%T %r')"
  check "-c 64 state" "$(squeue -h -j "$id" -o %T)" "PENDING"
  scancel "$id"
else
  echo "info  -c 64: rejected at submit: $out"
fi

if (( failures )); then echo "smoke.sh: $failures check(s) failed"; exit 1; fi
echo "smoke.sh: all checks passed"
