// The instances service: the one place that does things to an instance, between the faces (MCP
// tools, the CLI, WebDAV) and the machinery (store, sandbox backend, job engine). Create, archive,
// restore and delete (the store's lock held exactly as the store says, with the steps each needs
// passed per call); start, stop, restart, network and ports of its sandbox; its state (living
// status, processes, limits, disk use); what runs in it (registered, so that a delete or a
// snapshot finds it); its files' owner and broker. Nothing here knows MCP or the command line:
// the faces word the advice for their audience.
//
// Snapshots and reset (snapshots.hpp) and the computers of the mcp-virtual-computer entry point
// (computers.hpp) are built on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/fd.hpp"
#include "base/json.hpp"
#include "config/config.hpp"
#include "files/resolver.hpp"
#include "jobs/jobs.hpp"
#include "sandbox/capture.hpp"
#include "sandbox/execution.hpp"
#include "sandbox/layers.hpp"
#include "sandbox/sandbox.hpp"
#include "store/store.hpp"

namespace nshpc::instances {

class Desktops;  // instances/desktops.hpp
class Terminal;  // instances/terminal.hpp
struct TerminalRequest;

// What a stop or restart did.
struct Ended {
  bool was_running = false;          // the living sandbox was running before
  std::vector<jobs::Record> jobs;    // the local jobs ended first, as each ended (newest first)
  std::vector<std::string> problems; // jobs that could not be cancelled cleanly: "<job>: why"
  sandbox::LivingStatus status;      // afterwards
};

class Service {
 public:
  // Made from `config` (which must outlive it): the store, with the network of new instances
  // decided here once (`auto`: nat where it works, else filtered), and the bwrap backend on
  // first use. `backend`, when given, is used instead (tests: a fake one).
  explicit Service(const config::Config& config, std::unique_ptr<sandbox::Backend> backend = nullptr);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  const config::Config& config() const { return config_; }
  // The store, to read: instances, listings, archives, their audit logs.
  const store::Store& store() const { return *store_; }
  sandbox::Backend& backend();
  // The job engine, made on first use: a stop, an archive or a delete ends or counts the
  // instance's jobs through it, checked against their real processes.
  jobs::Engine& jobs();
  // The instances' desktops (desktops.hpp).
  Desktops& desktops();

  // ---- Instances -----------------------------------------------------------------------------
  // A new instance. UsageError when a network mode cannot work here, an allow entry is malformed,
  // the image is missing or this host cannot give it a writable layer.
  store::Instance create(std::string id, const store::CreateOptions& options, std::string_view actor);
  // Changed metadata (checked: a network mode that cannot work here, a malformed allow entry); a
  // network change reaches its running sandbox with apply_network.
  store::Instance update(std::string_view id, const store::UpdateOptions& options, std::string_view actor);
  // Archive and delete are refused while it has jobs that have not ended; what runs in it is
  // stopped first (its commands, its living sandbox).
  store::ArchivedInstance archive(std::string_view id, std::string_view actor);
  store::Instance restore(std::string_view archive, std::string_view new_id, std::string_view actor);
  void remove(std::string_view id, std::string_view actor);
  void remove_archived(std::string_view name, std::string_view actor);
  // Finishes the deletes an earlier run left unfinished (.deleting-* trees); how many it finished.
  std::size_t finish_deletions();

  // ---- Its sandbox ---------------------------------------------------------------------------
  // What a sandbox of the instance binds (its folders, network, cgroup folder).
  sandbox::Target target(const store::Instance& inst) const { return store_->sandbox_target(inst); }
  sandbox::LivingStatus living_status(const store::Instance& inst);
  std::vector<sandbox::LivingProcess> processes(const store::Instance& inst);
  // Whether the commands of a living instance share one pid namespace here (sandbox.hpp).
  bool commands_share_pids();
  // The instance's [namespace] limits and, while its cgroup exists, their usage (limits_json).
  nlohmann::json limits(const store::Instance& inst) const;
  // Ends the sandboxes and network helpers of instances that are gone (Backend::end_stray_sandboxes);
  // one line for each.
  std::vector<std::string> end_strays();
  // Reaps what the backend started and let run that has ended since; never waits.
  void reap_ended();
  // This process serves many requests: what the next command of an instance needs may be made
  // ahead of it (sandbox::Backend::expect_more_commands).
  void serving();

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

  // After the instance's network changed (update): its running living sandbox follows at once
  // among off, nat and filtered (processes kept; what the new mode forbids is cut), and is
  // restarted for a change to or from host. Throws UsageError when the mode cannot work here.
  enum class NetworkChange { not_running, applied, restarted };
  NetworkChange apply_network(const store::Instance& inst, std::string_view actor);

  // A port of the instance's sandbox forwarded from the host's 127.0.0.1:host_port (0: a free
  // port), kept while the instance exists (sandbox/network.hpp). Audited as network.port_exposed.
  sandbox::ExposedPort expose_port(const store::Instance& inst, std::uint16_t port, std::uint16_t host_port,
                                   std::string_view actor);
  // Ends it; false when it was not exposed. Audited as network.port_closed.
  bool unexpose_port(const store::Instance& inst, std::uint16_t port, std::string_view actor);
  std::vector<sandbox::ExposedPort> exposed_ports(const store::Instance& inst);

  // Whether the instance's living sandbox runs now (false for an instance that is not persistent).
  bool running(const store::Instance& inst);

  std::chrono::milliseconds grace() const;

  // ---- What runs in it -----------------------------------------------------------------------
  // Every command a face runs in an instance is described here, once: its target, its cgroup below
  // the instance's and its limits. An agent's command (terminal_execute, search_files) runs under
  // [terminal.limits] in a group of its own ("term-"/"search-<id>", gone with it); a person's
  // (ns-hpc bwrap, instance enter) only under the instance's [namespace] limits, as the original's
  // bwrap, so that a batch job on a Slurm node keeps its allocation (the backend gives it a
  // "cmd-<id>" group where it can). A job is described by the job engine, from its request.
  enum class Command { terminal, search, person };
  sandbox::ExecSpec command(const store::Instance& inst, Command kind, std::vector<std::string> argv) const;
  // Runs `spec` through the captured-run pump (sandbox/capture.hpp), registered as `what` (the
  // command in a few words) while it runs.
  sandbox::CaptureResult run_captured(const store::Instance& inst, sandbox::ExecSpec spec,
                                      sandbox::CaptureOptions options, std::string what = {});
  // Starts `spec` for a caller that follows it itself (a terminal relayed to a person).
  std::unique_ptr<sandbox::Execution> execute(sandbox::ExecSpec spec);
  // A person's terminal in the instance's sandbox, as `instance enter` gives one, for a face that
  // relays it (terminal.hpp); audited as sandbox.enter by `actor`. UsageError beyond the bounds.
  std::unique_ptr<Terminal> open_terminal(const store::Instance& inst, const TerminalRequest& request,
                                          std::string_view actor);

  // A running execution of an instance (a terminal command, a search, ...) is registered while it
  // runs, with what stops it: remove(), archive() and stop() stop it, hold_still() names it.
  class Registration {
   public:
    Registration(const Service& service, std::uint64_t key) : service_(&service), key_(key) {}
    Registration(Registration&& other) noexcept
        : service_(std::exchange(other.service_, nullptr)), key_(other.key_) {}
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    Registration& operator=(Registration&&) = delete;
    ~Registration();

   private:
    const Service* service_;
    std::uint64_t key_;
  };
  // `what`: the execution in a few words for people ("`make test`"); empty: "a command".
  Registration register_execution(std::string_view id, std::function<void()> stop, std::string what = {}) const;
  // Stops (kills the trees of) the executions of instance `id` that this process registered.
  void stop_executions(std::string_view id) const;
  // What this process runs in instance `id` now, as registered.
  std::vector<std::string> executions_of(std::string_view id) const;

  // ---- Its files -----------------------------------------------------------------------------
  // Whom the instance's files belong to (its accounts' ids included), and, for a normal user's
  // image instance, the broker that does what this process may not do to them from outside (files
  // of accounts made inside, folders closed to their owner): the view of the file tools and
  // WebDAV.
  struct FileAccess {
    std::optional<files::Owner> owner;
    std::shared_ptr<files::Broker> broker;
  };
  FileAccess file_access(const store::Instance& inst) const;
  // The instance's workspace and output as its sandbox sees them, with file_access's owner and
  // broker: what the file tools and the dashboard open (files::InstanceFiles).
  files::InstanceView file_view(const store::Instance& inst) const;

  // The root folder of an image instance's running sandbox, as its processes see it (its
  // /workspace, /tmp and every other mount included), for file operations done from outside with
  // no process inside (the computer's file tools). The sandbox is started when it does not run
  // (audited as instance.started then). `root` is "/" owned as the instance's files are
  // (file_access) and confined to the sandbox's own files (files::Root::confine: never its /proc,
  // /proc/sys, devices or devpts, nor a file of another uid); `held` keeps the instance's gate
  // and busy file (sandbox::LivingRoot) until it is destroyed. UsageError for an instance on the
  // host's root (its "/" is the host's).
  struct RunningRoot {
    files::Root root;
    sandbox::LivingRoot held;  // its descriptor moved into `root`
  };
  RunningRoot root_of_running(const store::Instance& inst, std::string_view actor);

  // Disk use of an instance's workspace, output folder, root layer (an image instance) and
  // snapshots (walked without following links; a large tree takes a while, so only describe and
  // listings for scripts ask). Allocated blocks: a snapshot's reflinked copy shares its blocks
  // with the layer but counts in both. No quota is set: the filesystem here has none that an
  // unprivileged server could use. `files`: of the workspace and output.
  struct DiskUse {
    std::uint64_t workspace_bytes = 0;
    std::uint64_t output_bytes = 0;
    std::uint64_t files = 0;
    std::uint64_t layer_bytes = 0;
    std::uint64_t snapshots_bytes = 0;
  };
  DiskUse disk_use(const store::Instance& inst) const;

 private:
  Ended end_all(const store::Instance& inst, std::string_view why, std::string_view actor);
  // The steps of an archive or delete: refuse while jobs run, stop what runs, stop the sandbox.
  store::RemovalSteps removal_steps(std::string_view why);
  // An image instance's version and ids, chosen with the store's lock held.
  std::optional<store::NewRoot> choose_root(const store::Store& store, const store::CreateOptions& options);
  void check_network(std::string_view id, config::Network network) const;

  const config::Config& config_;
  bool nat_works_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<sandbox::Backend> backend_;
  std::unique_ptr<jobs::Engine> jobs_;
  std::unique_ptr<Desktops> desktops_;
  std::mutex layer_mutex_;
  // The broker of root_of_running's roots (a normal user's): one for every image instance, whose
  // ids are all the user's and its subordinate range; started on first use.
  std::mutex root_broker_mutex_;
  std::shared_ptr<files::Broker> root_broker_;
  std::optional<sandbox::LayerSupport> layer_support_;  // probed at the first image instance

  struct Execution {
    std::string instance_id;
    std::function<void()> stop;
    std::string what;
  };
  mutable std::mutex executions_mutex_;
  mutable std::map<std::uint64_t, Execution> executions_;
  mutable std::uint64_t next_execution_ = 0;

  // Terminals open now, per instance (terminal.hpp: bounded).
  friend class Terminal;
  std::mutex terminals_mutex_;
  std::map<std::string, std::size_t, std::less<>> terminals_;
};

// The living state as data (for --json and structuredContent): state ("running" or "stopped"),
// and running_since (ISO 8601 UTC), processes and memory_bytes when running, or last_end and
// ended_at when it stopped before.
nlohmann::json state_json(const sandbox::LivingStatus& status);

// An instance as the faces show it (sandbox paths, never host paths): id, description,
// created_at, last_activity, network, persistent, root, hostname, workspace, output; image
// (NAME@VERSION) on an image, desktop when on.
nlohmann::json instance_json(const config::Config& config, const store::Instance& inst);

// The instance's [namespace] limits as data (describe_instance, `instance describe`): those set
// (cpus, memory_mib, pids), "enforced", "unenforced" (why not, per limit) and, while the
// instance's cgroup exists, "usage" (memory_bytes, pids, cpu_usec of everything it runs).
nlohmann::json limits_json(const config::Config& config, const std::string& cgroup_folder);  // Store::cgroup_folder
// The same in one line for people.
std::string limits_line(const nlohmann::json& limits);

}  // namespace nshpc::instances
