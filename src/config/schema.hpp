// Internal to src/config: the problems found while loading, and the schema check that turns the
// merged TOML layers into a Config.
#pragma once

#include <array>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "config/config.hpp"

namespace nshpc::config::detail {

// The source name of the built-in defaults layer, as it appears in positions.
inline constexpr std::string_view kDefaultsSource = "<defaults>";

// The tables whose entries are named by the user; an entry with `enabled = false` is removed.
inline constexpr std::array<std::string_view, 5> kNamedTables = {
    "proxied_mcps", "host_commands", "dav.extras", "jobs.slurm.limit", "jobs.local.limit"};

// "file:line:col" of a value, key or table.
std::string position(const toml::source_region& where);

// The dotted key of `name` inside `prefix` ("" for the top level); a name that is not a bare TOML
// key is quoted.
std::string join_key(std::string_view prefix, std::string_view name);

// "a string", "an integer", ... for messages.
std::string_view type_name(const toml::node& node);

// The problems of one load: any error refuses the configuration; warnings go with it.
struct Diagnostics {
  std::vector<std::string> errors;
  std::vector<std::string> warnings;

  // "file:line:col: dotted.key: message" (without the key part when `key` is empty).
  void error(const toml::source_region& where, std::string_view key, std::string_view message);
  // "file:line:col: message"
  void warning(const toml::source_region& where, std::string_view message);
};

// ${XDG_CONFIG_HOME:-$HOME/.config}/ns-hpc, absolute. The user file lives here, and relative
// paths of the defaults layer are resolved against it.
std::filesystem::path user_config_dir(const EnvLookup& env);

// Checks the merged layers against the schema and converts them. Every problem is added to
// `diagnostics`; the result is only meaningful when no error was added. `sources` is left empty.
Config validate(const toml::table& merged, const EnvLookup& env, Diagnostics& diagnostics);

}  // namespace nshpc::config::detail
