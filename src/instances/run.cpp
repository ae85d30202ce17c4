// The instances service: what runs in an instance, described once for every face.
#include <fmt/format.h>

#include "base/random.hpp"
#include "instances/instances.hpp"

namespace nshpc::instances {

namespace {

std::string_view leaf_of(Service::Command kind) {
  switch (kind) {
    case Service::Command::terminal: return "term";
    case Service::Command::search: return "search";
    case Service::Command::person: break;  // the backend names a person's command's group
  }
  return "cmd";
}

}  // namespace

sandbox::ExecSpec Service::command(const store::Instance& inst, Command kind, std::vector<std::string> argv) const {
  sandbox::ExecSpec spec;
  spec.target = target(inst);
  spec.argv = std::move(argv);
  // A person's: the instance's limits alone, in the group the backend gives a command that brings
  // none (cmd-<id> where cgroups can be written; else a pid namespace of its own kills its tree).
  if (kind == Command::person) return spec;
  // An agent's command: the same enforcement as a job's (cgroups for cpus/memory/pids, a file
  // size limit for output), in a group of its own that goes with it.
  spec.limits = config_.terminal.limits;
  spec.use_cgroups = config_.jobs.local.use_cgroups;
  spec.cgroup_name = fmt::format("{}/{}-{}", spec.target.cgroup_folder, leaf_of(kind), random::hex(6));
  return spec;
}

sandbox::CaptureResult Service::run_captured(const store::Instance& inst, sandbox::ExecSpec spec,
                                             sandbox::CaptureOptions options, std::string what) {
  // A delete, archive, stop or snapshot of the instance finds it (and stops it) while it runs.
  auto started = std::move(options.started);
  options.started = [this, &inst, what = std::move(what), started](sandbox::Execution& execution) {
    auto registration = std::make_shared<Registration>(
        register_execution(inst.id, [&execution] { execution.kill_tree(); }, what));
    if (!started) return std::shared_ptr<void>(registration);
    return std::shared_ptr<void>(std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
        registration, started(execution)));
  };
  return sandbox::capture(backend(), std::move(spec), options);
}

std::unique_ptr<sandbox::Execution> Service::execute(sandbox::ExecSpec spec) {
  return sandbox::execute(backend(), std::move(spec));
}

}  // namespace nshpc::instances
