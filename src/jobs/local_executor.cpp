// Local jobs: starting them as executions of the sandbox (sandbox/execution.hpp), watching them
// on one thread, finishing their records (exactly once, through the job store), cancelling, and
// re-attaching to jobs an earlier server left running (from the handle on record). What an
// execution is made of (status files, pid namespaces, keepers, cgroups) is the sandbox's.
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string.h>
#include <tuple>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/time.hpp"
#include "jobs/executor.hpp"
#include "sandbox/execution.hpp"

namespace nshpc::jobs {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct LocalExecutor::Running {
  store::Instance inst;
  Record record;
  std::unique_ptr<sandbox::Execution> execution;  // started here, or re-attached from the handle
  std::optional<Clock::time_point> deadline;  // wall-time limit of a sandbox without a keeper
  std::optional<Clock::time_point> hard_kill_at;
  bool deadline_hit = false;
  bool never_started = false;  // its submitter died before the sandbox existed
  bool finishing = false;  // handed to a finisher (guarded by the executor's mutex)
  std::mutex mu;          // guards the job's state: its record and what signals it
  bool finished = false;
};

namespace {

// NS_HPC_JOB_ID and one NS_HPC_LIMIT_<NAME> per limit, its unit in the name where it has one;
// OMP_NUM_THREADS = cpus (what nproc and OpenMP take as the cores to use) unless the job set it.
std::vector<std::pair<std::string, std::string>> limit_variables(const Record& rec) {
  static constexpr std::pair<const char*, const char*> kNames[] = {
      {"cpus", "NS_HPC_LIMIT_CPUS"},        {"memory", "NS_HPC_LIMIT_MEMORY_MIB"}, {"pids", "NS_HPC_LIMIT_PIDS"},
      {"time", "NS_HPC_LIMIT_TIME_S"},      {"output", "NS_HPC_LIMIT_OUTPUT_MIB"}};
  std::vector<std::pair<std::string, std::string>> vars{{"NS_HPC_JOB_ID", rec.id}};
  for (const auto& [limit, variable] : kNames)
    if (auto it = rec.limits.find(limit); it != rec.limits.end()) vars.emplace_back(variable, std::to_string(it->second));
  auto cpus = rec.limits.find("cpus");
  const bool set_by_job = std::any_of(rec.env.begin(), rec.env.end(), [](const auto& v) { return v.first == "OMP_NUM_THREADS"; });
  if (cpus != rec.limits.end() && !set_by_job) vars.emplace_back("OMP_NUM_THREADS", std::to_string(cpus->second));
  return vars;
}

// A sealed memory file holding `text`, positioned at its start.
UniqueFd stdin_memfd(const std::string& text) {
  UniqueFd fd(::memfd_create("ns-hpc-job-stdin", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw SysError(errno, "memfd_create", "the job's stdin");
  std::string_view rest = text;
  while (!rest.empty()) {
    const ssize_t n = ::write(fd.get(), rest.data(), rest.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "write", "the job's stdin");
    }
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
  ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  if (::lseek(fd.get(), 0, SEEK_SET) < 0) throw SysError(errno, "lseek", "the job's stdin");
  return fd;
}

}  // namespace

// While it exists, this thread runs on `cpus` of the cores it may use (chosen from the job id,
// so jobs spread over the cores), when cpus is fewer than those cores and cgroups enforce the
// quota; restored afterwards. Processes forked meanwhile keep it.
ScopedAffinity::ScopedAffinity(const std::map<std::string, std::int64_t>& limits, const std::string& job_id,
                               bool use_cgroups) {
  auto cpus = limits.find("cpus");
  if (!use_cgroups || cpus == limits.end() || cpus->second <= 0) return;
  cpu_set_t current;
  CPU_ZERO(&current);
  if (::sched_getaffinity(0, sizeof current, &current) < 0) return;
  std::vector<int> usable;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &current)) usable.push_back(c);
  const auto want = static_cast<std::size_t>(cpus->second);
  if (want >= usable.size()) return;
  const std::size_t first = std::hash<std::string>{}(job_id) % usable.size();
  cpu_set_t chosen;
  CPU_ZERO(&chosen);
  for (std::size_t i = 0; i < want; ++i) CPU_SET(usable[(first + i) % usable.size()], &chosen);
  if (::sched_setaffinity(0, sizeof chosen, &chosen) < 0) {
    log::debug("job {}: CPU affinity not set: {}", job_id, std::strerror(errno));
    return;
  }
  saved_ = current;
}

ScopedAffinity::~ScopedAffinity() {
  if (saved_) ::sched_setaffinity(0, sizeof *saved_, &*saved_);
}

// The name of a job output file that reached the output limit ("stdout", "stderr"), or "".
std::string LocalExecutor::output_limit_reached(const std::shared_ptr<Running>& job, std::int64_t limit_mib) {
  if (limit_mib <= 0) return {};
  const auto limit = static_cast<off_t>(limit_mib) * 1024 * 1024;
  const Record& rec = job->record;
  const store::Store& instances = jobs_.instances();
  for (const auto& [fd_number, name, path] : {std::tuple{1, "stdout", &rec.stdout_path}, std::tuple{2, "stderr", &rec.stderr_path}}) {
    int fd = job->execution ? job->execution->output_fd(fd_number) : -1;
    UniqueFd opened;
    if (fd < 0) {
      const std::string ws = job->inst.workspace.string() + "/";
      if (path->rfind(ws, 0) != 0) continue;
      try {
        opened = instances.open_workspace_file(job->inst, path->substr(ws.size()), store::Store::WorkspaceOpen::read);
      } catch (const std::exception&) {
        continue;  // not readable: its size says nothing
      }
      fd = opened.get();
    }
    struct stat st;
    if (fd >= 0 && ::fstat(fd, &st) == 0 && st.st_size >= limit) return name;
  }
  return {};
}

LocalExecutor::LocalExecutor(const config::Config& config, JobStore& jobs, sandbox::Backend& backend)
    : config_(config), jobs_(jobs), backend_(backend) {
  wake_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) throw SysError(errno, "eventfd");
  watcher_ = std::thread([this] { watch_loop(); });
}

LocalExecutor::~LocalExecutor() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake();
  if (watcher_.joinable()) watcher_.join();
  join_finishers(true);
  // Running jobs keep running; their children are released (never killed).
  std::lock_guard lock(mutex_);
  for (auto& [key, job] : running_)
    if (job->execution) job->execution->release();  // keeps running, its limits in force
}

void LocalExecutor::wake() {
  std::uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof one);
  (void)ignored;
}

LimitTable LocalExecutor::limits() const {
  return {&config_.jobs.local.limit, "[jobs.local.limit]", "limit"};
}

void LocalExecutor::prepare(const store::Instance&, Record& rec) {
  // The handle is the execution's: on record from before anything it names exists (start()).
  // Until then it says which backend will run the job, and nothing else.
  rec.handle = sandbox::ExecutionHandle{std::string(backend_.name()), sandbox::ExecutionHandle::kVersion,
                                        nlohmann::json::object()};
}

std::vector<stdfs::path> LocalExecutor::folders(const store::Instance& inst) const { return {inst.base / "status"}; }

Record LocalExecutor::start(const store::Instance& inst, Record record, std::string_view actor) {
  auto job = std::make_shared<Running>();
  job->inst = inst;
  job->record = std::move(record);
  Record& rec = job->record;

  store::Store& instances = jobs_.instances();
  sandbox::ExecSpec spec;
  spec.target = instances.sandbox_target(inst);
  spec.argv = rec.argv;
  spec.cwd = rec.cwd;
  // What the job asked for, then its limits as variables it can read (NS_HPC_LIMIT_*).
  spec.env = rec.env;
  for (auto& variable : limit_variables(rec)) spec.env.push_back(std::move(variable));
  // stdin: the request's text from a sealed memory file (never a path the sandbox can reach).
  UniqueFd input;
  if (!rec.stdin_text.empty()) {
    input = stdin_memfd(rec.stdin_text);
    spec.stdio.in = input.get();
  }
  // cpus as CPU affinity where that is honest (jobs/affinity: a quota of N cores on a host with
  // more): inherited from this thread by the sandbox it forks.
  ScopedAffinity affinity(rec.limits, rec.id, config_.jobs.local.use_cgroups);
  spec.stdout_file = output_relative(rec.id, "out");
  spec.stderr_file = output_relative(rec.id, "err");
  // Limits: cgroups for cpus/memory/pids, rlimit for output; the wall-time limit belongs to the
  // job's keeper, enforced even while no server runs.
  spec.limits = rec.limits;
  spec.time_grace = std::chrono::seconds(config_.jobs.cancel_grace);
  spec.use_cgroups = config_.jobs.local.use_cgroups;
  spec.cgroup_name = spec.target.cgroup_folder + "/" + rec.id;
  spec.outlives_caller = true;
  spec.status_path = (inst.base / "status" / (rec.id + ".status")).string();
  spec.command_prefix = config_.jobs.local.cgroups_command;
  // On record before anything it names exists: whoever finishes the job after a crash removes it.
  spec.on_handle = [&](const sandbox::ExecutionHandle& handle) {
    rec.handle = handle;
    jobs_.save(inst, rec);
  };

  try {
    job->execution = sandbox::execute(backend_, std::move(spec));
  } catch (const sandbox::OutputFileError& e) {
    if (auto refusal = output_refusal(config_, e.relative(), e.code())) throw *refusal;
    throw;
  } catch (const std::exception& e) {
    rec.state = State::failed;
    rec.reason = fmt::format("the sandbox could not start: {}", e.what());
    rec.finished_at = timeutil::iso_utc();
    jobs_.save(inst, rec);
    instances.audit(inst, "job.failed", actor, {{"job_id", rec.id}, {"command", rec.command}, {"reason", rec.reason}});
    return rec;
  }
  rec.unenforced = job->execution->unenforced();
  rec.state = State::running;
  rec.started_at = timeutil::iso_utc();
  rec.handle = job->execution->handle();
  jobs_.save(inst, rec);
  instances.audit(inst, "job.running", actor,
                  {{"job_id", rec.id}, {"command", rec.command}, {"mode", Mode::local}, {"limits", rec.limits},
                   {"unenforced", rec.unenforced}, {"stdout_path", sandbox_path(inst, config_, rec.stdout_path)},
                   {"stderr_path", sandbox_path(inst, config_, rec.stderr_path)}});
  Record copy = rec;
  start_watching(std::move(job));
  return copy;
}

void LocalExecutor::start_watching(std::shared_ptr<Running> job) {
  const std::string instance_id = job->record.instance_id, job_id = job->record.id;
  jobs_.hold(instance_id, job_id);
  {
    std::lock_guard lock(mutex_);
    running_[instance_id + "/" + job_id] = std::move(job);
  }
  wake();
}

void LocalExecutor::watch_loop() {
  for (;;) {
    std::vector<std::shared_ptr<Running>> jobs;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      for (auto& [key, job] : running_)
        if (!job->finishing) jobs.push_back(job);
    }
    join_finishers(false);
    std::vector<pollfd> fds{{wake_fd_.get(), POLLIN, 0}};
    auto next = Clock::now() + std::chrono::seconds(1);
    for (const auto& job : jobs) {
      fds.push_back({job->execution->wait_fd(), POLLIN, 0});
      if (job->hard_kill_at) next = std::min(next, *job->hard_kill_at);
      else if (job->deadline) next = std::min(next, *job->deadline);
    }
    const auto wait_ms = std::max<long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count());
    if (::poll(fds.data(), fds.size(), static_cast<int>(wait_ms) + 1) < 0 && errno != EINTR) {
      log::error("job watcher: poll failed: {}", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::uint64_t drained;
    while (::read(wake_fd_.get(), &drained, sizeof drained) > 0) {
    }
    const auto now = Clock::now();
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      auto& job = jobs[i];
      if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) || job->execution->ended()) {
        finish_in_background(job);
        continue;
      }
      // The server's own time limit, only for sandboxes without a keeper (an earlier release's):
      // a keeper enforces the limit itself, even while no server runs.
      if (!job->deadline && !job->hard_kill_at) continue;
      std::lock_guard guard(job->mu);
      if (job->finished) continue;
      if (job->deadline && !job->deadline_hit && now >= *job->deadline) {
        job->deadline_hit = true;
        job->execution->signal(SIGTERM);
        job->hard_kill_at = now + std::chrono::seconds(config_.jobs.cancel_grace);
      } else if (job->hard_kill_at && now >= *job->hard_kill_at) {
        job->hard_kill_at.reset();
        job->execution->kill_tree(/*everything=*/true);
      }
    }
  }
}

void LocalExecutor::finish_in_background(const std::shared_ptr<Running>& job) {
  {
    std::lock_guard lock(mutex_);
    if (job->finishing) return;
    job->finishing = true;
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread thread([this, job, done] {
    try {
      finish(job);
    } catch (const std::exception& e) {
      log::error("job {}: finishing it failed: {}", job->record.id, e.what());
    }
    *done = true;
    wake();  // the watcher joins this thread
  });
  std::lock_guard lock(mutex_);
  finishers_.push_back({std::move(thread), std::move(done)});
}

void LocalExecutor::join_finishers(bool all) {
  std::vector<Finisher> ending;
  {
    std::lock_guard lock(mutex_);
    for (auto it = finishers_.begin(); it != finishers_.end();) {
      if (all || *it->done) {
        ending.push_back(std::move(*it));
        it = finishers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& f : ending) f.thread.join();
}

void LocalExecutor::finish(const std::shared_ptr<Running>& job) {
  std::lock_guard guard(job->mu);
  if (job->finished) return;
  Record& rec = job->record;
  // Reaps what is ours, removes the job's groups; for one another process started, what its
  // record says (and nothing of its sandbox outlives it).
  const sandbox::ExitStatus st = job->execution->wait();
  std::optional<int> code;
  std::string error;
  if (st.started) code = st.exit_code;
  else error = st.error;
  rec.exit_code = code;
  // The real end: the keeper's report (or the status file's last write), not when we looked.
  auto finished = st.ended_at.value_or(timeutil::Clock::now());
  if (auto started = timeutil::parse_iso(rec.started_at); started && finished < *started) finished = *started;
  rec.finished_at = timeutil::iso_utc(finished);
  const bool timed_out = job->deadline_hit || st.timed_out;
  const auto& limits = rec.limits;
  auto limit = [&limits](const char* name) { return limits.count(name) ? limits.at(name) : 0; };
  // The signal that ended it: the exit code of a signalled command (or of a shell whose command
  // was), 128+N.
  if (code && *code > 128 && *code <= 128 + 64) rec.signal = *code - 128;
  const std::string by_signal =
      rec.signal ? fmt::format(" (signal {}, SIG{})", *rec.signal, ::sigabbrev_np(*rec.signal) ? ::sigabbrev_np(*rec.signal) : "?")
                 : std::string();
  const std::string full_output = output_limit_reached(job, limit("output"));
  if (st.oom_killed) {
    rec.state = State::out_of_memory;
    rec.reason = fmt::format("out of memory: killed at its memory limit of {} MiB", limit("memory"));
  } else if (rec.cancel_requested) {
    rec.state = State::cancelled;
    rec.reason = "cancelled" + by_signal;
  } else if (timed_out) {
    rec.state = State::timed_out;
    rec.reason = fmt::format("time limit of {} s reached; the job was killed{}", limit("time"), by_signal);
  } else if ((code && *code == 128 + SIGXFSZ) || !full_output.empty()) {
    rec.state = State::output_limit;
    rec.reason = fmt::format("output limit: {} reached the {} MiB limit; what came after was lost",
                             full_output.empty() ? std::string("a file") : full_output, limit("output"));
  } else if (code && *code == 0) {
    rec.state = State::completed;
    rec.reason.clear();
  } else if (code) {
    rec.state = State::failed;
    rec.reason = rec.signal ? fmt::format("killed by signal {} (SIG{})", *rec.signal,
                                          ::sigabbrev_np(*rec.signal) ? ::sigabbrev_np(*rec.signal) : "?")
                            : fmt::format("exit code {}", *code);
  } else if (job->execution->seen() == sandbox::Seen::unreadable) {
    // Nothing here can watch, signal or cancel it: its end is not ours to know.
    rec.state = State::lost;
    rec.reason = fmt::format("{}: how the job ended is unknown here", error);
  } else if (!error.empty()) {
    rec.state = State::failed;
    rec.reason = error;
  } else if (job->never_started) {
    rec.state = State::lost;
    rec.reason = "the job never started: the process submitting it stopped first";
  } else {
    rec.state = State::lost;
    rec.reason = "the job's processes ended without an exit code (killed from outside?)";
  }
  // Exactly one final record and audit line, even when another process watched the job too.
  try {
    jobs_.save_final(job->inst, rec,
                     {{"job_id", rec.id},
                      {"exit_code", rec.exit_code ? nlohmann::json(*rec.exit_code) : nlohmann::json(nullptr)},
                      {"reason", rec.reason},
                      {"duration_s", std::round(seconds_between(rec.started_at.empty() ? rec.created_at : rec.started_at,
                                                                rec.finished_at) * 100) / 100}});
  } catch (const std::exception& e) {
    log::error("job {}: could not record its end: {}", rec.id, e.what());
  }
  job->finished = true;
  {
    std::lock_guard lock(mutex_);
    running_.erase(rec.instance_id + "/" + rec.id);
  }
  jobs_.release(rec.instance_id, rec.id);
}

std::shared_ptr<LocalExecutor::Running> LocalExecutor::find(const std::string& instance_id, const std::string& job_id) {
  std::lock_guard lock(mutex_);
  auto it = running_.find(instance_id + "/" + job_id);
  return it == running_.end() ? nullptr : it->second;
}

std::optional<Record> LocalExecutor::tracked(const std::string& instance_id, const std::string& job_id) {
  auto job = find(instance_id, job_id);
  if (!job) return std::nullopt;
  std::lock_guard guard(job->mu);
  return job->record;
}

void LocalExecutor::tails(const store::Instance& inst, const Record& rec, const TailOptions& tail, View& v) {
  // A job lost before it was running has no output of its own: its files may be the empty ones
  // the server made and never handed to the sandbox's uid (it was killed in between), which the
  // tail would refuse to read.
  if (rec.state == State::lost && rec.started_at.empty()) return;
  const store::Store& instances = jobs_.instances();
  if (auto job = find(inst.id, rec.id)) {
    std::lock_guard guard(job->mu);
    v.stdout_tail = output_tail(instances, inst, config_, rec.stdout_path, job->execution->output_fd(1), tail);
    v.stderr_tail = output_tail(instances, inst, config_, rec.stderr_path, job->execution->output_fd(2), tail);
  } else {
    v.stdout_tail = output_tail(instances, inst, config_, rec.stdout_path, -1, tail);
    v.stderr_tail = output_tail(instances, inst, config_, rec.stderr_path, -1, tail);
  }
}

void LocalExecutor::cancel(const store::Instance& inst, const std::string& job_id, std::string_view actor) {
  auto job = find(inst.id, job_id);
  if (!job) return;
  // Every step that touches the job takes its lock and does nothing once it is finished: its
  // finish (which holds the lock throughout) may have reaped the process and removed its groups.
  auto while_running = [&](const std::function<void()>& step) {
    std::lock_guard guard(job->mu);
    if (!job->finished) step();
    return !job->finished;
  };
  const bool running = while_running([&] {
    job->record.cancel_requested = true;
    jobs_.save(inst, job->record);
  });
  if (!running) return;
  jobs_.instances().audit(inst, "job.cancel_requested", actor, {{"job_id", job_id}});
  while_running([&] { job->execution->signal(SIGTERM); });
  auto ended = [&] { return !jobs_.held_locked(inst.id, job_id); };
  jobs_.wait_changed(Clock::now() + std::chrono::seconds(config_.jobs.cancel_grace), ended);
  if (jobs_.held(inst.id, job_id)) {
    // SIGKILL to the sandbox init takes its pid namespace; the keeper then reaps it and exits.
    while_running([&] { job->execution->kill_tree(); });
    jobs_.wait_changed(Clock::now() + std::chrono::seconds(2), ended);
  }
  if (jobs_.held(inst.id, job_id)) {
    while_running([&] { job->execution->kill_tree(/*everything=*/true); });
    jobs_.wait_changed(Clock::now() + std::chrono::seconds(10), ended);
  }
}

void LocalExecutor::adopt(const store::Instance& inst, const Record& record) {
  const Record* rec = &record;
  // One caller adopts a job; another that looks at the same time finds it watched, or being
  // adopted, and leaves it alone.
  const std::string key = inst.id + "/" + rec->id;
  {
    std::lock_guard lock(mutex_);
    if (running_.count(key) || !adopting_.insert(key).second) return;
  }
  struct Claim {
    LocalExecutor& executor;
    const std::string& key;
    ~Claim() {
      std::lock_guard lock(executor.mutex_);
      executor.adopting_.erase(key);
    }
  } claim{*this, key};
  if (jobs_.hooks.adopting) jobs_.hooks.adopting(rec->id);
  auto job = std::make_shared<Running>();
  job->inst = inst;
  job->record = *rec;
  // Through the backend that made it (a handle of another is Seen::unreadable, never read as
  // this backend's).
  job->execution = backend_.attach(rec->handle);
  const sandbox::Seen seen = job->execution->seen();
  if (seen != sandbox::Seen::running && seen != sandbox::Seen::exited) {
    // No sandbox and no exit code: still starting (or watched) in the process that submitted
    // it, or that process died (then its keeper, if any, starts or runs it and reports the end;
    // without one it never will).
    if (submitter_alive(*rec) && rec->owner_pid != ::getpid()) return;
    if (seen == sandbox::Seen::never_started && rec->state == State::pending) job->never_started = true;
  }
  if (seen != sandbox::Seen::running && seen != sandbox::Seen::keeper) {
    finish(job);  // ended while nobody watched: record what is on record
    return;
  }
  // A keeper enforces the time limit itself; the server does for an earlier release's sandbox.
  if (auto it = rec->limits.find("time");
      !job->execution->enforces_time_limit() && it != rec->limits.end() && it->second > 0) {
    auto started = timeutil::parse_iso(rec->started_at.empty() ? rec->created_at : rec->started_at);
    if (started) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*started + std::chrono::seconds(it->second) -
                                                                        timeutil::Clock::now());
      job->deadline = Clock::now() + std::max(left, std::chrono::milliseconds(0));
    }
  }
  start_watching(std::move(job));
}

bool LocalExecutor::holds_instance(const Record& rec) {
  // A job whose sandbox is gone does not hold the instance (its record is finished on the next
  // look).
  return rec.state == State::pending || backend_.attach(rec.handle)->seen() == sandbox::Seen::running;
}

}  // namespace nshpc::jobs
