// The captured-run pump: one command's stdin fed from a string, its stdout and stderr read into
// strings (up to a cap) or written through to descriptors, in one poll loop with its end, a
// timeout, cancellation and progress. Used by the terminal tool, `ns-hpc bwrap --timeout` and
// doctor's smoke run. A timeout, a cancellation or the output cap kill the whole tree.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/fd.hpp"
#include "sandbox/execution.hpp"

namespace nshpc::sandbox {

// Where one output stream goes: appended to CaptureResult::out/err (counted against the cap),
// or written through to a descriptor (borrowed; counted too). A descriptor whose reader stops
// reading holds the pump, and with it the timeout, while a write to it blocks; one whose reader
// is gone (EPIPE) gets nothing more, and the command runs on.
struct Sink {
  int fd = -1;  // -1: keep in the result's string
  static Sink keep() { return {}; }
  static Sink write_to(int fd) { return {fd}; }
};

// What a progress call sees: the time so far and the output kept so far (sinks that keep; what
// went to a descriptor is not here).
struct CaptureProgress {
  std::chrono::milliseconds elapsed{0};
  std::string_view out, err;
};

struct CaptureOptions {
  std::string input;  // the command's stdin; empty: EOF at once
  // stdout + stderr bytes taken; at the cap the rest is dropped and the tree killed.
  std::size_t output_cap = std::numeric_limits<std::size_t>::max();
  std::optional<std::chrono::milliseconds> timeout;  // then the tree is killed
  // Polled every slice while the command runs; true: the tree is killed.
  std::function<bool()> cancelled;
  // Called every progress_interval while the command runs.
  std::function<void(const CaptureProgress&)> progress;
  std::chrono::milliseconds progress_interval{1000};
  std::chrono::milliseconds slice{50};  // cancellation is noticed within this
  // How long the pipes are still read after the command ended: its last writes, or (a living
  // instance, where background processes may hold the pipes) their first lines. Unset: 500 ms,
  // 100 ms in a living instance.
  std::optional<std::chrono::milliseconds> drain_grace;
  Sink out, err;
  // Called once the command runs (e.g. to let a delete of its instance kill it first); what it
  // returns is kept until the execution is gone.
  std::function<std::shared_ptr<void>(Execution&)> started;
};

enum class Ending { finished, timed_out, cancelled, output_limit };

struct CaptureResult {
  Ending ending = Ending::finished;
  ExitStatus status;  // oom_killed: the memory limit was hit
  std::string out, err;  // what was kept (sinks that keep)
  std::chrono::milliseconds duration{0};
};

// The descriptors the pump works with: the write end of the command's stdin (invalid when no
// input) and the read ends of its stdout and stderr (invalid: not captured).
struct CapturePipes {
  UniqueFd in, out, err;
};

// Runs `spec` with pipes made here for stdin (when there is input), stdout and stderr.
CaptureResult capture(Backend& backend, ExecSpec spec, const CaptureOptions& options);

// The loop itself, over an execution already started on `pipes` (only the command holds their
// other ends). options.started is not called here.
CaptureResult pump(Execution& execution, CapturePipes pipes, const CaptureOptions& options);

}  // namespace nshpc::sandbox
