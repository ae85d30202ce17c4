// The bubblewrap backend: one fresh, hardened sandbox per command.
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <poll.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <deque>
#include <thread>

#include <linux/magic.h>
#include <sys/file.h>
#include <sys/vfs.h>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "base/proc.hpp"
#include "base/random.hpp"
#include "base/scope.hpp"
#include "base/steps.hpp"
#include "base/text.hpp"
#include "network/netns.hpp"
#include "sandbox/bwrap_argv.hpp"
#include "sandbox/capture.hpp"
#include "sandbox/cgroups.hpp"
#include "sandbox/execution.hpp"
#include "sandbox/gate.hpp"
#include "sandbox/join.hpp"
#include "sandbox/keeper.hpp"
#include "sandbox/layers.hpp"
#include "sandbox/limits.hpp"
#include "sandbox/members.hpp"
#include "sandbox/network.hpp"
#include "sandbox/sandbox.hpp"
#include "sandbox/seccomp.hpp"
#include "sandbox/spawn.hpp"
#include "sandbox/status.hpp"

namespace nshpc::sandbox {

namespace {

// Descriptor numbers inside the bwrap process.
// The shell command's descriptor is high, out of the way of a script's own `exec 3>…`.
constexpr FdNumbers kChildFds{.status = 3, .seccomp = 4, .workspace = 5, .output = 6, .shared_output = 7, .busy = 8,
                               .script = 62, .root = 9};
// An image instance's sandbox: its starter's descriptors for the image and the user namespace
// (sandbox/layers.hpp: used and closed before anything is executed).
constexpr int kImageTreeFd = 10;
constexpr int kImageUsernsFd = 11;
// An instance's held network namespace (sandbox/network.hpp), and the user namespace owning it
// when the server is not root: joined by the child and closed before anything is executed.
constexpr int kHeldNetFd = 12;
constexpr int kHeldUsernsFd = 13;
// A keeper's descriptor of the store's audit log (KeeperOptions::audit_fd).
constexpr int kStoreAuditFd = 14;

// How long a launch waits while the instance's trees are copied (sandbox/gate.hpp) before it is
// refused: a snapshot of a small workspace takes well under this.
constexpr std::chrono::seconds kGatePatience{30};

// In the child, async-signal-safe: joins the held network namespace.
int join_held_network(int userns_fd, const char** step) {
  if (userns_fd >= 0) {
    if (::setns(userns_fd, CLONE_NEWUSER) != 0) {
      *step = "join the user namespace of the instance's network namespace";
      return errno;
    }
    ::close(userns_fd);
  }
  if (::setns(kHeldNetFd, CLONE_NEWNET) != 0) {
    *step = "join the instance's network namespace";
    return errno;
  }
  ::close(kHeldNetFd);
  return 0;
}

// A memfd holding a shell command, for the sandbox's shell to read (see shell_script_of).
UniqueFd script_fd(const std::string& script) {
  UniqueFd fd(::memfd_create("ns-hpc-command", MFD_CLOEXEC));
  if (!fd) throw SysError(errno, "memfd_create", "the shell command's descriptor");
  std::size_t done = 0;
  while (done < script.size()) {
    const ssize_t n = ::write(fd.get(), script.data() + done, script.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SysError(errno, "write", "the shell command's descriptor");
    done += static_cast<std::size_t>(n);
  }
  return fd;
}

std::optional<std::string> read_top_level_symlink(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return std::nullopt;
  return std::string(buf, static_cast<size_t>(n));
}

std::optional<std::string> host_env(std::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (!value) return std::nullopt;
  return std::string(value);
}

std::string find_bwrap(const std::string& name) {
  if (auto path = fs::find_program(name)) return *path;
  throw Error(fmt::format("'{}' (namespace.bwrap_command[0]) not found or not executable; install "
                          "bubblewrap (apt-get install bubblewrap) or fix the path", name));
}

// Why `uid`/`gid` cannot reach `dir` (a folder on the way lacks the search bit for it), or
// nullopt. bwrap resolves bind sources by path after dropping to that uid.
std::optional<std::string> unreachable_for(const stdfs::path& dir, uid_t uid, gid_t gid) {
  stdfs::path current = "/";
  auto check = [&](const stdfs::path& p) -> std::optional<std::string> {
    struct stat st;
    if (::stat(p.c_str(), &st) < 0) return fmt::format("{}: {}", p.string(), std::strerror(errno));
    mode_t bit = st.st_uid == uid ? S_IXUSR : (st.st_gid == gid ? S_IXGRP : S_IXOTH);
    if (!(st.st_mode & bit))
      return fmt::format("{} (mode {:04o}, owner uid {}) cannot be entered by uid {}", p.string(),
                         st.st_mode & 07777, st.st_uid, uid);
    return std::nullopt;
  };
  for (const auto& part : dir.relative_path()) {
    if (auto why = check(current)) return why;
    current /= part;
  }
  return check(current);
}

// Pipe whose read end yields the seccomp program (fits in the pipe buffer: < 4 KiB).
UniqueFd seccomp_program_fd(const std::string& bpf) {
  Pipe p = make_pipe();
  const char* data = bpf.data();
  size_t left = bpf.size();
  while (left > 0) {
    ssize_t n = ::write(p.write.get(), data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "write seccomp program");
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  return std::move(p.read);
}

class BwrapProcess final : public Process {
 public:
  // `child` is bwrap, or (`keeper`) the job keeper running bwrap. `status` is the read end of a
  // status pipe, or (`status_is_file`) a descriptor of the status file that bwrap appends to.
  BwrapProcess(Child child, bool keeper, UniqueFd status, bool status_is_file)
      : child_(std::move(child)), keeper_(keeper), status_fd_(std::move(status)), status_is_file_(status_is_file) {
    // Wait for the sandbox to exist (first status document) so kill() can reach its init.
    read_status(/*until_child_pid=*/true);
    if (auto init = status_.child_pid()) {
      init_pid_ = *init;
      // Checked against its pid namespace: should the init have ended and been reaped by bwrap
      // already, its pid may belong to another process (wait() sends SIGKILL here).
      init_pidfd_ = status_.pid_namespace() ? open_member(*init, *status_.pid_namespace()) : open_pidfd(*init);
    }
    // Under a keeper, bwrap's monitor is the init's parent. Should the keeper be killed, the
    // monitor and then the init come to us (the server is a subreaper): wait() reaps them.
    if (keeper_ && init_pidfd_ && !status_.joined()) {
      const pid_t monitor = parent_of(init_pid_);
      if (monitor > 0 && monitor != child_.pid()) {
        UniqueFd fd = open_pidfd(monitor);
        if (fd && parent_of(init_pid_) == monitor) monitor_pidfd_ = std::move(fd);  // still its parent: the same process
      }
    }
  }
  ~BwrapProcess() override {
    if (reaped_) return;
    try {
      kill();
      wait();
    } catch (...) {
    }
  }

  pid_t pid() const override { return child_.pid(); }
  pid_t sandbox_pid() const override { return init_pid_; }
  int pidfd() const override { return child_.pidfd(); }

  void kill() override {
    if (reaped_) return;
    // The sandbox init first: its death takes the whole pid namespace.
    signal_pidfd(init_pidfd_.get(), SIGKILL);
    // A keeper then sees bwrap end, reaps everything and reports: killing it as well would
    // hand its children to us half-way. Without an init to kill, it goes too.
    if (keeper_ && init_pidfd_) return;
    signal_pidfd(child_.pidfd(), SIGKILL);
  }

  void disown() override {
    child_.release();  // its keeper outlives this handle
    reaped_ = true;
  }

  // A group the backend made for this execution alone: emptied and removed once it has ended.
  void own_group(std::unique_ptr<Cgroup> group) { group_ = std::move(group); }

  ExitStatus wait() override {
    if (reaped_) return result_;
    read_status(/*until_child_pid=*/false);  // a pipe: to its end, when bwrap has exited
    const int raw = child_.wait(keeper_ ? "the job keeper" : "bwrap");
    reaped_ = true;
    read_status(/*until_child_pid=*/false);  // a file: everything written until the end
    result_ = interpret(raw);
    result_.timed_out = status_.deadline_reached().has_value();
    reap_leftovers();
    if (group_) {
      try {
        group_->kill(2000);
        group_->remove();
      } catch (const std::exception& e) {
        log::debug("cgroup of bwrap pid {} left: {}", child_.pid(), e.what());
      }
    }
    return result_;
  }

 private:
  void read_status(bool until_child_pid) {
    if (!status_fd_) return;
    if (status_is_file_) return read_status_file(until_child_pid);
    char buf[4096];
    while (!(until_child_pid && status_.child_pid())) {
      ssize_t n = ::read(status_fd_.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status_fd_.reset();  // EOF: bwrap has exited (or failed)
        return;
      }
      status_.feed(std::string_view(buf, static_cast<size_t>(n)));
    }
  }

  // bwrap's monitor exits when the main command does; with --die-with-parent the sandbox init
  // is killed then and goes to the nearest subreaper. When that is us (the server sets
  // PR_SET_CHILD_SUBREAPER; or a killed keeper's monitor and init), reap it here: nothing of the
  // sandbox may linger, so SIGKILL first, then wait for exactly that process (never a poll).
  // A keeper that exited normally has reaped them itself.
  void reap_leftovers() {
    for (UniqueFd* fd : {&monitor_pidfd_, &init_pidfd_}) {
      if (!*fd) continue;
      try {
        signal_pidfd(fd->get(), SIGKILL);
      } catch (const std::exception&) {
      }
      reap_if_child(fd->get());  // false when it is not ours: its own parent reaps it
      fd->reset();
    }
  }

  // The file has no end-of-stream: re-read it from the start until the wanted document is there
  // or bwrap has exited (then once more, for what it wrote last).
  void read_status_file(bool until_child_pid) {
    for (int attempt = 0;; ++attempt) {
      const bool exited = !until_child_pid || !process_alive();
      StatusStream fresh;
      char buf[4096];
      off_t offset = 0;
      ssize_t n;
      while ((n = ::pread(status_fd_.get(), buf, sizeof buf, offset)) > 0) {
        fresh.feed(std::string_view(buf, static_cast<size_t>(n)));
        offset += n;
      }
      status_ = fresh;
      if (exited || status_.child_pid()) return;
      ::usleep(attempt < 100 ? 200 : 2000);
    }
  }

  bool process_alive() const {
    pollfd p{child_.pidfd(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;  // a pidfd becomes readable when the process exits
  }

  ExitStatus interpret(int raw) const {
    ExitStatus st;
    if (auto code = status_.exit_code()) {
      st.started = true;
      st.exit_code = *code;
      return st;
    }
    if (WIFSIGNALED(raw)) {
      // Killed (by kill() or from outside) before bwrap could report: the tree went with it.
      st.started = status_.child_pid().has_value();
      st.exit_code = 128 + WTERMSIG(raw);
      if (!st.started) st.error = fmt::format("bwrap was killed by signal {} while starting", WTERMSIG(raw));
      return st;
    }
    st.exit_code = WIFEXITED(raw) ? WEXITSTATUS(raw) : 1;
    st.error = fmt::format(
        "bwrap exited with status {} before the command ran (it could not set up the sandbox "
        "or execute the command; its own message is on stderr)",
        st.exit_code);
    return st;
  }

  Child child_;
  bool keeper_ = false;
  UniqueFd status_fd_;
  bool status_is_file_ = false;
  StatusStream status_;
  pid_t init_pid_ = 0;
  UniqueFd init_pidfd_;
  UniqueFd monitor_pidfd_;  // bwrap's monitor under a keeper
  std::unique_ptr<Cgroup> group_;
  bool reaped_ = false;
  ExitStatus result_;
};

// Reaps the processes of pid namespace `pid_ns` (and those nested in it) that ended as children of
// this process. A command's process whose parent outside the sandbox died (its joiner, its command
// init, killed at a timeout) is adopted by the server, a subreaper; unreaped, it would keep the
// sandbox's init from ever finishing its exit (an init waits for every process of its namespace
// to be reaped), so a stop would hang and the next start find the old sandbox. waitid on one
// that runs, or on someone else's child, does nothing.
void reap_adopted(std::uint64_t pid_ns) {
  for (const TreeMember& m : tree_members(pid_ns)) {
    if (m.ppid != ::getpid()) continue;
    siginfo_t info{};
    ::waitid(P_PID, static_cast<id_t>(m.pid), &info, WEXITED | WNOHANG);
  }
}

// A command in a living sandbox (sandbox/join.hpp). Holds the instance's busy file shared while
// it runs, so the sandbox is not stopped for idleness under it.
class JoinedProcess final : public Process {
 public:
  // `group`: flat (root), the command's cgroup, through which its tree is killed; `own_group`
  // when the backend made it for this command (kept while what the command left runs).
  JoinedProcess(Joined joined, UniqueFd busy, Cgroup* group, std::unique_ptr<Cgroup> own_group, std::string cgroup_folder,
                Leftovers& leftovers)
      : leftovers_(leftovers),
        joined_(std::move(joined)),
        busy_(std::move(busy)),
        group_(group),
        own_group_(std::move(own_group)),
        cgroup_folder_(std::move(cgroup_folder)) {}
  ~JoinedProcess() override {
    try {
      if (!waited_) {
        kill();
        wait();
      }
    } catch (...) {
    }
    joined_.release.reset();  // the command init now discards what background processes write
    ::futimens(busy_.get(), nullptr);
    if (own_group_) {
      try {
        // The command init ends at once unless background processes still write to the pipes.
        wait_pidfd(joined_.pidfd.get(), std::chrono::milliseconds(50));
        if (own_group_->empty()) {
          own_group_->remove();
        } else {
          own_group_->keep();
          Cgroup::remove_empty(cgroup_folder_, "cmd-");
        }
      } catch (const std::exception&) {
      }
    }
    // Flat: the joiner is our child; it ends once nothing writes to the output pipes any more.
    if (joined_.our_child) {
      leftovers_.add(std::move(joined_.pidfd));
      leftovers_.reap_ended();
    }
    if (joined_.pid_ns != 0) {
      try {
        reap_adopted(joined_.pid_ns);  // what a killed tree left to us
      } catch (const std::exception&) {
      }
    }
    if (then_) then_();
  }

  pid_t pid() const override { return joined_.pid; }
  pid_t sandbox_pid() const override { return joined_.pid; }
  int pidfd() const override { return joined_.status.get(); }  // readable once the command has ended
  // Called once this command is done with (after its group went back): what comes next.
  void then(std::function<void()> next) { then_ = std::move(next); }
  int terminal() const override { return joined_.terminal.get(); }

  ExitStatus wait() override {
    if (waited_) return result_;
    int raw = 0;
    ssize_t n;
    do {
      n = ::read(joined_.status.get(), &raw, sizeof raw);
    } while (n < 0 && errno == EINTR);
    waited_ = true;
    result_.started = true;
    if (n == static_cast<ssize_t>(sizeof raw))
      result_.exit_code = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    else
      result_.exit_code = 128 + SIGKILL;  // its tree was killed before it could report
    return result_;
  }

  void kill() override {
    try {
      if (group_)
        group_->kill(2000);  // the command's cgroup: every process it started
      else
        signal_pidfd(joined_.pidfd.get(), SIGKILL);  // the command init: its whole pid namespace goes
    } catch (const std::exception&) {
    }
  }

  // The command's tree keeps running (its background processes stay; the command init reaps it).
  void disown() override {
    wait();
    joined_.release.reset();
  }

 private:
  Leftovers& leftovers_;
  Joined joined_;
  UniqueFd busy_;
  Cgroup* group_ = nullptr;
  std::unique_ptr<Cgroup> own_group_;
  std::string cgroup_folder_;  // the instance's (Target::cgroup_folder)
  bool waited_ = false;
  ExitStatus result_;
  std::function<void()> then_;
};

std::uint64_t resident_bytes(pid_t pid) {
  try {
    const std::optional<proc::Statm> statm = proc::read_statm(pid);
    return statm ? statm->resident_bytes() : 0;
  } catch (const SysError&) {
    return 0;  // unreadable: counted as nothing
  }
}

// A process's command line, its arguments separated by spaces, at most 512 characters (the
// sandbox wrote it).
std::string command_line(pid_t pid) {
  std::vector<std::string> args = proc::read_cmdline(pid);
  while (!args.empty() && args.back().empty()) args.pop_back();
  std::string line;
  for (const std::string& arg : args) {
    if (line.size() >= 512) break;
    if (!line.empty()) line += ' ';
    line += arg;
  }
  if (line.size() > 512) line.resize(512);
  for (char& c : line)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return text::sanitize_utf8(line);
}

std::chrono::seconds age_of(pid_t pid) {
  struct stat st;
  if (::stat(fmt::format("/proc/{}", pid).c_str(), &st) < 0) return std::chrono::seconds(0);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const auto started = std::chrono::seconds(st.st_mtim.tv_sec);
  return std::max(std::chrono::seconds(0), std::chrono::duration_cast<std::chrono::seconds>(now - started));
}

class BwrapBackend final : public Backend {
 public:
  explicit BwrapBackend(const config::Config& config)
      : ns_(config.ns), net_(config.network), server_port_(static_cast<std::uint16_t>(config.server.port)),
        use_cgroups_(config.jobs.local.use_cgroups) {
    drop_to_ = users::sandbox_owner(ns_.sandbox_uid, ns_.sandbox_gid);
  }
  ~BwrapBackend() override {
    {
      std::lock_guard lock(preparing_mutex_);
      stopping_ = true;
    }
    preparing_cv_.notify_all();
    if (preparer_.joinable()) preparer_.join();
    std::map<std::string, Awaiting> awaiting;
    {
      std::lock_guard lock(mutex_);
      awaiting.swap(awaiting_);
    }
    for (auto& [key, entry] : awaiting) dismiss(std::move(entry.joiner));
  }

  static constexpr const char* kName = "bwrap";
  std::string_view name() const override { return kName; }
  std::optional<users::Identity> runs_as(const Target& target) const override { return identity(target); }

  CgroupPool* spare_groups() override { return &spare_groups_; }
  void expect_more_commands() override { serving_ = true; }

  std::vector<std::string> describe(const RunSpec& spec) const override {
    if (!needs_keeper(spec)) return build_bwrap_argv(ns_, spec, fd_numbers(spec), argv_options());
    return keeper_argv(self_path(), keeper_options(spec));
  }

  // A command in the instance's sandbox: joined to its living one, else in a fresh one (in the
  // network namespace held for its commands, if any).
  std::unique_ptr<Process> start(const RunSpec& spec) override {
    Steps step("start", spec.target.instance_id);
    step("gate");  // held until the execution ends: no copy of the instance's trees begins meanwhile
    UniqueFd gate = enter_gate(spec.target, kGatePatience);
    step("instance limits");  // before the execution's group gets a process
    limit_instance(spec.target.cgroup_folder);
    if (spec.target.persistent) {
      step("join living");
      return holding_gate(join_living(spec), std::move(gate));
    }
    step("held network");
    std::optional<HeldNetwork> held = held_network_for(spec.target);
    step("fresh");
    if (!held) return holding_gate(start_fresh(spec), std::move(gate));
    RunSpec joined = spec;
    joined.network_joined = true;
    return holding_gate(start_fresh(joined, &*held), std::move(gate));
  }

  // What execute() recorded of an execution under the job keeper; versions 0 (an earlier
  // release's untyped handle) and 1 hold the same data. Any other handle: Backend::attach says
  // whose it is.
  std::unique_ptr<Execution> attach(const ExecutionHandle& handle) override {
    if (handle.backend == name() && handle.version <= ExecutionHandle::kVersion) return attach_by_status_file(handle);
    return Backend::attach(handle);
  }

  LivingStatus living_status(const Target& target) override {
    leftovers_.reap_ended();
    Living found = find_living(target);
    LivingStatus st;
    if (found.running) {
      st.running = true;
      st.since = found.status.started();
      for (const TreeMember& m : tree_members(*found.status.pid_namespace())) {
        ++st.processes;
        st.memory_bytes += resident_bytes(m.pid);
      }
      return st;
    }
    if (found.unreadable) {
      st.last_end = unreadable_living(*found.unreadable);
      return st;
    }
    if (!found.status.keeper()) return st;  // never ran
    st.ended_at = found.status.ended();
    if (auto end = read_end(target)) {
      st.last_end = end->first;
      st.ended_at = end->second;
    } else if (auto idle = found.status.idle_stopped()) {
      st.last_end = fmt::format("stopped after {} s without activity (namespace.idle_stop)", target.idle_stop.value_or(ns_.idle_stop));
      st.ended_at = idle;
    } else {
      st.last_end = "its sandbox ended outside ns-hpc (its main process exited or was killed); it starts again on next use";
    }
    return st;
  }

  std::vector<std::string> end_stray_sandboxes(const stdfs::path& instances_dir) override {
    const std::string root = instances_dir.lexically_normal().string() + "/";
    struct Stray {
      UniqueFd pidfd;
      UniqueFd init;  // a keeper's sandbox init: ended first, so that the keeper reaps and exits
      std::string line;
    };
    std::vector<Stray> strays;
    std::error_code ec;
    for (const auto& entry : stdfs::directory_iterator("/proc", ec)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name[0] < '0' || name[0] > '9') continue;
      const pid_t pid = static_cast<pid_t>(std::atoi(name.c_str()));
      Stray stray{open_pidfd(pid), {}, {}};
      if (!stray.pidfd) continue;
      const std::vector<std::string> argv = proc::read_cmdline(pid);
      if (wait_pidfd(stray.pidfd.get(), std::chrono::milliseconds(0))) continue;  // gone: argv may be another's
      if (argv.size() > 1 && argv[1] == kKeeperCommand) {
        std::optional<std::string> line = stray_keeper(pid, root, stray.init);
        if (!line) continue;
        stray.line = std::move(*line);
      } else if (const auto folder = network_helper_folder(argv)) {
        std::error_code fec;
        if (!folder->string().starts_with(root) || stdfs::exists(*folder, fec) || fec) continue;
        const std::string what = argv[1].starts_with("__") ? argv[1] : "pasta";
        stray.line = fmt::format("ended {} (pid {}) of {}: its instance's folder is gone", what, pid, folder->string());
      } else {
        continue;
      }
      strays.push_back(std::move(stray));
    }
    // Helpers and keepers without a known sandbox at once; a keeper, once its sandbox has ended
    // (it reaps what it leaves and exits), or after a little while.
    for (Stray& stray : strays) {
      try {
        signal_pidfd(stray.init ? stray.init.get() : stray.pidfd.get(), SIGKILL);
      } catch (const std::exception&) {
      }
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    std::vector<std::string> ended;
    for (Stray& stray : strays) {
      if (stray.init) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        if (!wait_pidfd(stray.pidfd.get(), std::max(left, std::chrono::milliseconds(0)))) {
          try {
            signal_pidfd(stray.pidfd.get(), SIGKILL);
          } catch (const std::exception&) {
          }
        }
      }
      ended.push_back(std::move(stray.line));
    }
    return ended;
  }

  void reap_ended() override { leftovers_.reap_ended(); }

  // Answered as command_group() decides: a command shares the sandbox's pid namespace when it
  // gets a cgroup that can be killed. Found out once, by making such a group.
  bool commands_share_pids() const override {
    if (!drop_to_ || !use_cgroups_) return false;
    std::lock_guard lock(share_pids_mutex_);
    if (!share_pids_) {
      try {
        std::vector<std::string> unenforced;
        std::unique_ptr<Cgroup> probe = Cgroup::create("probe-" + random::hex(6), {}, unenforced);
        share_pids_ = probe && !probe->paths().empty() && UniqueFd(probe->open_kill_file_fd());
      } catch (const std::exception& e) {
        log::debug("commands get pid namespaces of their own: no cgroup for them here ({})", e.what());
        share_pids_ = false;
      }
    }
    return *share_pids_;
  }

  LivingStatus start_living(const Target& target) override {
    UniqueFd gate = enter_gate(target, kGatePatience);
    ensure_living(target);
    return living_status(target);
  }

  bool stop_living(const Target& target, std::string_view why, std::chrono::milliseconds grace) override {
    leftovers_.reap_ended();
    dismiss_awaiting(target);
    // A namespace held for fresh sandboxes (the instance may have been one that is not
    // persistent) goes with it.
    release_network(target);
    fs::make_dirs(target.state_dir, 0700);
    fs::FileLock lock(target.state_dir / kLivingLock);
    Living found = find_living(target);
    if (found.unreadable) {
      // Nothing here can reach it: a stop lets the instance start again here, on this backend.
      log::warn("instance {}: {}; forgotten as it was stopped", target.instance_id, unreadable_living(*found.unreadable));
      ::unlink((target.state_dir / kLivingHandleFile).c_str());
      return false;
    }
    if (!found.running) {
      eventually_remove_groups(target.cgroup_folder, /*attempts=*/1);  // left by an idle stop
      return false;
    }
    write_end(target, why);
    const std::uint64_t pid_ns = *found.status.pid_namespace();
    const pid_t init = *found.status.child_pid();
    // Everything but the sandbox's main process gets SIGTERM and the grace to end.
    auto others = [&] {
      std::vector<TreeMember> out;
      for (const TreeMember& m : tree_members(pid_ns))
        if (!living_main_process(m, init)) out.push_back(m);
      return out;
    };
    for (const TreeMember& m : others()) {
      UniqueFd fd = open_member(m.pid, m.pid_ns);
      try {
        if (fd) signal_pidfd(fd.get(), SIGTERM);
      } catch (const std::exception&) {
      }
    }
    const auto until = std::chrono::steady_clock::now() + grace;
    while (std::chrono::steady_clock::now() < until) {
      leftovers_.reap_ended();
      reap_adopted(pid_ns);  // a command's process that ended is a zombie of ours until reaped
      if (others().empty()) break;
      ::usleep(20000);
    }
    signal_pidfd(found.init.get(), SIGKILL);  // its death takes every process of the sandbox
    // The init ends once every process of its namespace is reaped, ours included.
    const auto dead_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    do {
      leftovers_.reap_ended();
      reap_adopted(pid_ns);
    } while (!wait_pidfd(found.init.get(), std::chrono::milliseconds(20)) && std::chrono::steady_clock::now() < dead_by);
    end_network_of(target);
    // The groups commands kept for what they left running are empty now.
    eventually_remove_groups(target.cgroup_folder);
    return true;
  }

  bool change_network(const Target& target) override {
    leftovers_.reap_ended();
    if (!target.persistent) {
      const NetworkPlan plan = held_plan(target);
      if (target.network == config::Network::host) return release_held_network(plan);
      if (!find_held_network(plan)) return false;
      hold_network(plan, held_idle(), leftovers_, /*again=*/true);
      return true;
    }
    fs::make_dirs(target.state_dir, 0700);
    fs::FileLock lock(target.state_dir / kLivingLock);
    Living found = find_living(target);
    if (!found.running) return false;
    // What the sandbox was made with: its own namespace (a mode on record), or the host's.
    const bool own_namespace = served_network(target.state_dir).has_value();
    if (!own_namespace || target.network == config::Network::host) return false;
    serve_network(network_plan(target), *found.status.child_pid(), leftovers_);
    return true;
  }

  ExposedPort expose_port(const Target& target, std::uint16_t port, std::uint16_t host_port) override {
    leftovers_.reap_ended();
    if (target.network == config::Network::host)
      throw UsageError(fmt::format("instance '{}' shares the host's network: its port {} is the host's port {} "
                                   "already; expose_port is for an instance with a network of its own (off, nat "
                                   "or filtered)",
                                   target.instance_id, port, port));
    fs::make_dirs(target.state_dir, 0700);
    if (!target.persistent) {
      const NetworkPlan plan = held_plan(target);
      const HeldNetwork held = hold_network(plan, held_idle(), leftovers_);
      return sandbox::expose_port(plan, held.pid, port, host_port, leftovers_);
    }
    {
      UniqueFd gate = enter_gate(target, kGatePatience);
      ensure_living(target);
    }
    fs::FileLock lock(target.state_dir / kLivingLock);
    Living found = find_living(target);
    if (!found.running)
      throw Error(fmt::format("the sandbox of instance '{}' ended as its port was exposed; try again",
                              target.instance_id));
    return sandbox::expose_port(network_plan(target), *found.status.child_pid(), port, host_port, leftovers_);
  }

  bool unexpose_port(const Target& target, std::uint16_t port) override {
    return sandbox::unexpose_port(target.persistent ? network_plan(target) : held_plan(target), port);
  }

  std::vector<ExposedPort> exposed_ports(const Target& target) override {
    return sandbox::exposed_ports(target.persistent ? network_plan(target) : held_plan(target));
  }

  void release_network(const Target& target) override {
    try {
      release_held_network(held_plan(target));
    } catch (const std::exception& e) {
      log::warn("instance {}: ending its held network namespace: {}", target.instance_id, e.what());
    }
  }

  std::vector<LivingProcess> living_processes(const Target& target) override {
    Living found = find_living(target);
    std::vector<LivingProcess> out;
    if (!found.running) return out;
    for (const TreeMember& m : tree_members(*found.status.pid_namespace())) {
      LivingProcess p;
      p.pid = m.pid;
      p.ppid = m.ppid;
      p.command = command_line(m.pid);
      p.rss_bytes = resident_bytes(m.pid);
      p.age = age_of(m.pid);
      out.push_back(std::move(p));
    }
    return out;
  }

  LivingRoot living_root(const Target& target) override {
    if (!target.persistent)
      throw UsageError(fmt::format("instance '{}' has no living sandbox (each of its commands gets a fresh one)",
                                   target.instance_id));
    LivingRoot out;
    out.gate = enter_gate(target, kGatePatience);
    leftovers_.reap_ended();
    fs::make_dirs(target.state_dir, 0700);
    out.busy = mark_busy(target);
    for (int attempt = 0;; ++attempt) {
      {
        std::lock_guard lock(mutex_);
        auto it = joinable_.find(target.state_dir.string());
        out.started = it == joinable_.end() || wait_pidfd(it->second->init_pidfd.get(), std::chrono::milliseconds(0));
      }
      if (out.started) out.started = !find_living(target).running;
      const std::shared_ptr<const Joinable> sandbox = joinable(target);
      UniqueFd root(::open(fmt::format("/proc/{}/root", sandbox->init).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      const int err = root ? 0 : errno;
      // The init still lives (its pidfd is not readable): the pid named it during the open.
      if (!wait_pidfd(sandbox->init_pidfd.get(), std::chrono::milliseconds(0))) {
        if (!root)
          throw SysError(err, "open", fmt::format("/proc/{}/root (the root folder of instance '{}')", sandbox->init,
                                                  target.instance_id));
        out.root = std::move(root);
        break;
      }
      if (attempt > 0)
        throw Error(fmt::format("the sandbox of instance '{}' ended as its files were opened; try again",
                                target.instance_id));
      // It ended just now: joinable() finds that and starts it again.
    }
    // What the sandbox's own files are on: see image_bwrap_argv (its root, tmpfs for /tmp and
    // /dev/shm, the host folders it binds). Its /proc, /proc/sys, /dev's device nodes, devpts
    // and mqueue are not.
    auto add = [&out](std::int64_t type) {
      if (std::find(out.file_systems.begin(), out.file_systems.end(), type) == out.file_systems.end())
        out.file_systems.push_back(type);
    };
    struct statfs sfs;
    if (::fstatfs(out.root.get(), &sfs) < 0) throw SysError(errno, "statfs", "the root folder of " + target.instance_id);
    add(static_cast<std::int64_t>(sfs.f_type));
    add(TMPFS_MAGIC);
    for (const stdfs::path& bound : {target.workspace, target.output, target.shared_output_root}) {
      if (bound.empty()) continue;
      if (::statfs(bound.c_str(), &sfs) < 0) throw SysError(errno, "statfs", bound.string());
      add(static_cast<std::int64_t>(sfs.f_type));
    }
    return out;
  }

 private:
  // The files of a living instance in its state folder.
  static constexpr const char* kLivingStatus = kLivingStatusFile;  // status.hpp
  static constexpr const char* kLivingLock = "sandbox.lock";      // held while starting or stopping
  static constexpr const char* kLivingBusy = "sandbox.busy";      // held shared and touched by users
  static constexpr const char* kLivingEnd = "sandbox.end";        // why the server stopped it
  static constexpr const char* kLivingGroup = "sandbox";          // its cgroup, below the instance's

  struct Living {
    StatusStream status;
    UniqueFd init;  // pidfd of the sandbox's init while it runs
    bool running = false;
    // A record that is not this backend's to read (another backend's, a newer release's): nothing
    // of that sandbox is known here.
    std::optional<ExecutionHandle> unreadable;
  };

  // What living_status and a refused start say of such a record.
  static std::string unreadable_living(const ExecutionHandle& handle) {
    return fmt::format("its living sandbox is on record as started by the '{}' backend (handle version {}), which "
                       "this server cannot follow",
                       handle.backend, handle.version);
  }

  // Whether the keeper `pid` is a stray of the store at `root` (its record was removed, or no
  // instance names it): then the line that says so, and its sandbox's init in `init` when its
  // record says which; nullopt when it is not (or not this store's, or its record cannot be read:
  // another user's).
  static std::optional<std::string> stray_keeper(pid_t pid, const std::string& root, UniqueFd& init) {
    // Its status file (descriptor 3, the sandbox's record) says whose it is.
    const std::string fd = fmt::format("/proc/{}/fd/{}", pid, kChildFds.status);
    std::error_code ec;
    std::string status = stdfs::read_symlink(fd, ec).string();
    if (ec) return std::nullopt;
    constexpr std::string_view deleted = " (deleted)";
    const bool gone = status.ends_with(deleted);
    if (gone) status.resize(status.size() - deleted.size());
    if (!status.starts_with(root)) return std::nullopt;
    const stdfs::path file(status);
    StatusStream record;
    if (const UniqueFd in(::open(fd.c_str(), O_RDONLY | O_CLOEXEC)); in) {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(in.get(), buf, sizeof buf)) > 0) record.feed(std::string_view(buf, static_cast<size_t>(n)));
    }
    if (!gone) {
      if (file.filename() != kLivingStatus) return std::nullopt;  // a job's, on record
      Target target;
      target.state_dir = file.parent_path();
      const Living found = find_living(target);
      // A keeper that has not written its first document yet is starting (in another process,
      // at this moment), not a stray.
      if (!found.status.keeper_pid() ||
          (found.status.keeper_pid() == pid && stdfs::exists(file.parent_path().parent_path() / "metadata.json")))
        return std::nullopt;
    }
    if (record.child_pid() && record.pid_namespace() && !record.ended())
      init = open_member(*record.child_pid(), *record.pid_namespace());
    return fmt::format("ended the {} sandbox of keeper {} ({}): no instance names it{}",
                       file.filename() == kLivingStatus ? "living" : "job", pid, status,
                       gone ? " (its record was removed)" : "");
  }

  static Living find_living(const Target& target) {
    Living found;
    const std::optional<ExecutionHandle> handle = read_living_handle(target.state_dir);
    if (!handle) return found;  // never ran
    if (handle->backend != kName || handle->version > ExecutionHandle::kVersion) {
      found.unreadable = handle;
      return found;
    }
    stdfs::path status_path = target.state_dir / kLivingStatus;
    if (auto it = handle->data.find("status_path"); it != handle->data.end() && it->is_string())
      status_path = it->get<std::string>();
    UniqueFd fd(::open(status_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd) return found;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) found.status.feed(std::string_view(buf, static_cast<size_t>(n)));
    if (found.status.ended() || !found.status.child_pid() || !found.status.pid_namespace()) return found;
    found.init = open_member(*found.status.child_pid(), *found.status.pid_namespace());
    // An init that has ended is a zombie until bwrap reaps it, and the keeper writes the end
    // after that: a sandbox just stopped (a restart's first half) is not running any more.
    if (found.init && wait_pidfd(found.init.get(), std::chrono::milliseconds(0))) found.init.reset();
    found.running = static_cast<bool>(found.init);
    return found;
  }

  NetworkPlan network_plan(const Target& target) const {
    NetworkPlan plan{target.instance_id, target.network,   net_.allow,           net_.resolve,
                     target.state_dir,   target.audit_log, target.audit_rotation};
    plan.instance_allow = target.network_allow;
    plan.expose_ports = net_.expose_port_range;
    plan.server_port = server_port_;
    plan.runs_as = identity(target);
    return plan;
  }

  // An instance whose commands each get a fresh sandbox: the records of its held network.
  NetworkPlan held_plan(const Target& target) const {
    NetworkPlan plan = network_plan(target);
    plan.state_dir = held_network_dir(target.state_dir);
    return plan;
  }

  // A held namespace ends after this without commands: the instances' idle stop, else 10 minutes
  // (starting one again costs a pasta start, ~12-100 ms).
  std::chrono::seconds held_idle() const { return std::chrono::seconds(ns_.idle_stop > 0 ? ns_.idle_stop : 600); }

  // The network namespace a fresh sandbox of `target` joins: held for `nat` and `filtered` (it is
  // served from outside), and for `off` only while one is held (a switch from another mode); none
  // for `host`, nor for `off` otherwise (the sandbox unshares its own).
  std::optional<HeldNetwork> held_network_for(const Target& target) {
    // A sandbox of no instance (doctor's) has no state folder: its own namespace, if any.
    if (target.network == config::Network::host || target.state_dir.empty()) return std::nullopt;
    const NetworkPlan plan = held_plan(target);
    // `off` needs no namespace of its own unless one is held, or ports are exposed (a server of
    // a later command must be where they lead).
    if (target.network == config::Network::off && !find_held_network(plan) && sandbox::exposed_ports(plan).empty())
      return std::nullopt;
    fs::make_dirs(target.state_dir, 0700);
    return hold_network(plan, held_idle(), leftovers_);
  }

  // What served the network of the instance's last sandbox (pasta outlives it) is ended.
  void end_network_of(const Target& target) const {
    try {
      end_network(network_plan(target));
    } catch (const std::exception& e) {
      log::warn("instance {}: ending what served its network: {}", target.instance_id, e.what());
    }
  }

  static void write_end(const Target& target, std::string_view why) {
    nlohmann::json end = {{"why", why}, {"at_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                                       std::chrono::system_clock::now().time_since_epoch())
                                                       .count()}};
    fs::atomic_write(target.state_dir / kLivingEnd, end.dump() + "\n", 0600);
  }

  static std::optional<std::pair<std::string, LivingStatus::TimePoint>> read_end(const Target& target) {
    const auto text = fs::read_file(target.state_dir / kLivingEnd);
    if (!text) return std::nullopt;
    auto end = parse_json_or_discarded(*text);
    if (!end.is_object() || !end.contains("why") || !end["why"].is_string() || !end.contains("at_ms") ||
        !end["at_ms"].is_number_integer())
      return std::nullopt;
    return std::make_pair(end["why"].get<std::string>(),
                          LivingStatus::TimePoint(std::chrono::milliseconds(end["at_ms"].get<std::int64_t>())));
  }

  // The living sandbox of `target`, started when it does not run (under the instance's lock, so
  // two processes never start two), step by step.
  Living ensure_living(const Target& target) {
    leftovers_.reap_ended();
    if (Living found = find_living(target); found.running) return found;
    Steps step("living", target.instance_id);
    step("lock");
    fs::make_dirs(target.state_dir, 0700);
    fs::FileLock lock(target.state_dir / kLivingLock);
    if (Living found = find_living(target); found.running) {
      return found;
    } else if (found.unreadable) {
      // Never a second sandbox beside one this server cannot see.
      throw Error(fmt::format("instance '{}': {} ({}); it is left alone", target.instance_id,
                              unreadable_living(*found.unreadable), (target.state_dir / kLivingHandleFile).string()));
    }
    step("check network");
    end_network_of(target);  // what served an earlier sandbox (pasta outlives it)
    if (target.network == config::Network::nat)
      if (auto why = network::nat_unavailable())
        throw NeedsAction(NeedsAction::Action::choose_network,
                          fmt::format("instance '{}': network 'nat' cannot work here: {}", target.instance_id, *why),
                          target.instance_id);
    step("records");
    LivingRecords records = new_living_records(target);
    step("start sandbox");
    RunSpec spec = living_main_spec(target, records);
    std::unique_ptr<Cgroup> group = living_group(target.cgroup_folder);
    if (group) {
      spec.join_cgroups = group->procs_fds();
      spec.cgroup = group.get();
    }
    auto process = start_fresh(spec);
    if (group) group->keep();  // the sandbox outlives this call (and the server): stop_living removes it
    detach(*process);
    log::info("instance {}: living sandbox started (init pid {})", target.instance_id, process->sandbox_pid());
    // From here a sandbox that does not come up, or whose network is not what the instance asks
    // for, never runs.
    Living found;
    RollbackOnFailure end_it([&] {
      if (found.init) {
        signal_pidfd(found.init.get(), SIGKILL);
        wait_pidfd(found.init.get(), std::chrono::seconds(5));
      }
      end_network_of(target);
    });
    step("wait until ready");
    wait_until_ready(target, found);
    if (target.network != config::Network::host) {
      step("serve network");
      serve_network(network_plan(target), *found.status.child_pid(), leftovers_);
    }
    if (target.on_start) {
      step("on start");
      run_on_start(target);
    }
    step.done();
    return found;
  }

  // The target's command for each start of its living sandbox (a desktop's session), joined as
  // any command once the sandbox is up. Logged when it fails; the sandbox serves either way.
  void run_on_start(const Target& target) {
    try {
      ExecSpec spec;
      spec.target = target;
      spec.argv = target.on_start->argv;
      CaptureOptions options;
      options.input = target.on_start->input;
      options.timeout = target.on_start->timeout;
      options.output_cap = 64 * 1024;
      const CaptureResult result = capture(*this, std::move(spec), options);
      if (result.ending != Ending::finished || result.status.exit_code != 0)
        log::warn("instance {}: what its sandbox runs at each start failed ({}): {}", target.instance_id,
                  result.ending == Ending::timed_out ? "timed out" : fmt::format("exit {}", result.status.exit_code),
                  text::truncate_utf8(text::sanitize_utf8(text::trim(result.err)), 500));
    } catch (const std::exception& e) {
      log::warn("instance {}: what its sandbox runs at each start did not run: {}", target.instance_id, e.what());
    }
  }

  // A new start's records: the status file (a new file, never the old one truncated: the keeper
  // of a sandbox that just stopped may still append its last document to the file it holds), the
  // handle naming it, the busy file; the last stop's reason forgotten.
  struct LivingRecords {
    UniqueFd status, busy;
  };
  static LivingRecords new_living_records(const Target& target) {
    LivingRecords records;
    const stdfs::path status_path = target.state_dir / kLivingStatus;
    ::unlink(status_path.c_str());
    records.status.reset(::open(status_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!records.status) throw SysError(errno, "create", status_path.string());
    write_living_handle(target.state_dir,
                        ExecutionHandle{kName, ExecutionHandle::kVersion, {{"status_path", status_path.string()}}});
    records.busy = open_busy(target);
    ::unlink((target.state_dir / kLivingEnd).c_str());
    return records;
  }

  // The sandbox's main process only waits and reaps, as pid 1 (nothing inside can kill it):
  // everything else joins it. Its keeper stops it after the idle time.
  RunSpec living_main_spec(const Target& target, const LivingRecords& records) const {
    RunSpec spec;
    spec.target = target;
    spec.target.persistent = false;
    spec.argv = {"/bin/bash", "-c", kLivingMain};
    spec.living_main = true;
    spec.die_with_caller = false;
    spec.status_file = records.status.get();
    spec.busy_file = records.busy.get();
    spec.idle_stop = std::chrono::seconds(target.idle_stop.value_or(ns_.idle_stop));
    spec.limits.wall_time_grace = std::chrono::seconds(5);
    return spec;
  }

  // bwrap reports the init before it has finished setting the sandbox up (its own user namespace
  // comes last): ready once the init runs the main command. `found` is the sandbox as last seen.
  static void wait_until_ready(const Target& target, Living& found) {
    found = find_living(target);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (found.running && !runs_main_command(*found.status.child_pid()) && std::chrono::steady_clock::now() < until) {
      ::usleep(500);
      found = find_living(target);
    }
    if (!found.running || !runs_main_command(*found.status.child_pid()))
      throw NeedsAction(NeedsAction::Action::check_host,
                        fmt::format("the living sandbox of instance '{}' ended or did not come up as it started",
                                    target.instance_id),
                        target.instance_id);
  }

  // The main process runs its loop (its sleep has started): the sandbox's setup is done.
  static bool runs_main_command(pid_t init) {
    const std::vector<pid_t> children = proc::read_children(init);
    if (children.empty()) return false;
    try {
      const std::optional<proc::Stat> child = proc::read_stat(children.front());
      return child && child->comm == "sleep";
    } catch (const SysError&) {
      return false;
    }
  }

  static UniqueFd open_busy(const Target& target) {
    const stdfs::path path = target.state_dir / kLivingBusy;
    UniqueFd busy(::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!busy) throw SysError(errno, "open", path.string());
    return busy;
  }

  // A running living sandbox, ready to join: its namespaces opened once and kept while its
  // init lives (checked through its pidfd at every use).
  struct Joinable {
    pid_t init = 0;
    std::uint64_t pid_ns = 0;
    UniqueFd init_pidfd;
    SandboxNamespaces namespaces;
  };

  // A command (or, behind a keeper, a job) in the living sandbox, step by step.
  std::unique_ptr<Process> join_living(const RunSpec& spec) {
    Steps step("join", spec.target.instance_id);
    step("check command");
    check_command(spec.argv, spec.cwd);
    step("find sandbox");
    leftovers_.reap_ended();
    const std::shared_ptr<const Joinable> sandbox = joinable(spec.target);
    step("mark busy");
    UniqueFd busy = mark_busy(spec.target);
    if (needs_keeper(spec)) {  // a job: its keeper joins the sandbox and outlives this call
      step("start keeper");
      return start_fresh(keeper_job(spec, *sandbox, busy.get()));
    }
    step("describe");
    JoinLaunch launch = describe_join(spec, sandbox->namespaces);
    step("command group");
    CommandGroup group = command_group(spec, launch.setup);
    step("join");
    if (log::enabled(log::Level::debug))
      log::debug("sandbox {}: joining the living sandbox (init pid {}) with {}", spec.target.instance_id,
                 sandbox->init, text::shell_join(spec.argv));
    // A command that could not be executed was left to this process (a subreaper) when its
    // joiner was ended: a zombie in the sandbox's ps until reaped.
    RollbackOnFailure reap_failed([&] { reap_adopted(sandbox->pid_ns); });
    std::optional<Joined> joined;
    if (std::optional<PreparedJoiner> awaiting = take_awaiting(spec.target, *sandbox, group.in)) {
      joined = join_prepared(*awaiting, launch.setup);
      if (!joined) dismiss(std::move(*awaiting));
    }
    if (!joined) joined = join_sandbox(launch.setup);
    step.done();
    auto process = std::make_unique<JoinedProcess>(std::move(*joined), std::move(busy), group.in,
                                                   std::move(group.own), spec.target.cgroup_folder, leftovers_);
    // Once it is done (the server answering meanwhile), a joiner for the next command like it.
    if (launch.setup.flat && serving_)
      if (std::optional<Preparation> next = next_preparation(spec))
        process->then([this, alive = std::weak_ptr<const bool>(alive_), next = std::move(*next)] {
          if (!alive.lock()) return;  // never on a backend that is gone
          try {
            request_preparation(next);
          } catch (const std::exception& e) {  // (no thread to be had: the next command joins as usual)
            log::debug("instance {}: no joiner prepared for its next command: {}", next.target.instance_id, e.what());
          }
        });
    return process;
  }

  // The instance is in use while this is held (shared): its keeper's idle stop waits.
  static UniqueFd mark_busy(const Target& target) {
    UniqueFd busy = open_busy(target);
    ::flock(busy.get(), LOCK_SH);
    ::futimens(busy.get(), nullptr);
    return busy;
  }

  // A job of a living instance: a fresh launch of its keeper, which joins the sandbox itself.
  static RunSpec keeper_job(const RunSpec& spec, const Joinable& sandbox, int busy) {
    RunSpec job = spec;
    job.target.persistent = false;
    job.join_init = sandbox.init;
    job.join_pid_ns = sandbox.pid_ns;
    job.busy_file = busy;
    return job;
  }

  // What a joined command is given: its words, environment, folder, descriptors, limits,
  // identity and filter (JoinSetup), with the descriptors it borrows kept here.
  struct JoinLaunch {
    UniqueFd null_fd;
    UniqueFd script;
    JoinSetup setup;
  };

  JoinLaunch describe_join(const RunSpec& spec, const SandboxNamespaces& namespaces) {
    JoinLaunch launch;
    launch.null_fd.reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
    if (!launch.null_fd) throw SysError(errno, "open", "/dev/null");
    auto or_null = [&](int fd) { return fd >= 0 ? fd : launch.null_fd.get(); };
    JoinSetup& setup = launch.setup;
    setup.namespaces = &namespaces;
    setup.argv = spec.argv;
    setup.envp = build_sandbox_env(ns_, spec, host_env);
    setup.cwd = spec.cwd.empty() ? ns_.workspace_mount : spec.cwd;
    setup.fds = {{or_null(spec.stdio.in), 0}, {or_null(spec.stdio.out), 1}, {or_null(spec.stdio.err), 2}};
    if (auto command = shell_script_of(spec.argv)) {
      launch.script = script_fd(*command);
      setup.fds.emplace_back(launch.script.get(), kChildFds.script);
      setup.argv = {spec.argv[0], "-c", fmt::format(". /dev/fd/{}", kChildFds.script)};
    }
    setup.join_cgroups = spec.join_cgroups;
    setup.rlimits = rlimits(spec.limits);
    setup.drop_to = identity(spec.target);
    if (ns_.hardening && ns_.seccomp) setup.seccomp_bpf = seccomp_bpf();
    if (spec.target.image) setup.keep_caps = image_capability_mask();
    setup.controlling_tty = spec.terminal;
    setup.own_terminal = spec.terminal;
    setup.discard_after_release = spec.output_readers;
    return launch;
  }

  // The group a joined command's tree is killed through: the caller's, else one of its own.
  struct CommandGroup {
    Cgroup* in = nullptr;         // the group it runs in; null: a pid namespace of its own
    std::unique_ptr<Cgroup> own;  // made here for it (a person's command)
    UniqueFd kill_file;           // the group's cgroup.kill
  };

  // As root, the command's cgroup kills its tree, and it runs in the sandbox's own pid namespace
  // (flat): a later command's ps and kill reach what it left running. Elsewhere (a normal user
  // without delegated cgroups) a pid namespace of its own does.
  CommandGroup command_group(const RunSpec& spec, JoinSetup& setup) {
    CommandGroup group;
    if (drop_to_ && use_cgroups_) {
      group.in = spec.cgroup;
      if (!group.in) {
        try {
          std::vector<std::string> unenforced;
          group.own = Cgroup::create(spec.target.cgroup_folder + "/cmd-" + random::hex(6), {}, unenforced);
          if (group.own && group.own->paths().empty()) group.own.reset();
          if (group.own)
            for (int fd : group.own->procs_fds()) setup.join_cgroups.push_back(fd);
          group.in = group.own.get();
        } catch (const std::exception& e) {
          log::debug("sandbox {}: no cgroup for the command ({}); it gets a pid namespace of its own",
                     spec.target.instance_id, e.what());
        }
      }
      if (group.in) group.kill_file.reset(group.in->open_kill_file_fd());
      if (!group.kill_file) {
        group.in = nullptr;
        if (group.own) {
          setup.join_cgroups.clear();
          group.own.reset();
        }
      }
    }
    setup.flat = static_cast<bool>(group.kill_file);
    setup.kill_file = group.kill_file.get();
    if (setup.flat) {
      // The joiner is made in the group's v2 part, and joins the v1 parts through `tasks`.
      try {
        if (const int v2 = group.in->v2_dir_fd(); v2 >= 0) {
          setup.cgroup_dir = v2;
          setup.join_cgroups = group.in->v1_procs_fds();
        }
      } catch (const std::exception& e) {
        log::debug("sandbox {}: the command joins its cgroup through cgroup.procs: {}", spec.target.instance_id,
                   e.what());
      }
    }
    return group;
  }

  // ---- Prepared joiners (sandbox/join.hpp) ----------------------------------------------------
  // After a command of a living instance joins its sandbox flat, a joiner for the next command
  // like it is prepared on a thread of its own: a group made with the same limits, given to the
  // spare groups under the same key with the joiner waiting in it. The next such command takes
  // that group (CgroupPool prefers it) and the joiner in it starts the command; any other finds
  // none waiting and joins as before. One per instance; dismissed when its sandbox ends.

  struct Awaiting {
    PreparedJoiner joiner;
    pid_t init = 0;         // of the sandbox it joined
    stdfs::path group;      // the first path of the group it waits in
  };
  struct Preparation {
    Target target;
    std::string key;        // RunSpec::cgroup_key
    std::shared_ptr<const CgroupLimits> limits;
    std::string name;       // of the group to make: <instance folder>/<kind>-
  };

  // The joiner waiting in `group` for a command of the sandbox `sandbox`, if there is one.
  std::optional<PreparedJoiner> take_awaiting(const Target& target, const Joinable& sandbox, const Cgroup* group) {
    if (!group || group->paths().empty()) return std::nullopt;
    std::lock_guard lock(mutex_);
    auto it = awaiting_.find(target.state_dir.string());
    if (it == awaiting_.end() || it->second.init != sandbox.init || it->second.group != group->paths().front())
      return std::nullopt;
    PreparedJoiner joiner = std::move(it->second.joiner);
    awaiting_.erase(it);
    return joiner;
  }

  // Ends an unused joiner: its socket closed, it exits (and is reaped with the leftovers, where
  // it went when it was made: it also ends by itself, when its sandbox does).
  static void dismiss(PreparedJoiner joiner) { joiner.control.reset(); }

  void dismiss_awaiting(const Target& target) {
    std::optional<PreparedJoiner> joiner;
    {
      std::lock_guard lock(mutex_);
      auto it = awaiting_.find(target.state_dir.string());
      if (it == awaiting_.end()) return;
      joiner = std::move(it->second.joiner);
      awaiting_.erase(it);
    }
    dismiss(std::move(*joiner));
  }

  // What a joiner for the next command like `spec` needs (a command that keeps its groups in
  // the spare groups); nullopt for any other.
  static std::optional<Preparation> next_preparation(const RunSpec& spec) {
    if (spec.cgroup_key.empty() || !spec.cgroup_limits || !spec.cgroup || spec.cgroup->paths().empty() ||
        spec.terminal)
      return std::nullopt;
    const std::string leaf = spec.cgroup->paths().front().filename().string();
    const auto dash = leaf.find('-');
    if (dash == std::string::npos) return std::nullopt;
    return Preparation{spec.target, spec.cgroup_key, spec.cgroup_limits,
                       spec.target.cgroup_folder + "/" + leaf.substr(0, dash + 1)};
  }

  // Has the preparer make it, unless a joiner waits for the instance already.
  void request_preparation(const Preparation& next) {
    {
      std::lock_guard lock(mutex_);
      if (awaiting_.count(next.target.state_dir.string())) return;
    }
    std::lock_guard lock(preparing_mutex_);
    if (stopping_) return;
    for (const Preparation& queued : preparing_)
      if (queued.target.state_dir == next.target.state_dir) return;
    preparing_.push_back(next);
    if (!preparer_.joinable()) preparer_ = std::thread([this] { run_preparer(); });
    preparing_cv_.notify_one();
  }

  void run_preparer() {
    for (;;) {
      Preparation job;
      {
        std::unique_lock lock(preparing_mutex_);
        preparing_cv_.wait(lock, [&] { return stopping_ || !preparing_.empty(); });
        if (stopping_) return;
        job = std::move(preparing_.front());
        preparing_.pop_front();
      }
      try {
        prepare(job);
      } catch (const std::exception& e) {
        log::debug("instance {}: no joiner prepared for its next command: {}", job.target.instance_id, e.what());
      }
    }
  }

  // The group of the next command, made now, with a joiner waiting in it.
  void prepare(const Preparation& job) {
    Steps step("prepare", job.target.instance_id);
    step("find sandbox");
    const std::string key = job.target.state_dir.string();
    std::shared_ptr<const Joinable> sandbox;
    {
      std::lock_guard lock(mutex_);
      if (awaiting_.count(key)) return;
      auto it = joinable_.find(key);
      if (it == joinable_.end()) return;
      sandbox = it->second;
    }
    if (wait_pidfd(sandbox->init_pidfd.get(), std::chrono::milliseconds(0))) return;
    step("group");  // a spare one of an earlier command, else a new one
    CgroupPool::Spare spare;
    if (auto taken = spare_groups_.take(job.key)) {
      spare = std::move(*taken);
    } else {
      spare.group = Cgroup::create(job.name + random::hex(6), *job.limits, spare.unenforced);
      if (spare.group->paths().empty()) return;
    }
    std::unique_ptr<Cgroup>& group = spare.group;
    JoinSetup setup;
    setup.namespaces = &sandbox->namespaces;
    setup.drop_to = identity(job.target);
    if (ns_.hardening && ns_.seccomp) setup.seccomp_bpf = seccomp_bpf();
    if (job.target.image) setup.keep_caps = image_capability_mask();
    setup.flat = true;
    const UniqueFd kill_file(group->open_kill_file_fd());
    if (!kill_file) return;  // (the group goes with it)
    setup.kill_file = kill_file.get();
    if (const int v2 = group->v2_dir_fd(); v2 >= 0) {
      setup.cgroup_dir = v2;
      setup.join_cgroups = group->v1_procs_fds();
    } else {
      setup.join_cgroups = group->procs_fds();
    }
    step("fork");
    PreparedJoiner joiner = prepare_joiner(setup, sandbox->init_pidfd.get());
    leftovers_.add(UniqueFd(::fcntl(joiner.pidfd.get(), F_DUPFD_CLOEXEC, 3)));
    const stdfs::path path = group->paths().front();
    spare.awaited = true;
    spare_groups_.give(job.key, std::move(spare));
    std::optional<PreparedJoiner> replaced;
    {
      std::lock_guard lock(mutex_);
      auto& slot = awaiting_[key];
      if (slot.joiner.pidfd) replaced = std::move(slot.joiner);
      slot = Awaiting{std::move(joiner), sandbox->init, path};
    }
    if (replaced) dismiss(std::move(*replaced));
  }

  // Removes the groups the instance's commands kept and the living sandbox's, then the
  // instance's own folder, waiting a little for their last members.
  static void eventually_remove_groups(const std::string& folder, int attempts = 50) {
    for (int attempt = 0; attempt < attempts; ++attempt) {
      try {
        if (Cgroup::remove_empty(folder, "term-") + Cgroup::remove_empty(folder, "cmd-") +
                    Cgroup::remove_empty(folder, kLivingGroup) ==
                0) {
          Cgroup::remove_folder(folder);  // stays while a job's group is below it
          return;
        }
      } catch (const std::exception&) {
        return;
      }
      if (attempt + 1 < attempts) ::usleep(20000);
    }
  }

  bool instance_limited() const {
    const CgroupLimits limits = cgroup_limits(ns_.limits);
    return use_cgroups_ && (limits.cpus || limits.memory_bytes || limits.pids);
  }

  // [namespace] limits on the instance's group, re-written before each of its executions (so a
  // changed configuration reaches a running instance with its next command).
  void limit_instance(const std::string& folder) const {
    if (!use_cgroups_ || folder.empty()) return;
    if (!instance_limited()) {
      // Nothing to write but "unlimited" (a limit configured before may still be on the
      // folder): once per instance in this process. A folder made again meanwhile has none.
      std::lock_guard lock(limited_mutex_);
      if (!unlimited_.insert(folder).second) return;
    }
    try {
      for (const std::string& why : apply_instance_limits(ns_.limits, folder, use_cgroups_))
        log::debug("instance {}: [namespace] limits not enforced: {}", folder, why);
    } catch (const std::exception& e) {
      log::debug("instance {}: [namespace] limits not applied: {}", folder, e.what());
    }
  }

  // The group of a living sandbox's own processes (keeper, bwrap, its main process): a leaf
  // below the instance's folder, which holds no process itself. Only under [namespace] limits:
  // those few processes need no group otherwise (the commands and jobs have theirs), and moving
  // a process into a cgroup v1 group waits for an RCU grace period (measured here: up to ~9 ms
  // on an idle host), which every start would pay. Null without cgroups.
  std::unique_ptr<Cgroup> living_group(const std::string& folder) const {
    if (!instance_limited()) return nullptr;
    limit_instance(folder);
    try {
      std::vector<std::string> unenforced;
      auto group = Cgroup::create(folder + "/" + kLivingGroup, {}, unenforced);
      if (!group->paths().empty()) return group;
    } catch (const std::exception& e) {
      log::debug("instance {}: the living sandbox gets no cgroup of its own: {}", folder, e.what());
    }
    return nullptr;
  }

  std::shared_ptr<const Joinable> joinable(const Target& target) {
    const std::string key = target.state_dir.string();
    {
      std::lock_guard lock(mutex_);
      auto it = joinable_.find(key);
      if (it != joinable_.end()) {
        if (!wait_pidfd(it->second->init_pidfd.get(), std::chrono::milliseconds(0))) return it->second;
        joinable_.erase(it);
      }
    }
    dismiss_awaiting(target);  // it joined a sandbox that has ended
    auto entry = std::make_shared<Joinable>();
    for (int attempt = 0;; ++attempt) {
      Living found = ensure_living(target);
      entry->init = *found.status.child_pid();
      entry->pid_ns = *found.status.pid_namespace();
      try {
        entry->namespaces = open_sandbox_namespaces(entry->init, entry->pid_ns);
      } catch (const SysError& e) {
        // It ended just now (stopped by another process, or it died): once more, which starts
        // it again.
        if (e.code() != ESRCH || attempt > 0) throw;
        continue;
      }
      entry->init_pidfd = std::move(found.init);
      break;
    }
    std::lock_guard lock(mutex_);
    joinable_[key] = entry;
    return entry;
  }

  // A keeper that outlives this handle (a living sandbox's): reaped here later, or by whoever
  // inherits it when this process ends.
  void detach(Process& process) {
    UniqueFd fd(::fcntl(process.pidfd(), F_DUPFD_CLOEXEC, 3));
    process.disown();
    leftovers_.add(std::move(fd));
  }

  // A fresh sandbox, step by step: bwrap (behind a keeper when it must outlive its caller or has
  // a wall-time limit) started on descriptors opened here.
  std::unique_ptr<Process> start_fresh(const RunSpec& spec, const HeldNetwork* held = nullptr) {
    Steps step("fresh", spec.target.instance_id);
    FreshLaunch launch;
    launch.keeper = needs_keeper(spec);
    step("command line");
    describe_fresh(spec, launch);
    step("open folders");
    open_folders(spec, launch);
    step("descriptors");
    give_descriptors(spec, launch);
    if (spec.target.image && spec.living_main) {
      step("image root");
      enter_image_in_child(*spec.target.image, launch);
    }
    if (held) join_network_in_child(*held, launch.setup);
    step("command group");
    fresh_command_group(spec, launch);
    step("spawn");
    if (log::enabled(log::Level::debug))
      log::debug("sandbox {}: starting {}", spec.target.instance_id, text::shell_join(launch.setup.argv));
    Child child = spawn(launch.setup);
    launch.status.write.reset();
    auto process = std::make_unique<BwrapProcess>(std::move(child), launch.keeper, std::move(launch.status.read),
                                                  launch.status_is_file);
    if (launch.group) process->own_group(std::move(launch.group));
    step.done();
    return process;
  }

  // A fresh launch under way: the child's setup and the descriptors it borrows until the spawn.
  struct FreshLaunch {
    bool keeper = false;
    ChildSetup setup;
    UniqueFd store_audit, workspace, output, shared, seccomp, null_fd, script;
    Pipe status;
    bool status_is_file = false;
    ImageRootSetup image_root;
    std::unique_ptr<Cgroup> group;  // made here for a command that brings none
  };

  // What is executed: bwrap's argv, or the keeper's (this very binary: executed through
  // /proc/self/exe it needs no path the sandbox uid can search, and is the same version as the
  // server even during an upgrade), behind the command prefix if any; the environment; the
  // identity; rlimits and cgroups.
  void describe_fresh(const RunSpec& spec, FreshLaunch& launch) const {
    ChildSetup& setup = launch.setup;
    // A keeper says in the store's audit log when it ends a sandbox whose record was removed.
    if (launch.keeper) launch.store_audit = open_store_audit(spec.target);
    std::vector<std::string> argv;
    if (launch.keeper) {
      KeeperOptions options = keeper_options(spec);
      if (!launch.store_audit) options.audit_fd = -1;
      argv = keeper_argv(self_path(), options);
      setup.program = "/proc/self/exe";
    } else {
      argv = build_bwrap_argv(ns_, spec, fd_numbers(spec), argv_options());
      setup.program = argv.front();
    }
    setup.argv = std::move(argv);
    if (!spec.command_prefix.empty()) {
      auto prefix = fs::find_program(spec.command_prefix.front());
      if (!prefix)
        throw Error(fmt::format("'{}' ([jobs.local] cgroups_command) not found or not executable",
                                spec.command_prefix.front()));
      setup.program = *prefix;  // which then executes argv[0] by its path
      setup.argv.insert(setup.argv.begin(), spec.command_prefix.begin(), spec.command_prefix.end());
    }
    setup.envp = build_sandbox_env(ns_, spec, host_env);
    setup.drop_to = identity(spec.target);
    setup.rlimits = rlimits(spec.limits);
    setup.controlling_tty = spec.terminal;
    setup.die_with_parent = spec.die_with_caller;
    setup.join_cgroups = spec.join_cgroups;
  }

  // The instance's folders, checked reachable by the sandbox uid and passed as descriptors opened
  // here (bwrap binds /proc/self/fd/N): the folder bound is the one checked, even if a path
  // component changes afterwards.
  void open_folders(const RunSpec& spec, FreshLaunch& launch) const {
    if (const std::optional<users::Identity>& drop_to = launch.setup.drop_to) {
      for (const stdfs::path& dir : {spec.target.workspace, spec.target.output}) {
        if (auto why = unreachable_for(dir, drop_to->uid, drop_to->gid))
          throw Error(fmt::format(
              "the sandbox uid {} cannot reach {}: {}; keep namespace.instances_dir in a folder it can "
              "pass through (as root the default is {}) or change namespace.sandbox_uid",
              drop_to->uid, dir.string(), *why, config::kRootInstancesDir));
      }
    }
    launch.workspace = open_instance_dir(spec.target.workspace, "workspace");
    launch.output = open_instance_dir(spec.target.output, "output");
    if (ns_.shared_output) launch.shared = open_instance_dir(spec.target.shared_output_root, "shared output");
  }

  // The child's descriptors, by number: stdio (/dev/null for none), the status (a pipe, or the
  // caller's file), the folders, the seccomp filter, the busy file, the audit log, and a shell
  // command's script (on a descriptor, not in an argv that every local user can read).
  void give_descriptors(const RunSpec& spec, FreshLaunch& launch) {
    if (ns_.hardening && ns_.seccomp) launch.seccomp = seccomp_program_fd(seccomp_bpf());
    launch.status_is_file = spec.status_file >= 0;
    if (launch.status_is_file) {
      launch.status.read.reset(::fcntl(spec.status_file, F_DUPFD_CLOEXEC, 3));
      if (!launch.status.read) throw SysError(errno, "dup", "status file");
    } else {
      launch.status = make_pipe();
    }
    launch.null_fd.reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
    if (!launch.null_fd) throw SysError(errno, "open", "/dev/null");
    auto or_null = [&](int fd) { return fd >= 0 ? fd : launch.null_fd.get(); };
    auto& fds = launch.setup.fds;
    fds = {{or_null(spec.stdio.in), 0},
           {or_null(spec.stdio.out), 1},
           {or_null(spec.stdio.err), 2},
           {launch.status_is_file ? spec.status_file : launch.status.write.get(), kChildFds.status},
           {launch.workspace.get(), kChildFds.workspace},
           {launch.output.get(), kChildFds.output}};
    if (launch.seccomp) fds.emplace_back(launch.seccomp.get(), kChildFds.seccomp);
    if (launch.shared) fds.emplace_back(launch.shared.get(), kChildFds.shared_output);
    if (spec.busy_file >= 0) fds.emplace_back(spec.busy_file, kChildFds.busy);
    if (launch.store_audit) fds.emplace_back(launch.store_audit.get(), kStoreAuditFd);
    if (auto command = shell_script_of(spec.argv)) {
      launch.script = script_fd(*command);
      fds.emplace_back(launch.script.get(), kChildFds.script);
    }
  }

  // An image instance's living sandbox starts on the instance's root, as its uid 0: the child
  // mounts it in a mount namespace of its own and joins the instance's user namespace itself.
  static void enter_image_in_child(const ImageRoot& image, FreshLaunch& launch) {
    ImageRootSetup& root = launch.image_root;
    root = prepare_image_root(image);
    root.userns_fd = kImageUsernsFd;
    root.root_fd = kChildFds.root;
    if (root.tree) {  // as root: the idmapped image
      root.tree_fd = kImageTreeFd;
      launch.setup.fds.emplace_back(root.tree.get(), kImageTreeFd);
    }
    launch.setup.fds.emplace_back(root.userns.get(), kImageUsernsFd);
    launch.setup.in_child = [&root](const char** step) { return enter_image_root(root, step); };
    launch.setup.drop_to.reset();
  }

  // An instance whose commands each get a fresh sandbox: the child joins its held network
  // namespace (images are persistent: never both).
  static void join_network_in_child(const HeldNetwork& held, ChildSetup& setup) {
    setup.fds.emplace_back(held.ns.net.get(), kHeldNetFd);
    int userns = -1;
    if (held.ns.userns) {
      setup.fds.emplace_back(held.ns.userns.get(), kHeldUsernsFd);
      userns = kHeldUsernsFd;
    }
    setup.in_child = [userns](const char** step) { return join_held_network(userns, step); };
  }

  // Under [namespace] limits, a command that brings no group (a person's) gets one below the
  // instance's, so that the instance's limits hold for it as well. The group's v2 part is joined
  // as the child is made (SpawnSpec::cgroup_dir).
  void fresh_command_group(const RunSpec& spec, FreshLaunch& launch) const {
    ChildSetup& setup = launch.setup;
    if (spec.join_cgroups.empty() && spec.die_with_caller && instance_limited()) {
      try {
        std::vector<std::string> unenforced;
        launch.group = Cgroup::create(spec.target.cgroup_folder + "/cmd-" + random::hex(6), {}, unenforced);
        if (launch.group->paths().empty())
          launch.group.reset();
        else
          setup.join_cgroups = launch.group->procs_fds();
      } catch (const std::exception& e) {
        log::debug("sandbox {}: no cgroup for the command ({})", spec.target.instance_id, e.what());
      }
    }
    if (Cgroup* in = launch.group ? launch.group.get() : spec.cgroup; in && !setup.join_cgroups.empty()) {
      try {
        if (const int v2 = in->v2_dir_fd(); v2 >= 0) {
          setup.cgroup_dir = v2;
          setup.join_cgroups = in->v1_procs_fds();
        }
      } catch (const std::exception& e) {
        log::debug("sandbox {}: the sandbox joins its cgroup through cgroup.procs: {}", spec.target.instance_id, e.what());
      }
    }
  }

  static bool needs_keeper(const RunSpec& spec) {
    return !spec.die_with_caller || spec.limits.wall_time || spec.join_init > 0;
  }

  // bwrap under a keeper always dies with its parent, the keeper: the sandbox ends with its
  // main command or with the keeper, never orphaned.
  KeeperOptions keeper_options(const RunSpec& spec) const {
    RunSpec bwrap_spec = spec;
    bwrap_spec.die_with_caller = true;
    KeeperOptions options;
    options.status_fd = kChildFds.status;
    options.time_limit = spec.limits.wall_time.value_or(std::chrono::milliseconds(0));
    options.grace = spec.limits.wall_time_grace;
    if (spec.busy_file >= 0) options.busy_fd = kChildFds.busy;
    options.idle_stop = spec.idle_stop;
    if (!spec.target.store_audit_log.empty()) options.audit_fd = kStoreAuditFd;
    options.instance_id = spec.target.instance_id;
    if (spec.join_init > 0) {
      // A job in a living instance: the keeper joins it and runs the command itself.
      options.join_init = spec.join_init;
      options.join_pid_ns = spec.join_pid_ns;
      options.join_cwd = spec.cwd.empty() ? ns_.workspace_mount : spec.cwd;
      if (ns_.hardening && ns_.seccomp) options.seccomp_fd = kChildFds.seccomp;
      if (spec.target.image) options.keep_caps = image_capability_mask();
      options.bwrap_argv = spec.argv;
      if (shell_script_of(spec.argv))
        options.bwrap_argv = {spec.argv[0], "-c", fmt::format(". /dev/fd/{}", kChildFds.script)};
      return options;
    }
    options.bwrap_argv = build_bwrap_argv(ns_, bwrap_spec, fd_numbers(spec), argv_options());
    return options;
  }

  // This binary's path (the keeper's argv[0], and what a command_prefix executes).
  std::string self_path() const {
    std::lock_guard lock(mutex_);
    if (self_path_.empty()) self_path_ = fs::self_program("for the job keeper");
    return self_path_;
  }

  // Whom a sandbox of `target` runs as on the host (sandbox.hpp: host_identity).
  std::optional<users::Identity> identity(const Target& target) const { return host_identity(target, drop_to_); }

  FdNumbers fd_numbers(const RunSpec& spec) const {
    FdNumbers fds = kChildFds;
    if (!(spec.target.image && spec.living_main)) fds.root = -1;
    if (!shell_script_of(spec.argv)) fds.script = -1;
    if (!(ns_.hardening && ns_.seccomp)) fds.seccomp = -1;
    if (!ns_.shared_output) fds.shared_output = -1;
    return fds;
  }

  // Resolved on first use (not with std::call_once: an exception escaping it aborts with a
  // statically linked libstdc++, GCC bug 66146).
  ArgvOptions argv_options() const {
    std::lock_guard lock(mutex_);
    if (bwrap_path_.empty()) bwrap_path_ = find_bwrap(ns_.bwrap_command.at(0));
    return ArgvOptions{bwrap_path_, read_top_level_symlink};
  }

  std::string seccomp_bpf() {
    std::lock_guard lock(mutex_);
    if (seccomp_bpf_.empty()) seccomp_bpf_ = build_seccomp_bpf();
    return seccomp_bpf_;
  }

  // The store's audit log, for appending (created as audit::append does); none when the target
  // has no store, or when it cannot be opened (the keeper then ends an orphaned sandbox unsaid).
  static UniqueFd open_store_audit(const Target& target) {
    if (target.store_audit_log.empty()) return {};
    UniqueFd fd(::open(target.store_audit_log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) log::debug("{}: {}; a keeper of instance {} cannot write to it", target.store_audit_log.string(),
                        std::strerror(errno), target.instance_id);
    return fd;
  }

  static UniqueFd open_instance_dir(const stdfs::path& dir, std::string_view what) {
    try {
      return fs::open_dir_path(dir);
    } catch (const SysError& e) {
      throw e.wrapped(fmt::format("cannot open the instance's {} folder", what));
    }
  }

  static std::vector<std::pair<int, rlim_t>> rlimits(const Limits& limits) {
    std::vector<std::pair<int, rlim_t>> out;
    if (limits.cpu_seconds) out.emplace_back(RLIMIT_CPU, *limits.cpu_seconds);
    if (limits.file_size_bytes) out.emplace_back(RLIMIT_FSIZE, *limits.file_size_bytes);
    if (limits.open_files) out.emplace_back(RLIMIT_NOFILE, *limits.open_files);
    if (limits.address_space) out.emplace_back(RLIMIT_AS, *limits.address_space);
    return out;
  }

  config::Namespace ns_;
  config::NetworkPolicy net_;
  std::uint16_t server_port_;  // [server] port: never an exposed port's
  bool use_cgroups_ = true;  // [jobs.local] use_cgroups: off, commands of living instances get pid namespaces
  std::optional<users::Identity> drop_to_;
  mutable std::mutex mutex_;
  mutable std::string bwrap_path_;
  mutable std::string self_path_;
  mutable std::mutex share_pids_mutex_;
  mutable std::optional<bool> share_pids_;  // commands_share_pids(), once found out
  std::string seccomp_bpf_;
  Leftovers leftovers_;  // living sandboxes' keepers and commands' watchers started here, reaped once ended
  std::map<std::string, std::shared_ptr<const Joinable>> joinable_;  // by state folder
  mutable std::mutex limited_mutex_;
  mutable std::set<std::string> unlimited_;  // instances whose folder limit_instance() took limits off
  CgroupPool spare_groups_;                  // the groups of finished commands
  std::map<std::string, Awaiting> awaiting_;  // prepared joiners, by state folder (under mutex_)
  std::mutex preparing_mutex_;
  std::condition_variable preparing_cv_;
  std::deque<Preparation> preparing_;  // instances whose next command gets a prepared joiner
  bool stopping_ = false;
  std::thread preparer_;  // started with the first preparation
  std::atomic<bool> serving_ = false;  // expect_more_commands(): joiners are prepared
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);  // for what outlives a command
};

}  // namespace

std::unique_ptr<Backend> make_bwrap_backend(const config::Config& config) {
  return std::make_unique<BwrapBackend>(config);
}

}  // namespace nshpc::sandbox
