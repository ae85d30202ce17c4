// While alive, the stop signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT) are blocked and read from a
// signalfd, so the CLI can turn them into "kill the sandbox" and still write its audit record.
#pragma once

#include <signal.h>

#include <initializer_list>
#include <vector>

#include "base/fd.hpp"

namespace nshpc::cli {

class StopSignals {
 public:
  explicit StopSignals(std::initializer_list<int> extra = {});
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  int fd() const { return fd_.get(); }
  // Reads one pending signal; 0 when none.
  int take();
  // Blocks until `pidfd` is readable (the process exited) or a stop signal arrives.
  // Returns the signal number, or 0 when the process exited.
  int wait_for_exit_or_signal(int pidfd);

 private:
  sigset_t set_{};
  sigset_t previous_{};
  UniqueFd fd_;
};

}  // namespace nshpc::cli
