// The network proxy of the `filtered` mode (network/proxy.hpp), as the server runs it: the real
// binary as `ns-hpc __net-proxy` with a listening socket on descriptor 3, curl as the client, a
// test HTTP server as the origin. Names resolve through the policy's override (one test through
// a hosts file of its own); every address a test reaches is one of this host's own (loopback, or
// an address of its interfaces with a service listening on every address): nothing leaves it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "base/fs.hpp"
#include "base/pidfd.hpp"
#include "base/process.hpp"
#include "base/spawn.hpp"
#include "common/file_server.hpp"
#include "common/loopback.hpp"
#include "common/temp_dir.hpp"
#include "harness.hpp"
#include "network/netns.hpp"

namespace nshpc::test {
namespace {

using namespace std::chrono_literals;
using nshpc::tests::closed_within;
using nshpc::tests::connect_loopback;
using nshpc::tests::FileServer;
using nshpc::tests::read_some;
using nshpc::tests::send_all;
using nshpc::tests::TempDir;

// A socket listening on address:port (port 0: any free one; "0.0.0.0" or "::" for every address
// of the host, as a service that listens on all of them).
struct Listener {
  UniqueFd fd;
  std::uint16_t port = 0;
  explicit Listener(const std::string& address = "127.0.0.1", std::uint16_t wanted = 0) {
    sockaddr_storage storage{};
    auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
    socklen_t len = 0;
    if (::inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
      v4->sin_family = AF_INET;
      v4->sin_port = htons(wanted);
      len = sizeof *v4;
    } else if (::inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
      v6->sin6_family = AF_INET6;
      v6->sin6_port = htons(wanted);
      len = sizeof *v6;
    } else {
      throw std::runtime_error("not an address: " + address);
    }
    fd.reset(::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&storage), len) != 0 || ::listen(fd.get(), 512) != 0 ||
        ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&storage), &len) != 0)
      throw std::runtime_error("cannot listen on " + address);
    port = ntohs(storage.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
  }
  // Whether a connection is waiting to be accepted (one reached this address).
  bool reached() const {
    pollfd p{fd.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
  }
};

// This host's own addresses that a name could lead to (host_addresses(), link-local ones left
// out: they need a scope), IPv4 first.
std::vector<std::string> own_addresses() {
  std::vector<std::string> out;
  for (const std::string& a : nshpc::network::host_addresses())
    if (!a.starts_with("fe80:") && !a.starts_with("169.254.")) out.push_back(a);
  std::stable_partition(out.begin(), out.end(), [](const std::string& a) { return a.find(':') == std::string::npos; });
  return out;
}

std::string with_port(const std::string& address, std::uint16_t port) {
  return address.find(':') == std::string::npos ? fmt::format("{}:{}", address, port)
                                                 : fmt::format("[{}]:{}", address, port);
}

struct CurlResult {
  int exit_code = -1;
  std::string body;
  std::string code;     // %{http_code}
  std::string connect;  // %{http_connect}: the proxy's answer to CONNECT
};

// The proxy process with its files; SIGKILLed and reaped when the test ends (SpawnedChild).
class Proxy {
 public:
  // `wrapper`: a command that runs the proxy's argv (appended to it) in a setting of its own.
  explicit Proxy(const nlohmann::json& policy, int watch_pid = 0, std::vector<std::string> wrapper = {}) {
    write_policy(policy);
    std::vector<std::string> argv{binary(), "__net-proxy", "--policy", policy_file().string(), "--audit",
                                  audit_file().string()};
    if (watch_pid > 0) argv.insert(argv.end(), {"--watch-pid", std::to_string(watch_pid)});
    UniqueFd err(::open(stderr_file().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    SpawnSpec spec;
    if (!wrapper.empty()) argv.insert(argv.begin(), wrapper.begin(), wrapper.end());
    spec.program = argv.front();
    spec.argv = argv;
    spec.fds = {{listener_.fd.get(), 3}, {err.get(), 2}};
    child_ = spawn(spec);
  }

  std::uint16_t port() const { return listener_.port; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()); }
  SpawnedChild& child() { return child_; }
  fs::path policy_file() const { return dir_.path() / "policy.json"; }
  fs::path audit_file() const { return dir_.path() / "audit.jsonl"; }
  fs::path stderr_file() const { return dir_.path() / "stderr.txt"; }
  void write_policy(const nlohmann::json& policy) const { nshpc::fs::atomic_write(policy_file(), policy.dump(), 0600); }

  // curl through the proxy: an absolute-URI request, or (tunnel) CONNECT first.
  CurlResult curl(const std::string& target, bool tunnel = false) const {
    std::vector<std::string> argv{"curl", "-sS", "--noproxy", "", "-x", url(), "-m", "20", "-w",
                                  "\n%{http_code} %{http_connect}"};
    if (tunnel) argv.push_back("-p");
    argv.push_back(target);
    const CommandResult r = run_command(argv, "", 30s);
    CurlResult out;
    out.exit_code = r.exit_code;
    const auto nl = r.out.rfind('\n');
    out.body = r.out.substr(0, nl);
    std::istringstream tail(r.out.substr(nl + 1));
    tail >> out.code >> out.connect;
    return out;
  }

  // The audit lines of `event`.
  std::vector<nlohmann::json> audit(const std::string& event) const {
    std::vector<nlohmann::json> out;
    std::ifstream in(audit_file());
    for (std::string line; std::getline(in, line);) {
      const auto j = nshpc::parse_json_or_discarded(line);
      if (!j.is_discarded() && j.value("event", "") == event) out.push_back(j);
    }
    return out;
  }

  // Waits for the process to end; its wait status, or -1 when it is still running.
  int exit_status(std::chrono::milliseconds limit) {
    if (!wait_pidfd(child_.pidfd(), limit)) return -1;
    return child_.wait("the proxy");
  }

 private:
  TempDir dir_{"nshpc-proxy"};
  Listener listener_;
  SpawnedChild child_;
};

// Sends raw bytes to the proxy and returns everything it answers before it closes.
std::string raw_exchange(std::uint16_t port, const std::string& bytes) {
  const UniqueFd fd(connect_loopback(port));
  if (!fd) return "(no connection)";
  send_all(fd.get(), bytes);
  return read_some(fd.get(), 15s);
}

class ProxyTest : public ::testing::Test {
 protected:
  ProxyTest() {
    std::ofstream(files_.path() / "file") << kContent;
    std::string big(3 * 1024 * 1024, 'x');
    for (std::size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>('a' + (i / 4096) % 26);
    std::ofstream(files_.path() / "big", std::ios::binary) << big;
    big_ = big;
  }
  nlohmann::json allow_origin() const {
    const std::string port = std::to_string(origin_.port());
    return {{"mode", "filtered"},
            {"allow", nlohmann::json::array({"allowed.test:" + port, "127.0.0.1:" + port})},
            {"resolve", {{"allowed.test", nlohmann::json::array({"127.0.0.1"})},
                         {"other.test", nlohmann::json::array({"127.0.0.1"})}}}};
  }
  std::string origin_url(const std::string& host = "allowed.test") const {
    return "http://" + host + ":" + std::to_string(origin_.port()) + "/file";
  }

  static constexpr const char* kContent = "hello through the proxy";
  std::string big_;
  TempDir files_{"nshpc-proxy-files"};
  FileServer origin_{files_.path()};
};

TEST_F(ProxyTest, AllowedNameThroughAbsoluteUriRequest) {
  Proxy proxy(allow_origin());
  const CurlResult r = proxy.curl(origin_url());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.code, "200");
  EXPECT_EQ(r.body, kContent);
  EXPECT_EQ(origin_.requests(), 1);
  ASSERT_TRUE(eventually([&] { return !proxy.audit("network.allowed").empty(); }, 5s));
  const auto line = proxy.audit("network.allowed").front();
  EXPECT_EQ(line["actor"], "network");
  EXPECT_EQ(line["host"], "allowed.test");
  EXPECT_EQ(line["port"], origin_.port());
  EXPECT_EQ(line["address"], "127.0.0.1");
  EXPECT_GT(line["bytes_up"].get<int>(), 0);
  EXPECT_GT(line["bytes_down"].get<int>(), static_cast<int>(std::string(kContent).size()));
  EXPECT_TRUE(line.contains("duration_ms"));
}

TEST_F(ProxyTest, AllowedNameThroughConnect) {
  Proxy proxy(allow_origin());
  const CurlResult r = proxy.curl(origin_url(), true);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.connect, "200");
  EXPECT_EQ(r.code, "200");
  EXPECT_EQ(r.body, kContent);
  EXPECT_EQ(origin_.requests(), 1);
}

TEST_F(ProxyTest, RelaysLargeBodiesBothWays) {
  Proxy proxy(allow_origin());
  const std::string url = "http://allowed.test:" + std::to_string(origin_.port()) + "/big";
  const CurlResult get = proxy.curl(url);
  EXPECT_EQ(get.code, "200");
  EXPECT_TRUE(get.body == big_) << get.body.size();
  const CurlResult tunnel = proxy.curl(url, true);
  EXPECT_EQ(tunnel.code, "200");
  EXPECT_TRUE(tunnel.body == big_) << tunnel.body.size();
}

TEST_F(ProxyTest, BytesSentRightAfterConnectReachTheOrigin) {
  Listener origin;
  auto policy = allow_origin();
  policy["allow"].push_back("127.0.0.1:" + std::to_string(origin.port));
  Proxy proxy(policy);
  const UniqueFd client(connect_loopback(proxy.port()));
  ASSERT_TRUE(client);
  const std::string authority = "127.0.0.1:" + std::to_string(origin.port);
  ASSERT_TRUE(send_all(client.get(), "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\nearly bytes"));
  const UniqueFd upstream(::accept4(origin.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(upstream);
  EXPECT_EQ(read_some(upstream.get(), 5s, [](const std::string& s) { return s.size() >= 11; }), "early bytes");
  send_all(upstream.get(), "late bytes");
  EXPECT_EQ(read_some(client.get(), 5s, [](const std::string& s) { return s.ends_with("late bytes"); }),
            "HTTP/1.1 200 Connection established\r\n\r\nlate bytes");
}

TEST_F(ProxyTest, ForwardsOriginFormWithoutProxyHeaders) {
  // A raw origin that records the request it gets.
  Listener origin;
  auto policy = allow_origin();
  policy["allow"].push_back("allowed.test:" + std::to_string(origin.port));
  policy["allow"].push_back("127.0.0.1:" + std::to_string(origin.port));
  Proxy proxy(policy);
  const UniqueFd client_fd(connect_loopback(proxy.port()));
  const int client = client_fd.get();
  ASSERT_GE(client, 0);
  const std::string authority = "allowed.test:" + std::to_string(origin.port);
  ASSERT_TRUE(send_all(client, "POST http://" + authority + "/p?q=1 HTTP/1.1\r\nHost: wrong.test\r\n"
                               "Proxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\n"
                               "Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nContent-Length: 4\r\n\r\nbody"));
  UniqueFd upstream_fd(::accept4(origin.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  const int upstream = upstream_fd.get();
  ASSERT_GE(upstream, 0);
  const std::string got = read_some(upstream, 5s, [](const std::string& s) { return s.ends_with("\r\n\r\nbody"); });
  EXPECT_TRUE(got.starts_with("POST /p?q=1 HTTP/1.1\r\nHost: " + authority + "\r\n")) << got;
  EXPECT_EQ(got.find("Proxy-"), std::string::npos) << got;
  EXPECT_EQ(got.find("X-Hop"), std::string::npos) << got;
  EXPECT_EQ(got.find("wrong.test"), std::string::npos) << got;
  EXPECT_NE(got.find("Content-Length: 4\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close\r\n\r\nbody"), std::string::npos) << got;
  // The answer comes back under the proxy's own head: the origin's hop-by-hop headers go, and
  // the client's connection stays for its next request (it asked for keep-alive).
  send_all(upstream, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close, X-Origin-Hop\r\n"
                     "X-Origin-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: yes\r\n\r\nok");
  upstream_fd.reset();
  const std::string answer = read_some(client, 5s, [](const std::string& s) { return s.ends_with("ok"); });
  EXPECT_EQ(answer, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Kept: yes\r\n\r\nok");
  EXPECT_FALSE(closed_within(client, 300ms));
}

TEST_F(ProxyTest, UnlistedNameIsRefusedAndAudited) {
  Proxy proxy(allow_origin());
  const CurlResult r = proxy.curl(origin_url("other.test"));
  EXPECT_EQ(r.code, "403");
  EXPECT_EQ(r.body, "ns-hpc: other.test:" + std::to_string(origin_.port()) +
                        " is not in this instance's network allow list: add \"other.test:" +
                        std::to_string(origin_.port()) +
                        "\" to it with update_instance network_allow (the instance's whole list), or ask the "
                        "server's operator to add it to [network] allow in ns-hpc's config\n");
  const CurlResult t = proxy.curl(origin_url("other.test"), true);
  EXPECT_NE(t.exit_code, 0);
  EXPECT_EQ(t.connect, "403");
  EXPECT_EQ(origin_.requests(), 0);
  const auto denied = proxy.audit("network.denied");
  ASSERT_EQ(denied.size(), 2u);
  EXPECT_EQ(denied[0]["actor"], "network");
  EXPECT_EQ(denied[0]["host"], "other.test");
  EXPECT_EQ(denied[0]["port"], origin_.port());
  EXPECT_NE(denied[0]["reason"].get<std::string>().find("not in this instance's network allow list"), std::string::npos);
}

TEST_F(ProxyTest, ListedNameResolvingToAForbiddenAddressIsRefused) {
  // allowed.test is listed on another port of loopback, but that address is not.
  Listener other;
  Proxy proxy({{"mode", "filtered"},
               {"allow", nlohmann::json::array({"allowed.test:" + std::to_string(other.port),
                                                "127.0.0.1:" + std::to_string(origin_.port())})},
               {"resolve", {{"allowed.test", nlohmann::json::array({"127.0.0.1"})}}}});
  const std::string hp = "allowed.test:" + std::to_string(other.port);
  const CurlResult r = proxy.curl("http://" + hp + "/file");
  EXPECT_EQ(r.code, "403");
  EXPECT_EQ(r.body, "ns-hpc: " + hp +
                        " resolved to 127.0.0.1, a loopback address of this host, which is refused unless ns-hpc's own "
                        "configuration lists that address ([network] allow, e.g. 127.0.0.1:" +
                        std::to_string(other.port) + "); an instance's network_allow cannot open the host's addresses\n");
  const CurlResult t = proxy.curl("http://" + hp + "/file", true);
  EXPECT_EQ(t.connect, "403");
  // Nothing reached the address: no connection is waiting to be accepted.
  pollfd p{other.fd.get(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0);
  ASSERT_EQ(proxy.audit("network.denied").size(), 2u);
  EXPECT_NE(proxy.audit("network.denied")[0]["reason"].get<std::string>().find("resolved to 127.0.0.1"),
            std::string::npos);
}

TEST_F(ProxyTest, ModeOffRefusesEverything) {
  auto policy = allow_origin();
  policy["mode"] = "off";
  Proxy proxy(policy);
  const CurlResult r = proxy.curl(origin_url());
  EXPECT_EQ(r.code, "403");
  EXPECT_NE(r.body.find("network mode \"off\""), std::string::npos) << r.body;
  EXPECT_EQ(proxy.curl(origin_url(), true).connect, "403");
  EXPECT_EQ(proxy.curl("http://127.0.0.1:" + std::to_string(origin_.port()) + "/file").code, "403");
  EXPECT_EQ(origin_.requests(), 0);
}

TEST_F(ProxyTest, SighupSwitchesThePolicyAndClosesTunnelsItForbids) {
  Listener held;  // an origin that never answers: the tunnel stays open until someone closes it
  auto policy = allow_origin();
  policy["allow"].push_back("allowed.test:" + std::to_string(held.port));
  policy["allow"].push_back("127.0.0.1:" + std::to_string(held.port));
  Proxy proxy(policy);
  ASSERT_EQ(proxy.curl(origin_url()).code, "200");

  UniqueFd tunnel_fd(connect_loopback(proxy.port()));
  const int tunnel = tunnel_fd.get();
  ASSERT_GE(tunnel, 0);
  const std::string authority = "allowed.test:" + std::to_string(held.port);
  send_all(tunnel, "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n");
  const std::string established = read_some(tunnel, 5s, [](const std::string& s) { return s.ends_with("\r\n\r\n"); });
  ASSERT_EQ(established, "HTTP/1.1 200 Connection established\r\n\r\n");
  EXPECT_FALSE(closed_within(tunnel, 300ms));
  // A second tunnel, to the address itself, which the new policy still allows.
  UniqueFd kept_fd(connect_loopback(proxy.port()));
  const std::string address = "127.0.0.1:" + std::to_string(held.port);
  send_all(kept_fd.get(), "CONNECT " + address + " HTTP/1.1\r\nHost: " + address + "\r\n\r\n");
  ASSERT_EQ(read_some(kept_fd.get(), 5s, [](const std::string& s) { return s.ends_with("\r\n\r\n"); }),
            "HTTP/1.1 200 Connection established\r\n\r\n");

  // A policy without allowed.test (the addresses stay listed, the name does not).
  proxy.write_policy({{"mode", "filtered"},
                      {"allow", nlohmann::json::array({"127.0.0.1:" + std::to_string(origin_.port()), address})}});
  ASSERT_EQ(::kill(proxy.child().pid(), SIGHUP), 0);
  EXPECT_TRUE(closed_within(tunnel, 5s));
  EXPECT_FALSE(closed_within(kept_fd.get(), 300ms));
  kept_fd.reset();
  const CurlResult r = proxy.curl(origin_url());
  EXPECT_EQ(r.code, "403");
  EXPECT_NE(r.body.find("not in this instance's network allow list"), std::string::npos);
  // The address is still allowed by itself.
  EXPECT_EQ(proxy.curl("http://127.0.0.1:" + std::to_string(origin_.port()) + "/file").body, kContent);
  // The closed tunnel is audited as closed by the new policy, and as the connection it was.
  bool closed_line = false;
  for (const auto& line : proxy.audit("network.denied"))
    closed_line |= line["reason"].get<std::string>().find("closed by a new policy") != std::string::npos;
  EXPECT_TRUE(closed_line);
  // The first GET, the closed tunnel, the GET by address; the kept tunnel is only half-closed
  // (its origin neither answers nor closes), so not yet at its end.
  EXPECT_TRUE(eventually([&] { return proxy.audit("network.allowed").size() == 3; }, 5s));
  EXPECT_EQ(proxy.exit_status(0ms), -1);  // still serving
}

TEST_F(ProxyTest, BrokenPolicyOnSighupKeepsTheOldOne) {
  Proxy proxy(allow_origin());
  ASSERT_EQ(proxy.curl(origin_url()).code, "200");
  nshpc::fs::atomic_write(proxy.policy_file(), "{\"mode\": \"filtered\", \"allow\": [\"bad host\"]}", 0600);
  ASSERT_EQ(::kill(proxy.child().pid(), SIGHUP), 0);
  ASSERT_TRUE(eventually([&] { return read_text(proxy.stderr_file()).find("not reloaded") != std::string::npos; }, 5s));
  EXPECT_NE(read_text(proxy.stderr_file()).find("allow entry \"bad host\""), std::string::npos);
  EXPECT_EQ(proxy.curl(origin_url()).body, kContent);
}

TEST_F(ProxyTest, WhatIsNotAProxyRequestGets400) {
  Proxy proxy(allow_origin());
  const auto status_of = [](const std::string& answer) { return answer.substr(0, answer.find("\r\n")); };
  std::string a = raw_exchange(proxy.port(), std::string("\x16\x03\x01\x02\x00 garbage\r\n\r\n", 20));
  EXPECT_EQ(status_of(a), "HTTP/1.1 400 Bad Request") << a;
  a = raw_exchange(proxy.port(), "GET /file HTTP/1.1\r\nHost: allowed.test\r\n\r\n");
  EXPECT_EQ(status_of(a), "HTTP/1.1 400 Bad Request") << a;
  EXPECT_NE(a.find("this is a proxy"), std::string::npos) << a;
  a = raw_exchange(proxy.port(), "GET http://allowed.test:" + std::to_string(origin_.port()) +
                                     "/ HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
  EXPECT_EQ(status_of(a), "HTTP/1.1 400 Bad Request") << a;
  EXPECT_NE(a.find("larger than 16 KiB"), std::string::npos) << a;
  a = raw_exchange(proxy.port(), "CONNECT allowed.test HTTP/1.1\r\n\r\n");
  EXPECT_NE(a.find("needs a port"), std::string::npos) << a;
  a = raw_exchange(proxy.port(), "GET http://user@allowed.test/ HTTP/1.1\r\n\r\n");
  EXPECT_NE(a.find("user info"), std::string::npos) << a;
  a = raw_exchange(proxy.port(), "GET http://127.1:" + std::to_string(origin_.port()) + "/ HTTP/1.1\r\n\r\n");
  EXPECT_NE(a.find("does not name a valid host"), std::string::npos) << a;
  EXPECT_EQ(origin_.requests(), 0);
}

TEST_F(ProxyTest, AHeadThatDoesNotCompleteGets400After10Seconds) {
  Proxy proxy(allow_origin());
  const UniqueFd fd(connect_loopback(proxy.port()));
  ASSERT_TRUE(fd);
  send_all(fd.get(), "GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n");
  const auto start = std::chrono::steady_clock::now();
  const std::string answer = read_some(fd.get(), 20s);
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 400 Bad Request")) << answer;
  EXPECT_NE(answer.find("no complete request head within 10 s"), std::string::npos) << answer;
  EXPECT_GE(waited, 9s);
  EXPECT_LE(waited, 15s);
}

TEST_F(ProxyTest, OverTheConnectionLimitGets503) {
  Proxy proxy(allow_origin());
  ASSERT_EQ(proxy.curl(origin_url()).code, "200");
  std::vector<UniqueFd> held;
  for (int i = 0; i < 256; ++i) {
    held.emplace_back(connect_loopback(proxy.port()));
    ASSERT_TRUE(held.back()) << i;
  }
  const UniqueFd extra(connect_loopback(proxy.port()));
  const std::string answer = read_some(extra.get(), 10s);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 503 Service Unavailable")) << answer;
  EXPECT_NE(answer.find("256 connections"), std::string::npos) << answer;
  // Once they are gone, it serves again.
  held.clear();
  EXPECT_TRUE(eventually([&] { return proxy.curl(origin_url()).code == "200"; }, 10s));
}

TEST_F(ProxyTest, DeniedLinesAreRateLimited) {
  Proxy proxy(allow_origin());
  for (int i = 0; i < 25; ++i) {
    const std::string a = raw_exchange(proxy.port(), "CONNECT other.test:443 HTTP/1.1\r\n\r\n");
    ASSERT_TRUE(a.starts_with("HTTP/1.1 403 Forbidden")) << a;
  }
  EXPECT_EQ(proxy.audit("network.denied").size(), 20u);
  // The window's count is written when it ends, or when the proxy stops.
  ASSERT_EQ(::kill(proxy.child().pid(), SIGTERM), 0);
  const int status = proxy.exit_status(5s);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  const auto suppressed = proxy.audit("network.denied_suppressed");
  ASSERT_EQ(suppressed.size(), 1u);
  EXPECT_EQ(suppressed[0]["count"], 5);
}

TEST_F(ProxyTest, EndsWhenTheWatchedProcessEnds) {
  SpawnSpec spec;
  spec.program = "sleep";
  spec.argv = {"sleep", "60"};
  SpawnedChild watched = spawn(spec);
  Proxy proxy(allow_origin(), watched.pid());
  ASSERT_EQ(proxy.curl(origin_url()).body, kContent);
  EXPECT_EQ(proxy.exit_status(200ms), -1);
  ::kill(watched.pid(), SIGTERM);
  watched.wait("sleep");
  const int status = proxy.exit_status(5s);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// The host itself is out of reach whatever name leads there: every address of its interfaces
// (this machine's own "public" one included), with a service listening on all of them, is
// refused for a listed name, with GET and CONNECT, and for an instance's own address entry; only
// the server's configuration can list one (which shows the service was reachable).
TEST_F(ProxyTest, TheHostsOwnAddressesAreRefusedWhateverNameLeadsThere) {
  const std::vector<std::string> own = own_addresses();
  if (own.empty()) GTEST_SKIP() << "this host has no address besides loopback and link-local ones";
  Listener service4("0.0.0.0");
  Listener service6("::");  // every IPv6 address (and IPv4 too, on another port)
  auto port_of = [&](const std::string& a) { return a.find(':') == std::string::npos ? service4.port : service6.port; };
  nlohmann::json allow = nlohmann::json::array(), instance_allow = nlohmann::json::array();
  nlohmann::json resolve = nlohmann::json::object();
  for (std::size_t i = 0; i < own.size(); ++i) {
    const std::string name = fmt::format("self{}.test", i);
    allow.push_back(fmt::format("{}:{}", name, port_of(own[i])));
    instance_allow.push_back(with_port(own[i], port_of(own[i])));
    resolve[name] = nlohmann::json::array({own[i]});
  }
  Proxy proxy({{"mode", "filtered"}, {"allow", allow}, {"instance_allow", instance_allow}, {"resolve", resolve}});
  for (std::size_t i = 0; i < own.size(); ++i) {
    SCOPED_TRACE(own[i]);
    const std::string hp = fmt::format("self{}.test:{}", i, port_of(own[i]));
    const CurlResult get = proxy.curl("http://" + hp + "/");
    EXPECT_EQ(get.code, "403");
    EXPECT_EQ(get.body, fmt::format("ns-hpc: {} resolved to {}, an address of this host itself, which is refused "
                                    "unless ns-hpc's own configuration lists that address ([network] allow, e.g. {}); "
                                    "an instance's network_allow cannot open the host's addresses\n",
                                    hp, own[i], with_port(own[i], port_of(own[i]))));
    EXPECT_EQ(proxy.curl("http://" + hp + "/", true).connect, "403");
    // The address itself, listed by the instance (as an agent may): refused too.
    const std::string literal = with_port(own[i], port_of(own[i]));
    const std::string a =
        raw_exchange(proxy.port(), "CONNECT " + literal + " HTTP/1.1\r\nHost: " + literal + "\r\n\r\n");
    EXPECT_TRUE(a.starts_with("HTTP/1.1 403 Forbidden")) << a;
    EXPECT_NE(a.find("an address of this host itself"), std::string::npos) << a;
  }
  EXPECT_FALSE(service4.reached());
  EXPECT_FALSE(service6.reached());
  const auto denied = proxy.audit("network.denied");
  ASSERT_EQ(denied.size(), 3 * own.size());
  EXPECT_EQ(denied[0]["host"], "self0.test");
  EXPECT_NE(denied[0]["reason"].get<std::string>().find("an address of this host itself"), std::string::npos);

  // The server's configuration may list the address: then it is reached (the refusals above
  // were the proxy's, not an unreachable service).
  const std::string first = with_port(own[0], port_of(own[0]));
  Proxy configured({{"mode", "filtered"}, {"allow", nlohmann::json::array({first})}});
  const UniqueFd client(connect_loopback(configured.port()));
  ASSERT_TRUE(send_all(client.get(), "CONNECT " + first + " HTTP/1.1\r\nHost: " + first + "\r\n\r\n"));
  EXPECT_EQ(read_some(client.get(), 5s, [](const std::string& s) { return s.ends_with("\r\n\r\n"); }),
            "HTTP/1.1 200 Connection established\r\n\r\n");
  EXPECT_TRUE(eventually([&] { return (own[0].find(':') == std::string::npos ? service4 : service6).reached(); }, 5s));
}

// An address the host gets after the proxy started is refused as well (it follows the host's
// addresses): here a "public" one (TEST-NET-2) on a veth pair made for the test.
TEST_F(ProxyTest, AnAddressTheHostGetsLaterIsRefusedToo) {
  if (::geteuid() != 0) GTEST_SKIP() << "giving the host an address needs root";
  const std::string link = fmt::format("nshpcp{}", ::getpid() % 100000);
  const std::string address = fmt::format("198.51.100.{}", 1 + ::getpid() % 250);
  Listener service("0.0.0.0");
  const std::string hp = fmt::format("later.test:{}", service.port);
  Proxy proxy({{"mode", "filtered"},
               {"allow", nlohmann::json::array({hp})},
               {"resolve", {{"later.test", nlohmann::json::array({address})}}}});
  ASSERT_EQ(proxy.curl(origin_url("other.test")).code, "403");  // serving, with the addresses of its start
  struct Link {
    std::string name;
    ~Link() { run_command({"ip", "link", "del", name}); }
  } added{link};
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {"ip", "link", "add", link, "type", "veth", "peer", "name", link + "p"},
           {"ip", "addr", "add", address + "/32", "dev", link},
           {"ip", "link", "set", link, "up"}}) {
    const CommandResult r = run_command(argv);
    ASSERT_EQ(r.exit_code, 0) << describe_failure(argv, r);
  }
  const std::string a = raw_exchange(proxy.port(), "CONNECT " + hp + " HTTP/1.1\r\nHost: " + hp + "\r\n\r\n");
  EXPECT_TRUE(a.starts_with("HTTP/1.1 403 Forbidden")) << a;
  EXPECT_NE(a.find("resolved to " + address + ", an address of this host itself"), std::string::npos) << a;
  EXPECT_EQ(proxy.curl("http://" + hp + "/").code, "403");
  EXPECT_FALSE(service.reached());
}

// Requests sent one after the other on one connection (pipelined, or after an answer on a
// kept-alive connection) are each judged on their own: allowed ones are answered in order, a
// refused one gets its 403 and reaches nothing.
TEST_F(ProxyTest, EveryRequestOnAConnectionIsCheckedOnItsOwn) {
  Proxy proxy(allow_origin());
  const std::string p = std::to_string(origin_.port());
  const std::string ok = "HTTP/1.1 200 OK\r\nContent-Length: 23\r\n\r\n" + std::string(kContent);
  {
    const UniqueFd fd(connect_loopback(proxy.port()));
    ASSERT_TRUE(send_all(fd.get(), "GET http://allowed.test:" + p + "/file HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
                                   "GET http://127.0.0.1:" + p + "/file HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                                   "GET http://other.test:" + p + "/file HTTP/1.1\r\nHost: other.test\r\n\r\n"
                                   "GET http://allowed.test:" + p + "/file HTTP/1.1\r\nHost: allowed.test\r\n\r\n"));
    const std::string got = read_some(fd.get(), 10s);  // until the proxy closes, after the refusal
    ASSERT_TRUE(got.starts_with(ok + ok + "HTTP/1.1 403 Forbidden\r\n")) << got;
    EXPECT_TRUE(got.ends_with("ns-hpc: other.test:" + p + " is not in this instance's network allow list: add \"other.test:" +
                              p + "\" to it with update_instance network_allow (the instance's whole list), or ask the "
                              "server's operator to add it to [network] allow in ns-hpc's config\n"))
        << got;
  }
  EXPECT_EQ(origin_.requests(), 2);  // the one after the refusal was never sent
  // On a kept-alive connection, after an answer: the next request to a forbidden place is refused.
  {
    const UniqueFd fd(connect_loopback(proxy.port()));
    ASSERT_TRUE(send_all(fd.get(), "GET http://allowed.test:" + p + "/file HTTP/1.1\r\nHost: allowed.test\r\n\r\n"));
    EXPECT_EQ(read_some(fd.get(), 5s, [&](const std::string& s) { return s.size() >= ok.size(); }), ok);
    EXPECT_FALSE(closed_within(fd.get(), 200ms));
    ASSERT_TRUE(send_all(fd.get(), "GET http://other.test:" + p + "/file HTTP/1.1\r\nHost: other.test\r\n\r\n"));
    const std::string refused = read_some(fd.get(), 5s);
    EXPECT_TRUE(refused.starts_with("HTTP/1.1 403 Forbidden\r\n")) << refused;
  }
  EXPECT_EQ(origin_.requests(), 3);
  EXPECT_EQ(proxy.audit("network.denied").size(), 2u);
  EXPECT_TRUE(eventually([&] { return proxy.audit("network.allowed").size() == 3; }, 5s));
  // A client that asks to close gets the answer and the end of the connection.
  {
    const UniqueFd fd(connect_loopback(proxy.port()));
    ASSERT_TRUE(send_all(fd.get(), "GET http://allowed.test:" + p + "/file HTTP/1.1\r\nHost: allowed.test\r\n"
                                   "Connection: close\r\n\r\n"));
    EXPECT_EQ(read_some(fd.get(), 5s),
              "HTTP/1.1 200 OK\r\nContent-Length: 23\r\nConnection: close\r\n\r\n" + std::string(kContent));
  }
}

// A request's body goes to its origin as its framing says (chunked here, trailer and all), not a
// byte more: what follows it is the client's next request, judged on its own.
TEST_F(ProxyTest, ABodyEndsWhereItsFramingSaysAndTheNextRequestIsJudgedOnItsOwn) {
  Listener origin;
  auto policy = allow_origin();
  policy["allow"].push_back("allowed.test:" + std::to_string(origin.port));
  policy["allow"].push_back("127.0.0.1:" + std::to_string(origin.port));
  Proxy proxy(policy);
  const UniqueFd client(connect_loopback(proxy.port()));
  const std::string authority = "allowed.test:" + std::to_string(origin.port);
  const std::string body = "4\r\nbody\r\n0\r\nX-Trailer: t\r\n\r\n";
  ASSERT_TRUE(send_all(client.get(), "POST http://" + authority + "/up HTTP/1.1\r\nHost: " + authority +
                                         "\r\nTransfer-Encoding: chunked\r\n\r\n" + body +
                                         "GET http://other.test:" + std::to_string(origin.port) +
                                         "/ HTTP/1.1\r\nHost: other.test\r\n\r\n"));
  const UniqueFd upstream(::accept4(origin.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(upstream);
  const std::string got = read_some(upstream.get(), 5s, [&](const std::string& s) { return s.ends_with(body); });
  EXPECT_EQ(got, "POST /up HTTP/1.1\r\nHost: " + authority +
                     "\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + body);
  EXPECT_EQ(read_some(upstream.get(), 300ms), "") << "bytes after the body reached the origin";
  send_all(upstream.get(), "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n");
  const std::string answer = read_some(client.get(), 10s);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
                                 "HTTP/1.1 403 Forbidden\r\n"))
      << answer;
  EXPECT_FALSE(origin.reached());
}

// A TLS ClientHello, minimal but well-formed, naming `server` (SNI).
std::string client_hello(const std::string& server) {
  auto u16 = [](std::size_t n) { return std::string{static_cast<char>(n >> 8), static_cast<char>(n & 0xff)}; };
  const std::string name = std::string(1, '\0') + u16(server.size()) + server;  // host_name
  const std::string sni = u16(0) + u16(name.size() + 2) + u16(name.size()) + name;
  std::string hello = std::string("\x03\x03", 2) + std::string(32, '\x42') + std::string(1, '\0') + u16(2) +
                      std::string("\x13\x01", 2) + std::string("\x01\x00", 2) + u16(sni.size()) + sni;
  hello = std::string(1, '\x01') + std::string(1, '\0') + u16(hello.size()) + hello;
  return std::string("\x16\x03\x01", 3) + u16(hello.size()) + hello;
}

// Domain fronting: what a tunnel carries is not read, so a ClientHello naming another server
// (SNI) reaches only the address checked for the CONNECT target, and a CONNECT to a forbidden
// name is refused whatever server its ClientHello names.
TEST_F(ProxyTest, ATunnelGoesToTheCheckedAddressWhateverItsClientHelloNames) {
  Listener allowed;
  Listener fronted("127.0.0.2", allowed.port);  // where forbidden.test leads
  const std::string p = std::to_string(allowed.port);
  Proxy proxy({{"mode", "filtered"},
               {"allow", nlohmann::json::array({"allowed.test:" + p, "127.0.0.1:" + p})},
               {"resolve", {{"allowed.test", nlohmann::json::array({"127.0.0.1"})},
                            {"forbidden.test", nlohmann::json::array({"127.0.0.2"})}}}});
  const std::string hello = client_hello("forbidden.test");
  const UniqueFd client(connect_loopback(proxy.port()));
  ASSERT_TRUE(send_all(client.get(), "CONNECT allowed.test:" + p + " HTTP/1.1\r\nHost: allowed.test:" + p +
                                         "\r\n\r\n" + hello));
  const UniqueFd upstream(::accept4(allowed.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(upstream);
  EXPECT_EQ(read_some(upstream.get(), 5s, [&](const std::string& s) { return s.size() >= hello.size(); }), hello);
  EXPECT_EQ(read_some(client.get(), 5s, [](const std::string& s) { return s.ends_with("\r\n\r\n"); }),
            "HTTP/1.1 200 Connection established\r\n\r\n");
  for (const std::string& target : {"forbidden.test:" + p, "127.0.0.2:" + p}) {
    const std::string a = raw_exchange(proxy.port(), "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n" +
                                                         client_hello("allowed.test"));
    EXPECT_TRUE(a.starts_with("HTTP/1.1 403 Forbidden")) << a;
  }
  EXPECT_FALSE(fronted.reached());
}

// A name is resolved once per request, and the connection goes to the address that was checked:
// a name that resolves to another address a moment later (DNS rebinding) does not take it there.
// The resolver reads a hosts file of the proxy's own (bound over /etc/hosts in a mount namespace
// of its own) that names a listed address until it has been read once, and an unlisted one from
// then on (inotify says when a reading ends; the readings are counted).
TEST_F(ProxyTest, TheConnectionGoesToTheAddressThatWasCheckedNeverToTheNameAgain) {
  const bool root = ::geteuid() == 0;
  const std::vector<std::string> unshare = root ? std::vector<std::string>{"unshare", "--mount"}
                                                : std::vector<std::string>{"unshare", "--mount", "--user",
                                                                           "--map-root-user"};
  std::vector<std::string> probe = unshare;
  probe.push_back("true");
  if (run_command(probe).exit_code != 0) GTEST_SKIP() << "needs a mount namespace of its own (unshare fails here)";
  Listener checked;
  Listener rebound("127.0.0.2", checked.port);
  const std::string p = std::to_string(checked.port);
  const fs::path hosts = files_.path() / "hosts";
  std::ofstream(hosts) << "127.0.0.1 flip.test\n";
  const UniqueFd watch(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK));
  ASSERT_TRUE(watch);
  ASSERT_GE(::inotify_add_watch(watch.get(), hosts.c_str(), IN_CLOSE_NOWRITE), 0);
  std::atomic<int> readings{0};
  std::atomic<bool> stop{false};
  std::thread rebinder([&] {
    while (!stop) {
      pollfd pfd{watch.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 20) <= 0) continue;
      alignas(inotify_event) char buf[4096];
      const ssize_t n = ::read(watch.get(), buf, sizeof buf);
      for (ssize_t at = 0; at < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buf + at);
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
        // A reading has ended: from now on the name leads elsewhere (the same file, rewritten).
        if ((event->mask & IN_CLOSE_NOWRITE) && readings++ == 0) std::ofstream(hosts) << "127.0.0.2 flip.test\n";
      }
    }
  });
  struct Joined {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Joined() {
      stop = true;
      thread.join();
    }
  } joined{stop, rebinder};
  std::vector<std::string> wrapper = unshare;
  wrapper.insert(wrapper.end(), {"--", "sh", "-c", "mount --bind \"$0\" /etc/hosts && exec \"$@\"", hosts.string()});
  Proxy proxy({{"mode", "filtered"}, {"allow", nlohmann::json::array({"flip.test:" + p, "127.0.0.1:" + p})}}, 0,
              wrapper);
  const UniqueFd client(connect_loopback(proxy.port()));
  ASSERT_TRUE(send_all(client.get(), "CONNECT flip.test:" + p + " HTTP/1.1\r\nHost: flip.test:" + p + "\r\n\r\n"));
  EXPECT_EQ(read_some(client.get(), 10s, [](const std::string& s) { return s.ends_with("\r\n\r\n"); }),
            "HTTP/1.1 200 Connection established\r\n\r\n")
      << read_text(proxy.stderr_file());
  EXPECT_TRUE(eventually([&] { return checked.reached(); }, 5s));
  EXPECT_FALSE(rebound.reached());
  // The watcher thread may not have taken the reading's event yet: wait for it, then no more.
  EXPECT_TRUE(eventually([&] { return readings >= 1; }, 5s)) << "the name was never read";
  EXPECT_EQ(readings, 1) << "the name was resolved again for the same connection";
  // The next request resolves it again, and the new address is judged (refused: not listed).
  const std::string again =
      raw_exchange(proxy.port(), "CONNECT flip.test:" + p + " HTTP/1.1\r\nHost: flip.test:" + p + "\r\n\r\n");
  EXPECT_TRUE(again.starts_with("HTTP/1.1 403 Forbidden")) << again;
  EXPECT_NE(again.find("resolved to 127.0.0.2"), std::string::npos) << again;
  EXPECT_FALSE(rebound.reached());
  EXPECT_EQ(readings, 2);
}

TEST(ProxyStart, RefusesBadArgumentsAndPolicies) {
  TempDir dir("nshpc-proxy-start");
  const std::string policy = (dir.path() / "policy.json").string();
  const std::string audit = (dir.path() / "audit.jsonl").string();
  CommandResult r = run_command({binary(), "__net-proxy", "--policy", policy});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--audit FILE is missing"), std::string::npos) << r.err;

  r = run_command({binary(), "__net-proxy", "--policy", policy, "--audit", audit});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;

  nshpc::fs::atomic_write(policy, "{\"mode\": \"filtered\", \"allow\": [", 0600);
  r = run_command({binary(), "__net-proxy", "--policy", policy, "--audit", audit});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;

  nshpc::fs::atomic_write(policy, "{\"mode\": \"filtered\"}", 0600);
  r = run_command({binary(), "__net-proxy", "--policy", policy, "--audit", audit});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("descriptor 3 is not a listening TCP socket"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace nshpc::test
