// Errors that say what was wrong and what to do about it.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace nshpc {

// A failure the user can act on. what() is one line: the problem, then (after "; ") the remedy.
class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

// Bad input from the caller (invalid id, unknown instance, ...). The CLI maps it to exit 1 too,
// but callers may want to tell it apart from system failures.
class UsageError : public Error {
 public:
  using Error::Error;
};

// Something the caller named does not exist (an instance, a job). The message says only that;
// the layer that knows its audience (a tool, the CLI) adds where to look for what does exist.
// Facts the finder knows, for that layer's advice: a close name that does exist (a likely typo),
// and for an instance an archive of that id (its name and when it was archived).
class NotFound : public UsageError {
 public:
  enum class Kind { instance, job, archive, image };
  struct Facts {
    std::string near_miss;     // "" when none is close
    std::string archive_name;  // "" when the id was never archived
    std::string archived_at;   // ISO 8601, when known
  };
  NotFound(Kind kind, std::string message, Facts facts = {})
      : UsageError(std::move(message)), kind_(kind), facts_(std::move(facts)) {}
  Kind kind() const noexcept { return kind_; }
  const Facts& facts() const noexcept { return facts_; }

 private:
  Kind kind_;
  Facts facts_;
};

// A failed system call; keeps errno so callers can branch on it, through every layer: a layer
// that adds what it was doing wraps the error (as crun's crun_error_wrap) instead of turning it
// into text. what(): "<context>: ... <operation> <subject>: <strerror>".
class SysError : public Error {
 public:
  SysError(int err, std::string_view operation, std::string_view subject = {});
  int code() const noexcept { return code_; }

  // The same failure (same code) with `context` said first: "<context>: <what()>".
  SysError wrapped(std::string_view context) const;

 private:
  struct Message {};
  SysError(Message, int err, std::string message) : Error(std::move(message)), code_(err) {}
  int code_;
};

// Throws SysError(errno, ...) when rc < 0; returns rc otherwise.
long check_sys(long rc, std::string_view operation, std::string_view subject = {});

}  // namespace nshpc
