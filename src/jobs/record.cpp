// Job states, ids and the persisted record.
#include <array>

#include <fmt/format.h>

#include "base/random.hpp"
#include "jobs/jobs.hpp"

namespace nshpc::jobs {

namespace {
constexpr std::array<std::pair<State, std::string_view>, 10> kStates = {{{State::pending, "pending"},
                                                                        {State::running, "running"},
                                                                        {State::completed, "completed"},
                                                                        {State::failed, "failed"},
                                                                        {State::cancelled, "cancelled"},
                                                                        {State::timed_out, "timed_out"},
                                                                        {State::lost, "lost"},
                                                                        {State::out_of_memory, "out_of_memory"},
                                                                        {State::node_fail, "node_fail"},
                                                                        {State::preempted, "preempted"}}};
}  // namespace

std::string_view to_string(State state) {
  for (const auto& [s, name] : kStates)
    if (s == state) return name;
  return "lost";
}

std::optional<State> parse_state(std::string_view text) {
  for (const auto& [s, name] : kStates)
    if (name == text) return s;
  return std::nullopt;
}

bool is_final(State state) { return state != State::pending && state != State::running; }

std::string new_job_id() {
  return random::hex(6);
}

bool valid_job_id(std::string_view id) {
  if (id.size() != 12) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

nlohmann::json Record::to_json() const {
  nlohmann::json j = {{"job_id", id},
                      {"instance_id", instance_id},
                      {"command", command},
                      {"argv", argv},
                      {"mode", mode},
                      {"status", to_string(state)},
                      {"reason", reason},
                      {"exit_code", exit_code ? nlohmann::json(*exit_code) : nlohmann::json(nullptr)},
                      {"created_at", created_at},
                      {"started_at", started_at},
                      {"finished_at", finished_at},
                      {"limits", limits},
                      {"unenforced", unenforced},
                      {"cgroups", cgroups},
                      {"stdout_path", stdout_path},
                      {"stderr_path", stderr_path},
                      {"status_path", status_path},
                      {"pid", bwrap_pid},
                      {"owner_pid", owner_pid},
                      {"owner_start", owner_start},
                      {"cancel_requested", cancel_requested}};
  if (mode == "slurm") {
    j["slurm_job_id"] = slurm_job_id;
    j["scheduler_state"] = scheduler_state;
    j["scheduler_reason"] = scheduler_reason;
    j["signal"] = signal ? nlohmann::json(*signal) : nlohmann::json(nullptr);
    j["scheduler_error"] = scheduler_error;
  }
  return j;
}

std::optional<Record> Record::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  try {
    Record r;
    r.id = j.value("job_id", "");
    if (!valid_job_id(r.id)) return std::nullopt;
    r.instance_id = j.value("instance_id", "");
    r.command = j.value("command", "");
    if (auto it = j.find("argv"); it != j.end() && it->is_array()) r.argv = it->get<std::vector<std::string>>();
    r.mode = j.value("mode", "local");
    r.state = parse_state(j.value("status", "")).value_or(State::lost);
    r.reason = j.value("reason", "");
    if (auto it = j.find("exit_code"); it != j.end() && it->is_number_integer()) r.exit_code = it->get<int>();
    r.created_at = j.value("created_at", "");
    r.started_at = j.value("started_at", "");
    r.finished_at = j.value("finished_at", "");
    if (auto it = j.find("limits"); it != j.end() && it->is_object())
      r.limits = it->get<std::map<std::string, std::int64_t>>();
    if (auto it = j.find("unenforced"); it != j.end() && it->is_array())
      r.unenforced = it->get<std::vector<std::string>>();
    if (auto it = j.find("cgroups"); it != j.end() && it->is_array()) r.cgroups = it->get<std::vector<std::string>>();
    r.stdout_path = j.value("stdout_path", "");
    r.stderr_path = j.value("stderr_path", "");
    r.status_path = j.value("status_path", "");
    if (auto it = j.find("pid"); it != j.end() && it->is_number_integer()) r.bwrap_pid = it->get<pid_t>();
    r.cancel_requested = j.value("cancel_requested", false);
    r.owner_pid = j.value("owner_pid", 0);
    r.owner_start = j.value("owner_start", std::uint64_t{0});
    r.slurm_job_id = j.value("slurm_job_id", "");
    r.scheduler_state = j.value("scheduler_state", "");
    r.scheduler_reason = j.value("scheduler_reason", "");
    if (auto it = j.find("signal"); it != j.end() && it->is_number_integer()) r.signal = it->get<int>();
    r.scheduler_error = j.value("scheduler_error", "");
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a field of the wrong type: treated as corrupt
  }
}

nlohmann::json record_summary_json(const Record& r) {
  return {{"job_id", r.id},
          {"instance_id", r.instance_id},
          {"status", to_string(r.state)},
          {"exit_code", r.exit_code ? nlohmann::json(*r.exit_code) : nlohmann::json(nullptr)},
          {"reason", r.reason},
          {"command", r.command},
          {"mode", r.mode},
          {"slurm_job_id", r.mode == "slurm" ? nlohmann::json(r.slurm_job_id) : nlohmann::json(nullptr)},
          {"scheduler_state", r.mode == "slurm" ? nlohmann::json(r.scheduler_state) : nlohmann::json(nullptr)},
          {"scheduler_reason", r.mode == "slurm" ? nlohmann::json(r.scheduler_reason) : nlohmann::json(nullptr)},
          {"created_at", r.created_at},
          {"finished_at", r.finished_at}};
}

nlohmann::json view_json(const View& v) {
  nlohmann::json j = record_summary_json(v.record);
  j["started_at"] = v.record.started_at;
  j["duration_s"] = v.duration_s;
  j["stdout_path"] = v.stdout_sandbox_path;
  j["stderr_path"] = v.stderr_sandbox_path;
  j["stdout_tail"] = v.stdout_tail;
  j["stderr_tail"] = v.stderr_tail;
  j["limits"] = v.record.limits;
  j["unenforced"] = v.record.unenforced;
  j["signal"] = v.record.signal ? nlohmann::json(*v.record.signal) : nlohmann::json(nullptr);
  j["scheduler_error"] = v.record.mode == "slurm" ? nlohmann::json(v.record.scheduler_error) : nlohmann::json(nullptr);
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
  if (r.mode == "slurm") {
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
  if (r.state == State::running) text += "\nStill running: poll_job waits for it, cancel_job stops it.";
  if (r.state == State::pending) text += "\nWaiting in the scheduler's queue: poll_job waits for it, cancel_job removes it.";
  return text;
}

}  // namespace nshpc::jobs
