// Job records on disk, the final state exactly once, and the places under the caps.
#include "jobs/job_store.hpp"

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"

namespace nshpc::jobs {

namespace stdfs = std::filesystem;

JobStore::JobStore(const config::Config& config, store::Store& instances) : config_(config), instances_(instances) {}

std::optional<Record> JobStore::load(const store::Instance& inst, const std::string& job_id) const {
  auto text = fs::read_file(state_file(inst, job_id));
  if (!text) return std::nullopt;
  return Record::from_json(parse_json_or_discarded(*text));
}

void JobStore::save(const store::Instance& inst, const Record& record) const {
  fs::atomic_write(state_file(inst, record.id), record.to_json().dump(2) + "\n", 0600);
}

std::vector<std::string> JobStore::job_ids(const store::Instance& inst) const {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(dir(inst), ec))
    if (entry.path().extension() == ".state") ids.push_back(entry.path().stem().string());
  return ids;
}

bool JobStore::save_final(const store::Instance& inst, Record& record, const nlohmann::json& fields) const {
  // One lock per instance across processes: whoever comes second finds the final state.
  fs::FileLock lock(dir(inst) / ".lock");
  auto on_disk = load(inst, record.id);
  if (on_disk && is_final(on_disk->state)) {
    record = *on_disk;
    return false;
  }
  save(inst, record);
  instances_.audit(inst, fmt::format("job.{}", to_string(record.state)), "ns-hpc:jobs", fields);
  return true;
}

JobStore::Reservation::Reservation(JobStore& store, const std::string& instance_id, const std::string& job_id)
    : store_(store), key_(key(instance_id, job_id)) {
  std::lock_guard lock(store_.mutex_);
  // Jobs that hold a place: watched (local), tracked (Slurm), or still being started here.
  const std::string prefix = instance_id + "/";
  std::size_t all = 0, here = 0;
  auto count = [&](const std::string& k) {
    ++all;
    here += k.starts_with(prefix);
  };
  for (const auto& k : store_.held_) count(k);
  for (const auto& k : store_.submitting_)
    if (!store_.held_.count(k)) count(k);
  if (static_cast<std::int64_t>(all) >= store_.config_.jobs.max_running)
    throw UsageError(fmt::format("{} jobs are running or queued, the most this server allows ([jobs] max_running); "
                                 "wait for some to finish or cancel some",
                                 all));
  if (static_cast<std::int64_t>(here) >= store_.config_.jobs.max_running_per_instance)
    throw UsageError(fmt::format("{} jobs are running or queued in instance '{}', the most allowed "
                                 "([jobs] max_running_per_instance); wait or cancel some",
                                 here, instance_id));
  store_.submitting_.insert(key_);
}

JobStore::Reservation::~Reservation() {
  std::lock_guard lock(store_.mutex_);
  store_.submitting_.erase(key_);
}

bool JobStore::submitting(const std::string& instance_id, const std::string& job_id) const {
  std::lock_guard lock(mutex_);
  return submitting_.count(key(instance_id, job_id)) > 0;
}

void JobStore::hold(const std::string& instance_id, const std::string& job_id) {
  std::lock_guard lock(mutex_);
  held_.insert(key(instance_id, job_id));
}

void JobStore::release(const std::string& instance_id, const std::string& job_id) {
  {
    std::lock_guard lock(mutex_);
    held_.erase(key(instance_id, job_id));
  }
  changed_.notify_all();
}

bool JobStore::held(const std::string& instance_id, const std::string& job_id) const {
  std::lock_guard lock(mutex_);
  return held_locked(instance_id, job_id);
}

bool JobStore::held_locked(const std::string& instance_id, const std::string& job_id) const {
  return held_.count(key(instance_id, job_id)) > 0;
}

std::size_t JobStore::held_count() const {
  std::lock_guard lock(mutex_);
  return held_.size();
}

std::size_t JobStore::places_in(const std::string& instance_id) const {
  std::lock_guard lock(mutex_);
  const std::string prefix = instance_id + "/";
  std::size_t n = 0;
  for (const auto& k : held_) n += k.starts_with(prefix);
  for (const auto& k : submitting_) n += k.starts_with(prefix) && !held_.count(k);
  return n;
}

void JobStore::notify_changed() {
  { std::lock_guard lock(mutex_); }  // a waiter between its check and its wait sees this
  changed_.notify_all();
}

void JobStore::wait_changed(std::chrono::steady_clock::time_point until, const std::function<bool()>& done) {
  std::unique_lock lock(mutex_);
  if (done) {
    changed_.wait_until(lock, until, done);
  } else {
    changed_.wait_until(lock, until);
  }
}

}  // namespace nshpc::jobs
