#include "base/proc.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <string>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"

namespace nshpc::proc {

namespace {

// `text` as a whole number (no sign, no trailing characters).
template <typename T>
bool parse_number(std::string_view text, T& out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty();
}

// The text of a /proc file; nullopt when the process is gone or hidden from us (hidepid), or the
// file does not exist (a kernel without it). Other failures throw.
std::optional<std::string> read_proc_file(const std::string& path) {
  try {
    return fs::read_file(path);
  } catch (const SysError& e) {
    // ESRCH: reaped between the open and the read; EACCES/EPERM: not ours to see.
    if (e.code() == ESRCH || e.code() == EACCES || e.code() == EPERM) return std::nullopt;
    throw;
  }
}

}  // namespace

std::optional<Stat> parse_stat(std::string_view line) {
  const auto open = line.find('(');
  const auto close = line.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
  Stat stat;
  stat.comm = std::string(line.substr(open + 1, close - open - 1));
  std::string_view rest = line.substr(close + 1);
  while (!rest.empty() && rest.back() == '\n') rest.remove_suffix(1);
  // Fields 3 and on, each after a single space.
  int last = 2;
  for (int field = 3; !rest.empty() && field <= 49; ++field) {
    if (rest.front() != ' ') return std::nullopt;
    rest.remove_prefix(1);
    const auto end = std::min(rest.find(' '), rest.size());
    const std::string_view value = rest.substr(0, end);
    rest.remove_prefix(end);
    bool ok = true;
    switch (field) {
      case 3:
        ok = value.size() == 1;
        if (ok) stat.state = value.front();
        break;
      case 4: ok = parse_number(value, stat.ppid); break;
      case 22: ok = parse_number(value, stat.start_time); break;
      case 48: ok = parse_number(value, stat.arg_start); break;
      case 49: ok = parse_number(value, stat.arg_end); break;
      default: ok = !value.empty(); break;
    }
    if (!ok) return std::nullopt;
    last = field;
  }
  // The fields after 49 are of no use here; an older kernel's line ends before 48.
  if (last < 22) return std::nullopt;  // cut short
  return stat;
}

std::optional<Stat> read_stat(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  const std::optional<std::string> line = read_proc_file(fmt::format("/proc/{}/stat", pid));
  if (!line) return std::nullopt;
  return parse_stat(*line);
}

std::optional<Stat> read_own_stat() {
  const std::optional<std::string> line = read_proc_file("/proc/self/stat");
  if (!line) return std::nullopt;
  return parse_stat(*line);
}

std::uint64_t Statm::resident_bytes() const {
  const long page = ::sysconf(_SC_PAGESIZE);
  return resident * static_cast<std::uint64_t>(page > 0 ? page : 4096);
}

std::optional<Statm> parse_statm(std::string_view line) {
  while (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  const auto space = line.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::string_view second = line.substr(space + 1, line.find(' ', space + 1) - space - 1);
  Statm statm;
  if (!parse_number(line.substr(0, space), statm.size) || !parse_number(second, statm.resident)) return std::nullopt;
  return statm;
}

std::optional<Statm> read_statm(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  const std::optional<std::string> line = read_proc_file(fmt::format("/proc/{}/statm", pid));
  if (!line) return std::nullopt;
  return parse_statm(*line);
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

std::vector<pid_t> read_children(pid_t pid) {
  std::vector<pid_t> out;
  if (pid <= 0) return out;
  std::optional<std::string> text;
  try {
    text = fs::read_file(fmt::format("/proc/{}/task/{}/children", pid, pid));
  } catch (const SysError&) {
    return out;  // gone, or not ours to read
  }
  if (!text) return out;
  std::string_view rest = *text;
  while (!rest.empty()) {
    const auto end = std::min(rest.find_first_of(" \n"), rest.size());
    pid_t child = 0;
    if (parse_number(rest.substr(0, end), child)) out.push_back(child);
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return out;
}

}  // namespace nshpc::proc
