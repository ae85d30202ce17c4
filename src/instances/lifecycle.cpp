// The instances service: its sandbox's lifecycle (start, stop, restart, hold still, network,
// ports) and the state as data.
#include "instances/instances.hpp"

#include <unistd.h>

#include <future>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "sandbox/gate.hpp"
#include "sandbox/limits.hpp"

namespace nshpc::instances {

namespace {

// The instance's local jobs that have not ended (Slurm jobs run elsewhere, in sandboxes of their own).
std::vector<jobs::Record> live_local_jobs(jobs::Engine& engine, const std::string& instance_id) {
  std::vector<jobs::Record> live;
  for (auto& record : engine.list(instance_id))
    if (record.mode == jobs::Mode::local && !jobs::is_final(record.state)) live.push_back(std::move(record));
  return live;
}

nlohmann::json job_ids(const std::vector<jobs::Record>& records) {
  nlohmann::json ids = nlohmann::json::array();
  for (const auto& r : records) ids.push_back(r.id);
  return ids;
}

}  // namespace

std::chrono::milliseconds Service::grace() const { return std::chrono::seconds(config_.jobs.cancel_grace); }

sandbox::LivingStatus Service::living_status(const store::Instance& inst) { return backend().living_status(target(inst)); }

std::vector<sandbox::LivingProcess> Service::processes(const store::Instance& inst) {
  return backend().living_processes(target(inst));
}

bool Service::commands_share_pids() { return backend().commands_share_pids(); }

nlohmann::json Service::limits(const store::Instance& inst) const {
  return limits_json(config_, store_->cgroup_folder(inst.id));
}

std::vector<std::string> Service::end_strays() { return backend().end_stray_sandboxes(config_.ns.instances_dir); }

void Service::reap_ended() { backend().reap_ended(); }
void Service::serving() { backend().expect_more_commands(); }

Service::NetworkChange Service::apply_network(const store::Instance& inst, std::string_view actor) {
  if (!inst.persistent)  // the namespace held for its commands, if one is
    return backend().change_network(target(inst)) ? NetworkChange::applied : NetworkChange::not_running;
  if (!running(inst)) return NetworkChange::not_running;
  if (backend().change_network(target(inst))) return NetworkChange::applied;
  restart(inst, actor);
  return NetworkChange::restarted;
}

sandbox::ExposedPort Service::expose_port(const store::Instance& inst, std::uint16_t port, std::uint16_t host_port,
                                           std::string_view actor) {
  if (port == 0) throw UsageError("port must be 1-65535: the port a server inside the instance listens on");
  const sandbox::ExposedPort exposed = backend().expose_port(target(inst), port, host_port);
  store_->audit(inst, "network.port_exposed", actor,
               {{"instance_id", inst.id}, {"port", exposed.port}, {"host_port", exposed.host_port}});
  return exposed;
}

bool Service::unexpose_port(const store::Instance& inst, std::uint16_t port, std::string_view actor) {
  if (!backend().unexpose_port(target(inst), port)) return false;
  store_->audit(inst, "network.port_closed", actor, {{"instance_id", inst.id}, {"port", port}});
  return true;
}

std::vector<sandbox::ExposedPort> Service::exposed_ports(const store::Instance& inst) {
  return backend().exposed_ports(target(inst));
}

bool Service::running(const store::Instance& inst) {
  return inst.persistent && backend().living_status(target(inst)).running;
}

sandbox::LivingStatus Service::start(const store::Instance& inst, std::string_view actor) {
  const sandbox::Target target = this->target(inst);
  const bool was_running = backend().living_status(target).running;
  sandbox::LivingStatus status = backend().start_living(target);
  if (!was_running) store_->audit(inst, "instance.started", actor, {{"instance_id", inst.id}});
  return status;
}

Ended Service::end_all(const store::Instance& inst, std::string_view why, std::string_view actor) {
  Ended ended;
  // 1. The jobs first, through the engine, so each gets its final state and its cgroups go; in
  //    parallel, so N jobs take one cancel_grace, not N.
  {
    jobs::Engine* engine = &jobs();
    std::vector<jobs::Record> live = live_local_jobs(*engine, inst.id);
    std::vector<std::future<jobs::Record>> cancels;
    for (const auto& record : live)
      cancels.push_back(std::async(std::launch::async, [engine, &inst, &record, actor] {
        return engine->cancel(inst.id, record.id, actor);
      }));
    for (std::size_t i = 0; i < cancels.size(); ++i) {
      try {
        ended.jobs.push_back(cancels[i].get());
      } catch (const std::exception& e) {
        log::warn("instance '{}': job {} not cancelled cleanly before the {}: {}", inst.id, live[i].id, why, e.what());
        ended.problems.push_back(fmt::format("{}: {}", live[i].id, e.what()));
        ended.jobs.push_back(live[i]);
      }
    }
  }
  // 2. The commands this server runs in it (terminal_execute, search_files): an instance that is
  //    not persistent has a sandbox per command, which nothing else ends.
  stop_executions(inst.id);
  // 3. Everything else in the living sandbox (an instance that is not persistent has none).
  if (inst.persistent) ended.was_running = backend().stop_living(target(inst), why, grace());
  else backend().release_network(target(inst));
  return ended;
}

Ended Service::stop(const store::Instance& inst, std::string_view actor) {
  Ended ended = end_all(inst, "stopped", actor);
  if (inst.persistent) ended.status = backend().living_status(target(inst));
  store_->audit(inst, "instance.stopped", actor,
               {{"instance_id", inst.id}, {"was_running", ended.was_running}, {"jobs_ended", job_ids(ended.jobs)}});
  return ended;
}

Ended Service::restart(const store::Instance& inst, std::string_view actor) {
  Ended ended = end_all(inst, "restarted", actor);
  ended.status = backend().start_living(target(inst));
  store_->audit(inst, "instance.restarted", actor,
               {{"instance_id", inst.id}, {"was_running", ended.was_running}, {"jobs_ended", job_ids(ended.jobs)}});
  return ended;
}

Service::Still Service::hold_still(const store::Instance& inst, std::string_view why, std::string_view actor) {
  const sandbox::Target target = this->target(inst);
  // Jobs first (a running job holds the gate too, and is better named by its record), then the
  // gate, then the jobs once more: one launched in between is on record by now, and none starts
  // after the gate.
  auto refuse_while_jobs = [&] {
    std::vector<std::string> live;
    for (const auto& record : jobs().list(inst.id))
      if (!jobs::is_final(record.state))
        live.push_back(fmt::format("{} ({}: `{}`)", record.id, jobs::to_string(record.state),
                                   text::truncate_utf8(record.command, 60)));
    if (!live.empty())
      throw UsageError(fmt::format("instance '{}' has {} job(s) that have not ended: {}; its files are copied only "
                                   "while nothing of it runs, and no job is cancelled for that: wait for them to end "
                                   "(or cancel them), then try again",
                                   inst.id, live.size(), fmt::join(live, ", ")));
  };
  refuse_while_jobs();
  std::vector<pid_t> holders;
  std::optional<UniqueFd> gate = sandbox::close_gate(target, &holders);
  if (!gate) {
    std::vector<std::string> running = executions_of(inst.id);
    for (const pid_t pid : holders)
      if (pid != ::getpid()) running.push_back(fmt::format("a command of another ns-hpc process (pid {})", pid));
    if (running.empty()) running.push_back("a command that is just starting or ending");
    throw UsageError(fmt::format("instance '{}' is running {}; its files are copied only while nothing of it runs: "
                                 "wait for that to end (or stop it), then try again",
                                 inst.id, fmt::join(running, ", ")));
  }
  refuse_while_jobs();
  Still still;
  still.gate = std::move(*gate);
  if (inst.persistent) {
    still.ended.was_running = backend().stop_living(target, why, grace());
    still.ended.status = backend().living_status(target);
  } else {
    backend().release_network(target);
  }
  if (still.ended.was_running)
    store_->audit(inst, "instance.stopped", actor, {{"instance_id", inst.id}, {"was_running", true}, {"why", why}});
  return still;
}

bool Service::resume(const store::Instance& inst, Still& still, std::string_view actor) {
  still.gate.reset();
  if (!still.ended.was_running) return false;
  try {
    still.ended.status = start(inst, actor);
    return true;
  } catch (const std::exception& e) {
    // What was copied or swapped is done: the start is what failed, and the next command tries again.
    log::warn("instance '{}': its sandbox did not start again: {}", inst.id, e.what());
    still.ended.problems.push_back(fmt::format("its sandbox did not start again: {}", e.what()));
    return false;
  }
}

nlohmann::json instance_json(const config::Config& config, const store::Instance& inst) {
  nlohmann::json out = {{"id", inst.id},
                        {"description", inst.meta.description()},
                        {"created_at", inst.meta.created_at()},
                        {"last_activity", timeutil::iso_utc(inst.last_activity())},
                        {"network", config::to_string(inst.network)},
                        {"persistent", inst.persistent},
                        {"root", inst.meta.root()},
                        {"hostname", inst.meta.hostname()},
                        {"workspace", config.ns.workspace_mount},
                        {"output", config.ns.output_mount}};
  // An instance on an image: its name@version, as its root says ("image:NAME@VERSION").
  if (const std::string& root = inst.meta.root(); root.starts_with("image:")) out["image"] = root.substr(6);
  if (inst.meta.desktop()) out["desktop"] = true;
  return out;
}

nlohmann::json state_json(const sandbox::LivingStatus& status) {
  nlohmann::json out = {{"state", status.running ? "running" : "stopped"}};
  if (status.running) {
    if (status.since) out["running_since"] = timeutil::iso_utc(*status.since);
    out["processes"] = status.processes;
    out["memory_bytes"] = status.memory_bytes;
  } else {
    if (!status.last_end.empty()) out["last_end"] = status.last_end;
    if (status.ended_at) out["ended_at"] = timeutil::iso_utc(*status.ended_at);
  }
  return out;
}

nlohmann::json limits_json(const config::Config& config, const std::string& cgroup_folder) {
  const sandbox::InstanceLimits limits =
      sandbox::instance_limits(config.ns.limits, cgroup_folder, config.jobs.local.use_cgroups);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, value] : limits.configured) out[name == "memory" ? "memory_mib" : name] = value;
  out["enforced"] = !limits.configured.empty() && limits.unenforced.empty();
  if (!limits.unenforced.empty()) out["unenforced"] = limits.unenforced;
  // What the instance's group counts against its limits (its commands and jobs, and a living
  // sandbox's own processes, ns-hpc's helpers among them): only where there are limits to count
  // against. Without limits the living sandbox has no group there, and a count of its commands
  // alone would contradict the processes its living state counts.
  if (limits.usage && !limits.configured.empty()) {
    nlohmann::json usage = nlohmann::json::object();
    if (limits.usage->memory_bytes) usage["memory_bytes"] = *limits.usage->memory_bytes;
    if (limits.usage->pids) usage["pids"] = *limits.usage->pids;
    if (limits.usage->cpu_usec) usage["cpu_usec"] = *limits.usage->cpu_usec;
    out["usage"] = std::move(usage);
  }
  return out;
}

std::string limits_line(const nlohmann::json& limits) {
  std::vector<std::string> set;
  if (limits.contains("cpus")) set.push_back(fmt::format("{} cpus", limits["cpus"].get<std::int64_t>()));
  if (limits.contains("memory_mib")) set.push_back(fmt::format("{} MiB memory", limits["memory_mib"].get<std::int64_t>()));
  if (limits.contains("pids")) set.push_back(fmt::format("{} processes", limits["pids"].get<std::int64_t>()));
  std::string line = set.empty() ? std::string("none ([namespace] limits)") : fmt::format("{}", fmt::join(set, ", "));
  if (limits.contains("unenforced"))
    line += fmt::format(" — NOT enforced: {}", fmt::join(limits["unenforced"].get<std::vector<std::string>>(), "; "));
  if (limits.contains("usage")) {
    const nlohmann::json& u = limits["usage"];
    std::vector<std::string> used;
    if (u.contains("memory_bytes")) used.push_back(fmt::format("{:.1f} MiB", u["memory_bytes"].get<double>() / 1048576.0));
    if (u.contains("pids"))
      used.push_back(fmt::format("{} processes (ns-hpc's helpers included)", u["pids"].get<std::uint64_t>()));
    if (u.contains("cpu_usec")) used.push_back(fmt::format("{:.1f} s CPU", u["cpu_usec"].get<double>() / 1e6));
    if (!used.empty()) line += fmt::format("; counted against them now: {}", fmt::join(used, ", "));
  }
  return line;
}

}  // namespace nshpc::instances
