#include "sandbox/limits.hpp"

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"

namespace nshpc::sandbox {

namespace {

std::optional<std::int64_t> positive(const std::map<std::string, std::int64_t>& limits, const char* name) {
  auto it = limits.find(name);
  if (it == limits.end() || it->second <= 0) return std::nullopt;
  return it->second;
}

constexpr const char* kNoCgroups = "[jobs.local] use_cgroups is false";

}  // namespace

CgroupLimits cgroup_limits(const std::map<std::string, std::int64_t>& limits) {
  CgroupLimits cg;
  if (auto v = positive(limits, "cpus")) cg.cpus = static_cast<double>(*v);
  if (auto v = positive(limits, "memory")) cg.memory_bytes = static_cast<std::uint64_t>(*v) * 1024 * 1024;
  if (auto v = positive(limits, "pids")) cg.pids = static_cast<std::uint64_t>(*v);
  return cg;
}

Limits rlimits_of(const std::map<std::string, std::int64_t>& limits) {
  Limits out;
  if (auto v = positive(limits, "output")) out.file_size_bytes = static_cast<std::uint64_t>(*v) * 1024 * 1024;
  return out;
}

AppliedLimits apply_limits(const std::map<std::string, std::int64_t>& limits, const std::string& cgroup_name,
                           bool use_cgroups,
                           const std::function<void(const std::vector<std::filesystem::path>&)>& before_create) {
  AppliedLimits applied;
  const CgroupLimits cg = cgroup_limits(limits);
  applied.rlimits = rlimits_of(limits);
  if (use_cgroups) {
    try {
      if (before_create) before_create(Cgroup::candidate_paths(cgroup_name));
      applied.cgroup = Cgroup::create(cgroup_name, cg, applied.unenforced);
    } catch (const Error& e) {
      if (applied.unenforced.empty()) applied.unenforced.push_back(fmt::format("cpus, memory, pids: {}", e.what()));
    }
  } else if (cg.cpus || cg.memory_bytes || cg.pids) {
    applied.unenforced.push_back(fmt::format("cpus, memory, pids: {}", kNoCgroups));
  }
  return applied;
}

std::vector<std::string> apply_instance_limits(const std::map<std::string, std::int64_t>& limits,
                                               const std::string& folder, bool use_cgroups) {
  std::vector<std::string> unenforced;
  if (!use_cgroups) return unenforced;
  Cgroup::limit_folder(folder, cgroup_limits(limits), unenforced);
  return unenforced;
}

std::vector<std::string> instance_limits_unenforced(const std::map<std::string, std::int64_t>& limits,
                                                    bool use_cgroups) {
  const CgroupLimits cg = cgroup_limits(limits);
  std::vector<std::string> out;
  const std::pair<const char*, bool> asked[] = {
      {"cpus", cg.cpus.has_value()}, {"memory", cg.memory_bytes.has_value()}, {"pids", cg.pids.has_value()}};
  if (!cg.cpus && !cg.memory_bytes && !cg.pids) return out;
  if (!use_cgroups) {
    std::vector<std::string> names;
    for (const auto& [name, set] : asked)
      if (set) names.emplace_back(name);
    out.push_back(fmt::format("{}: {}", fmt::join(names, ", "), kNoCgroups));
    return out;
  }
  const CgroupSupport support = probe_cgroups();
  const bool works[] = {support.cpu, support.memory, support.pids};
  std::vector<std::string> not_here;
  for (std::size_t i = 0; i < std::size(asked); ++i)
    if (asked[i].second && !works[i]) not_here.emplace_back(asked[i].first);
  // One line for all of them: the probe's detail is the same reason for each.
  if (!not_here.empty()) out.push_back(fmt::format("{}: {}", fmt::join(not_here, ", "), support.detail));
  return out;
}

InstanceLimits instance_limits(const std::map<std::string, std::int64_t>& limits, const std::string& folder,
                               bool use_cgroups) {
  InstanceLimits out;
  for (const char* name : {"cpus", "memory", "pids"})
    if (auto v = positive(limits, name)) out.configured[name] = *v;
  out.unenforced = instance_limits_unenforced(limits, use_cgroups);
  if (use_cgroups) {
    try {
      out.usage = Cgroup::usage(folder);
    } catch (const Error& e) {
      log::debug("instance group {}: no cgroup usage: {}", folder, e.what());
    }
  }
  return out;
}

}  // namespace nshpc::sandbox
