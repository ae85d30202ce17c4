// The named steps of a launch (a sandbox started, a command joined to one), timed: with the log at
// debug each step writes one line, "<launch> <subject>: step <name> <ms> ms", and a launch that
// fails says in which step. `make bench` reads these lines for its per-step figures.
//
//   Steps step("fresh", instance_id);
//   step("command line");  ... the work of that step ...
//   step("spawn");         ... (naming a step ends the one before it)
//   step.done();           (or the end of the scope)
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace nshpc {

class Steps {
 public:
  Steps(std::string_view launch, std::string_view subject);
  ~Steps();
  Steps(const Steps&) = delete;
  Steps& operator=(const Steps&) = delete;

  // Ends the step under way (its line is written) and begins `name` (a string literal).
  void operator()(const char* name);
  // Ends the last step; the launch's total is written with it.
  void done();

 private:
  void end_step();

  bool timed_;  // the log is at debug: nothing is measured otherwise
  std::string launch_;
  std::string subject_;
  const char* step_ = nullptr;
  std::chrono::steady_clock::time_point began_, step_began_;
  int failures_at_start_;
};

}  // namespace nshpc
