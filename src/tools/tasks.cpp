#include "tools/tasks.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "instances/instances.hpp"
#include "base/time.hpp"
#include "store/store.hpp"
#include "tools/confirm.hpp"

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

// What a task needs beyond its job lives in notes beside the job records, out of every sandbox's
// reach: <instance>/.ns_hpc_tasks/<job>.tool names the tool whose task a job is (none: the job's
// own result), <instance>/.ns_hpc_tasks/<id>.confirm holds a job waiting for the user's yes.
std::filesystem::path tool_note(const store::Instance& inst, const std::string& job_id) {
  return inst.base / ".ns_hpc_tasks" / (job_id + ".tool");
}

constexpr std::string_view kConfirmKey = "confirm";  // the only input a job's task asks for

std::filesystem::path confirm_note(const store::Instance& inst, const std::string& id) {
  return inst.base / ".ns_hpc_tasks" / (id + ".confirm");
}

void save_note(const std::filesystem::path& file, const json& note) {
  fs::make_dirs(file.parent_path(), 0700);
  fs::atomic_write(file, note.dump(), 0600);
}

std::optional<json> load_note(const std::filesystem::path& file) {
  const std::optional<std::string> text = fs::read_file(file);
  if (!text) return std::nullopt;
  json note = json::parse(*text, nullptr, false);
  if (!note.is_object()) throw Error(fmt::format("{} is damaged (not a JSON object); delete it", file.string()));
  return note;
}

json request_json(const jobs::SubmitRequest& r) {
  return {{"instance_id", r.instance_id}, {"argv", r.argv},   {"display", r.display},
          {"cwd", r.cwd},                 {"env", r.env},     {"stdin", r.stdin_text},
          {"limits", r.limits.values},    {"mode", r.mode}};
}

jobs::SubmitRequest request_of(const json& j) {
  jobs::SubmitRequest r;
  r.instance_id = j.at("instance_id").get<std::string>();
  r.argv = j.at("argv").get<std::vector<std::string>>();
  r.display = j.value("display", "");
  r.cwd = j.value("cwd", "");
  r.env = j.value("env", std::vector<std::pair<std::string, std::string>>{});
  r.stdin_text = j.value("stdin", "");
  r.limits.values = j.value("limits", std::map<std::string, std::int64_t>{});
  r.mode = j.at("mode").get<jobs::Mode>();
  return r;
}

}  // namespace

mcp::Task JobTasks::awaiting_confirmation(const jobs::SubmitRequest& request, const std::string& what) {
  const store::Instance inst = ctx_.services.instances.store().get(request.instance_id);
  const std::string id = jobs::new_job_id();
  const std::string now = timeutil::iso_utc();
  save_note(confirm_note(inst, id), {{"state", "asking"},
                                     {"what", what},
                                     {"request", request_json(request)},
                                     {"created_at", now},
                                     {"updated_at", now}});
  return confirmation_task(job_task_id(inst.id, id), inst.id, *load_note(confirm_note(inst, id)));
}

mcp::Task JobTasks::confirmation_task(const std::string& id, const std::string& instance_id, const json& note) {
  const std::string state = note.value("state", "");
  if (state == "submitted") {
    // The job's own course from here; still named by the task's id, made when it was asked.
    mcp::Task t = of_job(instance_id, note.value("job_id", ""));
    t.id = id;
    t.created_at = note.value("created_at", t.created_at);
    return t;
  }
  mcp::Task t;
  t.id = id;
  t.created_at = note.value("created_at", "");
  t.last_updated_at = note.value("updated_at", t.created_at);
  t.ttl_ms = std::nullopt;
  t.poll_interval_ms = kLocalJobPollMs;
  const std::string what = note.value("what", "");
  if (state == "asking") {
    t.status = mcp::Task::Status::input_required;
    t.status_message = "waiting for the user's yes, nothing submitted yet: " + what;
    t.input_requests = {{std::string(kConfirmKey), {{"method", "elicitation/create"}, {"params", confirmation_request(what)}}}};
  } else if (state == "declined") {
    t.status = mcp::Task::Status::cancelled;
    t.status_message = "not submitted: " + note.value("why", std::string("the user declined"));
  } else {  // refused: the yes came, the submit did not take it
    t.status = mcp::Task::Status::completed;
    t.status_message = "not submitted: " + note.value("error", "");
    t.result = mcp::ToolResult::error(note.value("error", ""));
  }
  return t;
}

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
    if (auto note = load_note(confirm_note(ctx_.services.instances.store().get(instance), job)))
      return confirmation_task(id, instance, *note);
    return of_job(instance, job);
  } catch (const UsageError& e) {  // the job is not on record (or the instance went meanwhile)
    throw invalid(fmt::format("task {}: {}", id, e.what()));
  }
}

mcp::Task JobTasks::cancel(const std::string& id, mcp::RequestContext& rc) {
  const auto [instance, job] = resolve(id);
  try {
    const auto note_file = confirm_note(ctx_.services.instances.store().get(instance), job);
    std::unique_lock lock(confirm_mutex_);
    if (std::optional<json> note = load_note(note_file)) {
      if (note->value("state", "") == "asking") {
        (*note)["state"] = "declined";
        (*note)["why"] = "cancelled before it was confirmed";
        (*note)["updated_at"] = timeutil::iso_utc();
        save_note(note_file, *note);
      }
      if (note->value("state", "") != "submitted") return confirmation_task(id, instance, *note);
      lock.unlock();
      ctx_.services.instances.jobs().cancel(instance, note->value("job_id", ""), actor(rc));
      return confirmation_task(id, instance, *note);
    }
    lock.unlock();
    ctx_.services.instances.jobs().cancel(instance, job, actor(rc));  // cancel_job's path
    return of_job(instance, job);
  } catch (const UsageError& e) {
    throw invalid(fmt::format("task {}: {}", id, e.what()));
  }
}

void JobTasks::update(const std::string& id, const json& input_responses, mcp::RequestContext& rc) {
  const auto [instance, job] = resolve(id);
  const auto note_file = confirm_note(ctx_.services.instances.store().get(instance), job);
  std::lock_guard lock(confirm_mutex_);
  std::optional<json> note = load_note(note_file);
  if (!note) {
    get(id, rc);  // an unknown job is still said as such
    return;
  }
  const auto answer = input_responses.find(std::string(kConfirmKey));
  if (note->value("state", "") != "asking" || answer == input_responses.end()) return;
  (*note)["updated_at"] = timeutil::iso_utc();
  if (!accepts(*answer)) {
    (*note)["state"] = "declined";
    (*note)["why"] = "the user declined";
  } else {
    try {
      const jobs::Record rec = ctx_.services.instances.jobs().submit(request_of(note->at("request")), actor(rc));
      (*note)["state"] = "submitted";
      (*note)["job_id"] = rec.id;
    } catch (const std::exception& e) {  // the cluster or a cap refused it: the task ends with why
      (*note)["state"] = "refused";
      (*note)["error"] = fmt::format("the job was confirmed but not submitted: {}", e.what());
    }
  }
  save_note(note_file, *note);
}

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

}  // namespace nshpc::tools
