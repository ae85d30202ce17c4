// Starting bwrap (or the job keeper in its place) with exact control of its descriptors, limits
// and identity: the sandbox's terms for base/spawn.hpp, the one process starter.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/fd.hpp"
#include "base/pidfd.hpp"
#include "base/spawn.hpp"
#include "base/users.hpp"

namespace nshpc::sandbox {

struct ChildSetup {
  std::string program;                   // absolute path, executed with execve
  std::vector<std::string> argv;
  std::vector<std::string> envp;         // the complete environment
  std::vector<std::pair<int, int>> fds;  // (descriptor here, number in the child); all others closed
  std::vector<int> join_cgroups;         // cgroup.procs descriptors: the child writes "0" to each first
  int cgroup_dir = -1;                   // a cgroup v2 folder the child is made in (SpawnSpec::cgroup_dir)
  std::vector<std::pair<int, rlim_t>> rlimits;  // (RLIMIT_*, value) set as soft and hard limit
  std::optional<users::Identity> drop_to;  // setgroups(0) + setresgid + setresuid
  bool controlling_tty = false;  // setsid() and make the child's stdin its controlling terminal
  bool die_with_parent = true;   // PR_SET_PDEATHSIG(SIGKILL), set after the identity change
  std::function<int(const char** step)> in_child;  // SpawnSpec::in_child
};

using Child = SpawnedChild;
using nshpc::c_strings;

// Forks and execs, in "/". Throws SysError naming the step that failed in the child (e.g.
// "could not start the sandbox: setresuid(65534) failed: ...").
Child spawn(const ChildSetup& setup);

}  // namespace nshpc::sandbox
