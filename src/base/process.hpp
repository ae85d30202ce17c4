// Running a short host command (a scheduler client such as sbatch or squeue) and capturing what
// it says: stdin from a string, stdout and stderr apart, a time limit.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace nshpc {

struct CommandResult {
  int exit_code = -1;    // the program's exit code, or 128+N when signal N ended it
  bool timed_out = false;
  std::string out, err;
};

// Runs argv[0] (looked up in PATH when it has no slash) with `input` on stdin. Throws SysError
// when it cannot be started (ENOENT: not installed or not in PATH). Output beyond `max_output`
// bytes per stream is dropped. After `timeout` the program is killed (timed_out = true).
CommandResult run_command(const std::vector<std::string>& argv, const std::string& input = {},
                          std::chrono::milliseconds timeout = std::chrono::seconds(60),
                          std::size_t max_output = 64 * 1024 * 1024);

// "sbatch exited with 1: <first lines of stderr>" — for error messages.
std::string describe_failure(const std::vector<std::string>& argv, const CommandResult& result);

}  // namespace nshpc
