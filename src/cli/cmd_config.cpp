// ns-hpc config show [--json] | config check FILE | config keys [--markdown]
#include <cstdio>

#include "base/error.hpp"
#include "cli/app.hpp"
#include "cli/output.hpp"

namespace nshpc::cli {

void add_config_commands(CLI::App& app, Invocation& inv) {
  auto* config_cmd = app.add_subcommand("config", "Show or check the configuration");
  config_cmd->require_subcommand(1);

  auto json = std::make_shared<bool>(false);
  auto* show = config_cmd->add_subcommand("show", "Print the effective configuration (all layers merged)");
  show->add_flag("--json", *json, "Print JSON instead of TOML");
  show->callback([&inv, json] {
    const config::Config& cfg = inv.config();
    if (*json) {
      print_json(config::to_json(cfg));
      return;
    }
    std::printf("# Effective ns-hpc configuration. Layers read:%s\n", cfg.sources.empty() ? " (defaults only)" : "");
    for (const auto& source : cfg.sources) std::printf("#   %s\n", source.c_str());
    std::string text = config::to_toml(cfg);
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
  });

  auto markdown = std::make_shared<bool>(false);
  auto* keys = config_cmd->add_subcommand("keys", "Describe every key: its type, default and meaning");
  keys->add_flag("--markdown", *markdown, "Print the Markdown table of the README's configuration section");
  keys->callback([markdown] {
    const std::string text = *markdown ? config::keys_markdown() : config::keys_text();
    std::fwrite(text.data(), 1, text.size(), stdout);
  });

  auto file = std::make_shared<std::string>();
  auto* check = config_cmd->add_subcommand("check", "Validate one config file (on top of the defaults)");
  check->add_option("file", *file, "TOML file to check")->required();
  check->callback([file] {
    config::Loaded loaded = config::check_file(*file);
    for (const auto& warning : loaded.warnings) std::fprintf(stderr, "ns-hpc: warning: %s\n", warning.c_str());
    std::printf("%s: OK%s\n", file->c_str(),
                loaded.warnings.empty() ? "" : " (with warnings above)");
  });
}

}  // namespace nshpc::cli
