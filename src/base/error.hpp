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
    std::string name;          // what was looked for, when the advice names it (an image)
  };
  NotFound(Kind kind, std::string message, Facts facts = {})
      : UsageError(std::move(message)), kind_(kind), facts_(std::move(facts)) {}
  Kind kind() const noexcept { return kind_; }
  const Facts& facts() const noexcept { return facts_; }

 private:
  Kind kind_;
  Facts facts_;
};

// A failure that only an action on the instance or on the host mends. As with NotFound, what()
// says only what was found; the face that knows its audience words the action (the CLI names its
// commands, the MCP tools name a tool or the server's operator), so no layer below the faces
// tells anyone to run a command they may not have. None of these has an errno of its own: each is
// a decision on what was found (a failed system call stays a SysError).
class NeedsAction : public Error {
 public:
  enum class Action {
    choose_network,   // the instance's network mode ('nat') cannot work on this host: 'filtered' or 'off' can
    reset_instance,   // an image instance's layer was changed outside ns-hpc: a factory reset or a snapshot mends it
    build_image,      // the image belongs to another user: it must be built by the user who runs ns-hpc
    check_id_ranges,  // the subordinate id ranges (/etc/subuid, /etc/subgid) did not map: the host's to fix
    check_host,       // a sandbox could not be set up on this host: the host's checks (doctor) say why
  };
  // instance_id: the instance it concerns, "" where the failing layer does not know it.
  NeedsAction(Action action, std::string message, std::string instance_id = {})
      : Error(std::move(message)), action_(action), instance_id_(std::move(instance_id)) {}
  Action action() const noexcept { return action_; }
  const std::string& instance_id() const noexcept { return instance_id_; }

 private:
  Action action_;
  std::string instance_id_;
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
