#include "cli/app.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "cli/computer_config.hpp"

namespace nshpc::cli {

const config::Config& Invocation::config() {
  if (!loaded_) {
    config::LoadOptions options;
    options.explicit_path = config_path;
    loaded_ = config::load(options);
    for (const auto& warning : loaded_->warnings) log::warn("{}", warning);
  }
  return loaded_->config;
}

void Invocation::adjust_config(const std::function<void(config::Config&)>& change) {
  if (instances_) throw Error("internal: the config was changed after the instances service was made from it");
  config();
  change(loaded_->config);
}

const std::vector<std::string>& Invocation::config_warnings() {
  config();
  return loaded_->warnings;
}

instances::Service& Invocation::instances() {
  if (!instances_) instances_ = std::make_unique<instances::Service>(config());
  return *instances_;
}

bool confirm(const std::string& question) {
  if (!::isatty(STDIN_FILENO)) {
    std::fprintf(stderr, "%s [y/N] no terminal to answer; pass --force to skip the question\n",
                 question.c_str());
    return false;
  }
  std::fprintf(stderr, "%s [y/N] ", question.c_str());
  std::fflush(stderr);
  std::string answer;
  if (!std::getline(std::cin, answer)) return false;
  return answer == "y" || answer == "Y" || answer == "yes" || answer == "YES" || answer == "Yes";
}

const std::vector<std::string>& command_to_run(const Invocation& inv, const std::vector<std::string>& positional,
                                               const std::string& usage) {
  const std::vector<std::string>& command = inv.trailing ? *inv.trailing : positional;
  if (command.empty()) throw CLI::ValidationError("command", "no command given: " + usage);
  return command;
}

namespace {

void print_error(std::string_view message) {
  // One line: newlines inside a message (several config problems) stay, each still one line.
  std::string text(message);
  std::fprintf(stderr, "ns-hpc: error: %s\n", text.c_str());
}

// What a person asked of the log on stderr: --log-level, else -v (info) / -vv (debug), else the
// NS_HPC_LOG environment variable, else warning.
struct LogRequest {
  std::optional<log::Level> level;
  int verbosity = 0;
};

void add_log_options(CLI::App& app, LogRequest& request) {
  auto* level = add_choice(app, "--log-level", request.level, log::level_names(),
                           "what ns-hpc logs on stderr, never on stdout (default warning; debug adds the sandbox "
                           "argv, cgroups, scheduler commands and config files read); also from NS_HPC_LOG, which "
                           "this flag overrides");
  app.add_flag("-v,--verbose", request.verbosity, "log more on stderr: -v info, -vv debug (like --log-level)")
      ->excludes(level);
}

log::Level requested_level(const LogRequest& request) {
  if (request.level) return *request.level;
  if (request.verbosity > 0) return request.verbosity == 1 ? log::Level::info : log::Level::debug;
  if (const char* env = std::getenv("NS_HPC_LOG"); env && *env) {
    std::string name = env;
    // The same check, and so the same message, as --log-level's.
    const std::string problem = CLI::IsMember(log::level_names())(name);
    if (!problem.empty()) throw CLI::ValidationError("NS_HPC_LOG", problem);
    return *log::parse_level(name);
  }
  return log::Level::warning;
}

}  // namespace

int main(int argc, char** argv) {
  log::init();
  Invocation inv;
  // Invoked as mcp-virtual-computer (the symlink `make install` makes): the seed's command line.
  if (argc > 0 && std::filesystem::path(argv[0]).filename() == kComputerProgram)
    return computer_main(inv, std::vector<std::string>(argv + 1, argv + argc));
  CLI::App app{
      "ns-hpc: safe, persistent Linux sandboxes (bubblewrap) for LLM agents and people.\n"
      "Instances keep a workspace; commands run in a hardened sandbox, fresh for each command or, in a\n"
      "persistent instance, one long-lived sandbox that every command joins.",
      "ns-hpc"};
  app.set_version_flag("--version", std::string("ns-hpc ") + NSHPC_VERSION);
  app.require_subcommand(1);
  // The options here (--config, the log ones) are taken after the command's name too:
  // `ns-hpc run -vv` as well as `ns-hpc -vv run`.
  app.fallthrough();
  app.add_option("-c,--config", inv.config_path,
                 "TOML config file (highest-priority layer); also read from NS_HPC_CONFIG")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  LogRequest log_request;
  add_log_options(app, log_request);
  // Before any command runs (and so before the config is read).
  app.parse_complete_callback([&log_request] { log::set_level(requested_level(log_request)); });

  add_run_command(app, inv);
  add_computer_command(app, inv);
  add_doctor_command(app, inv);
  add_bwrap_command(app, inv);
  add_instance_commands(app, inv);
  add_image_commands(app, inv);
  add_clean_command(app, inv);
  add_config_commands(app, inv);

  // `computer` takes the seed's command line, which CLI11 does not see: the options before it
  // (--config, the log ones) are parsed here, everything after it goes to computer_main.
  for (int i = 1; i < argc; ++i) {
    const std::string_view word = argv[i];
    if (word == "--") break;
    if (word != "computer") continue;
    try {
      app.require_subcommand(0);
      app.parse(i, argv);
    } catch (const CLI::ParseError& e) {
      return app.exit(e);
    }
    if (app.get_subcommands().empty()) return computer_main(inv, std::vector<std::string>(argv + i + 1, argv + argc));
    break;  // "computer" was the value of an option of another command
  }
  app.require_subcommand(1);

  // The command after "--" is kept exactly as given; CLI11 parses only what comes before.
  int cli_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      inv.trailing = std::vector<std::string>(argv + i + 1, argv + argc);
      cli_argc = i;
      break;
    }
  }
  try {
    app.parse(cli_argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(e.what());
    std::fprintf(stderr, "Run 'ns-hpc --help' (or 'ns-hpc COMMAND --help') for usage.\n");
    return 2;
  } catch (const NotFound& e) {
    print_error(fmt::format("{}; {}", e.what(), not_found_advice(e)));
    return 1;
  } catch (const NeedsAction& e) {
    print_error(fmt::format("{}; {}", e.what(), needs_action_advice(e)));
    return 1;
  } catch (const UsageError& e) {
    print_error(e.what());
    return 1;
  } catch (const config::ConfigError& e) {
    for (const auto& problem : e.problems()) print_error(problem);
    return 1;
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
  std::fflush(stdout);
  return inv.exit_code;
}

std::string not_found_advice(const NotFound& e) {
  const NotFound::Facts& f = e.facts();
  if (e.kind() == NotFound::Kind::instance && !f.archive_name.empty())
    return fmt::format("'ns-hpc instance restore {}' brings it back", f.archive_name);
  std::string advice = f.near_miss.empty() ? "" : fmt::format("did you mean '{}'? ", f.near_miss);
  switch (e.kind()) {
    case NotFound::Kind::instance: return advice + "'ns-hpc instance list' lists the active ones";
    case NotFound::Kind::job: return advice + "'ns-hpc instance jobs ID' lists an instance's jobs";
    case NotFound::Kind::archive: return advice + "'ns-hpc instance list-archived' lists the archives";
    case NotFound::Kind::image:
      return advice + fmt::format("build it with 'ns-hpc image build {}' ('ns-hpc image list' lists the images)",
                                  f.name.empty() ? "NAME" : f.name);
  }
  return advice;
}

std::string needs_action_advice(const NeedsAction& e) {
  const std::string id = e.instance_id().empty() ? "ID" : e.instance_id();
  switch (e.action()) {
    case NeedsAction::Action::choose_network:
      return fmt::format("choose 'filtered' or 'off' (ns-hpc instance update {} --network filtered)", id);
    case NeedsAction::Action::reset_instance:
      return fmt::format("reset the instance (ns-hpc instance reset {}) or restore a snapshot (ns-hpc instance "
                         "snapshot-restore {} NAME)",
                         id, id);
    case NeedsAction::Action::build_image:
      return "build the image as the user who runs ns-hpc (ns-hpc image build NAME)";
    case NeedsAction::Action::check_id_ranges:
      return "check your ranges in /etc/subuid and /etc/subgid ('ns-hpc doctor' checks them)";
    case NeedsAction::Action::check_host:
      return "run 'ns-hpc doctor' and try again";
  }
  return "run 'ns-hpc doctor'";
}

}  // namespace nshpc::cli
