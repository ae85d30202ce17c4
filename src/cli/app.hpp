// The command line (CLI11). Every command: one error line on stderr and exit 1 on failure,
// exit 2 on a usage error; listings and descriptions have --json.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.hpp"
#include "config/config.hpp"
#include "instances/instances.hpp"
#include "jobs/jobs.hpp"
#include "store/store.hpp"

namespace nshpc::cli {

// One run of the ns-hpc command: the config and the services built from it, made on first use.
class Invocation {
 public:
  std::optional<std::filesystem::path> config_path;  // --config
  int exit_code = 0;
  // Everything after the first "--" on the command line, word for word (CLI11 never sees it,
  // so nothing in a command is taken for an option or a list).
  std::optional<std::vector<std::string>> trailing;

  const config::Config& config();
  const std::vector<std::string>& config_warnings();
  // Changes the loaded config before anything is built from it (a command's own settings, such
  // as `computer`'s --cpu and --memory). Throws Error once the store exists.
  void adjust_config(const std::function<void(config::Config&)>& change);
  // The instances service: everything a command does to an instance goes through it.
  instances::Service& instances();
  // Its store, to read (instances, listings, archives).
  const store::Store& store() { return instances().store(); }
  // Its job engine (made on first use).
  jobs::Engine& jobs() { return instances().jobs(); }

 private:
  std::optional<config::Loaded> loaded_;
  std::unique_ptr<instances::Service> instances_;
};

void add_instance_commands(CLI::App& app, Invocation& inv);
void add_image_commands(CLI::App& app, Invocation& inv);
void add_config_commands(CLI::App& app, Invocation& inv);
void add_doctor_command(CLI::App& app, Invocation& inv);
void add_bwrap_command(CLI::App& app, Invocation& inv);
void add_clean_command(CLI::App& app, Invocation& inv);
void add_run_command(CLI::App& app, Invocation& inv);
// `ns-hpc computer …`, and the binary invoked as mcp-virtual-computer (computer_main with its
// arguments): the seed's command line; returns the exit code (usage errors 2, others 1).
void add_computer_command(CLI::App& app, Invocation& inv);
int computer_main(Invocation& inv, const std::vector<std::string>& args);
void add_job_commands(CLI::App& instance, Invocation& inv);  // instance run|status|jobs|cancel
// instance reset|snapshot|snapshots|snapshot-restore|snapshot-delete
void add_snapshot_commands(CLI::App& instance, Invocation& inv);

// The values an option accepts, by the name typed on the command line (several names may mean
// the same value: an alias).
template <typename T>
using Choices = std::vector<std::pair<std::string, T>>;

// `values` by the names their module gives them (its to_string), so the CLI spells none itself.
template <typename T>
Choices<T> named(std::initializer_list<T> values) {
  Choices<T> choices;
  for (T value : values) choices.emplace_back(std::string(to_string(value)), value);
  return choices;
}

// An option taking one of `choices`: CLI11 checks the name (CLI::IsMember: a wrong one is a usage
// error listing them all, and --help shows them) and `target` gets its value.
template <typename T>
CLI::Option* add_choice(CLI::App& cmd, const std::string& flags, std::optional<T>& target, Choices<T> choices,
                        const std::string& help) {
  auto* option = cmd.add_option_function<std::string>(
      flags,
      [&target, choices](const std::string& name) {
        for (const auto& [n, value] : choices)
          if (n == name) target = value;
      },
      help);
  option->check(CLI::IsMember(std::move(choices)));
  return option;
}

// The command to run: the words after "--" when there are any, else `positional` (the command
// given without "--"). None at all is a usage error that shows `usage`.
const std::vector<std::string>& command_to_run(const Invocation& inv, const std::vector<std::string>& positional,
                                               const std::string& usage);

// Runs a command in an instance's sandbox attached to the caller (cli/pty_relay.hpp) and audits
// it. Returns the exit code to pass through. `ns-hpc bwrap` and `instance enter`.
int run_in_sandbox(Invocation& inv, const store::Instance& inst, const std::vector<std::string>& command,
                   std::string_view event);

// Asks "question [y/N] " on the terminal; false when the answer is not y/yes or there is none.
bool confirm(const std::string& question);

int main(int argc, char** argv);
// What a person does about something not found, naming commands (the CLI side of the tools' advice).
std::string not_found_advice(const NotFound& e);
// What a person does about a NeedsAction, naming commands (the CLI side of the tools' advice).
std::string needs_action_advice(const NeedsAction& e);

}  // namespace nshpc::cli
