// Reading the merged layers: positions and problems, the types of values with their rules, the
// Section that hands out the keys of a table, and validate(), which reads the whole key table.
#include "config/reader.hpp"

#include <cmath>
#include <stdexcept>

#include "base/fs.hpp"
#include "config/keys.hpp"

namespace nshpc::config::detail {

namespace stdfs = std::filesystem;

std::string position(const toml::source_region& where) {
  const std::string_view file = where.path ? std::string_view(*where.path) : "<unknown>";
  return fmt::format("{}:{}:{}", file, where.begin.line, where.begin.column);
}

void Diagnostics::error(const toml::source_region& where, std::string_view key, std::string_view message) {
  if (key.empty()) {
    errors.push_back(fmt::format("{}: {}", position(where), message));
  } else {
    errors.push_back(fmt::format("{}: {}: {}", position(where), key, message));
  }
}

void Diagnostics::warning(const toml::source_region& where, std::string_view message) {
  warnings.push_back(fmt::format("{}: {}", position(where), message));
}

stdfs::path user_config_dir(const EnvLookup& env) {
  const std::string xdg = env("XDG_CONFIG_HOME").value_or("");
  // The XDG spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
  stdfs::path base = !xdg.empty() && stdfs::path(xdg).is_absolute()
                         ? stdfs::path(xdg)
                         : stdfs::path(fs::expand_user_vars("~/.config", env));
  if (base.is_relative()) base = stdfs::absolute(base);
  return (base / "ns-hpc").lexically_normal();
}

std::string join_key(std::string_view prefix, std::string_view name) {
  const bool bare =
      !name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return is_alnum(c) || c == '_' || c == '-'; });
  std::string part = bare ? std::string(name) : fmt::format("{:?}", name);
  return prefix.empty() ? part : fmt::format("{}.{}", prefix, part);
}

std::string_view type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "a list";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

const toml::source_region& key_region(const toml::key& key, const toml::node& value) {
  return key.source().path ? key.source() : value.source();
}

void LoadState::error(const Field& field, std::string_view message) const {
  diagnostics.error(field.node.source(), field.key, message);
}

void LoadState::wrong_type(const Field& field, std::string_view expected) const {
  error(field, fmt::format("expected {}, got {}", expected, type_name(field.node)));
}

stdfs::path LoadState::base_dir(const toml::source_region& where) const {
  if (!where.path || *where.path == kDefaultsSource) return defaults_dir;
  return stdfs::path(*where.path).parent_path();
}

// ---- types of values ------------------------------------------------------------------------

Type<bool> boolean() {
  std::string expected = "a boolean (true or false)";
  return {expected, [expected](const Field& field, LoadState& state) -> std::optional<bool> {
            if (const auto* value = field.node.as_boolean()) return value->get();
            state.wrong_type(field, expected);
            return std::nullopt;
          }};
}

Type<std::int64_t> integer(const IntRule& rule) {
  const std::string range =
      rule.open_ended ? fmt::format("{} or more", rule.min) : fmt::format("{}..{}", rule.min, rule.max);
  const std::string allowed = rule.meaning.empty() ? range : fmt::format("{}, {}", rule.meaning, range);
  std::string expected = fmt::format("an integer ({})", allowed);
  return {expected, [rule, allowed, expected](const Field& field, LoadState& state) -> std::optional<std::int64_t> {
            const auto* value = field.node.as_integer();
            if (!value) {
              state.wrong_type(field, expected);
              return std::nullopt;
            }
            const std::int64_t number = value->get();
            if (number < rule.min || number > rule.max) {
              state.error(field, fmt::format("{} is out of range; use an integer ({})", number, allowed));
              return std::nullopt;
            }
            return number;
          }};
}

Type<double> number(const NumberRule& rule) {
  const std::string allowed = rule.min_allowed ? fmt::format("{}, {} or more", rule.meaning, rule.min)
                                               : fmt::format("{}, more than {}", rule.meaning, rule.min);
  std::string expected = fmt::format("a number ({})", allowed);
  return {expected, [rule, allowed, expected](const Field& field, LoadState& state) -> std::optional<double> {
            std::optional<double> number;
            if (const auto* integer = field.node.as_integer()) number = static_cast<double>(integer->get());
            if (const auto* real = field.node.as_floating_point()) number = real->get();
            if (!number) {
              state.wrong_type(field, expected);
              return std::nullopt;
            }
            const bool in_range =
                std::isfinite(*number) && (rule.min_allowed ? *number >= rule.min : *number > rule.min);
            if (!in_range) {
              state.error(field, fmt::format("{} is out of range; use a number ({})", *number, allowed));
              return std::nullopt;
            }
            return number;
          }};
}

Type<std::string> text(const StringRule& rule) {
  std::string expected = rule.what.empty() ? std::string("a string") : fmt::format("a string ({})", rule.what);
  std::string empty_error = rule.what.empty() ? std::string("must not be an empty string")
                                              : fmt::format("must not be empty; give {}", rule.what);
  return {expected,
          [non_empty = rule.non_empty, expected, empty_error](const Field& field,
                                                              LoadState& state) -> std::optional<std::string> {
            const auto* value = field.node.as_string();
            if (!value) {
              state.wrong_type(field, expected);
              return std::nullopt;
            }
            if (non_empty && value->get().empty()) {
              state.error(field, empty_error);
              return std::nullopt;
            }
            return value->get();
          }};
}

namespace {

// `base`, and then `check` on its value: a Type with the same words and one more rule.
template <class T, class Check>
Type<T> refine(Type<T> base, Check check) {
  return {base.expected, [read = std::move(base.read), check](const Field& field, LoadState& state) -> std::optional<T> {
            auto value = read(field, state);
            if (!value) return std::nullopt;
            return check(std::move(*value), field, state);
          }};
}

// Absolute and lexically normal, without a trailing slash; a relative path is taken from `base`.
stdfs::path absolute_path(std::string_view text, const stdfs::path& base) {
  stdfs::path path(text);
  if (path.is_relative()) path = base / path;
  path = path.lexically_normal();
  if (!path.has_filename() && path.has_relative_path()) path = path.parent_path();
  return path;
}

bool is_sandbox_path(std::string_view text) {
  if (text.empty() || text.front() != '/' || text.find('\0') != std::string_view::npos) return false;
  const stdfs::path path(text);
  if (std::any_of(path.begin(), path.end(), [](const stdfs::path& part) { return part == ".."; })) {
    return false;
  }
  return path.lexically_normal() != "/";
}

constexpr std::string_view kBadVarName =
    "is not a valid variable name; use letters, digits and _ (not starting with a digit)";

std::string item_key(std::string_view list_key, std::size_t index) {
  return fmt::format("{}[{}]", list_key, index);
}

// Every item of a list read as `item`; nullopt when the value is not a list or an item is bad
// (all bad items are reported).
template <class T>
Type<std::vector<T>> list_of(Type<T> item, std::string expected) {
  return {expected, [item, expected](const Field& field, LoadState& state) -> std::optional<std::vector<T>> {
            const toml::array* list = field.node.as_array();
            if (!list) {
              state.wrong_type(field, expected);
              return std::nullopt;
            }
            std::vector<T> items;
            bool all_good = true;
            for (std::size_t i = 0; i < list->size(); ++i) {
              if (auto value = item.read(Field{*list->get(i), item_key(field.key, i)}, state)) {
                items.push_back(std::move(*value));
              } else {
                all_good = false;
              }
            }
            if (!all_good) return std::nullopt;
            return items;
          }};
}

// Whether `name` may be set by an env table; reports why not.
bool check_env_name(std::string_view name, const toml::source_region& where, const std::string& key,
                    const EnvRule& rule, LoadState& state) {
  if (!is_var_name(name)) {
    state.diagnostics.error(where, key, fmt::format("{:?} {}", name, kBadVarName));
    return false;
  }
  if (rule.reserve_path_and_home && name == "PATH") {
    state.diagnostics.error(where, key, "PATH cannot be set here; use namespace.path");
    return false;
  }
  if (rule.reserve_path_and_home && name == "HOME") {
    state.diagnostics.error(where, key, "HOME cannot be set here; ns-hpc sets it itself");
    return false;
  }
  return true;
}

}  // namespace

Type<std::string> program() {
  return refine(text({"the program to run", true}),
                [](std::string value, const Field& field, LoadState& state) -> std::optional<std::string> {
                  if (value.find('\0') == std::string::npos) return value;
                  state.error(field, "must not contain a NUL character; give the program to run");
                  return std::nullopt;
                });
}

Type<std::string> url_path() {
  return refine(text({"an URL path starting with /"}),
                [](std::string value, const Field& field, LoadState& state) -> std::optional<std::string> {
                  if (!value.empty() && value.front() == '/' && value.find_first_of("?# \t") == std::string::npos)
                    return value;
                  state.error(field, fmt::format("{:?} is not an URL path; use something like \"/mcp\"", value));
                  return std::nullopt;
                });
}

Type<std::string> sandbox_path() {
  return refine(text({"an absolute sandbox path"}),
                [](std::string value, const Field& field, LoadState& state) -> std::optional<std::string> {
                  if (is_sandbox_path(value)) return absolute_path(value, "/").string();
                  state.error(field, fmt::format("{:?} is not allowed; use an absolute sandbox path (starting "
                                                 "with /, not / itself, without ..)",
                                                 value));
                  return std::nullopt;
                });
}

Type<stdfs::path> folder() {
  const Type<std::string> base = text({"a folder path"});
  return {base.expected, [read = base.read](const Field& field, LoadState& state) -> std::optional<stdfs::path> {
            const auto written = read(field, state);
            if (!written) return std::nullopt;
            const std::string expanded = fs::expand_user_vars(*written, state.env);
            if (expanded.empty()) {
              state.error(field,
                          fmt::format("{:?} is empty after expanding ~ and $VARs; give a folder path", *written));
              return std::nullopt;
            }
            return absolute_path(expanded, state.base_dir(field.node.source()));
          }};
}

Type<std::vector<std::string>> strings() { return list_of(text(), "a list of strings"); }

// [network] allow / resolve entries: non-empty, no blanks; `name=address` pairs with `pairs`.
// The proxy parses them fully (and refuses to start on one it cannot use).
Type<std::vector<std::string>> network_entries(bool pairs) {
  return refine(strings(), [pairs](std::vector<std::string> value, const Field& field,
                                   LoadState& state) -> std::optional<std::vector<std::string>> {
    for (const std::string& entry : value) {
      const bool blank = entry.empty() || entry.find_first_of(" \t\r\n/") != std::string::npos;
      const auto eq = entry.find('=');
      if (blank || (pairs && (eq == std::string::npos || eq == 0 || eq + 1 == entry.size()))) {
        state.error(field, fmt::format("{:?} is not {}", entry,
                                       pairs ? "a \"name=address\" pair" : "a name, *.domain or address (with an optional :port)"));
        return std::nullopt;
      }
    }
    return value;
  });
}

Type<std::vector<std::string>> argv() {
  return refine(list_of(text({.what = {}, .non_empty = true}), "a non-empty list of strings"),
                [](std::vector<std::string> value, const Field& field,
                   LoadState& state) -> std::optional<std::vector<std::string>> {
                  if (!value.empty()) return value;
                  state.error(field, "must be a non-empty list of strings");
                  return std::nullopt;
                });
}

Type<std::vector<std::string>> var_names() {
  const Type<std::string> name =
      refine(text({"a variable name"}), [](std::string value, const Field& field, LoadState& state) -> std::optional<std::string> {
        if (is_var_name(value)) return value;
        state.error(field, fmt::format("{:?} {}", value, kBadVarName));
        return std::nullopt;
      });
  return list_of(name, "a list of variable names");
}

Type<std::vector<stdfs::path>> folders() { return list_of(folder(), "a list of folder paths"); }

Type<std::map<std::string, std::string>> variables(const EnvRule& rule) {
  std::string expected = "a table of NAME = \"value\"";
  return {expected, [rule, expected, value_type = text({"the variable's value"})](
                        const Field& field, LoadState& state) -> std::optional<std::map<std::string, std::string>> {
            const toml::table* table = field.node.as_table();
            if (!table) {
              state.wrong_type(field, expected);
              return std::nullopt;
            }
            std::map<std::string, std::string> env;
            bool all_good = true;
            for (auto&& [name, value] : *table) {
              const std::string key = join_key(field.key, name.str());
              const bool good_name = check_env_name(name.str(), key_region(name, value), key, rule, state);
              const auto text = value_type.read(Field{value, key}, state);
              if (good_name && text) {
                env.emplace(name.str(), *text);
              } else {
                all_good = false;
              }
            }
            if (!all_good) return std::nullopt;
            return env;
          }};
}

std::string alternatives(const std::vector<std::string>& names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
    text += fmt::format("\"{}\"", names[i]);
  }
  return text;
}

// ---- tables ---------------------------------------------------------------------------------

std::string_view Section::name() const {
  const auto dot = key_.rfind('.');
  return dot == std::string::npos ? std::string_view(key_) : std::string_view(key_).substr(dot + 1);
}

std::optional<Field> Section::take(std::string_view name) {
  taken_.emplace(name);
  return find(name);
}

std::optional<Field> Section::find(std::string_view name) const {
  const toml::node* node = table_.get(name);
  if (!node) return std::nullopt;
  return Field{*node, join_key(key_, name)};
}

std::optional<Field> Section::require(std::string_view name, std::string_view hint) {
  auto field = take(name);
  if (!field) state_.diagnostics.error(table_.source(), join_key(key_, name), fmt::format("missing; {}", hint));
  return field;
}

void Section::for_each_unknown(
    const std::function<void(const toml::key&, const toml::node&, const std::string&)>& report) const {
  for (auto&& [name, node] : table_) {
    if (!taken_.contains(name.str())) report(name, node, join_key(key_, name.str()));
  }
}

void Section::warn_unknown() const {
  for_each_unknown([this](const toml::key& name, const toml::node& node, const std::string& key) {
    state_.diagnostics.warning(key_region(name, node), fmt::format("unknown key '{}' ignored", key));
  });
}

bool Section::check_name(const toml::key& name, const toml::node& node, const std::string& key,
                         const NameRule& rule) {
  if (rule.valid(name.str())) return true;
  state_.diagnostics.error(key_region(name, node), key,
                           fmt::format("{:?} is not a valid name; use {}", name.str(), rule.allowed));
  return false;
}

// ---- keys -----------------------------------------------------------------------------------

void warn_reserved(LoadState& state, const toml::source_region& where, const std::string& key, const KeyDoc& doc) {
  state.diagnostics.warning(where, fmt::format("reserved key '{}' read but not used: {}", key, doc.about.reserved));
}

std::optional<Field> key_field(Section& section, const KeyDoc& doc, std::optional<toml::table>& default_holder) {
  if (auto field = doc.about.required.empty() ? section.take(doc.name) : section.require(doc.name, doc.about.required)) {
    if (!doc.about.reserved.empty()) warn_reserved(section.state(), field->node.source(), field->key, doc);
    return field;
  }
  const std::string& written =
      section.state().as_root && !doc.about.as_root.empty() ? doc.about.as_root : doc.about.defaults_to;
  if (written.empty()) return std::nullopt;  // required (reported), or reserved without a default
  try {
    default_holder = toml::parse("value = " + written, std::string(kDefaultsSource));
  } catch (const toml::parse_error& e) {
    throw std::logic_error(fmt::format("the built-in default of {} ({}) is not TOML: {}",
                                       join_key(section.key(), doc.name), written, e.description()));
  }
  return Field{*default_holder->get("value"), join_key(section.key(), doc.name)};
}

namespace {

// Warns about each leaf below a legacy key, naming what replaced it.
void warn_legacy(const toml::key& name, const toml::node& node, const std::string& key,
                 std::string_view replacement, LoadState& state) {
  if (const toml::table* table = node.as_table(); table && !table->empty()) {
    for (auto&& [child, value] : *table) {
      const std::string child_key = join_key(key, child.str());
      warn_legacy(child, value, child_key, legacy_replacement(child_key).value_or(replacement), state);
    }
    return;
  }
  state.diagnostics.warning(
      key_region(name, node),
      fmt::format("'{}' is a legacy ns-hpc key and is ignored; use {} instead", key, replacement));
}

}  // namespace

Config validate(const toml::table& merged, const EnvLookup& env, bool as_root, Diagnostics& diagnostics) {
  LoadState state{diagnostics, env, user_config_dir(env), as_root};
  Section root(merged, "", state);
  Config config;
  read_keys(root, config, config_keys());
  root.for_each_unknown([&](const toml::key& name, const toml::node& node, const std::string& key) {
    if (const auto replacement = legacy_replacement(key)) {
      warn_legacy(name, node, key, *replacement, state);
    } else {
      diagnostics.warning(key_region(name, node), fmt::format("unknown key '{}' ignored", key));
    }
  });
  return config;
}

}  // namespace nshpc::config::detail
