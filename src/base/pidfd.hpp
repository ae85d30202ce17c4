// Process descriptors (pidfd_open(2)): a signal or a wait through one reaches the process it was
// opened for, never a later process that got the same pid. The only pidfd wrappers in the tree.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <mutex>
#include <vector>

#include "base/fd.hpp"

namespace nshpc {

// pidfd_open(2); an invalid fd when the process is already gone (or pidfds are not supported):
// `error`, when given, gets the errno then (ESRCH: gone).
UniqueFd open_pidfd(pid_t pid, int* error = nullptr);

// Sends `sig` through a pidfd; ESRCH (already gone) and an invalid fd are not errors. Throws
// SysError (e.g. EPERM) otherwise.
void signal_pidfd(int pidfd, int sig);

// Waits up to `timeout` for the process to end (its pidfd becomes readable); true when it has.
bool wait_pidfd(int pidfd, std::chrono::milliseconds timeout);

// Reaps the process of `pidfd` if it is our child, blocking until it has exited; returns false
// when it is not our child (or was reaped already). Send it SIGKILL first when it must not linger.
bool reap_if_child(int pidfd);

// Children that outlived the handle that started them (a keeper started for a living sandbox, a
// command's watcher still discarding what background processes write): each is reaped once it
// has ended, on a later reap_ended(); nothing here ever waits.
class Leftovers {
 public:
  void add(UniqueFd pidfd);
  void reap_ended();

 private:
  std::mutex mutex_;
  std::vector<UniqueFd> children_;
};

}  // namespace nshpc
