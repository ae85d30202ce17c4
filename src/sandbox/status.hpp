// Reading bwrap's --json-status-fd stream: concatenated JSON documents, first
// {"child-pid": N, ...namespace ids} when the sandbox exists, then {"exit-code": N} when the
// command ends. A missing exit-code document means bwrap failed during setup or exec.
//
// A sandbox run under the job keeper (sandbox/keeper.hpp) has the keeper's documents in the same
// stream: {"ns-hpc-keeper": <keeper pid>, ...} before bwrap's, {"ns-hpc-deadline": <epoch ms>}
// when the wall-time limit was reached, and {"ns-hpc-ended": <epoch ms>} once nothing of the
// sandbox is left.
//
// A living instance's sandbox keeps its record in the instance's state folder: its handle
// (sandbox/handle.hpp) in sandbox.handle, naming its status file, sandbox.status.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sandbox/handle.hpp"

namespace nshpc::sandbox {

// The keys of the keeper's documents (written by keeper.cpp, read here).
inline constexpr std::string_view kKeeperKey = "ns-hpc-keeper";
inline constexpr std::string_view kDeadlineKey = "ns-hpc-deadline";
inline constexpr std::string_view kEndedKey = "ns-hpc-ended";
// A living instance's keeper: {"ns-hpc-idle": <epoch ms>} when it stopped the sandbox for want of
// activity; its first document also says when it started ("started-ms").
inline constexpr std::string_view kIdleKey = "ns-hpc-idle";
inline constexpr std::string_view kStartedKey = "started-ms";
// In a job keeper's child-pid document: the command joined a living sandbox; child-pid is the
// command's own init (never the living sandbox's).
inline constexpr std::string_view kJoinedKey = "ns-hpc-joined";

class StatusStream {
 public:
  using TimePoint = std::chrono::system_clock::time_point;

  // Feeds raw bytes; complete documents are parsed as they arrive.
  void feed(std::string_view bytes);
  std::optional<pid_t> child_pid() const { return child_pid_; }
  std::optional<int> exit_code() const { return exit_code_; }
  // Inode of the sandbox's pid namespace: with child_pid, identifies the sandbox init safely
  // against pid reuse (compare with /proc/<child_pid>/ns/pid).
  std::optional<std::uint64_t> pid_namespace() const { return pid_namespace_; }
  // A job keeper runs this sandbox (it enforces the wall-time limit and reports the end).
  bool keeper() const { return keeper_pid_.has_value(); }
  // The keeper's pid, as it wrote it (a claim: check it before trusting it).
  std::optional<pid_t> keeper_pid() const { return keeper_pid_; }
  // When the keeper's wall-time limit was reached (the sandbox was then stopped).
  std::optional<TimePoint> deadline_reached() const { return deadline_reached_; }
  // When the keeper saw the last process of the sandbox end.
  std::optional<TimePoint> ended() const { return ended_; }
  // When the keeper started (its first document).
  std::optional<TimePoint> started() const { return started_; }
  // When a living instance's keeper stopped it for want of activity.
  std::optional<TimePoint> idle_stopped() const { return idle_stopped_; }
  bool malformed() const { return malformed_; }
  bool joined() const { return joined_; }

 private:
  void take_document(std::string_view doc);

  std::string pending_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
  std::optional<pid_t> child_pid_;
  std::optional<int> exit_code_;
  std::optional<std::uint64_t> pid_namespace_;
  std::optional<pid_t> keeper_pid_;
  std::optional<TimePoint> deadline_reached_;
  std::optional<TimePoint> ended_;
  std::optional<TimePoint> started_;
  std::optional<TimePoint> idle_stopped_;
  bool malformed_ = false;
  bool joined_ = false;
};

// A living sandbox's record, in its instance's state folder (Target::state_dir).
inline constexpr const char* kLivingHandleFile = "sandbox.handle";  // its ExecutionHandle
inline constexpr const char* kLivingStatusFile = "sandbox.status";  // the keeper's and bwrap's documents

// The handle of the living sandbox on record in `state_dir`: sandbox.handle when it holds one. A
// folder an earlier release wrote has the status file alone: read as bwrap's handle of version 0,
// {"status_path": "<state_dir>/sandbox.status"}. nullopt: neither (it never ran here). Never
// throws (what cannot be read is not on record).
std::optional<ExecutionHandle> read_living_handle(const std::filesystem::path& state_dir);

// Puts `handle` on record in `state_dir` (atomically, 0600). Throws SysError.
void write_living_handle(const std::filesystem::path& state_dir, const ExecutionHandle& handle);

}  // namespace nshpc::sandbox
