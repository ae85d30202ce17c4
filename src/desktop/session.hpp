// The desktop session of a living instance: an X server (Xvfb), a session bus, AT-SPI and Xfce,
// all inside the instance's sandbox, as its user, on the paths of desktop/wire.hpp. The server
// starts and stops it by running the commands below in the living sandbox (joined like any
// command); nothing needs to exist in the sandbox beforehand but the programs: each command is
// `bash -c SCRIPT` with the script built into this binary.
//
// The start command leaves a supervisor (bash, a session of its own) running in the sandbox. It
// starts, in order: Xvfb (only the socket kXSocket: no TCP, no abstract socket), dbus-daemon on
// kSessionBus, the AT-SPI bus (at-spi-bus-launcher, its socket under kRuntimeDir) with the
// accessibility switch on, then Xfce's pieces: xfsettingsd, xfwm4, xfce4-panel and xfdesktop.
// Right after the X server, in the background, the live view's VNC server: x11vnc on the Unix
// socket kVncSocket only (no TCP listener, no password: the socket is reached only through the
// sandbox's filesystem, which the server resolves safely), -forever -shared, with the session's
// X authority. x11vnc is optional: a root without it runs the desktop, leaves kVncMissing, and the
// live view says it is not available.
// It restarts the X server (and with it the session) and each piece when it ends (at most 5 times
// a minute each), and ends them all when the stop command asks it (through a FIFO, so a stop
// from another pid namespace reaches it). Its logs: kRuntimeDir/log/*.log (emptied at each start
// and when one passes 1 MiB).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace nshpc::desktop {

struct Geometry {
  int width = 1280;
  int height = 800;
  int depth = 24;
};

// argv of the command the server runs in the instance's living sandbox (joined like any command,
// as the sandbox user, with session_env() in its environment) to start the session when it does
// not run. Its stdin is the Xauthority file's bytes (at most 64 KiB: a FamilyWild
// MIT-MAGIC-COOKIE-1 entry the server made); it writes them to kXauthority (mode 0600). It returns
// once the X server answers on kXSocket and the session's processes have been started: exit 0 and
// "started" on stdout, or "running" when it ran already (stdin is then read and dropped: the X
// server keeps the cookie it started with, so the server should make its cookie once per
// instance). Otherwise it exits 1 with one line on stderr saying what failed, naming any program
// that is missing and its Debian package. Within 30 s (a start or stop that is still going on is
// waited for first, up to 30 s more).
// Throws UsageError for a geometry Xvfb cannot make (width 320-7680, height 200-4320, depth 16 or
// 24).
std::vector<std::string> start_command(const Geometry& geometry);

// Ends every process of the session: the supervisor ends the X server, window manager, panel,
// buses and AT-SPI (TERM, KILL after 3 s), and with the X server every application on the
// display. Exit 0 ("stopped", or "not running" when nothing ran); exit 1 with a line on stderr when
// the supervisor did not end within 10 s.
std::vector<std::string> stop_command();

// What every command, job and proxied server of the instance gets while the desktop is on:
// DISPLAY, XAUTHORITY, DBUS_SESSION_BUS_ADDRESS, XDG_RUNTIME_DIR (kRuntimeDir), the desktop's name
// for xdg-open (XDG_CURRENT_DESKTOP), and the accessibility switches of the toolkits that do not
// export their tree unasked (Qt, Firefox, Chromium and Electron). The session's own processes get
// the same.
std::vector<std::pair<std::string, std::string>> session_env();

// The programs a root needs to run the desktop (checked by the start command itself), and the
// Debian packages that hold them; for doctor's message.
std::vector<std::string> required_programs();
std::vector<std::string> required_packages();

}  // namespace nshpc::desktop
