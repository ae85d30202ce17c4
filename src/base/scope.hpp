// Rollbacks by scope: what undoes a half-done step runs when the scope is left by an exception,
// and never on success (nothing to write in a catch (...) block, nothing forgotten on a new exit).
//
//   RollbackOnFailure undo([&] { kill(sandbox); });
//   ... steps that may throw ...
//   (leaving the scope normally keeps what was done)
#pragma once

#include <exception>
#include <utility>

namespace nshpc {

template <typename F>
class RollbackOnFailure {
 public:
  explicit RollbackOnFailure(F undo) : undo_(std::move(undo)), failures_at_start_(std::uncaught_exceptions()) {}
  ~RollbackOnFailure() {
    if (std::uncaught_exceptions() <= failures_at_start_) return;
    try {
      undo_();
    } catch (...) {  // a rollback never replaces the error that caused it
    }
  }
  RollbackOnFailure(const RollbackOnFailure&) = delete;
  RollbackOnFailure& operator=(const RollbackOnFailure&) = delete;

 private:
  F undo_;
  int failures_at_start_;
};

}  // namespace nshpc
