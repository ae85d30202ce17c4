#include "base/steps.hpp"

#include <exception>

#include "base/log.hpp"

namespace nshpc {

namespace {

double ms_between(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

Steps::Steps(std::string_view launch, std::string_view subject)
    : timed_(log::enabled(log::Level::debug)), failures_at_start_(std::uncaught_exceptions()) {
  if (!timed_) return;
  launch_ = launch;
  subject_ = subject.empty() ? "-" : subject;
  began_ = step_began_ = std::chrono::steady_clock::now();
}

Steps::~Steps() {
  if (!timed_ || !step_) return;
  if (std::uncaught_exceptions() > failures_at_start_) {
    log::debug("{} {}: failed in step {} after {:.3f} ms", launch_, subject_, step_,
               ms_between(step_began_, std::chrono::steady_clock::now()));
    return;
  }
  done();
}

void Steps::operator()(const char* name) {
  if (!timed_) return;
  end_step();
  step_ = name;
}

void Steps::done() {
  if (!timed_ || !step_) return;
  end_step();
  step_ = nullptr;
  log::debug("{} {}: total {:.3f} ms", launch_, subject_, ms_between(began_, step_began_));
}

void Steps::end_step() {
  const auto now = std::chrono::steady_clock::now();
  if (step_) log::debug("{} {}: step {} {:.3f} ms", launch_, subject_, step_, ms_between(step_began_, now));
  step_began_ = now;
}

}  // namespace nshpc
