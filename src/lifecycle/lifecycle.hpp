// A living instance's sandbox together with its jobs: start, stop and restart, each in one fixed
// order for the MCP tools and the CLI alike, and its state as data. Nothing here knows MCP or the
// command line: the callers say it for their audience (and refuse instances that are not
// persistent, which have no sandbox to stop).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/fd.hpp"
#include "base/json.hpp"
#include "config/config.hpp"
#include "jobs/jobs.hpp"
#include "sandbox/sandbox.hpp"
#include "store/store.hpp"

namespace nshpc::lifecycle {

// What a stop or restart did.
struct Ended {
  bool was_running = false;          // the living sandbox was running before
  std::vector<jobs::Record> jobs;    // the local jobs ended first, as each ended (newest first)
  std::vector<std::string> problems; // jobs that could not be cancelled cleanly: "<job>: why"
  sandbox::LivingStatus status;      // afterwards
};

class Lifecycle {
 public:
  // `jobs` may be null (a process without a job engine): then no jobs are ended first.
  Lifecycle(const config::Config& config, store::Store& store, sandbox::Backend& backend, jobs::Engine* jobs)
      : config_(config), store_(store), backend_(backend), jobs_(jobs) {}

  // Starts the instance's living sandbox unless it runs. Audited as instance.started when it
  // was not running.
  sandbox::LivingStatus start(const store::Instance& inst, std::string_view actor);
  // Ends the instance's pending and running local jobs through the job engine (each gets its
  // final state, cancelled), then every process of its living sandbox: SIGTERM, then after
  // [jobs] cancel_grace SIGKILL. Files stay. Audited as instance.stopped. An instance that is not
  // persistent has no living sandbox: only its jobs end (what reset and snapshots need first).
  Ended stop(const store::Instance& inst, std::string_view actor);
  // stop, then start again. Audited as instance.restarted.
  Ended restart(const store::Instance& inst, std::string_view actor);

  // The instance held still while its trees are copied or swapped (snapshots.hpp): no execution
  // of it starts until the Still is let go (sandbox/gate.hpp). Refused with UsageError naming
  // them while a job of it has not ended or a command runs in it: nothing is killed for this.
  // Its living sandbox, when it runs, is stopped (every process ended; `why` goes on record) and
  // started again by resume().
  struct Still {
    UniqueFd gate;
    Ended ended;
  };
  Still hold_still(const store::Instance& inst, std::string_view why, std::string_view actor);
  // Lets go of `still`, then starts the living sandbox again when it ran before; true when it did.
  bool resume(const store::Instance& inst, Still& still, std::string_view actor);

  // After the instance's network changed (Store::update): its running living sandbox follows at
  // once among off, nat and filtered (processes kept; what the new mode forbids is cut), and is
  // restarted for a change to or from host. Throws UsageError when the mode cannot work here.
  enum class NetworkChange { not_running, applied, restarted };
  NetworkChange apply_network(const store::Instance& inst, std::string_view actor);

  // A port of the instance's sandbox forwarded from the host's 127.0.0.1:host_port (0: a free
  // port), kept while the instance exists (sandbox/network.hpp). Audited as network.port_exposed.
  sandbox::ExposedPort expose_port(const store::Instance& inst, std::uint16_t port, std::uint16_t host_port,
                                   std::string_view actor);
  // Ends it; false when it was not exposed. Audited as network.port_closed.
  bool unexpose_port(const store::Instance& inst, std::uint16_t port, std::string_view actor);
  std::vector<sandbox::ExposedPort> exposed_ports(const store::Instance& inst) const;

  // Whether the instance's living sandbox runs now (false for an instance that is not persistent).
  bool running(const store::Instance& inst) const;

  std::chrono::milliseconds grace() const;

 private:
  Ended end_all(const store::Instance& inst, std::string_view why, std::string_view actor);

  const config::Config& config_;
  store::Store& store_;
  sandbox::Backend& backend_;
  jobs::Engine* jobs_;
};

// The living state as data (for --json and structuredContent): state ("running" or "stopped"),
// and running_since (ISO 8601 UTC), processes and memory_bytes when running, or last_end and
// ended_at when it stopped before.
nlohmann::json state_json(const sandbox::LivingStatus& status);

// The instance's [namespace] limits as data (describe_instance, `instance describe`): those set
// (cpus, memory_mib, pids), "enforced", "unenforced" (why not, per limit) and, while the
// instance's cgroup exists, "usage" (memory_bytes, pids, cpu_usec of everything it runs).
nlohmann::json limits_json(const config::Config& config, const std::string& cgroup_folder);  // Store::cgroup_folder
// The same in one line for people.
std::string limits_line(const nlohmann::json& limits);

}  // namespace nshpc::lifecycle
