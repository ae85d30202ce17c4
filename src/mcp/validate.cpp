#include "mcp/validate.hpp"

#include "base/text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace nshpc::mcp::detail {

namespace {

std::string_view type_phrase(std::string_view type) {
  if (type == "string") return "a string";
  if (type == "integer") return "an integer";
  if (type == "number") return "a number";
  if (type == "boolean") return "a boolean";
  if (type == "object") return "an object";
  if (type == "array") return "an array";
  if (type == "null") return "null";
  return type;
}

bool is_integral(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && std::floor(d) == d;
}

// Unknown type names accept anything (the check is deliberately minimal).
bool type_matches(const json& v, std::string_view type) {
  if (type == "string") return v.is_string();
  if (type == "integer") return is_integral(v);
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "null") return v.is_null();
  return true;
}

std::string join_alternatives(const std::vector<std::string_view>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += (i + 1 == items.size()) ? " or " : ", ";
    out += items[i];
  }
  return out;
}

// A value as shown in a message: JSON text, cut when long.
std::string shown(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) {
    std::size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0u) == 0x80u) --cut;
    text = text.substr(0, cut) + "...";
  }
  return text;
}

// A count keyword's value (minLength, maxItems, ...): a non-negative integer, else ignored.
std::optional<std::size_t> count_keyword(const json& schema, const char* key) {
  auto it = schema.find(key);
  if (it == schema.end() || !is_integral(*it) || it->get<double>() < 0) return std::nullopt;
  if (it->get<double>() >= 1e18) return std::size_t{1} << 60;  // effectively unlimited
  return it->get<std::size_t>();
}

std::string plural(std::size_t n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

class Checker {
 public:
  explicit Checker(const json& root) : root_(root) {}

  std::optional<std::string> check(const json& v, const json& schema, const std::string& path,
                                   int depth) {
    if (depth > 64) return std::nullopt;  // schemas are ours; this only guards recursion
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return std::nullopt;
      return fmt::format("{} is not allowed", label(path));
    }
    if (!schema.is_object()) return std::nullopt;

    // A local reference ("#/$defs/address") applies with the keywords beside it (2020-12).
    if (auto ref = schema.find("$ref"); ref != schema.end() && ref->is_string()) {
      const std::string& target = ref->get_ref<const std::string&>();
      if (target == "#") {
        if (auto m = check(v, root_, path, depth + 1)) return m;
      } else if (target.rfind("#/", 0) == 0) {
        try {
          const json& resolved = root_.at(json::json_pointer(target.substr(1)));
          if (auto m = check(v, resolved, path, depth + 1)) return m;
        } catch (const json::exception&) {
          // An unresolvable reference constrains nothing (the schema is the tool's own).
        }
      }
    }

    if (auto t = schema.find("type"); t != schema.end()) {
      std::vector<std::string_view> types;
      if (t->is_string()) types.push_back(t->get_ref<const std::string&>());
      if (t->is_array())
        for (const auto& item : *t)
          if (item.is_string()) types.push_back(item.get_ref<const std::string&>());
      if (!types.empty() &&
          std::none_of(types.begin(), types.end(), [&](auto ty) { return type_matches(v, ty); })) {
        std::vector<std::string_view> phrases;
        for (auto ty : types) phrases.push_back(type_phrase(ty));
        return fmt::format("{}: expected {}, got {}", label(path), join_alternatives(phrases),
                           describe_type(v));
      }
    }
    if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
      if (std::find(e->begin(), e->end(), v) == e->end()) {
        std::string allowed;
        for (const auto& item : *e) allowed += (allowed.empty() ? "" : ", ") + shown(item);
        return fmt::format("{}: expected one of {}, got {}", label(path), allowed, shown(v));
      }
    }
    if (auto c = schema.find("const"); c != schema.end() && v != *c)
      return fmt::format("{}: expected {}, got {}", label(path), shown(*c), shown(v));

    if (v.is_number()) {
      const double x = v.get<double>();
      auto bound = [&](const char* key, auto fails, const char* op) -> std::optional<std::string> {
        auto b = schema.find(key);
        if (b == schema.end() || !b->is_number() || !fails(x, b->template get<double>()))
          return std::nullopt;
        return fmt::format("{}: expected a value {} {}, got {}", label(path), op, b->dump(),
                           v.dump());
      };
      if (auto m = bound(
              "minimum", [](double a, double b) { return a < b; }, ">="))
        return m;
      if (auto m = bound(
              "maximum", [](double a, double b) { return a > b; }, "<="))
        return m;
      if (auto m = bound(
              "exclusiveMinimum", [](double a, double b) { return a <= b; }, ">"))
        return m;
      if (auto m = bound(
              "exclusiveMaximum", [](double a, double b) { return a >= b; }, "<"))
        return m;
    }
    if (v.is_string()) {
      const std::size_t len = text::utf8_length(v.get_ref<const std::string&>());
      if (auto n = count_keyword(schema, "minLength"); n && len < *n)
        return fmt::format("{}: expected at least {}, got {}", label(path), plural(*n, "character"),
                           len);
      if (auto n = count_keyword(schema, "maxLength"); n && len > *n)
        return fmt::format("{}: expected at most {}, got {}", label(path), plural(*n, "character"),
                           len);
    }
    if (v.is_array()) {
      if (auto n = count_keyword(schema, "minItems"); n && v.size() < *n)
        return fmt::format("{}: expected at least {}, got {}", label(path), plural(*n, "item"),
                           v.size());
      if (auto n = count_keyword(schema, "maxItems"); n && v.size() > *n)
        return fmt::format("{}: expected at most {}, got {}", label(path), plural(*n, "item"),
                           v.size());
      if (auto items = schema.find("items");
          items != schema.end() && (items->is_object() || items->is_boolean())) {
        for (std::size_t i = 0; i < v.size(); ++i)
          if (auto m = check(v[i], *items, fmt::format("{}[{}]", path, i), depth + 1)) return m;
      }
    }
    if (v.is_object()) return check_object(v, schema, path, depth);
    return std::nullopt;
  }

 private:
  const json& root_;

  static std::string label(const std::string& path) {
    return path.empty() ? std::string("arguments") : fmt::format("argument '{}'", path);
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  std::optional<std::string> check_object(const json& v, const json& schema,
                                          const std::string& path, int depth) {
    static const json kNoProperties = json::object();
    auto p = schema.find("properties");
    const json& props = (p != schema.end() && p->is_object()) ? *p : kNoProperties;

    if (auto r = schema.find("required"); r != schema.end() && r->is_array()) {
      for (const auto& name : *r) {
        if (name.is_string() && !v.contains(name.get_ref<const std::string&>()))
          return fmt::format("missing required argument '{}'",
                             join(path, name.get_ref<const std::string&>()));
      }
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (auto ps = props.find(it.key()); ps != props.end())
        if (auto m = check(it.value(), *ps, join(path, it.key()), depth + 1)) return m;
    }
    auto extra = schema.find("additionalProperties");
    if (extra == schema.end()) return std::nullopt;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) continue;
      if (extra->is_boolean() && !extra->get<bool>()) {
        std::string known;
        for (auto k = props.begin(); k != props.end(); ++k)
          known += (known.empty() ? "" : ", ") + k.key();
        return fmt::format("unknown argument '{}'{}", text::sanitize_utf8(join(path, it.key())),
                           known.empty() ? std::string(" (this tool takes no arguments)")
                                         : fmt::format(" (expected one of: {})", known));
      }
      if (extra->is_object())
        if (auto m = check(it.value(), *extra, join(path, it.key()), depth + 1)) return m;
    }
    return std::nullopt;
  }
};

}  // namespace

std::optional<std::string> validate_arguments(const json& arguments, const json& schema) {
  if (!arguments.is_object())
    return fmt::format("arguments: expected an object, got {}", describe_type(arguments));
  return Checker(schema).check(arguments, schema, "", 0);
}

std::string_view describe_type(const json& value) {
  switch (value.type()) {
    case json::value_t::string:
      return "a string";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::null:
      return "null";
    case json::value_t::binary:
      return "binary data";
    case json::value_t::discarded:
      break;
  }
  return "nothing";
}

}  // namespace nshpc::mcp::detail
