// Internal to src/config: reading the merged TOML layers. Positions and the problems found; the
// types a value can have, each with its rule and the words that describe it (the same words in
// an error and in the README); and Section, which hands out the keys of one table and reports
// the keys nobody asked for.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "config/config.hpp"

namespace nshpc::config::detail {

// The source name of the built-in defaults, as it appears in positions.
inline constexpr std::string_view kDefaultsSource = "<defaults>";

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
// paths of the built-in defaults are resolved against it.
std::filesystem::path user_config_dir(const EnvLookup& env);

// A value of the configuration and the dotted key it was found under.
struct Field {
  const toml::node& node;
  std::string key;
};

// One reading of the merged layers: where its problems go, and what paths are resolved with.
struct LoadState {
  Diagnostics& diagnostics;
  const EnvLookup& env;
  std::filesystem::path defaults_dir;  // relative paths of the built-in defaults are resolved here
  bool as_root = false;                // the defaults for root apply

  void error(const Field& field, std::string_view message) const;
  void wrong_type(const Field& field, std::string_view expected) const;
  // The folder that relative paths written at `where` are resolved against.
  std::filesystem::path base_dir(const toml::source_region& where) const;
};

// ---- types of values ------------------------------------------------------------------------

// What a value must be and how it is read.
template <class T>
struct Type {
  std::string expected;  // e.g. "an integer (seconds, 1..604800)", as in "expected …, got …"
  // The value; nullopt (after reporting why) when it breaks the rule.
  std::function<std::optional<T>(const Field&, LoadState&)> read;
};

struct IntRule {
  std::int64_t min;
  std::int64_t max;
  std::string_view meaning;  // e.g. "seconds"; may be empty
  bool open_ended = false;   // describe the range as "min or more"
};

struct NumberRule {  // an integer or a float
  double min;
  bool min_allowed;  // whether `min` itself is allowed
  std::string_view meaning;
};

struct StringRule {
  std::string_view what;   // what the string is, e.g. "a folder path"; may be empty
  bool non_empty = false;  // refuse ""
};

struct EnvRule {
  bool reserve_path_and_home;  // PATH and HOME have their own settings
};

Type<bool> boolean();
Type<std::int64_t> integer(const IntRule& rule);
Type<double> number(const NumberRule& rule);
Type<std::string> text(const StringRule& rule = {});
Type<std::string> program();       // a non-empty string without NUL
Type<std::string> url_path();      // "/mcp"
Type<std::string> sandbox_path();  // absolute, not "/", without ".."; normalized
// A host folder: ~ and $VAR expanded, relative to the folder of the file that set it.
Type<std::filesystem::path> folder();
Type<std::vector<std::string>> strings();
Type<std::vector<std::string>> argv();  // a program and its arguments: non-empty, no empty item
Type<std::vector<std::string>> var_names();
// [network] allow / resolve entries: non-empty, without blanks or '/'; `name=address` pairs with
// `pairs` (the proxy parses them fully).
Type<std::vector<std::string>> network_entries(bool pairs);
Type<std::vector<std::filesystem::path>> folders();
Type<std::map<std::string, std::string>> variables(const EnvRule& rule);  // NAME = "value"

// "\"a\", \"b\" or \"c\""
std::string alternatives(const std::vector<std::string>& names);

// One of `values` of a config.hpp enumeration, written as its name.
template <class E>
Type<E> choice(std::vector<E> values) {
  std::vector<std::string> names;
  for (E value : values) names.push_back(to_string(value));
  std::string allowed = alternatives(names);
  std::string expected = fmt::format("a string ({})", allowed);
  return {expected, [values, allowed, expected](const Field& field, LoadState& state) -> std::optional<E> {
            const auto* text = field.node.as_string();
            if (!text) {
              state.wrong_type(field, expected);
              return std::nullopt;
            }
            const auto value = from_string<E>(text->get());
            if (value && std::find(values.begin(), values.end(), *value) != values.end()) return value;
            state.error(field, fmt::format("{:?} is not allowed; use {}", text->get(), allowed));
            return std::nullopt;
          }};
}

// ---- names ----------------------------------------------------------------------------------

inline bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_alnum(char c) { return is_lower(c) || (c >= 'A' && c <= 'Z') || is_digit(c); }

// True when `text` is one `first` character followed by `rest` characters.
template <class First, class Rest>
bool matches(std::string_view text, First first, Rest rest) {
  return !text.empty() && first(text.front()) && std::all_of(text.begin() + 1, text.end(), rest);
}

// A shell variable's name: letters, digits and _, not starting with a digit.
inline bool is_var_name(std::string_view name) {
  return matches(
      name, [](char c) { return (is_alnum(c) && !is_digit(c)) || c == '_'; },
      [](char c) { return is_alnum(c) || c == '_'; });
}

// ---- tables ---------------------------------------------------------------------------------

// The names allowed for the entries of a named table.
struct NameRule {
  bool (*valid)(std::string_view);
  std::string_view allowed;
};

// A table being read: hands out its values by key and remembers which keys were read, so the
// others can be reported as unknown.
class Section {
 public:
  Section(const toml::table& table, std::string key, LoadState& state)
      : table_(table), key_(std::move(key)), state_(state) {}

  LoadState& state() const { return state_; }
  const std::string& key() const { return key_; }
  const toml::source_region& source() const { return table_.source(); }
  // The last component of this table's key ("memory" for jobs.local.limit.memory).
  std::string_view name() const;

  // The value of `name` (nullopt when absent); the key counts as known from now on.
  std::optional<Field> take(std::string_view name);
  // The value of `name` without marking the key as known (for checks across keys).
  std::optional<Field> find(std::string_view name) const;
  // Like take(), but a missing key is an error ("missing; <hint>") at the table's position.
  std::optional<Field> require(std::string_view name, std::string_view hint);

  // Reads the sub-table `name` with read_table(Section&), then warns about its unknown keys. A
  // table that no layer has is read as an empty one (its keys take their defaults).
  template <class ReadTable>
  void table(std::string_view name, ReadTable read_table) {
    const auto field = take(name);
    const toml::table absent;
    const toml::table* table = field ? field->node.as_table() : &absent;
    if (!table) {
      state_.wrong_type(*field, "a table");
      return;
    }
    Section section(*table, field ? field->key : join_key(key_, name), state_);
    read_table(section);
    section.warn_unknown();
  }

  // Reads every entry of the named table `name` with read_entry(Section&) into `out`. An entry
  // whose name or type is bad is left out (its content is checked all the same).
  template <class Entry, class ReadEntry>
  void named(std::string_view name, const NameRule& rule, std::map<std::string, Entry>& out,
             ReadEntry read_entry) {
    table(name, [&](Section& entries) {
      for (auto&& [entry_name, node] : entries.table_) {
        entries.taken_.emplace(entry_name.str());
        const std::string key = join_key(entries.key_, entry_name.str());
        const bool good_name = entries.check_name(entry_name, node, key, rule);
        const toml::table* table = node.as_table();
        if (!table) {
          state_.wrong_type(Field{node, key}, "a table");
          continue;
        }
        Section entry(*table, key, state_);
        entry.take("enabled");  // checked and acted on when the layers were merged
        Entry value = read_entry(entry);
        entry.warn_unknown();
        if (good_name) out.insert_or_assign(std::string(entry_name.str()), std::move(value));
      }
    });
  }

  // Calls report(key, value, dotted_key) for every key that was not taken.
  void for_each_unknown(
      const std::function<void(const toml::key&, const toml::node&, const std::string&)>& report) const;
  void warn_unknown() const;

 private:
  bool check_name(const toml::key& name, const toml::node& node, const std::string& key, const NameRule& rule);

  const toml::table& table_;
  std::string key_;
  LoadState& state_;
  std::set<std::string, std::less<>> taken_;
};

// Where a key was written; falls back to its value's position.
const toml::source_region& key_region(const toml::key& key, const toml::node& value);

// Checks the merged layers against the key table (keys.hpp) and converts them. Every problem is
// added to `diagnostics`; the result is only meaningful when no error was added. `sources` is
// left empty.
Config validate(const toml::table& merged, const EnvLookup& env, bool as_root, Diagnostics& diagnostics);

}  // namespace nshpc::config::detail
