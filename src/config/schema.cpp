// The schema of the configuration: every key, its type and its rule. Reads the merged layers into
// a Config and reports each problem at the position of the value that caused it.
#include "config/schema.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <utility>

#include <fmt/format.h>

#include "base/fs.hpp"

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

namespace {

bool is_key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

}  // namespace

std::string join_key(std::string_view prefix, std::string_view name) {
  const bool bare = !name.empty() && std::all_of(name.begin(), name.end(), is_key_char);
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

namespace {

// ---- names and keys -------------------------------------------------------------------------

bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) { return is_lower(c) || is_upper(c) || is_digit(c); }

// True when `text` is one `first` character followed by `rest` characters.
template <class First, class Rest>
bool matches(std::string_view text, First first, Rest rest) {
  return !text.empty() && first(text.front()) && std::all_of(text.begin() + 1, text.end(), rest);
}

bool is_var_name(std::string_view name) {
  return matches(
      name, [](char c) { return is_lower(c) || is_upper(c) || c == '_'; },
      [](char c) { return is_alnum(c) || c == '_'; });
}

bool is_limit_name(std::string_view name) {
  return matches(name, is_lower, [](char c) { return is_lower(c) || is_digit(c) || c == '_'; });
}

bool is_dav_extra_name(std::string_view name) {
  return name != "instances" &&
         matches(name, is_alnum, [](char c) { return is_alnum(c) || c == '_' || c == '.' || c == '-'; });
}

bool is_mcp_name(std::string_view name) {
  return name.find("__") == std::string_view::npos &&
         matches(name, is_alnum, [](char c) { return is_alnum(c) || c == '_' || c == '-'; });
}

bool is_host_command_name(std::string_view name) { return !name.empty(); }

std::string item_key(std::string_view list_key, std::size_t index) {
  return fmt::format("{}[{}]", list_key, index);
}

// Where a key was written; falls back to its value's position.
const toml::source_region& key_region(const toml::key& key, const toml::node& value) {
  return key.source().path ? key.source() : value.source();
}

// ---- reading context ------------------------------------------------------------------------

// A value of the configuration and the dotted key it was found under.
struct Field {
  const toml::node& node;
  std::string key;
};

struct Context {
  Diagnostics& diagnostics;
  const EnvLookup& env;
  stdfs::path defaults_dir;  // relative paths of the defaults layer are resolved against it

  void error(const Field& field, std::string_view message) const {
    diagnostics.error(field.node.source(), field.key, message);
  }
  void wrong_type(const Field& field, std::string_view expected) const {
    error(field, fmt::format("expected {}, got {}", expected, type_name(field.node)));
  }
  // The folder that relative paths written at `where` are resolved against.
  stdfs::path base_dir(const toml::source_region& where) const {
    if (!where.path || *where.path == kDefaultsSource) return defaults_dir;
    return stdfs::path(*where.path).parent_path();
  }
};

// ---- readers of single values: nullopt (and a reported error) when the value breaks its rule --

std::optional<bool> read_bool(const Field& field, Context& ctx) {
  if (const auto* value = field.node.as_boolean()) return value->get();
  ctx.wrong_type(field, "a boolean (true or false)");
  return std::nullopt;
}

struct IntRule {
  std::int64_t min;
  std::int64_t max;
  std::string_view meaning;  // e.g. "seconds"; may be empty
  bool open_ended = false;   // describe the range as "min or more"
};

std::string allowed_ints(const IntRule& rule) {
  const std::string range =
      rule.open_ended ? fmt::format("{} or more", rule.min) : fmt::format("{}..{}", rule.min, rule.max);
  return rule.meaning.empty() ? range : fmt::format("{}, {}", rule.meaning, range);
}

std::optional<std::int64_t> read_int(const Field& field, const IntRule& rule, Context& ctx) {
  const auto* value = field.node.as_integer();
  if (!value) {
    ctx.wrong_type(field, fmt::format("an integer ({})", allowed_ints(rule)));
    return std::nullopt;
  }
  const std::int64_t number = value->get();
  if (number < rule.min || number > rule.max) {
    ctx.error(field, fmt::format("{} is out of range; use an integer ({})", number, allowed_ints(rule)));
    return std::nullopt;
  }
  return number;
}

struct NumberRule {
  double min;
  bool min_allowed;  // whether `min` itself is allowed
  std::string_view meaning;
};

std::string allowed_numbers(const NumberRule& rule) {
  return rule.min_allowed ? fmt::format("{}, {} or more", rule.meaning, rule.min)
                          : fmt::format("{}, more than {}", rule.meaning, rule.min);
}

// An integer or a float.
std::optional<double> read_number(const Field& field, const NumberRule& rule, Context& ctx) {
  std::optional<double> number;
  if (const auto* integer = field.node.as_integer()) number = static_cast<double>(integer->get());
  if (const auto* real = field.node.as_floating_point()) number = real->get();
  if (!number) {
    ctx.wrong_type(field, fmt::format("a number ({})", allowed_numbers(rule)));
    return std::nullopt;
  }
  const bool in_range =
      std::isfinite(*number) && (rule.min_allowed ? *number >= rule.min : *number > rule.min);
  if (!in_range) {
    ctx.error(field, fmt::format("{} is out of range; use a number ({})", *number, allowed_numbers(rule)));
    return std::nullopt;
  }
  return number;
}

struct StringRule {
  std::string_view what;   // what the string is, e.g. "a folder path"; may be empty
  bool non_empty = false;  // refuse ""
};

std::optional<std::string> read_string(const Field& field, const StringRule& rule, Context& ctx) {
  const auto* value = field.node.as_string();
  if (!value) {
    ctx.wrong_type(field,
                   rule.what.empty() ? std::string("a string") : fmt::format("a string ({})", rule.what));
    return std::nullopt;
  }
  if (rule.non_empty && value->get().empty()) {
    ctx.error(field, rule.what.empty() ? std::string("must not be an empty string")
                                       : fmt::format("must not be empty; give {}", rule.what));
    return std::nullopt;
  }
  return value->get();
}

std::optional<std::string> read_program(const Field& field, Context& ctx) {
  auto program = read_string(field, {"the program to run", true}, ctx);
  if (program && program->find('\0') != std::string::npos) {
    ctx.error(field, "must not contain a NUL character; give the program to run");
    return std::nullopt;
  }
  return program;
}

constexpr std::string_view kBadVarName =
    "is not a valid variable name; use letters, digits and _ (not starting with a digit)";

std::optional<std::string> read_var_name(const Field& field, Context& ctx) {
  auto name = read_string(field, {"a variable name"}, ctx);
  if (name && !is_var_name(*name)) {
    ctx.error(field, fmt::format("{:?} {}", *name, kBadVarName));
    return std::nullopt;
  }
  return name;
}

template <class E>
std::string alternatives(std::span<const E> choices) {
  std::string text;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) text += i + 1 == choices.size() ? " or " : ", ";
    text += fmt::format("\"{}\"", to_string(choices[i]));
  }
  return text;
}

// One of `choices`, written as its name.
template <class E>
std::optional<E> read_choice(const Field& field, std::span<const E> choices, Context& ctx) {
  const auto* value = field.node.as_string();
  if (!value) {
    ctx.wrong_type(field, fmt::format("a string ({})", alternatives(choices)));
    return std::nullopt;
  }
  for (E choice : choices) {
    if (to_string(choice) == value->get()) return choice;
  }
  ctx.error(field, fmt::format("{:?} is not allowed; use {}", value->get(), alternatives(choices)));
  return std::nullopt;
}

constexpr std::array kResultTypes{ResultType::text, ResultType::structured, ResultType::both};
constexpr std::array kNetworks{Network::host, Network::off};

std::optional<ResultType> read_result_type(const Field& field, Context& ctx) {
  return read_choice<ResultType>(field, kResultTypes, ctx);
}

std::optional<Network> read_network(const Field& field, Context& ctx) {
  return read_choice<Network>(field, kNetworks, ctx);
}

// Absolute and lexically normal, without a trailing slash; a relative path is taken from `base`.
stdfs::path absolute_path(std::string_view text, const stdfs::path& base) {
  stdfs::path path(text);
  if (path.is_relative()) path = base / path;
  path = path.lexically_normal();
  if (!path.has_filename() && path.has_relative_path()) path = path.parent_path();
  return path;
}

// A host folder: ~ and $VAR expanded, relative to the folder of the file that set it.
std::optional<stdfs::path> read_folder(const Field& field, Context& ctx) {
  const auto text = read_string(field, {"a folder path"}, ctx);
  if (!text) return std::nullopt;
  const std::string expanded = fs::expand_user_vars(*text, ctx.env);
  if (expanded.empty()) {
    ctx.error(field, fmt::format("{:?} is empty after expanding ~ and $VARs; give a folder path", *text));
    return std::nullopt;
  }
  return absolute_path(expanded, ctx.base_dir(field.node.source()));
}

bool is_sandbox_path(std::string_view text) {
  if (text.empty() || text.front() != '/' || text.find('\0') != std::string_view::npos) return false;
  const stdfs::path path(text);
  if (std::any_of(path.begin(), path.end(), [](const stdfs::path& part) { return part == ".."; })) {
    return false;
  }
  return path.lexically_normal() != "/";
}

// A path inside the sandbox: absolute, not "/", without "..".
std::optional<std::string> read_mount(const Field& field, Context& ctx) {
  const auto text = read_string(field, {"an absolute sandbox path"}, ctx);
  if (!text) return std::nullopt;
  if (!is_sandbox_path(*text)) {
    ctx.error(field, fmt::format("{:?} is not allowed; use an absolute sandbox path (starting with /, "
                                 "not / itself, without ..)",
                                 *text));
    return std::nullopt;
  }
  return absolute_path(*text, "/").string();
}

// ---- lists and tables of values -------------------------------------------------------------

// Every item of a list read with `read_item(field, ctx)`; nullopt when the value is not a list or
// an item is bad (all bad items are reported).
template <class ReadItem>
auto read_list(const Field& field, std::string_view expected, Context& ctx, ReadItem read_item)
    -> std::optional<
        std::vector<typename std::invoke_result_t<ReadItem, const Field&, Context&>::value_type>> {
  using Item = typename std::invoke_result_t<ReadItem, const Field&, Context&>::value_type;
  const toml::array* list = field.node.as_array();
  if (!list) {
    ctx.wrong_type(field, expected);
    return std::nullopt;
  }
  std::vector<Item> items;
  bool all_good = true;
  for (std::size_t i = 0; i < list->size(); ++i) {
    if (auto item = read_item(Field{*list->get(i), item_key(field.key, i)}, ctx)) {
      items.push_back(std::move(*item));
    } else {
      all_good = false;
    }
  }
  if (!all_good) return std::nullopt;
  return items;
}

std::optional<std::vector<std::string>> read_strings(const Field& field, Context& ctx) {
  return read_list(field, "a list of strings", ctx,
                   [](const Field& item, Context& c) { return read_string(item, {}, c); });
}

// A program and its arguments: a non-empty list of non-empty strings.
std::optional<std::vector<std::string>> read_argv(const Field& field, Context& ctx) {
  auto argv = read_list(field, "a non-empty list of strings", ctx, [](const Field& item, Context& c) {
    return read_string(item, {.what = {}, .non_empty = true}, c);
  });
  if (argv && argv->empty()) {
    ctx.error(field, "must be a non-empty list of strings");
    return std::nullopt;
  }
  return argv;
}

std::optional<std::vector<std::string>> read_var_names(const Field& field, Context& ctx) {
  return read_list(field, "a list of variable names", ctx, read_var_name);
}

std::optional<std::vector<stdfs::path>> read_folders(const Field& field, Context& ctx) {
  return read_list(field, "a list of folder paths", ctx, read_folder);
}

struct EnvRule {
  bool reserve_path_and_home;  // PATH and HOME have their own settings
};

// Whether `name` may be set by an env table; reports why not.
bool check_env_name(std::string_view name, const toml::source_region& where, const std::string& key,
                    const EnvRule& rule, Context& ctx) {
  if (!is_var_name(name)) {
    ctx.diagnostics.error(where, key, fmt::format("{:?} {}", name, kBadVarName));
    return false;
  }
  if (rule.reserve_path_and_home && name == "PATH") {
    ctx.diagnostics.error(where, key, "PATH cannot be set here; use namespace.path");
    return false;
  }
  if (rule.reserve_path_and_home && name == "HOME") {
    ctx.diagnostics.error(where, key, "HOME cannot be set here; ns-hpc sets it itself");
    return false;
  }
  return true;
}

// A table of NAME = "value".
std::optional<std::map<std::string, std::string>> read_env(const Field& field, const EnvRule& rule,
                                                           Context& ctx) {
  const toml::table* table = field.node.as_table();
  if (!table) {
    ctx.wrong_type(field, "a table of NAME = \"value\"");
    return std::nullopt;
  }
  std::map<std::string, std::string> env;
  bool all_good = true;
  for (auto&& [name, value] : *table) {
    const std::string key = join_key(field.key, name.str());
    const bool good_name = check_env_name(name.str(), key_region(name, value), key, rule, ctx);
    const auto text = read_string(Field{value, key}, {"the variable's value"}, ctx);
    if (good_name && text) {
      env.emplace(name.str(), *text);
    } else {
      all_good = false;
    }
  }
  if (!all_good) return std::nullopt;
  return env;
}

// ---- sections -------------------------------------------------------------------------------

struct NameRule {
  bool (*valid)(std::string_view);
  std::string_view allowed;
};

constexpr NameRule kLimitNames{is_limit_name, "lowercase letters, digits and _ (starting with a letter)"};
constexpr NameRule kDavExtraNames{
    is_dav_extra_name, "letters, digits, _, . and - (starting with a letter or digit; not \"instances\")"};
constexpr NameRule kMcpNames{is_mcp_name,
                             "letters, digits, _ and - (starting with a letter or digit; no \"__\", "
                             "which separates the server from the tool name)"};
constexpr NameRule kHostCommandNames{is_host_command_name, "a non-empty name"};

// A table being read: hands out its values by key and remembers which keys were read, so the
// others can be reported as unknown.
class Section {
 public:
  Section(const toml::table& table, std::string key, Context& ctx)
      : table_(table), key_(std::move(key)), ctx_(ctx) {}

  Context& ctx() const { return ctx_; }
  // The last component of this table's key ("memory" for jobs.local.limit.memory).
  std::string_view name() const {
    const auto dot = key_.rfind('.');
    return dot == std::string::npos ? std::string_view(key_) : std::string_view(key_).substr(dot + 1);
  }

  // The value of `name` (nullopt when absent); the key counts as known from now on.
  std::optional<Field> take(std::string_view name) {
    taken_.emplace(name);
    return find(name);
  }

  // The value of `name` without marking the key as known (for checks across keys).
  std::optional<Field> find(std::string_view name) const {
    const toml::node* node = table_.get(name);
    if (!node) return std::nullopt;
    return Field{*node, join_key(key_, name)};
  }

  // Like take(), but a missing key is an error ("missing; <hint>") at the table's position.
  std::optional<Field> require(std::string_view name, std::string_view hint) {
    auto field = take(name);
    if (!field)
      ctx_.diagnostics.error(table_.source(), join_key(key_, name), fmt::format("missing; {}", hint));
    return field;
  }

  // Sets `out` from the value of `name` when present and valid: reader(field, rule..., ctx).
  template <class T, class Reader, class... Rule>
  void read(std::string_view name, T& out, Reader reader, const Rule&... rule) {
    assign(take(name), out, reader, rule...);
  }

  // Like read(), but a missing key is an error.
  template <class T, class Reader, class... Rule>
  void read_required(std::string_view name, std::string_view hint, T& out, Reader reader,
                     const Rule&... rule) {
    assign(require(name, hint), out, reader, rule...);
  }

  // Reads the sub-table `name` with read_table(Section&), then warns about its unknown keys.
  template <class ReadTable>
  void table(std::string_view name, ReadTable read_table) {
    const auto field = take(name);
    if (!field) return;
    const toml::table* table = field->node.as_table();
    if (!table) {
      ctx_.wrong_type(*field, "a table");
      return;
    }
    Section section(*table, field->key, ctx_);
    read_table(section);
    section.warn_unknown();
  }

  // Reads every entry of the named table `name` with read_one(Section&) into `out`.
  template <class Entry, class ReadEntry>
  void named(std::string_view name, const NameRule& rule, std::map<std::string, Entry>& out,
             ReadEntry read_one) {
    table(name, [&](Section& entries) {
      for (auto&& [entry_name, node] : entries.table_) {
        entries.taken_.emplace(entry_name.str());
        if (auto entry = entries.read_named_entry(entry_name, node, rule, read_one)) {
          out.insert_or_assign(std::string(entry_name.str()), std::move(*entry));
        }
      }
    });
  }

  // Calls report(key, value, dotted_key) for every key that was not taken.
  template <class Report>
  void for_each_unknown(Report report) const {
    for (auto&& [name, node] : table_) {
      if (!taken_.contains(name.str())) report(name, node, join_key(key_, name.str()));
    }
  }

  void warn_unknown() const {
    for_each_unknown([this](const toml::key& name, const toml::node& node, const std::string& key) {
      ctx_.diagnostics.warning(key_region(name, node), fmt::format("unknown key '{}' ignored", key));
    });
  }

 private:
  template <class T, class Reader, class... Rule>
  void assign(const std::optional<Field>& field, T& out, Reader reader, const Rule&... rule) {
    if (!field) return;
    if (auto value = reader(*field, rule..., ctx_)) out = T(std::move(*value));
  }

  // One entry of a named table; nullopt when its name or type is bad (its content is checked
  // all the same, so every problem is reported).
  template <class ReadEntry>
  auto read_named_entry(const toml::key& name, const toml::node& node, const NameRule& rule,
                        ReadEntry read_one) -> std::optional<std::invoke_result_t<ReadEntry, Section&>> {
    const std::string key = join_key(key_, name.str());
    const bool good_name = rule.valid(name.str());
    if (!good_name) {
      ctx_.diagnostics.error(key_region(name, node), key,
                             fmt::format("{:?} is not a valid name; use {}", name.str(), rule.allowed));
    }
    const toml::table* table = node.as_table();
    if (!table) {
      ctx_.wrong_type(Field{node, key}, "a table");
      return std::nullopt;
    }
    Section entry(*table, key, ctx_);
    entry.take("enabled");  // checked and acted on when the layers were merged
    auto value = read_one(entry);
    entry.warn_unknown();
    if (!good_name) return std::nullopt;
    return value;
  }

  const toml::table& table_;
  std::string key_;
  Context& ctx_;
  std::set<std::string, std::less<>> taken_;
};

// ---- the schema -----------------------------------------------------------------------------

constexpr IntRule kTimeoutRule{1, 604800, "seconds"};
constexpr IntRule kStatusFdRule{3, std::numeric_limits<int>::max(), "a file descriptor number", true};
constexpr IntRule kHostIdRule{0, 4294967294, "a host uid/gid"};
constexpr IntRule kJobCountRule{1, 100000, "jobs"};
constexpr IntRule kGraceRule{0, 600, "seconds"};
constexpr IntRule kMessageBytesRule{1024, 1073741824, "bytes (1 KiB to 1 GiB)"};
constexpr IntRule kPageSizeRule{1, 10000, "items per page"};
constexpr IntRule kPortRule{0, 65535, "a TCP port, 0 = any free port"};
constexpr IntRule kIdleSecondsRule{1, 31536000, "seconds, at least 1"};
constexpr IntRule kSessionsRule{1, 100000, "sessions"};
constexpr IntRule kSseBufferRule{65536, 1073741824, "bytes (64 KiB to 1 GiB)"};
constexpr IntRule kHeaderSecondsRule{1, 3600, "seconds (1 to 3600)"};
constexpr IntRule kConnectionsRule{1, 1000000, "connections"};
constexpr IntRule kRequestsRule{1, 100000, "requests"};
constexpr IntRule kHeldBytesRule{1048576, 68719476736, "bytes (1 MiB to 64 GiB)"};

std::optional<std::string> read_http_path(const Field& field, Context& ctx) {
  auto text = read_string(field, {"an URL path starting with /"}, ctx);
  if (!text) return std::nullopt;
  if (text->empty() || text->front() != '/' || text->find_first_of("?# \t") != std::string::npos) {
    ctx.error(field, fmt::format("{:?} is not an URL path; use something like \"/mcp\"", *text));
    return std::nullopt;
  }
  return text;
}
constexpr IntRule kTmpSizeRule{1, 1048576, "MiB"};
constexpr IntRule kAuditSizeRule{1, 1048576, "MiB"};
constexpr IntRule kAuditKeepRule{1, 100, "rotated files"};

// [terminal.limits]: the limits ns-hpc knows, each at least its minimum (never switched off).
Terminal read_terminal(Section& section) {
  Terminal terminal;
  section.table("limits", [&](Section& limits) {
    static constexpr std::pair<std::string_view, std::int64_t> kMax[] = {
        {"cpus", 1024}, {"memory", 16777216}, {"pids", 4194304}, {"output", 1048576}};
    for (const auto& [name, max] : kMax) {
      const IntRule rule{*local_limit_minimum(name), max, name == "cpus" ? "cores" : name == "pids" ? "processes" : "MiB"};
      std::int64_t value = -1;
      limits.read(name, value, read_int, rule);
      if (value >= 0) terminal.limits[std::string(name)] = value;
    }
  });
  return terminal;
}

constexpr IntRule kLimitValueRule{0, std::numeric_limits<std::int64_t>::max(), "", true};
constexpr NumberRule kIdleTimeoutRule{0, true, "seconds; 0 = never closed"};
constexpr NumberRule kHostTimeoutRule{0, false, "seconds"};
constexpr StringRule kSandboxPathRule{"the PATH inside the sandbox, e.g. \"/usr/bin:/bin\"", true};
constexpr StringRule kShellCommandRule{"a shell command", true};
constexpr StringRule kDescriptionRule{"a description"};

// The three sandbox mounts: each valid on its own, and all different.
void read_mounts(Section& section, Namespace& ns) {
  const std::array<std::pair<std::string_view, std::string*>, 3> mounts{{
      {"workspace_mount", &ns.workspace_mount},
      {"output_mount", &ns.output_mount},
      {"shared_output_mount", &ns.shared_output_mount},
  }};
  std::vector<std::pair<Field, std::string>> read;  // the mounts that are valid, with their key
  for (const auto& [name, value] : mounts) {
    const auto field = section.take(name);
    if (!field) continue;
    const auto mount = read_mount(*field, section.ctx());
    if (!mount) continue;
    for (const auto& [other, other_value] : read) {
      if (other_value == *mount) {
        section.ctx().error(*field,
                            fmt::format("{:?} is also {}; the three mounts must differ", *mount, other.key));
      }
    }
    *value = *mount;
    read.emplace_back(*field, *mount);
  }
}

Namespace read_namespace(Section& section) {
  Namespace ns;
  section.read("instances_dir", ns.instances_dir, read_folder);
  section.read("bwrap_command", ns.bwrap_command, read_argv);
  read_mounts(section, ns);
  section.read("shared_output", ns.shared_output, read_bool);
  section.read("status_fd", ns.status_fd, read_int, kStatusFdRule);
  section.read("hardening", ns.hardening, read_bool);
  section.read("seccomp", ns.seccomp, read_bool);
  section.read("sandbox_uid", ns.sandbox_uid, read_int, kHostIdRule);
  section.read("sandbox_gid", ns.sandbox_gid, read_int, kHostIdRule);
  section.read("default_network", ns.default_network, read_network);
  section.read("path", ns.path, read_string, kSandboxPathRule);
  section.read("env", ns.env, read_env, EnvRule{.reserve_path_and_home = true});
  section.read("pass_env", ns.pass_env, read_var_names);
  section.read("tmp_size", ns.tmp_size, read_int, kTmpSizeRule);
  return ns;
}

// {default = int, max = int} with 0 <= default <= max.
Limit read_limit(Section& entry) {
  constexpr std::string_view kHint = "a limit needs both default and max (integers, 0 <= default <= max)";
  constexpr std::int64_t kUnset = -1;  // below any valid value
  Limit limit{kUnset, kUnset};
  entry.read_required("default", kHint, limit.default_value, read_int, kLimitValueRule);
  entry.read_required("max", kHint, limit.max, read_int, kLimitValueRule);
  if (limit.default_value != kUnset && limit.max != kUnset && limit.default_value > limit.max) {
    entry.ctx().error(
        *entry.find("default"),
        fmt::format("{} is larger than max ({}); use 0 <= default <= max", limit.default_value, limit.max));
  }
  return limit;
}

// A local job limit: as read_limit, and never below the minimum ns-hpc enforces for its name.
Limit read_local_limit(Section& entry) {
  Limit limit = read_limit(entry);
  const std::string_view name = entry.name();
  if (auto min = local_limit_minimum(name)) {
    limit.min = *min;
    for (auto [key, value] : {std::pair<const char*, std::int64_t>{"default", limit.default_value}, {"max", limit.max}}) {
      if (value >= 0 && value < *min)
        entry.ctx().error(*entry.find(key), fmt::format("{} is below the minimum of {} for {}; a local limit cannot "
                                                        "be switched off (give a large max instead)",
                                                        value, *min, name));
    }
  }
  return limit;
}

constexpr NumberRule kPollRule{0.1, true, "seconds"};

std::optional<std::string> read_status_source(const Field& field, Context& ctx) {
  auto text = read_string(field, {"\"auto\", \"sacct\" or \"squeue\""}, ctx);
  if (!text) return std::nullopt;
  if (*text != "auto" && *text != "sacct" && *text != "squeue") {
    ctx.error(field, fmt::format("{:?} is not a status source; use \"auto\", \"sacct\" or \"squeue\"", *text));
    return std::nullopt;
  }
  return text;
}

Jobs read_jobs(Section& section) {
  Jobs jobs;
  section.read("max_timeout", jobs.max_timeout, read_int, kTimeoutRule);
  section.read("max_running_per_instance", jobs.max_running_per_instance, read_int, kJobCountRule);
  section.read("max_running", jobs.max_running, read_int, kJobCountRule);
  section.read("cancel_grace", jobs.cancel_grace, read_int, kGraceRule);
  section.table("local", [&](Section& local) {
    local.read("use_cgroups", jobs.local.use_cgroups, read_bool);
    local.read("cgroups_command", jobs.local.cgroups_command, read_strings);
    local.read("proc_check", jobs.local.proc_check, read_bool);
    local.named("limit", kLimitNames, jobs.local.limit, read_local_limit);
  });
  section.table("slurm", [&](Section& slurm) {
    slurm.read("sbatch_command", jobs.slurm.sbatch_command, read_argv);
    slurm.named("limit", kLimitNames, jobs.slurm.limit, read_limit);
    slurm.read("squeue_command", jobs.slurm.squeue_command, read_argv);
    slurm.read("sacct_command", jobs.slurm.sacct_command, read_argv);
    slurm.read("scancel_command", jobs.slurm.scancel_command, read_argv);
    slurm.read("poll_interval", jobs.slurm.poll_interval, read_number, kPollRule);
    slurm.read("status_source", jobs.slurm.status_source, read_status_source);
    slurm.read("ns_hpc_command", jobs.slurm.ns_hpc_command, read_strings);
  });
  return jobs;
}

Resource read_resource(Section& section) {
  Resource resource;
  section.read("context_dirs", resource.context_dirs, read_folders);
  section.read("resource_patterns", resource.resource_patterns, read_strings);
  return resource;
}

DavExtra read_dav_extra(Section& entry) {
  DavExtra extra;
  entry.read_required("path", "give the folder to serve (a string)", extra.path, read_folder);
  entry.read("ro", extra.ro, read_bool);
  return extra;
}

Dav read_dav(Section& section) {
  Dav dav;
  section.read("enabled", dav.enabled, read_bool);
  section.named("extras", kDavExtraNames, dav.extras, read_dav_extra);
  return dav;
}

ProxiedMcp read_proxied_mcp(Section& entry) {
  ProxiedMcp mcp;
  entry.read_required("command", "give the program to run (a non-empty string)", mcp.command, read_program);
  entry.read("args", mcp.args, read_strings);
  entry.read("env", mcp.env, read_env, EnvRule{.reserve_path_and_home = false});
  entry.read("include", mcp.include, read_strings);
  entry.read("exclude", mcp.exclude, read_strings);
  entry.read("idle_timeout", mcp.idle_timeout, read_number, kIdleTimeoutRule);
  return mcp;
}

HostCommand read_host_command(Section& entry) {
  HostCommand command;
  entry.read_required("command", "give the shell command to run (a non-empty string)", command.command,
                      read_string, kShellCommandRule);
  entry.read("description", command.description, read_string, kDescriptionRule);
  entry.read("timeout", command.timeout, read_number, kHostTimeoutRule);
  return command;
}

// ---- keys of the original's old schema ------------------------------------------------------

struct LegacyKey {
  std::string_view key;          // dotted; also matches the keys below it
  std::string_view replacement;  // what to use now
};

constexpr auto kLegacyKeys = std::to_array<LegacyKey>({
    {"instances_dir", "namespace.instances_dir"},
    {"namespace_defaults", "the [namespace] table"},
    {"namespace_defaults.bind_ro", "namespace.bwrap_command"},
    {"namespace_defaults.flags", "namespace.bwrap_command"},
    {"namespace_defaults.workspace_mount", "namespace.workspace_mount"},
    {"namespace_defaults.output_mount", "namespace.output_mount"},
    {"namespace_defaults.status_fd", "namespace.status_fd"},
    {"resource_defaults", "the [resource] table"},
    {"resource_defaults.context_dirs", "resource.context_dirs"},
    {"resource_defaults.resource_patterns", "resource.resource_patterns"},
    {"resources", "jobs.local.cgroups_command"},
    {"resources.use_systemd", "jobs.local.use_cgroups"},
    {"slurm", "the [jobs.slurm] table"},
    {"slurm.partition", "jobs.slurm.sbatch_command"},
    {"slurm.default_cpus", "jobs.slurm.limit.cpus.default"},
    {"slurm.default_memory_gb", "jobs.slurm.limit.memory.default (in MiB)"},
    {"slurm.default_timeout", "jobs.max_timeout"},
    {"slurm.resources", "jobs.slurm.limit"},
    {"job", "the [jobs] table"},
    {"job.proc_check", "jobs.local.proc_check"},
    {"resource_limits", "jobs.max_timeout"},
});

bool is_within(std::string_view key, std::string_view prefix) {
  return key.starts_with(prefix) && (key.size() == prefix.size() || key[prefix.size()] == '.');
}

// The replacement of the most specific legacy key that `key` is or is under.
std::optional<std::string_view> legacy_replacement(std::string_view key) {
  std::optional<LegacyKey> best;
  for (const LegacyKey& legacy : kLegacyKeys) {
    if (is_within(key, legacy.key) && (!best || legacy.key.size() > best->key.size())) best = legacy;
  }
  if (!best) return std::nullopt;
  return best->replacement;
}

// Warns about each leaf below a legacy key, naming what replaced it.
void warn_legacy(const toml::key& name, const toml::node& node, const std::string& key,
                 std::string_view replacement, Context& ctx) {
  if (const toml::table* table = node.as_table(); table && !table->empty()) {
    for (auto&& [child, value] : *table) {
      const std::string child_key = join_key(key, child.str());
      warn_legacy(child, value, child_key, legacy_replacement(child_key).value_or(replacement), ctx);
    }
    return;
  }
  ctx.diagnostics.warning(
      key_region(name, node),
      fmt::format("'{}' is a legacy ns-hpc key and is ignored; use {} instead", key, replacement));
}

void warn_unknown_top_level(const toml::key& name, const toml::node& node, const std::string& key,
                            Context& ctx) {
  if (const auto replacement = legacy_replacement(key)) {
    warn_legacy(name, node, key, *replacement, ctx);
  } else {
    ctx.diagnostics.warning(key_region(name, node), fmt::format("unknown key '{}' ignored", key));
  }
}

}  // namespace

Config validate(const toml::table& merged, const EnvLookup& env, Diagnostics& diagnostics) {
  Context ctx{diagnostics, env, user_config_dir(env)};
  Section root(merged, "", ctx);
  Config config;
  root.table("namespace", [&](Section& section) { config.ns = read_namespace(section); });
  root.table("jobs", [&](Section& section) { config.jobs = read_jobs(section); });
  root.table("terminal", [&](Section& section) { config.terminal = read_terminal(section); });
  root.table("audit", [&](Section& section) {
    section.read("max_size", config.audit.max_size, read_int, kAuditSizeRule);
    section.read("keep", config.audit.keep, read_int, kAuditKeepRule);
  });
  root.table("resource", [&](Section& section) { config.resource = read_resource(section); });
  root.table("mcp", [&](Section& section) {
    section.read("result_type", config.mcp.result_type, read_result_type);
    section.read("max_message_bytes", config.mcp.max_message_bytes, read_int, kMessageBytesRule);
    section.read("page_size", config.mcp.page_size, read_int, kPageSizeRule);
    section.read("default_instance", config.mcp.default_instance, read_string, StringRule{"an instance id"});
  });
  root.table("server", [&](Section& section) {
    Server& server = config.server;
    section.read("host", server.host, read_string, StringRule{"a listen address such as 127.0.0.1", true});
    section.read("port", server.port, read_int, kPortRule);
    section.read("path", server.path, read_http_path);
    section.read("auth_token", server.auth_token, read_string, StringRule{"a bearer token, or \"\" for the generated one"});
    section.read("state_dir", server.state_dir, read_folder);
    section.read("allowed_hosts", server.allowed_hosts, read_strings);
    section.read("allowed_origins", server.allowed_origins, read_strings);
    section.read("session_idle_timeout", server.session_idle_timeout, read_int, kIdleSecondsRule);
    section.read("max_sessions", server.max_sessions, read_int, kSessionsRule);
    section.read("read_timeout", server.read_timeout, read_int, kIdleSecondsRule);
    section.read("header_timeout", server.header_timeout, read_int, kHeaderSecondsRule);
    section.read("shutdown_grace", server.shutdown_grace, read_int, kGraceRule);
    section.read("sse_buffer_bytes", server.sse_buffer_bytes, read_int, kSseBufferRule);
    section.read("max_connections", server.max_connections, read_int, kConnectionsRule);
    section.read("max_connections_per_peer", server.max_connections_per_peer, read_int, kConnectionsRule);
    section.read("max_sessions_per_peer", server.max_sessions_per_peer, read_int, kSessionsRule);
    section.read("max_requests_per_session", server.max_requests_per_session, read_int, kRequestsRule);
    section.read("max_requests_per_peer", server.max_requests_per_peer, read_int, kRequestsRule);
    section.read("max_session_buffer_bytes", server.max_session_buffer_bytes, read_int, kHeldBytesRule);
    section.read("max_buffer_bytes", server.max_buffer_bytes, read_int, kHeldBytesRule);
  });
  root.table("dav", [&](Section& section) { config.dav = read_dav(section); });
  root.named("proxied_mcps", kMcpNames, config.proxied_mcps, read_proxied_mcp);
  root.named("host_commands", kHostCommandNames, config.host_commands, read_host_command);
  root.for_each_unknown([&](const toml::key& name, const toml::node& node, const std::string& key) {
    warn_unknown_top_level(name, node, key, ctx);
  });
  return config;
}

}  // namespace nshpc::config::detail
