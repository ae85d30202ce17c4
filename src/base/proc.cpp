#include "base/proc.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <string>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"

namespace nshpc::proc {

std::optional<Stat> parse_stat(std::string_view line) {
  const auto paren = line.rfind(')');
  if (paren == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(paren + 1);
  Stat stat;
  // Fields 3..22, separated by single spaces.
  for (int field = 3; field <= 22; ++field) {
    if (rest.empty() || rest.front() != ' ') return std::nullopt;
    rest.remove_prefix(1);
    const auto end = std::min(rest.find(' '), rest.size());
    const std::string_view value = rest.substr(0, end);
    rest.remove_prefix(end);
    if (value.empty()) return std::nullopt;
    if (field == 3) {
      if (value.size() != 1) return std::nullopt;
      stat.state = value.front();
    } else if (field == 4) {
      if (std::from_chars(value.data(), value.data() + value.size(), stat.ppid).ec != std::errc()) return std::nullopt;
    } else if (field == 22) {
      if (std::from_chars(value.data(), value.data() + value.size(), stat.start_time).ec != std::errc())
        return std::nullopt;
    }
  }
  return stat;
}

std::optional<Stat> read_stat(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  std::optional<std::string> line;
  try {
    line = fs::read_file(fmt::format("/proc/{}/stat", pid));
  } catch (const SysError& e) {
    if (e.code() == ESRCH) return std::nullopt;  // reaped between the open and the read
    throw;
  }
  if (!line) return std::nullopt;
  return parse_stat(*line);
}

std::vector<std::string> read_cmdline(pid_t pid) {
  std::optional<std::string> raw;
  try {
    raw = fs::read_file(fmt::format("/proc/{}/cmdline", pid));
  } catch (const SysError&) {
    return {};  // gone between the open and the read, or not ours to read
  }
  std::vector<std::string> args;
  if (!raw) return args;
  std::string_view rest = *raw;
  while (!rest.empty()) {
    const auto end = std::min(rest.find('\0'), rest.size());
    args.emplace_back(rest.substr(0, end));
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return args;
}

}  // namespace nshpc::proc
