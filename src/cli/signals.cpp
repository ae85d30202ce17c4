#include "cli/signals.hpp"

#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>

#include "base/error.hpp"

namespace nshpc::cli {

StopSignals::StopSignals(std::initializer_list<int> extra) {
  sigemptyset(&set_);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set_, sig);
  for (int sig : extra) sigaddset(&set_, sig);
  if (::sigprocmask(SIG_BLOCK, &set_, &previous_) < 0) throw SysError(errno, "sigprocmask");
  fd_.reset(::signalfd(-1, &set_, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!fd_) throw SysError(errno, "signalfd");
}

StopSignals::~StopSignals() { ::sigprocmask(SIG_SETMASK, &previous_, nullptr); }

int StopSignals::take() {
  signalfd_siginfo info;
  ssize_t n = ::read(fd_.get(), &info, sizeof info);
  if (n != static_cast<ssize_t>(sizeof info)) return 0;
  return static_cast<int>(info.ssi_signo);
}

int StopSignals::wait_for_exit_or_signal(int pidfd) {
  for (;;) {
    pollfd fds[2] = {{pidfd, POLLIN, 0}, {fd_.get(), POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "poll");
    }
    if (fds[1].revents & POLLIN) {
      if (int sig = take()) return sig;
    }
    if (fds[0].revents) return 0;
  }
}

}  // namespace nshpc::cli
