#include "sandbox/keeper.hpp"

#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "audit/audit.hpp"
#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/pidfd.hpp"
#include "base/spawn.hpp"
#include "sandbox/join.hpp"
#include "sandbox/members.hpp"
#include "sandbox/status.hpp"

extern char** environ;

namespace nshpc::sandbox {

namespace {

using Steady = std::chrono::steady_clock;

// Signals that would end the keeper (and with it, through --die-with-parent, the sandbox):
// ignored by the keeper, default again in bwrap.
constexpr int kIgnored[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE};

// After SIGKILL to the sandbox init, how long bwrap gets to notice before it is killed too.
constexpr auto kEscalation = std::chrono::seconds(2);

// Where a shell command's script is (as for bwrap: FdNumbers::script).
constexpr int kScriptFd = 62;

// A sandbox whose record was removed: from SIGTERM to SIGKILL at most this (nothing can use it
// any more, so its processes get less than a deadline's grace).
constexpr auto kOrphanGrace = std::chrono::seconds(2);

// What descriptor `fd` of this process names (its path; " (deleted)" taken off).
std::string path_of_fd(int fd) {
  std::error_code ec;
  std::string path = std::filesystem::read_symlink(fmt::format("/proc/self/fd/{}", fd), ec).string();
  constexpr std::string_view deleted = " (deleted)";
  if (path.ends_with(deleted)) path.resize(path.size() - deleted.size());
  return path;
}

std::int64_t epoch_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::int64_t parse_count(const std::string& text, std::string_view option) {
  std::int64_t value = 0;
  std::size_t used = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < 0)
    throw UsageError(fmt::format("{} {:?}: expected a whole number >= 0", option, text));
  return value;
}

class Keeper {
 public:
  explicit Keeper(KeeperOptions options) : opt_(std::move(options)) {}

  // The keeper's whole life, in order.
  int run() {
    // Its own session: the caller's terminal signals (Ctrl-C, hang-up) do not reach the job.
    ::setsid();
    // The sandbox init comes to us when bwrap's monitor exits before it: we reap it.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    struct rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);  // re-raising bwrap's fatal signal leaves no core file
    sigset_t chld;
    ::sigemptyset(&chld);
    ::sigaddset(&chld, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &chld, nullptr);  // taken with sigtimedwait
    for (int sig : kIgnored) ::signal(sig, SIG_IGN);
    if (opt_.audit_fd >= 0) ::fcntl(opt_.audit_fd, F_SETFD, FD_CLOEXEC);  // the keeper's alone, never bwrap's

    // The status file (a pipe works too, but then the keeper cannot read the sandbox's pid
    // namespace back, and the wall-time limit kills without a graceful SIGTERM first).
    struct stat st;
    if (::fstat(opt_.status_fd, &st) < 0) {
      std::fprintf(stderr, "ns-hpc keeper: status descriptor %d: %s\n", opt_.status_fd, std::strerror(errno));
      return 1;
    }
    append(fmt::format("{{\"{}\": {}, \"{}\": {}, \"time-limit-ms\": {}, \"grace-ms\": {}}}\n", kKeeperKey,
                       ::getpid(), kStartedKey, epoch_ms(), opt_.time_limit.count(), opt_.grace.count()));
    if (opt_.busy_fd >= 0 && opt_.idle_stop.count() == 0) ::flock(opt_.busy_fd, LOCK_SH);  // a job: in use
    if (opt_.join_init > 0) return run_joined();
    if (!start_bwrap()) return 127;
    guard_audit_fd();
    drop_descriptors();
    supervise(chld);
    if (deadline_untold_) append(fmt::format("{{\"{}\": {}}}\n", kDeadlineKey, *deadline_untold_));
    append(fmt::format("{{\"{}\": {}}}\n", kEndedKey, epoch_ms()));
    return exit_like_bwrap();
  }

 private:
  // One write per document: appends at the offset bwrap shares, never inside its documents.
  void append(const std::string& doc) {
    const char* data = doc.data();
    size_t left = doc.size();
    while (left > 0) {
      ssize_t n = ::write(opt_.status_fd, data, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // nobody to tell; the server falls back to what it sees itself
      data += n;
      left -= static_cast<size_t>(n);
    }
  }

  // bwrap gets every descriptor the keeper was given (by number, as the server arranged them), the
  // keeper's environment, and default signal handling again.
  bool start_bwrap() {
    SpawnSpec spec;
    spec.program = opt_.bwrap_argv.front();
    spec.argv = opt_.bwrap_argv;
    spec.close_other_fds = false;
    try {
      bwrap_ = spawn(spec).release();  // reaped by reap(), with everything else that comes to us
    } catch (const SysError& e) {
      std::fprintf(stderr, "ns-hpc keeper: cannot start %s: %s\n", spec.program.c_str(), e.what());
      // As when bwrap itself could not start: the record ends, and so does the keeper, with 127.
      append(fmt::format("{{\"{}\": {}}}\n", kEndedKey, epoch_ms()));
      return false;
    }
    return true;
  }

  // bwrap has every descriptor it needs; the keeper keeps only the status file (and /dev/null
  // as stdio, so it holds none of the job's output or pipes open).
  void drop_descriptors() { drop_descriptors_except({}); }

  // The store's audit log was opened by the server: when this uid could not open it (as root the
  // keeper runs as the sandbox's uid), no other process of this uid may take the descriptor from
  // it (ptrace, /proc/PID/fd). After the sandbox has started: its children were made dumpable.
  void guard_audit_fd() const {
    struct stat st;
    if (opt_.audit_fd >= 0 && ::fstat(opt_.audit_fd, &st) == 0 && st.st_uid != ::geteuid())
      ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  }

  // The status file has no name any more: the instance's folder was removed under the sandbox.
  bool record_removed() const { return fs::removed(opt_.status_fd); }

  // Says in the store's audit log that the sandbox is being ended because its record is gone.
  void audit_record_removed(std::string_view sandbox, std::size_t signalled, std::chrono::milliseconds grace) const {
    if (opt_.audit_fd < 0) return;
    try {
      audit::append_to(opt_.audit_fd, path_of_fd(opt_.audit_fd), "sandbox.record_removed", "ns-hpc:keeper",
                       {{"instance_id", opt_.instance_id},
                        {"sandbox", sandbox},
                        {"record", path_of_fd(opt_.status_fd)},
                        {"keeper_pid", ::getpid()},
                        {"processes_signalled", signalled},
                        {"grace_ms", grace.count()},
                        {"why", "the instance's folder was removed while its sandbox ran: nothing could find or stop "
                                "it any more, so it was ended (SIGTERM, then SIGKILL)"}});
    } catch (const std::exception&) {
      // Best effort: the sandbox ends all the same.
    }
  }

  // Epoch time of the last sign of use: the busy file held (now) or touched.
  std::int64_t last_use() {
    if (::flock(opt_.busy_fd, LOCK_EX | LOCK_NB) < 0) return epoch_ms();  // held by a user
    ::flock(opt_.busy_fd, LOCK_UN);
    struct stat st;
    if (::fstat(opt_.busy_fd, &st) < 0) return epoch_ms();
    return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  }

  // A job in a living instance: the command joins the sandbox; this keeper reports as bwrap
  // would and enforces the time limit.
  int run_joined() {
    std::string bpf;
    if (opt_.seccomp_fd >= 0) {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(opt_.seccomp_fd, buf, sizeof buf)) > 0) bpf.append(buf, static_cast<size_t>(n));
      ::close(opt_.seccomp_fd);
    }
    Joined joined;
    try {
      SandboxNamespaces ns = open_sandbox_namespaces(opt_.join_init, opt_.join_pid_ns);
      JoinSetup setup;
      setup.namespaces = &ns;
      setup.argv = opt_.bwrap_argv;
      for (char** e = environ; *e; ++e) setup.envp.emplace_back(*e);
      setup.cwd = opt_.join_cwd;
      setup.fds = {{0, 0}, {1, 1}, {2, 2}};
      if (::fcntl(kScriptFd, F_GETFD) >= 0) setup.fds.emplace_back(kScriptFd, kScriptFd);
      setup.seccomp_bpf = bpf;
      setup.keep_caps = opt_.keep_caps;
      joined = join_sandbox(setup);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ns-hpc: %s\n", e.what());
      append(fmt::format("{{\"{}\": {}}}\n", kEndedKey, epoch_ms()));
      return 1;
    }
    append(fmt::format("{{\"child-pid\": {}, \"pid-namespace\": {}, \"{}\": true}}\n", joined.pid, joined.pid_ns,
                       kJoinedKey));
    guard_audit_fd();
    drop_descriptors_except({joined.pidfd.get(), joined.status.get(), joined.release.get()});
    std::optional<Steady::time_point> deadline, hard_kill;
    if (opt_.time_limit.count() > 0) deadline = Steady::now() + opt_.time_limit;
    bool orphaned = false;
    int code = 128 + SIGKILL;
    for (;;) {
      const auto now = Steady::now();
      // Looked at every kRemovedCheck (the poll below wakes up for it).
      int wait_ms = orphaned ? -1 : static_cast<int>(std::chrono::milliseconds(fs::kRemovedCheck).count());
      if (!orphaned && !hard_kill && record_removed()) {
        orphaned = true;
        deadline.reset();
        const auto grace = std::min<std::chrono::milliseconds>(opt_.grace, kOrphanGrace);
        audit_record_removed("job", signal_members(joined.pid_ns, SIGTERM), grace);
        hard_kill = now + grace;
      }
      if (deadline && now >= *deadline) {
        deadline.reset();
        append(fmt::format("{{\"{}\": {}}}\n", kDeadlineKey, epoch_ms()));
        signal_members(joined.pid_ns, SIGTERM);
        hard_kill = now + opt_.grace;
      }
      if (hard_kill && Steady::now() >= *hard_kill) {
        hard_kill.reset();
        signal_pidfd(joined.pidfd.get(), SIGKILL);
      }
      for (const auto& t : {deadline, hard_kill}) {
        if (!t) continue;
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(*t - Steady::now()).count();
        wait_ms = wait_ms < 0 ? static_cast<int>(std::max<long>(left, 0)) : std::min(wait_ms, static_cast<int>(std::max<long>(left, 0)));
      }
      pollfd p{joined.status.get(), POLLIN, 0};
      if (::poll(&p, 1, wait_ms) <= 0) continue;
      int raw = 0;
      if (::read(joined.status.get(), &raw, sizeof raw) == static_cast<ssize_t>(sizeof raw))
        code = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
      break;
    }
    append(fmt::format("{{\"exit-code\": {}}}\n", code));
    // Nothing a job leaves in the background outlives it: its tree ends with it.
    signal_pidfd(joined.pidfd.get(), SIGKILL);
    wait_pidfd(joined.pidfd.get(), std::chrono::seconds(10));
    append(fmt::format("{{\"{}\": {}}}\n", kEndedKey, epoch_ms()));
    return code;
  }

  // Keeps the status file, the busy file, the audit log and `also`; stdio becomes /dev/null.
  void drop_descriptors_except(const std::vector<int>& also) {
    std::vector<int> keep{opt_.status_fd};
    if (opt_.busy_fd >= 0) keep.push_back(opt_.busy_fd);
    if (opt_.audit_fd >= 0) keep.push_back(opt_.audit_fd);
    keep.insert(keep.end(), also.begin(), also.end());
    std::sort(keep.begin(), keep.end());
    int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      for (int fd = 0; fd <= 2; ++fd)
        if (!std::binary_search(keep.begin(), keep.end(), fd) && fd != null) ::dup2(null, fd);
      if (null > 2 && !std::binary_search(keep.begin(), keep.end(), null)) ::close(null);
    }
    unsigned from = 3;
    for (int fd : keep) {
      if (fd < 3) continue;
      if (static_cast<unsigned>(fd) > from) ::syscall(SYS_close_range, from, static_cast<unsigned>(fd - 1), 0U);
      from = static_cast<unsigned>(fd) + 1;
    }
    ::syscall(SYS_close_range, from, ~0U, 0U);
  }

  // Until bwrap and everything that came to us have been reaped.
  void supervise(const sigset_t& chld) {
    std::optional<Steady::time_point> deadline, hard_kill, escalate, deadline_idle;
    if (opt_.time_limit.count() > 0) deadline = Steady::now() + opt_.time_limit;
    for (;;) {
      if (!reap()) return;  // no child left
      if (bwrap_status_ && !init_stopped_) {
        // The main command ended: with --die-with-parent the init is dying already; make sure.
        init_stopped_ = true;
        learn_sandbox();
        kill_init();
      }
      std::optional<Steady::time_point> next;
      if (!bwrap_status_) {
        const auto now = Steady::now();
        if (!orphaned_ && !hard_kill && !escalate && record_removed() && sandbox_runs()) {
          orphaned_ = true;
          deadline.reset();
          hard_kill = now + end_orphan();
        }
        if (deadline && now >= *deadline) {
          deadline.reset();
          reach_deadline();
          hard_kill = now + opt_.grace;
        }
        if (opt_.idle_stop.count() > 0 && !hard_kill && !escalate) {
          const std::int64_t idle_at = last_use() + opt_.idle_stop.count();
          const std::int64_t left = idle_at - epoch_ms();
          if (left <= 0) {
            stop_for_idleness();
            hard_kill = now + opt_.grace;
          } else {
            const auto at = now + std::chrono::milliseconds(left);
            deadline_idle = at;
          }
        }
        if (hard_kill && now >= *hard_kill) {
          hard_kill.reset();
          if (!kill_init()) ::kill(bwrap_, SIGKILL);  // not set up yet: bwrap itself
          escalate = now + kEscalation;
        }
        if (escalate && now >= *escalate) {
          escalate.reset();
          ::kill(bwrap_, SIGKILL);  // our child, not reaped yet: the pid is still bwrap's
        }
        std::optional<Steady::time_point> look_again;  // at the record
        if (!orphaned_) look_again = now + fs::kRemovedCheck;
        for (const auto& t : {deadline, hard_kill, escalate, deadline_idle, look_again})
          if (t && (!next || *t < *next)) next = t;
        deadline_idle.reset();
      }
      timespec wait{};
      if (next) {
        const auto left = std::max(Steady::duration::zero(), *next - Steady::now());
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
        wait.tv_sec = static_cast<time_t>(ns / 1000000000);
        wait.tv_nsec = static_cast<long>(ns % 1000000000);
      }
      ::sigtimedwait(&chld, nullptr, next ? &wait : nullptr);  // EAGAIN at the timeout, EINTR: fine
    }
  }

  // Reaps every child that has exited; false when none is left at all.
  bool reap() {
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid > 0) {
        if (pid == bwrap_) bwrap_status_ = status;
        continue;
      }
      if (pid == 0) return true;
      if (errno == EINTR) continue;
      return false;  // ECHILD
    }
  }

  // The sandbox init and its pid namespace, from bwrap's first status document.
  void learn_sandbox() {
    if (init_ || pid_ns_) return;
    const StatusStream status = read_status();
    if (!status.child_pid() || !status.pid_namespace()) return;
    pid_ns_ = status.pid_namespace();
    init_ = open_member(*status.child_pid(), *pid_ns_);
  }

  // Whether the sandbox still runs (not only its bwrap finishing): its init has not ended, or is
  // not known yet (bwrap is setting the sandbox up).
  bool sandbox_runs() {
    learn_sandbox();
    return !init_ || !wait_pidfd(init_.get(), std::chrono::milliseconds(0));
  }

  // The record is gone: SIGTERM to every process of the sandbox, said in the audit log; returns
  // the grace until SIGKILL (none when the sandbox is not set up yet: bwrap is killed at once).
  std::chrono::milliseconds end_orphan() {
    const auto grace = std::min<std::chrono::milliseconds>(opt_.grace, kOrphanGrace);
    const bool set_up = pid_ns_.has_value();
    const std::size_t signalled = set_up ? signal_members(*pid_ns_, SIGTERM) : 0;
    audit_record_removed(opt_.idle_stop.count() > 0 || opt_.busy_fd >= 0 ? "living" : "job", signalled,
                         set_up ? grace : std::chrono::milliseconds(0));
    return set_up ? grace : std::chrono::milliseconds(0);
  }

  bool kill_init() {
    if (!init_) return false;
    try {
      signal_pidfd(init_.get(), SIGKILL);  // its death takes the whole pid namespace
    } catch (const std::exception&) {
      return false;
    }
    return true;
  }

  void reach_deadline() {
    const std::int64_t at = epoch_ms();
    learn_sandbox();
    if (!pid_ns_) {
      // bwrap has not finished its first document (the sandbox is still being set up): say so
      // once bwrap is gone, since writing now could land inside that document.
      deadline_untold_ = at;
      return;
    }
    append(fmt::format("{{\"{}\": {}}}\n", kDeadlineKey, at));
    signal_members(*pid_ns_, SIGTERM);
  }

  // A living instance unused for idle_stop: SIGTERM to every process but the sandbox's main
  // process; the caller SIGKILLs it (and with it everything) after the grace.
  void stop_for_idleness() {
    append(fmt::format("{{\"{}\": {}}}\n", kIdleKey, epoch_ms()));
    learn_sandbox();
    if (!pid_ns_ || !init_) return;
    StatusStream status = read_status();
    const pid_t init = status.child_pid().value_or(0);
    for (const TreeMember& m : tree_members(*pid_ns_)) {
      if (living_main_process(m, init)) continue;
      UniqueFd fd = open_member(m.pid, m.pid_ns);
      if (fd) ::syscall(SYS_pidfd_send_signal, fd.get(), SIGTERM, nullptr, 0);
    }
  }

  StatusStream read_status() const {
    StatusStream status;
    char buf[4096];
    off_t offset = 0;
    ssize_t n;
    while ((n = ::pread(opt_.status_fd, buf, sizeof buf, offset)) > 0) {
      status.feed(std::string_view(buf, static_cast<size_t>(n)));
      offset += n;
    }
    return status;
  }

  int exit_like_bwrap() {
    if (!bwrap_status_) return 1;
    const int status = *bwrap_status_;
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      ::signal(sig, SIG_DFL);
      sigset_t only;
      ::sigemptyset(&only);
      ::sigaddset(&only, sig);
      ::sigprocmask(SIG_UNBLOCK, &only, nullptr);
      ::raise(sig);
      return 128 + sig;
    }
    return 1;
  }

  KeeperOptions opt_;
  pid_t bwrap_ = -1;
  std::optional<int> bwrap_status_;
  UniqueFd init_;                           // pidfd of the sandbox init, once known
  std::optional<std::uint64_t> pid_ns_;
  bool init_stopped_ = false;
  bool orphaned_ = false;  // its record was removed: being ended
  std::optional<std::int64_t> deadline_untold_;
};

}  // namespace

std::vector<std::string> keeper_argv(const std::string& self, const KeeperOptions& options) {
  std::vector<std::string> argv{self,
                                std::string(kKeeperCommand),
                                "--status-fd",
                                std::to_string(options.status_fd),
                                "--time-limit-ms",
                                std::to_string(options.time_limit.count()),
                                "--grace-ms",
                                std::to_string(options.grace.count())};
  if (options.busy_fd >= 0) argv.insert(argv.end(), {"--busy-fd", std::to_string(options.busy_fd)});
  if (options.idle_stop.count() > 0) argv.insert(argv.end(), {"--idle-stop-ms", std::to_string(options.idle_stop.count())});
  if (options.audit_fd >= 0) argv.insert(argv.end(), {"--audit-fd", std::to_string(options.audit_fd)});
  if (!options.instance_id.empty()) argv.insert(argv.end(), {"--instance", options.instance_id});
  if (options.join_init > 0) {
    argv.insert(argv.end(), {"--join-init", std::to_string(options.join_init), "--join-pid-ns",
                             std::to_string(options.join_pid_ns), "--join-cwd", options.join_cwd});
    if (options.seccomp_fd >= 0) argv.insert(argv.end(), {"--seccomp-fd", std::to_string(options.seccomp_fd)});
    if (options.keep_caps != 0) argv.insert(argv.end(), {"--keep-caps", std::to_string(options.keep_caps)});
  }
  argv.push_back("--");
  argv.insert(argv.end(), options.bwrap_argv.begin(), options.bwrap_argv.end());
  return argv;
}

KeeperOptions parse_keeper_argv(const std::vector<std::string>& argv) {
  if (argv.size() < 2 || argv[1] != kKeeperCommand)
    throw UsageError(fmt::format("not a keeper command line (argv[1] must be {})", kKeeperCommand));
  KeeperOptions options;
  std::size_t i = 2;
  for (; i < argv.size() && argv[i] != "--"; i += 2) {
    const std::string& option = argv[i];
    if (i + 1 >= argv.size()) throw UsageError(fmt::format("{} needs a value", option));
    if (option == "--join-cwd") {
      options.join_cwd = argv[i + 1];
      continue;
    }
    if (option == "--instance") {
      options.instance_id = argv[i + 1];
      continue;
    }
    const std::int64_t value = parse_count(argv[i + 1], option);
    if (option == "--status-fd")
      options.status_fd = static_cast<int>(value);
    else if (option == "--time-limit-ms")
      options.time_limit = std::chrono::milliseconds(value);
    else if (option == "--grace-ms")
      options.grace = std::chrono::milliseconds(value);
    else if (option == "--busy-fd")
      options.busy_fd = static_cast<int>(value);
    else if (option == "--idle-stop-ms")
      options.idle_stop = std::chrono::milliseconds(value);
    else if (option == "--join-init")
      options.join_init = static_cast<pid_t>(value);
    else if (option == "--join-pid-ns")
      options.join_pid_ns = static_cast<std::uint64_t>(value);
    else if (option == "--seccomp-fd")
      options.seccomp_fd = static_cast<int>(value);
    else if (option == "--keep-caps")
      options.keep_caps = static_cast<std::uint64_t>(value);
    else if (option == "--audit-fd")
      options.audit_fd = static_cast<int>(value);
    else
      throw UsageError(fmt::format("unknown option {}", option));
  }
  if (i >= argv.size() || i + 1 >= argv.size()) throw UsageError("no command after --");
  if (options.status_fd < 0) throw UsageError("--status-fd is required");
  options.bwrap_argv.assign(argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
  return options;
}

int keeper_main(int argc, char** argv) {
  KeeperOptions options;
  try {
    options = parse_keeper_argv(std::vector<std::string>(argv, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ns-hpc %s: %s\n", argc > 1 ? argv[1] : "keeper", e.what());
    return 1;
  }
  return Keeper(std::move(options)).run();
}

}  // namespace nshpc::sandbox
