// The one way this program starts another: fork, a child set up with async-signal-safe calls
// only (everything it needs is allocated before the fork, so it is safe in a multi-threaded
// server), execve. The host-command runner (base/process.hpp), the sandbox launch
// (sandbox/spawn.hpp) and the job keeper's bwrap are built on it.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/fd.hpp"
#include "base/users.hpp"

namespace nshpc {

struct SpawnSpec {
  // Executed with execve. Without a '/', looked up in PATH first (before the fork); not found is
  // SysError(ENOENT) naming it.
  std::string program;
  std::vector<std::string> argv;
  // The complete environment; nullopt: this process's own.
  std::optional<std::vector<std::string>> envp;
  // (descriptor here, number in the child). With `close_other_fds` every other descriptor is
  // closed in the child; without, the child keeps whatever this process has without O_CLOEXEC
  // (the keeper hands bwrap descriptors it got by number).
  std::vector<std::pair<int, int>> fds;
  bool close_other_fds = true;
  std::vector<int> join_cgroups;                 // cgroup.procs descriptors: the child writes "0" to each first
  // A cgroup v2 folder (opened O_RDONLY|O_DIRECTORY) the child is made in, by clone3 with
  // CLONE_INTO_CGROUP: no global lock and no RCU grace period, which moving a process through
  // cgroup.procs waits for. -1: none.
  int cgroup_dir = -1;
  std::vector<std::pair<int, rlim_t>> rlimits;   // (RLIMIT_*, value) set as soft and hard limit
  std::optional<users::Identity> drop_to;        // setgroups(0) + setresgid + setresuid
  bool new_session = false;                      // setsid()
  bool controlling_tty = false;                  // setsid(), and the child's stdin becomes its controlling terminal
  // PR_SET_PDEATHSIG with this signal (0: none), set after the identity change (which would clear
  // it); a child whose parent ended before that fails instead of running orphaned.
  int die_with_parent = 0;
  std::string cwd;                               // chdir here before execve; empty: stay
  // Called in the child once its descriptors are in place, before the identity change, with
  // async-signal-safe calls only: returns 0, or an errno with *step set to a string literal
  // saying what failed. For a child a privileged parent sets namespaces up for (an image
  // instance's sandbox: sandbox/layers.hpp).
  std::function<int(const char** step)> in_child;
};

// A started child: its pid and a pidfd (signals and waits through it reach this process, never a
// later one with the same pid). Until it is waited for or released, destroying it kills (SIGKILL)
// and reaps the child, so no path leaves a child running or a zombie behind. pid() and pidfd()
// stay readable after wait() and release() (a pidfd is readable once its process has exited).
class SpawnedChild {
 public:
  SpawnedChild() = default;
  SpawnedChild(pid_t pid, UniqueFd pidfd) : pid_(pid), pidfd_(std::move(pidfd)), owned_(pid > 0) {}
  SpawnedChild(SpawnedChild&& other) noexcept
      : pid_(other.pid_), pidfd_(std::move(other.pidfd_)), owned_(std::exchange(other.owned_, false)) {}
  SpawnedChild& operator=(SpawnedChild&& other) noexcept;
  SpawnedChild(const SpawnedChild&) = delete;
  SpawnedChild& operator=(const SpawnedChild&) = delete;
  ~SpawnedChild() { kill_and_reap(); }

  pid_t pid() const { return pid_; }
  int pidfd() const { return pidfd_.get(); }

  // Blocks until the child has exited and reaps it; returns the wait status (WIFEXITED...).
  // Throws SysError naming `what` when waitpid fails (not EINTR), or when it was reaped already.
  int wait(std::string_view what = "the child process");
  // Gives the child up: whoever reaps it now is the caller's business (a keeper's waitpid(-1),
  // or a process that must outlive this handle). Returns its pid.
  pid_t release() {
    owned_ = false;
    return pid_;
  }

 private:
  void kill_and_reap() noexcept;
  pid_t pid_ = -1;
  UniqueFd pidfd_;
  bool owned_ = false;  // not waited for or released yet
};

// argv/envp for execve: pointers into `strings`, null-terminated (made before a fork).
std::vector<char*> c_strings(const std::vector<std::string>& strings);

// Forks and executes `spec`. The child's failing step comes back over a close-on-exec pipe:
// SysError with its errno, e.g. "execute /no/such: No such file or directory" or
// "setresuid(65534) failed: Operation not permitted".
SpawnedChild spawn(const SpawnSpec& spec);

}  // namespace nshpc
