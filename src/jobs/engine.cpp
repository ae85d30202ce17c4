// The local job engine: starting jobs in sandboxes, watching them on one thread, finishing
// their records exactly once, cancelling, and re-attaching after a restart.
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
#include <filesystem>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/pidfd.hpp"
#include "base/process.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "jobs/jobs.hpp"
#include "sandbox/bwrap_argv.hpp"
#include "sandbox/cgroups.hpp"
#include "sandbox/members.hpp"
#include "sandbox/limits.hpp"
#include "sandbox/spawn.hpp"
#include "sandbox/status.hpp"

namespace nshpc::jobs {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kKnownLimits[] = {"cpus", "memory", "pids", "time", "output"};

stdfs::path jobs_dir(const store::Instance& inst) { return inst.base / ".ns_hpc_jobs"; }
stdfs::path state_file(const store::Instance& inst, const std::string& id) {
  return jobs_dir(inst) / (id + ".state");
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

// The last `opt.lines` lines (at most `opt.bytes`) of the file open at `fd`.
std::string tail_from(int fd, const TailOptions& opt) {
  if (opt.lines == 0 || opt.bytes == 0 || fd < 0) return {};
  struct stat st;
  if (::fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return {};
  const off_t window = std::min<off_t>(st.st_size, static_cast<off_t>(std::max<std::size_t>(opt.bytes * 4, 65536)));
  std::string data(static_cast<size_t>(window), '\0');
  ssize_t n = ::pread(fd, data.data(), data.size(), st.st_size - window);
  if (n <= 0) return {};
  data.resize(static_cast<size_t>(n));
  if (!data.empty() && data.back() == '\n') data.pop_back();  // the last line's terminator
  // Walk back over `lines` line breaks: what follows the last one counted is the tail.
  size_t start = data.size();
  std::size_t seen = 0;
  while (start > 0) {
    size_t nl = data.rfind('\n', start - 1);
    if (nl == std::string::npos) {
      start = 0;
      break;
    }
    if (++seen == opt.lines) {
      start = nl + 1;
      break;
    }
    start = nl;
  }
  std::string tail = data.substr(start);
  if (tail.size() > opt.bytes) tail = "…" + tail.substr(tail.size() - opt.bytes);
  return text::sanitize_utf8(tail);
}

// This process's start time (field 22 of /proc/<pid>/stat), to recognise it again; 0 if gone.
std::uint64_t start_time_of(pid_t pid) {
  auto line = fs::read_file(fmt::format("/proc/{}/stat", pid));
  if (!line) return 0;
  auto paren = line->rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(line->substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

std::string sandbox_path(const store::Instance& inst, const config::Config& cfg, const std::string& host) {
  const std::string ws = inst.workspace.string();
  if (host.rfind(ws + "/", 0) == 0) return cfg.ns.workspace_mount + host.substr(ws.size());
  return host;
}

double seconds_between(const std::string& from, const std::string& to) {
  auto a = timeutil::parse_iso(from);
  auto b = to.empty() ? std::optional(timeutil::Clock::now()) : timeutil::parse_iso(to);
  if (!a || !b) return 0;
  return std::chrono::duration<double>(*b - *a).count();
}

constexpr std::string_view kOutputDir = ".ns_hpc_output";

// A job's output file, relative to its instance's workspace (every job writes there).
std::string output_relative(const std::string& job_id, std::string_view ext) {
  return fmt::format("{}/{}.{}", kOutputDir, job_id, ext);
}

// Everything under the workspace is written by the sandbox: the file is created beneath the
// workspace descriptor without following links (a planted .ns_hpc_output symlink is refused).
UniqueFd create_output(const store::Store& store, const store::Instance& inst, const config::Config& cfg,
                       const std::string& relative) {
  try {
    return store.open_workspace_file(inst, relative, store::Store::WorkspaceOpen::create);
  } catch (const SysError& e) {
    if (e.code() == ELOOP || e.code() == ENOTDIR || e.code() == EXDEV)
      throw UsageError(fmt::format("cannot create the job's output file {}/{}: {}/{} is not a plain folder (a "
                                   "symbolic link or a file was put there); remove it and submit again",
                                   cfg.ns.workspace_mount, relative, cfg.ns.workspace_mount, kOutputDir));
    throw;
  }
}

// The tail of a job's output file: from the descriptor the server created (while it has it),
// else re-opened beneath the workspace as an untrusted file (never a link, a FIFO, a device, a
// hard link or someone else's file). A file that may not be read says why instead.
std::string output_tail(const store::Store& store, const store::Instance& inst, const config::Config& cfg,
                        const std::string& host_path, int kept_fd, const TailOptions& opt) {
  if (opt.lines == 0 || opt.bytes == 0) return {};
  if (kept_fd >= 0) return tail_from(kept_fd, opt);
  const std::string ws = inst.workspace.string() + "/";
  if (host_path.rfind(ws, 0) != 0) return {};
  const std::string relative = host_path.substr(ws.size());
  fs::Refusal refusal;
  UniqueFd fd;
  try {
    fd = store.open_workspace_file(inst, relative, store::Store::WorkspaceOpen::read, &refusal);
  } catch (const SysError& e) {
    refusal = {e.code(), e.what()};
  }
  if (!fd) {
    if (refusal.code == ENOENT) return {};  // nothing written yet
    return fmt::format("[ns-hpc: {}/{} was not read: {}]", cfg.ns.workspace_mount, relative, refusal.why);
  }
  return tail_from(fd.get(), opt);
}

}  // namespace

struct Engine::Running {
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
  std::mutex mu;
  bool finished = false;
};

struct Engine::SlurmJob {
  store::Instance inst;
  Record record;  // guarded by mu
  Clock::time_point tracked_since = Clock::now();
  std::mutex mu;
};

Engine::Engine(const config::Config& config, store::Store& store, sandbox::Backend& backend)
    : config_(config), store_(store), backend_(backend), slurm_(config.jobs.slurm) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw SysError(errno, "eventfd");
  watcher_ = std::thread([this] { watch_loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake();
  slurm_wake_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  if (slurm_thread_.joinable()) slurm_thread_.join();
  // Running jobs keep running; their children are released (never killed).
  std::lock_guard lock(mutex_);
  for (auto& [key, job] : running_) {
    if (job->process) job->process->disown();  // keeps running; init (pid 1) reaps it later
    if (job->cgroup) job->cgroup->keep();      // its limits stay in force
  }
  ::close(wake_fd_);
}

Engine::Submitting::Submitting(Engine& engine, const std::string& instance_id, const std::string& job_id)
    : engine_(engine), key_(instance_id + "/" + job_id) {
  std::lock_guard lock(engine_.mutex_);
  // Jobs that hold a place: watched (local), tracked (Slurm), or still being started here.
  const std::string prefix = instance_id + "/";
  std::size_t all = 0, here = 0;
  auto count = [&](const std::string& key) {
    ++all;
    here += key.starts_with(prefix);
  };
  for (const auto& [key, job] : engine_.running_) count(key);
  for (const auto& [key, job] : engine_.slurm_jobs_) count(key);
  for (const auto& key : engine_.submitting_)
    if (!engine_.running_.count(key) && !engine_.slurm_jobs_.count(key)) count(key);
  if (static_cast<std::int64_t>(all) >= engine_.config_.jobs.max_running)
    throw UsageError(fmt::format("{} jobs are running or queued, the most this server allows ([jobs] max_running); "
                                 "wait for some to finish or cancel some",
                                 all));
  if (static_cast<std::int64_t>(here) >= engine_.config_.jobs.max_running_per_instance)
    throw UsageError(fmt::format("{} jobs are running or queued in instance '{}', the most allowed "
                                 "([jobs] max_running_per_instance); wait or cancel some",
                                 here, instance_id));
  engine_.submitting_.insert(key_);
}

Engine::Submitting::~Submitting() {
  std::lock_guard lock(engine_.mutex_);
  engine_.submitting_.erase(key_);
}

void Engine::wake() {
  std::uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof one);
  (void)ignored;
}

std::size_t Engine::tracked() const {
  std::lock_guard lock(mutex_);
  return running_.size() + slurm_jobs_.size();
}

std::map<std::string, std::int64_t> Engine::resolve_limits(const LimitRequest& request,
                                                           const std::map<std::string, config::Limit>& table,
                                                           std::string_view table_name) const {
  std::map<std::string, std::int64_t> out;
  for (const auto& [name, value] : request.values) {
    auto it = table.find(name);
    if (it == table.end()) {
      std::string known;
      for (const auto& [n, l] : table) known += (known.empty() ? "" : ", ") + n;
      throw UsageError(fmt::format("unknown {} '{}'; the {}s are: {}", table_name == "[jobs.slurm.limit]" ? "resource" : "limit",
                                   name, table_name == "[jobs.slurm.limit]" ? "resource" : "limit", known));
    }
    if (value < 0) throw UsageError(fmt::format("limit {} = {} must not be negative", name, value));
    if (value < it->second.min)
      throw UsageError(fmt::format("{} = {} is below its minimum of {} ({} {}); a limit cannot be switched off, "
                                   "ask for up to its maximum of {} instead",
                                   name, value, it->second.min, table_name, name, it->second.max));
    if (value > it->second.max)
      throw UsageError(fmt::format("{} = {} is over its maximum of {} ({} {})", name, value, it->second.max,
                                   table_name, name));
  }
  for (const auto& [name, limit] : table) {
    auto asked = request.values.find(name);
    out[name] = asked != request.values.end() ? asked->second : limit.default_value;
  }
  return out;
}

Record Engine::submit(const SubmitRequest& request, std::string_view actor) {
  if (request.argv.empty() || (request.argv.size() == 3 && request.argv[0] == "/bin/sh" &&
                               request.argv[2].find_first_not_of(" \t\r\n") == std::string::npos))
    throw UsageError("the command is empty; give the shell command to run");
  sandbox::check_command(request.argv);
  if (request.mode == Mode::slurm) return submit_slurm(request, actor);
  store::Instance inst = store_.get(request.instance_id);
  const auto limits = resolve_limits(request.limits, config_.jobs.local.limit, "[jobs.local.limit]");

  auto job = std::make_shared<Running>();
  job->inst = inst;
  Record& rec = job->record;
  rec.id = new_job_id();
  Submitting submitting(*this, inst.id, rec.id);
  rec.instance_id = inst.id;
  rec.argv = request.argv;
  rec.command = request.display.empty() ? text::shell_join(request.argv) : request.display;
  rec.created_at = timeutil::iso_utc();
  rec.limits = limits;
  fs::make_dirs(jobs_dir(inst), 0700);
  fs::make_dirs(inst.base / "status", 0700);
  rec.stdout_path = (inst.workspace / output_relative(rec.id, "out")).string();
  rec.stderr_path = (inst.workspace / output_relative(rec.id, "err")).string();
  rec.status_path = (inst.base / "status" / (rec.id + ".status")).string();
  rec.owner_pid = ::getpid();
  rec.owner_start = start_time_of(rec.owner_pid);
  save(inst, rec);  // pending: on record before anything runs

  // Limits: cgroups for cpus/memory/pids, rlimit for output; time is watched outside the sandbox.
  // The groups' paths go on record first: if this process dies while creating them, the next look
  // removes them.
  sandbox::AppliedLimits applied =
      sandbox::apply_limits(limits, inst.id + "/" + rec.id, config_.jobs.local.use_cgroups, [&](const auto& paths) {
        rec.cgroups.clear();
        for (const auto& p : paths) rec.cgroups.push_back(p.string());
        if (!rec.cgroups.empty()) save(inst, rec);
      });
  job->cgroup = std::move(applied.cgroup);
  rec.unenforced = applied.unenforced;
  rec.cgroups.clear();
  if (job->cgroup) for (const auto& p : job->cgroup->paths()) rec.cgroups.push_back(p.string());
  save(inst, rec);  // exactly the groups in use: whoever finishes the job after a crash removes them

  sandbox::RunSpec spec;
  spec.target = store_.sandbox_target(inst);
  spec.argv = request.argv;
  spec.die_with_caller = false;
  spec.command_prefix = config_.jobs.local.cgroups_command;
  job->stdout_fd = create_output(store_, inst, config_, output_relative(rec.id, "out"));
  job->stderr_fd = create_output(store_, inst, config_, output_relative(rec.id, "err"));
  const int out = job->stdout_fd.get(), err = job->stderr_fd.get();
  UniqueFd status(::open(rec.status_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!status) throw SysError(errno, "create", rec.status_path);
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
    save(inst, rec);
    store_.audit(inst, "job.failed", actor, {{"job_id", rec.id}, {"command", rec.command}, {"reason", rec.reason}});
    return rec;
  }
  rec.state = State::running;
  rec.started_at = timeutil::iso_utc();
  rec.bwrap_pid = job->process->pid();
  save(inst, rec);
  store_.audit(inst, "job.running", actor,
               {{"job_id", rec.id}, {"command", rec.command}, {"mode", Mode::local}, {"limits", rec.limits},
                {"unenforced", rec.unenforced}, {"stdout_path", sandbox_path(inst, config_, rec.stdout_path)},
                {"stderr_path", sandbox_path(inst, config_, rec.stderr_path)}});
  job->watch = UniqueFd(::fcntl(job->process->pidfd(), F_DUPFD_CLOEXEC, 3));
  Record copy = rec;
  start_watching(std::move(job));
  return copy;
}

void Engine::start_watching(std::shared_ptr<Running> job) {
  {
    std::lock_guard lock(mutex_);
    running_[job->record.instance_id + "/" + job->record.id] = std::move(job);
  }
  wake();
}

void Engine::watch_loop() {
  for (;;) {
    std::vector<std::shared_ptr<Running>> jobs;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      for (auto& [key, job] : running_) jobs.push_back(job);
    }
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
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
    while (::read(wake_fd_, &drained, sizeof drained) > 0) {
    }
    const auto now = Clock::now();
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      auto& job = jobs[i];
      if (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
        finish(job, true);
        continue;
      }
      // Re-attached, the watch is the sandbox init, which (started by an earlier release, with
      // no keeper) outlives the main command while background processes run: the job is over
      // as soon as the status file has the exit code.
      if (!job->process && read_status(job->record.status_path).exit_code()) {
        finish(job, false);
        continue;
      }
      // The server's own time limit, only for sandboxes without a keeper (an earlier release's):
      // a keeper enforces the limit itself, even while no server runs.
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

void Engine::terminate_members(Running& job) {
  // The processes of the sandbox's pid namespace, and only those: the job's cgroup also holds
  // bwrap's monitor and the job keeper, and SIGTERM to the monitor would end the sandbox at once
  // (--die-with-parent) instead of letting the command stop gracefully.
  std::optional<std::uint64_t> ns = job.pid_namespace;
  if (!ns) ns = read_status(job.record.status_path).pid_namespace();
  if (ns)
    sandbox::signal_members(*ns, SIGTERM);
  else if (job.cgroup)
    job.cgroup->signal_all(SIGTERM);  // no sandbox yet: nothing of the command runs
}

void Engine::finish(const std::shared_ptr<Running>& job, bool process_gone) {
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
      const sandbox::StatusStream status = read_status(rec.status_path);
      code = status.exit_code();
      if (status.keeper() ? status.ended().has_value() : code.has_value()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  (void)process_gone;
  rec.exit_code = code;
  // The real end: the keeper's report (or the status file's last write), not when we looked.
  const sandbox::StatusStream status = read_status(rec.status_path);
  auto finished = ended_at(status, rec.status_path).value_or(timeutil::Clock::now());
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
    fs::FileLock lock(jobs_dir(job->inst) / ".lock");
    auto on_disk = load(job->inst, rec.id);
    if (!on_disk || !is_final(on_disk->state)) {
      save(job->inst, rec);
      nlohmann::json fields = {{"job_id", rec.id},
                               {"exit_code", rec.exit_code ? nlohmann::json(*rec.exit_code) : nlohmann::json(nullptr)},
                               {"reason", rec.reason},
                               {"duration_s", std::round(seconds_between(rec.started_at.empty() ? rec.created_at : rec.started_at,
                                                                         rec.finished_at) * 100) / 100}};
      store_.audit(job->inst, fmt::format("job.{}", to_string(rec.state)), "ns-hpc:jobs", fields);
    } else {
      rec = *on_disk;
    }
  } catch (const std::exception& e) {
    log::error("job {}: could not record its end: {}", rec.id, e.what());
  }
  job->finished = true;
  {
    std::lock_guard lock(mutex_);
    running_.erase(rec.instance_id + "/" + rec.id);
  }
  changed_.notify_all();
}

std::optional<Record> Engine::load(const store::Instance& inst, const std::string& job_id) const {
  auto text = fs::read_file(state_file(inst, job_id));
  if (!text) return std::nullopt;
  return Record::from_json(nlohmann::json::parse(*text, nullptr, false));
}

void Engine::save(const store::Instance& inst, const Record& record) const {
  fs::atomic_write(state_file(inst, record.id), record.to_json().dump(2) + "\n", 0600);
}

std::shared_ptr<Engine::Running> Engine::find_running(const std::string& instance_id, const std::string& job_id) {
  std::lock_guard lock(mutex_);
  auto it = running_.find(instance_id + "/" + job_id);
  return it == running_.end() ? nullptr : it->second;
}

std::optional<Record> Engine::current_record(const store::Instance& inst, const std::string& job_id) {
  if (auto job = find_running(inst.id, job_id)) {
    std::lock_guard guard(job->mu);
    return job->record;
  }
  if (auto sj = find_slurm(inst.id, job_id)) {
    std::lock_guard guard(sj->mu);
    return sj->record;
  }
  std::optional<Record> rec = load(inst, job_id);
  if (!rec || is_final(rec->state)) return rec;
  if (rec->mode == Mode::slurm) {
    track_slurm(inst, *rec);  // submitted by another process: watch it here too
    return rec;
  }
  adopt(inst, job_id);  // left by another process (it may have ended meanwhile)
  if (auto job = find_running(inst.id, job_id)) {
    std::lock_guard guard(job->mu);
    return job->record;
  }
  if (auto again = load(inst, job_id)) return again;
  return rec;
}

View Engine::view(const std::string& instance_id, const std::string& job_id, const TailOptions& tail) {
  if (!valid_job_id(job_id))
    throw NotFound(NotFound::Kind::job, fmt::format("'{}' is not a job id (job ids are 12 hex characters)", job_id));
  store::Instance inst = store_.get(instance_id);
  const std::optional<Record> rec = current_record(inst, job_id);
  if (!rec) throw NotFound(NotFound::Kind::job, fmt::format("job '{}' not found in instance '{}'", job_id, instance_id));
  View v;
  v.record = *rec;
  if (auto job = find_running(instance_id, job_id)) {
    std::lock_guard guard(job->mu);
    v.stdout_tail = output_tail(store_, inst, config_, rec->stdout_path, job->stdout_fd.get(), tail);
    v.stderr_tail = output_tail(store_, inst, config_, rec->stderr_path, job->stderr_fd.get(), tail);
  } else {
    v.stdout_tail = output_tail(store_, inst, config_, rec->stdout_path, -1, tail);
    v.stderr_tail = output_tail(store_, inst, config_, rec->stderr_path, -1, tail);
  }
  if (rec->mode == Mode::slurm) {
    // What Slurm itself said (a batch script that could not start, a cancel): server-private.
    const stdfs::path said = jobs_dir(inst) / (rec->id + ".slurm.err");
    UniqueFd fd(::open(said.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (std::string slurm = tail_from(fd.get(), tail); !slurm.empty())
      v.stderr_tail += (v.stderr_tail.empty() ? "" : "\n") + slurm;
  }
  v.stdout_sandbox_path = sandbox_path(inst, config_, rec->stdout_path);
  v.stderr_sandbox_path = sandbox_path(inst, config_, rec->stderr_path);
  v.duration_s = std::round(seconds_between(rec->started_at.empty() ? rec->created_at : rec->started_at,
                                            rec->finished_at) * 100) / 100;
  return v;
}

View Engine::wait(const std::string& instance_id, const std::string& job_id, std::chrono::milliseconds timeout,
                  const TailOptions& tail, const std::function<bool()>& interrupted,
                  const std::function<void(double)>& tick) {
  View v = view(instance_id, job_id, tail);
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto last_tick = start;
  while (!is_final(v.record.state) && Clock::now() < deadline) {
    if (interrupted && interrupted()) break;
    {
      std::unique_lock lock(mutex_);
      changed_.wait_for(lock, std::chrono::milliseconds(100));
    }
    if (tick && Clock::now() - last_tick >= std::chrono::seconds(1)) {
      last_tick = Clock::now();
      tick(std::chrono::duration<double>(last_tick - start).count());
    }
    v = view(instance_id, job_id, tail);
  }
  return v;
}

std::vector<Record> Engine::list(const std::string& instance_id, std::optional<State> filter) {
  store::Instance inst = store_.get(instance_id);
  std::vector<Record> out;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(jobs_dir(inst), ec)) {
    if (entry.path().extension() != ".state") continue;
    std::optional<Record> rec = current_record(inst, entry.path().stem().string());
    if (!rec) continue;
    if (!filter || rec->state == *filter) out.push_back(std::move(*rec));
  }
  std::sort(out.begin(), out.end(), [](const Record& a, const Record& b) { return a.created_at > b.created_at; });
  return out;
}

Record Engine::cancel(const std::string& instance_id, const std::string& job_id, std::string_view actor) {
  View current = view(instance_id, job_id, {0, 0});
  if (is_final(current.record.state)) return current.record;
  if (current.record.mode == Mode::slurm) return cancel_slurm(store_.get(instance_id), job_id, actor);
  auto job = find_running(instance_id, job_id);
  if (!job) return view(instance_id, job_id, {0, 0}).record;
  store::Instance inst = store_.get(instance_id);
  {
    std::lock_guard guard(job->mu);
    job->record.cancel_requested = true;
    save(inst, job->record);
  }
  store_.audit(inst, "job.cancel_requested", actor, {{"job_id", job_id}});
  terminate_members(*job);
  const auto grace_end = Clock::now() + std::chrono::seconds(config_.jobs.cancel_grace);
  {
    std::unique_lock lock(mutex_);
    changed_.wait_until(lock, grace_end, [&] { return !running_.count(instance_id + "/" + job_id); });
  }
  if (find_running(instance_id, job_id)) {
    // SIGKILL to the sandbox init takes its pid namespace; the keeper then reaps it and exits.
    if (job->process) job->process->kill();
    else signal_pidfd(job->watch.get(), SIGKILL);  // re-attached: the watch is the init
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(2), [&] { return !running_.count(instance_id + "/" + job_id); });
  }
  if (find_running(instance_id, job_id)) {
    if (job->cgroup) job->cgroup->kill(2000);
    signal_pidfd(job->watch.get(), SIGKILL);
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(10), [&] { return !running_.count(instance_id + "/" + job_id); });
  }
  return view(instance_id, job_id, {0, 0}).record;
}

void Engine::recover() {
  const auto stale = stdfs::file_time_type::clock::now() - std::chrono::minutes(1);
  for (const auto& inst : store_.list().instances) {
    std::error_code ec;
    for (const auto& entry : stdfs::directory_iterator(jobs_dir(inst), ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.path().extension() == ".state") {
        adopt(inst, entry.path().stem().string());
      } else if (name.starts_with(".") && name.find(".tmp-") != std::string::npos &&
                 entry.last_write_time(ec) < stale) {
        stdfs::remove(entry.path(), ec);  // an atomic write cut short by a crash
      }
    }
  }
}

void Engine::adopt(const store::Instance& inst, const std::string& job_id) {
  if (find_running(inst.id, job_id)) return;
  {
    std::lock_guard lock(mutex_);
    if (submitting_.count(inst.id + "/" + job_id)) return;  // being started by this process
  }
  auto rec = load(inst, job_id);
  if (!rec || is_final(rec->state)) return;
  if (rec->mode == Mode::slurm) {
    track_slurm(inst, *rec);
    return;
  }
  const sandbox::StatusStream status = read_status(rec->status_path);
  auto job = std::make_shared<Running>();
  job->inst = inst;
  job->record = *rec;
  job->pid_namespace = status.pid_namespace();
  job->watch = open_sandbox_init(status);
  if (!job->watch && !status.exit_code()) {
    // No sandbox and no exit code: still starting in the process that submitted it, or that
    // process died before the sandbox started (then it never will).
    const bool submitter_alive =
        rec->owner_pid > 0 && rec->owner_start != 0 && start_time_of(rec->owner_pid) == rec->owner_start;
    if (submitter_alive && rec->owner_pid != ::getpid()) return;
    // The submitter died after starting the job keeper: the keeper still starts the sandbox (or
    // runs it), and reports its end; watch the keeper.
    job->watch = open_running_keeper(status, rec->status_path);
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
    finish(job, !job->watch);  // ended while nobody watched: record what the status file says
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

std::size_t Engine::active_jobs(const stdfs::path& instance_base) {
  std::size_t count = 0;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(instance_base / ".ns_hpc_jobs", ec)) {
    if (entry.path().extension() != ".state") continue;
    auto text = fs::read_file(entry.path());
    if (!text) continue;
    auto rec = Record::from_json(nlohmann::json::parse(*text, nullptr, false));
    if (!rec || is_final(rec->state)) continue;
    if (rec->mode == Mode::slurm) {
      ++count;  // queued or running on the cluster
      continue;
    }
    // A job whose sandbox is gone does not hold the instance (its record is finished on the
    // next look).
    if (rec->state == State::pending || open_sandbox_init(read_status(rec->status_path))) ++count;
  }
  return count;
}


// ---------------------------------------------------------------------------------------------
// Slurm jobs: sbatch runs `ns-hpc bwrap <instance> -- <command>` on a node; one status query
// per poll interval covers every tracked job.

std::vector<std::string> Engine::batch_command(const store::Instance& inst, const std::string& job_id,
                                               const std::vector<std::string>& argv) const {
  std::vector<std::string> cmd = config_.jobs.slurm.ns_hpc_command;
  if (cmd.empty()) {
    std::error_code ec;
    const stdfs::path self = stdfs::read_symlink("/proc/self/exe", ec);
    if (ec) throw SysError(ec.value(), "readlink", "/proc/self/exe (the path of ns-hpc for batch jobs)");
    cmd.push_back(self.string());
    if (config_.explicit_file) {
      cmd.push_back("--config");
      cmd.push_back(config_.explicit_file->string());
    }
  }
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

Record Engine::submit_slurm(const SubmitRequest& request, std::string_view actor) {
  store::Instance inst = store_.get(request.instance_id);
  // Everything that can be refused is refused before anything is written or submitted.
  const auto resources = resolve_limits(request.limits, config_.jobs.slurm.limit, "[jobs.slurm.limit]");
  Record rec;
  rec.id = new_job_id();
  Submitting submitting(*this, inst.id, rec.id);
  rec.instance_id = inst.id;
  rec.mode = Mode::slurm;
  rec.argv = request.argv;
  rec.command = request.display.empty() ? text::shell_join(request.argv) : request.display;
  rec.created_at = timeutil::iso_utc();
  rec.limits = resources;
  rec.stdout_path = (inst.workspace / output_relative(rec.id, "out")).string();
  rec.stderr_path = (inst.workspace / output_relative(rec.id, "err")).string();
  std::vector<std::string> sbatch =
      slurm_.sbatch_argv(resources, "ns-hpc-" + rec.id, (jobs_dir(inst) / (rec.id + ".slurm.out")).string(),
                         (jobs_dir(inst) / (rec.id + ".slurm.err")).string(), inst.base.string());
  // Only what the batch script needs reaches the job's environment (never the server's secrets).
  std::string exports = "--export=PATH,HOME,LANG";
  if (std::getenv("XDG_CONFIG_HOME")) exports += ",XDG_CONFIG_HOME";
  sbatch.insert(sbatch.begin() + 1, exports);
  const std::string script = fmt::format("#!/bin/sh\n# ns-hpc job {} in instance {}\nexec {}\n", rec.id, inst.id,
                                         text::shell_join(batch_command(inst, rec.id, request.argv)));

  fs::make_dirs(jobs_dir(inst), 0700);
  rec.owner_pid = ::getpid();
  rec.owner_start = start_time_of(rec.owner_pid);
  create_output(store_, inst, config_, output_relative(rec.id, "out"));  // there (and readable) while the job waits
  create_output(store_, inst, config_, output_relative(rec.id, "err"));
  save(inst, rec);
  try {
    rec.slurm_job_id = slurm_.submit(sbatch, script);
  } catch (...) {
    // Nothing half-submitted: no record, no output files.
    std::error_code ec;
    stdfs::remove(state_file(inst, rec.id), ec);
    stdfs::remove(rec.stdout_path, ec);
    stdfs::remove(rec.stderr_path, ec);
    throw;
  }
  save(inst, rec);
  store_.audit(inst, "job.submitted", actor,
               {{"job_id", rec.id}, {"mode", Mode::slurm}, {"slurm_job_id", rec.slurm_job_id}, {"command", rec.command},
                {"resources", rec.limits}, {"stdout_path", sandbox_path(inst, config_, rec.stdout_path)},
                {"stderr_path", sandbox_path(inst, config_, rec.stderr_path)}});
  track_slurm(inst, rec);
  return rec;
}

std::shared_ptr<Engine::SlurmJob> Engine::find_slurm(const std::string& instance_id, const std::string& job_id) {
  std::lock_guard lock(mutex_);
  auto it = slurm_jobs_.find(instance_id + "/" + job_id);
  return it == slurm_jobs_.end() ? nullptr : it->second;
}

void Engine::track_slurm(const store::Instance& inst, const Record& record) {
  const std::string key = inst.id + "/" + record.id;
  if (record.slurm_job_id.empty()) {
    // On record but never handed to Slurm: still being submitted, or its submitter died first.
    {
      std::lock_guard lock(mutex_);
      if (submitting_.count(key)) return;
    }
    const bool submitter_alive = record.owner_pid > 0 && record.owner_start != 0 &&
                                 start_time_of(record.owner_pid) == record.owner_start;
    if (submitter_alive) return;
    try {
      fs::FileLock lock(jobs_dir(inst) / ".lock");
      auto on_disk = load(inst, record.id);
      if (on_disk && !is_final(on_disk->state) && on_disk->slurm_job_id.empty()) {
        on_disk->state = State::lost;
        on_disk->reason = "the job was never handed to Slurm: the process submitting it stopped first";
        on_disk->finished_at = timeutil::iso_utc();
        save(inst, *on_disk);
        store_.audit(inst, "job.lost", "ns-hpc:jobs", {{"job_id", record.id}, {"reason", on_disk->reason}});
      }
    } catch (const std::exception& e) {
      log::error("job {}: {}", record.id, e.what());
    }
    return;
  }
  std::lock_guard lock(mutex_);
  if (stopping_ || slurm_jobs_.count(key)) return;
  auto job = std::make_shared<SlurmJob>();
  job->inst = inst;
  job->record = record;
  slurm_jobs_[key] = std::move(job);
  if (!slurm_thread_.joinable()) slurm_thread_ = std::thread([this] { slurm_loop(); });
}

void Engine::slurm_loop() {
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(config_.jobs.slurm.poll_interval));
  auto next = Clock::now();
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    slurm_wake_.wait_until(lock, next, [&] { return stopping_ || slurm_poll_now_; });
    if (stopping_) return;
    if (Clock::now() < next && !slurm_poll_now_) continue;
    slurm_poll_now_ = false;
    lock.unlock();
    try {
      poll_slurm();
    } catch (const std::exception& e) {
      log::error("slurm: polling failed: {}", e.what());
    }
    lock.lock();
    next = Clock::now() + interval;
  }
}

void Engine::poll_slurm() {
  std::vector<std::shared_ptr<SlurmJob>> jobs;
  {
    std::lock_guard lock(mutex_);
    for (auto& [key, job] : slurm_jobs_) jobs.push_back(job);
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
        save(job->inst, job->record);
      } catch (const std::exception&) {
      }
    }
    log::warn("slurm: asking the scheduler about {} job(s) failed: {}", jobs.size(), e.what());
    changed_.notify_all();
    return;
  }
  for (auto& job : jobs) {
    auto it = statuses.find(job->record.slurm_job_id);
    apply_slurm(*job, it == statuses.end() ? nullptr : &it->second);
  }
  changed_.notify_all();
}

void Engine::apply_slurm(SlurmJob& job, const SlurmStatus* st) {
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
        if (!unchanged()) save(job.inst, rec);
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
      save(job.inst, rec);
      return;
    }
    // Exactly one final record and audit line, even when another process watched the job too.
    try {
      fs::FileLock lock(jobs_dir(job.inst) / ".lock");
      auto on_disk = load(job.inst, rec.id);
      if (!on_disk || !is_final(on_disk->state)) {
        save(job.inst, rec);
        store_.audit(job.inst, fmt::format("job.{}", to_string(rec.state)), "ns-hpc:jobs",
                     {{"job_id", rec.id},
                      {"slurm_job_id", rec.slurm_job_id},
                      {"scheduler_state", rec.scheduler_state},
                      {"exit_code", rec.exit_code ? nlohmann::json(*rec.exit_code) : nlohmann::json(nullptr)},
                      {"signal", rec.signal ? nlohmann::json(*rec.signal) : nlohmann::json(nullptr)},
                      {"reason", rec.reason}});
      } else {
        rec = *on_disk;
      }
    } catch (const std::exception& e) {
      log::error("job {}: could not record its end: {}", rec.id, e.what());
    }
    done = true;
  }
  if (done) {
    std::lock_guard lock(mutex_);
    slurm_jobs_.erase(job.inst.id + "/" + job.record.id);
  }
}

Record Engine::cancel_slurm(const store::Instance& inst, const std::string& job_id, std::string_view actor) {
  auto job = find_slurm(inst.id, job_id);
  if (!job) {
    auto rec = load(inst, job_id);
    if (!rec || is_final(rec->state)) return view(inst.id, job_id, {0, 0}).record;
    track_slurm(inst, *rec);
    job = find_slurm(inst.id, job_id);
    if (!job) throw Error(fmt::format("job '{}' has no Slurm id yet (it is still being submitted); try again", job_id));
  }
  std::string slurm_id;
  {
    std::lock_guard guard(job->mu);
    job->record.cancel_requested = true;
    save(inst, job->record);
    slurm_id = job->record.slurm_job_id;
  }
  slurm_.cancel(slurm_id);  // a failure is reported as what it is
  store_.audit(inst, "job.cancel_requested", actor, {{"job_id", job_id}, {"slurm_job_id", slurm_id}});
  // Slurm signals the job (KillWait later SIGKILL); wait until it says the job is over.
  const auto deadline = Clock::now() + std::chrono::seconds(config_.jobs.cancel_grace + 30);
  while (Clock::now() < deadline && find_slurm(inst.id, job_id)) {
    {
      std::unique_lock lock(mutex_);
      slurm_poll_now_ = true;
      slurm_wake_.notify_all();
      changed_.wait_for(lock, std::chrono::milliseconds(500));
    }
  }
  return view(inst.id, job_id, {0, 0}).record;
}

}  // namespace nshpc::jobs
