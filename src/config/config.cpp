// Loading: reads the layers, merges them, removes disabled entries and validates the result
// against the key table. Output: the effective configuration as JSON or as TOML, from the table.
#include "config/config.hpp"

#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "base/text.hpp"
#include "config/keys.hpp"

namespace nshpc::config {

namespace stdfs = std::filesystem;

namespace names {
NLOHMANN_JSON_SERIALIZE_ENUM(ResultType, {{ResultType::text, "text"},
                                          {ResultType::structured, "structured"},
                                          {ResultType::both, "both"}})
NLOHMANN_JSON_SERIALIZE_ENUM(Network, {{Network::host, "host"},
                                       {Network::off, "off"},
                                       {Network::nat, "nat"},
                                       {Network::filtered, "filtered"}})
NLOHMANN_JSON_SERIALIZE_ENUM(DefaultNetwork, {{DefaultNetwork::automatic, "auto"},
                                              {DefaultNetwork::host, "host"},
                                              {DefaultNetwork::off, "off"},
                                              {DefaultNetwork::nat, "nat"},
                                              {DefaultNetwork::filtered, "filtered"}})
NLOHMANN_JSON_SERIALIZE_ENUM(StatusSource, {{StatusSource::automatic, "auto"},
                                            {StatusSource::sacct, "sacct"},
                                            {StatusSource::squeue, "squeue"}})
}  // namespace names

void to_json(nlohmann::json& out, const ResultType& value) { names::to_json(out, value); }
void from_json(const nlohmann::json& in, ResultType& value) { names::from_json(in, value); }
void to_json(nlohmann::json& out, const Network& value) { names::to_json(out, value); }
void from_json(const nlohmann::json& in, Network& value) { names::from_json(in, value); }
void to_json(nlohmann::json& out, const DefaultNetwork& value) { names::to_json(out, value); }
void from_json(const nlohmann::json& in, DefaultNetwork& value) { names::from_json(in, value); }
void to_json(nlohmann::json& out, const StatusSource& value) { names::to_json(out, value); }
void from_json(const nlohmann::json& in, StatusSource& value) { names::from_json(in, value); }
void to_json(nlohmann::json& out, const PortRange& range) { out = to_string(range); }

template <class E>
  requires std::is_enum_v<E>
std::string to_string(E value) {
  return nlohmann::json(value).get<std::string>();
}

template <class E>
  requires std::is_enum_v<E>
std::optional<E> from_string(std::string_view name) {
  const E value = nlohmann::json(name).get<E>();  // the first value when no value has this name
  if (to_string(value) != name) return std::nullopt;
  return value;
}

template std::string to_string(ResultType);
template std::string to_string(Network);
template std::string to_string(DefaultNetwork);
template std::string to_string(StatusSource);
template std::optional<ResultType> from_string<ResultType>(std::string_view);
template std::optional<Network> from_string<Network>(std::string_view);
template std::optional<DefaultNetwork> from_string<DefaultNetwork>(std::string_view);
template std::optional<StatusSource> from_string<StatusSource>(std::string_view);

ConfigError::ConfigError(std::vector<std::string> problems)
    : std::runtime_error(fmt::format("{}", fmt::join(problems, "\n"))), problems_(std::move(problems)) {}

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
  auto defaults = parse_layer(detail::defaults_layer_toml(), std::string(detail::kDefaultsSource), diagnostics);
  throw_if_errors(diagnostics);  // only if the generated text is broken
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
  for (const std::string& named_key : detail::named_table_keys()) {
    toml::table* named = merged.at_path(named_key).as_table();
    if (!named) continue;  // a wrong type is reported when the keys are read
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

Loaded load_layers(const std::vector<LayerFile>& files, const EnvLookup& env, bool as_root) {
  Diagnostics diagnostics;
  std::vector<toml::table> layers;
  layers.push_back(parse_defaults());
  std::vector<stdfs::path> sources;
  for (const LayerFile& file : files) {
    const auto text = read_layer_text(file, diagnostics);
    log::debug("config: {} {}: {}", file.label, text ? "read" : "not there", file.path.string());
    if (!text) continue;
    sources.push_back(file.path);
    if (auto layer = parse_layer(*text, file.path.string(), diagnostics)) layers.push_back(std::move(*layer));
  }
  throw_if_errors(diagnostics);

  // Before the layers merge: whether a file of the user's sets bwrap_command with --share-net (a
  // copy of the built-in list, which has it, as `config show` writes, does not count).
  bool shares_net = false;
  const toml::array* built_in_command = layers.front()["namespace"]["bwrap_command"].as_array();
  for (std::size_t i = 1; i < layers.size(); ++i)
    if (const toml::array* cmd = layers[i]["namespace"]["bwrap_command"].as_array();
        cmd && !(built_in_command && *cmd == *built_in_command))
      for (const toml::node& arg : *cmd)
        if (arg.value<std::string>() == "--share-net") shares_net = true;
  toml::table merged = merge_layers(std::move(layers));
  remove_disabled_entries(merged, diagnostics);
  Config config = detail::validate(merged, env, as_root, diagnostics);
  config.ns.bwrap_shares_net = shares_net;
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
  return load_layers({{absolute_file(file), "config file", true}}, env ? env : process_env(), running_as_root());
}

std::vector<std::string> self_command(const Config& config, std::string_view why) {
  std::vector<std::string> cmd{fs::self_program(why)};
  if (config.explicit_file) cmd.insert(cmd.end(), {"--config", config.explicit_file->string()});
  return cmd;
}

Network resolve_default_network(DefaultNetwork configured, bool bwrap_shares_net, bool nat_works) {
  switch (configured) {
    case DefaultNetwork::host: return Network::host;
    case DefaultNetwork::off: return Network::off;
    case DefaultNetwork::nat: return Network::nat;
    case DefaultNetwork::filtered: return Network::filtered;
    case DefaultNetwork::automatic: break;
  }
  if (bwrap_shares_net) return Network::host;
  return nat_works ? Network::nat : Network::filtered;
}

Config built_in(const EnvLookup& env, bool as_root) {
  return load_layers({}, env ? env : process_env(), as_root).config;
}

// ---- output ---------------------------------------------------------------------------------

nlohmann::json to_json(const Config& config) {
  nlohmann::json out = nlohmann::json::object();
  detail::show_keys(config, detail::config_keys(), out);
  out["sources"] = detail::shown(config.sources);
  return out;
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
  for (const auto& item : object.items()) {
    const std::string& key = item.key();  // (clang 14 cannot capture a structured binding)
    convert(item.value(), [&](auto&& v) { out.insert(key, std::forward<decltype(v)>(v)); });
  }
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
  for (const std::string& named_key : detail::named_table_keys()) {
    const toml::table* default_entries = defaults.at_path(named_key).as_table();
    toml::table* entries = out.at_path(named_key).as_table();
    if (!default_entries || !entries) continue;
    for (auto&& [name, entry] : *default_entries) {
      if (!entries->contains(name.str())) entries->insert(name.str(), toml::table{{"enabled", false}});
    }
  }
}

// Moves the reserved keys of `json` (at their dotted keys) into a JSON of their own, dropping the
// tables they leave empty.
nlohmann::json take_reserved(nlohmann::json& json) {
  nlohmann::json reserved = nlohmann::json::object();
  for (const std::string& key : detail::reserved_keys()) {
    const std::vector<std::string_view> parts = nshpc::text::split(key, '.');
    const std::vector<std::string> path(parts.begin(), parts.end());
    std::vector<nlohmann::json*> tables{&json};  // the tables on the way to the key
    for (std::size_t i = 0; i + 1 < path.size() && tables.back()->contains(path[i]); ++i)
      tables.push_back(&(*tables.back())[path[i]]);
    if (tables.size() != path.size() || !tables.back()->contains(path.back())) continue;
    nlohmann::json* target = &reserved;
    for (std::size_t i = 0; i + 1 < path.size(); ++i) target = &(*target)[path[i]];
    (*target)[path.back()] = std::move((*tables.back())[path.back()]);
    tables.back()->erase(path.back());
    for (std::size_t i = tables.size() - 1; i > 0 && tables[i]->empty(); --i) tables[i - 1]->erase(path[i - 1]);
  }
  return reserved;
}

// One-line double-quoted strings (newlines escaped) and flat tables, as people write them.
std::string toml_text(const toml::table& table) {
  constexpr auto kFlags = toml::toml_formatter::default_flags & ~toml::format_flags::allow_literal_strings &
                          ~toml::format_flags::allow_multi_line_strings &
                          ~toml::format_flags::indent_sub_tables;
  std::ostringstream text;
  text << toml::toml_formatter(table, kFlags) << '\n';
  return text.str();
}

}  // namespace

std::string to_toml(const Config& config) {
  nlohmann::json json = to_json(config);
  json.erase("sources");
  const nlohmann::json reserved = take_reserved(json);
  toml::table out = json_object_to_toml(json);
  add_removed_defaults(out);
  std::string text = toml_text(out);
  if (!reserved.empty()) {
    text += "\n# Reserved: read but not used yet (ns-hpc config keys says what is missing).\n";
    text += toml_text(json_object_to_toml(reserved));
  }
  return text;
}

}  // namespace nshpc::config
