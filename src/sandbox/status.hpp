// Reading bwrap's --json-status-fd stream: concatenated JSON documents, first
// {"child-pid": N, ...namespace ids} when the sandbox exists, then {"exit-code": N} when the
// command ends. A missing exit-code document means bwrap failed during setup or exec.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nshpc::sandbox {

class StatusStream {
 public:
  // Feeds raw bytes; complete documents are parsed as they arrive.
  void feed(std::string_view bytes);
  std::optional<pid_t> child_pid() const { return child_pid_; }
  std::optional<int> exit_code() const { return exit_code_; }
  // Inode of the sandbox's pid namespace: with child_pid, identifies the sandbox init safely
  // against pid reuse (compare with /proc/<child_pid>/ns/pid).
  std::optional<std::uint64_t> pid_namespace() const { return pid_namespace_; }
  bool malformed() const { return malformed_; }

 private:
  void take_document(std::string_view doc);

  std::string pending_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
  std::optional<pid_t> child_pid_;
  std::optional<int> exit_code_;
  std::optional<std::uint64_t> pid_namespace_;
  bool malformed_ = false;
};

}  // namespace nshpc::sandbox
