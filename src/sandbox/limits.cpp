#include "sandbox/limits.hpp"

#include <fmt/format.h>

#include "base/error.hpp"

namespace nshpc::sandbox {

namespace {

std::optional<std::int64_t> positive(const std::map<std::string, std::int64_t>& limits, const char* name) {
  auto it = limits.find(name);
  if (it == limits.end() || it->second <= 0) return std::nullopt;
  return it->second;
}

}  // namespace

AppliedLimits apply_limits(const std::map<std::string, std::int64_t>& limits, const std::string& cgroup_name,
                           bool use_cgroups,
                           const std::function<void(const std::vector<std::filesystem::path>&)>& before_create) {
  AppliedLimits applied;
  CgroupLimits cg;
  if (auto v = positive(limits, "cpus")) cg.cpus = static_cast<double>(*v);
  if (auto v = positive(limits, "memory")) cg.memory_bytes = static_cast<std::uint64_t>(*v) * 1024 * 1024;
  if (auto v = positive(limits, "pids")) cg.pids = static_cast<std::uint64_t>(*v);
  if (auto v = positive(limits, "output")) applied.rlimits.file_size_bytes = static_cast<std::uint64_t>(*v) * 1024 * 1024;
  if (use_cgroups) {
    try {
      if (before_create) before_create(Cgroup::candidate_paths(cgroup_name));
      applied.cgroup = Cgroup::create(cgroup_name, cg, applied.unenforced);
    } catch (const Error& e) {
      if (applied.unenforced.empty()) applied.unenforced.push_back(fmt::format("cpus, memory, pids: {}", e.what()));
    }
  } else if (cg.cpus || cg.memory_bytes || cg.pids) {
    applied.unenforced.push_back("cpus, memory, pids: [jobs.local] use_cgroups is false");
  }
  return applied;
}

}  // namespace nshpc::sandbox
