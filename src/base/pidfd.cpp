#include "base/pidfd.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "base/error.hpp"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace nshpc {

UniqueFd open_pidfd(pid_t pid, int* error) {
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0 && error) *error = errno;
  return UniqueFd(fd < 0 ? -1 : static_cast<int>(fd));
}

void signal_pidfd(int pidfd, int sig) {
  if (pidfd < 0) return;
  if (::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) < 0 && errno != ESRCH)
    throw SysError(errno, "pidfd_send_signal");
}

bool wait_pidfd(int pidfd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{pidfd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) throw SysError(errno, "poll", "a process descriptor");
  }
}

bool reap_if_child(int pidfd) {
  if (pidfd < 0) return false;
  siginfo_t info{};
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED) < 0) {
    if (errno != EINTR) return false;  // ECHILD: not our child, or reaped already
  }
  return true;
}

void Leftovers::add(UniqueFd pidfd) {
  if (!pidfd) return;
  std::lock_guard lock(mutex_);
  children_.push_back(std::move(pidfd));
}

void Leftovers::reap_ended() {
  std::lock_guard lock(mutex_);
  std::erase_if(children_, [](const UniqueFd& pidfd) {
    siginfo_t info{};
    // Gone from the list once reaped, or when it is not (or no longer) ours to reap (ECHILD).
    return ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd.get()), &info, WEXITED | WNOHANG) < 0 ||
           info.si_pid != 0;
  });
}

}  // namespace nshpc
