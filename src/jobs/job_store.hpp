// The job store: job records on disk (<instance>/.ns_hpc_jobs/<id>.state), the final state
// written exactly once across processes, the places jobs hold under [jobs] max_running and
// max_running_per_instance, and the signal that some job changed. Shared by the executors
// (jobs/executor.hpp); it starts and watches nothing itself.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/json.hpp"
#include "config/config.hpp"
#include "jobs/jobs.hpp"
#include "store/store.hpp"

namespace nshpc::jobs {

class JobStore {
 public:
  JobStore(const config::Config& config, store::Store& instances);
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  store::Store& instances() const { return instances_; }
  // Set before the first use (tests only).
  EngineHooks hooks;

  static std::filesystem::path dir(const store::Instance& inst) { return inst.base / ".ns_hpc_jobs"; }
  static std::filesystem::path state_file(const store::Instance& inst, const std::string& job_id) {
    return dir(inst) / (job_id + ".state");
  }

  // nullopt: no record, or a corrupt one.
  std::optional<Record> load(const store::Instance& inst, const std::string& job_id) const;
  void save(const store::Instance& inst, const Record& record) const;
  // The ids of the jobs on record in an instance (unordered).
  std::vector<std::string> job_ids(const store::Instance& inst) const;

  // Writes `record` (final) and its audit line `job.<state>` with `fields`, unless a final state
  // is on record already (another process finished the job): then `record` becomes that one and
  // nothing is written. True when this call wrote it.
  bool save_final(const store::Instance& inst, Record& record, const nlohmann::json& fields) const;

  // A job being started: its place under the caps, checked and taken in one step (parallel
  // submits cannot pass the caps together), and a mark that adoption leaves it alone. Lasts while
  // the reservation lives. The constructor throws UsageError when a cap is reached.
  class Reservation {
   public:
    Reservation(JobStore& store, const std::string& instance_id, const std::string& job_id);
    ~Reservation();
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;

   private:
    JobStore& store_;
    std::string key_;
  };
  bool submitting(const std::string& instance_id, const std::string& job_id) const;

  // Jobs watched here (by an executor) hold a place from hold() to release(); release() also
  // wakes whoever waits on changed().
  void hold(const std::string& instance_id, const std::string& job_id);
  void release(const std::string& instance_id, const std::string& job_id);
  bool held(const std::string& instance_id, const std::string& job_id) const;
  std::size_t held_count() const;
  // Jobs of an instance held or being submitted here.
  std::size_t places_in(const std::string& instance_id) const;

  // Some job changed (a poll, an end): wakes waiters.
  void notify_changed();
  // Waits until `done()` (called under the store's lock: it must not take other locks; held()
  // is fine through `held_locked`), a change, or `until`.
  void wait_changed(std::chrono::steady_clock::time_point until, const std::function<bool()>& done = {});
  // held() for a predicate of wait_changed (the lock is held there).
  bool held_locked(const std::string& instance_id, const std::string& job_id) const;

 private:
  static std::string key(const std::string& instance_id, const std::string& job_id) {
    return instance_id + "/" + job_id;
  }

  const config::Config& config_;
  store::Store& instances_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::set<std::string> held_;        // key: instance/job
  std::set<std::string> submitting_;  // jobs between their record and their watch
};

}  // namespace nshpc::jobs
