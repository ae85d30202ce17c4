// Per-job control groups: resource limits (memory, cpu, pids) and whole-tree kill, managed
// directly in the cgroup file systems (no systemd). Works with cgroup v1 controllers (memory,
// cpu, pids), the v2 hierarchy (unified, or mounted at /sys/fs/cgroup), or a hybrid of both, as
// far as this process may write them (root, or a delegated subtree).
//
// How limits nest (decided here, once): in each hierarchy
//   <this process's group>/ns-hpc/                 the server's executions
//     <instance>/                                  [namespace] limits: the whole instance
//       sandbox/                                   a living sandbox's keeper, bwrap and main process
//       term-<id>/  cmd-<id>/  <job id>/           one execution each, with its own limits
// An instance's folder never holds a process itself (cgroup v2 allows none in a group that hands
// controllers down), so everything of the instance is in a leaf below it, and the kernel bounds
// each leaf by its own limit and by what the instance has left: a command or job gets the
// smaller of the two, and all of them together never more than the instance's.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace nshpc::sandbox {

struct CgroupLimits {
  std::optional<double> cpus;               // e.g. 1.5 cores: CFS quota/period (v1) or cpu.max (v2)
  std::optional<std::uint64_t> memory_bytes;  // hard limit; swap included where the kernel allows
  std::optional<std::uint64_t> pids;          // max processes/threads
};

// What a group and everything below it use now (each where the host reports it).
struct CgroupUsage {
  std::optional<std::uint64_t> memory_bytes;  // memory.current (v2), memory.usage_in_bytes (v1)
  std::optional<std::uint64_t> pids;          // pids.current
  std::optional<std::uint64_t> cpu_usec;      // CPU time used: cpu.stat usage_usec (v2), cpuacct.usage (v1)
  // The limits written on the group itself (nullopt: none, or not readable).
  std::optional<std::uint64_t> memory_max_bytes;
  std::optional<std::uint64_t> pids_max;
  std::optional<double> cpus_max;
};

// What this host lets this process enforce, found by really creating and removing a test group.
struct CgroupSupport {
  bool memory = false;
  bool cpu = false;
  bool pids = false;
  bool kill = false;  // whole-group kill (cgroup.kill on v2, else signalling every member)
  std::string detail;  // one line for doctor: which hierarchy provides what, or why nothing
};
CgroupSupport probe_cgroups(const std::filesystem::path& mount_root = "/sys/fs/cgroup");

// One job's groups: "<base>/ns-hpc/<name>" in each usable hierarchy, where <base> is this
// process's own cgroup (so jobs count against the server's budget).
class Cgroup {
 public:
  // Creates the groups and writes the limits. Limits this host cannot enforce are listed in
  // `unenforced` (e.g. "memory: no writable memory controller") instead of failing; throws
  // Error only when nothing at all can be created and a limit was asked for. With no limit
  // asked and nothing creatable it returns a Cgroup without paths() (members() empty, kill() a
  // no-op) and adds "kill: <why>" to `unenforced`. `name` may contain '/' (parts must not be
  // empty, "." or ".."; else UsageError, as for cpus <= 0). An empty left-over group of the same
  // name is reused; one with members makes it throw SysError(EBUSY). `unenforced_controllers`,
  // when given, gets the controllers ("memory", "cpu", "pids") of the limits not enforced.
  static std::unique_ptr<Cgroup> create(const std::string& name, const CgroupLimits& limits,
                                        std::vector<std::string>& unenforced,
                                        const std::filesystem::path& mount_root = "/sys/fs/cgroup",
                                        std::vector<std::string>* unenforced_controllers = nullptr);
  // Re-attaches to groups created earlier (after a server restart), from their saved paths.
  // Paths that no longer exist are skipped (SysError ENOENT when none is left); a path outside
  // a cgroup file system throws Error.
  static std::unique_ptr<Cgroup> attach(const std::vector<std::filesystem::path>& paths);
  // Every path create(name) could use (one per usable hierarchy): put on record before
  // create(), so that whoever finishes a job whose submitter died mid-create removes them.
  static std::vector<std::filesystem::path> candidate_paths(const std::string& name,
                                                            const std::filesystem::path& mount_root = "/sys/fs/cgroup");
  // Removes the empty groups "<folder>/<prefix>*" (groups kept for processes that outlived their
  // command, once those have ended); returns how many are left (populated ones stay).
  static std::size_t remove_empty(const std::string& folder, std::string_view prefix,
                                  const std::filesystem::path& mount_root = "/sys/fs/cgroup");

  // The folder "<base>/ns-hpc/<name>" (an instance's) carrying `limits` for every group below
  // it. Made when missing and some limit is given, else left alone; never replaced or emptied
  // (unlike create()). The controllers are handed down to its children, and a limit not given
  // is set back to unlimited, so a limit taken out of the configuration goes at the next call.
  // Limits this host cannot enforce are listed in `unenforced` as by create(); throws UsageError
  // for a bad name or cpus, never for a missing cgroup file system.
  static void limit_folder(const std::string& name, const CgroupLimits& limits,
                           std::vector<std::string>& unenforced,
                           const std::filesystem::path& mount_root = "/sys/fs/cgroup");
  // What the groups "<base>/ns-hpc/<name>" (and everything below) use now; nullopt when no
  // hierarchy has that group.
  static std::optional<CgroupUsage> usage(const std::string& name,
                                          const std::filesystem::path& mount_root = "/sys/fs/cgroup");
  // Removes the folder "<base>/ns-hpc/<name>" once no group is left below it (remove_empty() or
  // their owners remove those), then "ns-hpc" when empty. True when it is gone.
  static bool remove_folder(const std::string& name, const std::filesystem::path& mount_root = "/sys/fs/cgroup");

  ~Cgroup();  // removes the (empty) groups; never kills
  Cgroup(const Cgroup&) = delete;
  Cgroup& operator=(const Cgroup&) = delete;

  const std::vector<std::filesystem::path>& paths() const { return paths_; }
  // Open O_WRONLY|O_CLOEXEC descriptors, one per hierarchy, that a freshly forked (so
  // single-threaded) child writes "0" to, to join the group (RunSpec::join_cgroups): `tasks` in
  // v1 (moving one's own thread takes no global lock there; moving a whole process through
  // cgroup.procs waits for an RCU grace period, up to ~10 ms here) and cgroup.procs in v2.
  // Opened on the first call and owned by this object until remove() or destruction.
  std::vector<int> procs_fds();
  // The same without the v2 group, which a child joins as it is made instead, through
  // clone3(CLONE_INTO_CGROUP, v2_dir_fd()) (no lock, no grace period).
  std::vector<int> v1_procs_fds();
  // The v2 group's folder, opened O_RDONLY|O_DIRECTORY (owned, as procs_fds()); -1 when the
  // group has no v2 part.
  int v2_dir_fd();
  // A descriptor of the group's cgroup.kill (v2) for writing "1", or invalid when no hierarchy
  // of it has one.
  int open_kill_file_fd() const;
  // Host pids of every member.
  std::vector<pid_t> members() const;
  // No member left (with a v2 part: its "populated", which covers everything placed in the
  // group, as every process is placed in all its parts at once).
  bool empty() const;
  // Sends `sig` to every member (SIGTERM before the kill, for a graceful stop).
  void signal_all(int sig);
  // Kills every member, including ones forking meanwhile; returns when the group is empty or
  // after `timeout_ms`. cgroup.kill where available, else repeated SIGKILL to cgroup.procs.
  bool kill(int timeout_ms = 5000);
  // Whether kill() ran: such a group is not used again (CgroupPool). The kernel here kills every
  // process made into a v2 group through clone3(CLONE_INTO_CGROUP) once its cgroup.kill has been
  // written (the kill count it compares is the parent's group's, not the target's).
  bool killed() const { return killed_; }
  // True when the memory limit's OOM killer fired in this group (since reuse(), when used again).
  bool oom_killed() const;
  // Starts the group over for another execution (CgroupPool): what oom_killed() counts from.
  void reuse();
  // Peak memory in bytes when the kernel reports it.
  std::optional<std::uint64_t> memory_peak() const;
  // Removes the groups now (they must be empty); idempotent. A group with members throws
  // SysError (EBUSY, naming the folder). The parents up to "ns-hpc" go only when empty.
  void remove();
  // Leaves the groups in place when this object goes (a job that outlives this process keeps
  // its limits; whoever adopts it later attaches and removes them).
  void keep() { removed_ = true; }

 private:
  Cgroup() = default;
  std::vector<std::filesystem::path> paths_;
  // Per path: the "ns-hpc" folder above it; remove() also rmdirs the folders between the leaf
  // and this one (inclusive) when they are empty. Empty = remove only the leaf.
  std::vector<std::filesystem::path> tops_;
  std::vector<int> fds_;  // owned, one per path
  int v2_index_ = -1;     // which of fds_ is the v2 group's (set by procs_fds())
  int v2_dir_ = -1;       // owned
  bool removed_ = false;
  bool killed_ = false;
  std::uint64_t oom_kills_before_ = 0;  // reuse(): the count oom_killed() compares with
};

// Groups of finished commands kept for the next ones, so a command does not pay for making (a mkdir and the limits' writes per hierarchy) and removing its group. Keyed by
// what a group is for (the instance's folder, the kind of execution, the limits); a group comes
// back only once empty, and one that was removed meanwhile (the instance stopped, in any
// process) is dropped. At most kMaxSpare are kept; the rest are removed when given back.
// Thread-safe.
class CgroupPool {
 public:
  struct Spare {
    std::unique_ptr<Cgroup> group;
    std::vector<std::string> unenforced;  // as create() reported it
    // A joiner prepared for the next command waits in it (its one member): taken first, and
    // without the check that it is empty.
    bool awaited = false;
  };
  static constexpr std::size_t kMaxSpare = 32;

  CgroupPool() = default;
  ~CgroupPool();
  CgroupPool(const CgroupPool&) = delete;
  CgroupPool& operator=(const CgroupPool&) = delete;

  static std::string key(const std::string& folder, std::string_view kind, const CgroupLimits& limits);
  // An empty group given back under `key` (or one a prepared joiner waits in), ready for another
  // execution; nullopt when none.
  std::optional<Spare> take(const std::string& key);
  // Keeps `spare` for a later take(): possibly with members still (processes a command left
  // running; the process watching it, about to end), which it must have lost by then.
  void give(const std::string& key, Spare spare);

 private:
  struct Entry {
    std::string key;
    Spare spare;
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;  // oldest first
};

}  // namespace nshpc::sandbox
