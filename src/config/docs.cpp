// What is derived from the key table as text: the lowest layer (the named tables' default
// entries), the lists of named and reserved keys, and the description of every key for people
// (`ns-hpc config keys`, the README's table).
#include <fmt/format.h>

#include "base/text.hpp"
#include "config/keys.hpp"

namespace nshpc::config {

namespace detail {

namespace {

using Visit = std::function<void(const KeyDoc&, const std::string&, const std::string&)>;

void walk(const KeyDoc& doc, const std::string& key, const std::string& inherited_reserved, const Visit& visit) {
  const std::string& reserved = doc.about.reserved.empty() ? inherited_reserved : doc.about.reserved;
  visit(doc, key, reserved);
  const std::string prefix = doc.kind == KeyKind::named ? key + ".<name>" : key;
  for (const KeyDoc& child : doc.children) walk(child, prefix + "." + child.name, reserved, visit);
}

}  // namespace

void for_each_key(const Visit& visit) {
  for (const KeyDoc& doc : config_doc().children) walk(doc, doc.name, "", visit);
}

std::string defaults_layer_toml() {
  std::string text =
      "# ns-hpc built-in defaults of the named tables (generated from src/config/keys.cpp). Every other\n"
      "# key takes its default from the key table when no layer sets it.\n";
  for_each_key([&](const KeyDoc& doc, const std::string& key, const std::string& reserved) {
    if (doc.kind != KeyKind::named || doc.about.defaults_to.empty() || !reserved.empty()) return;
    text += fmt::format("\n[{}]\n{}\n", key, doc.about.defaults_to);
  });
  return text;
}

std::vector<std::string> named_table_keys() {
  std::vector<std::string> keys;
  for_each_key([&](const KeyDoc& doc, const std::string& key, const std::string&) {
    if (doc.kind == KeyKind::named) keys.push_back(key);
  });
  return keys;
}

std::vector<std::string> reserved_keys() {
  std::vector<std::string> keys;
  for_each_key([&](const KeyDoc& doc, const std::string& key, const std::string&) {
    if (!doc.about.reserved.empty()) keys.push_back(key);
  });
  return keys;
}

namespace {

// One key as people read about it.
struct Row {
  std::string key;
  std::string type;
  std::vector<std::string> defaults;  // as written in TOML; empty: see `no_default`
  std::string as_root;
  std::string no_default;  // "required" or "none"
  std::string meaning;
};

std::vector<Row> rows() {
  std::vector<Row> rows;
  for_each_key([&](const KeyDoc& doc, const std::string& key, const std::string& reserved) {
    if (doc.kind == KeyKind::table) return;
    Row row;
    row.key = doc.kind == KeyKind::named ? key + ".<name>" : key;
    row.type = doc.type;
    if (!doc.about.defaults_to.empty()) {
      for (std::string_view line : nshpc::text::split(doc.about.defaults_to, '\n')) row.defaults.emplace_back(line);
    }
    row.as_root = doc.about.as_root;
    row.no_default = doc.about.required.empty() ? "none" : "required";
    if (reserved.empty()) {
      row.meaning = doc.about.help;
    } else if (doc.about.reserved.empty()) {  // a field of a reserved named table
      row.meaning = fmt::format("*Reserved.* {}", doc.about.help);
    } else {
      row.meaning = fmt::format("*Reserved: read but not used yet ({}).* {}", reserved, doc.about.help);
    }
    rows.push_back(std::move(row));
  });
  return rows;
}

std::string markdown_cell(std::string_view text) {
  std::string cell;
  for (char c : text) {
    if (c == '|') cell += '\\';
    cell += c;
  }
  return cell;
}

std::string code(std::string_view text) { return fmt::format("`{}`", text); }

// `text` in lines of at most `width` columns (longer words stay whole), each starting with `indent`.
std::string wrapped(std::string_view text, std::string_view indent, std::size_t width) {
  std::string out;
  std::string line;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(start, end - start);
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      out += fmt::format("{}{}\n", indent, line);
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line += word;
    start = end + 1;
  }
  if (!line.empty()) out += fmt::format("{}{}\n", indent, line);
  return out;
}

}  // namespace

}  // namespace detail

std::string keys_markdown() {
  std::string text = "| Key | Type | Default | Meaning |\n|---|---|---|---|\n";
  for (const detail::Row& row : detail::rows()) {
    std::string defaults;
    for (const std::string& line : row.defaults) defaults += (defaults.empty() ? "" : "<br>") + detail::code(line);
    if (defaults.empty()) defaults = row.no_default;
    if (!row.as_root.empty()) defaults += fmt::format("; as root {}", detail::code(row.as_root));
    text += fmt::format("| {} | {} | {} | {} |\n", detail::markdown_cell(detail::code(row.key)),
                        detail::markdown_cell(row.type), detail::markdown_cell(defaults),
                        detail::markdown_cell(row.meaning));
  }
  return text;
}

std::string keys_text() {
  std::string text;
  for (const detail::Row& row : detail::rows()) {
    std::string defaults;
    for (const std::string& line : row.defaults) defaults += (defaults.empty() ? "" : "; ") + line;
    if (defaults.empty()) defaults = row.no_default;
    if (!row.as_root.empty()) defaults += fmt::format(" (as root: {})", row.as_root);
    text += fmt::format("{}\n    type: {}\n    default: {}\n{}\n", row.key, row.type, defaults,
                        detail::wrapped(row.meaning, "    ", 100));
  }
  return text;
}

}  // namespace nshpc::config
