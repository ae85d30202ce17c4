// ns-hpc bwrap <id> -- cmd...: one command in the instance's sandbox, exit code passed through.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include <unistd.h>

#include "base/error.hpp"
#include "base/users.hpp"
#include "cli/app.hpp"
#include "cli/pty_relay.hpp"
#include "cli/signals.hpp"
#include "instances/terminal.hpp"
#include "sandbox/capture.hpp"

namespace nshpc::cli {

namespace {

constexpr int kTimeoutExitCode = 124;  // timeout(1)'s

sandbox::ExecSpec make_exec_spec(Invocation& inv, const store::Instance& inst, std::vector<std::string> command) {
  return inv.instances().command(inst, instances::Service::Command::person, std::move(command));
}

// Audits a finished sandbox run and turns it into the exit code to return.
int finish_sandbox_run(Invocation& inv, const store::Instance& inst, const std::vector<std::string>& command,
                       std::string_view event, const sandbox::ExitStatus& status,
                       std::chrono::steady_clock::duration elapsed, int stop_signal, bool timed_out = false) {
  nlohmann::json fields =
      instances::person_run_fields(inst, command, status, std::chrono::duration_cast<std::chrono::milliseconds>(elapsed));
  if (stop_signal) fields["stopped_by_signal"] = stop_signal;
  if (timed_out) fields["timed_out"] = true;
  inv.store().audit(inst, event, users::cli_actor(), std::move(fields));
  if (stop_signal) return 128 + stop_signal;
  if (!status.started) {
    std::fprintf(stderr, "ns-hpc: error: %s\n", status.error.c_str());
    return status.exit_code > 0 ? status.exit_code : 1;
  }
  return status.exit_code;
}

// Puts the workspace file `relative` (as a job's output) on descriptor `target`, opened as the
// store opens every file a sandbox writes: a batch job on a Slurm node writes its output this
// way, never by a path the sandbox could have turned into a link to a host file.
void redirect_to_workspace_file(Invocation& inv, const store::Instance& inst, const std::string& relative, int target) {
  UniqueFd fd = inv.store().open_workspace_file(inst, relative, store::Store::WorkspaceOpen::append);
  if (::dup2(fd.get(), target) < 0) throw SysError(errno, "dup2", relative);
}

// With a time limit: the command runs through the sandbox's captured-run pump, its output written
// through to ours as it comes; stdin is ours unless it is a terminal (which a sandbox is never
// handed). At the limit its whole tree is killed and the exit code is 124, as timeout(1)'s.
int run_with_timeout(Invocation& inv, const store::Instance& inst, const std::vector<std::string>& command,
                     std::chrono::milliseconds timeout) {
  sandbox::ExecSpec spec = make_exec_spec(inv, inst, command);
  if (!::isatty(STDIN_FILENO)) spec.stdio.in = STDIN_FILENO;
  sandbox::CaptureOptions options;
  options.timeout = timeout;
  options.out = sandbox::Sink::write_to(STDOUT_FILENO);
  options.err = sandbox::Sink::write_to(STDERR_FILENO);
  StopSignals signals;  // SIGINT/SIGTERM/SIGHUP/SIGQUIT end the run (its tree killed) instead of ns-hpc
  int stop_signal = 0;
  options.cancelled = [&] {
    if (!stop_signal) stop_signal = signals.take();
    return stop_signal != 0;
  };
  const auto started = std::chrono::steady_clock::now();
  const sandbox::CaptureResult run = inv.instances().run_captured(inst, std::move(spec), std::move(options));
  const bool timed_out = run.ending == sandbox::Ending::timed_out;
  const int code = finish_sandbox_run(inv, inst, command, "sandbox.exec", run.status,
                                      std::chrono::steady_clock::now() - started, stop_signal, timed_out);
  if (!timed_out) return code;
  std::fprintf(stderr, "ns-hpc: the command timed out after %.3g s; its sandbox was killed\n",
               std::chrono::duration<double>(timeout).count());
  return kTimeoutExitCode;
}

}  // namespace

int run_in_sandbox(Invocation& inv, const store::Instance& inst, const std::vector<std::string>& command,
                   std::string_view event) {
  const auto started = std::chrono::steady_clock::now();
  AttachedRun run = run_attached(inv.instances(), make_exec_spec(inv, inst, command));
  return finish_sandbox_run(inv, inst, command, event, run.status, std::chrono::steady_clock::now() - started,
                            run.stop_signal);
}

void add_bwrap_command(CLI::App& app, Invocation& inv) {
  struct Args {
    std::string id;
    std::vector<std::string> command;
    std::optional<std::string> stdout_file, stderr_file;
    bool fresh = false;
    std::optional<double> timeout;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "bwrap",
      "Run one command in an instance's sandbox: ns-hpc bwrap ID -- CMD [ARGS...]\n"
      "The exit code is the command's (128+N when signal N killed it). Ctrl-C, SIGTERM or\n"
      "SIGHUP kill the whole sandbox. On a terminal the command gets a private one, relayed to\n"
      "yours, so nothing it does to it (stty, line discipline) stays behind.\n"
      "With --timeout SECONDS the command's whole tree is killed at the limit and the exit code\n"
      "is 124 (as timeout(1)); its output is then relayed through pipes (no terminal).");
  cmd->add_option("id", a->id, "Instance id")->required();
  cmd->add_option("command", a->command, "The command and its arguments (after --)");
  cmd->add_option("--stdout", a->stdout_file,
                  "Append the command's stdout to this file of the workspace (a path relative to it; never "
                  "through a link)");
  cmd->add_option("--stderr", a->stderr_file, "The same for stderr");
  cmd->add_flag("--fresh", a->fresh,
                "Run in a fresh sandbox even when the instance is persistent (a Slurm batch job on a compute node "
                "never joins a living instance)");
  cmd->add_option("--timeout", a->timeout,
                  "Kill the command and everything it started after this many seconds (a fraction is fine); "
                  "exit code 124 then. Stdout and stderr are relayed through pipes, stdin is passed on unless "
                  "it is a terminal")
      ->check(CLI::PositiveNumber);
  cmd->callback([&inv, a] {
    const std::vector<std::string>& command = command_to_run(inv, a->command, "ns-hpc bwrap ID -- CMD [ARGS...]");
    store::Instance inst = inv.store().get(a->id);
    if (a->fresh) inst.persistent = false;
    if (a->stdout_file) redirect_to_workspace_file(inv, inst, *a->stdout_file, STDOUT_FILENO);
    if (a->stderr_file) redirect_to_workspace_file(inv, inst, *a->stderr_file, STDERR_FILENO);
    if (a->timeout) {
      const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(*a->timeout));
      inv.exit_code = run_with_timeout(inv, inst, command, std::max(limit, std::chrono::milliseconds(1)));
      return;
    }
    inv.exit_code = run_in_sandbox(inv, inst, command, "sandbox.exec");
  });
}

}  // namespace nshpc::cli
