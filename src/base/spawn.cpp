#include "base/spawn.hpp"

#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/pidfd.hpp"

extern char** environ;

namespace nshpc {

namespace {

enum class Step : int { cgroup, dup, dup2, setsid, ctty, close, rlimit, setgroups, setgid, setuid,
                        pdeathsig, orphaned, chdir, exec, in_child };

const char* step_name(Step s) {
  switch (s) {
    case Step::cgroup: return "join the job's cgroup";
    case Step::dup: return "dup";
    case Step::dup2: return "dup2";
    case Step::setsid: return "setsid";
    case Step::ctty: return "set the controlling terminal";
    case Step::close: return "close_range";
    case Step::rlimit: return "setrlimit";
    case Step::setgroups: return "setgroups";
    case Step::setgid: return "setresgid";
    case Step::setuid: return "setresuid";
    case Step::pdeathsig: return "prctl(PR_SET_PDEATHSIG)";
    case Step::orphaned: return "start (the parent exited)";
    case Step::chdir: return "chdir";
    case Step::exec: return "execute";
    case Step::in_child: return "set up";
  }
  return "?";
}

struct Failure {
  int step;
  int err;
  const char* detail;  // Step::in_child: a string literal of this program (the same address in parent and child)
};

[[noreturn]] void fail(int error_fd, Step step, const char* detail = nullptr) {
  Failure f{static_cast<int>(step), errno, detail};
  ssize_t ignored = ::write(error_fd, &f, sizeof f);
  (void)ignored;
  ::_exit(127);
}

// Everything the child uses, made before the fork.
struct Prepared {
  const SpawnSpec& spec;
  const char* program;
  char* const* argv;
  char* const* envp;
  int* staged;         // one slot per spec.fds entry
  int highest_target;  // the highest child descriptor number asked for (at least 2)
  int error_fd;
  pid_t parent;
};

// The child's side: only async-signal-safe calls from here to execve.
[[noreturn]] void child_main(const Prepared& p) {
  const SpawnSpec& spec = p.spec;
  // Join the cgroups first, while the descriptors still have their parent-side numbers.
  for (int fd : spec.join_cgroups) {
    if (::write(fd, "0", 1) != 1) fail(p.error_fd, Step::cgroup);
  }
  // Move every descriptor above the targets first, so no dup2 below clobbers a source.
  int err_fd = p.error_fd;
  if (!spec.fds.empty() || spec.close_other_fds) {
    const int stage_base = p.highest_target + 2;
    for (size_t i = 0; i < spec.fds.size(); ++i) {
      p.staged[i] = ::fcntl(spec.fds[i].first, F_DUPFD, stage_base);
      if (p.staged[i] < 0) fail(err_fd, Step::dup);
    }
    err_fd = ::fcntl(p.error_fd, F_DUPFD_CLOEXEC, stage_base);
    if (err_fd < 0) fail(p.error_fd, Step::dup);
    for (size_t i = 0; i < spec.fds.size(); ++i) {
      if (::dup2(p.staged[i], spec.fds[i].second) < 0) fail(err_fd, Step::dup2);
    }
    if (spec.close_other_fds) {
      // Keep the error pipe just above the targets, close everything else: above them, and what
      // an ancestor left open between them (a descriptor it did not mark close-on-exec).
      if (::dup3(err_fd, p.highest_target + 1, O_CLOEXEC) < 0) fail(err_fd, Step::dup2);
      err_fd = p.highest_target + 1;
      if (::syscall(SYS_close_range, p.highest_target + 2, ~0U, 0) < 0) fail(err_fd, Step::close);
      for (int fd = 3; fd < p.highest_target; ++fd) {
        bool target = false;
        for (const auto& pair : spec.fds) target = target || pair.second == fd;
        if (!target) ::close(fd);
      }
    } else {
      for (size_t i = 0; i < spec.fds.size(); ++i) ::close(p.staged[i]);
    }
  }

  if (spec.new_session || spec.controlling_tty) {
    if (::setsid() < 0) fail(err_fd, Step::setsid);
  }
  if (spec.controlling_tty) {
    if (::ioctl(0, TIOCSCTTY, 0) < 0) fail(err_fd, Step::ctty);
  }
  for (const auto& [resource, value] : spec.rlimits) {
    struct rlimit rl{value, value};
    if (::setrlimit(resource, &rl) < 0) fail(err_fd, Step::rlimit);
  }
  if (spec.in_child) {
    const char* step = "";
    if (const int err = spec.in_child(&step); err != 0) {
      errno = err;
      fail(err_fd, Step::in_child, step);
    }
  }
  if (spec.drop_to) {
    // The system calls themselves: the library's wrappers change every thread of the process
    // it believes it has, and after clone3 it still believes the parent's.
    const auto [uid, gid] = *spec.drop_to;
    if (::syscall(SYS_setgroups, 0, nullptr) < 0) fail(err_fd, Step::setgroups);
    if (::syscall(SYS_setresgid, gid, gid, gid) < 0) fail(err_fd, Step::setgid);
    if (::syscall(SYS_setresuid, uid, uid, uid) < 0) fail(err_fd, Step::setuid);
  }
  // After the identity change, which would clear it.
  if (spec.die_with_parent != 0) {
    if (::prctl(PR_SET_PDEATHSIG, spec.die_with_parent) < 0) fail(err_fd, Step::pdeathsig);
    if (::getppid() != p.parent) {
      errno = ESRCH;
      fail(err_fd, Step::orphaned);
    }
  }
  if (!spec.cwd.empty() && ::chdir(spec.cwd.c_str()) < 0) fail(err_fd, Step::chdir);

  // The program starts as a fresh process would: no signal blocked or ignored.
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);

  ::execve(p.program, p.argv, p.envp);
  fail(err_fd, Step::exec);
}

}  // namespace

std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

SpawnedChild& SpawnedChild::operator=(SpawnedChild&& other) noexcept {
  if (this != &other) {
    kill_and_reap();
    pid_ = other.pid_;
    pidfd_ = std::move(other.pidfd_);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

void SpawnedChild::kill_and_reap() noexcept {
  if (!owned_) return;
  owned_ = false;
  if (pidfd_) {
    try {
      signal_pidfd(pidfd_.get(), SIGKILL);
    } catch (const std::exception&) {
    }
  } else {
    ::kill(pid_, SIGKILL);  // not reaped yet, so the pid is still this child's
  }
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

int SpawnedChild::wait(std::string_view what) {
  if (!owned_) throw SysError(ECHILD, "wait for", what);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0) {
    if (errno != EINTR) throw SysError(errno, "waitpid", what);
  }
  owned_ = false;
  return status;
}

SpawnedChild spawn(const SpawnSpec& spec) {
  if (spec.program.empty() || spec.argv.empty()) throw Error("spawn: no program given");
  std::string program = spec.program;
  if (program.find('/') == std::string::npos) {
    auto found = fs::find_program(program);
    if (!found) throw SysError(ENOENT, "find in PATH", program);
    program = *found;
  }
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> own_env;
  if (spec.envp) own_env = c_strings(*spec.envp);
  std::vector<int> staged(spec.fds.size(), -1);
  int highest_target = 2;
  for (const auto& [from, to] : spec.fds) highest_target = std::max(highest_target, to);

  Pipe errors = make_pipe();
  const Prepared prepared{spec,           program.c_str(), argv.data(), spec.envp ? own_env.data() : environ,
                          staged.data(),  highest_target,  errors.write.get(), ::getpid()};
  pid_t pid;
  if (spec.cgroup_dir >= 0) {
    // fork(2) semantics (no CLONE_VM): the child goes on on a copy of this stack.
    clone_args args{};
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = static_cast<std::uint64_t>(spec.cgroup_dir);
    pid = static_cast<pid_t>(::syscall(SYS_clone3, &args, sizeof args));
  } else {
    pid = ::fork();
  }
  if (pid < 0) throw SysError(errno, spec.cgroup_dir >= 0 ? "clone3 into a cgroup" : "fork", spec.argv.front());
  if (pid == 0) child_main(prepared);

  errors.write.reset();
  SpawnedChild child(pid, open_pidfd(pid));

  Failure failure{};
  ssize_t n;
  do {
    n = ::read(errors.read.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return child;  // exec succeeded: the pipe closed on exec

  child.wait(program);  // it has _exit()ed already
  if (n != static_cast<ssize_t>(sizeof failure))
    throw Error(fmt::format("{} failed before exec (no report from the child)", program));
  const Step step = static_cast<Step>(failure.step);
  std::string what = step_name(step);
  if (step == Step::setuid || step == Step::setgid) {
    what += fmt::format("({})", step == Step::setuid ? spec.drop_to->uid : spec.drop_to->gid);
  } else if (step == Step::exec) {
    what += " " + program;
  } else if (step == Step::in_child && failure.detail) {
    what = failure.detail;
  } else if (step == Step::chdir) {
    what += fmt::format("({})", spec.cwd);
  }
  throw SysError(failure.err, what + " failed");
}

}  // namespace nshpc
