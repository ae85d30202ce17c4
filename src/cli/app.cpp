#include "cli/app.hpp"

#include <unistd.h>

#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"

namespace nshpc::cli {

const config::Config& Context::config() {
  if (!loaded_) {
    config::LoadOptions options;
    options.explicit_path = config_path;
    loaded_ = config::load(options);
    for (const auto& warning : loaded_->warnings) log::warn("{}", warning);
  }
  return loaded_->config;
}

const std::vector<std::string>& Context::config_warnings() {
  config();
  return loaded_->warnings;
}

store::Store& Context::store() {
  if (!store_) {
    jobs_guard_ = std::make_unique<store::RecordedJobsGuard>();
    store_ = std::make_unique<store::Store>(config(), *jobs_guard_);
  }
  return *store_;
}

sandbox::Backend& Context::backend() {
  if (!backend_) backend_ = sandbox::make_bwrap_backend(config());
  return *backend_;
}

jobs::Engine& Context::jobs() {
  if (!jobs_) {
    jobs_ = std::make_unique<jobs::Engine>(config(), store(), backend());
    store().set_jobs_guard(*jobs_);
  }
  return *jobs_;
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

namespace {

void print_error(std::string_view message) {
  // One line: newlines inside a message (several config problems) stay, each still one line.
  std::string text(message);
  std::fprintf(stderr, "ns-hpc: error: %s\n", text.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  log::init();
  Context ctx;
  CLI::App app{
      "ns-hpc: safe, persistent Linux sandboxes (bubblewrap) for LLM agents and people.\n"
      "Instances keep a workspace; every command runs in a fresh hardened sandbox.",
      "ns-hpc"};
  app.set_version_flag("--version", std::string("ns-hpc ") + NSHPC_VERSION);
  app.require_subcommand(1);
  app.add_option("-c,--config", ctx.config_path,
                 "TOML config file (highest-priority layer); also read from NS_HPC_CONFIG")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  add_run_command(app, ctx);
  add_doctor_command(app, ctx);
  add_bwrap_command(app, ctx);
  add_instance_commands(app, ctx);
  add_clean_command(app, ctx);
  add_config_commands(app, ctx);

  // The command after "--" is kept exactly as given; CLI11 parses only what comes before.
  int cli_argc = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      ctx.trailing = std::vector<std::string>(argv + i + 1, argv + argc);
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
  return ctx.exit_code;
}

}  // namespace nshpc::cli
