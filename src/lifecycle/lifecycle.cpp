#include "lifecycle/lifecycle.hpp"

#include <future>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/time.hpp"

namespace nshpc::lifecycle {

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

std::chrono::milliseconds Lifecycle::grace() const { return std::chrono::seconds(config_.jobs.cancel_grace); }

sandbox::LivingStatus Lifecycle::start(const store::Instance& inst, std::string_view actor) {
  const sandbox::Target target = store_.sandbox_target(inst);
  const bool was_running = backend_.living_status(target).running;
  sandbox::LivingStatus status = backend_.start_living(target);
  if (!was_running) store_.audit(inst, "instance.started", actor, {{"instance_id", inst.id}});
  return status;
}

Ended Lifecycle::end_all(const store::Instance& inst, std::string_view why, std::string_view actor) {
  Ended ended;
  // 1. The jobs first, through the engine, so each gets its final state and its cgroups go; in
  //    parallel, so N jobs take one cancel_grace, not N.
  if (jobs_) {
    std::vector<jobs::Record> live = live_local_jobs(*jobs_, inst.id);
    std::vector<std::future<jobs::Record>> cancels;
    for (const auto& record : live)
      cancels.push_back(std::async(std::launch::async, [this, &inst, &record, actor] {
        return jobs_->cancel(inst.id, record.id, actor);
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
  // 2. Everything else in the living sandbox.
  const sandbox::Target target = store_.sandbox_target(inst);
  ended.was_running = backend_.stop_living(target, why, grace());
  return ended;
}

Ended Lifecycle::stop(const store::Instance& inst, std::string_view actor) {
  Ended ended = end_all(inst, "stopped", actor);
  ended.status = backend_.living_status(store_.sandbox_target(inst));
  store_.audit(inst, "instance.stopped", actor,
               {{"instance_id", inst.id}, {"was_running", ended.was_running}, {"jobs_ended", job_ids(ended.jobs)}});
  return ended;
}

Ended Lifecycle::restart(const store::Instance& inst, std::string_view actor) {
  Ended ended = end_all(inst, "restarted", actor);
  ended.status = backend_.start_living(store_.sandbox_target(inst));
  store_.audit(inst, "instance.restarted", actor,
               {{"instance_id", inst.id}, {"was_running", ended.was_running}, {"jobs_ended", job_ids(ended.jobs)}});
  return ended;
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

}  // namespace nshpc::lifecycle
