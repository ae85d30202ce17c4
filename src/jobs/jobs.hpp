// Async jobs in instances on the local node: submit, wait, cancel, list; limits through cgroups
// and rlimits; nothing lost across server restarts.
//
// A job's record lives in <instance>/.ns_hpc_jobs/<id>.state (atomic writes); its output in
// <workspace>/.ns_hpc_output/<id>.out|.err (so the agent reads it as /workspace/...), created and
// read beneath the workspace without following links; bwrap's JSON status in
// <instance>/status/<id>.status. A job runs under a job keeper (sandbox/keeper.hpp), so it keeps
// running, and its time limit holds, while the server is down; a restarted server re-attaches
// through the status file (sandbox init pid + its pid-namespace inode: safe against pid reuse)
// and records the real exit code and end of jobs that ended meanwhile.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/json.hpp"
#include "config/config.hpp"
#include "jobs/slurm.hpp"
#include "jobs/state.hpp"
#include "sandbox/handle.hpp"
#include "sandbox/sandbox.hpp"
#include "store/store.hpp"

namespace nshpc::jobs {

// Resource limits of one job; unset fields take [jobs.local.limit] defaults.
struct LimitRequest {
  std::map<std::string, std::int64_t> values;  // cpus, memory (MiB), pids, time (s), output (MiB)
};

// Persisted as <id>.state (nlohmann-json, see record.cpp): the keys are the member names,
// except id ("job_id") and state ("status"); a missing key takes the default below.
struct Record {
  std::string id;           // 12 hex characters
  std::string instance_id;
  std::string command;      // shell command (/bin/sh -c), or the argv joined for display
  std::vector<std::string> argv;  // the exact argv run in the sandbox
  std::string cwd;                // sandbox path it starts in; empty: the workspace
  std::vector<std::pair<std::string, std::string>> env;  // extra variables it was given
  std::string stdin_text;         // its stdin (not kept on record: only the start needs it)
  Mode mode = Mode::local;
  State state = State::pending;
  std::string reason;       // why it ended as it did: "out of memory", "time limit (60 s)", ...
  std::optional<int> exit_code;
  std::string created_at, started_at, finished_at;  // ISO 8601 UTC
  std::map<std::string, std::int64_t> limits;       // effective
  std::vector<std::string> unenforced;              // limits this host could not enforce
  std::string stdout_path, stderr_path;  // host paths
  // Local jobs: the handle on its execution (sandbox::Execution::handle(): the backend that runs
  // it and that backend's data, opaque here; given back to the backend's attach()). On disk
  // {"handle": {"backend", "version", "data"}}. Records of earlier releases load too (record.cpp):
  // "backend" beside an untyped "handle" object, or the bwrap fields "status_path" and
  // "bwrap_pid" (or "pid"), with the job's cgroups beside them in "cgroups".
  sandbox::ExecutionHandle handle;
  pid_t owner_pid = 0;             // the process that submitted it, and that process's start
  std::uint64_t owner_start = 0;   // time: a pending job whose submitter is gone never started
  bool cancel_requested = false;
  // Slurm jobs (Mode::slurm; these keys only in their records): the scheduler's id, its state
  // and reason as it said them (e.g. PENDING / Resources, shown as they are; `state` is what
  // they map to), and the last failure to ask the scheduler (cleared by the next success).
  // `signal`: the signal that ended the job (both modes; a local job's when its exit code says
  // one, 128+N).
  std::string slurm_job_id;
  std::string scheduler_state, scheduler_reason;
  std::optional<int> signal;
  std::string scheduler_error;

  nlohmann::json to_json() const;
  static std::optional<Record> from_json(const nlohmann::json& j);
};

// What callers see: the record, tails of the output and sandbox paths.
struct View {
  Record record;
  std::string stdout_tail, stderr_tail;
  std::string stdout_sandbox_path, stderr_sandbox_path;
  double duration_s = 0;
};

struct SubmitRequest {
  std::string instance_id;
  std::vector<std::string> argv;  // e.g. {"/bin/bash", "-c", command} ([terminal] shell)
  std::string display;            // the command as shown in lists
  std::string cwd;                // absolute sandbox path; empty: the workspace (local jobs)
  std::vector<std::pair<std::string, std::string>> env;  // extra variables (local jobs)
  std::string stdin_text;         // given on stdin (local jobs); empty: none
  LimitRequest limits;            // local jobs: [jobs.local.limit]; Slurm jobs: [jobs.slurm.limit]
  Mode mode = Mode::local;
};

// The request of a job that runs `command` as `shell -c command` ([terminal] shell), listed as
// the command itself: how every face submits a command line.
SubmitRequest shell_job(std::string instance_id, const std::string& command, const std::string& shell);

struct TailOptions {
  std::size_t lines = 50;
  std::size_t bytes = 16 * 1024;
};

class JobStore;
class Executor;

// Points where a test steps in to order threads deterministically; unset otherwise.
struct EngineHooks {
  // submit: the instance was found; nothing of the job is written yet.
  std::function<void(const std::string& instance_id)> instance_found;
  // A job another process left unfinished is about to be watched here.
  std::function<void(const std::string& job_id)> adopting;
};

// The facade the tools and the CLI use: checks a request, writes the pending record through the
// job store (jobs/job_store.hpp) and hands the job to the executor of its mode
// (jobs/executor.hpp).
class Engine final {
 public:
  Engine(const config::Config& config, store::Store& store, sandbox::Backend& backend);
  ~Engine();  // stops watching; never kills jobs
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts a job and returns at once (state running, or failed when the sandbox could not start).
  // Throws UsageError for an empty command, an unknown/archived instance, limits over their max,
  // or when the concurrency caps are reached.
  Record submit(const SubmitRequest& request, std::string_view actor);

  // Waits until the job is final, `timeout` passes or `interrupted()` returns true; checks it
  // every 100 ms and calls `tick(elapsed)` about once a second.
  View wait(const std::string& instance_id, const std::string& job_id, std::chrono::milliseconds timeout,
            const TailOptions& tail, const std::function<bool()>& interrupted = {},
            const std::function<void(double elapsed_s, const View& now)>& tick = {});
  View view(const std::string& instance_id, const std::string& job_id, const TailOptions& tail);

  // Newest first. Unknown instance: UsageError.
  std::vector<Record> list(const std::string& instance_id, std::optional<State> filter = std::nullopt);

  // SIGTERM to every process of the job, then after [jobs] cancel_grace seconds SIGKILL to the
  // whole tree. Final jobs are left alone. Returns the record afterwards.
  Record cancel(const std::string& instance_id, const std::string& job_id, std::string_view actor);

  // Finds jobs left running by an earlier server (or CLI) and watches them again.
  void recover();

  // Pending or running jobs of an instance (archive and delete refuse then): held here, or found
  // running on the host by their executor.
  std::size_t active_jobs(const std::filesystem::path& instance_base);

  std::size_t tracked() const;

  // Before the first use.
  void set_hooks(EngineHooks hooks);

 private:
  Executor& executor(Mode mode);
  // Watches a job left unfinished by another process, or records how it ended.
  void adopt(const store::Instance& inst, const std::string& job_id);
  // The job's record as tracked here, else from disk; a job another process left unfinished is
  // watched here first (tracked or adopted) and its record read again. nullopt: no such job.
  std::optional<Record> current_record(const store::Instance& inst, const std::string& job_id);

  const config::Config& config_;
  store::Store& store_;
  std::unique_ptr<JobStore> jobs_;
  // One per mode, indexed by Mode.
  std::unique_ptr<Executor> executors_[2];
};

// The view as data (for --json and structuredContent): job_id, instance_id, status, exit_code,
// reason, command, mode, duration_s, created_at, started_at, finished_at, stdout_path,
// stderr_path (sandbox paths), stdout_tail, stderr_tail, limits, unenforced.
nlohmann::json view_json(const View& view);
nlohmann::json record_summary_json(const Record& record);  // for listings

// A readable multi-line summary with the output tails (what an agent or a person needs).
std::string view_text(const View& view);

// Job ids: 12 lowercase hex characters.
std::string new_job_id();
bool valid_job_id(std::string_view id);

}  // namespace nshpc::jobs
