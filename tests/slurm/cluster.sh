#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, for tests that submit jobs to Slurm.
#
#   tests/slurm/cluster.sh up       install what is missing (Debian), then start munged, mariadbd,
#                                   slurmdbd, slurmctld and slurmd; returns when the node is idle
#                                   and `sacct` answers. A quick health check when already up.
#   tests/slurm/cluster.sh down     cancel every job, wait until squeue is empty, then stop slurmd,
#                                   slurmctld, slurmdbd, mariadbd and munged. A no-op when down.
#   tests/slurm/cluster.sh status   one line per daemon plus `sinfo`; exit 0 when all five run, else 3.
#   tests/slurm/cluster.sh purge    down, then drop the accounting database, the configs, the
#                                   controller state, the logs and the test user (packages stay).
#
# Root only: exits 77 otherwise, so ctest can skip (SKIP_RETURN_CODE 77).
#
# Layout (loopback only): SlurmctldHost=localhost, NodeName=localhost NodeAddr=127.0.0.1, the CPU
# layout from `slurmd -C` and 85 % of its memory, one partition `cpu` (Default=YES). Accounting as
# on real clusters: accounting_storage/slurmdbd + jobacct_gather/linux, with MariaDB on its Unix
# socket only (--skip-networking); jobcomp/filetxt is kept, so `sacct -c` works as well.
# proctrack/linuxproc + task/none: no cgroup setup needed (this machine is cgroup v1 hybrid; the
# cgroup plugins are neither needed nor used).
#
# The controller state (job id sequence) and the database are kept across down/up: wiping only one
# of them makes job ids restart at 1 and collide in `sacct`. `purge` removes both. If the state is
# found missing while the database has job records, `up` empties the database.
#
# Tests: submit as the unprivileged user with `runuser -u nshpc-slurm -- sbatch --parsable ...`
# (output into a 1777 or user-owned directory) and read final states with
# `sacct -n -X -P -j ID -o JobID,State,ExitCode` (always select by -j).
#
# No systemd is assumed (PID 1 may be anything): daemons are started by hand and stopped by the PID
# in their own pid files, never by program name. Timings go to stderr.
set -euo pipefail
export LC_ALL=C PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export SLURM_CONF=/etc/slurm/slurm.conf

readonly me=cluster.sh
readonly cluster=ci account=tests test_user=nshpc-slurm partition=cpu
readonly packages=(munge slurm-client slurmctld slurmd slurmdbd slurm-wlm-mysql-plugin
                   mariadb-server mariadb-client)
readonly slurm_conf=/etc/slurm/slurm.conf dbd_conf=/etc/slurm/slurmdbd.conf
readonly state_dir=/var/lib/slurm/slurmctld spool_dir=/var/lib/slurm/slurmd slurm_log=/var/log/slurm
readonly mysql_run=/run/mysqld mysql_data=/var/lib/mysql mysql_log=/var/log/mysql
readonly mysql_sock=/run/mysqld/mysqld.sock
# Our own pid file name: a mariadbd started by anything else (e.g. /etc/init.d/mariadb writes
# mysqld.pid) is never taken for ours, nor stopped by us.
readonly mysql_pid=/run/mysqld/nshpc-slurm-cluster.pid
readonly db_name=slurm_acct_db
readonly lock_file=/run/lock/nshpc-slurm-cluster.lock

# Daemons in start order, with their pid files and logs.
readonly daemons=(munged mariadbd slurmdbd slurmctld slurmd)
declare -rA pid_file=([munged]=/run/munge/munged.pid [mariadbd]=$mysql_pid
  [slurmdbd]=/run/slurmdbd.pid [slurmctld]=/run/slurmctld.pid [slurmd]=/run/slurmd.pid)
declare -rA log_file=([munged]=/var/log/munge/munged.log [mariadbd]=$mysql_log/error.log
  [slurmdbd]=$slurm_log/slurmdbd.log [slurmctld]=$slurm_log/slurmctld.log
  [slurmd]=$slurm_log/slurmd.log)

usage() {
  cat >&2 <<EOF
usage: $me up|down|status|purge   (as root; exits 77 otherwise)
  up      install what is missing, start munged, mariadbd, slurmdbd, slurmctld, slurmd
          (a quick health check when already up); ends with the node idle and sacct answering
  down    cancel all jobs, wait for an empty queue, stop the five daemons (no-op when down)
  status  one line per daemon and sinfo; exit 0 when all run, 3 otherwise
  purge   down, then drop the accounting database, configs, state, logs and user $test_user
EOF
  exit 2
}

# ---------------------------------------------------------------- helpers
now_us() { local t=$EPOCHREALTIME; echo "${t/./}"; }
secs() { # microseconds -> "1.23"
  local us=$1; printf '%d.%02d' $((us / 1000000)) $((us % 1000000 / 10000))
}
t_start=$(now_us)
note() { echo "$me: [$(secs $(( $(now_us) - t_start )))] $*" >&2; }

tmp=
cleanup() { [[ -n $tmp ]] && rm -rf "$tmp"; return 0; }
trap cleanup EXIT

# fail MESSAGE [LOG...]: print MESSAGE and the tail of each log, then exit 1.
fail() {
  local msg=$1 log; shift
  echo "$me: error: $msg" >&2
  for log in "$@"; do
    if [[ -s $log ]]; then
      echo "---- last lines of $log ----" >&2
      tail -n 25 "$log" >&2
    fi
  done
  exit 1
}

# pid_alive PID COMM: true if PID is a live (not zombie) process named COMM. PID 1 may reap our
# exited daemons late, so `kill -0` would still succeed on them: read /proc/PID/stat instead.
pid_alive() {
  local pid=$1 want=$2 stat comm rest
  [[ $pid =~ ^[1-9][0-9]*$ ]] || return 1
  read -r stat 2>/dev/null <"/proc/$pid/stat" || return 1
  comm=${stat#*(}; comm=${comm%)*}
  rest=${stat##*) }
  [[ ${rest%% *} != [ZX] && $comm == "$want" ]]
}

# daemon_pid NAME: print the pid of NAME from its pid file if that process is alive.
daemon_pid() {
  local f=${pid_file[$1]} pid
  [[ -r $f ]] || return 1
  read -r pid <"$f" 2>/dev/null || return 1
  pid_alive "$pid" "$1" || return 1
  echo "$pid"
}

# wait_until SECONDS WHAT DAEMON LOG -- CMD...: poll CMD every 0.1 s until it succeeds. Fails with
# the command's last output and the log's tail after SECONDS, or at once if DAEMON has died.
last_out='' assoc_out=''
wait_until() {
  local seconds=$1 what=$2 daemon=$3 log=$4; shift 5
  local deadline=$(( $(now_us) + seconds * 1000000 ))
  while ! last_out=$("$@" 2>&1); do
    if [[ -n $daemon ]] && ! daemon_pid "$daemon" >/dev/null; then
      fail "$what: $daemon exited${last_out:+ (last check said: ${last_out//$'\n'/ })}" "$log"
    fi
    if (( $(now_us) > deadline )); then
      fail "$what: not ready after ${seconds} s${last_out:+ (last check said: ${last_out//$'\n'/ })}" "$log"
    fi
    sleep 0.1
  done
}

# stop_daemon NAME [SECONDS]: SIGTERM the pid in NAME's pid file, wait (zombie-aware), SIGKILL if
# it is still alive after SECONDS.
stop_daemon() {
  local name=$1 seconds=${2:-30} pid t0 deadline
  if ! pid=$(daemon_pid "$name"); then
    note "$name: not running"
    return 0
  fi
  t0=$(now_us); deadline=$(( t0 + seconds * 1000000 ))
  kill -TERM "$pid" 2>/dev/null || true
  while pid_alive "$pid" "$name"; do
    if (( $(now_us) > deadline )); then
      note "$name: pid $pid still alive after ${seconds} s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$(( $(now_us) + 10 * 1000000 ))
      while pid_alive "$pid" "$name"; do
        (( $(now_us) > deadline )) && fail "$name: pid $pid survives SIGKILL" "${log_file[$name]}"
        sleep 0.05
      done
      break
    fi
    sleep 0.02
  done
  note "$name: stopped (pid $pid, $(secs $(( $(now_us) - t0 ))) s)"
}

# close_fds: close every fd above 2 of this (sub)shell, so that no daemon we start keeps our lock
# file, or a caller's pipe (ctest, CI log capture), open.
close_fds() {
  local fd
  for fd in /proc/"$BASHPID"/fd/*; do
    fd=${fd##*/}
    if (( fd > 2 )); then eval "exec $fd>&-"; fi
  done
}
# detached CMD...: run CMD (which daemonizes) with only fds 0-2 open.
detached() { ( close_fds; exec "$@" ); }

# start_daemon NAME CMD...: run a daemonizing CMD; fail with its output and log if it exits non-zero.
start_daemon() {
  local name=$1; shift
  if ! detached "$@" </dev/null >"$tmp/$name.out" 2>&1; then
    cat "$tmp/$name.out" >&2
    fail "$name: failed to start: $*" "${log_file[$name]}"
  fi
}

have_pkg() {
  [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

mysql_root() { mariadb --socket="$mysql_sock" -u root "$@"; }

# --------------------------------------------------------------- install
install_packages() {
  local p missing=() added_policy=0
  for p in "${packages[@]}"; do have_pkg "$p" || missing+=("$p"); done
  (( ${#missing[@]} )) || return 0
  note "installing: ${missing[*]}"
  # Without systemd the postinsts would start mariadb, munge and slurm through /etc/init.d unless
  # policy-rc.d forbids it; we start them ourselves, by pid.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    added_policy=1
  fi
  local rc=0
  {
    DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 \
      apt-get -q -o DPkg::Lock::Timeout=600 update &&
    DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 \
      apt-get -q -y --no-install-recommends -o DPkg::Lock::Timeout=600 install "${missing[@]}"
  } >&2 || rc=$?
  (( added_policy )) && rm -f /usr/sbin/policy-rc.d
  (( rc == 0 )) || fail "apt-get failed (exit $rc) installing: ${missing[*]}"
  for p in "${packages[@]}"; do have_pkg "$p" || fail "package $p is still not installed"; done
}

ensure_users() {
  getent passwd slurm >/dev/null || fail "user 'slurm' is missing (it comes with the slurm packages)"
  getent passwd munge >/dev/null || fail "user 'munge' is missing (it comes with the munge package)"
  getent passwd mysql >/dev/null || fail "user 'mysql' is missing (it comes with mariadb-server)"
  if ! id -u "$test_user" >/dev/null 2>&1; then
    useradd -m "$test_user"
    note "created user $test_user (uid $(id -u "$test_user"))"
  fi
}

# ---------------------------------------------------------------- config
# install_if_changed SRC DST MODE OWNER: returns 0 when DST was (re)written.
install_if_changed() {
  local src=$1 dst=$2 mode=$3 owner=$4
  if [[ -f $dst ]] && cmp -s "$src" "$dst" && [[ $(stat -c '%a %U:%G' "$dst") == "$mode $owner" ]]
  then
    return 1
  fi
  install -m "$mode" -o "${owner%%:*}" -g "${owner##*:}" "$src" "$dst"
  return 0
}

slurm_conf_changed=0 dbd_conf_changed=0
write_configs() {
  install -d -m 0755 /etc/slurm
  install -d -o slurm -g slurm -m 0755 "$slurm_log" /var/lib/slurm "$state_dir"
  install -d -m 0755 "$spool_dir"

  # Node layout from slurmd -C; RealMemory = 85 % of what it reports.
  local line field cpus='' boards='' sockets='' cores='' threads='' mem=''
  line=$(slurmd -C 2>/dev/null | head -n 1) || true
  for field in $line; do
    case $field in
      CPUs=*) cpus=${field#*=} ;;
      Boards=*) boards=${field#*=} ;;
      SocketsPerBoard=*) sockets=${field#*=} ;;
      CoresPerSocket=*) cores=${field#*=} ;;
      ThreadsPerCore=*) threads=${field#*=} ;;
      RealMemory=*) mem=${field#*=} ;;
    esac
  done
  [[ -n $cpus && -n $boards && -n $sockets && -n $cores && -n $threads && -n $mem ]] ||
    fail "cannot parse \`slurmd -C\`: $line"
  mem=$(( mem * 85 / 100 ))

  cat >"$tmp/slurm.conf" <<EOF
# Written by tests/slurm/cluster.sh (ns-hpc test cluster); rewritten by every \`up\`.
ClusterName=$cluster
SlurmctldHost=localhost
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
# linuxproc: independent of the cgroup layout (this host is cgroup v1 hybrid); limits not enforced.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
JobRequeue=0
SlurmctldPidFile=${pid_file[slurmctld]}
SlurmdPidFile=${pid_file[slurmd]}
StateSaveLocation=$state_dir
SlurmdSpoolDir=$spool_dir
SlurmctldLogFile=${log_file[slurmctld]}
SlurmdLogFile=${log_file[slurmd]}
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/filetxt
JobCompLoc=$slurm_log/jobcomp.log
MinJobAge=3600
KillWait=5
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem State=UNKNOWN
PartitionName=$partition Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

  # The database password is generated once and kept in slurmdbd.conf (letters and digits only).
  local pass=
  if [[ -r $dbd_conf ]]; then
    pass=$(sed -n 's/^StoragePass=//p' "$dbd_conf" | head -n 1)
  fi
  if [[ ! $pass =~ ^[A-Za-z0-9]{16,}$ ]]; then
    pass=$(tr -dc 'A-Za-z0-9' </dev/urandom | head -c 32) || true
  fi
  db_pass=$pass
  cat >"$tmp/slurmdbd.conf" <<EOF
# Written by tests/slurm/cluster.sh (ns-hpc test cluster); rewritten by every \`up\`.
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=slurm
DebugLevel=info
LogFile=${log_file[slurmdbd]}
PidFile=${pid_file[slurmdbd]}
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=$db_name
StorageUser=slurm
StoragePass=$pass
EOF

  if install_if_changed "$tmp/slurm.conf" "$slurm_conf" 644 root:root; then
    slurm_conf_changed=1
    note "wrote $slurm_conf"
  fi
  # slurmdbd refuses a slurmdbd.conf that is not 0600 and owned by SlurmUser.
  if install_if_changed "$tmp/slurmdbd.conf" "$dbd_conf" 600 slurm:slurm; then
    dbd_conf_changed=1
    note "wrote $dbd_conf"
  fi
}

# --------------------------------------------------------------- daemons
start_munged() {
  local pid
  if pid=$(daemon_pid munged); then
    :
  else
    [[ -f /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create >&2 ||
      fail "no /etc/munge/munge.key and mungekey failed"
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge      # /run is a tmpfs
    # As user munge: started as root, munged rejects its munge-owned log and key files.
    start_daemon munged runuser -u munge -- /usr/sbin/munged
    wait_until 10 "munged" "" "${log_file[munged]}" -- daemon_pid munged
    pid=$(daemon_pid munged)
    note "munged: started (pid $pid)"
  fi
  wait_until 10 "munge credential check" munged "${log_file[munged]}" -- \
    bash -c 'munge -n | unmunge'
}

mysql_ping() { mariadb-admin --socket="$mysql_sock" ping; }

# The socket is shared (libmariadb's compiled-in default, which slurmdbd uses): never start a
# second server on it, and never use or stop one that we did not start.
refuse_foreign_mariadb() {
  if ! daemon_pid mariadbd >/dev/null && [[ -S $mysql_sock ]] && mysql_ping >/dev/null 2>&1; then
    fail "another MariaDB, not started by $me (no live pid in $mysql_pid), answers on $mysql_sock; refusing to start a second one on the same socket. Stop it first."
  fi
}

start_mariadbd() {
  local pid
  if pid=$(daemon_pid mariadbd); then
    :
  else
    refuse_foreign_mariadb
    install -d -o mysql -g mysql -m 0755 "$mysql_run"          # /run is a tmpfs
    install -d -o mysql -g adm -m 2750 "$mysql_log"            # Debian logs to syslog by default
    if [[ ! -d $mysql_data/mysql ]]; then
      note "mariadbd: initializing $mysql_data"
      install -d -o mysql -g mysql -m 0755 "$mysql_data"
      mariadb-install-db --user=mysql --datadir="$mysql_data" \
        --auth-root-authentication-method=socket --skip-test-db >"$tmp/install-db.out" 2>&1 ||
        { cat "$tmp/install-db.out" >&2; fail "mariadb-install-db failed"; }
    fi
    # mariadbd does not daemonize: setsid + &. No TCP port (--skip-networking).
    # One fork, exec'd into setsid + mariadbd: no shell of ours stays behind as its parent.
    ( close_fds
      exec setsid /usr/sbin/mariadbd --user=mysql --datadir="$mysql_data" \
        --socket="$mysql_sock" --pid-file="$mysql_pid" --skip-networking \
        --log-error="${log_file[mariadbd]}" --innodb-buffer-pool-size=512M \
        --innodb-lock-wait-timeout=900 --expire-logs-days=0 ) </dev/null >/dev/null 2>&1 &
    wait_until 60 "mariadbd pid file" "" "${log_file[mariadbd]}" -- daemon_pid mariadbd
    pid=$(daemon_pid mariadbd)
    note "mariadbd: started (pid $pid)"
  fi
  wait_until 60 "mariadbd ping on $mysql_sock" mariadbd "${log_file[mariadbd]}" -- mysql_ping
}

# The database and its user, kept in step with slurmdbd.conf (idempotent).
setup_database() {
  mysql_root <<SQL || fail "database setup failed" "${log_file[mariadbd]}"
CREATE DATABASE IF NOT EXISTS $db_name;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$db_pass';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$db_pass';
GRANT ALL PRIVILEGES ON $db_name.* TO 'slurm'@'localhost';
SQL
}

# Job-id reuse guard: a missing controller state restarts job ids at 1. If the database still holds
# job records then, empty it too (slurmdbd and slurmctld must be stopped).
reset_db_if_state_lost() {
  [[ -e $state_dir/job_state ]] && return 0
  daemon_pid slurmctld >/dev/null && return 0
  local n
  n=$(mysql_root -N -B -e "SELECT COUNT(*) FROM $db_name.${cluster}_job_table" 2>/dev/null) || n=0
  [[ $n =~ ^[0-9]+$ ]] && (( n > 0 )) || return 0
  note "controller state is gone but the database holds $n job records: emptying $db_name (job ids restart at 1)"
  if daemon_pid slurmdbd >/dev/null; then stop_daemon slurmdbd; fi
  mysql_root -e "DROP DATABASE IF EXISTS $db_name; CREATE DATABASE $db_name;" ||
    fail "could not reset $db_name" "${log_file[mariadbd]}"
}

start_slurmdbd() {
  local pid
  if (( dbd_conf_changed )) && daemon_pid slurmdbd >/dev/null; then
    note "slurmdbd.conf changed: restarting slurmdbd"
    stop_daemon slurmdbd
  fi
  if ! pid=$(daemon_pid slurmdbd); then
    # slurmdbd daemonizes before it connects to the database: check readiness with sacctmgr.
    start_daemon slurmdbd /usr/sbin/slurmdbd
    wait_until 10 "slurmdbd pid file" "" "${log_file[slurmdbd]}" -- daemon_pid slurmdbd
    pid=$(daemon_pid slurmdbd)
    note "slurmdbd: started (pid $pid)"
  fi
  # Readiness and the association check in one call (sacctmgr fails until slurmdbd answers).
  wait_until 60 "slurmdbd (sacctmgr list assoc)" slurmdbd "${log_file[slurmdbd]}" -- \
    sacctmgr -n -P list assoc cluster="$cluster" account="$account" format=Account,User
  assoc_out=$last_out
}

# Cluster, account `tests` and the test user's association (before slurmctld's first start).
sacctmgr_add() { # WHAT ARGS...
  local what=$1; shift
  sacctmgr -i add "$@" >"$tmp/sacctmgr.out" 2>&1 ||
    fail "sacctmgr add $what failed: $(tr '\n' ' ' <"$tmp/sacctmgr.out")" "${log_file[slurmdbd]}"
}
ensure_associations() {
  local out=$assoc_out
  grep -qx "$account|$test_user" <<<"$out" && return 0
  if ! sacctmgr -n -P list cluster format=Cluster | grep -qx "$cluster"; then
    sacctmgr_add cluster cluster "$cluster"
  fi
  if ! grep -qx "$account|" <<<"$out"; then
    sacctmgr_add account account "$account" cluster="$cluster" Description=ns-hpc-tests \
      Organization=ns-hpc
  fi
  sacctmgr_add user user "$test_user" account="$account" cluster="$cluster"
  note "accounting: user $test_user in account $account on cluster $cluster"
}

start_slurmctld() {
  local pid
  if ! pid=$(daemon_pid slurmctld); then
    install -d -o slurm -g slurm -m 0755 "$state_dir"
    chown slurm:slurm "$state_dir"
    start_daemon slurmctld /usr/sbin/slurmctld
    wait_until 10 "slurmctld pid file" "" "${log_file[slurmctld]}" -- daemon_pid slurmctld
    pid=$(daemon_pid slurmctld)
    note "slurmctld: started (pid $pid)"
  fi
  wait_until 60 "slurmctld (scontrol ping)" slurmctld "${log_file[slurmctld]}" -- \
    bash -c 'scontrol ping | grep -q "is UP"'
}

# The node is usable: idle, or mix/alloc when jobs are running (a no-op `up` with jobs).
node_ready() {
  local st
  st=$(sinfo -h -n localhost -o %t) || return 1
  echo "node state: $st"
  [[ $st == idle || $st == mix || $st == alloc ]]
}

start_slurmd() {
  local pid
  if ! pid=$(daemon_pid slurmd); then
    install -d -m 0755 "$spool_dir"
    start_daemon slurmd /usr/sbin/slurmd -N localhost
    wait_until 10 "slurmd pid file" "" "${log_file[slurmd]}" -- daemon_pid slurmd
    pid=$(daemon_pid slurmd)
    note "slurmd: started (pid $pid)"
  fi
  wait_until 60 "node localhost ready" slurmd "${log_file[slurmd]}" -- node_ready
}

# ---------------------------------------------------------------- actions
up() {
  install_packages
  ensure_users
  write_configs
  if (( slurm_conf_changed )) && { daemon_pid slurmctld || daemon_pid slurmd; } >/dev/null; then
    note "slurm.conf changed: restarting slurmd and slurmctld"
    stop_daemon slurmd
    stop_daemon slurmctld
  fi
  refuse_foreign_mariadb
  start_munged
  start_mariadbd
  setup_database
  reset_db_if_state_lost
  start_slurmdbd
  ensure_associations
  start_slurmctld
  start_slurmd
  wait_until 60 "sacct -n -X" slurmdbd "${log_file[slurmdbd]}" -- sacct -n -X
  note "up: node $(sinfo -h -n localhost -o %t), partition $partition, sacct answers"
}

# Leftovers of ours that must not survive a `down` (a foreign mariadbd is not ours to judge).
leftovers() {
  local f pid comm stat rest out=()
  for f in /proc/[0-9]*/stat; do
    read -r stat 2>/dev/null <"$f" || continue
    comm=${stat#*(}; comm=${comm%)*}
    rest=${stat##*) }
    [[ ${rest%% *} == [ZX] ]] && continue
    case $comm in
      munged|slurmdbd|slurmctld|slurmd|slurmstepd) pid=${f#/proc/}; out+=("${comm}[${pid%/stat}]") ;;
    esac
  done
  pid=$(daemon_pid mariadbd) && out+=("mariadbd[$pid]")
  (( ${#out[@]} )) && echo "${out[*]}"
  return 0
}

down() {
  local ids deadline left
  if daemon_pid slurmctld >/dev/null && scontrol ping 2>/dev/null | grep -q 'is UP'; then
    ids=$(squeue -h -o %i 2>/dev/null) || true
    if [[ -n $ids ]]; then
      note "cancelling $(wc -w <<<"$ids") job(s)"
      # shellcheck disable=SC2086
      scancel $ids 2>/dev/null || true
      deadline=$(( $(now_us) + 60 * 1000000 ))
      while [[ -n $(squeue -h -o %i 2>/dev/null) ]]; do
        if (( $(now_us) > deadline )); then
          note "warning: jobs still queued after 60 s:"
          squeue >&2 || true
          break
        fi
        sleep 0.1
      done
    fi
  fi
  stop_daemon slurmd
  stop_daemon slurmctld 60
  stop_daemon slurmdbd
  stop_daemon mariadbd 120
  stop_daemon munged
  left=$(leftovers)
  [[ -z $left ]] || fail "still running after down: $left"
}

status() {
  local d pid all=0
  for d in "${daemons[@]}"; do
    if pid=$(daemon_pid "$d"); then
      printf '%-10s running (pid %s)\n' "$d" "$pid"
    else
      printf '%-10s stopped\n' "$d"
      all=3
    fi
  done
  if daemon_pid slurmctld >/dev/null; then
    sinfo -o '%P %a %D %t %c %m' 2>&1 | sed 's/^/sinfo: /' || true
  else
    echo "sinfo: (slurmctld not running)"
  fi
  return $all
}

purge() {
  down
  if [[ -d $mysql_data/mysql ]] && [[ -x /usr/sbin/mariadbd ]]; then
    start_mariadbd
    mysql_root -e "DROP DATABASE IF EXISTS $db_name; DROP USER IF EXISTS 'slurm'@'localhost';" ||
      fail "could not drop $db_name" "${log_file[mariadbd]}"
    note "dropped database $db_name and its user"
    stop_daemon mariadbd 120
  fi
  rm -f "$slurm_conf" "$dbd_conf"
  rm -rf "${state_dir:?}" "${spool_dir:?}"
  rm -rf "${slurm_log:?}"/* "${log_file[mariadbd]}"
  if id -u "$test_user" >/dev/null 2>&1; then
    userdel -r "$test_user" 2>/dev/null || userdel "$test_user"
    note "removed user $test_user"
  fi
  note "purged (packages kept)"
}

# ------------------------------------------------------------------ main
(( $# == 1 )) || usage
case $1 in up|down|status|purge) ;; *) usage ;; esac
if (( EUID != 0 )); then
  echo "$me: needs root (it installs packages and starts system daemons); skipping" >&2
  exit 77
fi
if [[ $1 == status ]]; then
  rc=0; status || rc=$?; exit $rc
fi
# One up/down/purge at a time. Daemons are started with this fd closed (see detached).
exec 9>"$lock_file"
flock -w 900 9 || fail "another $me has held $lock_file for 900 s"
tmp=$(mktemp -d /tmp/nshpc-slurm-cluster.XXXXXX)

t_start=$(now_us)
"$1"
echo "$me: $1: $(secs $(( $(now_us) - t_start ))) s" >&2
