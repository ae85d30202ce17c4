#include "tools/tasks.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "instances/instances.hpp"
#include "store/store.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

mcp::ProtocolError invalid(std::string message) { return mcp::ProtocolError(mcp::kInvalidParams, std::move(message)); }

// What a task's statusMessage says of its job: the state and what is known of why.
std::string status_message(const jobs::Record& r) {
  std::string text = jobs::to_string(r.state);
  if (r.state == jobs::State::pending || r.state == jobs::State::running) {
    if (r.cancel_requested) text += ", being cancelled";
    if (r.mode == jobs::Mode::slurm && !r.scheduler_state.empty()) {
      text += fmt::format(" (Slurm {}", r.scheduler_state);
      if (!r.scheduler_reason.empty() && r.scheduler_reason != "None") text += ": " + r.scheduler_reason;
      text += ")";
    }
    if (r.state == jobs::State::running && !r.started_at.empty()) text += " since " + r.started_at;
    return text;
  }
  if (r.exit_code) text += fmt::format(", exit code {}", *r.exit_code);
  if (!r.reason.empty()) text += ": " + r.reason;
  return text;
}

}  // namespace

std::string job_task_id(std::string_view instance_id, std::string_view job_id) {
  return fmt::format("{}/{}", instance_id, job_id);
}

mcp::Task job_task(const jobs::Record& r, std::int64_t slurm_poll_ms) {
  mcp::Task t;
  t.id = job_task_id(r.instance_id, r.id);
  if (!jobs::is_final(r.state))
    t.status = mcp::Task::Status::working;
  else if (r.state == jobs::State::cancelled)
    t.status = mcp::Task::Status::cancelled;
  else
    t.status = mcp::Task::Status::completed;  // whatever its exit code: the job ran and ended
  t.status_message = status_message(r);
  t.created_at = r.created_at;
  t.last_updated_at = !r.finished_at.empty() ? r.finished_at : !r.started_at.empty() ? r.started_at : r.created_at;
  t.ttl_ms = std::nullopt;  // a finished job's record is kept as long as its instance
  t.poll_interval_ms = r.mode == jobs::Mode::slurm ? slurm_poll_ms : kLocalJobPollMs;
  return t;
}

JobTasks::JobTasks(ToolContext ctx, jobs::TailOptions tail, ResultOf result_of, Visible visible)
    : ctx_(std::move(ctx)), plain_{tail, std::move(result_of)}, visible_(std::move(visible)) {}

void JobTasks::add_result_shape(std::string tool, jobs::TailOptions tail, ResultOf result_of) {
  shapes_[std::move(tool)] = {tail, std::move(result_of)};
}

namespace {
// Which tool made a job its task: <instance>/.ns_hpc_tasks/<job>.tool (beside the job records,
// out of every sandbox's reach), holding the tool's name. No note: a job's own result.
std::filesystem::path tool_note(const store::Instance& inst, const std::string& job_id) {
  return inst.base / ".ns_hpc_tasks" / (job_id + ".tool");
}
}  // namespace

const JobTasks::Shape& JobTasks::shape_of(const std::string& instance_id, const std::string& job_id) const {
  if (shapes_.empty()) return plain_;
  const std::optional<std::string> tool = fs::read_file(tool_note(ctx_.services.instances.store().get(instance_id), job_id));
  if (!tool) return plain_;
  auto it = shapes_.find(*tool);
  return it == shapes_.end() ? plain_ : it->second;
}

std::int64_t JobTasks::slurm_poll_ms() const {
  // The scheduler is asked that often: polling the task faster learns nothing new.
  return std::max<std::int64_t>(kLocalJobPollMs,
                                std::llround(ctx_.services.config.jobs.slurm.poll_interval * 1000.0));
}

std::pair<std::string, std::string> JobTasks::resolve(const std::string& id) const {
  const auto slash = id.find('/');
  const std::string instance = slash == std::string::npos ? std::string() : id.substr(0, slash);
  const std::string job = slash == std::string::npos ? std::string() : id.substr(slash + 1);
  bool valid = !instance.empty() && jobs::valid_job_id(job);
  if (valid) {
    try {
      store::validate_id(instance);
    } catch (const UsageError&) {
      valid = false;
    }
  }
  if (!valid)
    throw invalid(fmt::format("unknown task '{}': this server's task ids are <instance>/<job> (as submit_job "
                              "answered), e.g. 'work/0123456789ab'",
                              id));
  const store::Store& store = ctx_.services.instances.store();
  if (!store.exists(instance)) {
    if (auto archive = store.latest_archive(instance))
      throw invalid(fmt::format("task {} belongs to instance {}, which is archived (as '{}'): restore_instance '{}' "
                                "first, then ask again",
                                id, instance, archive->name, archive->name));
    throw invalid(fmt::format("task {} belongs to instance {}, which does not exist (deleted, or never made): its "
                              "jobs went with it",
                              id, instance));
  }
  return {instance, job};
}

mcp::Task JobTasks::of_view(const jobs::View& view, const Shape& shape) const {
  mcp::Task t = job_task(view.record, slurm_poll_ms());
  // A cancelled job keeps what it printed: tasks/result (2025-11-25) gives it too.
  if (t.status == mcp::Task::Status::completed || t.status == mcp::Task::Status::cancelled)
    t.result = shape.result_of(view);
  return t;
}

mcp::Task JobTasks::of_job(const std::string& instance_id, const std::string& job_id, const std::string& tool) {
  if (!tool.empty()) {
    if (!shapes_.contains(tool)) throw std::logic_error("JobTasks: no result shape for " + tool);
    const auto note = tool_note(ctx_.services.instances.store().get(instance_id), job_id);
    fs::make_dirs(note.parent_path(), 0700);
    fs::atomic_write(note, tool, 0600);
  }
  const Shape& shape = shape_of(instance_id, job_id);
  return of_view(ctx_.services.instances.jobs().view(instance_id, job_id, shape.tail), shape);
}

mcp::Task JobTasks::get(const std::string& id, mcp::RequestContext&) {
  const auto [instance, job] = resolve(id);
  try {
    return of_job(instance, job);
  } catch (const UsageError& e) {  // the job is not on record (or the instance went meanwhile)
    throw invalid(fmt::format("task {}: {}", id, e.what()));
  }
}

mcp::Task JobTasks::cancel(const std::string& id, mcp::RequestContext& rc) {
  const auto [instance, job] = resolve(id);
  try {
    ctx_.services.instances.jobs().cancel(instance, job, actor(rc));  // cancel_job's path
    return of_job(instance, job);
  } catch (const UsageError& e) {
    throw invalid(fmt::format("task {}: {}", id, e.what()));
  }
}

void JobTasks::update(const std::string& id, const json&, mcp::RequestContext& rc) { get(id, rc); }

std::vector<mcp::Task> JobTasks::list(std::size_t start, std::size_t count, std::size_t& total,
                                      mcp::RequestContext& rc) {
  std::vector<jobs::Record> all;
  for (const std::string& instance : visible_(rc)) {
    try {
      for (jobs::Record& r : ctx_.services.instances.jobs().list(instance)) all.push_back(std::move(r));
    } catch (const UsageError&) {
      // Archived or deleted between the listing of instances and this: its jobs are not listed.
    }
  }
  std::sort(all.begin(), all.end(), [](const jobs::Record& a, const jobs::Record& b) {
    return a.created_at != b.created_at ? a.created_at > b.created_at : a.id < b.id;
  });
  total = all.size();
  std::vector<mcp::Task> page;
  const std::size_t end = count == 0 ? all.size() : std::min(all.size(), start + count);
  for (std::size_t i = start; i < end; ++i) page.push_back(job_task(all[i], slurm_poll_ms()));
  return page;
}

void add_task_tool(mcp::Server& server, ToolSpec spec) {
  // As add_tool (tools/spec.cpp) registers a tool, with task support: ToolSpec has no field for
  // it, and only the job tools take tasks.
  mcp::Tool tool;
  tool.name = std::move(spec.name);
  tool.description = std::move(spec.description);
  tool.input_schema = std::move(spec.input);
  tool.output_schema = std::move(spec.output);
  if (json hints = annotations(spec.hints); !hints.empty()) tool.annotations = std::move(hints);
  tool.accept_input_wrapper = true;
  tool.listed = spec.listed;
  tool.shown = std::move(spec.shown);
  tool.meta = std::move(spec.meta);
  tool.task_support = mcp::Tool::TaskSupport::optional;
  tool.handler = [handler = std::move(spec.handler)](const json& args, mcp::RequestContext& rc) {
    try {
      return handler(args, rc);
    } catch (const NotFound& e) {
      throw UsageError(fmt::format("{}; {}", e.what(), not_found_advice(e)));
    } catch (const NeedsAction& e) {
      throw Error(fmt::format("{}; {}", e.what(), needs_action_advice(e)));
    }
  };
  server.add_tool(std::move(tool));
}

}  // namespace nshpc::tools
