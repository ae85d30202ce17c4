// The network-namespace tools against the real kernel, ip, ss, pasta and bwrap. The tests with the
// outside world and pasta need root (they make a named network namespace and a veth pair, and
// /dev/net/tun is root-only here): skipped otherwise. The others need user namespaces only and
// run as a normal user too (the server of a normal user owns its sandboxes' user namespaces).
//
// No packet leaves this machine. "The outside world" is a network namespace made here
// (ip netns add) joined to the host by a veth pair on 10.233.X.0/30, with a TCP server on
// 10.233.X.2; "the sandbox" is a process in a network namespace of its own owned by a user
// namespace of its own (unshare --net --user --map-root-user sleep), whose descriptors are given
// to the functions. The sandbox only ever connects to the world server, to the host's own
// addresses and to loopback.
#include "network/netns.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/error.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/pidfd.hpp"
#include "base/process.hpp"
#include "base/spawn.hpp"
#include "harness.hpp"

namespace {

namespace net = nshpc::network;
namespace stdfs = std::filesystem;
using namespace std::chrono_literals;
using nshpc::CommandResult;
using nshpc::UniqueFd;
using nshpc::test::eventually;

#define REQUIRE_ROOT() \
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: makes network namespaces, a veth pair and runs pasta"
// The sandbox stand-in needs user namespaces only: a normal user (the HPC case) runs these too.
bool user_namespaces() {
  static const bool ok = nshpc::run_command({"unshare", "--net", "--user", "--map-root-user", "true"}).exit_code == 0;
  return ok;
}
#define REQUIRE_USERNS() \
  if (!user_namespaces()) GTEST_SKIP() << "needs user namespaces (unshare --user fails here)"
#define REQUIRE_PASTA()                                              \
  REQUIRE_ROOT();                                                    \
  if (auto why = net::nat_unavailable()) GTEST_SKIP() << *why

// A host command that must succeed.
void host(const std::vector<std::string>& argv) {
  const CommandResult r = nshpc::run_command(argv, {}, 30s);
  if (r.exit_code != 0) throw nshpc::Error(nshpc::describe_failure(argv, r));
}

// "The outside world": a network namespace joined to the host by a veth pair, host side
// 10.233.X.1/30, world side 10.233.X.2/30. Removed on destruction.
class World {
 public:
  World() {
    const CommandResult used = nshpc::run_command({"ip", "-4", "-o", "addr"});
    for (int i = 0; i < 200; ++i) {
      x_ = 20 + (::getpid() + i) % 200;
      if (used.out.find(fmt::format(" 10.233.{}.", x_)) == std::string::npos) break;
    }
    name_ = fmt::format("nshpc-world-{}", ::getpid());
    host_if_ = fmt::format("nshh{}", ::getpid());
    world_if_ = fmt::format("nshw{}", ::getpid());
    host({"ip", "netns", "add", name_});
    created_ = true;
    try {
      build();
    } catch (...) {
      remove();
      throw;
    }
  }
  ~World() { remove(); }
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  std::string host_ip() const { return fmt::format("10.233.{}.1", x_); }
  std::string world_ip() const { return fmt::format("10.233.{}.2", x_); }
  net::Netns view() const { return {fd_.get(), -1}; }  // root joins it directly

 private:
  void build() {
    host({"ip", "link", "add", host_if_, "type", "veth", "peer", "name", world_if_, "netns", name_});
    host({"ip", "addr", "add", host_ip() + "/30", "dev", host_if_});
    host({"ip", "link", "set", host_if_, "up"});
    host({"ip", "-n", name_, "addr", "add", world_ip() + "/30", "dev", world_if_});
    host({"ip", "-n", name_, "link", "set", world_if_, "up"});
    host({"ip", "-n", name_, "link", "set", "lo", "up"});
    fd_.reset(::open(("/run/netns/" + name_).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd_) throw nshpc::SysError(errno, "open", "/run/netns/" + name_);
  }
  void remove() noexcept {
    if (!created_) return;
    created_ = false;
    fd_.reset();
    try {
      nshpc::run_command({"ip", "link", "del", host_if_});  // its peer goes with it
      nshpc::run_command({"ip", "netns", "del", name_});
    } catch (const std::exception&) {
    }
  }

  int x_ = 0;
  bool created_ = false;
  std::string name_, host_if_, world_if_;
  UniqueFd fd_;
};

// The sandbox stand-in: `sleep` in a network namespace owned by a user namespace of its own,
// loopback up (as bwrap leaves it).
class Sandbox {
 public:
  Sandbox() {
    nshpc::SpawnSpec spec;
    spec.program = "unshare";
    spec.argv = {"unshare", "--net", "--user", "--map-root-user", "sleep", "600"};
    UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
    spec.fds = {{null.get(), 0}, {null.get(), 1}, {null.get(), 2}};
    process_ = nshpc::spawn(spec);
    struct stat ours{};
    ::stat("/proc/self/ns/net", &ours);
    const std::string path = fmt::format("/proc/{}/ns/net", process_.pid());
    // unshare has made its namespaces once it has become sleep.
    if (!eventually([&] {
          struct stat theirs{};
          std::error_code ec;
          return ::stat(path.c_str(), &theirs) == 0 && theirs.st_ino != ours.st_ino &&
                 stdfs::read_symlink(fmt::format("/proc/{}/exe", process_.pid()), ec).filename() == "sleep";
        }, 5s))
      throw nshpc::Error("the sandbox stand-in did not get a network namespace of its own");
    fds_ = net::open_netns(process_.pid());
    const CommandResult up = net::run_in(view(), {"ip", "link", "set", "lo", "up"});
    if (up.exit_code != 0) throw nshpc::Error(nshpc::describe_failure({"ip"}, up));
  }
  net::Netns view() const { return fds_.view(); }
  pid_t pid() const { return process_.pid(); }
  // Ends the sandbox's only process (the namespaces stay while descriptors hold them).
  void end() {
    nshpc::signal_pidfd(process_.pidfd(), SIGKILL);
    process_.wait();
  }

 private:
  nshpc::SpawnedChild process_;
  net::NetnsFds fds_;
};

// A TCP server on a listening socket (made anywhere): greets each client with "hello\n" and keeps
// the connection open; send_all() writes to every kept connection.
class Server {
 public:
  explicit Server(UniqueFd listener) : listener_(std::move(listener)) {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~Server() {
    stop_ = true;
    thread_.join();
  }
  std::uint16_t port() const { return port_; }
  int accepted() const { return accepted_; }
  void send_all(const std::string& text) {
    std::lock_guard lock(mutex_);
    for (const auto& c : connections_) (void)!::send(c.get(), text.data(), text.size(), MSG_NOSIGNAL);
  }

 private:
  void loop() {
    while (!stop_) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      UniqueFd c(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c) continue;
      // Counted before the greeting: a client that has read it finds the count already raised.
      ++accepted_;
      (void)!::send(c.get(), "hello\n", 6, MSG_NOSIGNAL);
      std::lock_guard lock(mutex_);
      connections_.push_back(std::move(c));
    }
  }
  UniqueFd listener_;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::mutex mutex_;
  std::vector<UniqueFd> connections_;
  std::thread thread_;
};

// A listening socket in this (the host's) network namespace.
UniqueFd host_listener(const std::string& address) {
  const int family = address.find(':') != std::string::npos ? AF_INET6 : AF_INET;
  UniqueFd s(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage a{};
  socklen_t len;
  if (family == AF_INET6) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&a);
    v6->sin6_family = AF_INET6;
    ::inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr);
    const int zero = 0;
    ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    len = sizeof *v6;
  } else {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&a);
    v4->sin_family = AF_INET;
    ::inet_pton(AF_INET, address.c_str(), &v4->sin_addr);
    len = sizeof *v4;
  }
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), len) < 0 || ::listen(s.get(), 16) < 0)
    throw nshpc::SysError(errno, "listen on", address);
  return s;
}

// From inside the sandbox: connect to host:port, read one line; prints "got:<line>". Exit 10:
// the connection failed (stderr says why).
CommandResult connect_from(const net::Netns& ns, const std::string& address, std::uint16_t port) {
  return net::run_in(ns,
                     {"bash", "-c", "exec 3<>\"/dev/tcp/$0/$1\" || exit 10; read -r -t 5 line <&3; echo \"got:$line\"",
                      address, std::to_string(port)},
                     {}, 20s);
}

// From inside: connect, read the greeting, then wait up to 15 s for a second line; prints read's
// status (0: a line, 1: end of file or an error, >128: timed out) and the line.
CommandResult hold_from(const net::Netns& ns, const std::string& address, std::uint16_t port) {
  return net::run_in(ns,
                     {"bash", "-c",
                      "exec 3<>\"/dev/tcp/$0/$1\" || exit 10; read -r line <&3; echo \"first:$line\"; "
                      "line=; read -r -t 15 line <&3; echo \"second rc=$?:$line\"",
                      address, std::to_string(port)},
                     {}, 30s);
}

std::vector<std::string> links_in(const net::Netns& ns) {
  const CommandResult r = net::run_in(ns, {"ip", "-o", "link", "show"});
  std::vector<std::string> names;
  std::size_t at = 0;
  while (at < r.out.size()) {
    const std::size_t end = r.out.find('\n', at);
    const std::string line = r.out.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? r.out.size() : end + 1;
    const auto colon = line.find(": ");
    if (colon == std::string::npos) continue;
    std::string name = line.substr(colon + 2, line.find(':', colon + 2) - colon - 2);
    names.push_back(name.substr(0, name.find('@')));
  }
  return names;
}

std::vector<std::string> prohibit_routes_in(const net::Netns& ns) {
  std::vector<std::string> routes;
  for (const char* family : {"-4", "-6"}) {
    const CommandResult r = net::run_in(ns, {"ip", family, "route", "show", "type", "prohibit"});
    std::size_t at = 0;
    while (at < r.out.size()) {
      const std::size_t end = r.out.find('\n', at);
      std::string line = r.out.substr(at, end - at);
      at = end == std::string::npos ? r.out.size() : end + 1;
      if (line.rfind("prohibit ", 0) == 0) routes.push_back(line.substr(9, line.find(' ', 9) - 9));
    }
  }
  std::sort(routes.begin(), routes.end());
  return routes;
}

// A folder of this test's own for pasta's pid files: on destruction every pasta recorded there is
// detached (a failed test leaves none running), then the folder is removed.
class TempDir {
 public:
  TempDir() : path_(stdfs::temp_directory_path() / fmt::format("nshpc-netns-{}-{}", ::getpid(), ++count_)) {
    stdfs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    for (const auto& entry : stdfs::directory_iterator(path_, ignored)) {
      try {
        net::detach_pasta(entry.path());
      } catch (const std::exception&) {
      }
    }
    stdfs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  stdfs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  static inline int count_ = 0;
  stdfs::path path_;
};

TEST(Netns, OpenNetnsGivesTheOwningUserNamespace) {
  REQUIRE_USERNS();
  Sandbox sandbox;
  EXPECT_GE(sandbox.view().userns_fd, 0) << "the stand-in's namespace is owned by its own user namespace";
  // Our own namespace is owned by our own user namespace: nothing to join.
  const net::NetnsFds own = net::open_netns(::getpid());
  EXPECT_TRUE(own.net.valid());
  EXPECT_FALSE(own.userns.valid());
  EXPECT_THROW(net::open_netns(999999999), nshpc::SysError);
}

TEST(Netns, ListenInMakesASocketInsideTheNamespace) {
  REQUIRE_USERNS();
  Sandbox sandbox;
  UniqueFd listener = net::listen_in(sandbox.view(), "127.0.0.1", 0, 16);
  // The socket belongs to the sandbox's namespace (SIOCGSKNS: the namespace of a socket).
  UniqueFd its_ns(::ioctl(listener.get(), SIOCGSKNS));
  ASSERT_TRUE(its_ns.valid()) << std::strerror(errno);
  struct stat a{}, b{};
  ::fstat(its_ns.get(), &a);
  ::fstat(sandbox.view().net_fd, &b);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_TRUE(::fcntl(listener.get(), F_GETFD) & FD_CLOEXEC);

  Server server(std::move(listener));
  const CommandResult inside = connect_from(sandbox.view(), "127.0.0.1", server.port());
  EXPECT_EQ(inside.exit_code, 0) << inside.err;
  EXPECT_EQ(inside.out, "got:hello\n");
  EXPECT_EQ(server.accepted(), 1);

  // The step that failed, with its errno.
  try {
    net::listen_in(sandbox.view(), "10.233.250.2", 0, 16);
    ADD_FAILURE() << "bound an address the namespace does not have";
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), EADDRNOTAVAIL);
    EXPECT_NE(std::string(e.what()).find("bind 10.233.250.2:0 in the sandbox's network namespace"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(net::listen_in(sandbox.view(), "not-an-address", 3128, 16), nshpc::UsageError);
}

TEST(Netns, RunInReportsAFailedJoin) {
  UniqueFd not_a_namespace(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  try {
    net::run_in({not_a_namespace.get(), -1}, {"true"});
    ADD_FAILURE() << "joined /dev/null";
  } catch (const nshpc::SysError& e) {
    EXPECT_EQ(e.code(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("join the sandbox's network namespace"), std::string::npos) << e.what();
  }
}

TEST(Netns, BlockAddressesReplacesTheEarlierSet) {
  REQUIRE_USERNS();
  Sandbox sandbox;
  net::block_addresses(sandbox.view(), {"192.0.2.77", "fd00::77", "fe80::1%eth0"});
  EXPECT_EQ(prohibit_routes_in(sandbox.view()), (std::vector<std::string>{"192.0.2.77", "fd00::77", "fe80::1"}));
  net::block_addresses(sandbox.view(), {"192.0.2.77", "198.51.100.9"});  // idempotent for what stays
  EXPECT_EQ(prohibit_routes_in(sandbox.view()), (std::vector<std::string>{"192.0.2.77", "198.51.100.9"}));
  net::block_addresses(sandbox.view(), {});
  EXPECT_TRUE(prohibit_routes_in(sandbox.view()).empty());
  EXPECT_THROW(net::block_addresses(sandbox.view(), {"example.org"}), nshpc::UsageError);
}

TEST(Netns, HostAddressesLeaveLoopbackOut) {
  const std::vector<std::string> addresses = net::host_addresses();
  for (const auto& a : addresses) {
    EXPECT_NE(a.rfind("127.", 0), 0u) << a;
    EXPECT_NE(a, "::1");
    EXPECT_EQ(a.find('%'), std::string::npos) << a;
  }
  EXPECT_TRUE(std::is_sorted(addresses.begin(), addresses.end()));
}

TEST(Netns, NatUnavailableSaysWhatIsMissing) {
  struct stat tun{};
  const bool root_only = ::stat("/dev/net/tun", &tun) == 0 && tun.st_uid == 0 && (tun.st_mode & 0066) == 0;
  const bool have_pasta = nshpc::fs::find_program("pasta").has_value();
  // As a normal user (here, or a child of root's that drops to nobody) with /dev/net/tun 0600:
  // the answer names the fix.
  auto check_normal_user = [&](const std::string& said) {
    EXPECT_NE(said.find("/dev/net/tun is root-only here (0600)"), std::string::npos) << said;
    EXPECT_NE(said.find("chmod 0666 /dev/net/tun"), std::string::npos) << said;
  };
  if (::geteuid() != 0) {
    if (!have_pasta || !root_only) GTEST_SKIP() << "needs pasta and a root-only /dev/net/tun, or root";
    const auto why = net::nat_unavailable();
    ASSERT_TRUE(why.has_value());
    check_normal_user(*why);
    return;
  }
  // Root can open /dev/net/tun; pasta is installed by `make deps`.
  if (!have_pasta) {
    EXPECT_NE(net::nat_unavailable().value_or("").find("apt-get install passt"), std::string::npos);
    return;
  }
  EXPECT_EQ(net::nat_unavailable(), std::nullopt);
  if (!root_only) GTEST_SKIP() << "/dev/net/tun is not root-only here";
  nshpc::Pipe pipe = nshpc::make_pipe();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setresgid(65534, 65534, 65534) < 0 || ::setresuid(65534, 65534, 65534) < 0) ::_exit(2);
    const auto why = net::nat_unavailable();
    const std::string text = why ? *why : "nullopt";
    (void)!::write(pipe.write.get(), text.data(), text.size());
    ::_exit(0);
  }
  pipe.write.reset();
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe.read.get(), buf, sizeof buf)) > 0;) said.append(buf, static_cast<std::size_t>(n));
  int status = 0;
  ::waitpid(child, &status, 0);
  check_normal_user(said);
}

// NAT through pasta: the world is reached, the host is not, detach leaves loopback only.
TEST(Netns, PastaReachesTheWorldButNotTheHost) {
  REQUIRE_PASTA();
  World world;
  Sandbox sandbox;
  Server world_server(net::listen_in(world.view(), world.world_ip(), 0, 16));
  Server host_loopback(host_listener("127.0.0.1"));
  Server host_veth(host_listener(world.host_ip()));
  Server host_any(host_listener("::"));
  const TempDir dir;
  const stdfs::path pid_file = dir / "pasta-nat.pid";

  // No network before pasta: only loopback.
  EXPECT_EQ(links_in(sandbox.view()), std::vector<std::string>{"lo"});
  EXPECT_EQ(connect_from(sandbox.view(), world.world_ip(), world_server.port()).exit_code, 10);

  const net::PastaProcess pasta = net::attach_pasta(sandbox.view(), {pid_file});
  std::cout << "[ measured ] pasta attach took " << pasta.took.count() / 1000.0 << " ms\n";
  EXPECT_GT(pasta.pid, 1);
  EXPECT_EQ(links_in(sandbox.view()).size(), 2u) << "lo and pasta's interface, configured when attach returns";

  // The world server is reached through the host's routes.
  const CommandResult reached = connect_from(sandbox.view(), world.world_ip(), world_server.port());
  EXPECT_EQ(reached.exit_code, 0) << reached.err;
  EXPECT_EQ(reached.out, "got:hello\n");
  EXPECT_EQ(world_server.accepted(), 1);

  // 127.0.0.1 in the sandbox is its own loopback (no port forwarding, --no-map-gw).
  const CommandResult loopback = connect_from(sandbox.view(), "127.0.0.1", host_loopback.port());
  EXPECT_EQ(loopback.exit_code, 10) << loopback.out;
  EXPECT_EQ(host_loopback.accepted(), 0);

  // The host's own addresses are reached as the host until they are blocked...
  const CommandResult veth_open = connect_from(sandbox.view(), world.host_ip(), host_veth.port());
  EXPECT_EQ(veth_open.out, "got:hello\n") << "without blocking, pasta reaches the host itself: " << veth_open.err;
  const int before_block = host_veth.accepted() + host_any.accepted();

  const std::vector<std::string> host_addresses = net::host_addresses();
  ASSERT_NE(std::find(host_addresses.begin(), host_addresses.end(), world.host_ip()), host_addresses.end());
  net::block_addresses(sandbox.view(), host_addresses);
  const CommandResult veth_blocked = connect_from(sandbox.view(), world.host_ip(), host_veth.port());
  EXPECT_EQ(veth_blocked.exit_code, 10) << veth_blocked.out;
  EXPECT_NE(veth_blocked.err.find("Permission denied"), std::string::npos) << veth_blocked.err;  // prohibit: EACCES
  for (const auto& address : host_addresses) {
    if (address.rfind("fe80:", 0) == 0) continue;  // link-local needs a scope: not reachable by name
    const CommandResult r = connect_from(sandbox.view(), address, host_any.port());
    EXPECT_EQ(r.exit_code, 10) << address << ": " << r.out;
  }
  EXPECT_EQ(host_veth.accepted() + host_any.accepted(), before_block);
  // ...and the world stays reachable.
  EXPECT_EQ(connect_from(sandbox.view(), world.world_ip(), world_server.port()).out, "got:hello\n");

  // Detach: pasta gone, only loopback left, the world unreachable.
  EXPECT_TRUE(net::detach_pasta(pid_file));
  EXPECT_TRUE(nshpc::wait_pidfd(pasta.pidfd.get(), 0ms));
  EXPECT_FALSE(stdfs::exists(pid_file));
  EXPECT_EQ(links_in(sandbox.view()), std::vector<std::string>{"lo"});
  const CommandResult cut = connect_from(sandbox.view(), world.world_ip(), world_server.port());
  EXPECT_EQ(cut.exit_code, 10) << cut.out;
  EXPECT_FALSE(net::detach_pasta(pid_file)) << "nothing left to detach";
}

TEST(Netns, DestroySocketsCutsOutsideConnectionsOnly) {
  REQUIRE_PASTA();
  World world;
  Sandbox sandbox;
  Server world_server(net::listen_in(world.view(), world.world_ip(), 0, 16));
  Server inside_server(net::listen_in(sandbox.view(), "127.0.0.1", 0, 16));
  const TempDir dir;
  const stdfs::path pid_file = dir / "pasta-destroy.pid";
  net::attach_pasta(sandbox.view(), {pid_file});

  auto outside = std::async(std::launch::async, [&] { return hold_from(sandbox.view(), world.world_ip(), world_server.port()); });
  auto loopback = std::async(std::launch::async, [&] { return hold_from(sandbox.view(), "127.0.0.1", inside_server.port()); });
  ASSERT_TRUE(eventually([&] { return world_server.accepted() == 1 && inside_server.accepted() == 1; }, 10s));
  // Both established inside (the inside client may still be reading its greeting).
  ASSERT_TRUE(eventually([&] {
    const CommandResult r = net::run_in(sandbox.view(), {"ss", "-H", "-n", "-t", "state", "established"});
    return std::count(r.out.begin(), r.out.end(), '\n') >= 3;  // outside + both ends of the loopback one
  }, 10s));

  const int closed = net::destroy_sockets(sandbox.view());
  EXPECT_EQ(closed, 1);
  const auto cut_at = std::chrono::steady_clock::now();
  const CommandResult out = outside.get();
  // The inside program's read fails at once (not after its 15 s timeout).
  EXPECT_EQ(out.out, "first:hello\nsecond rc=1:\n") << out.err;
  EXPECT_LT(std::chrono::steady_clock::now() - cut_at, 5s);
  EXPECT_NE(out.err.find("Software caused connection abort"), std::string::npos) << out.err;  // ECONNABORTED

  inside_server.send_all("still\n");
  const CommandResult in = loopback.get();
  EXPECT_EQ(in.out, "first:hello\nsecond rc=0:still\n") << in.err;
  EXPECT_EQ(net::destroy_sockets(sandbox.view()), 0) << "nothing left to close";
  net::detach_pasta(pid_file);
}

// pasta daemonizes: it outlives the process that attached it. It does not end when the sandbox's
// last process ends (it watches only for a deleted namespace path, and holds the namespace):
// the caller detaches it.
TEST(Netns, PastaOutlivesItsAttacherAndStaysUntilDetached) {
  REQUIRE_PASTA();
  World world;
  Sandbox sandbox;
  const TempDir dir;
  const stdfs::path pid_file = dir / "pasta-life.pid";

  const pid_t attacher = ::fork();
  ASSERT_GE(attacher, 0);
  if (attacher == 0) {
    try {
      net::attach_pasta(sandbox.view(), {pid_file});
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(attacher, &status, 0), attacher);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  auto pasta = net::find_pasta(pid_file);
  ASSERT_TRUE(pasta.has_value()) << "pasta ended with the process that attached it";
  {
    Server world_server(net::listen_in(world.view(), world.world_ip(), 0, 16));
    EXPECT_EQ(connect_from(sandbox.view(), world.world_ip(), world_server.port()).out, "got:hello\n");
  }

  // The sandbox's last process ends: pasta stays (the measured behaviour of this pasta).
  sandbox.end();
  EXPECT_FALSE(nshpc::wait_pidfd(pasta->pidfd.get(), 1500ms)) << "pasta ended with the sandbox";
  // A pid file that names another process is not taken for pasta.
  {
    const stdfs::path other = dir / "other.pid";
    std::ofstream(other) << ::getpid() << "\n";
    EXPECT_FALSE(net::find_pasta(other).has_value());
    EXPECT_FALSE(net::detach_pasta(other));
    EXPECT_EQ(::kill(::getpid(), 0), 0);
  }
  EXPECT_THROW(net::attach_pasta(sandbox.view(), {pid_file}), nshpc::UsageError) << "attached twice";
  EXPECT_TRUE(net::detach_pasta(pid_file));
  EXPECT_TRUE(nshpc::wait_pidfd(pasta->pidfd.get(), 0ms));
}

// A child subreaper (the MCP server is one) adopts the daemonized pasta: attach says so, and
// detach reaps it (no zombie left).
TEST(Netns, ASubreaperAdoptsPastaAndDetachReapsIt) {
  REQUIRE_PASTA();
  Sandbox sandbox;
  const TempDir dir;
  const stdfs::path pid_file = dir / "pasta-adopted.pid";
  const pid_t server = ::fork();
  ASSERT_GE(server, 0);
  if (server == 0) {
    int code = 0;
    try {
      ::prctl(PR_SET_CHILD_SUBREAPER, 1);
      const net::PastaProcess p = net::attach_pasta(sandbox.view(), {pid_file});
      if (!p.adopted) code = 2;
      if (::getpgid(p.pid) < 0) code = 3;
      if (!net::detach_pasta(pid_file)) code = 4;
      siginfo_t info{};
      // Reaped: no child of ours is left, not even a zombie.
      if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG) == 0 || errno != ECHILD) code = 5;
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(server, &status, 0), server);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: threw, 2: not adopted, 3: gone early, 4: not detached, 5: left unreaped";
}

TEST(Netns, PastaAttachTime) {
  REQUIRE_PASTA();
  Sandbox sandbox;
  const TempDir dir;
  const stdfs::path pid_file = dir / "pasta-time.pid";
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    const net::PastaProcess p = net::attach_pasta(sandbox.view(), {pid_file});
    ms.push_back(p.took.count() / 1000.0);
    ASSERT_TRUE(net::detach_pasta(pid_file));
  }
  std::sort(ms.begin(), ms.end());
  std::cout << fmt::format("[ measured ] pasta attach over 5 runs: min {:.1f} ms, median {:.1f} ms, max {:.1f} ms\n",
                           ms.front(), ms[2], ms.back());
  EXPECT_LT(ms[2], 1000.0);
}

}  // namespace

namespace {

// One line from `fd` within `limit` (without its newline); "" at end of file or on timeout.
std::string read_line(int fd, std::chrono::milliseconds limit) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char c;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (::read(fd, &c, 1) != 1) break;
    if (c == '\n') return line;
    line += c;
  }
  return line;
}

// The real thing: a hardened bwrap sandbox (its own user namespace with --disable-userns, every
// capability dropped) gets NAT from outside by its descriptors; its own process reaches the world
// and cannot undo the block on the host's addresses.
TEST(Netns, PastaServesAHardenedBwrapSandbox) {
  REQUIRE_PASTA();
  if (!nshpc::fs::find_program("bwrap")) GTEST_SKIP() << "bwrap is not installed";
  World world;
  Server world_server(net::listen_in(world.view(), world.world_ip(), 0, 16));
  Server host_veth(host_listener(world.host_ip()));
  const TempDir dir;
  const stdfs::path pid_file = dir / "pasta-bwrap.pid";

  // Inside: wait for the network (connect fails at once while there is no route), read the
  // greeting; on "go", try to delete the block and to reach the host.
  const std::string script =
      "until exec 3<>\"/dev/tcp/$0/$1\"; do sleep 0.05; done 2>/dev/null; read -r l <&3; echo \"got:$l\"; "
      "read -r go; ip route del prohibit \"$2/32\" 2>&1 && echo 'block deleted' || echo 'delete refused'; "
      "(exec 4<>\"/dev/tcp/$2/$3\") 2>/dev/null && echo 'host reached' || echo 'host blocked'";
  nshpc::Pipe in = nshpc::make_pipe(), out = nshpc::make_pipe(), info = nshpc::make_pipe();
  nshpc::SpawnSpec spec;
  spec.program = "bwrap";
  spec.argv = {"bwrap", "--unshare-user", "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
               "--disable-userns", "--cap-drop", "ALL", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
               "--proc", "/proc", "--info-fd", "5", "--", "bash", "-c", script, world.world_ip(),
               std::to_string(world_server.port()), world.host_ip(), std::to_string(host_veth.port())};
  spec.fds = {{in.read.get(), 0}, {out.write.get(), 1}, {out.write.get(), 2}, {info.write.get(), 5}};
  nshpc::SpawnedChild bwrap = nshpc::spawn(spec);
  in.read.reset();
  out.write.reset();
  info.write.reset();
  std::string json;
  for (std::string l; !(l = read_line(info.read.get(), 5s)).empty();) json += l;
  const auto child = nshpc::parse_json_or_discarded(json);
  ASSERT_TRUE(child.contains("child-pid")) << json;
  const net::NetnsFds fds = net::open_netns(child["child-pid"].get<pid_t>());
  ASSERT_TRUE(fds.userns.valid());

  net::attach_pasta(fds.view(), {pid_file});
  net::block_addresses(fds.view(), net::host_addresses());
  EXPECT_EQ(read_line(out.read.get(), 10s), "got:hello");
  EXPECT_EQ(world_server.accepted(), 1);
  ASSERT_EQ(::write(in.write.get(), "go\n", 3), 3);
  EXPECT_EQ(read_line(out.read.get(), 10s), "RTNETLINK answers: Operation not permitted");  // no CAP_NET_ADMIN
  EXPECT_EQ(read_line(out.read.get(), 10s), "delete refused");
  EXPECT_EQ(read_line(out.read.get(), 10s), "host blocked");
  EXPECT_EQ(host_veth.accepted(), 0);
  EXPECT_TRUE(net::detach_pasta(pid_file));
  EXPECT_EQ(links_in(fds.view()), std::vector<std::string>{"lo"});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The modes as an agent's instance has them (the real ns-hpc, living instances).

namespace {

using nshpc::test::Env;
using nshpc::test::Result;

// A shell command inside the instance (its living sandbox).
Result inside(const Env& env, const std::string& id, const std::string& script) {
  return env.run({"bwrap", id, "--", "/bin/bash", "-c", script});
}

// bash's /dev/tcp: "open" when a connection to address:port is made within 3 s, else "closed".
std::string probe(const std::string& address, std::uint16_t port) {
  return fmt::format("(timeout 3 bash -c 'exec 3<>/dev/tcp/{}/{}' 2>/dev/null && echo open || echo closed)", address,
                     port);
}

}  // namespace

// nat: the outside world (a server in a test-made namespace behind a veth pair) is reached; the
// host's loopback and the host's own addresses are not. Switching to off cuts the open connection
// at once and keeps the instance's processes; switching back brings the network back.
TEST(NetworkModes, NatReachesTheWorldButNotTheHostAndOffCutsItWhileProcessesStay) {
  REQUIRE_PASTA();
  World world;
  Server world_server(net::listen_in(world.view(), world.world_ip(), 0, 16));
  Server host_loopback(host_listener("127.0.0.1"));
  Server host_veth(host_listener(world.host_ip()));
  Env env;
  env.create("natty", {"--network", "nat", "--persistent"});
  const std::string checks = probe(world.world_ip(), world_server.port()) + "; " +
                             probe("127.0.0.1", host_loopback.port()) + "; " +
                             probe(world.host_ip(), host_veth.port());
  Result r = inside(env, "natty", checks);
  EXPECT_EQ(r.out, "open\nclosed\nclosed\n") << r.err;
  EXPECT_EQ(host_loopback.accepted(), 0);
  EXPECT_EQ(host_veth.accepted(), 0);

  // A connection held open by a background process, and a process that only sleeps.
  r = inside(env, "natty",
             fmt::format("sleep 600 >/dev/null 2>&1 & (exec 3<>/dev/tcp/{}/{}; while read -r -u 3 line; do :; done; "
                         "echo cut > /workspace/cut.txt) >/dev/null 2>&1 &",
                         world.world_ip(), world_server.port()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(eventually([&] { return world_server.accepted() >= 2; }, 5s));
  r = env.run({"instance", "update", "natty", "--network", "off"});
  EXPECT_NE(r.out.find("applied to the running sandbox"), std::string::npos) << r.out << r.err;
  EXPECT_TRUE(eventually([&] { return stdfs::exists(env.instances() / "natty/workspace/cut.txt"); }, 5s))
      << "the open connection was not cut";
  r = inside(env, "natty", "pgrep -x sleep | wc -l; ip -o link | wc -l; " + probe(world.world_ip(), world_server.port()));
  EXPECT_EQ(r.out, "2\n1\nclosed\n") << r.err;  // the living sandbox's own sleep and ours; loopback only
  EXPECT_EQ(env.run({"instance", "update", "natty", "--network", "nat"}).exit_code, 0);
  EXPECT_EQ(inside(env, "natty", probe(world.world_ip(), world_server.port())).out, "open\n");
  EXPECT_EQ(env.run({"instance", "stop", "natty"}).exit_code, 0);
  const std::string pasta_of_natty = (env.instances() / "natty/status/network.pasta.pid").string();
  EXPECT_TRUE(eventually([&] { return nshpc::run_command({"pgrep", "-f", pasta_of_natty}).exit_code == 1; }, 5s))
      << "pasta outlived the stopped instance";
  // A sandbox that ends without any server (an idle stop, its init killed): pasta ends with it.
  EXPECT_EQ(inside(env, "natty", probe(world.world_ip(), world_server.port())).out, "open\n");
  ASSERT_EQ(nshpc::run_command({"pgrep", "-f", pasta_of_natty}).exit_code, 0);
  const std::string status = nshpc::test::read_text(env.instances() / "natty/status/sandbox.status");
  const auto at = status.find("\"child-pid\": ");
  ASSERT_NE(at, std::string::npos) << status;
  ::kill(static_cast<pid_t>(std::atoi(status.c_str() + at + 13)), SIGKILL);
  EXPECT_TRUE(eventually([&] { return nshpc::run_command({"pgrep", "-f", pasta_of_natty}).exit_code == 1; }, 10s))
      << "pasta outlived its sandbox";
}

// filtered: only the allow list, through the proxy (names pinned to a loopback test server); an
// unlisted name, a listed name that resolves to an address not listed (the host's loopback: the
// ns-hpc server's port would be one), and a program that ignores the proxy variables all fail;
// refusals are audited. Works as a normal user too (no /dev/net/tun needed).
TEST(NetworkModes, FilteredReachesOnlyTheAllowListAndSwitchesAtOnce) {
  REQUIRE_USERNS();
  Server allowed(host_listener("127.0.0.1"));
  Server forbidden(host_listener("127.0.0.1"));
  const std::string a = std::to_string(allowed.port());
  const std::string f = std::to_string(forbidden.port());
  Env env("[network]\nallow = [\"allowed.test:" + a + "\", \"127.0.0.1:" + a + "\", \"pinned.test:" + f +
          "\"]\nresolve = [\"allowed.test=127.0.0.1\", \"pinned.test=127.0.0.1\"]\n[audit]\nmax_size = 5\nkeep = 2\n");
  env.create("filt", {"--network", "filtered", "--persistent"});
  const std::string curl = "curl -s -m 5 -o /dev/null -w '%{http_code}\\n' ";
  Result r = inside(env, "filt",
                    "curl -s -m 5 -p http://allowed.test:" + a + "/ -o /dev/null -w '%{http_code}\\n' || true; " +
                        curl + "http://unlisted.test/ ; " + curl + "http://pinned.test:" + f + "/ ; " +
                        probe("127.0.0.1", allowed.port()));
  // CONNECT to the allowed name succeeds (the test server speaks no HTTP: curl's code is 000
  // after the tunnel was made, and the server saw the connection); the others are refused.
  EXPECT_EQ(r.out.substr(r.out.find('\n') + 1), "403\n403\nclosed\n") << r.out << r.err;
  EXPECT_EQ(allowed.accepted(), 1);
  EXPECT_EQ(forbidden.accepted(), 0);
  const std::string audit = nshpc::test::read_text(env.instances() / "filt/audit.log");
  EXPECT_NE(audit.find("\"network.denied\""), std::string::npos) << audit;
  EXPECT_NE(audit.find("unlisted.test"), std::string::npos);
  // The proxy rotates the instance's log as [audit] says, as the server does.
  const std::string proxy_pid = nshpc::test::read_text(env.instances() / "filt/status/network.proxy.pid");
  std::string proxy_args = nshpc::test::read_text(fmt::format("/proc/{}/cmdline", std::atoi(proxy_pid.c_str())));
  std::replace(proxy_args.begin(), proxy_args.end(), '\0', ' ');
  EXPECT_NE(proxy_args.find("--audit-rotation 5242880,2"), std::string::npos) << proxy_args;

  // Off at once: the proxy refuses everything; processes stay. Back to filtered: allowed again.
  // A background process that shows it runs (a normal user's later commands may not see it in ps).
  const stdfs::path alive = env.instances() / "filt/workspace/alive";
  auto beating = [&] {
    std::error_code ec;
    const auto before = stdfs::last_write_time(alive, ec);
    return !ec && eventually([&] { return stdfs::last_write_time(alive, ec) != before; }, 3s);
  };
  ASSERT_EQ(inside(env, "filt", "(while :; do touch alive; sleep 0.1; done) >/dev/null 2>&1 &").exit_code, 0);
  ASSERT_TRUE(eventually([&] { return stdfs::exists(alive); }, 5s));
  r = env.run({"instance", "update", "filt", "--network", "off"});
  EXPECT_NE(r.out.find("applied to the running sandbox"), std::string::npos) << r.out << r.err;
  EXPECT_TRUE(beating()) << "the instance's process ended with the switch";
  r = inside(env, "filt", "env | grep -ci '^http_proxy=' || true");
  EXPECT_EQ(r.out, "0\n") << r.err;  // off: no proxy variables for new commands
  ASSERT_EQ(env.run({"instance", "update", "filt", "--network", "filtered"}).exit_code, 0);
  r = inside(env, "filt", "curl -s -m 5 -p http://allowed.test:" + a + "/ -o /dev/null || true");
  EXPECT_TRUE(eventually([&] { return allowed.accepted() == 2; }, 5s));
  // To host: a restart, said so; its processes end.
  r = env.run({"instance", "update", "filt", "--network", "host"});
  EXPECT_NE(r.out.find("restarted"), std::string::npos) << r.out << r.err;
  EXPECT_FALSE(beating()) << "the instance's process outlived the restart";
}

// A host address that appears while a nat instance runs is blocked inside within moments (the
// watcher follows the host's addresses); one that goes is unblocked.
TEST(NetworkModes, AHostAddressAddedWhileANatInstanceRunsIsBlockedToo) {
  REQUIRE_PASTA();
  const std::string link = fmt::format("nshpcd{}", ::getpid() % 100000);
  const std::string address = fmt::format("10.234.{}.1", ::getpid() % 250);
  Env env;
  env.create("natwatch", {"--network", "nat", "--persistent"});
  ASSERT_EQ(inside(env, "natwatch", "true").exit_code, 0);
  struct Link {
    std::string name;
    ~Link() { nshpc::run_command({"ip", "link", "del", name}); }
  } added{link};
  host({"ip", "link", "add", link, "type", "veth", "peer", "name", link + "p"});
  host({"ip", "addr", "add", address + "/32", "dev", link});
  host({"ip", "link", "set", link, "up"});
  Server on_new_address(host_listener(address));
  auto blocked = [&] { return inside(env, "natwatch", "ip route show type prohibit").out; };
  EXPECT_TRUE(eventually([&] { return blocked().find(address) != std::string::npos; }, 5s)) << blocked();
  EXPECT_EQ(inside(env, "natwatch", probe(address, on_new_address.port())).out, "closed\n");
  EXPECT_EQ(on_new_address.accepted(), 0);
  host({"ip", "link", "del", link});
  EXPECT_TRUE(eventually([&] { return blocked().find(address) == std::string::npos; }, 5s)) << blocked();
}

// An instance whose commands each get a fresh sandbox: one network namespace is held for all of
// them (one pasta, attached once), served as the mode says, switched at once while a command
// holds a connection, and ended with the instance.
TEST(NetworkModes, FreshSandboxesJoinOneHeldNamespaceThatSwitchesAndEndsWithTheInstance) {
  REQUIRE_PASTA();
  World world;
  Server world_server(net::listen_in(world.view(), world.world_ip(), 0, 16));
  Server host_loopback(host_listener("127.0.0.1"));
  Env env;
  env.create("eph", {"--network", "nat", "--no-persistent"});
  const std::string world_probe = probe(world.world_ip(), world_server.port());
  Result r = inside(env, "eph", world_probe + "; " + probe("127.0.0.1", host_loopback.port()) + "; readlink /proc/self/ns/net");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string first_ns = r.out.substr(r.out.rfind("net:"));
  EXPECT_EQ(r.out, "open\nclosed\n" + first_ns) << r.err;
  r = inside(env, "eph", "readlink /proc/self/ns/net; ip -o link | wc -l");
  EXPECT_EQ(r.out, first_ns + "2\n") << "the second command did not join the held namespace: " << r.err;
  const std::string eph_pasta = "^[^ ]*pasta .*" + (env.instances() / "eph/status").string() + "/network-";
  EXPECT_EQ(nshpc::run_command({"pgrep", "-c", "-f", eph_pasta}).out, "1\n");

  // A command holding a connection; the switch to off cuts it at once and the command goes on.
  auto held = std::async(std::launch::async, [&] {
    return inside(env, "eph",
                  fmt::format("exec 3<>/dev/tcp/{}/{}; while read -r -u 3 line; do :; done; echo cut",
                              world.world_ip(), world_server.port()));
  });
  ASSERT_TRUE(eventually([&] { return world_server.accepted() >= 2; }, 10s));
  r = env.run({"instance", "update", "eph", "--network", "off"});
  EXPECT_NE(r.out.find("applied to the running sandbox"), std::string::npos) << r.out << r.err;
  ASSERT_EQ(held.wait_for(10s), std::future_status::ready) << "the open connection was not cut";
  EXPECT_EQ(held.get().out, "cut\n");
  EXPECT_EQ(nshpc::run_command({"pgrep", "-c", "-f", eph_pasta}).out, "0\n");
  r = inside(env, "eph", world_probe + "; ip -o link | wc -l");
  EXPECT_EQ(r.out, "closed\n1\n") << r.err;
  ASSERT_EQ(env.run({"instance", "update", "eph", "--network", "nat"}).exit_code, 0);
  EXPECT_EQ(inside(env, "eph", world_probe).out, "open\n");

  // To host: the held namespace goes; the commands share the host's network.
  r = env.run({"instance", "update", "eph", "--network", "host"});
  EXPECT_NE(r.out.find("applied to the running sandbox"), std::string::npos) << r.out << r.err;
  EXPECT_TRUE(eventually([&] { return nshpc::run_command({"pgrep", "-c", "-f", eph_pasta}).out == "0\n"; }, 5s));
  EXPECT_EQ(inside(env, "eph", probe("127.0.0.1", host_loopback.port())).out, "open\n");
  // Deleted: nothing of its network is left.
  ASSERT_EQ(env.run({"instance", "update", "eph", "--network", "nat"}).exit_code, 0);
  EXPECT_EQ(inside(env, "eph", world_probe).out, "open\n");
  const std::string holder = (env.instances() / "eph/status").string() + "/network-";
  EXPECT_EQ(nshpc::run_command({"pgrep", "-c", "-f", "__net-hold .*" + holder}).out, "1\n");
  ASSERT_EQ(env.run({"instance", "delete", "eph", "--force"}).exit_code, 0);
  EXPECT_TRUE(eventually([&] { return nshpc::run_command({"pgrep", "-f", holder}).exit_code == 1; }, 5s))
      << "the holder or pasta outlived the deleted instance";
}

// The same for filtered, which a normal user has too: a fresh sandbox per command reaches the
// allow list through the held namespace's proxy, and nothing else.
TEST(NetworkModes, FreshSandboxesOfAFilteredInstanceGoThroughItsProxy) {
  REQUIRE_USERNS();
  Server allowed(host_listener("127.0.0.1"));
  const std::string a = std::to_string(allowed.port());
  Server extra(host_listener("127.0.0.1"));
  const std::string x = std::to_string(extra.port());
  Server own(host_listener("127.0.0.1"));
  const std::string o = std::to_string(own.port());
  // The server's configuration lists extra's address (a service of the host given on purpose),
  // not its name; the instance adds the name.
  Env env("[network]\nallow = [\"allowed.test:" + a + "\", \"127.0.0.1:" + a + "\", \"127.0.0.1:" + x +
          "\"]\nresolve = [\"allowed.test=127.0.0.1\", \"extra.test=127.0.0.1\"]\n");
  // The instance's own additions to the allow list: checked, applied, replaced at once.
  Result bad = env.run({"instance", "create", "bad", "--network", "filtered", "--allow", "exa mple.org"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("'exa mple.org'"), std::string::npos) << bad.err;
  env.create("ephf", {"--network", "filtered", "--no-persistent", "--allow", "extra.test:" + x, "--allow",
                      "127.0.0.1:" + o});
  const std::string via_extra = "curl -s -m 5 http://extra.test:" + x + "/ -o /dev/null -w '%{http_code}\\n' ";
  EXPECT_EQ(inside(env, "ephf", via_extra + "|| true").out, "000\n");  // the tunnel was made
  EXPECT_EQ(extra.accepted(), 1);
  // An address of the host that only the instance lists (as an agent may) stays out of reach.
  const std::string via_proxy = "curl --noproxy '' -s -m 5 -o /dev/null -w '%{http_code}\\n' ";
  EXPECT_EQ(inside(env, "ephf", via_proxy + "http://127.0.0.1:" + o + "/ || true").out, "403\n");
  EXPECT_EQ(own.accepted(), 0);
  Result cleared = env.run({"instance", "update", "ephf", "--allow", ""});
  EXPECT_NE(cleared.out.find("applied"), std::string::npos) << cleared.out << cleared.err;
  EXPECT_EQ(inside(env, "ephf", via_extra + "|| true").out, "403\n");
  EXPECT_EQ(extra.accepted(), 1);
  const std::string curl = "curl -s -m 5 -o /dev/null -w '%{http_code}\\n' ";
  Result r = inside(env, "ephf",
                    "curl -s -m 5 -p http://allowed.test:" + a + "/ -o /dev/null || true; " + curl +
                        "http://unlisted.test/ ; " + probe("127.0.0.1", allowed.port()));
  EXPECT_EQ(r.out, "403\nclosed\n") << r.err;
  EXPECT_EQ(allowed.accepted(), 1);
  r = inside(env, "ephf", curl + "http://unlisted.test/");
  EXPECT_EQ(r.out, "403\n") << r.err;
  const std::string audit = nshpc::test::read_text(env.instances() / "ephf/audit.log");
  EXPECT_NE(audit.find("unlisted.test"), std::string::npos) << audit;
  ASSERT_EQ(env.run({"instance", "delete", "ephf", "--force"}).exit_code, 0);
  const std::string holder = (env.instances() / "ephf/status").string() + "/network-";
  EXPECT_TRUE(eventually([&] { return nshpc::run_command({"pgrep", "-f", holder}).exit_code == 1; }, 5s))
      << "the holder or the proxy outlived the deleted instance";
}

// A client of the host's 127.0.0.1:port: sends "ping\n", returns what came back (the greeting and
// the echo) until the server closes or 3 s pass; "" when the connection is refused.
std::string talk_to(std::uint16_t port) {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return "";
  (void)!::send(s.get(), "ping\n", 5, MSG_NOSIGNAL);
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (got.size() < 23 && std::chrono::steady_clock::now() < deadline) {
    pollfd p{s.get(), POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(s.get(), buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  return got;
}

std::uint16_t host_port_of(const Result& r) {
  const auto json = nshpc::parse_json(r.out);
  return json.empty() ? 0 : json.at(0).at("host_port").get<std::uint16_t>();
}

// expose_port: a server inside an instance with a network of its own (off, nat, filtered) is
// reached from the host's loopback, through a sandbox restart (the same host port), and no
// longer once closed or the instance is gone; an instance on the host's network is told why not.
TEST(NetworkModes, ExposedPortsReachAServerInsideAndGoWithTheInstance) {
  REQUIRE_USERNS();
  Env env;
  for (const char* persistence : {"--persistent", "--no-persistent"}) {
    SCOPED_TRACE(persistence);
    const std::string id = persistence == std::string("--persistent") ? "web" : "webeph";
    env.create(id, {"--network", "off", persistence});
    env.install_probe(id);
    std::string job;
    Result r = env.run({"instance", "expose", id, "8000", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::uint16_t host_port = host_port_of(r);
    ASSERT_NE(host_port, 0) << r.out;
    EXPECT_EQ(talk_to(host_port), "") << "nothing listens inside yet: the connection is closed";
    // The server: a background process of a living instance, or a job of the other kind.
    if (id == "web")
      ASSERT_EQ(inside(env, id, "./probe serve 8000 >/dev/null 2>&1 &").exit_code, 0);
    else
      job = nshpc::parse_json(env.run({"instance", "run", id, "--timeout", "0", "--json", "--", "./probe", "serve", "8000"}).out)
                .at("job_id");  // a job left running
    EXPECT_TRUE(eventually([&] { return talk_to(host_port) == "hello from inside\nping\n"; }, 10s))
        << talk_to(host_port);
    // The sandbox's own loopback is not the host's: the port is not simply shared.
    EXPECT_EQ(inside(env, id, probe("127.0.0.1", host_port)).out, "closed\n");
    const std::string audit = nshpc::test::read_text(env.instances() / id / "audit.log");
    EXPECT_NE(audit.find("\"network.port_exposed\""), std::string::npos) << audit;
    if (id == "web") {
      // A restart ends the server and the forward; the forward comes back with the sandbox, on the
      // same port.
      ASSERT_EQ(env.run({"instance", "restart", id}).exit_code, 0);
      ASSERT_EQ(inside(env, id, "./probe serve 8000 >/dev/null 2>&1 &").exit_code, 0);
      EXPECT_TRUE(eventually([&] { return talk_to(host_port) == "hello from inside\nping\n"; }, 10s));
    }
    r = env.run({"instance", "expose", id, "8000", "--close"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(eventually([&] { return talk_to(host_port).empty(); }, 5s)) << "the forward outlived --close";
    EXPECT_EQ(env.run({"instance", "expose", id, "--json"}).out, "[]\n");
    ASSERT_EQ(env.run({"instance", "expose", id, "8000", "--host-port", std::to_string(host_port)}).exit_code, 0);
    EXPECT_TRUE(eventually([&] { return !talk_to(host_port).empty(); }, 5s));
    if (!job.empty()) env.run({"instance", "cancel", id, job});
    ASSERT_EQ(env.run({"instance", "delete", id, "--force"}).exit_code, 0);
    EXPECT_TRUE(eventually([&] { return talk_to(host_port).empty(); }, 5s)) << "the forward outlived the instance";
  }
  env.create("shared", {"--network", "host"});
  Result r = env.run({"instance", "expose", "shared", "8000"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("shares the host's network"), std::string::npos) << r.err;
}

// The uid a process runs as (the real one, from /proc/PID/status); -1 when it is gone.
long uid_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Uid:", 0) == 0) return std::atol(line.c_str() + 4);
  return -1;
}

// expose_port takes host ports from [network] expose_port_range only (default 40000-40999): one
// outside it (a privileged one too) is refused naming the range, 0 gives a free one in it; the
// forwarder is never root (the sandbox's uid when the server is root), so it could not take a
// privileged port even if asked.
TEST(NetworkModes, ExposedHostPortsComeFromTheRangeAndTheForwarderIsNotRoot) {
  REQUIRE_USERNS();
  Env env;
  env.create("ranged", {"--network", "off", "--persistent"});
  for (const char* outside : {"81", "39999", "41000", "8000"}) {
    const Result r = env.run({"instance", "expose", "ranged", "8000", "--host-port", outside});
    EXPECT_NE(r.exit_code, 0) << outside;
    EXPECT_NE(r.err.find(fmt::format("host port {} is outside the ports exposed ports may take here, 40000-40999 "
                                     "([network] expose_port_range)",
                                     outside)),
              std::string::npos)
        << r.err;
  }
  EXPECT_EQ(talk_to(81), "");
  const Result r = env.run({"instance", "expose", "ranged", "8000", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::uint16_t host_port = host_port_of(r);
  EXPECT_GE(host_port, 40000);
  EXPECT_LE(host_port, 40999);
  const std::string record = nshpc::test::read_text(env.instances() / "ranged/status/network.forward.8000.pid");
  const pid_t forwarder = static_cast<pid_t>(std::atol(record.c_str()));
  ASSERT_GT(forwarder, 1) << record;
  if (::geteuid() == 0)
    EXPECT_EQ(uid_of(forwarder), 65534) << "the forwarder of a root server runs as the sandbox's uid";
  else
    EXPECT_EQ(uid_of(forwarder), static_cast<long>(::geteuid()));
  // The forward works as that user: a server inside is reached.
  env.install_probe("ranged");
  ASSERT_EQ(inside(env, "ranged", "./probe serve 8000 >/dev/null 2>&1 &").exit_code, 0);
  EXPECT_TRUE(eventually([&] { return talk_to(host_port) == "hello from inside\nping\n"; }, 10s)) << talk_to(host_port);
  ASSERT_EQ(env.run({"instance", "delete", "ranged", "--force"}).exit_code, 0);
}

// A range of its own, and never the server's port: with [server] port inside the range, 0 skips it
// and asking for it is refused.
TEST(NetworkModes, TheServersOwnPortIsNeverExposed) {
  REQUIRE_USERNS();
  // Two ports: the server's, and one that is free now.
  std::uint16_t free = 0;
  for (std::uint16_t p = 40990; p < 41000 && free == 0; ++p) {
    UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(p);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) free = p;
  }
  if (free == 0) GTEST_SKIP() << "no free port in 40990-40999";
  const std::uint16_t server = free == 40999 ? 40998 : free + 1;
  const std::uint16_t first = std::min(free, server), last = std::max(free, server);
  Env env(fmt::format("[server]\nport = {}\n[network]\nexpose_port_range = \"{}-{}\"\n", server, first, last));
  env.create("own", {"--network", "off", "--persistent"});
  Result r = env.run({"instance", "expose", "own", "8000", "--host-port", std::to_string(server)});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("is the ns-hpc server's own HTTP port ([server] port)"), std::string::npos) << r.err;
  r = env.run({"instance", "expose", "own", "8000", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(host_port_of(r), free);
  // The range's other port is the server's: nothing left for another one.
  r = env.run({"instance", "expose", "own", "8001"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(fmt::format("[network] expose_port_range ({}-{}) has no port left for this instance", first,
                                   last)),
            std::string::npos)
      << r.err;
  ASSERT_EQ(env.run({"instance", "delete", "own", "--force"}).exit_code, 0);
}

// The forwarder's socket is bound as an unprivileged user: the kernel refuses it a privileged
// port whatever the caller is (root here binds it as nobody).
TEST(Netns, AForwardersSocketCannotTakeAPrivilegedPort) {
  const std::optional<nshpc::users::Identity> nobody =
      ::geteuid() == 0 ? std::optional<nshpc::users::Identity>(nshpc::users::Identity{65534, 65534}) : std::nullopt;
  // What the kernel calls privileged (Docker sets 0 in its containers: then no port is).
  const int unprivileged_start =
      std::atoi(nshpc::test::read_text("/proc/sys/net/ipv4/ip_unprivileged_port_start").c_str());
  if (unprivileged_start > 81) {
    try {
      net::listen_as(nobody, "127.0.0.1", {81});
      ADD_FAILURE() << "port 81 was bound";
    } catch (const nshpc::SysError& e) {
      EXPECT_EQ(e.code(), EACCES) << e.what();
      EXPECT_NE(std::string(e.what()).find("bind 127.0.0.1:81 on the host"), std::string::npos) << e.what();
    }
  } else {
    std::cout << "[ note ] net.ipv4.ip_unprivileged_port_start is " << unprivileged_start
              << ": port 81 is not privileged here (expose_port_range still keeps it out)\n";
  }
  // An unprivileged port is bound; a taken one makes it go on to the next.
  const UniqueFd first = net::listen_as(nobody, "127.0.0.1", {0});
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(first.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::uint16_t taken = ntohs(a.sin_port);
  const UniqueFd second = net::listen_as(nobody, "127.0.0.1", {taken, 0});
  ASSERT_EQ(::getsockname(second.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  EXPECT_NE(ntohs(a.sin_port), taken);
}

// The held namespace stays while a command is in it and ends after [namespace] idle_stop without
// one; the next command makes a new one.
TEST(NetworkModes, AHeldNamespaceEndsWhenIdleAndComesBackWithTheNextCommand) {
  REQUIRE_USERNS();
  Env env("idle_stop = 2\n");
  env.create("idler", {"--network", "filtered", "--no-persistent"});
  const std::string holder = "__net-hold .*" + (env.instances() / "idler/status").string() + "/network-";
  auto holders = [&] { return nshpc::run_command({"pgrep", "-c", "-f", holder}).out; };
  auto busy = std::async(std::launch::async, [&] { return inside(env, "idler", "sleep 6; echo done"); });
  ASSERT_TRUE(eventually([&] { return holders() == "1\n"; }, 5s));
  std::this_thread::sleep_for(4500ms);  // past idle_stop, with the command still in it
  EXPECT_EQ(holders(), "1\n") << "the holder ended under a running command";
  EXPECT_EQ(busy.get().out, "done\n");
  EXPECT_TRUE(eventually([&] { return holders() == "0\n"; }, 10s)) << "the holder outlived idle_stop";
  EXPECT_EQ(inside(env, "idler", "env | grep -c '^http_proxy='").out, "1\n");
  EXPECT_EQ(holders(), "1\n");
}

// What cannot be served is refused with the reason, never left half-working.
TEST(NetworkModes, ModesThatCannotBeServedAreRefusedWithTheReason) {
  Env env;
  if (auto why = net::nat_unavailable()) {
    Result r = env.run({"instance", "create", "nonat", "--network", "nat", "--persistent"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("network 'nat' cannot work here"), std::string::npos) << r.err;
    r = env.run({"instance", "create", "nonat2", "--network", "nat", "--no-persistent"});
    EXPECT_NE(r.exit_code, 0);
  }
}
