// Running a short host command (a scheduler client such as sbatch or squeue) and capturing what
// it says: stdin from a string, stdout and stderr apart, a time limit.
#pragma once

#include <signal.h>

#include <chrono>
#include <functional>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

namespace nshpc {

struct CommandResult {
  int exit_code = -1;    // the program's exit code, or 128+N when signal N ended it
  bool timed_out = false;
  std::string out, err;
};

// Runs argv[0] (looked up in PATH when it has no slash) with `input` on stdin. Throws SysError
// when it cannot be started (ENOENT: not installed or not in PATH). Output beyond `max_output`
// bytes per stream is dropped. After `timeout` the program is killed (timed_out = true), also
// when it has closed its output but not exited. When its output cannot be read any more (poll
// fails) it is killed and reaped, and SysError says so. A program that does not read its input
// cannot kill the caller with SIGPIPE.
// `on_line`, when given, gets every line of stdout and stderr (without its newline) as it
// arrives, for progress; the result still holds all of it.
// `setup`, when given, is applied to the child before exec (as SpawnSpec's fields of the same
// names): extra descriptors (numbered 3 and up), and an async-signal-safe hook, e.g. the setns
// calls that run the program in a sandbox's namespace (network/netns.hpp).
using LineSink = std::function<void(std::string_view line)>;
struct ChildSetup {
  std::vector<std::pair<int, int>> fds;
  std::function<int(const char** step)> in_child;
};
CommandResult run_command(const std::vector<std::string>& argv, const std::string& input = {},
                          std::chrono::milliseconds timeout = std::chrono::seconds(60),
                          std::size_t max_output = 64 * 1024 * 1024, const LineSink& on_line = {},
                          const ChildSetup& setup = {});

// SIGPIPE blocked on this thread while it writes to a pipe whose reader may be gone (a command
// that does not read its stdin must not kill the server, whatever anyone did with SIGPIPE); a
// SIGPIPE raised meanwhile is consumed before the mask is restored.
class SigpipeBlock {
 public:
  SigpipeBlock();
  ~SigpipeBlock();
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
};

// "sbatch exited with 1: <first lines of stderr>" — for error messages.
std::string describe_failure(const std::vector<std::string>& argv, const CommandResult& result);

}  // namespace nshpc
