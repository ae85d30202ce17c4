// The WebDAV If header (see if_header.hpp).
#include "dav/if_header.hpp"

#include <stdexcept>

namespace nshpc::dav {

namespace {

struct Cursor {
  std::string_view s;
  std::size_t at = 0;

  void skip_space() {
    while (at < s.size() && (s[at] == ' ' || s[at] == '\t' || s[at] == '\r' || s[at] == '\n')) ++at;
  }
  bool done() {
    skip_space();
    return at >= s.size();
  }
  char peek() {
    skip_space();
    return at < s.size() ? s[at] : '\0';
  }
  // Everything up to `close` (excluded); the cursor goes past it.
  std::string until(char close, const char* what) {
    const auto end = s.find(close, at);
    if (end == std::string_view::npos) throw std::invalid_argument(std::string("If header: unterminated ") + what);
    std::string out(s.substr(at, end - at));
    at = end + 1;
    return out;
  }
};

bool etag_equal(std::string_view a, std::string_view b) {
  // Weak comparison (RFC 9110 8.8.3.2), as If conditions on entity tags use.
  if (a.rfind("W/", 0) == 0) a.remove_prefix(2);
  if (b.rfind("W/", 0) == 0) b.remove_prefix(2);
  return a == b;
}

}  // namespace

std::vector<IfList> parse_if_header(std::string_view header) {
  std::vector<IfList> lists;
  Cursor c{header};
  std::optional<std::string> tag;
  bool tagged = false, untagged = false;
  while (!c.done()) {
    const char next = c.peek();
    if (next == '<') {
      ++c.at;
      tag = c.until('>', "resource tag");
      if (tag->empty()) throw std::invalid_argument("If header: empty resource tag");
      tagged = true;
      if (c.peek() != '(') throw std::invalid_argument("If header: a resource tag must be followed by a list");
      continue;
    }
    if (next != '(') throw std::invalid_argument("If header: expected '(' or '<'");
    ++c.at;
    if (!tag) untagged = true;
    if (tagged && untagged) throw std::invalid_argument("If header: tagged and untagged lists cannot be mixed");
    IfList list;
    list.resource = tag;
    for (;;) {
      const char ch = c.peek();
      if (ch == ')') {
        ++c.at;
        break;
      }
      if (ch == '\0') throw std::invalid_argument("If header: unterminated list");
      IfCondition cond;
      if (c.s.substr(c.at, 3) == "Not" || c.s.substr(c.at, 3) == "not" || c.s.substr(c.at, 3) == "NOT") {
        cond.negated = true;
        c.at += 3;
      }
      const char open = c.peek();
      if (open == '<') {
        ++c.at;
        cond.value = c.until('>', "state token");
        if (cond.value.empty()) throw std::invalid_argument("If header: empty state token");
      } else if (open == '[') {
        ++c.at;
        cond.is_etag = true;
        cond.value = c.until(']', "entity tag");
        if (cond.value.empty()) throw std::invalid_argument("If header: empty entity tag");
      } else {
        throw std::invalid_argument("If header: expected a state token <...> or an entity tag [...]");
      }
      list.conditions.push_back(std::move(cond));
    }
    if (list.conditions.empty()) throw std::invalid_argument("If header: empty list ()");
    lists.push_back(std::move(list));
  }
  if (lists.empty()) throw std::invalid_argument("If header: no list");
  return lists;
}

bool evaluate_if(const std::vector<IfList>& lists, const std::string& request_path, const IfFacts& facts) {
  for (const IfList& list : lists) {
    std::string path = request_path;
    if (list.resource) {
      auto p = facts.path_of(*list.resource);
      if (!p) continue;  // another server's resource: this list does not hold here
      path = *p;
    }
    bool holds = true;
    for (const IfCondition& cond : list.conditions) {
      bool match;
      if (cond.is_etag) {
        const auto current = facts.etag(path);
        match = current && etag_equal(*current, cond.value);
      } else {
        match = facts.locked_by(path, cond.value);
      }
      if (match == cond.negated) {
        holds = false;
        break;
      }
    }
    if (holds) return true;
  }
  return false;
}

std::vector<std::string> submitted_tokens(const std::vector<IfList>& lists) {
  std::vector<std::string> out;
  for (const IfList& list : lists)
    for (const IfCondition& cond : list.conditions)
      if (!cond.is_etag && !cond.negated) out.push_back(cond.value);
  return out;
}

}  // namespace nshpc::dav
