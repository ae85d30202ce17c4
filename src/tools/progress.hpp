// Progress notifications of long calls (a command that runs, a wait for a job) that carry the
// newest lines of its output, so an agent sees what happens before the call ends. Bounded: at
// most kProgressLines lines of at most kProgressLineBytes bytes each; the caller sends at most one
// a second.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace nshpc::tools {

inline constexpr std::size_t kProgressLines = 3;
inline constexpr std::size_t kProgressLineBytes = 160;

// The last `max_lines` lines of `data` (a final newline ends the last line, it does not start an
// empty one; of a line rewritten with '\r', as progress bars do, what it shows now), each cut to
// kProgressLineBytes bytes, as valid UTF-8, joined by '\n'. Empty when `data` has no visible text.
std::string newest_lines(std::string_view data, std::size_t max_lines = kProgressLines);

// Follows one call's output from progress to progress: each message is `what` and the lines
// that came since the one before ("what" alone when nothing came).
class OutputFollower {
 public:
  // `out`, `err`: everything kept so far (growing buffers, as a command's captured output).
  std::string grown(std::string_view what, std::string_view out, std::string_view err);
  // `out`, `err`: the newest part only (a window that slides, as a job's tail): its last lines
  // when it changed since the previous call.
  std::string window(std::string_view what, std::string_view out, std::string_view err);

 private:
  std::size_t out_seen_ = 0, err_seen_ = 0;
  std::uint64_t out_hash_ = 0, err_hash_ = 0;
};

}  // namespace nshpc::tools
