#include "tools/progress.hpp"

#include <vector>

#include "base/text.hpp"

namespace nshpc::tools {

std::string newest_lines(std::string_view data, std::size_t max_lines) {
  std::vector<std::string> lines;
  std::size_t end = data.size();
  if (end > 0 && data[end - 1] == '\n') --end;
  while (lines.size() < max_lines && end > 0) {
    const std::size_t nl = data.rfind('\n', end - 1);
    const std::size_t begin = nl == std::string_view::npos ? 0 : nl + 1;
    std::string_view line = data.substr(begin, end - begin);
    // A line redrawn with '\r' shows what came after the last one that is not at its end.
    std::string_view shown = text::trim(line, "\r");
    if (const std::size_t cr = shown.rfind('\r'); cr != std::string_view::npos) shown = shown.substr(cr + 1);
    std::string clean = text::sanitize_utf8(text::trim(shown, " \t"));
    // Cut with a marker ('…', 3 bytes) that the bound includes.
    if (!clean.empty())
      lines.push_back(clean.size() <= kProgressLineBytes ? clean : text::truncate_utf8(clean, kProgressLineBytes - 3));
    if (nl == std::string_view::npos) break;
    end = nl;
  }
  std::string out;
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (!out.empty()) out += '\n';
    out += *it;
  }
  return out;
}

namespace {

// `what`, then the newest lines of stdout and of stderr (marked), at most kProgressLines in all.
std::string compose(std::string_view what, std::string_view out, std::string_view err) {
  std::string err_lines = newest_lines(err, kProgressLines);
  std::string out_lines = newest_lines(out, err_lines.empty() ? kProgressLines : kProgressLines - 1);
  if (!err_lines.empty() && !out_lines.empty()) err_lines = newest_lines(err, 1);
  std::string message(what);
  if (!out_lines.empty()) message += "\n" + out_lines;
  if (!err_lines.empty()) {
    for (std::string_view line : text::split(err_lines, '\n')) message += "\n[stderr] " + std::string(line);
  }
  return message;
}

}  // namespace

std::string OutputFollower::grown(std::string_view what, std::string_view out, std::string_view err) {
  // A buffer that did not grow from where it was (another call's) starts again from nothing.
  if (out.size() < out_seen_) out_seen_ = 0;
  if (err.size() < err_seen_) err_seen_ = 0;
  std::string message = compose(what, out.substr(out_seen_), err.substr(err_seen_));
  out_seen_ = out.size();
  err_seen_ = err.size();
  return message;
}

std::string OutputFollower::window(std::string_view what, std::string_view out, std::string_view err) {
  const std::uint64_t out_hash = text::fnv1a(out), err_hash = text::fnv1a(err);
  std::string message = compose(what, out_hash == out_hash_ ? std::string_view() : out,
                                err_hash == err_hash_ ? std::string_view() : err);
  out_hash_ = out_hash;
  err_hash_ = err_hash;
  return message;
}

}  // namespace nshpc::tools
