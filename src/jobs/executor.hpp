// One executor per job mode (jobs::Mode): it starts a job whose pending record the engine wrote,
// watches it, finishes its record (through the job store, exactly once), cancels it, and adopts
// jobs another process left unfinished. The engine (jobs.hpp) picks the executor by the mode.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "config/config.hpp"
#include "jobs/job_store.hpp"
#include "jobs/jobs.hpp"
#include "jobs/slurm.hpp"
#include "jobs/support.hpp"
#include "sandbox/sandbox.hpp"
#include "store/store.hpp"

namespace nshpc::jobs {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual Mode mode() const = 0;
  // Where this mode's limits, their defaults and bounds are.
  virtual LimitTable limits() const = 0;
  // Fills what this mode keeps in a new record before it is first written.
  virtual void prepare(const store::Instance& inst, Record& record) = 0;
  // Host folders made with the pending record (beside the jobs folder).
  virtual std::vector<std::filesystem::path> folders(const store::Instance& inst) const = 0;
  // Starts the job whose pending record is on disk (its place reserved by the caller); returns
  // its record afterwards (running, pending in a queue, or failed to start). Throws when it
  // refuses (nothing of the job is left running then).
  virtual Record start(const store::Instance& inst, Record record, std::string_view actor) = 0;
  // The record of a job watched here; nullopt when it is not.
  virtual std::optional<Record> tracked(const std::string& instance_id, const std::string& job_id) = 0;
  // Watches an unfinished job on record that another process (or an earlier server) left, or
  // records how it ended.
  virtual void adopt(const store::Instance& inst, const Record& record) = 0;
  // Ends an unfinished job; returns once it is final (or the waits are over).
  virtual void cancel(const store::Instance& inst, const std::string& job_id, std::string_view actor) = 0;
  // True when an unfinished job on record still holds its instance (archive/delete wait).
  virtual bool holds_instance(const Record& record) = 0;
  // The tails of its output (and what else this mode has to say there).
  virtual void tails(const store::Instance& inst, const Record& record, const TailOptions& tail, View& view) = 0;
};

// Local jobs: a sandbox of the backend under a job keeper, watched on one thread.
// While it exists, the calling thread runs on `cpus` (a job limit) of its cores, when that is
// fewer than it may use and cgroups enforce the quota, so a sandbox forked meanwhile sees as
// many cores as it may use (nproc, sched_getaffinity). Restores the thread's affinity.
class ScopedAffinity {
 public:
  ScopedAffinity(const std::map<std::string, std::int64_t>& limits, const std::string& job_id, bool use_cgroups);
  ~ScopedAffinity();
  ScopedAffinity(const ScopedAffinity&) = delete;
  ScopedAffinity& operator=(const ScopedAffinity&) = delete;

 private:
  std::optional<cpu_set_t> saved_;
};

class LocalExecutor final : public Executor {
 public:
  LocalExecutor(const config::Config& config, JobStore& jobs, sandbox::Backend& backend);
  ~LocalExecutor() override;  // stops watching; never kills jobs

  Mode mode() const override { return Mode::local; }
  LimitTable limits() const override;
  void prepare(const store::Instance& inst, Record& record) override;
  std::vector<std::filesystem::path> folders(const store::Instance& inst) const override;
  Record start(const store::Instance& inst, Record record, std::string_view actor) override;
  std::optional<Record> tracked(const std::string& instance_id, const std::string& job_id) override;
  void adopt(const store::Instance& inst, const Record& record) override;
  void cancel(const store::Instance& inst, const std::string& job_id, std::string_view actor) override;
  bool holds_instance(const Record& record) override;
  void tails(const store::Instance& inst, const Record& record, const TailOptions& tail, View& view) override;

 private:
  struct Running;
  void watch_loop();
  void wake();
  void finish(const std::shared_ptr<Running>& job);
  void start_watching(std::shared_ptr<Running> job);
  std::string output_limit_reached(const std::shared_ptr<Running>& job, std::int64_t limit_mib);
  std::shared_ptr<Running> find(const std::string& instance_id, const std::string& job_id);

  const config::Config& config_;
  JobStore& jobs_;
  sandbox::Backend& backend_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Running>> running_;  // key: instance/job
  std::set<std::string> adopting_;                           // being adopted by one caller
  bool stopping_ = false;
  UniqueFd wake_fd_;
  std::thread watcher_;
  // Finishes run on their own threads (a finish can wait for a sandbox to be reaped): the
  // watcher goes on with the other jobs meanwhile. Joined when done, and at the end.
  struct Finisher {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Finisher> finishers_;
  void finish_in_background(const std::shared_ptr<Running>& job);
  void join_finishers(bool all);
};

// Slurm jobs: sbatch runs `ns-hpc bwrap --fresh <instance> -- <command>` on a node; one status
// query per poll interval covers every tracked job.
class SlurmExecutor final : public Executor {
 public:
  SlurmExecutor(const config::Config& config, JobStore& jobs);
  ~SlurmExecutor() override;

  Mode mode() const override { return Mode::slurm; }
  LimitTable limits() const override;
  void prepare(const store::Instance& inst, Record& record) override;
  std::vector<std::filesystem::path> folders(const store::Instance& inst) const override;
  Record start(const store::Instance& inst, Record record, std::string_view actor) override;
  std::optional<Record> tracked(const std::string& instance_id, const std::string& job_id) override;
  void adopt(const store::Instance& inst, const Record& record) override;
  void cancel(const store::Instance& inst, const std::string& job_id, std::string_view actor) override;
  bool holds_instance(const Record& record) override;
  void tails(const store::Instance& inst, const Record& record, const TailOptions& tail, View& view) override;

 private:
  struct Job;
  std::vector<std::string> batch_command(const store::Instance& inst, const std::string& job_id,
                                         const std::vector<std::string>& argv) const;
  std::shared_ptr<Job> find(const std::string& instance_id, const std::string& job_id);
  void track(const store::Instance& inst, const Record& record);
  void poll_loop();
  void poll();  // one scheduler query for every tracked job
  void apply(Job& job, const SlurmStatus* status);

  const config::Config& config_;
  JobStore& jobs_;
  SlurmClient slurm_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Job>> jobs_tracked_;  // key: instance/job
  bool stopping_ = false;
  bool poll_now_ = false;
  std::condition_variable wake_;
  std::thread thread_;  // started with the first job
};

}  // namespace nshpc::jobs
