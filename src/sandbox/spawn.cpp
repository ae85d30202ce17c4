#include "sandbox/spawn.hpp"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "base/error.hpp"

namespace nshpc::sandbox {

namespace {

enum class Step : int { cgroup, dup, dup2, setsid, ctty, close, rlimit, setgroups, setgid, setuid,
                        pdeathsig, orphaned, chdir, exec };

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
    case Step::chdir: return "chdir(/)";
    case Step::exec: return "execute";
  }
  return "?";
}

struct Failure {
  int step;
  int err;
};

[[noreturn]] void fail(int error_fd, Step step) {
  Failure f{static_cast<int>(step), errno};
  ssize_t ignored = ::write(error_fd, &f, sizeof f);
  (void)ignored;
  ::_exit(127);
}

// The child's side: only async-signal-safe calls from here to execve.
[[noreturn]] void child_main(const ChildSetup& setup, char* const* argv, char* const* envp,
                             int* staged, int highest_target, int error_fd, pid_t parent) {
  // Join the cgroups first, while the descriptors still have their parent-side numbers.
  for (int fd : setup.join_cgroups) {
    if (::write(fd, "0", 1) != 1) fail(error_fd, Step::cgroup);
  }
  // Move every descriptor above the targets first, so no dup2 below clobbers a source.
  const int stage_base = highest_target + 2;
  for (size_t i = 0; i < setup.fds.size(); ++i) {
    staged[i] = ::fcntl(setup.fds[i].first, F_DUPFD, stage_base);
    if (staged[i] < 0) fail(error_fd, Step::dup);
  }
  int err_fd = ::fcntl(error_fd, F_DUPFD_CLOEXEC, stage_base);
  if (err_fd < 0) fail(error_fd, Step::dup);
  for (size_t i = 0; i < setup.fds.size(); ++i) {
    if (::dup2(staged[i], setup.fds[i].second) < 0) fail(err_fd, Step::dup2);
  }
  // Keep the error pipe just above the targets, close everything else.
  if (::dup3(err_fd, highest_target + 1, O_CLOEXEC) < 0) fail(err_fd, Step::dup2);
  err_fd = highest_target + 1;
  if (::syscall(SYS_close_range, highest_target + 2, ~0U, 0) < 0) fail(err_fd, Step::close);

  if (setup.controlling_tty) {
    if (::setsid() < 0) fail(err_fd, Step::setsid);
    if (::ioctl(0, TIOCSCTTY, 0) < 0) fail(err_fd, Step::ctty);
  }
  for (const auto& [resource, value] : setup.rlimits) {
    struct rlimit rl{value, value};
    if (::setrlimit(resource, &rl) < 0) fail(err_fd, Step::rlimit);
  }
  if (setup.drop_to) {
    const auto [uid, gid] = *setup.drop_to;
    if (::setgroups(0, nullptr) < 0) fail(err_fd, Step::setgroups);
    if (::setresgid(gid, gid, gid) < 0) fail(err_fd, Step::setgid);
    if (::setresuid(uid, uid, uid) < 0) fail(err_fd, Step::setuid);
  }
  // After the identity change, which would clear it.
  if (setup.die_with_parent) {
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) fail(err_fd, Step::pdeathsig);
    if (::getppid() != parent) {
      errno = ESRCH;
      fail(err_fd, Step::orphaned);
    }
  }
  if (::chdir("/") < 0) fail(err_fd, Step::chdir);

  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);

  ::execve(setup.program.c_str(), argv, envp);
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

Child spawn(const ChildSetup& setup) {
  std::vector<char*> argv = c_strings(setup.argv);
  std::vector<char*> envp = c_strings(setup.envp);
  std::vector<int> staged(setup.fds.size(), -1);
  int highest_target = 2;
  for (const auto& [from, to] : setup.fds) highest_target = std::max(highest_target, to);

  Pipe errors = make_pipe();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw SysError(errno, "fork");
  if (pid == 0)
    child_main(setup, argv.data(), envp.data(), staged.data(), highest_target, errors.write.get(),
               parent);

  errors.write.reset();
  Child child;
  child.pid = pid;
  child.pidfd = open_pidfd(pid);

  Failure failure{};
  ssize_t n;
  do {
    n = ::read(errors.read.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return child;  // exec succeeded: the pipe closed on exec

  int status;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof failure)) throw Error("the child process failed before exec");
  const Step step = static_cast<Step>(failure.step);
  std::string what = step_name(step);
  if (step == Step::setuid || step == Step::setgid) {
    what += fmt::format("({})", step == Step::setuid ? setup.drop_to->uid : setup.drop_to->gid);
  } else if (step == Step::exec) {
    what += " " + setup.program;
  }
  throw SysError(failure.err, what + " failed").wrapped("could not start the sandbox");
}

}  // namespace nshpc::sandbox
