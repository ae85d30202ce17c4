#include "network/forward.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/nsfs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "audit/audit.hpp"
#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/pidfd.hpp"
#include "base/users.hpp"

namespace nshpc::network {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kListenFd = 3, kNetFd = 4, kUsernsFd = 5;
constexpr std::size_t kBufferBytes = 64 * 1024;
constexpr std::size_t kMaxConnections = 512;
constexpr auto kAuditPeriod = std::chrono::seconds(60);

// One direction of a connection: what was read from `from` and not yet written to `to`.
struct Flow {
  std::string buffer;
  bool eof = false;       // `from` ended: `to` is shut for writing once the buffer is empty
  bool shut = false;
  std::uint64_t bytes = 0;
};

struct Connection {
  UniqueFd outside, inside;
  Flow in, out;  // in: outside → inside; out: inside → outside
  bool broken = false;
  bool done() const { return broken || (in.shut && out.shut); }
};

// A TCP connection to the sandbox's own port (this process is in its namespace): 127.0.0.1,
// else ::1. Loopback answers at once, so a blocking connect is fine. -1 when nothing listens.
int connect_inside(std::uint16_t port) {
  {
    UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s && ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return s.release();
  }
  UniqueFd s(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  a.sin6_addr = in6addr_loopback;
  if (s && ::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return s.release();
  return -1;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Moves what `from` has into flow.buffer (up to kBufferBytes), and what the buffer has to `to`.
void pump(int from, int to, Flow& flow, bool readable, bool writable, bool& broken) {
  if (readable && !flow.eof && flow.buffer.size() < kBufferBytes) {
    char chunk[16384];
    const ssize_t n = ::read(from, chunk, std::min(sizeof chunk, kBufferBytes - flow.buffer.size()));
    if (n > 0) {
      flow.buffer.append(chunk, static_cast<std::size_t>(n));
      flow.bytes += static_cast<std::uint64_t>(n);
    } else if (n == 0) {
      flow.eof = true;
    } else if (errno != EAGAIN && errno != EINTR) {
      broken = true;
      return;
    }
  }
  (void)writable;  // a send that would block says so (MSG_DONTWAIT)
  if (!flow.buffer.empty()) {
    const ssize_t n = ::send(to, flow.buffer.data(), flow.buffer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) flow.buffer.erase(0, static_cast<std::size_t>(n));
    else if (n < 0 && errno != EAGAIN && errno != EINTR) broken = true;
  }
  if (flow.eof && flow.buffer.empty() && !flow.shut) {
    ::shutdown(to, SHUT_WR);
    flow.shut = true;
  }
}

struct Options {
  std::uint16_t port = 0;
  std::string audit_file, instance, record;
  pid_t watch = 0;
  std::optional<users::Identity> identity;  // --uid/--gid: become it once in the namespace
};

// A decimal id, 1..4294967294 (never root's 0).
std::optional<std::uint32_t> parse_id(std::string_view text) {
  std::uint32_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || n == 0 || n == 4294967295u)
    return std::nullopt;
  return n;
}

bool parse(int argc, char** argv, Options& o) {
  std::optional<std::uint32_t> uid, gid;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--port") {
      const long p = std::atol(value);
      if (p < 1 || p > 65535) return false;
      o.port = static_cast<std::uint16_t>(p);
    } else if (flag == "--audit") {
      o.audit_file = value;
    } else if (flag == "--uid" || flag == "--gid") {
      auto& id = flag == "--uid" ? uid : gid;
      id = parse_id(value);
      if (!id) return false;
    } else if (flag == "--instance") {
      o.instance = value;
    } else if (flag == "--watch-pid") {
      o.watch = static_cast<pid_t>(std::atol(value));
    } else if (flag == "--record") {  // the pid file's path: it names the forwarder for the server
      o.record = value;
    } else {
      return false;
    }
  }
  if (uid.has_value() != gid.has_value()) return false;
  if (uid) o.identity = users::Identity{*uid, *gid};
  struct stat st{};
  return o.port != 0 && !o.audit_file.empty() && !o.record.empty() && o.watch > 1 && ::fstat(kListenFd, &st) == 0 &&
         S_ISSOCK(st.st_mode) &&
         ::fstat(kNetFd, &st) == 0;
}

std::uint16_t local_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  return ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

}  // namespace

int forward_main(int argc, char** argv) {
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  Options options;
  if (!parse(argc, argv, options)) {
    fmt::print(stderr,
               "usage: ns-hpc {} --port P --audit FILE --instance ID --watch-pid PID --record FILE [--uid U --gid G], "
               "with a listening socket on fd 3 and a network namespace on fd 4 (started by the ns-hpc server)\n",
               kForwardCommand);
    return 2;
  }
  // The log is opened while this process may still open it by name.
  const UniqueFd audit_log(
      ::open(options.audit_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!audit_log) {
    fmt::print(stderr, "ns-hpc {}: open the audit log {}: {}\n", kForwardCommand, options.audit_file,
               std::strerror(errno));
    return 1;
  }
  // So is the folder of its record (the instance's state folder): it ends once that is removed.
  UniqueFd folder;
  try {
    folder = fs::open_dir_path(std::filesystem::absolute(options.record).parent_path());
  } catch (const SysError& e) {
    fmt::print(stderr, "ns-hpc {}: {}\n", kForwardCommand, e.what());
    return 1;
  }
  // The namespaces first (descriptor 5, when given, is a user namespace: checked, not assumed).
  if (::ioctl(kUsernsFd, NS_GET_NSTYPE) == CLONE_NEWUSER) {
    if (::setns(kUsernsFd, CLONE_NEWUSER) != 0) {
      fmt::print(stderr, "ns-hpc {}: join the sandbox's user namespace: {}\n", kForwardCommand, std::strerror(errno));
      return 1;
    }
    ::close(kUsernsFd);
  }
  if (::setns(kNetFd, CLONE_NEWNET) != 0) {
    fmt::print(stderr, "ns-hpc {}: join the sandbox's network namespace: {}\n", kForwardCommand, std::strerror(errno));
    return 1;
  }
  ::close(kNetFd);
  // What a sandbox sends passes through here: not root (with --uid), no capability from now on.
  if (options.identity &&
      (::setgroups(0, nullptr) != 0 || ::setresgid(options.identity->gid, options.identity->gid,
                                                   options.identity->gid) != 0 ||
       ::setresuid(options.identity->uid, options.identity->uid, options.identity->uid) != 0)) {
    fmt::print(stderr, "ns-hpc {}: become uid {} gid {}: {}\n", kForwardCommand, options.identity->uid,
               options.identity->gid, std::strerror(errno));
    return 1;
  }
  try {
    users::drop_capabilities();
  } catch (const std::exception& e) {
    fmt::print(stderr, "ns-hpc {}: {}\n", kForwardCommand, e.what());
    return 1;
  }
  const UniqueFd watched = open_pidfd(options.watch);
  if (!watched) return 0;  // the sandbox is gone already
  sigset_t stop;
  ::sigemptyset(&stop);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) ::sigaddset(&stop, sig);
  ::sigprocmask(SIG_BLOCK, &stop, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  const UniqueFd signals(::signalfd(-1, &stop, SFD_CLOEXEC));
  set_nonblocking(kListenFd);
  const std::uint16_t host_port = local_port(kListenFd);

  std::list<Connection> connections;
  std::uint64_t accepted = 0, refused = 0, bytes_in = 0, bytes_out = 0;
  auto last_audit = Clock::now();
  auto flush_audit = [&](bool final) {
    if (accepted == 0 && refused == 0) return;
    std::uint64_t in = bytes_in, out = bytes_out;
    for (const Connection& c : connections) {
      in += c.in.bytes;
      out += c.out.bytes;
    }
    try {
      audit::append_to(audit_log.get(), options.audit_file, "network.port_traffic", "network",
                       {{"instance_id", options.instance},
                        {"port", options.port},
                        {"host_port", host_port},
                        {"connections", accepted},
                        {"refused", refused},
                        {"bytes_to_sandbox", in},
                        {"bytes_from_sandbox", out},
                        {"final", final}});
    } catch (const std::exception& e) {
      fmt::print(stderr, "ns-hpc {}: cannot write the audit log: {}\n", kForwardCommand, e.what());
    }
    accepted = refused = 0;
    // Bytes of connections still open are counted again next time: keep only the ended ones out.
    bytes_in = bytes_out = 0;
    for (Connection& c : connections) c.in.bytes = c.out.bytes = 0;
    last_audit = Clock::now();
  };

  for (;;) {
    std::vector<pollfd> fds = {{kListenFd, POLLIN, 0}, {watched.get(), POLLIN, 0}, {signals.get(), POLLIN, 0}};
    for (const Connection& c : connections) {
      short outside_events = 0, inside_events = 0;
      if (!c.in.eof && c.in.buffer.size() < kBufferBytes) outside_events |= POLLIN;
      if (!c.out.buffer.empty()) outside_events |= POLLOUT;
      if (!c.out.eof && c.out.buffer.size() < kBufferBytes) inside_events |= POLLIN;
      if (!c.in.buffer.empty()) inside_events |= POLLOUT;
      fds.push_back({c.outside.get(), outside_events, 0});
      fds.push_back({c.inside.get(), inside_events, 0});
    }
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::chrono::milliseconds(fs::kRemovedCheck).count()));
    if (n < 0 && errno != EINTR) return 1;
    if (fds[1].revents != 0 || fds[2].revents != 0 || fs::removed(folder.get())) break;
    std::size_t i = 3;
    for (Connection& c : connections) {
      const pollfd& o = fds[i++];
      const pollfd& s = fds[i++];
      const bool o_in = (o.revents & (POLLIN | POLLHUP | POLLERR)) != 0, o_out = (o.revents & POLLOUT) != 0;
      const bool s_in = (s.revents & (POLLIN | POLLHUP | POLLERR)) != 0, s_out = (s.revents & POLLOUT) != 0;
      // An error, or a side hung up both ways after its end was read: nothing more can pass.
      if (((o.revents | s.revents) & POLLERR) != 0 || ((o.revents & POLLHUP) != 0 && c.in.eof) ||
          ((s.revents & POLLHUP) != 0 && c.out.eof)) {
        c.broken = true;
        continue;
      }
      pump(c.outside.get(), c.inside.get(), c.in, o_in, s_out, c.broken);
      if (!c.broken) pump(c.inside.get(), c.outside.get(), c.out, s_in, o_out, c.broken);
    }
    for (auto it = connections.begin(); it != connections.end();) {
      if (it->done()) {
        bytes_in += it->in.bytes;
        bytes_out += it->out.bytes;
        it = connections.erase(it);
      } else {
        ++it;
      }
    }
    if (fds[0].revents & POLLIN) {
      for (;;) {
        UniqueFd client(::accept4(kListenFd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!client) break;
        if (connections.size() >= kMaxConnections) {
          ++refused;
          continue;
        }
        UniqueFd inside(connect_inside(options.port));
        if (!inside) {
          ++refused;  // nothing listens on the port inside: the client sees the connection closed
          continue;
        }
        set_nonblocking(inside.get());
        ++accepted;
        connections.push_back(Connection{std::move(client), std::move(inside), {}, {}, false});
      }
    }
    if (Clock::now() - last_audit >= kAuditPeriod) flush_audit(false);
  }
  flush_audit(true);
  return 0;
}

}  // namespace nshpc::network
