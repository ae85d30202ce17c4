// Local jobs: starting them in sandboxes of the backend, watching them on one thread, finishing
// their records (exactly once, through the job store), cancelling, and re-attaching to jobs an
// earlier server left running (through the status file of their sandbox).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/pidfd.hpp"
#include "base/time.hpp"
#include "jobs/executor.hpp"
#include "sandbox/cgroups.hpp"
#include "sandbox/limits.hpp"
#include "sandbox/members.hpp"
#include "sandbox/status.hpp"

namespace nshpc::jobs {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The handle of a local job: its sandbox's status file, and the pid of what was started (bwrap
// or the job keeper; for the record only).
constexpr const char* kStatusPath = "status_path";
constexpr const char* kPid = "pid";

std::string status_path(const Record& rec) {
  auto it = rec.handle.find(kStatusPath);
  return it != rec.handle.end() && it->is_string() ? it->get<std::string>() : std::string();
}

sandbox::StatusStream read_status(const std::string& path) {
  sandbox::StatusStream status;
  if (auto text = fs::read_file(path)) status.feed(*text);
  return status;
}

// The sandbox init of a job, when it is still alive: its pid from the status file, checked
// against the pid-namespace inode bwrap recorded (a reused pid has another namespace).
UniqueFd open_sandbox_init(const sandbox::StatusStream& status) {
  if (!status.child_pid() || !status.pid_namespace()) return {};
  struct stat st;
  const std::string ns = fmt::format("/proc/{}/ns/pid", *status.child_pid());
  UniqueFd pidfd = open_pidfd(*status.child_pid());
  if (!pidfd || ::stat(ns.c_str(), &st) < 0 || st.st_ino != *status.pid_namespace()) return {};
  // An exited init waiting to be reaped still has its namespace: it is not running.
  auto stat_line = fs::read_file(fmt::format("/proc/{}/stat", *status.child_pid()));
  if (!stat_line) return {};
  auto paren = stat_line->rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat_line->size() || (*stat_line)[paren + 2] == 'Z') {
    ::waitpid(*status.child_pid(), nullptr, WNOHANG);  // ours to reap when we are its subreaper
    return {};
  }
  return pidfd;
}

// The job keeper of `status` while it is still starting or running the sandbox (it has not
// reported the end): a pidfd, when the process of that pid holds the status file `path` open —
// the keeper's pid alone is only a claim, and pids are reused.
UniqueFd open_running_keeper(const sandbox::StatusStream& status, const std::string& path) {
  const auto pid = status.keeper_pid();
  struct stat file;
  if (!pid || *pid <= 0 || status.ended() || ::stat(path.c_str(), &file) < 0) return {};
  UniqueFd pidfd = open_pidfd(*pid);
  if (!pidfd) return {};
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(fmt::format("/proc/{}/fd", *pid), ec)) {
    struct stat open_file;
    if (::stat(entry.path().c_str(), &open_file) == 0 && open_file.st_dev == file.st_dev &&
        open_file.st_ino == file.st_ino)
      return pidfd;
  }
  return {};
}

// When a job's sandbox ended: the job keeper's report, else (an earlier release, or a keeper
// killed itself) when bwrap last wrote the status file, its exit code; nullopt when neither.
std::optional<timeutil::Clock::time_point> ended_at(const sandbox::StatusStream& status, const std::string& path) {
  if (auto ended = status.ended()) return *ended;
  struct stat st;
  if (!status.exit_code() || ::stat(path.c_str(), &st) < 0) return std::nullopt;
  return timeutil::Clock::time_point(std::chrono::duration_cast<timeutil::Clock::duration>(
      std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
}

}  // namespace

struct LocalExecutor::Running {
  store::Instance inst;
  Record record;
  std::unique_ptr<sandbox::Process> process;  // our child; empty when re-attached
  std::unique_ptr<sandbox::Cgroup> cgroup;
  UniqueFd watch;                             // pidfd: bwrap (child) or the sandbox init (re-attached)
  std::optional<std::uint64_t> pid_namespace;
  std::optional<Clock::time_point> deadline;  // wall-time limit
  std::optional<Clock::time_point> hard_kill_at;
  bool deadline_hit = false;
  bool never_started = false;  // its submitter died before the sandbox existed
  UniqueFd stdout_fd, stderr_fd;  // the output files as created (tails are read from these)
  bool finishing = false;  // handed to a finisher (guarded by the executor's mutex)
  std::mutex mu;          // guards the job's state: its record and what signals it
  bool finished = false;
};

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
  for (auto& [key, job] : running_) {
    if (job->process) job->process->disown();  // keeps running; init (pid 1) reaps it later
    if (job->cgroup) job->cgroup->keep();      // its limits stay in force
  }
}

void LocalExecutor::wake() {
  std::uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_.get(), &one, sizeof one);
  (void)ignored;
}

LimitTable LocalExecutor::limits() const {
  return {&config_.jobs.local.limit, "[jobs.local.limit]", "limit"};
}

void LocalExecutor::prepare(const store::Instance& inst, Record& rec) {
  // The sandbox's status file (bwrap's JSON status and the job keeper's documents) is all the
  // handle this backend's executions need to be found again after a restart.
  rec.backend = std::string(backend_.name());
  rec.handle = {{kStatusPath, (inst.base / "status" / (rec.id + ".status")).string()}};
}

std::vector<stdfs::path> LocalExecutor::folders(const store::Instance& inst) const { return {inst.base / "status"}; }

Record LocalExecutor::start(const store::Instance& inst, Record record, std::string_view actor) {
  auto job = std::make_shared<Running>();
  job->inst = inst;
  job->record = std::move(record);
  Record& rec = job->record;
  const auto& limits = rec.limits;

  // Limits: cgroups for cpus/memory/pids, rlimit for output; time is watched outside the sandbox.
  // The groups' paths go on record first: if this process dies while creating them, the next look
  // removes them.
  sandbox::AppliedLimits applied =
      sandbox::apply_limits(limits, inst.id + "/" + rec.id, config_.jobs.local.use_cgroups, [&](const auto& paths) {
        rec.cgroups.clear();
        for (const auto& p : paths) rec.cgroups.push_back(p.string());
        if (!rec.cgroups.empty()) jobs_.save(inst, rec);
      });
  job->cgroup = std::move(applied.cgroup);
  rec.unenforced = applied.unenforced;
  rec.cgroups.clear();
  if (job->cgroup) for (const auto& p : job->cgroup->paths()) rec.cgroups.push_back(p.string());
  jobs_.save(inst, rec);  // exactly the groups in use: whoever finishes the job after a crash removes them

  store::Store& instances = jobs_.instances();
  sandbox::RunSpec spec;
  spec.target = instances.sandbox_target(inst);
  spec.argv = rec.argv;
  spec.die_with_caller = false;
  spec.command_prefix = config_.jobs.local.cgroups_command;
  job->stdout_fd = create_output(instances, inst, config_, output_relative(rec.id, "out"));
  job->stderr_fd = create_output(instances, inst, config_, output_relative(rec.id, "err"));
  const int out = job->stdout_fd.get(), err = job->stderr_fd.get();
  UniqueFd status(::open(status_path(rec).c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!status) throw SysError(errno, "create", status_path(rec));
  spec.stdio = {-1, out, err};
  spec.status_file = status.get();
  spec.limits.file_size_bytes = applied.rlimits.file_size_bytes;
  // The wall-time limit belongs to the job's keeper: enforced even while no server runs.
  if (auto it = limits.find("time"); it != limits.end() && it->second > 0)
    spec.limits.wall_time = std::chrono::seconds(it->second);
  spec.limits.wall_time_grace = std::chrono::seconds(config_.jobs.cancel_grace);
  if (job->cgroup) spec.join_cgroups = job->cgroup->procs_fds();

  try {
    job->process = backend_.start(spec);
  } catch (const std::exception& e) {
    rec.state = State::failed;
    rec.reason = fmt::format("the sandbox could not start: {}", e.what());
    rec.finished_at = timeutil::iso_utc();
    jobs_.save(inst, rec);
    instances.audit(inst, "job.failed", actor, {{"job_id", rec.id}, {"command", rec.command}, {"reason", rec.reason}});
    return rec;
  }
  rec.state = State::running;
  rec.started_at = timeutil::iso_utc();
  rec.handle[kPid] = job->process->pid();
  jobs_.save(inst, rec);
  instances.audit(inst, "job.running", actor,
                  {{"job_id", rec.id}, {"command", rec.command}, {"mode", Mode::local}, {"limits", rec.limits},
                   {"unenforced", rec.unenforced}, {"stdout_path", sandbox_path(inst, config_, rec.stdout_path)},
                   {"stderr_path", sandbox_path(inst, config_, rec.stderr_path)}});
  job->watch = UniqueFd(::fcntl(job->process->pidfd(), F_DUPFD_CLOEXEC, 3));
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
      fds.push_back({job->watch.get(), POLLIN, 0});
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
      if (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
        finish_in_background(job);
        continue;
      }
      // Re-attached, the watch is the sandbox init, which (started by an earlier release, with
      // no keeper) outlives the main command while background processes run: the job is over
      // as soon as the status file has the exit code.
      if (!job->process && read_status(status_path(job->record)).exit_code()) {
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
        terminate_members(*job);
        job->hard_kill_at = now + std::chrono::seconds(config_.jobs.cancel_grace);
      } else if (job->hard_kill_at && now >= *job->hard_kill_at) {
        job->hard_kill_at.reset();
        if (job->cgroup) job->cgroup->kill(1000);
        if (job->process) job->process->kill();
        signal_pidfd(job->watch.get(), SIGKILL);
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

void LocalExecutor::terminate_members(Running& job) {
  // The processes of the sandbox's pid namespace, and only those: the job's cgroup also holds
  // bwrap's monitor and the job keeper, and SIGTERM to the monitor would end the sandbox at once
  // (--die-with-parent) instead of letting the command stop gracefully.
  std::optional<std::uint64_t> ns = job.pid_namespace;
  if (!ns) ns = read_status(status_path(job.record)).pid_namespace();
  if (ns)
    sandbox::signal_members(*ns, SIGTERM);
  else if (job.cgroup)
    job.cgroup->signal_all(SIGTERM);  // no sandbox yet: nothing of the command runs
}

void LocalExecutor::finish(const std::shared_ptr<Running>& job) {
  std::lock_guard guard(job->mu);
  if (job->finished) return;
  Record& rec = job->record;
  std::optional<int> code;
  std::string error;
  if (job->process) {
    sandbox::ExitStatus st = job->process->wait();  // reaps bwrap; reads the status file
    if (st.started) code = st.exit_code;
    else error = st.error;
  } else if (!job->never_started) {
    // Re-attached: the sandbox init ended, or the status file has the exit code. A keeper
    // reports the end right after (once it has reaped everything), bwrap alone its exit code.
    // Nothing of the sandbox outlives the job (an earlier release's init waits for background
    // processes): SIGKILL to the init takes its pid namespace.
    try {
      signal_pidfd(job->watch.get(), SIGKILL);
    } catch (const std::exception& e) {
      log::warn("job {}: {}", rec.id, e.what());
    }
    for (int i = 0; i < 200; ++i) {
      const sandbox::StatusStream status = read_status(status_path(rec));
      code = status.exit_code();
      if (status.keeper() ? status.ended().has_value() : code.has_value()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  rec.exit_code = code;
  // The real end: the keeper's report (or the status file's last write), not when we looked.
  const sandbox::StatusStream status = read_status(status_path(rec));
  auto finished = ended_at(status, status_path(rec)).value_or(timeutil::Clock::now());
  if (auto started = timeutil::parse_iso(rec.started_at); started && finished < *started) finished = *started;
  rec.finished_at = timeutil::iso_utc(finished);
  const bool timed_out = job->deadline_hit || status.deadline_reached().has_value();
  const auto& limits = rec.limits;
  if (job->cgroup && job->cgroup->oom_killed()) {
    rec.state = State::failed;
    rec.reason = fmt::format("out of memory: killed at its memory limit of {} MiB", limits.count("memory") ? limits.at("memory") : 0);
  } else if (rec.cancel_requested) {
    rec.state = State::cancelled;
    rec.reason = "cancelled";
  } else if (timed_out) {
    rec.state = State::timed_out;
    rec.reason = fmt::format("time limit of {} s reached; the job was killed", limits.count("time") ? limits.at("time") : 0);
  } else if (code && *code == 0) {
    rec.state = State::completed;
    rec.reason.clear();
  } else if (code) {
    rec.state = State::failed;
    rec.reason = *code == 128 + SIGXFSZ
                     ? fmt::format("output limit: a file reached the {} MiB limit", limits.count("output") ? limits.at("output") : 0)
                     : fmt::format("exit code {}", *code);
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
  if (job->cgroup) {
    try {
      job->cgroup->kill(2000);  // leftovers, if the sandbox init left any
      job->cgroup->remove();
    } catch (const std::exception& e) {
      log::warn("job {}: {}", rec.id, e.what());
    }
  }
  if (!job->process) {
    // Re-attached: the sandbox init came to us (subreaper) or to pid 1; reap it if ours.
    if (job->watch)
      reap_if_child(job->watch.get());
    else if (auto init = status.child_pid())
      ::waitpid(*init, nullptr, WNOHANG);
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
  const store::Store& instances = jobs_.instances();
  if (auto job = find(inst.id, rec.id)) {
    std::lock_guard guard(job->mu);
    v.stdout_tail = output_tail(instances, inst, config_, rec.stdout_path, job->stdout_fd.get(), tail);
    v.stderr_tail = output_tail(instances, inst, config_, rec.stderr_path, job->stderr_fd.get(), tail);
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
  while_running([&] { terminate_members(*job); });
  auto ended = [&] { return !jobs_.held_locked(inst.id, job_id); };
  jobs_.wait_changed(Clock::now() + std::chrono::seconds(config_.jobs.cancel_grace), ended);
  if (jobs_.held(inst.id, job_id)) {
    // SIGKILL to the sandbox init takes its pid namespace; the keeper then reaps it and exits.
    while_running([&] {
      if (job->process) job->process->kill();
      else signal_pidfd(job->watch.get(), SIGKILL);  // re-attached: the watch is the init
    });
    jobs_.wait_changed(Clock::now() + std::chrono::seconds(2), ended);
  }
  if (jobs_.held(inst.id, job_id)) {
    while_running([&] {
      if (job->cgroup) job->cgroup->kill(2000);
      signal_pidfd(job->watch.get(), SIGKILL);
    });
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
  const sandbox::StatusStream status = read_status(status_path(*rec));
  auto job = std::make_shared<Running>();
  job->inst = inst;
  job->record = *rec;
  job->pid_namespace = status.pid_namespace();
  job->watch = open_sandbox_init(status);
  if (!job->watch && !status.exit_code()) {
    // No sandbox and no exit code: still starting in the process that submitted it, or that
    // process died before the sandbox started (then it never will).
    if (submitter_alive(*rec) && rec->owner_pid != ::getpid()) return;
    // The submitter died after starting the job keeper: the keeper still starts the sandbox (or
    // runs it), and reports its end; watch the keeper.
    job->watch = open_running_keeper(status, status_path(*rec));
    if (!job->watch && rec->state == State::pending && !status.child_pid()) job->never_started = true;
  }
  if (!rec->cgroups.empty()) {
    std::vector<stdfs::path> paths(rec->cgroups.begin(), rec->cgroups.end());
    try {
      job->cgroup = sandbox::Cgroup::attach(paths);
    } catch (const std::exception&) {
      // Already removed by whoever finished it: nothing left to limit or kill there.
    }
  }
  if (!job->watch || status.exit_code()) {
    finish(job);  // ended while nobody watched: record what the status file says
    return;
  }
  // A keeper enforces the time limit itself; the server does for an earlier release's sandbox.
  if (auto it = rec->limits.find("time"); !status.keeper() && it != rec->limits.end() && it->second > 0) {
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
  return rec.state == State::pending || open_sandbox_init(read_status(status_path(rec)));
}

}  // namespace nshpc::jobs
