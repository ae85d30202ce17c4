// Slurm client (see slurm.hpp).
#include "jobs/slurm.hpp"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/text.hpp"

namespace nshpc::jobs {

namespace {

constexpr std::chrono::seconds kCommandTimeout{60};

std::string first_word(std::string_view s) {
  const auto space = s.find(' ');
  return std::string(s.substr(0, space));
}

// "3:0" → code 3, signal 0.
void parse_exit(std::string_view text, SlurmStatus& st) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) return;
  try {
    st.exit_code = std::stoi(std::string(text.substr(0, colon)));
    st.signal = std::stoi(std::string(text.substr(colon + 1)));
  } catch (const std::exception&) {
  }
}

}  // namespace

State state_for(std::string_view s) {
  if (s == "PENDING" || s == "REQUEUED" || s == "REQUEUE_HOLD" || s == "REQUEUE_FED" || s == "RESV_DEL_HOLD")
    return State::pending;
  if (s == "COMPLETED") return State::completed;
  if (s == "FAILED" || s == "BOOT_FAIL" || s == "DEADLINE" || s == "SPECIAL_EXIT") return State::failed;
  if (s == "CANCELLED" || s == "REVOKED") return State::cancelled;
  if (s == "TIMEOUT") return State::timed_out;
  if (s == "OUT_OF_MEMORY") return State::out_of_memory;
  if (s == "NODE_FAIL") return State::node_fail;
  if (s == "PREEMPTED") return State::preempted;
  return State::running;  // RUNNING, CONFIGURING, COMPLETING, SUSPENDED, STAGE_OUT, SIGNALING, …
}

std::string SlurmClient::run(const std::vector<std::string>& argv, const std::string& input, std::string_view failed) {
  CommandResult result;
  try {
    ++invocations_;
    result = run_command(argv, input, kCommandTimeout);
    if (log::enabled(log::Level::debug))
      log::debug("slurm: {} exited {}{}", text::shell_join(argv), result.exit_code, result.timed_out ? " (timed out)" : "");
  } catch (const SysError& e) {
    throw SchedulerError(SchedulerError::Cause::not_started,
                         fmt::format("cannot run {}: {} (is Slurm installed on this machine, and is {} in PATH?)",
                                     argv[0], std::strerror(e.code()), argv[0]),
                         e.code());
  }
  if (result.exit_code != 0 || result.timed_out) {
    const bool no_accounting = result.err.find("accounting storage is disabled") != std::string::npos;
    throw SchedulerError(no_accounting ? SchedulerError::Cause::no_accounting : SchedulerError::Cause::failed,
                         std::string(failed) + describe_failure(argv, result));
  }
  return std::move(result.out);
}

std::string SlurmClient::ask(const std::vector<std::string>& command, std::initializer_list<const char*> options,
                             const std::vector<std::string>& ids) {
  std::vector<std::string> argv = command;
  argv.insert(argv.end(), options.begin(), options.end());
  argv.emplace_back("-j");
  argv.push_back(fmt::format("{}", fmt::join(ids, ",")));
  return run(argv, {}, "");
}

SlurmClient::SlurmClient(const config::JobsSlurm& config) : config_(config), source_(config.status_source) {}


std::vector<std::string> SlurmClient::sbatch_argv(const std::map<std::string, std::int64_t>& resources,
                                                  const std::string& job_name, const std::string& stdout_path,
                                                  const std::string& stderr_path, const std::string& workdir) const {
  if (config_.sbatch_command.empty()) throw UsageError("[jobs.slurm] sbatch_command is empty; set the sbatch argv");
  std::vector<std::string> argv;
  for (const std::string& part : config_.sbatch_command) {
    std::string out;
    std::size_t pos = 0;
    while (pos < part.size()) {
      const auto open = part.find('{', pos);
      if (open == std::string::npos) {
        out += part.substr(pos);
        break;
      }
      const auto close = part.find('}', open);
      if (close == std::string::npos) {
        out += part.substr(pos);
        break;
      }
      out += part.substr(pos, open - pos);
      const std::string name = part.substr(open + 1, close - open - 1);
      auto it = resources.find(name);
      if (it == resources.end())
        throw UsageError(fmt::format("[jobs.slurm] sbatch_command uses {{{}}}, which is not a resource in "
                                     "[jobs.slurm.limit]; add it there or remove it from the command",
                                     name));
      out += std::to_string(it->second);
      pos = close + 1;
    }
    argv.push_back(std::move(out));
  }
  argv.push_back("--parsable");
  argv.push_back("--job-name=" + job_name);
  argv.push_back("--output=" + stdout_path);
  argv.push_back("--error=" + stderr_path);
  argv.push_back("--chdir=" + workdir);
  return argv;
}

std::string SlurmClient::submit(const std::vector<std::string>& argv, const std::string& script) {
  const std::string out = run(argv, script, "submitting failed: ");
  // --parsable: "<id>" or "<id>;<cluster>"
  std::string id = out.substr(0, out.find_first_of(";\n"));
  while (!id.empty() && (id.back() == ' ' || id.back() == '\r')) id.pop_back();
  if (id.empty() || id.find_first_not_of("0123456789_") != std::string::npos)
    throw SchedulerError(SchedulerError::Cause::failed, fmt::format("{} printed no job id (got {:?}); is it really sbatch?", argv[0], out.substr(0, 200)));
  return id;
}

std::map<std::string, SlurmStatus> SlurmClient::query(const std::vector<std::string>& ids) {
  if (ids.empty()) return {};
  // squeue knows every job the controller holds: queued, running, and finished ones for
  // MinJobAge after their end (state, pending reason and exit status in one call).
  std::map<std::string, SlurmStatus> out = query_squeue(ids);
  std::vector<std::string> missing;
  for (const auto& id : ids)
    if (!out.count(id)) missing.push_back(id);
  if (missing.empty() || source_ == config::StatusSource::squeue) return out;
  // Jobs the controller has forgotten: accounting (sacct) has their ends, where there is one.
  try {
    for (auto& [id, st] : query_sacct(missing)) out.emplace(id, std::move(st));
    source_ = config::StatusSource::sacct;
  } catch (const SchedulerError& e) {
    const bool no_accounting = e.cause() != SchedulerError::Cause::failed;  // or no sacct at all
    if (source_ == config::StatusSource::sacct || !no_accounting) throw;
    source_ = config::StatusSource::squeue;  // decided once: this cluster keeps no accounting
  }
  return out;
}

std::map<std::string, SlurmStatus> SlurmClient::query_sacct(const std::vector<std::string>& ids) {
  const std::string text = ask(config_.sacct_command, {"-n", "-X", "-P", "-o", "JobIDRaw,State,ExitCode,Reason"}, ids);
  std::map<std::string, SlurmStatus> out;
  for (auto line : text::split(text, '\n')) {
    if (line.empty()) continue;
    auto f = text::split(line, '|');
    if (f.size() < 4) continue;
    SlurmStatus st;
    st.scheduler_state = first_word(f[1]);
    st.state = state_for(st.scheduler_state);
    st.reason = std::string(f[3]);
    parse_exit(f[2], st);
    out[std::string(f[0])] = std::move(st);
  }
  return out;
}

std::map<std::string, SlurmStatus> SlurmClient::query_squeue(const std::vector<std::string>& ids) {
  const std::string text = ask(config_.squeue_command, {"-h", "-t", "all", "-O", "JobID:|,State:|,Reason:|,exit_code:|"}, ids);
  const auto trim = [](std::string_view v) { return std::string(text::trim(v)); };
  std::map<std::string, SlurmStatus> out;
  for (auto line : text::split(text, '\n')) {
    auto f = text::split(line, '|');
    if (f.size() < 4) continue;
    SlurmStatus st;
    st.scheduler_state = first_word(trim(f[1]));
    st.state = state_for(st.scheduler_state);
    st.reason = trim(f[2]);
    if (is_final(st.state)) {
      // The raw wait status: code << 8 | signal.
      try {
        const int raw = std::stoi(trim(f[3]));
        st.exit_code = (raw >> 8) & 0xff;
        st.signal = raw & 0x7f;
      } catch (const std::exception&) {
      }
    }
    out[trim(f[0])] = std::move(st);
  }
  return out;
}

void SlurmClient::cancel(const std::string& id) {
  std::vector<std::string> argv = config_.scancel_command;
  argv.push_back(id);
  run(argv, {}, "cancelling failed: ");
}

}  // namespace nshpc::jobs
