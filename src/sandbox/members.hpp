// The processes of one sandbox, named by its pid namespace: bwrap's init (pid 1 inside, the
// "child-pid" of the status stream) and everything it runs. Processes cannot leave a pid
// namespace, so the namespace is the one set that holds exactly the sandbox (neither bwrap's
// monitor nor the job keeper, which live outside it).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/fd.hpp"

namespace nshpc::sandbox {

// A pidfd of the process `pid` if it is (still) in the pid namespace with inode `pid_ns` (a
// reused pid has another namespace); invalid otherwise.
UniqueFd open_member(pid_t pid, std::uint64_t pid_ns);

// Sends `sig` to every process of the pid namespace `pid_ns`, each through a pidfd checked as
// open_member does; returns how many were signalled.
std::size_t signal_members(std::uint64_t pid_ns, int sig);

// The parent of `pid` (field 4 of /proc/<pid>/stat); 0 when it is gone.
pid_t parent_of(pid_t pid);

// A process of a living sandbox: in its pid namespace, or in a command's pid namespace directly
// below it (sandbox/join.hpp).
struct TreeMember {
  pid_t pid = 0;
  pid_t ppid = 0;
  std::uint64_t pid_ns = 0;  // the process's own pid namespace
};
std::vector<TreeMember> tree_members(std::uint64_t pid_ns);

// A living sandbox's own main process is pid 1 of its namespace (bwrap --as-pid-1): a bash that
// ignores every signal sent from inside and reaps what is left to it, waiting in kLivingIdler.
inline constexpr const char* kLivingMain =
    "trap '' TERM INT HUP QUIT USR1 USR2; while :; do sleep 86400; done";
// True for that main process and the sleep it waits in: what a stop must not wait for.
bool living_main_process(const TreeMember& member, pid_t init);

}  // namespace nshpc::sandbox
