// Joining a living sandbox from outside: a command started in the namespaces of a sandbox that
// runs already (as `crun exec` does), with exactly a fresh sandbox's restrictions.
//
// The chain, each step in a forked process of this binary (nothing is executed from the
// sandbox's file system before the last step, and only async-signal-safe calls are made):
//   joiner   (host side)  not dumpable; joins the command's cgroups; sets rlimits; as root drops
//                         to the sandbox uid (groups, gid, uid) so no host capability is left;
//                         then joins the sandbox's outer user namespace (bwrap's, which owns its
//                         other namespaces), its mount, pid, net, ipc, uts and cgroup namespaces,
//                         and last the sandbox's own (inner) user namespace.
//   (flat: there is no command pid namespace and no command init; the command's cgroup is its
//   tree (see JoinSetup::flat). The joiner starts the command in the sandbox's pid namespace and
//   watches it from outside, where nothing in the sandbox can see or signal it: two processes
//   per command instead of four.)
//   spawner  (in the sandbox's pid namespace) makes a new pid namespace for this command, drops
//                         every capability (bounding, ambient, permitted), sets no-new-privileges
//                         and starts:
//   command init (pid 1 of the command's pid namespace) loads the sandbox's seccomp filter,
//                         starts the command, reports its exit status, and stays until the last
//                         process of the command's tree has ended (background processes keep
//                         running after the command returns). Killing it kills the whole tree:
//                         setsid'd and SIGTERM-ignoring processes included, nothing else.
//   command  a new session, the working directory, the environment, execve (PATH searched
//                         inside the sandbox).
// Descriptors other than the command's stdio (and a shell script's) are closed before the
// command runs. The caller gets the command init's pidfd (sent over a socket by the spawner),
// so it never needs a pid the sandbox could fake.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/fd.hpp"
#include "base/users.hpp"

namespace nshpc::sandbox {

// The namespaces of a running sandbox, opened from its init (checked against pid reuse).
struct SandboxNamespaces {
  UniqueFd outer_user;  // bwrap's user namespace (owner of the others)
  UniqueFd user;        // the sandbox's own (the init's), a child of outer_user
  UniqueFd mnt, pid, net, ipc, uts, cgroup;
};

// Opens the namespaces of the process `init` if it is still in the pid namespace `pid_ns`.
// Throws SysError (ESRCH when the sandbox is gone).
SandboxNamespaces open_sandbox_namespaces(pid_t init, std::uint64_t pid_ns);

struct JoinSetup {
  const SandboxNamespaces* namespaces = nullptr;
  std::vector<std::string> argv;             // argv[0] without '/' is searched in PATH of envp
  std::vector<std::string> envp;
  std::string cwd;                           // sandbox path
  std::vector<std::pair<int, int>> fds;      // (descriptor here, number in the command): stdio, script
  std::vector<int> join_cgroups;             // Cgroup::procs_fds(): the joiner writes "0" to each
  // A cgroup v2 folder (Cgroup::v2_dir_fd()) the joiner, and so the command, is made in
  // (clone3's CLONE_INTO_CGROUP) instead of joining it through a join_cgroups descriptor; -1:
  // none.
  int cgroup_dir = -1;
  std::vector<std::pair<int, rlim_t>> rlimits;
  std::optional<users::Identity> drop_to;    // as root: the sandbox's host uid/gid
  std::string seccomp_bpf;                   // struct sock_filter[]; empty: none
  // Capabilities the command keeps in the sandbox's user namespace (bits by number: an image
  // instance's profile, kImageCapabilities); 0: none at all.
  std::uint64_t keep_caps = 0;
  bool controlling_tty = false;              // stdin is a terminal to become the controlling tty
  // The command gets a terminal of the sandbox's own devpts as stdin, stdout, stderr and
  // controlling tty (its master: Joined::terminal); fds 0-2 above are replaced.
  bool own_terminal = false;
  // Read ends of the command's output pipes: once the caller has read what it wanted and
  // released the command (Joined::release), the command init reads and discards what
  // background processes still write there, so they never get EPIPE or block on a full pipe.
  std::vector<int> discard_after_release;
  // Flat: no pid namespace of the command's own; the command runs in the sandbox's pid
  // namespace (so `ps` and `kill` in a later command see it) and its tree is killed through its
  // cgroup, whose cgroup.kill is `kill_file` (the command init writes it when the caller goes
  // away before the command has ended). Only where this process can make such a group (root).
  bool flat = false;
  int kill_file = -1;
};

// A command started in a sandbox. Destroying it releases the command (see release()).
struct Joined {
  pid_t pid = 0;             // host pid of the command init (flat: of the joiner watching the command)
  std::uint64_t pid_ns = 0;  // the command's own pid namespace (its tree, and only it)
  UniqueFd pidfd;            // of the command init: SIGKILL through it ends the whole tree
  // Readable when the command has ended: 4 bytes (its wait status) or EOF (the command init
  // was killed first).
  UniqueFd status;
  // Closing it releases the command: until then, the caller going away counts as a cancel (the
  // command init kills the tree when this closes before the command has ended).
  UniqueFd release;
  UniqueFd terminal;  // own_terminal: the master of the command's terminal (non-blocking)
  // Flat: `pidfd` is this process's child (the joiner), to be reaped once it has ended; it ends
  // after the release, when no background process writes to the output pipes any more.
  bool our_child = false;
};


// A joiner prepared ahead of its command (flat joins only): forked into the command's group,
// dropped to the sandbox uid, in every namespace of the sandbox and already under the command's
// restrictions (capabilities, no_new_privs, the seccomp filter), it waits for one command. What
// a join costs before the command's own execve (the fork of the server, the joins, loading the
// filter) is then paid ahead of the request. It ends unused when `control` closes, when the
// sandbox ends or after 20 s; whoever holds it reaps it (its pidfd).
struct PreparedJoiner {
  pid_t pid = 0;
  UniqueFd pidfd;
  UniqueFd control;  // the request goes here
};

// `setup`: namespaces, join_cgroups / cgroup_dir (the group it waits in), drop_to, seccomp_bpf,
// keep_caps, flat with kill_file; `sandbox_pidfd`: the sandbox init's. Throws SysError when it
// cannot be made.
PreparedJoiner prepare_joiner(const JoinSetup& setup, int sandbox_pidfd);

// Starts the command of `setup` (argv, envp, cwd, fds, rlimits, discard_after_release) on
// `joiner`, which is used up either way, as join_sandbox() would. nullopt when the joiner is gone
// or the request is one it cannot carry (a terminal, too many words or descriptors): nothing ran,
// join the usual way. A command that cannot be executed throws as in join_sandbox().
std::optional<Joined> join_prepared(PreparedJoiner& joiner, const JoinSetup& setup);

// Starts the command; returns once it has been executed (or throws SysError naming the step and
// the errno, e.g. "execute python4: No such file or directory").
Joined join_sandbox(const JoinSetup& setup);

}  // namespace nshpc::sandbox
