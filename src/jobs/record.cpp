// Job states, ids and the persisted record.
#include <fmt/format.h>

#include "base/json.hpp"
#include "base/random.hpp"
#include "jobs/jobs.hpp"

namespace nshpc::jobs {

namespace names {
// The first pair is what an unknown name reads as: an unknown mode runs locally, an unknown
// state is lost.
NLOHMANN_JSON_SERIALIZE_ENUM(Mode, {{Mode::local, "local"}, {Mode::slurm, "slurm"}})
NLOHMANN_JSON_SERIALIZE_ENUM(State, {{State::lost, "lost"},
                                     {State::pending, "pending"},
                                     {State::running, "running"},
                                     {State::completed, "completed"},
                                     {State::failed, "failed"},
                                     {State::cancelled, "cancelled"},
                                     {State::timed_out, "timed_out"},
                                     {State::out_of_memory, "out_of_memory"},
                                     {State::node_fail, "node_fail"},
                                     {State::preempted, "preempted"},
                                     {State::output_limit, "output_limit"}})
}  // namespace names

void to_json(nlohmann::json& out, const Mode& mode) { names::to_json(out, mode); }
void from_json(const nlohmann::json& in, Mode& mode) { names::from_json(in, mode); }
void to_json(nlohmann::json& out, const State& state) { names::to_json(out, state); }
void from_json(const nlohmann::json& in, State& state) { names::from_json(in, state); }

std::string to_string(State state) { return nlohmann::json(state).get<std::string>(); }
std::string to_string(Mode mode) { return nlohmann::json(mode).get<std::string>(); }

std::optional<State> parse_state(std::string_view text) {
  const auto state = nlohmann::json(text).get<State>();
  if (to_string(state) != text) return std::nullopt;  // read as the first name: not a state
  return state;
}

std::optional<Mode> parse_mode(std::string_view text) {
  const auto mode = nlohmann::json(text).get<Mode>();
  if (to_string(mode) != text) return std::nullopt;
  return mode;
}

bool is_final(State state) { return state != State::pending && state != State::running; }

SubmitRequest shell_job(std::string instance_id, const std::string& command, const std::string& shell) {
  SubmitRequest req;
  req.instance_id = std::move(instance_id);
  req.argv = {shell, "-c", command};
  req.display = command;
  return req;
}

std::string new_job_id() {
  return random::hex(6);
}

bool valid_job_id(std::string_view id) {
  if (id.size() != 12) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Every member by its name but the handle (below); missing keys take the defaults of Record.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Record, id, instance_id, command, argv, cwd, env, mode, state, reason, exit_code,
                                                created_at, started_at, finished_at, limits, unenforced,
                                                stdout_path, stderr_path, owner_pid, owner_start, cancel_requested,
                                                slurm_job_id, scheduler_state, scheduler_reason, signal,
                                                scheduler_error)

namespace {

// Members stored under another key, as since the first release: (member, key on disk).
constexpr std::pair<const char*, const char*> kKeyOnDisk[] = {{"id", "job_id"}, {"state", "status"}};
// The bwrap fields of the oldest records, now in the handle's data: (key on disk, key in the
// data). "pid" is the oldest name of "bwrap_pid".
constexpr std::pair<const char*, const char*> kOldHandleKeys[] = {
    {"status_path", "status_path"}, {"bwrap_pid", "pid"}, {"pid", "pid"}};
// The keys of earlier releases that the handle takes in: the backend's name beside an untyped
// handle, and the job's cgroups (which execute() now keeps in the handle's data).
constexpr const char* kBackendKey = "backend";
constexpr const char* kCgroupsKey = "cgroups";
// Written for Slurm jobs only.
constexpr const char* kSlurmOnly[] = {"slurm_job_id", "scheduler_state", "scheduler_reason", "scheduler_error"};

void rename_key(nlohmann::json& j, const char* from, const char* to) {
  auto it = j.find(from);
  if (it == j.end()) return;
  if (!j.contains(to)) j[to] = std::move(*it);
  j.erase(from);
}

}  // namespace

nlohmann::json Record::to_json() const {
  nlohmann::json j = *this;
  for (const auto& [member, key] : kKeyOnDisk) rename_key(j, member, key);
  if (mode != Mode::slurm)
    for (const char* key : kSlurmOnly) j.erase(key);
  if (!signal) j.erase("signal");
  if (cwd.empty()) j.erase("cwd");
  if (env.empty()) j.erase("env");
  if (!handle.empty()) j["handle"] = handle.to_json();
  return j;
}

namespace {

// The job's handle as any release wrote it (see Record::handle); an empty one when there is
// none (a Slurm job's, or a job that never started), nullopt when it is corrupt.
std::optional<sandbox::ExecutionHandle> handle_on_record(const nlohmann::json& rec) {
  const auto it = rec.find("handle");
  if (it != rec.end() && sandbox::ExecutionHandle::typed(*it)) return sandbox::ExecutionHandle::from_json(*it);
  // An earlier release's: bwrap's (or the backend named beside it), version 0, the same data.
  nlohmann::json data = nlohmann::json::object();
  if (it != rec.end()) {
    if (!it->is_object()) return std::nullopt;
    data = *it;
  } else {
    // Its bwrap fields (empty or zero ones are none: a Slurm job's, or a job that never started).
    for (const auto& [old_key, key] : kOldHandleKeys) {
      auto field = rec.find(old_key);
      if (field == rec.end()) continue;
      const bool none = (field->is_string() && field->get_ref<const std::string&>().empty()) ||
                        (field->is_number() && *field == 0) || field->is_null();
      if (!none && !data.contains(key)) data[key] = *field;
    }
  }
  if (auto cgroups = rec.find(kCgroupsKey); cgroups != rec.end()) {
    if (!cgroups->is_array()) return std::nullopt;
    if (!cgroups->empty() && !data.contains(kCgroupsKey)) data[kCgroupsKey] = *cgroups;
  }
  sandbox::ExecutionHandle handle = sandbox::ExecutionHandle::untyped(std::move(data));
  const auto backend = rec.find(kBackendKey);
  if (backend != rec.end() && !backend->is_string()) return std::nullopt;
  const bool named = backend != rec.end() && !backend->get_ref<const std::string&>().empty();
  if (named) handle.backend = backend->get<std::string>();
  if (!named && handle.data.empty()) return sandbox::ExecutionHandle{};  // nothing on record
  return handle;
}

}  // namespace

std::optional<Record> Record::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  nlohmann::json by_member = j;
  for (const auto& [member, key] : kKeyOnDisk) rename_key(by_member, key, member);
  std::optional<sandbox::ExecutionHandle> handle = handle_on_record(by_member);
  if (!handle) return std::nullopt;  // a handle of the wrong shape: treated as corrupt
  for (const char* key : {"handle", kBackendKey, kCgroupsKey}) by_member.erase(key);
  for (const auto& [old_key, key] : kOldHandleKeys) by_member.erase(old_key);
  try {
    auto r = by_member.get<Record>();
    if (!valid_job_id(r.id)) return std::nullopt;
    r.handle = std::move(*handle);
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a field of the wrong type: treated as corrupt
  }
}

namespace {

// Puts `value` unless it is an empty string: a result carries what is known, not blanks.
void put_text(nlohmann::json& j, const char* key, const std::string& value) {
  if (!value.empty()) j[key] = value;
}

}  // namespace

nlohmann::json record_summary_json(const Record& r) {
  nlohmann::json j = {{"job_id", r.id},
                      {"instance_id", r.instance_id},
                      {"status", to_string(r.state)},
                      {"exit_code", r.exit_code ? nlohmann::json(*r.exit_code) : nlohmann::json(nullptr)},
                      {"command", r.command},
                      {"mode", r.mode}};
  put_text(j, "reason", r.reason);
  if (r.signal && *r.signal != 0) j["signal"] = *r.signal;
  if (r.mode == Mode::slurm) {
    // A Slurm job's scheduler fields, known or not yet (null: the scheduler has not said).
    auto known = [](const std::string& v) { return v.empty() ? nlohmann::json(nullptr) : nlohmann::json(v); };
    j["slurm_job_id"] = known(r.slurm_job_id);
    j["scheduler_state"] = known(r.scheduler_state);
    j["scheduler_reason"] = known(r.scheduler_reason);
  }
  put_text(j, "created_at", r.created_at);
  put_text(j, "finished_at", r.finished_at);
  return j;
}

nlohmann::json view_json(const View& v) {
  nlohmann::json j = record_summary_json(v.record);
  put_text(j, "started_at", v.record.started_at);
  j["duration_s"] = v.duration_s;
  j["stdout_path"] = v.stdout_sandbox_path;
  j["stderr_path"] = v.stderr_sandbox_path;
  put_text(j, "stdout_tail", v.stdout_tail);
  put_text(j, "stderr_tail", v.stderr_tail);
  j["limits"] = v.record.limits;
  if (!v.record.unenforced.empty()) j["unenforced"] = v.record.unenforced;
  if (v.record.mode == Mode::slurm) put_text(j, "scheduler_error", v.record.scheduler_error);
  return j;
}

std::string view_text(const View& v) {
  const Record& r = v.record;
  std::string head = fmt::format("Job {} in instance '{}': {}", r.id, r.instance_id, to_string(r.state));
  if (r.exit_code) head += fmt::format(", exit code {}", *r.exit_code);
  if (r.signal && *r.signal != 0) head += fmt::format(", signal {}", *r.signal);
  head += fmt::format(" ({:.2f} s)", v.duration_s);
  if (!r.reason.empty() && r.state != State::completed) head += " — " + r.reason;
  std::string text = head + "\nCommand: " + r.command;
  if (r.mode == Mode::slurm) {
    text += fmt::format("\nSlurm job {}: {}", r.slurm_job_id.empty() ? std::string("(not submitted)") : r.slurm_job_id,
                        r.scheduler_state.empty() ? std::string("not yet seen by the scheduler") : r.scheduler_state);
    if (!r.scheduler_reason.empty() && r.scheduler_reason != "None") text += " (reason: " + r.scheduler_reason + ")";
    if (!r.scheduler_error.empty()) text += "\nAsking the scheduler failed: " + r.scheduler_error;
  }
  auto stream = [&](const char* name, const std::string& path, const std::string& tail) {
    text += fmt::format("\n{} ({}):", name, path);
    text += tail.empty() ? std::string(" (empty)") : "\n" + tail;
  };
  stream("stdout", v.stdout_sandbox_path, v.stdout_tail);
  stream("stderr", v.stderr_sandbox_path, v.stderr_tail);
  if (!r.unenforced.empty()) {
    text += "\nLimits not enforced on this host:";
    for (const auto& u : r.unenforced) text += "\n- " + u;
  }
  if (r.state == State::running) text += "\nStill running.";
  if (r.state == State::pending) text += "\nWaiting in the scheduler's queue.";
  return text;
}

}  // namespace nshpc::jobs
