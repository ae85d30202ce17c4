// Executions on a backend: limits, output files and the status file set up around
// Backend::start, and the identity checks that find an execution again from its handle.
#include "sandbox/execution.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/pidfd.hpp"
#include "base/proc.hpp"
#include "base/safe_path.hpp"
#include "base/steps.hpp"
#include "sandbox/cgroups.hpp"
#include "sandbox/limits.hpp"
#include "sandbox/members.hpp"
#include "sandbox/status.hpp"

namespace nshpc::sandbox {

namespace {

namespace stdfs = std::filesystem;
using SystemTime = std::chrono::system_clock::time_point;

// The handle's data: the sandbox's status file (bwrap's JSON status and the job keeper's
// documents), the cgroups it uses (on record before they exist), and the pid of what was started
// (bwrap or the keeper; for people reading the record only). The same in versions 0 and 1.
constexpr const char* kStatusPath = "status_path";
constexpr const char* kCgroups = "cgroups";
constexpr const char* kPid = "pid";

StatusStream read_status(const std::string& path) {
  StatusStream status;
  if (path.empty()) return status;
  if (auto text = fs::read_file(path)) status.feed(*text);
  return status;
}

// The sandbox init, when it is still alive: its pid from the status file, checked against the
// pid-namespace inode bwrap recorded (a reused pid has another namespace).
UniqueFd open_sandbox_init(const StatusStream& status) {
  if (!status.child_pid() || !status.pid_namespace()) return {};
  UniqueFd pidfd = open_member(*status.child_pid(), *status.pid_namespace());
  if (!pidfd) return {};
  // An exited init waiting to be reaped still has its namespace: it is not running.
  const std::optional<proc::Stat> stat = proc::read_stat(*status.child_pid());
  if (!stat) return {};
  if (stat->ended()) {
    ::waitpid(*status.child_pid(), nullptr, WNOHANG);  // ours to reap when we are its subreaper
    return {};
  }
  return pidfd;
}

// The job keeper of `status` while it is still starting or running the sandbox (it has not
// reported the end): a pidfd, when the process of that pid holds the status file `path` open —
// the keeper's pid alone is only a claim, and pids are reused.
UniqueFd open_running_keeper(const StatusStream& status, const std::string& path) {
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

// When the sandbox ended: the job keeper's report, else (an earlier release, or a keeper killed
// itself) when bwrap last wrote the status file, its exit code; nullopt when neither.
std::optional<SystemTime> ended_at(const StatusStream& status, const std::string& path) {
  if (auto ended = status.ended()) return *ended;
  struct stat st;
  if (path.empty() || !status.exit_code() || ::stat(path.c_str(), &st) < 0) return std::nullopt;
  return SystemTime(std::chrono::duration_cast<SystemTime::duration>(std::chrono::seconds(st.st_mtim.tv_sec) +
                                                                      std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
}

std::vector<std::string> strings_of(const nlohmann::json& handle, const char* key) {
  std::vector<std::string> out;
  auto it = handle.find(key);
  if (it == handle.end() || !it->is_array()) return out;
  for (const auto& v : *it)
    if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

class SandboxExecution final : public Execution {
 public:
  ~SandboxExecution() override {
    if (process_ && !waited_ && !released_) {
      try {
        process_->kill();
        wait();
      } catch (const std::exception& e) {
        log::warn("sandbox {}: ending an abandoned execution: {}", instance_id_, e.what());
      }
    }
    // Someone else's execution (attached, not finished here) or one let go keeps its limits.
    if (cgroup_ && !waited_ && (released_ || !process_)) cgroup_->keep();
  }

  int wait_fd() const override { return watch_.get(); }

  bool ended() const override {
    if (Execution::ended()) return true;
    // Attached, the watch is the sandbox init, which (started by an earlier release, with no
    // keeper) outlives the main command while background processes run: it is over as soon as
    // the status file has the exit code.
    return !process_ && read_status(status_path_).exit_code().has_value();
  }

  ExitStatus wait() override {
    if (waited_) return result_;
    if (process_) {
      result_ = process_->wait();  // reaps bwrap or the keeper; reads the status file
    } else if (seen_ != Seen::never_started) {
      finish_attached();
    }
    waited_ = true;
    const StatusStream status = read_status(status_path_);
    if (!result_.ended_at) result_.ended_at = ended_at(status, status_path_);
    result_.timed_out = result_.timed_out || status.deadline_reached().has_value();
    if (cgroup_) {
      result_.oom_killed = cgroup_->oom_killed();
      settle_cgroup();
    }
    if (!process_) {
      // Attached: the sandbox init came to us (subreaper) or to pid 1; reap it if ours.
      if (watch_ && watch_is_init_)
        reap_if_child(watch_.get());
      else if (watch_ && wait_pidfd(watch_.get(), std::chrono::milliseconds(0)))
        reap_if_child(watch_.get());
      else if (auto init = status.child_pid())
        ::waitpid(*init, nullptr, WNOHANG);
    }
    return result_;
  }

  void signal(int sig) override {
    if (waited_) return;  // reaped: its pids may be someone else's by now
    // The processes of the sandbox's pid namespace, and only those: its cgroup also holds
    // bwrap's monitor and the keeper.
    std::optional<std::uint64_t> ns = pid_ns_;
    if (!ns) ns = read_status(status_path_).pid_namespace();
    if (ns)
      signal_members(*ns, sig);
    else if (cgroup_)
      cgroup_->signal_all(sig);  // no sandbox yet: nothing of the command runs
  }

  void kill_tree(bool everything) override {
    if (waited_ || released_) return;
    killed_ = true;
    try {
      // The sandbox init first: its death takes the whole pid namespace (a keeper then reaps
      // everything and reports).
      if (process_)
        process_->kill();
      else
        signal_pidfd(watch_.get(), SIGKILL);
      if (everything) {
        if (cgroup_) cgroup_->kill(2000);
        signal_pidfd(watch_.get(), SIGKILL);
      }
    } catch (const std::exception& e) {
      log::warn("sandbox {}: killing an execution: {}", instance_id_, e.what());
    }
  }

  ExecutionHandle handle() const override { return handle_; }

  void release() override {
    if (waited_) return;
    released_ = true;
    if (process_) process_->disown();  // keeps running; init (pid 1) or a subreaper reaps it later
    if (cgroup_) cgroup_->keep();      // its limits stay in force
  }

  std::vector<std::string> unenforced() const override { return unenforced_; }
  int output_fd(int stream) const override { return stream == 1 ? out_.get() : stream == 2 ? err_.get() : -1; }
  bool enforces_time_limit() const override { return keeper_; }
  Seen seen() const override { return seen_; }
  int terminal() const override { return process_ ? process_->terminal() : -1; }

 private:
  friend std::unique_ptr<Execution> sandbox::execute(Backend& backend, ExecSpec spec);
  friend std::unique_ptr<Execution> sandbox::attach_by_status_file(const ExecutionHandle& handle);

  // An execution another process started: it ended (its watch is readable), or its exit code is
  // on record. Nothing of the sandbox outlives it (an earlier release's init waits for
  // background processes): SIGKILL to the init takes its pid namespace. A keeper reports the end
  // right after (once it has reaped everything), bwrap alone its exit code.
  void finish_attached() {
    if (watch_is_init_) {
      try {
        signal_pidfd(watch_.get(), SIGKILL);
      } catch (const std::exception& e) {
        log::warn("sandbox {}: {}", instance_id_, e.what());
      }
    }
    std::optional<int> code;
    for (int i = 0; i < 200; ++i) {
      const StatusStream status = read_status(status_path_);
      code = status.exit_code();
      if (status.keeper() ? status.ended().has_value() : code.has_value()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    result_.started = code.has_value();
    result_.exit_code = code.value_or(-1);
  }

  // A command that left processes running in a living instance keeps its group (still bounded
  // by its limits) until they end; it goes with a later command's sweep of empty groups or the
  // instance's stop. Otherwise the group goes now, with anything left in it.
  void settle_cgroup() {
    try {
      // For the instance's next command: in a living instance once what this one left running
      // has ended; otherwise its sandbox is gone, and with it everything of the command.
      if (pool_ && !killed_ && !cgroup_->paths().empty() && (persistent_ || cgroup_->empty())) {
        pool_->give(pool_key_, {std::move(cgroup_), unenforced_});
        return;
      }
    } catch (const std::exception& e) {
      log::debug("sandbox {}: {}", instance_id_, e.what());
    }
    try {
      if (!outlives_ && persistent_ && !cgroup_->empty()) {
        cgroup_->keep();
        // Only groups of the same kind ("term-*"): never an empty group of something else that
        // is being set up (a job's, before its sandbox joins it).
        if (!cgroup_prefix_.empty()) Cgroup::remove_empty(cgroup_folder_, cgroup_prefix_);
      } else {
        cgroup_->kill(2000);
        cgroup_->remove();
      }
    } catch (const std::exception& e) {
      log::warn("sandbox {}: {}", instance_id_, e.what());  // the destructor tries again
    }
  }

  std::string instance_id_;
  std::unique_ptr<Process> process_;  // ours; null when attached
  std::unique_ptr<Cgroup> cgroup_;
  std::string status_path_;
  std::optional<std::uint64_t> pid_ns_;
  UniqueFd watch_;            // pidfd: bwrap or the keeper (ours), the sandbox init or keeper (attached)
  bool watch_is_init_ = false;
  bool keeper_ = true;
  bool outlives_ = false;
  bool persistent_ = false;
  // "<instance>", "term-" (from a cgroup name "<instance>/term-<id>"): the sweep of kept groups.
  std::string cgroup_folder_, cgroup_prefix_;
  CgroupPool* pool_ = nullptr;  // where the group goes at the end (a command, not a job)
  bool killed_ = false;         // kill_tree() ran: its group is not used again (Cgroup::killed())
  std::string pool_key_;
  UniqueFd out_, err_;
  ExecutionHandle handle_;
  std::vector<std::string> unenforced_;
  Seen seen_ = Seen::running;
  bool waited_ = false;
  bool released_ = false;
  ExitStatus result_;
};

UniqueFd create_output_file(int workspace, const std::string& relative, const std::optional<users::Identity>& owner) {
  std::optional<std::pair<uid_t, gid_t>> ids;
  if (owner) ids = std::make_pair(owner->uid, owner->gid);
  try {
    return fs::create_beneath(workspace, relative, 0644, ids, "the workspace's " + relative);
  } catch (const SysError& e) {
    throw OutputFileError(relative, e);
  }
}

}  // namespace

bool Execution::ended() const {
  if (wait_fd() < 0) return true;
  pollfd p{wait_fd(), POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;  // a pidfd (or an eventfd) becomes readable at the end
}

// The order of an execution: its output files, its status file, its cgroups (on record first),
// then the sandbox.
std::unique_ptr<Execution> execute(Backend& backend, ExecSpec spec) {
  Steps step("execute", spec.target.instance_id);
  auto exec = std::make_unique<SandboxExecution>();
  exec->handle_.backend = std::string(backend.name());
  exec->instance_id_ = spec.target.instance_id;
  exec->outlives_ = spec.outlives_caller;
  exec->persistent_ = spec.target.persistent;
  const auto publish = [&] {
    if (spec.on_handle) spec.on_handle(exec->handle_);
  };

  if (!spec.stdout_file.empty() || !spec.stderr_file.empty()) {
    step("output files");
    UniqueFd workspace;
    try {
      workspace = fs::open_dir_path(spec.target.workspace);
    } catch (const SysError& e) {
      throw e.wrapped("cannot open the instance's workspace folder");
    }
    const auto owner = backend.runs_as(spec.target);
    if (!spec.stdout_file.empty()) exec->out_ = create_output_file(workspace.get(), spec.stdout_file, owner);
    if (!spec.stderr_file.empty()) exec->err_ = create_output_file(workspace.get(), spec.stderr_file, owner);
  }

  UniqueFd status;
  if (spec.outlives_caller) {
    step("status file");
    if (spec.status_path.empty()) throw Error("an execution that outlives its caller needs a status file (ExecSpec::status_path)");
    status.reset(::open(spec.status_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!status) throw SysError(errno, "create", spec.status_path);
    exec->status_path_ = spec.status_path;
    exec->handle_.data[kStatusPath] = spec.status_path;
  }

  // Limits: cgroups for cpus/memory/pids, rlimit for output, the keeper for time. The groups'
  // paths go on record first: if this process dies while creating them, whoever attaches later
  // removes them.
  step("limits");
  const bool cgroups = spec.use_cgroups && !spec.cgroup_name.empty();
  if (auto slash = spec.cgroup_name.rfind('/'); slash != std::string::npos) {
    exec->cgroup_folder_ = spec.cgroup_name.substr(0, slash);
    const std::string leaf = spec.cgroup_name.substr(slash + 1);
    if (const auto dash = leaf.find('-'); dash != std::string::npos) exec->cgroup_prefix_ = leaf.substr(0, dash + 1);
  }
  // A command takes the group an earlier one of the instance left, when there is one.
  if (cgroups && !spec.outlives_caller && !exec->cgroup_prefix_.empty()) {
    exec->pool_ = backend.spare_groups();
    if (exec->pool_)
      exec->pool_key_ = CgroupPool::key(exec->cgroup_folder_, exec->cgroup_prefix_, cgroup_limits(spec.limits));
  }
  AppliedLimits applied;
  if (auto spare = exec->pool_ ? exec->pool_->take(exec->pool_key_) : std::nullopt) {
    applied.cgroup = std::move(spare->group);
    applied.unenforced = std::move(spare->unenforced);
    applied.rlimits = rlimits_of(spec.limits);
  } else {
    applied = apply_limits(spec.limits, spec.cgroup_name, cgroups, [&](const auto& paths) {
      if (paths.empty()) return;
      auto& list = exec->handle_.data[kCgroups] = nlohmann::json::array();
      for (const auto& p : paths) list.push_back(p.string());
      publish();
    });
  }
  exec->cgroup_ = std::move(applied.cgroup);
  exec->unenforced_ = applied.unenforced;
  exec->handle_.data.erase(kCgroups);
  if (exec->cgroup_ && !exec->cgroup_->paths().empty()) {
    auto& list = exec->handle_.data[kCgroups] = nlohmann::json::array();
    for (const auto& p : exec->cgroup_->paths()) list.push_back(p.string());
  }
  publish();  // exactly the groups in use

  RunSpec run;
  run.target = spec.target;
  run.argv = spec.argv;
  run.cwd = spec.cwd;
  run.env = spec.env;
  run.stdio = spec.stdio;
  if (exec->out_) run.stdio.out = exec->out_.get();
  if (exec->err_) run.stdio.err = exec->err_.get();
  run.terminal = spec.terminal;
  run.output_readers = spec.output_readers;
  run.die_with_caller = !spec.outlives_caller;
  run.command_prefix = spec.command_prefix;
  run.status_file = status.get();
  run.limits = applied.rlimits;
  if (auto it = spec.limits.find("time"); it != spec.limits.end() && it->second > 0)
    run.limits.wall_time = std::chrono::seconds(it->second);
  run.limits.wall_time_grace = spec.time_grace;
  if (exec->cgroup_) {
    run.join_cgroups = exec->cgroup_->procs_fds();
    run.cgroup = exec->cgroup_.get();
    if (exec->pool_) {
      run.cgroup_key = exec->pool_key_;
      run.cgroup_limits = std::make_shared<const CgroupLimits>(cgroup_limits(spec.limits));
    }
  }

  step("start");
  exec->process_ = backend.start(run);
  exec->watch_ = UniqueFd(::fcntl(exec->process_->pidfd(), F_DUPFD_CLOEXEC, 3));
  if (!exec->watch_) throw SysError(errno, "dup", "the sandbox's process descriptor");
  exec->handle_.data[kPid] = exec->process_->pid();  // the final handle: handle()
  return exec;
}

std::unique_ptr<Execution> attach_by_status_file(const ExecutionHandle& handle) {
  auto exec = std::make_unique<SandboxExecution>();
  exec->outlives_ = true;
  exec->handle_ = handle;
  if (!exec->handle_.data.is_object()) exec->handle_.data = nlohmann::json::object();
  const nlohmann::json& data = exec->handle_.data;
  if (auto it = data.find(kStatusPath); it != data.end() && it->is_string()) exec->status_path_ = it->get<std::string>();

  const StatusStream status = read_status(exec->status_path_);
  exec->pid_ns_ = status.pid_namespace();
  exec->keeper_ = status.keeper();
  exec->watch_ = open_sandbox_init(status);
  exec->watch_is_init_ = static_cast<bool>(exec->watch_);
  // No sandbox and no exit code: the keeper may still start it (or run it) and report its end.
  if (!exec->watch_ && !status.exit_code()) exec->watch_ = open_running_keeper(status, exec->status_path_);
  if (status.exit_code())
    exec->seen_ = Seen::exited;
  else if (exec->watch_is_init_)
    exec->seen_ = Seen::running;
  else if (exec->watch_)
    exec->seen_ = Seen::keeper;
  else if (status.child_pid())
    exec->seen_ = Seen::vanished;
  else
    exec->seen_ = Seen::never_started;

  const std::vector<std::string> cgroups = strings_of(data, kCgroups);
  if (!cgroups.empty()) {
    try {
      exec->cgroup_ = Cgroup::attach(std::vector<stdfs::path>(cgroups.begin(), cgroups.end()));
    } catch (const std::exception&) {
      // Already removed by whoever finished it: nothing left to limit or kill there.
    }
  }
  return exec;
}

}  // namespace nshpc::sandbox

namespace nshpc::sandbox {

namespace {

// An execution whose handle this backend cannot read: nothing of it is known, nothing is done to
// it.
class UnreadableExecution final : public Execution {
 public:
  UnreadableExecution(ExecutionHandle handle, std::string why) : handle_(std::move(handle)), why_(std::move(why)) {}
  int wait_fd() const override { return -1; }  // ended, as far as this backend can tell
  ExitStatus wait() override {
    ExitStatus status;
    status.error = why_;
    return status;
  }
  void signal(int) override {}
  void kill_tree(bool) override {}
  ExecutionHandle handle() const override { return handle_; }
  bool enforces_time_limit() const override { return false; }
  Seen seen() const override { return Seen::unreadable; }

 private:
  ExecutionHandle handle_;
  std::string why_;
};

[[noreturn]] void no_ports(const Backend& backend) {
  throw UsageError(fmt::format("the {} backend cannot expose an instance's ports", backend.name()));
}
}  // namespace

std::unique_ptr<Execution> unreadable_execution(const ExecutionHandle& handle, std::string why) {
  return std::make_unique<UnreadableExecution>(handle, std::move(why));
}

std::unique_ptr<Execution> Backend::attach(const ExecutionHandle& handle) {
  if (handle.empty()) return attach_by_status_file(handle);  // nothing on record: never_started
  if (handle.backend != name())
    return unreadable_execution(handle, fmt::format("its execution was recorded by the '{}' backend, which this server "
                                                    "does not have (it runs '{}')",
                                                    handle.backend, name()));
  if (handle.version > ExecutionHandle::kVersion)
    return unreadable_execution(handle, fmt::format("its execution was recorded by a newer release ('{}' handle of "
                                                    "version {}; this release reads up to version {})",
                                                    handle.backend, handle.version, ExecutionHandle::kVersion));
  return unreadable_execution(handle, fmt::format("the '{}' backend cannot find its executions again after a restart",
                                                  handle.backend));
}

ExposedPort Backend::expose_port(const Target&, std::uint16_t, std::uint16_t) { no_ports(*this); }
bool Backend::unexpose_port(const Target&, std::uint16_t) { no_ports(*this); }
std::vector<ExposedPort> Backend::exposed_ports(const Target&) { return {}; }

LivingRoot Backend::living_root(const Target& target) {
  throw UsageError(fmt::format("the {} backend cannot reach the files of instance '{}' from outside its sandbox",
                               name(), target.instance_id));
}

}  // namespace nshpc::sandbox
