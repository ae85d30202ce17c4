// Sandbox backends behind one interface. The default backend is bubblewrap, hardened:
// unprivileged host uid, all namespaces, no capabilities, seccomp, clean environment,
// read-only /proc/sys, the whole tree killed when the caller goes away.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "audit/audit.hpp"
#include "base/fd.hpp"
#include "base/users.hpp"
#include "config/config.hpp"
#include "sandbox/types.hpp"

namespace nshpc::sandbox {

namespace stdfs = std::filesystem;

class Cgroup;
struct CgroupLimits;
class CgroupPool;
class Execution;         // sandbox/execution.hpp
struct ExecutionHandle;  // sandbox/handle.hpp

// Per-process limits applied with setrlimit before bwrap starts (inherited by the whole tree),
// and the wall-time limit of the whole run. cgroup-backed limits (memory, cpus, pids) belong to
// the jobs engine.
struct Limits {
  std::optional<std::uint64_t> cpu_seconds;      // RLIMIT_CPU
  std::optional<std::uint64_t> file_size_bytes;  // RLIMIT_FSIZE
  std::optional<std::uint64_t> open_files;       // RLIMIT_NOFILE
  std::optional<std::uint64_t> address_space;    // RLIMIT_AS (bytes)
  // Enforced by the job keeper (sandbox/keeper.hpp), with or without the caller: at the limit
  // every process of the sandbox gets SIGTERM, wall_time_grace later SIGKILL.
  std::optional<std::chrono::milliseconds> wall_time;
  std::chrono::milliseconds wall_time_grace{0};
};

// Descriptors the command gets as stdin/stdout/stderr; borrowed, -1 means /dev/null.
struct Stdio {
  int in = -1;
  int out = -1;
  int err = -1;
};

struct RunSpec {
  Target target;
  std::vector<std::string> argv;                            // the command, word for word
  std::string cwd;                                          // sandbox path; empty = workspace
  std::vector<std::pair<std::string, std::string>> env;     // extra variables
  Stdio stdio;
  Limits limits;
  bool terminal = false;         // stdin is a terminal to become the sandbox's controlling tty
  // SIGKILL the sandbox when the calling process dies (--die-with-parent). Jobs that must outlive
  // a server restart turn it off: they then run under a job keeper (sandbox/keeper.hpp) that
  // survives the caller, and the sandbox dies with its main command or with the keeper.
  bool die_with_caller = true;
  // Borrowed descriptors of cgroup.procs files: the child joins these cgroups before anything
  // else, so everything in the sandbox is accounted and limited from its first instruction.
  std::vector<int> join_cgroups;
  // Borrowed descriptor of a file for bwrap's JSON status (child-pid, then exit-code; and the
  // keeper's documents, see status.hpp). When set, the status survives the caller:
  // Process::wait() reads the exit code back from this file. Needed for a graceful stop at the
  // wall-time limit (without it the limit kills at once).
  int status_file = -1;
  // Program and arguments put in front of bwrap (e.g. systemd-run --user --scope -p … --), as
  // [jobs.local] cgroups_command; empty for none.
  std::vector<std::string> command_prefix;
  // Read ends of the stdout/stderr pipes: in a living instance, once the caller is done with
  // the command, its background processes' further output there is read and discarded (they
  // neither block on a full pipe nor die of SIGPIPE).
  std::vector<int> output_readers;
  // The cgroup the command joins (join_cgroups are its cgroup.procs), when the caller made one:
  // in a living instance, as root, the command's tree is killed through it.
  Cgroup* cgroup = nullptr;
  // How the next command like this one gets its group (execute() sets both when it keeps its
  // groups in the backend's spare_groups()): the pool's key, and the limits to make one with. A
  // backend may make that group ahead, a joiner already waiting in it (BwrapBackend).
  std::string cgroup_key;
  std::shared_ptr<const CgroupLimits> cgroup_limits;

  // Set by the backend itself (a living instance's keeper, a job joining one).
  int busy_file = -1;                   // borrowed: the living instance's busy file
  std::chrono::seconds idle_stop{0};    // the keeper stops the sandbox after this without use
  bool living_main = false;             // the living sandbox's main process: pid 1 (--as-pid-1)
  pid_t join_init = 0;                  // the keeper joins the living sandbox of this init...
  std::uint64_t join_pid_ns = 0;        // ...in this pid namespace
  // The sandbox starts in the network namespace its starter joined (an instance whose commands
  // each get a fresh sandbox has one held for them: sandbox/network.hpp): bwrap unshares none.
  bool network_joined = false;
};

// A port of an instance's sandbox exposed on the host's loopback (network/forward.hpp).
struct ExposedPort {
  std::uint16_t port = 0;       // inside
  std::uint16_t host_port = 0;  // on the host's 127.0.0.1
  bool forwarding = false;      // its forwarder runs (else: it starts again with the sandbox)
};

struct ExitStatus {
  bool started = false;  // the command itself ran
  int exit_code = -1;    // the command's exit code; 128+N when signal N killed it
  std::string error;     // when !started: why the command did not run
  bool timed_out = false;  // Limits::wall_time was reached and the sandbox stopped
  bool oom_killed = false;  // the memory limit's OOM killer fired in its cgroup
  // When it ended, as its keeper (or bwrap's last write) recorded it; unset when unknown.
  std::optional<std::chrono::system_clock::time_point> ended_at;
};

// A running sandbox. Destroying a Process that is still running kills its whole tree.
class Process {
 public:
  virtual ~Process() = default;
  virtual pid_t pid() const = 0;            // host pid of the process started: bwrap or its keeper
  virtual pid_t sandbox_pid() const = 0;    // host pid of the sandbox's init (0 if unknown)
  virtual int pidfd() const = 0;            // pidfd of pid(): readable once the sandbox has ended
  virtual ExitStatus wait() = 0;            // blocks until the sandbox has ended; reaps it all
  virtual void kill() = 0;                  // SIGKILL to the whole tree; idempotent
  // Lets the sandbox run on when this handle is destroyed (a job outliving its server; with
  // die_with_caller off). The process is then reaped by whoever inherits it.
  virtual void disown() = 0;
  // The master of the command's terminal when the backend made it inside the sandbox (a command
  // joining a living sandbox with `terminal`: a terminal the caller made has no name in the
  // sandbox's /dev); the caller relays this one in place of the terminal it passed. -1: none.
  virtual int terminal() const { return -1; }
};

// The long-lived sandbox of a living instance, as found on record and in the kernel.
struct LivingStatus {
  using TimePoint = std::chrono::system_clock::time_point;
  bool running = false;
  std::optional<TimePoint> since;   // running since
  std::size_t processes = 0;        // processes in the sandbox, its init included
  std::uint64_t memory_bytes = 0;   // their resident memory
  // How it ended last time ("idle for 900 s", "stopped", "its init died: ..."); empty when it
  // is running or never ran.
  std::string last_end;
  std::optional<TimePoint> ended_at;
};

// The root folder of a running living sandbox, held for file operations done from outside (the
// computer's file tools): its files as its processes see them, through its own mounts.
struct LivingRoot {
  // O_PATH descriptor of the sandbox init's root (/proc/<init>/root), opened while the init was
  // alive (checked through its pidfd after the open, so a reused pid is never taken for it).
  // Kernel interfaces are reachable beneath it too (its /proc, /dev/pts): see file_systems.
  UniqueFd root;
  // The file systems the sandbox's own files are on (statfs f_type): its root's, the tmpfs it
  // mounts (/tmp, /dev/shm) and those of the host folders it binds (workspace, output). Anything
  // else beneath `root` is a kernel interface (proc, sysfs, devpts, mqueue) or a mount this list
  // does not know: never the sandbox's files.
  std::vector<std::int64_t> file_systems;
  UniqueFd gate;  // the instance's gate, held shared (gate.hpp): no snapshot or reset meanwhile
  UniqueFd busy;  // the instance's busy file, held shared and touched: no idle stop meanwhile
  bool started = false;  // the sandbox was not running and was started for this
};

// One process of a living instance's sandbox (instance ps).
struct LivingProcess {
  pid_t pid = 0;              // host pid
  pid_t ppid = 0;             // host pid of its parent
  std::string command;        // its command line (the sandbox wrote it: untrusted text)
  std::uint64_t rss_bytes = 0;
  std::chrono::seconds age{0};  // how long it has run
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Who a sandbox of `target` runs as on the host (and owns the files made for it); nullopt: as
  // the caller.
  virtual std::optional<users::Identity> runs_as(const Target& target) const { return host_identity(target, std::nullopt); }
  // Starts the command; returns once the sandbox exists (or throws Error saying why it can't).
  // For a persistent target the command joins the instance's living sandbox, which is started
  // first when it is not running.
  virtual std::unique_ptr<Process> start(const RunSpec& spec) = 0;
  // Finds an execution again from the handle it had (Execution::handle(); after a restart), or
  // reports how it ended while nobody watched. Never throws for what it cannot find (seen()
  // says). A handle of another backend, or of a version newer than this release writes, is never
  // read as this backend's: Seen::unreadable, its error naming whose it is. This default reads
  // none but an empty handle (nothing on record: never_started).
  virtual std::unique_ptr<Execution> attach(const ExecutionHandle& handle);

  // Living instances (target.persistent). Each is safe across processes: a start, stop or join
  // in one server or CLI process sees what another did.
  virtual LivingStatus living_status(const Target& target) = 0;
  // Starts the living sandbox unless it runs already; returns its status.
  virtual LivingStatus start_living(const Target& target) = 0;
  // Ends every process of the living sandbox (SIGTERM, then after `grace` SIGKILL to all);
  // files stay. `why` goes on record ("stopped", "restarted", ...). False when it was not running.
  virtual bool stop_living(const Target& target, std::string_view why, std::chrono::milliseconds grace) = 0;
  // The network of a running living sandbox is now target.network: served at once among off,
  // nat and filtered (sandbox/network.hpp), its processes kept. False when it does not run, or
  // when the change is to or from `host` (its namespace is the host's: only a restart changes
  // that). Throws NeedsAction (choose_network) when the new mode cannot work here.
  // An instance whose commands each get a fresh sandbox: its held network namespace, when one
  // is held, is served so (a change to `host` releases it); false when none is held.
  virtual bool change_network(const Target& target) = 0;
  // An instance that is deleted or stopped: the network namespace held for its commands ends.
  virtual void release_network(const Target& target) { (void)target; }
  // Ports of an instance's sandbox forwarded from the host's loopback (sandbox/network.hpp:
  // expose_port); the sandbox (or the namespace held for its commands) is started when it does
  // not run. UsageError for an instance on the host's network, or a backend without them.
  virtual ExposedPort expose_port(const Target& target, std::uint16_t port, std::uint16_t host_port);
  virtual bool unexpose_port(const Target& target, std::uint16_t port);
  virtual std::vector<ExposedPort> exposed_ports(const Target& target);
  virtual std::vector<LivingProcess> living_processes(const Target& target) = 0;
  // The root folder of the living sandbox of `target` (started when it does not run), with the
  // instance's gate and busy file held until the LivingRoot is destroyed. This default: UsageError
  // (a backend whose sandboxes cannot be reached from outside).
  virtual LivingRoot living_root(const Target& target);
  // Whether the commands of a living instance share one pid namespace (a later command can ps and
  // kill what an earlier one left running): as root with cgroup v2. Otherwise each has its own.
  virtual bool commands_share_pids() const = 0;
  // Sandboxes that no record names are ended, and so are the processes serving an instance's
  // network whose state folder is gone; returns one line for each. A living sandbox's keeper
  // writes a status file under `instances_dir` that is gone or names another keeper (the instance
  // was deleted, archived or started again behind its back); a job's keeper one that was removed.
  // Found by the record a keeper holds open and by the folder a helper names, never by uid. A
  // keeper and a helper end by themselves once their record is removed (fs::removed): this ends
  // those that did not (stopped, or of an older version).
  virtual std::vector<std::string> end_stray_sandboxes(const stdfs::path& instances_dir) = 0;
  // Reaps what this backend started and let run that has ended since (a living sandbox's keeper,
  // a network helper, an adopted pasta); never waits. A server calls it every few seconds, so
  // that nothing it started stays a zombie until the next use of its instance.
  virtual void reap_ended() {}
  // The program and arguments start() would execute, with placeholder descriptor numbers.
  virtual std::vector<std::string> describe(const RunSpec& spec) const = 0;
  // Where the groups of finished commands wait for the next ones of their instance; null: none.
  virtual CgroupPool* spare_groups() { return nullptr; }
  // The caller is a server, with more commands to come: the backend may prepare ahead what the
  // next ones need (BwrapBackend: a joiner waiting in a living instance). Not for one-shot callers.
  virtual void expect_more_commands() {}
};

std::unique_ptr<Backend> make_bwrap_backend(const config::Config& config);

}  // namespace nshpc::sandbox
