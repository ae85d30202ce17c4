// Named limits of one execution (the [jobs.local.limit] / [terminal.limits] vocabulary) and of a
// whole instance ([namespace] limits) turned into what enforces them: a cgroup for cpus, memory
// and pids, RLIMIT_FSIZE for output. The time limit belongs to whoever watches the execution
// (the job keeper, the captured-run pump's timeout).
//
// Nesting (cgroups.hpp has the layout): the instance's folder group carries [namespace] limits,
// each execution's group below it carries the execution's own, so a command or job gets the
// smaller of its own limit and what the instance has left. Without cgroups (a normal user
// without a delegated subtree, or [jobs.local] use_cgroups = false) the instance's limits are
// not enforced: instance_limits() says so, and the server warns once at start.
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

// The rlimit part of `limits` (output, in MiB) alone: for an execution whose group was made
// earlier (CgroupPool).
Limits rlimits_of(const std::map<std::string, std::int64_t>& limits);

// cpus, memory (MiB) and pids of `limits` that are set (> 0), as a cgroup takes them.
CgroupLimits cgroup_limits(const std::map<std::string, std::int64_t>& limits);

// Writes [namespace] `limits` on an instance's group `folder` (Target::cgroup_folder; made when missing), before
// an execution of the instance starts below it; a limit no longer configured is taken off.
// Returns the limits this host cannot enforce. Nothing happens without `use_cgroups`.
std::vector<std::string> apply_instance_limits(const std::map<std::string, std::int64_t>& limits,
                                               const std::string& folder, bool use_cgroups);

// An instance's limits as configured, whether they are enforced, and what it uses now.
struct InstanceLimits {
  std::map<std::string, std::int64_t> configured;  // cpus, memory (MiB), pids; only those set
  std::vector<std::string> unenforced;             // "memory, pids: why", for configured limits only
  std::optional<CgroupUsage> usage;                // while the instance's group exists
};
// Read-only for the instance (nothing made under its name): whether the limits can be enforced
// is found with probe_cgroups() (a test group made and removed).
InstanceLimits instance_limits(const std::map<std::string, std::int64_t>& limits, const std::string& folder,
                               bool use_cgroups);

// Why [namespace] `limits` cannot be enforced by this process (empty: they can, or none is set);
// for the server's start-up warning.
std::vector<std::string> instance_limits_unenforced(const std::map<std::string, std::int64_t>& limits,
                                                    bool use_cgroups);

}  // namespace nshpc::sandbox
