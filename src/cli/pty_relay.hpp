// Running a sandbox attached to the caller's stdin, stdout and stderr (`ns-hpc bwrap`,
// `instance enter`), with a private PTY relayed in place of the caller's terminal.
#pragma once

#include "instances/instances.hpp"
#include "sandbox/execution.hpp"

namespace nshpc::cli {

struct AttachedRun {
  sandbox::ExitStatus status;
  int stop_signal = 0;  // the SIGINT/SIGTERM/SIGHUP/SIGQUIT that made ns-hpc kill the sandbox, or 0
};

// Runs `spec` on the caller's stdin, stdout and stderr until it ends; a stop signal kills the
// whole sandbox. A terminal among them is never handed over: the sandbox gets a private PTY in
// its place, relayed to the caller's terminal (raw while the command runs when stdin is on it,
// restored exactly afterwards; window size forwarded), so nothing the sandbox does to its
// terminal (stty, TIOCSETD) reaches the caller's. Pipes and files are passed as they are.
AttachedRun run_attached(instances::Service& instances, sandbox::ExecSpec spec);

}  // namespace nshpc::cli
