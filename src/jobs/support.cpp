// What both executors and the engine use: limits, output files and tails, times.
#include "jobs/support.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <sstream>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/proc.hpp"
#include "base/text.hpp"
#include "base/time.hpp"

namespace nshpc::jobs {

namespace {
constexpr std::string_view kOutputDir = ".ns_hpc_output";

}  // namespace

std::string output_relative(const std::string& job_id, std::string_view ext) {
  return fmt::format("{}/{}.{}", kOutputDir, job_id, ext);
}

std::optional<UsageError> output_refusal(const config::Config& cfg, const std::string& relative, int code) {
  if (code != ELOOP && code != ENOTDIR && code != EXDEV) return std::nullopt;
  return UsageError(fmt::format("cannot create the job's output file {}/{}: {}/{} is not a plain folder (a "
                                "symbolic link or a file was put there); remove it and submit again",
                                cfg.ns.workspace_mount, relative, cfg.ns.workspace_mount, kOutputDir));
}

// Everything under the workspace is written by the sandbox: the file is created beneath the
// workspace descriptor without following links (a planted .ns_hpc_output symlink is refused).
UniqueFd create_output(const store::Store& store, const store::Instance& inst, const config::Config& cfg,
                       const std::string& relative) {
  try {
    return store.open_workspace_file(inst, relative, store::Store::WorkspaceOpen::create);
  } catch (const SysError& e) {
    if (auto refusal = output_refusal(cfg, relative, e.code())) throw *refusal;
    throw;
  }
}

// The tail of a job's output file: from the descriptor the server created (while it has it),
// else re-opened beneath the workspace as an untrusted file (never a link, a FIFO, a device, a
// hard link or someone else's file). A file that may not be read says why instead.
std::string output_tail(const store::Store& store, const store::Instance& inst, const config::Config& cfg,
                        const std::string& host_path, int kept_fd, const TailOptions& opt) {
  if (opt.lines == 0 || opt.bytes == 0) return {};
  if (kept_fd >= 0) return tail_from(kept_fd, opt);
  const std::string ws = inst.workspace.string() + "/";
  if (host_path.rfind(ws, 0) != 0) return {};
  const std::string relative = host_path.substr(ws.size());
  fs::Refusal refusal;
  UniqueFd fd;
  try {
    fd = store.open_workspace_file(inst, relative, store::Store::WorkspaceOpen::read, &refusal);
  } catch (const SysError& e) {
    refusal = {e.code(), e.what()};
  }
  if (!fd) {
    if (refusal.code == ENOENT) return {};  // nothing written yet
    return fmt::format("[ns-hpc: {}/{} was not read: {}]", cfg.ns.workspace_mount, relative, refusal.why);
  }
  return tail_from(fd.get(), opt);
}


// The last `opt.lines` lines (at most `opt.bytes`) of the file open at `fd`.
std::string tail_from(int fd, const TailOptions& opt) {
  if (opt.lines == 0 || opt.bytes == 0 || fd < 0) return {};
  struct stat st;
  if (::fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return {};
  const off_t window = std::min<off_t>(st.st_size, static_cast<off_t>(std::max<std::size_t>(opt.bytes * 4, 65536)));
  std::string data(static_cast<size_t>(window), '\0');
  ssize_t n = ::pread(fd, data.data(), data.size(), st.st_size - window);
  if (n <= 0) return {};
  data.resize(static_cast<size_t>(n));
  if (!data.empty() && data.back() == '\n') data.pop_back();  // the last line's terminator
  // Walk back over `lines` line breaks: what follows the last one counted is the tail.
  size_t start = data.size();
  std::size_t seen = 0;
  while (start > 0) {
    size_t nl = data.rfind('\n', start - 1);
    if (nl == std::string::npos) {
      start = 0;
      break;
    }
    if (++seen == opt.lines) {
      start = nl + 1;
      break;
    }
    start = nl;
  }
  std::string tail = data.substr(start);
  if (tail.size() > opt.bytes) tail = "…" + tail.substr(tail.size() - opt.bytes);
  return text::sanitize_utf8(tail);
}

// This process's start time (field 22 of /proc/<pid>/stat), to recognise it again; 0 if gone.
std::uint64_t start_time_of(pid_t pid) {
  const std::optional<proc::Stat> stat = proc::read_stat(pid);
  return stat ? stat->start_time : 0;
}

std::string sandbox_path(const store::Instance& inst, const config::Config& cfg, const std::string& host) {
  const std::string ws = inst.workspace.string();
  if (host.rfind(ws + "/", 0) == 0) return cfg.ns.workspace_mount + host.substr(ws.size());
  return host;
}

double seconds_between(const std::string& from, const std::string& to) {
  auto a = timeutil::parse_iso(from);
  auto b = to.empty() ? std::optional(timeutil::Clock::now()) : timeutil::parse_iso(to);
  if (!a || !b) return 0;
  return std::chrono::duration<double>(*b - *a).count();
}

bool submitter_alive(const Record& rec) {
  if (rec.owner_pid <= 0 || rec.owner_start == 0) return false;
  const std::optional<proc::Stat> stat = proc::read_stat(rec.owner_pid);
  // A zombie keeps its pid and start time until it is reaped, yet submits nothing any more.
  return stat && stat->start_time == rec.owner_start && !stat->ended();
}

std::map<std::string, std::int64_t> resolve_limits(const LimitRequest& request, const LimitTable& limits) {
  const auto& table = *limits.table;
  const std::string_view table_name = limits.name;
  std::map<std::string, std::int64_t> out;
  for (const auto& [name, value] : request.values) {
    auto it = table.find(name);
    if (it == table.end()) {
      std::string known;
      for (const auto& [n, l] : table) known += (known.empty() ? "" : ", ") + n;
      throw UsageError(fmt::format("unknown {} '{}'; the {}s are: {}", limits.noun, name, limits.noun, known));
    }
    if (value < 0) throw UsageError(fmt::format("limit {} = {} must not be negative", name, value));
    if (value < it->second.min)
      throw UsageError(fmt::format("{} = {} is below its minimum of {} ({} {}); a limit cannot be switched off, "
                                   "ask for up to its maximum of {} instead",
                                   name, value, it->second.min, table_name, name, it->second.max));
    if (value > it->second.max)
      throw UsageError(fmt::format("{} = {} is over its maximum of {} ({} {})", name, value, it->second.max,
                                   table_name, name));
  }
  for (const auto& [name, limit] : table) {
    auto asked = request.values.find(name);
    out[name] = asked != request.values.end() ? asked->second : limit.default_value;
  }
  return out;
}

}  // namespace nshpc::jobs
