#include "network/netns.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/nsfs.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <linux/capability.h>
#include <sys/ioctl.h>
#include <net/if.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/pidfd.hpp"
#include "base/proc.hpp"
#include "base/text.hpp"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

namespace nshpc::network {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kJoinUser = "join the user namespace that owns the sandbox's network namespace";
constexpr const char* kJoinNet = "join the sandbox's network namespace";

// In a forked child, async-signal-safe: joins the owning user namespace (when given), then the
// network namespace. Returns 0 or an errno with *step set.
int join_netns(int userns_fd, int net_fd, const char** step) {
  if (userns_fd >= 0 && ::setns(userns_fd, CLONE_NEWUSER) < 0) {
    *step = kJoinUser;
    return errno;
  }
  if (::setns(net_fd, CLONE_NEWNET) < 0) {
    *step = kJoinNet;
    return errno;
  }
  return 0;
}

// The program run next keeps CAP_NET_ADMIN (ambient) across its execve: after joining a user
// namespace in which this process's uid is not root (a root server joining a sandbox whose user
// namespace maps only the sandbox's uid), execve would drop every capability. Async-signal-safe.
int keep_net_admin(const char** step) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &header, data) < 0) {
    *step = "capget";
    return errno;
  }
  if (!(data[0].permitted & (1U << CAP_NET_ADMIN))) return 0;  // nothing to keep: the call fails as it would
  data[0].inheritable |= 1U << CAP_NET_ADMIN;
  if (::syscall(SYS_capset, &header, data) < 0 ||
      ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_ADMIN, 0, 0) < 0) {
    *step = "keep CAP_NET_ADMIN (ambient capability)";
    return errno;
  }
  return 0;
}

void require(const Netns& ns) {
  if (ns.net_fd < 0) throw Error("no network namespace descriptor given");
}

// ---- listen_in -------------------------------------------------------------------------------

enum class ListenStep : int { ok, user, net, identity, socket, reuse, bind, listen };

struct ListenReport {
  int step;
  int err;
  int bound;  // the index of the candidate that was bound
};

struct ParsedAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
};

ParsedAddress parse_address(const std::string& address, std::uint16_t port) {
  ParsedAddress a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
  if (::inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    a.length = sizeof *v4;
    a.family = AF_INET;
  } else if (::inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    a.length = sizeof *v6;
    a.family = AF_INET6;
  } else {
    throw UsageError(fmt::format("'{}' is not an IPv4 or IPv6 address", address));
  }
  return a;
}

// Sends the report, with the socket when there is one; async-signal-safe.
void send_report(int channel, ListenReport report, int fd) {
  iovec iov{&report, sizeof report};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))]{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
  }
  ssize_t ignored = ::sendmsg(channel, &msg, MSG_NOSIGNAL);
  (void)ignored;
}

// What a listening socket is made for, all prepared before the fork.
struct ListenPlan {
  const Netns* ns = nullptr;                     // joined first; nullptr: this process's namespace
  const std::optional<users::Identity>* as = nullptr;  // become it (root only); else drop every capability
  std::vector<ParsedAddress> candidates;         // bound in turn until one is free
  int backlog = 128;
  std::string where;                             // "in the sandbox's network namespace", "on the host"
};

// In the forked child, async-signal-safe: the socket of `plan`, sent over `channel`.
[[noreturn]] void listen_child(const ListenPlan& plan, int channel) {
  auto fail = [channel](ListenStep step, int bound = 0) {
    send_report(channel, {static_cast<int>(step), errno, bound}, -1);
    ::_exit(1);
  };
  if (plan.ns) {
    if (plan.ns->userns_fd >= 0 && ::setns(plan.ns->userns_fd, CLONE_NEWUSER) < 0) fail(ListenStep::user);
    if (::setns(plan.ns->net_fd, CLONE_NEWNET) < 0) fail(ListenStep::net);
  }
  if (plan.as && *plan.as) {
    // Raw system calls: glibc's set*id would signal threads the child does not have.
    const users::Identity& id = **plan.as;
    if (::syscall(SYS_setgroups, 0, nullptr) < 0 || ::syscall(SYS_setresgid, id.gid, id.gid, id.gid) < 0 ||
        ::syscall(SYS_setresuid, id.uid, id.uid, id.uid) < 0)
      fail(ListenStep::identity);
  } else if (plan.as) {
    // This process's own uid, without any capability it may hold (CAP_NET_BIND_SERVICE).
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2] = {};
    if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 || ::syscall(SYS_capset, &header, data) < 0)
      fail(ListenStep::identity);
  }
  const int family = plan.candidates.front().family;
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail(ListenStep::socket);
  const int one = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) fail(ListenStep::reuse);
  std::size_t i = 0;
  for (;; ++i) {
    const ParsedAddress& a = plan.candidates[i];
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) == 0) break;
    if (errno != EADDRINUSE || i + 1 == plan.candidates.size()) fail(ListenStep::bind, static_cast<int>(i));
  }
  if (::listen(fd, plan.backlog) < 0) fail(ListenStep::listen, static_cast<int>(i));
  send_report(channel, {static_cast<int>(ListenStep::ok), 0, static_cast<int>(i)}, fd);
  ::_exit(0);
}

std::string listen_step_name(ListenStep step, const std::string& where, const std::string& in) {
  switch (step) {
    case ListenStep::user: return kJoinUser;
    case ListenStep::net: return kJoinNet;
    case ListenStep::identity: return fmt::format("give up privileges to bind {} {}", where, in);
    case ListenStep::socket: return fmt::format("make a TCP socket {}", in);
    case ListenStep::reuse: return fmt::format("set SO_REUSEADDR {}", in);
    case ListenStep::bind: return fmt::format("bind {} {}", where, in);
    case ListenStep::listen: return fmt::format("listen on {} {}", where, in);
    case ListenStep::ok: break;
  }
  return "?";
}

std::string address_text(const std::string& address, int family, std::uint16_t port) {
  return family == AF_INET6 ? fmt::format("[{}]:{}", address, port) : fmt::format("{}:{}", address, port);
}

// Makes the socket of `plan` in a forked child and receives it. Throws SysError naming the step
// (and `address` with the port it was at).
UniqueFd make_listener(const ListenPlan& plan, const std::string& address, const std::vector<std::uint16_t>& ports) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0)
    throw SysError(errno, "socketpair", fmt::format("for a socket made {}", plan.where));
  UniqueFd ours(pair[0]), theirs(pair[1]);

  const pid_t child = ::fork();
  if (child < 0) throw SysError(errno, "fork", fmt::format("a process to make a socket {}", plan.where));
  if (child == 0) listen_child(plan, theirs.get());
  theirs.reset();

  ListenReport report{-1, 0, 0};
  iovec iov{&report, sizeof report};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))]{};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(ours.get(), &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  const int receive_error = errno;
  UniqueFd socket;
  if (n > 0) {
    for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
      if (cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cmsg), sizeof fd);
        socket.reset(fd);
      }
    }
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (n < 0) throw SysError(receive_error, fmt::format("receive the socket made {}", plan.where));
  if (n != static_cast<ssize_t>(sizeof report))
    throw Error(fmt::format("the process making a socket {} ended (status {}) without a report", plan.where, status));
  if (report.step != static_cast<int>(ListenStep::ok)) {
    const std::size_t at = std::min<std::size_t>(static_cast<std::size_t>(std::max(report.bound, 0)), ports.size() - 1);
    std::string where = address_text(address, plan.candidates.front().family, ports[at]);
    if (report.step == static_cast<int>(ListenStep::bind) && report.err == EADDRINUSE && ports.size() > 1)
      where = fmt::format("{} (and {} other ports)", where, ports.size() - 1);
    throw SysError(report.err, listen_step_name(static_cast<ListenStep>(report.step), where, plan.where));
  }
  if (!socket) throw Error(fmt::format("the socket made {} did not arrive", plan.where));
  return socket;
}

// ---- routes ----------------------------------------------------------------------------------

// "a.b.c.d/32" or "x::y/128" in canonical form; UsageError when `text` is no address.
std::string host_route(std::string_view text) {
  const std::string bare(text.substr(0, text.find('%')));
  char out[INET6_ADDRSTRLEN];
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, bare.c_str(), &v4) == 1) return std::string(::inet_ntop(AF_INET, &v4, out, sizeof out)) + "/32";
  if (::inet_pton(AF_INET6, bare.c_str(), &v6) == 1)
    return std::string(::inet_ntop(AF_INET6, &v6, out, sizeof out)) + "/128";
  throw UsageError(fmt::format("'{}' is not an IPv4 or IPv6 address; give addresses such as 10.0.0.1 or fd00::1",
                               std::string(text)));
}

CommandResult checked_run_in(const Netns& ns, const std::vector<std::string>& argv, const std::string& input = {}) {
  CommandResult r = run_in(ns, argv, input);
  if (r.exit_code != 0 || r.timed_out)
    throw Error(fmt::format("in the sandbox's network namespace: {}", describe_failure(argv, r)));
  return r;
}

// The prohibit host routes now in the namespace's main table, as "address/len".
std::set<std::string> prohibit_routes(const Netns& ns) {
  std::set<std::string> found;
  for (const char* family : {"-4", "-6"}) {
    const std::vector<std::string> argv{"ip", "-j", family, "route", "show", "table", "main", "type", "prohibit"};
    const CommandResult r = checked_run_in(ns, argv);
    const auto routes = parse_json_or_discarded(r.out.empty() ? std::string("[]") : r.out);
    if (!routes.is_array()) throw Error(fmt::format("ip {} route show printed no JSON list: {}", family, r.out));
    for (const auto& route : routes) {
      const std::string dst = route.value("dst", "");
      if (dst.empty() || dst == "default") continue;
      // ip prints a host route without its length.
      if (dst.find('/') == std::string::npos) found.insert(host_route(dst));
      else if (dst.ends_with("/32") || dst.ends_with("/128")) found.insert(host_route(dst.substr(0, dst.find('/'))));
    }
  }
  return found;
}

// ---- pasta -----------------------------------------------------------------------------------

std::optional<std::string> read_first_line(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  return line;
}

// pasta's stderr without the lines about a missing syslog (it logs to both).
std::string pasta_message(const CommandResult& r) {
  const std::string said = r.err + r.out;
  std::string kept;
  for (std::string_view line : text::split(said, '\n')) {
    line = text::trim(line);
    if (line.empty() || line.starts_with("Failed to send")) continue;
    if (!kept.empty()) kept += "; ";
    kept += line;
  }
  return kept;
}

}  // namespace

NetnsFds open_netns(pid_t pid) {
  const std::string path = fmt::format("/proc/{}/ns/net", pid);
  NetnsFds fds;
  fds.net.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fds.net) throw SysError(errno, "open", path);
  fds.userns.reset(::ioctl(fds.net.get(), NS_GET_USERNS));
  if (!fds.userns) throw SysError(errno, "ioctl(NS_GET_USERNS) on", path);
  ::fcntl(fds.userns.get(), F_SETFD, FD_CLOEXEC);
  struct stat theirs{}, ours{};
  if (::fstat(fds.userns.get(), &theirs) == 0 && ::stat("/proc/self/ns/user", &ours) == 0 &&
      theirs.st_ino == ours.st_ino && theirs.st_dev == ours.st_dev)
    fds.userns.reset();  // our own user namespace owns it: nothing to join (setns would fail)
  return fds;
}

UniqueFd listen_in(const Netns& ns, const std::string& address, std::uint16_t port, int backlog) {
  require(ns);
  ListenPlan plan;
  plan.ns = &ns;
  plan.candidates.push_back(parse_address(address, port));
  plan.backlog = backlog;
  plan.where = "in the sandbox's network namespace";
  return make_listener(plan, address, {port});
}

UniqueFd listen_as(const std::optional<users::Identity>& identity, const std::string& address,
                   const std::vector<std::uint16_t>& ports, int backlog) {
  if (ports.empty()) throw Error("listen_as: no port to try");
  ListenPlan plan;
  plan.as = &identity;
  for (const std::uint16_t port : ports) plan.candidates.push_back(parse_address(address, port));
  plan.backlog = backlog;
  plan.where = identity ? fmt::format("on the host as uid {}", identity->uid) : std::string("on the host");
  return make_listener(plan, address, ports);
}

CommandResult run_in(const Netns& ns, const std::vector<std::string>& argv, const std::string& input,
                     std::chrono::milliseconds timeout) {
  require(ns);
  ChildSetup setup;
  // Numbered in the child as 3 (net) and 4 (user), closed there once joined.
  setup.fds.emplace_back(ns.net_fd, 3);
  const bool with_user = ns.userns_fd >= 0;
  if (with_user) setup.fds.emplace_back(ns.userns_fd, 4);
  setup.in_child = [with_user](const char** step) {
    int err = join_netns(with_user ? 4 : -1, 3, step);
    ::close(3);
    if (with_user) ::close(4);
    if (err == 0) err = keep_net_admin(step);
    return err;
  };
  return run_command(argv, input, timeout, 64 * 1024 * 1024, {}, setup);
}

void block_addresses(const Netns& ns, const std::vector<std::string>& addresses) {
  require(ns);
  std::set<std::string> wanted;
  for (const auto& a : addresses) wanted.insert(host_route(a));
  const std::set<std::string> present = prohibit_routes(ns);
  std::string batch;
  for (const auto& route : wanted) batch += fmt::format("route replace prohibit {}\n", route);
  for (const auto& route : present)
    if (!wanted.count(route)) batch += fmt::format("route del prohibit {}\n", route);
  if (batch.empty()) return;
  try {
    checked_run_in(ns, {"ip", "-batch", "-"}, batch);
  } catch (const Error& e) {
    throw Error(fmt::format("could not set the blocked addresses: {}", e.what()));
  }
}

std::vector<std::string> host_addresses() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) < 0) throw SysError(errno, "getifaddrs", "(this host's addresses)");
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> owned(list, ::freeifaddrs);
  std::set<std::string> found;
  char out[INET6_ADDRSTRLEN];
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    if (i->ifa_addr->sa_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) continue;
      found.insert(::inet_ntop(AF_INET, &a->sin_addr, out, sizeof out));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr)) continue;
      found.insert(::inet_ntop(AF_INET6, &a->sin6_addr, out, sizeof out));
    }
  }
  return {found.begin(), found.end()};
}

HostAddressWatch::HostAddressWatch()
    : socket_(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE)) {
  if (!socket_) throw SysError(errno, "socket(AF_NETLINK)", "to follow this host's addresses");
  sockaddr_nl groups{};
  groups.nl_family = AF_NETLINK;
  groups.nl_groups = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
  if (::bind(socket_.get(), reinterpret_cast<sockaddr*>(&groups), sizeof groups) != 0)
    throw SysError(errno, "bind to rtnetlink's address groups", "to follow this host's addresses");
}

bool HostAddressWatch::changed() {
  bool any = false;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::recv(socket_.get(), buf, sizeof buf, 0);
    if (n > 0) {
      any = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // ENOBUFS: the kernel dropped announcements (and says so once); anything may have changed.
    if (n < 0 && errno == ENOBUFS) {
      any = true;
      continue;
    }
    return any;  // EAGAIN: nothing more queued
  }
}

int destroy_sockets(const Netns& ns) {
  require(ns);
  // ss's filter: every TCP socket whose peer is not loopback (IPv4, IPv6, IPv4-mapped).
  const std::string not_loopback = "( ! dst 127.0.0.0/8 and ! dst [::1] and ! dst [::ffff:127.0.0.0/104] )";
  const std::vector<std::string> kill{"ss", "-K", "-H", "-n", "-t", "state", "connected", not_loopback};
  const CommandResult killed = checked_run_in(ns, kill);
  int closed = 0;
  for (std::string_view line : text::split(killed.out, '\n'))
    if (!text::trim(line).empty()) ++closed;
  // ss skips sockets the kernel cannot destroy (EOPNOTSUPP without CONFIG_INET_DIAG_DESTROY)
  // without a word: look again.
  const std::vector<std::string> look{"ss", "-H", "-n", "-t", "state", "established", not_loopback};
  const CommandResult left = checked_run_in(ns, look);
  int remaining = 0;
  for (std::string_view line : text::split(left.out, '\n'))
    if (!text::trim(line).empty()) ++remaining;
  if (remaining == 0) return closed;
  std::string why = "the kernel may lack CONFIG_INET_DIAG_DESTROY (sock_diag's SOCK_DESTROY), which `ss -K` needs";
  const CommandResult cfg = run_command({"sh", "-c", "zcat /proc/config.gz 2>/dev/null | grep INET_DIAG_DESTROY"});
  if (cfg.out.find("CONFIG_INET_DIAG_DESTROY=y") != std::string::npos)
    why = "the kernel has CONFIG_INET_DIAG_DESTROY, so they were probably opened after `ss -K` ran; try again";
  else if (cfg.out.find("is not set") != std::string::npos)
    why = "this kernel is built without CONFIG_INET_DIAG_DESTROY (sock_diag's SOCK_DESTROY), which `ss -K` needs; "
          "stop the sandbox to end them, or use a kernel with that option";
  throw Error(fmt::format("{} TCP connection(s) to non-loopback peers are still open in the sandbox's network "
                          "namespace after `ss -K`: {}",
                          remaining, why));
}

std::optional<PastaProcess> find_pasta(const std::filesystem::path& pid_file) {
  const auto line = read_first_line(pid_file);
  if (!line) return std::nullopt;
  pid_t pid = 0;
  try {
    pid = static_cast<pid_t>(std::stol(std::string(text::trim(*line))));
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (pid <= 1) return std::nullopt;
  PastaProcess p;
  p.pid = pid;
  p.pidfd = open_pidfd(pid);
  if (!p.pidfd) return std::nullopt;
  const std::vector<std::string> args = proc::read_cmdline(pid);
  // Read while the pidfd's process was alive: the command line was its own, not a later
  // process's with the same pid.
  if (wait_pidfd(p.pidfd.get(), std::chrono::milliseconds(0))) return std::nullopt;
  if (args.empty() || !std::filesystem::path(args[0]).filename().string().starts_with("pasta")) return std::nullopt;
  const std::string recorded = std::filesystem::absolute(pid_file).string();
  for (std::size_t i = 0; i + 1 < args.size(); ++i)
    if ((args[i] == "--pid" || args[i] == "-P") && args[i + 1] == recorded) return p;
  return std::nullopt;
}

PastaProcess attach_pasta(const Netns& ns, const PastaOptions& options) {
  require(ns);
  if (options.pid_file.empty()) throw UsageError("attach_pasta: no pid file given");
  const std::string pid_file = std::filesystem::absolute(options.pid_file).string();
  if (auto running = find_pasta(pid_file))
    throw UsageError(fmt::format("pasta (pid {}) is already attached with the pid file {}; detach it first",
                                 running->pid, pid_file));
  std::error_code ignored;
  std::filesystem::remove(pid_file, ignored);  // stale

  std::vector<std::string> argv{"pasta", "--quiet", "--config-net", "--netns", "/proc/self/fd/3"};
  ChildSetup setup;
  setup.fds.emplace_back(ns.net_fd, 3);
  if (ns.userns_fd >= 0) {
    argv.insert(argv.end(), {"--userns", "/proc/self/fd/4"});
    setup.fds.emplace_back(ns.userns_fd, 4);
  }
  // As root pasta would drop to nobody before it opens the namespaces, and fail.
  if (::geteuid() == 0) argv.insert(argv.end(), {"--runas", "0"});
  argv.insert(argv.end(), {"--no-map-gw", "-t", "none", "-u", "none", "-T", "none", "-U", "none", "--pid", pid_file});

  const auto start = Clock::now();
  CommandResult r;
  try {
    r = run_command(argv, {}, options.timeout, 64 * 1024, {}, setup);
  } catch (const SysError& e) {
    if (e.code() == ENOENT) throw e.wrapped("NAT needs pasta; install the package passt (apt-get install passt)");
    throw;
  }
  if (r.exit_code != 0 || r.timed_out) {
    std::string said = pasta_message(r);
    if (r.timed_out) said = fmt::format("it did not start within {} ms", options.timeout.count());
    throw Error(fmt::format("could not attach pasta (NAT) to the sandbox's network namespace: pasta exited with {}{}{}",
                            r.exit_code, said.empty() ? "" : ": ", said));
  }
  auto found = find_pasta(pid_file);
  if (!found)
    throw Error(fmt::format("pasta started but is not running (its pid file {} names no living pasta); "
                            "run it by hand with --foreground --debug to see why",
                            pid_file));
  siginfo_t info{};
  found->adopted = ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(found->pidfd.get()), &info,
                            WEXITED | WNOHANG | WNOWAIT) == 0;
  found->took = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
  return std::move(*found);
}

namespace {

// Ends the pasta of `found` (SIGTERM, SIGKILL after `grace`) and reaps it when it is ours.
void end_pasta(const PastaProcess& found, std::chrono::milliseconds grace) {
  const int pidfd = found.pidfd.get();
  signal_pidfd(pidfd, SIGTERM);
  if (!wait_pidfd(pidfd, grace)) {
    signal_pidfd(pidfd, SIGKILL);
    if (!wait_pidfd(pidfd, std::chrono::seconds(5)))
      throw Error(fmt::format("pasta (pid {}) did not end within 5 s of SIGKILL; its interface stays in the "
                              "sandbox's network namespace",
                              found.pid));
  }
  // Our child when this process is a subreaper that adopted it: reap it (no-op otherwise).
  reap_if_child(pidfd);
}

}  // namespace

bool detach_pasta(const std::filesystem::path& pid_file, std::chrono::milliseconds grace) {
  std::error_code ignored;
  auto found = find_pasta(pid_file);
  if (!found) {
    std::filesystem::remove(pid_file, ignored);
    return false;
  }
  end_pasta(*found, grace);
  std::filesystem::remove(pid_file, ignored);
  return true;
}

int watch_main(int argc, char** argv) {
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  pid_t init = 0;
  std::filesystem::path pid_file;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string_view option = argv[i];
    if (option == "--watch-pid")
      init = static_cast<pid_t>(std::atol(argv[i + 1]));
    else if (option == "--pasta-pid-file")
      pid_file = argv[i + 1];
  }
  if (init <= 1 || pid_file.empty()) {
    fmt::print(stderr, "usage: ns-hpc {} --watch-pid PID --pasta-pid-file FILE (started by the ns-hpc server)\n",
               kWatchCommand);
    return 2;
  }
  const UniqueFd sandbox = open_pidfd(init);
  std::optional<PastaProcess> pasta = find_pasta(pid_file);
  if (!pasta) return 0;  // detached already
  // The folder of the pid file: when it is removed (the instance's folder was), pasta is ended.
  UniqueFd folder;
  try {
    folder = fs::open_dir_path(std::filesystem::absolute(pid_file).parent_path());
  } catch (const SysError&) {
  }
  if (sandbox && folder) {
    // The host's addresses are watched (rtnetlink): when they change, the sandbox's blocked set
    // follows within moments.
    std::optional<NetnsFds> ns;
    try {
      ns = open_netns(init);
    } catch (const std::exception& e) {
      fmt::print(stderr, "ns-hpc {}: the host's new addresses will not be blocked: {}\n", kWatchCommand, e.what());
    }
    std::optional<HostAddressWatch> changes;
    try {
      changes.emplace();
    } catch (const std::exception& e) {
      fmt::print(stderr, "ns-hpc {}: the host's new addresses will not be blocked: {}\n", kWatchCommand, e.what());
    }
    for (;;) {
      pollfd fds[3] = {{sandbox.get(), POLLIN, 0},
                       {pasta->pidfd.get(), POLLIN, 0},
                       {ns && changes ? changes->fd() : -1, POLLIN, 0}};
      const int ready = ::poll(fds, 3, static_cast<int>(std::chrono::milliseconds(fs::kRemovedCheck).count()));
      if (ready < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[1].revents != 0) return 0;  // pasta ended first
      if (fds[0].revents != 0 || fs::removed(folder.get())) break;
      if (fds[2].revents != 0) {
        changes->changed();
        ::usleep(50000);  // an address change comes as several messages
        changes->changed();
        try {
          block_addresses(ns->view(), host_addresses());
        } catch (const std::exception& e) {
          fmt::print(stderr, "ns-hpc {}: blocking the host's new addresses: {}\n", kWatchCommand, e.what());
        }
      }
    }
  }
  // By the descriptor found at the start: the pid file may be gone with its folder by now.
  try {
    end_pasta(*pasta, std::chrono::seconds(2));
  } catch (const std::exception& e) {
    fmt::print(stderr, "ns-hpc {}: {}\n", kWatchCommand, e.what());
    return 1;
  }
  // Only while it still names this pasta: a sandbox started again meanwhile has a new pasta that
  // wrote the same file, and removing it would leave that pasta unfindable.
  const auto line = read_first_line(pid_file);
  if (line && text::trim(*line) == std::to_string(pasta->pid)) {
    std::error_code ignored;
    std::filesystem::remove(pid_file, ignored);
  }
  return 0;
}

namespace {

// Becomes the only member of a new network namespace (with a user namespace of its own when not
// root, mapping this user to itself: sandboxes started in it keep the user's uid) whose loopback
// is up. The creator holds every capability in a new user namespace whatever its uid there.
// Returns 0 or an errno with *step set.
int make_held_netns(const char** step) {
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (uid != 0) {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNET) < 0) return *step = "unshare a user and network namespace", errno;
    const std::pair<const char*, std::string> maps[] = {{"/proc/self/setgroups", "deny"},
                                                        {"/proc/self/uid_map", fmt::format("{0} {0} 1", uid)},
                                                        {"/proc/self/gid_map", fmt::format("{0} {0} 1", gid)}};
    for (const auto& [file, text] : maps) {
      const UniqueFd fd(::open(file, O_WRONLY | O_CLOEXEC));
      if (!fd || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()))
        return *step = "map this user in its user namespace", errno;
    }
  } else if (::unshare(CLONE_NEWNET) < 0) {
    return *step = "unshare a network namespace", errno;
  }
  const UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock) return *step = "make a socket to bring loopback up", errno;
  ifreq req{};
  std::strncpy(req.ifr_name, "lo", IFNAMSIZ - 1);
  if (::ioctl(sock.get(), SIOCGIFFLAGS, &req) < 0) return *step = "read loopback's flags", errno;
  req.ifr_flags = static_cast<short>(req.ifr_flags | IFF_UP);
  if (::ioctl(sock.get(), SIOCSIFFLAGS, &req) < 0) return *step = "bring loopback up", errno;
  return 0;
}

// Whether a process other than this one is in the network namespace `ino` (on device `dev`).
// Processes this one may not inspect do not count; a sandbox's are this user's.
bool others_in(dev_t dev, ino_t ino) {
  const pid_t self = ::getpid();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] < '0' || name[0] > '9') continue;
    if (static_cast<pid_t>(std::atol(name.c_str())) == self) continue;
    struct stat st{};
    if (::stat((entry.path() / "ns/net").c_str(), &st) == 0 && st.st_dev == dev && st.st_ino == ino) return true;
  }
  return false;
}

}  // namespace

int hold_main(int argc, char** argv) {
  long idle = -1;
  std::filesystem::path record;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::string_view(argv[i]) == "--idle") idle = std::atol(argv[i + 1]);
    if (std::string_view(argv[i]) == "--record") record = argv[i + 1];
  }
  struct stat ready{};
  if (idle < 0 || record.empty() || ::fstat(3, &ready) < 0 || !S_ISFIFO(ready.st_mode)) {
    fmt::print(stderr, "usage: ns-hpc {} --idle SECONDS --record FILE, fd 3 a pipe (started by the ns-hpc server)\n",
               kHoldCommand);
    return 2;
  }
  // The folder of its record: the holder ends when it is removed (the instance's folder was).
  UniqueFd folder;
  try {
    folder = fs::open_dir_path(std::filesystem::absolute(record).parent_path());
  } catch (const SysError& e) {
    const std::string message = fmt::format("{}\n", e.what());
    (void)!::write(3, message.data(), message.size());
    return 1;
  }
  sigset_t stop;
  ::sigemptyset(&stop);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaddset(&stop, sig);
  ::sigprocmask(SIG_BLOCK, &stop, nullptr);
  const char* step = nullptr;
  if (const int err = make_held_netns(&step); err != 0) {
    const std::string message = fmt::format("{}: {}\n", step, std::strerror(err));
    (void)!::write(3, message.data(), message.size());
    return 1;
  }
  // It stays dumpable: the server opens its namespaces as /proc/PID/ns/*, which a normal user
  // cannot do to a process that is not (nor could this write its own uid_map). Sandboxes, in
  // pid namespaces of their own, never see it.
  // It keeps its capabilities: it reads nothing a sandbox writes, and it looks for the
  // sandboxes' processes in /proc (which, of another uid's, takes CAP_SYS_PTRACE).
  (void)!::write(3, "ready\n", 6);
  ::close(3);
  struct stat own{};
  if (::stat("/proc/self/ns/net", &own) < 0) return 1;
  // Checked every few seconds: a command ending does not end the namespace at once, only after
  // `idle` seconds with nothing in it. Its record's folder is looked at every kRemovedCheck.
  const auto period = std::chrono::seconds(idle > 0 ? std::min<long>(idle, 5) : 3600);
  auto last_busy = Clock::now();
  auto next_look = last_busy + period;
  for (;;) {
    const timespec wait{static_cast<time_t>(fs::kRemovedCheck.count()), 0};
    const int sig = ::sigtimedwait(&stop, nullptr, &wait);
    if (sig > 0 || fs::removed(folder.get())) return 0;
    if (idle == 0 || Clock::now() < next_look) continue;
    next_look = Clock::now() + period;
    if (others_in(own.st_dev, own.st_ino)) last_busy = Clock::now();
    else if (Clock::now() - last_busy >= std::chrono::seconds(idle)) return 0;
  }
}

std::optional<std::string> nat_unavailable() {
  if (!fs::find_program("pasta"))
    return std::string("pasta is not installed, so sandboxes cannot get NAT (`nat` mode); an administrator can "
                       "install the package passt (apt-get install passt)");
  const UniqueFd tun(::open("/dev/net/tun", O_RDWR | O_CLOEXEC));
  if (tun) return std::nullopt;
  const int err = errno;
  struct stat st{};
  if (err == ENOENT)
    return std::string("/dev/net/tun does not exist, so pasta cannot give sandboxes NAT (`nat` mode); an "
                       "administrator can load the tun module (modprobe tun) or create the device "
                       "(mknod /dev/net/tun c 10 200)");
  if ((err == EACCES || err == EPERM) && ::stat("/dev/net/tun", &st) == 0 && st.st_uid == 0 &&
      (st.st_mode & 0066) == 0)
    return fmt::format("/dev/net/tun is root-only here ({:04o}): a normal user gets `filtered` instead of `nat`; an "
                       "administrator can chmod 0666 /dev/net/tun",
                       st.st_mode & 07777);
  return fmt::format("/dev/net/tun cannot be opened ({}), so pasta cannot give sandboxes NAT (`nat` mode); an "
                     "administrator can check its permissions and that the tun module is loaded",
                     std::strerror(err));
}

}  // namespace nshpc::network
