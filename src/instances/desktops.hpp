// The desktops of living instances (desktop/): switched on and off in place, started with their
// sandbox, seen and driven through a display agent. The session (X server, Xfce, AT-SPI) runs
// inside the instance's sandbox as the sandbox does; the agent that reads its screen and sends its
// input runs on the host with the sandbox's identity, never in this process (desktop/client.hpp).
// This process only resolves the X socket beneath the sandbox's root (openat2, no links followed)
// and connects to it; the agent does the rest. The live view's VNC socket is reached the same way.
//
// While an instance's desktop is on, every command, job and proxied server of it gets the display
// (desktop::session_env()), and each start of its living sandbox starts the session (the store's
// target decorator: sandbox::Target::on_start).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/json.hpp"
#include "desktop/wire.hpp"
#include "sandbox/types.hpp"
#include "store/store.hpp"

namespace nshpc::desktop {
class Agent;
}

namespace nshpc::instances {

class Service;

// Why an instance cannot switch its desktop on.
class DesktopUnavailable : public UsageError {
 public:
  enum class Why { ephemeral, root };  // commands get fresh sandboxes; its root has no desktop
  DesktopUnavailable(Why why, std::string message) : UsageError(std::move(message)), why_(why) {}
  Why why() const { return why_; }

 private:
  Why why_;
};

// A screen request to an instance whose desktop is off.
class DesktopOff : public UsageError {
 public:
  using UsageError::UsageError;
};

class Desktops {
 public:
  explicit Desktops(Service& service);
  ~Desktops();
  Desktops(const Desktops&) = delete;
  Desktops& operator=(const Desktops&) = delete;

  // nullopt when `inst` can run a desktop: a persistent instance on an image built with
  // --desktop, or on the host's root where [desktop] host_root allows it.
  std::optional<DesktopUnavailable> unavailable(const store::Instance& inst) const;

  // Switches the desktop. On: recorded, then the living sandbox (started when it does not run)
  // runs the session before this returns; throws DesktopUnavailable, or Error when the session
  // did not start (the setting stays on: the next start tries again). Off: recorded, the session
  // ended; files and other processes stay. Audited as desktop.on / desktop.off when it changed.
  // Returns the instance as on record now.
  store::Instance set(const store::Instance& inst, bool on, std::string_view actor);

  // Makes sure the session of an instance whose desktop is on runs in its sandbox (starting
  // both as needed). Throws DesktopOff, or Error saying why the session did not start.
  void ensure_running(const store::Instance& inst, std::string_view actor);

  // One request to the instance's display agent (desktop/wire.hpp), the agent connected (and the
  // sandbox and session started) when needed. A reply {"ok": false} is an Error with its text. An
  // agent that died (its sandbox restarted) is replaced and the request sent once more.
  desktop::Frame call(const store::Instance& inst, const nlohmann::json& request, std::string_view actor,
                      std::chrono::milliseconds deadline = std::chrono::seconds(10));

  // A connection to the live view's VNC server (x11vnc on desktop::kVncSocket in the sandbox),
  // for a relay: the socket found beneath the living sandbox's root without following any link,
  // checked to be a socket of the sandbox's user, connected through /proc/self/fd (the same path
  // as the display's; never a host path). Starts the sandbox and the session as needed, and waits
  // for x11vnc's socket up to 10 s (it comes a moment after the session, and again after a restart
  // of x11vnc). Throws DesktopOff, DesktopUnavailable, Error "not available" when the root has no
  // x11vnc, Error when the socket is not there, refuses or does not accept in time (a stale or
  // hostile socket), or is not a socket of the sandbox's user. Blocks: call it off I/O threads.
  // The socket is blocking and close-on-exec; what comes out of it is the sandbox talking.
  UniqueFd connect_vnc(const store::Instance& inst, std::string_view actor);

  // The accessibility helper's answer to `request` (desktop/atspi.hpp), run inside the sandbox
  // with the session's environment: its raw output, for desktop::parse_snapshot/parse_element.
  std::string accessibility(const store::Instance& inst, const nlohmann::json& request, std::string_view actor);

  // Opens a URL or file on the desktop (xdg-open, detached); returns once it was launched.
  void open(const store::Instance& inst, const std::string& what, std::string_view actor);

  // The screen size sessions get ([desktop] width, height).
  int width() const;
  int height() const;

  // What the store's target decorator adds for an instance whose desktop is on: the session's
  // variables and its start at each start of the living sandbox.
  void decorate(const store::Instance& inst, sandbox::Target& target) const;

 private:
  struct Display;
  std::shared_ptr<desktop::Agent> connect(const store::Instance& inst, std::string_view actor);
  void start_session(const store::Instance& inst);
  std::string xauthority(const store::Instance& inst) const;  // the file's bytes (its cookie made once)

  Service& service_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<desktop::Agent>> agents_;  // by instance id
};

}  // namespace nshpc::instances
