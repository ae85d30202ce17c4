#include "sandbox/join.hpp"

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/magic.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <linux/sched.h>
#include <linux/nsfs.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <tuple>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/pidfd.hpp"
#include "base/proc.hpp"
#include "sandbox/members.hpp"
#include "sandbox/spawn.hpp"

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif

namespace nshpc::sandbox {

namespace {

// Descriptor numbers in the chain, above the command's own (stdio and the script on 62).
constexpr int kErrors = 63;   // close-on-exec: EOF once the command has been executed
constexpr int kStatus = 64;   // the command init writes the command's wait status here
constexpr int kRelease = 65;  // EOF: the caller is done (or gone)
constexpr int kSocket = 66;   // the terminal's master, then (nested) the command init's pidfd go here
constexpr int kNamespaces = 67;  // 8 namespace descriptors: outer user, user, mnt, pid, net, ipc, uts, cgroup
constexpr int kNamespaceCount = 8;
constexpr int kDiscard = kNamespaces + kNamespaceCount;  // read ends to discard after release
constexpr int kMaxDiscard = 4;
constexpr int kKillFile = kDiscard + kMaxDiscard;  // flat: the command's cgroup.kill
constexpr int kStage = 100;  // staging area while descriptors are moved into place

enum class Step : int { dumpable, cgroup, dup, close, rlimit, setgroups, setgid, setuid, setns_outer_user,
                        setns_mnt, setns_pid, setns_net, setns_ipc, setns_uts, setns_cgroup, setns_user,
                        fork, unshare_pid, capabilities, no_new_privs, seccomp, send, signals, setsid, ctty,
                        chdir, exec, terminal, proc };

const char* step_name(Step s) {
  switch (s) {
    case Step::dumpable: return "prctl(PR_SET_DUMPABLE)";
    case Step::cgroup: return "join the command's cgroup";
    case Step::dup: return "move descriptors";
    case Step::close: return "close_range";
    case Step::rlimit: return "setrlimit";
    case Step::setgroups: return "setgroups";
    case Step::setgid: return "setresgid";
    case Step::setuid: return "setresuid";
    case Step::setns_outer_user: return "join the sandbox's outer user namespace";
    case Step::setns_mnt: return "join the sandbox's mount namespace";
    case Step::setns_pid: return "join the sandbox's pid namespace";
    case Step::setns_net: return "join the sandbox's network namespace";
    case Step::setns_ipc: return "join the sandbox's ipc namespace";
    case Step::setns_uts: return "join the sandbox's uts namespace";
    case Step::setns_cgroup: return "join the sandbox's cgroup namespace";
    case Step::setns_user: return "join the sandbox's user namespace";
    case Step::fork: return "fork";
    case Step::unshare_pid: return "make the command's pid namespace";
    case Step::capabilities: return "drop capabilities";
    case Step::no_new_privs: return "prctl(PR_SET_NO_NEW_PRIVS)";
    case Step::seccomp: return "load the seccomp filter";
    case Step::send: return "hand over the command's pidfd";
    case Step::signals: return "set up signals";
    case Step::setsid: return "setsid";
    case Step::ctty: return "set the controlling terminal";
    case Step::chdir: return "change to the working directory";
    case Step::exec: return "execute";
    case Step::terminal: return "open a terminal in the sandbox (/dev/ptmx)";
    case Step::proc: return "mount the command's own /proc";
  }
  return "?";
}

struct Failure {
  int step;
  int err;
};

struct Prepared;
[[noreturn]] void fail(const Prepared& p, Step step);

// Writes the failed step and errno to the error pipe and ends this process.
[[noreturn]] void fail_to(int error_fd, Step step) {
  Failure f{static_cast<int>(step), errno};
  ssize_t ignored = ::write(error_fd, &f, sizeof f);
  (void)ignored;
  ::_exit(127);
}

// fork(2) without the library's at-fork handlers (the caller is a forked child already).
pid_t raw_fork(int* pidfd = nullptr) {
  unsigned long flags = SIGCHLD;
  if (pidfd) flags |= CLONE_PIDFD;
  return static_cast<pid_t>(::syscall(SYS_clone, flags, nullptr, pidfd, nullptr, nullptr));
}

// fork(2) into the cgroup v2 folder `cgroup_dir` (clone3 with CLONE_INTO_CGROUP): the child is
// a member from its first instruction, and nothing waits for the global lock (and the RCU grace
// period) that moving a process through cgroup.procs takes. Made by the server itself (the
// permission is the caller's), without the library's at-fork handlers: the child makes only
// async-signal-safe calls and never allocates.
pid_t raw_fork_into(int cgroup_dir) {
  clone_args args{};
  args.flags = CLONE_INTO_CGROUP;
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<std::uint64_t>(cgroup_dir);
  return static_cast<pid_t>(::syscall(SYS_clone3, &args, sizeof args));
}

// Everything the chain needs, prepared before the fork (no allocation after it).
struct Prepared {
  const JoinSetup* setup;
  std::vector<char*> argv;
  std::vector<char*> envp;
  std::string path;  // PATH of envp
  const char* path_c = nullptr;  // path, or (a prepared joiner) its request's
  const char* cwd = nullptr;     // the working directory; empty: none
  // The joiner already holds the command's restrictions (capabilities, no_new_privs, seccomp):
  // a prepared joiner, whose command inherits them.
  bool restricted = false;
  sock_fprog seccomp{};
  std::vector<std::pair<int, int>> moves;  // (source here, target) for every descriptor kept
  std::vector<int> staged;
  std::vector<int> keep;                   // sorted target numbers
  int discard_count = 0;
  int error_fd = -1;  // where failures go: the parent's number until the move, then kErrors
  bool join[kNamespaceCount] = {};  // false: the sandbox shares the caller's (e.g. the host's network)
  // This process's command line (the kernel's arg area), which the command init, a copy of this
  // process that the sandbox can see in ps, overwrites: the server's arguments are not its business.
  char* args = nullptr;
  std::size_t args_len = 0;
  std::vector<char> buffer;  // a prepared joiner's request (sized before the fork)
};

// The arg area of this process, from fields 48 and 49 of /proc/self/stat.
std::pair<char*, std::size_t> own_arg_area() {
  std::optional<proc::Stat> stat;
  try {
    stat = proc::read_own_stat();
  } catch (const SysError&) {
    return {nullptr, 0};  // then the command init leaves the arguments as they are
  }
  if (!stat || stat->arg_start == 0 || stat->arg_end <= stat->arg_start) return {nullptr, 0};
  return {reinterpret_cast<char*>(stat->arg_start), static_cast<std::size_t>(stat->arg_end - stat->arg_start)};
}

void fail(const Prepared& p, Step step) { fail_to(p.error_fd, step); }

// Moves every descriptor to its number (through a staging area, so no source is clobbered) and
// closes all others.
void place_descriptors(Prepared& p) {
  for (std::size_t i = 0; i < p.moves.size(); ++i) {
    p.staged[i] = ::fcntl(p.moves[i].first, F_DUPFD, kStage);
    if (p.staged[i] < 0) fail(p, Step::dup);
    if (p.moves[i].second == kErrors) p.error_fd = p.staged[i];  // out of the way of the targets
  }
  // The error pipe first, so failures below still reach the caller.
  for (std::size_t i = 0; i < p.moves.size(); ++i) {
    const int flags = p.moves[i].second == kErrors ? O_CLOEXEC : 0;
    if (::dup3(p.staged[i], p.moves[i].second, flags) < 0) fail(p, Step::dup);
  }
  p.error_fd = kErrors;
  int from = 3;
  for (int fd : p.keep) {
    if (fd < 3) continue;
    if (fd > from && ::syscall(SYS_close_range, from, fd - 1, 0) < 0) fail(p, Step::close);
    from = fd + 1;
  }
  if (::syscall(SYS_close_range, from, ~0U, 0) < 0) fail(p, Step::close);
}

// Every capability but those in `keep` (bits by number, in the sandbox's user namespace) goes
// from the bounding, ambient, permitted, effective and inheritable sets.
void drop_capabilities(const Prepared& p, std::uint64_t keep = 0) {
  for (int cap = 0; cap <= 63; ++cap) {
    if ((keep >> cap) & 1U) continue;
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) fail(p, Step::capabilities);
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) fail(p, Step::capabilities);
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  for (int i = 0; i < 2; ++i) {
    const auto word = static_cast<std::uint32_t>(keep >> (32 * i));
    data[i].permitted = data[i].effective = data[i].inheritable = word;
  }
  if (::syscall(SYS_capset, &header, data) < 0) fail(p, Step::capabilities);
}

// execvp without allocation: PATH searched in the sandbox's file system.
[[noreturn]] void exec_command(const Prepared& p) {
  const char* file = p.argv[0];
  if (std::strchr(file, '/')) {
    ::execve(file, p.argv.data(), p.envp.data());
    fail(p, Step::exec);
  }
  char buf[4096];
  const std::size_t flen = std::strlen(file);
  int saved = ENOENT;
  const char* dir = p.path_c;
  for (;;) {
    const char* end = std::strchr(dir, ':');
    const std::size_t dlen = end ? static_cast<std::size_t>(end - dir) : std::strlen(dir);
    if (dlen + 1 + flen + 1 <= sizeof buf) {
      std::size_t n = 0;
      if (dlen == 0) {
        buf[n++] = '.';
      } else {
        std::memcpy(buf, dir, dlen);
        n = dlen;
      }
      buf[n++] = '/';
      std::memcpy(buf + n, file, flen + 1);
      ::execve(buf, p.argv.data(), p.envp.data());
      if (errno == EACCES) saved = EACCES;
      else if (errno != ENOENT && errno != ENOTDIR) fail(p, Step::exec);
    }
    if (!end) break;
    dir = end + 1;
  }
  errno = saved;
  fail(p, Step::exec);
}

// The command: its own session, default signals, the working directory, execve.
[[noreturn]] void command_main(const Prepared& p) {
  // Only the command's own descriptors go with it (the error pipe closes on exec).
  if (::syscall(SYS_close_range, kStatus, ~0U, 0) < 0) fail(p, Step::close);
  if (::setsid() < 0) fail(p, Step::setsid);
  if (p.setup->controlling_tty && ::ioctl(0, TIOCSCTTY, 0) < 0) fail(p, Step::ctty);
  sigset_t none;
  ::sigemptyset(&none);
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) < 0) fail(p, Step::signals);
  if (p.cwd && *p.cwd && ::chdir(p.cwd) < 0) fail(p, Step::chdir);
  exec_command(p);
}

// The command's process, up to its execve: flat, it drops the privileges first (the joiner, its
// parent, has the sandbox user namespace's capabilities); nested, the command init already has.
int command_child(void* arg) {
  const Prepared& p = *static_cast<const Prepared*>(arg);
  if (p.setup->flat && !p.restricted) {
    drop_capabilities(p, p.setup->keep_caps);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) fail(p, Step::no_new_privs);
    if (p.seccomp.len > 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p.seccomp) < 0) fail(p, Step::seccomp);
  }
  command_main(p);
}

// Starts the command as a child of this process, with SIGCHLD routed to `sigfd`. The child
// shares this process's memory until its execve (CLONE_VM|CLONE_VFORK, on a stack of its own
// here, as posix_spawn does): copying the address space, which is the server's, is most of what
// a fork costs. Everything it changes before the execve is its own (descriptors, signal
// dispositions and mask, credentials, seccomp, working directory).
pid_t start_command(const Prepared& p, int& sigfd) {
  sigset_t chld;
  ::sigemptyset(&chld);
  ::sigaddset(&chld, SIGCHLD);
  if (::sigprocmask(SIG_BLOCK, &chld, nullptr) < 0) fail(p, Step::signals);
  sigfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) fail(p, Step::signals);

  alignas(64) char stack[64 * 1024];
  const pid_t command = ::clone(command_child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                                const_cast<Prepared*>(&p));
  if (command < 0) fail(p, Step::fork);
  // The command holds its stdio now; the watcher keeps none of it.
  for (int fd : p.keep)
    if (fd < kErrors) ::close(fd);
  ::close(kErrors);
  return command;
}

// Waits for the command and reports its wait status on kStatus; the caller going away before
// that (kRelease closed) is a cancel. Once released, reads and discards what background
// processes still write to the output pipes. Nested (pid 1 of the command's pid namespace): also
// reaps every process of the tree and ends with the last of them. Flat (the joiner, outside the
// sandbox's pid namespace): ends once the command has ended, the caller is done and nobody writes
// the pipes; what the command left running is the sandbox init's to reap.
[[noreturn]] void watch_command(const Prepared& p, pid_t command, int sigfd) {
  bool reported = false, released = false;
  bool discard_open[kMaxDiscard];
  for (int i = 0; i < kMaxDiscard; ++i) discard_open[i] = i < p.discard_count;
  for (;;) {
    pollfd fds[2 + kMaxDiscard];
    int n = 0;
    fds[n++] = {sigfd, POLLIN, 0};
    if (!released) fds[n++] = {kRelease, POLLIN, 0};
    int index[kMaxDiscard];
    for (int i = 0; i < p.discard_count; ++i) {
      index[i] = -1;
      if (released && discard_open[i]) {
        index[i] = n;
        fds[n++] = {kDiscard + i, POLLIN, 0};
      }
    }
    if (::poll(fds, static_cast<nfds_t>(n), -1) < 0 && errno != EINTR) ::_exit(1);

    signalfd_siginfo info;
    while (::read(sigfd, &info, sizeof info) > 0) {
    }
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(p.setup->flat ? command : -1, &status, WNOHANG);
      if (pid == command && !reported) {
        reported = true;
        ssize_t ignored = ::write(kStatus, &status, sizeof status);
        (void)ignored;
        ::close(kStatus);
      }
      if (pid > 0 && !p.setup->flat) continue;
      if (pid < 0 && errno == EINTR) continue;
      if (pid < 0 && !p.setup->flat) ::_exit(0);  // ECHILD: nothing of the tree is left
      break;
    }
    if (!released && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      char c;
      if (::read(kRelease, &c, 1) <= 0) {
        released = true;
        ::close(kRelease);
        // The caller went away before the command ended: that is a cancel.
        if (!reported) {
          if (p.setup->flat) {
            ssize_t ignored = ::write(kKillFile, "1", 1);
            (void)ignored;
          } else {
            ::kill(-1, SIGKILL);
          }
        }
      }
    }
    bool discarding = false;
    for (int i = 0; i < p.discard_count; ++i) {
      if (index[i] >= 0 && fds[index[i]].revents) {
        char buf[4096];
        const ssize_t got = ::read(kDiscard + i, buf, sizeof buf);
        if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
          ::close(kDiscard + i);
          discard_open[i] = false;
        }
      }
      discarding = discarding || discard_open[i];
    }
    if (p.setup->flat && reported && released && !discarding) ::_exit(0);
  }
}

// Nested: a /proc of the command's own pid namespace in place of the sandbox's (in the command's
// copy of the mount namespace), so that ps, pgrep and kill inside see the pids the command
// itself uses; without it, procps stops with "lookup self" and pkill would aim at the sandbox's
// numbering. Covered as bwrap covers a sandbox's: sys, sysrq-trigger, irq and bus read-only.
// The mount point is found from the sandbox's root without following any link, and must be a
// proc mount already (what the sandbox made there is never mounted over).
void mount_own_proc(const Prepared& p) {
  const int root = ::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) fail(p, Step::proc);
  open_how how{};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const int target = static_cast<int>(::syscall(SYS_openat2, root, "proc", &how, sizeof how));
  struct statfs fs;
  if (target < 0 || ::fstatfs(target, &fs) < 0) fail(p, Step::proc);
  if (fs.f_type != PROC_SUPER_MAGIC) {
    errno = EXDEV;
    fail(p, Step::proc);
  }
  const int context = static_cast<int>(::syscall(SYS_fsopen, "proc", FSOPEN_CLOEXEC));
  if (context < 0 || ::syscall(SYS_fsconfig, context, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0) fail(p, Step::proc);
  constexpr unsigned kLocked = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
  const int proc = static_cast<int>(::syscall(SYS_fsmount, context, FSMOUNT_CLOEXEC, kLocked));
  if (proc < 0) fail(p, Step::proc);
  if (::syscall(SYS_move_mount, proc, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
    fail(p, Step::proc);
  for (const char* cover : {"sys", "sysrq-trigger", "irq", "bus"}) {
    const int tree =
        static_cast<int>(::syscall(SYS_open_tree, proc, cover, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW));
    if (tree < 0) {
      if (errno == ENOENT) continue;  // not on this kernel
      fail(p, Step::proc);
    }
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_RDONLY | kLocked;
    if (::syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0 ||
        ::syscall(SYS_move_mount, tree, "", proc, cover, MOVE_MOUNT_F_EMPTY_PATH) < 0)
      fail(p, Step::proc);
    ::close(tree);
  }
  ::close(proc);
  ::close(context);
  ::close(target);
  ::close(root);
}

// pid 1 of the command's pid namespace (nested): loads the seccomp filter, starts the command,
// reports its status, reaps every process of the tree until none is left. Never returns.
[[noreturn]] void command_init(const Prepared& p) {
  ::close(kSocket);
  static constexpr char kTitle[] = "ns-hpc-command-init";
  if (p.args && p.args_len > sizeof kTitle) {
    std::memset(p.args, 0, p.args_len);
    std::memcpy(p.args, kTitle, sizeof kTitle);
  }
  ::prctl(PR_SET_NAME, "ns-hpc-init", 0, 0, 0);
  mount_own_proc(p);
  // Now the sandbox's own user namespace, and nothing of any capability kept.
  if (p.join[1] && ::setns(kNamespaces + 1, CLONE_NEWUSER) < 0) fail(p, Step::setns_user);
  ::close(kNamespaces + 1);
  drop_capabilities(p, p.setup->keep_caps);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) fail(p, Step::no_new_privs);
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) fail(p, Step::dumpable);
  if (p.seccomp.len > 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p.seccomp) < 0) fail(p, Step::seccomp);
  int sigfd = -1;
  const pid_t command = start_command(p, sigfd);
  watch_command(p, command, sigfd);
}

// One byte and room for one descriptor (SCM_RIGHTS), for sendmsg/recvmsg on the chain's socket.
struct FdMessage {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))]{};
  msghdr msg{};
  FdMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

// Sends a descriptor to the caller over kSocket; false when it cannot.
bool send_fd(int fd) {
  FdMessage m;
  msghdr& msg = m.msg;
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  return ::sendmsg(kSocket, &msg, MSG_NOSIGNAL) >= 0;
}

// The command's terminal, from the sandbox's own devpts: a terminal the caller made has no name
// in the sandbox's /dev (`tty` would say "not a tty", programs that look up their terminal by
// name fail). Opened with the sandbox's own access (after the uid drop and the joins), and
// checked to be a terminal master; what lies at /dev/ptmx is the sandbox's to replace, and
// anything else there is refused. The master goes to the caller; the slave becomes the
// command's stdin, stdout and stderr.
void open_terminal(const Prepared& p) {
  const int master = ::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  if (master < 0) fail(p, Step::terminal);
  unsigned number = 0;
  int unlock = 0;
  if (::ioctl(master, TIOCGPTN, &number) < 0 || ::ioctl(master, TIOCSPTLCK, &unlock) < 0) fail(p, Step::terminal);
  const int slave = ::ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY);
  if (slave < 0) fail(p, Step::terminal);
  // It starts as the terminal it replaces (stdin): its settings and window size.
  termios attrs{};
  if (::tcgetattr(0, &attrs) == 0) ::tcsetattr(slave, TCSANOW, &attrs);
  winsize size{};
  if (::ioctl(0, TIOCGWINSZ, &size) == 0) ::ioctl(master, TIOCSWINSZ, &size);
  for (int fd = 0; fd < 3; ++fd)
    if (::dup2(slave, fd) < 0) fail(p, Step::dup);
  ::close(slave);
  if (!send_fd(master)) fail(p, Step::send);
  ::close(master);
}

// Nested: in the sandbox's pid namespace (not yet in it as a process: its children are) makes a
// pid namespace and a mount namespace (a copy of the sandbox's) for the command, starts the
// command init and exits at once, so the command init's parent becomes the sandbox's init, which
// reaps it.
[[noreturn]] void spawner_main(const Prepared& p) {
  // Still in the sandbox's outer user namespace, which owns its mount namespace: the copy made
  // here has the same owner, so the command init may mount a /proc of its own in it.
  if (::unshare(CLONE_NEWPID | CLONE_NEWNS) < 0) fail(p, Step::unshare_pid);
  int pidfd = -1;
  const pid_t init = raw_fork(&pidfd);
  if (init < 0) fail(p, Step::fork);
  if (init == 0) command_init(p);

  if (!send_fd(pidfd)) {
    ::kill(init, SIGKILL);
    fail(p, Step::send);
  }
  ::_exit(0);
}

// The joiner's side, host-side until it has joined every namespace.
[[noreturn]] void joiner_main(Prepared& p) {
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) fail(p, Step::dumpable);
  for (int fd : p.setup->join_cgroups) {
    if (::write(fd, "0", 1) != 1) fail(p, Step::cgroup);
  }
  place_descriptors(p);
  for (const auto& [resource, value] : p.setup->rlimits) {
    struct rlimit rl{value, value};
    if (::setrlimit(resource, &rl) < 0) fail(p, Step::rlimit);
  }
  if (p.setup->drop_to) {
    const auto [uid, gid] = *p.setup->drop_to;
    // The system calls themselves: the library's wrappers change every thread of the process
    // it believes it has, and after a raw clone (raw_fork_into) it still believes the server's.
    if (::syscall(SYS_setgroups, 0, nullptr) < 0) fail(p, Step::setgroups);
    if (::syscall(SYS_setresgid, gid, gid, gid) < 0) fail(p, Step::setgid);
    if (::syscall(SYS_setresuid, uid, uid, uid) < 0) fail(p, Step::setuid);
    if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) fail(p, Step::dumpable);
  }
  // The outer user namespace gives the capabilities to join the others (it owns them); the
  // sandbox's own user namespace comes last.
  constexpr std::array<std::pair<int, Step>, 8> order{{{CLONE_NEWUSER, Step::setns_outer_user},
                                                        {CLONE_NEWUSER, Step::setns_user},
                                                        {CLONE_NEWNS, Step::setns_mnt},
                                                        {CLONE_NEWPID, Step::setns_pid},
                                                        {CLONE_NEWNET, Step::setns_net},
                                                        {CLONE_NEWIPC, Step::setns_ipc},
                                                        {CLONE_NEWUTS, Step::setns_uts},
                                                        {CLONE_NEWCGROUP, Step::setns_cgroup}}};
  if (::setns(kNamespaces + 0, CLONE_NEWUSER) < 0) fail(p, Step::setns_outer_user);
  for (int i = 2; i < kNamespaceCount; ++i) {
    if (p.join[i] && ::setns(kNamespaces + i, order[static_cast<std::size_t>(i)].first) < 0)
      fail(p, order[static_cast<std::size_t>(i)].second);
  }
  // Flat: the sandbox's own user namespace now. Nested: the command init joins it, once it has
  // mounted the command's /proc (which takes the outer one's capabilities).
  if (p.setup->flat && p.join[1] && ::setns(kNamespaces + 1, CLONE_NEWUSER) < 0) fail(p, Step::setns_user);
  if (p.setup->flat || !p.join[1]) {
    ::syscall(SYS_close_range, kNamespaces, kNamespaces + kNamespaceCount - 1, 0);
  } else {
    ::close(kNamespaces);
    ::syscall(SYS_close_range, kNamespaces + 2, kNamespaces + kNamespaceCount - 1, 0);
  }
  if (p.setup->own_terminal) open_terminal(p);

  if (p.setup->flat) {
    // Flat: this process is the command's watcher. It stays outside the sandbox's pid namespace
    // (nothing inside can see or signal it), and keeps no capability once the command runs.
    int sigfd = -1;
    const pid_t command = start_command(p, sigfd);
    drop_capabilities(p);
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) ::_exit(127);
    watch_command(p, command, sigfd);
  }
  const pid_t spawner = raw_fork();
  if (spawner < 0) fail(p, Step::fork);
  if (spawner == 0) spawner_main(p);
  int status = 0;
  while (::waitpid(spawner, &status, 0) < 0 && errno == EINTR) {
  }
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 127);
}

// ---- prepared joiners ------------------------------------------------------------------------

// A pidfd of the child `pid`, just forked; when none can be had, the child is ended and reaped.
UniqueFd pidfd_of_child(pid_t pid, const char* what) {
  int error = 0;
  UniqueFd pidfd = open_pidfd(pid, &error);
  if (!pidfd) {
    ::kill(pid, SIGKILL);  // not reaped yet: the pid is still this child's
    ::waitpid(pid, nullptr, 0);
    throw SysError(error, "pidfd_open", what);
  }
  return pidfd;
}

// The step of the chain that failed, as the caller's error.
[[noreturn]] void throw_failure(const Failure& failure, const JoinSetup& setup) {
  const Step step = static_cast<Step>(failure.step);
  std::string what = step_name(step);
  if (step == Step::exec) what += " " + setup.argv.front();
  if (step == Step::chdir) what += " " + setup.cwd;
  throw SysError(failure.err, what + " failed").wrapped("could not run the command in the instance's sandbox");
}

// Reaps the child behind `pidfd` if it is still ours to reap (whoever else holds it may have).
void reap_pidfd(int pidfd) {
  siginfo_t info{};
  while (::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &info, WEXITED) < 0 && errno == EINTR) {
  }
}

// A prepared joiner's request: one message on its socket, with the command's descriptors
// (SCM_RIGHTS, in the order of `targets`) and, after this header, argv, envp, the working folder
// and PATH as NUL-terminated strings.
constexpr std::uint32_t kRequestMagic = 0x6e736a31;  // "nsj1"
constexpr int kMaxRequestFds = 16;
constexpr std::size_t kMaxWords = 4096;         // argv and envp entries, each
constexpr std::size_t kMaxRequest = 256 * 1024;  // the whole message
constexpr int kMaxRlimits = 8;
struct Request {
  std::uint32_t magic = kRequestMagic;
  std::uint32_t argc = 0, envc = 0;
  std::uint32_t fd_count = 0;
  std::int32_t targets[kMaxRequestFds] = {};
  std::uint32_t discard_count = 0;
  std::uint32_t rlimit_count = 0;
  std::int32_t rlimit_resource[kMaxRlimits] = {};
  std::uint64_t rlimit_value[kMaxRlimits] = {};
  std::uint32_t strings = 0;  // bytes after the header
};

// How long an unused prepared joiner waits for its command before it ends by itself.
constexpr int kPreparedPatienceMs = 20000;

// Takes `count` NUL-terminated strings from [*at, end) into `out` (null-terminated); false when
// they are not all there.
bool take_words(const char*& at, const char* end, std::uint32_t count, std::vector<char*>& out) {
  if (count >= out.size()) return false;
  for (std::uint32_t i = 0; i < count; ++i) {
    const void* nul = std::memchr(at, '\0', static_cast<std::size_t>(end - at));
    if (!nul) return false;
    out[i] = const_cast<char*>(at);
    at = static_cast<const char*>(nul) + 1;
  }
  out[count] = nullptr;
  return true;
}

// A prepared joiner: the joiner's steps up to the command (its group, its identity, every
// namespace of the sandbox), then the command's own restrictions on itself; it then waits for
// one request on kSocket and runs that command as a flat joiner does. Ends at once (unused) when
// the socket closes, when the sandbox's init (its pidfd on kRelease until the request) ends, or
// after kPreparedPatienceMs.
[[noreturn]] void prepared_main(Prepared& p) {
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) ::_exit(127);
  for (int fd : p.setup->join_cgroups)
    if (::write(fd, "0", 1) != 1) ::_exit(127);
  place_descriptors(p);
  if (p.setup->drop_to) {
    const auto [uid, gid] = *p.setup->drop_to;
    if (::syscall(SYS_setgroups, 0, nullptr) < 0 || ::syscall(SYS_setresgid, gid, gid, gid) < 0 ||
        ::syscall(SYS_setresuid, uid, uid, uid) < 0 || ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
      ::_exit(127);
  }
  constexpr int kinds[kNamespaceCount] = {CLONE_NEWUSER, CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWPID,
                                          CLONE_NEWNET,  CLONE_NEWIPC,  CLONE_NEWUTS, CLONE_NEWCGROUP};
  if (::setns(kNamespaces + 0, CLONE_NEWUSER) < 0) ::_exit(127);
  for (int i = 2; i < kNamespaceCount; ++i)
    if (p.join[i] && ::setns(kNamespaces + i, kinds[i]) < 0) ::_exit(127);
  if (p.join[1] && ::setns(kNamespaces + 1, CLONE_NEWUSER) < 0) ::_exit(127);
  ::syscall(SYS_close_range, kNamespaces, kNamespaces + kNamespaceCount - 1, 0);
  drop_capabilities(p, p.setup->keep_caps);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) ::_exit(127);
  if (p.seccomp.len > 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p.seccomp) < 0) ::_exit(127);
  p.restricted = true;

  // The request.
  pollfd wait[2] = {{kSocket, POLLIN, 0}, {kRelease, POLLIN, 0}};
  int ready;
  do {
    ready = ::poll(wait, 2, kPreparedPatienceMs);
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0 || wait[1].revents != 0) ::_exit(0);
  Request request;
  iovec iov[2] = {{&request, sizeof request}, {p.buffer.data(), p.buffer.size() - 1}};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxRequestFds)];
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(kSocket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) ::_exit(0);  // the caller went away: unused
  int fds[kMaxRequestFds];
  int fd_count = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < count && fd_count < kMaxRequestFds; ++i)
      std::memcpy(&fds[fd_count++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
  }
  // Nothing of a malformed request runs (the caller sees this process end without a report).
  if (static_cast<std::size_t>(n) < sizeof request || request.magic != kRequestMagic ||
      (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || static_cast<int>(request.fd_count) != fd_count ||
      request.discard_count > static_cast<std::uint32_t>(kMaxDiscard) || request.rlimit_count > kMaxRlimits ||
      request.strings != static_cast<std::size_t>(n) - sizeof request)
    ::_exit(2);
  const char* at = p.buffer.data();
  const char* end = at + request.strings;
  p.buffer[request.strings] = '\0';
  if (!take_words(at, end, request.argc, p.argv) || request.argc == 0 || !take_words(at, end, request.envc, p.envp))
    ::_exit(2);
  p.cwd = at;
  at += std::strlen(at) + 1;
  if (at >= end) ::_exit(2);
  p.path_c = at;

  // Its descriptors at their numbers (the error pipe first among them), the rest closed; the
  // cgroup.kill file stays where it is.
  p.moves.resize(static_cast<std::size_t>(fd_count) + 1);
  p.staged.resize(p.moves.size());
  p.keep.resize(p.moves.size());
  for (int i = 0; i < fd_count; ++i) {
    const int target = request.targets[i];
    if (target < 0 || target >= kStage || target == kKillFile || target == kSocket) ::_exit(2);
    p.moves[static_cast<std::size_t>(i)] = {fds[i], target};
    p.keep[static_cast<std::size_t>(i)] = target;
  }
  p.moves.back() = {kKillFile, kKillFile};
  p.keep.back() = kKillFile;
  std::sort(p.keep.begin(), p.keep.end());
  p.error_fd = -1;
  place_descriptors(p);  // p.error_fd is kErrors from here
  p.discard_count = static_cast<int>(request.discard_count);
  for (std::uint32_t i = 0; i < request.rlimit_count; ++i) {
    const auto value = static_cast<rlim_t>(request.rlimit_value[i]);
    struct rlimit rl{value, value};
    if (::setrlimit(request.rlimit_resource[i], &rl) < 0) fail(p, Step::rlimit);
  }
  int sigfd = -1;
  // The watcher keeps what the command has (an image's capabilities, in the sandbox's user
  // namespace only): without CAP_SETPCAP nothing more can be dropped.
  const pid_t command = start_command(p, sigfd);
  watch_command(p, command, sigfd);
}

// The namespace `name` of `pid`; invalid when it is this process's own (nothing to join).
UniqueFd open_ns(pid_t pid, const char* name) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/ns/%s", static_cast<int>(pid), name);
  UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd) throw SysError(errno, "open", path);
  char own[64];
  std::snprintf(own, sizeof own, "/proc/self/ns/%s", name);
  struct stat theirs, ours;
  if (::fstat(fd.get(), &theirs) == 0 && ::stat(own, &ours) == 0 && theirs.st_ino == ours.st_ino) return {};
  return fd;
}

UniqueFd receive_fd(int socket) {
  FdMessage m;
  msghdr& msg = m.msg;
  ssize_t n;
  do {
    n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return {};
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  if (!cmsg || cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) return {};
  int fd;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof fd);
  return UniqueFd(fd);
}

// The host pid a pidfd refers to (its "Pid:" line in fdinfo); 0 when the process is gone.
pid_t pid_of_pidfd(int pidfd) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path, "re"), std::fclose);
  if (!f) return 0;
  char line[256];
  while (std::fgets(line, sizeof line, f.get())) {
    int pid = 0;
    if (std::sscanf(line, "Pid: %d", &pid) == 1) return pid > 0 ? static_cast<pid_t>(pid) : 0;
  }
  return 0;
}

}  // namespace

SandboxNamespaces open_sandbox_namespaces(pid_t init, std::uint64_t pid_ns) {
  UniqueFd pidfd = open_member(init, pid_ns);
  if (!pidfd) throw SysError(ESRCH, "find the sandbox's init", fmt::format("pid {}", init));
  SandboxNamespaces ns;
  try {
    ns.user = open_ns(init, "user");
    ns.mnt = open_ns(init, "mnt");
    ns.pid = open_ns(init, "pid");
    ns.net = open_ns(init, "net");
    ns.ipc = open_ns(init, "ipc");
    ns.uts = open_ns(init, "uts");
    ns.cgroup = open_ns(init, "cgroup");
  } catch (const SysError&) {
    // An init that has just ended (a zombie still) has no namespaces left to open.
    if (!wait_pidfd(pidfd.get(), std::chrono::milliseconds(0))) throw;
  }
  // Still the same process (its pidfd not readable): the namespaces are its own.
  if (wait_pidfd(pidfd.get(), std::chrono::milliseconds(0)))
    throw SysError(ESRCH, "find the sandbox's init", fmt::format("pid {} ended", init));
  struct stat st;
  if (::fstat(ns.pid.get(), &st) < 0 || st.st_ino != pid_ns)
    throw SysError(ESRCH, "find the sandbox's init", "its pid namespace changed");
  // The owner of the sandbox's namespaces: bwrap's user namespace; the init's own is a child of
  // it (--disable-userns) or the same.
  ns.outer_user.reset(::ioctl(ns.pid.get(), NS_GET_USERNS));
  if (!ns.outer_user) throw SysError(errno, "ioctl(NS_GET_USERNS)", "the sandbox's pid namespace");
  ::fcntl(ns.outer_user.get(), F_SETFD, FD_CLOEXEC);
  struct stat outer, inner;
  if (::fstat(ns.outer_user.get(), &outer) == 0 && ::fstat(ns.user.get(), &inner) == 0 && outer.st_ino == inner.st_ino)
    ns.user.reset();  // one user namespace: joined as the outer one
  return ns;
}

Joined join_sandbox(const JoinSetup& setup) {
  if (!setup.namespaces) throw Error("join_sandbox: no namespaces");
  if (setup.argv.empty()) throw UsageError("no command given to run in the sandbox");
  if (setup.discard_after_release.size() > static_cast<std::size_t>(kMaxDiscard))
    throw Error("join_sandbox: too many descriptors to discard");
  for (const auto& [from, to] : setup.fds)
    if (to < 0 || to >= kErrors) throw Error(fmt::format("join_sandbox: descriptor number {} is reserved", to));

  Prepared p;
  p.setup = &setup;
  p.argv = c_strings(setup.argv);
  p.envp = c_strings(setup.envp);
  static const std::pair<char*, std::size_t> arg_area = own_arg_area();  // fixed for the process's life
  std::tie(p.args, p.args_len) = arg_area;
  p.path = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& var : setup.envp)
    if (var.rfind("PATH=", 0) == 0) p.path = var.substr(5);
  p.path_c = p.path.c_str();
  p.cwd = setup.cwd.c_str();
  if (!setup.seccomp_bpf.empty()) {
    p.seccomp.len = static_cast<unsigned short>(setup.seccomp_bpf.size() / sizeof(sock_filter));
    p.seccomp.filter = reinterpret_cast<sock_filter*>(const_cast<char*>(setup.seccomp_bpf.data()));
  }

  Pipe errors = make_pipe();
  Pipe status = make_pipe();
  Pipe release = make_pipe();
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) throw SysError(errno, "socketpair");
  UniqueFd ours(pair[0]), theirs(pair[1]);

  p.moves = setup.fds;
  const SandboxNamespaces& ns = *setup.namespaces;
  const int ns_fds[kNamespaceCount] = {ns.outer_user.get(), ns.user.get(), ns.mnt.get(), ns.pid.get(),
                                       ns.net.get(),        ns.ipc.get(),  ns.uts.get(), ns.cgroup.get()};
  // (an invalid descriptor: a namespace the sandbox shares with this process, nothing to join)
  p.moves.emplace_back(errors.write.get(), kErrors);
  p.moves.emplace_back(status.write.get(), kStatus);
  p.moves.emplace_back(release.read.get(), kRelease);
  if (!setup.flat || setup.own_terminal) p.moves.emplace_back(theirs.get(), kSocket);
  for (int i = 0; i < kNamespaceCount; ++i) {
    if (ns_fds[i] < 0) continue;
    p.moves.emplace_back(ns_fds[i], kNamespaces + i);
    p.join[i] = true;
  }
  if (!p.join[0]) throw Error("join_sandbox: the sandbox has no user namespace of its own");
  for (std::size_t i = 0; i < setup.discard_after_release.size(); ++i)
    p.moves.emplace_back(setup.discard_after_release[i], kDiscard + static_cast<int>(i));
  p.discard_count = static_cast<int>(setup.discard_after_release.size());
  if (setup.flat) {
    if (setup.kill_file < 0) throw Error("join_sandbox: a flat join needs the command's cgroup.kill");
    p.moves.emplace_back(setup.kill_file, kKillFile);
  }
  p.staged.assign(p.moves.size(), -1);
  for (const auto& [from, to] : p.moves) p.keep.push_back(to);
  std::sort(p.keep.begin(), p.keep.end());

  const pid_t joiner = setup.cgroup_dir >= 0 ? raw_fork_into(setup.cgroup_dir) : ::fork();
  if (joiner < 0) throw SysError(errno, setup.cgroup_dir >= 0 ? "clone3 into the command's cgroup" : "fork");
  if (joiner == 0) {
    p.error_fd = errors.write.get();  // until place_descriptors() moves it to kErrors
    joiner_main(p);
  }
  errors.write.reset();
  status.write.reset();
  release.read.reset();
  theirs.reset();

  Joined joined;
  if (setup.flat) {
    // The joiner itself watches the command: our child, reaped by whoever holds the handle.
    joined.pidfd = pidfd_of_child(joiner, "the joining process");
    joined.our_child = true;
  }
  if (setup.own_terminal) joined.terminal = receive_fd(ours.get());
  if (!setup.flat) joined.pidfd = receive_fd(ours.get());
  Failure failure{};
  ssize_t n;
  do {
    n = ::read(errors.read.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  int raw = 0;
  if (!setup.flat || n == static_cast<ssize_t>(sizeof failure)) {
    if (setup.flat) signal_pidfd(joined.pidfd.get(), SIGKILL);  // it would wait for the release
    while (::waitpid(joiner, &raw, 0) < 0 && errno == EINTR) {
    }
  }
  if (n == static_cast<ssize_t>(sizeof failure)) {
    if (joined.pidfd) signal_pidfd(joined.pidfd.get(), SIGKILL);
    throw_failure(failure, setup);
  }
  if (!joined.pidfd)
    throw Error(fmt::format("could not run the command in the instance's sandbox: the joining process ended "
                            "with status {} without a report",
                            raw));
  joined.pid = setup.flat ? joiner : pid_of_pidfd(joined.pidfd.get());
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/ns/pid", static_cast<int>(joined.pid));
  struct stat st;
  // Flat: the command has no pid namespace of its own (its init's is the whole sandbox's).
  if (!setup.flat && joined.pid > 0 && ::stat(path, &st) == 0) joined.pid_ns = st.st_ino;
  joined.status = std::move(status.read);
  joined.release = std::move(release.write);
  return joined;
}

PreparedJoiner prepare_joiner(const JoinSetup& setup, int sandbox_pidfd) {
  if (!setup.namespaces || !setup.flat || setup.kill_file < 0)
    throw Error("prepare_joiner: a prepared joiner is flat, with the namespaces and cgroup.kill of its group");
  Prepared p;
  p.setup = &setup;
  p.argv.assign(kMaxWords + 1, nullptr);
  p.envp.assign(kMaxWords + 1, nullptr);
  p.buffer.assign(kMaxRequest, '\0');
  if (!setup.seccomp_bpf.empty()) {
    p.seccomp.len = static_cast<unsigned short>(setup.seccomp_bpf.size() / sizeof(sock_filter));
    p.seccomp.filter = reinterpret_cast<sock_filter*>(const_cast<char*>(setup.seccomp_bpf.data()));
  }
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) throw SysError(errno, "socketpair");
  UniqueFd ours(pair[0]), theirs(pair[1]);
  const SandboxNamespaces& ns = *setup.namespaces;
  const int ns_fds[kNamespaceCount] = {ns.outer_user.get(), ns.user.get(), ns.mnt.get(), ns.pid.get(),
                                       ns.net.get(),        ns.ipc.get(),  ns.uts.get(), ns.cgroup.get()};
  p.moves.emplace_back(theirs.get(), kSocket);
  p.moves.emplace_back(setup.kill_file, kKillFile);
  p.moves.emplace_back(sandbox_pidfd, kRelease);
  for (int i = 0; i < kNamespaceCount; ++i) {
    if (ns_fds[i] < 0) continue;
    p.moves.emplace_back(ns_fds[i], kNamespaces + i);
    p.join[i] = true;
  }
  if (!p.join[0]) throw Error("prepare_joiner: the sandbox has no user namespace of its own");
  for (const auto& [from, to] : p.moves) p.keep.push_back(to);
  std::sort(p.keep.begin(), p.keep.end());
  // Room for a request's descriptors, so that the joiner never allocates.
  p.moves.reserve(kMaxRequestFds + 1);
  p.staged.reserve(kMaxRequestFds + 1);
  p.keep.reserve(kMaxRequestFds + 1);
  p.staged.assign(p.moves.size(), -1);

  const pid_t pid = setup.cgroup_dir >= 0 ? raw_fork_into(setup.cgroup_dir) : ::fork();
  if (pid < 0) throw SysError(errno, setup.cgroup_dir >= 0 ? "clone3 into the command's cgroup" : "fork");
  if (pid == 0) prepared_main(p);
  PreparedJoiner joiner;
  joiner.pid = pid;
  joiner.pidfd = pidfd_of_child(pid, "the prepared joiner");
  joiner.control = std::move(ours);
  return joiner;
}

std::optional<Joined> join_prepared(PreparedJoiner& joiner, const JoinSetup& setup) {
  if (!joiner.pidfd || wait_pidfd(joiner.pidfd.get(), std::chrono::milliseconds(0))) return std::nullopt;
  // What a request cannot carry goes the usual way.
  if (setup.argv.empty() || setup.own_terminal || setup.controlling_tty || setup.argv.size() >= kMaxWords ||
      setup.envp.size() >= kMaxWords || setup.fds.size() + 3 + setup.discard_after_release.size() > kMaxRequestFds ||
      setup.rlimits.size() > static_cast<std::size_t>(kMaxRlimits))
    return std::nullopt;
  Request request;
  std::string strings;
  for (const auto& word : setup.argv) strings.append(word).push_back('\0');
  for (const auto& var : setup.envp) strings.append(var).push_back('\0');
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  for (const auto& var : setup.envp)
    if (var.rfind("PATH=", 0) == 0) path = var.substr(5);
  strings.append(setup.cwd).push_back('\0');
  strings.append(path).push_back('\0');
  if (strings.size() + 1 > kMaxRequest) return std::nullopt;
  request.argc = static_cast<std::uint32_t>(setup.argv.size());
  request.envc = static_cast<std::uint32_t>(setup.envp.size());
  request.strings = static_cast<std::uint32_t>(strings.size());
  request.discard_count = static_cast<std::uint32_t>(setup.discard_after_release.size());
  request.rlimit_count = static_cast<std::uint32_t>(setup.rlimits.size());
  for (std::size_t i = 0; i < setup.rlimits.size(); ++i) {
    request.rlimit_resource[i] = setup.rlimits[i].first;
    request.rlimit_value[i] = setup.rlimits[i].second;
  }

  Pipe errors = make_pipe();
  Pipe status = make_pipe();
  Pipe release = make_pipe();
  std::vector<int> fds;
  auto give = [&](int fd, int target) {
    request.targets[fds.size()] = target;
    fds.push_back(fd);
  };
  for (const auto& [from, to] : setup.fds) {
    if (to < 0 || to >= kErrors) throw Error(fmt::format("join_sandbox: descriptor number {} is reserved", to));
    give(from, to);
  }
  give(errors.write.get(), kErrors);
  give(status.write.get(), kStatus);
  give(release.read.get(), kRelease);
  for (std::size_t i = 0; i < setup.discard_after_release.size(); ++i)
    give(setup.discard_after_release[i], kDiscard + static_cast<int>(i));
  request.fd_count = static_cast<std::uint32_t>(fds.size());

  iovec iov[2] = {{&request, sizeof request}, {strings.data(), strings.size()}};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()), '\0');
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  ssize_t sent;
  do {
    sent = ::sendmsg(joiner.control.get(), &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(sizeof request + strings.size())) return std::nullopt;  // it is gone
  joiner.control.reset();
  errors.write.reset();
  status.write.reset();
  release.read.reset();

  Joined joined;
  joined.pid = joiner.pid;
  joined.pidfd = std::move(joiner.pidfd);
  joined.our_child = true;
  Failure failure{};
  ssize_t n;
  do {
    n = ::read(errors.read.get(), &failure, sizeof failure);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof failure)) {
    signal_pidfd(joined.pidfd.get(), SIGKILL);
    reap_pidfd(joined.pidfd.get());
    throw_failure(failure, setup);
  }
  // The joiner waits for the release once the command runs: ended now, it never started it.
  if (wait_pidfd(joined.pidfd.get(), std::chrono::milliseconds(0))) {
    reap_pidfd(joined.pidfd.get());
    throw Error("could not run the command in the instance's sandbox: its prepared joining process ended "
                "without a report");
  }
  joined.status = std::move(status.read);
  joined.release = std::move(release.write);
  return joined;
}

}  // namespace nshpc::sandbox
