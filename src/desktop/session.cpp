#include "desktop/session.hpp"

#include <algorithm>
#include <string_view>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "desktop/wire.hpp"

namespace nshpc::desktop {

namespace {

struct RequiredProgram {
  std::string_view program;
  std::string_view package;  // Debian's
};

// What the session runs (bash, coreutils and findutils are in every Debian root).
constexpr RequiredProgram kRequired[] = {
    {"Xvfb", "xvfb"},
    {"dbus-daemon", "dbus-daemon"},
    {"dbus-send", "dbus-bin"},
    {"/usr/libexec/at-spi-bus-launcher", "at-spi2-core"},
    {"xfsettingsd", "xfce4-settings"},
    {"xfwm4", "xfwm4"},
    {"xfce4-panel", "xfce4-panel"},
    {"xfdesktop", "xfdesktop4"},
    {"flock", "util-linux"},
    {"setsid", "util-linux"},
};

// The session's script: start, stop and the supervisor, after a prelude of the paths and the
// environment (session_script()). Every sleep in the supervisor is a read that times out on a
// FIFO no one writes (no process per tick); everything is in $rt, the sandbox's own /tmp.
constexpr std::string_view kScript = R"nshpc(
set -u
umask 077

fail() {
  printf 'desktop: %s\n' "$*" >&2
  exit 1
}

# Milliseconds since the epoch in $now. Like start_time, it sets a variable rather than printing:
# the supervisor calls both every second, and a command substitution is a process each time.
clock() {
  now=${EPOCHREALTIME//[!0-9]/}
  now=$((10#$now / 1000))
}

# The start time (clock ticks since boot) of process $1 in $began, "" when it does not run (or is
# a zombie): with the pid it names one process, whatever pid reuse does.
start_time() {
  began=
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 0
  stat=${stat##*) }
  set -- $stat
  [ "$1" = Z ] || [ "$1" = X ] || began=${20}
}

# Whether the supervisor runs: it holds supervisor.lock while it lives, and a lock is seen from
# every pid namespace of the sandbox (a command may have one of its own).
supervisor_alive() {
  [ -e "$rt/supervisor.lock" ] || return 1
  flock -n -E 75 "$rt/supervisor.lock" true
  [ $? -eq 75 ]
}

# Ends the processes on record in $rt/pids that still run (TERM, KILL after 2 s): what a
# supervisor that was killed left behind (those of this pid namespace: the others it cannot see).
end_recorded() {
  [ -s "$rt/pids" ] || return 0
  local name pid since live=() left=() entry
  while read -r name pid since; do
    start_time "$pid"
    [ -n "$since" ] && [ "$began" = "$since" ] && live+=("$pid:$since")
  done <"$rt/pids"
  for entry in "${live[@]}"; do kill -TERM "${entry%%:*}" 2>/dev/null; done
  clock
  local deadline=$((now + 2000))
  while :; do
    left=()
    for entry in "${live[@]}"; do
      start_time "${entry%%:*}"
      [ "$began" = "${entry#*:}" ] && left+=("$entry")
    done
    ((${#left[@]} == 0)) && break
    clock
    if ((now > deadline)); then
      for entry in "${left[@]}"; do kill -KILL "${entry%%:*}" 2>/dev/null; done
      break
    fi
    sleep 0.05
  done
  : >"$rt/pids"
}

# The runtime folder, this user's and private (anyone in the sandbox may have made it first; only
# the sandbox trusts what is in it).
runtime_dir() {
  mkdir -p "$rt" || fail "cannot make $rt"
  [ -d "$rt" ] && [ ! -L "$rt" ] && [ -O "$rt" ] || fail "$rt is not a folder of this user"
  chmod 700 "$rt" && mkdir -p "$rt/log" || fail "cannot set up $rt"
}

# Starts and stops one at a time.
take_lock() {
  exec 9>>"$rt/lock" || fail "cannot open $rt/lock"
  flock -w 30 9 || fail "another start or stop of the desktop did not finish within 30 s"
}

# Waits up to 30 s for the session to be ready; fails saying why it is not.
wait_ready() {
  clock
  local supervisor=$1 deadline=$((now + 30000))
  until [ -s "$rt/ready" ]; do
    [ -s "$rt/failed" ] && fail "$(head -c 400 "$rt/failed")"
    if [ -n "$supervisor" ] && ! kill -0 "$supervisor" 2>/dev/null; then
      fail "the desktop's supervisor ended at start: $(tail -n 3 "$rt/log/supervisor.log" | tr '\n' ' ' | cut -c1-300)"
    fi
    clock
    ((now > deadline)) && fail "the desktop did not start within 30 s (its logs: $rt/log)"
    sleep 0.05
  done
  return 0
}

start() {
  local width=$1 height=$2 depth=$3 missing=() program
  for program in "${programs[@]}"; do
    command -v "${program%%:*}" >/dev/null 2>&1 || missing+=("${program%%:*} (Debian package ${program#*:})")
  done
  ((${#missing[@]} == 0)) || fail "this root lacks what the desktop needs: ${missing[*]}"
  runtime_dir
  take_lock
  if supervisor_alive; then
    # The X server keeps the cookie it started with (the one in $xauthority).
    head -c 65536 >/dev/null
    wait_ready ""
    echo running
    exit 0
  fi
  end_recorded
  head -c 65536 >"$xauthority.new" && [ -s "$xauthority.new" ] || fail "no Xauthority data on stdin"
  mv -f "$xauthority.new" "$xauthority" || fail "cannot write $xauthority"
  mkdir -p /tmp/.X11-unix && chmod 1777 /tmp/.X11-unix 2>/dev/null
  # The supervisor runs from a copy of this script's functions, in a session of its own (setsid),
  # its output to its log: it outlives this command and holds none of its descriptors.
  {
    declare -p rt xsocket xauthority bus vncsocket vncmissing programs
    declare -f
    printf 'supervise "$@"\n'
  } >"$rt/session.sh" || fail "cannot write $rt/session.sh"
  rm -f "$rt/ready" "$rt/failed"
  : >"$rt/log/supervisor.log"
  setsid bash "$rt/session.sh" "$width" "$height" "$depth" </dev/null >>"$rt/log/supervisor.log" 2>&1 9>&- &
  wait_ready $!
  echo started
}

stop() {
  [ -d "$rt" ] || { echo "not running"; exit 0; }
  take_lock
  local was=0 writer
  if supervisor_alive; then
    was=1
    # Through the FIFO, which it reads: it may be in another pid namespace than this command.
    printf 'stop\n' >"$rt/control" &
    writer=$!
    flock -w 10 "$rt/supervisor.lock" true
    kill "$writer" 2>/dev/null
    wait "$writer" 2>/dev/null
  fi
  # A supervisor that did not answer, or what a killed one left: by their records.
  [ -s "$rt/pids" ] && was=1
  end_recorded
  supervisor_alive && fail "the desktop's supervisor did not end within 10 s, and this command cannot reach it"
  rm -f "$rt/ready"
  if ((was)); then echo stopped; else echo "not running"; fi
}

# --- The supervisor ---

# Sleeps $1 seconds without starting a process.
pause() { read -r -t "$1" -u 6 _; }

running() { [ -n "${pid[$1]:-}" ] && start_time "${pid[$1]}" && [ "$began" = "${since[$1]}" ]; }

# The pids of the session, for a stop or start that finds the supervisor killed.
record() {
  local name
  {
    start_time $$
    printf 'supervisor %s %s\n' "$$" "$began"
    for name in "${!pid[@]}"; do printf '%s %s %s\n' "$name" "${pid[$name]}" "${since[$name]}"; done
  } >"$rt/pids.new" && mv -f "$rt/pids.new" "$rt/pids"
}

# launch NAME COMMAND...: in the background, its output appended to its log (emptied first),
# without the supervisor's lock and FIFOs.
launch() {
  local name=$1
  shift
  : >"$rt/log/$name.log"
  "$@" </dev/null >>"$rt/log/$name.log" 2>&1 8>&- 7>&- 6>&- &
  pid[$name]=$!
  start_time $!
  since[$name]=$began
  record
}

# Waits up to $2 ms for file $1 to be non-empty while process $3 runs.
wait_for() {
  clock
  local deadline=$((now + $2))
  until [ -s "$1" ]; do
    running "$3" || return 1
    clock
    ((now > deadline)) && return 1
    pause 0.02
  done
  return 0
}

last_lines() { tail -n 3 "$rt/log/$1.log" 2>/dev/null | tr '\n' ' ' | cut -c1-300; }

# Ends the session and the supervisor, leaving why for the start command.
give_up() {
  printf '%s\n' "$*" >"$rt/failed"
  printf 'desktop: %s\n' "$*" >&2
  end_all
  exit 1
}

# The X server on the socket only: no TCP, and no abstract socket (in a host-network sandbox one
# would reach every user of the host). -displayfd writes the display once it accepts clients.
start_x() {
  : >"$rt/x.ready"
  launch xvfb Xvfb :0 -screen 0 "${width}x${height}x${depth}" -dpi 96 -nolisten tcp -nolisten local \
    -auth "$xauthority" -displayfd 3 3>"$rt/x.ready"
  wait_for "$rt/x.ready" 15000 xvfb || give_up "the X server (Xvfb) did not start: $(last_lines xvfb)"
  [ -S "$xsocket" ] || give_up "the X server started but not on $xsocket: $(last_lines xvfb)"
}

# The live view's VNC server: on a Unix socket only (x11vnc listens on [::]:5900 unless told both
# -rfbport 0 and -rfbportv6 -1), no password (only the server reaches the socket, through the
# sandbox's filesystem), for any number of viewers, until the session ends. Started in the
# background: the desktop is ready without waiting for it. A root without x11vnc runs the desktop
# without a live view, and says so with $vncmissing.
start_vnc() {
  if ! command -v x11vnc >/dev/null 2>&1; then
    : >"$vncmissing"
    return 0
  fi
  rm -f "$vncmissing" "$vncsocket"
  launch vnc x11vnc -display :0 -auth "$xauthority" -unixsock "$vncsocket" -rfbport 0 -rfbportv6 -1 \
    -forever -shared -nopw -quiet -nolookup -noremote -nocmds -noxrecord -nowf -noscr
}

start_bus() {
  : >"$rt/bus.address"
  launch bus dbus-daemon --session --address="$bus" --nofork --nopidfile --print-address=3 3>"$rt/bus.address"
  wait_for "$rt/bus.address" 10000 bus || give_up "the session bus (dbus-daemon) did not start: $(last_lines bus)"
}

# The accessibility bus (its socket in $XDG_RUNTIME_DIR, never an abstract one), and the switch
# that tells toolkits to export their trees.
start_atspi() {
  launch atspi /usr/libexec/at-spi-bus-launcher --launch-immediately
  local try
  for try in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    dbus-send --session --print-reply --dest=org.a11y.Bus /org/a11y/bus org.freedesktop.DBus.Properties.Set \
      string:org.a11y.Status string:IsEnabled variant:boolean:true >/dev/null 2>&1 && return 0
    pause 0.1
  done
  printf 'desktop: the accessibility bus (org.a11y.Bus) did not answer within 2 s\n' >&2
}

# Xfce's pieces, without a session manager (nothing to save or restore, no ICE sockets).
start_piece() {
  case $1 in
    xfsettingsd) launch xfsettingsd xfsettingsd --sm-client-disable --disable-wm-check ;;
    xfwm4) launch xfwm4 xfwm4 --compositor=off --sm-client-disable ;;
    panel) launch panel xfce4-panel --sm-client-disable --disable-wm-check ;;
    desktop) launch desktop xfdesktop --sm-client-disable --disable-wm-check ;;
  esac
}

start_session() {
  start_x
  start_vnc
  running bus || start_bus
  start_atspi
  local piece
  for piece in "${pieces[@]}"; do start_piece "$piece"; done
  echo ready >"$rt/ready"
}

end_all() {
  local name left order=(vnc "${pieces[@]}" atspi bus xvfb)
  rm -f "$rt/ready"
  for name in "${order[@]}"; do running "$name" && kill -TERM "${pid[$name]}" 2>/dev/null; done
  clock
  local deadline=$((now + 3000))
  while :; do
    left=()
    for name in "${order[@]}"; do running "$name" && left+=("$name"); done
    ((${#left[@]} == 0)) && break
    clock
    if ((now > deadline)); then
      for name in "${left[@]}"; do kill -KILL "${pid[$name]}" 2>/dev/null; done
      break
    fi
    pause 0.05
  done
  pid=()
  since=()
  rm -f "$vncsocket"
  record
}

# A process that keeps ending is started again at most 5 times a minute.
may_restart() {
  local name=$1
  clock
  if [ -z "${first_restart[$name]:-}" ] || ((now - first_restart[$name] > 60000)); then
    first_restart[$name]=$now
    restarts[$name]=0
  fi
  restarts[$name]=$((restarts[$name] + 1))
  ((restarts[$name] <= 5))
}

# Logs are emptied when one passes 1 MiB (their writers append, so they go on at its start).
bound_logs() {
  local log
  while IFS= read -r log; do : >"$log"; done < <(find "$rt/log" -name '*.log' -size +1024k 2>/dev/null)
}

supervise() {
  local width=$1 height=$2 depth=$3 stopping=0 line ticks=0 name
  local -A pid=() since=() restarts=() first_restart=()
  local pieces=(xfsettingsd xfwm4 panel desktop)
  exec 8>>"$rt/supervisor.lock" || exit 1
  flock -n 8 || exit 0
  rm -f "$rt/control" "$rt/tick"
  mkfifo -m 600 "$rt/control" "$rt/tick" || give_up "cannot make the FIFOs in $rt"
  exec 7<>"$rt/control" 6<>"$rt/tick"
  # The panel's first start takes Xfce's default layout instead of asking.
  export XFCE_PANEL_MIGRATE_DEFAULT=1 XDG_SESSION_DESKTOP=xfce
  trap 'stopping=1' TERM INT HUP
  start_session
  while ((!stopping)); do
    if read -r -t 1 -u 7 line && [ "$line" = stop ]; then break; fi
    if ! running xvfb; then
      # Every client of the display ended with it: the session starts again.
      printf 'desktop: the X server ended; starting the session again\n' >&2
      may_restart xvfb || give_up "the X server ended 5 times within a minute: $(last_lines xvfb)"
      end_all
      start_session
      continue
    fi
    if ! running bus && may_restart bus; then
      printf 'desktop: the session bus ended; starting it again\n' >&2
      start_bus
      start_atspi
    fi
    if [ ! -e "$vncmissing" ] && ! running vnc && may_restart vnc; then
      printf 'desktop: the live view (x11vnc) ended; starting it again\n' >&2
      start_vnc
    fi
    for name in "${pieces[@]}"; do
      running "$name" && continue
      may_restart "$name" || continue
      printf 'desktop: %s ended; starting it again\n' "$name" >&2
      start_piece "$name"
    done
    ((++ticks % 30 == 0)) && bound_logs
  done
  end_all
  exit 0
}

case ${1:-} in
  start) shift; start "$@" ;;
  stop) stop ;;
  *) fail "usage: start WIDTH HEIGHT DEPTH, or stop" ;;
esac
)nshpc";

// The paths of desktop/wire.hpp, the programs to check and the session's environment, then the
// script.
std::string session_script() {
  std::string out = "# ns-hpc's desktop session (src/desktop/session.cpp)\n";
  out += fmt::format("rt={}\nxsocket={}\nxauthority={}\nbus={}\nvncsocket={}\nvncmissing={}\n",
                     text::shell_quote(kRuntimeDir), text::shell_quote(kXSocket), text::shell_quote(kXauthority),
                     text::shell_quote(kSessionBus), text::shell_quote(kVncSocket), text::shell_quote(kVncMissing));
  out += "programs=(";
  for (const auto& r : kRequired) out += fmt::format(" {}", text::shell_quote(fmt::format("{}:{}", r.program, r.package)));
  out += " )\n";
  for (const auto& [name, value] : session_env()) out += fmt::format("export {}={}\n", name, text::shell_quote(value));
  out += kScript;
  return out;
}

// argv[0] the script sees ($0), so that `ps` and error messages say what runs.
constexpr std::string_view kName = "ns-hpc-desktop";

}  // namespace

std::vector<std::string> start_command(const Geometry& geometry) {
  // The range of [desktop] width and height; 16 and 24 bits are what Xvfb's TrueColor visuals
  // and the display agent's capture handle.
  if (geometry.width < 320 || geometry.width > 7680 || geometry.height < 200 || geometry.height > 4320 ||
      (geometry.depth != 16 && geometry.depth != 24))
    throw UsageError(fmt::format("a desktop of {}x{}x{} cannot be made: width 320-7680, height 200-4320, depth 16 or 24",
                                 geometry.width, geometry.height, geometry.depth));
  return {"bash",
          "-c",
          session_script(),
          std::string(kName),
          "start",
          std::to_string(geometry.width),
          std::to_string(geometry.height),
          std::to_string(geometry.depth)};
}

std::vector<std::string> stop_command() { return {"bash", "-c", session_script(), std::string(kName), "stop"}; }

std::vector<std::pair<std::string, std::string>> session_env() {
  return {
      {"DISPLAY", std::string(kDisplay)},
      {"XAUTHORITY", std::string(kXauthority)},
      {"DBUS_SESSION_BUS_ADDRESS", std::string(kSessionBus)},
      // The session's runtime folder: the accessibility bus's socket and dconf's live there.
      {"XDG_RUNTIME_DIR", std::string(kRuntimeDir)},
      // xdg-open opens with Xfce's preferred applications (exo-open).
      {"XDG_CURRENT_DESKTOP", "XFCE"},
      {"XDG_SESSION_TYPE", "x11"},
      // GTK exports its tree whenever the accessibility bus runs; these toolkits only when told.
      {"QT_ACCESSIBILITY", "1"},
      {"QT_LINUX_ACCESSIBILITY_ALWAYS_ON", "1"},
      {"GNOME_ACCESSIBILITY", "1"},     // Firefox
      {"ACCESSIBILITY_ENABLED", "1"},   // Chromium and Electron
  };
}

std::vector<std::string> required_programs() {
  std::vector<std::string> out;
  for (const auto& r : kRequired) out.emplace_back(r.program);
  return out;
}

std::vector<std::string> required_packages() {
  std::vector<std::string> out;
  for (const auto& r : kRequired)
    if (std::find(out.begin(), out.end(), r.package) == out.end()) out.emplace_back(r.package);
  return out;
}

}  // namespace nshpc::desktop
