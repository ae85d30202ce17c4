// The command line (CLI11). Every command: one error line on stderr and exit 1 on failure,
// exit 2 on a usage error; listings and descriptions have --json.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "config/config.hpp"
#include "jobs/jobs.hpp"
#include "sandbox/sandbox.hpp"
#include "store/store.hpp"

namespace nshpc::cli {

// Shared state of one invocation: the config and the services built from it, made on first use.
class Context {
 public:
  std::optional<std::filesystem::path> config_path;  // --config
  int exit_code = 0;
  // Everything after the first "--" on the command line, word for word (CLI11 never sees it,
  // so nothing in a command is taken for an option or a list).
  std::optional<std::vector<std::string>> trailing;

  const config::Config& config();
  const std::vector<std::string>& config_warnings();
  store::Store& store();
  sandbox::Backend& backend();
  // The job engine (it also answers the store's "jobs still running?" from then on).
  jobs::Engine& jobs();

 private:
  std::optional<config::Loaded> loaded_;
  std::unique_ptr<store::RecordedJobsGuard> jobs_guard_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<sandbox::Backend> backend_;
  std::unique_ptr<jobs::Engine> jobs_;
};

void add_instance_commands(CLI::App& app, Context& ctx);
void add_config_commands(CLI::App& app, Context& ctx);
void add_doctor_command(CLI::App& app, Context& ctx);
void add_bwrap_command(CLI::App& app, Context& ctx);
void add_clean_command(CLI::App& app, Context& ctx);
void add_run_command(CLI::App& app, Context& ctx);
void add_job_commands(CLI::App& instance, Context& ctx);  // instance run|status|jobs|cancel

// Runs a command in an instance's sandbox attached to the caller (run_attached) and audits it.
// Returns the exit code to pass through. `ns-hpc bwrap` and `instance enter`.
int run_in_sandbox(Context& ctx, const store::Instance& inst, const std::vector<std::string>& command,
                   std::string_view event);

struct AttachedRun {
  sandbox::ExitStatus status;
  int stop_signal = 0;  // the SIGINT/SIGTERM/SIGHUP/SIGQUIT that made ns-hpc kill the sandbox, or 0
};
// Runs `spec` on the caller's stdin, stdout and stderr until it ends; a stop signal kills the
// whole sandbox. A terminal among them is never handed over: the sandbox gets a private PTY in
// its place, relayed to the caller's terminal (raw while the command runs when stdin is on it,
// restored exactly afterwards; window size forwarded), so nothing the sandbox does to its
// terminal (stty, TIOCSETD) reaches the caller's. Pipes and files are passed as they are.
AttachedRun run_attached(sandbox::Backend& backend, sandbox::RunSpec spec);

// Audits a finished sandbox run and turns it into the exit code to return.
int finish_sandbox_run(Context& ctx, const store::Instance& inst, const std::vector<std::string>& command,
                       std::string_view event, const sandbox::ExitStatus& status,
                       std::chrono::steady_clock::duration elapsed, int stop_signal);

sandbox::RunSpec make_run_spec(Context& ctx, const store::Instance& inst,
                               std::vector<std::string> command);

// Asks "question [y/N] " on the terminal; false when the answer is not y/yes or there is none.
bool confirm(const std::string& question);

int main(int argc, char** argv);

}  // namespace nshpc::cli
