#include "sandbox/spawn.hpp"

#include <signal.h>

#include "base/error.hpp"

namespace nshpc::sandbox {

Child spawn(const ChildSetup& setup) {
  SpawnSpec spec;
  spec.program = setup.program;
  spec.argv = setup.argv;
  spec.envp = setup.envp;
  spec.fds = setup.fds;
  spec.join_cgroups = setup.join_cgroups;
  spec.cgroup_dir = setup.cgroup_dir;
  spec.rlimits = setup.rlimits;
  spec.drop_to = setup.drop_to;
  spec.controlling_tty = setup.controlling_tty;
  spec.die_with_parent = setup.die_with_parent ? SIGKILL : 0;
  spec.in_child = setup.in_child;
  spec.cwd = "/";  // nothing of the server's working directory leaks in; bwrap sets its own
  try {
    return nshpc::spawn(spec);
  } catch (const SysError& e) {
    throw e.wrapped("could not start the sandbox");
  }
}

}  // namespace nshpc::sandbox
