// The server's side of a desktop's display agent (desktop/agent.hpp): starts `ns-hpc __display`
// on a connected X socket and speaks desktop/wire.hpp with it. Everything the agent says is
// checked before anyone uses it: a reply of the wrong shape, a late one or none at all ends the
// agent, and the caller gets an Error; the server never waits past the deadline it gave.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "base/fd.hpp"
#include "base/json.hpp"
#include "base/spawn.hpp"
#include "base/users.hpp"
#include "desktop/wire.hpp"

namespace nshpc::desktop {

struct AgentOptions {
  std::string program;                              // the ns-hpc binary; empty: /proc/self/exe
  std::optional<users::Identity> identity;          // the sandbox's host identity to run as; nullopt: this process's
  std::size_t max_memory = std::size_t{512} << 20;  // RLIMIT_AS
};

class Agent {
 public:
  // Starts the agent on `x_socket` (connected to the display by the caller) and says hello with
  // `cookie` (16 raw bytes). Throws Error saying what failed ("the desktop's X server did not
  // answer within 5 s", a refused cookie, a dead agent ...); never hangs past `deadline`.
  static std::unique_ptr<Agent> start(UniqueFd x_socket, std::string_view cookie, const AgentOptions& options,
                                      std::chrono::milliseconds deadline);
  ~Agent();  // kills and reaps it
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // One request. {"ok": false, "error": E}: throws Error(E) (E cut to 300 characters, control
  // characters removed) and the agent lives on. A timeout, EOF or malformed frame: the agent is
  // killed, Error thrown, alive() false. Calls are serialized (thread-safe); waiting for another
  // call to end counts against `deadline`.
  Frame call(const nlohmann::json& request, std::chrono::milliseconds deadline);
  bool alive() const { return alive_; }
  int width() const { return width_; }
  int height() const { return height_; }
  // The agent's process id (for diagnostics; -1 once it was stopped).
  pid_t pid() const { return pid_; }

 private:
  Agent() = default;
  // Sends `request` and reads its reply before `until`, checked; the agent stopped on any failure.
  Frame exchange(const nlohmann::json& request, std::chrono::steady_clock::time_point until,
                 std::chrono::milliseconds deadline);
  // Kills and reaps the agent; `why` gets how it ended when it had ended on its own.
  void stop(std::string* why = nullptr);

  std::timed_mutex mutex_;  // one call at a time; a caller waits for its turn within its deadline
  SpawnedChild child_;
  UniqueFd control_;
  std::atomic<bool> alive_{false};
  std::atomic<pid_t> pid_{-1};
  int width_ = 0, height_ = 0;
};

}  // namespace nshpc::desktop
