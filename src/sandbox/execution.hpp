// The execution seam: an exec description in, an execution out. Everything a caller needs to run
// a command in an instance's sandbox and to follow it — its limits (cgroups, rlimits, the wall
// time), its output files, its status file, its identity in the kernel (pid namespace, pidfds),
// and finding it again after a restart — lives behind this header. Callers keep its handle()
// (sandbox/handle.hpp: which backend made it, and that backend's data), give it back to that
// backend's Backend::attach(), and never read status files, /proc or cgroup files themselves.
//
// The low-level layer below it (sandbox.hpp: Backend::start, RunSpec, Process) spawns one
// sandbox; execute() is the one way callers above `sandbox` start one.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "base/json.hpp"
#include "sandbox/handle.hpp"
#include "sandbox/sandbox.hpp"

namespace nshpc::sandbox {

// What to run, where, with what, and for how long it may live.
struct ExecSpec {
  Target target;
  std::vector<std::string> argv;                         // the command, word for word
  std::string cwd;                                       // sandbox path; empty = workspace
  std::vector<std::pair<std::string, std::string>> env;  // extra variables
  // Borrowed descriptors (pipes a pump made, a terminal, files); -1 = /dev/null, unless an
  // output file below takes its place.
  Stdio stdio;
  bool terminal = false;  // stdin is a terminal to become the sandbox's controlling tty
  // Read ends of stdout/stderr pipes: in a living instance the output background processes
  // write after the command is done is read and discarded.
  std::vector<int> output_readers;
  // Files created beneath the instance's workspace (paths relative to it; never through a link;
  // owned by whoever the sandbox runs as) that become stdout/stderr. Empty: none.
  std::string stdout_file, stderr_file;
  // Named limits, the [jobs.local.limit] / [terminal.limits] vocabulary: cpus (cores), memory
  // (MiB), pids (through a cgroup), output (MiB, RLIMIT_FSIZE), time (s, enforced by the job
  // keeper even while no server runs: SIGTERM to the tree, `time_grace` later SIGKILL).
  std::map<std::string, std::int64_t> limits;
  std::chrono::milliseconds time_grace{0};
  bool use_cgroups = true;   // [jobs.local] use_cgroups
  // "<instance>/<name>"; empty: no cgroup of its own. A command of a living instance that leaves
  // processes running keeps its group; with a name "<instance>/<kind>-<id>" the empty groups of
  // earlier commands of that kind are swept then.
  std::string cgroup_name;
  // Keeps running when the caller (the server) goes, under a job keeper; Backend::attach() finds
  // it again from its handle. Otherwise it dies with the caller.
  bool outlives_caller = false;
  // An outliving execution's status file (its handle names it); required then. Created afresh.
  std::string status_path;
  std::vector<std::string> command_prefix;  // e.g. [jobs.local] cgroups_command
  // Called with the handle before anything named in it exists (the cgroup paths it may use), and
  // again with exactly the groups in use: a caller that persists it finds and removes everything
  // after a crash at any point. Once the sandbox runs, Execution::handle() is the final one.
  std::function<void(const ExecutionHandle& handle)> on_handle;
};

// execute() could not create an output file (a link or a file where a folder should be, ...):
// nothing was started. code() is the errno of the failed step.
class OutputFileError : public Error {
 public:
  OutputFileError(std::string relative, const SysError& cause)
      : Error(cause.what()), relative_(std::move(relative)), code_(cause.code()) {}
  const std::string& relative() const { return relative_; }
  int code() const { return code_; }

 private:
  std::string relative_;
  int code_;
};

// What Backend::attach() found of an execution on record.
enum class Seen {
  running,        // the sandbox runs (its init, identified by pid and pid namespace)
  keeper,         // no sandbox (yet), but its job keeper runs: it starts it or reports its end
  exited,         // the command's exit code is on record
  vanished,       // it ran, but nothing of it is left and no exit code is on record
  never_started,  // nothing on record at all: still starting in another process, or never will
  // Its handle is not this backend's to read (another backend made it, or a newer release):
  // nothing of it is known here. wait()'s ExitStatus::error says whose it is.
  unreadable,
};

// A command running (or run) in a sandbox. Not thread-safe: one caller at a time.
class Execution {
 public:
  virtual ~Execution() = default;  // one that does not outlive its caller is killed
  // Readable once the execution has ended (poll(2)).
  virtual int wait_fd() const = 0;
  // Blocks until it has ended; reaps what is ours to reap, removes its cgroups (or keeps those
  // of a command that left processes running in a living instance). Once; later calls repeat.
  virtual ExitStatus wait() = 0;
  // Sends `sig` to every process of the command's tree (never to the keeper or bwrap's monitor:
  // SIGTERM there would end the sandbox at once instead of letting the command stop). Reaches
  // what it can name safely: the pid namespace on record (an outliving execution), else the
  // members of its cgroup; nothing otherwise (kill_tree() always reaches the tree).
  virtual void signal(int sig) = 0;
  // SIGKILL to the whole tree, setsid'd and signal-ignoring processes included. `everything`:
  // also the keeper and every process of its cgroups (the last resort). Idempotent.
  virtual void kill_tree(bool everything = false) = 0;
  // What a caller persists to find it again after a restart (Backend::attach).
  virtual ExecutionHandle handle() const { return {}; }
  // Whether it has ended, without blocking (also when only the record says so: an earlier
  // release's sandbox init outlives its command).
  virtual bool ended() const;
  // Lets it run on when this object goes (its cgroups stay); whoever attaches later finishes it.
  virtual void release() {}
  // Limits this host could not enforce ("memory: no writable memory controller").
  virtual std::vector<std::string> unenforced() const { return {}; }
  // The descriptor of output file 1 (stdout) or 2 (stderr) as created; -1 when none.
  virtual int output_fd(int stream) const {
    (void)stream;
    return -1;
  }
  // Whether a keeper enforces the time limit (else, an earlier release's sandbox, the caller
  // must).
  virtual bool enforces_time_limit() const { return true; }
  // What Backend::attach() found (running for a started execution).
  virtual Seen seen() const { return Seen::running; }
  // The master of the command's terminal when the backend made one inside the sandbox (a
  // command joining a living sandbox with `terminal`): the one to relay in place of the
  // terminal passed. -1: none.
  virtual int terminal() const { return -1; }
};

// Starts `spec` on `backend`; returns once the sandbox exists. Throws OutputFileError when an
// output file cannot be created, Error/SysError when the sandbox cannot start (nothing is left
// running then).
std::unique_ptr<Execution> execute(Backend& backend, ExecSpec spec);

// For backends, in their Backend::attach() (callers use that): an execution that execute()
// started under the job keeper, found again from the data execute() put in its handle — the
// keeper's status file, the cgroups, the pid started ({"status_path", "cgroups", "pid"}). Reports
// how it ended while nobody watched; never throws for what it cannot find (seen() says). Empty
// data: never_started.
std::unique_ptr<Execution> attach_by_status_file(const ExecutionHandle& handle);

// For backends: the execution of a handle that is not theirs to read (Seen::unreadable); `why`
// names whose it is, as wait() reports it. Its handle() is `handle`, kept as it was.
std::unique_ptr<Execution> unreadable_execution(const ExecutionHandle& handle, std::string why);

}  // namespace nshpc::sandbox
