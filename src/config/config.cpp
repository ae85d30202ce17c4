// Loading: reads the layers, merges them, removes disabled entries and validates the result.
// Output: the effective configuration as JSON or as TOML.
#include "config/config.hpp"

#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "config/schema.hpp"

namespace nshpc::config {

namespace stdfs = std::filesystem;

namespace {

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) {
    if (!text.empty()) text += '\n';
    text += line;
  }
  return text;
}

}  // namespace

ConfigError::ConfigError(std::vector<std::string> problems)
    : std::runtime_error(join_lines(problems)), problems_(std::move(problems)) {}

bool running_as_root() { return ::geteuid() == 0; }

EnvLookup process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

namespace {

using detail::Diagnostics;

// A config file to read as a layer.
struct LayerFile {
  stdfs::path path;        // absolute
  std::string_view label;  // how messages name it, e.g. "config file (from --config)"
  bool must_exist;
};

void throw_if_errors(Diagnostics& diagnostics) {
  if (!diagnostics.errors.empty()) throw ConfigError(std::move(diagnostics.errors));
}

// The file's text; nullopt when it is missing (an error when it must exist) or unreadable.
std::optional<std::string> read_layer_text(const LayerFile& file, Diagnostics& diagnostics) {
  try {
    auto text = fs::read_file(file.path);
    if (!text && file.must_exist) {
      diagnostics.errors.push_back(fmt::format("{}: {} does not exist", file.path.string(), file.label));
    }
    return text;
  } catch (const SysError& e) {
    diagnostics.errors.push_back(fmt::format("{}: {} cannot be read: {}", file.path.string(), file.label,
                                             std::generic_category().message(e.code())));
    return std::nullopt;
  }
}

// One line, whatever the parser's description contains.
std::string single_line(std::string_view text) {
  std::string line(text);
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return line;
}

std::optional<toml::table> parse_layer(std::string_view text, std::string source, Diagnostics& diagnostics) {
  try {
    return toml::parse(text, std::move(source));
  } catch (const toml::parse_error& e) {
    diagnostics.errors.push_back(
        fmt::format("{}: TOML syntax error: {}", detail::position(e.source()), single_line(e.description())));
    return std::nullopt;
  }
}

toml::table parse_defaults() {
  Diagnostics diagnostics;
  auto defaults = parse_layer(default_toml(), std::string(detail::kDefaultsSource), diagnostics);
  throw_if_errors(diagnostics);  // only if the built-in text is broken
  return std::move(*defaults);
}

// Moves every entry of `lower` that `upper` does not set into `upper`; tables in both merge
// recursively, anything else in `upper` wins whole. Moving keeps each node's source position.
void merge_under(toml::table& upper, toml::table& lower) {
  for (auto&& [key, lower_node] : lower) {
    toml::node* upper_node = upper.get(key.str());
    if (!upper_node) {
      upper.insert(key, std::move(lower_node));
    } else if (upper_node->is_table() && lower_node.is_table()) {
      merge_under(*upper_node->as_table(), *lower_node.as_table());
    }
  }
}

// The layers merged, lowest first.
toml::table merge_layers(std::vector<toml::table> layers) {
  toml::table merged;
  for (toml::table& layer : layers) {
    merge_under(layer, merged);
    merged = std::move(layer);
  }
  return merged;
}

// Removes the entries of the named tables that say `enabled = false`.
void remove_disabled_entries(toml::table& merged, Diagnostics& diagnostics) {
  for (std::string_view named_key : detail::kNamedTables) {
    toml::table* named = merged.at_path(named_key).as_table();
    if (!named) continue;  // a wrong type is reported by the schema check
    std::vector<std::string> disabled;
    for (auto&& [name, entry] : *named) {
      const toml::table* table = entry.as_table();
      const toml::node* enabled = table ? table->get("enabled") : nullptr;
      if (!enabled) continue;
      if (const auto* flag = enabled->as_boolean()) {
        if (!flag->get()) disabled.emplace_back(name.str());
      } else {
        diagnostics.error(enabled->source(),
                          detail::join_key(detail::join_key(named_key, name.str()), "enabled"),
                          fmt::format("expected a boolean (true keeps the entry, false removes it), got {}",
                                      detail::type_name(*enabled)));
      }
    }
    for (const std::string& name : disabled) named->erase(name);
  }
}

// As root, sandboxes run as an unprivileged uid that must be able to reach the workspaces, so the
// default state folder is the system one rather than root's private home.
void use_system_state_dir(toml::table& defaults) {
  if (toml::table* ns = defaults["namespace"].as_table()) {
    if (toml::node* dir = ns->get("instances_dir")) {
      (void)dir;
      ns->insert_or_assign("instances_dir", std::string(kRootInstancesDir));
    }
  }
  if (toml::table* server = defaults["server"].as_table())
    server->insert_or_assign("state_dir", std::string(kRootStateDir));
}

Loaded load_layers(const std::vector<LayerFile>& files, const EnvLookup& env, bool as_root) {
  Diagnostics diagnostics;
  std::vector<toml::table> layers;
  layers.push_back(parse_defaults());
  if (as_root) use_system_state_dir(layers.front());
  std::vector<stdfs::path> sources;
  for (const LayerFile& file : files) {
    const auto text = read_layer_text(file, diagnostics);
    log::debug("config: {} {}: {}", file.label, text ? "read" : "not there", file.path.string());
    if (!text) continue;
    sources.push_back(file.path);
    if (auto layer = parse_layer(*text, file.path.string(), diagnostics)) layers.push_back(std::move(*layer));
  }
  throw_if_errors(diagnostics);

  toml::table merged = merge_layers(std::move(layers));
  remove_disabled_entries(merged, diagnostics);
  Config config = detail::validate(merged, env, diagnostics);
  throw_if_errors(diagnostics);
  config.sources = std::move(sources);
  return Loaded{std::move(config), std::move(diagnostics.warnings)};
}

stdfs::path absolute_file(const stdfs::path& path) { return stdfs::absolute(path).lexically_normal(); }

// --config, else NS_HPC_CONFIG; nullopt when neither names a file.
std::optional<LayerFile> explicit_layer(const LoadOptions& options, const EnvLookup& env) {
  if (options.explicit_path) {
    return LayerFile{absolute_file(*options.explicit_path), "config file (from --config)", true};
  }
  const std::string from_env = env("NS_HPC_CONFIG").value_or("");
  if (from_env.empty()) return std::nullopt;
  return LayerFile{absolute_file(from_env), "config file (from NS_HPC_CONFIG)", true};
}

}  // namespace

Loaded load(const LoadOptions& options) {
  const EnvLookup env = options.env ? options.env : process_env();
  std::vector<LayerFile> files;
  if (options.read_user_file) {
    files.push_back({detail::user_config_dir(env) / "config.toml", "user config file", false});
  }
  std::optional<stdfs::path> explicit_file;
  if (auto file = explicit_layer(options, env)) {
    explicit_file = file->path;
    files.push_back(std::move(*file));
  }
  Loaded loaded = load_layers(files, env, options.as_root);
  loaded.config.explicit_file = std::move(explicit_file);
  return loaded;
}

Loaded check_file(const stdfs::path& file, const EnvLookup& env) {
  return load_layers({{absolute_file(file), "config file", true}}, env ? env : process_env(),
                     ::geteuid() == 0);
}

// ---- output ---------------------------------------------------------------------------------

namespace {

nlohmann::json limits_json(const std::map<std::string, Limit>& limits) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, limit] : limits) out[name] = {{"default", limit.default_value}, {"max", limit.max}};
  return out;
}

nlohmann::json paths_json(const std::vector<stdfs::path>& paths) {
  nlohmann::json out = nlohmann::json::array();
  for (const stdfs::path& path : paths) out.push_back(path.string());
  return out;
}

nlohmann::json namespace_json(const Namespace& ns) {
  return {
      {"instances_dir", ns.instances_dir.string()},
      {"bwrap_command", ns.bwrap_command},
      {"workspace_mount", ns.workspace_mount},
      {"output_mount", ns.output_mount},
      {"shared_output_mount", ns.shared_output_mount},
      {"shared_output", ns.shared_output},
      {"status_fd", ns.status_fd},
      {"hardening", ns.hardening},
      {"seccomp", ns.seccomp},
      {"sandbox_uid", ns.sandbox_uid},
      {"sandbox_gid", ns.sandbox_gid},
      {"default_network", to_string(ns.default_network)},
      {"path", ns.path},
      {"env", ns.env},
      {"pass_env", ns.pass_env},
      {"tmp_size", ns.tmp_size},
  };
}

nlohmann::json jobs_json(const Jobs& jobs) {
  return {
      {"max_timeout", jobs.max_timeout},
      {"max_running_per_instance", jobs.max_running_per_instance},
      {"max_running", jobs.max_running},
      {"cancel_grace", jobs.cancel_grace},
      {"local",
       {{"use_cgroups", jobs.local.use_cgroups},
        {"cgroups_command", jobs.local.cgroups_command},
        {"proc_check", jobs.local.proc_check},
        {"limit", limits_json(jobs.local.limit)}}},
      {"slurm",
       {{"sbatch_command", jobs.slurm.sbatch_command},
        {"limit", limits_json(jobs.slurm.limit)},
        {"squeue_command", jobs.slurm.squeue_command},
        {"sacct_command", jobs.slurm.sacct_command},
        {"scancel_command", jobs.slurm.scancel_command},
        {"poll_interval", jobs.slurm.poll_interval},
        {"status_source", jobs.slurm.status_source},
        {"ns_hpc_command", jobs.slurm.ns_hpc_command}}},
  };
}

nlohmann::json dav_json(const Dav& dav) {
  nlohmann::json extras = nlohmann::json::object();
  for (const auto& [name, extra] : dav.extras)
    extras[name] = {{"path", extra.path.string()}, {"ro", extra.ro}};
  return {{"enabled", dav.enabled}, {"extras", std::move(extras)}};
}

nlohmann::json proxied_mcps_json(const std::map<std::string, ProxiedMcp>& mcps) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, mcp] : mcps) {
    out[name] = {{"command", mcp.command}, {"args", mcp.args},       {"env", mcp.env},
                 {"include", mcp.include}, {"exclude", mcp.exclude}, {"idle_timeout", mcp.idle_timeout}};
  }
  return out;
}

nlohmann::json host_commands_json(const std::map<std::string, HostCommand>& commands) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, command] : commands) {
    out[name] = {
        {"command", command.command}, {"description", command.description}, {"timeout", command.timeout}};
  }
  return out;
}

}  // namespace

nlohmann::json to_json(const Config& config) {
  return {
      {"namespace", namespace_json(config.ns)},
      {"jobs", jobs_json(config.jobs)},
      {"terminal", {{"limits", config.terminal.limits}}},
      {"audit", {{"max_size", config.audit.max_size}, {"keep", config.audit.keep}}},
      {"resource",
       {{"context_dirs", paths_json(config.resource.context_dirs)},
        {"resource_patterns", config.resource.resource_patterns}}},
      {"mcp",
       {{"result_type", to_string(config.mcp.result_type)},
        {"max_message_bytes", config.mcp.max_message_bytes},
        {"page_size", config.mcp.page_size},
        {"default_instance", config.mcp.default_instance}}},
      {"server",
       {{"host", config.server.host},
        {"port", config.server.port},
        {"path", config.server.path},
        // A secret: shown only as set or not.
        {"auth_token", config.server.auth_token.empty() ? "" : "<set, hidden>"},
        {"state_dir", config.server.state_dir.string()},
        {"allowed_hosts", config.server.allowed_hosts},
        {"allowed_origins", config.server.allowed_origins},
        {"session_idle_timeout", config.server.session_idle_timeout},
        {"max_sessions", config.server.max_sessions},
        {"read_timeout", config.server.read_timeout},
        {"header_timeout", config.server.header_timeout},
        {"shutdown_grace", config.server.shutdown_grace},
        {"sse_buffer_bytes", config.server.sse_buffer_bytes},
        {"max_connections", config.server.max_connections},
        {"max_connections_per_peer", config.server.max_connections_per_peer},
        {"max_sessions_per_peer", config.server.max_sessions_per_peer},
        {"max_requests_per_session", config.server.max_requests_per_session},
        {"max_requests_per_peer", config.server.max_requests_per_peer},
        {"max_session_buffer_bytes", config.server.max_session_buffer_bytes},
        {"max_buffer_bytes", config.server.max_buffer_bytes}}},
      {"dav", dav_json(config.dav)},
      {"proxied_mcps", proxied_mcps_json(config.proxied_mcps)},
      {"host_commands", host_commands_json(config.host_commands)},
      {"sources", paths_json(config.sources)},
  };
}

namespace {

toml::table json_object_to_toml(const nlohmann::json& object);
toml::array json_array_to_toml(const nlohmann::json& array);

// Hands `value` (any JSON the config produces: no nulls) to `add` as the matching TOML value.
template <typename Add>
void convert(const nlohmann::json& value, Add&& add) {
  if (value.is_object())
    add(json_object_to_toml(value));
  else if (value.is_array())
    add(json_array_to_toml(value));
  else if (value.is_boolean())
    add(value.get<bool>());
  else if (value.is_number_integer())
    add(value.get<std::int64_t>());
  else if (value.is_number_float())
    add(value.get<double>());
  else
    add(value.get<std::string>());
}

toml::table json_object_to_toml(const nlohmann::json& object) {
  toml::table out;
  for (const auto& [key, value] : object.items())
    convert(value, [&](auto&& v) { out.insert(key, std::forward<decltype(v)>(v)); });
  return out;
}

toml::array json_array_to_toml(const nlohmann::json& array) {
  toml::array out;
  for (const auto& value : array) convert(value, [&](auto&& v) { out.push_back(std::forward<decltype(v)>(v)); });
  return out;
}

// An entry of the defaults' named tables that the config does not have was removed with
// `enabled = false`; writing it that way keeps the text equivalent when loaded over the defaults.
void add_removed_defaults(toml::table& out) {
  const toml::table defaults = parse_defaults();
  for (std::string_view named_key : detail::kNamedTables) {
    const toml::table* default_entries = defaults.at_path(named_key).as_table();
    toml::table* entries = out.at_path(named_key).as_table();
    if (!default_entries || !entries) continue;
    for (auto&& [name, entry] : *default_entries) {
      if (!entries->contains(name.str())) entries->insert(name.str(), toml::table{{"enabled", false}});
    }
  }
}

}  // namespace

std::string to_toml(const Config& config) {
  nlohmann::json json = to_json(config);
  json.erase("sources");
  toml::table out = json_object_to_toml(json);
  add_removed_defaults(out);
  // One-line double-quoted strings (newlines escaped) and flat tables, as people write them.
  constexpr auto kFlags = toml::toml_formatter::default_flags & ~toml::format_flags::allow_literal_strings &
                          ~toml::format_flags::allow_multi_line_strings &
                          ~toml::format_flags::indent_sub_tables;
  std::ostringstream text;
  text << toml::toml_formatter(out, kFlags) << '\n';
  return text.str();
}

}  // namespace nshpc::config
