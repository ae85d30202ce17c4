// Named limits of one execution (the [jobs.local.limit] / [terminal.limits] vocabulary) turned
// into what enforces them: a cgroup for cpus, memory and pids, RLIMIT_FSIZE for output. The time
// limit belongs to whoever watches the execution (the job keeper, the captured-run pump's timeout).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sandbox/cgroups.hpp"
#include "sandbox/sandbox.hpp"

namespace nshpc::sandbox {

struct AppliedLimits {
  std::unique_ptr<Cgroup> cgroup;        // null when no group could be made
  Limits rlimits;                        // for RunSpec::limits
  std::vector<std::string> unenforced;   // "memory: no writable memory controller", ...
};

// `limits`: cpus (cores), memory (MiB), pids, output (MiB); other names are ignored here.
// `cgroup_name` as for Cgroup::create. With `use_cgroups` false the cgroup limits are listed
// as unenforced. `before_create` gets every path the groups may use, before any exists (a job
// puts them on record so that whoever finishes it after a crash removes them).
AppliedLimits apply_limits(const std::map<std::string, std::int64_t>& limits, const std::string& cgroup_name,
                           bool use_cgroups,
                           const std::function<void(const std::vector<std::filesystem::path>&)>& before_create = {});

}  // namespace nshpc::sandbox
