// What both executors and the engine use: the limit tables, output files and their tails, the
// submitter's identity, and times. Internal to the jobs module.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "config/config.hpp"
#include "jobs/jobs.hpp"
#include "store/store.hpp"

namespace nshpc::jobs {

// The limits a mode takes: their table of defaults and bounds, its name in the configuration,
// and what one entry is called in messages ("limit", "resource").
struct LimitTable {
  const std::map<std::string, config::Limit>* table = nullptr;
  std::string_view name;  // "[jobs.local.limit]"
  std::string_view noun;  // "limit"
};

// The effective limits of a request; UsageError for an unknown name or a value out of bounds.
std::map<std::string, std::int64_t> resolve_limits(const LimitRequest& request, const LimitTable& limits);

// A job's output file, relative to its instance's workspace (every job writes there).
std::string output_relative(const std::string& job_id, std::string_view ext);

// Creating a job's output file `relative` failed with errno `code`: when that means a link or a
// file was put where the output folder should be, the error that says so (and what to do).
std::optional<UsageError> output_refusal(const config::Config& cfg, const std::string& relative, int code);

// Everything under the workspace is written by the sandbox: the file is created beneath the
// workspace descriptor without following links (a planted .ns_hpc_output symlink is refused).
UniqueFd create_output(const store::Store& store, const store::Instance& inst, const config::Config& cfg,
                       const std::string& relative);

// The last `opt.lines` lines (at most `opt.bytes`) of the file open at `fd`.
std::string tail_from(int fd, const TailOptions& opt);

// The tail of a job's output file: from the descriptor the server created (while it has it),
// else re-opened beneath the workspace as an untrusted file (never a link, a FIFO, a device, a
// hard link or someone else's file). A file that may not be read says why instead.
std::string output_tail(const store::Store& store, const store::Instance& inst, const config::Config& cfg,
                        const std::string& host_path, int kept_fd, const TailOptions& opt);

// A host path under the workspace as the sandbox sees it.
std::string sandbox_path(const store::Instance& inst, const config::Config& cfg, const std::string& host);

// Seconds from one ISO time to another (to now when `to` is empty); 0 when unreadable.
double seconds_between(const std::string& from, const std::string& to);

// This process's start time (field 22 of /proc/<pid>/stat), to recognise it again; 0 if gone.
std::uint64_t start_time_of(pid_t pid);

// The process that submitted `rec` still runs (same pid and start time).
bool submitter_alive(const Record& rec);

}  // namespace nshpc::jobs
