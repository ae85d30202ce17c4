// The job keeper: the small process a sandbox that outlives its caller runs under (a local job
// survives a server restart). It is the ns-hpc binary itself, run as
//   ns-hpc __keeper --status-fd 3 --time-limit-ms N --grace-ms G -- <bwrap argv...>
// and executed exactly where bwrap would be (same descriptors, cgroups, rlimits and uid). It
//   - starts bwrap WITH --die-with-parent, so the sandbox ends with its main command (nothing a
//     job leaves in the background outlives it) or with the keeper;
//   - is a subreaper and reaps bwrap and the sandbox init it inherits: no zombie anywhere;
//   - enforces the wall-time limit without any server: at the limit it appends
//     {"ns-hpc-deadline": <epoch ms>} to the status file, sends SIGTERM to every process of the
//     sandbox, and after the grace SIGKILL;
//   - appends {"ns-hpc-ended": <epoch ms>} once nothing of the sandbox is left, and exits with
//     bwrap's status (re-raising the signal that killed bwrap);
//   - ends the sandbox when its record is gone: once a second it looks whether the status file
//     still has a name (fs::removed); when the instance's folder was removed under it (rm -rf of
//     the instance or of the whole instances folder), nothing can find or stop the sandbox any
//     more, so the keeper sends SIGTERM to every process of it, SIGKILL after at most 2 s, and
//     writes "sandbox.record_removed" to the store's audit log (through --audit-fd, a descriptor
//     the server opened: as root the keeper runs as the sandbox's uid, which may not open it).
// It has no parent-death signal (it must survive the server) and lives outside the sandbox's pid
// namespace, so nothing inside can see or signal it. Terminal signals do not reach it (own
// session); SIGTERM, SIGINT, SIGHUP and SIGQUIT are ignored: only SIGKILL ends it, and then
// --die-with-parent takes the sandbox with it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nshpc::sandbox {

// argv[1] that makes ns-hpc a keeper (dispatched in main() before anything else is set up).
inline constexpr std::string_view kKeeperCommand = "__keeper";

struct KeeperOptions {
  int status_fd = -1;                       // bwrap's --json-status-fd: a file, appended to
  std::chrono::milliseconds time_limit{0};  // wall-time limit; 0 = none
  std::chrono::milliseconds grace{0};       // from SIGTERM to SIGKILL at the limit
  std::vector<std::string> bwrap_argv;      // [0] is the program, executed as is
  // A living instance's keeper: a lock file that every user of the instance holds shared, and
  // touches; after `idle_stop` with neither, the keeper stops the sandbox (SIGTERM to every
  // process, `grace`, SIGKILL) and says so ({"ns-hpc-idle": ms}). A job's keeper holds it shared
  // while the job runs.
  int busy_fd = -1;
  std::chrono::milliseconds idle_stop{0};
  // A job in a living instance: instead of bwrap, the keeper joins the sandbox whose init is
  // `join_init` in pid namespace `join_pid_ns` (sandbox/join.hpp) and runs bwrap_argv there as
  // the command (its working directory `join_cwd`, the seccomp program on `seccomp_fd`). Its
  // status documents are bwrap's, for the command's own pid namespace.
  pid_t join_init = 0;
  std::uint64_t join_pid_ns = 0;
  std::string join_cwd;
  int seccomp_fd = -1;
  std::uint64_t keep_caps = 0;  // JoinSetup::keep_caps (an image instance's job)
  // The store's audit log (<instances_dir>/.audit.log), opened for appending by the server, and
  // the instance it is for: where the keeper says it ended a sandbox whose record was removed.
  int audit_fd = -1;
  std::string instance_id;
};

// The keeper's argv for `self` (argv[0], the ns-hpc binary) and `options`.
std::vector<std::string> keeper_argv(const std::string& self, const KeeperOptions& options);

// Reads what keeper_argv() wrote (argv[0] included). Throws UsageError.
KeeperOptions parse_keeper_argv(const std::vector<std::string>& argv);

// `ns-hpc __keeper ...`: runs bwrap as described above; returns (or raises) bwrap's status.
int keeper_main(int argc, char** argv);

}  // namespace nshpc::sandbox
