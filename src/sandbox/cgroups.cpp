// Per-job control groups, managed directly in the cgroup file systems (see cgroups.hpp).
//
// Layout: for each hierarchy that provides something we use (a v1 hierarchy carrying memory,
// cpu or pids; the v2 hierarchy for cgroup.kill/cgroup.events and whatever controllers it has),
// the job's group is "<mount>/<this process's group>/ns-hpc/<name>". A controller is bound to
// exactly one hierarchy, so each limit has at most one place to go: v1 first, else v2.
#include "sandbox/cgroups.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/pidfd.hpp"
#include "base/text.hpp"

namespace nshpc::sandbox {

namespace stdfs = std::filesystem;

namespace {

constexpr std::string_view kTop = "ns-hpc";
constexpr long long kCpuPeriodUs = 100000;
constexpr long long kCpuMinQuotaUs = 1000;          // the kernel's minimum (1 ms)
constexpr long long kCpuMaxQuotaUs = 1000000000000;  // far below the kernel's maximum
constexpr const char* kControllers[] = {"memory", "cpu", "pids"};

// ---- text and file helpers ----------------------------------------------------------------

std::set<std::string> words(std::string_view s) {
  std::set<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) out.emplace(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  s = text::trim(s);
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

// The number after `key` in "key value" lines (cgroup.events, memory.events, memory.oom_control).
std::optional<std::uint64_t> keyed_value(std::string_view text, std::string_view key) {
  for (std::string_view l : text::split(text, '\n')) {
    if (l.size() > key.size() && l.substr(0, key.size()) == key && l[key.size()] == ' ')
      return parse_u64(l.substr(key.size() + 1));
  }
  return std::nullopt;
}

bool file_exists(const stdfs::path& p) { return ::access(p.c_str(), F_OK) == 0; }

// A cgroup file's content; nullopt when it (or its group) is gone. Other failures throw.
std::optional<std::string> read_cgroup_file(const stdfs::path& p) {
  try {
    return fs::read_file(p);
  } catch (const SysError& e) {
    if (e.code() == ENODEV || e.code() == ENOENT) return std::nullopt;  // removed meanwhile
    throw;
  }
}

// One write(2) of `value`, as cgroup files want it. Throws SysError naming the file.
void write_cgroup_file(const stdfs::path& file, std::string_view value) {
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) throw SysError(errno, "open", file.string());
  for (;;) {
    ssize_t n = ::write(fd.get(), value.data(), value.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw SysError(errno, fmt::format("write '{}' to", value), file.string());
    if (static_cast<size_t>(n) != value.size())
      throw SysError(EIO, fmt::format("short write of '{}' to", value), file.string());
    return;
  }
}

std::vector<pid_t> read_pids(const stdfs::path& procs_file) {
  std::vector<pid_t> out;
  auto text = read_cgroup_file(procs_file);
  if (!text) return out;
  for (const auto& line : text::split(*text, '\n'))
    if (auto v = parse_u64(line); v && *v > 0) out.push_back(static_cast<pid_t>(*v));
  return out;
}

// `dir` and every group below it, deepest first. Never follows symbolic links.
void collect_dirs(const stdfs::path& dir, std::vector<stdfs::path>& out) {
  std::error_code ec;
  for (stdfs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (it->symlink_status(ec2).type() == stdfs::file_type::directory) collect_dirs(it->path(), out);
  }
  out.push_back(dir);
}

// Lexically normal, without a trailing slash.
std::string normal(const stdfs::path& p) {
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

bool is_under(const std::string& path, const std::string& root) {
  if (root == "/") return !path.empty() && path.front() == '/';
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

// Undoes mountinfo's octal escapes (\040 for space and so on).
std::string unescape_mountinfo(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() &&
        std::all_of(s.begin() + static_cast<long>(i) + 1, s.begin() + static_cast<long>(i) + 4,
                    [](char c) { return c >= '0' && c <= '7'; })) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// ---- discovery ----------------------------------------------------------------------------

struct Hierarchy {
  bool v2 = false;
  stdfs::path mount;
  std::set<std::string> controllers;  // of memory/cpu/pids: what a child group here can get
  stdfs::path own;                    // this process's group in it; empty when unusable
  std::string problem;                // why unusable
};

struct Discovery {
  std::vector<Hierarchy> hierarchies;  // v1 ones first, then the v2 one
  std::string root;                    // the normalised mount_root
};

Discovery discover(const stdfs::path& mount_root) {
  Discovery d;
  d.root = normal(mount_root);

  // This process's groups: "N:controllers:/path" (v1) and "0::/path" (v2).
  std::vector<std::pair<std::set<std::string>, std::string>> v1_own;
  std::optional<std::string> v2_own;
  if (auto text = fs::read_file("/proc/self/cgroup")) {
    for (const auto& line : text::split(*text, '\n')) {
      size_t a = line.find(':');
      size_t b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string_view id = line.substr(0, a), ctrls = line.substr(a + 1, b - a - 1);
      const std::string path(line.substr(b + 1));
      if (id == "0" && ctrls.empty()) {
        v2_own = path;
      } else {
        auto list = text::split(ctrls, ',');
        v1_own.emplace_back(std::set<std::string>(list.begin(), list.end()), path);
      }
    }
  }

  auto locate = [](const std::string& own, const std::string& mount_root_field,
                   const stdfs::path& mount, Hierarchy& h) {
    std::string rel;
    if (mount_root_field == "/") {
      rel = own;
    } else if (own == mount_root_field) {
      rel = "/";
    } else if (is_under(own, mount_root_field)) {
      rel = own.substr(mount_root_field.size());
    } else {
      h.problem = fmt::format("this process's cgroup {} is outside the part mounted at {}", own,
                              mount.string());
      return;
    }
    for (const auto& part : text::split(rel, '/')) {
      if (part == "..") {
        h.problem = fmt::format("this process's cgroup {} is outside its cgroup namespace", own);
        return;
      }
    }
    stdfs::path relpath = stdfs::path(rel).relative_path();
    h.own = normal(relpath.empty() ? mount : mount / relpath);
  };

  std::vector<Hierarchy> v1, v2;
  std::set<std::string> seen_devices;
  if (auto text = fs::read_file("/proc/self/mountinfo")) {
    for (const auto& line : text::split(*text, '\n')) {
      std::vector<std::string> t;
      for (std::string_view w : text::split(line, ' '))
        if (!w.empty()) t.emplace_back(w);
      auto dash = std::find(t.begin(), t.end(), "-");
      if (dash == t.end() || dash - t.begin() < 6 || t.end() - dash < 4) continue;
      const std::string& fstype = *(dash + 1);
      const std::string& super_options = *(dash + 3);
      if (fstype != "cgroup" && fstype != "cgroup2") continue;
      const std::string mount_point = normal(unescape_mountinfo(t[4]));
      if (!is_under(mount_point, d.root)) continue;
      if (!seen_devices.insert(t[2]).second) continue;  // a second mount of the same hierarchy
      const std::string mount_root_field = unescape_mountinfo(t[3]);

      Hierarchy h;
      h.mount = mount_point;
      if (fstype == "cgroup") {
        auto opts = text::split(super_options, ',');
        for (const char* c : kControllers)
          if (std::find(opts.begin(), opts.end(), c) != opts.end()) h.controllers.insert(c);
        if (h.controllers.empty()) continue;  // cpuset, devices, name=systemd, ...: not ours
        const std::string* own = nullptr;
        for (const auto& [ctrls, path] : v1_own)
          if (ctrls.count(*h.controllers.begin())) own = &path;
        if (!own)
          h.problem = fmt::format("the {} hierarchy at {} is not in /proc/self/cgroup",
                                  *h.controllers.begin(), mount_point);
        else
          locate(*own, mount_root_field, h.mount, h);
        v1.push_back(std::move(h));
      } else {
        h.v2 = true;
        if (!v2_own)
          h.problem = fmt::format("no cgroup2 entry in /proc/self/cgroup for {}", mount_point);
        else
          locate(*v2_own, mount_root_field, h.mount, h);
        if (!h.own.empty()) {
          try {
            auto ctrls = words(fs::read_file(h.own / "cgroup.controllers").value_or(""));
            for (const char* c : kControllers)
              if (ctrls.count(c)) h.controllers.insert(c);
          } catch (const Error& e) {
            h.problem = e.what();
            h.own.clear();
          }
        }
        v2.push_back(std::move(h));
      }
    }
  }
  d.hierarchies = std::move(v1);
  for (auto& h : v2) d.hierarchies.push_back(std::move(h));
  return d;
}

// Which hierarchy provides each controller (a controller lives in exactly one: v1 first, else
// v2), or why none can.
void assign_providers(const Discovery& d, std::map<std::string, size_t>& provider,
                      std::map<std::string, std::string>& problems) {
  const Hierarchy* v2 = nullptr;
  for (const auto& h : d.hierarchies)
    if (h.v2) v2 = &h;
  for (const char* c : kControllers) {
    for (size_t i = 0; i < d.hierarchies.size() && !provider.count(c) && !problems.count(c); ++i) {
      const Hierarchy& h = d.hierarchies[i];
      if (!h.v2 && h.controllers.count(c)) {
        if (h.own.empty())
          problems[c] = h.problem;
        else
          provider[c] = i;
      }
    }
    if (provider.count(c) || problems.count(c)) continue;
    for (size_t i = 0; i < d.hierarchies.size(); ++i)
      if (d.hierarchies[i].v2 && !d.hierarchies[i].own.empty() && d.hierarchies[i].controllers.count(c))
        provider[c] = i;
    if (provider.count(c)) continue;
    if (d.hierarchies.empty())
      problems[c] = fmt::format("no cgroup hierarchy is mounted under {}", d.root);
    else if (v2 && !v2->own.empty())
      problems[c] = fmt::format("no {0} controller (no v1 {0} hierarchy under {1}, not in {2})", c,
                                d.root, (v2->own / "cgroup.controllers").string());
    else
      problems[c] = fmt::format("no {0} controller (no v1 {0} hierarchy or usable cgroup2 under {1})",
                                c, d.root);
  }
}

// ---- group creation -----------------------------------------------------------------------

void check_name(const std::string& name) {
  bool ok = !name.empty() && name.find('\0') == std::string::npos &&
            name.find('\n') == std::string::npos;
  if (ok) {
    for (const auto& part : text::split(name, '/'))
      if (part.empty() || part == "." || part == "..") ok = false;
  }
  if (!ok)
    throw UsageError(fmt::format(
        "invalid cgroup name '{}'; use non-empty parts separated by '/', without '.' or '..'", name));
}

// Turns on `wanted` v2 controllers for the children of `dir`. Ones that fail are moved from
// `wanted` to `failures`.
void enable_controllers(const stdfs::path& dir, std::set<std::string>& wanted,
                        std::map<std::string, std::string>& failures) {
  const stdfs::path file = dir / "cgroup.subtree_control";
  std::set<std::string> have;
  try {
    have = words(read_cgroup_file(file).value_or(""));
  } catch (const Error&) {
    // The write below reports the problem.
  }
  for (auto it = wanted.begin(); it != wanted.end();) {
    if (have.count(*it)) {
      ++it;
      continue;
    }
    try {
      write_cgroup_file(file, "+" + *it);
      ++it;
    } catch (const SysError& e) {
      std::string why = e.what();
      if (e.code() == EBUSY)
        why += " (that cgroup holds processes, so it cannot hand controllers down; start the "
               "server in a leaf cgroup of its own inside the delegated subtree)";
      failures[*it] = why;
      it = wanted.erase(it);
    }
  }
}

// mkdir -p of "<own>/ns-hpc/<name>" in one hierarchy (enabling v2 controllers on the way).
// nullopt with `failure` set when the hierarchy cannot be used; throws when a busy group of
// this name already exists.
std::optional<stdfs::path> make_group(const Hierarchy& h, const std::string& name,
                                      std::set<std::string> enable,
                                      std::map<std::string, std::string>& enable_failures,
                                      std::string& failure, bool keep_existing = false) {
  std::vector<std::string> parts{std::string(kTop)};
  for (std::string_view p : text::split(name, '/')) parts.emplace_back(p);
  for (int attempt = 0;; ++attempt) {
    stdfs::path dir = h.own;
    bool retry = false;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (h.v2 && !enable.empty()) enable_controllers(dir, enable, enable_failures);
      const stdfs::path next = dir / parts[i];
      const bool leaf = i + 1 == parts.size();
      if (::mkdir(next.c_str(), 0755) < 0) {
        int err = errno;
        if (err == EEXIST && (!leaf || keep_existing)) {
          dir = next;
          continue;
        }
        if (err == EEXIST) {
          // Left over from an earlier run: reuse it only when it is empty.
          if (::rmdir(next.c_str()) < 0 && errno != ENOENT)
            throw SysError(errno, "create cgroup (a group of this name exists and is in use)",
                           next.string());
          if (::mkdir(next.c_str(), 0755) == 0) {
            dir = next;
            continue;
          }
          err = errno;
        }
        if (err == ENOENT && attempt < 3) {  // a parent was removed meanwhile by another job
          retry = true;
          break;
        }
        failure = SysError(err, "mkdir", next.string()).what();
        return std::nullopt;
      }
      dir = next;
    }
    if (!retry) return dir;
  }
}

void write_memory(const Hierarchy& h, const stdfs::path& group, std::uint64_t bytes,
                  std::vector<std::string>& notes) {
  const std::string value = std::to_string(bytes);
  if (!h.v2) {
    write_cgroup_file(group / "memory.limit_in_bytes", value);
    if (file_exists(group / "memory.memsw.limit_in_bytes")) {  // only with swap accounting
      try {
        write_cgroup_file(group / "memory.memsw.limit_in_bytes", value);
      } catch (const Error& e) {
        notes.push_back(fmt::format("memory+swap: {}", e.what()));
      }
    }
  } else {
    write_cgroup_file(group / "memory.max", value);
    if (file_exists(group / "memory.swap.max")) {  // memory.max excludes swap: allow none
      try {
        write_cgroup_file(group / "memory.swap.max", "0");
      } catch (const Error& e) {
        notes.push_back(fmt::format("memory+swap: {}", e.what()));
      }
    }
  }
}

// The cores a v1 group's quota gives (nullopt: no quota, "-1").
std::optional<double> v1_cpus(const stdfs::path& group) {
  const auto quota = parse_u64(read_cgroup_file(group / "cpu.cfs_quota_us").value_or(""));
  const auto period = parse_u64(read_cgroup_file(group / "cpu.cfs_period_us").value_or(""));
  if (!quota || !period || *period == 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

// v1 refuses a group a CPU quota above that of its nearest ancestor with one (EINVAL), where
// v2 takes the smaller of the two itself. So on v1 a group gets at most what is above it: an
// execution's own cpus below an instance's, the same bound as on v2.
double v1_cpu_ceiling(const Hierarchy& h, const stdfs::path& group, double cpus) {
  const std::string mount = normal(h.mount);
  for (stdfs::path dir = stdfs::path(normal(group)).parent_path(); is_under(dir.string(), mount) && dir.string() != mount;
       dir = dir.parent_path()) {
    if (auto above = v1_cpus(dir)) return std::min(cpus, *above);
  }
  return cpus;
}

void write_cpu(const Hierarchy& h, const stdfs::path& group, double cpus) {
  if (!h.v2) cpus = v1_cpu_ceiling(h, group, cpus);
  const double wanted = std::round(cpus * static_cast<double>(kCpuPeriodUs));
  const long long quota = wanted >= static_cast<double>(kCpuMaxQuotaUs)
                              ? kCpuMaxQuotaUs
                              : std::max(kCpuMinQuotaUs, static_cast<long long>(wanted));
  if (!h.v2) {
    write_cgroup_file(group / "cpu.cfs_period_us", std::to_string(kCpuPeriodUs));
    write_cgroup_file(group / "cpu.cfs_quota_us", std::to_string(quota));
  } else {
    write_cgroup_file(group / "cpu.max", fmt::format("{} {}", quota, kCpuPeriodUs));
  }
}

// Takes the limit of controller `c` off `group` (a folder whose limit left the configuration).
void write_unlimited(const Hierarchy& h, const stdfs::path& group, std::string_view c) {
  if (c == "memory") {
    if (!h.v2) {
      // memsw first: v1 refuses a memory limit above the memory+swap one.
      if (file_exists(group / "memory.memsw.limit_in_bytes")) write_cgroup_file(group / "memory.memsw.limit_in_bytes", "-1");
      write_cgroup_file(group / "memory.limit_in_bytes", "-1");
    } else {
      write_cgroup_file(group / "memory.max", "max");
      if (file_exists(group / "memory.swap.max")) write_cgroup_file(group / "memory.swap.max", "max");
    }
  } else if (c == "cpu") {
    if (!h.v2)
      write_cgroup_file(group / "cpu.cfs_quota_us", "-1");
    else
      write_cgroup_file(group / "cpu.max", fmt::format("max {}", kCpuPeriodUs));
  } else if (c == "pids") {
    write_cgroup_file(group / "pids.max", "max");
  }
}

// A limit as a cgroup file shows it: nullopt for "max" (v2) or v1's huge "no limit" number.
std::optional<std::uint64_t> limit_value(const std::optional<std::string>& text) {
  if (!text) return std::nullopt;
  auto v = parse_u64(*text);
  if (!v || *v >= (std::uint64_t{1} << 62)) return std::nullopt;
  return v;
}

// Sends `sig` to every process listed under `paths` (never to this process). A pidfd is taken
// before a second look at the member list, so a pid that was recycled meanwhile is not hit.
void signal_members(const std::vector<pid_t>& first_look,
                    const std::function<std::vector<pid_t>()>& look, int sig) {
  const pid_t self = ::getpid();
  std::vector<std::pair<pid_t, UniqueFd>> targets;
  for (pid_t pid : first_look) {
    if (pid == self) continue;
    int error = 0;
    UniqueFd fd = open_pidfd(pid, &error);
    if (!fd && error == ESRCH) continue;
    targets.emplace_back(pid, std::move(fd));
  }
  if (targets.empty()) return;
  const std::vector<pid_t> second_look = look();
  for (auto& [pid, fd] : targets) {
    if (!std::binary_search(second_look.begin(), second_look.end(), pid)) continue;
    if (!fd) {
      ::kill(pid, sig);  // no pidfd for it (not supported here): by pid, checked just above
      continue;
    }
    try {
      signal_pidfd(fd.get(), sig);
    } catch (const SysError&) {
      // Not ours to signal (EPERM): nothing else to do for it.
    }
  }
}

}  // namespace

// ---- Cgroup -------------------------------------------------------------------------------

std::vector<stdfs::path> Cgroup::candidate_paths(const std::string& name, const stdfs::path& mount_root) {
  check_name(name);
  std::vector<stdfs::path> out;
  for (const auto& h : discover(mount_root).hierarchies) {
    if (h.own.empty()) continue;
    stdfs::path p = h.own / kTop;
    for (std::string_view part : text::split(name, '/')) p /= part;
    out.push_back(std::move(p));
  }
  return out;
}

std::size_t Cgroup::remove_empty(const std::string& folder, std::string_view prefix, const stdfs::path& mount_root) {
  std::size_t left = 0;
  for (const stdfs::path& dir : candidate_paths(folder, mount_root)) {
    std::error_code ec;
    for (const auto& entry : stdfs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (!name.starts_with(prefix) || !entry.is_directory(ec)) continue;
      if (::rmdir(entry.path().c_str()) < 0) ++left;  // EBUSY while it has members
    }
  }
  return left;
}

void Cgroup::limit_folder(const std::string& name, const CgroupLimits& limits, std::vector<std::string>& unenforced,
                          const stdfs::path& mount_root) {
  check_name(name);
  if (limits.cpus && !(std::isfinite(*limits.cpus) && *limits.cpus > 0))
    throw UsageError(fmt::format("invalid cpu limit {}; give a positive number of cores", *limits.cpus));
  const std::map<std::string, bool> asked{{"memory", limits.memory_bytes.has_value()},
                                          {"cpu", limits.cpus.has_value()},
                                          {"pids", limits.pids.has_value()}};
  const bool any_asked = limits.memory_bytes || limits.cpus || limits.pids;
  const Discovery d = discover(mount_root);
  std::map<std::string, std::string> problems;
  std::map<std::string, size_t> provider;
  assign_providers(d, provider, problems);
  std::vector<std::string> notes;
  for (size_t i = 0; i < d.hierarchies.size(); ++i) {
    const Hierarchy& h = d.hierarchies[i];
    std::set<std::string> roles;
    for (const auto& [c, idx] : provider)
      if (idx == i) roles.insert(c);
    if (roles.empty() || h.own.empty()) continue;
    stdfs::path folder = h.own / kTop;
    for (std::string_view part : text::split(name, '/')) folder /= part;
    if (!file_exists(folder / "cgroup.procs")) {
      if (!any_asked) continue;  // nothing to take off a folder that is not there
      std::map<std::string, std::string> enable_failures;
      std::string failure;
      if (!make_group(h, name, h.v2 ? roles : std::set<std::string>{}, enable_failures, failure,
                      /*keep_existing=*/true)) {
        for (const auto& c : roles) problems[c] = failure;
        continue;
      }
      for (const auto& [c, why] : enable_failures) problems[c] = why;
      log::debug("cgroup {}: created the folder {}", name, folder.string());
    }
    for (const auto& c : roles) {
      if (problems.count(c)) continue;
      try {
        if (c == "memory" && limits.memory_bytes) {
          // v1 refuses a memory limit above the memory+swap one: a raise lifts memsw first (the
          // memory limit itself stays in force meanwhile; write_memory sets memsw again).
          if (!h.v2 && file_exists(folder / "memory.memsw.limit_in_bytes"))
            write_cgroup_file(folder / "memory.memsw.limit_in_bytes", "-1");
          write_memory(h, folder, *limits.memory_bytes, notes);
        } else if (c == "cpu" && limits.cpus) {
          if (!h.v2) {
            // v1: no group below may keep more than the folder gets (see v1_cpu_ceiling); they
            // come down first, so that the folder's own quota is accepted.
            std::error_code ec;
            for (const auto& entry : stdfs::directory_iterator(folder, ec)) {
              std::error_code ec2;
              if (entry.symlink_status(ec2).type() != stdfs::file_type::directory) continue;
              if (auto has = v1_cpus(entry.path()); has && *has > *limits.cpus) write_cpu(h, entry.path(), *limits.cpus);
            }
          }
          write_cpu(h, folder, *limits.cpus);
        } else if (c == "pids" && limits.pids) {
          write_cgroup_file(folder / "pids.max", std::to_string(*limits.pids));
        } else {
          write_unlimited(h, folder, c);
        }
      } catch (const Error& e) {
        if (asked.at(c))
          problems[c] = e.what();
        else  // e.g. a group of that name another user's server made (EACCES): not ours to change
          log::debug("cgroup {}: the {} limit could not be taken off: {}", name, c, e.what());
      }
    }
  }
  for (const char* c : kControllers)
    if (asked.at(c) && problems.count(c)) unenforced.push_back(fmt::format("{}: {}", c, problems[c]));
  for (auto& n : notes) unenforced.push_back(std::move(n));
}

std::optional<CgroupUsage> Cgroup::usage(const std::string& name, const stdfs::path& mount_root) {
  std::optional<CgroupUsage> out;
  for (const stdfs::path& p : candidate_paths(name, mount_root)) {
    if (!file_exists(p / "cgroup.procs")) continue;
    if (!out) out.emplace();
    CgroupUsage& u = *out;
    auto first = [&p](std::initializer_list<const char*> files) -> std::optional<std::string> {
      for (const char* f : files)
        if (auto text = read_cgroup_file(p / f)) return text;
      return std::nullopt;
    };
    auto set = [](auto& field, auto v) {
      if (!field && v) field = v;
    };
    auto ratio = [](std::optional<std::uint64_t> quota, std::optional<std::uint64_t> period) -> std::optional<double> {
      if (!quota || !period || *period == 0) return std::nullopt;  // "max"/"-1": no limit
      return static_cast<double>(*quota) / static_cast<double>(*period);
    };
    try {
      if (auto t = first({"memory.current", "memory.usage_in_bytes"})) set(u.memory_bytes, parse_u64(*t));
      if (auto t = first({"pids.current"})) set(u.pids, parse_u64(*t));
      if (auto t = read_cgroup_file(p / "cpu.stat")) set(u.cpu_usec, keyed_value(*t, "usage_usec"));
      if (auto t = read_cgroup_file(p / "cpuacct.usage"))
        if (auto ns = parse_u64(*t)) set(u.cpu_usec, std::optional<std::uint64_t>(*ns / 1000));
      set(u.memory_max_bytes, limit_value(first({"memory.max", "memory.limit_in_bytes"})));
      set(u.pids_max, limit_value(first({"pids.max"})));
      if (auto t = read_cgroup_file(p / "cpu.max")) {  // "<quota|max> <period>"
        auto parts = text::split(text::trim(*t), ' ');
        if (parts.size() == 2) set(u.cpus_max, ratio(parse_u64(parts[0]), parse_u64(parts[1])));
      } else if (auto q = read_cgroup_file(p / "cpu.cfs_quota_us")) {
        set(u.cpus_max, ratio(parse_u64(*q), parse_u64(read_cgroup_file(p / "cpu.cfs_period_us").value_or(""))));
      }
    } catch (const Error& e) {
      log::debug("cgroup {}: usage not readable: {}", name, e.what());
    }
  }
  return out;
}

bool Cgroup::remove_folder(const std::string& name, const stdfs::path& mount_root) {
  bool gone = true;
  for (const stdfs::path& folder : candidate_paths(name, mount_root)) {
    if (::rmdir(folder.c_str()) < 0 && errno != ENOENT) {
      gone = false;  // a group below it (EBUSY) is somebody's: left alone
      continue;
    }
    // The folders between it and "ns-hpc", then "ns-hpc" itself, while they are empty.
    for (stdfs::path dir = folder.parent_path(); dir.has_relative_path(); dir = dir.parent_path()) {
      const bool top = dir.filename() == kTop;
      if (::rmdir(dir.c_str()) < 0 || top) break;
    }
  }
  return gone;
}

std::unique_ptr<Cgroup> Cgroup::create(const std::string& name, const CgroupLimits& limits,
                                       std::vector<std::string>& unenforced, const stdfs::path& mount_root,
                                       std::vector<std::string>* unenforced_controllers) {
  check_name(name);
  if (limits.cpus && !(std::isfinite(*limits.cpus) && *limits.cpus > 0))
    throw UsageError(fmt::format("invalid cpu limit {}; give a positive number of cores", *limits.cpus));

  const Discovery d = discover(mount_root);
  const std::map<std::string, bool> asked{{"memory", limits.memory_bytes.has_value()},
                                          {"cpu", limits.cpus.has_value()},
                                          {"pids", limits.pids.has_value()}};
  bool any_asked = false;
  for (const auto& [c, a] : asked) any_asked = any_asked || a;

  std::map<std::string, std::string> problems;  // controller -> why it is not enforced
  std::map<std::string, size_t> provider;       // controller -> index in d.hierarchies
  assign_providers(d, provider, problems);

  std::unique_ptr<Cgroup> cg(new Cgroup());  // removes what was made if anything below throws
  std::vector<std::string> failures;         // why groups could not be made
  auto add_failure = [&failures](const std::string& why) {
    if (std::find(failures.begin(), failures.end(), why) == failures.end()) failures.push_back(why);
  };
  if (d.hierarchies.empty()) add_failure(fmt::format("no cgroup hierarchy is mounted under {}", d.root));

  std::map<std::string, std::pair<const Hierarchy*, stdfs::path>> groups;  // controller -> group
  for (size_t i = 0; i < d.hierarchies.size(); ++i) {
    const Hierarchy& h = d.hierarchies[i];
    std::set<std::string> roles;
    for (const auto& [c, idx] : provider)
      if (idx == i) roles.insert(c);
    if (!h.v2 && roles.empty()) {  // an unusable v1 hierarchy (its limits' `problems` say why)
      if (h.own.empty()) add_failure(h.problem);
      continue;
    }
    if (h.own.empty()) {
      add_failure(h.problem);
      continue;
    }
    std::map<std::string, std::string> enable_failures;
    std::string failure;
    auto leaf = make_group(h, name, h.v2 ? roles : std::set<std::string>{}, enable_failures, failure);
    if (!leaf) {
      add_failure(failure);
      for (const auto& c : roles) problems[c] = failure;
      continue;
    }
    log::debug("cgroup {}: created {}", name, leaf->string());
    cg->paths_.push_back(*leaf);
    cg->tops_.push_back(h.own / kTop);
    for (const auto& c : roles) {
      if (auto it = enable_failures.find(c); it != enable_failures.end())
        problems[c] = it->second;
      else
        groups[c] = {&h, *leaf};
    }
  }

  std::vector<std::string> notes;
  auto apply = [&](const char* c, const std::function<void(const Hierarchy&, const stdfs::path&)>& write) {
    if (!asked.at(c)) return;
    auto it = groups.find(c);
    if (it == groups.end()) return;  // `problems` says why
    try {
      write(*it->second.first, it->second.second);
    } catch (const Error& e) {
      problems[c] = e.what();
    }
  };
  apply("memory", [&](const Hierarchy& h, const stdfs::path& g) {
    write_memory(h, g, *limits.memory_bytes, notes);
  });
  apply("cpu", [&](const Hierarchy& h, const stdfs::path& g) { write_cpu(h, g, *limits.cpus); });
  apply("pids", [&](const Hierarchy&, const stdfs::path& g) {
    write_cgroup_file(g / "pids.max", std::to_string(*limits.pids));
  });

  for (const char* c : kControllers)
    if (asked.at(c) && problems.count(c)) {
      unenforced.push_back(fmt::format("{}: {}", c, problems[c]));
      if (unenforced_controllers) unenforced_controllers->emplace_back(c);
    }
  for (auto& n : notes) unenforced.push_back(std::move(n));

  if (cg->paths_.empty()) {
    const std::string why = failures.empty() ? "no usable cgroup hierarchy" : fmt::format("{}", fmt::join(failures, ", "));
    if (any_asked)
      throw Error(fmt::format("no cgroup could be created for '{}' ({}); run the server as root or "
                              "in a delegated cgroup, or turn off jobs.local.use_cgroups",
                              name, why));
    unenforced.push_back(fmt::format("kill: no cgroup created ({})", why));
  }
  return cg;
}

std::unique_ptr<Cgroup> Cgroup::attach(const std::vector<stdfs::path>& paths) {
  std::unique_ptr<Cgroup> cg(new Cgroup());
  for (const auto& given : paths) {
    const stdfs::path p = normal(given);
    struct statfs sf {};
    if (::statfs(p.c_str(), &sf) < 0) {
      if (errno == ENOENT) continue;  // gone (reboot, or removed): nothing left to manage there
      throw SysError(errno, "attach cgroup", p.string());
    }
    if ((sf.f_type != CGROUP_SUPER_MAGIC && sf.f_type != CGROUP2_SUPER_MAGIC) ||
        !file_exists(p / "cgroup.procs"))
      throw Error(fmt::format("{} is not a cgroup folder; the saved job record is wrong", p.string()));
    // The "ns-hpc" folder above the leaf (the last one, as the name itself may contain one).
    stdfs::path top, prefix;
    for (const auto& part : p.parent_path()) {
      prefix /= part;
      if (part == kTop) top = prefix;
    }
    log::debug("cgroup: attached to {}", p.string());
    cg->paths_.push_back(p);
    cg->tops_.push_back(top);
  }
  if (cg->paths_.empty() && !paths.empty())
    throw SysError(ENOENT, "attach cgroup", paths.front().string());
  return cg;
}

Cgroup::~Cgroup() {
  try {
    remove();
  } catch (const std::exception& e) {
    log::warn("cgroup left behind: {}", e.what());
  }
  for (int fd : fds_) ::close(fd);
  if (v2_dir_ >= 0) ::close(v2_dir_);
}

std::vector<int> Cgroup::procs_fds() {
  if (fds_.empty() && !paths_.empty()) {
    std::vector<UniqueFd> opened;
    int v2 = -1;
    for (const auto& p : paths_) {
      // v1 has `tasks`; v2 has none (cgroup.threads only in threaded groups).
      stdfs::path file = p / "tasks";
      UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CLOEXEC));
      if (!fd && errno == ENOENT) {
        file = p / "cgroup.procs";
        fd.reset(::open(file.c_str(), O_WRONLY | O_CLOEXEC));
        struct statfs sf {};
        if (fd && ::fstatfs(fd.get(), &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC) v2 = static_cast<int>(opened.size());
      }
      if (!fd) throw SysError(errno, "open", file.string());
      opened.push_back(std::move(fd));
    }
    for (auto& fd : opened) fds_.push_back(fd.release());
    v2_index_ = v2;
  }
  return fds_;
}

std::vector<int> Cgroup::v1_procs_fds() {
  std::vector<int> out = procs_fds();
  if (v2_index_ >= 0) out.erase(out.begin() + v2_index_);
  return out;
}

int Cgroup::v2_dir_fd() {
  procs_fds();
  if (v2_dir_ < 0 && v2_index_ >= 0) {
    const stdfs::path& p = paths_[static_cast<std::size_t>(v2_index_)];
    v2_dir_ = ::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (v2_dir_ < 0) throw SysError(errno, "open", p.string());
  }
  return v2_dir_;
}

std::vector<pid_t> Cgroup::members() const {
  std::vector<pid_t> all;
  for (const auto& p : paths_) {
    std::vector<stdfs::path> dirs;
    collect_dirs(p, dirs);
    for (const auto& dir : dirs) {
      auto pids = read_pids(dir / "cgroup.procs");
      all.insert(all.end(), pids.begin(), pids.end());
    }
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

int Cgroup::open_kill_file_fd() const {
  for (const auto& p : paths_) {
    const int fd = ::open((p / "cgroup.kill").c_str(), O_WRONLY | O_CLOEXEC);
    if (fd >= 0) return fd;
  }
  return -1;
}

bool Cgroup::empty() const {
  for (const auto& p : paths_) {
    if (auto events = read_cgroup_file(p / "cgroup.events")) {  // v2: covers the subtree and every part
      if (auto populated = keyed_value(*events, "populated")) return *populated == 0;
    }
  }
  for (const auto& p : paths_) {
    std::vector<stdfs::path> dirs;
    collect_dirs(p, dirs);
    for (const auto& dir : dirs)
      if (!read_pids(dir / "cgroup.procs").empty()) return false;
  }
  return true;
}

void Cgroup::signal_all(int sig) {
  signal_members(members(), [this] { return members(); }, sig);
}

bool Cgroup::kill(int timeout_ms) {
  killed_ = true;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(0, timeout_ms));
  auto delay = std::chrono::milliseconds(1);
  const pid_t self = ::getpid();
  for (;;) {
    for (const auto& p : paths_) {
      const stdfs::path file = p / "cgroup.kill";
      if (!file_exists(file)) continue;
      // Never through cgroup.kill when this very process is in the group.
      auto pids = read_pids(p / "cgroup.procs");
      if (std::find(pids.begin(), pids.end(), self) != pids.end()) continue;
      try {
        write_cgroup_file(file, "1");
      } catch (const SysError& e) {
        if (e.code() != ENOENT && e.code() != ENODEV) throw;
      }
    }
    // Also (and, without cgroup.kill, only) member by member; repeated for ones forked meanwhile.
    signal_all(SIGKILL);
    if (empty()) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(delay, deadline - now));
    delay = std::min(delay * 2, std::chrono::milliseconds(20));
  }
}

namespace {

std::uint64_t oom_kills(const std::vector<stdfs::path>& paths) {
  for (const auto& p : paths) {
    auto text = read_cgroup_file(p / "memory.oom_control");  // v1
    if (!text) text = read_cgroup_file(p / "memory.events");  // v2
    if (!text) continue;
    if (auto n = keyed_value(*text, "oom_kill")) return *n;
  }
  return 0;
}

}  // namespace

bool Cgroup::oom_killed() const { return oom_kills(paths_) > oom_kills_before_; }

void Cgroup::reuse() { oom_kills_before_ = oom_kills(paths_); }

std::optional<std::uint64_t> Cgroup::memory_peak() const {
  for (const auto& p : paths_) {
    for (const char* file : {"memory.max_usage_in_bytes", "memory.peak"}) {
      if (auto text = read_cgroup_file(p / file))
        if (auto v = parse_u64(*text)) return v;
    }
  }
  return std::nullopt;
}

void Cgroup::remove() {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
  v2_index_ = -1;
  if (v2_dir_ >= 0) ::close(v2_dir_);
  v2_dir_ = -1;
  if (removed_) return;
  std::optional<SysError> first_error;
  for (size_t i = 0; i < paths_.size(); ++i) {
    std::vector<stdfs::path> dirs;
    collect_dirs(paths_[i], dirs);
    bool gone = true;
    for (const auto& dir : dirs) {
      if (::rmdir(dir.c_str()) < 0 && errno != ENOENT) {
        if (!first_error) first_error.emplace(errno, "remove cgroup", dir.string());
        gone = false;
      }
    }
    const std::string top = i < tops_.size() ? normal(tops_[i]) : std::string();
    if (!gone || top.empty() || !is_under(normal(paths_[i]), top)) continue;
    // The folders between the leaf and "ns-hpc", then "ns-hpc" itself, while they are empty.
    for (stdfs::path dir = stdfs::path(normal(paths_[i])).parent_path();
         is_under(dir.string(), top); dir = dir.parent_path()) {
      if (::rmdir(dir.c_str()) < 0 || dir.string() == top) break;
    }
  }
  if (first_error) throw *first_error;
  removed_ = true;
}

// ---- CgroupPool ---------------------------------------------------------------------------

CgroupPool::~CgroupPool() {
  for (auto& e : entries_) {
    // Empty ones go (the destructor removes them); ones with members stay for the sweep that
    // removes an instance's kept groups.
    try {
      if (!e.spare.group->empty()) e.spare.group->keep();
    } catch (const std::exception&) {
      e.spare.group->keep();
    }
  }
}

std::string CgroupPool::key(const std::string& folder, std::string_view kind, const CgroupLimits& limits) {
  auto text = [](const auto& v) { return v ? fmt::format("{}", *v) : std::string("-"); };
  return fmt::format("{}/{}|{}|{}|{}", folder, kind, text(limits.cpus), text(limits.memory_bytes), text(limits.pids));
}

std::optional<CgroupPool::Spare> CgroupPool::take(const std::string& key) {
  std::lock_guard lock(mutex_);
  for (bool awaited : {true, false}) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->key != key || it->spare.awaited != awaited) {
        ++it;
        continue;
      }
      Cgroup& g = *it->spare.group;
      if (g.paths().empty() || !file_exists(g.paths().front() / "cgroup.procs")) {
        // Removed behind our back (the instance stopped or went): nothing of it to keep.
        g.keep();
        it = entries_.erase(it);
        continue;
      }
      bool empty = awaited;
      try {
        if (!awaited) empty = g.empty();
      } catch (const std::exception&) {
      }
      if (!empty) {
        ++it;
        continue;
      }
      Spare spare = std::move(it->spare);
      entries_.erase(it);
      spare.awaited = false;
      spare.group->reuse();
      return spare;
    }
  }
  return std::nullopt;
}

void CgroupPool::give(const std::string& key, Spare spare) {
  if (spare.group->killed()) {
    spare.group->keep();  // the sweep of an instance's empty groups removes it
    return;
  }
  std::vector<Entry> evicted;
  {
    std::lock_guard lock(mutex_);
    entries_.push_back({key, std::move(spare)});
    while (entries_.size() > kMaxSpare) {
      evicted.push_back(std::move(entries_.front()));
      entries_.erase(entries_.begin());
    }
  }
  for (auto& e : evicted) {
    try {
      if (e.spare.group->empty())
        e.spare.group->remove();
      else
        e.spare.group->keep();  // the sweep of kept groups removes it once its processes end
    } catch (const std::exception& ex) {
      e.spare.group->keep();
      log::debug("cgroup pool: {}", ex.what());
    }
  }
}

// ---- probe --------------------------------------------------------------------------------

CgroupSupport probe_cgroups(const stdfs::path& mount_root) {
  CgroupSupport s;
  const pid_t pid = ::getpid(), tid = static_cast<pid_t>(::gettid());
  const std::string name = tid == pid ? fmt::format("probe-{}", pid) : fmt::format("probe-{}.{}", pid, tid);
  // Harmless limits: nothing ever runs in the probe group. The cpu quota is the minimum so a
  // parent with its own quota does not refuse it.
  CgroupLimits limits;
  limits.memory_bytes = std::uint64_t{1} << 40;
  limits.cpus = 0.01;
  limits.pids = 100000;
  std::vector<std::string> unenforced, not_enforced;
  std::unique_ptr<Cgroup> cg;
  try {
    cg = Cgroup::create(name, limits, unenforced, mount_root, &not_enforced);
  } catch (const std::exception& e) {
    s.detail = e.what();
    return s;
  }
  auto works = [&not_enforced](const std::string& c) {
    return std::find(not_enforced.begin(), not_enforced.end(), c) == not_enforced.end();
  };
  s.memory = works("memory");
  s.cpu = works("cpu");
  s.pids = works("pids");
  s.kill = !cg->paths().empty();

  // Which hierarchy provides what, from the files in the groups made.
  const Discovery d = discover(mount_root);
  std::vector<std::string> v1_parts, v2_parts;
  bool kill_file = false;
  for (const auto& p : cg->paths()) {
    const Hierarchy* h = nullptr;
    for (const auto& candidate : d.hierarchies)
      if (is_under(p.string(), candidate.mount.string())) h = &candidate;
    if (!h) continue;
    std::vector<std::string> provides;
    const std::pair<const char*, std::pair<const char*, const char*>> files[] = {
        {"memory", {"memory.limit_in_bytes", "memory.max"}},
        {"cpu", {"cpu.cfs_quota_us", "cpu.max"}},
        {"pids", {"pids.max", "pids.max"}}};
    for (const auto& [c, f] : files)
      if (works(c) && file_exists(p / (h->v2 ? f.second : f.first))) provides.emplace_back(c);
    if (!h->v2) {
      v1_parts.insert(v1_parts.end(), provides.begin(), provides.end());
    } else {
      if (file_exists(p / "cgroup.kill")) {
        provides.emplace_back("kill");
        kill_file = true;
      }
      v2_parts.push_back(fmt::format("v2 ({}) {}", h->mount.string(),
                                     provides.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(provides, ", "))));
    }
  }
  std::vector<std::string> parts, v1_sorted;
  for (const char* c : kControllers)
    if (std::find(v1_parts.begin(), v1_parts.end(), c) != v1_parts.end()) v1_sorted.emplace_back(c);
  if (!v1_sorted.empty()) parts.push_back(fmt::format("v1 {}", fmt::join(v1_sorted, ", ")));
  parts.insert(parts.end(), v2_parts.begin(), v2_parts.end());
  if (s.kill && !kill_file) parts.emplace_back("kill by signalling members");
  if (!unenforced.empty()) parts.push_back(fmt::format("not available: {}", fmt::join(unenforced, ", ")));
  s.detail = fmt::format("{}", fmt::join(parts, "; "));
  try {
    cg->remove();
  } catch (const std::exception& e) {
    s.detail += fmt::format("; probe group left behind: {}", e.what());
  }
  return s;
}

}  // namespace nshpc::sandbox
