#include "base/text.hpp"

#include <algorithm>

namespace nshpc::text {

std::string shell_quote(std::string_view arg) {
  if (arg.empty()) return "''";
  bool plain = true;
  for (char c : arg) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.' || c == '/' || c == ':' || c == '=' || c == '@' ||
              c == '+' || c == ',' || c == '%';
    if (!ok) {
      plain = false;
      break;
    }
  }
  if (plain) return std::string(arg);
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  out += '\'';
  return out;
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    out += shell_quote(a);
  }
  return out;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (;;) {
    const auto end = s.find(sep);
    out.push_back(s.substr(0, end));
    if (end == std::string_view::npos) return out;
    s.remove_prefix(end + 1);
  }
}

std::string_view trim(std::string_view s, std::string_view chars) {
  const auto first = s.find_first_not_of(chars);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(chars) - first + 1);
}

namespace {

// Length of the well-formed UTF-8 sequence starting at s[0] (n > 0 bytes available), or 0.
std::size_t sequence_length(const unsigned char* s, std::size_t n) {
  const unsigned c = s[0];
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;  // continuation byte or overlong 2-byte lead
  auto cont = [&](std::size_t i) { return i < n && (s[i] & 0xC0u) == 0x80u; };
  if (c < 0xE0) return cont(1) ? 2 : 0;
  if (c < 0xF0) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;   // overlong
    if (c == 0xED && s[1] >= 0xA0) return 0;  // UTF-16 surrogates
    return 3;
  }
  if (c < 0xF5) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0;   // overlong
    if (c == 0xF4 && s[1] >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

const unsigned char* bytes(std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }

}  // namespace

std::optional<std::size_t> find_invalid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = sequence_length(bytes(s) + i, s.size() - i);
    if (len == 0) return i;
    i += len;
  }
  return std::nullopt;
}

std::size_t utf8_length(std::string_view s) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < s.size(); ++count) {
    const std::size_t len = sequence_length(bytes(s) + i, s.size() - i);
    i += len == 0 ? 1 : len;
  }
  return count;
}

std::string sanitize_utf8(std::string_view s) {
  auto bad = find_invalid_utf8(s);
  if (!bad) return std::string(s);
  std::string out(s.substr(0, *bad));
  out.reserve(s.size() + 8);
  for (std::size_t i = *bad; i < s.size();) {
    const std::size_t len = sequence_length(bytes(s) + i, s.size() - i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

std::size_t utf8_prefix_bytes(std::string_view s, std::size_t chars) {
  std::size_t i = 0;
  for (std::size_t n = 0; n < chars && i < s.size(); ++n) {
    const std::size_t len = sequence_length(bytes(s) + i, s.size() - i);
    i += len == 0 ? 1 : len;
  }
  return i;
}

MiddleCut cut_middle(std::string_view s, std::size_t max_chars, const std::function<std::string(std::size_t cut)>& marker) {
  const std::size_t total = utf8_length(s);
  if (total <= max_chars) return {std::string(s), 0};
  // The marker's length depends on the number it names; one with the largest possible number
  // bounds it.
  const std::size_t marker_chars = utf8_length(marker(total)) + 2;  // + the line breaks around it
  const std::size_t keep = max_chars > marker_chars ? max_chars - marker_chars : 0;
  const std::size_t head_chars = keep * 2 / 5;
  const std::size_t tail_chars = keep - head_chars;
  std::size_t head_end = utf8_prefix_bytes(s, head_chars);
  std::size_t tail_start = utf8_prefix_bytes(s, total - tail_chars);
  // Whole lines where a line break is within the last (first) fifth of the kept part.
  if (auto nl = s.rfind('\n', head_end == 0 ? 0 : head_end - 1);
      nl != std::string_view::npos && head_end - (nl + 1) <= head_end / 5 && nl + 1 <= head_end)
    head_end = nl + 1;
  if (auto nl = s.find('\n', tail_start);
      nl != std::string_view::npos && nl + 1 - tail_start <= (s.size() - tail_start) / 5)
    tail_start = nl + 1;
  const std::size_t cut = total - utf8_length(s.substr(0, head_end)) - utf8_length(s.substr(tail_start));
  std::string out(s.substr(0, head_end));
  if (!out.empty() && out.back() != '\n') out += '\n';
  out += marker(cut);
  out += '\n';
  out.append(s.substr(tail_start));
  return {std::move(out), cut};
}

std::vector<std::size_t> find_all(std::string_view hay, std::string_view needle) {
  std::vector<std::size_t> at;
  if (needle.empty()) return at;
  for (std::size_t pos = hay.find(needle); pos != std::string_view::npos; pos = hay.find(needle, pos + needle.size()))
    at.push_back(pos);
  return at;
}

std::string replace_at(std::string_view s, const std::vector<std::size_t>& positions, std::size_t old_size,
                       std::string_view with) {
  std::string out;
  out.reserve(s.size() + positions.size() * (with.size() > old_size ? with.size() - old_size : 0));
  std::size_t from = 0;
  for (std::size_t pos : positions) {
    out.append(s.substr(from, pos - from));
    out.append(with);
    from = pos + old_size;
  }
  out.append(s.substr(from));
  return out;
}

std::string truncate_utf8(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut)) + "…";
}

}  // namespace nshpc::text

namespace nshpc::text {

std::optional<std::string> closest(std::string_view word, const std::vector<std::string>& candidates) {
  const std::size_t allowed = std::min<std::size_t>(3, std::max<std::size_t>(1, word.size() / 3));
  std::optional<std::string> best;
  std::size_t best_distance = allowed + 1;
  std::vector<std::size_t> row;
  for (const std::string& c : candidates) {
    if (c == word) continue;
    const std::size_t gap = c.size() > word.size() ? c.size() - word.size() : word.size() - c.size();
    if (gap >= best_distance) continue;
    row.resize(c.size() + 1);
    for (std::size_t j = 0; j <= c.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= word.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= c.size(); ++j) {
        const std::size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (word[i - 1] == c[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    if (row[c.size()] < best_distance) {
      best_distance = row[c.size()];
      best = c;
    }
  }
  return best;
}

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace nshpc::text
