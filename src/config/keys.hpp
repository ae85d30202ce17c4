// Internal to src/config: the key table. Every key of the configuration is defined once, in
// keys.cpp, as a Key: its name, what it holds (a Type, the keys of a table, or the fields of the
// entries of a named table), its default as written in TOML, and what it means. Reading and
// validation, `config show`, the built-in defaults and the README's table are derived from it.
//
// A key is bound to the struct member that holds its value by a member pointer, so a Type whose
// value does not fit the member does not compile.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/json.hpp"
#include "config/config.hpp"
#include "config/reader.hpp"

namespace nshpc::config::detail {

enum class KeyKind {
  value,  // one value of a Type
  table,  // a table of keys of its own
  named,  // a table of entries named by the user, each with the same fields
};

// Everything about a key that is not how it is read: its default and what it is for.
struct About {
  std::string defaults_to;  // the default as written in TOML ("" = none); for a named table its
                            // default entries, one `name = { … }` per line
  std::string as_root;      // the default when ns-hpc runs as root, if it differs
  std::string help;         // what the key means: one paragraph of Markdown (the README's text)
  std::string reserved;     // not "": read and checked but not used yet; says what is missing
  std::string required;     // not "": the key must be given (fields of entries); the error's hint
  bool secret = false;      // `config show` says only whether it is set
};

// A key as people read about it.
struct KeyDoc {
  std::string name;
  KeyKind kind = KeyKind::value;
  std::string type;  // e.g. "an integer (seconds, 1..604800)"
  About about;
  std::vector<KeyDoc> children;  // a table's keys; the fields of a named table's entries
};

// A key of a table whose values are held by an `Owner`.
template <class Owner>
struct Key {
  KeyDoc doc;
  std::function<void(Section&, Owner&)> read;                 // reads it from the table
  std::function<void(const Owner&, nlohmann::json&)> show;  // adds it to the table's JSON
};

// A rule across the keys of one table, checked once they are read.
template <class Owner>
using Check = std::function<void(Section&, Owner&)>;

template <class Owner>
struct Keys {
  std::vector<Key<Owner>> keys;
  Check<Owner> check;
};

template <class Owner>
void read_keys(Section& section, Owner& owner, const Keys<Owner>& keys) {
  for (const Key<Owner>& key : keys.keys) key.read(section, owner);
  if (keys.check) keys.check(section, owner);
}

template <class Owner>
void show_keys(const Owner& owner, const Keys<Owner>& keys, nlohmann::json& out) {
  for (const Key<Owner>& key : keys.keys) key.show(owner, out);
}

template <class Owner>
std::vector<KeyDoc> docs_of(const std::vector<Key<Owner>>& keys) {
  std::vector<KeyDoc> docs;
  for (const Key<Owner>& key : keys) docs.push_back(key.doc);
  return docs;
}

// The root of the table, and of its docs.
const Keys<Config>& config_keys();
const KeyDoc& config_doc();

// ---- helpers of the builders below (reader.cpp) -----------------------------------------------

// The value of a key: as given (nullopt if absent; an error if it is required), else its default
// read from the table (never nullopt when the key has one). Warns when a reserved key is given.
std::optional<Field> key_field(Section& section, const KeyDoc& doc, std::optional<toml::table>& default_holder);

// Warns that the entry (or value) at `where` named `key` is read but not used (`doc` is reserved).
void warn_reserved(LoadState& state, const toml::source_region& where, const std::string& key, const KeyDoc& doc);

inline nlohmann::json shown(const std::filesystem::path& path) { return path.string(); }
inline nlohmann::json shown(const std::vector<std::filesystem::path>& paths) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& path : paths) out.push_back(path.string());
  return out;
}
template <class T>
nlohmann::json shown(const T& value) {
  return value;
}

template <class T>
std::optional<T> read_key(Section& section, const KeyDoc& doc, const Type<T>& type) {
  std::optional<toml::table> default_holder;
  const auto field = key_field(section, doc, default_holder);
  if (!field) return std::nullopt;
  return type.read(*field, section.state());
}

// ---- builders -------------------------------------------------------------------------------

// A key holding one value of `type`, kept in `owner.*member`.
template <class Owner, class Member, class T>
Key<Owner> value(std::string_view name, Member Owner::*member, Type<T> type, About about) {
  static_assert(std::is_constructible_v<Member, T&&>, "the key's type does not fit its member");
  KeyDoc doc{std::string(name), KeyKind::value, type.expected, std::move(about), {}};
  auto read = [doc, member, type](Section& section, Owner& owner) {
    if (auto value = read_key(section, doc, type)) owner.*member = static_cast<Member>(std::move(*value));
  };
  auto show = [doc, member](const Owner& owner, nlohmann::json& out) {
    const Member& value = owner.*member;
    if (!doc.about.reserved.empty() && value == Member{}) return;  // not given: nothing to show
    if constexpr (std::is_same_v<Member, std::string>) {
      if (doc.about.secret) {
        out[doc.name] = value.empty() ? "" : "<set, hidden>";
        return;
      }
    }
    out[doc.name] = shown(value);
  };
  return {std::move(doc), std::move(read), std::move(show)};
}

// A key of a table whose values are kept in one map, `owner.*map`, under their key names.
template <class Owner, class T>
Key<Owner> map_value(std::string_view name, std::map<std::string, T> Owner::*map, Type<T> type, About about) {
  KeyDoc doc{std::string(name), KeyKind::value, type.expected, std::move(about), {}};
  auto read = [doc, map, type](Section& section, Owner& owner) {
    if (auto value = read_key(section, doc, type)) (owner.*map)[doc.name] = std::move(*value);
  };
  auto show = [doc, map](const Owner& owner, nlohmann::json& out) {
    if (const auto it = (owner.*map).find(doc.name); it != (owner.*map).end()) out[doc.name] = shown(it->second);
  };
  return {std::move(doc), std::move(read), std::move(show)};
}

// A table of its own `keys`, whose values `part(owner)` holds (`part` takes a const or non-const
// Owner and returns the matching Sub&).
template <class Owner, class Sub, class Part>
Key<Owner> sub_table(std::string_view name, Part part, std::vector<Key<Sub>> keys, Check<Sub> check) {
  KeyDoc doc{std::string(name), KeyKind::table, "a table", {}, docs_of(keys)};
  auto shared = std::make_shared<const Keys<Sub>>(Keys<Sub>{std::move(keys), std::move(check)});
  auto read = [name = doc.name, part, shared](Section& section, Owner& owner) {
    section.table(name, [&](Section& sub) { read_keys(sub, part(owner), *shared); });
  };
  auto show = [name = doc.name, part, shared](const Owner& owner, nlohmann::json& out) {
    nlohmann::json sub = nlohmann::json::object();
    show_keys(part(owner), *shared, sub);
    if (!sub.empty()) out[name] = std::move(sub);  // empty: only reserved keys, none given
  };
  return {std::move(doc), std::move(read), std::move(show)};
}

// A table of its own `keys`, kept in `owner.*member`.
template <class Owner, class Sub>
Key<Owner> table(std::string_view name, Sub Owner::*member, std::vector<Key<Sub>> keys,
                 std::type_identity_t<Check<Sub>> check = {}) {
  return sub_table<Owner, Sub>(
      name, [member](auto& owner) -> auto& { return owner.*member; }, std::move(keys), std::move(check));
}

// A table of its own `keys` whose values its owner holds (e.g. [terminal.limits] in Terminal).
template <class Owner>
Key<Owner> table(std::string_view name, std::vector<Key<Owner>> keys) {
  return sub_table<Owner, Owner>(name, [](auto& owner) -> auto& { return owner; }, std::move(keys), {});
}

// A table of entries named by the user (names allowed by `names`), each an `Entry` with the
// `fields` and kept in `owner.*member`. Reading an entry starts from `blank`.
template <class Owner, class Entry>
Key<Owner> named(std::string_view name, std::map<std::string, Entry> Owner::*member, NameRule names,
                 std::vector<Key<Entry>> fields, About about, std::type_identity_t<Check<Entry>> check = {},
                 std::type_identity_t<Entry> blank = {}) {
  KeyDoc doc{std::string(name), KeyKind::named, fmt::format("a table per entry; names: {}", names.allowed),
             std::move(about), docs_of(fields)};
  auto shared = std::make_shared<const Keys<Entry>>(Keys<Entry>{std::move(fields), std::move(check)});
  auto read = [doc, member, names, shared, blank](Section& section, Owner& owner) {
    section.named(doc.name, names, owner.*member, [&](Section& entry) {
      if (!doc.about.reserved.empty()) warn_reserved(entry.state(), entry.source(), entry.key(), doc);
      Entry value = blank;
      read_keys(entry, value, *shared);
      return value;
    });
  };
  auto show = [doc, member, shared](const Owner& owner, nlohmann::json& out) {
    const auto& entries = owner.*member;
    if (!doc.about.reserved.empty() && entries.empty()) return;
    nlohmann::json shown_entries = nlohmann::json::object();
    for (const auto& [entry_name, entry] : entries) {
      nlohmann::json fields = nlohmann::json::object();
      show_keys(entry, *shared, fields);
      shown_entries[entry_name] = std::move(fields);
    }
    out[doc.name] = std::move(shown_entries);
  };
  return {std::move(doc), std::move(read), std::move(show)};
}

// ---- derived from the table (docs.cpp) --------------------------------------------------------

// Calls visit(doc, dotted key, reserved) for every key of the table, parents first; the entries
// of a named table are `<name>` (e.g. "jobs.local.limit.<name>.max"). `reserved` is the note of
// the key or of the named table it belongs to.
void for_each_key(const std::function<void(const KeyDoc&, const std::string&, const std::string&)>& visit);

// The lowest layer: the default entries of the named tables (jobs.local.limit, jobs.slurm.limit),
// so that a file can change a field of one or remove it with `enabled = false`. Every other key
// takes its default from the table when no layer sets it.
std::string defaults_layer_toml();

// The dotted keys of the named tables (where `enabled = false` removes an entry), and of the
// reserved keys.
std::vector<std::string> named_table_keys();
std::vector<std::string> reserved_keys();

// The replacement of a key of the original's old schema (a top-level key ns-hpc does not know),
// or nullopt.
std::optional<std::string_view> legacy_replacement(std::string_view key);

}  // namespace nshpc::config::detail
