// Talking to Slurm: sbatch to submit; one squeue per poll for all tracked jobs (queued, running
// and recently finished, with pending reasons and exit statuses), plus sacct only for jobs the
// controller has already forgotten (where the cluster keeps accounting); scancel. No knowledge
// of instances.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "config/config.hpp"
#include "jobs/state.hpp"

namespace nshpc::jobs {

// A failure to talk to the scheduler (sbatch/squeue/sacct/scancel missing or failing): never
// to be mistaken for "job not found". What kind of failure it was is decided once, where the
// program's result is read, and kept for callers to branch on.
class SchedulerError : public Error {
 public:
  enum class Cause {
    failed,         // the program ran and failed (or did not answer in time)
    not_started,    // it could not be started: code() is the errno (ENOENT: not installed)
    no_accounting,  // sacct: this cluster keeps no accounting
  };
  SchedulerError(Cause cause, std::string message, int code = 0)
      : Error(std::move(message)), cause_(cause), code_(code) {}
  Cause cause() const noexcept { return cause_; }
  int code() const noexcept { return code_; }

 private:
  Cause cause_;
  int code_;
};

// What the scheduler says about one job.
struct SlurmStatus {
  std::string scheduler_state;  // as Slurm says it: PENDING, RUNNING, COMPLETED, TIMEOUT, …
  State state = State::running;  // scheduler_state mapped once, when it is read (state_for)
  std::string reason;            // pending reason (Resources, Priority, …) or "None"
  std::optional<int> exit_code;
  std::optional<int> signal;
};

// Slurm's state words mapped to ns-hpc's; running for unknown live ones.
State state_for(std::string_view slurm_state);

class SlurmClient {
 public:
  explicit SlurmClient(const config::JobsSlurm& config);

  // The sbatch argv: sbatch_command with every "{name}" replaced by resources[name], then
  // --parsable, the job name and the output files. Throws UsageError for a placeholder that
  // names no resource.
  std::vector<std::string> sbatch_argv(const std::map<std::string, std::int64_t>& resources,
                                       const std::string& job_name, const std::string& stdout_path,
                                       const std::string& stderr_path, const std::string& workdir) const;
  // Submits `script` (on sbatch's stdin); returns the Slurm job id. Throws SchedulerError with
  // what sbatch said.
  std::string submit(const std::vector<std::string>& argv, const std::string& script);

  // One query for all `ids`. Jobs the scheduler does not (yet, or any more) know are absent.
  // Throws SchedulerError when the query itself fails.
  std::map<std::string, SlurmStatus> query(const std::vector<std::string>& ids);

  // scancel; throws SchedulerError.
  void cancel(const std::string& id);

  // Where the ends of jobs the controller forgot come from: sacct, or squeue (no accounting:
  // such jobs are lost); `automatic` until decided at the first need.
  config::StatusSource source() const { return source_; }
  // Scheduler processes started so far (for the benchmark and tests).
  std::uint64_t invocations() const { return invocations_.load(); }

 private:
  // Runs one scheduler command (counted) and returns its stdout; a program that cannot be
  // started or that fails becomes SchedulerError (`failed` + what it said).
  std::string run(const std::vector<std::string>& argv, const std::string& input, std::string_view failed);
  // `command` with `options`, then "-j" and the ids: the one query of squeue or sacct.
  std::string ask(const std::vector<std::string>& command, std::initializer_list<const char*> options,
                  const std::vector<std::string>& ids);
  std::map<std::string, SlurmStatus> query_sacct(const std::vector<std::string>& ids);
  std::map<std::string, SlurmStatus> query_squeue(const std::vector<std::string>& ids);

  const config::JobsSlurm& config_;
  config::StatusSource source_;
  std::atomic<std::uint64_t> invocations_{0};
};

}  // namespace nshpc::jobs
