// Slurm jobs: sbatch runs `ns-hpc bwrap --fresh <instance> -- <command>` on a node; one status
// query per poll interval covers every tracked job; the final state is written once through the
// job store, whichever process sees the end first.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <tuple>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "jobs/executor.hpp"

namespace nshpc::jobs {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct SlurmExecutor::Job {
  store::Instance inst;
  Record record;  // guarded by mu
  Clock::time_point tracked_since = Clock::now();
  std::mutex mu;
};

SlurmExecutor::SlurmExecutor(const config::Config& config, JobStore& jobs)
    : config_(config), jobs_(jobs), slurm_(config.jobs.slurm) {}

SlurmExecutor::~SlurmExecutor() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

LimitTable SlurmExecutor::limits() const {
  return {&config_.jobs.slurm.limit, "[jobs.slurm.limit]", "resource"};
}

void SlurmExecutor::prepare(const store::Instance&, Record&) {}

std::vector<stdfs::path> SlurmExecutor::folders(const store::Instance&) const { return {}; }

std::vector<std::string> SlurmExecutor::batch_command(const store::Instance& inst, const std::string& job_id,
                                               const std::vector<std::string>& argv) const {
  std::vector<std::string> cmd = config_.jobs.slurm.ns_hpc_command;
  if (cmd.empty()) cmd = config::self_command(config_, "for batch jobs");
  cmd.push_back("bwrap");
  // A batch job always runs in a fresh sandbox on its node, never in a living instance's.
  cmd.push_back("--fresh");
  // The job's output files are opened by ns-hpc on the node beneath the workspace (never by a
  // path Slurm follows); Slurm's own --output/--error get only its own messages.
  cmd.insert(cmd.end(), {"--stdout", output_relative(job_id, "out"), "--stderr", output_relative(job_id, "err")});
  cmd.push_back(inst.id);
  cmd.push_back("--");
  cmd.insert(cmd.end(), argv.begin(), argv.end());
  return cmd;
}

Record SlurmExecutor::start(const store::Instance& inst, Record rec, std::string_view actor) {
  store::Store& instances = jobs_.instances();
  try {
    std::vector<std::string> sbatch =
        slurm_.sbatch_argv(rec.limits, "ns-hpc-" + rec.id, (JobStore::dir(inst) / (rec.id + ".slurm.out")).string(),
                           (JobStore::dir(inst) / (rec.id + ".slurm.err")).string(), inst.base.string());
    // Only what the batch script needs reaches the job's environment (never the server's secrets).
    std::string exports = "--export=PATH,HOME,LANG";
    if (std::getenv("XDG_CONFIG_HOME")) exports += ",XDG_CONFIG_HOME";
    sbatch.insert(sbatch.begin() + 1, exports);
    const std::string script = fmt::format("#!/bin/sh\n# ns-hpc job {} in instance {}\nexec {}\n", rec.id, inst.id,
                                           text::shell_join(batch_command(inst, rec.id, rec.argv)));
    create_output(instances, inst, config_, output_relative(rec.id, "out"));  // there (and readable) while the job waits
    create_output(instances, inst, config_, output_relative(rec.id, "err"));
    rec.slurm_job_id = slurm_.submit(sbatch, script);
  } catch (...) {
    // Nothing half-submitted: no record, no output files.
    std::error_code ec;
    stdfs::remove(JobStore::state_file(inst, rec.id), ec);
    stdfs::remove(rec.stdout_path, ec);
    stdfs::remove(rec.stderr_path, ec);
    throw;
  }
  jobs_.save(inst, rec);
  instances.audit(inst, "job.submitted", actor,
                  {{"job_id", rec.id}, {"mode", Mode::slurm}, {"slurm_job_id", rec.slurm_job_id}, {"command", rec.command},
                   {"resources", rec.limits}, {"stdout_path", sandbox_path(inst, config_, rec.stdout_path)},
                   {"stderr_path", sandbox_path(inst, config_, rec.stderr_path)}});
  track(inst, rec);
  return rec;
}

std::shared_ptr<SlurmExecutor::Job> SlurmExecutor::find(const std::string& instance_id, const std::string& job_id) {
  std::lock_guard lock(mutex_);
  auto it = jobs_tracked_.find(instance_id + "/" + job_id);
  return it == jobs_tracked_.end() ? nullptr : it->second;
}

std::optional<Record> SlurmExecutor::tracked(const std::string& instance_id, const std::string& job_id) {
  auto job = find(instance_id, job_id);
  if (!job) return std::nullopt;
  std::lock_guard guard(job->mu);
  return job->record;
}

void SlurmExecutor::adopt(const store::Instance& inst, const Record& record) { track(inst, record); }

bool SlurmExecutor::holds_instance(const Record&) { return true; }  // queued or running on the cluster

void SlurmExecutor::tails(const store::Instance& inst, const Record& rec, const TailOptions& tail, View& v) {
  const store::Store& instances = jobs_.instances();
  v.stdout_tail = output_tail(instances, inst, config_, rec.stdout_path, -1, tail);
  v.stderr_tail = output_tail(instances, inst, config_, rec.stderr_path, -1, tail);
  // What Slurm itself said (a batch script that could not start, a cancel): server-private.
  const stdfs::path said = JobStore::dir(inst) / (rec.id + ".slurm.err");
  UniqueFd fd(::open(said.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (std::string slurm = tail_from(fd.get(), tail); !slurm.empty())
    v.stderr_tail += (v.stderr_tail.empty() ? "" : "\n") + slurm;
}

void SlurmExecutor::track(const store::Instance& inst, const Record& record) {
  const std::string key = inst.id + "/" + record.id;
  if (record.slurm_job_id.empty()) {
    // On record but never handed to Slurm: still being submitted, or its submitter died first.
    if (jobs_.submitting(inst.id, record.id) || submitter_alive(record)) return;
    try {
      fs::FileLock lock(JobStore::dir(inst) / ".lock");
      auto on_disk = jobs_.load(inst, record.id);
      if (on_disk && !is_final(on_disk->state) && on_disk->slurm_job_id.empty()) {
        on_disk->state = State::lost;
        on_disk->reason = "the job was never handed to Slurm: the process submitting it stopped first";
        on_disk->finished_at = timeutil::iso_utc();
        jobs_.save(inst, *on_disk);
        jobs_.instances().audit(inst, "job.lost", "ns-hpc:jobs", {{"job_id", record.id}, {"reason", on_disk->reason}});
      }
    } catch (const std::exception& e) {
      log::error("job {}: {}", record.id, e.what());
    }
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || jobs_tracked_.count(key)) return;
    auto job = std::make_shared<Job>();
    job->inst = inst;
    job->record = record;
    jobs_tracked_[key] = std::move(job);
    if (!thread_.joinable()) thread_ = std::thread([this] { poll_loop(); });
  }
  jobs_.hold(inst.id, record.id);
}

void SlurmExecutor::poll_loop() {
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(config_.jobs.slurm.poll_interval));
  auto next = Clock::now();
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_until(lock, next, [&] { return stopping_ || poll_now_; });
    if (stopping_) return;
    if (Clock::now() < next && !poll_now_) continue;
    poll_now_ = false;
    lock.unlock();
    try {
      poll();
    } catch (const std::exception& e) {
      log::error("slurm: polling failed: {}", e.what());
    }
    lock.lock();
    next = Clock::now() + interval;
  }
}

void SlurmExecutor::poll() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard lock(mutex_);
    for (auto& [key, job] : jobs_tracked_) jobs.push_back(job);
  }
  if (jobs.empty()) return;
  std::vector<std::string> ids;
  for (auto& job : jobs) {
    std::lock_guard guard(job->mu);
    ids.push_back(job->record.slurm_job_id);
  }
  std::map<std::string, SlurmStatus> statuses;
  try {
    statuses = slurm_.query(ids);
  } catch (const SchedulerError& e) {
    // Said as what it is; the jobs keep their last known state.
    for (auto& job : jobs) {
      std::lock_guard guard(job->mu);
      if (job->record.scheduler_error == e.what()) continue;
      job->record.scheduler_error = e.what();
      try {
        jobs_.save(job->inst, job->record);
      } catch (const std::exception&) {
      }
    }
    log::warn("slurm: asking the scheduler about {} job(s) failed: {}", jobs.size(), e.what());
    jobs_.notify_changed();
    return;
  }
  for (auto& job : jobs) {
    auto it = statuses.find(job->record.slurm_job_id);
    apply(*job, it == statuses.end() ? nullptr : &it->second);
  }
  jobs_.notify_changed();
}

void SlurmExecutor::apply(Job& job, const SlurmStatus* st) {
  bool done = false;
  {
    std::lock_guard guard(job.mu);
    Record& rec = job.record;
    // What a poll can change (compared field by field: this runs for every job on every poll).
    const auto before = std::make_tuple(rec.state, rec.scheduler_state, rec.scheduler_reason, rec.scheduler_error,
                                        rec.started_at);
    const auto unchanged = [&] {
      return std::make_tuple(rec.state, rec.scheduler_state, rec.scheduler_reason, rec.scheduler_error,
                             rec.started_at) == before;
    };
    rec.scheduler_error.clear();
    if (!st) {
      // Not (yet, or no longer) known: the controller may not list it yet right after sbatch.
      if (Clock::now() - job.tracked_since < std::chrono::minutes(5)) {
        if (!unchanged()) jobs_.save(job.inst, rec);
        return;
      }
      rec.state = State::lost;
      rec.reason = fmt::format("Slurm has no record of job {} any more ({}); it ended while nobody watched and the "
                               "cluster keeps no accounting for it",
                               rec.slurm_job_id, config::to_string(slurm_.source()));
      rec.finished_at = timeutil::iso_utc();
    } else {
      rec.scheduler_state = st->scheduler_state;
      rec.scheduler_reason = st->reason;
      const State mapped = st->state;
      if (mapped == State::running && rec.started_at.empty()) rec.started_at = timeutil::iso_utc();
      rec.state = mapped;
      if (is_final(mapped)) {
        rec.exit_code = st->exit_code;
        rec.signal = st->signal;
        if (rec.finished_at.empty()) rec.finished_at = timeutil::iso_utc();
        const int sig = st->signal.value_or(0);
        switch (mapped) {
          case State::completed: rec.reason.clear(); break;
          case State::failed:
            rec.reason = sig ? fmt::format("killed by signal {} ({})", sig, st->scheduler_state)
                             : fmt::format("exit code {}", st->exit_code.value_or(-1));
            break;
          case State::cancelled:
            rec.reason = rec.cancel_requested ? "cancelled" : "cancelled in Slurm (scancel or an administrator)";
            break;
          case State::timed_out: rec.reason = "the Slurm time limit was reached"; break;
          case State::out_of_memory: rec.reason = "out of memory: Slurm killed the job at its memory limit"; break;
          case State::node_fail: rec.reason = "the node running the job failed"; break;
          case State::preempted: rec.reason = "preempted by the scheduler"; break;
          default: break;
        }
      }
    }
    if (unchanged()) return;
    if (!is_final(rec.state)) {
      jobs_.save(job.inst, rec);
      return;
    }
    // Exactly one final record and audit line, even when another process watched the job too.
    try {
      jobs_.save_final(job.inst, rec,
                       {{"job_id", rec.id},
                        {"slurm_job_id", rec.slurm_job_id},
                        {"scheduler_state", rec.scheduler_state},
                        {"exit_code", rec.exit_code ? nlohmann::json(*rec.exit_code) : nlohmann::json(nullptr)},
                        {"signal", rec.signal ? nlohmann::json(*rec.signal) : nlohmann::json(nullptr)},
                        {"reason", rec.reason}});
    } catch (const std::exception& e) {
      log::error("job {}: could not record its end: {}", rec.id, e.what());
    }
    done = true;
  }
  if (done) {
    {
      std::lock_guard lock(mutex_);
      jobs_tracked_.erase(job.inst.id + "/" + job.record.id);
    }
    jobs_.release(job.inst.id, job.record.id);
  }
}

void SlurmExecutor::cancel(const store::Instance& inst, const std::string& job_id, std::string_view actor) {
  auto job = find(inst.id, job_id);
  if (!job) {
    auto rec = jobs_.load(inst, job_id);
    if (!rec || is_final(rec->state)) return;
    track(inst, *rec);
    job = find(inst.id, job_id);
    if (!job) throw Error(fmt::format("job '{}' has no Slurm id yet (it is still being submitted); try again", job_id));
  }
  std::string slurm_id;
  {
    std::lock_guard guard(job->mu);
    job->record.cancel_requested = true;
    jobs_.save(inst, job->record);
    slurm_id = job->record.slurm_job_id;
  }
  slurm_.cancel(slurm_id);  // a failure is reported as what it is
  jobs_.instances().audit(inst, "job.cancel_requested", actor, {{"job_id", job_id}, {"slurm_job_id", slurm_id}});
  // Slurm signals the job (KillWait later SIGKILL); wait until it says the job is over.
  const auto deadline = Clock::now() + std::chrono::seconds(config_.jobs.cancel_grace + 30);
  while (Clock::now() < deadline && find(inst.id, job_id)) {
    {
      std::lock_guard lock(mutex_);
      poll_now_ = true;
    }
    wake_.notify_all();
    jobs_.wait_changed(Clock::now() + std::chrono::milliseconds(500),
                       [&] { return !jobs_.held_locked(inst.id, job_id); });
  }
}

}  // namespace nshpc::jobs
